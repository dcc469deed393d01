/* test_graph_cuda.c — CUDA graphs of decode steps (ops->graph_*, the
 * fixed-split decode attention, padded buckets in engine/model.c).
 *
 * Claims and tolerances:
 *   - a replayed graph gives the same bits as the same ops run eagerly with
 *     the same batch (same n_seqs), for any contexts uploaded between
 *     replays (bitwise);
 *   - against the CPU backend: attention |d| <= 4e-3 (outputs are convex
 *     mixes of V, |V| <= 1), q/k/v and the KV cache |d| <= 4e-3 * max + 1e-3;
 *     padding rows (past -1, slot -1) give zeros and write no K/V;
 *   - a failed recording leaves the backend usable;
 *   - the model (qwen3-tiny fixture) with graphs vs AWQD_CUDA_GRAPHS=0:
 *     decode steps whose batch size is a bucket are bitwise equal; padded
 *     steps within 1e-2 * max|logit| (a padded batch runs the linears with
 *     more rows, which may change the split-K order); prefill steps bitwise. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/util.h"
#include "kernels/cuda/ops_cuda_graph.h"
#include "kernels/ops.h"
#include "tests/harness/model_fixture.h"
#include "tests/harness/test.h"

static uint64_t gr_rs = 0x9e3779b97f4a7c15ull;
static uint32_t gr_rnd(void) {
    gr_rs ^= gr_rs << 13;
    gr_rs ^= gr_rs >> 7;
    gr_rs ^= gr_rs << 17;
    return (uint32_t)(gr_rs >> 16);
}
static float gr_urand(float lo, float hi) {
    return fp16_to_f32(f32_to_fp16(lo + (hi - lo) * (float)(gr_rnd() & 0xffffff) / 16777216.0f));
}

static int gpu_present(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static struct buf *mk(struct ops *o, enum buf_kind k, size_t n, const void *host) {
    struct buf *b = o->alloc(o->ctx, k, n);
    if (b && host) o->upload(o->ctx, b, 0, host, n);
    return b;
}

static float *get(struct ops *o, const struct buf *b, size_t off, size_t n) {
    float *x = malloc(n * sizeof *x);
    int rc = o->download(o->ctx, x, b, off, n);
    if (rc) test_fail(__FILE__, __LINE__, "%s download: %d", o->name, rc);
    return x;
}

/* max |a - b| over n, and max |a| */
static double maxdiff(const float *a, const float *b, size_t n, double *mx) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = test_err_max(d, e);
        m = fmax(m, fabs(a[i]));
    }
    if (mx) *mx = m;
    return d;
}

/* ---- ops level: q/k-norm + RoPE + KV write + attention recorded once ------ */

/* One case: S real sequences padded to S + P rows; rounds of new contexts
 * replayed through one graph; eager (same ops, same batch) must give the same
 * bits and the CPU backend the same values within tolerance. */
static void attn_graph_case_fused(int hd, int nh, int nkv, int S, int P, int rounds, int fused);
static void attn_graph_case(int hd, int nh, int nkv, int S, int P, int rounds) {
    const int prev = ops_cuda_dec_qk(-1); /* the knob in effect (environment or default) */
    attn_graph_case_fused(hd, nh, nkv, S, P, rounds, 0);
    ops_cuda_dec_qk(prev);
}

/* fused: the graph recorded with q/k-norm + RoPE + the K/V write folded into
 * the decode attention (ops_cuda_dec_qk(1)), the eager run after each replay
 * with the separate kernels: the outputs and, in the last round, the caches
 * must be the same bits; q|k|v keeps the raw q and k on the fused path */
