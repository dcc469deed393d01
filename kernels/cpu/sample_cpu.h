/* sample_cpu.h — the CPU backend's sample_topk (kernels/ops.h, sampling
 * section), registered by ops_cpu_create. */
#ifndef AWQD_KERNELS_SAMPLE_CPU_H
#define AWQD_KERNELS_SAMPLE_CPU_H

#include <stdint.h>

#include "kernels/ops.h"

/* The race score of kernels/ops.h (sampling): (double)w * inv_t + g(key, id);
 * -inf for a w that is not finite. The host sampler (engine/sampler.c) and
 * this backend both call it; kernels/cuda/sample.cu has the device twin. */
double sample_race_score(uint64_t key, int32_t id, float w, float inv_t);
/* g <= -log(-log(1 - 2^-53)) = 36.74: a token with (double)w * inv_t +
 * SAMPLE_RACE_GMAX below the best score so far cannot win (exact pruning). */
#define SAMPLE_RACE_GMAX 36.8
/* The uniform u in (0, 1) behind g for (key, id). */
double sample_race_uniform(uint64_t key, int32_t id);

/* kernels/ops.h's order of tokens as one integer, larger = better: w
 * descending, then id ascending; NaN below everything, -0 == +0. Used by this
 * backend's selection and by the host's candidate merge (engine/sampler.c). */
static inline uint64_t sample_order_key(float v, int32_t id) {
    union { float f; uint32_t u; } b;
    b.f = v == 0.0f ? 0.0f : v;
    uint32_t u = v != v ? 0u : (b.u & 0x80000000u) ? ~b.u : (b.u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)id);
}

void cpu_sample_topk(void *ctx, struct buf *out, const struct buf *logits, struct buf *work,
                     const struct sample_batch *sb);

#endif
