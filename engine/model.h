/* model.h — the forward pass of Qwen3, Qwen2 and Llama, written once against
 * the op table (kernels/ops.h) and the communicator (comm/comm.h).
 *
 * A struct model is one tensor-parallel rank's model: its weights uploaded to
 * one backend, its share of the paged KV cache (per layer K and V of
 * [n_blocks, block_size, n_kv_heads_of_rank, head_dim]) and a workspace sized
 * for the largest batch it accepts.
 *
 * Usage (tp = 1):
 *     struct ops *ops;     ops_cpu_create(2, &ops, err, sizeof err);
 *     struct comm *comm;   comm_cpu_single(&comm);
 *     struct model_opts o; model_opts_default(&o);   o.n_blocks = 256; ...
 *     struct model *m;
 *     if (model_init(&weights, ops, comm, &o, &m, err, sizeof err)) { ... }
 *     model_weights_free(&weights);          // host copy no longer needed
 *     struct batch_seq s = {.tokens = ids, .n_tokens = n, .past = 0,
 *                           .blocks = kvs.blocks, .n_blocks = kvs.n_blocks,
 *                           .logits = MODEL_LOGITS_LAST};
 *     struct batch b = {&s, 1};
 *     float *logits = malloc(model_logit_rows(&b) * vocab * sizeof(float));
 *     model_forward(m, &b, logits, err, sizeof err);
 *     model_free(m); comm_free(comm); ops_destroy(ops);
 *
 * A batch mixes prefill chunks and decode steps freely: each sequence brings
 * its new tokens, the number of tokens already in its KV cache (`past`, the
 * position of its first new token) and its block table (engine/kv.h), which
 * must already cover past + n_tokens positions. The forward writes the new
 * tokens' K/V into those blocks and returns logits for the rows asked for, in
 * batch order: for each sequence in order, nothing, its last row, or all its
 * rows. Two sequences of one batch must not write the same KV slot.
 *
 * Tensor parallelism: one struct model per rank (ckpt_load(rank, tp) shards,
 * a comm of that size); every rank calls model_forward with the same batch
 * and the same host `logits` array at the same time (one thread per rank);
 * each rank writes its own vocabulary columns of it, so when all have
 * returned the array is complete.
 *
 * Thread safety: a struct model is used by one thread at a time. */
#ifndef AWQD_MODEL_H
#define AWQD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "engine/ckpt.h"
#include "kernels/ops.h"

/* MODEL_LOGITS_SAMPLE: the last row, as sampling candidates instead of full
 * logits (struct model_out, ops->sample_topk): what a decode row needs. */
enum model_logits {
    MODEL_LOGITS_NONE = 0,
    MODEL_LOGITS_LAST = 1,
    MODEL_LOGITS_ALL = 2,
    MODEL_LOGITS_SAMPLE = 3,
};

struct model_opts {
    int n_blocks;                 /* KV blocks (all layers share the block ids) */
    int block_size;               /* tokens per KV block (default 16) */
    int max_tokens;               /* most rows (new tokens) in one forward (default 512) */
    int max_seqs;                 /* most sequences in one forward (default 64) */
    int max_blocks_per_seq;       /* block table width (default: max_position / block_size) */
    int logit_chunk;              /* rows per lm_head call (0, the default: min(max_seqs,
                                     MODEL_LOGIT_CHUNK_MAX); tests set it small) */
};

/* Most rows one lm_head call computes when model_opts.logit_chunk is 0. */
#define MODEL_LOGIT_CHUNK_MAX 128

struct batch_seq {
    const int32_t *tokens;        /* [n_tokens] new token ids */
    int n_tokens;                 /* >= 1 */
    int past;                     /* tokens already cached = position of tokens[0] */
    const int32_t *blocks;        /* [n_blocks] KV block ids, block j = positions [j*bs, (j+1)*bs) */
    int n_blocks;                 /* >= ceil((past + n_tokens) / block_size) */
    int logits;                   /* enum model_logits */
};

