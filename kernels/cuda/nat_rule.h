/* nat_rule.h — where the wgmma GEMM (mode 4 with stream-K, w4a16_gemm.cu)
 * takes the middle M range, 17-64, from tc64 and the skinny kernel, and
 * M = 1025-4096 from dequantize + cuBLAS (kernels/cuda/w4a16.cu,
 * nat_window). Plain integer arithmetic, shared by
 * the CUDA backend and a CPU test (tests/test_nat_rule.c), so that the
 * measured rules are checked in CI. Measurements: docs/PERFORMANCE.md
 * "Session 19" (the H100 rule), "Session 28", "Session 42" and "Session
 * 43" (the H200 rule), "Session 71" (the same on the H100), and
 * docs/KERNELS.md "Mode 4". */
#ifndef AWQD_NAT_RULE_H
#define AWQD_NAT_RULE_H

/* Which rule: b2b = 1 (the default on every device since session 71) the
 * rules below measured back to back, on the H200 in sessions 28-49 and
 * checked on the H100 in session 71; b2b = 0 (AWQD_W4A16_NAT_BIG=0, for
 * measurements) session 19's rule from single cold calls on the H100.
 *
 * Session 71 (the H100, `bench kernels --b2b-audit --set all`, two runs at
 * M = 17-64 and one at 1024 / 2048 / 4096; docs/PERFORMANCE.md "Session
 * 71"): with b2b = 1 the H100 takes the wgmma GEMM where the H200 does and
 * is faster for it: Qwen3-8B M = 64 back to back q|k|v / o / gate|up / down
 * 1.40 / 1.19 / 1.89 / 1.74x cuBLAS FP16 against 0.94 / 0.82 / 1.55 /
 * 1.10x by session 19's rule; Qwen3-8B batch 40 / 48 / 64 7498-7499 /
 * 8717-8721 / 10724-10726 tok/s against 5812-5834 / 6808-6809 / 8611-8630
 * end to end (two runs each), batch 32 +6%, the 4096-token prompt 111
 * against 120 ms; at M >= 1025 every Qwen3-8B /
 * Qwen3-32B shape the rule gives the wgmma GEMM 0.60-0.96x dequantize +
 * cuBLAS's time. What the H100 audit marks (the pick > 3% slower): the
 * K N >= 48 Mi down shards at M = 17-20 (the skinny kernel 0.84-0.90x the
 * wgmma GEMM's time: Qwen3-32B tp = 2, Llama-3-70B tp = 4), Qwen3-32B tp
 * = 4 down at M = 28-32 (0.93x) and Llama-3-70B tp = 4 q|k|v at 28 (the
 * wgmma GEMM 0.96x the skinny kernel's) — left as on the H200.
 *
 * The H100 (session 19, single cold calls, against tc64 at M = 48-64):
 * M = 33-64 only for the largest matrices, K >= 5120 and K N >= 96 Mi
 * (Qwen3-32B gate|up 1.19-1.25x, down 1.07-1.09x, its tp=2 gate|up
 * 1.16-1.28x; Qwen3-8B gate|up (K = 4096) lost 5-10%, down 10%, the 32B
 * tp=2 down 3-5%; 32B q|k|v won 1.2x (52 Mi, left out)). */
#define NAT_SK_MIN_M 33
#define NAT_SK_MIN_K 5120
#define NAT_SK_KN (96ll << 20)

