/* model.c — one forward pass for Qwen3 / Qwen2 / Llama over a mixed batch,
 * as calls on the op table and the communicator. */
#include "engine/model.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"
#ifdef AWQD_CUDA
#include "comm/cuda/comm_cuda.h"
#endif

/* Rows of logits computed per lm_head call (the logits and sampling
 * workspace hold that many rows: ~1.3 MB a row at a 152 K vocabulary). The
 * lm_head streams its whole fp16 table once per call whatever the rows
 * (Qwen3-8B: 1.24 GB, ~295 us on an H200), so a step samples all its rows
 * in one call where the workspace allows: min(max_seqs, 128) rows by
 * default (until session 43 a fixed 32: batch 64 took two calls, 590 us;
 * docs/PERFORMANCE.md "Session 43"). */
static int logit_chunk_of(const struct model_opts *o) {
    int c = o->logit_chunk > 0 ? o->logit_chunk : o->max_seqs < MODEL_LOGIT_CHUNK_MAX ? o->max_seqs
                                                                                      : MODEL_LOGIT_CHUNK_MAX;
    return c < 1 ? 1 : c;
}
/* Adjustment entries the sampling buffers first hold per chunk (doubled as needed). */
#define SAMPLE_ADJ_CAP0 1024
/* Most batch-size buckets with a CUDA graph (decode steps). */
#define MODEL_MAX_BUCKETS 64

struct layer {
    struct buf *attn_norm, *mlp_norm;     /* W16 [hidden] */
    struct buf *q_norm, *k_norm;          /* W16 [head_dim] or NULL */
    struct op_linear *qkv, *o, *gate_up, *down;
    struct buf *k_cache, *v_cache;        /* ACT [n_blocks * block_size, nkv, hd] */
};

struct model {
    struct model_config cfg;
    struct model_opts opts;
    struct ops *ops;
    struct comm *comm;
    /* this rank's geometry */
    int hidden, nh, nkv, hd, inter;
    int vocab_start, vocab_rows;
    int logit_chunk;                      /* rows per lm_head call (logit_chunk_of) */
    float eps, attn_scale;
    /* weights */
    struct buf *embed;                    /* W16 [vocab_rows, hidden] */
    struct buf *lm_head;                  /* W16 [vocab_rows, hidden]; == embed when tied */
    struct buf *final_norm;               /* W16 [hidden] */
    struct buf *inv_freq;                 /* F32 [hd / 2] */
    struct layer *layers;                 /* [n_layers] */
    /* device workspace (T = max_tokens) */
    struct buf *ids, *positions, *slots;  /* I32 [T] */
    struct buf *q_start;                  /* I32 [max_seqs + 1] */
    struct buf *past;                     /* I32 [max_seqs] */
    struct buf *block_table;              /* I32 [max_seqs, max_blocks_per_seq] */
    struct buf *logit_rows;               /* I32 [T] */
    struct buf *h;                        /* ACT [T, hidden] residual stream */
    struct buf *h2;                       /* ACT [H2_ROWS, hidden] its other copy for batches
                                             of <= H2_ROWS rows when the backend fuses
                                             add_rmsnorm into the next linear (out of place:
                                             the residual alternates h / h2) */
    struct buf *x;                        /* ACT [T, hidden] normed input of a block */
    struct buf *qkv;                      /* ACT [T, (nh + 2 nkv) hd] */
    struct buf *att;                      /* ACT [T, nh hd]; the same buffer as x (never live
                                             together: x is read by the qkv linear before
                                             attention writes att, att by o_proj before
                                             add_rmsnorm writes x) */
    struct buf *proj;                     /* ACT [T, hidden] o_proj / down_proj output */
    struct buf *mlp;                      /* ACT [T, inter]; the same buffer as qkv (qkv is
                                             dead after attention, mlp after down_proj) */
    struct buf *logits;                   /* F32 [logit_chunk, vocab_rows] */
    /* host staging */
    int32_t *h_ids, *h_pos, *h_slots, *h_rows;      /* [T] */
    int32_t *h_q_start, *h_past;                    /* [max_seqs + 1], [max_seqs] */
    int32_t *h_bt;                                  /* [max_seqs * max_blocks_per_seq], staged as
                                                       rows as long as a batch needs (stage_batch) */
    float *h_logits;                                /* [logit_chunk * vocab_rows] */
    /* sampling (MODEL_LOGITS_SAMPLE rows), allocated on first use */
    const struct model_out *sout;                   /* the forward's outputs (model_forward_out) */
    int32_t *h_srows;                               /* [max_seqs] batch row of each sample row */
    int n_srows;                                    /* sample rows of the last forward */
    int logits_chunk;                               /* sample chunk m->logits holds, -1: none */
    struct buf *s_inv_t;                            /* F32 [logit_chunk] */
    struct buf *s_adj_start;                        /* I32 [logit_chunk + 1] */
    struct buf *s_race;                             /* I32 [3 * logit_chunk] race triples */
    struct buf *s_rows;                             /* I32 [logit_chunk] x rows of a sample chunk */
    int s_pre;                                      /* chunk 0's inputs went up with the batch */
    int s_pre_mr, s_pre_race;                       /* ... its rows, whether any races */
    size_t s_pre_na;                                /* ... its adjustments */
    struct buf *s_adj;                              /* I32 [2 * s_cap_adj] */
    struct buf *s_out;                              /* F32 [SAMPLE_OUT_FLOATS(logit_chunk, SAMPLE_MAX_K, s_cap_adj)] */
    struct buf *s_work;                             /* F32 [sample_work_floats(logit_chunk, vocab_rows, SAMPLE_MAX_K)] */
    size_t s_cap_adj;
    float *h_inv_t;                                 /* [logit_chunk] */
    int32_t *h_adj_start;                           /* [logit_chunk + 1] */
    int32_t *h_adj;                                 /* [2 * s_cap_adj] */
    float *h_sout;                                  /* like s_out */
    /* graphs of decode steps (ops->graph_*; none on the CPU backend or with
     * AWQD_CUDA_GRAPHS=0): a decode-only batch of S sequences is padded to
     * the smallest bucket >= S and replays that bucket's graph (embed ..
     * final norm), recorded on first use */
    int n_buckets;
    int bucket[MODEL_MAX_BUCKETS];                  /* padded sizes, ascending */
    struct op_graph *graph[MODEL_MAX_BUCKETS];      /* NULL: not recorded yet */
    int graph_failed[MODEL_MAX_BUCKETS];            /* recording failed: eager from then on */
};

static int sample_rows(struct model *m, const struct batch *b, int cols, char *err,
                       size_t errlen);
static int sample_inputs_ok(const struct model *m);
static int sample_stage(struct model *m, int c0, struct buf **dst, const void **src, size_t *cnt,
                        int *mr_out, size_t *na_out, int *race_out);

void model_opts_default(struct model_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_blocks = 0; /* must be set */
    o->block_size = 16;
    o->max_tokens = 512;
    o->max_seqs = 64;
    o->max_blocks_per_seq = 0; /* from max_position */
}

/* ------------------------------------------------------------------------ */
/* RoPE                                                                     */
/* ------------------------------------------------------------------------ */

