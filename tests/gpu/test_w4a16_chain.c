/* test_w4a16_chain.c — the persistent o -> add + RMSNorm -> gate|up -> down
 * kernel (kernels/cuda/w4a16_chain.h) against a CPU reference of the same
 * arithmetic, on awkward and real shapes.
 *
 * Reference (double, from the same fp16 inputs, the weights dequantized
 * exactly by tests/gpu/w4a16_ref.h): yo = fp16(x @ Wo); rout = fp16(rin +
 * yo); a = fp16(w * (rout * rsqrt(mean(rout^2) + eps))); act = fp16(silu(a
 * @ Wg) * (a @ Wu)); y = act @ Wd.
 *
 * Bounds (stated, not tuned): rout within 2^-10 (|yo| + |rout|) + 2^-12
 * max|yo| of the reference (yo is an fp32 sum in another order and may
 * round one ulp the other way before the residual add); y within
 * 5e-3 * max|y_ref|: the kernel's fp32 sums are exact to ~K 2^-24, the
 * fp16 roundings of yo, a and act in the chain may each land one ulp (2^-11
 * relative) from the reference's where the exact value sits near a
 * rounding boundary, and y itself is rounded (2^-11); with random signs
 * that is ~2e-3 of the output scale, 5e-3 with margin. Every output must be
 * written (poisoned with NaN first), two calls and a graph replay must be
 * bitwise equal, rin must be left untouched, and no grid-wide wait may time
 * out.
 *
 * rout's bound also has an absolute term, 2^-12 max|yo|: the chain sums
 * (1024 + q) x per group and takes (1024 + z) X back out in fp32, an error
 * on the scale of the largest outputs that a column with |yo| near 0
 * cannot absorb in a relative bound (session 33: one data set — the
 * Qwen3-8B shape drawn in sequence after the four cases of
 * matches_reference — put 2 of 4096 values past the relative bound alone,
 * at 8 and 16 ring stages; an fp32 emulation of that arithmetic on the same
 * data puts yo's error at 1.2e-5 max|yo|, the decode kernel's second mma
 * (its form to session 33) 6.3e-6, exact codes (q - z, its form since)
 * 2.2e-7: docs/PERFORMANCE.md "Session 33" item 8).
 *
 * Data: each case draws its own, seeded by its shape, so a case does not
 * depend on which ran before it. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_chain.h"
#include "tests/gpu/w4a16_ref.h"
#include "tests/harness/test.h"

static uint64_t ch_rng = 0x2545f4914f6cdd1dull;
static uint32_t ch_rnd(void) {
    ch_rng ^= ch_rng << 13;
    ch_rng ^= ch_rng >> 7;
    ch_rng ^= ch_rng << 17;
    return (uint32_t)(ch_rng >> 16);
}
static float ch_unit(void) { return ref_unit(ch_rnd); }

#define CK(call) do { cudaError_t e_ = (call); ASSERT_MSG(e_ == cudaSuccess, "%s: %s", #call, \
                                                          cudaGetErrorString(e_)); } while (0)

static int have_sm90(void) {
    int n = 0, major = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    return major >= 9;
}

/* out[N] = x[K] @ w[K][N] in double, x given as doubles */
static void mv(const float *w, const double *x, int K, int N, double *out) {
    for (int n = 0; n < N; n++) out[n] = 0;
    for (int k = 0; k < K; k++) {
        if (x[k] == 0) continue;
        const float *wr = w + (size_t)k * N;
        for (int n = 0; n < N; n++) out[n] += x[k] * wr[n];
    }
}

static double rh(double v) { return f_from_h(h_from_f((float)v)); } /* round to fp16 */

