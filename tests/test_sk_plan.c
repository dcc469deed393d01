/* test_sk_plan.c — the W4A16 skinny kernel's split rule and shared memory
 * layout (kernels/cuda/sk_plan.h), on the CPU: the M = 17..32 rule written
 * out for the 110 points measured on an H200 (session 35, back to back, the
 * 28 shapes of `awqd bench kernels --set all` where the dispatch runs the
 * skinny kernel at M = 17, 20, 24, 28, 32), and its invariants over many
 * shapes. */
#include "tests/harness/test.h"

#include "kernels/cuda/sk_plan.h"

#define SMS 132
#define SMEM_SM (228 * 1024)
#define BPS 2 /* the MT = 4 kernel's occupancy query on the H200 */

static int nb_of(int n) { return ((n + 15) / 16 + SK_WARPS - 1) / SK_WARPS; }

/* K, N, M -> the rule's split, the 48 KB rule's split; measured µs of each (best of two runs) */
static const struct { int k, n, m, ks, ks48; double us, us48; const char *what; } pts[] = {
        {25600, 5120, 17, 19, 19, 51.4, 51.4, "32b.down"},
        {25600, 5120, 20, 16, 22, 49.9, 54.8, "32b.down"},
        {25600, 5120, 24, 25, 25, 56.7, 56.7, "32b.down"},
        {12800, 5120, 17, 8, 10, 28.5, 32.2, "32b.down.tp2"},
        {12800, 5120, 20, 8, 11, 29.7, 31.5, "32b.down.tp2"},
        {12800, 5120, 24, 13, 13, 29.4, 29.4, "32b.down.tp2"},
        {12800, 5120, 28, 12, 16, 31.7, 33.5, "32b.down.tp2"},
        {12800, 5120, 32, 13, 17, 31.0, 36.1, "32b.down.tp2"},
        {6400, 5120, 17, 7, 7, 20.6, 20.7, "32b.down.tp4"},
        {6400, 5120, 20, 7, 7, 21.3, 21.3, "32b.down.tp4"},
        {6400, 5120, 24, 7, 7, 21.1, 20.9, "32b.down.tp4"},
        {6400, 5120, 28, 8, 8, 20.1, 20.1, "32b.down.tp4"},
        {6400, 5120, 32, 9, 9, 19.9, 19.9, "32b.down.tp4"},
        {5120, 51200, 17, 3, 4, 86.6, 89.4, "32b.gate_up"},
        {5120, 51200, 20, 3, 5, 91.7, 95.2, "32b.gate_up"},
        {5120, 51200, 24, 4, 5, 96.5, 98.2, "32b.gate_up"},
        {5120, 51200, 28, 5, 7, 105.0, 114.2, "32b.gate_up"},
        {5120, 51200, 32, 5, 7, 107.5, 114.1, "32b.gate_up"},
        {5120, 25600, 17, 3, 4, 45.3, 49.0, "32b.gate_up.tp2"},
        {5120, 25600, 20, 3, 5, 48.0, 50.0, "32b.gate_up.tp2"},
        {5120, 25600, 24, 5, 5, 50.0, 50.0, "32b.gate_up.tp2"},
        {5120, 25600, 28, 5, 7, 52.5, 57.9, "32b.gate_up.tp2"},
        {5120, 25600, 32, 5, 7, 54.5, 57.4, "32b.gate_up.tp2"},
        {5120, 12800, 17, 5, 5, 26.1, 26.1, "32b.gate_up.tp4"},
        {5120, 12800, 20, 5, 5, 27.7, 27.7, "32b.gate_up.tp4"},
        {5120, 12800, 24, 5, 5, 27.5, 27.5, "32b.gate_up.tp4"},
        {5120, 12800, 28, 5, 7, 28.6, 33.4, "32b.gate_up.tp4"},
        {5120, 12800, 32, 5, 7, 28.7, 32.8, "32b.gate_up.tp4"},
        {8192, 5120, 17, 8, 8, 21.0, 21.0, "32b.o"},
        {8192, 5120, 20, 8, 8, 22.1, 22.0, "32b.o"},
        {8192, 5120, 24, 8, 8, 21.9, 21.8, "32b.o"},
        {8192, 5120, 28, 8, 10, 23.1, 25.1, "32b.o"},
        {8192, 5120, 32, 8, 11, 23.0, 23.9, "32b.o"},
        {4096, 5120, 28, 5, 5, 13.8, 13.8, "32b.o.tp2"},
        {4096, 5120, 32, 6, 6, 13.0, 13.0, "32b.o.tp2"},
        {2048, 5120, 28, 3, 3, 10.1, 10.1, "32b.o.tp4"},
        {2048, 5120, 32, 3, 3, 10.2, 10.2, "32b.o.tp4"},
        {5120, 10240, 17, 5, 5, 25.8, 25.8, "32b.qkv"},
        {5120, 10240, 20, 5, 5, 27.5, 27.5, "32b.qkv"},
        {5120, 10240, 24, 5, 5, 27.1, 27.1, "32b.qkv"},
        {5120, 10240, 28, 5, 7, 28.2, 28.8, "32b.qkv"},
        {5120, 10240, 32, 5, 7, 28.4, 28.6, "32b.qkv"},
        {5120, 5120, 17, 5, 5, 14.2, 14.2, "32b.qkv.tp2"},
        {5120, 5120, 20, 5, 5, 14.9, 14.9, "32b.qkv.tp2"},
        {5120, 5120, 24, 5, 5, 14.9, 14.9, "32b.qkv.tp2"},
        {5120, 5120, 28, 5, 7, 15.6, 19.4, "32b.qkv.tp2"},
        {5120, 5120, 32, 5, 7, 15.6, 18.9, "32b.qkv.tp2"},
        {5120, 2560, 20, 5, 5, 10.2, 10.2, "32b.qkv.tp4"},
        {5120, 2560, 24, 5, 5, 10.0, 10.1, "32b.qkv.tp4"},
        {5120, 2560, 28, 5, 7, 10.6, 12.8, "32b.qkv.tp4"},
        {5120, 2560, 32, 5, 7, 10.5, 12.9, "32b.qkv.tp4"},
        {28672, 8192, 17, 15, 21, 81.5, 82.6, "70b.down"},
        {28672, 8192, 20, 18, 24, 82.1, 85.9, "70b.down"},
        {28672, 8192, 24, 22, 28, 89.0, 91.9, "70b.down"},
        {14336, 8192, 17, 8, 11, 39.4, 45.5, "70b.down.tp2"},
        {14336, 8192, 20, 8, 12, 41.3, 45.4, "70b.down.tp2"},
        {14336, 8192, 24, 14, 14, 47.4, 47.4, "70b.down.tp2"},
        {7168, 8192, 17, 7, 7, 26.9, 26.9, "70b.down.tp4"},
        {7168, 8192, 20, 7, 7, 28.5, 28.5, "70b.down.tp4"},
        {7168, 8192, 24, 7, 7, 28.3, 28.3, "70b.down.tp4"},
        {7168, 8192, 28, 7, 9, 29.6, 30.6, "70b.down.tp4"},
        {7168, 8192, 32, 7, 10, 29.6, 29.8, "70b.down.tp4"},
        {8192, 57344, 17, 5, 6, 139.1, 148.8, "70b.gate_up"},
        {8192, 57344, 20, 6, 7, 161.7, 166.0, "70b.gate_up"},
        {8192, 57344, 24, 7, 8, 169.9, 172.0, "70b.gate_up"},
        {8192, 57344, 28, 8, 10, 183.8, 192.0, "70b.gate_up"},
        {8192, 57344, 32, 8, 11, 186.8, 200.4, "70b.gate_up"},
        {8192, 28672, 17, 5, 6, 75.0, 78.3, "70b.gate_up.tp2"},
        {8192, 28672, 20, 7, 7, 78.8, 78.8, "70b.gate_up.tp2"},
        {8192, 28672, 24, 7, 8, 84.4, 87.3, "70b.gate_up.tp2"},
        {8192, 28672, 28, 8, 10, 92.5, 97.2, "70b.gate_up.tp2"},
        {8192, 28672, 32, 8, 11, 94.4, 101.9, "70b.gate_up.tp2"},
        {8192, 14336, 17, 4, 6, 43.0, 45.7, "70b.gate_up.tp4"},
        {8192, 14336, 20, 7, 7, 43.2, 43.2, "70b.gate_up.tp4"},
        {8192, 14336, 24, 7, 8, 43.7, 45.8, "70b.gate_up.tp4"},
        {8192, 14336, 28, 8, 10, 48.7, 52.1, "70b.gate_up.tp4"},
        {8192, 14336, 32, 8, 11, 49.4, 53.2, "70b.gate_up.tp4"},
        {8192, 8192, 17, 8, 8, 26.6, 26.7, "70b.o"},
        {8192, 8192, 20, 8, 8, 28.2, 28.3, "70b.o"},
        {8192, 8192, 24, 8, 8, 28.0, 28.0, "70b.o"},
        {8192, 8192, 28, 8, 10, 29.1, 31.6, "70b.o"},
        {8192, 8192, 32, 8, 11, 29.2, 34.0, "70b.o"},
        {4096, 8192, 28, 4, 5, 15.7, 19.7, "70b.o.tp2"},
        {4096, 8192, 32, 4, 6, 15.6, 18.7, "70b.o.tp2"},
        {2048, 8192, 28, 2, 3, 10.5, 12.1, "70b.o.tp4"},
        {2048, 8192, 32, 2, 3, 12.2, 12.1, "70b.o.tp4"},
        {8192, 10240, 17, 6, 6, 32.0, 31.9, "70b.qkv"},
        {8192, 10240, 20, 6, 7, 33.3, 36.3, "70b.qkv"},
        {8192, 10240, 24, 8, 8, 34.1, 34.1, "70b.qkv"},
        {8192, 10240, 28, 8, 10, 35.4, 42.1, "70b.qkv"},
        {8192, 10240, 32, 8, 11, 35.7, 39.8, "70b.qkv"},
        {8192, 5120, 17, 8, 8, 21.0, 21.2, "70b.qkv.tp2"},
        {8192, 5120, 20, 8, 8, 22.0, 22.2, "70b.qkv.tp2"},
        {8192, 5120, 24, 8, 8, 21.9, 22.1, "70b.qkv.tp2"},
        {8192, 5120, 28, 8, 10, 23.0, 25.4, "70b.qkv.tp2"},
        {8192, 5120, 32, 8, 11, 23.1, 23.9, "70b.qkv.tp2"},
        {8192, 2560, 17, 8, 8, 14.5, 14.4, "70b.qkv.tp4"},
        {8192, 2560, 20, 8, 8, 15.2, 15.1, "70b.qkv.tp4"},
        {8192, 2560, 24, 8, 8, 15.1, 15.0, "70b.qkv.tp4"},
        {8192, 2560, 28, 10, 10, 14.5, 14.5, "70b.qkv.tp4"},
        {8192, 2560, 32, 11, 11, 14.2, 14.2, "70b.qkv.tp4"},
        {12288, 4096, 17, 8, 9, 19.1, 25.8, "down"},
        {12288, 4096, 20, 8, 11, 20.1, 24.8, "down"},
        {12288, 4096, 24, 8, 12, 20.1, 23.3, "down"},
        {12288, 4096, 28, 11, 15, 25.9, 26.6, "down"},
        {12288, 4096, 32, 12, 16, 24.4, 25.5, "down"},
        {4096, 4096, 28, 4, 5, 10.6, 13.3, "o"},
        {4096, 4096, 32, 4, 6, 10.5, 12.6, "o"},
        {4096, 6144, 28, 5, 5, 13.8, 13.8, "qkv"},
        {4096, 6144, 32, 4, 6, 15.1, 18.0, "qkv"},
};

