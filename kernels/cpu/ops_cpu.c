/* ops_cpu.c — the CPU reference backend: fp32 everywhere, AWQ weights
 * dequantized to fp32 at upload, every op a plain loop split over a pthread
 * pool. Clarity first: this is the oracle the CUDA kernels are tested against.
 */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"
#include "kernels/cpu/sample_cpu.h"

struct cpu_ctx {
    struct cpu_pool *pool;
};

/* One linear layer, dequantized (to fp16 values) and transposed so each output column is a
 * contiguous dot product. */
struct op_linear {
    enum linear_kind kind;
    int k, n;
    float *wt;                    /* fp32 [N, K] = W^T */
    float *bias;                  /* fp32 [N] or NULL */
};

/* ======================================================================== */
/* fp16 and AWQ unpacking (independent of engine/ckpt.c on purpose)          */
/* ======================================================================== */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400));
            mant &= 0x3ff;
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | mant << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (uint32_t)(exp - 15 + 127) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Rounds to the nearest fp16 value (ties to even), as fp16 arithmetic would:
 * AutoAWQ's dequantization computes (q - z) * s in fp16, and so do the CUDA
 * kernels, so the reference does too. Normal and subnormal range. */
static float round_to_half(float x) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    frexpf(x, &e); /* |x| = m * 2^e, m in [0.5, 1) */
    int q = e - 11 < -24 ? -24 : e - 11;
    return ldexpf(nearbyintf(ldexpf(x, -q)), q);
}

static const int awq_order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* ======================================================================== */
/* buffers                                                                   */
/* ======================================================================== */

static size_t elem_size(enum buf_kind k) { return k == BUF_I32 ? sizeof(int32_t) : sizeof(float); }

static struct buf *cpu_alloc(void *ctx, enum buf_kind kind, size_t n) {
    struct buf *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->kind = kind;
    b->n = n;
    b->data = calloc(n ? n : 1, elem_size(kind));
    if (!b->data) {
        free(b);
        return NULL;
    }
    return b;
}

static void cpu_free(void *ctx, struct buf *b) {
    if (!b) return;
    free(b->data);
    free(b);
}

static int cpu_upload(void *ctx, struct buf *dst, size_t off, const void *src, size_t n) {
    if (off > dst->n || n > dst->n - off) return -ERANGE;
    if (dst->kind == BUF_W16) {
        const uint16_t *h = src;
        float *d = cpu_f32(dst) + off;
        for (size_t i = 0; i < n; i++) d[i] = half_to_float(h[i]);
    } else {
        memcpy((char *)dst->data + off * elem_size(dst->kind), src, n * elem_size(dst->kind));
    }
    return 0;
}

static int cpu_download(void *ctx, void *dst, const struct buf *src, size_t off, size_t n) {
    if (off > src->n || n > src->n - off) return -ERANGE;
    memcpy(dst, (const char *)src->data + off * elem_size(src->kind), n * elem_size(src->kind));
    return 0;
}

static void cpu_copy(void *ctx, struct buf *dst, size_t dst_off, const struct buf *src,
                     size_t src_off, size_t n) {
    AWQD_ASSERT(dst_off <= dst->n && n <= dst->n - dst_off);
    AWQD_ASSERT(src_off <= src->n && n <= src->n - src_off);
    size_t es = elem_size(dst->kind);
    memmove((char *)dst->data + dst_off * es, (const char *)src->data + src_off * es, n * es);
}

/* ======================================================================== */
/* weights                                                                   */
/* ======================================================================== */

