/* test_cpu_ops.c — the CPU reference backend op by op against naive math
 * written here: W4A16 linear on AutoAWQ's packing vectors, RMSNorm with the
 * residual, q/k norm + RoPE + KV write, paged attention over scrambled block
 * tables, gate|up linear + SiLU·mul, embedding and lm_head with vocab ranges, threads giving
 * bit-identical results, and the in-process all-reduce. */
#include "tests/harness/test.h"

#include <math.h>
#include <pthread.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/safetensors.h"
#include "kernels/ops.h"

static float frand(unsigned *s) { return (float)rand_r(s) / RAND_MAX * 2.0f - 1.0f; }

static struct buf *mk(struct ops *o, enum buf_kind k, const void *src, size_t n) {
    struct buf *b = o->alloc(o->ctx, k, n);
    if (b && src) o->upload(o->ctx, b, 0, src, n);
    return b;
}

static float *get(struct ops *o, const struct buf *b, size_t n) {
    float *h = malloc(n * sizeof *h);
    o->download(o->ctx, h, b, 0, n);
    return h;
}

static float h2f(uint16_t h) { /* fp16 normal/zero only (test data) */
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e ? ldexpf(1.0f + m / 1024.0f, e - 15) : ldexpf(m / 1024.0f, -14);
    return (h & 0x8000) ? -v : v;
}

static uint16_t f2h_simple(float f) { /* round to fp16, normal range only */
    if (f == 0) return 0;
    uint16_t sign = f < 0 ? 0x8000 : 0;
    f = fabsf(f);
    int e;
    float m = frexpf(f, &e); /* f = m * 2^e, m in [0.5, 1) */
    int he = e - 1 + 15;
    int mant = (int)lrintf((m * 2 - 1) * 1024);
    if (mant == 1024) mant = 0, he++;
    return sign | (uint16_t)(he << 10) | (uint16_t)mant;
}

TEST(cpu_ops, linear_matches_autoawq_dequant) {
    struct safetensors *st;
    char err[256];
    if (safetensors_open(test_fixture("awq-pack-vectors.safetensors"), &st, err, sizeof err))
        TEST_SKIP("awq-pack-vectors.safetensors not available");
    struct ops *o;
    ASSERT_EQ_INT(ops_cpu_create(2, &o, err, sizeof err), 0);
    const char *names[3] = {"a", "b", "c"};
    unsigned seed = 1;
    for (int li = 0; li < 3; li++) {
        char nm[64];
        snprintf(nm, sizeof nm, "%s.qweight", names[li]);
        const struct st_tensor *qw = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.qzeros", names[li]);
        const struct st_tensor *qz = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.scales", names[li]);
        const struct st_tensor *sc = safetensors_find(st, nm);
        snprintf(nm, sizeof nm, "%s.dequant", names[li]);
        const struct st_tensor *dq = safetensors_find(st, nm);
        ASSERT(qw && qz && sc && dq);
        int K = (int)qw->shape[0], N = (int)sc->shape[1];
        uint16_t *bias = malloc((size_t)N * sizeof *bias);
        for (int j = 0; j < N; j++) bias[j] = f2h_simple(frand(&seed));
        struct awq_linear l = {K, N, 128, qw->data, qz->data, sc->data, li == 1 ? bias : NULL};
        struct op_linear *ol = o->upload_linear(o->ctx, &l, LINEAR_PLAIN);
        ASSERT(ol);
        int M = 5;
        float *x = malloc((size_t)M * K * sizeof *x);
        for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
        struct buf *bx = mk(o, BUF_ACT, x, (size_t)M * K), *by = mk(o, BUF_ACT, NULL, (size_t)M * N);
        o->linear(o->ctx, by, bx, M, ol);
        float *y = get(o, by, (size_t)M * N);
        const uint16_t *d = dq->data;
        double maxabs = 0, maxerr = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = l.bias ? h2f(bias[j]) : 0;
                for (int k = 0; k < K; k++) ref += (double)x[i * K + k] * h2f(d[(size_t)k * N + j]);
                maxabs = fmax(maxabs, fabs(ref));
                maxerr = test_err_max(maxerr, fabs(ref - y[i * N + j]));
            }
        /* same fp16 weights as AutoAWQ's dequant: only fp32 summation order differs */
        ASSERT_MSG(maxerr <= 1e-5 * maxabs, "layer %s: max error %g of %g", names[li], maxerr, maxabs);
        free(y);
        free(x);
        free(bias);
        o->free(o->ctx, bx);
        o->free(o->ctx, by);
        o->free_linear(o->ctx, ol);
    }
    ops_destroy(o);
    safetensors_close(st);
}

