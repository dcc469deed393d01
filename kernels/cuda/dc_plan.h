/* dc_plan.h — the W4A16 decode kernel's launch plan and its place in the
 * automatic dispatch (kernels/cuda/w4a16.cu, k_decode): tiles per block,
 * blocks, shared memory, and whether the dispatch takes it at M rows. Plain
 * integer arithmetic, shared by the CUDA backend (host and device code) and
 * a CPU test (tests/test_dc_plan.c), so that the rules measured on the GPU
 * are checked in CI, where no GPU runs. The measurements behind each rule
 * are in docs/KERNELS.md ("The decode kernel") and docs/PERFORMANCE.md
 * (sessions 4, 7, 21 and 22). */
#ifndef AWQD_DC_PLAN_H
#define AWQD_DC_PLAN_H

#include <stddef.h>

#ifdef __CUDACC__
#define DC_FN static __host__ __device__ __forceinline__
#else
#define DC_FN static inline
#endif

#define DC_WARPS 8
#define DC_MAX_M 24              /* MT = 1 (M <= 8), 2 (M <= 16) or 3 (M <= 24) mma column blocks */
#define DC_SMEM_MAX (200 * 1024) /* x of M x K + the reduction area (MT = 1, 2) */
#define DC_SMEM_MAX_MT3 (224 * 1024) /* MT = 3: one block per SM anyway (x of 24 rows at K = 4096) */
#define DC_DISPATCH_MAX_M 24     /* the dispatch's last M (session 35; 16 in session 22, 8 in session 21) */
#define DC_MT2_MAX_K 4096        /* M = 9..24: the largest K taken on any grid (sessions 34, 35) */
#define DC_MT2_WAVES3_MAX_K 5120 /* M = 9..24: above DC_MT2_MAX_K, on <= 3 x SMs blocks (session 42) */

/* Shared memory of a decode block: x [m][K + 8] fp16 (the 16-byte pad puts
 * the 8 rows' LDS.128 on distinct banks), then the reduction area
 * [TB][MT*4][8 warps][32 lanes] fp32. */
DC_FN size_t dc_x_bytes(int m, int K) { return ((size_t)m * (K + 8) * 2 + 15) / 16 * 16; }
DC_FN size_t dc_smem_bytes(int m, int K, int tb, int mt) {
    return dc_x_bytes(m, K) + (size_t)tb * mt * 4 * DC_WARPS * 32 * 4;
}
/* ... of a block of the cluster K split (cl blocks a column, K the block's
 * share): rank 0 also holds the other ranks' sums [cl - 1][TB][MT][32][4] */
DC_FN size_t dc_smem_cl(int m, int K, int tb, int mt, int cl) {
    return dc_smem_bytes(m, K, tb, mt) + (size_t)(cl - 1) * tb * mt * 32 * 4 * 4;
}

/* What the plan needs to know of the GPU. */
struct dc_gpu {
    int sms;        /* multiprocessors */
    int smem_sm;    /* shared memory per multiprocessor, bytes (0: unknown) */
    int smem_optin; /* largest dynamic shared memory per block, bytes (0: unknown) */
};

/* dc_plan_make's flags */
#define DC_PLAN_HALVE 1 /* the halving of wide grids at M <= DC_HALVE_MAX_M (the default) */
#define DC_PLAN_S21 2   /* session 21's rules instead (AWQD_W4A16_DC_PLAN=21, for measurements;
                           blocks per SM counted as since session 22) */
#define DC_HALVE_MAX_M 4
#define DC_PLAN_TB1 4   /* dc_ps_plan may give MT = 2 one tile per block where one block fits per SM */
#define DC_PLAN_TB4 8   /* dc_ps_plan may give MT = 2 four tiles per block where one block fits per SM */

struct dc_plan {
    int mt, tb, blocks, k; /* k: the K of one block (the weight's K / cl) */
    int cl;        /* blocks (a thread-block cluster) sharing each column's K: 1, or 2 (dc_plan_make_cl) */
    int gs;        /* 1: the cl blocks of a column are plain blocks adding through global memory (dc_plan_gs) */
    int m, n16;    /* rows and 16-column tiles it was made for */
    int pf;        /* L2 prefetch distance in ring turns (MT = 1; 0: none) */
    size_t smem;
    size_t wbytes; /* INT4 weight bytes of one block: TB x 16 columns x K / 2 */
    int flags;     /* those it was made with */
};

/* Blocks of the decode kernel one SM holds (at most 2: __launch_bounds__)
 * with smem bytes of dynamic shared memory each; the runtime reserves 1 KB
 * per block and the NORM variant has 256 bytes of static shared memory
 * (until session 22 this counted 2 KB per block: Qwen3-8B o at M = 12, 112
 * KB, was taken for one block per SM where the GPU placed two). */
DC_FN int dc_blocks_per_sm(const struct dc_gpu *g, size_t smem) {
    if (g->smem_sm <= 0) return 2;
    const int n = (int)((size_t)g->smem_sm / (smem + 1024 + 256));
    return n < 2 ? n : 2;
}

/* The kernel's own shared memory limit at MT mma column blocks */
DC_FN size_t dc_smem_max(int mt) { return mt >= 3 ? DC_SMEM_MAX_MT3 : DC_SMEM_MAX; }

/* Blocks per SM at MT mma column blocks: MT = 3 is compiled for one block
 * per SM (__launch_bounds__(256, 1), 221-240 registers), whatever its shared
 * memory would allow (K <= 2048 at M = 17-20; session 35: the Qwen3-32B tp =
 * 4 o shard at M = 17, 160 blocks planned as one wave of two per SM, ran as
 * two waves: 8.1 us against 6.8 at M = 24 on the persistent grid) */
DC_FN int dc_slots_per_sm(const struct dc_gpu *g, size_t smem, int mt) {
    const int n = dc_blocks_per_sm(g, smem);
    return mt >= 3 && n > 1 ? 1 : n;
}

/* Whether a block of smem bytes can launch: within the kernel's own limit
 * and the device's opt-in maximum (where known). */
DC_FN int dc_smem_fits(const struct dc_gpu *g, size_t smem, int mt) {
    return smem <= dc_smem_max(mt) && (g->smem_optin <= 0 || smem <= (size_t)g->smem_optin);
}

/* The L2 prefetch (pf, k_decode at MT = 1, not the SUM variant): each warp
 * requests the lines of its ring turn after next into L2 (a hint: no
 * registers), only where one block fits per SM. There the SM has 8 warps,
 * each with its 4 KB register ring, too few bytes in flight. H200, session
 * 24, back to back, one turn against none in the same call: all 23 points
 * of that kind the dispatch takes at M = 1-8 on the Qwen3-8B / 32B and
 * Llama-3-70B shapes and shards were 2.6-7.3% faster (geometric mean
 * 0.951x; Qwen3-8B down M = 5-7, Qwen3-32B o M = 7-8, Llama-3-70B o /
 * gate|up M = 7-8 and down M = 2-3, its tp = 2 / 4 shards at M = 4-8).
 * With two blocks per SM it cost up to 25% at M = 1 on the large matrices
 * and was mixed elsewhere, so it is off there. */
