/* test_w4a16_gemm.c — the sm_90a INT4 GEMM for large M (kernels/cuda/w4a16_gemm.cu,
 * forced through w4a16_linear_ex(..., W4A16_KERNEL_WGMMA, ...)) against a CPU
 * reference: Qwen3-8B's four matrices for M in {64, 100, 128, 257, 1000, 2048,
 * 4096}, every tile configuration in both modes (wgmma, mma.sync) with and
 * without split-K, awkward shapes (N not a multiple of the tile, K of a few
 * groups, G = 64, bias, the gate|up silu epilogue), no workspace, and the
 * automatic dispatch. Skipped where the kernel is not available (not a 9.0
 * device or no sm_90a code in the build).
 *
 * Reference: y_ref[m][n] = sum_k x[m][k] (q - z) s in double from the same fp16
 * x (a local dequantizer, AWQ order map from AWQ_FORMAT.md).
 *
 * Error bound (as for the other W4A16 kernels, tests/gpu/test_w4a16.c): the
 * kernel rounds each dequantized weight (q - z) s to fp16 (relative 2^-11,
 * random signs: <= 2^-11 of the output scale), accumulates in fp32 (~K 2^-24)
 * and rounds y to fp16 (2^-11): 2 x 2^-11 ~ 1e-3, doubled:
 *     max |y - y_ref| <= 2e-3 max |y_ref|              (plain, bias)
 *     max |y - y_ref| <= 5e-3 max|g_ref| max|u_ref|    (silu(g) u, first order)
 * over the checked rows (all rows for M <= 8, else 0, 1, 63, 64, 127, 128, M/2,
 * a random one, M - 1). Every element must be written (NaN poison) and two
 * identical calls must be bitwise equal (deterministic split-K). */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "engine/util.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_gemm.h"
#include "kernels/cuda/w4a16_repack.h"
#include "tests/gpu/w4a16_ref.h"
#include "tests/harness/test.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t grnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float grnd_unit(void) { return ref_unit(grnd); }

struct glayer {
    struct ref_layer r;
    float *wref; /* [K][N] (q - z) s */
    struct w4a16_weight *dw;
};

static void glayer_make(struct glayer *h, int K, int N, int G, int gate_up, int with_bias) {
    memset(h, 0, sizeof *h);
    ASSERT_MSG(ref_layer_make(&h->r, K, N, G, with_bias, grnd) == 0, "out of memory (K=%d N=%d)", K, N);
    h->wref = ref_dequant(&h->r.l);
    ASSERT(h->wref);
    char err[256];
    int rc = w4a16_upload(&h->r.l, gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &h->dw, err,
                          sizeof err);
    ASSERT_MSG(rc == 0, "upload K=%d N=%d: %s", K, N, err);
}

static void glayer_free(struct glayer *h) {
    w4a16_free(h->dw);
    ref_layer_free(&h->r);
    free(h->wref);
}

#define GCK(call) do { cudaError_t e_ = (call); ASSERT_MSG(e_ == cudaSuccess, "%s: %s", #call, \
                                                           cudaGetErrorString(e_)); } while (0)

/* One call (forced kernel `kern`, split `ks`, workspace or none) checked
 * against the reference. */
static void gcheck(const struct glayer *h, int gate_up, int M, int bias, enum w4a16_kernel kern, int ks,
                   int no_ws, const char *what) {
    const int K = h->r.l.k, N = h->r.l.n, oc = gate_up ? N / 2 : N;
    const int epi = (gate_up ? W4A16_EPI_SILU_MUL : 0) | (bias ? W4A16_EPI_BIAS : 0);
    size_t nx = (size_t)M * K, ny = (size_t)M * oc;
    uint16_t *hx = malloc(nx * 2), *hy = malloc(ny * 2), *hy2 = malloc(ny * 2);
    double *ref = malloc(sizeof(double) * N);
    ASSERT(hx && hy && hy2 && ref);
    for (size_t i = 0; i < nx; i++) hx[i] = h_from_f(2.f * grnd_unit() - 1.f);
    uint16_t *dx = NULL, *dy = NULL;
    void *ws = NULL;
    size_t wsb = no_ws ? 0 : w4a16_workspace_bytes(h->dw, M);
    if (!no_ws && ks > 0) { /* room for the forced split */
        size_t np = (size_t)(N + 255) / 256 * 256, mp = (size_t)(M + 255) / 256 * 256;
        size_t need = (size_t)ks * np * mp * 4 + 4096;
        if (need > wsb) wsb = need;
    }
    if (!no_ws && ks == 0 && wsb < ((size_t)32 << 20)) wsb = (size_t)32 << 20; /* a forced stream-K's pieces */
    GCK(cudaMalloc((void **)&dx, nx * 2));
    GCK(cudaMalloc((void **)&dy, ny * 2));
    if (wsb) GCK(cudaMalloc(&ws, wsb));
    GCK(cudaMemcpy(dx, hx, nx * 2, cudaMemcpyHostToDevice));
    char err[256] = "";
    uint16_t *outs[2] = {hy, hy2};
    for (int rep = 0; rep < 2; rep++) {
        GCK(cudaMemset(dy, 0xff, ny * 2)); /* NaN poison */
        int rc = w4a16_linear_ex(h->dw, dx, M, dy, epi, kern, ks, ws, wsb, 0, err, sizeof err);
        ASSERT_MSG(rc == 0, "%s M=%d: rc=%d: %s", what, M, rc, err);
        GCK(cudaDeviceSynchronize());
        GCK(cudaMemcpy(outs[rep], dy, ny * 2, cudaMemcpyDeviceToHost));
    }
    size_t nan_at = ny;
    for (size_t i = 0; i < ny && nan_at == ny; i++)
        if (isnan(f_from_h(hy[i]))) nan_at = i;
    ASSERT_MSG(nan_at == ny, "%s M=%d: y[%zu][%zu] not written (NaN)", what, M, nan_at / oc, nan_at % oc);
    ASSERT_MSG(memcmp(hy, hy2, ny * 2) == 0, "%s M=%d: two identical calls differ", what, M);

    int rows[16], nr = 0;
    if (M <= 8) {
        for (int m = 0; m < M; m++) rows[nr++] = m;
    } else {
        const int cand[8] = {0, 1, 63, 64, 127, 128, M / 2, M - 1};
        for (int i = 0; i < 8; i++)
            if (cand[i] < M) rows[nr++] = cand[i];
        rows[nr++] = (int)(grnd() % (uint32_t)M);
    }
    double maxref = 0, maxerr = 0, gmax = 0, umax = 0, worst_ref = 0;
    int worst_m = 0, worst_n = 0, nbad = 0;
    double *yr = malloc(sizeof(double) * (size_t)nr * oc);
    ASSERT(yr);
    for (int ri = 0; ri < nr; ri++) {
        const uint16_t *xr = hx + (size_t)rows[ri] * K;
        for (int n = 0; n < N; n++) ref[n] = bias ? f_from_h(h->r.bias[n]) : 0.0;
        for (int k = 0; k < K; k++) {
            double xk = f_from_h(xr[k]);
            const float *wr = h->wref + (size_t)k * N;
            for (int n = 0; n < N; n++) ref[n] += xk * wr[n];
        }
        for (int j = 0; j < oc; j++) {
            double v = ref[j];
            if (gate_up) {
                double g = ref[j], u = ref[oc + j];
                if (fabs(g) > gmax) gmax = fabs(g);
                if (fabs(u) > umax) umax = fabs(u);
                v = g / (1 + exp(-g)) * u;
            }
            yr[(size_t)ri * oc + j] = v;
            if (fabs(v) > maxref) maxref = fabs(v);
        }
    }
    const double bound = gate_up ? 5e-3 * gmax * umax : 2e-3 * maxref;
    for (int ri = 0; ri < nr; ri++)
        for (int j = 0; j < oc; j++) {
            double yv = f_from_h(hy[(size_t)rows[ri] * oc + j]), rv = yr[(size_t)ri * oc + j];
            double e = fabs(yv - rv);
            if (e > bound && nbad++ < 6) /* where: tells a permutation from a rounding problem */
                fprintf(stderr, "    %s M=%d: y[%d][%d] = %.5g, ref %.5g\n", what, M, rows[ri], j, yv, rv);
            if (test_err_above(maxerr, e)) {
                maxerr = e;
                worst_m = rows[ri];
                worst_n = j;
                worst_ref = rv;
            }
        }
    if (getenv("AWQD_TEST_VERBOSE"))
        fprintf(stderr, "  %-30s M=%-5d ks=%d max|err| %.3g bound %.3g (rel %.2g)\n", what, M, ks, maxerr,
                bound, maxerr / (maxref > 0 ? maxref : 1));
    ASSERT_MSG(maxerr <= bound && maxref > 0,
               "%s M=%d ks=%d: max|y-ref| = %.4g at [%d][%d] (y %.5g ref %.5g) > bound %.4g (max|ref| %.4g, %d bad)",
               what, M, ks, maxerr, worst_m, worst_n, f_from_h(hy[(size_t)worst_m * oc + worst_n]), worst_ref,
               bound, maxref, nbad);
    free(yr);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ws);
    free(hx);
    free(hy);
    free(hy2);
    free(ref);
}

