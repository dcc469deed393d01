/* test_model_cuda.c — the whole model on the CUDA backend against the three
 * fixtures' Hugging Face references (fp32) and the CPU backend.
 *
 * Tolerance (fp16 activations and KV cache, fp32 accumulation):
 *     |logit_cuda - logit_ref| <= TOL * max|logit_ref|   at every position,
 *     TOL = 2e-2.
 * Greedy tokens: the reference's 24 greedy tokens must come out of CUDA's own
 * greedy decode up to the first step whose top-2 margin (from the CPU
 * backend, which matches the reference to ~1e-6, teacher-forced on the
 * reference tokens) is <= TOL * max|logit| — past such a step an fp16 run may
 * legitimately take the other branch. Teacher-forced, CUDA's argmax must equal
 * the reference token at every step whose margin exceeds the tolerance.
 * Batched runs (all four prompts at once; staggered joins with prefill chunks
 * riding along decodes) must match the run alone within the same tolerance;
 * no KV block may leak. `awqd generate --backend cuda --logits-out` is checked
 * the same way through the command line. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/util.h"
#include "tests/harness/model_fixture.h"
#include "tests/harness/test.h"

#define MC_TOL 2e-2

/* From the CPU backend, teacher-forced on prompt + greedy: per prompt and
 * greedy step t, the top-2 margin before token t and the largest |logit|. */
struct mc_margins {
    float margin[MT_PROMPTS][MT_GREEDY];
    float maxabs[MT_PROMPTS][MT_GREEDY];
};

static int gpu_present(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static void top2(const float *x, int n, float *margin, float *mx) {
    float a = -INFINITY, b = -INFINITY, m = 0;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
        m = fmaxf(m, fabsf(x[i]));
    }
    *margin = a - b;
    *mx = m;
}

/* One sequence alone through g, logits for every row: out [n, V]. */
static void forward_all(struct model_group *g, const int32_t *ids, int n, int V, int chunk,
                        float *out) {
    const struct model_opts *mo = model_opts(model_group_rank0(g));
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, mo->n_blocks, mo->block_size), 0);
    struct kv_seq seq = {0};
    char err[512];
    for (int pos = 0; pos < n; pos += chunk) {
        int m = n - pos < chunk ? n - pos : chunk;
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &seq, pos + m), 0);
        struct batch_seq s = {ids + pos, m, pos, seq.blocks, seq.n_blocks, MODEL_LOGITS_ALL};
        struct batch b = {&s, 1};
        int rc = model_group_forward(g, &b, out + (size_t)pos * V, err, sizeof err);
        ASSERT_MSG(rc == 0, "forward: %s", err);
    }
    kv_seq_free(&kv, &seq);
    ASSERT_EQ_INT(kv_free_blocks(&kv), mo->n_blocks);
    kv_free(&kv);
}

/* prompt + greedy[0..22] teacher-forced: rows plen-1+t predict greedy[t]. */
static void teacher_forced(struct model_group *g, struct mt_fixture *f, int i, float *out) {
    int n = f->plen[i] + MT_GREEDY - 1;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    memcpy(ids, f->prompt[i], (size_t)f->plen[i] * sizeof *ids);
    memcpy(ids + f->plen[i], f->greedy[i], (MT_GREEDY - 1) * sizeof *ids);
    forward_all(g, ids, n, f->vocab, 64, out);
    free(ids);
}

/* Logits vs a reference at TOL; returns the worst |diff| / max|ref|. */
static double check_logits(const char *what, int i, const float *a, const float *ref, int n, int V) {
    double worst = 0;
    for (int p = 0; p < n; p++) {
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(ref[(size_t)p * V + v]));
            d = test_err_max(d, fabs(a[(size_t)p * V + v] - ref[(size_t)p * V + v]));
        }
        double q = mx > 0 ? d / mx : d;
        if (q > worst) worst = q;
        if (!(d <= MC_TOL * mx)) {
            test_fail(__FILE__, __LINE__, "%s prompt %d position %d: max |diff| %g > %g * max|logit| %g",
                      what, i, p, d, MC_TOL, mx);
            return worst;
        }
    }
    return worst;
}

/* Tokens equal up to the first low-margin step; returns steps compared. */
static int check_tokens(const char *what, const struct mt_fixture *f, const struct mc_margins *m,
                        int i, const int32_t *tok) {
    for (int t = 0; t < MT_GREEDY; t++) {
        if (m->margin[i][t] <= MC_TOL * m->maxabs[i][t]) return t;
        if (tok[t] != f->greedy[i][t]) {
            test_fail(__FILE__, __LINE__, "%s prompt %d greedy token %d: %d != %d (margin %g)", what,
                      i, t, tok[t], f->greedy[i][t], m->margin[i][t]);
            return t;
        }
    }
    return MT_GREEDY;
}