static struct op_linear *cpu_upload_linear(void *ctx, const struct awq_linear *l,
                                           enum linear_kind kind) {
    AWQD_ASSERT(l->k > 0 && l->n > 0 && l->n % 8 == 0 && l->group > 0 && l->k % l->group == 0);
    AWQD_ASSERT(kind == LINEAR_PLAIN || (kind == LINEAR_GATE_UP && l->n % 2 == 0));
    struct op_linear *o = calloc(1, sizeof *o);
    if (!o) return NULL;
    o->kind = kind;
    o->k = l->k;
    o->n = l->n;
    o->wt = malloc((size_t)l->k * l->n * sizeof(float));
    if (!o->wt) goto fail;
    int n8 = l->n / 8;
    for (int k = 0; k < l->k; k++) {
        int g = k / l->group;
        for (int c = 0; c < n8; c++) {
            uint32_t q = l->qweight[(size_t)k * n8 + c];
            uint32_t z = l->qzeros[(size_t)g * n8 + c];
            for (int j = 0; j < 8; j++) {
                int col = c * 8 + j;
                int qv = (int)((q >> (4 * awq_order[j])) & 0xf);
                int zv = (int)((z >> (4 * awq_order[j])) & 0xf);
                float s = half_to_float(l->scales[(size_t)g * l->n + col]);
                o->wt[(size_t)col * l->k + k] = round_to_half((float)(qv - zv) * s);
            }
        }
    }
    if (l->bias) {
        o->bias = malloc((size_t)l->n * sizeof(float));
        if (!o->bias) goto fail;
        for (int i = 0; i < l->n; i++) o->bias[i] = half_to_float(l->bias[i]);
    }
    return o;
fail:
    free(o->wt);
    free(o);
    return NULL;
}

static void cpu_free_linear(void *ctx, struct op_linear *l) {
    if (!l) return;
    free(l->wt);
    free(l->bias);
    free(l);
}

/* ======================================================================== */
/* compute                                                                   */
/* ======================================================================== */

static struct cpu_pool *pool_of(void *ctx) { return ((struct cpu_ctx *)ctx)->pool; }

/* Dot product with 8 partial sums (vectorises without -ffast-math). */
static float dot(const float *a, const float *b, int n) {
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[r] = dot(x[r], w, n) for r < nr <= 4, reading w once for all rows. The
 * summation order per row is exactly dot()'s, so a row's result never depends
 * on which rows share the call (batched == alone, bit for bit). */
#define DOT_ROWS 4
static void dot_rows(const float *const *x, int nr, const float *w, int n, float *out) {
    if (nr < DOT_ROWS) {
        for (int r = 0; r < nr; r++) out[r] = dot(x[r], w, n);
        return;
    }
    float acc[DOT_ROWS][8] = {{0}};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int r = 0; r < DOT_ROWS; r++)
            for (int j = 0; j < 8; j++) acc[r][j] += x[r][i + j] * w[i + j];
    for (int r = 0; r < DOT_ROWS; r++) {
        const float *a = acc[r];
        float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        for (int t = i; t < n; t++) s += x[r][t] * w[t];
        out[r] = s;
    }
}

/* --- embedding --- */
static void cpu_embed(void *ctx, struct buf *out, const struct buf *table, const struct buf *ids,
                      int n, int dim, int row_start, int rows) {
    AWQD_ASSERT(out->n >= (size_t)n * dim && ids->n >= (size_t)n);
    for (int i = 0; i < n; i++) {
        int id = cpu_i32(ids)[i] - row_start;
        float *o = cpu_f32(out) + (size_t)i * dim;
        if (id >= 0 && id < rows)
            memcpy(o, cpu_f32(table) + (size_t)id * dim, (size_t)dim * sizeof(float));
        else
            memset(o, 0, (size_t)dim * sizeof(float));
    }
}

/* --- residual add + RMSNorm --- */
static void rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps) {
    double ss = 0;
    for (int j = 0; j < dim; j++) ss += (double)x[j] * x[j];
    float r = (float)(1.0 / sqrt(ss / dim + eps));
    for (int j = 0; j < dim; j++) out[j] = w[j] * (x[j] * r);
}