/* Random AWQ packing of a K x N linear, group 128: qweight [K, N / 8],
 * qzeros [K / 128, N / 8] (any nibbles), scales [K / 128, N] in [0.01, 0.03). */
static void rand_awq(unsigned *seed, int K, int N, uint32_t *qw, uint32_t *qz, uint16_t *sc) {
    for (int i = 0; i < K * N / 8; i++) qw[i] = (uint32_t)rand_r(seed) * 2654435761u;
    for (int i = 0; i < K / 128 * N / 8; i++) qz[i] = (uint32_t)rand_r(seed) * 2654435761u;
    for (int i = 0; i < K / 128 * N; i++) sc[i] = f2h_simple(0.01f + 0.01f * (frand(seed) + 1));
}

/* gate|up linear + SiLU·mul == silu(plain linear of the gate columns) *
 * plain linear of the up columns, with biases. */
TEST(cpu_ops, linear_silu_mul_matches_plain_linear) {
    char err[128];
    struct ops *o;
    ASSERT_EQ_INT(ops_cpu_create(2, &o, err, sizeof err), 0);
    enum { K = 128, I = 24, N = 2 * I, M = 3 };
    unsigned seed = 13;
    uint32_t qw[K * N / 8], qz[N / 8];
    uint16_t sc[N], bias[N];
    rand_awq(&seed, K, N, qw, qz, sc);
    for (int i = 0; i < N; i++) bias[i] = f2h_simple(frand(&seed));
    struct awq_linear l = {K, N, 128, qw, qz, sc, bias};
    struct op_linear *plain = o->upload_linear(o->ctx, &l, LINEAR_PLAIN);
    struct op_linear *gu = o->upload_linear(o->ctx, &l, LINEAR_GATE_UP);
    ASSERT(plain && gu);
    float x[M * K];
    for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
    struct buf *bx = mk(o, BUF_ACT, x, M * K), *by = mk(o, BUF_ACT, NULL, M * N),
               *bs = mk(o, BUF_ACT, NULL, M * I);
    o->linear(o->ctx, by, bx, M, plain);
    o->linear_silu_mul(o->ctx, bs, bx, M, gu);
    float *y = get(o, by, M * N), *s = get(o, bs, M * I);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < I; j++) {
            double g = y[i * N + j], u = y[i * N + I + j];
            ASSERT_NEAR(s[i * I + j], g / (1 + exp(-g)) * u, 1e-5 * (1 + fabs(g * u)));
        }
    free(y);
    free(s);
    o->free(o->ctx, bx);
    o->free(o->ctx, by);
    o->free(o->ctx, bs);
    o->free_linear(o->ctx, plain);
    o->free_linear(o->ctx, gu);
    ops_destroy(o);
}

/* add_rmsnorm_linear: out of place, bitwise add_rmsnorm then the linear (plain
 * and gate|up, with and without delta) for n = 1, 2; -ENOTSUP (nothing
 * written) for n = 3, as on CUDA */