static int gemm_here(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 && w4a16_gemm_available();
}

#define NEED_GEMM()                                                                      \
    do {                                                                                 \
        if (!gemm_here()) {                                                              \
            TEST_SKIP("no sm_90a wgmma kernel for this device/build");                   \
            return;                                                                      \
        }                                                                                \
    } while (0)

static const int CFGS[5][2] = {{1, 64}, {2, 64}, {1, 128}, {2, 128}, {1, 256}}; /* 1 x 256: modes 3-5 only */

/* Every tile configuration in one mode, split 1 and 3, on a shape whose N is
 * not a multiple of any tile (1000 = 62.5 n16 tiles), with bias. */
static void check_configs(int mode) {
    struct glayer h;
    glayer_make(&h, 1024, 1000, 128, 0, 1);
    ASSERT_OK_SO_FAR();
    static const int ms[] = {1, 64, 100, 257};
    for (int ci = 0; ci < (mode >= 3 ? 5 : 4); ci++)
        for (int ks = 1; ks <= 3; ks += 2) {
            ASSERT(w4a16_gemm_config(CFGS[ci][0], CFGS[ci][1], ks, mode) == 0);
            char what[64];
            snprintf(what, sizeof what, "cfg %dx%d %s split %d", CFGS[ci][0], CFGS[ci][1],
                     mode == 1   ? "mma.sync"
                     : mode == 2 ? "wgmma+workspace"
                     : mode == 3 ? "warp-specialized"
                     : mode == 4 ? "natural-k x (TMA)"
                     : mode == 5 ? "A dequantized to shared memory"
                                 : "wgmma+cluster",
                     ks);
            for (int i = 0; i < 4; i++) {
                gcheck(&h, 0, ms[i], 1, W4A16_KERNEL_WGMMA, 0, 0, what);
                if (test_failed()) {
                    w4a16_gemm_config(0, 0, 0, 0);
                    glayer_free(&h);
                    return;
                }
            }
        }
    w4a16_gemm_config(0, 0, 0, 0);
    glayer_free(&h);
}

/* mma.sync mode first: the same data path (x permutation, swizzle, dequant,
 * split-K, epilogue) without wgmma, so a wgmma-only failure is told apart. */
TEST(w4a16_gemm, configs_mma_sync) {
    NEED_GEMM();
    check_configs(1);
}

TEST(w4a16_gemm, configs_wgmma) { /* split reduced inside a thread-block cluster */
    NEED_GEMM();
    check_configs(0);
}

TEST(w4a16_gemm, configs_wgmma_workspace) { /* split reduced through the workspace */
    NEED_GEMM();
    check_configs(2);
}

TEST(w4a16_gemm, configs_warp_specialized) { /* mode 3: producer warpgroup, persistent grid */
    NEED_GEMM();
    check_configs(3);
}

TEST(w4a16_gemm, configs_natural_k) { /* mode 4: x by TMA, the weight words transposed in the quad */
    NEED_GEMM();
    check_configs(4);
}

TEST(w4a16_gemm, configs_smem_a) { /* mode 5: the producer warpgroup dequantizes into shared memory */
    NEED_GEMM();
    check_configs(5);
}

/* Mode 6: mode 4's pipelined loop with its split reduced by all of its
 * blocks through the workspace (a counter per tile), and mode 7 (the same
 * with three consumer warpgroups, 192-row tiles). Against the CPU
 * reference at M = 1, 17, 64, 100 (two token tiles), every tile, splits 2,
 * 3, 8, plain + bias and gate|up; each call checked to have run mode 6 / 7
 * (not a fallback), and its counters left at zero (a second call, the same
 * bits: gcheck's two repetitions). */
TEST(w4a16_gemm, configs_split_all_blocks) {
    NEED_GEMM();
    for (int gu = 0; gu < 2 && !test_failed(); gu++) {
        struct glayer h;
        glayer_make(&h, 1024, gu ? 2 * 504 : 1000, 128, gu, 1);
        ASSERT_OK_SO_FAR();
        static const int ms[] = {1, 17, 64, 100}, kss[] = {2, 3, 8};
        for (int v = 0; v < 3 && !test_failed(); v++) /* mode 6 1 x 64, 2 x 64; mode 7 (192-row tiles) */
            for (int i = 0; i < 3 && !test_failed(); i++) {
                const int mt = v == 1 ? 2 : 1, mode = v == 2 ? 7 : 6;
                ASSERT(w4a16_gemm_config(mt, 64, kss[i], mode) == 0);
                for (int j = 0; j < 4 && !test_failed(); j++) {
                    char what[64];
                    snprintf(what, sizeof what, "%s mode %d %dx64 split %d", gu ? "gate|up" : "plain", mode, mt,
                             kss[i]);
                    const unsigned long n0 = w4a16_gemm_dr_launches();
                    gcheck(&h, gu, ms[j], 1, W4A16_KERNEL_WGMMA, kss[i], 0, what);
                    ASSERT_MSG(w4a16_gemm_dr_launches() == n0 + 2, "%s M=%d: mode 6 did not run", what, ms[j]);
                }
            }
        w4a16_gemm_config(0, 0, 0, 0);
        glayer_free(&h);
    }
}

/* One comparison case: a K x N layer with bias (gate|up: N / 2 outputs),
 * M rows of x uniform in [-1, 1) on the device, y there, and three host
 * buffers of y (ya, yb, yc). Check test_failed() after gcase_make. */
struct gcase {
    struct glayer h;
    int K, N, gu, M, oc;
    size_t ny;
    uint16_t *hx, *dx, *dy, *ya, *yb, *yc;
};