static const char *fixtures[3] = {"qwen3-tiny-awq", "qwen2-tiny-awq", "llama-tiny-awq"};

static void check_fixture(const char *name) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    if (rc) return;
    int V = f.vocab;
    struct model_group *cpu = NULL, *gpu = NULL;
    if (mt_group(&f, "cpu", 1, 64, 256, &cpu) || mt_group(&f, "cuda", 1, 64, 256, &gpu)) goto out;
    struct mc_margins mg;
    memset(&mg, 0, sizeof mg);
    /* margins from the CPU backend, teacher-forced; CPU greedy = reference */
    for (int i = 0; i < f.n && !test_failed(); i++) {
        int n = f.plen[i] + MT_GREEDY - 1;
        float *lc = malloc((size_t)n * V * sizeof(float)), *lg = malloc((size_t)n * V * sizeof(float));
        teacher_forced(cpu, &f, i, lc);
        if (!test_failed()) teacher_forced(gpu, &f, i, lg);
        int low = 0, agree = 0;
        for (int t = 0; t < MT_GREEDY && !test_failed(); t++) {
            const float *c = lc + (size_t)(f.plen[i] - 1 + t) * V;
            const float *g = lg + (size_t)(f.plen[i] - 1 + t) * V;
            top2(c, V, &mg.margin[i][t], &mg.maxabs[i][t]);
            if (mt_argmax(c, V) != f.greedy[i][t]) {
                test_fail(__FILE__, __LINE__, "%s prompt %d: CPU greedy token %d differs from the reference",
                          name, i, t);
                break;
            }
            if (mg.margin[i][t] <= MC_TOL * mg.maxabs[i][t]) {
                low++;
                continue;
            }
            if (mt_argmax(g, V) != f.greedy[i][t]) {
                test_fail(__FILE__, __LINE__, "%s prompt %d teacher-forced step %d: cuda %d, ref %d (margin %g)",
                          name, i, t, mt_argmax(g, V), f.greedy[i][t], mg.margin[i][t]);
                break;
            }
            agree++;
        }
        /* logits of the whole teacher-forced sequence vs CPU */
        if (!test_failed()) {
            char w[96];
            snprintf(w, sizeof w, "%s teacher-forced vs cpu", name);
            double q = check_logits(w, i, lg, lc, n, V);
            fprintf(stderr, "  %s prompt %d (len %d): teacher-forced max|diff|/max|logit| %.2e, argmax agrees on %d/%d "
                   "steps (%d below the margin)\n",
                   name, i, f.plen[i], q, agree, MT_GREEDY - low, low);
        }
        free(lc);
        free(lg);
    }
    if (test_failed()) goto out;
    /* alone: prompt logits vs the reference, free-running greedy */
    struct mt_result alone, r;
    mt_run(gpu, &f, 64, NULL, 256, &alone);
    if (test_failed()) goto out;
    for (int i = 0; i < f.n && !test_failed(); i++) {
        double q = check_logits(name, i, alone.logits[i], f.logits[i], f.plen[i], V);
        int k = check_tokens(name, &f, &mg, i, alone.tokens[i]);
        fprintf(stderr, "  %s prompt %d: prompt logits max|diff|/max|logit| %.2e; greedy equal for %d/%d steps "
               "(compared up to the first low-margin step)\n",
               name, i, q, k, MT_GREEDY);
    }
    if (test_failed()) {
        mt_result_free(&alone);
        goto out;
    }
    /* all at once, and staggered with chunks of 16 riding along decodes */
    const int together[4] = {0, 0, 0, 0}, stagger[4] = {3, 0, 1, 5};
    for (int mode = 0; mode < 2 && !test_failed(); mode++) {
        mt_run(gpu, &f, mode ? 16 : 256, mode ? stagger : together, mode ? 40 : 256, &r);
        for (int i = 0; i < f.n && !test_failed(); i++) {
            char w[96];
            snprintf(w, sizeof w, "%s %s", name, mode ? "staggered" : "batched");
            check_logits(w, i, r.logits[i], f.logits[i], f.plen[i], V);
            if (!test_failed()) check_tokens(w, &f, &mg, i, r.tokens[i]);
        }
        mt_result_free(&r);
    }
    mt_result_free(&alone);
