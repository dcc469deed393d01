/* test_model_graph.c — model_forward's decode-graph control flow, on the CPU
 * backend with stand-in graph hooks (the CPU backend has none): a decode step
 * records its bucket's graph once and replays it after; prefill steps never
 * do; a tensor-parallel group whose status reports a failure (what a replayed
 * all-reduce cannot report itself) fails the step before the replay, and a
 * failure that appears during the replay fails it after the sync. The real
 * recording and replay are tested on the GPU (tests/gpu/test_graph_cuda.c). */
#include "tests/harness/test.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/ckpt.h"
#include "engine/model.h"
#include "kernels/ops.h"

static int n_begin, n_end, n_run, n_free;
static int status_rc, fail_in_run;
static int token; /* its address stands for the recorded graph */

static int fake_begin(void *ctx) {
    (void)ctx;
    n_begin++;
    return 0;
}
static int fake_end(void *ctx, struct op_graph **out) {
    (void)ctx;
    n_end++;
    *out = (struct op_graph *)&token;
    return 0;
}
static int fake_run(void *ctx, struct op_graph *g) {
    (void)ctx;
    if (g == (struct op_graph *)&token) n_run++;
    if (fail_in_run) status_rc = -ETIMEDOUT; /* a peer never arrived during the replay */
    return 0;
}
static void fake_free(void *ctx, struct op_graph *g) {
    (void)ctx;
    if (g == (struct op_graph *)&token) n_free++;
}
static int fake_status(struct comm *c) {
    (void)c;
    return status_rc;
}

