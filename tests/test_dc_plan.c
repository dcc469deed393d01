/* test_dc_plan.c — the W4A16 decode kernel's launch plan and its place in
 * the automatic dispatch (kernels/cuda/dc_plan.h), on the CPU: the rules
 * measured on H100 / H200 (docs/KERNELS.md "The decode kernel"), written
 * out for the real layer shapes of Qwen3-8B / 32B and its tensor-parallel
 * shards on a 132-SM GPU with 228 KB of shared memory per SM, plus the
 * plan's invariants over many shapes. The GPU test w4a16.decode_dispatch_rule
 * checks that the CUDA backend's choice follows the same rule. */
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
        /* 256 tiles: 1 per block at M <= 2, at least 2 from M = 3 */
        {4096, 4096, 1, 1, 256, "Qwen3-8B o"},
        {4096, 4096, 3, 2, 128, "Qwen3-8B o"},
        /* 1536 tiles: 384 blocks of 4 would be 1.45 waves of 2 per SM: halved at M <= 2 */
        {4096, 24576, 1, 2, 768, "Qwen3-8B gate|up"},
        {4096, 24576, 3, 4, 384, "Qwen3-8B gate|up"},
        {12288, 4096, 2, 1, 256, "Qwen3-8B down"},
        {12288, 4096, 5, 2, 128, "Qwen3-8B down"},
        /* 640 tiles: 160 blocks of 4 */
        {5120, 10240, 1, 4, 160, "Qwen3-32B q|k|v"},
        /* 3200 tiles: 800 blocks of 4 (3 waves: not halved) */
        {5120, 51200, 1, 4, 800, "Qwen3-32B gate|up"},
        {8192, 5120, 6, 2, 160, "Qwen3-32B o"},
        /* 160 tiles of the tp = 4 q|k|v shard: 1 per block, 2 from M = 3 */
        {5120, 2560, 1, 1, 160, "Qwen3-32B q|k|v tp=4"},
        {5120, 2560, 8, 2, 80, "Qwen3-32B q|k|v tp=4"},
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
}

TEST(dc_plan, where_the_kernel_does_not_apply) {
    struct dc_plan pl;
    ASSERT(!dc_plan_make(0, 4096, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(17, 4096, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(1, 4096, 256, 64, &H200, 0, 1, &pl)); /* group 128 only */
    /* x of 8 rows at K = 12288 + the reduction area: 205 KB > 200 KB */
    ASSERT(dc_plan_make(7, 12288, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(8, 12288, 256, 128, &H200, 0, 1, &pl));
    /* a GPU whose blocks may hold less (A100: 163 KB) */
    const struct dc_gpu a100 = {108, 164 * 1024, 163 * 1024};
    ASSERT(dc_plan_make(7, 12288, 256, 128, &H200, 0, 1, &pl));
    ASSERT(!dc_plan_make(7, 12288, 256, 128, &a100, 0, 1, &pl));
}

/* The session-21 rule on the 16 measured shapes at M = 1..8 (H200, back to
 * back against the skinny kernel, docs/PERFORMANCE.md "Session 21"). */
TEST(dc_plan, dispatch_rule_on_measured_shapes) {
    static const struct { int k, n; const char *what; int dec[8]; } cs[] = {
        {4096, 6144, "Qwen3-8B q|k|v", {1, 1, 1, 1, 1, 1, 1, 1}},
        {4096, 4096, "Qwen3-8B o", {1, 1, 1, 1, 1, 1, 1, 1}},
        {4096, 24576, "Qwen3-8B gate|up", {1, 1, 1, 1, 1, 1, 1, 1}},
        /* 128 blocks: one wave at one block per SM (M = 5-7); M = 8 no plan */
        {12288, 4096, "Qwen3-8B down", {1, 1, 1, 1, 1, 1, 1, 0}},
        {5120, 10240, "Qwen3-32B q|k|v", {1, 1, 1, 1, 1, 1, 1, 1}},
        /* 160 blocks, one per SM from M = 7: measured 15.4-15.7 vs skinny 13.0-13.6 us */
        {8192, 5120, "Qwen3-32B o", {1, 1, 1, 1, 1, 1, 0, 0}},
        {5120, 51200, "Qwen3-32B gate|up", {1, 1, 1, 1, 1, 1, 1, 1}},
        /* one block per SM from M = 3 (36.2 vs 27.4 us), no plan from M = 4 */
        {25600, 5120, "Qwen3-32B down", {1, 1, 0, 0, 0, 0, 0, 0}},
        {5120, 5120, "Qwen3-32B q|k|v tp=2", {1, 1, 1, 1, 1, 1, 1, 1}},
        {4096, 5120, "Qwen3-32B o tp=2", {1, 1, 1, 1, 1, 1, 1, 1}},
        {5120, 25600, "Qwen3-32B gate|up tp=2", {1, 1, 1, 1, 1, 1, 1, 1}},
        /* one block per SM from M = 5 (21.8-23.2 vs 17.1 us) */
        {12800, 5120, "Qwen3-32B down tp=2", {1, 1, 1, 1, 0, 0, 0, 0}},
        {5120, 2560, "Qwen3-32B q|k|v tp=4", {1, 1, 1, 1, 1, 1, 1, 1}},
        {2048, 5120, "Qwen3-32B o tp=4", {1, 1, 1, 1, 1, 1, 1, 1}},
        {5120, 12800, "Qwen3-32B gate|up tp=4", {1, 1, 1, 1, 1, 1, 1, 1}},
        {6400, 5120, "Qwen3-32B down tp=4", {1, 1, 1, 1, 1, 1, 1, 1}},
    };
    for (int i = 0; i < (int)(sizeof cs / sizeof cs[0]); i++)
        for (int m = 1; m <= 8; m++) {
            struct dc_plan pl;
            const int has = dc_plan_make(m, cs[i].k, n16_of(cs[i].n), 128, &H200, 0, 1, &pl);
            const int takes = dc_dispatch_takes(m, DC_DISPATCH_MAX_M, has ? &pl : 0, &H200);
            ASSERT_MSG(takes == cs[i].dec[m - 1], "%s (K %d, N %d) M=%d: %s, want %s", cs[i].what, cs[i].k,
                       cs[i].n, m, takes ? "decode" : "not decode", cs[i].dec[m - 1] ? "decode" : "not decode");
            /* a lower last M (AWQD_W4A16_DC_MAX_M) only removes M above it */
            ASSERT(dc_dispatch_takes(m, 4, has ? &pl : 0, &H200) == (m <= 4 && takes));
        }
}

/* Invariants over many shapes: the plan covers every tile, fits its shared
 * memory, and the dispatch takes it at M <= 2 wherever it applies and never
 * where one block per SM leaves a second wave. */
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
                    ASSERT(pl.smem == dc_smem_bytes(m, k, pl.tb, pl.mt) && pl.smem <= DC_SMEM_MAX);
                    ASSERT(gpus[gi].smem_optin == 0 || pl.smem <= (size_t)gpus[gi].smem_optin);
                    ASSERT(m < 3 || pl.tb >= 2);
                    const int takes = dc_dispatch_takes(m, DC_DISPATCH_MAX_M, &pl, &gpus[gi]);
                    if (m <= 2) ASSERT(takes);
                    if (m > DC_DISPATCH_MAX_M) ASSERT(!takes);
                    if (takes && m >= 3)
                        ASSERT(dc_blocks_per_sm(&gpus[gi], pl.smem) >= 2 || pl.blocks <= gpus[gi].sms);
                    if (test_failed()) return;
                }
}