TEST(sk_plan, mid_rule_on_measured_points) {
    double logsum = 0;
    for (int i = 0; i < (int)(sizeof pts / sizeof pts[0]); i++) {
        const int kc = pts[i].k / 64, nb = nb_of(pts[i].n);
        const int ks0 = sk_split_rule(pts[i].m, kc, nb, SMS, BPS);
        const int ks = sk_split_mid(pts[i].m, kc, nb, 128, ks0, SMS, SMEM_SM);
        ASSERT_MSG(ks == pts[i].ks, "%s (K %d, N %d) M=%d: split %d, want %d", pts[i].what, pts[i].k, pts[i].n,
                   pts[i].m, ks, pts[i].ks);
        /* the 48 KB rule as the dispatch ran it before (AWQD_W4A16_SK_MID=0) */
        const int old = sk_split_limited(kc, ks0, sk_cps_limit(pts[i].m, SK_X_BYTES_MAX));
        ASSERT_MSG(old == pts[i].ks48, "%s M=%d: 48 KB split %d, want %d", pts[i].what, pts[i].m, old, pts[i].ks48);
        /* measured: never more than 1% slower than the 48 KB rule */
        ASSERT_MSG(pts[i].us <= pts[i].us48 * 1.01, "%s M=%d: %.1f vs %.1f us", pts[i].what, pts[i].m, pts[i].us,
                   pts[i].us48);
        logsum += __builtin_log(pts[i].us / pts[i].us48);
    }
    /* 0.948x the 48 KB rule's time, geometric mean */
    ASSERT(logsum / (sizeof pts / sizeof pts[0]) < __builtin_log(0.95));
}

