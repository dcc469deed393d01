/* test_tp.c — tensor parallelism on CPU threads (comm_cpu_group): the
 * fixtures sharded over 2 ranks (vocab-parallel embedding / lm_head,
 * column-parallel qkv and gate_up, row-parallel o and down with all-reduces)
 * give the same greedy tokens as tp = 1 and logits within 1e-4 of the largest
 * |logit|, alone and batched. Shardings the AWQ groups do not allow (rows per
 * rank not a multiple of 128) are refused with a message, not run.
 *
 * Uses the mt_* helpers of tests/test_model.c. */
#include "tests/harness/test.h"

#include <stdlib.h>

#include "engine/ckpt.h"
#include "engine/model.h"

#define MT_GREEDY 24
#define MT_PROMPTS 4

struct safetensors;
struct mt_fixture {
    const char *name;
    struct ckpt *ck;
    struct safetensors *ref;
    int vocab;
    int n;
    int32_t *prompt[MT_PROMPTS];
    int plen[MT_PROMPTS];
    const float *logits[MT_PROMPTS];
    const int32_t *greedy[MT_PROMPTS];
};
struct mt_result {
    float *logits[MT_PROMPTS];
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

static void check_tp(const char *name, int tp) {
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g1 = NULL, *gt = NULL;
    if (mt_group(&f, 1, 64, 256, &g1) || mt_group(&f, tp, 64, 256, &gt)) return;
    ASSERT_EQ_INT(model_group_tp(gt), tp);
    struct mt_result a, b;
    mt_run(g1, &f, 64, NULL, 256, &a);
    ASSERT_OK_SO_FAR();
    mt_run(gt, &f, 64, NULL, 256, &b);
    ASSERT_OK_SO_FAR();
    mt_check_reference(&f, &b);
    ASSERT_OK_SO_FAR();
    mt_check_same(&f, &a, &b, 1e-4);
    ASSERT_OK_SO_FAR();
    mt_result_free(&b);
    /* batched with staggered joins and chunked prefill on the sharded model */
    const int stagger[4] = {2, 0, 0, 4};
    mt_run(gt, &f, 16, stagger, 48, &b);
    ASSERT_OK_SO_FAR();
    mt_check_same(&f, &a, &b, 1e-4);
    mt_result_free(&a);
    mt_result_free(&b);
    model_group_free(g1);
    model_group_free(gt);
    mt_fixture_close(&f);
}

TEST(tp, qwen3_tp2_matches_tp1) { check_tp("qwen3-tiny-awq", 2); }
TEST(tp, qwen2_tp2_matches_tp1) { check_tp("qwen2-tiny-awq", 2); }

TEST(tp, ungroupable_shards_are_refused) {
    struct mt_fixture f;
    int rc = mt_fixture_open("llama-tiny-awq", &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    /* intermediate 640 / 2 = 320 rows of down_proj per rank: not whole groups */
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.tp = 2;
    o.cpu_threads = 1;
    o.model.n_blocks = 8;
    o.model.max_tokens = 16;
    o.model.max_seqs = 2;
    struct model_group *g = NULL;
    char err[512];
    ASSERT(model_group_init(f.ck, &o, &g, err, sizeof err) < 0);
    ASSERT(g == NULL);
    ASSERT_CONTAINS(err, "group_size");
    mt_fixture_close(&f);
}
