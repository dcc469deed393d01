/* test_carveout.c — the shared-memory carveout of a kernel launch
 * (kernels/cuda/carveout_rule.h) on the CPU, for launches of a 132-SM H200
 * (228 KB of shared memory an SM): the floor where a launch needs less, its
 * blocks' need where more, and the driver's choice where off. */
#include "tests/harness/test.h"

#include "kernels/cuda/carveout_rule.h"

#define H200_SMEM 233472
#define H200_SMS 132

static struct carveout_launch launch(int regs, int stat, long long dyn, int threads, long long blocks) {
    struct carveout_launch l = {regs, stat, dyn, threads, blocks, H200_SMEM, H200_SMS};
    return l;
}

TEST(carveout, small_kernels_take_the_floor) {
    /* the batch-1 q|k|v decode linear: 192 blocks of 256 threads at 128 registers, 16 KB each */
    struct carveout_launch l = launch(128, 256, 16400, 256, 192);
    ASSERT_EQ_INT(carveout_pct(&l, CARVEOUT_DEFAULT_PCT), 72);
    ASSERT_EQ_INT(carveout_pct(&l, 58), 58);
    /* the batch-1 decode attention: 264 CTAs of 128 threads, 39 KB each: two a SM by its grid */
    l = launch(125, 512, 39168, 128, 264);
    ASSERT_EQ_INT(carveout_pct(&l, 72), 72);
    /* the merge: 32 blocks, no dynamic shared memory */
    l = launch(40, 2048, 0, 256, 32);
    ASSERT_EQ_INT(carveout_pct(&l, 72), 72);
}

TEST(carveout, a_launch_that_needs_more_gets_it) {
    /* the attention at batch 64: 512 CTAs, four a SM by registers and by its grid: 4 x 40.5 KB */
    struct carveout_launch l = launch(125, 512, 39168, 128, 512);
    const long long need = 4LL * (39168 + 512 + 1024);
    ASSERT_EQ_INT(carveout_pct(&l, 50), (int)((need * 100 + H200_SMEM - 1) / H200_SMEM)); /* 70 */
    ASSERT_EQ_INT(carveout_pct(&l, 80), 80);
    /* a decode linear at M = 8 and K = 5120: two blocks of 89 KB a SM need 78% */
    l = launch(128, 0, 90000, 256, 320);
    ASSERT_EQ_INT(carveout_pct(&l, 72), (int)((2LL * 91024 * 100 + H200_SMEM - 1) / H200_SMEM));
    ASSERT(carveout_pct(&l, 72) > 72);
    /* one block of 200 KB: the whole array */
    l = launch(255, 0, 200 * 1024, 256, 132);
    ASSERT_EQ_INT(carveout_pct(&l, 72), 89);
    l = launch(255, 0, 227 * 1024, 256, 132);
    ASSERT_EQ_INT(carveout_pct(&l, 72), 100);
}

TEST(carveout, occupancy_limits) {
    /* registers bound it: 255 registers x 256 threads -> one block a SM, even on a large grid */
    struct carveout_launch l = launch(255, 0, 100 * 1024, 256, 4000);
    ASSERT_EQ_INT(carveout_pct(&l, 10), (int)((101LL * 1024 * 100 + H200_SMEM - 1) / H200_SMEM));
    /* unknown registers: threads bound it (2048 / 1024 = 2 blocks) */
    l = launch(0, 0, 40 * 1024, 1024, 4000);
    ASSERT_EQ_INT(carveout_pct(&l, 10), (int)((2LL * 41 * 1024 * 100 + H200_SMEM - 1) / H200_SMEM));
    /* a grid of fewer blocks than SMs: one a SM */
    l = launch(32, 0, 60 * 1024, 128, 100);
    ASSERT_EQ_INT(carveout_pct(&l, 10), (int)((61LL * 1024 * 100 + H200_SMEM - 1) / H200_SMEM));
}

TEST(carveout, off_and_unknown) {
    struct carveout_launch l = launch(128, 256, 16400, 256, 192);
    ASSERT_EQ_INT(carveout_pct(&l, 0), -1);
    ASSERT_EQ_INT(carveout_pct(&l, 101), -1);
    l.sm_smem = 0;
    ASSERT_EQ_INT(carveout_pct(&l, 72), -1);
    l = launch(128, 256, 16400, 0, 192);
    ASSERT_EQ_INT(carveout_pct(&l, 72), -1);
}
