/* test_dc_plan.c — the W4A16 decode kernel's launch plan and its place in
 * the automatic dispatch (kernels/cuda/dc_plan.h), on the CPU: the rules
 * measured on H100 / H200 (docs/KERNELS.md "The decode kernel"), written
 * out for the real layer shapes of Qwen3-8B / 32B and its tensor-parallel
 * shards on a 132-SM GPU with 228 KB of shared memory per SM, plus the
 * plan's invariants over many shapes. The GPU test w4a16.decode_dispatch_rule
 * checks that the CUDA backend's choice follows the same rule. */
#include <string.h>
#include "tests/harness/test.h"

#include "kernels/cuda/dc_plan.h"

static const struct dc_gpu H200 = {132, 228 * 1024, 227 * 1024};

/* n16 of a weight of N output columns (gate|up: N = 2 x inter) */
static int n16_of(int n) { return (n + 15) / 16; }

TEST(dc_plan, tiles_per_block_on_real_shapes) {
    /* K, N, M -> TB, blocks (132 SMs) */
    static const struct { int k, n, m, tb, blocks; const char *what; } cs[] = {
        /* 384 tiles: 192 blocks of 2 leave >= 1.2 per SM, 96 of 4 do not */
        {4096, 6144, 1, 2, 192, "Qwen3-8B q|k|v"},
        /* 256 tiles: 1 per block (session 21 had at least 2 from M = 3) */
        {4096, 4096, 1, 1, 256, "Qwen3-8B o"},
        {4096, 4096, 3, 1, 256, "Qwen3-8B o"},
        {4096, 4096, 8, 1, 256, "Qwen3-8B o"},
        /* 1536 tiles: 384 blocks of 4 would be 1.45 waves of 2 per SM: halved at M <= 4 */
        {4096, 24576, 1, 2, 768, "Qwen3-8B gate|up"},
        {4096, 24576, 4, 2, 768, "Qwen3-8B gate|up"},
        {4096, 24576, 5, 4, 384, "Qwen3-8B gate|up"},
        {12288, 4096, 2, 1, 256, "Qwen3-8B down"},
        {12288, 4096, 4, 1, 256, "Qwen3-8B down"},
        /* M = 5-7: x leaves room for one block per SM; 256 blocks widened to one wave of 128 */
        {12288, 4096, 5, 2, 128, "Qwen3-8B down"},
        /* M = 8: the widened block would not fit (205 KB > 200 KB): 2 waves, left to the dispatch */
        {12288, 4096, 8, 1, 256, "Qwen3-8B down"},
        /* 640 tiles: 160 blocks of 4 */
        {5120, 10240, 1, 4, 160, "Qwen3-32B q|k|v"},
        /* 3200 tiles: 800 blocks of 4 (3 waves: not halved) */
        {5120, 51200, 1, 4, 800, "Qwen3-32B gate|up"},
        {8192, 5120, 6, 2, 160, "Qwen3-32B o"},
        /* one block per SM from M = 7: 160 blocks widened to 80 */
        {8192, 5120, 7, 4, 80, "Qwen3-32B o"},
        {25600, 5120, 3, 4, 80, "Qwen3-32B down"},
        /* 160 tiles of the tp = 4 q|k|v shard: 1 per block at every M */
        {5120, 2560, 1, 1, 160, "Qwen3-32B q|k|v tp=4"},
        {5120, 2560, 8, 1, 160, "Qwen3-32B q|k|v tp=4"},
        /* Llama-3-70B down: one block per SM already at M = 2 (x 112 KB + 8 KB) */
        {28672, 8192, 1, 2, 256, "Llama-3-70B down"},
        {28672, 8192, 2, 4, 128, "Llama-3-70B down"},
        /* MT = 2 always 2 tiles */
        {4096, 24576, 16, 2, 768, "Qwen3-8B gate|up"},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        struct dc_plan pl;
        ASSERT_MSG(dc_plan_make(cs[i].m, cs[i].k, n16_of(cs[i].n), 128, &H200, 0, 1, &pl), "%s M=%d: no plan",
                   cs[i].what, cs[i].m);
        ASSERT_MSG(pl.tb == cs[i].tb && pl.blocks == cs[i].blocks, "%s (K %d, N %d) M=%d: TB %d, %d blocks; want %d, %d",
                   cs[i].what, cs[i].k, cs[i].n, cs[i].m, pl.tb, pl.blocks, cs[i].tb, cs[i].blocks);
        ASSERT_EQ_INT(pl.mt, cs[i].m > 8 ? 2 : 1);
    }
    /* the halving off (AWQD_W4A16_DC_WAVES=0), a forced width */
    struct dc_plan pl;
    ASSERT(dc_plan_make(1, 4096, n16_of(24576), 128, &H200, 0, 0, &pl) && pl.tb == 4 && pl.blocks == 384);
    ASSERT(dc_plan_make(1, 4096, n16_of(6144), 128, &H200, 4, 1, &pl) && pl.tb == 4 && pl.blocks == 96);
    ASSERT(dc_plan_make(6, 12288, n16_of(4096), 128, &H200, 1, 1, &pl) && pl.tb == 1 && pl.blocks == 256);
    /* session 21's rules (AWQD_W4A16_DC_PLAN=21): at least 2 tiles from M = 3, halving at M <= 2, no widening */
    const int s21 = DC_PLAN_HALVE | DC_PLAN_S21;
    ASSERT(dc_plan_make(3, 4096, n16_of(4096), 128, &H200, 0, s21, &pl) && pl.tb == 2 && pl.blocks == 128);
    ASSERT(dc_plan_make(3, 4096, n16_of(24576), 128, &H200, 0, s21, &pl) && pl.tb == 4 && pl.blocks == 384);
    ASSERT(dc_plan_make(7, 8192, n16_of(5120), 128, &H200, 0, s21, &pl) && pl.tb == 2 && pl.blocks == 160);
    ASSERT(dc_plan_make(2, 28672, n16_of(8192), 128, &H200, 0, s21, &pl) && pl.tb == 2 && pl.blocks == 256);
}

