/* test_sample_cands.c — the candidate path (ops->sample_topk on the CPU
 * backend + sampler_cands_merge + sampler_finish) against the full host
 * sampler (sampler_sample) on random rows and parameter mixes: greedy,
 * temperature, top_k (also above K), top_p, min_p, penalties, logit_bias with
 * -inf bans, raw and processed logprobs, ties. At tp = 1 on the CPU the sums
 * run in the same order, so every decided row must be identical bit for bit;
 * undecided rows (SAMPLER_NEED_FULL) go to sampler_sample, as the engine does.
 * A 2-rank split of the columns must give the same merged candidates and the
 * same results. */
#include "tests/harness/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "kernels/ops.h"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double unif(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(void) {
    double u = unif() + 1e-12, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Runs sample_topk for one row on columns [c0, c0 + nc) of `row` as a rank
 * with vocab_start c0 and row stride ld (>= nc). out_row: SAMPLE_ROW_FLOATS(k)
 * floats; adj_raw[n_adj] receives this rank's tokens' raw logits. */
static void run_op(struct ops *o, const float *row, int c0, int nc, int ld, int k, float inv_t,
                   const int32_t *race, const int32_t *adj, int n_adj, float *out_row,
                   float *adj_raw) {
    void *c = o->ctx;
    struct buf *lg = o->alloc(c, BUF_F32, (size_t)ld);
    struct buf *wk = o->alloc(c, BUF_F32, sample_work_floats(1, ld, k));
    struct buf *out = o->alloc(c, BUF_F32, SAMPLE_OUT_FLOATS(1, k, n_adj));
    struct buf *it = o->alloc(c, BUF_F32, 1);
    struct buf *as = o->alloc(c, BUF_I32, 2);
    struct buf *rc3 = o->alloc(c, BUF_I32, 3);
    if (race) o->upload(c, rc3, 0, race, 3);
    struct buf *ad = o->alloc(c, BUF_I32, (size_t)(2 * n_adj + 2));
    float *pad = malloc(sizeof(float) * (size_t)ld);
    for (int i = 0; i < ld; i++) pad[i] = i < nc ? row[c0 + i] : 1e30f; /* padding never read */
    o->upload(c, lg, 0, pad, (size_t)ld);
    o->upload(c, it, 0, &inv_t, 1);
    int32_t hs[2] = {0, n_adj};
    o->upload(c, as, 0, hs, 2);
    if (n_adj) o->upload(c, ad, 0, adj, (size_t)(2 * n_adj));
    struct sample_batch sb = {.m = 1, .k = k, .ld = ld, .n_cols = nc, .vocab_start = c0,
                              .inv_t = it, .adj_start = as, .adj = ad, .h_adj_start = hs,
                              .race = race ? rc3 : NULL};
    o->sample_topk(c, out, lg, wk, &sb);
    float *h = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(1, k, n_adj));
    o->download(c, h, out, 0, SAMPLE_OUT_FLOATS(1, k, n_adj));
    memcpy(out_row, h, sizeof(float) * SAMPLE_ROW_FLOATS(k));
    for (int e = 0; e < n_adj; e++) {
        int t = adj[2 * e] >> 2;
        if (t >= c0 && t < c0 + nc) adj_raw[e] = h[SAMPLE_ROW_FLOATS(k) + e];
    }
    free(h);
    free(pad);
    o->free(c, lg);
    o->free(c, wk);
    o->free(c, out);
    o->free(c, it);
    o->free(c, as);
    o->free(c, rc3);
    o->free(c, ad);
}

static int same_f(float a, float b) { return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b); }

