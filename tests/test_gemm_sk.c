/* test_gemm_sk.c — the work partition of the INT4 wgmma GEMM's persistent
 * grid (kernels/cuda/gemm_sk.h): whole tiles, then stream-K shares cut at
 * tile boundaries. The kernel (sm_90a only; tests/gpu/test_w4a16_gemm.c runs
 * it) relies on these invariants for its results and for not hanging: its
 * head blocks wait for the pieces of later blocks. Every block of a grid is
 * simulated here on the CPU, over many tile counts, chunk counts and grid
 * sizes. */
#include "tests/harness/test.h"

#include "kernels/cuda/gemm_sk.h"

#include <stdlib.h>
#include <string.h>

/* One grid of G blocks over ntiles tiles of nk chunk steps, stream-K on or
 * off (the host's sk_whole / skT rule, w4a16_gemm.cu). */
static void check_grid(int ntiles, int nk, int G, int sk) {
    const int skD = sk ? sk_whole_tiles(ntiles, G) : ntiles;
    const int skT = sk ? (ntiles - skD) * nk : 0;
    if (sk && skT < G) return; /* never run: the host asks for >= 2 steps per block */
    unsigned char *seen = calloc((size_t)ntiles * nk, 1);
    int *head = malloc(sizeof(int) * (size_t)ntiles);  /* block holding a cut tile's chunk 0 */
    int *parked = malloc(sizeof(int) * (size_t)G);     /* tile of the block's parked piece, or -1 */
    unsigned char *gathered = calloc((size_t)G, 1);
    ASSERT(seen && head && parked && gathered);
    for (int t = 0; t < ntiles; t++) head[t] = -1;
    for (int b = 0; b < G; b++) parked[b] = -1;
    int min_share = 1 << 30, max_share = 0;
    for (int b = 0; b < G && !test_failed(); b++) {
        struct sk_work w;
        sk_work_init(&w, b, G, skD, skT, nk);
        if (skT) {
            const int n = w.i1 - w.i;
            if (n < min_share) min_share = n;
            if (n > max_share) max_share = n;
        }
        int pieces = 0, sk_pieces = 0, head_at = -1, last_tile = -1, last_kb = -1;
        while (sk_work_next(&w, G, skD, nk)) {
            const int t = w.tile, kb = w.kb, ke = w.ke;
            ASSERT_MSG(t >= 0 && t < ntiles && kb >= 0 && kb < ke && ke <= nk,
                       "ntiles %d nk %d G %d: block %d piece tile %d [%d, %d)", ntiles, nk, G, b, t, kb, ke);
            ASSERT_MSG(t > last_tile || (t == last_tile && kb > last_kb), "block %d: pieces out of order", b);
            last_tile = t, last_kb = kb;
            for (int c = kb; c < ke; c++) {
                ASSERT_MSG(!seen[(size_t)t * nk + c], "ntiles %d nk %d G %d sk %d: tile %d chunk %d twice", ntiles,
                           nk, G, sk, t, c);
                seen[(size_t)t * nk + c] = 1;
            }
            if (t < skD) { /* whole tiles: b, b + G, ... */
                ASSERT_MSG(kb == 0 && ke == nk && t % G == b, "block %d: whole tile %d cut or not its own", b, t);
            } else {
                if (kb > 0) { /* not the tile's head: only as the block's first stream-K piece */
                    ASSERT_MSG(sk_pieces == 0 && parked[b] < 0, "block %d parks tile %d after other work", b, t);
                    parked[b] = t;
                }
                if (kb == 0 && ke < nk) {
                    ASSERT_MSG(head[t] < 0, "tile %d has two heads", t);
                    head[t] = b;
                    head_at = pieces;
                }
                sk_pieces++;
            }
            pieces++;
        }
        ASSERT_MSG(head_at < 0 || head_at == pieces - 1, "ntiles %d nk %d G %d: block %d's head piece is not its last",
                   ntiles, nk, G, b);
    }
    for (size_t e = 0; e < (size_t)ntiles * nk && !test_failed(); e++)
        ASSERT_MSG(seen[e], "ntiles %d nk %d G %d sk %d: tile %zu chunk %zu never run", ntiles, nk, G, sk,
                   e / (size_t)nk, e % (size_t)nk);
    if (skT) /* equal shares */
        ASSERT_MSG(max_share - min_share <= 1 && min_share >= 1, "shares %d..%d steps", min_share, max_share);
    /* each head gathers (the kernel's loop, ws_sk_gather) exactly the parked
     * pieces of its tile, each once */
    for (int t = 0; t < ntiles && !test_failed(); t++) {
        if (head[t] < 0) continue;
        const int end = (t + 1) * nk;
        int got = 0;
        for (int b = head[t] + 1; b < G && sk_share(b, G, skD, skT, nk) < end; b++) {
            ASSERT_MSG(parked[b] == t, "ntiles %d nk %d G %d: tile %d's head waits for block %d, which parked %d",
                       ntiles, nk, G, t, b, parked[b]);
            ASSERT_MSG(!gathered[b], "block %d's piece gathered twice", b);
            gathered[b] = 1;
            got++;
        }
        ASSERT_MSG(got > 0, "tile %d has a head but no other piece", t);
    }
    for (int b = 0; b < G && !test_failed(); b++)
        ASSERT_MSG(parked[b] < 0 || gathered[b], "ntiles %d nk %d G %d: block %d's piece of tile %d never gathered",
                   ntiles, nk, G, b, parked[b]);
    free(seen);
    free(head);
    free(parked);
    free(gathered);
}

