/* test_w4a16.c — the fused W4A16 kernels (kernels/cuda/w4a16.h) against a CPU
 * reference, on the real layer shapes (Qwen3-8B / 32B, Llama-3-70B, tp = 1, 2,
 * 4, 8) and awkward ones, for M in the list.
 *
 * Reference: y_ref[m][n] = sum_k x[m][k] * (q - z) * s, accumulated in double
 * from the same fp16 x (a local dequantizer, independent of the kernels'
 * repacking; AWQ order map from AWQ_FORMAT.md).
 *
 * Error bound (stated, not tuned): over the checked rows,
 *     max |y - y_ref| <= 2e-3 * max |y_ref|      (plain and bias)
 * The inputs are exact in both; the kernels accumulate in fp32 (error ~K *
 * 2^-24, negligible), the GEMM path rounds each dequantized weight to fp16
 * (relative 2^-11 per weight, random signs: <= 2^-11 of the output scale), and
 * y is rounded to fp16 (2^-11 relative). 2^-11 + 2^-11 ~ 1e-3, doubled for
 * margin. For silu(g) * u: |d(silu(g) u)| <= 1.1 |u| |dg| + |g| |du|, so
 *     max |y - y_ref| <= 5e-3 * max|g_ref| * max|u_ref|.
 * Every output element must be written (y is poisoned with NaN first), and a
 * second identical call must be bitwise equal (deterministic split-K).
 *
 * Large shapes check a sample of rows (all rows when M <= 8; else 0, 1, a
 * random one, M/2, M-1) against the reference; all rows are checked for NaN. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "kernels/cuda/dc_plan.h"
#include "kernels/cuda/w4a16.h"
#include "tests/gpu/w4a16_ref.h"
#include "tests/harness/test.h"

/* ---- small helpers (local; the test must not depend on the code it checks) */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return ref_unit(rnd); } /* [0,1) */

static void layer_make(struct ref_layer *h, int K, int N, int G, int with_bias) {
    ASSERT_MSG(ref_layer_make(h, K, N, G, with_bias, rnd) == 0, "out of memory (K=%d N=%d)", K, N);
}

/* out[N] (double) = x_row[K] @ W */
static void ref_row(const float *w, const uint16_t *xrow, int K, int N, double *out) {
    for (int n = 0; n < N; n++) out[n] = 0;
    for (int k = 0; k < K; k++) {
        double xk = f_from_h(xrow[k]);
        if (xk == 0) continue;
        const float *wr = w + (size_t)k * N;
        for (int n = 0; n < N; n++) out[n] += xk * wr[n];
    }
}

#define CK(call) do { cudaError_t e_ = (call); ASSERT_MSG(e_ == cudaSuccess, "%s: %s", #call, \
                                                          cudaGetErrorString(e_)); } while (0)

static int have_gpu(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* When nonzero, check_case gives the kernel exactly this much workspace. */
static size_t g_ws_exact;

/* Runs one (weight, M, epilogue, kernel, split) case and checks it. */
static void check_case(const struct ref_layer *h, const float *wref, struct w4a16_weight *dw,
                       int gate_up, int M, int epi, enum w4a16_kernel kern, int ksplit,
                       const char *what) {
    int K = h->l.k, N = h->l.n, oc = gate_up ? N / 2 : N;
    size_t nx = (size_t)M * K, ny = (size_t)M * oc;
    uint16_t *hx = malloc(nx * 2), *hy = malloc(ny * 2), *hy2 = malloc(ny * 2);
    double *ref = malloc(sizeof(double) * N);
    ASSERT(hx && hy && hy2 && ref);
    for (size_t i = 0; i < nx; i++) hx[i] = h_from_f(2.f * rnd_unit() - 1.f);
    uint16_t *dx = NULL, *dy = NULL;
    void *ws = NULL;
    size_t wsb = w4a16_workspace_bytes(dw, M);
    if (kern != W4A16_KERNEL_AUTO) { /* room for any forced kernel / split */
        size_t np = (size_t)(N + 127) / 128 * 128, mp = (size_t)(M + 127) / 128 * 128;
        size_t need = 16 * np * mp * 4 + np * K * 2 + mp * np * 2 + 4096;
        if (need > wsb) wsb = need;
    }
    if (g_ws_exact) wsb = g_ws_exact;
    CK(cudaMalloc((void **)&dx, nx * 2));
    CK(cudaMalloc((void **)&dy, ny * 2));
    if (wsb) CK(cudaMalloc(&ws, wsb));
    CK(cudaMemcpy(dx, hx, nx * 2, cudaMemcpyHostToDevice));
    char err[256] = "";
    uint16_t *outs[2] = {hy, hy2};
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(dy, 0xff, ny * 2)); /* NaN poison */
        int rc = w4a16_linear_ex(dw, dx, M, dy, epi, kern, ksplit, ws, wsb, 0, err, sizeof err);
        ASSERT_MSG(rc == 0, "%s M=%d: w4a16_linear rc=%d: %s", what, M, rc, err);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(outs[rep], dy, ny * 2, cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < ny; i++) {
        ASSERT_MSG(!isnan(f_from_h(hy[i])), "%s M=%d: y[%zu][%zu] not written (NaN)", what, M,
                   i / oc, i % oc);
    }
    ASSERT_MSG(memcmp(hy, hy2, ny * 2) == 0, "%s M=%d: two identical calls differ", what, M);

    int rows[8], nr = 0;
    if (M <= 8) {
        for (int m = 0; m < M; m++) rows[nr++] = m;
    } else {
        rows[nr++] = 0;
        rows[nr++] = 1;
        rows[nr++] = (int)(rnd() % (uint32_t)M);
        rows[nr++] = M / 2;
        rows[nr++] = M - 1;
    }
    double maxref = 0, maxerr = 0, gmax = 0, umax = 0;
    int worst_m = 0, worst_n = 0;
    double worst_ref = 0;
    double *yr = malloc(sizeof(double) * (size_t)nr * oc);
    ASSERT(yr);
    for (int ri = 0; ri < nr; ri++) {
        int m = rows[ri];
        ref_row(wref, hx + (size_t)m * K, K, N, ref);
        if (epi & W4A16_EPI_BIAS)
            for (int n = 0; n < N; n++) ref[n] += f_from_h(h->bias[n]);
        for (int j = 0; j < oc; j++) {
            double v;
            if (gate_up) {
                double g = ref[j], u = ref[oc + j];
                if (fabs(g) > gmax) gmax = fabs(g);
                if (fabs(u) > umax) umax = fabs(u);
                v = g / (1 + exp(-g)) * u;
            } else {
                v = ref[j];
            }
            yr[(size_t)ri * oc + j] = v;
            if (fabs(v) > maxref) maxref = fabs(v);
        }
    }
    for (int ri = 0; ri < nr; ri++)
        for (int j = 0; j < oc; j++) {
            double e = fabs(f_from_h(hy[(size_t)rows[ri] * oc + j]) - yr[(size_t)ri * oc + j]);
            if (test_err_above(maxerr, e)) {
                maxerr = e;
                worst_m = rows[ri];
                worst_n = j;
                worst_ref = yr[(size_t)ri * oc + j];
            }
        }
    double bound = gate_up ? 5e-3 * gmax * umax : 2e-3 * maxref;
    if (getenv("AWQD_TEST_VERBOSE"))
        fprintf(stderr, "  %-28s M=%-5d kern=%d split=%d  max|err| %.3g  bound %.3g (rel %.2g)\n",
                what, M, (int)kern, ksplit, maxerr, bound, maxerr / (maxref > 0 ? maxref : 1));
    ASSERT_MSG(maxerr <= bound && maxref > 0,
               "%s M=%d kern=%d split=%d: max|y-ref| = %.4g at [%d][%d] (y %.5g ref %.5g) > bound %.4g "
               "(max|ref| %.4g)", what, M, (int)kern, ksplit, maxerr, worst_m, worst_n,
               f_from_h(hy[(size_t)worst_m * oc + worst_n]),
               worst_ref, bound, maxref);
    free(yr);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    free(hx);
    free(hy);
    free(hy2);
    free(ref);
}

/* One shape: upload, then every M of ms[] through the automatic dispatch. */
static void check_shape(const char *what, int K, int N, int G, int gate_up, int with_bias,
                        const int *ms, int nms) {
    struct ref_layer h;
    layer_make(&h, K, N, G, with_bias);
    struct w4a16_weight *dw = NULL;
    char err[256];
    int rc = w4a16_upload(&h.l, gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &dw, err,
                          sizeof err);
    ASSERT_MSG(rc == 0, "%s: upload: %s", what, err);
    float *wref = ref_dequant(&h.l);
    ASSERT(wref);
    int epi = (gate_up ? W4A16_EPI_SILU_MUL : 0) | (with_bias ? W4A16_EPI_BIAS : 0);
    for (int i = 0; i < nms; i++) {
        check_case(&h, wref, dw, gate_up, ms[i], epi, W4A16_KERNEL_AUTO, 0, what);
        if (test_failed()) break;
    }
    free(wref);
    w4a16_free(dw);
    ref_layer_free(&h);
}

static const int M_ALL[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 64, 100, 128, 257, 1000, 2048, 4096};
static const int M_SOME[] = {1, 3, 16, 17, 64, 257, 1000};
static const int M_FEW[] = {1, 16, 100, 257};
#define NM(a) (int)(sizeof(a) / sizeof(a[0]))

