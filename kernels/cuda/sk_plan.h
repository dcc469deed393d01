/* sk_plan.h — the W4A16 skinny kernel's shared memory layout and, at M =
 * 17..32, its split-K rule (kernels/cuda/w4a16.cu, k_skinny). Plain integer
 * arithmetic, shared by the CUDA backend (host and device code) and a CPU
 * test (tests/test_sk_plan.c), so that the rule measured on the GPU is
 * checked in CI, where no GPU runs. Measurements: docs/PERFORMANCE.md
 * "Session 35" item 6. */
#ifndef AWQD_SK_PLAN_H
#define AWQD_SK_PLAN_H

#include <stddef.h>

#ifdef __CUDACC__
#define SK_FN static __host__ __device__ __forceinline__
#else
#define SK_FN static inline
#endif

#define SK_WARPS 8
#define SK_STAGES 8 /* ring depth (16 and 24 measured slower on H200: fewer resident blocks) */
#define SK_X_BYTES_MAX (48 * 1024) /* x slice limit -> K range per split (M <= 8, M > 32) */
#define SK_X_BYTES_MAX_MID (96 * 1024) /* M = 9..32: the largest slice the split rule may pick */
/* The first M of sk_split_mid's rule: 17 from session 35, 9 since session
 * 48 (H200, back to back, the 30 skinny points of --set 8b / 32b / 70b at M
 * = 12 / 16, one binary, AWQD_W4A16_SK_MID16=0 / 1: geometric mean 0.989x,
 * at worst 1.006x; Qwen3-32B down M = 16 38.0 -> 34.7 us (17 -> 13
 * splits), Llama-3-70B gate|up / down and their tp = 2 shards at M = 16
 * 0.92-0.96x; at M = 12 and on Qwen3-8B every point within 1%. qwen3-32b
 * batch 16 9.51-9.55 -> 9.30 ms a step). AWQD_W4A16_SK_MID16=0 goes back
 * to 17 (kernels/cuda/w4a16.cu). */
#define SK_MID_MIN_M 9

/* A block's shared memory: x [m][krange + 8] fp16 (its rows of the split's
 * K range), then SK_WARPS rings of st 512-byte weight chunks, the scales
 * (256 bytes) and zeros (64 bytes) of every group the range touches. */
struct sk_smem {
    int krange, ngroups, xstride; /* halves per x row */
    size_t x_off, w_off, s_off, z_off, total;
};

SK_FN struct sk_smem sk_layout(int m, int cps, int G, int st) {
    struct sk_smem L;
    L.krange = cps * 64;
    L.ngroups = (L.krange + G - 1) / G + 1;
    L.xstride = L.krange + 8;
    L.x_off = 0;
    L.w_off = ((size_t)m * L.xstride * 2 + 15) / 16 * 16;
    L.s_off = L.w_off + (size_t)SK_WARPS * st * 512;
    L.z_off = L.s_off + (size_t)L.ngroups * 256;
    L.total = L.z_off + (size_t)L.ngroups * 64;
    return L;
}

/* The largest x slice at m rows (bytes) and the chunks per split it allows */
SK_FN int sk_x_limit_from(int m, int mid_lo) { return m >= mid_lo && m <= 32 ? SK_X_BYTES_MAX_MID : SK_X_BYTES_MAX; }
SK_FN int sk_x_limit(int m) { return sk_x_limit_from(m, SK_MID_MIN_M); }
SK_FN int sk_cps_limit(int m, int xbytes) {
    const int c = xbytes / (m * 128);
    return c < 1 ? 1 : c;
}

/* The general split rule (before the x slice's minimum), with the
 * kernel's blocks per SM bps (the occupancy query). Measured on H100 (bench
 * --sweep): the skinny kernel is best with ~16 chunks per warp as long as
 * the grid stays one wave; 8 splits beat 12 on down (K 12288, 32 column
 * blocks) with or without the cluster reduction (H200 sweep), hence the cap
 * where the grid is large enough anyway. One wave of resident blocks for M
 * <= 8 (gate|up M = 1: 2 splits 21.9 us, 4 splits 24.6); above, two waves
 * won (M = 16: 4 splits 33.5 us, 3 (one wave) 36.8). */
#define SK_SPLIT_CAP 8
SK_FN int sk_split_rule(int m, int kc, int nb, int sms, int bps) {
    int ks = (kc + 15) / 16;
    if (ks > SK_SPLIT_CAP && nb * SK_SPLIT_CAP >= sms) ks = SK_SPLIT_CAP;
    const int waves = m <= 8 ? 1 : 2, slots = bps * sms;
    if (nb > 0 && ks > waves * slots / nb) ks = waves * slots / nb;
    return ks < 1 ? 1 : ks;
}

/* The split that ks asks for, as the kernel runs it: at most cps_max chunks
 * per split, then as few splits as those chunks need (the launch's own
 * normalization). */
SK_FN int sk_split_norm(int kc, int ks, int cps_max) {
    if (ks < 1) ks = 1;
    if (ks > kc) ks = kc;
    int cps = (kc + ks - 1) / ks;
    if (cps > cps_max) cps = cps_max;
    return (kc + cps - 1) / cps;
}