#define DC_PF_ONE_BLOCK 1
DC_FN int dc_pf_rule(int mt, const struct dc_gpu *g, size_t smem) {
    return mt == 1 && dc_blocks_per_sm(g, smem) < 2 ? DC_PF_ONE_BLOCK : 0;
}

/* The plan for m rows of a weight of K inputs, n16 tiles of 16 columns and
 * the given group size; 0 when the kernel does not apply (M, a group size
 * other than 128, shared memory). tb_force: 1, 2 or 4 tiles per block (a
 * measurement knob), else 0; flags: DC_PLAN_*.
 *
 * TB (H200, session 4): the widest block that still leaves at least 1.2
 * blocks per SM (fewer, wider blocks read x fewer times and amortize the
 * block's fixed costs; more blocks spread the stream). Halved at M <= 4
 * where the grid would be 1 to 1.5 waves of 2 blocks per SM (its last wave
 * half empty: Qwen3-8B gate|up, 384 -> 768 blocks; at M = 1 H100 session 7,
 * back to back 83.1 -> 91.0% of the copy rate; at M = 3-4 H200 session 22,
 * 18.2 -> 17.1 us; at M = 6-8 the 4-wide blocks are faster again; a
 * general fill rule, also moving Qwen3-32B q|k|v and the tp=2 gate|up shard
 * to 1 tile per block, lost 11-14 points at M = 1). Where x fills so much
 * shared memory that one block fits per SM and the grid would need a second
 * wave, the blocks are widened (to 4 tiles) until it does not: one wave of
 * wide blocks beats two of narrow ones (H200 session 22, back to back:
 * Qwen3-8B down M = 6 15.1 -> 12.2 us, Qwen3-32B o M = 8 15.7 -> 12.4,
 * its down M = 3 36.1 -> 30.7, the tp = 2 down M = 6 22.3 -> 17.6).
 * MT = 2 (M = 9..16) and 3 (M = 17..24) use TB = 2 (TB = 1 spills at 128
 * registers at MT = 2); the persistent grid may give MT = 2 one or four
 * (dc_ps_tb1, dc_ps_tb4).
 *
 * Session 21's rules (DC_PLAN_S21): the halving at M <= 2 only, at least 2
 * tiles per block from M = 3 (from session 4, when x went through L2 only:
 * with x through L1, 1 tile per block is faster where the width rule gives
 * it: Qwen3-8B o M = 3-8 6.1-7.4 -> 5.1-5.8 us, its down M = 3-4 14.1-15.3
 * -> 10.2-11.2, the Qwen3-32B tp = 4 q|k|v shard 7.1-8.3 -> 5.7-6.7), no
 * widening. */
DC_FN int dc_plan_make_cl(int m, int K, int n16, int group, const struct dc_gpu *g, int cl, int tb_force,
                          int flags, struct dc_plan *pl) {
    if (m < 1 || m > DC_MAX_M || group != 128 || n16 < 1 || cl < 1) return 0;
    const int mt = (m + 7) / 8, sms = g->sms > 0 ? g->sms : 1, s21 = flags & DC_PLAN_S21;
    int tb = tb_force;
    if (tb != 1 && tb != 2 && tb != 4) {
        const int want = sms + sms / 5;
        tb = (n16 + 3) / 4 >= want ? 4 : (n16 + 1) / 2 >= want ? 2 : 1;
        if ((flags & DC_PLAN_HALVE) && m <= (s21 ? 2 : DC_HALVE_MAX_M) && tb > 1) {
            const int slots = 2 * sms, b = (n16 + tb - 1) / tb;
            if (b > slots && 2 * b <= 3 * slots) tb /= 2;
        }
        if (s21 && m >= 3 && tb < 2) tb = 2;
        if (!s21 && mt == 1)
            while (tb < 4 && (n16 + tb - 1) / tb > sms && dc_blocks_per_sm(g, dc_smem_cl(m, K, tb, mt, cl)) < 2 &&
                   dc_smem_cl(m, K, 2 * tb, mt, cl) <= DC_SMEM_MAX)
                tb *= 2;
    }
    if (mt >= 2) tb = 2;
    const size_t smem = dc_smem_cl(m, K, tb, mt, cl);
    if (!dc_smem_fits(g, smem, mt)) return 0;
    pl->cl = cl;
    pl->gs = 0;
    pl->mt = mt;
    pl->tb = tb;
    pl->pf = dc_pf_rule(mt, g, smem);
    pl->blocks = (n16 + tb - 1) / tb;
    pl->k = K;
    pl->m = m;
    pl->n16 = n16;
    pl->smem = smem;
    pl->wbytes = (size_t)tb * 8 * K;
    pl->flags = flags;
    return 1;
}
DC_FN int dc_plan_make(int m, int K, int n16, int group, const struct dc_gpu *g, int tb_force, int flags,
                       struct dc_plan *pl) {
    return dc_plan_make_cl(m, K, n16, group, g, 1, tb_force, flags, pl);
}

/* The cluster K split (k_decode's CL; w4a16_decode_cluster): the cl blocks
 * of a thread-block cluster share each column, block q taking the q-th of
 * cl equal K ranges and staging only that range of x, so each SM takes in
 * 1 / cl of x per column block (x is the larger part of an SM's intake at
 * M = 9-24 on the small matrices: Qwen3-8B q|k|v at M = 16 131 KB of x
 * against 95 KB of weights a block) and MT = 3 fits where x of all of K
 * does not (K = 5120 from M = 20, K = 8192 from M = 13); rank 0 adds the
 * others' sums. Plain variant, MT >= 2, K / 128 a multiple of cl. The plan
 * is that of one block of K / cl on a GPU of the clusters that fit at once
 * (g: sms = those clusters, one block per SM), pl->k = K / cl, pl->cl =
 * cl; grids in clusters (the launch multiplies by cl). */
DC_FN int dc_plan_cluster(int m, int K, int n16, int group, const struct dc_gpu *g, int cl, int tb_force,
                          int flags, struct dc_plan *pl) {
    if (cl < 2 || (m + 7) / 8 < 2 || K % (128 * cl) != 0) return 0;
    return dc_plan_make_cl(m, K / cl, n16, group, g, cl, tb_force, flags, pl);
}

/* The K split through global memory (k_decode's GS): ks plain blocks a
 * column of tb tiles, block q taking groups [q KG / ks, (q + 1) KG / ks),
 * its sums into a workspace, the last of the column's blocks to arrive
 * adding all ks in order (then storing, or making the tensor-parallel sum).
 * The plan of one block of the largest piece; blocks = columns (the launch
 * multiplies by ks). Its shared memory is a plain block's (x of its piece
 * and the warps' partials): the cluster split's area for the other ranks'
 * sums is not used (until session 55 it was counted, 6 KB at 4 x 4). */