/* A model's four matrices at tp = 1, 2, 4, 8. ms_tp1 for tp = 1, ms for the shards. */
static void check_model(const char *name, int hidden, int inter, int nq, int nkv, int hd,
                        const int *ms1, int nms1, const int *ms, int nms, int max_tp) {
    for (int tp = 1; tp <= max_tp; tp *= 2) {
        int kvh = nkv / tp > 0 ? nkv / tp : 1;
        int qkv_n = (nq / tp + 2 * kvh) * hd;
        char what[96];
        const int *m = tp == 1 ? ms1 : ms;
        int nm = tp == 1 ? nms1 : nms;
        snprintf(what, sizeof what, "%s tp%d qkv", name, tp);
        check_shape(what, hidden, qkv_n, 128, 0, 0, m, nm);
        ASSERT_OK_SO_FAR();
        snprintf(what, sizeof what, "%s tp%d o", name, tp);
        check_shape(what, nq * hd / tp, hidden, 128, 0, 0, m, nm);
        ASSERT_OK_SO_FAR();
        snprintf(what, sizeof what, "%s tp%d gate_up", name, tp);
        check_shape(what, hidden, 2 * inter / tp, 128, 1, 0, m, nm);
        ASSERT_OK_SO_FAR();
        snprintf(what, sizeof what, "%s tp%d down", name, tp);
        check_shape(what, inter / tp, hidden, 128, 0, 0, m, nm);
        ASSERT_OK_SO_FAR();
    }
}

TEST(w4a16, qwen3_8b_all_m) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    check_model("qwen3-8b", 4096, 12288, 32, 8, 128, M_ALL, NM(M_ALL), M_SOME, NM(M_SOME), 8);
}

TEST(w4a16, qwen3_32b) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    check_model("qwen3-32b", 5120, 25600, 64, 8, 128, M_FEW, NM(M_FEW), M_FEW, NM(M_FEW), 8);
}

TEST(w4a16, llama3_70b) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const int m1[] = {1, 17, 257};
    check_model("llama3-70b", 8192, 28672, 64, 8, 128, m1, NM(m1), M_FEW, NM(M_FEW), 8);
}

TEST(w4a16, awkward_shapes) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    /* N not a multiple of 16/64/128, tiny K, group 64, tiny N */
    check_shape("K128 N8", 128, 8, 128, 0, 0, M_ALL, NM(M_ALL));
    ASSERT_OK_SO_FAR();
    check_shape("K128 N200", 128, 200, 128, 0, 0, M_ALL, NM(M_ALL));
    ASSERT_OK_SO_FAR();
    check_shape("K192 G64 N72", 192, 72, 64, 0, 0, M_ALL, NM(M_ALL));
    ASSERT_OK_SO_FAR();
    check_shape("K384 N1000 bias", 384, 1000, 128, 0, 1, M_ALL, NM(M_ALL));
    ASSERT_OK_SO_FAR();
    check_shape("gate_up K256 inter24", 256, 48, 128, 1, 0, M_ALL, NM(M_ALL));
    ASSERT_OK_SO_FAR();
    check_shape("gate_up K640 inter136 bias", 640, 272, 128, 1, 1, M_SOME, NM(M_SOME));
    ASSERT_OK_SO_FAR();
    check_shape("K4096 N4104", 4096, 4104, 128, 0, 1, M_SOME, NM(M_SOME));
}

/* Every kernel and several splits on one shape, whatever the dispatch picks. */
TEST(w4a16, forced_kernels_and_splits) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    struct ref_layer h;
    layer_make(&h, 1024, 1040, 128, 1);
    struct w4a16_weight *dw = NULL, *dg = NULL;
    char err[256];
    ASSERT_MSG(w4a16_upload(&h.l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(w4a16_upload(&h.l, W4A16_LAYOUT_GATE_UP, &dg, err, sizeof err) == 0, "%s", err);
    float *wref = ref_dequant(&h.l);
    static const int ms[] = {1, 2, 3, 4, 5, 9, 16, 24, 32, 33, 64, 65, 130};
    static const int splits[] = {1, 2, 3, 7, 16};
    static const int kerns[] = {W4A16_KERNEL_SKINNY, W4A16_KERNEL_TC64, W4A16_KERNEL_TC128,
                                W4A16_KERNEL_CUBLAS, W4A16_KERNEL_DECODE};
    for (int ki = 0; ki < NM(kerns); ki++)
        for (int i = 0; i < NM(ms); i++) {
            const int kern = kerns[ki];
            if (kern == W4A16_KERNEL_SKINNY && ms[i] > 64) continue;
            if (kern == W4A16_KERNEL_DECODE && ms[i] > 24) continue;
            for (int s = 0; s < NM(splits); s++) {
                if ((kern == W4A16_KERNEL_CUBLAS || kern == W4A16_KERNEL_DECODE) && s > 0)
                    break; /* no split */
                check_case(&h, wref, dw, 0, ms[i], W4A16_EPI_BIAS, (enum w4a16_kernel)kern,
                           splits[s], "forced plain+bias");
                ASSERT_OK_SO_FAR();
                check_case(&h, wref, dg, 1, ms[i], W4A16_EPI_SILU_MUL, (enum w4a16_kernel)kern,
                           splits[s], "forced gate_up");
                ASSERT_OK_SO_FAR();
            }
        }
    free(wref);
    w4a16_free(dw);
    w4a16_free(dg);
    ref_layer_free(&h);
}

/* ZM (w4a16_decode_zm, on by default): the zero point through the sums of x,
 * made by the decode kernel itself (one more mma a k16 step, A = ones), on the
 * plain and persistent grids and the K split through global memory (Qwen3-32B
 * o, K = 8192), at one, two and four tiles a block (TB 1 only at K >= 12288:
 * Qwen3-8B down), with and without x group by group (M >= 6), K = 640 / 5120
 * with 0-1 / 5 groups a warp, a bias, and K = 128 (seven warps idle); M = 1-8
 * (9 and 16: the ordinary path). ZM1 (w4a16_decode_zm1, on by default): at M
 * = 1 the sums by one mma a group (dc_plan.h dc_zm_form) — at one tile where a
 * warp's range is one or two whole ring turns (Qwen3-8B o, K = 4096; the
 * Llama-3-70B tp = 4 q|k|v shard, K = 8192; 288 tiles at K = 4096 with a bias:
 * the persistent grid, each block two columns), and at two or four tiles on
 * the plain grid at K = 4096 (Qwen3-8B q|k|v), the persistent grid (gate|up)
 * and the K split (K = 8192); K = 640, 128, 5120 and 12288 at one tile keep
 * the other forms. Each shape three
 * times — ZM and ZM1 on, ZM on and ZM1 off, ZM off (the HSUB2 path) — against
 * the CPU reference with the bound of every decode case; the ZM and ZM1
 * kernels and the K split must have run, and neither where it was off. */
TEST(w4a16, decode_zero_point_by_mma) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {4096, 4096, 0, 0}, {4096, 6144, 0, 0}, {12288, 4096, 0, 0}, {640, 272, 0, 1},
        {5120, 1280, 0, 0}, {4096, 24576, 1, 0}, {8192, 5120, 0, 0}, {2560, 5120, 0, 0},
        {128, 8, 0, 0}, {8192, 2560, 0, 0}, {4096, 4608, 0, 1},
    };
    static const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
    unsigned long zon[3], z1on[3], gon = 0; /* launches in each pass */
    const int old = w4a16_decode_zm(-1), old1 = w4a16_decode_zm1(-1);
    for (int pass = 0; pass < 3; pass++) {
        w4a16_decode_zm(pass < 2 ? 8 : 0);
        w4a16_decode_zm1(pass == 0);
        const unsigned long z0 = w4a16_zm_launches(), z10 = w4a16_zm1_launches(), g0 = w4a16_decode_ksplit_launches();
        for (int si = 0; si < NM(shp) && !test_failed(); si++) {
            char what[64];
            snprintf(what, sizeof what, "zm=%d zm1=%d K%d N%d%s", pass < 2, pass == 0, shp[si].k, shp[si].n,
                     shp[si].gate_up ? " gate_up" : "");
            check_shape(what, shp[si].k, shp[si].n, 128, shp[si].gate_up, shp[si].bias, ms, NM(ms));
        }
        zon[pass] = w4a16_zm_launches() - z0;
        z1on[pass] = w4a16_zm1_launches() - z10;
        if (pass == 0) gon = w4a16_decode_ksplit_launches() - g0;
    }
    w4a16_decode_zm(old);
    w4a16_decode_zm1(old1);
    ASSERT_MSG(zon[0] >= 32 && zon[1] >= 32, "ZM launched %lu / %lu times", zon[0], zon[1]);
    ASSERT_MSG(z1on[0] >= 3, "ZM1 launched %lu times", z1on[0]);
    ASSERT_MSG(z1on[1] == 0 && z1on[2] == 0, "ZM1 launched %lu / %lu times where off", z1on[1], z1on[2]);
    ASSERT_MSG(zon[2] == 0, "ZM launched %lu times with ZM off", zon[2]);
    ASSERT_MSG(gon > 0, "no K split ran with ZM on");
}

/* The decode kernel (M <= 16, group 128) on the shapes that exercise its
 * decomposition (docs/KERNELS.md; tiles per block as chosen for 132 SMs):
 * one group (K = 128: seven warps idle), group 64 (not for it: the skinny
 * kernel runs), 4 KB of weights per warp (exactly the ring), 2, 3, 5, 12 and
 * 24 groups per warp (last turns of 2, 3 and 1 groups), 1, 2 and 4 tiles per
 * block (N = 1040 is 65 tiles, gate|up N = 272 is 17: a last block past the
 * last tile), bias, gate|up, and x too large for shared memory from M = 8
 * with K = 24576 (skinny again); M = 1 to 8 (one m8 block) and 9 to 16
 * (two). With the kernel on (the default), the dispatch must pick it for
 * M <= 2, and for M <= 4 up to K = 8192 (two blocks per SM there), wherever
 * the group is 128. */
