/* gemm_sk.h — how the INT4 wgmma GEMM's persistent grid (kernels/cuda/
 * w4a16_gemm.cu, mode 4) splits its work among its blocks: whole tiles
 * first, then stream-K over the rest. Plain integer arithmetic, shared by
 * the kernel (device code) and a CPU test (tests/test_gemm_sk.c), so the
 * partition's invariants (every chunk step once; a block parks at most one
 * piece; a cut tile's head is its block's last piece and gathers exactly
 * the tile's other pieces, each the first stream-K piece of a later block)
 * are checked in CI, where no GPU runs the kernel.
 *
 * Terms: G blocks (one per SM), ntiles output tiles of nk chunk steps (64 k
 * each). Tiles [0, skD) go whole to blocks b, b + G, ... ; the skT = (ntiles
 * - skD) nk chunk steps after them are cut into G contiguous equal shares,
 * block b taking steps [sk_share(b), sk_share(b + 1)), and each share again
 * at tile boundaries into pieces: tile `tile`, chunks [kb, ke). skT == 0:
 * every tile whole (skD == ntiles). */
#ifndef AWQD_GEMM_SK_H
#define AWQD_GEMM_SK_H

#ifdef __CUDACC__
#define SK_FN static __host__ __device__ __forceinline__
#define SK_MIN(a, b) min(a, b)
#else
#define SK_FN static inline
#define SK_MIN(a, b) ((a) < (b) ? (a) : (b))
#endif

struct sk_work {
    int d;     /* next whole tile */
    int i, i1; /* next stream-K step, end of the share */
    int tile, kb, ke;
};

/* The first chunk step (counted over all tiles) of block b's share. */
SK_FN int sk_share(int b, unsigned G, int skD, int skT, int nk) {
    return skD * nk + (int)((long long)b * skT / G);
}

SK_FN void sk_work_init(struct sk_work *w, int b, unsigned G, int skD, int skT, int nk) {
    w->d = b;
    w->i = skT ? sk_share(b, G, skD, skT, nk) : 0;
    w->i1 = skT ? sk_share(b + 1, G, skD, skT, nk) : 0;
}

/* The block's next piece into w->tile, kb, ke; 0 when it has none left. */
SK_FN int sk_work_next(struct sk_work *w, unsigned G, int skD, int nk) {
    if (w->d < skD) {
        w->tile = w->d;
        w->kb = 0;
        w->ke = nk;
        w->d += G;
        return 1;
    }
    if (w->i >= w->i1) return 0;
    w->tile = w->i / nk;
    w->kb = w->i - w->tile * nk;
    w->ke = SK_MIN(nk, w->kb + (w->i1 - w->i));
    w->i += w->ke - w->kb;
    return 1;
}

/* Tiles taken whole before stream-K: all but the last full wave and the
 * ragged one (stream-K over a whole grid of many waves lost the blocks'
 * shared L2 reads: docs/KERNELS.md "Stream-K"). */
SK_FN int sk_whole_tiles(int ntiles, int G) {
    const int q = ntiles / G;
    return q > 1 ? (q - 1) * G : 0;
}

