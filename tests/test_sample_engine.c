/* test_sample_engine.c — the scheduler's sampling through candidates
 * (MODEL_LOGITS_SAMPLE, incremental penalty history, per-row adjustments,
 * min_tokens bans, n > 1 forks, full-row fallbacks) gives exactly the tokens
 * and logprobs of the full-row path (AWQD_SAMPLE_CANDIDATES=0), on the CPU
 * backend at tp 1 and 2, with K = 256 and with K = 4 (mostly fallbacks), and
 * for a batch of unfiltered rows, whose steps ask for 5 and then 1 candidate
 * per row (sampler_cands_needed). */
#include "tests/harness/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/cfg.h"
#include "engine/engine.h"

#define N_REQ 5
#define MAX_TOK 12

struct got {
    int n_tok[N_REQ][2];
    int32_t tok[N_REQ][2][MAX_TOK];
    float lp[N_REQ][2][MAX_TOK];
    int32_t top[N_REQ][2][MAX_TOK][ENGINE_MAX_LOGPROBS];
};

/* plain: no top_k / top_p / min_p, penalties or bias; logprobs only on
 * request 3, which stops early (the later steps need one candidate a row). */
static void run_engine(const char *model, int tp, const char *cands, const char *kenv, int plain,
                       struct got *g) {
    setenv("AWQD_SAMPLE_CANDIDATES", cands, 1);
    if (kenv) setenv("AWQD_SAMPLE_K", kenv, 1);
    else unsetenv("AWQD_SAMPLE_K");
    struct engine_opts o;
    engine_opts_defaults(&o);
    o.model_dir = model;
    o.backend = CFG_BACKEND_CPU;
    o.tp = tp;
    o.cpu_threads = 1;
    o.kv_cache_tokens = 4096;
    struct engine *e = NULL;
    char err[256];
    int rc = engine_init(&e, &o, err, sizeof err);
    unsetenv("AWQD_SAMPLE_CANDIDATES");
    unsetenv("AWQD_SAMPLE_K");
    ASSERT_MSG(rc == 0, "engine_init: %s", err);
    ASSERT_EQ_INT(engine_start(e, err, sizeof err), 0);
    memset(g, 0, sizeof *g);
    int32_t prompt[N_REQ][8];
    int32_t bias_ids[3] = {7, 11, 13};
    float bias_vals[3] = {3.0f, -100.0f, 1.5f};
    uint64_t ids[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        for (int j = 0; j < 8; j++) prompt[i][j] = (int32_t)((i * 37 + j * 11) % 300 + 1);
        struct engine_request r = {0};
        r.prompt = prompt[i];
        r.n_prompt = 8;
        r.n = i == 2 ? 2 : 1;
        r.max_tokens = MAX_TOK;
        r.temperature = (const float[]){0.0f, 0.9f, 1.0f, 0.7f, 1.3f}[i];
        r.top_p = i == 3 ? 0.95f : 1.0f;
        r.top_k = i == 4 ? 30 : 0;
        r.min_p = i == 1 ? 0.01f : 0.0f;
        r.repetition_penalty = i == 1 || i == 2 ? 1.4f : 1.0f;
        r.presence_penalty = i == 2 ? 0.6f : 0.0f;
        r.frequency_penalty = i == 3 ? 0.8f : 0.0f;
        if (i >= 1) {
            r.n_logit_bias = 3;
            r.logit_bias_ids = bias_ids;
            r.logit_bias_vals = bias_vals;
        }
        r.has_seed = 1;
        r.seed = 1000 + (uint64_t)i;
        r.logprobs = i % 2 ? 5 : 0;
        r.min_tokens = i == 0 ? 4 : 0;
        if (plain) {
            r.top_p = 1.0f;
            r.top_k = 0;
            r.min_p = 0.0f;
            r.repetition_penalty = 1.0f;
            r.presence_penalty = r.frequency_penalty = 0.0f;
            r.n_logit_bias = 0;
            r.logprobs = i == 3 ? 5 : 0;
            if (i == 3) r.max_tokens = MAX_TOK / 2;
        }
        r.ud = (void *)(intptr_t)i;
        ASSERT_MSG(engine_submit(e, &r, &ids[i], err, sizeof err) == 0, "submit: %s", err);
    }
    int ended = 0;
    for (int spin = 0; ended < N_REQ && spin < 200000; spin++) {
        struct engine_event *ev = engine_poll(e);
        if (!ev) {
            usleep(1000);
            continue;
        }
        while (ev) {
            struct engine_event *nx = ev->next;
            int i = (int)(intptr_t)ev->ud, c = ev->choice;
            if (ev->kind == ENGINE_EV_END) ended++;
            if (ev->kind == ENGINE_EV_FINISH && ev->finish == ENGINE_FINISH_ERROR)
                test_fail(__FILE__, __LINE__, "request %d: %s", i, ev->message);
            if (ev->kind == ENGINE_EV_TOKENS && !ev->is_prompt)
                for (int t = 0; t < ev->n_tokens && g->n_tok[i][c] < MAX_TOK; t++) {
                    int k = g->n_tok[i][c]++;
                    g->tok[i][c][k] = ev->tokens[t].id;
                    g->lp[i][c][k] = ev->tokens[t].logprob;
                    for (int j = 0; j < ev->tokens[t].n_top; j++)
                        g->top[i][c][k][j] = ev->tokens[t].top_ids[j];
                }
            engine_event_free(ev);
            ev = nx;
        }
    }
    ASSERT_EQ_INT(ended, N_REQ);
    engine_free(e);
}