/* 1 when the two results are identical (logprobs to tol; 0: bitwise) */
static int same_result(const struct sample_result *a, const struct sample_result *b, double tol,
                       char *why, size_t wl) {
    if (a->token != b->token) {
        snprintf(why, wl, "token %d vs %d", a->token, b->token);
        return 0;
    }
    int lp_ok = tol == 0 ? same_f(a->logprob, b->logprob)
                         : (isnan(a->logprob) && isnan(b->logprob)) ||
                               a->logprob == b->logprob || fabs(a->logprob - b->logprob) <= tol;
    if (!lp_ok) {
        snprintf(why, wl, "logprob %.9g vs %.9g", a->logprob, b->logprob);
        return 0;
    }
    if (a->n_top != b->n_top) {
        snprintf(why, wl, "n_top %d vs %d", a->n_top, b->n_top);
        return 0;
    }
    for (int i = 0; i < a->n_top; i++) {
        int ok = a->top_ids[i] == b->top_ids[i] &&
                 (tol == 0 ? same_f(a->top_logprobs[i], b->top_logprobs[i])
                           : a->top_logprobs[i] == b->top_logprobs[i] ||
                                 fabs(a->top_logprobs[i] - b->top_logprobs[i]) <= tol);
        if (!ok) {
            snprintf(why, wl, "top %d: id %d (%.9g) vs %d (%.9g)", i, a->top_ids[i],
                     a->top_logprobs[i], b->top_ids[i], b->top_logprobs[i]);
            return 0;
        }
    }
    return 1;
}

struct mix_stats {
    int rows, decided, decided_sampling;
    signed char *rc;              /* NULL, or [rows] each row's sampler_finish result (tp 1) */
};

/* One random row + parameters; checks candidate results against the
 * reference at tp = 1 (exact) and tp = 2 (same candidates, same results).
 * k <= 0: sampler_cands_needed(p, n_adj, -k) candidates, as the scheduler
 * stages a row. */
