/* sample.h — the CUDA backend's sample_topk (kernels/ops.h, sampling
 * section; kernels/cuda/sample.cu), registered by ops_cuda_create. C++ (nvcc)
 * only, like ops_cuda_internal.h. */
#ifndef AWQD_CUDA_SAMPLE_H
#define AWQD_CUDA_SAMPLE_H

#include "kernels/cuda/ops_cuda_internal.h"

void ops_cuda__sample_topk(void *ctx, struct buf *out, const struct buf *logits,
                           struct buf *work, const struct sample_batch *sb);

#endif