TEST(sk_plan, invariants) {
    for (int k = 1024; k <= 32768; k += 1024)
        for (int n16 = 8; n16 <= 4096; n16 = n16 * 2 + 8)
            for (int m = SK_MID_MIN_M; m <= 32; m++)
                for (int smem_sm = 0; smem_sm <= SMEM_SM; smem_sm += SMEM_SM / 2) {
                    const int kc = k / 64, nb = (n16 + SK_WARPS - 1) / SK_WARPS;
                    const int ks0 = sk_split_rule(m, kc, nb, SMS, BPS);
                    const int ks = sk_split_mid_w(m, kc, nb, 128, ks0, SMS, smem_sm, 2);
                    ASSERT(ks >= 1 && ks <= kc);
                    const int cps = (kc + ks - 1) / ks;
                    /* as the launch runs it: within the slice limit and normalized */
                    ASSERT(cps <= sk_cps_limit(m, sk_x_limit(m)));
                    ASSERT(sk_split_norm(kc, ks, sk_cps_limit(m, sk_x_limit(m))) == ks);
                    ASSERT(sk_layout(m, cps, 128, SK_STAGES).total <= 200 * 1024);
                    /* between the 96 KB slice's split (from the one-wave split where it is
                     * fewer) and the 48 KB slice's, or the one-wave split itself (M > 16) */
                    const int s48 = sk_split_limited(kc, ks0, sk_cps_limit(m, SK_X_BYTES_MAX));
                    const int ks1 = 2 * SMS / nb, lo = ks1 >= 1 && ks1 < ks0 ? ks1 : ks0;
                    const int s96 = sk_split_limited(kc, lo, sk_cps_limit(m, SK_X_BYTES_MAX_MID));
                    const int s1 = ks1 >= 1 ? sk_split_limited(kc, ks1, sk_cps_limit(m, SK_X_BYTES_MAX_MID)) : 0;
                    ASSERT((ks <= s48 && ks >= s96) || (m > 16 && ks == s1));
                    if (test_failed()) return;
                }
    /* the general rule: ~16 chunks a warp, 8 where the grid is large, two waves above M = 8 */
    ASSERT_EQ_INT(sk_split_rule(17, 192, 32, SMS, BPS), 8);
    ASSERT_EQ_INT(sk_split_rule(4, 64, 32, SMS, BPS), 4);
    ASSERT_EQ_INT(sk_split_rule(20, 128, 448, SMS, BPS), 1);
    ASSERT_EQ_INT(sk_x_limit(8), SK_X_BYTES_MAX);
    ASSERT_EQ_INT(sk_x_limit(9), SK_X_BYTES_MAX_MID);
    ASSERT_EQ_INT(sk_x_limit(17), SK_X_BYTES_MAX_MID);
    ASSERT_EQ_INT(sk_x_limit(33), SK_X_BYTES_MAX);
    ASSERT_EQ_INT(sk_x_limit_from(16, 17), SK_X_BYTES_MAX);
}