TEST(cpu_ops, add_rmsnorm_linear_is_the_two_ops) {
    char err[128];
    struct ops *o;
    ASSERT_EQ_INT(ops_cpu_create(1, &o, err, sizeof err), 0);
    enum { K = 256, I = 24, N = 2 * I, M = 3 };
    unsigned seed = 29;
    uint32_t qw[K * N / 8], qz[K / 128 * N / 8];
    uint16_t sc[K / 128 * N], gw[K];
    rand_awq(&seed, K, N, qw, qz, sc);
    for (int i = 0; i < K; i++) gw[i] = f2h_simple(0.5f + 0.5f * (frand(&seed) + 1));
    struct awq_linear l = {K, N, 128, qw, qz, sc, NULL};
    struct op_linear *lin[2] = {o->upload_linear(o->ctx, &l, LINEAR_PLAIN),
                                o->upload_linear(o->ctx, &l, LINEAR_GATE_UP)};
    ASSERT(lin[0] && lin[1]);
    float h[M * K], d[M * K];
    for (int i = 0; i < M * K; i++) h[i] = 2 * frand(&seed), d[i] = frand(&seed);
    struct buf *bw = mk(o, BUF_W16, gw, K);
    for (int gu = 0; gu < 2; gu++)
        for (int wd = 0; wd < 2; wd++)
            for (int n = 1; n <= M; n++) {
                const int oc = gu ? I : N;
                struct buf *rin = mk(o, BUF_ACT, h, M * K), *dl = mk(o, BUF_ACT, d, M * K);
                struct buf *rout = mk(o, BUF_ACT, NULL, M * K), *y = mk(o, BUF_ACT, NULL, M * N);
                struct buf *r2 = mk(o, BUF_ACT, h, M * K), *x2 = mk(o, BUF_ACT, NULL, M * K);
                struct buf *y2 = mk(o, BUF_ACT, NULL, M * N);
                int rc = o->add_rmsnorm_linear(o->ctx, rin, wd ? dl : NULL, rout, bw, n, K, 1e-6f,
                                               y, lin[gu]);
                float *gr = get(o, rout, M * K), *gy = get(o, y, M * N), *gi = get(o, rin, M * K);
                ASSERT(!memcmp(gi, h, sizeof h)); /* rin untouched */
                if (n > 2) {
                    ASSERT_EQ_INT(rc, -ENOTSUP);
                    for (int i = 0; i < M * K; i++) ASSERT(gr[i] == 0.0f); /* nothing written */
                } else {
                    ASSERT_EQ_INT(rc, 0);
                    o->add_rmsnorm(o->ctx, r2, wd ? dl : NULL, x2, bw, n, K, 1e-6f);
                    if (gu) o->linear_silu_mul(o->ctx, y2, x2, n, lin[1]);
                    else o->linear(o->ctx, y2, x2, n, lin[0]);
                    float *er = get(o, r2, M * K), *ey = get(o, y2, M * N);
                    ASSERT_MSG(!memcmp(gr, er, sizeof(float) * n * K), "gu %d delta %d n %d: resid", gu,
                               wd, n);
                    ASSERT_MSG(!memcmp(gy, ey, sizeof(float) * n * oc), "gu %d delta %d n %d: y", gu,
                               wd, n);
                    free(er);
                    free(ey);
                }
                free(gr);
                free(gy);
                free(gi);
                struct buf *all[] = {rin, dl, rout, y, r2, x2, y2};
                for (int i = 0; i < 7; i++) o->free(o->ctx, all[i]);
            }
    o->free(o->ctx, bw);
    o->free_linear(o->ctx, lin[0]);
    o->free_linear(o->ctx, lin[1]);
    ops_destroy(o);
}

TEST(cpu_ops, threads_are_bit_identical) {
    char err[128];
    struct ops *o1, *o4;
    ASSERT_EQ_INT(ops_cpu_create(1, &o1, err, sizeof err), 0);
    ASSERT_EQ_INT(ops_cpu_create(4, &o4, err, sizeof err), 0);
    enum { K = 256, N = 136, M = 7 };
    unsigned seed = 3;
    uint32_t *qw = malloc(K * N / 8 * 4), *qz = malloc(2 * N / 8 * 4);
    uint16_t *sc = malloc(2 * N * 2);
    for (int i = 0; i < K * N / 8; i++) qw[i] = (uint32_t)rand_r(&seed) * 2654435761u;
    for (int i = 0; i < 2 * N / 8; i++) qz[i] = (uint32_t)rand_r(&seed) * 2654435761u;
    for (int i = 0; i < 2 * N; i++) sc[i] = f2h_simple(0.01f + 0.02f * (frand(&seed) + 1));
    struct awq_linear l = {K, N, 128, qw, qz, sc, NULL};
    float x[M * K];
    for (int i = 0; i < M * K; i++) x[i] = frand(&seed);
    float *y[2];
    struct ops *os[2] = {o1, o4};
    for (int t = 0; t < 2; t++) {
        struct ops *o = os[t];
        struct op_linear *ol = o->upload_linear(o->ctx, &l, LINEAR_PLAIN);
        struct buf *bx = mk(o, BUF_ACT, x, M * K), *by = mk(o, BUF_ACT, NULL, M * N);
        o->linear(o->ctx, by, bx, M, ol);
        y[t] = get(o, by, M * N);
        o->free(o->ctx, bx);
        o->free(o->ctx, by);
        o->free_linear(o->ctx, ol);
    }
    for (int i = 0; i < M * N; i++) ASSERT_MSG(y[0][i] == y[1][i], "element %d differs", i);
    free(y[0]);
    free(y[1]);
    free(qw);
    free(qz);
    free(sc);
    ops_destroy(o1);
    ops_destroy(o4);
}

