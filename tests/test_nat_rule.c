/* test_nat_rule.c — where the wgmma GEMM takes M = 17-64 from tc64 and the
 * skinny kernel (kernels/cuda/nat_rule.h), on the CPU: session 19's rule
 * from single calls on the H100 (b2b = 0, AWQD_W4A16_NAT_BIG=0) and the
 * back-to-back rule of sessions 28-49 (b2b = 1, the default on every device
 * since session 71; columns "h200"), written out for the real
 * layer shapes of Qwen3-8B, Qwen3-32B and Llama-3-70B and their tp = 2 / 4
 * shards, as the back-to-back audits of sessions 28 and 42 measured them
 * (docs/PERFORMANCE.md "Session 28" item 2, "Session 42" item 6). */
#include "tests/harness/test.h"

#include "kernels/cuda/nat_rule.h"

/* K, N (all the weight's columns; gate|up 2 x intermediate); then
 * the first M of 17-27 from which mode 4 takes it on an H200 (session 42's
 * audit: N >= 5120, K >= 5120 and K >= 6144 or K N >= 96 Mi, from 17; from
 * 25 where K N < 48 Mi since session 49's skinny split sweep), the first M of 25-28 from which
 * session 43's rule gives it the rest (N >= 4096 and K N >= 96 Mi from 25,
 * K >= 12288 from 26, K N >= 48 Mi from 28; 0: not by that rule), whether
 * it takes M = 28, 32, 40, 64 on an H200 and M = 32, 40, 64 on an H100; then whether nat_wide_takes gives it M = 1536, 2048, 4096 on an
 * H200 (132 SMs; -1: not asked, gate|up takes M <= 4096 by its own rule in
 * w4a16.cu) */
