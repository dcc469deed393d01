/* model_fixture.c — see model_fixture.h. */
#include "tests/harness/model_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/util.h"
#include "tests/harness/test.h"

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

int mt_group(struct mt_fixture *f, const char *backend, int tp, int n_blocks, int max_tokens,
             struct model_group **g) {
    return mt_group_chunk(f, backend, tp, n_blocks, max_tokens, 0, g);
}

int mt_group_chunk(struct mt_fixture *f, const char *backend, int tp, int n_blocks, int max_tokens,
                   int logit_chunk, struct model_group **g) {
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.backend = backend;
    o.tp = tp;
    o.cpu_threads = tp > 1 ? 1 : 2;
    o.model.n_blocks = n_blocks;
    o.model.block_size = 16;
    o.model.max_tokens = max_tokens;
    o.model.max_seqs = 8;
    o.model.max_blocks_per_seq = 16;
    o.model.logit_chunk = logit_chunk;
    char err[512];
    int rc = model_group_init(f->ck, &o, g, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "model_group_init %s %s tp %d: %s", f->name, backend, tp, err);
    return rc;
}

void mt_result_free(struct mt_result *r) {
    for (int i = 0; i < MT_PROMPTS; i++) free(r->logits[i]);
    memset(r, 0, sizeof *r);
}

int mt_argmax(const float *x, int n) {
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
            last_tok[i] = mt_argmax(last, V);
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
                d = test_err_max(d, fabs(a[v] - ref[v]));
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
                d = test_err_max(d, fabs(x[v] - y[v]));
            }
            ASSERT_MSG(d <= tol * mx, "%s prompt %d position %d: runs differ by %g (max %g)", f->name,
                       i, p, d, mx);
        }
        for (int t = 0; t < MT_GREEDY; t++)
            ASSERT_MSG(a->tokens[i][t] == b->tokens[i][t], "%s prompt %d token %d: %d != %d",
                       f->name, i, t, a->tokens[i][t], b->tokens[i][t]);
    }
}