TEST(cpu_ops, add_rmsnorm_embed_silu_lm_head) {
    char err[128];
    struct ops *o;
    ASSERT_EQ_INT(ops_cpu_create(2, &o, err, sizeof err), 0);
    enum { n = 3, D = 40, VR = 6 };
    unsigned seed = 5;
    float r[n * D], d[n * D];
    uint16_t w16[D], tab16[VR * D];
    for (int i = 0; i < n * D; i++) r[i] = frand(&seed), d[i] = frand(&seed);
    for (int i = 0; i < D; i++) w16[i] = f2h_simple(1 + 0.5f * frand(&seed));
    for (int i = 0; i < VR * D; i++) tab16[i] = f2h_simple(frand(&seed));
    struct buf *br = mk(o, BUF_ACT, r, n * D), *bd = mk(o, BUF_ACT, d, n * D),
               *bo = mk(o, BUF_ACT, NULL, n * D), *bw = mk(o, BUF_W16, w16, D);
    o->add_rmsnorm(o->ctx, br, bd, bo, bw, n, D, 1e-6f);
    float *nr = get(o, br, n * D), *no = get(o, bo, n * D);
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) {
            double v = (double)r[i * D + j] + d[i * D + j];
            ASSERT_NEAR(nr[i * D + j], v, 1e-6);
            ss += v * v;
        }
        double inv = 1 / sqrt(ss / D + 1e-6);
        for (int j = 0; j < D; j++)
            ASSERT_NEAR(no[i * D + j], (r[i * D + j] + d[i * D + j]) * inv * h2f(w16[j]), 1e-5);
    }
    free(nr);
    free(no);
    /* embedding of a vocab slice [10, 16): other ids give zeros */
    struct buf *tab = mk(o, BUF_W16, tab16, VR * D);
    int32_t ids[n] = {12, 3, 15};
    struct buf *bids = mk(o, BUF_I32, ids, n), *be = mk(o, BUF_ACT, NULL, n * D);
    o->embed(o->ctx, be, tab, bids, n, D, 10, VR);
    float *e = get(o, be, n * D);
    for (int j = 0; j < D; j++) {
        ASSERT_NEAR(e[j], h2f(tab16[2 * D + j]), 0);
        ASSERT_NEAR(e[D + j], 0, 0);
        ASSERT_NEAR(e[2 * D + j], h2f(tab16[5 * D + j]), 0);
    }
    free(e);
    /* lm_head on rows 2 and 0 */
    int32_t rows[2] = {2, 0};
    struct buf *brows = mk(o, BUF_I32, rows, 2), *bl = mk(o, BUF_F32, NULL, 2 * VR);
    o->lm_head(o->ctx, bl, bd, brows, 2, tab, D, VR);
    float *lg = get(o, bl, 2 * VR);
    for (int q = 0; q < 2; q++)
        for (int v = 0; v < VR; v++) {
            double ref = 0;
            for (int j = 0; j < D; j++) ref += (double)d[rows[q] * D + j] * h2f(tab16[v * D + j]);
            ASSERT_NEAR(lg[q * VR + v], ref, 1e-5);
        }
    free(lg);
    /* rows NULL: rows 0 and 1 */
    o->lm_head(o->ctx, bl, bd, NULL, 2, tab, D, VR);
    lg = get(o, bl, 2 * VR);
    for (int q = 0; q < 2; q++)
        for (int v = 0; v < VR; v++) {
            double ref = 0;
            for (int j = 0; j < D; j++) ref += (double)d[q * D + j] * h2f(tab16[v * D + j]);
            ASSERT_NEAR(lg[q * VR + v], ref, 1e-5);
        }
    free(lg);
    struct buf *all[] = {br, bd, bo, bw, tab, bids, be, brows, bl};
    for (int i = 0; i < 9; i++) o->free(o->ctx, all[i]);
    ops_destroy(o);
}