DC_FN int dc_plan_gs(int m, int K, int n16, int group, const struct dc_gpu *g, int ks, int tb, int flags,
                     struct dc_plan *pl) {
    if (m > 8 || ks < 2 || K % 128 != 0 || K / 128 < ks) return 0;
    if (!dc_plan_make_cl(m, (K / 128 + ks - 1) / ks * 128, n16, group, g, 1, tb, flags, pl)) return 0;
    pl->cl = ks;
    pl->gs = 1;
    pl->pf = 0;
    return 1;
}
/* Its workspace: [columns][ks][tb][mt * 4][32] fp32 */
DC_FN size_t dc_gs_ws_bytes(const struct dc_plan *pl) {
    return (size_t)pl->blocks * pl->cl * pl->tb * pl->mt * 4 * 32 * 4;
}
/* Whether its grid is one wave (every block resident at once) */
DC_FN int dc_gs_one_wave(const struct dc_plan *pl, const struct dc_gpu *g) {
    return pl->blocks * pl->cl <= (g->sms > 0 ? g->sms : 1) * dc_blocks_per_sm(g, pl->smem);
}
/* Where the dispatch takes it, and how (dc_gs_pick): at M <= 8, K >= 6144 (5120 from M = 2 since
 * session 63, below)
 * (at least 16 groups a block of three, two a warp) and N >= 4096, where
 * one of 3 blocks of four tiles, 2 of four or 2 of two a column gives a
 * one-wave grid of at least 1.4x the blocks the one-block plan has resident
 * at once (the most such blocks wins; the one-block plan leaves slots idle:
 * 160 blocks of two tiles for the 5120-column matrices, 104 of 132 SMs
 * streaming with one block's 32 KB of loads in flight; or one block a SM
 * where its x is large). H200, session 53, back to back against the plan:
 * at M = 1 / 2 / 4 / 8 (3 x 4 tiles, 240 blocks) Qwen3-32B down 0.82 /
 * 0.76x (M = 4-8: the skinny kernel's), o 0.93 / 0.92 / 0.85 / 0.81x, its
 * tp = 2 down 0.89 / 0.86 / 0.80x, tp = 4 down 0.94 / 0.96 / 0.85 / 0.81x,
 * the Llama-3-70B tp = 2 q|k|v shard 0.96 / 0.93 / 0.84 / 0.81x; (2 x 4
 * tiles, 256 blocks) Llama-3-70B down at M = 2 0.87x, o at M = 8 0.93x,
 * its tp = 2 down at M = 4 0.89x; (2 x 2 tiles, 256 blocks) Qwen3-8B down at
 * M = 8 0.90x. It lost below the K limit (the Qwen3-32B tp = 2 q|k|v
 * shard, K = 5120, 1.06x at M = 1; the tp = 2 o shard, K = 4096,
 * 1.06-1.21x), on the 2560-column Llama-3-70B tp = 4 q|k|v shard at M = 1-2
 * (1.07-1.2x), and where the one-block plan has two blocks on most SMs
 * (Qwen3-8B o 1.25-1.32x, down at M = 1-2 1.09-1.15x). */
/*
 * Session 54 added 4 x 4 tiles (first: of equal counts, 4 x 4 before 2 x 2)
 * and, where x of all of K leaves no one-block plan (the stand-in below: the
 * dispatch's alternative is the skinny kernel), grids of more than one wave:
 * 4 x 4, else 4 x 2 tiles, wherever two of their blocks fit an SM. H200,
 * back to back, forced against the rule, M = 5-8 (`s54c`): Qwen3-8B down
 * 4 x 4 against 2 x 2 10.05 / 9.94 / 10.25 / 10.05 against 10.43 / 10.56 /
 * 11.14 / 11.17 us (0.90-0.96x); past one wave, against the skinny kernel,
 * Qwen3-32B down M = 6 / 7 33.3 / 30.2 -> 26.1 / 26.5 (4 x 4), M = 8 29.5
 * -> 27.5 (4 x 2), Llama-3-70B down M = 5 / 6 39.8 / 42.4 -> 34.0 / 35.9
 * (4 x 4), M = 7 49.8 -> 47.7 (4 x 2), its tp = 2 down M = 7 / 8 23.2 /
 * 24.9 -> 21.3 / 20.8 (4 x 4). Where one block a SM is all that fits the
 * grids of more than one wave lost (Qwen3-32B down M = 8 at 4 x 4 31.7 us,
 * Llama-3-70B down M = 8 at 4 x 2 59.2), and so did 3 x 4 and 2 x 4 past one
 * wave (1.03-1.35x). And 4 x 4 tiles of as many blocks as the one-block
 * plan has resident where that plan's x is >= 64 KB (each block of the split
 * stages a quarter of it after the wait): Qwen3-8B down at M = 3 / 4 (x of
 * 74 / 98 KB, 256 blocks of one tile two a SM) 9.59 / 10.82 -> 9.24 / 9.32
 * us, at M = 2 (49 KB) 1.013x, so not there (`s54h`); 2 x 4 tiles in the same
 * place gained nothing (Llama-3-70B o M = 4-6 1.00x) or lost (its tp = 4
 * down M = 6 1.07x, `s54c`).
 *
 * Session 55 added 6 x 4 and 8 x 4 tiles past one wave and picks among them
 * by the fill of the last wave (a grid of B blocks on 2 x SMs slots fills
 * B / (waves x slots) of them), and of those within DC_GS_FILL_TOL points of
 * the fullest the fewest blocks (each stages its x after the wait: at M = 8
 * Llama-3-70B down's 4 x 2 grid stages ~100 MB of x from L2 beside its 117
 * MB of weights). H200, back to back, forced (`s55a`, two runs): Qwen3-32B
 * down M = 6 / 7 / 8 26.0 / 26.5 / 27.5 (4 x 4, 4 x 4, 4 x 2: 61, 61, 81%
 * full) -> 22.9 / 23.8 / 23.4 us (6 x 4, 91%; 8 x 4, 81%: 25.8 / 25.2 /
 * 25.4), Llama-3-70B down M = 7 / 8 46.7 (4 x 2) / 45.6 (skinny) -> 39.5 /
 * 38.1 (6 x 4; 8 x 4 41.1 / 38.5); at 97% all, Llama-3-70B down M = 5 / 6
 * keeps 4 x 4 (34.0 / 36.3 against 6 x 4's 35.2 / 36.4), its tp = 2 down M
 * = 7 / 8 too (21.0 / 20.6 against 23.7 / 22.7).
 */