static void one_case(struct ops *o, struct sampler *s, int V, int k, int variant,
                     struct mix_stats *st) {
    float *row = malloc(sizeof(float) * (size_t)V);
    double scale = (const double[]){0.3, 1.5, 3.0, 6.0}[rnd() % 4];
    int ties = rnd() % 4 == 0;
    for (int i = 0; i < V; i++) {
        double g = gauss() * scale;
        if (ties) g = floor(g * 2) / 2; /* many equal logits */
        row[i] = (float)g;
    }
    if (rnd() % 3 == 0) row[rnd() % V] += 8.0f; /* a dominant token */

    struct sampling_params p;
    sampling_params_default(&p);
    const float temps[] = {0, 0.3f, 0.7f, 1.0f, 1.6f};
    p.temperature = temps[rnd() % 5];
    const int tks[] = {0, 0, 1, 5, 40, 300};
    p.top_k = tks[rnd() % 6];
    const float tps[] = {1, 1, 0.5f, 0.9f, 0.99f};
    p.top_p = tps[rnd() % 5];
    const float mps[] = {0, 0, 0.05f, 0.3f};
    p.min_p = mps[rnd() % 4];
    if (variant == 1) { /* pure temperature: the server's default */
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
        if (p.temperature == 0) p.temperature = 1;
    }
    p.seed = rnd();
    const int nls[] = {-1, 0, 5, 20};
    p.n_logprobs = nls[rnd() % 4];
    p.logprobs_processed = rnd() % 3 == 0;
    /* history: prompt and output tokens */
    int np = (int)(rnd() % 40), no = (int)(rnd() % 30);
    int32_t prompt[40], output[30];
    for (int i = 0; i < np; i++) prompt[i] = (int32_t)(rnd() % (uint64_t)(V < 60 ? V : 60));
    for (int i = 0; i < no; i++) output[i] = (int32_t)(rnd() % (uint64_t)(V < 60 ? V : 60));
    if (rnd() % 2) p.repetition_penalty = (rnd() % 2) ? 1.3f : 0.8f;
    if (rnd() % 2) p.presence_penalty = 0.4f;
    if (rnd() % 2) p.frequency_penalty = 0.25f;
    struct logit_bias lb[12];
    int nb = (int)(rnd() % 6);
    for (int i = 0; i < nb; i++) {
        lb[i].token = (int32_t)(rnd() % (uint64_t)V);
        double r = unif();
        lb[i].bias = r < 0.3 ? -INFINITY : r < 0.6 ? 5.0f : (float)(gauss() * 2);
    }
    if (nb && rnd() % 2) lb[nb++] = lb[0]; /* a duplicate: applied twice, in order */
    lb[nb++] = (struct logit_bias){V + 3, 1.0f}; /* outside the vocabulary: ignored */
    if (variant == 2) { /* ban everything but a few: C tiny */
        nb = 0;
    }
    p.logit_bias = lb;
    p.n_logit_bias = nb;

    struct sample_result ref;
    sampler_sample(s, &p, row, prompt, np, output, no, &ref);

    struct sampler_hist h = {0};
    for (int i = 0; i < np; i++) sampler_hist_add(&h, prompt[i], 0);
    for (int i = 0; i < no; i++) sampler_hist_add(&h, output[i], 1);
    int32_t *adj = malloc(sizeof(int32_t) * 2 * (size_t)(sampler_adj_max(&p, &h) + 1));
    int n_adj = sampler_adj_build(&p, &h, V, adj);
    float inv_t = sampler_inv_t(&p);
    if (k <= 0) k = sampler_cands_needed(&p, n_adj, -k);

    /* tp = 1 */
    float *r1 = malloc(sizeof(float) * SAMPLE_ROW_FLOATS(k));
    float *ar1 = calloc((size_t)n_adj + 1, sizeof(float));
    int32_t race[3];
    sampler_race_row(&p, no, race);
    run_op(o, row, 0, V, V, k, inv_t, race, adj, n_adj, r1, ar1);
    const float *rows1[1] = {r1};
    struct sample_cands *c1 = malloc(sizeof *c1);
    sampler_cands_merge(c1, rows1, 1, k, V, inv_t);
    c1->adj = adj;
    c1->adj_raw = ar1;
    c1->n_adj = n_adj;
    struct sample_result a;
    int rc = sampler_finish(&p, c1, no, &a);
    char why[200];
    if (st->rc) st->rc[st->rows] = (signed char)rc;
    st->rows++;
    if (rc == 0) {
        st->decided++;
        if (p.temperature > 0) st->decided_sampling++;
        ASSERT_MSG(same_result(&a, &ref, 0, why, sizeof why),
                   "tp1 V %d k %d T %g top_k %d top_p %g min_p %g lp %d/%d adj %d: %s", V, k,
                   p.temperature, p.top_k, p.top_p, p.min_p, p.n_logprobs,
                   p.logprobs_processed, n_adj, why);
    } else {
        ASSERT_EQ_INT(rc, SAMPLER_NEED_FULL);
    }

    /* tp = 2: the second rank's slice is padded (ld > n_cols) */
    int half = V / 2 + (int)(rnd() % 3), ld = V - half + 1;
    if (half > V - 1) half = V - 1;
    float *r2a = malloc(sizeof(float) * SAMPLE_ROW_FLOATS(k));
    float *r2b = malloc(sizeof(float) * SAMPLE_ROW_FLOATS(k));
    float *ar2 = calloc((size_t)n_adj + 1, sizeof(float));
    run_op(o, row, 0, half, ld > half ? ld : half, k, inv_t, race, adj, n_adj, r2a, ar2);
    run_op(o, row, half, V - half, ld, k, inv_t, race, adj, n_adj, r2b, ar2);
    const float *rows2[2] = {r2a, r2b};
    struct sample_cands *c2 = malloc(sizeof *c2);
    sampler_cands_merge(c2, rows2, 2, k, V, inv_t);
    c2->adj = adj;
    c2->adj_raw = ar2;
    c2->n_adj = n_adj;
    ASSERT_EQ_INT(c2->n, c1->n);
    ASSERT_EQ_INT(c2->complete, c1->complete);
    for (int i = 0; i < c1->n; i++) {
        ASSERT_MSG(c1->ids[i] == c2->ids[i] && same_f(c1->w[i], c2->w[i]) &&
                       same_f(c1->raw[i], c2->raw[i]),
                   "merged candidate %d: %d vs %d", i, c1->ids[i], c2->ids[i]);
    }
    ASSERT(same_f(c1->max_w, c2->max_w) && same_f(c1->max_raw, c2->max_raw));
    /* the race: the merged winner is the one-rank winner, same score */
    ASSERT_MSG(c1->race_id == c2->race_id && c1->race_score == c2->race_score &&
                   same_f(c1->race_w, c2->race_w) && same_f(c1->race_raw, c2->race_raw),
               "race winner %d (%.17g) vs %d (%.17g)", c1->race_id, c1->race_score, c2->race_id,
               c2->race_score);
    if (p.temperature > 0 && c1->race_id >= 0)
        ASSERT(c1->race_score == sampler_race_score(sampler_race_key(p.seed, (uint64_t)no),
                                                    c1->race_id, c1->race_w, inv_t));
    ASSERT(fabs(c1->sum_w - c2->sum_w) <= 1e-6 * c1->sum_w);
    ASSERT(fabs(c1->sum_raw - c2->sum_raw) <= 1e-6 * c1->sum_raw);
    for (int e = 0; e < n_adj; e++) ASSERT(same_f(ar1[e], ar2[e]));
    struct sample_result b;
    int rc2 = sampler_finish(&p, c2, no, &b);
    ASSERT_EQ_INT(rc2, rc);
    if (rc2 == 0)
        ASSERT_MSG(same_result(&b, &ref, 1e-5, why, sizeof why), "tp2: %s", why);

    free(c1);
    free(c2);
    free(r1);
    free(ar1);
    free(r2a);
    free(r2b);
    free(ar2);
    free(adj);
    sampler_hist_free(&h);
    free(row);
}