void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq) {
    int dim = cfg->head_dim;
    /* HF, in fp32: 1 / base ** (arange(0, dim, 2) / dim) */
    for (int j = 0; j < dim / 2; j++) {
        float e = (float)(2 * j) / (float)dim;
        float pw = (float)pow((double)(float)cfg->rope.theta, (double)e);
        inv_freq[j] = 1.0f / pw;
    }
    if (cfg->rope.type == ROPE_LLAMA3) {
        /* HF _compute_llama3_parameters */
        float factor = (float)cfg->rope.factor, lo = (float)cfg->rope.low_freq_factor,
              hi = (float)cfg->rope.high_freq_factor;
        float old_ctx = (float)cfg->rope.original_max_position;
        float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int j = 0; j < dim / 2; j++) {
            float f = inv_freq[j];
            float wavelen = (float)(2 * M_PI) / f;
            float scaled = wavelen > low_wavelen ? f / factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = (old_ctx / wavelen - lo) / (hi - lo);
                scaled = (1 - smooth) * scaled / factor + smooth * scaled;
            }
            inv_freq[j] = scaled;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* init / free                                                              */
/* ------------------------------------------------------------------------ */

size_t model_kv_block_bytes(const struct model_weights *w, int block_size, int act_bytes) {
    return (size_t)2 * w->cfg.n_layers * block_size * w->n_kv_heads * w->cfg.head_dim * act_bytes;
}

#define H2_ROWS 8 /* rows of m->h2: the fused norm + linear is for decode batches */

/* Elements of the two shared activation buffers per row: x|att and qkv|mlp. */
static size_t xa_cols(int H, int nh, int hd) { return (size_t)(H > nh * hd ? H : nh * hd); }
static size_t qm_cols(int nh, int nkv, int hd, int inter) {
    size_t q = (size_t)(nh + 2 * nkv) * hd;
    return q > (size_t)inter ? q : (size_t)inter;
}

void model_workspace(const struct model_config *cfg, int tp, const struct model_opts *o,
                     int act_bytes, struct model_ws *ws) {
    memset(ws, 0, sizeof *ws);
    if (tp < 1) tp = 1;
    /* this rank's geometry as ckpt_load shards it */
    int nh = cfg->n_heads / tp, nkv = tp <= cfg->n_kv_heads ? cfg->n_kv_heads / tp : 1;
    int hd = cfg->head_dim, H = cfg->hidden, inter = cfg->intermediate / tp;
    size_t V = (size_t)(cfg->vocab + tp - 1) / tp;
    size_t T = (size_t)o->max_tokens, S = (size_t)o->max_seqs;
    int bs = o->block_size > 0 ? o->block_size : 16;
    size_t mbps = o->max_blocks_per_seq > 0 ? (size_t)o->max_blocks_per_seq
                                            : (size_t)(cfg->max_position + bs - 1) / bs;
    ws->act = (T * ((size_t)2 * H + xa_cols(H, nh, hd) + qm_cols(nh, nkv, hd, inter)) +
               (size_t)H2_ROWS * H) * act_bytes;
    ws->act_unshared = T * ((size_t)3 * H + (size_t)(nh + 2 * nkv) * hd + (size_t)nh * hd + inter) *
                       act_bytes;
    ws->batch = (4 * T + 2 * S + 1 + S * mbps) * sizeof(int32_t);
    const int LC = logit_chunk_of(o);
    ws->logit_chunk = LC;
    ws->logits = (size_t)LC * V * sizeof(float);
    ws->sample = sample_work_floats(LC, (int)V, SAMPLE_MAX_K) * sizeof(float) +
                 ((size_t)LC + LC + 1 + 3 * (size_t)LC + LC) * 4 +
                 (2 * SAMPLE_ADJ_CAP0) * sizeof(int32_t) +
                 SAMPLE_OUT_FLOATS(LC, SAMPLE_MAX_K, SAMPLE_ADJ_CAP0) * sizeof(float);
    ws->total = ws->act + ws->batch + ws->logits + ws->sample;
}

static struct buf *up_w16(struct model *m, const uint16_t *src, size_t n) {
    struct buf *b = m->ops->alloc(m->ops->ctx, BUF_W16, n);
    if (b && m->ops->upload(m->ops->ctx, b, 0, src, n)) {
        m->ops->free(m->ops->ctx, b);
        return NULL;
    }
    return b;
}

void model_free(struct model *m) {
    if (!m) return;
    struct ops *o = m->ops;
    void *c = o->ctx;
    for (int i = 0; i < m->n_buckets; i++) /* before the buffers they use */
        if (m->graph[i]) o->graph_free(c, m->graph[i]);
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            struct layer *L = &m->layers[l];
            o->free(c, L->attn_norm);
            o->free(c, L->mlp_norm);
            o->free(c, L->q_norm);
            o->free(c, L->k_norm);
            o->free_linear(c, L->qkv);
            o->free_linear(c, L->o);
            o->free_linear(c, L->gate_up);
            o->free_linear(c, L->down);
            o->free(c, L->k_cache);
            o->free(c, L->v_cache);
        }
        free(m->layers);
    }
    if (m->lm_head != m->embed) o->free(c, m->lm_head);
    o->free(c, m->embed);
    o->free(c, m->final_norm);
    o->free(c, m->inv_freq);
    struct buf *ws[] = {m->ids, m->positions, m->slots, m->q_start, m->past, m->block_table,
                        m->logit_rows, m->h, m->h2, m->x, m->qkv, m->proj, m->logits,
                        m->att != m->x ? m->att : NULL, m->mlp != m->qkv ? m->mlp : NULL};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) o->free(c, ws[i]);
    free(m->h_ids);
    free(m->h_pos);
    free(m->h_slots);
    free(m->h_rows);
    free(m->h_q_start);
    free(m->h_past);
    free(m->h_bt);
    free(m->h_logits);
    o->free(c, m->s_inv_t);
    o->free(c, m->s_adj_start);
    o->free(c, m->s_race);
    o->free(c, m->s_rows);
    o->free(c, m->s_adj);
    o->free(c, m->s_out);
    o->free(c, m->s_work);
    free(m->h_srows);
    free(m->h_inv_t);
    free(m->h_adj_start);
    free(m->h_adj);
    free(m->h_sout);
    free(m);
}

/* The decode graph bucket after b (model_graph_buckets below) */
static int next_bucket(int b, int flags) {
    const int fine = (flags & MODEL_BUCKETS_FINE) != 0;
    if (b < 8) return b == 2 && !fine ? 4 : b < 6 ? b + 1 : 8;
    if (b < 16) return b + (fine ? 4 : 8);
    if (b < 32) return b + ((flags & MODEL_BUCKETS_STEP8) ? 8 : 4);
    if (b < 128) return b + 16;
    return b < 256 ? b + 32 : b + 64;
}

/* The decode graph buckets up to lim rows: 1 2 4 5 6 8 16, then steps of
 * 4 to 32, 16 to 128, 32 to 256, 64 beyond, and lim itself last. A batch
 * replays the smallest bucket that holds it, so it runs the linears at that
 * bucket's M: from 16 to 32 they grow in steps (H200, session 50: Qwen3-32B
 * q|k|v 20.5 us at M = 20, 27.1 at 24; the sum over the 28 shapes of `bench
 * kernels --set all` 856 against 873 us), hence steps of 4 there since
 * session 50 (MODEL_BUCKETS_STEP8: 8, as before; AWQD_GRAPH_STEP8=1, for
 * measurements). 5 and 6 since session 55: batch 5-6 replayed the 8 graph,
 * and a layer's four linears at M = 5 / 6 take 0.86-0.97x their time at M =
 * 8 (session 54, back to back); end to end (H200, session 55, 20-layer
 * models, context 512) llama3-70b batch 5 / 6 3.80-3.83 / 3.81-3.84 ->
 * 3.42-3.43 / 3.55-3.56 ms a step, qwen3-32b 2.49-2.50 / 2.52-2.53 -> 2.35 /
 * 2.47-2.48, Qwen3-8B unchanged. MODEL_BUCKETS_FINE (AWQD_GRAPH_FINE=1, for
 * measurements) adds 3 and 12: 3 was mixed (llama3-70b 0.98x, Qwen3-8B
 * 1.01x), and 12 lost: Qwen3-8B batch 9 / 12 2.76-2.77 / 2.83 -> 3.17-3.20 /
 * 3.25-3.27 ms a step (at M = 9-15 o and down run the skinny kernel, 12.3
 * and 17.8 us a layer in the step against 5.6 and 13.5 at M = 16). No 7: at
 * M = 7 the linears take 0.98-1.04x their M = 8 time. Returns the count (at
 * most max). */
int model_graph_buckets(int lim, int flags, int *bucket, int max) {
    int n = 0;
    for (int b = 1; b <= lim && n < max; b = next_bucket(b, flags)) bucket[n++] = b;
    if (n > 0 && n < max && bucket[n - 1] < lim) bucket[n++] = lim;
    return n;
}

