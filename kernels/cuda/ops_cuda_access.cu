/* ops_cuda_access.cu — read-only accessors of CUDA-backend objects for the
 * communicator (see ops_cuda_access.h). */
#include "kernels/cuda/ops_cuda_access.h"

#include "kernels/cuda/ops_cuda_internal.h"

extern "C" void *ops_cuda_buf_ptr(const struct buf *b) { return b ? b->d : NULL; }
extern "C" size_t ops_cuda_buf_len(const struct buf *b) { return b ? b->n : 0; }
extern "C" int ops_cuda_buf_kind(const struct buf *b) { return b ? (int)b->kind : -1; }

extern "C" void *ops_cuda_stream(void *ctx) { return (void *)((struct cuda_ctx *)ctx)->stream; }
extern "C" int ops_cuda_device(void *ctx) { return ((struct cuda_ctx *)ctx)->device; }
extern "C" int ops_cuda_error(void *ctx) { return ((struct cuda_ctx *)ctx)->rc; }
extern "C" int ops_cuda_pdl(void *ctx) { return ((struct cuda_ctx *)ctx)->pdl; }