static void compare(const struct got *a, const struct got *b, double tol, const char *what) {
    for (int i = 0; i < N_REQ; i++)
        for (int c = 0; c < 2; c++) {
            ASSERT_MSG(a->n_tok[i][c] == b->n_tok[i][c], "%s: request %d choice %d: %d vs %d tokens",
                       what, i, c, a->n_tok[i][c], b->n_tok[i][c]);
            for (int t = 0; t < a->n_tok[i][c]; t++) {
                ASSERT_MSG(a->tok[i][c][t] == b->tok[i][c][t],
                           "%s: request %d choice %d token %d: %d vs %d", what, i, c, t,
                           a->tok[i][c][t], b->tok[i][c][t]);
                ASSERT_MSG(fabs(a->lp[i][c][t] - b->lp[i][c][t]) <= tol,
                           "%s: request %d token %d logprob %.9g vs %.9g", what, i, t,
                           a->lp[i][c][t], b->lp[i][c][t]);
                for (int j = 0; j < ENGINE_MAX_LOGPROBS; j++)
                    ASSERT(a->top[i][c][t][j] == b->top[i][c][t][j]);
            }
        }
}

TEST(sample_engine, candidates_equal_full_rows_tp1_tp2) {
    const char *model = test_fixture("qwen3-tiny-awq");
    if (!model || access(model, R_OK) != 0) TEST_SKIP("fixture not installed");
    struct got *full = malloc(sizeof *full), *cand = malloc(sizeof *cand);
    for (int tp = 1; tp <= 2 && !test_failed(); tp++) {
        run_engine(model, tp, "0", NULL, 0, full);
        ASSERT_OK_SO_FAR();
        int total = 0;
        for (int i = 0; i < N_REQ; i++) total += full->n_tok[i][0];
        ASSERT(total >= N_REQ * 4); /* min_tokens etc.: something was generated */
        run_engine(model, tp, "1", NULL, 0, cand);
        ASSERT_OK_SO_FAR();
        compare(cand, full, tp == 1 ? 0 : 1e-5, tp == 1 ? "tp1 K=256" : "tp2 K=256");
        ASSERT_OK_SO_FAR();
        run_engine(model, tp, "1", "4", 0, cand);
        ASSERT_OK_SO_FAR();
        compare(cand, full, tp == 1 ? 0 : 1e-5, tp == 1 ? "tp1 K=4" : "tp2 K=4");
        ASSERT_OK_SO_FAR();
        run_engine(model, tp, "0", NULL, 1, full);
        ASSERT_OK_SO_FAR();
        ASSERT(full->n_tok[3][0] >= 1 && full->n_tok[3][0] <= MAX_TOK / 2);
        run_engine(model, tp, "1", NULL, 1, cand);
        ASSERT_OK_SO_FAR();
        compare(cand, full, tp == 1 ? 0 : 1e-5, tp == 1 ? "tp1 plain" : "tp2 plain");
    }
    free(full);
    free(cand);
}