int model_init(const struct model_weights *w, struct ops *ops, struct comm *comm,
               const struct model_opts *opts, struct model **out, char *err, size_t errlen) {
    *out = NULL;
    const struct model_config *cfg = &w->cfg;
    struct model_opts o = *opts;
    if (o.block_size <= 0) o.block_size = 16;
    if (o.max_blocks_per_seq <= 0)
        o.max_blocks_per_seq = (cfg->max_position + o.block_size - 1) / o.block_size;
    if (o.n_blocks <= 0 || o.max_tokens <= 0 || o.max_seqs <= 0 || o.max_blocks_per_seq <= 0)
        return util_err(err, errlen, -EINVAL,
                        "model: bad options (n_blocks %d, max_tokens %d, max_seqs %d)",
                        o.n_blocks, o.max_tokens, o.max_seqs);
    if (comm->size != w->tp || comm->rank != w->rank)
        return util_err(err, errlen, -EINVAL, "model: weights are rank %d of %d, comm is %d of %d",
                        w->rank, w->tp, comm->rank, comm->size);
    if (w->n_kv_heads <= 0 || w->n_heads % w->n_kv_heads != 0 || cfg->head_dim % 2 != 0)
        return util_err(err, errlen, -EINVAL, "model: %d query heads over %d KV heads, head_dim %d",
                        w->n_heads, w->n_kv_heads, cfg->head_dim);

    struct model *m = calloc(1, sizeof *m);
    if (!m) return util_err(err, errlen, -ENOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->opts = o;
    m->ops = ops;
    m->comm = comm;
    m->hidden = cfg->hidden;
    m->nh = w->n_heads;
    m->nkv = w->n_kv_heads;
    m->hd = cfg->head_dim;
    m->inter = w->intermediate;
    m->vocab_start = w->vocab_start;
    m->vocab_rows = w->vocab_rows;
    m->logit_chunk = logit_chunk_of(&o);
    m->eps = (float)cfg->rms_eps;
    m->attn_scale = (float)(1.0 / sqrt((double)cfg->head_dim));
    void *c = ops->ctx;
    const char *what = "";
    int H = m->hidden, T = o.max_tokens, qkvw = (m->nh + 2 * m->nkv) * m->hd;

    /* weights */
    what = "embed_tokens";
    if (!(m->embed = up_w16(m, w->embed, (size_t)m->vocab_rows * H))) goto oom;
    what = "lm_head";
    if (w->lm_head == w->embed) m->lm_head = m->embed;
    else if (!(m->lm_head = up_w16(m, w->lm_head, (size_t)m->vocab_rows * H))) goto oom;
    what = "norm";
    if (!(m->final_norm = up_w16(m, w->final_norm, (size_t)H))) goto oom;
    what = "rope";
    {
        float *inv = malloc((size_t)(m->hd / 2) * sizeof *inv);
        if (!inv) goto oom;
        model_rope_inv_freq(cfg, inv);
        m->inv_freq = ops->alloc(c, BUF_F32, (size_t)m->hd / 2);
        int rc = m->inv_freq ? ops->upload(c, m->inv_freq, 0, inv, (size_t)m->hd / 2) : -ENOMEM;
        free(inv);
        if (rc) goto oom;
    }
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) goto oom;
    size_t kv_elems = (size_t)o.n_blocks * o.block_size * m->nkv * m->hd;
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct layer_weights *lw = &w->layers[l];
        struct layer *L = &m->layers[l];
        what = "layer norms";
        if (!(L->attn_norm = up_w16(m, lw->attn_norm, (size_t)H))) goto oom;
        if (!(L->mlp_norm = up_w16(m, lw->mlp_norm, (size_t)H))) goto oom;
        if (cfg->qk_norm) {
            if (!lw->q_norm || !lw->k_norm) {
                model_free(m);
                return util_err(err, errlen, -EINVAL, "model: layer %d has no q_norm/k_norm", l);
            }
            if (!(L->q_norm = up_w16(m, lw->q_norm, (size_t)m->hd))) goto oom;
            if (!(L->k_norm = up_w16(m, lw->k_norm, (size_t)m->hd))) goto oom;
        }
        if (lw->qkv.k != H || lw->qkv.n != qkvw || lw->o.k != m->nh * m->hd || lw->o.n != H ||
            lw->gate_up.k != H || lw->gate_up.n != 2 * m->inter || lw->down.k != m->inter ||
            lw->down.n != H) {
            model_free(m);
            return util_err(err, errlen, -EINVAL, "model: layer %d linear shapes do not match the config", l);
        }
        what = "linear weights";
        if (!(L->qkv = ops->upload_linear(c, &lw->qkv, LINEAR_PLAIN))) goto oom;
        if (!(L->o = ops->upload_linear(c, &lw->o, LINEAR_PLAIN))) goto oom;
        if (!(L->gate_up = ops->upload_linear(c, &lw->gate_up, LINEAR_GATE_UP))) goto oom;
        if (!(L->down = ops->upload_linear(c, &lw->down, LINEAR_PLAIN))) goto oom;
        what = "KV cache";
        if (!(L->k_cache = ops->alloc(c, BUF_ACT, kv_elems))) goto oom;
        if (!(L->v_cache = ops->alloc(c, BUF_ACT, kv_elems))) goto oom;
    }

    if (ops->weights_done) ops->weights_done(c);

    /* workspace */
    what = "workspace";
    int S = o.max_seqs;
    size_t btn = (size_t)S * o.max_blocks_per_seq;
    if (!(m->ids = ops->alloc(c, BUF_I32, (size_t)T)) ||
        !(m->positions = ops->alloc(c, BUF_I32, (size_t)T)) ||
        !(m->slots = ops->alloc(c, BUF_I32, (size_t)T)) ||
        !(m->q_start = ops->alloc(c, BUF_I32, (size_t)S + 1)) ||
        !(m->past = ops->alloc(c, BUF_I32, (size_t)S)) ||
        !(m->block_table = ops->alloc(c, BUF_I32, btn)) ||
        !(m->logit_rows = ops->alloc(c, BUF_I32, (size_t)T)) ||
        !(m->h = ops->alloc(c, BUF_ACT, (size_t)T * H)) ||
        !(m->h2 = ops->alloc(c, BUF_ACT, (size_t)H2_ROWS * H)) ||
        !(m->x = ops->alloc(c, BUF_ACT, (size_t)T * xa_cols(H, m->nh, m->hd))) ||
        !(m->qkv = ops->alloc(c, BUF_ACT, (size_t)T * qm_cols(m->nh, m->nkv, m->hd, m->inter))) ||
        !(m->proj = ops->alloc(c, BUF_ACT, (size_t)T * H)) ||
        !(m->logits = ops->alloc(c, BUF_F32, (size_t)m->logit_chunk * m->vocab_rows)))
        goto oom;
    m->att = m->x;   /* shared: see struct model */
    m->mlp = m->qkv;
    m->h_ids = malloc((size_t)T * sizeof(int32_t));
    m->h_pos = malloc((size_t)T * sizeof(int32_t));
    m->h_slots = malloc((size_t)T * sizeof(int32_t));
    m->h_rows = malloc((size_t)T * sizeof(int32_t));
    m->h_q_start = malloc(((size_t)S + 1) * sizeof(int32_t));
    m->h_past = malloc((size_t)S * sizeof(int32_t));
    m->h_bt = calloc(btn, sizeof(int32_t)); /* rows past a batch's sequences: valid ids */
    m->h_logits = malloc((size_t)m->logit_chunk * m->vocab_rows * sizeof(float));
    if (!m->h_ids || !m->h_pos || !m->h_slots || !m->h_rows || !m->h_q_start || !m->h_past ||
        !m->h_bt || !m->h_logits)
        goto oom;
    if (ops->graph_begin && ops->graph_end && ops->graph_run && ops->graph_free) {
        int lim = S < T ? S : T;
        const char *e8 = getenv("AWQD_GRAPH_STEP8"), *ef = getenv("AWQD_GRAPH_FINE");
        const int bf = (e8 && !strcmp(e8, "1") ? MODEL_BUCKETS_STEP8 : 0) | (ef && !strcmp(ef, "1") ? MODEL_BUCKETS_FINE : 0);
        m->n_buckets = model_graph_buckets(lim, bf, m->bucket, MODEL_MAX_BUCKETS);
    }
    *out = m;
    return 0;
oom:
    model_free(m);
    return util_err(err, errlen, -ENOMEM, "model: out of %s memory for %s", ops->name, what);
}

const struct model_config *model_config(const struct model *m) { return &m->cfg; }
int model_vocab(const struct model *m) { return m->cfg.vocab; }
const struct model_opts *model_opts(const struct model *m) { return &m->opts; }

void model_copy_block(struct model *m, int dst, int src) {
    AWQD_ASSERT(dst >= 0 && dst < m->opts.n_blocks && src >= 0 && src < m->opts.n_blocks);
    size_t be = (size_t)m->opts.block_size * m->nkv * m->hd;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        m->ops->copy(m->ops->ctx, m->layers[l].k_cache, (size_t)dst * be, m->layers[l].k_cache,
                     (size_t)src * be, be);
        m->ops->copy(m->ops->ctx, m->layers[l].v_cache, (size_t)dst * be, m->layers[l].v_cache,
                     (size_t)src * be, be);
    }
}

