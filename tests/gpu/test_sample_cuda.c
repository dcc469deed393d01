/* test_sample_cuda.c — ops->sample_topk on CUDA against the CPU op
 * (kernels/cpu/sample_cpu.c) on random rows of Qwen's vocabulary (151936) and
 * awkward sizes, k at its limits, with adjustments, ties, -inf: candidate ids,
 * their w and raw values, maxima and the adjusted tokens' raw logits must be
 * identical; the sums of exps agree to 1e-5 relative (fp32 partials on the
 * GPU, all-double on the CPU); the race winner (id, w, raw) is identical and
 * its score equal to ~1 ulp (CUDA's double log), over various temperatures.
 *
 * sample_cuda.bench prints the host-side sampling cost per step at batch 1, 8
 * and 64 (old: download the full logits + sampler_sample per row; new: the
 * op + candidate download + sampler_finish, falling back to the full row when
 * undecided) — measured, not asserted. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "engine/sampler.h"
#include "kernels/ops.h"
#include "tests/harness/test.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}
static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(void) {
    double u = unif() + 1e-12, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

struct srun {
    struct buf *lg, *wk, *out, *it, *as, *ad;
};

/* Runs the op on backend o: rows [m, ld] (n_cols valid from vocab_start). */
static int run_op(struct ops *o, const float *rows, int m, int ld, int nc, int vs, int k,
                  const float *inv_t, const int32_t *as, const int32_t *adj, const int32_t *race,
                  float *out) {
    void *c = o->ctx;
    int n_adj = as[m];
    struct srun r = {
        o->alloc(c, BUF_F32, (size_t)m * ld), o->alloc(c, BUF_F32, sample_work_floats(m, ld, k)),
        o->alloc(c, BUF_F32, SAMPLE_OUT_FLOATS(m, k, n_adj)), o->alloc(c, BUF_F32, (size_t)m),
        o->alloc(c, BUF_I32, (size_t)m + 1), o->alloc(c, BUF_I32, 2 * (size_t)n_adj + 2)};
    if (!r.lg || !r.wk || !r.out || !r.it || !r.as || !r.ad) return -ENOMEM;
    o->upload(c, r.lg, 0, rows, (size_t)m * ld);
    o->upload(c, r.it, 0, inv_t, (size_t)m);
    o->upload(c, r.as, 0, as, (size_t)m + 1);
    if (n_adj) o->upload(c, r.ad, 0, adj, 2 * (size_t)n_adj);
    struct buf *rb = race ? o->alloc(c, BUF_I32, 3 * (size_t)m) : NULL;
    if (race) o->upload(c, rb, 0, race, 3 * (size_t)m);
    /* adj_raw of tokens outside the slice stays as it was: make it equal */
    float *init = calloc(SAMPLE_OUT_FLOATS(m, k, n_adj), sizeof(float));
    o->upload(c, r.out, 0, init, SAMPLE_OUT_FLOATS(m, k, n_adj));
    free(init);
    struct sample_batch sb = {.m = m, .k = k, .ld = ld, .n_cols = nc, .vocab_start = vs,
                              .inv_t = r.it, .adj_start = r.as, .adj = r.ad, .h_adj_start = as,
                              .race = rb};
    o->sample_topk(c, r.out, r.lg, r.wk, &sb);
    int rc = o->download(c, out, r.out, 0, SAMPLE_OUT_FLOATS(m, k, n_adj));
    o->free(c, r.lg);
    o->free(c, r.wk);
    o->free(c, r.out);
    o->free(c, r.it);
    o->free(c, r.as);
    o->free(c, r.ad);
    o->free(c, rb);
    return rc;
}