static const struct nat_case {
    const char *what;
    int k, n;
    int low;     /* H200: the first M of 17-27 from which session 42's clause takes it (0: none;
                  * 25: K N < 48 Mi, the skinny kernel to M = 24 since session 49) */
    int mid;     /* H200, from M = mid (session 43) */
    int h200[4];
    int h100[3];
    int wide[3];
} cases[] = {
    {"Qwen3-8B q|k|v", 4096, 6144, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    /* K N = 16 Mi: the edge, in; 192 tiles at 1536: 1.45 waves */
    {"Qwen3-8B o", 4096, 4096, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {0, 1, 1}},
    {"Qwen3-8B gate|up", 4096, 24576, 0, 25, {1, 1, 1, 1}, {0, 0, 0}, {-1, -1, -1}}, /* H200: a tie until session 36's loop */
    {"Qwen3-8B down", 12288, 4096, 0, 26, {1, 1, 1, 1}, {0, 0, 0}, {0, 1, 1}},
    {"Qwen3-32B q|k|v", 5120, 10240, 0, 28, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Qwen3-32B o", 8192, 5120, 25, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Qwen3-32B gate|up", 5120, 51200, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {-1, -1, -1}},
    {"Qwen3-32B down", 25600, 5120, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {1, 0, 1}}, /* 2048: x 100 MB, 320 whole tiles in 3 rounds */
    {"Qwen3-32B tp=2 q|k|v", 5120, 5120, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Qwen3-32B tp=2 o", 4096, 5120, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Qwen3-32B tp=2 gate|up", 5120, 25600, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {-1, -1, -1}},
    /* session 28: skinny at 28-32 (1.07-1.14x); session 42: mode 4 from 17 (0.82-0.96x at 18-27);
     * 2048: x 50 MB, 3 rounds (1.17x measured) */
    {"Qwen3-32B tp=2 down", 12800, 5120, 17, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 0, 1}},
    /* N = 2560: tc64 won at M = 40-64 in session 28, the wgmma GEMM since session 49 */
    {"Qwen3-32B tp=4 q|k|v", 5120, 2560, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {0, 0, 0}},
    {"Qwen3-32B tp=4 o", 2048, 5120, 0, 0, {0, 0, 0, 0}, {0, 0, 0}, {1, 1, 1}}, /* K N = 10 Mi: tc64 won */
    {"Qwen3-32B tp=4 gate|up", 5120, 12800, 0, 28, {1, 1, 1, 1}, {0, 0, 0}, {-1, -1, -1}},
    {"Qwen3-32B tp=4 down", 6400, 5120, 25, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Llama-3-70B q|k|v", 8192, 10240, 17, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Llama-3-70B o", 8192, 8192, 17, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Llama-3-70B gate|up", 8192, 57344, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {-1, -1, -1}},
    {"Llama-3-70B down", 28672, 8192, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
    {"Llama-3-70B tp=2 q|k|v", 8192, 5120, 25, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Llama-3-70B tp=2 o", 4096, 8192, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"Llama-3-70B tp=2 gate|up", 8192, 28672, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {-1, -1, -1}},
    {"Llama-3-70B tp=2 down", 14336, 8192, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
    {"Llama-3-70B tp=4 q|k|v", 8192, 2560, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {0, 0, 0}},
    {"Llama-3-70B tp=4 o", 2048, 8192, 0, 0, {0, 0, 1, 1}, {0, 0, 0}, {1, 1, 1}}, /* K N = 16 Mi: in */
    {"Llama-3-70B tp=4 gate|up", 8192, 14336, 17, 0, {1, 1, 1, 1}, {0, 1, 1}, {-1, -1, -1}},
    {"Llama-3-70B tp=4 down", 7168, 8192, 17, 0, {1, 1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
};

TEST(nat_rule, real_shapes_on_the_h200_and_the_h100) {
    static const int m200[4] = {28, 32, 40, 64}, m100[3] = {32, 40, 64};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        const struct nat_case *c = &cases[i];
        for (int m = 1; m <= 27; m++) {
            const int want = (c->low && m >= c->low) || (c->mid && m >= c->mid);
            ASSERT_MSG(nat_mid_takes(m, c->k, c->n, 1) == want, "H200 %s (K %d, N %d) M=%d: mode 4 %s", c->what,
                       c->k, c->n, m, want ? "expected" : "not expected");
            ASSERT(!nat_mid_takes(m, c->k, c->n, 0)); /* the H100: from M = 33 only */
        }
        for (int j = 0; j < 4; j++)
            ASSERT_MSG(nat_mid_takes(m200[j], c->k, c->n, 1) == c->h200[j],
                       "H200 %s (K %d, N %d) M=%d: mode 4 %s", c->what, c->k, c->n, m200[j],
                       c->h200[j] ? "expected" : "not expected");
        for (int j = 0; j < 3; j++)
            ASSERT_MSG(nat_mid_takes(m100[j], c->k, c->n, 0) == c->h100[j],
                       "H100 %s (K %d, N %d) M=%d: mode 4 %s", c->what, c->k, c->n, m100[j],
                       c->h100[j] ? "expected" : "not expected");
    }
}

TEST(nat_rule, edges) {
    /* below M = 17 never; M = 17-24 only by session 42's clause (Qwen3-8B down: N = 4096; K = 5120
     * with K N < 96 Mi); M = 33 with 40 on the H200 (the times are flat there) */
    ASSERT(!nat_mid_takes(16, 28672, 8192, 1));
    ASSERT(nat_mid_takes(17, 28672, 8192, 1));
    ASSERT(!nat_mid_takes(24, 12288, 4096, 1));
    ASSERT(nat_mid_takes(27, 6144, 5120, 1));
    ASSERT(!nat_mid_takes(27, 6143, 5120, 1));
    ASSERT(nat_mid_takes(20, 5120, 19661, 1));
    ASSERT(!nat_mid_takes(20, 5120, 19660, 1));
    ASSERT(!nat_mid_takes(20, 4096, 1 << 20, 1));
    ASSERT(nat_mid_takes(33, 4096, 6144, 1));
    ASSERT(!nat_mid_takes(32, 4096, 6144, 1));
    ASSERT(nat_mid_takes(33, 5120, 2560, 1));  /* N >= 2560 and K >= 5120 from M = 33 (session 49) */
    ASSERT(!nat_mid_takes(32, 5120, 2560, 1));
    ASSERT(!nat_mid_takes(33, 5119, 2560, 1));
    ASSERT(!nat_mid_takes(33, 5120, 2559, 1));
    ASSERT(!nat_mid_takes(64, 2048, 5120, 1)); /* Qwen3-32B tp = 4 o */
    /* the H200's K N and N limits */
    ASSERT(!nat_mid_takes(48, 4096, 4080, 1));
    ASSERT(!nat_mid_takes(48, 4080, 4096, 1));
    /* session 43 at M = 25-32 (N >= 4096): K N >= 96 Mi from 25, K >= 12288 from 26, K N >= 48 Mi from 28 */
    ASSERT(nat_mid_takes(25, 4096, 24576, 1));
    ASSERT(!nat_mid_takes(24, 4096, 24576, 1));
    ASSERT(!nat_mid_takes(25, 4096, 24575, 1));
    ASSERT(nat_mid_takes(26, 12288, 4096, 1));
    ASSERT(!nat_mid_takes(25, 12288, 4096, 1));
    ASSERT(!nat_mid_takes(27, 12287, 4096, 1));
    ASSERT(!nat_mid_takes(30, 14336, 1024, 1)); /* N < 4096 */
    ASSERT(nat_mid_takes(28, 4096, 12288, 1));  /* 48 Mi */
    ASSERT(!nat_mid_takes(27, 4096, 12288, 1));
    ASSERT(!nat_mid_takes(28, 4096, 12287, 1));
    /* K = 4096 (any layout, gate|up too since session 36) on the H200, not on the H100 */
    ASSERT(nat_mid_takes(64, 4096, 1 << 16, 1));
    ASSERT(!nat_mid_takes(64, 4096, 1 << 16, 0));
    /* the H100: K >= 5120 and K N >= 96 Mi from M = 33 */
    ASSERT(!nat_mid_takes(33, 4096, 1 << 16, 0));
    ASSERT(nat_mid_takes(33, 5120, 19661, 0));
    ASSERT(!nat_mid_takes(33, 5120, 19660, 0));
    ASSERT(!nat_mid_takes(32, 25600, 5120, 0));
}

/* Above M = 1024 on the H200 (132 SMs), session 39: the table's wide
 * column, the non-gate|up shapes at M = 1536, 2048, 4096 (docs/PERFORMANCE.md
 * "Session 39" item 5: measured 0.80-0.98x dequantize + cuBLAS at every
 * point taken; the points left: Qwen3-8B o / down at 1536 1.11x, Qwen3-32B
 * tp = 2 down at 2048 1.17x, the tp = 4 q|k|v shards 0.81-0.84x at 1536
 * but 0.985-1.35x from 2048, Qwen3-32B down at 2048 0.98x) */

TEST(nat_rule, above_1024_on_the_h200) {
    static const int ms[3] = {1536, 2048, 4096};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        const struct nat_case *c = &cases[i];
        for (int j = 0; j < 3; j++)
            if (c->wide[j] >= 0)
                ASSERT_MSG(nat_wide_takes(ms[j], c->k, c->n, 132, 1) == c->wide[j],
                           "H200 %s (K %d, N %d) M=%d: mode 4 %s", c->what, c->k, c->n, ms[j],
                           c->wide[j] ? "expected" : "not expected");
    }
    /* the M range, the H100 (not measured), N */
    ASSERT(!nat_wide_takes(1024, 4096, 6144, 132, 1));
    ASSERT(nat_wide_takes(1025, 4096, 6144, 132, 1));
    ASSERT(!nat_wide_takes(4097, 4096, 6144, 132, 1));
    ASSERT(!nat_wide_takes(2048, 4096, 6144, 132, 0));
    ASSERT(!nat_wide_takes(2048, 4096, 4080, 132, 1));
    /* the 1.8-wave edge: 32 x 8 = 256 tiles on 142 SMs (255.6 needed) in, on 143 (257.4) out */
    ASSERT(nat_wide_takes(2048, 4096, 4096, 142, 1));
    ASSERT(!nat_wide_takes(2048, 4096, 4096, 143, 1));
    /* stream-K's x limit (32 MiB: M K 2 bytes), then whole rounds >= 90% full: 320 tiles in 3 rounds
       of 132 out, 256 in 2 in */
    ASSERT(nat_wide_takes(2048, 8192, 5120, 132, 1));  /* x = 32 MiB: stream-K */
    ASSERT(!nat_wide_takes(2048, 8193, 5120, 132, 1)); /* x > 32 MiB, 320 tiles */
    ASSERT(nat_wide_takes(2048, 8193, 4096, 132, 1));  /* 256 tiles in 2 rounds */
}

/* XP (session 51): the H200's back-to-back audit at M = 17-64 against the
 * previous commit: the gate|up matrices of K N >= 56 Mi gained, every
 * down_proj, Llama-3-70B o and the small matrices lost; M = 65-128 lost on
 * most shapes (docs/PERFORMANCE.md "Session 51"). */
TEST(nat_rule, xp_where_measured) {
    static const struct { const char *what; int k, n, gu, xp; } xc[] = {
        {"Qwen3-8B q|k|v", 4096, 6144, 0, 0},            /* 1.04x at M = 64 */
        {"Qwen3-8B o", 4096, 4096, 0, 0},                /* 1.02x */
        {"Qwen3-8B gate|up", 4096, 24576, 1, 1},         /* 0.97-0.98x at M = 32 / 64 */
        {"Qwen3-8B down", 12288, 4096, 0, 0},            /* 1.00-1.01x */
        {"Qwen3-32B gate|up", 5120, 51200, 1, 1},        /* 0.91-0.95x */
        {"Qwen3-32B down", 25600, 5120, 0, 0},           /* 1.04-1.05x */
        {"Qwen3-32B tp=2 gate|up", 5120, 25600, 1, 1},   /* 0.96-0.97x */
        {"Qwen3-32B tp=2 down", 12800, 5120, 0, 0},      /* 1.05-1.06x */
        {"Qwen3-32B tp=4 gate|up", 5120, 12800, 1, 1},   /* 62.5 Mi: within 1.5% */
        {"Llama-3-70B o", 8192, 8192, 0, 0},             /* 1.05x */
        {"Llama-3-70B gate|up", 8192, 57344, 1, 1},      /* 0.91-0.96x */
        {"Llama-3-70B down", 28672, 8192, 0, 0},         /* 1.03-1.04x */
        {"Llama-3-70B tp=2 gate|up", 8192, 28672, 1, 1}, /* 0.94-0.95x */
        {"Llama-3-70B tp=4 gate|up", 8192, 14336, 1, 1}, /* 0.97x */
        {"Llama-3-70B tp=4 down", 7168, 8192, 0, 0},     /* 1.04-1.05x */
    };
    for (size_t i = 0; i < sizeof xc / sizeof xc[0]; i++) {
        static const int ms[] = {17, 24, 32, 40, 64};
        for (int j = 0; j < 5; j++)
            ASSERT_MSG(nat_xp_takes(ms[j], xc[i].k, xc[i].n, xc[i].gu) == xc[i].xp, "%s M=%d: XP %d, measured %d",
                       xc[i].what, ms[j], nat_xp_takes(ms[j], xc[i].k, xc[i].n, xc[i].gu), xc[i].xp);
        ASSERT_MSG(!nat_xp_takes(65, xc[i].k, xc[i].n, xc[i].gu) && !nat_xp_takes(128, xc[i].k, xc[i].n, xc[i].gu),
                   "%s: XP above M = 64", xc[i].what);
    }
    /* the edge: K N = 56 Mi of gate|up in, below out */
    ASSERT(nat_xp_takes(64, 4096, 14336, 1) && !nat_xp_takes(64, 4096, 14336 - 16, 1) && !nat_xp_takes(0, 8192, 57344, 1));
}