static void gcase_make(struct gcase *c, int K, int N, int gu, int M) {
    memset(c, 0, sizeof *c);
    c->K = K, c->N = N, c->gu = gu, c->M = M, c->oc = gu ? N / 2 : N;
    c->ny = (size_t)M * c->oc;
    glayer_make(&c->h, K, N, 128, gu, 1);
    ASSERT_OK_SO_FAR();
    c->hx = malloc((size_t)M * K * 2);
    c->ya = malloc(c->ny * 2), c->yb = malloc(c->ny * 2), c->yc = malloc(c->ny * 2);
    ASSERT(c->hx && c->ya && c->yb && c->yc);
    for (size_t i = 0; i < (size_t)M * K; i++) c->hx[i] = h_from_f(2.f * grnd_unit() - 1.f);
    GCK(cudaMalloc((void **)&c->dx, (size_t)M * K * 2));
    GCK(cudaMalloc((void **)&c->dy, c->ny * 2));
    GCK(cudaMemcpy(c->dx, c->hx, (size_t)M * K * 2, cudaMemcpyHostToDevice));
}

static void gcase_free(struct gcase *c) {
    cudaFree(c->dx);
    cudaFree(c->dy);
    free(c->hx);
    free(c->ya);
    free(c->yb);
    free(c->yc);
    glayer_free(&c->h);
}

/* y of one forced call (config mt x bn, split ks, mode), copied to hy. */
static void run_cfg(const struct glayer *h, const uint16_t *dx, uint16_t *dy, void *ws, size_t wsb, int M,
                    int gate_up, int mt, int bn, int ks, int mode, uint16_t *hy, size_t ny) {
    ASSERT(w4a16_gemm_config(mt, bn, ks, mode) == 0);
    char err[256];
    GCK(cudaMemset(dy, 0xff, ny * 2));
    int rc = w4a16_linear_ex(h->dw, dx, M, dy, gate_up ? W4A16_EPI_SILU_MUL | W4A16_EPI_BIAS : W4A16_EPI_BIAS,
                             W4A16_KERNEL_WGMMA, 0, ws, wsb, 0, err, sizeof err);
    w4a16_gemm_config(0, 0, 0, 0);
    ASSERT_MSG(rc == 0, "rc=%d: %s", rc, err);
    GCK(cudaDeviceSynchronize());
    GCK(cudaMemcpy(hy, dy, ny * 2, cudaMemcpyDeviceToHost));
}

/* The cluster reduction adds the same partials in the same order as the
 * workspace reduction: bitwise equal, for every configuration and 2..8 splits. */
TEST(w4a16_gemm, cluster_matches_workspace) {
    NEED_GEMM();
    for (int gu = 0; gu < 2; gu++) {
        struct glayer h;
        const int K = 1536, N = gu ? 2 * 520 : 1000, M = 200, oc = gu ? N / 2 : N;
        glayer_make(&h, K, N, 128, gu, 1);
        ASSERT_OK_SO_FAR();
        size_t ny = (size_t)M * oc, wsb = (size_t)64 << 20;
        uint16_t *hx = malloc((size_t)M * K * 2), *ya = malloc(ny * 2), *yb = malloc(ny * 2), *dx = NULL, *dy = NULL;
        void *ws = NULL;
        ASSERT(hx && ya && yb);
        for (size_t i = 0; i < (size_t)M * K; i++) hx[i] = h_from_f(2.f * grnd_unit() - 1.f);
        GCK(cudaMalloc((void **)&dx, (size_t)M * K * 2));
        GCK(cudaMalloc((void **)&dy, ny * 2));
        GCK(cudaMalloc(&ws, wsb));
        GCK(cudaMemcpy(dx, hx, (size_t)M * K * 2, cudaMemcpyHostToDevice));
        static const int kss[] = {2, 3, 5, 8};
        for (int ci = 0; ci < 4 && !test_failed(); ci++)
            for (int i = 0; i < 4 && !test_failed(); i++) {
                run_cfg(&h, dx, dy, ws, wsb, M, gu, CFGS[ci][0], CFGS[ci][1], kss[i], 0, ya, ny);
                if (test_failed()) break;
                run_cfg(&h, dx, dy, ws, wsb, M, gu, CFGS[ci][0], CFGS[ci][1], kss[i], 2, yb, ny);
                if (test_failed()) break;
                ASSERT_MSG(memcmp(ya, yb, ny * 2) == 0, "%s cfg %dx%d split %d: cluster != workspace reduction",
                           gu ? "gate|up" : "plain", CFGS[ci][0], CFGS[ci][1], kss[i]);
            }
        cudaFree(dx);
        cudaFree(dy);
        cudaFree(ws);
        free(hx);
        free(ya);
        free(yb);
        glayer_free(&h);
        ASSERT_OK_SO_FAR();
    }
}

/* Mode a against mode b on every configuration both have (ntiles of CFGS),
 * splits 1, 2, 3, 8, plain + bias and gate|up + bias, ragged M and N, a K of
 * two chunks (more tiles than SMs: the persistent loop runs several tiles per
 * block with the ring wrapping inside a tile and across tiles) and Qwen3-8B
 * q|k|v: bit for bit (bound < 0), else within bound x max|y|. */
static void compare_modes(int ma, int mb, int ntiles, float bound) {
    static const struct { int k, n, gu, m; } sh[] = {
        {1536, 1000, 0, 200}, {1536, 2 * 520, 1, 333}, {128, 4104, 0, 1000}, {4096, 6144, 0, 1024}};
    for (int si = 0; si < 4 && !test_failed(); si++) {
        struct gcase c;
        gcase_make(&c, sh[si].k, sh[si].n, sh[si].gu, sh[si].m);
        if (test_failed()) {
            gcase_free(&c);
            return;
        }
        const int K = c.K, N = c.N, gu = c.gu, M = c.M, oc = c.oc;
        const size_t ny = c.ny;
        struct glayer *const hp = &c.h;
        uint16_t *const ya = c.ya, *const yb = c.yb, *const dx = c.dx, *const dy = c.dy;
        static const int kss[] = {1, 2, 3, 8};
        for (int ci = 0; ci < ntiles && !test_failed(); ci++)
            for (int i = 0; i < 4 && !test_failed(); i++) {
                if (kss[i] > K / 64) continue;
                run_cfg(hp, dx, dy, NULL, 0, M, gu, CFGS[ci][0], CFGS[ci][1], kss[i], ma, ya, ny);
                if (test_failed()) break;
                run_cfg(hp, dx, dy, NULL, 0, M, gu, CFGS[ci][0], CFGS[ci][1], kss[i], mb, yb, ny);
                if (test_failed()) break;
                float ymax = 0.f, dmax = 0.f;
                size_t at = ny;
                for (size_t e = 0; e < ny; e++) {
                    const float a = f_from_h(ya[e]), b = f_from_h(yb[e]);
                    ASSERT_MSG(a == a && b == b, "mode %d / %d: NaN at y[%zu]", ma, mb, e);
                    if (fabsf(a) > ymax) ymax = fabsf(a);
                    if (bound < 0 ? (ya[e] != yb[e] && at == ny) : fabsf(a - b) > dmax) dmax = fabsf(a - b), at = e;
                }
                ASSERT_MSG(bound < 0 ? at == ny : dmax <= bound * ymax,
                           "K=%d N=%d%s M=%d cfg %dx%d split %d: mode %d != mode %d at y[%zu][%zu] (%g vs %g, "
                           "max|y| %g)",
                           K, N, gu ? " gate|up" : "", M, CFGS[ci][0], CFGS[ci][1], kss[i], mb, ma,
                           (at < ny ? at : 0) / oc, (at < ny ? at : 0) % oc, f_from_h(yb[at < ny ? at : 0]),
                           f_from_h(ya[at < ny ? at : 0]), ymax);
            }
        gcase_free(&c);
    }
}

