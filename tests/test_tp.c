/* test_tp.c — tensor parallelism on CPU threads (comm_cpu_group): the
 * fixtures sharded over 2 ranks (vocab-parallel embedding / lm_head,
 * column-parallel qkv and gate_up, row-parallel o and down with all-reduces)
 * give the same greedy tokens as tp = 1 and logits within 1e-4 of the largest
 * |logit|, alone and batched. Shardings the AWQ groups do not allow (rows per
 * rank not a multiple of 128) are refused with a message, not run.
 *
 * Uses the mt_* fixture helpers (tests/harness/model_fixture.h). */
#include "tests/harness/test.h"
#include "tests/harness/model_fixture.h"

#include <stdlib.h>
#include <string.h>

#include "engine/ckpt.h"
#include "engine/model.h"

static void check_tp(const char *name, int tp) {
    struct mt_fixture f;
    int rc = mt_fixture_open(name, &f);
    if (rc == 1) TEST_SKIP("fixture not installed");
    ASSERT_OK_SO_FAR();
    struct model_group *g1 = NULL, *gt = NULL;
    if (mt_group(&f, "cpu", 1, 64, 256, &g1) || mt_group(&f, "cpu", tp, 64, 256, &gt)) return;
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

/* The handoff with polling before the condition variables (AWQD_SPIN_US; on
 * by default only with the CUDA backend): the same results, every job seen
 * once (a job missed or run twice fails or hangs the comparison). */
TEST(tp, qwen3_tp2_polling_handoff) {
    setenv("AWQD_SPIN_US", "300", 1);
    check_tp("qwen3-tiny-awq", 2);
    unsetenv("AWQD_SPIN_US");
}

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

/* tp = 4 (KV heads replicated: 2 KV heads over 4 ranks) on the synthetic
 * `awqd mkmodel tiny` checkpoint (Qwen3, real 151936 vocabulary), whose shapes
 * divide into whole AWQ groups: three prompts batched with staggered joins
 * give the same greedy tokens as tp = 1, logits within 1e-4. */
TEST(tp, mkmodel_tiny_tp4_matches_tp1) {
    const char *dir = test_tmpdir();
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s mkmodel tiny %s/m --threads 2 2>&1", test_awqd_bin(), dir);
    if (test_run(cmd, &out) != 0) {
        fprintf(stderr, "%s\n", out ? out : "");
        free(out);
        TEST_SKIP("awqd mkmodel tiny failed (tokenizer not installed?)");
    }
    free(out);
    struct mt_fixture f;
    memset(&f, 0, sizeof f);
    f.name = "mkmodel-tiny";
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/m", dir);
    ASSERT_MSG(ckpt_open(path, &f.ck, err, sizeof err) == 0, "%s", err);
    f.vocab = ckpt_config(f.ck)->vocab;
    f.n = 3;
    const int lens[3] = {5, 9, 2};
    unsigned seed = 1;
    for (int i = 0; i < 3; i++) {
        f.plen[i] = lens[i];
        f.prompt[i] = malloc(sizeof(int32_t) * (size_t)lens[i]);
        for (int j = 0; j < lens[i]; j++) f.prompt[i][j] = rand_r(&seed) % f.vocab;
    }
    struct model_group *g1 = NULL, *g4 = NULL;
    if (mt_group(&f, "cpu", 1, 64, 64, &g1) || mt_group(&f, "cpu", 4, 64, 64, &g4)) return;
    const int stagger[3] = {0, 1, 3};
    struct mt_result a, b;
    mt_run(g1, &f, 8, stagger, 64, &a);
    ASSERT_OK_SO_FAR();
    mt_run(g4, &f, 8, stagger, 64, &b);
    ASSERT_OK_SO_FAR();
    mt_check_same(&f, &a, &b, 1e-4);
    mt_result_free(&a);
    mt_result_free(&b);
    model_group_free(g1);
    model_group_free(g4);
    ckpt_close(f.ck);
    for (int i = 0; i < 3; i++) free(f.prompt[i]);
}

/* The comm contract the model's CUDA graphs rely on (comm.h): a single rank's
 * no-op all-reduce may be recorded (graph_safe), the CPU group's may not (the
 * CPU backend has no graphs; its all-reduce blocks on a barrier); neither
 * has a status hook to poll. */
TEST(tp, comm_cpu_graph_flags) {
    struct comm *one = NULL, *grp[2] = {NULL, NULL};
    ASSERT_EQ_INT(comm_cpu_single(&one), 0);
    ASSERT_EQ_INT(one->graph_safe, 1);
    ASSERT_MSG(one->status == NULL, "comm_cpu_single has a status hook");
    ASSERT_EQ_INT(comm_cpu_group(2, grp), 0);
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ_INT(grp[r]->graph_safe, 0);
        ASSERT_EQ_INT(grp[r]->rank, r);
    }
    comm_free(one);
    comm_free(grp[0]);
    comm_free(grp[1]);
}