static void attn_graph_case_fused(int hd, int nh, int nkv, int S, int P, int rounds, int fused) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    char err[256];
    struct ops *cpu = NULL, *gpu = NULL;
    ASSERT_MSG(ops_cpu_create(2, &cpu, err, sizeof err) == 0, "cpu: %s", err);
    ASSERT_MSG(ops_cuda_create(0, &gpu, err, sizeof err) == 0, "cuda: %s", err);
    if (!gpu->graph_begin) {
        ops_destroy(cpu);
        ops_destroy(gpu);
        TEST_SKIP("graphs disabled (AWQD_CUDA_GRAPHS=0)");
    }
    const int bs = 16, MB = 140, NB = S * MB + 4, N = S + P;
    const int width = (nh + 2 * nkv) * hd;
    const size_t cache = (size_t)NB * bs * nkv * hd;
    float *kc = malloc(cache * sizeof *kc), *vc = malloc(cache * sizeof *vc);
    for (size_t i = 0; i < cache; i++) {
        kc[i] = gr_urand(-1, 1);
        vc[i] = gr_urand(-1, 1);
    }
    for (size_t i = 0; i < cache; i += 97) kc[i] = fp16_to_f32(f32_to_fp16(kc[i] * 8));
    float *qn = malloc((size_t)hd * 4), *kn = malloc((size_t)hd * 4), *inv = malloc((size_t)hd * 2);
    for (int i = 0; i < hd; i++) {
        qn[i] = gr_urand(0.5f, 1.5f);
        kn[i] = gr_urand(0.5f, 1.5f);
    }
    for (int j = 0; j < hd / 2; j++) inv[j] = (float)(1.0 / pow(1e6, 2.0 * j / hd));
    uint16_t *qn16 = malloc((size_t)hd * 2), *kn16 = malloc((size_t)hd * 2);
    for (int i = 0; i < hd; i++) {
        qn16[i] = f32_to_fp16(qn[i]);
        kn16[i] = f32_to_fp16(kn[i]);
    }
    /* block tables: a random permutation of the blocks */
    int32_t *perm = malloc((size_t)NB * sizeof *perm);
    for (int i = 0; i < NB; i++) perm[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        int j = (int)(gr_rnd() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *bt = calloc((size_t)N * MB, sizeof *bt);
    for (int s = 0; s < S; s++)
        for (int j = 0; j < MB; j++) bt[(size_t)s * MB + j] = perm[s * MB + j];
    int32_t qs[64], past[64], pos[64], slots[64];
    float *qkv = malloc((size_t)N * width * sizeof *qkv);

    /* both backends: caches, norms, batch buffers */
    struct buf *KC[2], *VC[2], *QN[2], *KN[2], *IF[2], *Q[2], *O[2], *BQ[2], *BP[2], *BT[2],
        *BPOS[2], *BSL[2];
    struct ops *be[2] = {cpu, gpu};
    for (int k = 0; k < 2; k++) {
        struct ops *o = be[k];
        KC[k] = mk(o, BUF_ACT, cache, kc);
        VC[k] = mk(o, BUF_ACT, cache, vc);
        QN[k] = mk(o, BUF_W16, (size_t)hd, qn16);
        KN[k] = mk(o, BUF_W16, (size_t)hd, kn16);
        IF[k] = mk(o, BUF_F32, (size_t)hd / 2, inv);
        Q[k] = mk(o, BUF_ACT, (size_t)N * width, NULL);
        O[k] = mk(o, BUF_ACT, (size_t)N * nh * hd, NULL);
        BQ[k] = mk(o, BUF_I32, (size_t)N + 1, NULL);
        BP[k] = mk(o, BUF_I32, (size_t)N, NULL);
        BT[k] = mk(o, BUF_I32, (size_t)N * MB, bt);
        BPOS[k] = mk(o, BUF_I32, (size_t)N, NULL);
        BSL[k] = mk(o, BUF_I32, (size_t)N, NULL);
    }
    struct buf *OE = mk(gpu, BUF_ACT, (size_t)N * nh * hd, NULL); /* eager output */
    struct attn_batch abg = {N, N, MB, bs, BQ[1], BP[1], BT[1], BPOS[1], BSL[1], qs, past, 1};
    struct attn_batch abc = {S, S, MB, bs, BQ[0], BP[0], BT[0], BPOS[0], BSL[0], qs, past, 0};
    const float scale = 2.0f / sqrtf((float)hd);
    const int ctx_choice[] = {0, 1, 14, 15, 16, 17, 31, 32, 33, 63, 64, 65, 200, 1000, 2047, 2200};
    struct op_graph *g = NULL;
    long rec0, rep0;
    ops_cuda_graph_counts(&rec0, NULL, &rep0);
    for (int r = 0; r < rounds && !test_failed(); r++) {
        for (int s = 0; s < N; s++) {
            qs[s] = s;
            if (s < S) {
                past[s] = ctx_choice[gr_rnd() % (sizeof ctx_choice / sizeof ctx_choice[0])];
                if (r == 0 && s == 0) past[s] = 0;       /* context 1 */
                if (r == 1 && s == 0) past[s] = 2200;    /* longest */
                /* short after the longest: the splits without keys hold
                 * round 1's partials unless they write their empty state
                 * (attn_decode.cu, DEC_EMPTY_NS) */
                if (r == 2 && s == 0) past[s] = 100;
                pos[s] = past[s];
                slots[s] = bt[(size_t)s * MB + past[s] / bs] * bs + past[s] % bs;
            } else { /* padding */
                past[s] = -1;
                pos[s] = 0;
                slots[s] = -1;
            }
        }
        qs[N] = N;
        for (size_t i = 0; i < (size_t)N * width; i++) qkv[i] = gr_urand(-2, 2);
        for (int k = 0; k < 2; k++) {
            struct ops *o = be[k];
            o->upload(o->ctx, BQ[k], 0, qs, (size_t)N + 1);
            o->upload(o->ctx, BP[k], 0, past, (size_t)N);
            o->upload(o->ctx, BPOS[k], 0, pos, (size_t)N);
            o->upload(o->ctx, BSL[k], 0, slots, (size_t)N);
            o->upload(o->ctx, Q[k], 0, qkv, (size_t)N * width);
        }
        /* CPU: the S real rows only */
        cpu->qk_norm_rope_kv(cpu->ctx, Q[0], S, nh, nkv, hd, QN[0], KN[0], 1e-6f, IF[0], &abc,
                             KC[0], VC[0]);
        cpu->attention(cpu->ctx, O[0], Q[0], nh, nkv, hd, scale, &abc, KC[0], VC[0]);
        /* GPU graph: recorded in round 0, replayed every round */
        if (!g) {
            ops_cuda_dec_qk(fused ? 1 : 0);
            ASSERT_EQ_INT(gpu->graph_begin(gpu->ctx), 0);
            gpu->qk_norm_rope_kv(gpu->ctx, Q[1], N, nh, nkv, hd, QN[1], KN[1], 1e-6f, IF[1], &abg,
                                 KC[1], VC[1]);
            gpu->attention(gpu->ctx, O[1], Q[1], nh, nkv, hd, scale, &abg, KC[1], VC[1]);
            ASSERT_EQ_INT(gpu->graph_end(gpu->ctx, &g), 0);
            ASSERT(g != NULL);
        }
        ASSERT_EQ_INT(gpu->graph_run(gpu->ctx, g), 0);
        char what[160];
        snprintf(what, sizeof what, "hd %d nh %d nkv %d S %d pad %d round %d", hd, nh, nkv, S, P, r);
        /* against the CPU */
        float *oc = get(cpu, O[0], 0, (size_t)S * nh * hd), *og = get(gpu, O[1], 0, (size_t)N * nh * hd);
        double mx, d = maxdiff(oc, og, (size_t)S * nh * hd, &mx);
        ASSERT_MSG(d <= 4e-3, "%s: attention differs from the CPU by %g", what, d);
        for (size_t i = (size_t)S * nh * hd; i < (size_t)N * nh * hd; i++)
            ASSERT_MSG(og[i] == 0.0f, "%s: padding row output %g at %zu", what, og[i], i);
        if (!fused) {
            float *qc = get(cpu, Q[0], 0, (size_t)S * width), *qg = get(gpu, Q[1], 0, (size_t)S * width);
            d = maxdiff(qc, qg, (size_t)S * width, &mx);
            ASSERT_MSG(d <= 4e-3 * mx + 1e-3, "%s: q/k/v after rope differ by %g", what, d);
            free(qc);
            free(qg);
        }
        if (r == rounds - 1) { /* the whole cache: no stray writes from the padding rows */
            for (int kv = 0; kv < 2 && !test_failed(); kv++) {
                float *cc = get(cpu, kv ? VC[0] : KC[0], 0, cache), *cg = get(gpu, kv ? VC[1] : KC[1], 0, cache);
                d = maxdiff(cc, cg, cache, &mx);
                ASSERT_MSG(d <= 4e-3 * mx + 1e-3, "%s: %s cache differs by %g", what, kv ? "V" : "K", d);
                free(cc);
                free(cg);
            }
        }
        /* eager, the same ops on the same batch: the same bits (fused: the
         * separate kernels, which rewrite the same K/V rows) */
        float *kf = NULL, *vf = NULL;
        if (fused && r == rounds - 1) {
            kf = get(gpu, KC[1], 0, cache);
            vf = get(gpu, VC[1], 0, cache);
        }
        ops_cuda_dec_qk(0);
        gpu->upload(gpu->ctx, Q[1], 0, qkv, (size_t)N * width);
        gpu->qk_norm_rope_kv(gpu->ctx, Q[1], N, nh, nkv, hd, QN[1], KN[1], 1e-6f, IF[1], &abg,
                             KC[1], VC[1]);
        gpu->attention(gpu->ctx, OE, Q[1], nh, nkv, hd, scale, &abg, KC[1], VC[1]);
        float *oe = get(gpu, OE, 0, (size_t)N * nh * hd);
        ASSERT_MSG(!memcmp(oe, og, (size_t)N * nh * hd * sizeof(float)), "%s: replay != eager", what);
        if (kf) {
            float *ks = get(gpu, KC[1], 0, cache), *vs = get(gpu, VC[1], 0, cache);
            ASSERT_MSG(!memcmp(kf, ks, cache * sizeof(float)), "%s: K cache fused != separate", what);
            ASSERT_MSG(!memcmp(vf, vs, cache * sizeof(float)), "%s: V cache fused != separate", what);
            free(ks);
            free(vs);
            free(kf);
            free(vf);
        }
        /* without padding, the plain eager path (decode_fixed 0, host geometry) too */
        if (P == 0) {
            struct attn_batch abe = abg;
            abe.decode_fixed = 0;
            gpu->attention(gpu->ctx, OE, Q[1], nh, nkv, hd, scale, &abe, KC[1], VC[1]);
            float *oe2 = get(gpu, OE, 0, (size_t)N * nh * hd);
            ASSERT_MSG(!memcmp(oe2, og, (size_t)N * nh * hd * sizeof(float)),
                       "%s: replay != eager (decode_fixed 0)", what);
            free(oe2);
        }
        free(oe);
        free(oc);
        free(og);
    }
    long rec1, rep1;
    ops_cuda_graph_counts(&rec1, NULL, &rep1);
    if (!test_failed()) {
        ASSERT_EQ_INT(rec1 - rec0, 1);
        ASSERT_EQ_INT(rep1 - rep0, rounds);
    }
    ASSERT_EQ_INT(gpu->sync(gpu->ctx), 0);
    gpu->graph_free(gpu->ctx, g);
    for (int k = 0; k < 2; k++) {
        struct ops *o = be[k];
        struct buf *all[] = {KC[k], VC[k], QN[k], KN[k], IF[k], Q[k], O[k], BQ[k], BP[k], BT[k], BPOS[k], BSL[k]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) o->free(o->ctx, all[i]);
    }
    gpu->free(gpu->ctx, OE);
    ops_destroy(cpu);
    ops_destroy(gpu);
    free(kc);
    free(vc);
    free(qn);
    free(kn);
    free(inv);
    free(qn16);
    free(kn16);
    free(perm);
    free(bt);
    free(qkv);
}

TEST(graph_cuda, attention_replay_matches_eager_and_cpu) {
    attn_graph_case(128, 32, 8, 5, 0, 5);   /* Qwen3-8B heads, 5 sequences */
    if (!test_failed()) attn_graph_case(128, 32, 8, 1, 0, 4);   /* batch 1: many splits */
    if (!test_failed()) attn_graph_case(128, 32, 8, 40, 0, 3);  /* few splits */
}

/* q/k-norm + RoPE + K/V write inside the decode attention (AWQD_CUDA_DEC_QK)
 * against the separate kernels: G = 1 / 2 / 4 / 8 / 16, hd 32 / 64 / 128,
 * padded buckets, 1-64 splits (from 32 the kernel whose empty splits exit) */
TEST(graph_cuda, attention_fused_qk_matches_separate) {
    const int prev = ops_cuda_dec_qk(-1);
    attn_graph_case_fused(128, 32, 8, 5, 0, 4, 1);             /* Qwen3-8B heads, 7 splits */
    if (!test_failed()) attn_graph_case_fused(128, 32, 8, 40, 0, 3, 1);  /* one split */
    if (!test_failed()) attn_graph_case_fused(128, 32, 8, 3, 5, 4, 1);   /* padded bucket of 8 */
    if (!test_failed()) attn_graph_case_fused(128, 64, 8, 9, 0, 3, 1);   /* Qwen3-32B heads, GQA 8 */
    if (!test_failed()) attn_graph_case_fused(64, 16, 2, 6, 2, 3, 1);    /* GQA 8, hd 64, 17 splits */
    if (!test_failed()) attn_graph_case_fused(32, 16, 1, 24, 0, 3, 1);   /* GQA 16, hd 32 */
    if (!test_failed()) attn_graph_case_fused(128, 8, 8, 8, 0, 3, 1);    /* GQA 1 */
    if (!test_failed()) attn_graph_case_fused(64, 8, 4, 12, 1, 3, 1);    /* GQA 2, padded */
    if (!test_failed()) attn_graph_case_fused(128, 32, 8, 1, 0, 4, 1);   /* batch 1: 33 splits, empty ones */
    if (!test_failed()) attn_graph_case_fused(128, 32, 4, 1, 0, 4, 1);   /* a Qwen3-32B tp = 2 rank: 64 splits */
    if (!test_failed()) attn_graph_case_fused(128, 32, 8, 2, 1, 3, 1);   /* padded, 22 splits */
    ops_cuda_dec_qk(prev);
}

TEST(graph_cuda, attention_replay_padded) {
    attn_graph_case(128, 32, 8, 3, 5, 4);   /* 3 sequences in a bucket of 8 */
    if (!test_failed()) attn_graph_case(64, 16, 2, 6, 2, 3);   /* GQA 8 */
    if (!test_failed()) attn_graph_case(256, 8, 1, 2, 2, 3);   /* hd 256 */
    if (!test_failed()) attn_graph_case(32, 16, 1, 3, 1, 3);   /* GQA 16, hd 32 */
}

/* A recording that hits a refused op fails cleanly; the backend goes on. */
TEST(graph_cuda, failed_recording_recovers) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    char err[256];
    struct ops *gpu = NULL;
    ASSERT_MSG(ops_cuda_create(0, &gpu, err, sizeof err) == 0, "cuda: %s", err);
    if (!gpu->graph_begin) {
        ops_destroy(gpu);
        TEST_SKIP("graphs disabled (AWQD_CUDA_GRAPHS=0)");
    }
    const int dim = 256;
    float x[256], w[256];
    uint16_t w16[256];
    for (int i = 0; i < dim; i++) {
        x[i] = gr_urand(-2, 2);
        w[i] = gr_urand(0.5f, 1.5f);
        w16[i] = f32_to_fp16(w[i]);
    }
    struct buf *R = mk(gpu, BUF_ACT, dim, x), *O = mk(gpu, BUF_ACT, dim, NULL), *W = mk(gpu, BUF_W16, dim, w16);
    long f0;
    ops_cuda_graph_counts(NULL, &f0, NULL);
    ASSERT_EQ_INT(gpu->graph_begin(gpu->ctx), 0);
    ASSERT_EQ_INT(gpu->graph_begin(gpu->ctx), -EBUSY); /* no nesting */
    gpu->add_rmsnorm(gpu->ctx, R, NULL, O, W, 1, dim, 1e-6f);
    ASSERT(gpu->alloc(gpu->ctx, BUF_ACT, 16) == NULL);
    ASSERT_EQ_INT(gpu->upload(gpu->ctx, R, 0, x, dim), -EBUSY);
    ASSERT_EQ_INT(gpu->sync(gpu->ctx), -EBUSY);
    struct op_graph *g = (struct op_graph *)&g; /* must be reset to NULL */
    ASSERT(gpu->graph_end(gpu->ctx, &g) < 0);
    ASSERT(g == NULL);
    long f1;
    ops_cuda_graph_counts(NULL, &f1, NULL);
    ASSERT_EQ_INT(f1 - f0, 1);
    /* still usable: eager op, then a good recording */
    ASSERT_EQ_INT(gpu->sync(gpu->ctx), 0);
    gpu->add_rmsnorm(gpu->ctx, R, NULL, O, W, 1, dim, 1e-6f);
    float *a = get(gpu, O, 0, dim);
    ASSERT_EQ_INT(gpu->graph_begin(gpu->ctx), 0);
    gpu->add_rmsnorm(gpu->ctx, R, NULL, O, W, 1, dim, 1e-6f);
    ASSERT_EQ_INT(gpu->graph_end(gpu->ctx, &g), 0);
    gpu->upload(gpu->ctx, O, 0, x, dim); /* clobber; the replay rewrites it */
    ASSERT_EQ_INT(gpu->graph_run(gpu->ctx, g), 0);
    float *b = get(gpu, O, 0, dim);
    ASSERT(!memcmp(a, b, dim * sizeof(float)));
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    double rr = 1.0 / sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; i++) ASSERT(fabs(b[i] - x[i] * rr * w[i]) <= 4e-3 * 3 + 1e-3);
    free(a);
    free(b);
    gpu->graph_free(gpu->ctx, g);
    gpu->free(gpu->ctx, R);
    gpu->free(gpu->ctx, O);
    gpu->free(gpu->ctx, W);
    ASSERT_EQ_INT(gpu->sync(gpu->ctx), 0);
    ops_destroy(gpu);
}