/*
 * Session 56 added two cases, both where the one-block plan leaves SMs with one block (H200, back to
 * back, forced, two runs each):
 * - The 2560-column matrices (160 tiles, under DC_GS_MIN_N16) from M = 4 (DC_GS_NARROW_MIN_M), at K
 *   >= 8192 where a one-block plan exists (the shape measured; K = 6144-8191 would give the six
 *   blocks a column one or one and a half groups a warp), with
 *   6 x 4 tiles among the one-wave candidates (240 blocks; with 256 or more tiles 6 x 4 is never one
 *   wave, so no other shape sees it): the Llama-3-70B tp = 4 q|k|v shard at M = 4 / 5 / 6 / 7 / 8 6.93
 *   / 7.45 / 8.05 / 7.50 / 7.43 us (the plain grid, 160 or 80 blocks) -> 6.40 / 6.54 / 6.75 / 7.27 /
 *   6.81 (`s56c`); 4 x 4 6.45 / 6.60 / 6.91 / 7.70 / 6.98 (`s56b`, `s55a`); at M = 1-3 every split
 *   lost (M = 3: 1.05x, M = 1: 1.16x).
 * - Past one wave where the one-block plan has one block a SM (x of K = 8192 at M = 7-8: 115-131 KB)
 *   on more blocks than SMs: 2 x 4 tiles, two blocks a SM, where that is at most DC_GS_WIDE_WAVES
 *   waves whose last is at least DC_GS_WIDE_FILL percent full. The Llama-3-70B gate|up shards at M =
 *   7 / 8 (the persistent grid of 128 blocks): tp = 2 (3.4 waves, 85%) 39.94 / 39.05 -> 39.43 / 37.84
 *   us, tp = 4 (1.7 waves, 85%) 23.29 / 22.82 -> 21.95 / 21.55 (`s56c`); the whole matrix, 6.8 waves,
 *   69.44 / 68.48 against 73.86 / 70.45 (`s55c`), and Llama-3-70B q|k|v (1.2 waves, 61%) 17.73 /
 *   17.32 against 17.74 / 17.41 (`s56c`), so not there.
 * DC_GS_S56 turns both on in dc_gs_pick_flags (AWQD_W4A16_DC_KS=2 leaves them out, as before). The
 * tensor-parallel sum epilogue still takes one-wave grids only (launch_decode), so the second case
 * never reaches it.
 */
#define DC_GS_MIN_K 6144
/* Session 63, with the column's last rank polling (w4a16.cu, DC_F_GSPOLL: a cheaper end than the
 * arrival counter's): K = 5120 too from M = 2 (40 groups, 13-14 a block of three). H200, back to
 * back, the rule against 3 x 4 forced (`s63f`, two runs): the Qwen3-32B tp = 2 q|k|v shard (5120
 * x 5120, 160 blocks of two tiles) at M = 2 / 4 / 8 6.32 / 6.73 / 7.44 -> 6.06 / 6.28 / 6.36 us,
 * at M = 1 6.11 -> 6.07 (left out: the fused-norm variant, which has no split, runs M = 1-2 in a
 * model anyway); no other shape of K = 5120 has a one-wave split at N >= 4096 */
#define DC_GS_MIN_K_POLL 5120
#define DC_GS_MIN_K_POLL_M 2
#define DC_GS_MIN_N16 256
#define DC_GS_NARROW_N16 160
#define DC_GS_NARROW_MIN_M 4
#define DC_GS_NARROW_MIN_K 8192 /* as measured; and only with a one-block plan */
#define DC_GS_WIDE_WAVES 4
#define DC_GS_WIDE_FILL 80
#define DC_GS_FILL_PCT 140
#define DC_GS_X_BYTES (64 * 1024) /* see "4 x 4 ... where its x is large" in dc_gs_pick */
#define DC_GS_MULTI 4                /* the candidates past one wave */
#define DC_GS_FILL_TOL 5             /* points of last-wave fill (session 55) */
#define DC_GS_S56 1                  /* dc_gs_pick_flags: session 56's two cases */
/* Waves of a split grid of two blocks a SM, and in *fill the percent of their slots it fills */
DC_FN int dc_gs_waves(const struct dc_plan *q, int sms, int *fill) {
    const int b = q->blocks * q->cl, slots = 2 * sms, waves = (b + slots - 1) / slots;
    *fill = 100 * b / (waves * slots);
    return waves;
}
DC_FN int dc_gs_pick_flags(const struct dc_plan *pl, const struct dc_gpu *g, int s56, struct dc_plan *out) {
    static const int cand[5][2] = {{6, 4}, {4, 4}, {3, 4}, {2, 4}, {2, 2}}, /* ks, tb */
        multi[DC_GS_MULTI][2] = {{4, 4}, {6, 4}, {8, 4}, {4, 2}};
    /* none: pl is dc_plan_none's stand-in (x of all of K fits no block) */
    const int none = !dc_smem_fits(g, pl->smem, pl->mt), sms = g->sms > 0 ? g->sms : 1,
              narrow = s56 && !none && pl->m >= DC_GS_NARROW_MIN_M && pl->n16 >= DC_GS_NARROW_N16 &&
                       pl->k >= DC_GS_NARROW_MIN_K;
    const int min_k = pl->m >= DC_GS_MIN_K_POLL_M ? DC_GS_MIN_K_POLL : DC_GS_MIN_K;
    if (pl->mt != 1 || pl->cl != 1 || pl->k < min_k || (pl->n16 < DC_GS_MIN_N16 && !narrow)) return 0;
    const int slots1 = none ? 0 : sms * dc_blocks_per_sm(g, pl->smem), res1 = pl->blocks < slots1 ? pl->blocks : slots1;
    int best = 0;
    for (int i = s56 ? 0 : 1; i < 5; i++) {
        struct dc_plan q;
        if (!dc_plan_gs(pl->m, pl->k, pl->n16, 128, g, cand[i][0], cand[i][1], pl->flags, &q) ||
            !dc_gs_one_wave(&q, g) || q.blocks * q.cl <= best)
            continue;
        best = q.blocks * q.cl;
        *out = q;
    }
    /* or 4 x 4 tiles of as many blocks as the one-block plan has resident, where its x is large
     * (x staged after the wait: each block of the split stages a quarter of it) */
    if (best > 0)
        return 100 * best >= DC_GS_FILL_PCT * res1 ||
               (best >= res1 && out->cl == 4 && dc_x_bytes(pl->m, pl->k) >= DC_GS_X_BYTES);
    if (!none) {
        /* past one wave only where there is no one-block plan, or (session 56) where it has one
         * block a SM on more than one wave: 2 x 4 tiles of at most DC_GS_WIDE_WAVES waves */
        struct dc_plan q;
        if (!s56 || slots1 != sms || pl->blocks <= sms ||
            !dc_plan_gs(pl->m, pl->k, pl->n16, 128, g, 2, 4, pl->flags, &q) || dc_blocks_per_sm(g, q.smem) < 2)
            return 0;
        int fill;
        if (dc_gs_waves(&q, sms, &fill) > DC_GS_WIDE_WAVES || fill < DC_GS_WIDE_FILL) return 0;
        *out = q;
        return 1;
    }
    /* of those with two blocks a SM, the fullest last wave (the share of the waves' slots the
     * grid fills), and of those within DC_GS_FILL_TOL points of it the fewest blocks */
    struct dc_plan c[DC_GS_MULTI];
    int fill[DC_GS_MULTI], nc = 0, top = 0, pick = -1;
    for (int i = 0; i < DC_GS_MULTI; i++) {
        struct dc_plan *q = &c[nc];
        if (!dc_plan_gs(pl->m, pl->k, pl->n16, 128, g, multi[i][0], multi[i][1], pl->flags, q) ||
            dc_blocks_per_sm(g, q->smem) < 2)
            continue;
        dc_gs_waves(q, sms, &fill[nc]);
        if (fill[nc] > top) top = fill[nc];
        nc++;
    }
    for (int i = 0; i < nc; i++)
        if (fill[i] + DC_GS_FILL_TOL >= top && (pick < 0 || c[i].blocks * c[i].cl < c[pick].blocks * c[pick].cl))
            pick = i;
    if (pick < 0) return 0;
    *out = c[pick];
    return 1;
}