/* The warp-specialized kernel (mode 3) computes what the session-3 kernel
 * (mode 0) computes, bit for bit: the same A values, the same wgmma sequence
 * per split, the same cluster reduction. */
/* Modes 6 and 7 add the same partials in the same order as mode 4's
 * cluster reduction (each output's k16 steps, chunks and splits in the same
 * order, whichever warpgroup holds it): bit for bit, every tile, splits
 * 2..8, plain and gate|up, M in the pipelined loop's range (64) and past it
 * (100). */
TEST(w4a16_gemm, split_all_blocks_matches_cluster) {
    NEED_GEMM();
    const size_t wsb = (size_t)64 << 20;
    void *ws = NULL;
    GCK(cudaMalloc(&ws, wsb));
    for (int gu = 0; gu < 2 && !test_failed(); gu++)
        for (int mi = 0; mi < 2 && !test_failed(); mi++) {
            struct gcase c;
            gcase_make(&c, 1536, gu ? 2 * 496 : 1000, gu, mi ? 100 : 64);
            static const int kss[] = {2, 3, 4, 6, 8};
            for (int v = 0; v < 3 && !test_failed(); v++) /* mode 6 1 x 64, 2 x 64; mode 7 (against 1 x 64) */
                for (int i = 0; i < 5 && !test_failed(); i++) {
                    const int mt = v == 1 ? 2 : 1, mode = v == 2 ? 7 : 6;
                    run_cfg(&c.h, c.dx, c.dy, ws, wsb, c.M, gu, mt, 64, kss[i], 4, c.ya, c.ny);
                    if (test_failed()) break;
                    const unsigned long n0 = w4a16_gemm_dr_launches();
                    run_cfg(&c.h, c.dx, c.dy, ws, wsb, c.M, gu, mt, 64, kss[i], mode, c.yb, c.ny);
                    if (test_failed()) break;
                    ASSERT_MSG(w4a16_gemm_dr_launches() == n0 + 1, "mode %d did not run (%dx64 split %d)", mode, mt,
                               kss[i]);
                    ASSERT_MSG(memcmp(c.ya, c.yb, c.ny * 2) == 0,
                               "%s M=%d cfg %dx64 split %d: mode %d != mode 4 (cluster)", gu ? "gate|up" : "plain",
                               c.M, mt, kss[i], mode);
                }
            gcase_free(&c);
        }
    cudaFree(ws);
}

/* XP (session 51): x copied permuted within each 64-deep chunk (k_xperm)
 * into the repacked words' k order, the weight words read as stored. That is
 * mode 3's x permutation (its 4-byte copies put pair 8c + u of a chunk at 4u
 * + c) with mode 4's pipelined loops, so each call is bit for bit mode 3's
 * at the same tile and split: mode 4 at split 1 and 3 (cluster), mode 6 at
 * splits 2, 3, 8 (mode 3 reduces in a cluster, mode 6 through the
 * workspace: the same order), mode 7 against mode 3's 1 x 64; the plain loop
 * (M = 100, 257) on every tile at splits 1 and 3. Plain + bias and gate|up,
 * M = 1, 17, 64; each XP call checked to have run XP. Then the
 * automatic choice with XP on the Qwen3-8B shapes against the CPU reference
 * (gcheck) at M = 17, 40, 64. */
static void xp_case(struct gcase *c, void *ws, size_t wsb, int mt, int bn, int ks, int mode, int mode3_mt) {
    run_cfg(&c->h, c->dx, c->dy, ws, wsb, c->M, c->gu, mode3_mt, bn, ks, 3, c->ya, c->ny);
    if (test_failed()) return;
    const int x0 = w4a16_gemm_xp(-1);
    w4a16_gemm_xp(2);
    const unsigned long n0 = w4a16_gemm_xp_launches();
    run_cfg(&c->h, c->dx, c->dy, ws, wsb, c->M, c->gu, mt, bn, ks, mode, c->yb, c->ny);
    w4a16_gemm_xp(x0);
    if (test_failed()) return;
    ASSERT_MSG(w4a16_gemm_xp_launches() == n0 + 1, "XP did not run (mode %d %dx%d split %d M=%d)", mode, mt, bn, ks,
               c->M);
    size_t at = c->ny;
    for (size_t e = 0; e < c->ny && at == c->ny; e++)
        if (c->ya[e] != c->yb[e]) at = e;
    ASSERT_MSG(at == c->ny, "%s M=%d mode %d %dx%d split %d with XP != mode 3: y[%zu][%zu] %g vs %g",
               c->gu ? "gate|up" : "plain", c->M, mode, mt, bn, ks, (at < c->ny ? at : 0) / c->oc,
               (at < c->ny ? at : 0) % c->oc, f_from_h(c->yb[at < c->ny ? at : 0]),
               f_from_h(c->ya[at < c->ny ? at : 0]));
}

TEST(w4a16_gemm, xp_matches_warp_specialized) {
    NEED_GEMM();
    const size_t wsb = (size_t)64 << 20;
    void *ws = NULL;
    GCK(cudaMalloc(&ws, wsb));
    static const int ms[] = {1, 17, 64};
    for (int gu = 0; gu < 2 && !test_failed(); gu++)
        for (int mi = 0; mi < 3 && !test_failed(); mi++) {
            struct gcase c;
            gcase_make(&c, 1536, gu ? 2 * 496 : 1000, gu, ms[mi]);
            for (int mt = 1; mt <= 2 && !test_failed(); mt++) {
                static const int k4[] = {1, 3}, k6[] = {2, 3, 8};
                for (int i = 0; i < 2 && !test_failed(); i++) xp_case(&c, ws, wsb, mt, 64, k4[i], 4, mt);
                for (int i = 0; i < 3 && !test_failed(); i++) xp_case(&c, ws, wsb, mt, 64, k6[i], 6, mt);
                if (mt == 1)
                    for (int i = 0; i < 3 && !test_failed(); i++) xp_case(&c, ws, wsb, 1, 64, k6[i], 7, 1);
            }
            gcase_free(&c);
        }
    /* the plain loop (M > 64): every tile of mode 4, splits 1 and 3, two
     * and five token tiles */
    for (int gu = 0; gu < 2 && !test_failed(); gu++)
        for (int mi = 0; mi < 2 && !test_failed(); mi++) {
            struct gcase c;
            gcase_make(&c, 1536, gu ? 2 * 496 : 1000, gu, mi ? 257 : 100);
            for (int ci = 0; ci < 5 && !test_failed(); ci++)
                for (int ks = 1; ks <= 3 && !test_failed(); ks += 2)
                    xp_case(&c, ws, wsb, CFGS[ci][0], CFGS[ci][1], ks, 4, CFGS[ci][0]);
            gcase_free(&c);
        }
    cudaFree(ws);
    static const struct { int k, n, gu; } sh[] = {{4096, 6144, 0}, {4096, 4096, 0}, {4096, 2 * 12288, 1},
                                                  {12288, 4096, 0}};
    static const int am[] = {17, 40, 64};
    const int x0 = w4a16_gemm_xp(-1);
    w4a16_gemm_xp(2);
    for (int si = 0; si < 4 && !test_failed(); si++) {
        struct glayer h;
        glayer_make(&h, sh[si].k, sh[si].n, 128, sh[si].gu, !sh[si].gu);
        if (test_failed()) break;
        for (int i = 0; i < 3 && !test_failed(); i++) {
            const unsigned long n0 = w4a16_gemm_xp_launches();
            gcheck(&h, sh[si].gu, am[i], !sh[si].gu, W4A16_KERNEL_WGMMA, 0, 0, "XP, automatic");
            ASSERT_MSG(w4a16_gemm_xp_launches() >= n0 + 2, "XP did not run (K=%d N=%d M=%d)", sh[si].k, sh[si].n,
                       am[i]);
        }
        /* the default (nat_rule.h nat_xp_takes): gate|up (K N = 96 Mi) at
         * M = 32, not q|k|v (another layout, 24 Mi) */
        if (si == 0 || si == 2) {
            w4a16_gemm_xp(1);
            const unsigned long n0 = w4a16_gemm_xp_launches();
            gcheck(&h, sh[si].gu, 32, !sh[si].gu, W4A16_KERNEL_WGMMA, 0, 0, "XP by the rule");
            ASSERT_MSG(w4a16_gemm_xp_launches() == n0 + (si == 2 ? 2 : 0), "XP by the rule: K=%d N=%d M=32 ran %lu",
                       sh[si].k, sh[si].n, w4a16_gemm_xp_launches() - n0);
            w4a16_gemm_xp(2);
        }
        glayer_free(&h);
    }
    w4a16_gemm_xp(x0);
}