TEST(w4a16, decode_kernel_shapes) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, g, gate_up, bias; } shp[] = {
        {128, 8, 128, 0, 0},     {192, 72, 64, 0, 1},      {4096, 6144, 128, 0, 0},
        {5120, 1280, 128, 0, 0}, {12288, 4096, 128, 0, 0}, {640, 272, 128, 1, 1},
        {2048, 33792, 128, 0, 0}, {24576, 256, 128, 0, 0}, {4096, 24576, 128, 1, 0},
        {2048, 1024, 128, 0, 0}, {3072, 1040, 128, 0, 1}, {3072, 12288, 128, 0, 0},
    };
    static const int ms[] = {1, 2, 3, 5, 8, 9, 13, 16, 17, 20, 24};
    for (int si = 0; si < NM(shp); si++) {
        struct ref_layer h;
        layer_make(&h, shp[si].k, shp[si].n, shp[si].g, shp[si].bias);
        struct w4a16_weight *dw = NULL;
        char err[256], what[64];
        ASSERT_MSG(w4a16_upload(&h.l, shp[si].gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN,
                                &dw, err, sizeof err) == 0, "%s", err);
        float *wref = ref_dequant(&h.l);
        ASSERT(wref);
        int epi = (shp[si].gate_up ? W4A16_EPI_SILU_MUL : 0) | (shp[si].bias ? W4A16_EPI_BIAS : 0);
        snprintf(what, sizeof what, "decode K%d N%d%s", shp[si].k, shp[si].n,
                 shp[si].gate_up ? " gate_up" : "");
        for (int i = 0; i < NM(ms); i++) {
            if (shp[si].k * (size_t)shp[si].n > (size_t)64 << 20 && ms[i] != 1 && ms[i] != 8 &&
                ms[i] != 16 && ms[i] != 24)
                continue; /* big shapes: the CPU reference is slow */
            enum w4a16_kernel k;
            int ks;
            w4a16_choice(dw, ms[i], &k, &ks);
            if (w4a16_decode_kernel(-1) && shp[si].g == 128 && !getenv("AWQD_W4A16_DC_MAX_M") &&
                (ms[i] <= 2 || (ms[i] <= 4 && shp[si].k <= 8192)))
                ASSERT_MSG(k == W4A16_KERNEL_DECODE && ks == 1, "%s M=%d: dispatch picked kernel %d",
                           what, ms[i], (int)k);
            check_case(&h, wref, dw, shp[si].gate_up, ms[i], epi, W4A16_KERNEL_DECODE, 0, what);
            ASSERT_OK_SO_FAR();
        }
        free(wref);
        w4a16_free(dw);
        ref_layer_free(&h);
    }
}

/* The current device's compute capability major, 0 where it cannot be asked. */
static int cc_major_here(void) {
    int dev = 0, cc = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess
               ? cc
               : 0;
}

/* What the decode kernel's plan knows of this GPU (kernels/cuda/dc_plan.h). */
static int dc_gpu_here(struct dc_gpu *g) {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&g->smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&g->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess;
}

/* One layer of the decode-kernel tests: the host reference, its upload, the
 * dequantized reference weights, the epilogue flags and output columns. */
struct dc_layer {
    struct ref_layer h;
    struct w4a16_weight *dw;
    float *wref;
    int k, n, gate_up, epi, oc;
    char what[64];
};
static void dc_layer_make(struct dc_layer *L, int k, int n, int gate_up, int bias, const char *tag) {
    char err[256];
    memset(L, 0, sizeof *L);
    layer_make(&L->h, k, n, 128, bias);
    ASSERT_MSG(w4a16_upload(&L->h.l, gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &L->dw, err, sizeof err) == 0,
               "%s", err);
    L->wref = ref_dequant(&L->h.l);
    ASSERT(L->wref);
    L->k = k, L->n = n, L->gate_up = gate_up;
    L->epi = (gate_up ? W4A16_EPI_SILU_MUL : 0) | (bias ? W4A16_EPI_BIAS : 0);
    L->oc = gate_up ? n / 2 : n;
    snprintf(L->what, sizeof L->what, "%s K%d N%d%s", tag, k, n, gate_up ? " gate_up" : "");
}
static void dc_layer_free(struct dc_layer *L) {
    free(L->wref);
    w4a16_free(L->dw);
    ref_layer_free(&L->h);
}

/* One call of the decode kernel on x (M x K) into the host buffer y. */
static void decode_run(struct w4a16_weight *dw, const uint16_t *hx, int M, int K, int oc, int epi,
                       uint16_t *hy, const char *what) {
    uint16_t *dx = NULL, *dy = NULL;
    char err[256] = "";
    CK(cudaMalloc((void **)&dx, (size_t)M * K * 2));
    CK(cudaMalloc((void **)&dy, (size_t)M * oc * 2));
    CK(cudaMemcpy(dx, hx, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, (size_t)M * oc * 2));
    const int rc = w4a16_linear_ex(dw, dx, M, dy, epi, W4A16_KERNEL_DECODE, 0, NULL, 0, 0, err, sizeof err);
    ASSERT_MSG(rc == 0, "%s M=%d: w4a16_linear rc=%d: %s", what, M, rc, err);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy, dy, (size_t)M * oc * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
}

/* x random (M rows); the decode kernel as things stand (y1), then with
 * set(off) (y0), then set(on) again: y0 and y1 bitwise the same. */
static void dc_same_bits(const struct dc_layer *L, int M, int (*set)(int), int off, int on, const char *how) {
    uint16_t *hx = malloc((size_t)M * L->k * 2), *y1 = malloc((size_t)M * L->oc * 2), *y0 = malloc((size_t)M * L->oc * 2);
    ASSERT(hx && y1 && y0);
    for (size_t j = 0; j < (size_t)M * L->k; j++) hx[j] = h_from_f(2.f * rnd_unit() - 1.f);
    decode_run(L->dw, hx, M, L->k, L->oc, L->epi, y1, L->what);
    set(off);
    decode_run(L->dw, hx, M, L->k, L->oc, L->epi, y0, L->what);
    set(on);
    ASSERT_MSG(memcmp(y0, y1, (size_t)M * L->oc * 2) == 0, "%s M=%d: %s differ", L->what, M, how);
    free(hx), free(y1), free(y0);
}

/* The decode kernel's persistent grid (dc_ps_plan): it is launched exactly
 * where the rule says for this GPU, its results match the CPU reference on
 * every column (check_case) and, where the tiles per block stay those of
 * the plain grid, are bitwise the plain grid's (with one form of ZM's sums
 * on both). Shapes (H200 plans):
 * Qwen3-8B gate|up (TB = 2; at M = 8 TB 4 -> 2), a K = 8192 gate|up (M = 8:
 * TB 4 -> 1, one block per SM), tile counts that leave blocks with waves -
 * 1 columns (1425 tiles at TB = 2 with a bias; 2003 tiles, the last one 8
 * columns wide; 2105 at K = 1024, one ring turn per warp), TB 4 -> 2 at K =
 * 2048, and at K = 5120 (M = 8: 275 blocks of TB = 4, two waves 52% full)
 * 138 blocks of two columns (DC_PS_TWO_WAVES; the last block one). */
