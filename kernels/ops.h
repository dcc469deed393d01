/* ops.h — the backend interface the forward pass (engine/model.c) is written
 * against. A backend is a table of function pointers plus an opaque context;
 * the CPU reference backend lives in kernels/cpu/, the CUDA one in
 * kernels/cuda/. The model never looks inside a buffer.
 *
 * Usage:
 *     struct ops *ops;
 *     if (ops_cpu_create(2, &ops, err, sizeof err)) { ... }
 *     struct buf *x = ops->alloc(ops->ctx, BUF_ACT, n * hidden);
 *     ops->upload(ops->ctx, ids, 0, host_ids, n);     // BUF_I32: int32 host
 *     ops->embed(ops->ctx, x, embed_table, ids, n, hidden, 0, vocab);
 *     ...
 *     ops->free(ops->ctx, x);
 *     ops_destroy(ops);
 *
 * Buffers. `struct buf` is backend memory of one kind, sized in elements:
 *   BUF_ACT  activations and KV cache, in the backend's own dtype (fp32 on CPU,
 *            fp16 on CUDA); upload/download convert from/to host fp32 (float).
 *   BUF_F32  always fp32 (logits, RoPE tables); host side is float.
 *   BUF_I32  int32 (token ids, positions, slots, block tables); host int32_t.
 *   BUF_W16  constant weights given as fp16 bit patterns (uint16_t) on the host;
 *            the backend stores them as it likes (fp32 on CPU, fp16 on CUDA).
 * Offsets and counts of upload/download are in elements. Every op runs in
 * order on the backend's stream; download waits for everything before it.
 *
 * Shapes below are row-major, [rows, cols]; "n" is the number of token rows in
 * the batch. Activations of one row are contiguous.
 *
 * Errors: alloc/upload_linear return NULL on out-of-memory (the caller names
 * the thing); ops that can fail return 0 / negative errno. Compute ops are
 * infallible on valid arguments (invariants are asserted).
 *
 * Thread safety: one backend instance (ops + ctx) is used by one thread at a
 * time. Tensor-parallel ranks each create their own instance. */
#ifndef AWQD_OPS_H
#define AWQD_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/ckpt.h"

enum buf_kind { BUF_ACT = 0, BUF_F32 = 1, BUF_I32 = 2, BUF_W16 = 3 };

/* How an uploaded linear will be used (a backend may lay it out for that). */
enum linear_kind {
    LINEAR_PLAIN = 0,             /* ops->linear */
    LINEAR_GATE_UP = 1,           /* ops->linear_silu_mul: N = 2 * inter, gate | up columns */
};

struct buf;        /* backend memory; opaque to the model */
#define OPS_UPLOAD_PARTS 16 /* most parts of one upload_group */
struct op_linear;  /* one W4A16 linear layer uploaded to the backend */
struct op_graph;   /* a recorded sequence of ops (graph_begin / graph_end) */

/* One batch's attention geometry (backend buffers, uploaded by the model).
 * Sequence s owns rows [q_start[s], q_start[s+1]) of the batch; its first new
 * token sits at position past[s]; its KV cache pages are block_table[s *
 * max_blocks + j] for j < ceil((past[s] + rows) / block_size). Row r of s (at
 * position p = past[s] + r - q_start[s]) attends to positions 0..p. */
struct attn_batch {
    int n_seqs;
    int n_rows;                   /* total rows = q_start[n_seqs] */
    int max_blocks;               /* stride of block_table */
    int block_size;               /* tokens per KV block */
    const struct buf *q_start;    /* i32 [n_seqs + 1] */
    const struct buf *past;       /* i32 [n_seqs] */
    const struct buf *block_table;/* i32 [n_seqs, max_blocks] */
    const struct buf *positions;  /* i32 [n_rows] absolute position of each row */
    const struct buf *slots;      /* i32 [n_rows] KV slot = block * block_size + offset */
    /* host copies of the same (for launch geometry; never written) */
    const int32_t *h_q_start;     /* [n_seqs + 1] */
    const int32_t *h_past;        /* [n_seqs] */
    /* 1: a decode-only batch (every sequence has exactly one row, n_rows ==
     * n_seqs) run with launch geometry that depends on n_seqs only, never on
     * the contexts, so that a CUDA graph captured with it can be replayed for
     * other contexts (the device buffers are re-uploaded before each replay).
     * The backend then reads the contexts from `past` on the device and
     * ignores h_q_start / h_past. Padding rows (a batch padded up to a graph's
     * size) have past[s] < 0: attention writes zeros for them; their slot is
     * < 0: qk_norm_rope_kv writes no K/V for them. Only set by the model on
     * backends with graph ops (the CPU backend never sees it). */
    int decode_fixed;
};

