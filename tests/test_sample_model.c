/* test_sample_model.c — MODEL_LOGITS_SAMPLE through a model group on the
 * fixtures (CPU backend, tp 1 and 2): the candidates of a mixed batch match
 * the full logits of the same rows, sampler_finish on them equals
 * sampler_sample on the full row, model_group_sample_row_logits returns the
 * row exactly, tp = 2 gives the candidates of tp = 1, and lm_head calls of
 * 2 rows (two sample chunks) give tp = 1's candidates bit for bit. */
#include "tests/harness/test.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "tests/harness/model_fixture.h"

enum { K = 64 };

struct run {
    float *full;                  /* [4, V] LAST logits of every prompt */
    float *cands;                 /* [tp, 3, RF] SAMPLE rows (prompts 0, 2, 3) */
    float *adj_raw;
    float *row[3];                /* model_group_sample_row_logits */
};

static const int sample_prompt[3] = {0, 2, 3};

static void params_for(int i, struct sampling_params *p) {
    sampling_params_default(p);
    p->temperature = (const float[]){0.0f, 0.8f, 1.2f}[i];
    p->top_p = i == 1 ? 0.9f : 1.0f;
    p->top_k = i == 1 ? 50 : 0; /* row 2: pure temperature (the op's race decides) */
    p->min_p = i == 1 ? 0.02f : 0.0f;
    p->repetition_penalty = i == 1 ? 1.3f : 1.0f;
    p->presence_penalty = i == 2 ? 0.5f : 0.0f;
    p->seed = 1234 + (uint64_t)i;
    p->n_logprobs = 5;
}

static void run_group(struct mt_fixture *f, int tp, int logit_chunk, const int32_t *adj,
                      const int32_t *adj_start, struct run *out) {
    struct model_group *g = NULL;
    if (mt_group_chunk(f, "cpu", tp, 64, 256, logit_chunk, &g)) return;
    int V = f->vocab;
    size_t RF = SAMPLE_ROW_FLOATS(K);
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 64, 16), 0);
    struct kv_seq seq[4] = {{0}};
    struct batch_seq bs[4];
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &seq[i], f->plen[i]), 0);
        bs[i] = (struct batch_seq){f->prompt[i], f->plen[i], 0, seq[i].blocks, seq[i].n_blocks,
                                   MODEL_LOGITS_LAST};
    }
    struct batch b = {bs, 4};
    char err[512];
    out->full = malloc(sizeof(float) * 4 * (size_t)V);
    ASSERT_MSG(model_group_forward(g, &b, out->full, err, sizeof err) == 0, "%s", err);
    /* the same rows again, prompts 0, 2, 3 as candidates */
    for (int i = 0; i < 3; i++) bs[sample_prompt[i]].logits = MODEL_LOGITS_SAMPLE;
    ASSERT_EQ_INT(model_sample_rows(&b), 3);
    ASSERT_EQ_INT(model_logit_rows(&b), 1);
    float inv_t[3];
    for (int i = 0; i < 3; i++) {
        struct sampling_params p;
        params_for(i, &p);
        inv_t[i] = sampler_inv_t(&p);
    }
    float *one = malloc(sizeof(float) * (size_t)V);
    out->cands = malloc(sizeof(float) * (size_t)tp * 3 * RF);
    out->adj_raw = calloc((size_t)adj_start[3] + 1, sizeof(float));
    int32_t race[9];
    for (int i = 0; i < 3; i++) { /* n_output: the t % 3 == 0 prompt positions (check_fixture) */
        struct sampling_params p;
        params_for(i, &p);
        sampler_race_row(&p, (f->plen[sample_prompt[i]] + 2) / 3, race + 3 * i);
    }
    struct model_out mo = {.logits = one, .k = K, .inv_t = inv_t, .adj_start = adj_start,
                           .adj = adj, .cands = out->cands, .adj_raw = out->adj_raw,
                           .race = race};
    ASSERT_MSG(model_group_forward_out(g, &b, &mo, err, sizeof err) == 0, "%s", err);
    for (int v = 0; v < V; v++) ASSERT(one[v] == out->full[(size_t)1 * V + v]);
    for (int i = 2; i >= 0; i--) { /* last chunk first: no recompute; then the others */
        out->row[i] = malloc(sizeof(float) * (size_t)V);
        ASSERT_MSG(model_group_sample_row_logits(g, i, out->row[i], err, sizeof err) == 0, "%s",
                   err);
    }
    ASSERT(model_group_sample_row_logits(g, 3, one, err, sizeof err) == -EINVAL);
    free(one);
    for (int i = 0; i < 4; i++) kv_seq_free(&kv, &seq[i]);
    kv_free(&kv);
    model_group_free(g);
}