TEST(w4a16, decode_persistent_grid) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    if (getenv("AWQD_W4A16_DC_TB") || getenv("AWQD_W4A16_DC_WAVES") || getenv("AWQD_W4A16_DC_PLAN") ||
        getenv("AWQD_W4A16_DC_LATE") || getenv("AWQD_W4A16_DC_TB1") || getenv("AWQD_W4A16_DC_TB4") ||
        getenv("AWQD_W4A16_DC_KS"))
        TEST_SKIP("a decode-plan knob is set");
    const int cl0 = w4a16_decode_cluster(-1);
    w4a16_decode_cluster(1); /* one block a column: the plans below */
    struct dc_gpu g;
    ASSERT(dc_gpu_here(&g));
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {4096, 24576, 1, 0}, {8192, 14336, 1, 0}, {4096, 22800, 0, 1},
        {2048, 32040, 0, 0}, {1024, 33680, 0, 1}, {2048, 38000, 0, 0}, {5120, 17600, 0, 0},
        {5120, 25600, 1, 1}, /* M = 9-16: TB = 4 (dc_ps_tb4; TB = 2 has no whole turns at K = 5120) */
    };
    static const int ms[] = {1, 3, 8, 9, 16, 20}; /* 9, 16: MT = 2 (TB = 1 / 4 where dc_ps_tb1 / 4), 20: MT = 3 */
    const int ps0 = w4a16_decode_persistent(1);
    int applied = 0, same_tb = 0;
    for (int si = 0; si < NM(shp); si++) {
        struct dc_layer L;
        dc_layer_make(&L, shp[si].k, shp[si].n, shp[si].gate_up, shp[si].bias, "persistent");
        ASSERT_OK_SO_FAR();
        struct w4a16_weight *dw = L.dw;
        const int K = L.k;
        const char *what = L.what;
        for (int i = 0; i < NM(ms); i++) {
            const int M = ms[i];
            struct dc_plan pl;
            int want = 0, tb0 = 0;
            int gs = 0; /* the K split takes it instead (dc_gs_pick: K = 8192 at M = 8, session 56) */
            if (dc_plan_make(M, K, (shp[si].n + 15) / 16, 128, &g, 0, DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4, &pl)) {
                struct dc_plan q;
                tb0 = pl.tb;
                gs = dc_gs_pick(&pl, &g, &q);
                want = gs ? 0 : dc_ps_plan(&pl, &g, 0);
            }
            int dtb = 0, dcols = 0, dgrid = 0; /* the launch: grid < columns is the persistent grid */
            const int has = w4a16_decode_describe(dw, M, &dtb, &dcols, &dgrid);
            const int grid = has && dgrid < dcols ? dgrid : 0;
            ASSERT_MSG(grid == want, "%s M=%d: grid %d, the rule says %d", what, M, grid, want);
            if (gs) { /* 2 x 4 tiles past one wave: against the reference too */
                check_case(&L.h, L.wref, dw, L.gate_up, M, L.epi, W4A16_KERNEL_DECODE, 0, what);
                ASSERT_OK_SO_FAR();
            }
            if (!want) continue;
            ASSERT_MSG(dtb == pl.tb && dcols == pl.blocks, "%s M=%d: TB %d, %d columns; the rule says TB %d, %d", what,
                       M, dtb, dcols, pl.tb, pl.blocks);
            applied++;
            check_case(&L.h, L.wref, dw, L.gate_up, M, L.epi, W4A16_KERNEL_DECODE, 0, what);
            ASSERT_OK_SO_FAR();
            if (pl.tb != tb0) continue;
            same_tb++;
            w4a16_decode_persistent(0);
            ASSERT(w4a16_decode_describe(dw, M, &dtb, &dcols, &dgrid) && dgrid == dcols);
            w4a16_decode_persistent(1);
            /* ZM1's rule may give the grids different forms of the sums at M = 1
             * (dc_zm_form: form 2 on the persistent grid, form 1 on a plain range
             * of K > 4096), so the bits are compared with one form on both: ZM1
             * wherever ZM runs (2), then ZM1 off */
            const int z1 = w4a16_decode_zm1(-1);
            for (int zf = 0; zf < 2; zf++) {
                w4a16_decode_zm1(zf ? 0 : 2);
                dc_same_bits(&L, M, w4a16_decode_persistent, 0, 1,
                             zf ? "persistent and plain grids (ZM1 off)" : "persistent and plain grids (ZM1 = 2)");
                ASSERT_OK_SO_FAR();
            }
            w4a16_decode_zm1(z1);
        }
        dc_layer_free(&L);
    }
    w4a16_decode_persistent(ps0);
    w4a16_decode_cluster(cl0);
    /* on a GPU like the H100 / H200 (132 SMs) the rule applies to most points */
    ASSERT_MSG(g.sms > 200 || (applied >= 6 && same_tb >= 2), "persistent grid at %d points (%d with the plan's TB)",
               applied, same_tb);
}

/* The cluster K split (w4a16_decode_cluster(2), dc_plan_cluster): at M =
 * 9-24 two blocks a column, each with x of half of K, rank 0 adding the
 * other's sums, against the CPU reference: plain and persistent grids
 * (Qwen3-8B q|k|v, a K = 5120 gate|up of 1600 columns: TB = 4 at MT = 2,
 * the Qwen3-32B tp = 2 q|k|v shard), K = 8192 (MT = 3 only with the split)
 * and 2048 with a bias and a last block past the last tile (65 tiles), K =
 * 3072 (12 groups a block); where K / 128 is odd (640) or x of half of K
 * does not fit (12288 from M = 16) the plan has one block a column. */
TEST(w4a16, decode_cluster_split) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {4096, 6144, 0, 0}, {5120, 3200, 1, 0}, {5120, 5120, 0, 0}, {8192, 1280, 0, 1},
        {2048, 1040, 0, 1}, {3072, 12288, 0, 0}, {640, 272, 1, 1}, {12288, 1024, 0, 0},
    };
    static const int ms[] = {9, 13, 16, 17, 20, 24};
    const int cl0 = w4a16_decode_cluster(-1);
    int split = 0;
    for (int si = 0; si < NM(shp); si++) {
        struct dc_layer L;
        dc_layer_make(&L, shp[si].k, shp[si].n, shp[si].gate_up, shp[si].bias, "cluster split");
        ASSERT_OK_SO_FAR();
        for (int i = 0; i < NM(ms); i++) {
            const int M = ms[i];
            w4a16_decode_cluster(2);
            const int cl = w4a16_decode_blocks_per_column(L.dw, M);
            const int x_half = M * (L.k / 2 + 8) * 2 + ((M + 7) / 8) * 4096 <= 224 * 1024; /* at least x + red */
            if (L.k % 256 != 0 || !x_half) /* odd K / 128, or x of half of K too large */
                ASSERT_MSG(cl <= 1, "%s M=%d: %d blocks a column", L.what, M, cl);
            if (cl != 2) continue;
            split++;
            check_case(&L.h, L.wref, L.dw, L.gate_up, M, L.epi, W4A16_KERNEL_DECODE, 0, L.what);
            ASSERT_OK_SO_FAR();
        }
        w4a16_decode_cluster(1);
        dc_layer_free(&L);
    }
    w4a16_decode_cluster(cl0);
    const int cc = cc_major_here();
    ASSERT(cc > 0);
    ASSERT_MSG(cc < 9 || split >= 25, "the cluster split ran at %d points", split);
}

/* The K split through global memory at M <= 8 (w4a16_decode_ksplit,
 * dc_plan_gs): by the rule (dc_gs_pick: its blocks a column and tiles
 * exactly where the rule says, on this GPU) and forced to 2, 3 or 4
 * plain blocks a column of 2 or 4 tiles, 6 or 8 of 4 tiles (4, 6 and 8 also
 * past one wave), the last to arrive adding the
 * pieces in order, against the CPU reference (two calls alike: the arrival
 * counters reset): the Qwen3-32B down and o and their tp = 2 shards (K /
 * 128 = 200, 64, 100, 32), Qwen3-8B down, a gate|up (silu), 325 tiles with
 * a bias (a part-filled last column) at K = 3072 (24 groups: 8 or 12 a
 * block), the 2560-column Llama-3-70B and Qwen3-32B tp = 4 q|k|v shards, at
 * M = 1, 3, 6, 8; off, one block a column. */
TEST(w4a16, decode_ksplit) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {25600, 5120, 0, 0}, {8192, 5120, 0, 0}, {12800, 5120, 0, 0}, {4096, 5120, 0, 1},
        {12288, 4096, 0, 0}, {5120, 5120, 1, 0}, {3072, 5200, 0, 1},
        {8192, 2560, 0, 0}, /* the Llama-3-70B tp = 4 q|k|v shard: 6 x 4 from M = 4 (session 56) */
        {5120, 2560, 0, 0}, /* the Qwen3-32B tp = 4 q|k|v shard (no split by the rule; forced ones) */
    };
    static const int ms[] = {1, 3, 6, 8}, kss[] = {1, 22, 24, 32, 34, 44, 64, 84, 142, 144, 164, 184};
    const int k0 = w4a16_decode_ksplit(-1);
    struct dc_gpu g;
    ASSERT(dc_gpu_here(&g));
    int by_rule = 0;
    const unsigned long l0 = w4a16_decode_ksplit_launches();
    for (int si = 0; si < NM(shp); si++) {
        struct dc_layer L;
        dc_layer_make(&L, shp[si].k, shp[si].n, shp[si].gate_up, shp[si].bias, "ksplit");
        ASSERT_OK_SO_FAR();
        for (int i = 0; i < NM(ms); i++) {
            const int M = ms[i];
            struct dc_plan pl, q;
            memset(&q, 0, sizeof q);
            const int want = dc_plan_make(M, L.k, (shp[si].n + 15) / 16, 128, &g, 0,
                                          DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4, &pl) &&
                             dc_gs_pick(&pl, &g, &q);
            if (!w4a16_decode_applies(L.dw, M)) continue;
            int dtb = 0, dcols = 0, dgrid = 0;
            w4a16_decode_ksplit(0);
            ASSERT(w4a16_decode_describe(L.dw, M, &dtb, &dcols, &dgrid));
            ASSERT_MSG(dgrid <= dcols, "%s M=%d: split with it off", L.what, M);
            w4a16_decode_ksplit(1);
            ASSERT(w4a16_decode_describe(L.dw, M, &dtb, &dcols, &dgrid));
            const int ks = dgrid > dcols ? dgrid / dcols : 1;
            ASSERT_MSG(ks == (want ? q.cl : 1), "%s M=%d: %d blocks a column, the rule says %d", L.what, M, ks,
                       want ? q.cl : 1);
            by_rule += want;
            if (want)
                ASSERT_MSG(dtb == q.tb && dcols == q.blocks && dgrid == q.cl * q.blocks,
                           "%s M=%d: TB %d, %d columns on %d blocks", L.what, M, dtb, dcols, dgrid);
        }
        for (int j = 0; j < NM(kss); j++) {
            w4a16_decode_ksplit(kss[j]);
            for (int i = 0; i < NM(ms); i++) {
                char what[96];
                snprintf(what, sizeof what, "%s ks %d tb %d%s", L.what, kss[j] == 1 ? 0 : kss[j] % 100 / 10, kss[j] % 10,
                         kss[j] >= 100 ? " (any waves)" : "");
                check_case(&L.h, L.wref, L.dw, L.gate_up, ms[i], L.epi, W4A16_KERNEL_DECODE, 0, what);
                ASSERT_OK_SO_FAR();
            }
        }
        dc_layer_free(&L);
    }
    w4a16_decode_ksplit(k0);
    const unsigned long n = w4a16_decode_ksplit_launches() - l0;
    /* on a 132-SM GPU: the Qwen3-32B down, o and tp = 2 down, Qwen3-8B down at M = 6-8, the 2560-column
     * shard at M = 6-8 */
    ASSERT_MSG(g.sms != 132 || by_rule >= 10, "the rule took %d points", by_rule);
    ASSERT_MSG(cc_major_here() < 9 || n >= 40, "the K split ran %lu times", n);
}