/* ---- model level ------------------------------------------------------------ */

#define GM_SEQS 12

static int gm_group(struct mt_fixture *f, int graphs, struct model_group **g) {
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.backend = "cuda";
    o.model.n_blocks = GM_SEQS * 32 + 8;
    o.model.block_size = 16;
    o.model.max_tokens = 256;
    o.model.max_seqs = GM_SEQS; /* buckets 1 2 4 5 6 8 12 */
    o.model.max_blocks_per_seq = 32;
    char err[512];
    if (!graphs) setenv("AWQD_CUDA_GRAPHS", "0", 1);
    int rc = model_group_init(f->ck, &o, g, err, sizeof err);
    if (!graphs) unsetenv("AWQD_CUDA_GRAPHS");
    if (rc) test_fail(__FILE__, __LINE__, "model_group_init (graphs %d): %s", graphs, err);
    return rc;
}

/* Both groups run the same batches; logits compared per step. */
TEST(graph_cuda, model_decode_replay_matches_eager) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    const char *ge = getenv("AWQD_CUDA_GRAPHS");
    if (ge && !strcmp(ge, "0")) TEST_SKIP("graphs disabled (AWQD_CUDA_GRAPHS=0)");
    struct mt_fixture f;
    int fr = mt_fixture_open("qwen3-tiny-awq", &f);
    if (fr == 1) TEST_SKIP("fixture qwen3-tiny-awq missing");
    if (fr) return;
    struct model_group *gg = NULL, *ge_ = NULL;
    if (gm_group(&f, 1, &gg) || gm_group(&f, 0, &ge_)) {
        model_group_free(gg);
        mt_fixture_close(&f);
        return;
    }
    const int V = f.vocab;
    const struct model_opts *mo = model_opts(model_group_rank0(gg));
    struct kv kv[2];
    ASSERT_EQ_INT(kv_init(&kv[0], mo->n_blocks, mo->block_size), 0);
    ASSERT_EQ_INT(kv_init(&kv[1], mo->n_blocks, mo->block_size), 0);
    struct kv_seq seq[2][GM_SEQS];
    memset(seq, 0, sizeof seq);
    /* prompt lengths: block boundaries, 1 token, long; seq 11 has no prompt
     * (its first decode step is at context 1) */
    const int plen[GM_SEQS] = {1, 15, 16, 17, 31, 32, 33, 100, 250, 2, 47, 0};
    int len[GM_SEQS];
    int32_t toks[GM_SEQS][512];
    for (int s = 0; s < GM_SEQS; s++)
        for (int i = 0; i < 512; i++) toks[s][i] = (int32_t)(gr_rnd() % (uint32_t)V);
    float *lg = malloc((size_t)GM_SEQS * V * sizeof *lg), *le = malloc((size_t)GM_SEQS * V * sizeof *le);
    struct model_group *grp[2] = {gg, ge_};
    float *out[2] = {lg, le};
    char err[512];
    long rec0, rep0, fail0;
    ops_cuda_graph_counts(&rec0, &fail0, &rep0);
    /* prefill, one sequence at a time (bitwise; sequence 0's one-token
     * prompt is a decode-only batch: a replay of bucket 1) */
    for (int s = 0; s < GM_SEQS && !test_failed(); s++) {
        len[s] = plen[s];
        if (!plen[s]) continue;
        for (int k = 0; k < 2; k++) {
            ASSERT_EQ_INT(kv_seq_reserve(&kv[k], &seq[k][s], plen[s]), 0);
            struct batch_seq bs = {toks[s], plen[s], 0, seq[k][s].blocks, seq[k][s].n_blocks, MODEL_LOGITS_LAST};
            struct batch b = {&bs, 1};
            int rc = model_group_forward(grp[k], &b, out[k], err, sizeof err);
            ASSERT_MSG(rc == 0, "prefill: %s", err);
        }
        ASSERT_MSG(!memcmp(lg, le, (size_t)V * sizeof(float)), "prefill of sequence %d differs", s);
    }
    /* decode steps: phase 0 bucket sizes only (bitwise), phase 1 any size */
    const int sizes0[] = {1, 2, 4, 8, 12, 12, 8, 5, 6, 4, 2, 1, 12, 4};
    const int sizes1[] = {3, 5, 7, 11, 9, 6, 10, 3, 12, 1};
    int n_steps = 0;
    for (int phase = 0; phase < 2 && !test_failed(); phase++) {
        const int *sz = phase ? sizes1 : sizes0;
        int nst = phase ? (int)(sizeof sizes1 / sizeof sizes1[0]) : (int)(sizeof sizes0 / sizeof sizes0[0]);
        for (int st = 0; st < nst && !test_failed(); st++) {
            int S = sz[st];
            /* a rotating subset of the sequences */
            int pick[GM_SEQS];
            int off = (int)(gr_rnd() % GM_SEQS);
            for (int i = 0; i < S; i++) pick[i] = (off + i * 5) % GM_SEQS; /* 5 is coprime to 12 */
            struct batch_seq bs[2][GM_SEQS];
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < S; i++) {
                    int s = pick[i];
                    ASSERT_EQ_INT(kv_seq_reserve(&kv[k], &seq[k][s], len[s] + 1), 0);
                    bs[k][i] = (struct batch_seq){&toks[s][len[s]], 1, len[s], seq[k][s].blocks,
                                                  seq[k][s].n_blocks, MODEL_LOGITS_LAST};
                }
            for (int k = 0; k < 2; k++) {
                struct batch b = {bs[k], S};
                int rc = model_group_forward(grp[k], &b, out[k], err, sizeof err);
                ASSERT_MSG(rc == 0, "decode step %d: %s", n_steps, err);
            }
            for (int i = 0; i < S; i++) len[pick[i]]++;
            n_steps++;
            if (phase == 0) {
                ASSERT_MSG(!memcmp(lg, le, (size_t)S * V * sizeof(float)),
                           "decode step %d (batch %d, a bucket): graph != eager", n_steps, S);
            } else {
                double mx, d = maxdiff(le, lg, (size_t)S * V, &mx);
                ASSERT_MSG(d <= 1e-2 * mx, "decode step %d (batch %d, padded): max diff %g (max %g)",
                           n_steps, S, d, mx);
            }
        }
    }
    long rec1, rep1, fail1;
    ops_cuda_graph_counts(&rec1, &fail1, &rep1);
    if (!test_failed()) {
        ASSERT_EQ_INT(fail1 - fail0, 0);
        ASSERT_MSG(rec1 - rec0 >= 7, "%ld graphs recorded (buckets 1 2 4 5 6 8 12 used)", rec1 - rec0);
        ASSERT_EQ_INT(rep1 - rep0, n_steps + 1);
    }
    for (int k = 0; k < 2; k++) {
        for (int s = 0; s < GM_SEQS; s++) kv_seq_free(&kv[k], &seq[k][s]);
        ASSERT_EQ_INT(kv_free_blocks(&kv[k]), mo->n_blocks);
        kv_free(&kv[k]);
    }
    free(lg);
    free(le);
    model_group_free(gg);
    model_group_free(ge_);
    mt_fixture_close(&f);
}