/* ks0 raised to the fewest splits whose x slices stay within cps_max
 * chunks, as the kernel runs it */
SK_FN int sk_split_limited(int kc, int ks0, int cps_max) {
    const int mins = (kc + cps_max - 1) / cps_max;
    return sk_split_norm(kc, ks0 > mins ? ks0 : mins, cps_max);
}

/* The split at m = 17..32 rows (MT = 4; 99 registers: two blocks per SM by
 * registers; since session 48 also at m = 9..16, SK_MID_MIN_M), given ks0,
 * sk_split_rule's split. Candidates: the splits that
 * x-slice limits of 48 (the rule before session 35), 64 and 96 KB give.
 * Among those whose block leaves room for two per SM (shared memory per SM
 * smem_sm; 0: unknown, taken as fitting), the one whose busiest SM streams
 * the fewest chunks: ceil(blocks / SMs) x (chunks per split + 4), the 4 a
 * block's fixed cost; ties to the larger slice (fewer splits). H200,
 * session 35, back to back, 110 skinny points of the 28 shapes at M = 17,
 * 20, 24, 28, 32: the rule's pick within 3% of the best of the three at
 * 107, at worst 1.056x; against the 48 KB rule 0.948x the time (geometric
 * mean), at worst 1.008x (Qwen3-8B down M = 17 / 20 25.8 / 24.8 -> 19.1 /
 * 20.1 us, o M = 28 / 32 13.3 / 12.6 -> 10.6 / 10.5). A slice of 96 KB
 * alone was 1.0x on average (0.74-1.26x: one block per SM where x grew),
 * 64 KB 0.961x (0.73-1.15x). */
#define SK_MID_FIXED_CHUNKS 4
/* wave1 (1: the dispatch's default in session 48; AWQD_W4A16_SK_WAVE1=0
 * turns it off): at m <= 16 also the split of one wave of two blocks per SM
 * where that is fewer than ks0's, on the 96 KB slice; wave1 = 2 (the
 * default on this branch, from session 49's sweep): at m = 17..32 too, where
 * it is fewer or more. H200, session 49, the skinny kernel's split forced
 * at M = 20 / 24 / 32 on the 28 shapes (docs/PERFORMANCE.md "Session 49"
 * item 6, tests/test_sk_plan.c one_wave_at_m17_32): of the 84 points it
 * changes 22 (20 distinct K x N x M), 19 (17) of them to measured splits,
 * 0.74-1.01x the old pick's time (Qwen3-32B q|k|v M = 20 5 -> 3 splits
 * 27.6 -> 20.4 us, o M = 20 / 24 8 -> 6 22.1 -> 18.6, Qwen3-8B q|k|v 4 -> 5
 * 0.90x), three (Llama-3-70B tp = 4 q|k|v, 13 splits) not measured. H200, back to back,
 * one binary, the 30 skinny points of --set 8b / 32b / 70b at M = 12 / 16:
 * geometric mean 0.960x, at worst 1.026x (Qwen3-32B o M = 12, 8 -> 6
 * splits); Qwen3-32B o M = 16 15.6 -> 14.1 us, its down tp = 2 / 4 shards
 * 0.88-0.89x / 0.95x, Llama-3-70B o 0.85-0.87x, its down tp = 4 at M = 16
 * 0.79x; qwen3-32b batch 16 9.29-9.30 -> 9.16-9.19 ms a step
 * (docs/PERFORMANCE.md "Session 48" item 7). */
SK_FN int sk_split_mid_w(int m, int kc, int nb, int group, int ks0, int sms, int smem_sm, int wave1) {
    int best = 0, best_two = 0;
    long best_load = 0;
    if (sms < 1) sms = 1;
    const int ks1 = nb > 0 ? 2 * sms / nb : ks0;
    const int nc = ks1 >= 1 && ((wave1 && m <= 16 && ks1 < ks0) || (wave1 >= 2 && m > 16 && ks1 != ks0)) ? 4 : 3;
    for (int i = 0; i < nc; i++) {
        const int ks = i == 3 ? sk_split_limited(kc, ks1, sk_cps_limit(m, 96 * 1024))
                              : sk_split_limited(kc, ks0, sk_cps_limit(m, (i == 0 ? 48 : i == 1 ? 64 : 96) * 1024));
        const int cps = (kc + ks - 1) / ks;
        const size_t smem = sk_layout(m, cps, group, SK_STAGES).total;
        const int two = smem_sm <= 0 || 2 * (smem + 1024) <= (size_t)smem_sm;
        const long blocks = (long)nb * ks, load = (blocks + sms - 1) / sms * (long)(cps + SK_MID_FIXED_CHUNKS);
        if (!best || (two && !best_two) || (two == best_two && load <= best_load)) {
            best = ks;
            best_two = two;
            best_load = load;
        }
    }
    return best;
}
SK_FN int sk_split_mid(int m, int kc, int nb, int group, int ks0, int sms, int smem_sm) {
    return sk_split_mid_w(m, kc, nb, group, ks0, sms, smem_sm, 0);
}

#endif