/* ------------------------------------------------------------------------ */
/* forward                                                                  */
/* ------------------------------------------------------------------------ */

int model_logit_rows(const struct batch *b) {
    int n = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->seqs[s].logits == MODEL_LOGITS_LAST) n += 1;
        else if (b->seqs[s].logits == MODEL_LOGITS_ALL) n += b->seqs[s].n_tokens;
    }
    return n;
}

/* "1" (any value but "" and "0") in the environment: the opt-in switches */
static int env_on(const char *name) {
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0") != 0;
}

/* Checks the batch and fills the host staging arrays; *bt_width: the
 * entries of each staged block-table row (h_bt is [n_seqs][*bt_width]). */
static int stage_batch(struct model *m, const struct batch *b, int *n_rows, int *n_logit,
                       int *bt_width, char *err, size_t errlen) {
    m->n_srows = 0; /* sample rows (MODEL_LOGITS_SAMPLE) */
    m->logits_chunk = -1;
    const struct model_opts *o = &m->opts;
    if (b->n_seqs < 1 || b->n_seqs > o->max_seqs)
        return util_err(err, errlen, -EINVAL, "batch: %d sequences (1..%d)", b->n_seqs, o->max_seqs);
    int n = 0, nl = 0;
    /* the block table is staged as rows of w entries, the most any sequence
     * of the batch needs (upload_group writes them max_blocks_per_seq apart;
     * no kernel reads a row past its sequence's context) */
    int w = 1;
    static int full = -1; /* AWQD_STAGE_FULL_BT=1 (measurement only): whole rows, as before session 57 */
    if (full < 0) full = env_on("AWQD_STAGE_FULL_BT");
    if (full) w = o->max_blocks_per_seq;
    for (int s = 0; s < b->n_seqs && !full; s++) {
        const struct batch_seq *q = &b->seqs[s];
        const long need = ((long)q->past + q->n_tokens + o->block_size - 1) / o->block_size;
        if (need > w) w = need < o->max_blocks_per_seq ? (int)need : o->max_blocks_per_seq;
    }
    *bt_width = w;
    for (int s = 0; s < b->n_seqs; s++) {
        const struct batch_seq *q = &b->seqs[s];
        if (q->n_tokens < 1 || q->past < 0)
            return util_err(err, errlen, -EINVAL, "batch: sequence %d has %d tokens, past %d", s,
                            q->n_tokens, q->past);
        if (n + q->n_tokens > o->max_tokens)
            return util_err(err, errlen, -EINVAL, "batch: more than %d tokens", o->max_tokens);
        int ctx = q->past + q->n_tokens;
        int need = (ctx + o->block_size - 1) / o->block_size;
        if (q->n_blocks < need || need > o->max_blocks_per_seq || !q->blocks)
            return util_err(err, errlen, -EINVAL,
                            "batch: sequence %d needs %d KV blocks for %d positions, has %d (max %d)",
                            s, need, ctx, q->n_blocks, o->max_blocks_per_seq);
        if (q->logits < MODEL_LOGITS_NONE || q->logits > MODEL_LOGITS_SAMPLE ||
            (q->logits == MODEL_LOGITS_SAMPLE && !m->h_srows))
            return util_err(err, errlen, -EINVAL, "batch: sequence %d: bad logits mode", s);
        int32_t *bt = m->h_bt + (size_t)s * w;
        for (int j = 0; j < w; j++) {
            if (j < need) {
                if (q->blocks[j] < 0 || q->blocks[j] >= o->n_blocks)
                    return util_err(err, errlen, -EINVAL, "batch: sequence %d: block id %d out of range",
                                    s, q->blocks[j]);
                bt[j] = q->blocks[j];
            } else {
                bt[j] = 0;
            }
        }
        m->h_q_start[s] = n;
        m->h_past[s] = q->past;
        for (int i = 0; i < q->n_tokens; i++) {
            int id = q->tokens[i], pos = q->past + i;
            if (id < 0 || id >= m->cfg.vocab)
                return util_err(err, errlen, -EINVAL, "batch: token id %d out of range (vocab %d)",
                                id, m->cfg.vocab);
            m->h_ids[n + i] = id;
            m->h_pos[n + i] = pos;
            m->h_slots[n + i] = bt[pos / o->block_size] * o->block_size + pos % o->block_size;
            if (q->logits == MODEL_LOGITS_SAMPLE && i == q->n_tokens - 1)
                m->h_srows[m->n_srows++] = n + i;
            if (q->logits == MODEL_LOGITS_ALL || (q->logits == MODEL_LOGITS_LAST && i == q->n_tokens - 1))
                m->h_rows[nl++] = n + i;
        }
        n += q->n_tokens;
    }
    m->h_q_start[b->n_seqs] = n;
    *n_rows = n;
    *n_logit = nl;
    return 0;
}

/* y = x @ W of a row-parallel linear (o_proj, down_proj), summed over the
 * ranks: in the linear's own epilogue where the backend and the
 * communicator offer it (ops->linear_sum, comm->sum_desc; the same choice on
 * every rank), else the linear and then all_reduce_sum. site: the call's
 * number in the forward (2 l for o_proj, 2 l + 1 for down_proj). */
static int linear_summed(struct model *m, struct buf *y, const struct buf *x, int n,
                         const struct op_linear *l, int site) {
    struct ops *O = m->ops;
    struct comm *cm = m->comm;
    int rc;
    if (cm->size > 1 && O->linear_sum && cm->sum_desc && O->linear_sum_ok(O->ctx, n, l)) {
        const void *d = NULL;
        if ((rc = cm->sum_desc(cm, site, (size_t)n * m->hidden, &d))) return rc;
        if (d) {
            O->linear_sum(O->ctx, y, x, n, l, d);
            return 0;
        }
    }
    O->linear(O->ctx, y, x, n, l);
    return cm->size > 1 ? cm->all_reduce_sum(cm, y, (size_t)n * m->hidden) : 0;
}

/* embed .. layers .. final norm for the ab->n_rows rows staged on the
 * device: m->x holds the normed rows. */
static int forward_layers(struct model *m, const struct attn_batch *ab, char *err, size_t errlen) {
    struct ops *O = m->ops;
    void *c = O->ctx;
    int n = ab->n_rows, H = m->hidden, rc;
    /* h = embed(ids) (vocab-parallel: each rank fills its rows, sum) */
    O->embed(c, m->h, m->embed, m->ids, n, H, m->vocab_start, m->vocab_rows);
    if (m->comm->size > 1 && (rc = m->comm->all_reduce_sum(m->comm, m->h, (size_t)n * H)))
        return util_err(err, errlen, rc, "model: all-reduce failed");

    /* the residual stream: in hc; a fused norm + linear writes it to hn and
     * the two swap (decode batches, backends with add_rmsnorm_linear) */
    struct buf *hc = m->h, *hn = m->h2, *t;
    const int fuse = O->add_rmsnorm_linear && n <= H2_ROWS;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        struct layer *L = &m->layers[l];
        /* x = rmsnorm(h += previous mlp output); qkv = x @ Wqkv (+ bias) */
        if (fuse && O->add_rmsnorm_linear(c, hc, l ? m->proj : NULL, hn, L->attn_norm, n, H,
                                          m->eps, m->qkv, L->qkv) == 0) {
            t = hc, hc = hn, hn = t;
        } else {
            O->add_rmsnorm(c, hc, l ? m->proj : NULL, m->x, L->attn_norm, n, H, m->eps);
            O->linear(c, m->qkv, m->x, n, L->qkv);
        }
        /* q/k norm, RoPE, write k/v into the paged cache */
        O->qk_norm_rope_kv(c, m->qkv, n, m->nh, m->nkv, m->hd, L->q_norm, L->k_norm, m->eps,
                           m->inv_freq, ab, L->k_cache, L->v_cache);
        /* att = softmax(q K^T / sqrt(hd)) V over each sequence's cache */
        O->attention(c, m->att, m->qkv, m->nh, m->nkv, m->hd, m->attn_scale, ab, L->k_cache,
                     L->v_cache);
        /* proj = att @ Wo, summed over ranks */
        if ((rc = linear_summed(m, m->proj, m->att, n, L->o, 2 * l)))
            return util_err(err, errlen, rc, "model: all-reduce failed");
        /* x = rmsnorm(h += proj); mlp = silu(x @ Wg) * (x @ Wu) (one fused op) */
        if (fuse && O->add_rmsnorm_linear(c, hc, m->proj, hn, L->mlp_norm, n, H, m->eps, m->mlp,
                                          L->gate_up) == 0) {
            t = hc, hc = hn, hn = t;
        } else {
            O->add_rmsnorm(c, hc, m->proj, m->x, L->mlp_norm, n, H, m->eps);
            O->linear_silu_mul(c, m->mlp, m->x, n, L->gate_up);
        }
        /* proj = mlp @ Wd, summed over ranks */
        if ((rc = linear_summed(m, m->proj, m->mlp, n, L->down, 2 * l + 1)))
            return util_err(err, errlen, rc, "model: all-reduce failed");
    }
    /* x = final_norm(h += last mlp output) */
    O->add_rmsnorm(c, hc, m->proj, m->x, m->final_norm, n, H, m->eps);
    return 0;
}