static int bits_eq(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static int race_rows, race_exact; /* rows with a race winner; with bit-identical scores */

static void compare(const float *a, const float *b, int m, int k, int n_adj, const char *what) {
    size_t RF = SAMPLE_ROW_FLOATS(k);
    for (int r = 0; r < m; r++) {
        const float *x = a + r * RF, *y = b + r * RF;
        ASSERT_MSG(bits_eq(x[0], y[0]) && bits_eq(x[3], y[3]), "%s row %d: max %g/%g vs %g/%g",
                   what, r, x[0], x[3], y[0], y[3]);
        ASSERT_MSG(bits_eq(x[6], y[6]), "%s row %d: valid count differs", what, r);
        /* the race: the same winner, w and raw; the score equal up to the
         * last bits of CUDA's log (within 1 ulp of glibc's) */
        int32_t wa, wb;
        double sa, sb;
        memcpy(&wa, x + 7, 4);
        memcpy(&wb, y + 7, 4);
        memcpy(&sa, x + 8, 8);
        memcpy(&sb, y + 8, 8);
        ASSERT_MSG(wa == wb && bits_eq(x[10], y[10]) && bits_eq(x[11], y[11]) &&
                       (sa == sb || fabs(sa - sb) <= 1e-13 * fabs(sa)),
                   "%s row %d: race winner %d (%.17g, w %g) vs %d (%.17g, w %g)", what, r, wa, sa,
                   x[10], wb, sb, y[10]);
        race_rows += wa >= 0;
        race_exact += wa >= 0 && sa == sb;
        double s1, s2;
        for (int q = 1; q <= 4; q += 3) {
            memcpy(&s1, x + q, 8);
            memcpy(&s2, y + q, 8);
            ASSERT_MSG(fabs(s1 - s2) <= 1e-5 * fabs(s1) || s1 == s2, "%s row %d: sum %d %.12g vs %.12g",
                       what, r, q, s1, s2);
        }
        for (int i = 0; i < k; i++) {
            int32_t ia, ib;
            memcpy(&ia, x + SAMPLE_HDR + 2 * k + i, 4);
            memcpy(&ib, y + SAMPLE_HDR + 2 * k + i, 4);
            ASSERT_MSG(ia == ib && bits_eq(x[SAMPLE_HDR + i], y[SAMPLE_HDR + i]) &&
                           bits_eq(x[SAMPLE_HDR + k + i], y[SAMPLE_HDR + k + i]),
                       "%s row %d cand %d: id %d (%g, %g) vs %d (%g, %g)", what, r, i, ia,
                       x[SAMPLE_HDR + i], x[SAMPLE_HDR + k + i], ib, y[SAMPLE_HDR + i],
                       y[SAMPLE_HDR + k + i]);
        }
    }
    for (int e = 0; e < n_adj; e++)
        ASSERT_MSG(bits_eq(a[m * RF + e], b[m * RF + e]), "%s: adj raw %d", what, e);
}

struct pair {
    struct ops *cpu, *gpu;
};

static int pair_open(struct pair *p) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 1;
    char err[256];
    if (ops_cpu_create(1, &p->cpu, err, sizeof err) || ops_cuda_create(0, &p->gpu, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return -1;
    }
    return 0;
}

enum { ROW_GAUSS, ROW_TIES, ROW_FLAT, ROW_NEGINF };

/* One case: m rows of nc columns (stride ld) at vocab_start vs. */
static void one_case(struct pair *p, int m, int nc, int ld, int vs, int k, int kind, int with_adj) {
    float *rows = malloc(sizeof(float) * (size_t)m * ld);
    for (int r = 0; r < m; r++)
        for (int c = 0; c < ld; c++) {
            float v;
            if (kind == ROW_FLAT) v = 0.0f;
            else if (kind == ROW_NEGINF) v = -INFINITY;
            else if (kind == ROW_TIES) v = (float)(floor(gauss() * 4) / 2);
            else v = (float)(gauss() * 3);
            if (kind == ROW_GAUSS && rnd() % 1000 == 0) v = -INFINITY;
            rows[(size_t)r * ld + c] = c < nc ? v : NAN; /* past n_cols: never read */
        }
    float *inv_t = malloc(sizeof(float) * m);
    int32_t *as = malloc(sizeof(int32_t) * (m + 1));
    int32_t *adj = malloc(sizeof(int32_t) * 2 * (size_t)(m * 40 + 1));
    as[0] = 0;
    for (int r = 0; r < m; r++) {
        inv_t[r] = (const float[]){1.0f, 1.0f / 0.7f, 2.0f, 1.0f / 1.5f, 1.0f / 0.3f, 0.25f}[rnd() % 6];
        int n = 0;
        if (with_adj) { /* ascending tokens, some with several entries */
            int32_t t = vs - 5 + (int32_t)(rnd() % 50);
            for (int i = 0; i < 12; i++) {
                t += 1 + (int32_t)(rnd() % (uint64_t)(nc / 10 + 1));
                int ne = 1 + (int)(rnd() % 3);
                for (int j = 0; j < ne; j++) {
                    int op = (int)(rnd() % 3);
                    float v = op == SAMPLE_ADJ_REP ? 1.3f
                              : op == SAMPLE_ADJ_SUB ? 0.75f
                              : (rnd() % 3 == 0 ? -INFINITY : (float)(gauss() * 5));
                    adj[2 * (as[r] + n)] = t * 4 + op;
                    memcpy(&adj[2 * (as[r] + n) + 1], &v, 4);
                    n++;
                }
            }
        }
        as[r + 1] = as[r] + n;
    }
    int n_adj = as[m];
    /* race triples: random keys, most rows racing */
    int32_t *race = malloc(sizeof(int32_t) * 3 * (size_t)m);
    for (int r = 0; r < m; r++) {
        uint64_t key = rnd();
        race[3 * r] = (int32_t)(uint32_t)key;
        race[3 * r + 1] = (int32_t)(uint32_t)(key >> 32);
        race[3 * r + 2] = rnd() % 5 != 0;
    }
    float *a = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(m, k, n_adj));
    float *b = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(m, k, n_adj));
    ASSERT_EQ_INT(run_op(p->cpu, rows, m, ld, nc, vs, k, inv_t, as, adj, race, a), 0);
    ASSERT_EQ_INT(run_op(p->gpu, rows, m, ld, nc, vs, k, inv_t, as, adj, race, b), 0);
    char what[128];
    snprintf(what, sizeof what, "m %d n_cols %d ld %d vs %d k %d kind %d adj %d", m, nc, ld, vs, k,
             kind, with_adj);
    compare(a, b, m, k, n_adj, what);
    free(a);
    free(b);
    free(rows);
    free(inv_t);
    free(as);
    free(adj);
    free(race);
}