TEST(sample_cands, equal_full_sampler_random_mixes) {
    struct ops *o;
    char err[128];
    ASSERT_EQ_INT(ops_cpu_create(1, &o, err, sizeof err), 0);
    const int vocabs[] = {7, 300, 1000, 4099};
    const int ks[] = {1, 8, 64, 256};
    struct mix_stats st = {0};
    for (int vi = 0; vi < 4; vi++) {
        struct sampler s;
        ASSERT_EQ_INT(sampler_init(&s, vocabs[vi]), 0);
        for (int ki = 0; ki < 4; ki++)
            for (int it = 0; it < 60 && !test_failed(); it++)
                one_case(o, &s, vocabs[vi], ks[ki], it % 3, &st);
        sampler_free(&s);
        if (test_failed()) break;
    }
    ops_destroy(o);
    if (test_failed()) return;
    /* the candidates must decide most rows (else the path is useless) */
    ASSERT_MSG(st.decided * 10 >= st.rows * 6, "decided %d of %d", st.decided, st.rows);
    ASSERT_MSG(st.decided_sampling > st.rows / 5, "decided %d sampled rows of %d",
               st.decided_sampling, st.rows);
}

TEST(sample_cands, needed_count_decides_as_the_cap) {
    /* Each random row with the count the scheduler asks for
     * (sampler_cands_needed) is decided exactly when 256 candidates decide
     * it — and gives the full sampler's result (one_case) */
    struct ops *o;
    char err[128];
    ASSERT_EQ_INT(ops_cpu_create(1, &o, err, sizeof err), 0);
    enum { ROWS = 3 * 120 };
    static signed char rc_cap[ROWS], rc_need[ROWS];
    struct mix_stats a = {.rc = rc_cap}, b = {.rc = rc_need};
    int fewer = 0;
    for (int pass = 0; pass < 2 && !test_failed(); pass++) {
        rng_state = 0x243f6a8885a308d3ull;
        const int vocabs[] = {300, 1000, 4099};
        for (int vi = 0; vi < 3 && !test_failed(); vi++) {
            struct sampler s;
            ASSERT_EQ_INT(sampler_init(&s, vocabs[vi]), 0);
            for (int it = 0; it < ROWS / 3 && !test_failed(); it++)
                one_case(o, &s, vocabs[vi], pass ? -256 : 256, it % 3, pass ? &b : &a);
            sampler_free(&s);
        }
    }
    ops_destroy(o);
    if (test_failed()) return;
    ASSERT_EQ_INT(a.rows, ROWS);
    ASSERT_EQ_INT(b.rows, ROWS);
    for (int i = 0; i < ROWS; i++) {
        ASSERT_MSG(rc_cap[i] == rc_need[i], "row %d: %d with 256 candidates, %d with the needed count",
                   i, rc_cap[i], rc_need[i]);
        fewer += rc_need[i] == 0;
    }
    ASSERT(fewer * 10 >= ROWS * 6);
}