/* The graph bucket a batch replays, or -1 (run op by op): decode-only
 * batches (every sequence one new token) on a backend with graphs, when the
 * all-reduce (tp > 1) may be recorded. */
static int graph_bucket(const struct model *m, const struct batch *b) {
    if (m->n_buckets == 0 || (m->comm->size > 1 && !m->comm->graph_safe)) return -1;
    if (b->n_seqs > m->bucket[m->n_buckets - 1]) return -1;
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seqs[s].n_tokens != 1) return -1;
    int i = 0;
    while (m->bucket[i] < b->n_seqs) i++;
    return m->graph_failed[i] ? -1 : i;
}

/* Rows [S, nb) of the staged decode batch become padding: token 0 at
 * position 0, KV slot -1 (nothing written), past -1 (attention writes zeros);
 * their block-table rows hold ids of earlier batches (never read). */
static void pad_decode_batch(struct model *m, int S, int nb) {
    for (int s = S; s < nb; s++) {
        m->h_ids[s] = 0;
        m->h_pos[s] = 0;
        m->h_slots[s] = -1;
        m->h_past[s] = -1;
        m->h_q_start[s + 1] = s + 1;
    }
}

/* Replays bucket gi's graph, recording it first if needed. A recording that
 * fails (the backend logs why) marks the bucket eager for good and runs this
 * step op by op: nothing ran while recording. */
static int forward_graph(struct model *m, int gi, const struct attn_batch *ab, char *err,
                         size_t errlen) {
    struct ops *O = m->ops;
    void *c = O->ctx;
    int rc;
    if (!m->graph[gi]) {
        struct op_graph *g = NULL;
        rc = O->graph_begin(c);
        if (!rc) {
            char e2[256] = "";
            int frc = forward_layers(m, ab, e2, sizeof e2);
            rc = O->graph_end(c, &g);
            if (frc) {
                if (!rc) O->graph_free(c, g);
                g = NULL;
                /* the tensor-parallel group failed during the recording (a
                 * rank's fault at a collective): that is the step's error;
                 * running it again op by op would only report the
                 * cancellation that followed */
                if (m->comm->status && m->comm->status(m->comm))
                    return util_err(err, errlen, frc, "%s", e2);
                log_warn("model: decode batches of %d run without a graph: %s", m->bucket[gi], e2);
                rc = frc;
            }
        }
        if (rc) {
            m->graph_failed[gi] = 1;
            return forward_layers(m, ab, err, errlen);
        }
        m->graph[gi] = g;
    }
    /* a replayed all-reduce cannot report a failed peer itself: ask the
     * group before the replay (and after the step's sync, model_forward) */
    if (m->comm->status && (rc = m->comm->status(m->comm)))
        return util_err(err, errlen, rc, "model: the tensor-parallel group has failed");
    if ((rc = O->graph_run(c, m->graph[gi])))
        return util_err(err, errlen, rc, "model: graph replay failed");
    return 0;
}

/* AWQD_TRACE_FORWARD=1: one log line per forward with the host time of its
 * phases (where a step's wall time goes when the GPU is not the limit). */
static int trace_forward(void) {
    static int on = -1;
    if (on < 0) on = env_on("AWQD_TRACE_FORWARD");
    return on;
}

/* rows[i] == i for i < n: the lm_head needs no gather (ops->lm_head rows NULL). */
static int rows_identity(const int32_t *rows, int n) {
    for (int i = 0; i < n; i++)
        if (rows[i] != i) return 0;
    return 1;
}

/* Small 4-byte uploads at offset 0: as one (ops->upload_group) where the
 * backend has it, else one by one; width / stride (or NULL): rows of
 * width[i] written stride[i] apart (ops->upload_group). */
static int upload_parts(struct ops *O, struct buf *const *dst, const void *const *src,
                        const size_t *n, const size_t *width, const size_t *stride, int parts) {
    if (O->upload_group) return O->upload_group(O->ctx, dst, src, n, width, stride, parts);
    for (int i = 0; i < parts; i++) {
        const int rows = width && width[i];
        const size_t w = rows ? width[i] : n[i], ld = rows ? stride[i] : 0;
        for (size_t r = 0; w && r < n[i] / w; r++) {
            int rc = O->upload(O->ctx, dst[i], r * ld, (const int32_t *)src[i] + r * w, w);
            if (rc) return rc;
        }
    }
    return 0;
}

int model_forward(struct model *m, const struct batch *b, float *logits, char *err,
                  size_t errlen) {
    struct ops *O = m->ops;
    void *c = O->ctx;
    int n = 0, nl = 0, btw = 0, rc;
    const int tr = trace_forward();
    double t[6] = {0}, t_up = 0;
    if (tr) t[0] = util_now_s();
    if ((rc = stage_batch(m, b, &n, &nl, &btw, err, errlen))) return rc;
    if (nl > 0 && !logits) return util_err(err, errlen, -EINVAL, "batch: logits wanted, no output array");

    /* upload the batch description (a decode batch that replays a graph:
     * padded to its bucket first) */
    int S = b->n_seqs;
    int gi = graph_bucket(m, b);
    int ns = S, nr = n;                   /* sequences and rows the ops run on */
    if (gi >= 0) {
        ns = nr = m->bucket[gi];
        pad_decode_batch(m, S, ns);
    }
    {
        struct buf *dst[12] = {m->ids, m->positions, m->slots, m->q_start, m->past,
                               m->block_table, m->logit_rows};
        const void *src[12] = {m->h_ids, m->h_pos, m->h_slots, m->h_q_start, m->h_past, m->h_bt,
                               m->h_rows};
        size_t cnt[] = {(size_t)nr, (size_t)nr, (size_t)nr, (size_t)ns + 1, (size_t)ns,
                        (size_t)ns * btw, nl > 0 ? (size_t)nl : 0,
                        0, 0, 0, 0, 0};
        /* the block table's rows: btw entries each, max_blocks_per_seq apart */
        size_t wd[12] = {0, 0, 0, 0, 0, (size_t)btw}, ld[12] = {0, 0, 0, 0, 0,
                                                                  (size_t)m->opts.max_blocks_per_seq};
        /* sample chunk 0's inputs go up with the batch: nothing to upload
         * between the layers and the lm_head */
        m->s_pre = m->n_srows > 0 && sample_inputs_ok(m) &&
                   sample_stage(m, 0, dst + 7, src + 7, cnt + 7, &m->s_pre_mr, &m->s_pre_na,
                                &m->s_pre_race) == 0;
        if (tr) t_up = util_now_s();
        if ((rc = upload_parts(O, dst, src, cnt, wd, ld, m->s_pre ? 12 : 7)))
            return util_err(err, errlen, rc, "model: upload of the batch failed");
    }
    if (tr) t[1] = util_now_s();
    struct attn_batch ab = {
        .n_seqs = ns, .n_rows = nr, .max_blocks = m->opts.max_blocks_per_seq,
        .block_size = m->opts.block_size, .q_start = m->q_start, .past = m->past,
        .block_table = m->block_table, .positions = m->positions, .slots = m->slots,
        .h_q_start = m->h_q_start, .h_past = m->h_past, .decode_fixed = gi >= 0,
    };
    int H = m->hidden;

    /* embed .. layers .. x = final_norm(h += last mlp output): replayed from
     * the bucket's graph, or run op by op */
    rc = gi >= 0 ? forward_graph(m, gi, &ab, err, errlen) : forward_layers(m, &ab, err, errlen);
    if (rc) return rc;
    if (tr) t[2] = util_now_s();

    /* logits of the selected rows, this rank's vocabulary columns */
    int V = m->cfg.vocab;
    int cols = m->vocab_rows;
    if (m->vocab_start + cols > V) cols = V - m->vocab_start;
    for (int r0 = 0; r0 < nl; r0 += m->logit_chunk) {
        int mr = nl - r0 < m->logit_chunk ? nl - r0 : m->logit_chunk;
        if (r0 > 0 && (rc = O->upload(c, m->logit_rows, 0, m->h_rows + r0, (size_t)mr)))
            return util_err(err, errlen, rc, "model: upload failed");
        O->lm_head(c, m->logits, m->x, rows_identity(m->h_rows + r0, mr) ? NULL : m->logit_rows, mr,
                   m->lm_head, H, m->vocab_rows);
        if ((rc = O->download(c, m->h_logits, m->logits, 0, (size_t)mr * m->vocab_rows)))
            return util_err(err, errlen, rc, "model: download of logits failed");
        for (int r = 0; r < mr; r++)
            if (cols > 0)
                memcpy(logits + (size_t)(r0 + r) * V + m->vocab_start,
                       m->h_logits + (size_t)r * m->vocab_rows, (size_t)cols * sizeof(float));
    }
    /* sampling candidates of the SAMPLE rows (after the full rows: m->logits
     * then holds the last sample chunk, for model_sample_row_logits) */
    if (tr) t[3] = util_now_s();
    if (m->n_srows > 0 && (rc = sample_rows(m, b, cols, err, errlen))) return rc;
    if (tr) t[4] = util_now_s();
    if ((rc = O->sync(c))) return util_err(err, errlen, rc, "model: backend sync failed");
    if (tr) {
        t[5] = util_now_s();
        log_info("forward trace (rank %d, %d rows, %s): stage+upload %.3f ms (upload %.3f), layers "
                 "submitted %.3f, full logits %.3f, sampling %.3f, sync %.3f, total %.3f ms",
                 m->comm->rank, n, gi >= 0 ? "graph" : "eager", (t[1] - t[0]) * 1e3, (t[1] - t_up) * 1e3,
                 (t[2] - t[1]) * 1e3, (t[3] - t[2]) * 1e3, (t[4] - t[3]) * 1e3,
                 (t[5] - t[4]) * 1e3, (t[5] - t[0]) * 1e3);
    }
    if (gi >= 0 && m->comm->status && (rc = m->comm->status(m->comm)))
        return util_err(err, errlen, rc, "model: an all-reduce of the replayed step failed");
    return 0;
}

