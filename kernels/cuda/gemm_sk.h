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

#undef SK_FN
#undef SK_MIN
#endif