TEST(gemm_sk, partition_invariants) {
    static const int gs[] = {1, 2, 3, 7, 16, 114, 132, 144};
    static const int ts[] = {1, 2, 5, 16, 96, 131, 132, 133, 160, 263, 264, 265, 400, 1000};
    static const int ks[] = {1, 2, 3, 16, 64, 80, 192, 400};
    int grids = 0;
    for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++)
        for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (int sk = 0; sk < 2; sk++) {
                    check_grid(ts[ti], ks[ki], gs[gi], sk);
                    ASSERT_OK_SO_FAR();
                    grids++;
                }
    /* a real case of many waves: Qwen3-8B gate|up at M = 4096, 1 x 256 */
    check_grid(3072, 64, 132, 1);
    ASSERT(grids == 8 * 14 * 8 * 2);
}

/* The whole-tile rule: all but the last full wave and the ragged one. */
TEST(gemm_sk, whole_tiles_before_stream_k) {
    ASSERT_EQ_INT(sk_whole_tiles(96, 132), 0);   /* under one wave: all stream-K */
    ASSERT_EQ_INT(sk_whole_tiles(132, 132), 0);  /* one wave */
    ASSERT_EQ_INT(sk_whole_tiles(264, 132), 132);
    ASSERT_EQ_INT(sk_whole_tiles(265, 132), 132);
    ASSERT_EQ_INT(sk_whole_tiles(3072, 132), 22 * 132);
}

/* Mode 6 / 7's pick (gk_dr_pick) on the real shapes the wgmma GEMM takes
 * at M = 33-64 on an H200 (132 SMs), as sessions 36 and 37 measured them:
 * the tile, the split, the mode and the grid, or none where stream-K
 * stayed faster (splits of 2-3, K = 2048) or the tiles alone fill the SMs.
 * Times: the pick's against session 36's (2 x 64, the most blocks). */