/* want_stages: the ring depth the plan must have chosen (0: any) */
static void chain_case_s(int KO, int H, int I, int want_stages) {
    ch_rng = 0x2545f4914f6cdd1dull ^ ((uint64_t)KO << 40 | (uint64_t)H << 20 | (uint64_t)I); /* the shape's data */
    struct ref_layer lo, lg, ld;
    ASSERT(ref_layer_make(&lo, KO, H, 128, 0, ch_rnd) == 0);
    ASSERT(ref_layer_make(&lg, H, 2 * I, 128, 0, ch_rnd) == 0);
    ASSERT(ref_layer_make(&ld, I, H, 128, 0, ch_rnd) == 0);
    struct w4a16_weight *wo = NULL, *wg = NULL, *wd = NULL;
    char err[256] = "";
    ASSERT_MSG(w4a16_upload(&lo.l, W4A16_LAYOUT_PLAIN, &wo, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(w4a16_upload(&lg.l, W4A16_LAYOUT_GATE_UP, &wg, err, sizeof err) == 0, "%s", err);
    ASSERT_MSG(w4a16_upload(&ld.l, W4A16_LAYOUT_PLAIN, &wd, err, sizeof err) == 0, "%s", err);
    struct w4a16_chain *ch = NULL;
    int rc = w4a16_chain_create(wo, wg, wd, &ch, err, sizeof err);
    ASSERT_MSG(rc == 0, "KO=%d H=%d I=%d: create rc %d: %s", KO, H, I, rc, err);
    if (want_stages) {
        int stages = 0;
        w4a16_chain_describe(ch, NULL, &stages, NULL);
        ASSERT_MSG(stages == want_stages, "stages %d, want %d", stages, want_stages);
    }

    uint16_t *hx = malloc((size_t)KO * 2), *hr = malloc((size_t)H * 2), *hw = malloc((size_t)H * 2);
    uint16_t *out[3], *rout = malloc((size_t)H * 2), *rin2 = malloc((size_t)H * 2);
    for (int i = 0; i < 3; i++) out[i] = malloc((size_t)H * 2);
    ASSERT(hx && hr && hw && out[0] && out[1] && out[2] && rout && rin2);
    for (int i = 0; i < KO; i++) hx[i] = h_from_f(2.f * ch_unit() - 1.f);
    for (int i = 0; i < H; i++) {
        hr[i] = h_from_f(4.f * ch_unit() - 2.f);
        hw[i] = h_from_f(0.5f + ch_unit());
    }
    uint16_t *dx, *dr, *dw, *drout, *dy;
    CK(cudaMalloc((void **)&dx, (size_t)KO * 2));
    CK(cudaMalloc((void **)&dr, (size_t)H * 2));
    CK(cudaMalloc((void **)&dw, (size_t)H * 2));
    CK(cudaMalloc((void **)&drout, (size_t)H * 2));
    CK(cudaMalloc((void **)&dy, (size_t)H * 2));
    CK(cudaMemcpy(dx, hx, (size_t)KO * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dr, hr, (size_t)H * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, (size_t)H * 2, cudaMemcpyHostToDevice));
    const float eps = 1e-6f;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaMemset(dy, 0xff, (size_t)H * 2));
        CK(cudaMemset(drout, 0xff, (size_t)H * 2));
        if (rep < 2) {
            rc = w4a16_chain_run(ch, dx, dr, dw, eps, drout, dy, s, err, sizeof err);
            ASSERT_MSG(rc == 0, "run rc %d: %s", rc, err);
        } else { /* captured into a graph, replayed twice */
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            rc = w4a16_chain_run(ch, dx, dr, dw, eps, drout, dy, s, err, sizeof err);
            CK(cudaStreamEndCapture(s, &g));
            ASSERT_MSG(rc == 0, "captured run rc %d: %s", rc, err);
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
        }
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(out[rep], dy, (size_t)H * 2, cudaMemcpyDeviceToHost));
        if (rep == 0) CK(cudaMemcpy(rout, drout, (size_t)H * 2, cudaMemcpyDeviceToHost));
    }
    ASSERT_MSG(w4a16_chain_error(ch) == 0, "KO=%d H=%d I=%d: a grid-wide wait timed out", KO, H, I);
    CK(cudaMemcpy(rin2, dr, (size_t)H * 2, cudaMemcpyDeviceToHost));
    ASSERT_MSG(memcmp(rin2, hr, (size_t)H * 2) == 0, "rin was modified");
    ASSERT_MSG(memcmp(out[0], out[1], (size_t)H * 2) == 0, "KO=%d H=%d I=%d: two calls differ", KO, H, I);
    ASSERT_MSG(memcmp(out[0], out[2], (size_t)H * 2) == 0, "KO=%d H=%d I=%d: the graph replay differs", KO, H, I);

    /* the reference */
    float *fo = ref_dequant(&lo.l), *fg = ref_dequant(&lg.l), *fd = ref_dequant(&ld.l);
    double *xv = malloc(sizeof(double) * (KO > H ? (KO > I ? KO : I) : (H > I ? H : I)));
    double *yo = malloc(sizeof(double) * H), *gu = malloc(sizeof(double) * 2 * I), *y = malloc(sizeof(double) * H);
    double *hv = malloc(sizeof(double) * H);
    ASSERT(fo && fg && fd && xv && yo && gu && y && hv);
    for (int k = 0; k < KO; k++) xv[k] = f_from_h(hx[k]);
    mv(fo, xv, KO, H, yo);
    double ss = 0, yomax = 0;
    int rbad = 0;
    for (int n = 0; n < H; n++) yomax = fmax(yomax, fabs(yo[n]));
    for (int n = 0; n < H; n++) {
        hv[n] = rh(f_from_h(hr[n]) + rh(yo[n]));
        const double got = f_from_h(rout[n]);
        /* fp16(yo) one ulp off (2^-10 |yo|) moves rin + yo by that much, then
         * the sum rounds (2^-11 |rout|); yo's own fp32 error is absolute
         * (the header) */
        if (fabs(got - hv[n]) > (fabs(yo[n]) + fabs(hv[n])) * (1.0 / 1024) + yomax * (1.0 / 4096) + 1e-7) rbad++;
        ss += hv[n] * hv[n];
    }
    ASSERT_MSG(rbad == 0, "KO=%d H=%d I=%d: %d of rout off by more than a rounding of yo", KO, H, I, rbad);
    const double rr = 1.0 / sqrt(ss / H + eps);
    for (int n = 0; n < H; n++) xv[n] = rh(f_from_h(hw[n]) * (hv[n] * rr));
    mv(fg, xv, H, 2 * I, gu);
    for (int j = 0; j < I; j++) xv[j] = rh(gu[j] / (1 + exp(-gu[j])) * gu[I + j]);
    mv(fd, xv, I, H, y);
    double maxref = 0, maxerr = 0;
    for (int n = 0; n < H; n++) {
        const double v = f_from_h(out[0][n]);
        ASSERT_MSG(!isnan(v), "KO=%d H=%d I=%d: y[%d] not written", KO, H, I, n);
        maxref = fmax(maxref, fabs(y[n]));
        const double e = fabs(v - y[n]);
        maxerr = test_err_max(maxerr, e);
    }
    ASSERT_MSG(maxref > 0 && maxerr <= 5e-3 * maxref, "KO=%d H=%d I=%d: max|y - ref| %.4g > 5e-3 * %.4g",
               KO, H, I, maxerr, maxref);
    free(fo), free(fg), free(fd), free(xv), free(yo), free(gu), free(y), free(hv);
    for (int i = 0; i < 3; i++) free(out[i]);
    free(hx), free(hr), free(hw), free(rout), free(rin2);
    cudaFree(dx), cudaFree(dr), cudaFree(dw), cudaFree(drout), cudaFree(dy);
    cudaStreamDestroy(s);
    w4a16_chain_free(ch);
    w4a16_free(wo), w4a16_free(wg), w4a16_free(wd);
    ref_layer_free(&lo), ref_layer_free(&lg), ref_layer_free(&ld);
}