/* Mode 6 (session 36): at M <= 64 a K split of the one token tile reduced
 * by all of its blocks through the workspace (w4a16_gemm.cu gk_dr_store);
 * mode 7 (session 37): the same with three consumer warpgroups and tiles
 * of 192 rows. The pick, from kc 64-deep chunks, n16 16-row column tiles,
 * sms SMs, over three tiles: mode 6 at 1 x 64 (128 rows) and 2 x 64 (256
 * rows) with splits in [4, 8], mode 7 (mt 1, 192 rows) with splits in
 * [3, 8]. A split must divide kc into equal-enough ranges (ceil(kc /
 * ceil(kc / ks)) == ks) and its grid (tiles x ks <= sms) fill at least
 * 3 / 4 of the SMs. Only where K >= 4096 (kc >= 64).
 * - K <= 6400 (kc <= GK_DR_FEW_KC): the fewest splits, ties to the smaller
 *   tile. With 10-25 chunks a block, its fixed costs (the pipeline's fill,
 *   parking and summing a partial per split) outweigh the balance of the
 *   grid: Qwen3-8B o 1 x 64 split 4 took 0.89x the time of 2 x 64 split 8,
 *   q|k|v mode 7 split 4 0.86x 2 x 64 split 5 (H200 sweep,
 *   docs/PERFORMANCE.md "Session 37").
 * - Larger K: the split of 1 x 64 or 2 x 64 whose grid fills the most SMs,
 *   ties to 2 x 64 (session 36): there the work of a block rules and mode 7
 *   at its coarser grids lost up to 1.12x.
 * Measured on the H200 (docs/PERFORMANCE.md "Session 36" item 6): fewer
 * splits in mode 6 (2-3: the tp = 4 gate|up shards, Qwen3-32B /
 * Llama-3-70B q|k|v) or K = 2048 (Llama-3-70B tp = 4 o) lost 1-17% to
 * stream-K. Returns ks (0: none), *mt and *mode (6 or 7). */
#define GK_DR_MIN_SPLIT 4
#define GK_DR7_MIN_SPLIT 3
#define GK_DR_MAX_SPLIT 8
#define GK_DR_MIN_KC 64
#define GK_DR_FEW_KC 100
/* 1 when split ks of a grid of `tiles` tiles runs mode 6 / 7 on sms SMs */
SK_FN int gk_dr_fills(int kc, int tiles, int sms, int ks) {
    const int cps = (kc + ks - 1) / ks, b = tiles * ks;
    return (kc + cps - 1) / cps == ks && b <= sms && 4 * b >= 3 * sms;
}
/* The largest split for a grid of `tiles` tiles (0: none), setting *blocks. */
SK_FN int gk_dr_split(int kc, int tiles, int sms, int *blocks) {
    if (kc < GK_DR_MIN_KC) return 0;
    for (int ks = GK_DR_MAX_SPLIT; ks >= GK_DR_MIN_SPLIT; ks--)
        if (gk_dr_fills(kc, tiles, sms, ks)) {
            *blocks = tiles * ks;
            return ks;
        }
    return 0;
}
/* allow7 0: mode 6 only (AWQD_W4A16_GEMM_WG3=0) */
SK_FN int gk_dr_pick(int kc, int n16, int sms, int allow7, int *mt, int *mode) {
    if (kc < GK_DR_MIN_KC) return 0;
    int ks_best = 0;
    if (kc <= GK_DR_FEW_KC) {
        for (int c = 0; c < 3; c++) { /* by rows (128 + 64 c): 1 x 64, mode 7, 2 x 64 */
            if (c == 1 && !allow7) continue;
            const int rows = 128 + 64 * c, tiles = (n16 * 16 + rows - 1) / rows;
            for (int ks = c == 1 ? GK_DR7_MIN_SPLIT : GK_DR_MIN_SPLIT; ks <= GK_DR_MAX_SPLIT; ks++)
                if (gk_dr_fills(kc, tiles, sms, ks)) {
                    if (!ks_best || ks < ks_best) {
                        ks_best = ks;
                        *mt = c == 2 ? 2 : 1;
                        *mode = c == 1 ? 7 : 6;
                    }
                    break;
                }
        }
        return ks_best;
    }
    int best = 0;
    for (int t = 2; t >= 1; t--) {
        int blocks = 0;
        const int ks = gk_dr_split(kc, (n16 + 8 * t - 1) / (8 * t), sms, &blocks);
        if (ks && blocks > best) {
            best = blocks;
            ks_best = ks;
            *mt = t;
            *mode = 6;
        }
    }
    return ks_best;
}
#undef SK_FN
#undef SK_MIN

#endif