TEST(w4a16_gemm, warp_specialized_matches_session3) {
    NEED_GEMM();
    compare_modes(0, 3, 4, -1.f);
}

/* Mode 4 sums the same fp16 products as mode 3 with the k16 steps holding
 * other k: not bitwise, within a few fp16 ulps of the output. Bound: 2e-3 of
 * max|y| (the reference bound of gcheck), every tile (1 x 256 too). */
TEST(w4a16_gemm, natural_k_matches_warp_specialized) {
    NEED_GEMM();
    compare_modes(3, 4, 5, 2e-3f);
}

/* Mode 5 feeds the wgmma the same fp16 A values as mode 4 (from shared
 * memory instead of registers) in the same k16 steps: bit for bit, every
 * tile and split, the ring and the A buffers wrapping across tiles. */
TEST(w4a16_gemm, smem_a_matches_natural_k) {
    NEED_GEMM();
    compare_modes(4, 5, 5, -1.f);
}

/* Mode 4's stream-K (split 1, equal shares of the chunk steps per block,
 * cut tiles summed by their head block from parked pieces) against mode 4
 * split 1 with whole tiles: the same fp16 products in other fp32 groupings,
 * so within 2e-3 of max|y|, not bitwise; every element written; two calls
 * bitwise equal (the order of the pieces is fixed). Shapes: a tile cut
 * across ~17 blocks (K = 12288, 8 tiles), gate|up + bias, ragged M and N,
 * two chunks per tile (pieces of one chunk), Qwen3-8B q|k|v at M = 512. */
TEST(w4a16_gemm, stream_k_matches_natural_k) {
    NEED_GEMM();
    static const struct { int k, n, gu, m; } sh[] = {
        {12288, 1000, 0, 64}, {1536, 2 * 520, 1, 333}, {128, 4104, 0, 1000}, {4096, 6144, 0, 512}};
    const size_t wsb = (size_t)64 << 20;
    void *ws = NULL;
    GCK(cudaMalloc(&ws, wsb));
    for (int si = 0; si < 4 && !test_failed(); si++) {
        struct gcase c;
        gcase_make(&c, sh[si].k, sh[si].n, sh[si].gu, sh[si].m);
        const int K = c.K, N = c.N, gu = c.gu, M = c.M, oc = c.oc;
        const size_t ny = c.ny;
        struct glayer *const hp = &c.h;
        uint16_t *const ya = c.ya, *const yb = c.yb, *const yc = c.yc, *const dx = c.dx, *const dy = c.dy;
        for (int ci = 0; ci < 5 && !test_failed(); ci++) {
            run_cfg(hp, dx, dy, NULL, 0, M, gu, CFGS[ci][0], CFGS[ci][1], 1, 4, ya, ny);
            const unsigned long sk0 = w4a16_gemm_sk_launches();
            if (!test_failed()) run_cfg(hp, dx, dy, ws, wsb, M, gu, CFGS[ci][0], CFGS[ci][1], 0, 4, yb, ny);
            ASSERT_MSG(w4a16_gemm_sk_launches() == sk0 + 1, "K=%d N=%d M=%d cfg %dx%d: stream-K did not run", K, N,
                       M, CFGS[ci][0], CFGS[ci][1]);
            if (!test_failed()) run_cfg(hp, dx, dy, ws, wsb, M, gu, CFGS[ci][0], CFGS[ci][1], 0, 4, yc, ny);
            if (test_failed()) break;
            ASSERT_MSG(memcmp(yb, yc, ny * 2) == 0, "K=%d N=%d M=%d cfg %dx%d: two stream-K calls differ", K, N, M,
                       CFGS[ci][0], CFGS[ci][1]);
            float ymax = 0.f, dmax = 0.f;
            size_t at = 0, same = 0;
            for (size_t e = 0; e < ny; e++) {
                const float a = f_from_h(ya[e]), b = f_from_h(yb[e]);
                ASSERT_MSG(a == a && b == b, "K=%d N=%d M=%d cfg %dx%d: NaN at y[%zu][%zu] (stream-K %g)", K, N, M,
                           CFGS[ci][0], CFGS[ci][1], e / oc, e % oc, b);
                if (fabsf(a) > ymax) ymax = fabsf(a);
                if (fabsf(a - b) > dmax) dmax = fabsf(a - b), at = e;
                same += ya[e] == yb[e];
            }
            ASSERT_MSG(dmax <= 2e-3f * ymax, "K=%d N=%d%s M=%d cfg %dx%d: stream-K %g vs %g at y[%zu][%zu] (max|y| %g)",
                       K, N, gu ? " gate|up" : "", M, CFGS[ci][0], CFGS[ci][1], f_from_h(yb[at]), f_from_h(ya[at]),
                       at / oc, at % oc, ymax);
            if (getenv("AWQD_TEST_VERBOSE"))
                fprintf(stderr, "  stream-K K=%d N=%d M=%d cfg %dx%d: max diff %.3g of max|y| %.3g, %.1f%% bitwise\n",
                        K, N, M, CFGS[ci][0], CFGS[ci][1], dmax, ymax, 100.0 * same / ny);
        }
        gcase_free(&c);
    }
    cudaFree(ws);
}

/* The engine sizes its linear workspace with w4a16_stream_k_bytes too: for a
 * small shard (Llama-3-70B gate|up at tp = 8, K = 8192, N = 2 x 3584) the
 * 64-row split-K partials need less than stream-K's parked pieces, and a
 * call with the 64-row size alone ran whole tiles. With exactly
 * w4a16_stream_k_bytes the forced 1 x 256 stream-K runs (launch counter),
 * one byte less falls back to whole tiles, and both agree within 2e-3 of
 * max|y|. */