/* The H200, session 28, back
 * to back (bench kernels --b2b-audit, two runs, every Qwen3-8B / Qwen3-32B
 * / Llama-3-70B shape and tp = 2 / 4 shard): at M = 40-64 the wgmma GEMM
 * took 0.64-0.96x tc64's time wherever N >= 4096 and K N >= 16 Mi
 * (Llama-3-70B q|k|v 41.2 vs 64.5 us at M = 64), but not on Qwen3-8B
 * gate|up (K = 4096: 0.96-1.04x, a tie; tc64 kept, as on the H100); it
 * lost 1.03-1.17x on the tp = 4 q|k|v shards (N = 2560) and Qwen3-32B
 * tp = 4 o (K N = 10 Mi). At M = 28-32 it took 0.86-0.97x the skinny
 * kernel's time where K >= 14336 (the down_proj of Qwen3-32B, Llama-3-70B
 * and its tp = 2 shard) and lost where K is smaller (Qwen3-32B tp = 2 down,
 * K = 12800: 1.07-1.14x). M = 33-39 (not measured) go with 40: both
 * kernels' times are flat in M there. End to end (2x H200, the same binary
 * with the rule on / off, two runs): qwen3-32b batch 40 / 48 / 64 19.2-19.4
 * ms against 21.3-21.7 (-10%), batch 32 17.20 against 17.55-17.62; its
 * tp = 2 batch 48 / 64 -1.8 / -2.5%; Qwen3-8B batch 40 / 48 -5 to -6%, 64
 * -2%. Single cold calls show the wgmma GEMM 3-10% slower at M = 64 on the
 * H200 too, so the H100's rule (from single calls) may hide the same gain;
 * AWQD_W4A16_NAT_BIG=1 measures it there. Session 36 (the pipelined
 * consumer loop at M <= 64, 0.92x mode 4's time): Qwen3-8B gate|up, the
 * one K < 5120 matrix the rule had left to tc64, now takes 0.92 / 0.90x
 * tc64's time at M = 40 / 64 (42.94 / 42.03 against 45.23 / 46.71 us back
 * to back), so on the H200 gate|up goes with the other layouts. */
#define NAT_BIG_MIN_N 4096
#define NAT_BIG_MIN_KN (16ll << 20)
/* (session 28's K >= 14336 clause at M = 28-32 is now part of session 43's
 * rule below) */
/* The H200, session 42 (bench kernels --b2b-audit at M = 17-27, two runs,
 * the 28 shapes; docs/PERFORMANCE.md "Session 42"): below M = 33 the wgmma
 * GEMM (sessions 36-41 made it 0.85x faster at M = 40-64) now beats the
 * skinny kernel wherever N >= 5120, K >= 5120 and either K >= 6144 or K N
 * >= 96 Mi: 0.73-0.99x at M = 18-27 (Qwen3-32B o, gate|up, down and their
 * tp = 2 gate|up / down and tp = 4 down shards, every Llama-3-70B shape with
 * N >= 5120; Llama-3-70B q|k|v 1.03x at M = 17, 0.95-1.0x above). It lost
 * on Qwen3-8B down (N = 4096: 1.08-1.13x at M <= 24), the Qwen3-32B q|k|v tp
 * = 2 shard (K N = 25 Mi: 1.04-1.09x) and its tp = 4 gate|up (62 Mi:
 * 1.00-1.10x), and won on Qwen3-32B q|k|v (50 Mi, 0.91-0.97x: left to the
 * decode kernel to M = 19, 0.83x). Where the decode kernel takes M = 17-24
 * (K <= 4096, Qwen3-32B q|k|v and its tp = 2 shard) this rule does not
 * apply (K < 5120 or K N < 96 Mi), so the order of the questions does not
 * matter. */
#define NAT_BIG_LOW_MIN_M 17
#define NAT_BIG_LOW_MIN_N 5120
#define NAT_BIG_LOW_MIN_K 5120
#define NAT_BIG_LOW_K 6144
#define NAT_BIG_LOW_KN (96ll << 20)
/* Session 49 (docs/PERFORMANCE.md "Session 49" item 6): with the skinny
 * kernel's one-wave split at M = 17-32 (sk_plan.h, wave1 = 2), the shapes
 * of the clause above with K N < 48 Mi go back to the skinny kernel up to
 * M = 24: Qwen3-32B o (K 8192, N 5120) 18.6 against the wgmma GEMM's 20.8-20.9
 * us at M = 20 / 24, its tp = 4 down (6400, 5120) 15.9-16.0 against
 * 17.7-17.8, Llama-3-70B tp = 2 q|k|v (8192, 5120) 18.7-18.8 against 20.8
 * (back to back; the skinny kernel at the split the rule now picks, forced).
 * At M = 32 the wgmma GEMM kept Qwen3-32B o (20.9 against 23.0) and the
 * Llama-3-70B shard (21.0 against 22.7); M = 25-31 were not measured and
 * stay with it. */