/* --- sampling ----------------------------------------------------------------
 * ops->sample_topk turns logits rows into sampling candidates on the backend,
 * so that only a few KB per row come back to the host (engine/sampler.h
 * finishes the draw; sampler_sample is the reference it reproduces).
 *
 * Processed logits of row r: w = raw logits with the row's adjustments applied.
 * Adjustment e of row r (adj_start[r] <= e < adj_start[r + 1]) is two int32:
 * adj[2e] = token * 4 + op (global token id), adj[2e + 1] = the float's bits:
 *   SAMPLE_ADJ_ADD  w += v              (logit_bias; -inf bans)
 *   SAMPLE_ADJ_REP  w = w > 0 ? w / v : w * v   (repetition penalty v)
 *   SAMPLE_ADJ_SUB  w -= v              (presence + frequency * count)
 * All entries of one token are consecutive and applied in order; tokens
 * outside this rank's columns are skipped. Float ops exactly as written (no
 * contraction), so every backend and the host sampler get the same w.
 *
 * Order of tokens: by w descending, then id ascending (NaN last; -0 == +0).
 *
 * out, per row r at r * SAMPLE_ROW_FLOATS(k):
 *   [0] max of w over the columns      [1..2] double: sum of expf((w - max) * inv_t)
 *   [3] max of raw                     [4..5] double: sum of expf(raw - max raw)
 *   [6] int32: valid candidates (min(k, n_cols))
 *   [7] int32: race winner's global id (-1: no race, or no finite w)
 *   [8..9] double: the winner's race score (-inf when none)
 *   [10] the winner's w    [11] the winner's raw logit (-inf when none)
 *   [12, 12+k)     w of the top k tokens, best first
 *   [12+k, 12+2k)  raw logits of the same tokens
 *   [12+2k, 12+3k) their global ids (int32 bit patterns; -1 past the valid ones)
 * ("double" = the 8 bytes of a host double in two float slots; sums run in
 * double over fp32 expf terms; -inf max: sum 0.) After the m rows, out[m *
 * SAMPLE_ROW_FLOATS(k) + e] = raw logit of adjustment e's token when that token
 * is in this rank's columns (else left as it was).
 *
 * The race (exponential race = Gumbel-max; engine/sampler.h defines it): for
 * rows whose race[3r + 2] is nonzero, the column with the largest
 *   score(id) = (double)w * (double)inv_t + g(key, id),
 *   g = -log(-log(u)), u = ((h >> 12) + 0.5) * 2^-52, h = splitmix64(key ^
 *   ((uint64)id * 0x9E3779B97F4A7C15)), key = race[3r] | race[3r + 1] << 32
 * over the columns whose w is finite, lowest id on equal scores. The product
 * is exact in double, so only log() can differ between backends (CUDA's log
 * is within 1 ulp of glibc's): winners can differ only where two scores are
 * within ~1 ulp. */
#define SAMPLE_MAX_K 256
#define SAMPLE_HDR 12
#define SAMPLE_ROW_FLOATS(k) (SAMPLE_HDR + 3 * (size_t)(k))
#define SAMPLE_OUT_FLOATS(m, k, n_adj) ((size_t)(m) * SAMPLE_ROW_FLOATS(k) + (size_t)(n_adj))
enum sample_adj_op { SAMPLE_ADJ_ADD = 0, SAMPLE_ADJ_REP = 1, SAMPLE_ADJ_SUB = 2 };