TEST(w4a16_gemm, stream_k_workspace) {
    NEED_GEMM();
    int dev = 0, sms = 0;
    GCK(cudaGetDevice(&dev));
    GCK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    struct gcase c;
    gcase_make(&c, 8192, 2 * 3584, 1, 1024);
    ASSERT_OK_SO_FAR();
    const size_t wsk = w4a16_stream_k_bytes(c.h.dw);
    if (!w4a16_gemm_stream_k()) {
        ASSERT(wsk == 0);
        gcase_free(&c);
        return;
    }
    ASSERT_MSG(wsk == (size_t)sms * 128 * 256 * 4, "stream-K bytes %zu for %d SMs", wsk, sms);
    ASSERT_MSG(wsk > w4a16_workspace_bytes(c.h.dw, 64), "64-row workspace %zu already holds stream-K's %zu",
               w4a16_workspace_bytes(c.h.dw, 64), wsk);
    void *ws = NULL;
    GCK(cudaMalloc(&ws, wsk));
    const unsigned long n0 = w4a16_gemm_sk_launches();
    run_cfg(&c.h, c.dx, c.dy, ws, wsk, c.M, 1, 1, 256, 0, 4, c.ya, c.ny);
    ASSERT_MSG(w4a16_gemm_sk_launches() == n0 + 1, "stream-K did not run with %zu bytes", wsk);
    run_cfg(&c.h, c.dx, c.dy, ws, wsk - 1, c.M, 1, 1, 256, 0, 4, c.yb, c.ny);
    ASSERT_MSG(w4a16_gemm_sk_launches() == n0 + 1, "stream-K ran with %zu bytes", wsk - 1);
    float ymax = 0.f, dmax = 0.f;
    for (size_t e = 0; e < c.ny && !test_failed(); e++) {
        const float a = f_from_h(c.ya[e]), b = f_from_h(c.yb[e]);
        ASSERT_MSG(a == a && b == b, "NaN at y[%zu]", e);
        if (fabsf(b) > ymax) ymax = fabsf(b);
        if (fabsf(a - b) > dmax) dmax = fabsf(a - b);
    }
    ASSERT_MSG(dmax <= 2e-3f * ymax, "stream-K vs whole tiles: %g (max|y| %g)", dmax, ymax);
    cudaFree(ws);
    gcase_free(&c);
}

/* Every tile with stream-K forced, against the reference (the shapes and M
 * of check_configs; where the chunk steps are too few for the grid the call
 * runs split 1 with whole tiles). */
TEST(w4a16_gemm, configs_stream_k) {
    NEED_GEMM();
    struct glayer h;
    glayer_make(&h, 4096, 1000, 128, 0, 1);
    ASSERT_OK_SO_FAR();
    static const int ms[] = {64, 100, 257};
    for (int ci = 0; ci < 5 && !test_failed(); ci++) {
        ASSERT(w4a16_gemm_config(CFGS[ci][0], CFGS[ci][1], 0, 4) == 0);
        char what[64];
        snprintf(what, sizeof what, "cfg %dx%d stream-K", CFGS[ci][0], CFGS[ci][1]);
        for (int i = 0; i < 3 && !test_failed(); i++) gcheck(&h, 0, ms[i], 1, W4A16_KERNEL_WGMMA, 0, 0, what);
    }
    w4a16_gemm_config(0, 0, 0, 0);
    glayer_free(&h);
}

/* The tiles of session 44 against the reference: 1 x 96 (wgmma m64n96) in
 * modes 3 (staged tile end) and 4 (bulk-store tile end) at split 1, a split
 * in a cluster and stream-K, in modes 6 / 7 with their splits, and 1 x 128
 * in modes 6 / 7; plain (ragged N = 1000, with and without bias) and
 * gate|up layouts; M below, at and above one token tile. Then the
 * automatic choice takes 96-token tiles at M = 65-96 only, on the Qwen3-8B
 * shapes. */
TEST(w4a16_gemm, configs_bn96) {
    NEED_GEMM();
    static const struct { int k, n, gate_up, bias; } sh[] = {{1024, 1000, 0, 1}, {4096, 1000, 0, 0},
                                                              {2048, 2 * 1400, 1, 1}, {1024, 2 * 1016, 1, 0}};
    static const int ms[] = {1, 65, 80, 96, 100, 257};
    for (int s = 0; s < 4 && !test_failed(); s++) {
        struct glayer h;
        glayer_make(&h, sh[s].k, sh[s].n, 128, sh[s].gate_up, sh[s].bias);
        ASSERT_OK_SO_FAR();
        /* tile (mt x bn), split (0: stream-K), mode; modes 6 / 7 counted by their launches (1 x 128 in
         * modes 6 / 7: M = 97-128, session 44) */
        static const int cf[8][4] = {{1, 96, 1, 4}, {1, 96, 3, 4}, {1, 96, 0, 4}, {1, 96, 1, 3},
                                     {1, 96, 3, 6}, {1, 96, 4, 7},  {1, 128, 3, 6}, {1, 128, 4, 7}};
        for (int c = 0; c < 8 && !test_failed(); c++) {
            ASSERT(w4a16_gemm_config(cf[c][0], cf[c][1], cf[c][2], cf[c][3]) == 0);
            char what[96];
            snprintf(what, sizeof what, "%dx%d mode %d split %d K=%d N=%d%s", cf[c][0], cf[c][1], cf[c][3], cf[c][2],
                     sh[s].k, sh[s].n, sh[s].gate_up ? " gate|up" : "");
            const unsigned long dr0 = w4a16_gemm_dr_launches();
            for (int i = 0; i < 6 && !test_failed(); i++) /* the split passed too: workspace for modes 6 / 7 */
                gcheck(&h, sh[s].gate_up, ms[i], sh[s].bias, W4A16_KERNEL_WGMMA, cf[c][3] >= 6 ? cf[c][2] : 0, 0,
                       what);
            if (cf[c][3] >= 6) /* two calls a point; at least the M <= 96 points fit their grid */
                ASSERT_MSG(w4a16_gemm_dr_launches() - dr0 >= 8, "%s: %lu mode 6/7 launches", what,
                           w4a16_gemm_dr_launches() - dr0);
        }
        w4a16_gemm_config(0, 0, 0, 0);
        glayer_free(&h);
    }
    ASSERT(w4a16_gemm_config(1, 96, 1, 5) == -EINVAL); /* not in mode 5 */
    ASSERT(w4a16_gemm_config(2, 96, 1, 4) == -EINVAL);
    ASSERT(w4a16_gemm_config(2, 96, 3, 6) == -EINVAL);
    ASSERT(w4a16_gemm_config(2, 128, 3, 6) == -EINVAL);
    ASSERT(w4a16_gemm_config(1, 256, 3, 6) == -EINVAL);
    int dev = 0, sms = 0;
    GCK(cudaGetDevice(&dev));
    GCK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    static const struct { int k, n, gate_up; } q8[] = {{4096, 6144, 0}, {4096, 4096, 0}, {4096, 24576, 1}, {12288, 4096, 0}};
    for (int s = 0; s < 4; s++) {
        struct w4a16_dims dims;
        ASSERT(w4a16_dims_of(q8[s].k, q8[s].n, 128, q8[s].gate_up, &dims) == 0);
        struct w4a16_gemm_args ga;
        memset(&ga, 0, sizeof ga);
        ga.n16 = dims.n16;
        ga.n16a = dims.n16a;
        ga.kc = dims.kc;
        ga.sms = sms;
        ga.cnt_len = 4096;
        static const int mm[] = {64, 65, 80, 96, 97, 128};
        for (int i = 0; i < 6; i++) {
            ga.m = mm[i];
            int mt, bn, ks, mode;
            w4a16_gemm_choice(&ga, &mt, &bn, &ks, &mode);
            if (mode >= 4) /* the automatic modes unless overridden by the environment */
                ASSERT_MSG((bn == 96) == (mm[i] > 64 && mm[i] <= 96 && !util_env_is_zero("AWQD_W4A16_GEMM_BN96")),
                           "K=%d N=%d M=%d: %dx%d split %d mode %d", q8[s].k, q8[s].n, mm[i], mt, bn, ks, mode);
        }
    }
}