int model_sample_rows(const struct batch *b) {
    int n = 0;
    for (int s = 0; s < b->n_seqs; s++) n += b->seqs[s].logits == MODEL_LOGITS_SAMPLE;
    return n;
}

int model_forward_out(struct model *m, const struct batch *b, const struct model_out *o,
                      char *err, size_t errlen) {
    if (!m->h_srows && !(m->h_srows = malloc(sizeof(int32_t) * (size_t)m->opts.max_seqs)))
        return util_err(err, errlen, -ENOMEM, "model: out of memory");
    m->sout = o;
    int rc = model_forward(m, b, o ? o->logits : NULL, err, errlen);
    m->sout = NULL;
    return rc;
}

/* Sampling buffers for adjustment lists of up to n_adj entries per chunk. */
static int sample_reserve(struct model *m, size_t n_adj) {
    struct ops *O = m->ops;
    void *c = O->ctx;
    if (!m->s_work) {
        m->s_work = O->alloc(c, BUF_F32, sample_work_floats(m->logit_chunk, m->vocab_rows, SAMPLE_MAX_K));
        m->s_inv_t = O->alloc(c, BUF_F32, (size_t)m->logit_chunk);
        m->s_adj_start = O->alloc(c, BUF_I32, (size_t)m->logit_chunk + 1);
        m->s_race = O->alloc(c, BUF_I32, 3 * (size_t)m->logit_chunk);
        m->s_rows = O->alloc(c, BUF_I32, (size_t)m->logit_chunk);
        m->h_inv_t = malloc(sizeof(float) * (size_t)m->logit_chunk);
        m->h_adj_start = malloc(sizeof(int32_t) * ((size_t)m->logit_chunk + 1));
        if (!m->s_work || !m->s_inv_t || !m->s_adj_start || !m->s_race || !m->s_rows ||
            !m->h_inv_t || !m->h_adj_start)
            return -ENOMEM;
    }
    if (!m->s_out || n_adj > m->s_cap_adj) {
        size_t cap = m->s_cap_adj ? m->s_cap_adj : SAMPLE_ADJ_CAP0;
        while (cap < n_adj) cap *= 2;
        O->free(c, m->s_adj);
        O->free(c, m->s_out);
        free(m->h_adj);
        free(m->h_sout);
        m->s_adj = O->alloc(c, BUF_I32, 2 * cap);
        m->s_out = O->alloc(c, BUF_F32, SAMPLE_OUT_FLOATS(m->logit_chunk, SAMPLE_MAX_K, cap));
        m->h_adj = malloc(sizeof(int32_t) * 2 * cap);
        m->h_sout = malloc(sizeof(float) * SAMPLE_OUT_FLOATS(m->logit_chunk, SAMPLE_MAX_K, cap));
        m->s_cap_adj = m->s_adj && m->s_out && m->h_adj && m->h_sout ? cap : 0;
        if (!m->s_cap_adj) return -ENOMEM;
    }
    return 0;
}

/* lm_head of sample chunk ci into m->logits. */
static int sample_chunk_logits(struct model *m, int ci, int rows_uploaded) {
    struct ops *O = m->ops;
    const int LC = m->logit_chunk;
    int c0 = ci * LC, mr = m->n_srows - c0 < LC ? m->n_srows - c0 : LC;
    int rc = rows_uploaded ? 0 : O->upload(O->ctx, m->s_rows, 0, m->h_srows + c0, (size_t)mr);
    if (rc) return rc;
    O->lm_head(O->ctx, m->logits, m->x, rows_identity(m->h_srows + c0, mr) ? NULL : m->s_rows,
               mr, m->lm_head, m->hidden, m->vocab_rows);
    m->logits_chunk = ci;
    return 0;
}

/* The sampling inputs model_forward_out was given are usable. */
static int sample_inputs_ok(const struct model *m) {
    const struct model_out *o = m->sout;
    int ns = m->n_srows;
    return o && o->cands && o->inv_t && o->k >= 1 && o->k <= SAMPLE_MAX_K && m->ops->sample_topk &&
           !(o->adj_start && o->adj_start[ns] > 0 && (!o->adj || !o->adj_raw));
}

/* Stages sample chunk c0's inputs (temperatures, adjustments, race triples,
 * x rows) in the host arrays and lists their uploads as 5 parts; its rows,
 * adjustments and whether any row races into *mr, *na, *race. */
static int sample_stage(struct model *m, int c0, struct buf **dst, const void **src, size_t *cnt,
                        int *mr_out, size_t *na_out, int *race_out) {
    const struct model_out *o = m->sout;
    int ns = m->n_srows;
    int mr = ns - c0 < m->logit_chunk ? ns - c0 : m->logit_chunk;
    int chunk_off = o->adj_start ? o->adj_start[c0] : 0;
    size_t na = o->adj_start ? (size_t)(o->adj_start[c0 + mr] - chunk_off) : 0;
    int rc = sample_reserve(m, na);
    if (rc) return rc;
    for (int r = 0; r < mr; r++) {
        m->h_inv_t[r] = o->inv_t[c0 + r] > 0 ? o->inv_t[c0 + r] : 1.0f;
        m->h_adj_start[r] = o->adj_start ? o->adj_start[c0 + r] - chunk_off : 0;
    }
    m->h_adj_start[mr] = (int32_t)na;
    int race = 0; /* any row of the chunk races (greedy rows do not) */
    for (int r = 0; o->race && r < mr; r++) race |= o->race[3 * (size_t)(c0 + r) + 2] != 0;
    if (na) memcpy(m->h_adj, o->adj + 2 * (size_t)chunk_off, sizeof(int32_t) * 2 * na);
    struct buf *d[5] = {m->s_inv_t, m->s_adj_start, m->s_adj, m->s_race, m->s_rows};
    const void *sr[5] = {m->h_inv_t, m->h_adj_start, m->h_adj,
                         o->race ? o->race + 3 * (size_t)c0 : NULL, m->h_srows + c0};
    size_t n[5] = {(size_t)mr, (size_t)mr + 1, 2 * na, race ? 3 * (size_t)mr : 0, (size_t)mr};
    for (int i = 0; i < 5; i++) {
        dst[i] = d[i];
        src[i] = sr[i];
        cnt[i] = n[i];
    }
    *mr_out = mr;
    *na_out = na;
    *race_out = race;
    return 0;
}