TEST(sample_cuda, equals_cpu_qwen_vocab) {
    struct pair p;
    int rc = pair_open(&p);
    if (rc == 1) TEST_SKIP("no CUDA device");
    ASSERT_OK_SO_FAR();
    const int ks[] = {1, 20, 64, 256};
    for (int ki = 0; ki < 4 && !test_failed(); ki++)
        for (int kind = 0; kind < 4 && !test_failed(); kind++)
            one_case(&p, kind == ROW_GAUSS ? 33 : 3, 151936, 151936, 0, ks[ki], kind, kind < 2);
    printf("race: %d rows with a winner, %d with bit-identical scores\n", race_rows, race_exact);
    ASSERT(race_rows > 0);
    ops_destroy(p.cpu);
    ops_destroy(p.gpu);
}

TEST(sample_cuda, equals_cpu_odd_sizes) {
    struct pair p;
    int rc = pair_open(&p);
    if (rc == 1) TEST_SKIP("no CUDA device");
    ASSERT_OK_SO_FAR();
    const int ncs[] = {1, 5, 255, 257, 8191, 8193, 75968, 100003, 262144};
    for (int i = 0; i < 9 && !test_failed(); i++)
        for (int ki = 0; ki < 3 && !test_failed(); ki++) {
            int k = (const int[]){1, 37, 256}[ki];
            one_case(&p, 1 + (int)(rnd() % 5), ncs[i], ncs[i] + (int)(rnd() % 4), 75968 * (i % 2), k,
                     (int)(rnd() % 2), 1);
        }
    ops_destroy(p.cpu);
    ops_destroy(p.gpu);
}

/* k = 1 runs as one kernel whose last block per row finishes it (arrival
 * counters that live in the backend and must be back at 0 after every call).
 * With the separate kernels' 32 columns per thread (AWQD_CUDA_SAMPLE_GS=32)
 * it is bit for bit their output (AWQD_CUDA_SAMPLE_FUSE=0); with its default
 * 8 columns per thread everything but the two sums of exps (other fp32
 * partials) is, and the sums agree to 1e-6. Over calls of varying rows,
 * columns, races and adjustments on one backend. */