/* The K split's reducer poll (w4a16_decode_ksplit_poll: the column's last
 * rank waits for the other ranks' sums in the device's poll buffer, where the
 * whole grid is resident) against the arrival counter (the last block to
 * arrive adds): bitwise the same on the shapes of decode_ksplit by the rule
 * and forced to 2 or 3 blocks a column of 2 or 4 tiles, 4 of 4, at M = 1-8;
 * twice at each point with new x each time, so that a poll buffer left
 * holding the last call's sums (not made idle again) would hand them to the
 * next call and differ; and the poll taken at the rule's points. */
static void gs_run(const struct dc_layer *L, const uint16_t *hx, int M, uint16_t *hy) {
    uint16_t *dx = NULL, *dy = NULL;
    void *ws = NULL;
    char err[256] = "";
    const size_t wsb = w4a16_workspace_bytes(L->dw, M);
    CK(cudaMalloc((void **)&dx, (size_t)M * L->k * 2));
    CK(cudaMalloc((void **)&dy, (size_t)M * L->oc * 2));
    if (wsb) CK(cudaMalloc(&ws, wsb));
    CK(cudaMemcpy(dx, hx, (size_t)M * L->k * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, (size_t)M * L->oc * 2));
    const int rc = w4a16_linear_ex(L->dw, dx, M, dy, L->epi, W4A16_KERNEL_DECODE, 0, ws, wsb, 0, err, sizeof err);
    ASSERT_MSG(rc == 0, "%s M=%d: w4a16_linear rc=%d: %s", L->what, M, rc, err);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy, dy, (size_t)M * L->oc * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(ws));
}
/* new random x; the kernel with the poll (y1), then with the counter (y0): bitwise alike */
static void gs_same_bits(const struct dc_layer *L, int M, const char *how) {
    uint16_t *hx = malloc((size_t)M * L->k * 2), *y1 = malloc((size_t)M * L->oc * 2), *y0 = malloc((size_t)M * L->oc * 2);
    ASSERT(hx && y1 && y0);
    for (size_t j = 0; j < (size_t)M * L->k; j++) hx[j] = h_from_f(2.f * rnd_unit() - 1.f);
    w4a16_decode_ksplit_poll(1);
    gs_run(L, hx, M, y1);
    w4a16_decode_ksplit_poll(0);
    gs_run(L, hx, M, y0);
    w4a16_decode_ksplit_poll(1);
    ASSERT_MSG(memcmp(y0, y1, (size_t)M * L->oc * 2) == 0, "%s M=%d: %s differ", L->what, M, how);
    free(hx), free(y1), free(y0);
}

TEST(w4a16, decode_ksplit_poll) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {25600, 5120, 0, 0}, {8192, 5120, 0, 0}, {12800, 5120, 0, 0}, {12288, 4096, 0, 0},
        {5120, 5120, 1, 0},  {3072, 5200, 0, 1}, {8192, 2560, 0, 0},
    };
    static const int ms[] = {1, 2, 3, 5, 8}, kss[] = {1, 22, 24, 32, 34, 44};
    const int k0 = w4a16_decode_ksplit(-1), p0 = w4a16_decode_ksplit_poll(1);
    const unsigned long n0 = w4a16_decode_ksplit_polls();
    unsigned long rule_polls = 0;
    for (int si = 0; si < NM(shp); si++) {
        struct dc_layer L;
        dc_layer_make(&L, shp[si].k, shp[si].n, shp[si].gate_up, shp[si].bias, "ksplit poll");
        ASSERT_OK_SO_FAR();
        for (int j = 0; j < NM(kss); j++) {
            w4a16_decode_ksplit(kss[j]);
            for (int i = 0; i < NM(ms); i++) {
                if (!w4a16_decode_applies(L.dw, ms[i])) continue;
                const unsigned long b = w4a16_decode_ksplit_polls();
                char how[96];
                snprintf(how, sizeof how, "ks %d: the poll's and the counter's results", kss[j]);
                gs_same_bits(&L, ms[i], how);
                gs_same_bits(&L, ms[i], how);
                ASSERT_OK_SO_FAR();
                if (kss[j] == 1) rule_polls += w4a16_decode_ksplit_polls() - b;
            }
        }
        dc_layer_free(&L);
    }
    w4a16_decode_ksplit(k0);
    w4a16_decode_ksplit_poll(p0);
    struct dc_gpu g;
    ASSERT(dc_gpu_here(&g));
    const unsigned long n = w4a16_decode_ksplit_polls() - n0;
    /* on a 132-SM GPU the rule splits Qwen3-32B o and down and the tp = 2 down at M = 1-2 on one wave */
    ASSERT_MSG(cc_major_here() < 9 || n >= 60, "the poll ran %lu times", n);
    ASSERT_MSG(g.sms != 132 || rule_polls >= 6, "the poll ran %lu times at the rule's points", rule_polls);
}

/* x staged group by group (w4a16_decode_x_groups: each of a warp's first
 * ring-turn groups its own cp.async group, waited for in the first column's
 * turns) changes no value: at M = 1-8 the kernel is run with it from M = 1
 * and with it off (min M 99), bitwise the same, on plain and persistent
 * grids and on warp ranges shorter than a ring turn (K = 640: 0-1 groups a
 * warp; K = 3072: 3), of one turn (4096), one turn and a group (5120) and
 * several (12288), with a bias and gate|up; the run with it on also against
 * the CPU reference. At M >= 9 it is always on (decode_kernel_shapes checks
 * those M against the reference). ZM off: the XP kernels at TB < 4 have no
 * ZM form, so with it on XP from M = 1 would change the zero point's
 * arithmetic where the two tiles' ZM would take it (decode_zero_point_by_mma
 * runs ZM with XP at M = 6-8). */
TEST(w4a16, decode_x_groups_bitwise) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {640, 272, 1, 1}, {3072, 1040, 0, 1}, {4096, 6144, 0, 0}, {5120, 1280, 0, 0},
        {12288, 4096, 0, 0}, {4096, 24576, 1, 0},
    };
    static const int ms[] = {1, 2, 6, 7, 8};
    const int xp0 = w4a16_decode_x_groups(0), zm0 = w4a16_decode_zm(-1);
    w4a16_decode_zm(0);
    for (int si = 0; si < NM(shp); si++) {
        struct dc_layer L;
        dc_layer_make(&L, shp[si].k, shp[si].n, shp[si].gate_up, shp[si].bias, "x groups");
        ASSERT_OK_SO_FAR();
        for (int i = 0; i < NM(ms); i++) {
            const int M = ms[i];
            if (!w4a16_decode_applies(L.dw, M)) continue;
            w4a16_decode_x_groups(1);
            if ((size_t)L.k * L.n <= (size_t)64 << 20 || M == 8) { /* the CPU reference is slow */
                check_case(&L.h, L.wref, L.dw, L.gate_up, M, L.epi, W4A16_KERNEL_DECODE, 0, L.what);
                ASSERT_OK_SO_FAR();
            }
            dc_same_bits(&L, M, w4a16_decode_x_groups, 99, 1, "x by groups and x at once");
            ASSERT_OK_SO_FAR();
        }
        dc_layer_free(&L);
    }
    w4a16_decode_x_groups(xp0);
    w4a16_decode_zm(zm0);
}

/* The automatic dispatch follows the decode kernel's rule
 * (kernels/cuda/dc_plan.h, sessions 21-23; its expectations on the measured
 * shapes are pinned by the CPU test dc_plan.dispatch_rule_on_measured_shapes):
 * w4a16_choice picks the decode kernel at M = 1..DC_DISPATCH_MAX_M exactly where
 * dc_dispatch_takes says so for this GPU's SMs and shared memory, on shapes
 * on both sides of the rule (on a 132-SM GPU with 228 KB per SM: Qwen3-32B
 * down leaves the decode kernel at M = 3, the tp = 2 down at M = 5, Qwen3-8B
 * down at M = 8; Qwen3-32B o stays to M = 8 on 80 widened blocks). Only the
 * choice is checked here:
 * decode_kernel_shapes runs the kernel itself at these M. */
