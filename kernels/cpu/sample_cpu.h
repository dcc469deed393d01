/* sample_cpu.h — the CPU backend's sample_topk (kernels/ops.h, sampling
 * section), registered by ops_cpu_create. */
#ifndef AWQD_KERNELS_SAMPLE_CPU_H
#define AWQD_KERNELS_SAMPLE_CPU_H

#include "kernels/ops.h"

void cpu_sample_topk(void *ctx, struct buf *out, const struct buf *logits, struct buf *work,
                     const struct sample_batch *sb);

#endif