static void same_rows(const float *a, const float *b, int m, int exact, const char *what) {
    for (int r = 0; r < m && !test_failed(); r++) {
        const float *x = a + (size_t)r * SAMPLE_ROW_FLOATS(1), *y = b + (size_t)r * SAMPLE_ROW_FLOATS(1);
        for (int i = 0; i < (int)SAMPLE_ROW_FLOATS(1); i++) {
            if (!exact && (i == 1 || i == 2 || i == 4 || i == 5)) continue;
            ASSERT_MSG(bits_eq(x[i], y[i]), "%s row %d float %d: %.9g vs %.9g", what, r, i, x[i], y[i]);
        }
        for (int q = 1; q <= 4; q += 3) {
            double s1, s2;
            memcpy(&s1, x + q, 8);
            memcpy(&s2, y + q, 8);
            ASSERT_MSG(fabs(s1 - s2) <= 1e-6 * fabs(s1), "%s row %d sum %d: %.12g vs %.12g", what, r,
                       q, s1, s2);
        }
    }
}

TEST(sample_cuda, k1_fused_equals_kernels) {
    struct pair p;
    int rc = pair_open(&p);
    if (rc == 1) TEST_SKIP("no CUDA device");
    ASSERT_OK_SO_FAR();
    char err[256];
    struct ops *un = NULL, *g32 = NULL;
    setenv("AWQD_CUDA_SAMPLE_FUSE", "0", 1);
    rc = ops_cuda_create(0, &un, err, sizeof err);
    unsetenv("AWQD_CUDA_SAMPLE_FUSE");
    ASSERT_MSG(rc == 0, "%s", err);
    setenv("AWQD_CUDA_SAMPLE_GS", "32", 1);
    rc = ops_cuda_create(0, &g32, err, sizeof err);
    unsetenv("AWQD_CUDA_SAMPLE_GS");
    ASSERT_MSG(rc == 0, "%s", err);
    const int ms[] = {5, 1, 33, 2, 1, 70, 3};
    const int ncs[] = {151936, 151936, 8193, 1, 262144, 75968, 257};
    for (int i = 0; i < 7 && !test_failed(); i++) {
        int m = ms[i], nc = ncs[i], ld = nc + i % 3, vs = (i % 2) * 75968, n_adj = 0;
        float *rows = malloc(sizeof(float) * (size_t)m * ld), *inv_t = malloc(sizeof(float) * m);
        int32_t *as = malloc(sizeof(int32_t) * (m + 1)), *adj = malloc(sizeof(int32_t) * 2 * m);
        int32_t *race = malloc(sizeof(int32_t) * 3 * (size_t)m);
        for (size_t j = 0; j < (size_t)m * ld; j++)
            rows[j] = i == 4 ? (float)(floor(gauss() * 4) / 2) : (float)(gauss() * 3);
        as[0] = 0;
        for (int r = 0; r < m; r++) {
            inv_t[r] = r % 2 ? 1.0f / 0.7f : 1.0f;
            if (i % 2 == 0 && r % 3 == 0) { /* one adjustment: a banned token */
                float v = -INFINITY;
                adj[2 * n_adj] = (vs + (int32_t)(rnd() % (uint64_t)nc)) * 4 + SAMPLE_ADJ_ADD;
                memcpy(&adj[2 * n_adj + 1], &v, 4);
                n_adj++;
            }
            as[r + 1] = n_adj;
            uint64_t key = rnd();
            race[3 * r] = (int32_t)(uint32_t)key;
            race[3 * r + 1] = (int32_t)(uint32_t)(key >> 32);
            race[3 * r + 2] = i == 1 ? 0 : (int32_t)(rnd() % 3 != 0);
        }
        size_t nf = SAMPLE_OUT_FLOATS(m, 1, n_adj);
        float *a = malloc(sizeof(float) * nf), *b = malloc(sizeof(float) * nf);
        float *a32 = malloc(sizeof(float) * nf);
        const int32_t *rc3 = i == 3 ? NULL : race; /* one call with no race at all */
        ASSERT_EQ_INT(run_op(p.gpu, rows, m, ld, nc, vs, 1, inv_t, as, adj, rc3, a), 0);
        ASSERT_EQ_INT(run_op(g32, rows, m, ld, nc, vs, 1, inv_t, as, adj, rc3, a32), 0);
        ASSERT_EQ_INT(run_op(un, rows, m, ld, nc, vs, 1, inv_t, as, adj, rc3, b), 0);
        char w1[64], w2[64];
        snprintf(w1, sizeof w1, "call %d (m %d, n_cols %d) fused/32", i, m, nc);
        snprintf(w2, sizeof w2, "call %d (m %d, n_cols %d) fused/8", i, m, nc);
        same_rows(b, a32, m, 1, w1);
        same_rows(b, a, m, 0, w2);
        ASSERT_MSG(memcmp(a + (size_t)m * SAMPLE_ROW_FLOATS(1), b + (size_t)m * SAMPLE_ROW_FLOATS(1),
                          sizeof(float) * (size_t)n_adj) == 0, "%s: adjusted raw logits", w2);
        free(a32);
        float *cref = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(m, 1, n_adj));
        ASSERT_EQ_INT(run_op(p.cpu, rows, m, ld, nc, vs, 1, inv_t, as, adj, rc3, cref), 0);
        char what[64];
        snprintf(what, sizeof what, "fused call %d", i);
        compare(cref, a, m, 1, n_adj, what);
        free(cref);
        free(a);
        free(b);
        free(rows);
        free(inv_t);
        free(as);
        free(adj);
        free(race);
    }
    ops_destroy(un);
    ops_destroy(g32);
    ops_destroy(p.cpu);
    ops_destroy(p.gpu);
}