struct sample_batch {
    int m;                        /* rows */
    int k;                        /* candidates per row, 1..SAMPLE_MAX_K */
    int ld;                       /* row stride of logits (the rank's vocab_rows) */
    int n_cols;                   /* valid columns, <= ld (CUDA: <= 262144) */
    int vocab_start;              /* global id of column 0 */
    const struct buf *inv_t;      /* F32 [m] 1 / temperature (1 for greedy) */
    const struct buf *adj_start;  /* I32 [m + 1] */
    const struct buf *adj;        /* I32 [2 * n_adj] (may be NULL when n_adj == 0) */
    const int32_t *h_adj_start;   /* host copy of adj_start (launch decisions) */
    const struct buf *race;       /* I32 [3 m]: per row key low word, key high word, 1 = run
                                     the race (0: winner -1); NULL: no race in any row */
};

/* Scratch floats sample_topk needs (processed rows, candidate keys). */
static inline size_t sample_work_floats(int m, int ld, int k) {
    size_t chunks = ((size_t)ld + 8191) / 8192 + 1; /* CUDA: 8192 columns per block */
    size_t per_row = (size_t)ld + 2 * 256 * chunks + 2 * 32 * (size_t)k + 16 + 12 * chunks;
    return (size_t)m * per_row + 64;
}

struct ops {
    const char *name;             /* "cpu", "cuda" */
    void *ctx;                    /* backend state */

    /* --- buffers ----------------------------------------------------------- */
    struct buf *(*alloc)(void *ctx, enum buf_kind kind, size_t n);   /* zeroed */
    void (*free)(void *ctx, struct buf *b);                          /* NULL ok */
    /* Host -> backend: n elements at element offset off. src is float for
     * ACT/F32, int32_t for I32, uint16_t (fp16 bits) for W16. */
    int (*upload)(void *ctx, struct buf *dst, size_t off, const void *src, size_t n);
    /* Optional (NULL: upload each part): parts (<= OPS_UPLOAD_PARTS) uploads
     * of 4-byte elements (F32 / I32 buffers) at offset 0 as one: dst[i][0,
     * n[i]) = src[i][0, n[i]); parts with n[i] = 0 are skipped. With width
     * (may be NULL) and width[i] > 0, part i is n[i] / width[i] rows of
     * width[i] elements written stride[i] apart: dst[i][r * stride[i] + j] =
     * src[i][r * width[i] + j] (the block table's rows as long as the batch
     * needs). The CUDA backend packs them into one copy and one scatter
     * kernel (a decode step's batch description is 6-7 small arrays). */
    int (*upload_group)(void *ctx, struct buf *const *dst, const void *const *src,
                        const size_t *n, const size_t *width, const size_t *stride, int parts);
    /* Backend -> host (float for ACT/F32, int32_t for I32). Synchronous. */
    int (*download)(void *ctx, void *dst, const struct buf *src, size_t off, size_t n);
    /* Copies n elements of the same kind between buffers of this backend. */
    void (*copy)(void *ctx, struct buf *dst, size_t dst_off, const struct buf *src,
                 size_t src_off, size_t n);

    /* --- weights ----------------------------------------------------------- */
    /* Uploads one AWQ linear (host, AutoAWQ packing; bias optional). The CPU
     * backend dequantizes here (reference only); CUDA keeps INT4 and may
     * repack (e.g. interleave gate/up columns for LINEAR_GATE_UP). */
    struct op_linear *(*upload_linear)(void *ctx, const struct awq_linear *l,
                                       enum linear_kind kind);
    void (*free_linear)(void *ctx, struct op_linear *l);           /* NULL ok */
    /* Optional (NULL: nothing to do): the model's weights are all uploaded;
     * the backend may drop what it kept for uploads (CUDA: the pinned host
     * buffer the linears are repacked into). Uploads may still follow. */
    void (*weights_done)(void *ctx);

    /* --- compute ----------------------------------------------------------- */
    /* out[i, :] = table[ids[i] - row_start, :] when row_start <= ids[i] <
     * row_start + rows, else zeros (vocab-parallel: the all-reduce fills in).
     * out: ACT [n, dim]; table: W16 [rows, dim]; ids: I32 [n]. */
    void (*embed)(void *ctx, struct buf *out, const struct buf *table, const struct buf *ids,
                  int n, int dim, int row_start, int rows);