static void chain_case(int KO, int H, int I) { chain_case_s(KO, H, I, 0); }

/* fewer items than blocks in every phase; uneven shares; the tp = 4 rank
 * proxy of qwen3-32b; Qwen3-8B */
TEST(w4a16_chain, matches_reference) {
    if (!have_sm90()) TEST_SKIP("needs an sm_90 device");
    static const int shp[][3] = {{256, 384, 640}, {1024, 1152, 1408}, {2048, 5120, 6400}, {4096, 4096, 12288}};
    for (int i = 0; i < (int)(sizeof shp / sizeof shp[0]) && !test_failed(); i++)
        chain_case(shp[i][0], shp[i][1], shp[i][2]);
}

/* the shallowest ring (AWQD_CHAIN_STAGES=8: one stage a pair, refilled as
 * soon as both warps hold it): each stage's rounds in order */
TEST(w4a16_chain, one_stage_a_pair) {
    if (!have_sm90()) TEST_SKIP("needs an sm_90 device");
    setenv("AWQD_CHAIN_STAGES", "8", 1);
    chain_case_s(1024, 1152, 1408, 8);
    if (!test_failed()) chain_case_s(4096, 4096, 12288, 8);
    unsetenv("AWQD_CHAIN_STAGES");
}

TEST(w4a16_chain, refuses_what_it_cannot_run) {
    if (!have_sm90()) TEST_SKIP("needs an sm_90 device");
    struct ref_layer a, b;
    ASSERT(ref_layer_make(&a, 256, 384, 128, 0, ch_rnd) == 0);
    ASSERT(ref_layer_make(&b, 384, 1280, 128, 0, ch_rnd) == 0);
    struct w4a16_weight *wa = NULL, *wb = NULL, *wbp = NULL;
    char err[256] = "";
    ASSERT(w4a16_upload(&a.l, W4A16_LAYOUT_PLAIN, &wa, err, sizeof err) == 0);
    ASSERT(w4a16_upload(&b.l, W4A16_LAYOUT_GATE_UP, &wb, err, sizeof err) == 0);
    ASSERT(w4a16_upload(&b.l, W4A16_LAYOUT_PLAIN, &wbp, err, sizeof err) == 0);
    struct w4a16_chain *ch = NULL;
    /* down must be inter -> H: a (256 -> 384) is not 640 -> 384 */
    ASSERT(w4a16_chain_create(wa, wb, wa, &ch, err, sizeof err) == -ENOTSUP && !ch && strstr(err, "chain"));
    /* gate|up must have the gate|up layout */
    ASSERT(w4a16_chain_create(wa, wbp, wa, &ch, err, sizeof err) == -ENOTSUP && !ch);
    w4a16_free(wa), w4a16_free(wb), w4a16_free(wbp);
    ref_layer_free(&a), ref_layer_free(&b);
}