/* ---- timing ------------------------------------------------------------- */

static void bench_batch(struct pair *p, int m, const struct sampling_params *sp, const char *name,
                        int flat) {
    enum { V = 151936, K = 256, CH = 32, IT = 5 };
    struct ops *o = p->gpu;
    void *c = o->ctx;
    float *rows = malloc(sizeof(float) * (size_t)m * V);
    /* a peaked head over a gaussian tail: 32 boosted tokens hold ~96% of the
     * mass at T = 1 (a flat tail is what makes a draw fall beyond the
     * candidates) */
    for (size_t i = 0; i < (size_t)m * V; i++) rows[i] = (float)(gauss() * (flat ? 0.05 : 2.0));
    for (int r = 0; r < m && !flat; r++)
        for (int j = 0; j < 32; j++) rows[(size_t)r * V + rnd() % V] += 16.0f - 0.4f * (float)j;
    struct buf *lg = o->alloc(c, BUF_F32, (size_t)m * V);
    struct buf *wk = o->alloc(c, BUF_F32, sample_work_floats(CH, V, K));
    struct buf *out = o->alloc(c, BUF_F32, SAMPLE_OUT_FLOATS(CH, K, 0));
    struct buf *it = o->alloc(c, BUF_F32, CH), *as = o->alloc(c, BUF_I32, CH + 1);
    struct buf *rb = o->alloc(c, BUF_I32, 3 * CH);
    int32_t race[3 * CH];
    for (int i = 0; i < CH; i++) sampler_race_row(sp, 0, race + 3 * i);
    struct buf *one = o->alloc(c, BUF_F32, (size_t)CH * V);
    o->upload(c, lg, 0, rows, (size_t)m * V);
    float *host = malloc(sizeof(float) * (size_t)m * V), *stage = malloc(sizeof(float) * (size_t)m * V);
    float *hout = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(CH, K, 0));
    struct sampler s;
    sampler_init(&s, V);
    float inv[CH];
    int32_t h_as[CH + 1] = {0};
    for (int i = 0; i < CH; i++) inv[i] = sampler_inv_t(sp);
    double t_old = 1e30, t_new = 1e30;
    int fallbacks = 0, mism = 0;
    struct sample_cands *cd = malloc(sizeof *cd);
    for (int iter = 0; iter < IT; iter++) {
        int32_t tok_old[64], tok_new[64];
        /* old: download every row (pageable, then copied as the model does) + host sampler */
        double t0 = now_ms();
        o->download(c, stage, lg, 0, (size_t)m * V);
        memcpy(host, stage, sizeof(float) * (size_t)m * V);
        for (int r = 0; r < m; r++) {
            struct sample_result res;
            sampler_sample(&s, sp, host + (size_t)r * V, NULL, 0, NULL, 0, &res);
            tok_old[r] = res.token;
        }
        double told = now_ms() - t0, tnew = 0;
        /* new: per chunk of 32 rows, the op + candidates down + finish (the
         * copy standing for lm_head's output is not timed) */
        for (int r0 = 0; r0 < m; r0 += CH) {
            int mr = m - r0 < CH ? m - r0 : CH;
            o->copy(c, one, 0, lg, (size_t)r0 * V, (size_t)mr * V);
            o->sync(c);
            double c0 = now_ms();
            o->upload(c, it, 0, inv, (size_t)mr);
            o->upload(c, as, 0, h_as, (size_t)mr + 1);
            if (race[2]) o->upload(c, rb, 0, race, 3 * (size_t)mr);
            struct sample_batch sb = {.m = mr, .k = K, .ld = V, .n_cols = V, .vocab_start = 0,
                                      .inv_t = it, .adj_start = as, .adj = NULL, .h_adj_start = h_as,
                                      .race = race[2] ? rb : NULL};
            o->sample_topk(c, out, one, wk, &sb);
            o->download(c, hout, out, 0, SAMPLE_OUT_FLOATS(mr, K, 0));
            for (int r = 0; r < mr; r++) {
                const float *rr[1] = {hout + (size_t)r * SAMPLE_ROW_FLOATS(K)};
                sampler_cands_merge(cd, rr, 1, K, V, inv[0]);
                struct sample_result res;
                if (sampler_finish(sp, cd, 0, &res) == SAMPLER_NEED_FULL) {
                    fallbacks += iter == 0;
                    o->download(c, stage, one, (size_t)r * V, V);
                    sampler_sample(&s, sp, stage, NULL, 0, NULL, 0, &res);
                }
                tok_new[r0 + r] = res.token;
            }
            tnew += now_ms() - c0;
        }
        if (told < t_old) t_old = told;
        if (tnew < t_new) t_new = tnew;
        for (int r = 0; r < m; r++) mism += tok_old[r] != tok_new[r];
    }
    printf("BENCH sample %-26s batch %2d: old %8.3f ms/step  new %7.3f ms/step  (%5.1fx)  "
           "fallbacks %d/%d  token mismatches %d\n",
           name, m, t_old, t_new, t_old / t_new, fallbacks, m, mism);
    fflush(stdout);
    free(cd);
    sampler_free(&s);
    free(rows);
    free(host);
    free(stage);
    free(hout);
    o->free(c, lg);
    o->free(c, wk);
    o->free(c, out);
    o->free(c, it);
    o->free(c, as);
    o->free(c, rb);
    o->free(c, one);
}