/* q/k norm + RoPE + KV write, then paged attention, against naive math on
 * two sequences with scrambled block tables and mixed past lengths. */
TEST(cpu_ops, rope_and_paged_attention) {
    char err[128];
    struct ops *o;
    ASSERT_EQ_INT(ops_cpu_create(2, &o, err, sizeof err), 0);
    enum { NH = 4, NKV = 2, HD = 8, BS = 4, NB = 12, MAXB = 6 };
    const int past[2] = {5, 0}, len[2] = {3, 6};
    const int32_t bt[2][MAXB] = {{7, 2, 9, 0, 0, 0}, {4, 11, 0, 0, 0, 0}};
    int n = len[0] + len[1];
    const int W = (NH + 2 * NKV) * HD;
    unsigned seed = 9;
    float inv[HD / 2];
    for (int j = 0; j < HD / 2; j++) inv[j] = powf(10000.0f, -2.0f * j / HD);
    uint16_t qn16[HD], kn16[HD];
    for (int i = 0; i < HD; i++) qn16[i] = f2h_simple(1 + 0.3f * frand(&seed)),
                                 kn16[i] = f2h_simple(1 + 0.3f * frand(&seed));
    /* full per-sequence histories of raw (pre-norm, pre-rope) q, k, v */
    int tot[2] = {past[0] + len[0], past[1] + len[1]};
    float hist[2][16][(NH + 2 * NKV) * HD];
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < tot[s]; t++)
            for (int i = 0; i < W; i++) hist[s][t][i] = frand(&seed);
    struct buf *kc = mk(o, BUF_ACT, NULL, NB * BS * NKV * HD), *vc = mk(o, BUF_ACT, NULL, NB * BS * NKV * HD);
    struct buf *binv = mk(o, BUF_F32, inv, HD / 2), *bqn = mk(o, BUF_W16, qn16, HD),
               *bkn = mk(o, BUF_W16, kn16, HD);
    /* step 1: write the past of sequence 0 (positions 0..4) as a prefill of its own */
    for (int step = 0; step < 2; step++) {
        int S = step == 0 ? 1 : 2;
        int32_t qs[3], pa[2], pos[16], slots[16], btab[2 * MAXB];
        float rows[16 * W];
        int r = 0;
        for (int s = 0; s < S; s++) {
            int p0 = step == 0 ? 0 : past[s], l = step == 0 ? past[0] : len[s];
            qs[s] = r;
            pa[s] = p0;
            for (int j = 0; j < MAXB; j++) btab[s * MAXB + j] = bt[s][j];
            for (int i = 0; i < l; i++, r++) {
                pos[r] = p0 + i;
                slots[r] = bt[s][pos[r] / BS] * BS + pos[r] % BS;
                for (int c = 0; c < W; c++) rows[r * W + c] = hist[s][pos[r]][c];
            }
        }
        qs[S] = r;
        struct buf *bqs = mk(o, BUF_I32, qs, S + 1), *bpa = mk(o, BUF_I32, pa, S),
                   *bbt = mk(o, BUF_I32, btab, S * MAXB), *bpos = mk(o, BUF_I32, pos, r),
                   *bsl = mk(o, BUF_I32, slots, r), *bqkv = mk(o, BUF_ACT, rows, r * W),
                   *bout = mk(o, BUF_ACT, NULL, r * NH * HD);
        struct attn_batch ab = {S, r, MAXB, BS, bqs, bpa, bbt, bpos, bsl, qs, pa, 0};
        o->qk_norm_rope_kv(o->ctx, bqkv, r, NH, NKV, HD, bqn, bkn, 1e-6f, binv, &ab, kc, vc);
        o->attention(o->ctx, bout, bqkv, NH, NKV, HD, 0.35f, &ab, kc, vc);
        if (step == 1) {
            ASSERT_EQ_INT(r, n);
            float *out = get(o, bout, r * NH * HD);
            /* naive: normalise + rotate every history row, attend causally */
            for (int s = 0; s < 2; s++) {
                static double K[16][NKV][HD], V[16][NKV][HD], Q[16][NH][HD];
                for (int t = 0; t < tot[s]; t++) {
                    for (int h = 0; h < NH + NKV; h++) {
                        const float *x = &hist[s][t][h * HD];
                        const uint16_t *wn = h < NH ? qn16 : kn16;
                        double ss = 0, y[HD];
                        for (int i = 0; i < HD; i++) ss += (double)x[i] * x[i];
                        double rr = 1 / sqrt(ss / HD + 1e-6);
                        for (int i = 0; i < HD; i++) y[i] = x[i] * rr * h2f(wn[i]);
                        double z[HD];
                        for (int i = 0; i < HD / 2; i++) {
                            double a = t * (double)inv[i];
                            z[i] = y[i] * cos(a) - y[i + HD / 2] * sin(a);
                            z[i + HD / 2] = y[i + HD / 2] * cos(a) + y[i] * sin(a);
                        }
                        for (int i = 0; i < HD; i++) {
                            if (h < NH) Q[t][h][i] = z[i];
                            else K[t][h - NH][i] = z[i];
                        }
                    }
                    for (int h = 0; h < NKV; h++)
                        for (int i = 0; i < HD; i++) V[t][h][i] = hist[s][t][(NH + NKV + h) * HD + i];
                }
                for (int i = 0; i < len[s]; i++) {
                    int p = past[s] + i, row = qs[s] + i;
                    for (int h = 0; h < NH; h++) {
                        int g = h / (NH / NKV);
                        double sc[16], mx = -1e30, sum = 0;
                        for (int t = 0; t <= p; t++) {
                            sc[t] = 0;
                            for (int d = 0; d < HD; d++) sc[t] += Q[p][h][d] * K[t][g][d];
                            sc[t] *= 0.35;
                            mx = fmax(mx, sc[t]);
                        }
                        for (int t = 0; t <= p; t++) sum += sc[t] = exp(sc[t] - mx);
                        for (int d = 0; d < HD; d++) {
                            double ref = 0;
                            for (int t = 0; t <= p; t++) ref += sc[t] / sum * V[t][g][d];
                            ASSERT_NEAR(out[row * NH * HD + h * HD + d], ref, 2e-5);
                        }
                    }
                }
            }
            free(out);
        }
        struct buf *fr[] = {bqs, bpa, bbt, bpos, bsl, bqkv, bout};
        for (int i = 0; i < 7; i++) o->free(o->ctx, fr[i]);
    }
    struct buf *fr[] = {kc, vc, binv, bqn, bkn};
    for (int i = 0; i < 5; i++) o->free(o->ctx, fr[i]);
    ops_destroy(o);
}