out:
    model_group_free(gpu);
    model_group_free(cpu);
    mt_fixture_close(&f);
}

TEST(model_cuda, qwen3_fixture) { check_fixture(fixtures[0]); }
TEST(model_cuda, qwen2_fixture) { check_fixture(fixtures[1]); }
TEST(model_cuda, llama_fixture) { check_fixture(fixtures[2]); }

/* `awqd generate --backend cuda --logits-out --json` on every prompt. */
TEST(model_cuda, generate_cli) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    int ran = 0;
    for (int fi = 0; fi < 3 && !test_failed(); fi++) {
        struct mt_fixture f;
        int rc = mt_fixture_open(fixtures[fi], &f);
        if (rc == 1) continue;
        if (rc) return;
        for (int i = 0; i < f.n && !test_failed(); i++) {
            char *ids = malloc((size_t)f.plen[i] * 8 + 1), *out = NULL;
            size_t o = 0;
            for (int j = 0; j < f.plen[i]; j++) o += (size_t)sprintf(ids + o, "%s%d", j ? "," : "", f.prompt[i][j]);
            char path[512], *cmd = malloc(o + 2048);
            snprintf(path, sizeof path, "%s/logits.safetensors", test_tmpdir());
            sprintf(cmd, "%s generate --backend cuda --model %s --prompt-ids %s --max-tokens 24 "
                         "--ignore-eos --json --logits-out %s --chunk 16",
                    test_awqd_bin(), test_fixture(fixtures[fi]), ids, path);
            free(ids);
            rc = test_run(cmd, &out);
            free(cmd);
            if (rc != 0) {
                test_fail(__FILE__, __LINE__, "%s prompt %d: awqd generate exited %d: %.500s",
                          fixtures[fi], i, rc, out ? out : "");
                free(out);
                break;
            }
            struct safetensors *st = NULL;
            char err[256];
            if (safetensors_open(path, &st, err, sizeof err)) {
                test_fail(__FILE__, __LINE__, "%s", err);
                free(out);
                break;
            }
            const struct st_tensor *t = safetensors_find(st, "logits");
            if (!t || t->dtype != ST_F32 || t->shape[0] != f.plen[i] || t->shape[1] != f.vocab) {
                test_fail(__FILE__, __LINE__, "%s prompt %d: bad logits tensor", fixtures[fi], i);
            } else {
                check_logits(fixtures[fi], i, t->data, f.logits[i], f.plen[i], f.vocab);
                /* first greedy token (margins are checked in the fixture tests) */
                char want[32];
                snprintf(want, sizeof want, "\"output_ids\":[%d", f.greedy[i][0]);
                float mg, mx;
                top2(f.logits[i] + (size_t)(f.plen[i] - 1) * f.vocab, f.vocab, &mg, &mx);
                if (!test_failed() && mg > MC_TOL * mx && (!out || !strstr(out, want)))
                    test_fail(__FILE__, __LINE__, "%s prompt %d: output %.300s lacks %s", fixtures[fi],
                              i, out ? out : "", want);
            }
            safetensors_close(st);
            free(out);
            ran++;
        }
        mt_fixture_close(&f);
    }
    if (!ran && !test_failed()) TEST_SKIP("fixtures not installed");
}

/* ---- synthetic Qwen3-0.6B: a batch of 32 mixed prompts = each alone ------- */

#define SB_N 32
#define SB_STEPS 8

/* Runs the sequences idx[0..cnt) together: one forward prefills all their
 * prompts (last-row logits), then SB_STEPS - 1 batched greedy decode steps.
 * tok/margin/maxabs: [SB_N][SB_STEPS] (rows of idx are written). */