struct batch {
    const struct batch_seq *seqs; /* [n_seqs] */
    int n_seqs;
};

struct model;

void model_opts_default(struct model_opts *o);

/* Uploads the weights of one rank (w: from ckpt_load(rank, comm->size)) to
 * `ops` and allocates the KV cache and workspace. The model keeps pointers to
 * ops and comm (not owned; they must outlive it) and nothing of w: w may be
 * freed when model_init returns. -ENOMEM with a message naming what did not
 * fit; -EINVAL on inconsistent options. */
/* The decode CUDA-graph buckets for batches of up to lim sequences, in
 * order (1 2 4 5 6 8 16 20 24 28 32 48 64 ...; MODEL_BUCKETS_STEP8: steps of
 * 8 from 16 to 32 as before session 50; MODEL_BUCKETS_FINE: 3 and 12 too);
 * returns how many (at most max). */
#define MODEL_BUCKETS_STEP8 1
#define MODEL_BUCKETS_FINE 2
int model_graph_buckets(int lim, int flags, int *bucket, int max);

int model_init(const struct model_weights *w, struct ops *ops, struct comm *comm,
               const struct model_opts *opts, struct model **out, char *err, size_t errlen);
void model_free(struct model *m);

/* Rows of logits a batch produces. */
int model_logit_rows(const struct batch *b);

/* One forward pass. logits: host fp32 [model_logit_rows(b), vocab] (may be
 * NULL when no row asks for logits). Validates the batch against the options
 * (-EINVAL with a message: too many rows, a block table too short, a block id
 * out of range, a token id out of range) before touching anything. */
int model_forward(struct model *m, const struct batch *b, float *logits, char *err,
                  size_t errlen);

/* A forward's outputs (and the SAMPLE rows' inputs). logits: host fp32
 * [model_logit_rows(b), vocab], the LAST / ALL rows (may be NULL when there
 * are none). SAMPLE rows i = 0 .. model_sample_rows(b) - 1 (batch order) are
 * sampled at inv_t[i] with the adjustments adj[2 * adj_start[i] .. 2 *
 * adj_start[i + 1]) (kernels/ops.h, sampling; engine/sampler.h builds them);
 * each rank r writes cands[(r * rows + i) * SAMPLE_ROW_FLOATS(k)], the op's
 * row for its vocabulary columns (merge with sampler_cands_merge), and
 * adj_raw[j] for the adjustments j of its columns' tokens. */
struct model_out {
    float *logits;
    int k;                        /* candidates per row, 1..SAMPLE_MAX_K */
    const float *inv_t;           /* [rows] 1 / temperature (1 for greedy) */
    const int32_t *adj_start;     /* [rows + 1], or NULL: no adjustments */
    const int32_t *adj;           /* [2 * adj_start[rows]] */
    float *cands;                 /* [tp, rows, SAMPLE_ROW_FLOATS(k)] */
    float *adj_raw;               /* [adj_start[rows]] */
    const int32_t *race;          /* [3 * rows] each row's race (sampler_race_row), or NULL:
                                     no race (a sampled row then needs the full row) */
};

int model_sample_rows(const struct batch *b);

/* model_forward with SAMPLE rows too. */
int model_forward_out(struct model *m, const struct batch *b, const struct model_out *o,
                      char *err, size_t errlen);

/* The full logits of SAMPLE row i of the last forward (the sampler's
 * fallback, SAMPLER_NEED_FULL): recomputes the lm_head of i's chunk exactly
 * as the forward did and writes this rank's columns of row[vocab]. Valid until
 * the next forward. */
int model_sample_row_logits(struct model *m, int i, float *row, char *err, size_t errlen);

/* Copies KV block src to dst in every layer (after kv_seq_fork). */
void model_copy_block(struct model *m, int dst, int src);

const struct model_config *model_config(const struct model *m);
int model_vocab(const struct model *m);             /* cfg.vocab */
const struct model_opts *model_opts(const struct model *m);

/* Bytes of KV cache one block costs on one rank (K and V, all layers), for
 * sizing n_blocks from free memory. act_bytes: 4 on CPU, 2 on CUDA. */