/* The rule at M = 16 (session 48, SK_MID_MIN_M 9): the measured points
 * where it moved the split (H200, back to back, us), and one it kept */
TEST(sk_plan, mid_rule_at_m16) {
    static const struct { int k, n, ks, ks48; double us, us48; const char *what; } p16[] = {
        {25600, 5120, 13, 17, 34.72, 38.00, "32b.down"},
        {28672, 8192, 0, 0, 58.83, 61.15, "70b.down"},
        {14336, 8192, 0, 0, 30.72, 33.26, "70b.down.tp2"},
        {12288, 4096, 8, 8, 14.57, 14.55, "down"},
    };
    for (int i = 0; i < (int)(sizeof p16 / sizeof p16[0]); i++) {
        const int kc = p16[i].k / 64, nb = nb_of(p16[i].n);
        const int ks0 = sk_split_rule(16, kc, nb, SMS, BPS);
        const int ks = sk_split_mid(16, kc, nb, 128, ks0, SMS, SMEM_SM);
        const int old = sk_split_limited(kc, ks0, sk_cps_limit(16, SK_X_BYTES_MAX));
        if (p16[i].ks) {
            ASSERT_MSG(ks == p16[i].ks && old == p16[i].ks48, "%s M=16: split %d (48 KB %d), want %d (%d)",
                       p16[i].what, ks, old, p16[i].ks, p16[i].ks48);
        } else {
            ASSERT_MSG(ks < old, "%s M=16: split %d, the 48 KB rule %d", p16[i].what, ks, old);
        }
        ASSERT(p16[i].us <= p16[i].us48 * 1.01);
    }
    /* ... and with the one-wave candidate at M <= 16 (sk_split_mid_w's wave1, the
     * dispatch's default): measured back to back (session 48, us, without -> with) */
    static const struct { int k, n, m, ks, ks_w; double us, us_w; const char *what; } pw[] = {
        {8192, 5120, 16, 8, 6, 15.64, 14.11, "32b.o"},
        {12800, 5120, 16, 9, 6, 21.56, 18.92, "32b.down.tp2"},
        {7168, 8192, 16, 7, 4, 20.15, 15.84, "70b.down.tp4"},
        {8192, 8192, 12, 8, 4, 20.18, 17.19, "70b.o"},
        {25600, 5120, 16, 13, 13, 0, 0, "32b.down"}, /* one wave would need 96 KB slices one per SM */
        {8192, 5120, 17, 8, 8, 0, 0, "32b.o"},       /* M >= 17: no such candidate */
    };
    for (int i = 0; i < (int)(sizeof pw / sizeof pw[0]); i++) {
        const int kc = pw[i].k / 64, nb = nb_of(pw[i].n);
        const int ks0 = sk_split_rule(pw[i].m, kc, nb, SMS, BPS);
        const int ks = sk_split_mid(pw[i].m, kc, nb, 128, ks0, SMS, SMEM_SM);
        const int ksw = sk_split_mid_w(pw[i].m, kc, nb, 128, ks0, SMS, SMEM_SM, 1);
        ASSERT_MSG(ks == pw[i].ks && ksw == pw[i].ks_w, "%s M=%d: split %d / %d with one wave, want %d / %d",
                   pw[i].what, pw[i].m, ks, ksw, pw[i].ks, pw[i].ks_w);
        ASSERT(pw[i].us_w <= pw[i].us);
    }
}