struct ar_arg {
    struct comm *c;
    struct ops *o;
    float *result;
    int rc;
};

static void *ar_thread(void *p) {
    struct ar_arg *a = p;
    enum { N = 1001 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(a->c->rank + 1) * (float)i;
    struct buf *b = mk(a->o, BUF_ACT, x, N);
    a->rc = a->c->all_reduce_sum(a->c, b, N);
    a->c->barrier(a->c);
    a->rc |= a->c->all_reduce_sum(a->c, b, 10); /* a second, smaller one */
    a->o->download(a->o->ctx, a->result, b, 0, N);
    a->o->free(a->o->ctx, b);
    return NULL;
}

TEST(cpu_ops, comm_group_all_reduce) {
    enum { R = 3, N = 1001 };
    struct comm *c[R];
    ASSERT_EQ_INT(comm_cpu_group(R, c), 0);
    char err[128];
    struct ops *o[R];
    pthread_t th[R];
    struct ar_arg a[R];
    static float res[R][N];
    for (int r = 0; r < R; r++) {
        ASSERT_EQ_INT(ops_cpu_create(1, &o[r], err, sizeof err), 0);
        a[r] = (struct ar_arg){c[r], o[r], res[r], 0};
        pthread_create(&th[r], NULL, ar_thread, &a[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++) {
        ASSERT_EQ_INT(a[r].rc, 0);
        for (int i = 0; i < N; i++) {
            float want = 6.0f * (float)i * (i < 10 ? 3 : 1);
            ASSERT_NEAR(res[r][i], want, 1e-3 * want);
        }
        comm_free(c[r]);
        ops_destroy(o[r]);
    }
    struct comm *one;
    ASSERT_EQ_INT(comm_cpu_single(&one), 0);
    ASSERT_EQ_INT(one->size, 1);
    comm_free(one);
}
