/* w4a16_chain.h — the decode MLP block of one layer at batch 1 as ONE
 * persistent kernel (session 32; a measured prototype, not yet in the
 * engine's forward):
 *
 *     y_o   = x @ W_o                                   (plain, K_o -> H)
 *     rout  = fp16(rin + fp16(y_o))                     (the residual)
 *     a     = fp16(norm_w * (rout * rsqrt(mean(rout^2) + eps)))
 *     act   = silu(a @ W_gate) * (a @ W_up)             (the gate|up layout)
 *     y     = act @ W_down                              (plain, inter -> H)
 *
 * the arithmetic of w4a16_linear (o) + w4a16_linear_norm (gate|up with
 * W4A16_EPI_SILU_MUL) + w4a16_linear (down), in another summation order.
 *
 * Why (docs/TENSOR_PARALLEL.md "One H200 and 2x H200, session 31"): a
 * kernel per linear leaves DRAM idle at every boundary (the launch ~2 µs,
 * the wait's release, the prologue, the blocks' tail) and the small
 * matrices never reach the copy rate. Here one block per SM streams the
 * three weights as one contiguous-per-block byte stream through a
 * shared-memory ring fed by the bulk-copy engine, which never waits for x:
 * the next matrix's weights arrive while the current one finishes, its
 * outputs are reduced and the next x is built. Each block takes an equal
 * share of every matrix's (128-column block, group) items in memory order
 * (no wave quantization); a column block's partial sums are added in block
 * order (deterministic) by the block that holds its last item, which also
 * applies the phase's epilogue. Partials, rout, its sums of squares and act
 * travel as LL words (payload + call epoch in one 8-byte store, polled by
 * the reader): a phase starts once its block has polled all of its x's
 * inputs (a grid-wide wait; the whole grid is resident: one block per SM,
 * grid = SMs).
 *
 * Status: measured 0.73-0.92x the three kernels on H200 (session 33:
 * docs/PERFORMANCE.md "Session 33"); `awqd bench chain` and the GPU test
 * `w4a16_chain` keep it honest while it is tuned. Not called by the engine.
 *
 * Limits: M = 1, group 128, sm_90 (bulk copies, mbarrier tx counts), one
 * GPU (no all-reduce), no bias, hidden <= 8192, intermediate a multiple of
 * 8, x of the largest K in shared memory beside the ring (K <= ~50 K), at
 * most 16 column blocks per block per phase. Thread safety: one chain
 * object per stream; calls on one stream serialize (the epoch and the exit
 * counter are moved on by each call's last block).
 *
 * Timing switches (results wrong, for `bench chain` only):
 * AWQD_CHAIN_DBG bits 1 no math, 2 no phase waits (LL words taken as they
 * are), 4 no phase ends (only with 2), 8
 * weights only, 16 no copies (the consumers' own pace), 32 no x builds;
 * AWQD_CHAIN_STAGES=n fewer ring stages. */
#ifndef AWQD_W4A16_CHAIN_H
#define AWQD_W4A16_CHAIN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct w4a16_weight;
struct w4a16_chain;

/* Plans the chain over o (PLAIN, K_o -> H), gate|up (GATE_UP, H -> 2 inter)
 * and down (PLAIN, inter -> H) on the current device and allocates its
 * workspace (LL partials, rout, sums of squares, act; the epoch). 0; -ENOTSUP where it cannot run
 * (device below sm_90, group != 128, shapes that do not chain, x too large
 * for shared memory); -ENOMEM. The weights must outlive the chain. */
int w4a16_chain_create(const struct w4a16_weight *o, const struct w4a16_weight *gu,
                       const struct w4a16_weight *down, struct w4a16_chain **out, char *err,
                       size_t errlen);
void w4a16_chain_free(struct w4a16_chain *ch); /* NULL ok */

/* One call (M = 1): x fp16 [K_o], rin fp16 [H], norm_w fp16 [H]; writes rout
 * fp16 [H] and y fp16 [H] (rout must differ from rin). Enqueued on s (with
 * programmatic dependent launch where w4a16_pdl is on); capturable. A
 * grid-wide wait that does not finish within ~2 s (a lost block) ends the
 * call with garbage and sets the error that w4a16_chain_error returns. */
int w4a16_chain_run(struct w4a16_chain *ch, const uint16_t *x, const uint16_t *rin,
                    const uint16_t *norm_w, float eps, uint16_t *rout, uint16_t *y,
                    cudaStream_t s, char *err, size_t errlen);

/* 0, or 1 when a call's grid-wide wait timed out (reads a device word:
 * synchronizes the device). */
int w4a16_chain_error(struct w4a16_chain *ch);

/* With -DAWQD_STAMPS (scripts/prebuilt.sh: PB_STAMPS=1): prints the last
 * call's per-block timeline (kernels/cuda/stamps.cuh) to stderr; else
 * nothing. */
void w4a16_chain_stamps_dump(void);

/* The plan, for logs and benchmarks: blocks, ring stages, stage bytes. */
void w4a16_chain_describe(const struct w4a16_chain *ch, int *blocks, int *stages, int *stage_bytes);

#ifdef __cplusplus
}
#endif

#endif