TEST(w4a16, decode_dispatch_rule) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    if (!w4a16_decode_kernel(-1)) TEST_SKIP("decode kernel turned off (AWQD_W4A16_DECODE=0)");
    if (getenv("AWQD_W4A16_DC_MAX_M") || getenv("AWQD_W4A16_DC_TB") || getenv("AWQD_W4A16_DC_WAVES") ||
        getenv("AWQD_W4A16_DC_PLAN") || w4a16_decode_cluster(-1) != 0 || w4a16_decode_ksplit(-1) > 1)
        TEST_SKIP("a decode-plan knob is set");
    struct dc_gpu g;
    ASSERT(dc_gpu_here(&g));
    const int cc = cc_major_here();
    ASSERT(cc > 0);
    static const struct { int k, n, gate_up; } cs[] = {
        {4096, 6144, 0}, {4096, 24576, 1}, {12288, 4096, 0}, {8192, 5120, 0},
        {25600, 5120, 0}, {12800, 5120, 0}, {2048, 5120, 0}, {8192, 2560, 0},
    };
    int both = 0, neither = 0, split = 0; /* the rule must be seen to go both ways */
    for (int ci = 0; ci < NM(cs); ci++) {
        struct ref_layer h;
        layer_make(&h, cs[ci].k, cs[ci].n, 128, 0);
        struct w4a16_weight *dw = NULL;
        char err[256];
        ASSERT_MSG(w4a16_upload(&h.l, cs[ci].gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &dw, err,
                                sizeof err) == 0, "%s", err);
        for (int m = 1; m <= DC_DISPATCH_MAX_M; m++) {
            enum w4a16_kernel k;
            int ks;
            struct dc_plan pl;
            const int has = dc_plan_make(m, cs[ci].k, (cs[ci].n + 15) / 16, 128, &g, 0, DC_PLAN_HALVE, &pl);
            /* the cluster K split by its own rule (dc_cl_takes) where its plan fits, on sm_90+ */
            struct dc_plan pc;
            const int cl = cc >= 9 && dc_cl_takes(m, cs[ci].k, cs[ci].n) &&
                           dc_plan_cluster(m, cs[ci].k, (cs[ci].n + 15) / 16, 128, &g, 2, 0, DC_PLAN_HALVE, &pc);
            ASSERT_MSG((w4a16_decode_blocks_per_column(dw, m) == 2) == cl, "K %d N %d M=%d: the cluster split %s",
                       cs[ci].k, cs[ci].n, m, cl ? "not planned" : "planned");
            split += cl;
            /* and the K split through global memory at M <= 8 (dc_gs_pick_any: also where the
             * one-block plan is not taken or does not fit) */
            struct dc_plan pg;
            const int gs = w4a16_decode_ksplit(-1) == 1 && w4a16_decode_ksplit_dispatch(-1) &&
                           dc_gs_pick_any(m, cs[ci].k, (cs[ci].n + 15) / 16, 128, &g,
                                          DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4, &pg);
            const int want = cl || gs || dc_dispatch_takes(m, DC_DISPATCH_MAX_M, has ? &pl : NULL, &g);
            w4a16_choice(dw, m, &k, &ks);
            ASSERT_MSG((k == W4A16_KERNEL_DECODE) == want, "K %d N %d M=%d: kernel %d, the rule says %s", cs[ci].k,
                       cs[ci].n, m, (int)k, want ? "decode" : "not decode");
            both += want, neither += !want;
        }
        w4a16_free(dw);
        ref_layer_free(&h);
        ASSERT_OK_SO_FAR();
    }
    ASSERT_MSG(both > 0 && neither > 0, "decode at %d of %d points", both, both + neither);
    /* K = 8192: M = 12, 17-24 at N = 5120, M = 12-24 at N = 2560 */
    ASSERT_MSG(cc < 9 || split == 22, "the cluster split at %d points", split);
}

/* A workspace too small (or none) must still give the right answer. */
TEST(w4a16, no_workspace) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    struct ref_layer h;
    layer_make(&h, 2048, 512, 128, 0);
    struct w4a16_weight *dw = NULL;
    char err[256];
    ASSERT_MSG(w4a16_upload(&h.l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err) == 0, "%s", err);
    const int dc0 = w4a16_decode_kernel(0); /* the skinny kernel's split-K (decode needs no workspace) */
    ASSERT(w4a16_workspace_bytes(dw, 1) > 0); /* N = 512 splits K at M = 1 */
    size_t ny = 4 * 512;
    uint16_t *dx, *dy, *hx = malloc(4 * 2048 * 2), *ha = malloc(ny * 2), *hb = malloc(ny * 2);
    for (int i = 0; i < 4 * 2048; i++) hx[i] = h_from_f(rnd_unit() - 0.5f);
    CK(cudaMalloc((void **)&dx, 4 * 2048 * 2));
    CK(cudaMalloc((void **)&dy, ny * 2));
    CK(cudaMemcpy(dx, hx, 4 * 2048 * 2, cudaMemcpyHostToDevice));
    void *ws;
    size_t wsb = w4a16_workspace_bytes(dw, 4);
    CK(cudaMalloc(&ws, wsb));
    ASSERT(w4a16_linear(dw, dx, 4, dy, 0, ws, wsb, 0, err, sizeof err) == 0);
    CK(cudaMemcpy(ha, dy, ny * 2, cudaMemcpyDeviceToHost));
    ASSERT(w4a16_linear(dw, dx, 4, dy, 0, NULL, 0, 0, err, sizeof err) == 0);
    CK(cudaMemcpy(hb, dy, ny * 2, cudaMemcpyDeviceToHost));
    double md = 0, mr = 0;
    for (size_t i = 0; i < ny; i++) {
        double d = fabs(f_from_h(ha[i]) - f_from_h(hb[i]));
        if (d > md) md = d;
        if (fabs(f_from_h(ha[i])) > mr) mr = fabs(f_from_h(ha[i]));
    }
    ASSERT_MSG(md <= 2e-3 * mr, "split vs unsplit differ by %g (max %g)", md, mr);
    w4a16_decode_kernel(dc0);
    cudaFree(ws);
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(ha);
    free(hb);
    w4a16_free(dw);
    ref_layer_free(&h);
}

/* Dequantize + cuBLAS in column slabs (w4a16_cublas_slabs): workspaces of
 * one, three and three and a half 128-column slabs, so that the last slab is
 * partial; awkward N (a partial last tile and block), bias, gate|up. Every
 * output written (NaN poison), deterministic, within the reference bound.
 * Each case twice: with K-slabs allowed (plain layouts whose column slabs
 * are narrow take them: here 2048x1000 at 3 and 3.5 slabs' workspace, in
 * slabs of 768, 768 and 512 rows, and 12288x512 in 4 of 3072 or 2 of 6144)
 * and with column slabs only (w4a16_cublas_kslabs(0)); the 1024x4096 shapes
 * at 20 slabs' scratch: several wide column slabs (gate|up; plain with
 * column slabs only) and K-slabs of 512 rows (plain). */
static size_t al256(size_t b) { return (b + 255) / 256 * 256; }

TEST(w4a16, cublas_slabs) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    const int mode0 = w4a16_cublas_slabs(1), kmode0 = w4a16_cublas_kslabs(-1);
    const struct {
        int K, N, gate_up, bias;
    } shapes[] = {{2048, 1000, 0, 1}, {1024, 1552, 1, 0}, {1024, 1552, 1, 1}, {12288, 512, 0, 0},
                  {1024, 4096, 0, 1}, {1024, 4096, 1, 0}};
    const int ms[] = {257, 1000};
    const double slabs[] = {1, 3, 3.5, 20};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && !test_failed(); si++) {
        struct ref_layer h;
        layer_make(&h, shapes[si].K, shapes[si].N, 128, shapes[si].bias);
        struct w4a16_weight *dw = NULL;
        char err[256];
        int gu = shapes[si].gate_up;
        ASSERT_MSG(w4a16_upload(&h.l, gu ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &dw, err,
                                sizeof err) == 0, "%s", err);
        float *wref = ref_dequant(&h.l);
        ASSERT(wref);
        int epi = (gu ? W4A16_EPI_SILU_MUL : 0) | (shapes[si].bias ? W4A16_EPI_BIAS : 0);
        for (int km = 0; km < 2 && !test_failed(); km++)
        for (int mi = 0; mi < 2 && !test_failed(); mi++)
            for (int k = 0; k < 4 && !test_failed(); k++) {
                w4a16_cublas_kslabs(!km);
                int M = ms[mi];
                size_t cols = (size_t)(slabs[k] * 128);
                size_t one = al256((size_t)128 * h.l.k * 2) + (gu ? al256((size_t)M * 128 * 2) : 0);
                size_t want = al256(cols * h.l.k * 2) + (gu ? al256((size_t)M * cols * 2) : 0);
                g_ws_exact = want > one ? want : one;
                char what[96];
                snprintf(what, sizeof what, "slabs K=%d N=%d%s%s ws=%.1f slabs%s", h.l.k, h.l.n,
                         gu ? " gate_up" : "", shapes[si].bias ? " bias" : "", slabs[k],
                         km ? " (columns only)" : "");
                check_case(&h, wref, dw, gu, M, epi, W4A16_KERNEL_CUBLAS, 0, what);
                g_ws_exact = 0;
            }
        free(wref);
        w4a16_free(dw);
        ref_layer_free(&h);
    }
    w4a16_cublas_slabs(mode0);
    w4a16_cublas_kslabs(kmode0);
}

TEST(w4a16, rejects_bad_input) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    struct ref_layer h;
    struct w4a16_weight *dw = NULL;
    char err[256] = "";
    layer_make(&h, 6432, 64, 32, 0); /* K % 64 != 0, group 32 */
    ASSERT_EQ_INT(w4a16_upload(&h.l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err), -EINVAL);
    ASSERT_CONTAINS(err, "unsupported shape");
    ASSERT(dw == NULL);
    ref_layer_free(&h);
    layer_make(&h, 256, 64, 128, 0);
    ASSERT_EQ_INT(w4a16_upload(&h.l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err), 0);
    uint16_t *dx, *dy;
    CK(cudaMalloc((void **)&dx, 256 * 2));
    CK(cudaMalloc((void **)&dy, 64 * 2));
    ASSERT_EQ_INT(w4a16_linear(dw, dx, 1, dy, W4A16_EPI_SILU_MUL, NULL, 0, 0, err, sizeof err),
                  -EINVAL);
    ASSERT_CONTAINS(err, "silu_mul");
    ASSERT_EQ_INT(w4a16_linear(dw, dx, 1, dy, W4A16_EPI_BIAS, NULL, 0, 0, err, sizeof err), -EINVAL);
    ASSERT_CONTAINS(err, "without bias");
    ASSERT_EQ_INT(w4a16_linear(dw, dx + 1, 1, dy, 0, NULL, 0, 0, err, sizeof err), -EINVAL);
    ASSERT_EQ_INT(w4a16_linear_ex(dw, dx, 1, dy, 0, (enum w4a16_kernel)5, 0, NULL, 0, 0, err,
                                  sizeof err),
                  -EINVAL); /* the removed GEMV kernel */
    ASSERT_CONTAINS(err, "unknown kernel");
    cudaFree(dx);
    cudaFree(dy);
    w4a16_free(dw);
    ref_layer_free(&h);
}

