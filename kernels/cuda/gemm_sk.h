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
 * by all of its blocks through the workspace (w4a16_gemm.cu gk_dr_store).
 * Its pick, from kc 64-deep chunks, n16 16-row column tiles, sms SMs:
 * among 1 x 64 and 2 x 64 tiles (128 / 256 rows), the split in [4, 8]
 * (one that divides kc into equal-enough ranges: ceil(kc / ceil(kc / ks))
 * == ks) whose grid (tiles x ks <= sms) fills the most SMs, at least 3 / 4
 * of them; ties to 2 x 64. Only where K >= 4096 (kc >= 64). Measured on
 * the H200 (docs/PERFORMANCE.md "Session 36" item 6): fewer splits (2-3:
 * the tp = 4 gate|up shards, Qwen3-32B / Llama-3-70B q|k|v) or K = 2048
 * (Llama-3-70B tp = 4 o) lost 1-17% to stream-K. Returns ks (0: none) and
 * *mt. */
#define GK_DR_MIN_SPLIT 4
#define GK_DR_MAX_SPLIT 8
#define GK_DR_MIN_KC 64
/* The split for a grid of `tiles` tiles (0: none), setting *blocks. */
SK_FN int gk_dr_split(int kc, int tiles, int sms, int *blocks) {
    if (kc < GK_DR_MIN_KC) return 0;
    for (int ks = GK_DR_MAX_SPLIT; ks >= GK_DR_MIN_SPLIT; ks--) {
        const int cps = (kc + ks - 1) / ks, b = tiles * ks;
        if ((kc + cps - 1) / cps == ks && b <= sms && 4 * b >= 3 * sms) {
            *blocks = b;
            return ks;
        }
    }
    return 0;
}
SK_FN int gk_dr_pick(int kc, int n16, int sms, int *mt) {
    int best = 0, ks_best = 0;
    for (int t = 2; t >= 1; t--) {
        int blocks = 0;
        const int ks = gk_dr_split(kc, (n16 + 8 * t - 1) / (8 * t), sms, &blocks);
        if (ks && blocks > best) {
            best = blocks;
            ks_best = ks;
            *mt = t;
        }
    }
    return ks_best;
}
#undef SK_FN
#undef SK_MIN

#endif