/* Qwen3-8B q|k|v, o, gate|up (silu epilogue), down at the M values. */
TEST(w4a16_gemm, qwen3_8b_shapes) {
    NEED_GEMM();
    static const struct { const char *name; int k, n, gate_up; } sh[] = {
        {"qkv", 4096, 6144, 0}, {"o", 4096, 4096, 0}, {"gate_up", 4096, 24576, 1}, {"down", 12288, 4096, 0}};
    static const int ms[] = {64, 80, 96, 100, 128, 257, 1000, 2048, 4096};
    for (int s = 0; s < 4; s++) {
        struct glayer h;
        glayer_make(&h, sh[s].k, sh[s].n, 128, sh[s].gate_up, 0);
        ASSERT_OK_SO_FAR();
        for (int i = 0; i < 9 && !test_failed(); i++) {
            gcheck(&h, sh[s].gate_up, ms[i], 0, W4A16_KERNEL_WGMMA, 0, 0, sh[s].name);
            if (!test_failed()) /* the automatic dispatch without workspace (M >= 512: this kernel) */
                gcheck(&h, sh[s].gate_up, ms[i], 0, W4A16_KERNEL_AUTO, 0, 1, sh[s].name);
        }
        glayer_free(&h);
        ASSERT_OK_SO_FAR();
    }
}

/* Awkward shapes: tiny and ragged N, K of one to three groups (G = 64 too),
 * gate|up with inter not a multiple of 64, bias, forced splits. */
TEST(w4a16_gemm, awkward_shapes) {
    NEED_GEMM();
    static const struct { int k, n, g, gate_up, bias; } sh[] = {
        {128, 8, 64, 0, 0},   {192, 200, 64, 0, 1}, {256, 72, 128, 0, 0}, {384, 4104, 128, 0, 1},
        {128, 48, 64, 1, 0},  {256, 272, 128, 1, 1}, {640, 1000, 64, 0, 0},
    };
    static const int ms[] = {1, 3, 64, 65, 100, 257};
    for (int s = 0; s < 7; s++) {
        struct glayer h;
        glayer_make(&h, sh[s].k, sh[s].n, sh[s].g, sh[s].gate_up, sh[s].bias);
        ASSERT_OK_SO_FAR();
        char what[64];
        snprintf(what, sizeof what, "K=%d N=%d G=%d%s%s", sh[s].k, sh[s].n, sh[s].g,
                 sh[s].gate_up ? " gate|up" : "", sh[s].bias ? " bias" : "");
        for (int i = 0; i < 6 && !test_failed(); i++)
            for (int ks = 0; ks <= 2 && !test_failed(); ks++)
                gcheck(&h, sh[s].gate_up, ms[i], sh[s].bias, W4A16_KERNEL_WGMMA, ks, 0, what);
        glayer_free(&h);
        ASSERT_OK_SO_FAR();
    }
}

/* No workspace: the split falls back to 1, same result. gate|up + bias with
 * every configuration in wgmma mode. */
TEST(w4a16_gemm, no_workspace_and_gate_up_configs) {
    NEED_GEMM();
    struct glayer h;
    glayer_make(&h, 2048, 2 * 1400, 128, 1, 1);
    ASSERT_OK_SO_FAR();
    gcheck(&h, 1, 300, 1, W4A16_KERNEL_WGMMA, 4, 1, "gate|up no workspace");
    for (int ci = 0; ci < 4 && !test_failed(); ci++) {
        ASSERT(w4a16_gemm_config(CFGS[ci][0], CFGS[ci][1], 2, 0) == 0);
        gcheck(&h, 1, 200, 1, W4A16_KERNEL_WGMMA, 0, 0, "gate|up cfg");
    }
    w4a16_gemm_config(0, 0, 0, 0);
    glayer_free(&h);
}

/* ---- Tuning sweep (not a check; runs only with AWQD_GEMM_SWEEP=1) --------
 * Times every tile configuration and split on Qwen3-8B's shapes against the
 * forced tc64 and dequantize + cuBLAS paths, single cold calls (L2 flushed by
 * a 256 MB memset before each), median of 9. Used to pick the dispatch's
 * crossovers and the cost model's constants (docs/PERFORMANCE.md). */
static float sweep_time(struct w4a16_weight *dw, const uint16_t *dx, int M, uint16_t *dy, int epi,
                        enum w4a16_kernel kern, int ks, void *ws, size_t wsb, void *flush, int *rc) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float v[9];
    char err[256];
    for (int i = 0; i < 11; i++) {
        cudaMemsetAsync(flush, i, (size_t)256 << 20, 0);
        cudaEventRecord(a, 0);
        *rc |= w4a16_linear_ex(dw, dx, M, dy, epi, kern, ks, ws, wsb, 0, err, sizeof err);
        cudaEventRecord(b, 0);
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (i >= 2) v[i - 2] = ms * 1000.f;
    }
    for (int i = 0; i < 9; i++) /* sort */
        for (int j = i + 1; j < 9; j++)
            if (v[j] < v[i]) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return v[4];
}