DC_FN int dc_gs_pick(const struct dc_plan *pl, const struct dc_gpu *g, struct dc_plan *out) {
    return dc_gs_pick_flags(pl, g, DC_GS_S56, out);
}

/* A stand-in one-block plan at m <= 8 rows where x of all of K leaves none
 * (dc_plan_make refused it): one tile a block, every column its block, and
 * more shared memory than a block may have (none resident), for dc_gs_pick */
DC_FN void dc_plan_none(int m, int K, int n16, int flags, struct dc_plan *pl) {
    pl->m = m;
    pl->mt = 1;
    pl->tb = 1;
    pl->cl = 1;
    pl->gs = 0;
    pl->k = K;
    pl->n16 = n16;
    pl->blocks = n16;
    pl->pf = 0;
    pl->smem = dc_smem_bytes(m, K, 1, 1);
    pl->wbytes = (size_t)8 * K;
    pl->flags = flags;
}
/* dc_gs_pick for m rows of (K, n16), against the one-block plan or, where
 * there is none at m <= 8, the stand-in (the K split then the only decode
 * plan: Qwen3-32B down at M = 4, x of 200 KB) */
DC_FN int dc_gs_pick_any(int m, int K, int n16, int group, const struct dc_gpu *g, int flags, struct dc_plan *out) {
    struct dc_plan pl;
    if (!dc_plan_make(m, K, n16, group, g, 0, flags, &pl)) {
        if (m < 1 || m > 8 || group != 128) return 0;
        dc_plan_none(m, K, n16, flags, &pl);
    }
    return dc_gs_pick(&pl, g, out);
}

/* Where the dispatch runs the decode kernel as the cluster K split
 * (dc_plan_cluster, two blocks a column): K = 8192 at M = 12-24 (each block
 * x of 4096 columns, where the kernel measured best), at M = 17-24 on
 * matrices of up to 28672 columns, not the 5120-column ones at M = 13-16,
 * where the skinny kernel's one-wave split is faster. Before the wgmma GEMM's rules
 * (nat_rule.h) at M = 17-24. H200, session 50, back to back, `bench kernels
 * --set all --b2b-audit`, two runs, the split forced against the pick of
 * one block a column: Llama-3-70B gate|up at M = 12 / 16 111.2 / 113.0 ->
 * 90.0 / 90.2 us (the skinny kernel before), its tp = 2 shard 54.6 / 56.5
 * -> 47.1 / 47.2, o 0.92-0.93x, q|k|v M = 16 0.92x, its tp = 4 shard M =
 * 12-24 0.85-0.93x; at M = 20 / 24 against the wgmma GEMM o 26.3 -> 20.3 /
 * 20.8, q|k|v 33.3 -> 24.6 / 25.1, the tp = 4 gate|up shard 41.5 -> 33.5 /
 * 33.9, the tp = 2 one 69.4 -> 65.2 / 65.8; Qwen3-32B o and the Llama-3-70B
 * tp = 2 q|k|v shard (K = 8192, N = 5120) at M = 12 / 20 / 24 0.85-0.87x,
 * but at M = 16 1.13x (15.9 against the skinny kernel's 14.1). Not: M = 9
 * (1.09-1.33x the one-block kernel at K = 8192), Llama-3-70B gate|up at M =
 * 24 (57344 columns: 1.01x the wgmma GEMM), K = 4096 (the one-block kernel
 * 1.02-1.8x faster: Qwen3-8B q|k|v, gate|up, the o shards), K = 5120 (20
 * groups a block, 2 or 3 a warp: Qwen3-32B q|k|v and gate|up 1.1-1.7x). */
#define DC_CL_K 8192
#define DC_CL_MIN_M 12
#define DC_CL_MAX_N 28672
DC_FN int dc_cl_takes(int m, int K, int n) {
    return K == DC_CL_K && m >= DC_CL_MIN_M && m <= DC_MAX_M && (m <= 16 || n <= DC_CL_MAX_N) &&
           !(m >= 13 && m <= 16 && n == 5120);
}