static void sb_run(struct model_group *g, int V, int32_t *const *prompts, const int *lens,
                   const int *idx, int cnt, int32_t tok[][SB_STEPS], float margin[][SB_STEPS],
                   float maxabs[][SB_STEPS]) {
    const struct model_opts *mo = model_opts(model_group_rank0(g));
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, mo->n_blocks, mo->block_size), 0);
    struct kv_seq seq[SB_N] = {{0}};
    struct batch_seq bs[SB_N];
    int32_t last[SB_N];
    float *lg = malloc((size_t)cnt * V * sizeof(float));
    char err[512];
    for (int step = 0; step < SB_STEPS && !test_failed(); step++) {
        for (int k = 0; k < cnt; k++) {
            int i = idx[k], past = step ? lens[i] + step - 1 : 0;
            int n = step ? 1 : lens[i];
            ASSERT_EQ_INT(kv_seq_reserve(&kv, &seq[k], past + n), 0);
            bs[k] = (struct batch_seq){step ? &last[k] : prompts[i], n, past, seq[k].blocks,
                                       seq[k].n_blocks, MODEL_LOGITS_LAST};
        }
        struct batch b = {bs, cnt};
        int rc = model_group_forward(g, &b, lg, err, sizeof err);
        ASSERT_MSG(rc == 0, "forward: %s", err);
        for (int k = 0; k < cnt; k++) {
            const float *l = lg + (size_t)k * V;
            int i = idx[k];
            last[k] = mt_argmax(l, V);
            tok[i][step] = last[k];
            top2(l, V, &margin[i][step], &maxabs[i][step]);
        }
    }
    for (int k = 0; k < cnt; k++) kv_seq_free(&kv, &seq[k]);
    ASSERT_EQ_INT(kv_free_blocks(&kv), mo->n_blocks);
    kv_free(&kv);
    free(lg);
}

TEST(model_cuda, synthetic_qwen3_0_6b_batch32_equals_alone) {
    if (!gpu_present()) TEST_SKIP("no CUDA device");
    char dir[512], cmd[1200], *out = NULL;
    snprintf(dir, sizeof dir, "%s/q06", test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s mkmodel qwen3-0.6b %s --threads 8 2>&1", test_awqd_bin(), dir);
    int rc = test_run(cmd, &out);
    if (rc != 0) {
        int no_tok = out && strstr(out, "tokenizer");
        if (!no_tok) test_fail(__FILE__, __LINE__, "mkmodel failed: %.300s", out ? out : "");
        free(out);
        if (no_tok) TEST_SKIP("mkmodel: no qwen3 tokenizer here (set AWQD_TOKENIZER_DIR)");
        return;
    }
    free(out);
    struct ckpt *ck = NULL;
    char err[512];
    ASSERT_MSG(ckpt_open(dir, &ck, err, sizeof err) == 0, "%s", err);
    int V = ckpt_config(ck)->vocab;
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.backend = "cuda";
    o.model.n_blocks = SB_N * 6 + 8;
    o.model.block_size = 16;
    o.model.max_tokens = 2048;
    o.model.max_seqs = SB_N;
    o.model.max_blocks_per_seq = 8;
    struct model_group *g = NULL;
    if (model_group_init(ck, &o, &g, err, sizeof err)) {
        ckpt_close(ck);
        ASSERT_MSG(0, "model_group_init: %s", err);
    }
    int32_t *prompts[SB_N];
    int lens[SB_N], idx[SB_N];
    uint32_t r = 7;
    for (int i = 0; i < SB_N; i++) {
        r = r * 1664525u + 1013904223u;
        lens[i] = 1 + (int)((r >> 8) % 60); /* 1..60 tokens, mixed */
        prompts[i] = malloc((size_t)lens[i] * sizeof(int32_t));
        for (int j = 0; j < lens[i]; j++) {
            r = r * 1664525u + 1013904223u;
            prompts[i][j] = (int32_t)((r >> 8) % (uint32_t)V);
        }
        idx[i] = i;
    }
    static int32_t ta[SB_N][SB_STEPS], tb[SB_N][SB_STEPS];
    static float ma[SB_N][SB_STEPS], xa[SB_N][SB_STEPS], mb[SB_N][SB_STEPS], xb[SB_N][SB_STEPS];
    for (int i = 0; i < SB_N && !test_failed(); i++) sb_run(g, V, prompts, lens, &idx[i], 1, ta, ma, xa);
    if (!test_failed()) sb_run(g, V, prompts, lens, idx, SB_N, tb, mb, xb);
    int compared = 0, total = 0;
    for (int i = 0; i < SB_N && !test_failed(); i++)
        for (int t = 0; t < SB_STEPS; t++) {
            total++;
            if (ma[i][t] <= MC_TOL * xa[i][t]) break; /* near-tie: either branch is right */
            if (ta[i][t] != tb[i][t]) {
                test_fail(__FILE__, __LINE__, "prompt %d (len %d) step %d: batched %d, alone %d (margin %g of %g)",
                          i, lens[i], t, tb[i][t], ta[i][t], ma[i][t], xa[i][t]);
                break;
            }
            compared++;
        }
    fprintf(stderr, "  qwen3-0.6b synthetic: 32 mixed prompts batched vs alone: %d/%d greedy tokens compared, all equal\n",
            compared, total);
    for (int i = 0; i < SB_N; i++) free(prompts[i]);
    model_group_free(g);
    ckpt_close(ck);
}