    /* Residual add + RMSNorm: when delta != NULL, resid += delta; then
     * out = resid / sqrt(mean(resid^2) + eps) * w.
     * resid, delta, out: ACT [n, dim]; w: W16 [dim]. */
    void (*add_rmsnorm)(void *ctx, struct buf *resid, const struct buf *delta, struct buf *out,
                        const struct buf *w, int n, int dim, float eps);

    /* Optional (NULL: not offered): add_rmsnorm fused
     * into the linear that consumes its output, out of place:
     *   resid_out = resid_in (+ delta); x = resid_out / sqrt(mean(resid_out^2)
     *   + eps) * w; y = x @ W (LINEAR_PLAIN: y [n, N]) or silu(g) * u
     *   (LINEAR_GATE_UP: y [n, N / 2]), as linear / linear_silu_mul would.
     * resid_in, delta, resid_out: ACT [n, dim] (delta may be NULL; resid_out
     * distinct from both); w: W16 [dim]; x itself is not written. Returns 0,
     * or -ENOTSUP with nothing done when this backend does not fuse this call
     * (then run add_rmsnorm and the linear). A graph records it like the
     * compute ops. */
    int (*add_rmsnorm_linear)(void *ctx, const struct buf *resid_in, const struct buf *delta,
                              struct buf *resid_out, const struct buf *w, int n, int dim,
                              float eps, struct buf *y, const struct op_linear *l);

    /* y[n, N] = x[n, K] @ W[K, N] (+ bias). x, y: ACT. l: LINEAR_PLAIN.
     * The elements of y past its first n * N are scratch during the call (a
     * backend may use them: the CUDA backend's prefill GEMMs do; callers keep
     * nothing there), as are those of out past n * N / 2 in linear_silu_mul. */
    void (*linear)(void *ctx, struct buf *y, const struct buf *x, int n, const struct op_linear *l);

    /* Optional (NULL: not offered): linear followed by the sum of y over the
     * tensor-parallel ranks, made in the linear's own epilogue (desc: from
     * comm->sum_desc for this call). linear_sum_ok says, without side
     * effects, whether this backend fuses (l, n) — from the shapes alone, so
     * every rank answers alike; when it does, the caller asks comm->sum_desc
     * and, given a descriptor, calls linear_sum (which must then run: the
     * peers wait for its tiles). */
    int (*linear_sum_ok)(void *ctx, int n, const struct op_linear *l);
    void (*linear_sum)(void *ctx, struct buf *y, const struct buf *x, int n,
                       const struct op_linear *l, const void *desc);

    /* In place on qkv (ACT [n, (nh + 2 * nkv) * hd], q | k | v per row):
     * optional per-head RMSNorm of q and k (q_norm, k_norm: W16 [hd], or NULL),
     * RoPE (rotate-half layout) of q and k with angle positions[i] * inv_freq[j]
     * (inv_freq: F32 [hd / 2], already scaled), then writes k and v of row i to
     * slot slots[i] of k_cache/v_cache (ACT [n_blocks * block_size, nkv, hd]). */
    void (*qk_norm_rope_kv)(void *ctx, struct buf *qkv, int n, int nh, int nkv, int hd,
                            const struct buf *q_norm, const struct buf *k_norm, float eps,
                            const struct buf *inv_freq, const struct attn_batch *ab,
                            struct buf *k_cache, struct buf *v_cache);

    /* Causal attention of the q part of qkv over the paged cache (which
     * already holds this batch's k/v): out[i, h*hd:(h+1)*hd] = softmax(q_h .
     * K_g^T * scale) V_g with g = h / (nh / nkv). out: ACT [n, nh * hd]. */
    void (*attention)(void *ctx, struct buf *out, const struct buf *qkv, int nh, int nkv, int hd,
                      float scale, const struct attn_batch *ab, const struct buf *k_cache,
                      const struct buf *v_cache);