TEST(dc_plan, where_the_kernel_does_not_apply) {
    struct dc_plan pl;
    ASSERT(!dc_plan_make(0, 4096, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(25, 4096, 256, 128, &H200, 0, 1, &pl));
    /* MT = 3 (M = 17..24): x of 24 rows at K = 4096 + the reduction area of 2 tiles (221 KB) within
     * DC_SMEM_MAX_MT3, at K = 4608 not */
    ASSERT(dc_plan_make(24, 4096, 256, 128, &H200, 0, 1, &pl) && pl.mt == 3 && pl.tb == 2);
    ASSERT(!dc_plan_make(24, 4608, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(1, 4096, 256, 64, &H200, 0, 1, &pl)); /* group 128 only */
    /* x of 8 rows at K = 12800 alone: 205 KB > 200 KB; at K = 12288 x + the
     * reduction area of 1 tile fit (200.8 KB), of 2 tiles not */
    ASSERT(dc_plan_make(8, 12288, 256, 128, &H200, 0, 1, &pl) && pl.tb == 1);
    ASSERT(!dc_plan_make(8, 12288, 256, 128, &H200, 2, 1, &pl));
    ASSERT(!dc_plan_make(8, 12800, 320, 128, &H200, 0, 1, &pl));
    /* a GPU whose blocks may hold less (A100: 163 KB) */
    const struct dc_gpu a100 = {108, 164 * 1024, 163 * 1024};
    ASSERT(dc_plan_make(7, 12288, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(7, 12288, 256, 128, &a100, 0, 1, &pl));
}

/* The rule on the 28 measured shapes at M = 1..24 (H200, back to back
 * against the skinny kernel: docs/PERFORMANCE.md "Session 21" and
 * "Session 22"; M = 9..16 "Session 34"; M = 17..24 "Session 35": every
 * shape with K <= 4096, and at K = 5120 (a plan to M = 19 only) the one-wave
 * tp = 4 q|k|v shard). M = 9..16 (MT = 2): never two blocks
 * per SM on a grid of at most one per SM; otherwise every grid up to K = 4096
 * and, above it, one wave or two waves >= 90% full. Four points at M = 6
 * (Llama-3-70B q|k|v and gate|up at tp = 1 / 2 / 4) moved to the decode
 * kernel with the exact per-block reserve (two blocks of 115 KB fit per SM)
 * and were not measured there; at M = 5, with two blocks per SM as well, it
 * won by 8-38% (session 23's audit: at M = 6 1.02-1.39x). Session 23: one
 * block per SM over several waves where the waves are >= 80% full on average
 * and x is at most the block's weight (the Llama-3-70B gate|up shards at M =
 * 7-8); session 34: any grid of two waves (Llama-3-70B q|k|v at M = 7-8,
 * Qwen3-8B down at M = 8). Session 42 (x staged group by group; the
 * audit at M = 9-27, two runs): above K = 4096 at MT >= 2 also K = 5120 on at
 * most 3 SMs' worth of blocks: Qwen3-32B q|k|v and its tp = 2 shard to M =
 * 19 (the K = 8192 persistent grids that also won back to back are not
 * taken: see dc_plan.h). */
TEST(dc_plan, dispatch_rule_on_measured_shapes) {
    static const struct { int k, n; const char *what; int dec[24]; } cs[] = {
        /* M = 9-12: 192 blocks, two per SM (0.71-0.78x the skinny kernel's time); 13-16 one per SM, the
         * persistent grid (0.85-0.87x) */
        {4096, 6144, "Qwen3-8B q|k|v", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* M = 9-12: two per SM on 128 blocks lost (0.98-1.07x); 13-16: one per SM, one wave (0.76-0.79x) */
        {4096, 4096, "Qwen3-8B o", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* M = 9-16: 768 blocks on the persistent grid (0.75-0.91x; 1.04-1.46x with session 22's kernel) */
        {4096, 24576, "Qwen3-8B gate|up", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* 128 blocks: one wave at one block per SM (M = 5-7); M = 8: 2 waves of 1 tile, each
         * block staging 192 KB of x for 96 KB of weight (16.6 us against skinny 14.7, session 23;
         * 12.9 against 14.0 with session 34's fp16 zero point) */
        {12288, 4096, "Qwen3-8B down", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 9-19: 320 blocks, <= 3 x SMs (session 42, x by groups: 0.84-0.94x the skinny
         * kernel at M = 9-16, 0.83x at 17-18); no plan from 20 */
        {5120, 10240, "Qwen3-32B q|k|v", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}},
        /* M = 7-8: widened to 80 blocks of 256 KB (12.2-12.5 us vs skinny 12.5-13.1) */
        {8192, 5120, "Qwen3-32B o", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {5120, 51200, "Qwen3-32B gate|up", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* one block per SM from M = 3, 80 blocks of 800 KB (30.7 vs 26.3 us), no plan from M = 4 */
        {25600, 5120, "Qwen3-32B down", {1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 9: 160 blocks, two per SM, one wave (0.83x); from 10 one per SM, 2 waves 61% full (1.02-1.09x
         * in session 34; session 42, x by groups: 0.88-0.98x at M = 10-16, 0.97-1.0x at 17-18) */
        {5120, 5120, "Qwen3-32B q|k|v tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}},
        /* M = 13-16: one per SM, the persistent grid (0.92-0.94x) */
        {4096, 5120, "Qwen3-32B o tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        {5120, 25600, "Qwen3-32B gate|up tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* one block per SM from M = 5: 80 blocks of 400 KB (M = 6: 17.6 vs 16.5 us) */
        {12800, 5120, "Qwen3-32B down tp=2", {1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 9: 80 blocks two per SM (1.21x); from 10 one per SM, one wave (0.83-0.92x) */
        {5120, 2560, "Qwen3-32B q|k|v tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0}},
        /* K = 2048: two blocks per SM to M = 16 (0.67-0.71x) */
        {2048, 5120, "Qwen3-32B o tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* M = 9: 400 blocks, more than 3 SMs' worth (session 42: 1.06x) */
        {5120, 12800, "Qwen3-32B gate|up tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {6400, 5120, "Qwen3-32B down tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* 160 blocks of 4 tiles: two per SM to M = 6 (115 KB each), one from M = 7 (a second wave
         * 21% full: 23.7-24.0 us against skinny 18.6-20.1, session 23; 17.5 against 18.7-19.9
         * with session 34's fp16 zero point) */
        {8192, 10240, "Llama-3-70B q|k|v", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* widened to 128 blocks at M = 7-8; M = 9-10 256 blocks, 2 waves (0.88-0.92x); no plan from 12 */
        {8192, 8192, "Llama-3-70B o", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 7-8: one block per SM, 896 blocks (7 waves, 97% full on average), x 112-128 KB of 256 KB */
        {8192, 57344, "Llama-3-70B gate|up", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* widened to 128 blocks at M = 2-3 (M = 3: 37.1 vs skinny 40.7 us), no plan from M = 4 */
        {28672, 8192, "Llama-3-70B down", {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 7-8: 80 blocks of 256 KB */
        {8192, 5120, "Llama-3-70B q|k|v tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 13-16: one per SM, the persistent grid (0.77-0.78x) */
        {4096, 8192, "Llama-3-70B o tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* M = 7-8: 448 blocks, one per SM (4 waves, 85% full) */
        {8192, 28672, "Llama-3-70B gate|up tp=2", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* widened to 128 blocks at M = 4-6 (20.1-21.0 vs skinny 22.1-27.5 us) */
        {14336, 8192, "Llama-3-70B down tp=2", {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 7-8: 80 blocks of 128 KB (8.4-8.6 vs skinny 9.1-9.6 us); 9-10 the same (0.87-0.89x); no
         * plan from 12 */
        {8192, 2560, "Llama-3-70B q|k|v tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        {2048, 8192, "Llama-3-70B o tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
        /* M = 7-8: 224 blocks, one per SM (2 waves, 85% full) */
        {8192, 14336, "Llama-3-70B gate|up tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
        /* M = 9-12: 256 blocks, 2 waves (0.88-0.92x); no plan from 14 */
        {7168, 8192, "Llama-3-70B down tp=4", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++)
        for (int m = 1; m <= 24; m++) {
            struct dc_plan pl;
            const int has = dc_plan_make(m, cs[i].k, n16_of(cs[i].n), 128, &H200, 0, DC_PLAN_HALVE, &pl);
            const int takes = dc_dispatch_takes(m, DC_DISPATCH_MAX_M, has ? &pl : 0, &H200);
            ASSERT_MSG(takes == cs[i].dec[m - 1], "%s (K %d, N %d) M=%d: %s, want %s", cs[i].what, cs[i].k,
                       cs[i].n, m, takes ? "decode" : "not decode", cs[i].dec[m - 1] ? "decode" : "not decode");
            /* a lower last M (AWQD_W4A16_DC_MAX_M) only removes M above it */
            ASSERT(dc_dispatch_takes(m, 4, has ? &pl : 0, &H200) == (m <= 4 && takes));
        }
    /* session 21's rule: Qwen3-32B o at M = 7 (160 blocks, one per SM) and
     * the Llama-3-70B tp = 2 down at M = 4 (256 of 2 tiles, one per SM) not
     * decode; its tp = 4 q|k|v at M = 7 (80 of 2 tiles) decode */
    const int s21 = DC_PLAN_HALVE | DC_PLAN_S21;
    struct dc_plan pl;
    ASSERT(dc_plan_make(7, 8192, n16_of(5120), 128, &H200, 0, s21, &pl) && !dc_dispatch_takes(7, 8, &pl, &H200));
    ASSERT(dc_plan_make(4, 14336, n16_of(8192), 128, &H200, 0, s21, &pl) && !dc_dispatch_takes(4, 8, &pl, &H200));
    ASSERT(dc_plan_make(7, 8192, n16_of(2560), 128, &H200, 0, s21, &pl) && dc_dispatch_takes(7, 8, &pl, &H200));
}

/* The L2 prefetch (one ring turn ahead) where one block fits per SM, at MT
 * = 1 only: points measured in session 24 (H200, back to back: 2.6-7.3%
 * faster at all 23 points of the first kind at M = 1-8, up to 25% slower
 * with two blocks per SM). The plan's pf; the persistent grid drops it
 * (DC_PS_NO_PF, test persistent_grid). */
TEST(dc_plan, l2_prefetch_where_one_block_fits) {
    static const struct { int k, n, m, pf; const char *what; } cs[] = {
        {12288, 4096, 5, 1, "Qwen3-8B down"},
        {8192, 5120, 8, 1, "Qwen3-32B o"},
        {28672, 8192, 2, 1, "Llama-3-70B down"},
        {8192, 8192, 8, 1, "Llama-3-70B o"},
        {8192, 57344, 8, 1, "Llama-3-70B gate|up"},
        {8192, 5120, 8, 1, "Llama-3-70B q|k|v tp=2"},
        {8192, 28672, 8, 1, "Llama-3-70B gate|up tp=2"},
        {14336, 8192, 4, 1, "Llama-3-70B down tp=2"},
        {8192, 2560, 8, 1, "Llama-3-70B q|k|v tp=4"},
        {8192, 14336, 8, 1, "Llama-3-70B gate|up tp=4"},
        {7168, 8192, 8, 1, "Llama-3-70B down tp=4"},
        /* two blocks per SM: off */
        {4096, 24576, 1, 0, "Qwen3-8B gate|up"},
        {12288, 4096, 4, 0, "Qwen3-8B down"},
        {8192, 8192, 1, 0, "Llama-3-70B o"},
        {5120, 51200, 8, 0, "Qwen3-32B gate|up"},
        {5120, 2560, 1, 0, "Qwen3-32B q|k|v tp=4"},
        /* MT = 2 (one block per SM there): off */
        {4096, 4096, 16, 0, "Qwen3-8B o"},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        struct dc_plan pl;
        ASSERT_MSG(dc_plan_make(cs[i].m, cs[i].k, n16_of(cs[i].n), 128, &H200, 0, DC_PLAN_HALVE, &pl),
                   "%s M=%d: no plan", cs[i].what, cs[i].m);
        ASSERT_MSG(pl.pf == cs[i].pf, "%s (K %d, N %d) M=%d: pf %d, want %d (%d blocks per SM)", cs[i].what, cs[i].k,
                   cs[i].n, cs[i].m, pl.pf, cs[i].pf, dc_blocks_per_sm(&H200, pl.smem));
        if (cs[i].pf && cs[i].m <= DC_DISPATCH_MAX_M)
            ASSERT_MSG(dc_dispatch_takes(cs[i].m, DC_DISPATCH_MAX_M, &pl, &H200), "%s M=%d: measured on decode",
                       cs[i].what, cs[i].m);
    }
}

/* The persistent grid (dc_ps_plan): only where the plan needs more than
 * one wave of block slots, with the tiles per block whose whole ring turns
 * give the fullest waves (>= DC_PS_FILL_PCT; every block streams waves or
 * waves - 1 columns), else the plan's own on one block per slot; at most
 * one block per slot. */
TEST(dc_plan, persistent_grid) {
    struct dc_plan pl;
    /* Qwen3-8B gate|up M = 1: 768 blocks of TB = 2 on 264 slots -> 3 waves, 256 blocks */
    ASSERT(dc_plan_make(1, 4096, n16_of(24576), 128, &H200, 0, DC_PLAN_HALVE, &pl) && pl.blocks == 768);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 256);
    ASSERT_EQ_INT(pl.tb, 2);
    /* at M = 8 the plan's TB = 4 (384 blocks, 2 waves 73% full) becomes TB = 2 (3 waves, 97%) */
    ASSERT(dc_plan_make(8, 4096, n16_of(24576), 128, &H200, 0, DC_PLAN_HALVE, &pl) && pl.tb == 4);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 256);
    ASSERT(pl.tb == 2 && pl.blocks == 768 && pl.smem == dc_smem_bytes(8, 4096, 2, 1));
    /* ... unless TB is forced: then TB = 4, two ragged waves: two columns a block */
    ASSERT(dc_plan_make(8, 4096, n16_of(24576), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 1), 192);
    ASSERT(pl.tb == 4 && pl.blocks == 384);
    /* Llama-3-70B gate|up M = 1: TB = 4 (896 blocks, 4 waves, 85%) -> TB = 2 (1792, 7 waves, 97%) */
    ASSERT(dc_plan_make(1, 8192, n16_of(57344), 128, &H200, 0, DC_PLAN_HALVE, &pl) && pl.tb == 4);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 256);
    ASSERT_EQ_INT(pl.tb, 2);
    /* one wave (Qwen3-8B q|k|v, 192 blocks): not persistent */
    ASSERT(dc_plan_make(1, 4096, n16_of(6144), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 0);
    /* Qwen3-32B gate|up (K = 5120: 40 groups, whole turns only at TB = 4; 800
     * blocks, 76%): the plan's TB on one block per slot */
    ASSERT(dc_plan_make(1, 5120, n16_of(51200), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 264);
    ASSERT(pl.tb == 4 && pl.blocks == 800);
    /* its tp = 2 shard (400 blocks, two waves at 76%): 200 blocks of two columns each
     * (DC_PS_TWO_WAVES, session 52), at M = 1 and M = 8 */
    ASSERT(dc_plan_make(1, 5120, n16_of(25600), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 200);
    ASSERT(pl.tb == 4 && pl.blocks == 400);
    ASSERT(dc_plan_make(8, 5120, n16_of(25600), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 200);
    ASSERT(pl.tb == 4 && pl.blocks == 400);
    /* K = 5120 at a TB whose turns are not whole (forced TB = 2, 5 groups per warp): not */
    ASSERT(dc_plan_make(1, 5120, n16_of(51200), 128, &H200, 2, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 1), 0);
    /* Qwen3-8B q|k|v M = 16 (one block per SM: 192 blocks of TB = 2 on 132 slots, 73%): with
     * DC_PLAN_TB1 384 of TB = 1 (3 waves, 97%) on 128 blocks; without it ragged, 132 */
    ASSERT(dc_plan_make(16, 4096, n16_of(6144), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl) && pl.tb == 2);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 128);
    ASSERT(pl.tb == 1 && pl.blocks == 384 && pl.smem == dc_smem_bytes(16, 4096, 1, 2));
    ASSERT(dc_plan_make(16, 4096, n16_of(6144), 128, &H200, 0, DC_PLAN_HALVE, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 132);
    ASSERT(pl.tb == 2 && pl.blocks == 192);
    /* the persistent grid without the L2 prefetch (DC_PS_NO_PF, session 55): Llama-3-70B gate|up
     * at M = 8, 896 columns of four tiles on 128 blocks; the plain grid keeps it (its tp = 4
     * q|k|v shard, 80 blocks) */
    ASSERT(dc_plan_make(8, 8192, n16_of(57344), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl) && pl.pf == 1);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 128);
    ASSERT(pl.tb == 4 && pl.blocks == 896 && pl.pf == 0);
    ASSERT(dc_plan_make(8, 8192, n16_of(2560), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl) && pl.pf == 1);
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 0);
    ASSERT_EQ_INT(pl.pf, 1);
    /* ... not at MT = 3 (M = 20: mixed, session 38) nor where two blocks fit per SM (M = 9) */
    ASSERT(dc_plan_make(20, 4096, n16_of(6144), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 132);
    ASSERT_EQ_INT(pl.tb, 2);
    ASSERT(dc_plan_make(9, 4096, n16_of(6144), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 0);
    /* DC_PLAN_TB4 (session 48). Qwen3-32B gate|up M = 16 (K = 5120: TB = 2 has no whole
     * turns; the plain grid of 1600 one-per-SM blocks, which the dispatch leaves to the
     * skinny kernel): TB = 4, 800 columns in 7 waves (87%) on 115 blocks, and the
     * dispatch takes it; without the flag the plain grid, not taken */
    const int tb4 = DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4;
    ASSERT(dc_plan_make(16, 5120, n16_of(51200), 128, &H200, 0, tb4, &pl) && pl.tb == 2 && pl.blocks == 1600);
    ASSERT(dc_dispatch_takes(16, DC_DISPATCH_MAX_M, &pl, &H200));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 115);
    ASSERT(pl.tb == 4 && pl.blocks == 800 && pl.smem == dc_smem_bytes(16, 5120, 4, 2));
    ASSERT(dc_plan_make(16, 5120, n16_of(51200), 128, &H200, 0, DC_PLAN_HALVE | DC_PLAN_TB1, &pl));
    ASSERT(!dc_dispatch_takes(16, DC_DISPATCH_MAX_M, &pl, &H200));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 0);
    /* Qwen3-8B gate|up M = 16: TB = 4 (384 columns, 3 waves, 97%) ties TB = 2 (768, 6
     * waves, 97%) and the wider block wins; at M = 9 two blocks fit per SM: TB = 2 */
    ASSERT(dc_plan_make(16, 4096, n16_of(24576), 128, &H200, 0, tb4, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 128);
    ASSERT(pl.tb == 4 && pl.blocks == 384);
    ASSERT(dc_plan_make(9, 4096, n16_of(24576), 128, &H200, 0, tb4, &pl));
    ASSERT_EQ_INT(dc_ps_plan(&pl, &H200, 0), 256);
    ASSERT_EQ_INT(pl.tb, 2);
    for (int f = 0; f < 3; f++)
        for (int k = 1024; k <= 32768; k += 1024)
            for (int n16 = 8; n16 <= 4096; n16 += 56)
                for (int m = 1; m <= DC_MAX_M; m++) {
                    const int fl = DC_PLAN_HALVE | (f ? DC_PLAN_TB1 : 0) | (f == 2 ? DC_PLAN_TB4 : 0);
                    if (!dc_plan_make(m, k, n16, 128, &H200, 0, fl, &pl)) continue;
                    const struct dc_plan pl0 = pl;
                    const int g = dc_ps_plan(&pl, &H200, 0);
                    if (!g) {
                        ASSERT(memcmp(&pl, &pl0, sizeof pl) == 0);
                        continue;
                    }
                    const int slots = H200.sms * dc_slots_per_sm(&H200, pl.smem, pl.mt), waves = (pl.blocks + slots - 1) / slots;
                    ASSERT(pl0.blocks > H200.sms * dc_slots_per_sm(&H200, pl0.smem, pl0.mt));
                    ASSERT(pl.pf == 0); /* DC_PS_NO_PF */
                    pl.pf = pl0.pf;     /* for the comparisons below */
                    ASSERT((k / 128) % (DC_WARPS * (4 / pl.tb)) == 0 && pl.mt == pl0.mt &&
                           (pl.mt == 1 || pl.tb == 2 ||
                            (f && pl.mt == 2 && pl.tb == 1 && dc_blocks_per_sm(&H200, pl.smem) == 1) ||
                            (f == 2 && pl.mt == 2 && pl.tb == 4 && dc_blocks_per_sm(&H200, pl.smem) == 1)));
                    ASSERT(pl.blocks == (n16 + pl.tb - 1) / pl.tb && pl.smem <= dc_smem_max(pl.mt));
                    ASSERT(pl.blocks > slots && g <= slots);
                    if (100L * pl.blocks >= (long)DC_PS_FILL_PCT * waves * slots) { /* full waves */
                        ASSERT((long)g * waves >= pl.blocks && (long)g * (waves - 1) < pl.blocks);
                    } else if ((k / 128) % (DC_WARPS * (4 / pl0.tb)) == 0) {
                        /* ragged: the plan's TB (pf aside), one block per slot; over two waves of
                         * two blocks per SM at MT = 1 two columns a block */
                        ASSERT(memcmp(&pl, &pl0, sizeof pl) == 0);
                        ASSERT(g == (pl.mt == 1 && slots > H200.sms && waves == 2 ? (pl.blocks + 1) / 2 : slots));
                    } else { /* MT >= 2 whose plan's TB has no whole turns: the TB that has them */
                        ASSERT(pl.mt >= 2 && pl.tb != pl0.tb && (long)g * waves >= pl.blocks &&
                               (long)g * (waves - 1) < pl.blocks);
                    }
                }
}

/* Invariants over many shapes: the plan covers every tile, fits its shared
 * memory, leaves a second wave of one block per SM only where no wider block
 * fits, and the dispatch takes it at M <= 2 wherever it applies and, at one
 * block per SM, never on a short wave of large blocks nor (M <= 8) on more
 * than two waves under 80% full on average or whose blocks stage more x
 * than weight;
 * at M = 9..24 never two blocks per SM on a part of the SMs, and above
 * DC_MT2_MAX_K on no more than two waves; MT = 3 one block per SM. */
TEST(dc_plan, invariants) {
    static const struct dc_gpu gpus[] = {{132, 228 * 1024, 227 * 1024}, {108, 164 * 1024, 163 * 1024},
                                         {114, 228 * 1024, 227 * 1024}, {1, 0, 0}};
    for (int gi = 0; gi < 4; gi++)
        for (int k = 128; k <= 32768; k += k < 4096 ? 640 : 4224)
            for (int n16 = 1; n16 <= 4096; n16 = n16 * 3 + 1)
                for (int m = 1; m <= DC_MAX_M; m++) {
                    struct dc_plan pl;
                    if (!dc_plan_make(m, k, n16, 128, &gpus[gi], 0, 1, &pl)) {
                        ASSERT(!dc_dispatch_takes(m, DC_DISPATCH_MAX_M, 0, &gpus[gi]));
                        continue;
                    }
                    ASSERT(pl.tb == 1 || pl.tb == 2 || pl.tb == 4);
                    ASSERT((long)pl.blocks * pl.tb >= n16 && (long)(pl.blocks - 1) * pl.tb < n16);
                    ASSERT(pl.smem == dc_smem_bytes(m, k, pl.tb, pl.mt) && pl.smem <= dc_smem_max(pl.mt));
                    ASSERT(pl.mt == (m + 7) / 8 && (pl.mt == 1 || pl.tb == 2));
                    ASSERT(gpus[gi].smem_optin == 0 || pl.smem <= (size_t)gpus[gi].smem_optin);
                    const int one = dc_slots_per_sm(&gpus[gi], pl.smem, pl.mt) < 2;
                    ASSERT(pl.mt < 3 || one); /* MT = 3: one block per SM, whatever its shared memory */
                    ASSERT(pl.pf == (pl.mt == 1 && one ? DC_PF_ONE_BLOCK : 0));
                    /* one block per SM and a second wave only where no wider block fits */
                    if (pl.mt == 1 && one && pl.blocks > gpus[gi].sms)
                        ASSERT(pl.tb == 4 || dc_smem_bytes(m, k, 2 * pl.tb, 1) > DC_SMEM_MAX);
                    const int takes = dc_dispatch_takes(m, DC_DISPATCH_MAX_M, &pl, &gpus[gi]);
                    if (m <= 2) ASSERT(takes);
                    if (m > DC_DISPATCH_MAX_M) ASSERT(!takes);
                    const int sms = gpus[gi].sms, waves = (pl.blocks + sms - 1) / sms;
                    if (takes && m >= 3 && one && pl.blocks <= sms)
                        ASSERT(10 * pl.blocks >= 9 * sms || pl.wbytes <= DC_ONE_WAVE_WBYTES);
                    if (takes && pl.mt == 1 && m >= 3 && one && waves > 2) /* > 2 waves: >= 80% full */
                        ASSERT(5 * pl.blocks >= 4 * waves * sms && dc_x_bytes(m, k) <= pl.wbytes);
                    if (takes && pl.mt >= 2) { /* never two per SM on a part of the SMs; above
                                                  DC_MT2_MAX_K at most two waves, >= 90% full, or
                                                  K = 5120 on <= 3 x SMs blocks */
                        const int slots = (one ? 1 : 2) * sms, w2 = (pl.blocks + slots - 1) / slots;
                        ASSERT(one || pl.blocks > sms);
                        ASSERT(k <= DC_MT2_MAX_K || w2 == 1 || (w2 == 2 && 10 * pl.blocks >= 18 * slots) ||
                               (k <= DC_MT2_WAVES3_MAX_K && pl.blocks <= 3 * sms));
                    }
                    if (test_failed()) return;
                }
}

/* The cluster K split (dc_plan_cluster): one block's K / 2 on a GPU of 66
 * clusters, its shared memory x of K / 2 plus rank 0's area for the other
 * block's sums; where it applies and where not (M <= 8, K / 128 odd, x of
 * half of K too large) */
TEST(dc_plan, cluster_split) {
    const struct dc_gpu g2 = {66, 228 * 1024, 227 * 1024};
    const int fl = DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4;
    struct dc_plan pl;
    /* Qwen3-32B q|k|v at M = 24: x of all of K (246 KB) fits no block; of half, 123 KB */
    ASSERT(!dc_plan_make(24, 5120, n16_of(10240), 128, &H200, 0, fl, &pl));
    ASSERT(dc_plan_cluster(24, 5120, n16_of(10240), 128, &g2, 2, 0, fl, &pl));
    ASSERT(pl.cl == 2 && pl.k == 2560 && pl.mt == 3 && pl.tb == 2 && pl.blocks == 320);
    ASSERT(pl.smem == dc_x_bytes(24, 2560) + 2 * 3 * 4 * 8 * 32 * 4 + 2 * 3 * 32 * 16);
    ASSERT(pl.smem == dc_smem_cl(24, 2560, 2, 3, 2) && pl.smem <= dc_smem_max(3));
    /* no persistent grid: MT = 3 runs TB = 2, and 20 groups are no whole turns of 8 warps */
    ASSERT(dc_ps_plan(&pl, &g2, 0) == 0 && pl.blocks == 320);
    /* Qwen3-32B gate|up at M = 16: TB = 4 on the persistent grid (2 or 3 groups a warp) */
    ASSERT(dc_plan_cluster(16, 5120, n16_of(51200), 128, &g2, 2, 0, fl, &pl));
    ASSERT(dc_ps_plan(&pl, &g2, 0) > 0 && pl.tb == 4 && pl.blocks == 800 && pl.smem == dc_smem_cl(16, 2560, 4, 2, 2));
    ASSERT(dc_whole_turns(20, 4, 2) && !dc_whole_turns(20, 4, 1) && dc_whole_turns(40, 4, 1) && !dc_whole_turns(20, 2, 2));
    /* Qwen3-8B q|k|v at M = 16: 66 KB of x a block instead of 131 */
    ASSERT(dc_plan_cluster(16, 4096, n16_of(6144), 128, &g2, 2, 0, fl, &pl));
    ASSERT(pl.k == 2048 && pl.mt == 2 && dc_x_bytes(16, 2048) < dc_x_bytes(16, 4096) / 2 + 512);
    /* not: M <= 8, K / 128 odd, one block (cl 1), x of half of K too large */
    ASSERT(!dc_plan_cluster(8, 4096, n16_of(6144), 128, &g2, 2, 0, fl, &pl));
    ASSERT(!dc_plan_cluster(16, 640, n16_of(272), 128, &g2, 2, 0, fl, &pl));
    ASSERT(!dc_plan_cluster(16, 4096, n16_of(6144), 128, &g2, 1, 0, fl, &pl));
    ASSERT(!dc_plan_cluster(24, 25600, n16_of(5120), 128, &g2, 2, 0, fl, &pl));
    /* the one-block plans are unchanged: cl 1, the old shared memory */
    ASSERT(dc_plan_make(16, 4096, n16_of(6144), 128, &H200, 0, fl, &pl) && pl.cl == 1 &&
           pl.smem == dc_smem_bytes(16, 4096, 2, 2));
}

/* Where the dispatch takes the cluster split (dc_cl_takes, session 50's
 * measured points) */
TEST(dc_plan, cluster_split_rule) {
    static const struct { int m, k, n, want; const char *what; } cs[] = {
        {16, 8192, 57344, 1, "Llama-3-70B gate|up (111 -> 90 us at M = 12 / 16)"},
        {24, 8192, 57344, 0, "Llama-3-70B gate|up (1.01x the wgmma GEMM)"},
        {16, 8192, 28672, 1, "its tp = 2 shard"},
        {24, 8192, 28672, 1, "its tp = 2 shard (0.95x the wgmma GEMM)"},
        {24, 8192, 8192, 1, "Llama-3-70B o (26.4 -> 20.8 us)"},
        {24, 8192, 10240, 1, "Llama-3-70B q|k|v (33.3 -> 25.1 us)"},
        {16, 8192, 2560, 1, "its tp = 4 shard"},
        {12, 8192, 5120, 1, "Qwen3-32B o (0.86x)"},
        {16, 8192, 5120, 0, "Qwen3-32B o (1.13x the skinny kernel)"},
        {24, 8192, 5120, 1, "Qwen3-32B o (18.4 -> 16.0 us)"},
        {9, 8192, 8192, 0, "M = 9 (1.17x)"},
        {16, 4096, 6144, 0, "Qwen3-8B q|k|v (1.54x)"},
        {16, 5120, 10240, 0, "Qwen3-32B q|k|v (1.13x)"},
        {16, 28672, 8192, 0, "Llama-3-70B down"},
        {25, 8192, 8192, 0, "past the decode kernel's M"},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        ASSERT_MSG(dc_cl_takes(cs[i].m, cs[i].k, cs[i].n) == cs[i].want, "%s M=%d: %d", cs[i].what, cs[i].m,
                   !cs[i].want);
}

/* The K split through global memory at M <= 8 (dc_gs_pick, dc_plan_gs;
 * sessions 53-54's measured points on the H200's 132 SMs): where a split
 * grid of one wave has at least 1.4x the blocks the one-block plan has
 * resident (4 x 4 of as many where its x is >= 64 KB), K >= 6144 (5120
 * from M = 2, session 63) and N >= 4096, the most blocks (4 x 4 before 2 x 2);
 * where there is no one-block plan, grids of more than one wave */
TEST(dc_plan, ksplit_rule) {
    static const struct { int m, k, n, ks, tb; const char *what; } cs[] = {
        {1, 25600, 5120, 3, 4, "Qwen3-32B down (23.3 -> 19.2 us)"},
        {2, 25600, 5120, 3, 4, "Qwen3-32B down (25.7 -> 19.5 us)"},
        {1, 8192, 5120, 3, 4, "Qwen3-32B o (0.93x)"},
        {8, 8192, 5120, 3, 4, "Qwen3-32B o (0.81x; one block a SM of four tiles before)"},
        {1, 12800, 5120, 3, 4, "its tp = 2 down (0.89x)"},
        {4, 12800, 5120, 3, 4, "its tp = 2 down (0.80x)"},
        {1, 6400, 5120, 3, 4, "its tp = 4 down (0.94x)"},
        {8, 8192, 5120, 3, 4, "the Llama-3-70B tp = 2 q|k|v shard (0.81x)"},
        {8, 12288, 4096, 4, 4, "Qwen3-8B down (256 blocks of one a SM before: 0.90x; 4 x 4 of the same count 0.90x 2 x 2's)"},
        {5, 12288, 4096, 4, 4, "Qwen3-8B down (4 x 4 0.96x 2 x 2)"},
        {2, 28672, 8192, 2, 4, "Llama-3-70B down (0.87x)"},
        {8, 8192, 8192, 2, 4, "Llama-3-70B o (0.93x)"},
        {1, 5120, 5120, 0, 0, "the Qwen3-32B tp = 2 q|k|v shard (K = 5120 at M = 1: 1.06x with the counter, 0.99x with the poll)"},
        {2, 5120, 5120, 3, 4, "the Qwen3-32B tp = 2 q|k|v shard (session 63, the poll: 6.32 -> 6.06 us)"},
        {4, 5120, 5120, 3, 4, "the Qwen3-32B tp = 2 q|k|v shard (6.73 -> 6.28 us)"},
        {8, 5120, 5120, 3, 4, "the Qwen3-32B tp = 2 q|k|v shard (7.44 -> 6.36 us)"},
        {2, 5120, 10240, 0, 0, "Qwen3-32B q|k|v (K = 5120: no split of one wave)"},
        {2, 4096, 5120, 0, 0, "its tp = 2 o shard (K = 4096)"},
        {1, 4096, 5120, 0, 0, "its tp = 2 o shard (K = 4096: 1.21x)"},
        {1, 5120, 10240, 0, 0, "Qwen3-32B q|k|v (K = 5120)"},
        {1, 12288, 4096, 0, 0, "Qwen3-8B down (256 blocks, two a SM: 1.09x)"},
        {4, 12288, 4096, 4, 4, "Qwen3-8B down (256 blocks, two a SM, x of 98 KB: 4 x 4 0.86x)"},
        {3, 12288, 4096, 4, 4, "Qwen3-8B down (x of 74 KB: 4 x 4 0.96x)"},
        {2, 12288, 4096, 0, 0, "Qwen3-8B down (x of 49 KB: 4 x 4 1.01x)"},
        {6, 7168, 8192, 0, 0, "the Llama-3-70B tp = 4 down (2 x 4 as many blocks: 1.07x)"},
        {1, 4096, 4096, 0, 0, "Qwen3-8B o (1.25x)"},
        {1, 28672, 8192, 0, 0, "Llama-3-70B down (256 blocks, two a SM)"},
        {1, 8192, 8192, 0, 0, "Llama-3-70B o (256 blocks, two a SM: 1.08x)"},
        {1, 8192, 2560, 0, 0, "the Llama-3-70B tp = 4 q|k|v shard (N = 2560: 1.07-1.2x)"},
        {3, 8192, 2560, 0, 0, "the Llama-3-70B tp = 4 q|k|v shard (6 x 4 1.05x)"},
        {4, 8192, 2560, 6, 4, "the Llama-3-70B tp = 4 q|k|v shard (6.90 -> 6.34 us; 4 x 4 6.45)"},
        {6, 8192, 2560, 6, 4, "the Llama-3-70B tp = 4 q|k|v shard (8.00 -> 6.73 us)"},
        {8, 8192, 2560, 6, 4, "the Llama-3-70B tp = 4 q|k|v shard (80 blocks of one a SM, 7.38 -> 6.80 us)"},
        {6, 6144, 2560, 0, 0, "N = 2560 below K = 8192 (not measured)"},
        {4, 5120, 2560, 0, 0, "the Qwen3-32B tp = 4 q|k|v shard (3 x 2: 0.88x back to back, its rank proxy 1.007x a step)"},
    };
    const int fl = DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        struct dc_plan pl, q;
        memset(&q, 0, sizeof q);
        ASSERT(dc_plan_make(cs[i].m, cs[i].k, n16_of(cs[i].n), 128, &H200, 0, fl, &pl));
        const int got = dc_gs_pick(&pl, &H200, &q);
        ASSERT_MSG(got == (cs[i].ks > 0), "%s M=%d: %d", cs[i].what, cs[i].m, got);
        if (!got) continue;
        ASSERT_MSG(q.cl == cs[i].ks && q.tb == cs[i].tb, "%s M=%d: %d x %d tiles", cs[i].what, cs[i].m, q.cl, q.tb);
        ASSERT(q.gs == 1 && q.pf == 0 && q.blocks == (pl.n16 + q.tb - 1) / q.tb && dc_gs_one_wave(&q, &H200));
        ASSERT(q.k == (cs[i].k / 128 + q.cl - 1) / q.cl * 128 && q.smem == dc_smem_bytes(cs[i].m, q.k, q.tb, 1));
        ASSERT(dc_gs_ws_bytes(&q) == (size_t)q.blocks * q.cl * q.tb * 4 * 32 * 4);
    }
    /* the one-block plans are unchanged (gs 0) */
    struct dc_plan pl;
    ASSERT(dc_plan_make(1, 25600, n16_of(5120), 128, &H200, 0, fl, &pl) && pl.gs == 0 && pl.cl == 1 && pl.tb == 2);
    /* uneven thirds: K / 128 = 200 as 66 / 67 / 67, the plan's x room for 67 */
    struct dc_plan q;
    ASSERT(dc_plan_gs(1, 25600, 320, 128, &H200, 3, 4, fl, &q) && q.k == 67 * 128 && q.blocks == 80);
    /* where x of all of K leaves no one-block plan (dc_gs_pick_any): Qwen3-32B down at M = 4
     * (30.65 -> 20.11 us against the skinny kernel), its tp = 2 down at M = 8 (16.71 -> 12.60) */
    ASSERT(!dc_plan_make(4, 25600, 320, 128, &H200, 0, fl, &pl));
    ASSERT(dc_gs_pick_any(4, 25600, 320, 128, &H200, fl, &q) && q.cl == 3 && q.tb == 4 && q.blocks == 80);
    ASSERT(dc_gs_pick_any(3, 25600, 320, 128, &H200, fl, &q) && q.cl == 3 && q.tb == 4);
    ASSERT(dc_gs_pick_any(8, 12800, 320, 128, &H200, fl, &q) && q.cl == 3 && q.tb == 4);
    ASSERT(!dc_gs_pick_any(9, 25600, 320, 128, &H200, fl, &q));
    /* and there no split of one wave (session 54): more than one wave of 4 x 4, 6 x 4, 8 x 4 or 4 x 2
     * tiles where two blocks fit an SM (x of a third of K at M = 6, 103 KB, leaves one a SM), the
     * fullest last wave, and of those within 5 points of it the fewest blocks (session 55) */
    static const struct { int m, k, n, ks, tb; const char *what; } mw[] = {
        {6, 25600, 5120, 6, 4, "Qwen3-32B down (4 x 4, 320 blocks, 61% of the last wave: 26.0 us; 6 x 4, 91%: 22.9)"},
        {7, 25600, 5120, 6, 4, "Qwen3-32B down (4 x 4 26.5 us, 6 x 4 23.8, 8 x 4 25.2)"},
        {8, 25600, 5120, 6, 4, "Qwen3-32B down (4 x 2 27.5 us, 6 x 4 23.4; 4 x 4, one block a SM, 31.7)"},
        {5, 28672, 8192, 4, 4, "Llama-3-70B down (97% full as 6 x 4: the fewer blocks, 34.0 us against 35.2)"},
        {6, 28672, 8192, 4, 4, "Llama-3-70B down (36.3 us, 6 x 4 36.4)"},
        {7, 28672, 8192, 6, 4, "Llama-3-70B down (4 x 2 46.7 us, 6 x 4 39.5, 8 x 4 41.1)"},
        {8, 28672, 8192, 6, 4, "Llama-3-70B down (skinny 45.6 us, 6 x 4 38.1, 8 x 4 38.5)"},
        {7, 14336, 8192, 4, 4, "its tp = 2 down (23.2 -> 21.3 us; 6 x 4 23.7)"},
        {8, 14336, 8192, 4, 4, "its tp = 2 down (24.9 -> 20.8 us; 6 x 4 22.7)"},
    };
    for (size_t i = 0; i < sizeof mw / sizeof mw[0]; i++) {
        memset(&q, 0, sizeof q);
        ASSERT(!dc_plan_make(mw[i].m, mw[i].k, n16_of(mw[i].n), 128, &H200, 0, fl, &pl));
        const int got = dc_gs_pick_any(mw[i].m, mw[i].k, n16_of(mw[i].n), 128, &H200, fl, &q);
        ASSERT_MSG(got == (mw[i].ks > 0), "%s M=%d: %d", mw[i].what, mw[i].m, got);
        if (!got) continue;
        ASSERT_MSG(q.cl == mw[i].ks && q.tb == mw[i].tb && !dc_gs_one_wave(&q, &H200) &&
                       dc_blocks_per_sm(&H200, q.smem) == 2,
                   "%s M=%d: %d x %d tiles", mw[i].what, mw[i].m, q.cl, q.tb);
    }
    /* not past one wave where a one-block plan exists (Qwen3-32B o at M = 8: its 3 x 4 of one wave) */
    ASSERT(dc_plan_make(8, 8192, 320, 128, &H200, 0, fl, &pl) && dc_gs_pick(&pl, &H200, &q) && q.cl == 3 &&
           dc_gs_one_wave(&q, &H200));
    ASSERT(dc_plan_make(1, 28672, 512, 128, &H200, 0, fl, &pl) && !dc_gs_pick(&pl, &H200, &q));
    /* but past one wave as 2 x 4 where that plan has one block a SM over more than one wave, in at
     * most 4 waves whose last is >= 80% full (session 56): the Llama-3-70B gate|up shards at M = 7-8
     * (tp = 2 3.4 waves, tp = 4 1.7, both 85%), not the whole matrix (6.8 waves) nor its q|k|v (1.2
     * waves, 61%); without session 56's cases (dc_gs_pick_flags 0) none of them */
    static const struct { int m, k, n, take; } wide[] = {
        {7, 8192, 28672, 1}, {8, 8192, 28672, 1}, {7, 8192, 14336, 1}, {8, 8192, 14336, 1},
        {8, 8192, 57344, 0}, {8, 8192, 10240, 0}, {6, 8192, 28672, 0},
    };
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        ASSERT(dc_plan_make(wide[i].m, wide[i].k, n16_of(wide[i].n), 128, &H200, 0, fl, &pl));
        memset(&q, 0, sizeof q);
        const int got = dc_gs_pick(&pl, &H200, &q);
        ASSERT_MSG(got == wide[i].take, "N=%d M=%d: %d", wide[i].n, wide[i].m, got);
        if (got)
            ASSERT(q.cl == 2 && q.tb == 4 && !dc_gs_one_wave(&q, &H200) && dc_blocks_per_sm(&H200, q.smem) == 2 &&
                   dc_blocks_per_sm(&H200, pl.smem) == 1);
        ASSERT(!dc_gs_pick_flags(&pl, &H200, 0, &q));
    }
    ASSERT(dc_plan_make(6, 8192, 160, 128, &H200, 0, fl, &pl) && !dc_gs_pick_flags(&pl, &H200, 0, &q));
    /* not: M > 8, fewer groups than blocks */
    ASSERT(!dc_plan_gs(9, 8192, 320, 128, &H200, 3, 4, fl, &q));
    ASSERT(!dc_plan_gs(1, 256, 320, 128, &H200, 3, 4, fl, &q));
}

/* ZM's form (dc_zm_form, docs/KERNELS.md "ZM", "ZM1"): the rule's picks on the
 * real shapes at M = 1 (the grid each takes there on 132 SMs), form 2 never
 * past M = 1 (it reads every column of x's fragment as one row), and the
 * knobs: ZM off, ZM1 off, ZM1 everywhere. */
TEST(dc_plan, zm_form_rule) {
    enum { P = DC_GRID_PLAIN, S = DC_GRID_PS, G = DC_GRID_GS };
    static const struct { int tb, k, grid, form; const char *what; } cs[] = {
        {1, 4096, P, 2, "Qwen3-8B o (one turn a warp)"},
        {1, 8192, P, 2, "Llama-3-70B q|k|v tp=4 (two turns)"},
        {1, 8192, S, 2, "Llama-3-70B gate|up tp=2 (persistent, two turns)"},
        {1, 5120, P, 0, "Qwen3-32B q|k|v tp=4 (a partial turn)"},
        {1, 12288, P, 1, "Qwen3-8B down (three turns: form 1)"},
        {1, 2048, P, 0, "one tile, half a turn"},
        {2, 4096, P, 2, "Qwen3-8B q|k|v"},
        {2, 2048, P, 2, "Qwen3-32B o tp=4"},
        {2, 4096, S, 2, "Qwen3-8B gate|up (persistent)"},
        {4, 5120, S, 2, "Qwen3-32B gate|up (persistent)"},
        {4, 2560, G, 2, "Qwen3-32B o (the K split, 3 x 4)"},
        {4, 8576, G, 2, "Qwen3-32B down (the K split)"},
        {4, 5120, P, 1, "Qwen3-32B q|k|v"},
        {2, 5120, P, 1, "Qwen3-32B q|k|v tp=2"},
        {2, 8192, P, 1, "Llama-3-70B o"},
        {2, 28672, P, 1, "Llama-3-70B down"},
        {4, 8192, P, 1, "Llama-3-70B q|k|v"},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++) {
        const int f = dc_zm_form(1, cs[i].tb, cs[i].k, cs[i].grid, 8, 1);
        ASSERT_MSG(f == cs[i].form, "%s: TB %d K %d grid %d: form %d, want %d", cs[i].what, cs[i].tb, cs[i].k,
                   cs[i].grid, f, cs[i].form);
        /* ZM1 off: form 1 where the k16-step rule takes it, else none */
        const int f1 = dc_zm_form(1, cs[i].tb, cs[i].k, cs[i].grid, 8, 0);
        ASSERT_EQ_INT(f1, cs[i].tb >= 2 || cs[i].k >= 12288 ? 1 : 0);
        /* ZM1 everywhere: form 2 wherever ZM runs (and the one-tile short ranges) */
        const int f2 = dc_zm_form(1, cs[i].tb, cs[i].k, cs[i].grid, 8, 2);
        ASSERT_EQ_INT(f2, f1 || cs[i].form == 2 ? 2 : 0);
        ASSERT_EQ_INT(dc_zm_form(1, cs[i].tb, cs[i].k, cs[i].grid, 0, 1), 0); /* ZM off */
    }
    /* never form 2 past M = 1; form 1 by its rule at M = 2-8, none past zm_max */
    for (int m = 2; m <= 16; m++)
        for (int tb = 1; tb <= 4; tb *= 2)
            for (int k = 2048; k <= 28672; k += 1024)
                for (int grid = 0; grid < 3; grid++)
                    for (int z1 = 0; z1 <= 2; z1++) {
                        const int f = dc_zm_form(m, tb, k, grid, 8, z1);
                        const int want = m <= 8 && (tb >= 4 || (m <= 4 && (tb >= 2 || k >= 12288)));
                        ASSERT_MSG(f == want, "M %d TB %d K %d grid %d zm1 %d: form %d, want %d", m, tb, k, grid,
                                   z1, f, want);
                    }
    ASSERT_EQ_INT(dc_zm_form(4, 2, 4096, DC_GRID_PLAIN, 3, 1), 0); /* AWQD_W4A16_DC_ZM=3 at M = 4 */
}