static void cpu_add_rmsnorm(void *ctx, struct buf *resid, const struct buf *delta, struct buf *out,
                            const struct buf *w, int n, int dim, float eps) {
    AWQD_ASSERT(resid->n >= (size_t)n * dim && out->n >= (size_t)n * dim);
    for (int i = 0; i < n; i++) {
        float *r = cpu_f32(resid) + (size_t)i * dim;
        if (delta) {
            const float *d = cpu_f32(delta) + (size_t)i * dim;
            for (int j = 0; j < dim; j++) r[j] += d[j];
        }
        rmsnorm_row(cpu_f32(out) + (size_t)i * dim, r, cpu_f32(w), dim, eps);
    }
}

/* --- linear --- */
struct linear_job {
    float *y;
    const float *x;
    int n;
    const struct op_linear *l;
};

static void linear_cols(void *arg, int c0, int c1) {
    struct linear_job *j = arg;
    const struct op_linear *l = j->l;
    for (int r0 = 0; r0 < j->n; r0 += DOT_ROWS) {
        int nr = j->n - r0 < DOT_ROWS ? j->n - r0 : DOT_ROWS;
        const float *xs[DOT_ROWS];
        for (int r = 0; r < nr; r++) xs[r] = j->x + (size_t)(r0 + r) * l->k;
        for (int c = c0; c < c1; c++) {
            float v[DOT_ROWS];
            dot_rows(xs, nr, l->wt + (size_t)c * l->k, l->k, v);
            for (int r = 0; r < nr; r++)
                j->y[(size_t)(r0 + r) * l->n + c] = l->bias ? v[r] + l->bias[c] : v[r];
        }
    }
}

static void cpu_linear(void *ctx, struct buf *y, const struct buf *x, int n,
                       const struct op_linear *l) {
    AWQD_ASSERT(l->kind == LINEAR_PLAIN);
    AWQD_ASSERT(x->n >= (size_t)n * l->k && y->n >= (size_t)n * l->n);
    struct linear_job j = {cpu_f32(y), cpu_f32(x), n, l};
    cpu_pool_run(pool_of(ctx), l->n, 8, linear_cols, &j);
}

/* --- q/k norm + RoPE + KV write --- */
struct rope_job {
    float *qkv;
    int nh, nkv, hd;
    const float *q_norm, *k_norm;
    float eps;
    const float *inv_freq;
    const int32_t *pos, *slots;
    float *kc, *vc;
};

static void rope_head(float *x, int hd, const float *inv_freq, int pos) {
    int half = hd / 2;
    for (int j = 0; j < half; j++) {
        /* as HF: angle = float(pos) * inv_freq in fp32, then cos/sin */
        float ang = (float)pos * inv_freq[j];
        float c = (float)cos((double)ang), s = (float)sin((double)ang);
        float x1 = x[j], x2 = x[j + half];
        x[j] = x1 * c - x2 * s;
        x[j + half] = x2 * c + x1 * s;
    }
}

static void rope_rows(void *arg, int r0, int r1) {
    struct rope_job *j = arg;
    int width = (j->nh + 2 * j->nkv) * j->hd;
    for (int r = r0; r < r1; r++) {
        float *row = j->qkv + (size_t)r * width;
        float *q = row, *k = row + j->nh * j->hd, *v = k + j->nkv * j->hd;
        for (int h = 0; h < j->nh; h++) {
            float *qh = q + h * j->hd;
            if (j->q_norm) rmsnorm_row(qh, qh, j->q_norm, j->hd, j->eps);
            rope_head(qh, j->hd, j->inv_freq, j->pos[r]);
        }
        for (int h = 0; h < j->nkv; h++) {
            float *kh = k + h * j->hd;
            if (j->k_norm) rmsnorm_row(kh, kh, j->k_norm, j->hd, j->eps);
            rope_head(kh, j->hd, j->inv_freq, j->pos[r]);
        }
        size_t slot = (size_t)j->slots[r] * j->nkv * j->hd;
        memcpy(j->kc + slot, k, (size_t)j->nkv * j->hd * sizeof(float));
        memcpy(j->vc + slot, v, (size_t)j->nkv * j->hd * sizeof(float));
    }
}