/* ---- benchmark: decode attention per layer (prints; asserts only success) -- */

static double gr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Qwen3-8B heads (32 / 8 x 128): 36 attention calls per graph replay (the
 * decode kernel), against 36 eager calls of the general kernel
 * (AWQD_CUDA_DECODE_ATTN=0). Times per call from the wall clock over
 * repeated replays (GPU-bound at these sizes). */
TEST(graph_cuda, bench_decode_attention) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    const char *ge = getenv("AWQD_CUDA_GRAPHS");
    if (ge && !strcmp(ge, "0")) TEST_SKIP("graphs disabled (AWQD_CUDA_GRAPHS=0)");
    const int nh = 32, nkv = 8, hd = 128, bs = 16, L = 36, reps = 10;
    const int cases[][2] = {{1, 512}, {1, 4096}, {8, 512}, {8, 4096}, {32, 4096}, {64, 512}, {64, 4096}};
    char err[256];
    struct ops *o[2] = {NULL, NULL}; /* decode kernel, general kernel */
    ASSERT_MSG(ops_cuda_create(0, &o[0], err, sizeof err) == 0, "cuda: %s", err);
    setenv("AWQD_CUDA_DECODE_ATTN", "0", 1);
    int rc = ops_cuda_create(0, &o[1], err, sizeof err);
    unsetenv("AWQD_CUDA_DECODE_ATTN");
    ASSERT_MSG(rc == 0, "cuda: %s", err);
    printf("\n| batch | context | decode kernel us/layer (graph) | GB/s | general kernel us/layer (eager) | GB/s |\n|---|---|---|---|---|---|\n");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0] && !test_failed(); ci++) {
        int S = cases[ci][0], ctx = cases[ci][1];
        int mb = (ctx + bs) / bs + 1, NB = S * mb;
        size_t cache = (size_t)NB * bs * nkv * hd;
        int32_t *qs = malloc((S + 1) * 4), *past = malloc(S * 4), *pos = malloc(S * 4),
                *slots = malloc(S * 4), *bt = malloc((size_t)S * mb * 4);
        for (int s = 0; s < S; s++) {
            qs[s] = s;
            past[s] = ctx - 1;
            pos[s] = ctx - 1;
            for (int j = 0; j < mb; j++) bt[(size_t)s * mb + j] = s * mb + j;
            slots[s] = bt[(size_t)s * mb + (ctx - 1) / bs] * bs + (ctx - 1) % bs;
        }
        qs[S] = S;
        double us[2] = {0, 0};
        const char *gen = getenv("AWQD_BENCH_GENERAL");
        int nk = gen && !strcmp(gen, "0") ? 1 : 2;
        for (int k = 0; k < nk && !test_failed(); k++) {
            struct ops *g = o[k];
            struct buf *KC = mk(g, BUF_ACT, cache, NULL), *VC = mk(g, BUF_ACT, cache, NULL);
            struct buf *Q = mk(g, BUF_ACT, (size_t)S * (nh + 2 * nkv) * hd, NULL);
            struct buf *O = mk(g, BUF_ACT, (size_t)S * nh * hd, NULL);
            struct buf *BQ = mk(g, BUF_I32, S + 1, qs), *BP = mk(g, BUF_I32, S, past),
                       *BT = mk(g, BUF_I32, (size_t)S * mb, bt), *BPOS = mk(g, BUF_I32, S, pos),
                       *BSL = mk(g, BUF_I32, S, slots);
            ASSERT(KC && VC && Q && O);
            struct attn_batch ab = {S, S, mb, bs, BQ, BP, BT, BPOS, BSL, qs, past, k == 0};
            struct op_graph *gr = NULL;
            if (k == 0) {
                ASSERT_EQ_INT(g->graph_begin(g->ctx), 0);
                for (int l = 0; l < L; l++) g->attention(g->ctx, O, Q, nh, nkv, hd, 0.088f, &ab, KC, VC);
                ASSERT_EQ_INT(g->graph_end(g->ctx, &gr), 0);
            }
            for (int rep = -2; rep < reps; rep++) {
                if (rep == 0) {
                    ASSERT_EQ_INT(g->sync(g->ctx), 0);
                    us[k] = gr_now();
                }
                if (k == 0) g->graph_run(g->ctx, gr);
                else
                    for (int l = 0; l < L; l++) g->attention(g->ctx, O, Q, nh, nkv, hd, 0.088f, &ab, KC, VC);
            }
            ASSERT_EQ_INT(g->sync(g->ctx), 0);
            us[k] = (gr_now() - us[k]) * 1e6 / ((double)reps * L);
            if (gr) g->graph_free(g->ctx, gr);
            struct buf *all[] = {KC, VC, Q, O, BQ, BP, BT, BPOS, BSL};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) g->free(g->ctx, all[i]);
        }
        double bytes = 2.0 * S * ctx * nkv * hd * 2; /* K and V read once */
        printf("| %d | %d | %.1f | %.0f | %.1f | %.0f |\n", S, ctx, us[0], bytes / us[0] / 1e3, us[1],
               bytes / us[1] / 1e3);
        free(qs);
        free(past);
        free(pos);
        free(slots);
        free(bt);
    }
    fflush(stdout);
    ops_destroy(o[0]);
    ops_destroy(o[1]);
}