/* Programmatic dependent launch: a chain of dependent calls (each layer's x is
 * the previous layer's y) must give bitwise the same result with PDL off, on,
 * and captured into a CUDA graph. A kernel that read x before its dependency
 * wait would read the NaN poison or a stale value. */
TEST(w4a16, pdl_chain_and_graph) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    /* 2048 -> 20480 (160 column blocks: the cluster split-K for M <= 8),
     * 20480 -> 2048 (long K: workspace split-K), gate|up 2048 -> 2048 + bias */
    enum { NL = 3, K = 2048, KW = 20480 };
    struct ref_layer h[NL];
    struct w4a16_weight *dw[NL];
    char err[256];
    const int gate_up[NL] = {0, 0, 1}, lk[NL] = {K, KW, K}, ln[NL] = {KW, K, 2 * K};
    for (int i = 0; i < NL; i++) {
        layer_make(&h[i], lk[i], ln[i], 128, i == 2);
        /* scales ~ 1/sqrt(K * E[(q-z)^2]): activations keep their magnitude */
        size_t ns = (size_t)(lk[i] / 128) * h[i].l.n;
        float s0 = 1.f / sqrtf((float)lk[i] * 42.5f);
        for (size_t j = 0; j < ns; j++) h[i].sc[j] = h_from_f(s0 * (0.6f + 0.8f * rnd_unit()));
        ASSERT_MSG(w4a16_upload(&h[i].l, gate_up[i] ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN,
                                &dw[i], err, sizeof err) == 0, "%s", err);
    }
    static const int ms[] = {1, 2, 3, 4, 8, 16, 64, 100};
    enum { MMAX = 100, STEPS = 6 }; /* ends with the gate|up layer: y [M, K] */
    size_t wsb = 0;
    for (int i = 0; i < NL; i++) {
        size_t b = w4a16_workspace_bytes(dw[i], MMAX);
        if (b > wsb) wsb = b;
    }
    uint16_t *buf[STEPS + 1], *hx = malloc((size_t)MMAX * K * 2);
    uint16_t *out[3];
    for (int r = 0; r < 3; r++) out[r] = malloc((size_t)MMAX * K * 2);
    ASSERT(hx && out[0] && out[1] && out[2]);
    for (int i = 0; i <= STEPS; i++) CK(cudaMalloc((void **)&buf[i], (size_t)MMAX * KW * 2));
    void *ws = NULL;
    if (wsb) CK(cudaMalloc(&ws, wsb));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int pdl0 = w4a16_pdl(-1);
    for (int mi = 0; mi < NM(ms); mi++) {
        int M = ms[mi];
        for (size_t i = 0; i < (size_t)M * K; i++) hx[i] = h_from_f(2.f * rnd_unit() - 1.f);
        for (int run = 0; run < 3; run++) { /* 0: PDL off, 1: on, 2: on, in a graph */
            w4a16_pdl(run > 0);
            CK(cudaMemcpy(buf[0], hx, (size_t)M * K * 2, cudaMemcpyHostToDevice));
            for (int i = 1; i <= STEPS; i++) CK(cudaMemset(buf[i], 0xff, (size_t)MMAX * KW * 2));
            CK(cudaDeviceSynchronize());
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            if (run == 2) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < STEPS; i++) {
                int l = i % NL;
                int epi = (gate_up[l] ? W4A16_EPI_SILU_MUL : 0) | (l == 2 ? W4A16_EPI_BIAS : 0);
                ASSERT(w4a16_k(dw[l]) == (i == 0 ? K : w4a16_out_cols(dw[(i + NL - 1) % NL])));
                int rc = w4a16_linear(dw[l], buf[i], M, buf[i + 1], epi, ws, wsb, st, err, sizeof err);
                ASSERT_MSG(rc == 0, "chain M=%d step %d: %s", M, i, err);
            }
            if (run == 2) {
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge, g, 0));
                CK(cudaGraphLaunch(ge, st));
            }
            CK(cudaStreamSynchronize(st));
            CK(cudaMemcpy(out[run], buf[STEPS], (size_t)M * K * 2, cudaMemcpyDeviceToHost));
            if (ge) cudaGraphExecDestroy(ge);
            if (g) cudaGraphDestroy(g);
        }
        double mx = 0;
        for (size_t i = 0; i < (size_t)M * K; i++) {
            float v = f_from_h(out[0][i]);
            ASSERT_MSG(isfinite(v), "chain M=%d: y[%zu] = %g", M, i, v);
            if (fabs(v) > mx) mx = fabs(v);
        }
        ASSERT_MSG(mx > 1e-3, "chain M=%d: output vanished (max %g)", M, mx);
        ASSERT_MSG(memcmp(out[0], out[1], (size_t)M * K * 2) == 0, "chain M=%d: PDL on != off", M);
        ASSERT_MSG(memcmp(out[0], out[2], (size_t)M * K * 2) == 0, "chain M=%d: graph != eager", M);
    }
    w4a16_pdl(pdl0);
    cudaStreamDestroy(st);
    for (int i = 0; i <= STEPS; i++) cudaFree(buf[i]);
    cudaFree(ws);
    free(hx);
    for (int r = 0; r < 3; r++) free(out[r]);
    for (int i = 0; i < NL; i++) {
        w4a16_free(dw[i]);
        ref_layer_free(&h[i]);
    }
}

/* The skinny kernel's split-K reduced inside a thread-block cluster (sm_90;
 * used for M <= 8 when the grid has more blocks than SMs: N = 20480 gives 160
 * column blocks) must be bitwise equal to the workspace + counter reduction
 * (same additions, same order), also when no workspace is passed at all (a
 * fallback to one split would round differently). The same for the
 * tensor-core GEMM (tc64, tc128) with one row block (M <= 64, 128), whose
 * cluster spreads the tile's pairs over its blocks (splits up to 8, partial
 * row blocks; with more row blocks the workspace reduces, and
 * forced_kernels_and_splits checks those against the reference). */
TEST(w4a16, cluster_reduce_matches_workspace) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    struct ref_layer h;
    layer_make(&h, 4096, 20480, 128, 1);
    struct w4a16_weight *dw = NULL;
    char err[256];
    ASSERT_MSG(w4a16_upload(&h.l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err) == 0, "%s", err);
    enum { MMAX = 128, K = 4096, N = 20480 };
    uint16_t *hx = malloc((size_t)MMAX * K * 2), *ha = malloc((size_t)MMAX * N * 2),
             *hb = malloc((size_t)MMAX * N * 2), *hc = malloc((size_t)MMAX * N * 2);
    ASSERT(hx && ha && hb && hc);
    for (int i = 0; i < MMAX * K; i++) hx[i] = h_from_f(2.f * rnd_unit() - 1.f);
    uint16_t *dx, *dy;
    void *ws;
    size_t wsb = (size_t)256 << 20;
    CK(cudaMalloc((void **)&dx, (size_t)MMAX * K * 2));
    CK(cudaMalloc((void **)&dy, (size_t)MMAX * N * 2));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemcpy(dx, hx, (size_t)MMAX * K * 2, cudaMemcpyHostToDevice));
    const int cl0 = w4a16_cluster_reduce(-1);
    static const struct {
        int kern, m, split;
    } cases[] = {
        {W4A16_KERNEL_SKINNY, 1, 2}, {W4A16_KERNEL_SKINNY, 1, 3}, {W4A16_KERNEL_SKINNY, 1, 4},
        {W4A16_KERNEL_SKINNY, 3, 2}, {W4A16_KERNEL_SKINNY, 3, 3}, {W4A16_KERNEL_SKINNY, 3, 4},
        {W4A16_KERNEL_SKINNY, 8, 2}, {W4A16_KERNEL_SKINNY, 8, 3}, {W4A16_KERNEL_SKINNY, 8, 4},
        {W4A16_KERNEL_TC64, 17, 2},  {W4A16_KERNEL_TC64, 33, 5},  {W4A16_KERNEL_TC64, 64, 8},
        {W4A16_KERNEL_TC128, 64, 4}, {W4A16_KERNEL_TC128, 100, 3}, {W4A16_KERNEL_TC128, 128, 7},
    };
    for (int ci = 0; ci < NM(cases); ci++) {
        const int M = cases[ci].m, split = cases[ci].split, kern = cases[ci].kern;
        const size_t ny = (size_t)M * N * 2;
        uint16_t *outs[3] = {ha, hb, hc};
        for (int run = 0; run < 3; run++) { /* cluster, workspace, cluster without ws */
            w4a16_cluster_reduce(run != 1);
            CK(cudaMemset(dy, 0xff, ny));
            int rc = w4a16_linear_ex(dw, dx, M, dy, W4A16_EPI_BIAS, (enum w4a16_kernel)kern, split,
                                     run == 2 ? NULL : ws, run == 2 ? 0 : wsb, 0, err, sizeof err);
            ASSERT_MSG(rc == 0, "kernel %d M=%d split=%d: %s", kern, M, split, err);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(outs[run], dy, ny, cudaMemcpyDeviceToHost));
        }
        for (size_t i = 0; i < (size_t)M * N; i++)
            ASSERT_MSG(!isnan(f_from_h(ha[i])), "kernel %d M=%d split=%d: y[%zu] not written", kern,
                       M, split, i);
        ASSERT_MSG(memcmp(ha, hb, ny) == 0, "kernel %d M=%d split=%d: cluster != workspace reduction",
                   kern, M, split);
        ASSERT_MSG(memcmp(ha, hc, ny) == 0, "kernel %d M=%d split=%d: no-workspace call differs", kern,
                   M, split);
    }
    w4a16_cluster_reduce(cl0);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    free(hx);
    free(ha);
    free(hb);
    free(hc);
    w4a16_free(dw);
    ref_layer_free(&h);
}