static void cpu_qk_norm_rope_kv(void *ctx, struct buf *qkv, int n, int nh, int nkv, int hd,
                                const struct buf *q_norm, const struct buf *k_norm, float eps,
                                const struct buf *inv_freq, const struct attn_batch *ab,
                                struct buf *k_cache, struct buf *v_cache) {
    AWQD_ASSERT(n == ab->n_rows && qkv->n >= (size_t)n * (nh + 2 * nkv) * hd);
    size_t cache_slots = k_cache->n / ((size_t)nkv * hd);
    for (int r = 0; r < n; r++) AWQD_ASSERT(cpu_i32(ab->slots)[r] >= 0 &&
                                            (size_t)cpu_i32(ab->slots)[r] < cache_slots);
    struct rope_job j = {cpu_f32(qkv), nh, nkv, hd,
                         q_norm ? cpu_f32(q_norm) : NULL, k_norm ? cpu_f32(k_norm) : NULL, eps,
                         cpu_f32(inv_freq), cpu_i32(ab->positions), cpu_i32(ab->slots),
                         cpu_f32(k_cache), cpu_f32(v_cache)};
    cpu_pool_run(pool_of(ctx), n, 1, rope_rows, &j);
}

/* --- paged attention --- */
struct attn_job {
    float *out;
    const float *qkv;
    int nh, nkv, hd;
    float scale;
    const struct attn_batch *ab;
    const int32_t *q_start, *past, *bt;
    const float *kc, *vc;
    int *row_seq;                 /* [n_rows] sequence of each row */
    int max_ctx;                  /* longest context in the batch */
};