TEST(w4a16_gemm, sweep) {
    if (!getenv("AWQD_GEMM_SWEEP")) {
        TEST_SKIP("tuning sweep: set AWQD_GEMM_SWEEP=1");
        return;
    }
    NEED_GEMM();
    static const struct { const char *name; int k, n, gate_up; } sh[] = {
        {"qkv", 4096, 6144, 0}, {"o", 4096, 4096, 0}, {"gate_up", 4096, 24576, 1}, {"down", 12288, 4096, 0}};
    static const int ms[] = {64, 128, 256, 512, 1024, 2048, 4096};
    static const int kss[] = {1, 2, 3, 4, 6, 8};
    const char *only = getenv("AWQD_GEMM_SWEEP_SHAPE");
    void *flush = NULL, *ws = NULL;
    uint16_t *dx = NULL, *dy = NULL;
    const size_t wsb = (size_t)1 << 30;
    GCK(cudaMalloc(&flush, (size_t)256 << 20));
    GCK(cudaMalloc(&ws, wsb));
    GCK(cudaMalloc((void **)&dx, (size_t)4096 * 12288 * 2));
    GCK(cudaMalloc((void **)&dy, (size_t)4096 * 24576 * 2));
    GCK(cudaMemset(dx, 0x3c, (size_t)4096 * 12288 * 2)); /* x = ~1.0: finite sums */
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int s = 0; s < 4; s++) {
        if (only && strcmp(only, sh[s].name)) continue;
        struct awq_linear l;
        size_t nq = (size_t)sh[s].k * (sh[s].n / 8), ns = (size_t)(sh[s].k / 128) * sh[s].n;
        uint32_t *qw = malloc(nq * 4), *qz = malloc(ns / 8 * 4);
        uint16_t *sc = malloc(ns * 2);
        ASSERT(qw && qz && sc);
        for (size_t i = 0; i < nq; i++) qw[i] = grnd() ^ (grnd() << 16);
        for (size_t i = 0; i < ns / 8; i++) qz[i] = grnd() ^ (grnd() << 16);
        for (size_t i = 0; i < ns; i++) sc[i] = h_from_f(0.001f);
        memset(&l, 0, sizeof l);
        l.k = sh[s].k;
        l.n = sh[s].n;
        l.group = 128;
        l.qweight = qw;
        l.qzeros = qz;
        l.scales = sc;
        struct w4a16_weight *dw = NULL;
        char err[256];
        ASSERT(w4a16_upload(&l, sh[s].gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &dw, err, sizeof err) == 0);
        const int epi = sh[s].gate_up ? W4A16_EPI_SILU_MUL : 0;
        printf("sweep %-8s workspace for max_m 4096: %.1f MB (automatic dispatch as configured)\n", sh[s].name,
               w4a16_workspace_bytes(dw, 4096) / 1e6);
        for (int mi = 0; mi < 7; mi++) {
            const int M = ms[mi];
            int rc = 0;
            enum w4a16_kernel ak;
            int aks;
            w4a16_choice(dw, M, &ak, &aks);
            struct w4a16_gemm_args ga;
            memset(&ga, 0, sizeof ga);
            struct w4a16_dims dims; /* the device layout's tiles and chunks */
            ASSERT(w4a16_dims_of(l.k, l.n, l.group, sh[s].gate_up, &dims) == 0);
            ga.n16 = dims.n16;
            ga.n16a = dims.n16a;
            ga.kc = dims.kc;
            ga.m = M;
            ga.sms = sms;
            ga.cnt_len = 4096;
            int amt, abn, aks2, amode;
            w4a16_gemm_choice(&ga, &amt, &abn, &aks2, &amode);
            float t_auto = sweep_time(dw, dx, M, dy, epi, W4A16_KERNEL_AUTO, 0, ws, wsb, flush, &rc);
            float t_tc = sweep_time(dw, dx, M, dy, epi, W4A16_KERNEL_TC64, 0, ws, wsb, flush, &rc);
            float t_cb = sweep_time(dw, dx, M, dy, epi, W4A16_KERNEL_CUBLAS, 0, ws, wsb, flush, &rc);
            printf("sweep %-8s M=%-5d auto(kern %d ks %d; gemm %dx%d ks %d) %8.2f us  tc64 %8.2f  deq+cublas %8.2f\n",
                   sh[s].name, M, (int)ak, aks, amt, abn, aks2, t_auto, t_tc, t_cb);
            float best = 1e30f;
            int bc = -1, bk = 0;
            for (int ci = 0; ci < 4; ci++) {
                printf("  %dx%-3d", CFGS[ci][0], CFGS[ci][1]);
                for (int ki = 0; ki < 6; ki++) {
                    const int tiles = (ga.n16 + 8 * CFGS[ci][0] - 1) / (8 * CFGS[ci][0]) *
                                      ((M + CFGS[ci][1] - 1) / CFGS[ci][1]);
                    if (kss[ki] > 1 && tiles * kss[ki] > 4 * sms) {
                        printf("        -");
                        continue;
                    }
                    /* session-3 kernel (cluster split) / warp-specialized kernel */
                    w4a16_gemm_config(CFGS[ci][0], CFGS[ci][1], kss[ki], 0);
                    float t = sweep_time(dw, dx, M, dy, epi, W4A16_KERNEL_WGMMA, 0, ws, wsb, flush, &rc);
                    printf(" %8.2f", t);
                    if (kss[ki] <= 8) {
                        w4a16_gemm_config(CFGS[ci][0], CFGS[ci][1], kss[ki], 3);
                        float t2 = sweep_time(dw, dx, M, dy, epi, W4A16_KERNEL_WGMMA, 0, ws, wsb, flush, &rc);
                        printf("/%-7.2f", t2);
                        if (t2 < t) t = t2;
                    }
                    if (t < best) {
                        best = t;
                        bc = ci;
                        bk = kss[ki];
                    }
                }
                printf("\n");
            }
            w4a16_gemm_config(0, 0, 0, 0);
            printf("  best %dx%d ks %d %.2f us (auto %.2f)%s\n", bc >= 0 ? CFGS[bc][0] : 0,
                   bc >= 0 ? CFGS[bc][1] : 0, bk, best, t_auto, rc ? "  ERRORS" : "");
            fflush(stdout);
            ASSERT_MSG(rc == 0, "sweep %s M=%d: a call failed", sh[s].name, M);
        }
        w4a16_free(dw);
        free(qw);
        free(qz);
        free(sc);
    }
    cudaFree(flush);
    cudaFree(ws);
    cudaFree(dx);
    cudaFree(dy);
}

/* ---- Layout diagnosis (not a check; runs only with AWQD_GEMM_DIAG=1) -----
 * x = identity (token n has x[n][k] = 1 at k = n), W = 0 except one weight
 * (k0, c0) = 1, so y[n][c] = W[n][c] has a single 1 at token k0, column c0.
 * Prints where each mode puts it (a wrong x permutation moves the token, a
 * wrong A/D fragment mapping the column). */
TEST(w4a16_gemm, diag) {
    if (!getenv("AWQD_GEMM_DIAG")) {
        TEST_SKIP("layout diagnosis: set AWQD_GEMM_DIAG=1");
        return;
    }
    NEED_GEMM();
    const int K = 64, N = 64, G = 64, M = 64;
    static const int probes[][2] = {{0, 0}, {1, 0}, {2, 0}, {4, 0}, {16, 0}, {17, 3}, {33, 9}, {63, 15}, {5, 40}};
    uint16_t *hx = calloc((size_t)M * K, 2), *hy = malloc((size_t)M * N * 2), *dx = NULL, *dy = NULL;
    ASSERT(hx && hy);
    for (int n = 0; n < M; n++) hx[(size_t)n * K + n] = h_from_f(1.f);
    GCK(cudaMalloc((void **)&dx, (size_t)M * K * 2));
    GCK(cudaMalloc((void **)&dy, (size_t)M * N * 2));
    GCK(cudaMemcpy(dx, hx, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    for (int pi = 0; pi < 9; pi++) {
        const int k0 = probes[pi][0], c0 = probes[pi][1];
        uint32_t qw[64 * 8], qz[8];
        uint16_t sc[64];
        for (int i = 0; i < 64 * 8; i++) qw[i] = 0x88888888u;
        for (int i = 0; i < 8; i++) qz[i] = 0x88888888u;
        for (int i = 0; i < 64; i++) sc[i] = h_from_f(1.f);
        qw[k0 * 8 + c0 / 8] = (qw[k0 * 8 + c0 / 8] & ~(15u << (4 * REF_AWQ_ORDER[c0 % 8]))) | (9u << (4 * REF_AWQ_ORDER[c0 % 8]));
        struct awq_linear l;
        memset(&l, 0, sizeof l);
        l.k = K;
        l.n = N;
        l.group = G;
        l.qweight = qw;
        l.qzeros = qz;
        l.scales = sc;
        struct w4a16_weight *dw = NULL;
        char err[256];
        ASSERT(w4a16_upload(&l, W4A16_LAYOUT_PLAIN, &dw, err, sizeof err) == 0);
        for (int mode = 1; mode >= 0; mode--) {
            w4a16_gemm_config(1, 64, 1, mode);
            GCK(cudaMemset(dy, 0, (size_t)M * N * 2));
            int rc = w4a16_linear_ex(dw, dx, M, dy, 0, W4A16_KERNEL_WGMMA, 0, NULL, 0, 0, err, sizeof err);
            cudaError_t e = cudaDeviceSynchronize();
            GCK(cudaMemcpy(hy, dy, (size_t)M * N * 2, cudaMemcpyDeviceToHost));
            printf("diag probe W[k=%d][c=%d] %s rc=%d %s:", k0, c0, mode ? "mma.sync" : "wgmma", rc,
                   cudaGetErrorString(e));
            int shown = 0;
            for (int i = 0; i < M * N && shown < 8; i++)
                if (f_from_h(hy[i]) != 0.f) {
                    printf(" y[%d][%d]=%g", i / N, i % N, f_from_h(hy[i]));
                    shown++;
                }
            printf("\n");
        }
        w4a16_gemm_config(0, 0, 0, 0);
        w4a16_free(dw);
    }
    fflush(stdout);
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
}