static void check_fixture(const char *name) {
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    int V = f.vocab;
    size_t RF = SAMPLE_ROW_FLOATS(K);
    /* adjustments: each sample row's prompt as penalty history, plus a ban */
    struct sampler_hist h[3] = {{0}};
    int32_t adj_start[4] = {0};
    int32_t *adj = malloc(sizeof(int32_t) * 2 * 4096);
    struct logit_bias ban = {0, -INFINITY};
    for (int i = 0; i < 3; i++) {
        int P = sample_prompt[i];
        for (int t = 0; t < f.plen[P]; t++) sampler_hist_add(&h[i], f.prompt[P][t], t % 3 == 0);
        struct sampling_params p;
        params_for(i, &p);
        p.logit_bias = &ban;
        p.n_logit_bias = 1;
        adj_start[i + 1] = adj_start[i] + sampler_adj_build(&p, &h[i], V, adj + 2 * adj_start[i]);
    }
    struct run r1 = {0}, r2 = {0}, rc2 = {0};
    run_group(&f, 1, 0, adj, adj_start, &r1);
    if (!test_failed()) run_group(&f, 2, 0, adj, adj_start, &r2);
    if (!test_failed()) run_group(&f, 1, 2, adj, adj_start, &rc2); /* rows {0, 1} and {2} */
    for (int i = 0; i < 3 && !test_failed(); i++) {
        ASSERT(memcmp(rc2.cands + (size_t)i * RF, r1.cands + (size_t)i * RF, sizeof(float) * RF) == 0);
        ASSERT(memcmp(rc2.row[i], r1.row[i], sizeof(float) * (size_t)V) == 0);
    }
    if (!test_failed())
        ASSERT(memcmp(rc2.adj_raw, r1.adj_raw, sizeof(float) * (size_t)adj_start[3]) == 0);
    struct sampler s;
    sampler_init(&s, V);
    for (int tpi = 0; tpi < 2 && !test_failed(); tpi++) {
        int tp = tpi + 1;
        struct run *r = tpi ? &r2 : &r1;
        for (int i = 0; i < 3 && !test_failed(); i++) {
            int P = sample_prompt[i];
            const float *full = r->full + (size_t)P * V;
            for (int v = 0; v < V; v++) ASSERT(r->row[i][v] == full[v]);
            struct sampling_params p;
            params_for(i, &p);
            p.logit_bias = &ban;
            p.n_logit_bias = 1;
            const float *rows[2];
            for (int k = 0; k < tp; k++) rows[k] = r->cands + ((size_t)k * 3 + i) * RF;
            struct sample_cands *c = malloc(sizeof *c);
            sampler_cands_merge(c, rows, tp, K, V, sampler_inv_t(&p));
            c->adj = adj + 2 * adj_start[i];
            c->adj_raw = r->adj_raw + adj_start[i];
            c->n_adj = adj_start[i + 1] - adj_start[i];
            ASSERT_EQ_INT(c->n, K);
            /* the raw values are the row's; the order is by processed value */
            for (int j = 0; j < K; j++) {
                ASSERT(c->raw[j] == full[c->ids[j]]);
                if (j) ASSERT(c->w[j] < c->w[j - 1] || (c->w[j] == c->w[j - 1] && c->ids[j] > c->ids[j - 1]));
            }
            ASSERT(c->ids[0] != 0 || V == 1); /* banned */
            /* the history's prompt tokens: outputs in h are the t % 3 == 0
             * positions; the reference gets the same split */
            int32_t *pr = malloc(sizeof(int32_t) * (size_t)f.plen[P]);
            int32_t *ou = malloc(sizeof(int32_t) * (size_t)f.plen[P]);
            int np = 0, no = 0;
            for (int t = 0; t < f.plen[P]; t++)
                if (t % 3 == 0) ou[no++] = f.prompt[P][t];
                else pr[np++] = f.prompt[P][t];
            struct sample_result ref, got;
            sampler_sample(&s, &p, full, pr, np, ou, no, &ref);
            int frc = sampler_finish(&p, c, no, &got);
            ASSERT_MSG(frc == 0, "tp %d row %d: not decided from %d candidates", tp, i, K);
            if (i == 0) ASSERT_EQ_INT(c->race_id, -1); /* greedy rows do not race */
            else ASSERT(c->race_id >= 0);
            ASSERT_EQ_INT(got.token, ref.token);
            ASSERT_NEAR(got.logprob, ref.logprob, tp == 1 ? 0 : 1e-5);
            for (int j = 0; j < ref.n_top; j++) {
                ASSERT_EQ_INT(got.top_ids[j], ref.top_ids[j]);
                ASSERT_NEAR(got.top_logprobs[j], ref.top_logprobs[j], tp == 1 ? 0 : 1e-5);
            }
            free(pr);
            free(ou);
            free(c);
        }
    }
    /* tp = 2 candidates are tp = 1's (logits agree to ~1e-5) */
    for (int i = 0; i < 3 && !test_failed(); i++) {
        const float *a1[1] = {r1.cands + (size_t)i * RF};
        const float *a2[2] = {r2.cands + (size_t)i * RF, r2.cands + ((size_t)3 + i) * RF};
        struct sample_cands *c1 = malloc(sizeof *c1), *c2 = malloc(sizeof *c2);
        struct sampling_params p;
        params_for(i, &p);
        sampler_cands_merge(c1, a1, 1, K, V, sampler_inv_t(&p));
        sampler_cands_merge(c2, a2, 2, K, V, sampler_inv_t(&p));
        ASSERT_EQ_INT(c1->ids[0], c2->ids[0]);
        for (int j = 0; j < K; j++) ASSERT_NEAR(c1->w[j], c2->w[j], 1e-3);
        ASSERT_NEAR(c1->sum_w, c2->sum_w, 1e-4 * c1->sum_w);
        free(c1);
        free(c2);
    }
    sampler_free(&s);
    for (int i = 0; i < 3; i++) {
        sampler_hist_free(&h[i]);
        free(r1.row[i]);
        free(r2.row[i]);
        free(rc2.row[i]);
    }
    free(rc2.full);
    free(rc2.cands);
    free(rc2.adj_raw);
    free(r1.full);
    free(r2.full);
    free(r1.cands);
    free(r2.cands);
    free(r1.adj_raw);
    free(r2.adj_raw);
    free(adj);
    mt_fixture_close(&f);
}

TEST(sample_model, qwen3_candidates_match_full_rows_tp1_tp2) { check_fixture("qwen3-tiny-awq"); }
TEST(sample_model, qwen2_candidates_match_full_rows_tp1_tp2) { check_fixture("qwen2-tiny-awq"); }