/* The one-wave candidate at M = 17-32 (wave1 = 2, session 49, fewer or
 * more splits than the rule's): the skinny kernel's split forced at M = 20 /
 * 24 / 32 on the 28 shapes of `bench kernels --set all` (H200, back to
 * back, docs/PERFORMANCE.md "Session 49" item 6). Of the 84 points (27
 * distinct K x N: Qwen3-32B o and Llama-3-70B tp = 2 q|k|v are both 8192 x
 * 5120) it changes exactly these, the others keep their split (us: the old
 * pick, the new one as a forced split in the same call; 0: not measured). */
TEST(sk_plan, one_wave_at_m17_32) {
    static const struct { int k, n, m, ks_old, ks_new; double us_old, us_new; const char *what; } chg[] = {
        {6400, 5120, 20, 7, 6, 21.3, 16.0, "32b.down.tp4"},
        {8192, 5120, 20, 8, 6, 22.1, 18.6, "32b.o (and 70b.qkv.tp2: 22.3 -> 18.7)"},
        {4096, 5120, 20, 4, 6, 14.5, 12.6, "32b.o.tp2"},
        {2048, 5120, 20, 2, 6, 9.3, 9.4, "32b.o.tp4"},
        {5120, 10240, 20, 5, 3, 27.6, 20.4, "32b.qkv"},
        {5120, 5120, 20, 5, 6, 14.9, 14.2, "32b.qkv.tp2"},
        {7168, 8192, 20, 7, 4, 28.5, 21.7, "70b.down.tp4"},
        {8192, 2560, 20, 8, 13, 15.2, 0, "70b.qkv.tp4 (12 splits: 13.8)"},
        {4096, 6144, 20, 4, 5, 14.6, 13.2, "qkv"},
        {6400, 5120, 24, 7, 6, 21.2, 15.9, "32b.down.tp4"},
        {8192, 5120, 24, 8, 6, 21.9, 18.6, "32b.o (and 70b.qkv.tp2: 22.1 -> 18.8)"},
        {4096, 5120, 24, 4, 6, 14.4, 12.6, "32b.o.tp2"},
        {2048, 5120, 24, 2, 6, 10.5, 9.4, "32b.o.tp4"},
        {5120, 5120, 24, 5, 6, 14.8, 14.2, "32b.qkv.tp2"},
        {8192, 2560, 24, 8, 13, 15.1, 0, "70b.qkv.tp4 (12 splits: 13.7)"},
        {4096, 6144, 24, 4, 5, 14.5, 13.1, "qkv"},
        {6400, 5120, 32, 9, 6, 19.9, 16.7, "32b.down.tp4"},
        {5120, 5120, 32, 5, 6, 15.6, 14.9, "32b.qkv.tp2"},
        {8192, 2560, 32, 11, 13, 14.4, 0, "70b.qkv.tp4 (12 splits: 14.1)"},
        {4096, 6144, 32, 4, 5, 15.1, 13.7, "qkv"},
    };
    static const struct { int k, n; } shapes[] = {
        {4096, 6144}, {4096, 4096}, {4096, 24576}, {12288, 4096},     /* Qwen3-8B */
        {5120, 10240}, {8192, 5120}, {5120, 51200}, {25600, 5120},    /* Qwen3-32B */
        {5120, 5120}, {4096, 5120}, {5120, 25600}, {12800, 5120},     /* tp = 2 */
        {5120, 2560}, {2048, 5120}, {5120, 12800}, {6400, 5120},      /* tp = 4 */
        {8192, 10240}, {8192, 8192}, {8192, 57344}, {28672, 8192},    /* Llama-3-70B */
        {4096, 8192}, {8192, 28672}, {14336, 8192},                   /* tp = 2 (q|k|v: Qwen3-32B o's K, N) */
        {8192, 2560}, {2048, 8192}, {8192, 14336}, {7168, 8192},      /* tp = 4 */
    };
    static const int ms[3] = {20, 24, 32};
    int changed = 0, measured = 0;
    double logsum = 0;
    for (int i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++)
        for (int j = 0; j < 3; j++) {
            const int m = ms[j], kc = shapes[i].k / 64, nb = nb_of(shapes[i].n);
            const int ks0 = sk_split_rule(m, kc, nb, SMS, BPS);
            const int before = sk_split_mid_w(m, kc, nb, 128, ks0, SMS, SMEM_SM, 1);
            const int after = sk_split_mid_w(m, kc, nb, 128, ks0, SMS, SMEM_SM, 2);
            int want = before;
            for (int c = 0; c < (int)(sizeof chg / sizeof chg[0]); c++)
                if (chg[c].k == shapes[i].k && chg[c].n == shapes[i].n && chg[c].m == m) {
                    ASSERT_MSG(before == chg[c].ks_old, "%s M=%d: split %d before, want %d", chg[c].what, m, before,
                               chg[c].ks_old);
                    if (chg[c].us_new > 0) { /* measured: at worst 2% slower */
                        ASSERT(chg[c].us_new <= chg[c].us_old * 1.02);
                        logsum += __builtin_log(chg[c].us_new / chg[c].us_old);
                        measured++;
                    }
                    want = chg[c].ks_new;
                    changed++;
                }
            ASSERT_MSG(after == want, "K %d N %d M=%d: split %d, want %d (before %d)", shapes[i].k, shapes[i].n, m,
                       after, want, before);
        }
    ASSERT_EQ_INT(changed, 20);
    ASSERT_EQ_INT(measured, 17);
    ASSERT(logsum / measured < __builtin_log(0.9)); /* 0.86x, geometric mean */
    /* M <= 16 is wave1 = 1's (session 48): only fewer splits */
    for (int nb = 8; nb <= 512; nb *= 2) {
        const int ks0 = sk_split_rule(16, 128, nb, SMS, BPS);
        ASSERT_EQ_INT(sk_split_mid_w(16, 128, nb, 128, ks0, SMS, SMEM_SM, 2),
                      sk_split_mid_w(16, 128, nb, 128, ks0, SMS, SMEM_SM, 1));
    }
}