/* Candidates of every SAMPLE row into m->sout (this rank's part). Chunk 0's
 * inputs may have gone up with the batch (m->s_pre). */
static int sample_rows(struct model *m, const struct batch *b, int cols, char *err,
                       size_t errlen) {
    struct ops *O = m->ops;
    void *c = O->ctx;
    const struct model_out *o = m->sout;
    int ns = m->n_srows, rc;
    if (!sample_inputs_ok(m))
        return util_err(err, errlen, -EINVAL,
                        "batch: sampling rows need model_forward_out (k 1..%d, inv_t, adjustment "
                        "outputs) on a backend with sample_topk", SAMPLE_MAX_K);
    int k = o->k, rank = m->comm->rank;
    size_t RF = SAMPLE_ROW_FLOATS(k);
    if (cols < 0) cols = 0;
    for (int c0 = 0; c0 < ns; c0 += m->logit_chunk) {
        int mr, race;
        size_t na;
        int chunk_off = o->adj_start ? o->adj_start[c0] : 0;
        if (c0 == 0 && m->s_pre) {
            mr = m->s_pre_mr;
            na = m->s_pre_na;
            race = m->s_pre_race;
        } else {
            struct buf *dst[5];
            const void *src[5];
            size_t cnt[5];
            if ((rc = sample_stage(m, c0, dst, src, cnt, &mr, &na, &race)))
                return util_err(err, errlen, rc, "model: out of %s memory for sampling", O->name);
            if ((rc = upload_parts(O, dst, src, cnt, NULL, NULL, 5)))
                return util_err(err, errlen, rc, "model: upload failed");
        }
        if ((rc = sample_chunk_logits(m, c0 / m->logit_chunk, 1)))
            return util_err(err, errlen, rc, "model: upload failed");
        struct sample_batch sb = {.m = mr, .k = k, .ld = m->vocab_rows, .n_cols = cols,
                                  .vocab_start = m->vocab_start, .inv_t = m->s_inv_t,
                                  .adj_start = m->s_adj_start, .adj = m->s_adj,
                                  .h_adj_start = m->h_adj_start,
                                  .race = race ? m->s_race : NULL};
        O->sample_topk(c, m->s_out, m->logits, m->s_work, &sb);
        size_t nf = SAMPLE_OUT_FLOATS(mr, k, na);
        if ((rc = O->download(c, m->h_sout, m->s_out, 0, nf)))
            return util_err(err, errlen, rc, "model: download of sampling candidates failed");
        for (int r = 0; r < mr; r++)
            memcpy(o->cands + ((size_t)rank * ns + c0 + r) * RF, m->h_sout + (size_t)r * RF,
                   RF * sizeof(float));
        for (size_t e = 0; e < na; e++) {
            int t = m->h_adj[2 * e] >> 2;
            if (t >= m->vocab_start && t < m->vocab_start + cols)
                o->adj_raw[chunk_off + e] = m->h_sout[(size_t)mr * RF + e];
        }
    }
    return 0;
}

int model_sample_row_logits(struct model *m, int i, float *row, char *err, size_t errlen) {
    if (i < 0 || i >= m->n_srows)
        return util_err(err, errlen, -EINVAL, "model: no sampling row %d in the last forward", i);
    struct ops *O = m->ops;
    int rc, ci = i / m->logit_chunk;
    if (m->logits_chunk != ci && (rc = sample_chunk_logits(m, ci, 0)))
        return util_err(err, errlen, rc, "model: upload failed");
    if ((rc = O->download(O->ctx, m->h_logits, m->logits, (size_t)(i - ci * m->logit_chunk) * m->vocab_rows,
                          (size_t)m->vocab_rows)))
        return util_err(err, errlen, rc, "model: download of logits failed");
    int V = m->cfg.vocab, cols = m->vocab_rows;
    if (m->vocab_start + cols > V) cols = V - m->vocab_start;
    if (cols > 0) memcpy(row + m->vocab_start, m->h_logits, (size_t)cols * sizeof(float));
    return 0;
}

/* ======================================================================== */
/* model_group: one worker thread per rank                                  */
/* ======================================================================== */

enum { JOB_NONE = 0, JOB_FORWARD, JOB_COPY, JOB_EXIT, JOB_SAMPLE_ROW };

struct rank_worker {
    struct model_group *g;
    int rank;
    pthread_t th;
    int started;
    struct ops *ops;
    struct comm *comm;
    struct model *m;
    int rc;                       /* last job's status */
    char err[256];
};

struct model_group {
    int tp;
    struct rank_worker *w;        /* [tp] */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long gen;            /* bumped per job */
    int pending;                  /* workers not done with the current job */
    int job;
    const struct batch *b;
    float *logits;
    const struct model_out *out;  /* JOB_FORWARD */
    int row_i;                    /* JOB_SAMPLE_ROW */
    float *row;
    int cp_dst, cp_src;
    double spin_s;                /* poll this long before sleeping on start / done */
    int cuda_comm;                /* the ranks talk through comm/cuda (comm_cuda_status) */
    /* init only */
    struct ckpt *ck;
    const struct model_group_opts *o;
};

void model_group_opts_default(struct model_group_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "cpu";
    o->tp = 1;
    model_opts_default(&o->model);
}

static void worker_done(struct model_group *g) {
    pthread_mutex_lock(&g->mu);
    if (__atomic_sub_fetch(&g->pending, 1, __ATOMIC_ACQ_REL) == 0) pthread_cond_broadcast(&g->done);
    pthread_mutex_unlock(&g->mu);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Before a thread sleeps on a condition variable it polls for up to
 * g->spin_s (AWQD_SPIN_US; CUDA backend only): a decode loop's next job
 * and a GPU step's end then cost no wake-up (futex + scheduler, 10-30 us
 * per handoff, two per step). 1 when gen moved off `seen` (a worker, for_done 0)
 * or pending reached 0 (the caller, for_done 1) while polling. */
static int spin(const struct model_group *g, int for_done, unsigned long seen) {
    if (g->spin_s <= 0) return 0;
    double t0 = util_now_s();
    for (unsigned i = 1;; i++) {
        if (for_done ? __atomic_load_n(&g->pending, __ATOMIC_ACQUIRE) == 0
                     : __atomic_load_n(&g->gen, __ATOMIC_ACQUIRE) != seen)
            return 1;
        cpu_relax();
        if (!(i & 255) && util_now_s() - t0 > g->spin_s) return 0;
    }
}

static int worker_init(struct rank_worker *w) {
    struct model_group *g = w->g;
    const struct model_group_opts *o = g->o;
    int rc;
    if (!strcmp(o->backend, "cpu")) {
        int th = o->cpu_threads;
        if (th <= 0) {
            const int nc = util_cpus(0);
            th = nc > g->tp ? nc / g->tp : 1;
        }
        rc = ops_cpu_create(th, &w->ops, w->err, sizeof w->err);
    } else if (!strcmp(o->backend, "cuda")) {
#ifdef AWQD_CUDA
        int dev = o->devices ? o->devices[w->rank] : w->rank;
        rc = ops_cuda_create(dev, &w->ops, w->err, sizeof w->err);
        if (!rc && g->tp > 1) /* the rank's all-reduce runs on this backend's stream */
            rc = comm_cuda_attach(w->comm, w->ops, w->err, sizeof w->err);
#else
        rc = util_err(w->err, sizeof w->err, -ENOTSUP,
                      "backend cuda: this build has no CUDA backend (build with CUDA=1)");
#endif
    } else {
        rc = util_err(w->err, sizeof w->err, -EINVAL, "unknown backend \"%s\" (cpu, cuda)",
                      o->backend);
    }
    if (rc) return rc;
    struct model_weights mw;
    memset(&mw, 0, sizeof mw);
    char e[200];
    const double t0 = util_now_s();
    if ((rc = ckpt_load(g->ck, w->rank, g->tp, &mw, e, sizeof e)))
        return util_err(w->err, sizeof w->err, rc, "rank %d: %s", w->rank, e);
    const double t1 = util_now_s();
    rc = model_init(&mw, w->ops, w->comm, &o->model, &w->m, e, sizeof e);
    model_weights_free(&mw);
    if (rc) return util_err(w->err, sizeof w->err, rc, "rank %d: %s", w->rank, e);
    /* where a load's time goes: the checkpoint read vs the backend's
     * weights (on CUDA the host repack and the copies), KV cache and graphs */
    log_info("rank %d: weights read in %.2f s, the %s model made in %.2f s", w->rank, t1 - t0, o->backend,
             util_now_s() - t1);
    return 0;
}