/* Whether the automatic dispatch runs the decode kernel for a plan pl at m
 * rows (pl: its plan, or NULL when there is none), with max_m the last M
 * allowed (DC_DISPATCH_MAX_M, or lower for measurements). M <= 2: wherever
 * the kernel applies (faster than the skinny kernel on every shape, H200
 * session 4). M = 3..8 (H200 sessions 21-22, back to back, x staged
 * through L1): where two blocks fit per SM, or where one does and the grid
 * is one wave that either fills at least 90% of the SMs (Qwen3-8B down at
 * M = 5-7, 128 blocks) or gives each block at most 256 KB of weights
 * (DC_ONE_WAVE_WBYTES). One block per SM on fewer SMs with more to stream
 * is slow because each of the kernel's blocks streams at only ~15 GB/s, its
 * warps latency-bound (session 23, docs/PERFORMANCE.md item 4): the widened
 * Qwen3-32B down at
 * M = 3 (80 blocks of 800 KB) 30.7 us against the skinny kernel's 26.3, its
 * tp = 2 down at M = 6 (80 of 400 KB) 17.6 against 16.5; the Llama-3-70B
 * tp = 4 q|k|v shard at M = 7-8 (80 of 128 KB) 8.4-8.6 against 9.0-9.4,
 * Qwen3-32B o at M = 8 (80 of 256 KB) 12.4 against 12.8. One block per SM
 * over several waves (session 23, H200, the --b2b-audit of 28 shapes at
 * M = 3-8; nine such points): where the waves are at least 80% full on
 * average (DC_WAVE_FILL_PCT; blocks >= 0.8 x waves x SMs: the 448 blocks
 * of the tp = 2 shard are 4 waves of 132, 85%, its last 39%) and x is no
 * more than the block's weight: the Llama-3-70B gate|up and its tp = 2 / 4
 * shards at
 * M = 7-8 (896 / 448 / 224 blocks of 256 KB, x 112-128 KB) 0.85-0.94x the
 * skinny kernel's time (tp = 2 at M = 8: 1.00x); then not its q|k|v (160
 * blocks: the second wave 21% full, 1.19-1.27x) nor Qwen3-8B down at M = 8
 * (256 blocks of 96 KB, each staging 192 KB of x: 1.13x). Since session 34
 * (the zero point in fp16) any grid of two waves: those two now took
 * 0.88-0.93x (q|k|v at M = 7-8) and 0.92x (down) the skinny kernel's time
 * (the audit at M = 3-8: no other point refused where the kernel won).
 *
 * M = 9..16 (MT = 2; H200 session 34, the audit of 28 shapes at M = 9, 10,
 * 12, 14, 16 against the skinny kernel, back to back, after the zero point
 * moved into fp16 made the kernel 0.88-0.93x faster at M = 16): never two
 * blocks per SM on a grid of at most one block per SM (Qwen3-8B o at M =
 * 9-12, 128 blocks: 0.98-1.07x the skinny kernel's time; the Qwen3-32B tp
 * = 4 q|k|v shard at M = 9, 80 blocks: 1.21x). Otherwise, up to K = 4096
 * (DC_MT2_MAX_K) everywhere: Qwen3-8B q|k|v 0.71-0.87x, o at M = 14-16
 * 0.76-0.79x, gate|up (768 blocks, the persistent grid) 0.75-0.91x, the o
 * shards 0.63-0.94x; above it only a grid of one wave, or of two waves at
 * least 90% full: the tp = 4 q|k|v shards (80 blocks) 0.83-0.92x, Qwen3-32B
 * q|k|v tp = 2 at M = 9 (160, two per SM) 0.83x, Llama-3-70B o (256, one
 * per SM) 0.88-0.92x, its tp = 4 down 0.88-0.92x — the 160-block grids of
 * one per SM lost 1.02-1.19x (Qwen3-32B o, the q|k|v tp = 2 shards at M >=
 * 10, its tp = 4 down), the K = 5120 multi-wave plain grids 1.06-1.41x
 * (Qwen3-32B gate|up and its shards), and Llama-3-70B gate|up (7-14 waves)
 * went either way (0.90-1.08x). (Session 22's rule, from the kernel with a
 * second mma per k16 step: only K <= 4096, two per SM on one to two SMs'
 * worth of blocks or one per SM in a wave of >= 90% of the SMs.) Session
 * 21's rule (pl made with DC_PLAN_S21): M <= 8 only, one block per SM in
 * one wave of any size.
 *
 * M = 17..24 (MT = 3, one block per SM; H200 session 35, the audit of 28
 * shapes at M = 17, 18, 20, 22, 24 against the skinny kernel, back to back):
 * the M = 9..16 rule. Up to K = 4096 every point won: Qwen3-8B q|k|v
 * 0.75-0.80x, o 0.66-0.75x, gate|up (the persistent grid) 0.71-0.74x, the
 * Qwen3-32B / Llama-3-70B o shards 0.70-0.92x. Above, x fits only at K =
 * 5120 and M <= 19: the tp = 4 q|k|v shard (80 blocks, one wave) 0.77x
 * taken; not taken: Qwen3-32B q|k|v (320 blocks, 3 waves; it won there,
 * 0.83x), its tp = 2 shard (1.00-1.01x), gate|up and its shards (4-13 waves:
 * 1.03-1.11x).
 *
 * Session 42 (x staged group by group; H200, bench kernels --b2b-audit at M
 * = 9-27, two runs): above K = 4096 also K = 5120 on at most 3 x SMs blocks
 * (DC_MT2_WAVES3_MAX_K): Qwen3-32B q|k|v (320 blocks) 0.84-0.94x the skinny
 * kernel at M = 9-16 and 0.83x at 17-18, its tp = 2 shard (160) 0.88-0.98x
 * at M = 10-16 and 0.97-1.0x at 17-18; not its gate|up shards (400-1600
 * blocks: 1.06-1.26x). Qwen3-32B end to end batch 16 (q|k|v the only
 * change) +0.6%. The grids the persistent grid takes at K = 8192 also won
 * back to back (Llama-3-70B q|k|v 0.81-0.86x, gate|up and its shards
 * 0.83-0.95x, Qwen3-32B o 0.95-1.0x at M = 9-11) but Qwen3-32B end to end
 * at batch 10, with its o on the decode kernel too, was 0.6% slower: not
 * taken (docs/PERFORMANCE.md "Session 42"). */
DC_FN int dc_ps_tb4_takes(const struct dc_plan *pl, const struct dc_gpu *g);
#define DC_ONE_WAVE_WBYTES (256 * 1024)
#define DC_WAVE_FILL_PCT 80
DC_FN int dc_dispatch_takes(int m, int max_m, const struct dc_plan *pl, const struct dc_gpu *g) {
    const int s21 = pl && (pl->flags & DC_PLAN_S21);
    if (!pl || m > max_m || (s21 && m > 8)) return 0;
    if (m <= 2) return 1;
    const int two = dc_slots_per_sm(g, pl->smem, pl->mt) >= 2, wave = 10 * pl->blocks >= 9 * g->sms;
    if (pl->mt >= 2) {
        if (two && pl->blocks <= g->sms) return 0; /* two per SM on a part of the SMs */
        if (pl->k <= DC_MT2_MAX_K) return 1;
        const int slots = (two ? 2 : 1) * g->sms, waves = (pl->blocks + slots - 1) / slots;
        if (waves == 1 || (waves == 2 && 10 * pl->blocks >= 9 * waves * slots)) return 1;
        /* session 42 (x group by group): K = 5120 on at most 3 SMs' worth of blocks */
        if (pl->k <= DC_MT2_WAVES3_MAX_K && pl->blocks <= 3 * g->sms) return 1;
        /* session 48: past that, the persistent grid of four tiles per block
         * (x staged once per block instead of once per column) */
        return dc_ps_tb4_takes(pl, g);
    }
    if (two) return 1;
    if (pl->blocks > g->sms) { /* one block per SM, several waves */
        const int waves = (pl->blocks + g->sms - 1) / g->sms;
        return !s21 && (waves == 2 || (100 * pl->blocks >= DC_WAVE_FILL_PCT * waves * g->sms &&
                                       dc_x_bytes(m, pl->k) <= pl->wbytes));
    }
    return s21 || wave || pl->wbytes <= DC_ONE_WAVE_WBYTES;
}