#define NAT_BIG_LOW_SK_MAX_M 24
#define NAT_BIG_LOW_SK_KN (48ll << 20)
/* The H200, session 43 (bench kernels --b2b-audit at M = 25-32 on the 28
 * shapes; docs/PERFORMANCE.md "Session 43"): where N >= 4096 the wgmma
 * GEMM also takes
 *   M = 25-32 where K N >= 96 Mi (Qwen3-8B gate|up: 0.87-0.93x the skinny
 *     kernel's and tc64's time; every other such shape already took it),
 *   M = 26-32 where K >= 12288 (Qwen3-8B down: 0.84-0.89x; at M = 25 the
 *     skinny kernel's 20.2 us beat its 21.8),
 *   M = 28-32 where K N >= 48 Mi (Qwen3-32B q|k|v 0.88-0.89x, its tp = 4
 *     gate|up 0.99x; at M = 25-27 both lost 0-5%).
 * Decode steps run padded to a graph bucket (16, 24, 32, ...), so of these
 * only M = 32 reaches a decode step: Qwen3-8B batch 25-32 5.27-5.31 ->
 * 4.98-5.04 ms a step (+5.5%), qwen3-32b batch 25-32 14.30-14.46 ->
 * 14.14-14.20 ms. M = 25-31 are prefill chunks and eager steps. */
#define NAT_BIG_MID_MIN_N 4096
#define NAT_BIG_MID_GU_M 25
#define NAT_BIG_MID_GU_KN (96ll << 20)
#define NAT_BIG_MID_DOWN_M 26
#define NAT_BIG_MID_DOWN_K 12288
#define NAT_BIG_MID_M 28
#define NAT_BIG_MID_KN (48ll << 20)
/* The H200, session 49 (bench kernels --b2b-audit at M = 17-64 on the 28
 * shapes, after sessions 36-48's work on the wgmma GEMM; docs/PERFORMANCE.md
 * "Session 49" item 3):
 *   M = 33-64 also where N >= 2560 and K >= 5120: the tp = 4 q|k|v shards
 *     (N = 2560), left to tc64 by session 28 (1.03-1.17x then), now take
 *     0.76-0.80x (Qwen3-32B, K = 5120, K N = 12.5 Mi) and 0.66-0.68x
 *     (Llama-3-70B, K = 8192) of tc64's time at M = 33 / 40 / 64; the tp =
 *     4 rank proxy of qwen3-32b batch 40 / 48 / 64 0.96-0.98x a step.
 *     Qwen3-32B tp = 4 o (K = 2048, N = 5120) stays on tc64 (the wgmma
 *     GEMM 1.02-1.07x).
 * Not taken: at M = 32 Qwen3-8B q|k|v would gain (14.4 against the skinny
 * kernel's 15.3 us; session 43 14.4 / 15.2), but no shape rule separates it
 * from the Qwen3-32B tp = 2 q|k|v shard (a tie) and the Llama-3-70B tp = 2
 * o shard (K = 4096, N = 8192: the skinny kernel's 15.5 against ~17). */
#define NAT_BIG_NARROW_MIN_N 2560
#define NAT_BIG_NARROW_MIN_K 5120

/* Whether mode 4 takes M < 65 on a K x N weight (N: all output columns of
 * the weight, 2 x the intermediate size for gate|up; no rule tells gate|up
 * apart since session 36), given that stream-K is on and the GEMM is built
 * for the device; b2b: the back-to-back rule (else session 19's). */
static inline int nat_mid_takes(int m, int k, long long n, int b2b) {
    const long long kn = (long long)k * n;
    if (b2b) {
        if (m >= NAT_SK_MIN_M)
            return (n >= NAT_BIG_MIN_N && kn >= NAT_BIG_MIN_KN) ||
                   (n >= NAT_BIG_NARROW_MIN_N && k >= NAT_BIG_NARROW_MIN_K);
        if (n >= NAT_BIG_MID_MIN_N &&
            ((m >= NAT_BIG_MID_GU_M && kn >= NAT_BIG_MID_GU_KN) ||
             (m >= NAT_BIG_MID_DOWN_M && k >= NAT_BIG_MID_DOWN_K) || (m >= NAT_BIG_MID_M && kn >= NAT_BIG_MID_KN)))
            return 1;
        return m >= NAT_BIG_LOW_MIN_M && n >= NAT_BIG_LOW_MIN_N && k >= NAT_BIG_LOW_MIN_K &&
               (k >= NAT_BIG_LOW_K || kn >= NAT_BIG_LOW_KN) && (m > NAT_BIG_LOW_SK_MAX_M || kn >= NAT_BIG_LOW_SK_KN);
    }
    return m >= NAT_SK_MIN_M && k >= NAT_SK_MIN_K && kn >= NAT_SK_KN;
}

