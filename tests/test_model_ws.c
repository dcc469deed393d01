/* test_model_ws.c — model_workspace (engine/model.h), the sizes the CUDA
 * memory plan prints, against what model_init and the first sampling forward
 * really allocate: the CPU backend's alloc / free are wrapped to count
 * elements per buffer kind. Activations (ACT minus the KV cache), the batch
 * tables (I32), the logits chunk (F32 minus the RoPE table) and the sampling
 * buffers must match the formula exactly, and the shared activation buffers
 * must be smaller than the unshared sum. */
#include "tests/harness/test.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/ckpt.h"
#include "engine/model.h"
#include "kernels/ops.h"

#define WS_MAX_BUFS 4096

static struct buf *(*real_alloc)(void *ctx, enum buf_kind kind, size_t n);
static void (*real_free)(void *ctx, struct buf *b);
static struct {
    struct buf *b;
    enum buf_kind kind;
    size_t n;
} live[WS_MAX_BUFS];
static int n_live;
static size_t elems[4]; /* live elements per kind */

static struct buf *count_alloc(void *ctx, enum buf_kind kind, size_t n) {
    struct buf *b = real_alloc(ctx, kind, n);
    if (b && n_live < WS_MAX_BUFS && (int)kind >= 0 && (int)kind < 4) {
        live[n_live].b = b;
        live[n_live].kind = kind;
        live[n_live].n = n;
        n_live++;
        elems[kind] += n;
    }
    return b;
}

static void count_free(void *ctx, struct buf *b) {
    for (int i = 0; b && i < n_live; i++)
        if (live[i].b == b) {
            elems[live[i].kind] -= live[i].n;
            live[i] = live[--n_live];
            break;
        }
    real_free(ctx, b);
}

TEST(model_ws, matches_allocations) {
    char err[512];
    struct ckpt *ck = NULL;
    if (ckpt_open(test_fixture("qwen3-tiny-awq"), &ck, err, sizeof err))
        TEST_SKIP("fixture not installed");
    struct model_weights w;
    memset(&w, 0, sizeof w);
    ASSERT_MSG(ckpt_load(ck, 0, 1, &w, err, sizeof err) == 0, "%s", err);
    const struct model_config *cfg = &w.cfg;
    struct ops *ops = NULL;
    ASSERT_MSG(ops_cpu_create(1, &ops, err, sizeof err) == 0, "%s", err);
    real_alloc = ops->alloc;
    real_free = ops->free;
    ops->alloc = count_alloc;
    ops->free = count_free;
    n_live = 0;
    memset(elems, 0, sizeof elems);
    struct comm *comm = NULL;
    ASSERT_EQ_INT(comm_cpu_single(&comm), 0);
    struct model_opts o;
    model_opts_default(&o);
    o.n_blocks = 8;
    o.max_tokens = 40;
    o.max_seqs = 5;
    struct model *m = NULL;
    ASSERT_MSG(model_init(&w, ops, comm, &o, &m, err, sizeof err) == 0, "%s", err);

    struct model_ws ws;
    model_workspace(cfg, 1, &o, 4, &ws); /* the CPU backend: 4-byte elements */
    size_t kv = (size_t)2 * cfg->n_layers * o.n_blocks * o.block_size * w.n_kv_heads * cfg->head_dim;
    ASSERT_MSG(elems[BUF_ACT] - kv == ws.act / 4, "activations: %zu elements allocated, %zu planned",
               elems[BUF_ACT] - kv, ws.act / 4);
    ASSERT(ws.act < ws.act_unshared);
    ASSERT_MSG(elems[BUF_I32] == ws.batch / 4, "batch tables: %zu elements allocated, %zu planned",
               elems[BUF_I32], ws.batch / 4);
    size_t rope = (size_t)cfg->head_dim / 2;
    ASSERT_MSG(elems[BUF_F32] - rope == ws.logits / 4, "logits: %zu elements allocated, %zu planned",
               elems[BUF_F32] - rope, ws.logits / 4);
    ASSERT_EQ_INT(ws.logit_chunk, 5); /* min(max_seqs, MODEL_LOGIT_CHUNK_MAX) */
    {
        struct model_opts big = o;
        struct model_ws w2;
        big.max_seqs = 300;
        model_workspace(cfg, 1, &big, 4, &w2);
        ASSERT_EQ_INT(w2.logit_chunk, MODEL_LOGIT_CHUNK_MAX);
        big.logit_chunk = 3;
        model_workspace(cfg, 1, &big, 4, &w2);
        ASSERT_EQ_INT(w2.logit_chunk, 3);
        ASSERT(w2.logits < ws.logits);
    }
    model_weights_free(&w);

    /* a forward with one SAMPLE row allocates the sampling buffers */
    size_t f0 = elems[BUF_F32], i0 = elems[BUF_I32];
    int V = model_vocab(m);
    int32_t blocks[1] = {0}, prompt[3] = {1, 2, 3};
    struct batch_seq s = {.tokens = prompt, .n_tokens = 3, .past = 0, .blocks = blocks,
                          .n_blocks = 1, .logits = MODEL_LOGITS_SAMPLE};
    struct batch b = {&s, 1};
    float inv_t[1] = {1.0f};
    int32_t adj_start[2] = {0, 0};
    float *cands = malloc(SAMPLE_ROW_FLOATS(SAMPLE_MAX_K) * sizeof(float));
    ASSERT(cands != NULL);
    struct model_out mo = {.logits = NULL, .k = SAMPLE_MAX_K, .inv_t = inv_t,
                           .adj_start = adj_start, .cands = cands};
    ASSERT_MSG(model_forward_out(m, &b, &mo, err, sizeof err) == 0, "%s", err);
    size_t got = (elems[BUF_F32] - f0 + elems[BUF_I32] - i0) * 4;
    ASSERT_MSG(got == ws.sample, "sampling: %zu bytes allocated, %zu planned (vocab %d)", got,
               ws.sample, V);
    ASSERT_EQ_INT((long)ws.total, (long)(ws.act + ws.batch + ws.logits + ws.sample));

    free(cands);
    model_free(m);
    ASSERT_EQ_INT(n_live, 0); /* model_free releases every buffer exactly once */
    comm_free(comm);
    ops_destroy(ops);
    ckpt_close(ck);
}