/* ---- prefill attention kernels (attn.cu): old one-m-tile kernel, the FA
 * kernel variants, each against the CPU (|d| <= 4e-3) ---------------------- */

/* AWQD_ATTN_TC values of the tensor-core prefill kernels (read by attn.cu at
 * each work-list build): the old kernel, FA 4 warps (default), FA 2 warps */
static const char *const pf_modes[] = {"old", "4", "2"};
#define PF_NMODES 3

struct pf_geo {
    int n_seqs, n_rows, mb, nb;
    int32_t *qs, *past, *bt;
};

/* a batch of sequences (past[s], rows[s]) over a permuted paged cache */
static void pf_geo_make(struct pf_geo *g, int n_seqs, const int *past, const int *rows, int bs) {
    g->n_seqs = n_seqs;
    g->qs = malloc(((size_t)n_seqs + 1) * 4);
    g->past = malloc((size_t)n_seqs * 4);
    g->mb = 1;
    g->nb = 0;
    g->qs[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        int nb = (past[s] + rows[s] + bs - 1) / bs;
        g->past[s] = past[s];
        g->qs[s + 1] = g->qs[s] + rows[s];
        if (nb > g->mb) g->mb = nb;
        g->nb += nb;
    }
    g->n_rows = g->qs[n_seqs];
    g->nb += 2;
    int32_t *perm = malloc((size_t)g->nb * 4);
    for (int i = 0; i < g->nb; i++) perm[i] = i;
    for (int i = g->nb - 1; i > 0; i--) {
        int j = (int)(gr_rnd() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    g->bt = calloc((size_t)n_seqs * g->mb, 4);
    int next = 0;
    for (int s = 0; s < n_seqs; s++) {
        int nb = (past[s] + rows[s] + bs - 1) / bs;
        for (int j = 0; j < nb; j++) g->bt[(size_t)s * g->mb + j] = perm[next++];
    }
    free(perm);
}

static void pf_geo_free(struct pf_geo *g) {
    free(g->qs);
    free(g->past);
    free(g->bt);
}

/* o[0] CPU, o[1 + k] GPU contexts for pf_modes[k] */
static void pf_case(struct ops **o, int hd, int nh, int nkv, int n_seqs, const int *past,
                    const int *rows, int bs) {
    struct pf_geo g;
    pf_geo_make(&g, n_seqs, past, rows, bs);
    const int n = g.n_rows, width = (nh + 2 * nkv) * hd;
    const size_t cache = (size_t)g.nb * bs * nkv * hd;
    float *qkv = malloc((size_t)n * width * 4), *kc = malloc(cache * 4), *vc = malloc(cache * 4);
    for (size_t i = 0; i < (size_t)n * width; i++) qkv[i] = gr_urand(-1, 1);
    for (size_t i = 0; i < cache; i++) {
        kc[i] = gr_urand(-1, 1);
        vc[i] = gr_urand(-1, 1);
    }
    for (size_t i = 0; i < cache; i += 97) kc[i] = fp16_to_f32(f32_to_fp16(kc[i] * 8)); /* peaks */
    const float scale = 2.0f / sqrtf((float)hd);
    float *ref = NULL;
    for (int k = 0; k < 1 + PF_NMODES && !test_failed(); k++) {
        struct ops *b = o[k];
        if (k) setenv("AWQD_ATTN_TC", pf_modes[k - 1], 1);
        struct buf *Q = mk(b, BUF_ACT, (size_t)n * width, qkv), *KC = mk(b, BUF_ACT, cache, kc),
                   *VC = mk(b, BUF_ACT, cache, vc), *O = mk(b, BUF_ACT, (size_t)n * nh * hd, NULL),
                   *BQ = mk(b, BUF_I32, (size_t)n_seqs + 1, g.qs),
                   *BP = mk(b, BUF_I32, (size_t)n_seqs, g.past),
                   *BT = mk(b, BUF_I32, (size_t)n_seqs * g.mb, g.bt);
        ASSERT(Q && KC && VC && O && BQ && BP && BT);
        struct attn_batch ab = {n_seqs, n, g.mb, bs, BQ, BP, BT, NULL, NULL, g.qs, g.past, 0};
        b->attention(b->ctx, O, Q, nh, nkv, hd, scale, &ab, KC, VC);
        float *r = get(b, O, 0, (size_t)n * nh * hd);
        unsetenv("AWQD_ATTN_TC");
        if (!k) {
            ref = r;
        } else {
            double mx, d = maxdiff(ref, r, (size_t)n * nh * hd, &mx);
            ASSERT_MSG(d <= 4e-3,
                       "AWQD_ATTN_TC=%s hd %d nh %d nkv %d seqs %d rows %d past[0] %d bs %d: "
                       "differs from the CPU by %g",
                       pf_modes[k - 1], hd, nh, nkv, n_seqs, n, past[0], bs, d);
            free(r);
        }
        struct buf *all[] = {Q, KC, VC, O, BQ, BP, BT};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) b->free(b->ctx, all[i]);
    }
    free(ref);
    free(qkv);
    free(kc);
    free(vc);
    pf_geo_free(&g);
}

/* rows not a multiple of 32, G = 1 / 2 / 4 / 8, chunks with past > 0,
 * split-K (few tiles over a long past, > 32 splits), mixed batches, odd
 * block sizes, a one-wave grid (the FA kernel's paired CTA order) */
TEST(graph_cuda, attention_prefill_kernels) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    char err[256];
    struct ops *o[1 + PF_NMODES] = {NULL};
    ASSERT_MSG(ops_cpu_create(2, &o[0], err, sizeof err) == 0, "cpu: %s", err);
    for (int k = 1; k <= PF_NMODES; k++)
        ASSERT_MSG(ops_cuda_create(0, &o[k], err, sizeof err) == 0, "cuda: %s", err);
    static const struct {
        int hd, nh, nkv, bs, n_seqs, past[3], rows[3];
    } cs[] = {
        {128, 32, 8, 16, 1, {0}, {77}},
        {128, 32, 8, 16, 1, {0}, {256}},
        {128, 32, 8, 16, 1, {3000}, {40}},          /* split-K */
        {128, 32, 8, 16, 1, {200}, {37}},
        {128, 8, 8, 16, 1, {0}, {300}},             /* G = 1 */
        {128, 8, 8, 7, 1, {70}, {129}},
        {128, 16, 8, 7, 1, {33}, {100}},            /* G = 2 */
        {128, 64, 8, 16, 1, {0}, {200}},            /* G = 8 */
        {128, 32, 8, 16, 3, {0, 500, 1000}, {45, 1, 90}},
        {64, 16, 2, 16, 3, {0, 500, 17}, {45, 1, 130}},
        {64, 4, 4, 32, 1, {2500}, {9}},
        {32, 8, 2, 1, 1, {5}, {257}},
        {32, 8, 1, 16, 2, {64, 0}, {64, 1}},
        {64, 8, 1, 16, 1, {5000}, {3}},             /* > 32 splits of one tile */
        {32, 32, 32, 16, 1, {0}, {700}},            /* one wave: paired CTA order */
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0] && !test_failed(); i++)
        pf_case(o, cs[i].hd, cs[i].nh, cs[i].nkv, cs[i].n_seqs, cs[i].past, cs[i].rows, cs[i].bs);
    for (int k = 0; k <= PF_NMODES; k++) ops_destroy(o[k]);
}