size_t model_kv_block_bytes(const struct model_weights *w, int block_size, int act_bytes);

/* The device workspace a struct model allocates on its backend, itemized
 * (the CUDA memory plan prints it): one rank of `tp` of cfg with options o
 * (T = o->max_tokens rows, o->max_seqs sequences; max_blocks_per_seq <= 0:
 * from max_position), act_bytes per activation element (2 on CUDA, 4 on the
 * CPU). Buffers not live at the same time share memory: x (the normed input
 * of a block) with att (the attention output), qkv with mlp (the gate|up
 * output); h and proj stay separate. */
struct model_ws {
    size_t act;                   /* h, x|att, qkv|mlp, proj: T rows each */
    size_t act_unshared;          /* what the same six buffers take without sharing */
    size_t batch;                 /* ids, positions, slots, logit rows [T]; q_start, past,
                                     block table [max_seqs, max_blocks_per_seq] (int32) */
    size_t logits;                /* F32 [logit_chunk, vocab_rows]: the lm_head's rows */
    size_t sample;                /* sample_topk scratch, per-row inputs and outputs of a
                                     chunk (1024 adjustments; grows with penalty histories) */
    int logit_chunk;              /* rows per lm_head / sample_topk call */
    size_t total;                 /* act + batch + logits + sample */
};
void model_workspace(const struct model_config *cfg, int tp, const struct model_opts *o,
                     int act_bytes, struct model_ws *ws);

/* RoPE inverse frequencies exactly as Hugging Face computes them for the
 * config (default and llama3 scaling). inv_freq: [head_dim / 2]. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

/* ------------------------------------------------------------------------ */
/* model_group: all tensor-parallel ranks of one model, one thread per rank  */
/* ------------------------------------------------------------------------ */
/* The scheduler's view of a model on 1..N devices (seed 001's threading):
 * each rank has a worker thread that owns its backend instance (CPU ops, or
 * one CUDA device), its comm handle, its weight shard and its KV shard.
 * model_group_forward hands the batch to every worker (mutex + condition
 * variables), waits for all, and returns the full logits.
 *
 *     struct model_group_opts go;  model_group_opts_default(&go);
 *     go.backend = "cpu"; go.tp = 2; go.model.n_blocks = 256;
 *     struct model_group *g;
 *     if (model_group_init(ck, &go, &g, err, sizeof err)) { ... }
 *     model_group_forward(g, &batch, logits, err, sizeof err);
 *     model_group_free(g);
 *
 * The ckpt (engine/ckpt.h) is only used during init (each worker loads its
 * shard, then frees the host copy). Thread safety: one caller at a time. */
struct model_group_opts {
    const char *backend;          /* "cpu" (default) or "cuda" */
    int tp;                       /* ranks (default 1) */
    const int *devices;           /* CUDA device of each rank, or NULL: 0..tp-1 */
    int cpu_threads;              /* CPU backend threads per rank (0: cores / tp) */
    struct model_opts model;      /* per-rank model options (KV blocks etc.) */
};

struct model_group;
struct ckpt;

void model_group_opts_default(struct model_group_opts *o);
int model_group_init(struct ckpt *ck, const struct model_group_opts *o, struct model_group **out,
                     char *err, size_t errlen);
void model_group_free(struct model_group *g);
int model_group_forward(struct model_group *g, const struct batch *b, float *logits, char *err,
                        size_t errlen);
int model_group_forward_out(struct model_group *g, const struct batch *b,
                            const struct model_out *o, char *err, size_t errlen);
/* model_sample_row_logits on every rank: row[vocab] complete. */
int model_group_sample_row_logits(struct model_group *g, int i, float *row, char *err,
                                  size_t errlen);
/* model_copy_block on every rank. */
void model_group_copy_block(struct model_group *g, int dst, int src);
/* Rank 0's model (config, options; do not run it directly). */
struct model *model_group_rank0(struct model_group *g);
int model_group_tp(const struct model_group *g);

#endif