/* Above M = 1024 (the H200, session 39, after the consumers' per-chunk
 * arithmetic was trimmed: docs/PERFORMANCE.md "Session 39"): mode 4 against
 * dequantize + cuBLAS, back to back, two or three alternating rounds, every
 * non-gate|up shape of Qwen3-8B, Qwen3-32B, Llama-3-70B and their tp = 2 / 4
 * shards at M = 1536 / 2048 / 4096 (Qwen3-8B also 3072): 0.80-0.98x the time
 * where N >= 4096 and the grid of 1 x 256 tiles (128 columns x 256 rows of
 * x) fills >= 1.8 waves of the SMs, and either stream-K evens its last waves
 * (x within W4A16_GEMM_SK_X_MAX_BYTES) or whole tiles leave the last round
 * >= 90% full. It lost with fewer tiles (Qwen3-8B o and down at 1536: 192
 * tiles on 132 SMs, 1.11x) and with whole tiles in 2.42 rounds (x too large
 * for stream-K: Qwen3-32B tp = 2 down at 2048 1.17x, the N = 2560 tp = 4
 * q|k|v shards at 4096 1.11 / 1.35x; Qwen3-32B down at 2048 0.98x, a tie).
 * gate|up takes M <= 4096 without this rule (w4a16.cu). */
#define NAT_WIDE_MIN_M 1025
#define NAT_WIDE_MAX_M 4096
#define NAT_WIDE_MIN_N 4096
#define NAT_WIDE_SK_X_MAX (32ll << 20) /* = W4A16_GEMM_SK_X_MAX_BYTES (checked in w4a16.cu) */

/* Whether mode 4 takes M = NAT_WIDE_MIN_M..NAT_WIDE_MAX_M on a K x N weight
 * on a device of sms SMs; b2b: the back-to-back rule (session 19's rule
 * had none: dequantize + cuBLAS above M = 1024). */
static inline int nat_wide_takes(int m, int k, long long n, int sms, int b2b) {
    if (!b2b || m < NAT_WIDE_MIN_M || m > NAT_WIDE_MAX_M || n < NAT_WIDE_MIN_N || sms < 1) return 0;
    const long long tiles = (n + 127) / 128 * (long long)((m + 255) / 256);
    if (tiles * 5 < (long long)sms * 9) return 0;             /* < 1.8 waves */
    if ((long long)m * k * 2 <= NAT_WIDE_SK_X_MAX) return 1; /* stream-K */
    const long long rounds = (tiles + sms - 1) / sms;
    return tiles * 10 >= rounds * sms * 9; /* whole tiles: >= 90% of the rounds' slots */
}

/* XP (session 51, w4a16_gemm.cu k_xperm): the GEMM's x copied permuted
 * within each 64-deep chunk into the repacked weight words' k order by a
 * small kernel before it, so that the consumers read each weight word as
 * stored instead of gathering it in natural k order. H200, back to back
 * (bench kernels --set all, XP against the previous commit, two runs):
 * the gate|up matrices of K N >= 56 Mi at M = 17-64 0.91-0.98x the time
 * (Qwen3-32B gate|up M = 17 75.9 -> 71.7 us, Llama-3-70B gate|up 127.5 ->
 * 119.3, Qwen3-8B gate|up M = 32 / 64 0.97 / 0.98x); every down_proj and
 * Llama-3-70B o 1.03-1.06x (the copy grows with K: 64 rows of Qwen3-32B
 * down are 3.3 MB), the small matrices 1.02-1.05x; above M = 64 every shape
 * but the large gate|up at 96 lost (M = 512 / 1024 1.06x geometric mean).
 * Measured on the H200 only; applied to the H100 too
 * (AWQD_W4A16_GEMM_XP=0 turns it off). */
#define NAT_XP_MAX_M 64
#define NAT_XP_KN (56ll << 20)

static inline int nat_xp_takes(int m, int k, long long n, int gate_up) {
    return gate_up && m >= 1 && m <= NAT_XP_MAX_M && (long long)k * n >= NAT_XP_KN;
}

#endif
