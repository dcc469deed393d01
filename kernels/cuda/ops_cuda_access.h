/* ops_cuda_access.h — the few facts about a CUDA-backend object that code
 * outside kernels/cuda (the NCCL / peer-to-peer communicator, comm/cuda/) may
 * read. Everything else about the backend stays behind kernels/ops.h.
 *
 * Plain C declarations (no CUDA types): a stream is returned as void * and is
 * a cudaStream_t. Usable from C and CUDA sources of CUDA builds only. */
#ifndef AWQD_OPS_CUDA_ACCESS_H
#define AWQD_OPS_CUDA_ACCESS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct buf;

/* Device address of a CUDA-backend buffer: fp16 [n] for BUF_ACT/BUF_W16,
 * float [n] for BUF_F32, int32 [n] for BUF_I32. */
void *ops_cuda_buf_ptr(const struct buf *b);
/* Elements in the buffer and its kind (enum buf_kind). */
size_t ops_cuda_buf_len(const struct buf *b);
int ops_cuda_buf_kind(const struct buf *b);

/* ctx is struct ops.ctx of an ops_cuda_create instance. */
void *ops_cuda_stream(void *ctx);   /* cudaStream_t every op of ctx runs on */
int ops_cuda_device(void *ctx);     /* its CUDA device */
int ops_cuda_error(void *ctx);      /* first asynchronous error recorded (negative errno), or 0 */
int ops_cuda_pdl(void *ctx);        /* 1: its kernels use programmatic dependent launch (sm_90+) */

#ifdef __cplusplus
}
#endif

#endif