/* w4a16_linear_norm: the residual add + RMSNorm in the decode kernel's
 * prologue. For each shape and M (1 to 4, with and without delta, with bias):
 * rout must be fp16(rin + delta) bit for bit (and rin, delta untouched); y is
 * checked like check_case against the reference of the host's x =
 * fp16(w * (v * rsqrt(mean(v^2) + eps))) (sum in double: the kernel's fp32
 * sum in another order may move an element of x by an ulp, inside the bound).
 * M = 3, 4 (and 5 at K = 12288) must return -ENOTSUP and launch nothing (the
 * prologue is used up to M = 2). K = 12288 and the four-tile 5120 x 25600
 * take w's pieces past the registers' from shared memory. */
static void norm_fused_cases(void) {
    static const struct { int k, n, gate_up, bias; } shp[] = {
        {4096, 6144, 0, 0}, {4096, 24576, 1, 0}, {1024, 1040, 0, 1}, {640, 272, 1, 1},
        {12288, 4096, 0, 0},
        {5120, 25600, 1, 0}, /* the Qwen3-32B tp = 2 gate|up shard: four tiles a block, all of w's
                                pieces in shared memory (dc_norm_w_stage) */
        {8192, 2560, 0, 0},  /* the Llama-3-70B tp = 4 q|k|v shard: one tile, ZM1 at M = 1 */
    };
    const float eps = 1e-6f;
    for (int si = 0; si < NM(shp) && !test_failed(); si++) {
        struct ref_layer h;
        layer_make(&h, shp[si].k, shp[si].n, 128, shp[si].bias);
        struct w4a16_weight *dw = NULL;
        char err[256] = "";
        const int gu = shp[si].gate_up, K = h.l.k, N = h.l.n, oc = gu ? N / 2 : N;
        ASSERT_MSG(w4a16_upload(&h.l, gu ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &dw, err,
                                sizeof err) == 0, "%s", err);
        float *wref = ref_dequant(&h.l);
        ASSERT(wref);
        const int epi = (gu ? W4A16_EPI_SILU_MUL : 0) | (shp[si].bias ? W4A16_EPI_BIAS : 0);
        enum { MM = 5 };
        uint16_t *hin = malloc((size_t)MM * K * 2), *hd = malloc((size_t)MM * K * 2);
        uint16_t *hw = malloc((size_t)K * 2), *hx = malloc((size_t)MM * K * 2);
        uint16_t *hout = malloc((size_t)MM * K * 2), *hy = malloc((size_t)MM * oc * 2);
        double *ref = malloc(sizeof(double) * N);
        ASSERT(hin && hd && hw && hx && hout && hy && ref);
        for (int i = 0; i < MM * K; i++) {
            hin[i] = h_from_f(4.f * rnd_unit() - 2.f);
            hd[i] = h_from_f(2.f * rnd_unit() - 1.f);
        }
        for (int k = 0; k < K; k++) hw[k] = h_from_f(0.5f + rnd_unit());
        uint16_t *din, *dd, *dout, *dwn, *dy;
        CK(cudaMalloc((void **)&din, (size_t)MM * K * 2));
        CK(cudaMalloc((void **)&dd, (size_t)MM * K * 2));
        CK(cudaMalloc((void **)&dout, (size_t)MM * K * 2));
        CK(cudaMalloc((void **)&dwn, (size_t)K * 2));
        CK(cudaMalloc((void **)&dy, (size_t)MM * oc * 2));
        CK(cudaMemcpy(din, hin, (size_t)MM * K * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dd, hd, (size_t)MM * K * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwn, hw, (size_t)K * 2, cudaMemcpyHostToDevice));
        for (int M = 1; M <= 4 && !test_failed(); M++)
            for (int wd = 0; wd < 2 && !test_failed(); wd++) {
                const int expect = w4a16_linear_norm_ok(dw, M);
                ASSERT_MSG(expect == (M <= 2), "K=%d M=%d: fused %d, want %d", K, M, expect, M <= 2);
                CK(cudaMemset(dy, 0xff, (size_t)MM * oc * 2));
                CK(cudaMemset(dout, 0xff, (size_t)MM * K * 2));
                int rc = w4a16_linear_norm(dw, din, wd ? dd : NULL, dout, dwn, eps, M, dy, epi, 0,
                                           err, sizeof err);
                if (!expect) {
                    ASSERT_MSG(rc == -ENOTSUP, "K=%d M=%d: rc %d, want -ENOTSUP", K, M, rc);
                    continue;
                }
                ASSERT_MSG(rc == 0, "K=%d N=%d M=%d: rc %d: %s", K, N, M, rc, err);
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hout, dout, (size_t)M * K * 2, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hy, dy, (size_t)M * oc * 2, cudaMemcpyDeviceToHost));
                double maxref = 0, maxerr = 0, gmax = 0, umax = 0;
                for (int m = 0; m < M && !test_failed(); m++) {
                    double ss = 0;
                    for (int k = 0; k < K; k++) {
                        size_t i = (size_t)m * K + k;
                        uint16_t v = wd ? h_from_f(f_from_h(hin[i]) + f_from_h(hd[i])) : hin[i];
                        ASSERT_MSG(hout[i] == v, "K=%d M=%d row %d: rout[%d] %#x, want %#x", K, M,
                                   m, k, hout[i], v);
                        if (test_failed()) break;
                        ss += (double)f_from_h(v) * f_from_h(v);
                        hx[i] = v;
                    }
                    const double r = 1.0 / sqrt(ss / K + eps);
                    for (int k = 0; k < K; k++) {
                        size_t i = (size_t)m * K + k;
                        hx[i] = h_from_f((float)(f_from_h(hw[k]) * (f_from_h(hx[i]) * r)));
                    }
                    ref_row(wref, hx + (size_t)m * K, K, N, ref);
                    if (epi & W4A16_EPI_BIAS)
                        for (int n = 0; n < N; n++) ref[n] += f_from_h(h.bias[n]);
                    for (int j = 0; j < oc; j++) {
                        double v = ref[j];
                        if (gu) {
                            double g = ref[j], u = ref[oc + j];
                            gmax = fmax(gmax, fabs(g));
                            umax = fmax(umax, fabs(u));
                            v = g / (1 + exp(-g)) * u;
                        }
                        maxref = fmax(maxref, fabs(v));
                        double e = fabs(f_from_h(hy[(size_t)m * oc + j]) - v);
                        maxerr = test_err_max(maxerr, e);
                    }
                }
                double bound = gu ? 5e-3 * gmax * umax : 2e-3 * maxref;
                ASSERT_MSG(maxerr <= bound && maxref > 0,
                           "fused norm K=%d N=%d M=%d delta=%d: max|y-ref| %.4g > bound %.4g", K, N,
                           M, wd, maxerr, bound);
            }
        /* inputs untouched */
        CK(cudaMemcpy(hout, din, (size_t)MM * K * 2, cudaMemcpyDeviceToHost));
        ASSERT(memcmp(hout, hin, (size_t)MM * K * 2) == 0);
        CK(cudaMemcpy(hout, dd, (size_t)MM * K * 2, cudaMemcpyDeviceToHost));
        ASSERT(memcmp(hout, hd, (size_t)MM * K * 2) == 0);
        /* 5 rows at K = 12288 (the decode kernel takes M <= 2 there) */
        if (K > 8192) {
            int rc = w4a16_linear_norm(dw, din, dd, dout, dwn, eps, 5, dy, epi, 0, err, sizeof err);
            ASSERT_MSG(rc == -ENOTSUP, "K=%d M=5: rc %d, want -ENOTSUP", K, rc);
        }
        cudaFree(din);
        cudaFree(dd);
        cudaFree(dout);
        cudaFree(dwn);
        cudaFree(dy);
        free(hin);
        free(hd);
        free(hw);
        free(hx);
        free(hout);
        free(hy);
        free(ref);
        free(wref);
        w4a16_free(dw);
        ref_layer_free(&h);
    }
}

/* With ZM as the rule takes it (the default); the ZM kernel must have run, and
 * ZM1 where it is on. */
TEST(w4a16, linear_norm_fused) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    const int m0 = w4a16_decode_zm(-1); /* knob setters return the value in force */
    w4a16_decode_zm(8);
    const unsigned long l0 = w4a16_zm_launches(), l1 = w4a16_zm1_launches();
    norm_fused_cases();
    w4a16_decode_zm(m0);
    ASSERT_MSG(w4a16_zm_launches() - l0 >= 8, "ZM launched %lu times", w4a16_zm_launches() - l0);
    if (w4a16_decode_zm1(-1)) ASSERT_MSG(w4a16_zm1_launches() > l1, "ZM1 did not run (K = 8192, N = 2560, M = 1)");
}

/* The same cases without ZM (the zero point's HSUB2 in the loop). */
TEST(w4a16, linear_norm_fused_no_zm) {
    if (!have_gpu()) TEST_SKIP("no CUDA device");
    const int m0 = w4a16_decode_zm(-1);
    w4a16_decode_zm(0);
    const unsigned long l0 = w4a16_zm_launches();
    norm_fused_cases();
    w4a16_decode_zm(m0);
    ASSERT_MSG(w4a16_zm_launches() == l0, "ZM launched %lu times with ZM off", w4a16_zm_launches() - l0);
}