/* ---- benchmark: prefill attention per call (prints; asserts only success) --
 * Qwen3-8B heads (32 / 8 x 128), one sequence, eager calls; the old kernel
 * and the FA kernel variants (warps, CTA order, split rule) in one run.
 * TFLOP/s from the causal FLOPs 4 nh hd sum over rows of the keys seen. */
TEST(graph_cuda, bench_prefill_attention) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    const int nh = 32, nkv = 8, hd = 128, bs = 16, width = (nh + 2 * nkv) * hd;
    const int cases[][2] = {{128, 0}, {1024, 0}, {4096, 0}, {1024, 3072}}; /* rows, past */
    /* kernel k: AWQD_ATTN_TC = mode[k], and the variable xenv[k] = xval[k] */
    const char *mode[] = {"old", "4", "4", "4", "4", "4", "2"};
    const char *xenv[] = {NULL, NULL, "AWQD_ATTN_PDL_TRIGGER", "AWQD_ATTN_BAL", "AWQD_ATTN_BAL",
                          "AWQD_ATTN_BAL", NULL};
    const char *xval[] = {NULL, NULL, "start", "0", "100", "150", NULL};
    const char *name[] = {"old (tc, 64 pairs)", "FA 4 warps (128 pairs)",
                          "FA 4 warps, PDL trigger at start", "FA 4 warps, no balance split",
                          "FA 4 warps, balance 100 %", "FA 4 warps, balance 150 %",
                          "FA 2 warps (64 pairs)"};
    enum { NK = 7 };
    char err[256];
    struct ops *o[NK] = {NULL};
    for (int k = 0; k < NK; k++) ASSERT_MSG(ops_cuda_create(0, &o[k], err, sizeof err) == 0, "cuda: %s", err);
    /* AWQD_BENCH_PF_CASE / _KERNEL = i: only that case / kernel (profiling) */
    const char *only_c = getenv("AWQD_BENCH_PF_CASE"), *only_k = getenv("AWQD_BENCH_PF_KERNEL");
    printf("\n| rows | past | kernel | us/call | TFLOP/s |\n|---|---|---|---|---|\n");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0] && !test_failed(); ci++) {
        int rows = cases[ci][0], past = cases[ci][1];
        if (only_c && atoi(only_c) != (int)ci) continue;
        struct pf_geo g;
        pf_geo_make(&g, 1, &past, &rows, bs);
        size_t cache = (size_t)g.nb * bs * nkv * hd;
        float *qkv = malloc((size_t)rows * width * 4), *kv = malloc(cache * 4);
        for (size_t i = 0; i < (size_t)rows * width; i++) qkv[i] = gr_urand(-1, 1);
        for (size_t i = 0; i < cache; i++) kv[i] = gr_urand(-1, 1);
        double flop = 0;
        for (int r = 0; r < rows; r++) flop += 4.0 * nh * hd * (past + r + 1);
        for (int k = 0; k < NK && !test_failed(); k++) {
            struct ops *b = o[k];
            if (only_k && atoi(only_k) != k) continue;
            setenv("AWQD_ATTN_TC", mode[k], 1);
            if (xenv[k]) setenv(xenv[k], xval[k], 1);
            struct buf *Q = mk(b, BUF_ACT, (size_t)rows * width, qkv), *KC = mk(b, BUF_ACT, cache, kv),
                       *VC = mk(b, BUF_ACT, cache, kv), *O = mk(b, BUF_ACT, (size_t)rows * nh * hd, NULL),
                       *BQ = mk(b, BUF_I32, 2, g.qs), *BP = mk(b, BUF_I32, 1, g.past),
                       *BT = mk(b, BUF_I32, (size_t)g.mb, g.bt);
            ASSERT(Q && KC && VC && O && BQ && BP && BT);
            struct attn_batch ab = {1, rows, g.mb, bs, BQ, BP, BT, NULL, NULL, g.qs, g.past, 0};
            /* warm-up (clocks ramp up): >= 50 ms of calls; then ~100 ms timed */
            int nw = 0;
            double t = gr_now();
            do {
                for (int i = 0; i < 4; i++) b->attention(b->ctx, O, Q, nh, nkv, hd, 0.088f, &ab, KC, VC);
                nw += 4;
                ASSERT_EQ_INT(b->sync(b->ctx), 0);
            } while (gr_now() - t < 0.05);
            int reps = (int)(0.1 / ((gr_now() - t) / nw));
            if (reps < 10) reps = 10;
            t = gr_now();
            for (int rep = 0; rep < reps; rep++)
                b->attention(b->ctx, O, Q, nh, nkv, hd, 0.088f, &ab, KC, VC);
            ASSERT_EQ_INT(b->sync(b->ctx), 0);
            double us = (gr_now() - t) * 1e6 / reps;
            unsetenv("AWQD_ATTN_TC");
            if (xenv[k]) unsetenv(xenv[k]);
            printf("| %d | %d | %s | %.1f | %.0f |\n", rows, past, name[k], us, flop / us / 1e6);
            struct buf *all[] = {Q, KC, VC, O, BQ, BP, BT};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) b->free(b->ctx, all[i]);
        }
        free(qkv);
        free(kv);
        pf_geo_free(&g);
    }
    fflush(stdout);
    for (int k = 0; k < NK; k++) ops_destroy(o[k]);
}