static void *worker_main(void *arg) {
    struct rank_worker *w = arg;
    struct model_group *g = w->g;
    w->rc = worker_init(w);
    unsigned long seen = 0;
    pthread_mutex_lock(&g->mu);
    seen = g->gen;
    pthread_mutex_unlock(&g->mu);
    worker_done(g);
    for (;;) {
        spin(g, 0, seen);
        pthread_mutex_lock(&g->mu);
        while (g->gen == seen) pthread_cond_wait(&g->start, &g->mu);
        seen = g->gen;
        int job = g->job;
        pthread_mutex_unlock(&g->mu);
        if (job == JOB_EXIT) break;
        if (job == JOB_FORWARD)
            w->rc = model_forward_out(w->m, g->b, g->out, w->err, sizeof w->err);
        else if (job == JOB_SAMPLE_ROW)
            w->rc = model_sample_row_logits(w->m, g->row_i, g->row, w->err, sizeof w->err);
        else if (job == JOB_COPY)
            model_copy_block(w->m, g->cp_dst, g->cp_src);
        worker_done(g);
    }
    return NULL;
}

/* Runs one job on every worker and waits for all. */
static void group_run(struct model_group *g, int job) {
    pthread_mutex_lock(&g->mu);
    g->job = job;
    g->pending = g->tp;
    __atomic_add_fetch(&g->gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&g->start);
    pthread_mutex_unlock(&g->mu);
    if (job == JOB_EXIT || spin(g, 1, 0)) return;
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

void model_group_free(struct model_group *g) {
    if (!g) return;
    int any = 0;
    for (int r = 0; r < g->tp; r++) any |= g->w[r].started;
    if (any) {
        pthread_mutex_lock(&g->mu);
        g->job = JOB_EXIT;
        __atomic_add_fetch(&g->gen, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&g->start);
        pthread_mutex_unlock(&g->mu);
    }
    for (int r = 0; r < g->tp; r++) {
        struct rank_worker *w = &g->w[r];
        if (w->started) pthread_join(w->th, NULL);
        model_free(w->m);
        comm_free(w->comm);
        ops_destroy(w->ops);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->start);
    pthread_cond_destroy(&g->done);
    free(g->w);
    free(g);
}

int model_group_init(struct ckpt *ck, const struct model_group_opts *o, struct model_group **out,
                     char *err, size_t errlen) {
    *out = NULL;
    int tp = o->tp < 1 ? 1 : o->tp;
    const char *backend = o->backend ? o->backend : "cpu";
    int cuda_tp = tp > 1 && strcmp(backend, "cuda") == 0;
    if (tp > 1 && strcmp(backend, "cpu") != 0 && !cuda_tp)
        return util_err(err, errlen, -EINVAL, "unknown backend \"%s\" (cpu, cuda)", backend);
#ifndef AWQD_CUDA
    if (cuda_tp)
        return util_err(err, errlen, -ENOTSUP,
                        "backend cuda: this build has no CUDA backend (build with CUDA=1)");
#endif
    struct model_group *g = calloc(1, sizeof *g);
    if (!g) return util_err(err, errlen, -ENOMEM, "model group: out of memory");
    g->tp = tp;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->start, NULL);
    pthread_cond_init(&g->done, NULL);
    g->w = calloc((size_t)tp, sizeof *g->w);
    struct comm **comms = calloc((size_t)tp, sizeof *comms);
    int rc = 0;
    if (!g->w || !comms) {
        free(comms);
        model_group_free(g);
        return util_err(err, errlen, -ENOMEM, "model group: out of memory");
    }
    char ce[256] = "";
#ifdef AWQD_CUDA
    if (cuda_tp) { /* NCCL + peer-to-peer all-reduce (comm/cuda/comm_cuda.h) */
        rc = comm_cuda_group(tp, o->devices, comms, ce, sizeof ce);
        g->cuda_comm = rc == 0;
    } else
#endif
        rc = tp == 1 ? comm_cpu_single(&comms[0]) : comm_cpu_group(tp, comms);
    if (rc) {
        free(comms);
        model_group_free(g);
        return util_err(err, errlen, rc, "model group: cannot create the communicator%s%s",
                        ce[0] ? ": " : "", ce);
    }
    struct model_group_opts oo = *o;
    oo.backend = backend;
    oo.tp = tp;
    g->ck = ck;
    g->o = &oo;
    /* polling before a handoff sleeps (spin): on by default where the
     * threads mostly wait for a GPU, off on the CPU backend (its compute
     * threads need the cores) */
    g->spin_s = !strcmp(backend, "cuda") ? 10e-3 : 0;
    const char *spin = getenv("AWQD_SPIN_US");
    if (spin && *spin) g->spin_s = atof(spin) * 1e-6;
    g->pending = tp;
    for (int r = 0; r < tp; r++) {
        g->w[r].g = g;
        g->w[r].rank = r;
        g->w[r].comm = comms[r];
    }
    free(comms);
    for (int r = 0; r < tp; r++) {
        if (pthread_create(&g->w[r].th, NULL, worker_main, &g->w[r])) {
            /* init has no collectives: the started ranks finish it alone */
            pthread_mutex_lock(&g->mu);
            g->pending -= tp - r;
            pthread_mutex_unlock(&g->mu);
            rc = util_err(err, errlen, -EAGAIN, "model group: cannot start thread %d", r);
            break;
        }
        g->w[r].started = 1;
    }
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    g->ck = NULL;
    g->o = NULL;
    for (int r = 0; r < tp && !rc; r++)
        if (g->w[r].rc) rc = util_err(err, errlen, g->w[r].rc, "%s", g->w[r].err);
    if (rc) {
        model_group_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int model_group_forward(struct model_group *g, const struct batch *b, float *logits, char *err,
                        size_t errlen) {
    struct model_out o = {.logits = logits};
    return model_group_forward_out(g, b, &o, err, errlen);
}

/* The first failing rank's error (others' collectives are cancelled). When
 * the tensor-parallel group itself failed (a rank's fault at a collective, a
 * peer that never arrived), the communicator knows which rank failed first
 * and why: that leads the message (a rank that only saw the group fail, e.g.
 * before a graph replay, reports the group's state, not the cause). */
static int group_error(struct model_group *g, char *err, size_t errlen) {
    int bad = -1;
    for (int r = 0; r < g->tp; r++)
        if (g->w[r].rc && (bad < 0 || (g->w[bad].rc == -ECANCELED && g->w[r].rc != -ECANCELED)))
            bad = r;
    if (bad < 0) return 0;
#ifdef AWQD_CUDA
    char cm[256];
    if (g->cuda_comm && comm_cuda_status(g->w[0].comm, cm, sizeof cm))
        return util_err(err, errlen, g->w[bad].rc, "%s (rank %d: %s)", cm, bad, g->w[bad].err);
#endif
    return util_err(err, errlen, g->w[bad].rc, "rank %d: %s", bad, g->w[bad].err);
}

int model_group_sample_row_logits(struct model_group *g, int i, float *row, char *err,
                                  size_t errlen) {
    g->row_i = i;
    g->row = row;
    group_run(g, JOB_SAMPLE_ROW);
    return group_error(g, err, errlen);
}

int model_group_forward_out(struct model_group *g, const struct batch *b,
                            const struct model_out *o, char *err, size_t errlen) {
    g->b = b;
    g->logits = o->logits;
    g->out = o;
    group_run(g, JOB_FORWARD);
    return group_error(g, err, errlen);
}

void model_group_copy_block(struct model_group *g, int dst, int src) {
    g->cp_dst = dst;
    g->cp_src = src;
    group_run(g, JOB_COPY);
}

struct model *model_group_rank0(struct model_group *g) { return g->w[0].m; }
int model_group_tp(const struct model_group *g) { return g->tp; }