/* The persistent grid (k_decode's PS variant; AWQD_W4A16_DC_PS=0 turns it
 * off): where the plan's grid needs more than one wave of the block slots
 * (SMs x blocks per SM), a grid of at most one block per slot whose blocks
 * each stream waves or waves - 1 columns back to back through one register
 * ring, the last ring turn of a column requesting the first of the next, so
 * that a column's start no longer waits a memory latency and a block's
 * launch, x and norm are paid once per block. Needs every warp's K range to
 * be whole ring turns (K / 128 groups divisible by 8 warps x 4 / TB groups
 * per turn). The tiles per block are chosen again (among those with whole
 * turns, unless tb_fixed) for the fullest waves: blocks / (waves x slots),
 * the share of the slots busy until the last column ends (a wider block
 * wins ties within 2 points), and ceil(blocks / waves) blocks each stream
 * waves or waves - 1 columns. Where no TB reaches DC_PS_FILL_PCT, the
 * plan's TB (if its turns are whole) on one block per slot instead, the
 * last wave as ragged as the plain grid's. Returns the grid and rewrites
 * pl's tb, blocks (columns), smem, wbytes and pf (only pf, 0, on the ragged
 * grid), or 0 for the plain grid. At MT >= 2, where the plan's TB
 * has no whole turns, the TB with the fullest waves among those that have
 * them, at any fill (dc_ps_tb4).
 *
 * H200, session 25, back to back against the plain grid: Qwen3-8B gate|up
 * at M = 1-8 (TB = 2, 768 columns on 256 blocks) 0.85-0.94x the time (M = 1
 * 16.4 -> 15.4 us, 79% of the copy rate), its down at M = 8 0.85x,
 * Llama-3-70B gate|up at M = 8 0.89x, its tp = 2 shard at M = 1-4 and 8
 * 0.94-0.98x; the other Llama-3-70B gate|up points within -1..+5%. Qwen3-8B
 * end to end, batch 1 / 2 / 4 / 8: +3 / +8 / +2 / +4% tokens per second.
 * The plan's own grid with ceil(blocks / waves) persistent blocks (no
 * choice of TB) lost where that left slots empty: Qwen3-32B gate|up (800
 * blocks on 200 of 264 slots) 1.04-1.10x at M = 1-4, Llama-3-70B gate|up
 * (896 on 224) 1.04-1.09x; hence the fill rule. Qwen3-32B gate|up (K =
 * 5120: whole turns only at TB = 4, 76%) on one block per slot (264) is
 * 0.96 / 0.95 / 0.94 / 0.89x the plain grid at M = 1 / 2 / 4 / 8, its tp =
 * 2 shard (400 blocks) 1.00 / 1.00 / 0.98 / 0.94x; Qwen3-32B with 16
 * layers, batch 1 / 4: 484 -> 500, 1823 -> 1852 tok/s. */
#define DC_PS_FILL_PCT 90
/* DC_PS_TWO_WAVES: where no TB fills the waves and the plan's grid is two
 * waves of two blocks per SM at MT = 1 (M <= 8; with one block per SM
 * fewer blocks would leave SMs idle: not measured, not taken),
 * ceil(blocks / 2) blocks of two columns each
 * instead of one block per slot (the first blocks % slots taking a second
 * column, the rest ending half way). H200, session 52, back to back: the
 * Qwen3-32B tp = 2 gate|up shard (K = 5120, TB = 4: 400 columns) on 200
 * blocks instead of 264 at M = 1 / 8 20.53-20.67 -> 19.67-19.74 / 21.75-21.82
 * -> 21.33-21.40 us (the grid forced by a knob of that experiment); the same
 * shape is the only two-wave ragged grid of `bench kernels --set all`. Over
 * four waves it lost (Qwen3-32B gate|up, 800 columns: 200 blocks of four
 * 38.2 against 35.3 us; session 25: 1.04-1.10x), and one block per SM is
 * slower still (134 blocks: 27.7 / 53.6 us), so the rule stops at two. */
/* MT = 2 (M = 9..16) may take one tile per block on the persistent grid
 * where one block fits per SM (DC_PLAN_TB1, the default; without the
 * 128-register cap: 216-227 registers, no spills). Its TB = 2 leaves
 * ragged waves on some grids (Qwen3-8B q|k|v at M = 13-16: 192 columns on
 * 132 slots, 73% full; 384 of TB = 1 fill 97%). H200, session 38, back to
 * back, the decode kernel forced at M = 9-24 on the 28 shapes, two runs
 * each: Qwen3-8B q|k|v M = 16 9.03 -> 8.52 us (0.94x), Llama-3-70B q|k|v M
 * = 9 20.13 -> 19.10 (0.95x), every other point within +-1% (the plan
 * unchanged). At MT = 3 it was mixed (q|k|v M = 20 0.97x, M = 24 1.03x):
 * not taken. */
DC_FN int dc_ps_tb1(const struct dc_plan *pl) { return pl->mt == 2 && (pl->flags & DC_PLAN_TB1); }
/* ... and four tiles per block (DC_PLAN_TB4, the default since session 48;
 * 255 registers, no spills): one ring turn is then one group, so every K
 * has whole turns, and each x fragment feeds 8 independent mma chains
 * instead of 4. Where TB = 2 has no whole turns (K = 5120: 5 groups a
 * warp) the persistent grid takes TB = 4 at any fill (the plain grid
 * stages x, up to 164 KB, once per block: 1600 blocks for Qwen3-32B
 * gate|up), and the dispatch takes that grid past its other M = 9..16
 * rules (dc_ps_tb4_takes). H200, session 48, back to back, one binary,
 * AWQD_W4A16_DC_TB4=0 / 1: Qwen3-32B gate|up at M = 9 / 12 / 16 62.6 /
 * 68.3 / 70.9 us (the skinny kernel) -> 48.7 / 49.1 / 50.2 (TB = 4, 800
 * columns on 115 blocks, 63-65% of the copy rate), its tp = 2 / 4 shards
 * 0.75-0.91x / 0.80-0.86x, its q|k|v 0.84-0.99x (160 columns on 80 blocks
 * against the plain grid of 320), Qwen3-8B gate|up at M = 12 / 16 0.92x
 * (TB 4 ties TB 2 at 97% fill: the wider block wins), Llama-3-70B gate|up
 * at M = 9 92.8 -> 73.9 us; no other point of --set 8b / 32b / 70b at M
 * = 9 / 12 / 16 changed its kernel or plan. qwen3-32b end to end at batch
 * 9-16 0.86-0.87x a step at tp = 1, 0.92x at tp = 2; Qwen3-8B 0.98x
 * (docs/PERFORMANCE.md "Session 48"). */
DC_FN int dc_ps_tb4(const struct dc_plan *pl) { return pl->mt == 2 && (pl->flags & DC_PLAN_TB4); }
/* Whether every warp's range of a block's kg groups is whole ring turns of
 * TB tiles (4 / TB groups): equal ranges of whole turns; with the cluster
 * K split (cl > 1) also unequal ones at TB = 4 (one group a turn: K = 5120
 * as two blocks of 20 groups, 2 or 3 a warp) */
