/* test_w4a16_repack.c — the host repack of AWQ weights into the W4A16
 * kernels' device layout (kernels/cuda/w4a16_repack.c), on the CPU, against
 * the layout's definition written out nibble by nibble (kernels/cuda/w4a16.cu
 * header comment): plain and gate|up matrices with padded tiles, half
 * tiles, group 64 and 128, a bias, on 1 and 3 threads. The GPU tests check
 * the kernels on the repacked weights against the CPU reference. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "tests/harness/test.h"

#include "engine/awq_pack.h"
#include "engine/ckpt.h"
#include "kernels/cuda/w4a16_repack.h"

/* Physical row rho of tile nt -> checkpoint column, or -1 for padding. */
static int ref_col(const struct w4a16_dims *d, int nt, int rho) {
    if (d->gate_up) {
        const int inter = d->n / 2, j = nt * 8 + (rho & 7);
        if (j >= inter) return -1;
        return rho < 8 ? j : inter + j;
    }
    const int n = nt * 16 + rho;
    return n < d->n ? n : -1;
}

static unsigned ref_nib(const uint32_t *packed, int row, int n8, int n) {
    return (packed[(size_t)row * n8 + n / 8] >> (4 * awq_order[n % 8])) & 15u;
}

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

/* One shape: random AWQ tensors, the repack on `threads`, every output
 * element against the definition. */
static void check_shape(int K, int N, int G, int gate_up, int bias, int threads) {
    struct w4a16_dims d;
    ASSERT_EQ_INT(w4a16_dims_of(K, N, G, gate_up, &d), 0);
    const int n8 = N / 8, KG = K / G;
    uint64_t seed = (uint64_t)K * 131 + N * 7 + G + gate_up;
    uint32_t *q = malloc((size_t)K * n8 * 4), *z = malloc((size_t)KG * n8 * 4);
    uint16_t *s = malloc((size_t)KG * N * 2), *b = bias ? malloc((size_t)N * 2) : NULL;
    for (size_t i = 0; i < (size_t)K * n8; i++) q[i] = lcg(&seed);
    for (size_t i = 0; i < (size_t)KG * n8; i++) z[i] = lcg(&seed);
    for (size_t i = 0; i < (size_t)KG * N; i++) s[i] = (uint16_t)lcg(&seed);
    for (int i = 0; bias && i < N; i++) b[i] = (uint16_t)lcg(&seed);
    struct awq_linear l = {K, N, G, q, z, s, b};

    const size_t qn = w4a16_repack_qw_words(&d), sn = w4a16_repack_sz_count(&d);
    ASSERT_EQ_INT(qn, (size_t)d.n16a * d.kc * 128);
    ASSERT_EQ_INT(sn, (size_t)KG * d.n16a * 8);
    uint32_t *hq = malloc(qn * 4), *hs = malloc(sn * 4);
    uint8_t *hz = malloc(sn);
    uint16_t *hb = malloc((size_t)d.n16a * 16 * 2);
    /* poison: every element must be written */
    memset(hq, 0xa5, qn * 4);
    memset(hs, 0xa5, sn * 4);
    memset(hz, 0xa5, sn);
    memset(hb, 0xa5, (size_t)d.n16a * 16 * 2);
    ASSERT_EQ_INT(w4a16_repack(&l, &d, hq, hs, hz, bias ? hb : NULL, threads), 0);

    long bad = 0;
    for (int nt = 0; nt < d.n16a; nt++)
        for (int kc = 0; kc < d.kc; kc++) {
            const uint32_t *dst = hq + (((size_t)(nt / 8) * d.kc + kc) * 8 + nt % 8) * 128;
            for (int lane = 0; lane < 32; lane++) {
                const int r = lane >> 2, c = lane & 3;
                for (int t = 0; t < 4; t++) {
                    uint32_t want = 0;
                    for (int j = 0; j < 4; j++)
                        for (int hi = 0; hi < 2; hi++) {
                            const int n = ref_col(&d, nt, r + 8 * hi);
                            if (n < 0) continue;
                            want |= ref_nib(q, kc * 64 + 16 * c + 4 * t + j, n8, n) << (4 * ((j >> 1) * 2 + hi + (j & 1) * 4));
                        }
                    bad += dst[lane * 4 + t] != want;
                }
            }
        }
    ASSERT_MSG(bad == 0, "K=%d N=%d G=%d gate_up=%d threads=%d: %ld qweight words differ", K, N, G, gate_up,
               threads, bad);
    for (int g = 0; g < KG; g++)
        for (int nt = 0; nt < d.n16a; nt++)
            for (int r = 0; r < 8; r++) {
                const int nlo = ref_col(&d, nt, r), nhi = ref_col(&d, nt, r + 8);
                const uint32_t ws = (nlo >= 0 ? s[(size_t)g * N + nlo] : 0u) |
                                    (uint32_t)(nhi >= 0 ? s[(size_t)g * N + nhi] : 0u) << 16;
                const uint8_t wz = (uint8_t)((nlo >= 0 ? ref_nib(z, g, n8, nlo) : 0u) |
                                             (nhi >= 0 ? ref_nib(z, g, n8, nhi) : 0u) << 4);
                const size_t i = ((size_t)g * d.n16a + nt) * 8 + r;
                bad += (hs[i] != ws) + (hz[i] != wz);
            }
    ASSERT_MSG(bad == 0, "K=%d N=%d gate_up=%d: %ld scale / zero entries differ", K, N, gate_up, bad);
    for (int p = 0; bias && p < d.n16a * 16; p++) {
        const int n = ref_col(&d, p / 16, p % 16);
        bad += hb[p] != (n >= 0 ? b[n] : 0);
    }
    ASSERT_MSG(bad == 0, "K=%d N=%d gate_up=%d: %ld bias entries differ", K, N, gate_up, bad);
    free(q), free(z), free(s), free(b), free(hq), free(hs), free(hz), free(hb);
}