/* the counts themselves */
TEST(sample_cands, needed_count_rule) {
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = 0;
    p.n_logprobs = 0;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 1);
    ASSERT_EQ_INT(sampler_cands_needed(&p, 3, 256), 1);    /* greedy: adjustments do not matter */
    p.top_p = 0.5f;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 1);    /* nor filters */
    p.n_logprobs = 5;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 5);
    ASSERT_EQ_INT(sampler_cands_needed(&p, 2, 256), 256);  /* raw top 5 of an adjusted row */
    p.logprobs_processed = 1;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 2, 256), 5);
    sampling_params_default(&p);
    p.temperature = 1.0f;
    p.n_logprobs = 0;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 1);    /* the race winner */
    p.top_k = 40;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 40);
    p.top_p = 0.9f;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 40);   /* within the top 40 */
    p.top_k = 300;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 256);
    p.top_k = 0;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 256);  /* top_p alone */
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 16), 16);
    p.top_p = 1.0f;
    p.min_p = 0.05f;
    ASSERT_EQ_INT(sampler_cands_needed(&p, 0, 256), 256);
}

TEST(sample_cands, full_vocabulary_rows) {
    /* Qwen's vocabulary, K = 256: peaked rows are decided from candidates */
    enum { V = 151936 };
    struct ops *o;
    char err[128];
    ASSERT_EQ_INT(ops_cpu_create(1, &o, err, sizeof err), 0);
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    struct mix_stats st = {0};
    for (int it = 0; it < 12 && !test_failed(); it++) one_case(o, &s, V, 256, it % 2, &st);
    sampler_free(&s);
    ops_destroy(o);
    if (test_failed()) return;
    ASSERT(st.decided > 0);
}

TEST(sample_cands, forced_fallbacks) {
    /* flat row, K = 16: pure temperature draws are decided by the race (and
     * need the full row without it); top_k > K, a wide top_p and a wide min_p
     * are decided when the race winner is among the candidates (rarely here),
     * else they ask for the full row; decided results equal the reference */
    enum { V = 2000, K = 16 };
    struct ops *o;
    char err[128];
    ASSERT_EQ_INT(ops_cpu_create(1, &o, err, sizeof err), 0);
    struct sampler s;
    ASSERT_EQ_INT(sampler_init(&s, V), 0);
    float *row = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) row[i] = (float)(gauss() * 0.01);
    float out[SAMPLE_ROW_FLOATS(K)];
    float dummy[1];
    struct sampling_params p;
    sampling_params_default(&p);
    struct sample_cands *c = malloc(sizeof *c);
    struct sample_result r, ref;
    const float *rows[1] = {out};
    /* without the race: every pure-temperature draw needs the full row */
    run_op(o, row, 0, V, V, K, sampler_inv_t(&p), NULL, NULL, 0, out, dummy);
    sampler_cands_merge(c, rows, 1, K, V, sampler_inv_t(&p));
    ASSERT_EQ_INT(c->n, K);
    ASSERT_EQ_INT(c->complete, 0);
    ASSERT_EQ_INT(c->race_id, -1);
    ASSERT_EQ_INT(sampler_finish(&p, c, 0, &r), SAMPLER_NEED_FULL);
    /* with it: never; and the same token as the reference */
    int beyond = 0;
    for (int i = 0; i < 50; i++) {
        p.seed = (uint64_t)i;
        int32_t race[3];
        sampler_race_row(&p, 3, race);
        run_op(o, row, 0, V, V, K, sampler_inv_t(&p), race, NULL, 0, out, dummy);
        sampler_cands_merge(c, rows, 1, K, V, sampler_inv_t(&p));
        ASSERT_EQ_INT(sampler_finish(&p, c, 3, &r), 0);
        sampler_sample(&s, &p, row, NULL, 0, NULL, 3, &ref);
        ASSERT_EQ_INT(r.token, ref.token);
        ASSERT(r.logprob == ref.logprob);
        int in = 0;
        for (int j = 0; j < K; j++) in |= c->ids[j] == r.token;
        beyond += !in;
        /* the filters that reach beyond the candidates */
        int full = 0;
        const int tks[3] = {K + 1, 0, 0};
        const float tps[3] = {1.0f, 0.9f, 1.0f}, mps[3] = {0, 0, 0.5f};
        for (int f = 0; f < 3; f++) {
            p.top_k = tks[f];
            p.top_p = tps[f];
            p.min_p = mps[f];
            int rc = sampler_finish(&p, c, 3, &r);
            sampler_sample(&s, &p, row, NULL, 0, NULL, 3, &ref);
            if (rc == SAMPLER_NEED_FULL) full++;
            else ASSERT_EQ_INT(r.token, ref.token);
            ASSERT_EQ_INT(rc == 0, in); /* decided exactly when the winner is a candidate */
        }
        p.top_k = 0;
        p.top_p = 1;
        p.min_p = 0;
    }
    ASSERT_MSG(beyond >= 40, "only %d of 50 race winners beyond the candidates", beyond);
    p.top_k = K; /* exactly K: decided (a race over the candidates on the host) */
    ASSERT_EQ_INT(sampler_finish(&p, c, 3, &r), 0);
    sampler_sample(&s, &p, row, NULL, 0, NULL, 3, &ref);
    ASSERT_EQ_INT(r.token, ref.token);
    p.top_k = 0;
    p.temperature = 0; /* greedy never needs more */
    p.n_logprobs = K + 4 > SAMPLER_MAX_LOGPROBS ? SAMPLER_MAX_LOGPROBS : K + 4;
    ASSERT_EQ_INT(sampler_finish(&p, c, 0, &r), SAMPLER_NEED_FULL); /* 20 > 16 logprobs */
    p.n_logprobs = 5;
    ASSERT_EQ_INT(sampler_finish(&p, c, 0, &r), 0);
    ASSERT_EQ_INT(r.token, c->ids[0]);
    free(c);
    free(row);
    sampler_free(&s);
    ops_destroy(o);
}