TEST(gemm_sk, split_all_blocks_pick) {
    static const struct {
        const char *what;
        int k, n, mt, ks, mode; /* ks 0: neither mode */
    } cs[] = {
        {"Qwen3-8B q|k|v", 4096, 6144, 1, 4, 7},   /* 32 tiles x 4 = 128 blocks: 0.86x 2 x 64 split 5 */
        {"Qwen3-8B o", 4096, 4096, 1, 4, 6},       /* 32 x 4: 0.89x 2 x 64 split 8 */
        {"Qwen3-8B gate|up", 4096, 24576, 0, 0, 0}, /* 96 tiles: no split fits */
        {"Qwen3-8B down", 12288, 4096, 2, 8, 6},   /* K > 6400: the most blocks (mode 7 split 6 1.00x) */
        {"Qwen3-8B tp=2 q|k|v", 4096, 3072, 1, 5, 6},
        {"Qwen3-8B tp=2 down", 6144, 4096, 1, 4, 6},
        {"Qwen3-32B q|k|v", 5120, 10240, 0, 0, 0}, /* 40 tiles x 3: too few splits */
        {"Qwen3-32B o", 8192, 5120, 2, 6, 6},      /* 20 x 6 = 120 */
        {"Qwen3-32B down", 25600, 5120, 2, 6, 6},  /* mode 7 split 4: 1.12x */
        {"Qwen3-32B tp=2 q|k|v", 5120, 5120, 1, 4, 7}, /* 27 x 4 = 108: 0.94x */
        {"Qwen3-32B tp=2 o", 4096, 5120, 1, 4, 7},     /* 0.91x */
        {"Qwen3-32B tp=4 q|k|v", 5120, 2560, 1, 5, 6}, /* 20 x 5: all within 1% */
        {"Qwen3-32B tp=4 gate|up", 5120, 12800, 0, 0, 0}, /* 50 x 2: lost 1.04-1.10x */
        {"Qwen3-32B tp=4 down", 6400, 5120, 1, 4, 7},     /* 0.97x */
        {"Llama-3-70B o", 8192, 8192, 2, 4, 6},           /* 32 x 4 = 128 */
        {"Llama-3-70B tp=2 q|k|v", 8192, 5120, 2, 6, 6},
        {"Llama-3-70B tp=2 o", 4096, 8192, 1, 3, 7}, /* 43 x 3 = 129: 0.95x */
        {"Llama-3-70B tp=4 o", 2048, 8192, 0, 0, 0}, /* K = 2048: lost 1.14-1.17x */
        {"Llama-3-70B tp=4 gate|up", 8192, 14336, 0, 0, 0},
        {"Llama-3-70B tp=4 down", 7168, 8192, 2, 4, 6},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int mt = 0, mode = 0;
        const int ks = gk_dr_pick(cs[i].k / 64, cs[i].n / 16, 132, 1, &mt, &mode);
        ASSERT_MSG(ks == cs[i].ks && (!ks || (mt == cs[i].mt && mode == cs[i].mode)),
                   "%s: pick %d x 64 split %d mode %d, expected %d x 64 split %d mode %d", cs[i].what, ks ? mt : 0,
                   ks, ks ? mode : 0, cs[i].mt, cs[i].ks, cs[i].mode);
        if (ks) {
            const int rows = mode == 7 ? 192 : 128 * mt, tiles = (cs[i].n + rows - 1) / rows;
            ASSERT(tiles * ks <= 132 && 4 * tiles * ks >= 3 * 132);
        }
        /* without mode 7 (AWQD_W4A16_GEMM_WG3=0): mode 6 at the same or more splits */
        int mt6 = 0, mode6 = 0;
        const int ks6 = gk_dr_pick(cs[i].k / 64, cs[i].n / 16, 132, 0, &mt6, &mode6);
        ASSERT_MSG(!ks6 || mode6 == 6, "%s: mode %d without mode 7", cs[i].what, mode6);
        ASSERT_MSG(!!ks6 == !!ks && (mode != 6 || (ks6 == ks && mt6 == mt)) && ks6 >= ks,
                   "%s: without mode 7 split %d (%d x 64), with %d", cs[i].what, ks6, mt6, ks);
    }
    /* fewer SMs: the grid still fits them */
    for (int sms = 78; sms <= 144; sms += 6)
        for (int k = 4096; k <= 28672; k += 2048) {
            int mt = 0, mode = 0;
            const int ks = gk_dr_pick(k / 64, 256, sms, 1, &mt, &mode);
            const int rows = mode == 7 ? 192 : 128 * mt;
            ASSERT_MSG(ks == 0 || ((4096 + rows - 1) / rows * ks <= sms && (mode == 6 || mt == 1)),
                       "%d SMs K %d: %d x 64 split %d mode %d", sms, k, mt, ks, mode);
        }
}