TEST(model_graph, replay_and_group_status) {
    char err[512];
    struct ckpt *ck = NULL;
    if (ckpt_open(test_fixture("qwen3-tiny-awq"), &ck, err, sizeof err))
        TEST_SKIP("fixture not installed");
    struct model_weights w;
    memset(&w, 0, sizeof w);
    ASSERT_MSG(ckpt_load(ck, 0, 1, &w, err, sizeof err) == 0, "%s", err);
    struct ops *ops = NULL;
    ASSERT_MSG(ops_cpu_create(1, &ops, err, sizeof err) == 0, "%s", err);
    ops->graph_begin = fake_begin;
    ops->graph_end = fake_end;
    ops->graph_run = fake_run;
    ops->graph_free = fake_free;
    struct comm *comm = NULL;
    ASSERT_EQ_INT(comm_cpu_single(&comm), 0);
    comm->status = fake_status;
    struct model_opts o;
    model_opts_default(&o);
    o.n_blocks = 8;
    o.max_tokens = 32;
    o.max_seqs = 4;
    struct model *m = NULL;
    ASSERT_MSG(model_init(&w, ops, comm, &o, &m, err, sizeof err) == 0, "%s", err);
    model_weights_free(&w);
    int V = model_vocab(m);
    float *logits = malloc((size_t)V * sizeof(float));
    ASSERT(logits != NULL);

    int32_t blocks[1] = {0}, prompt[3] = {1, 2, 3}, next[1] = {4};
    struct batch_seq s = {.tokens = prompt, .n_tokens = 3, .past = 0, .blocks = blocks,
                          .n_blocks = 1, .logits = MODEL_LOGITS_LAST};
    struct batch b = {&s, 1};
    /* prefill: op by op */
    ASSERT_MSG(model_forward(m, &b, logits, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(n_begin, 0);
    /* first decode step: recorded, then replayed */
    s = (struct batch_seq){.tokens = next, .n_tokens = 1, .past = 3, .blocks = blocks,
                           .n_blocks = 1, .logits = MODEL_LOGITS_LAST};
    ASSERT_MSG(model_forward(m, &b, logits, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(n_begin, 1);
    ASSERT_EQ_INT(n_end, 1);
    ASSERT_EQ_INT(n_run, 1);
    /* second: replayed only */
    s.past = 4;
    ASSERT_MSG(model_forward(m, &b, logits, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(n_begin, 1);
    ASSERT_EQ_INT(n_run, 2);
    /* a failed group: the step fails before the replay */
    status_rc = -EIO;
    err[0] = 0;
    ASSERT_EQ_INT(model_forward(m, &b, logits, err, sizeof err), -EIO);
    ASSERT_MSG(strstr(err, "tensor-parallel group") != NULL, "message: %s", err);
    ASSERT_EQ_INT(n_run, 2);
    /* a failure during the replay: the step fails after the sync */
    status_rc = 0;
    fail_in_run = 1;
    err[0] = 0;
    ASSERT_EQ_INT(model_forward(m, &b, logits, err, sizeof err), -ETIMEDOUT);
    ASSERT_MSG(strstr(err, "all-reduce") != NULL, "message: %s", err);
    ASSERT_EQ_INT(n_run, 3);
    /* healthy again: replays */
    status_rc = 0;
    fail_in_run = 0;
    ASSERT_MSG(model_forward(m, &b, logits, err, sizeof err) == 0, "%s", err);
    ASSERT_EQ_INT(n_run, 4);

    free(logits);
    model_free(m);
    ASSERT_EQ_INT(n_free, 1);
    comm_free(comm);
    ops_destroy(ops);
    ckpt_close(ck);
}

/* The decode graph buckets: 5 and 6 (session 55), steps of 4 from 16 to 32
 * (session 50), of 8 with step8, and the limit itself last */
TEST(model_graph, buckets) {
    int b[64];
    static const int want[] = {1, 2, 4, 5, 6, 8, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 300};
    int n = model_graph_buckets(300, 0, b, 64);
    ASSERT_EQ_INT(n, (int)(sizeof want / sizeof want[0]));
    for (int i = 0; i < n; i++) ASSERT_MSG(b[i] == want[i], "bucket %d: %d, want %d", i, b[i], want[i]);
    static const int want8[] = {1, 2, 4, 5, 6, 8, 16, 24, 32, 40};
    n = model_graph_buckets(40, MODEL_BUCKETS_STEP8, b, 64);
    ASSERT_EQ_INT(n, 10);
    for (int i = 0; i < n; i++) ASSERT_MSG(b[i] == want8[i], "step 8, bucket %d: %d, want %d", i, b[i], want8[i]);
    ASSERT_EQ_INT(model_graph_buckets(12, 0, b, 64), 7); /* 1 2 4 5 6 8 12 */
    ASSERT_EQ_INT(b[6], 12);
    ASSERT_EQ_INT(model_graph_buckets(3, 0, b, 64), 3); /* 1 2 3 */
    ASSERT_EQ_INT(b[2], 3);
    ASSERT_EQ_INT(model_graph_buckets(7, 0, b, 64), 6); /* 1 2 4 5 6 7 */
    ASSERT_EQ_INT(b[5], 7);
    ASSERT_EQ_INT(model_graph_buckets(1, 0, b, 64), 1);
    ASSERT_EQ_INT(model_graph_buckets(300, 0, b, 3), 3); /* at most max */
    /* finer below 16 (AWQD_GRAPH_FINE=1): 3 and 12 too, no 7 */
    static const int wantf[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 24, 28, 32, 48};
    n = model_graph_buckets(48, MODEL_BUCKETS_FINE, b, 64);
    ASSERT_EQ_INT(n, (int)(sizeof wantf / sizeof wantf[0]));
    for (int i = 0; i < n; i++) ASSERT_MSG(b[i] == wantf[i], "fine, bucket %d: %d, want %d", i, b[i], wantf[i]);
    static const int wantf8[] = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40};
    n = model_graph_buckets(40, MODEL_BUCKETS_FINE | MODEL_BUCKETS_STEP8, b, 64);
    ASSERT_EQ_INT(n, (int)(sizeof wantf8 / sizeof wantf8[0]));
    for (int i = 0; i < n; i++) ASSERT_MSG(b[i] == wantf8[i], "fine + step 8, bucket %d: %d, want %d", i, b[i], wantf8[i]);
    ASSERT_EQ_INT(model_graph_buckets(7, MODEL_BUCKETS_FINE, b, 64), 7); /* 1 2 3 4 5 6 7 (the limit last) */
    ASSERT_EQ_INT(b[6], 7);
}