TEST(sample_cuda, bench) {
    struct pair p;
    int rc = pair_open(&p);
    if (rc == 1) TEST_SKIP("no CUDA device");
    ASSERT_OK_SO_FAR();
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("BENCH sample device: %s\n", prop.name);
    struct sampling_params g, t, tp;
    sampling_params_default(&g);
    g.temperature = 0;
    g.n_logprobs = 0; /* what the engine asks when no logprobs are wanted */
    sampling_params_default(&t);
    t.temperature = 1.0f;
    t.seed = 7;
    sampling_params_default(&tp);
    tp.temperature = 0.7f;
    tp.top_p = 0.9f;
    tp.seed = 9;
    const int bs[] = {1, 8, 64};
    for (int i = 0; i < 3; i++) bench_batch(&p, bs[i], &g, "greedy+logprob", 0);
    for (int i = 0; i < 3; i++) bench_batch(&p, bs[i], &t, "T=1 (server default)", 0);
    for (int i = 0; i < 3; i++) bench_batch(&p, bs[i], &tp, "T=0.7 top_p=0.9", 0);
    /* nearly flat rows (random weights): the race decides every T = 1 row */
    bench_batch(&p, 64, &t, "T=1 flat row", 1);
    ops_destroy(p.cpu);
    ops_destroy(p.gpu);
}
