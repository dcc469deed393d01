/* ckpt_load.c — ckpt_load: one rank's shard of the weights.
 *
 * The load is a plan of 2-D block copies (source tensor rows x columns ->
 * destination with its own row stride, with bf16/fp32 -> fp16 conversion where
 * needed) into one anonymous arena. The plan is built twice: once to measure
 * the arena, once to fill in destinations. The blocks are then cut into
 * chunks of a few MB and copied by a few threads; loads over 1 GB report
 * progress (%, GB, GB/s) on stderr. */
#include "engine/ckpt.h"

#include "engine/ckpt_internal.h"
#include "engine/safetensors.h"
#include "engine/util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* geometry of one rank                                                      */

struct geom {
    int rank, tp;
    int nh, nkv, kv_start;        /* query heads, KV heads, first KV head on this rank */
    int inter;                    /* intermediate columns on this rank */
    int vocab_start, vocab_rows;  /* padded: vocab_rows = ceil(vocab / tp) */
};

static int shard_geom(const struct model_config *c, int rank, int tp, struct geom *g, char *err,
                      size_t errlen) {
    memset(g, 0, sizeof *g);
    if (tp < 1 || tp > 1024 || rank < 0 || rank >= tp)
        return util_err(err, errlen, -EINVAL, "bad tensor-parallel rank %d of tp %d", rank, tp);
    int G = c->group_size > 0 ? c->group_size : 1, hd = c->head_dim;
    if (c->n_heads % tp)
        return util_err(err, errlen, -EINVAL,
                        "tp %d: num_attention_heads %d is not divisible by %d", tp, c->n_heads,
                        tp);
    if (tp <= c->n_kv_heads) {
        if (c->n_kv_heads % tp)
            return util_err(err, errlen, -EINVAL,
                            "tp %d: num_key_value_heads %d is not divisible by %d", tp,
                            c->n_kv_heads, tp);
    } else if (tp % c->n_kv_heads) {
        return util_err(err, errlen, -EINVAL,
                        "tp %d: more ranks than num_key_value_heads %d, and %d is not a multiple"
                        " of it (KV heads can only be replicated evenly)", tp, c->n_kv_heads, tp);
    }
    if (c->intermediate % tp)
        return util_err(err, errlen, -EINVAL,
                        "tp %d: intermediate_size %d is not divisible by %d", tp, c->intermediate,
                        tp);
    g->rank = rank;
    g->tp = tp;
    g->nh = c->n_heads / tp;
    if (tp <= c->n_kv_heads) {
        g->nkv = c->n_kv_heads / tp;
        g->kv_start = rank * g->nkv;
    } else {
        g->nkv = 1;
        g->kv_start = rank / (tp / c->n_kv_heads);
    }
    g->inter = c->intermediate / tp;
    if (tp > 1 && c->quantized) {
        if ((g->nh * hd) % 8 || (g->nkv * hd) % 8 || g->inter % 8)
            return util_err(err, errlen, -EINVAL,
                            "tp %d: column-parallel slices (q %d, k/v %d, gate/up %d columns) "
                            "must be multiples of 8 (one int32 of AWQ nibbles)", tp,
                            g->nh * hd, g->nkv * hd, g->inter);
        if ((g->nh * hd) % G)
            return util_err(err, errlen, -EINVAL,
                            "tp %d: o_proj rows per rank %d (of %d) are not a multiple of "
                            "group_size %d", tp, g->nh * hd, c->n_heads * hd, G);
        if (g->inter % G)
            return util_err(err, errlen, -EINVAL,
                            "tp %d: down_proj rows per rank %d (intermediate_size %d / %d) are "
                            "not a multiple of group_size %d", tp, g->inter, c->intermediate, tp,
                            G);
    }
    g->vocab_rows = (c->vocab + tp - 1) / tp;
    g->vocab_start = rank * g->vocab_rows;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* the plan                                                                  */

struct blk {
    const struct st_tensor *src;
    int64_t src_cols;             /* elements per source row */
    int64_t r0, nr, c0, nc;       /* the source block */
    char *dst;                    /* destination of the block's first element */
    int64_t dst_stride;           /* elements per destination row */
    int to_fp16;                  /* float source -> fp16 destination */
};

struct plan {
    int measure;                  /* 1: only size the arena */
    char *base;
    size_t cursor;                /* bytes of arena used */
    struct blk *b;
    int n, cap;
};

static void *take(struct plan *p, size_t bytes) {
    size_t off = (p->cursor + 63) & ~(size_t)63;
    p->cursor = off + bytes;
    return p->measure ? NULL : p->base + off;
}

static int add(struct plan *p, const struct st_tensor *src, int64_t src_cols, int64_t r0,
               int64_t nr, int64_t c0, int64_t nc, void *dst, size_t dst_off_elems,
               int64_t dst_stride, int to_fp16) {
    if (p->measure || nr == 0 || nc == 0) return 0;
    if (p->n == p->cap) {
        int nc2 = p->cap ? 2 * p->cap : 256;
        struct blk *nb = realloc(p->b, (size_t)nc2 * sizeof *nb);
        if (!nb) return -ENOMEM;
        p->b = nb;
        p->cap = nc2;
    }
    size_t desz = to_fp16 ? 2 : st_dtype_size(src->dtype);
    struct blk *b = &p->b[p->n++];
    b->src = src;
    b->src_cols = src_cols;
    b->r0 = r0;
    b->nr = nr;
    b->c0 = c0;
    b->nc = nc;
    b->dst = (char *)dst + dst_off_elems * desz;
    b->dst_stride = dst_stride;
    b->to_fp16 = to_fp16;
    return 0;
}

static const struct st_tensor *need(const struct ckpt *ck, const char *name) {
    return safetensors_find(ck->st, name);
}

/* Column-parallel AWQ linear: the concatenation of column ranges of several
 * projections of one layer (q|k|v or gate|up). */
struct seg { int proj; int64_t c0, nc; };

static int plan_cols(const struct ckpt *ck, struct plan *p, int layer, const struct seg *s,
                     int nseg, int with_bias, struct awq_linear *out) {
    const struct model_config *c = &ck->cfg;
    int G = c->group_size, K, N;
    ckpt_linear_shape(c, s[0].proj, &K, &N);
    int64_t nr = 0;
    for (int i = 0; i < nseg; i++) nr += s[i].nc;
    uint32_t *qw = take(p, (size_t)K * (size_t)(nr / 8) * 4);
    uint32_t *qz = take(p, (size_t)(K / G) * (size_t)(nr / 8) * 4);
    uint16_t *sc = take(p, (size_t)(K / G) * (size_t)nr * 2);
    uint16_t *bias = with_bias ? take(p, (size_t)nr * 2) : NULL;
    out->k = K;
    out->n = (int)nr;
    out->group = G;
    out->qweight = qw;
    out->qzeros = qz;
    out->scales = sc;
    out->bias = bias;
    int64_t acc = 0;
    char base[200], nm[256];
    for (int i = 0; i < nseg; i++) {
        ckpt_linear_shape(c, s[i].proj, &K, &N);
        ckpt_linear_name(layer, s[i].proj, base, sizeof base);
        const struct st_tensor *tq, *tz, *ts, *tb = NULL;
        snprintf(nm, sizeof nm, "%s.qweight", base);
        tq = need(ck, nm);
        snprintf(nm, sizeof nm, "%s.qzeros", base);
        tz = need(ck, nm);
        snprintf(nm, sizeof nm, "%s.scales", base);
        ts = need(ck, nm);
        if (with_bias) {
            snprintf(nm, sizeof nm, "%s.bias", base);
            tb = need(ck, nm);
        }
        if (!tq || !tz || !ts || (with_bias && !tb)) return -ENOENT;
        if (add(p, tq, N / 8, 0, K, s[i].c0 / 8, s[i].nc / 8, qw, (size_t)(acc / 8), nr / 8, 0) ||
            add(p, tz, N / 8, 0, K / G, s[i].c0 / 8, s[i].nc / 8, qz, (size_t)(acc / 8), nr / 8,
                0) ||
            add(p, ts, N, 0, K / G, s[i].c0, s[i].nc, sc, (size_t)acc, nr, 1) ||
            (tb && add(p, tb, N, 0, 1, s[i].c0, s[i].nc, bias, (size_t)acc, nr, 1)))
            return -ENOMEM;
        acc += s[i].nc;
    }
    return 0;
}

/* Row-parallel AWQ linear: rows [r0, r0 + nr) of K. */
static int plan_rows(const struct ckpt *ck, struct plan *p, int layer, int proj, int64_t r0,
                     int64_t nr, int with_bias, struct awq_linear *out) {
    const struct model_config *c = &ck->cfg;
    int G = c->group_size, K, N;
    ckpt_linear_shape(c, proj, &K, &N);
    char base[200], nm[256];
    ckpt_linear_name(layer, proj, base, sizeof base);
    snprintf(nm, sizeof nm, "%s.qweight", base);
    const struct st_tensor *tq = need(ck, nm);
    snprintf(nm, sizeof nm, "%s.qzeros", base);
    const struct st_tensor *tz = need(ck, nm);
    snprintf(nm, sizeof nm, "%s.scales", base);
    const struct st_tensor *ts = need(ck, nm);
    const struct st_tensor *tb = NULL;
    if (with_bias) {
        snprintf(nm, sizeof nm, "%s.bias", base);
        tb = need(ck, nm);
    }
    if (!tq || !tz || !ts || (with_bias && !tb)) return -ENOENT;
    uint32_t *qw = take(p, (size_t)nr * (size_t)(N / 8) * 4);
    uint32_t *qz = take(p, (size_t)(nr / G) * (size_t)(N / 8) * 4);
    uint16_t *sc = take(p, (size_t)(nr / G) * (size_t)N * 2);
    uint16_t *bias = with_bias ? take(p, (size_t)N * 2) : NULL;
    out->k = (int)nr;
    out->n = N;
    out->group = G;
    out->qweight = qw;
    out->qzeros = qz;
    out->scales = sc;
    out->bias = bias;
    if (add(p, tq, N / 8, r0, nr, 0, N / 8, qw, 0, N / 8, 0) ||
        add(p, tz, N / 8, r0 / G, nr / G, 0, N / 8, qz, 0, N / 8, 0) ||
        add(p, ts, N, r0 / G, nr / G, 0, N, sc, 0, N, 1) ||
        (tb && add(p, tb, N, 0, 1, 0, N, bias, 0, N, 1)))
        return -ENOMEM;
    return 0;
}

/* A whole fp16 vector [n]. */
static int plan_vec(const struct ckpt *ck, struct plan *p, const char *name, int64_t n,
                    const uint16_t **out) {
    const struct st_tensor *t = need(ck, name);
    if (!t) return -ENOENT;
    uint16_t *d = take(p, (size_t)n * 2);
    *out = d;
    return add(p, t, n, 0, 1, 0, n, d, 0, n, 1) ? -ENOMEM : 0;
}

/* Rows [start, start + rows) of a [vocab, hidden] matrix, zero past vocab. */
static int plan_vocab(const struct ckpt *ck, struct plan *p, const char *name,
                      const struct geom *g, const uint16_t **out) {
    const struct model_config *c = &ck->cfg;
    const struct st_tensor *t = need(ck, name);
    if (!t) return -ENOENT;
    uint16_t *d = take(p, (size_t)g->vocab_rows * (size_t)c->hidden * 2);
    *out = d;
    int64_t real = c->vocab - g->vocab_start;
    if (real > g->vocab_rows) real = g->vocab_rows;
    if (real < 0) real = 0;
    /* the arena is fresh anonymous memory: padding rows are already zero */
    return add(p, t, c->hidden, g->vocab_start, real, 0, c->hidden, d, 0, c->hidden, 1) ? -ENOMEM
                                                                                         : 0;
}

static int build_plan(const struct ckpt *ck, const struct geom *g, struct plan *p,
                      struct model_weights *w) {
    const struct model_config *c = &ck->cfg;
    int hd = c->head_dim, rc;
    char nm[256];
    if ((rc = plan_vocab(ck, p, "model.embed_tokens.weight", g, &w->embed))) return rc;
    if (c->tie_embeddings)
        w->lm_head = w->embed;
    else if ((rc = plan_vocab(ck, p, "lm_head.weight", g, &w->lm_head)))
        return rc;
    if ((rc = plan_vec(ck, p, "model.norm.weight", c->hidden, &w->final_norm))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *L = &w->layers[l];
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
        if ((rc = plan_vec(ck, p, nm, c->hidden, &L->attn_norm))) return rc;
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
        if ((rc = plan_vec(ck, p, nm, c->hidden, &L->mlp_norm))) return rc;
        if (c->qk_norm) {
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_norm.weight", l);
            if ((rc = plan_vec(ck, p, nm, hd, &L->q_norm))) return rc;
            snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_norm.weight", l);
            if ((rc = plan_vec(ck, p, nm, hd, &L->k_norm))) return rc;
        }
        struct seg qkv[3] = {
            {CKPT_Q, (int64_t)g->rank * g->nh * hd, (int64_t)g->nh * hd},
            {CKPT_K, (int64_t)g->kv_start * hd, (int64_t)g->nkv * hd},
            {CKPT_V, (int64_t)g->kv_start * hd, (int64_t)g->nkv * hd},
        };
        if ((rc = plan_cols(ck, p, l, qkv, 3, c->qkv_bias, &L->qkv))) return rc;
        if ((rc = plan_rows(ck, p, l, CKPT_O, (int64_t)g->rank * g->nh * hd, (int64_t)g->nh * hd,
                            ck->o_bias && g->rank == 0, &L->o)))
            return rc;
        struct seg gu[2] = {
            {CKPT_GATE, (int64_t)g->rank * g->inter, g->inter},
            {CKPT_UP, (int64_t)g->rank * g->inter, g->inter},
        };
        if ((rc = plan_cols(ck, p, l, gu, 2, 0, &L->gate_up))) return rc;
        if ((rc = plan_rows(ck, p, l, CKPT_DOWN, (int64_t)g->rank * g->inter, g->inter, 0,
                            &L->down)))
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* running the plan                                                          */

struct chunk { int blk; int64_t ra, rb; };

struct runner {
    const struct plan *p;
    struct chunk *ch;
    int n_chunks;
    int next;                     /* atomic: next chunk to take */
    uint64_t done_bytes;          /* atomic */
    int done_threads;             /* atomic */
};

static void copy_rows(const struct blk *b, int64_t ra, int64_t rb) {
    size_t sesz = st_dtype_size(b->src->dtype);
    size_t desz = b->to_fp16 ? 2 : sesz;
    const char *sbase = b->src->data;
    /* ask the kernel to read the chunk's source pages ahead (cold page cache) */
    {
        size_t pg = 4096;
        uintptr_t lo = (uintptr_t)(sbase + (size_t)(b->r0 + ra) * (size_t)b->src_cols * sesz);
        uintptr_t hi = (uintptr_t)(sbase + (size_t)(b->r0 + rb) * (size_t)b->src_cols * sesz);
        lo &= ~(uintptr_t)(pg - 1);
        if (hi > lo && hi - lo >= (1u << 20)) madvise((void *)lo, hi - lo, MADV_WILLNEED);
    }
    for (int64_t r = ra; r < rb; r++) {
        const char *s = sbase + ((size_t)(b->r0 + r) * (size_t)b->src_cols + (size_t)b->c0) * sesz;
        char *d = b->dst + (size_t)r * (size_t)b->dst_stride * desz;
        if (!b->to_fp16 || b->src->dtype == ST_F16) {
            memcpy(d, s, (size_t)b->nc * sesz);
        } else if (b->src->dtype == ST_BF16) {
            for (int64_t i = 0; i < b->nc; i++) {
                uint16_t v;
                memcpy(&v, s + 2 * i, 2);
                uint16_t h = f32_to_fp16(bf16_to_f32(v));
                memcpy(d + 2 * i, &h, 2);
            }
        } else { /* ST_F32 */
            for (int64_t i = 0; i < b->nc; i++) {
                float v;
                memcpy(&v, s + 4 * i, 4);
                uint16_t h = f32_to_fp16(v);
                memcpy(d + 2 * i, &h, 2);
            }
        }
    }
}

static size_t row_bytes(const struct blk *b) {
    return (size_t)b->nc * st_dtype_size(b->src->dtype);
}

static void *worker(void *arg) {
    struct runner *r = arg;
    for (;;) {
        int i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (i >= r->n_chunks) break;
        const struct chunk *c = &r->ch[i];
        const struct blk *b = &r->p->b[c->blk];
        copy_rows(b, c->ra, c->rb);
        __atomic_fetch_add(&r->done_bytes, (uint64_t)(c->rb - c->ra) * row_bytes(b),
                           __ATOMIC_RELAXED);
    }
    __atomic_fetch_add(&r->done_threads, 1, __ATOMIC_RELEASE);
    return NULL;
}

#define CHUNK_BYTES (4u << 20)
#define PROGRESS_MIN_BYTES (1ull << 30)

static int run_plan(const struct plan *p, const char *what, char *err, size_t errlen) {
    uint64_t total = 0;
    int64_t n_chunks = 0;
    for (int i = 0; i < p->n; i++) {
        size_t rb = row_bytes(&p->b[i]);
        int64_t rows_per = rb ? (int64_t)(CHUNK_BYTES / rb) : p->b[i].nr;
        if (rows_per < 1) rows_per = 1;
        n_chunks += (p->b[i].nr + rows_per - 1) / rows_per;
        total += (uint64_t)rb * (uint64_t)p->b[i].nr;
    }
    struct runner r = {.p = p};
    r.ch = malloc((size_t)(n_chunks + 1) * sizeof *r.ch);
    if (!r.ch) return util_err(err, errlen, -ENOMEM, "out of memory planning the load");
    for (int i = 0; i < p->n; i++) {
        size_t rb = row_bytes(&p->b[i]);
        int64_t rows_per = rb ? (int64_t)(CHUNK_BYTES / rb) : p->b[i].nr;
        if (rows_per < 1) rows_per = 1;
        for (int64_t a = 0; a < p->b[i].nr; a += rows_per)
            r.ch[r.n_chunks++] = (struct chunk){i, a, a + rows_per < p->b[i].nr ? a + rows_per
                                                                                  : p->b[i].nr};
    }
    int nth = total < (64u << 20) ? 1 : util_cpus(8);
    double t0 = util_now_s();
    int progress = total >= PROGRESS_MIN_BYTES || getenv("AWQD_LOAD_PROGRESS") != NULL;
    if (nth == 1) {
        worker(&r);
    } else {
        pthread_t th[8];
        int started = 0;
        for (int i = 0; i < nth; i++)
            if (pthread_create(&th[i], NULL, worker, &r) == 0) started++;
            else break;
        if (!started) worker(&r);
        double last = t0;
        while (started && __atomic_load_n(&r.done_threads, __ATOMIC_ACQUIRE) < started) {
            usleep(50000);
            double now = util_now_s();
            if (progress && now - last >= 1.0) {
                last = now;
                uint64_t d = __atomic_load_n(&r.done_bytes, __ATOMIC_RELAXED);
                fprintf(stderr, "loading %s: %5.1f%% (%.2f of %.2f GB, %.2f GB/s)\n", what,
                        100.0 * (double)d / (double)(total ? total : 1), d / 1e9, total / 1e9,
                        d / 1e9 / (now - t0));
            }
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    double dt = util_now_s() - t0;
    if (progress)
        fprintf(stderr, "loading %s: 100.0%% (%.2f GB in %.2f s, %.2f GB/s)\n", what, total / 1e9,
                dt, dt > 0 ? total / 1e9 / dt : 0.0);
    free(r.ch);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* public                                                                    */

struct weights_priv {
    void *arena;
    size_t arena_bytes;
};

static int plan_error(const struct ckpt *ck, int rc, char *err, size_t errlen) {
    if (rc == -ENOMEM) return util_err(err, errlen, rc, "out of memory planning the load");
    return util_err(err, errlen, rc, "%s: a tensor vanished between open and load", ck->dir);
}

int ckpt_rank_bytes(const struct ckpt *ck, int rank, int tp, uint64_t *bytes, char *err,
                    size_t errlen) {
    *bytes = 0;
    if (!ck->cfg.quantized)
        return util_err(err, errlen, -ENOTSUP, "%s: unquantized checkpoint", ck->dir);
    struct geom g;
    int rc = shard_geom(&ck->cfg, rank, tp, &g, err, errlen);
    if (rc) return rc;
    struct model_weights w;
    memset(&w, 0, sizeof w);
    w.layers = calloc((size_t)ck->cfg.n_layers, sizeof *w.layers);
    if (!w.layers) return util_err(err, errlen, -ENOMEM, "out of memory");
    struct plan p = {.measure = 1};
    rc = build_plan(ck, &g, &p, &w);
    free(w.layers);
    if (rc) return plan_error(ck, rc, err, errlen);
    *bytes = p.cursor;
    return 0;
}

int ckpt_load(struct ckpt *ck, int rank, int tp, struct model_weights *w, char *err,
              size_t errlen) {
    memset(w, 0, sizeof *w);
    const struct model_config *c = &ck->cfg;
    if (!c->quantized)
        return util_err(err, errlen, -ENOTSUP,
                        "%s is an unquantized checkpoint; convert it with `awqd quantize` first",
                        ck->dir);
    struct geom g;
    int rc = shard_geom(c, rank, tp, &g, err, errlen);
    if (rc) return rc;
    struct weights_priv *wp = calloc(1, sizeof *wp);
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    struct plan p = {.measure = 1};
    w->priv = wp;
    if (!wp || !w->layers) { rc = util_err(err, errlen, -ENOMEM, "out of memory"); goto fail; }
    if ((rc = build_plan(ck, &g, &p, w))) { rc = plan_error(ck, rc, err, errlen); goto fail; }
    size_t bytes = p.cursor ? p.cursor : 64;
    void *arena = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        rc = util_err(err, errlen, -ENOMEM, "out of memory: %zu bytes for the weights of %s", bytes,
                      ck->dir);
        goto fail;
    }
    wp->arena = arena;
    wp->arena_bytes = bytes;
    if (bytes >= (64u << 20)) madvise(arena, bytes, MADV_HUGEPAGE); /* fewer page faults */
    memset(w->layers, 0, (size_t)c->n_layers * sizeof *w->layers);
    p.measure = 0;
    p.base = arena;
    p.cursor = 0;
    if ((rc = build_plan(ck, &g, &p, w))) { rc = plan_error(ck, rc, err, errlen); goto fail; }
    AWQD_ASSERT(p.cursor <= bytes);
    char what[300];
    if (tp > 1) snprintf(what, sizeof what, "%s rank %d/%d", ck->dir, rank, tp);
    else snprintf(what, sizeof what, "%s", ck->dir);
    if ((rc = run_plan(&p, what, err, errlen))) goto fail;
    free(p.b);
    w->cfg = *c;
    w->rank = rank;
    w->tp = tp;
    w->n_heads = g.nh;
    w->n_kv_heads = g.nkv;
    w->kv_head_start = g.kv_start;
    w->intermediate = g.inter;
    w->vocab_start = g.vocab_start;
    w->vocab_rows = g.vocab_rows;
    return 0;
fail:
    free(p.b);
    model_weights_free(w);
    return rc;
}

void model_weights_free(struct model_weights *w) {
    if (!w) return;
    struct weights_priv *wp = w->priv;
    if (wp) {
        if (wp->arena) munmap(wp->arena, wp->arena_bytes);
        free(wp);
    }
    free(w->layers);
    memset(w, 0, sizeof *w);
}