TEST(sample_cands, history_and_adjustments) {
    /* incremental history: distinct ascending ids, output counts */
    struct sampler_hist h = {0};
    int32_t seq[] = {5, 3, 5, 9, 3, 3};
    for (int i = 0; i < 6; i++) ASSERT_EQ_INT(sampler_hist_add(&h, seq[i], i >= 3), 0);
    ASSERT_EQ_INT(h.n, 3);
    ASSERT(h.tok[0] == 3 && h.tok[1] == 5 && h.tok[2] == 9);
    ASSERT(h.cnt[0] == 2 && h.cnt[1] == 0 && h.cnt[2] == 1);
    struct sampling_params p;
    sampling_params_default(&p);
    p.repetition_penalty = 1.5f;
    p.frequency_penalty = 0.5f;
    struct logit_bias lb[3] = {{9, 1.0f}, {4, -INFINITY}, {9, 2.0f}};
    p.logit_bias = lb;
    p.n_logit_bias = 3;
    int32_t adj[32];
    ASSERT(sampler_adj_max(&p, &h) <= 16);
    int n = sampler_adj_build(&p, &h, 100, adj);
    /* 3: REP, SUB(1.0) / 4: ADD -inf / 5: REP / 9: ADD 1, ADD 2, REP, SUB(0.5) */
    ASSERT_EQ_INT(n, 8);
    const int want_tok[8] = {3, 3, 4, 5, 9, 9, 9, 9};
    const int want_op[8] = {SAMPLE_ADJ_REP, SAMPLE_ADJ_SUB, SAMPLE_ADJ_ADD, SAMPLE_ADJ_REP,
                            SAMPLE_ADJ_ADD, SAMPLE_ADJ_ADD, SAMPLE_ADJ_REP, SAMPLE_ADJ_SUB};
    for (int i = 0; i < 8; i++) {
        ASSERT_EQ_INT(adj[2 * i] >> 2, want_tok[i]);
        ASSERT_EQ_INT(adj[2 * i] & 3, want_op[i]);
    }
    float v;
    memcpy(&v, &adj[2 * 1 + 1], sizeof v);
    ASSERT(v == 1.0f); /* frequency 0.5 * count 2 */
    memcpy(&v, &adj[2 * 4 + 1], sizeof v);
    ASSERT(v == 1.0f); /* bias entries keep their order */
    memcpy(&v, &adj[2 * 5 + 1], sizeof v);
    ASSERT(v == 2.0f);
    sampler_hist_free(&h);
}