static void attn_items(void *arg, int i0, int i1) {
    struct attn_job *j = arg;
    const struct attn_batch *ab = j->ab;
    int width = (j->nh + 2 * j->nkv) * j->hd, group = j->nh / j->nkv;
    float *sc = malloc((size_t)j->max_ctx * sizeof *sc); /* scores of one (row, head) */
    AWQD_ASSERT(sc);
    for (int it = i0; it < i1; it++) {
        int r = it / j->nh, h = it % j->nh, s = j->row_seq[r];
        int pos = j->past[s] + (r - j->q_start[s]);
        const float *q = j->qkv + (size_t)r * width + h * j->hd;
        const int32_t *bt = j->bt + (size_t)s * ab->max_blocks;
        int g = h / group;
        float mx = -INFINITY;
        for (int t = 0; t <= pos; t++) {
            size_t slot = (size_t)bt[t / ab->block_size] * ab->block_size + t % ab->block_size;
            const float *k = j->kc + (slot * j->nkv + g) * j->hd;
            sc[t] = dot(q, k, j->hd) * j->scale;
            if (sc[t] > mx) mx = sc[t];
        }
        double sum = 0;
        for (int t = 0; t <= pos; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        float inv = (float)(1.0 / sum);
        float *o = j->out + (size_t)r * j->nh * j->hd + h * j->hd;
        memset(o, 0, (size_t)j->hd * sizeof(float));
        for (int t = 0; t <= pos; t++) {
            size_t slot = (size_t)bt[t / ab->block_size] * ab->block_size + t % ab->block_size;
            const float *v = j->vc + (slot * j->nkv + g) * j->hd;
            float p = sc[t] * inv;
            for (int d = 0; d < j->hd; d++) o[d] += p * v[d];
        }
    }
    free(sc);
}

static void cpu_attention(void *ctx, struct buf *out, const struct buf *qkv, int nh, int nkv,
                          int hd, float scale, const struct attn_batch *ab,
                          const struct buf *k_cache, const struct buf *v_cache) {
    AWQD_ASSERT(nkv > 0 && nh % nkv == 0 && out->n >= (size_t)ab->n_rows * nh * hd);
    const int32_t *qs = cpu_i32(ab->q_start), *past = cpu_i32(ab->past);
    int max_ctx = 1;
    int *row_seq = malloc((size_t)(ab->n_rows ? ab->n_rows : 1) * sizeof(int));
    AWQD_ASSERT(row_seq);
    for (int s = 0; s < ab->n_seqs; s++) {
        AWQD_ASSERT(qs[s] <= qs[s + 1] && past[s] >= 0);
        int ctx_len = past[s] + qs[s + 1] - qs[s];
        AWQD_ASSERT((ctx_len + ab->block_size - 1) / ab->block_size <= ab->max_blocks);
        if (ctx_len > max_ctx) max_ctx = ctx_len;
        for (int r = qs[s]; r < qs[s + 1]; r++) row_seq[r] = s;
    }
    size_t n_items = (size_t)ab->n_rows * nh;
    struct attn_job j = {cpu_f32(out), cpu_f32(qkv), nh, nkv, hd, scale, ab, qs, past,
                         cpu_i32(ab->block_table), cpu_f32(k_cache), cpu_f32(v_cache),
                         row_seq, max_ctx};
    cpu_pool_run(pool_of(ctx), (int)n_items, 1, attn_items, &j);
    free(row_seq);
}

/* --- gate|up linear + SiLU * mul --- */
static void silu_mul_cols(void *arg, int c0, int c1) {
    struct linear_job *j = arg;
    const struct op_linear *l = j->l;
    int inter = l->n / 2;
    for (int r0 = 0; r0 < j->n; r0 += DOT_ROWS) {
        int nr = j->n - r0 < DOT_ROWS ? j->n - r0 : DOT_ROWS;
        const float *xs[DOT_ROWS];
        for (int r = 0; r < nr; r++) xs[r] = j->x + (size_t)(r0 + r) * l->k;
        for (int c = c0; c < c1; c++) {
            float g[DOT_ROWS], u[DOT_ROWS];
            dot_rows(xs, nr, l->wt + (size_t)c * l->k, l->k, g);
            dot_rows(xs, nr, l->wt + (size_t)(inter + c) * l->k, l->k, u);
            for (int r = 0; r < nr; r++) {
                float gr = g[r], ur = u[r];
                if (l->bias) gr += l->bias[c], ur += l->bias[inter + c];
                j->y[(size_t)(r0 + r) * inter + c] = gr / (1.0f + expf(-gr)) * ur;
            }
        }
    }
}

static void cpu_linear_silu_mul(void *ctx, struct buf *out, const struct buf *x, int n,
                                const struct op_linear *l) {
    AWQD_ASSERT(l->kind == LINEAR_GATE_UP);
    AWQD_ASSERT(x->n >= (size_t)n * l->k && out->n >= (size_t)n * (l->n / 2));
    struct linear_job j = {cpu_f32(out), cpu_f32(x), n, l};
    cpu_pool_run(pool_of(ctx), l->n / 2, 8, silu_mul_cols, &j);
}

/* The reference of the CUDA backend's fused op (kernels/ops.h): the same
 * add_rmsnorm and linear, out of place, for the rows the CUDA backend fuses
 * (n <= 2; else -ENOTSUP, as there). Bitwise the unfused ops' results, so CI
 * runs the model's alternating residual (h / h2) on every decode step. */
static int cpu_add_rmsnorm_linear(void *ctx, const struct buf *rin, const struct buf *delta,
                                  struct buf *rout, const struct buf *w, int n, int dim, float eps,
                                  struct buf *y, const struct op_linear *l) {
    AWQD_ASSERT(rin != rout && delta != rout && dim == l->k);
    AWQD_ASSERT(rin->n >= (size_t)n * dim && rout->n >= (size_t)n * dim);
    if (n < 1 || n > 2) return -ENOTSUP;
    struct buf *x = cpu_alloc(ctx, BUF_ACT, (size_t)n * dim);
    if (!x) return -ENOTSUP; /* (out of memory: the caller runs the separate ops) */
    cpu_copy(ctx, rout, 0, rin, 0, (size_t)n * dim);
    cpu_add_rmsnorm(ctx, rout, delta, x, w, n, dim, eps);
    if (l->kind == LINEAR_GATE_UP) cpu_linear_silu_mul(ctx, y, x, n, l);
    else cpu_linear(ctx, y, x, n, l);
    cpu_free(ctx, x);
    return 0;
}

/* --- lm_head --- */
struct lm_job {
    float *logits;
    const float *x, *table;
    const int32_t *rows;
    int m, dim, vocab_rows;
};

static void lm_cols(void *arg, int v0, int v1) {
    struct lm_job *j = arg;
    for (int r0 = 0; r0 < j->m; r0 += DOT_ROWS) {
        int nr = j->m - r0 < DOT_ROWS ? j->m - r0 : DOT_ROWS;
        const float *xs[DOT_ROWS];
        for (int r = 0; r < nr; r++)
            xs[r] = j->x + (size_t)(j->rows ? j->rows[r0 + r] : r0 + r) * j->dim;
        for (int v = v0; v < v1; v++) {
            float o[DOT_ROWS];
            dot_rows(xs, nr, j->table + (size_t)v * j->dim, j->dim, o);
            for (int r = 0; r < nr; r++) j->logits[(size_t)(r0 + r) * j->vocab_rows + v] = o[r];
        }
    }
}

static void cpu_lm_head(void *ctx, struct buf *logits, const struct buf *x, const struct buf *rows,
                        int m, const struct buf *table, int dim, int vocab_rows) {
    AWQD_ASSERT(logits->n >= (size_t)m * vocab_rows && table->n >= (size_t)vocab_rows * dim);
    for (int r = 0; r < m; r++) {
        int xr = rows ? cpu_i32(rows)[r] : r; /* NULL: rows 0..m-1 */
        AWQD_ASSERT(xr >= 0 && (size_t)(xr + 1) * dim <= x->n);
    }
    struct lm_job j = {cpu_f32(logits), cpu_f32(x), cpu_f32(table), rows ? cpu_i32(rows) : NULL,
                       m, dim, vocab_rows};
    cpu_pool_run(pool_of(ctx), vocab_rows, 16, lm_cols, &j);
}

static int cpu_sync(void *ctx) { return 0; }

static void cpu_destroy(struct ops *ops) {
    if (!ops) return;
    struct cpu_ctx *c = ops->ctx;
    if (c) cpu_pool_free(c->pool);
    free(c);
    free(ops);
}

int ops_cpu_create(int n_threads, struct ops **out, char *err, size_t errlen) {
    *out = NULL;
    if (n_threads <= 0) n_threads = util_cpus(0);
    struct ops *o = calloc(1, sizeof *o);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!o || !c) {
        free(o);
        free(c);
        return util_err(err, errlen, -ENOMEM, "cpu backend: out of memory");
    }
    int rc = cpu_pool_init(&c->pool, n_threads);
    if (rc) {
        free(o);
        free(c);
        return util_err(err, errlen, rc, "cpu backend: cannot start %d threads", n_threads);
    }
    o->name = "cpu";
    o->ctx = c;
    o->alloc = cpu_alloc;
    o->free = cpu_free;
    o->upload = cpu_upload;
    o->download = cpu_download;
    o->copy = cpu_copy;
    o->upload_linear = cpu_upload_linear;
    o->free_linear = cpu_free_linear;
    o->embed = cpu_embed;
    o->add_rmsnorm = cpu_add_rmsnorm;
    o->add_rmsnorm_linear = cpu_add_rmsnorm_linear;
    o->linear = cpu_linear;
    o->qk_norm_rope_kv = cpu_qk_norm_rope_kv;
    o->attention = cpu_attention;
    o->linear_silu_mul = cpu_linear_silu_mul;
    o->lm_head = cpu_lm_head;
    o->sample_topk = cpu_sample_topk;
    o->sync = cpu_sync;
    o->destroy = cpu_destroy;
    *out = o;
    return 0;
}

void ops_destroy(struct ops *ops) {
    if (ops && ops->destroy) ops->destroy(ops);
}