    /* The MLP's first half, fused: with g|u = x @ W (+ bias), W = [K, 2 * inter]
     * uploaded as LINEAR_GATE_UP, out[i, j] = silu(g[i, j]) * u[i, j].
     * x: ACT [n, K]; out: ACT [n, inter]. */
    void (*linear_silu_mul)(void *ctx, struct buf *out, const struct buf *x, int n,
                            const struct op_linear *l);

    /* logits[r, v] = x[rows[r], :] . table[v, :] for r < m, v < vocab_rows.
     * x: ACT [n, dim]; rows: I32 [m], or NULL for rows 0..m-1 (no gather on
     * CUDA: a decode step's rows); table: W16 [vocab_rows, dim];
     * logits: F32 [m, vocab_rows]. */
    void (*lm_head)(void *ctx, struct buf *logits, const struct buf *x, const struct buf *rows,
                    int m, const struct buf *table, int dim, int vocab_rows);

    /* --- sampling (see the sampling section below the table) ---------------
     * For m rows of this rank's logits: the processed logits w (the row's
     * adjustments applied), their max and sum of exps at the row's 1/T, the
     * same of the raw logits, and the top sb->k tokens by (w desc, id asc),
     * into out (F32 [SAMPLE_OUT_FLOATS(m, k, n_adj)], layout below).
     * logits: F32 [m, sb->ld] (read only); work: F32 [sample_work_floats(m,
     * sb->ld, sb->k)] scratch. */
    void (*sample_topk)(void *ctx, struct buf *out, const struct buf *logits, struct buf *work,
                        const struct sample_batch *sb);

    /* Waits for queued work (no-op on CPU). 0 / negative errno. */
    int (*sync)(void *ctx);

    /* --- graphs (optional: NULL when the backend has none, e.g. the CPU
     * backend, or CUDA with AWQD_CUDA_GRAPHS=0) ------------------------------
     * Record a fixed sequence of compute ops once and replay it:
     *     ops->graph_begin(ctx);                 // ops below are recorded, not run
     *     ops->add_rmsnorm(ctx, ...); ...        // compute ops + comm all-reduce
     *     struct op_graph *g;
     *     if (ops->graph_end(ctx, &g) == 0)      // nothing has run yet
     *         ops->graph_run(ctx, g);            // runs the recorded ops
     *     ... upload new inputs into the same buffers; ops->graph_run(ctx, g);
     *     ops->graph_free(ctx, g);
     * Between begin and end only compute ops (embed, add_rmsnorm,
     * add_rmsnorm_linear, linear, linear_silu_mul, qk_norm_rope_kv, attention, lm_head, copy) and a
     * comm->all_reduce_sum with comm->graph_safe may be called, on the thread
     * that called begin; alloc, free, upload, download, sync, upload_linear
     * and free_linear are refused (NULL / -EBUSY) and make graph_end fail.
     * A replay runs the same ops with the same arguments: the same buffers,
     * the same shapes (n, n_seqs, ...), the same attn_batch (set decode_fixed
     * so attention's geometry does not depend on the contexts); it reads
     * whatever the buffers hold when it runs (upload the new batch first).
     * Replays are ordered with the other ops of the stream like any op.
     * graph_end always ends the recording; on failure (an op that cannot be
     * recorded) it returns a negative errno with *out = NULL, nothing was run,
     * and the backend stays usable (run the ops eagerly instead). A graph
     * stays valid until graph_free; the buffers it uses must outlive it. */
    int (*graph_begin)(void *ctx);
    int (*graph_end)(void *ctx, struct op_graph **out);
    int (*graph_run)(void *ctx, struct op_graph *g);
    void (*graph_free)(void *ctx, struct op_graph *g);               /* NULL ok */

    /* Frees the context and this table. */
    void (*destroy)(struct ops *ops);
};

/* The CPU reference backend (fp32 on dequantized weights). n_threads <= 0:
 * one per online CPU. */
int ops_cpu_create(int n_threads, struct ops **out, char *err, size_t errlen);

#ifdef AWQD_CUDA
/* The CUDA backend on device `device` (kernels/cuda/). */
int ops_cuda_create(int device, struct ops **out, char *err, size_t errlen);
#endif

/* Calls ops->destroy (NULL ok). */
void ops_destroy(struct ops *ops);

#endif