TEST(w4a16_repack, matches_the_layout_definition) {
    static const struct { int k, n, g, gate_up, bias; } cs[] = {
        {128, 8, 128, 0, 1},      /* one half tile, 7.5 tiles of padding */
        {256, 40, 128, 0, 0},     /* N % 16 == 8: the last tile half padding */
        {192, 136, 64, 0, 1},     /* group 64, K not a multiple of 128 */
        {128, 48, 128, 1, 1},     /* gate|up, intermediate 24: 3 tiles + padding */
        {256, 272, 128, 1, 0},    /* gate|up, 17 tiles -> 24 */
        {1024, 1000, 128, 0, 0},  /* 63 tiles -> 64, 16 K chunks */
        {512, 2048, 128, 1, 1},   /* gate|up, whole blocks of 8 tiles */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int threads = 1; threads <= 3; threads += 2)
            check_shape(cs[i].k, cs[i].n, cs[i].g, cs[i].gate_up, cs[i].bias, threads);
}

TEST(w4a16_repack, rejects_shapes_the_layout_cannot_hold) {
    struct w4a16_dims d;
    ASSERT_EQ_INT(w4a16_dims_of(96, 64, 32, 0, &d), -EINVAL);  /* K % 64 */
    ASSERT_EQ_INT(w4a16_dims_of(256, 64, 96, 0, &d), -EINVAL); /* group % 64 */
    ASSERT_EQ_INT(w4a16_dims_of(192, 64, 128, 0, &d), -EINVAL); /* K % group */
    ASSERT_EQ_INT(w4a16_dims_of(128, 12, 128, 0, &d), -EINVAL); /* N % 8 */
    ASSERT_EQ_INT(w4a16_dims_of(128, 24, 128, 1, &d), -EINVAL); /* gate|up: N / 2 % 8 */
    ASSERT_EQ_INT(w4a16_dims_of(0, 64, 128, 0, &d), -EINVAL);
    ASSERT_EQ_INT(w4a16_dims_of(128, 24, 128, 0, &d), 0);
    ASSERT(d.n16 == 2 && d.n16a == 8 && d.kc == 2 && d.kg == 1);
    ASSERT_EQ_INT(w4a16_dims_of(5120, 51200, 128, 1, &d), 0); /* Qwen3-32B gate|up */
    ASSERT(d.n16 == 3200 && d.n16a == 3200 && d.kc == 80 && d.kg == 40);
}