DC_FN int dc_whole_turns(int kg, int tb, int cl) {
    return kg % (DC_WARPS * (4 / tb)) == 0 || (cl > 1 && tb == 4 && kg >= DC_WARPS);
}
/* DC_PS_NO_PF: the persistent grid streams without the L2 prefetch (pf 0;
 * only MT = 1 with one block a SM had it). H200, session 55, back to back,
 * the prefetch off against on (`s55c`, two runs): Llama-3-70B gate|up at M =
 * 7 / 8 (896 columns of four tiles on 128 blocks) 71.3 / 70.6 -> 69.4 / 68.5
 * us, its tp = 2 shard 41.2 / 40.9 -> 39.3 / 38.8, the tp = 4 shard and
 * q|k|v (1.2-1.7 waves) 0.99-1.0x; it stays on the plain grid, where it
 * still gains (the Llama-3-70B tp = 4 q|k|v shard at M = 7-8, 80 blocks:
 * 1.016x the time without). Session 24 measured it before the persistent
 * grid (session 25) and x staged group by group (session 51). */
DC_FN int dc_ps_plan(struct dc_plan *pl, const struct dc_gpu *g, int tb_fixed) {
    const int sms = g->sms > 0 ? g->sms : 1, kg = pl->k / 128,
              plan_slots = sms * dc_slots_per_sm(g, pl->smem, pl->mt);
    if (pl->blocks <= plan_slots) return 0;
    int best_tb = 0, best_fill = 0, best_grid = 0;
    for (int tb = 4; tb >= 1; tb /= 2) {
        if ((tb_fixed && tb != pl->tb) ||
            (pl->mt >= 2 && tb != 2 && !(tb == 1 && dc_ps_tb1(pl)) && !(tb == 4 && dc_ps_tb4(pl))) ||
            !dc_whole_turns(kg, tb, pl->cl))
            continue;
        const size_t smem = dc_smem_cl(pl->m, pl->k, tb, pl->mt, pl->cl);
        if (!dc_smem_fits(g, smem, pl->mt)) continue;
        if (pl->mt >= 2 && tb != 2 && dc_blocks_per_sm(g, smem) > 1) continue; /* spills at 128 registers */
        const int slots = sms * dc_slots_per_sm(g, smem, pl->mt), blocks = (pl->n16 + tb - 1) / tb;
        if (slots < 1 || blocks <= slots) continue;
        const int waves = (blocks + slots - 1) / slots, fill = (int)(100L * blocks / ((long)waves * slots));
        if (fill > best_fill + 2) best_tb = tb, best_fill = fill, best_grid = (blocks + waves - 1) / waves;
    }
    if (!best_tb || best_fill < DC_PS_FILL_PCT) {
        /* no TB fills the waves: the plan's TB on one block per slot (the
         * first blocks % slots of them take one column more), where its
         * turns are whole; pl untouched but its pf. At MT = 1 over two waves of two
         * blocks per SM, every block two columns instead (DC_PS_TWO_WAVES) */
        if (dc_whole_turns(kg, pl->tb, pl->cl)) {
            pl->pf = 0; /* see DC_PS_NO_PF */
            return pl->mt == 1 && plan_slots > sms && pl->blocks <= 2 * plan_slots ? (pl->blocks + 1) / 2
                                                                                   : plan_slots;
        }
        /* at MT >= 2 the plain grid stages x (up to 164 KB) in every one
         * of its blocks: any TB with whole turns beats it */
        if (!best_tb || pl->mt < 2) return 0;
    }
    pl->tb = best_tb;
    pl->blocks = (pl->n16 + best_tb - 1) / best_tb;
    pl->smem = dc_smem_cl(pl->m, pl->k, best_tb, pl->mt, pl->cl);
    pl->wbytes = (size_t)best_tb * 8 * pl->k;
    pl->pf = 0; /* DC_PS_NO_PF */
    return best_grid;
}

/* Whether the persistent grid plans four tiles per block at MT = 2 for pl
 * (dc_ps_tb4: where TB = 2 has no whole ring turns, K = 5120) */
DC_FN int dc_ps_tb4_takes(const struct dc_plan *pl, const struct dc_gpu *g) {
    if (!dc_ps_tb4(pl)) return 0;
    struct dc_plan q = *pl;
    return dc_ps_plan(&q, g, 0) && q.tb == 4;
}

/* ZM's form for a decode launch (k_decode's ZM, docs/KERNELS.md "ZM" and
 * "ZM1"): 0 none (the zero point by HSUB2), 1 the sums of x by one more mma
 * a k16 step, 2 by one mma a group — valid at M = 1 only, where every
 * column of x's fragment is the same row. m, tb: the launch's rows and
 * tiles a block; k: a block's K (dc_plan's k); grid: DC_GRID_PLAIN,
 * DC_GRID_PS (persistent) or DC_GRID_GS (the K split through global
 * memory); zm_max: the largest M that takes ZM (AWQD_W4A16_DC_ZM, 0 off);
 * zm1: AWQD_W4A16_DC_ZM1 (0 no form 2, 1 the rule, 2 form 2 at every M = 1
 * point that takes ZM, for measurements).
 * Form 1 (session 69, H200 back to back): four tiles a block at every M <=
 * 8 (0.94-0.997x; Qwen3-32B q|k|v 0.913-0.939x); two tiles at M <= 4
 * (0.945-0.967x); one tile only where a warp's range is three ring turns or
 * more, K >= 12288 (Qwen3-8B down 0.982-0.992x; on one or two turns the
 * extra mma doubles the tensor work: Qwen3-8B o 1.006-1.014x).
 * Form 2 (session 70, H200 back to back, against the form the rest of the
 * rule gives, three and six runs): one tile where a warp's range is one or
 * two whole ring turns (K = 4096, 8192: Qwen3-8B o 0.970-0.977x, the
 * Llama-3-70B tp = 2 gate|up shard 0.946-0.955x; K = 5120 1.021-1.030x, K =
 * 12288 1.006-1.008x against form 1); in place of form 1 at two or four
 * tiles on the persistent grid and the K split (Qwen3-8B gate|up, Qwen3-32B
 * gate|up, o and down and its tp = 2 / 4 down shards, Llama-3-70B gate|up
 * and its tp = 2 q|k|v shard: 0.975-0.993x) and on the plain grid where a
 * warp's range is at most 4 groups, K <= 4096 (Qwen3-8B q|k|v 0.984x, the
 * o shards of Qwen3-32B / Llama-3-70B at tp = 2 and 4 0.952-0.989x) — not
 * on longer plain ranges (Qwen3-32B q|k|v and its tp = 2 shard at K = 5120
 * 1.009-1.032x, Llama-3-70B o and down and its down shards at K >= 7168
 * 1.002-1.016x). */
#define DC_GRID_PLAIN 0
#define DC_GRID_PS 1
#define DC_GRID_GS 2
DC_FN int dc_zm_form(int m, int tb, int k, int grid, int zm_max, int zm1) {
    if (m < 1 || m > zm_max) return 0;
    const int f1 = tb >= 4 || (m <= 4 && (tb >= 2 || k >= 12288));
    if (m > 1 || !zm1) return f1;
    if (tb == 1 && k < 12288 && dc_whole_turns(k / 128, 1, 1)) return 2;
    if (f1 && (zm1 == 2 || (tb >= 2 && (grid != DC_GRID_PLAIN || k <= 4096)))) return 2;
    return f1;
}

#endif
