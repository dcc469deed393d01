/* test_ops_cuda.c — every op of the CUDA backend against the CPU reference
 * backend (kernels/cpu/ops_cpu.c), on many shapes including awkward ones.
 *
 * Inputs are fp16-representable (rounded on the host first), so both
 * backends start from the same numbers; the CPU computes in fp32, CUDA in
 * fp16 storage with fp32 accumulation. Tolerances (stated, not tuned):
 *   linear_silu_mul: |d| <= 1e-2 * max|ref| (silu(g) u amplifies g's error by |u|)
 *   elementwise / norms / rope:   |d| <= 4e-3 * max|ref| + 1e-3 (two fp16 roundings)
 *   attention:                    |d| <= 4e-3 (outputs are convex mixes of V, |V| <= 1)
 *   linear, lm_head (dot products of K terms): |d| <= 4e-3 * max|ref| per test case
 * Buffers (ACT/F32/I32/W16) round-trip exactly where the dtype allows. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "engine/ckpt.h"
#include "kernels/ops.h"
#include "tests/harness/test.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rs = 0x243f6a8885a308d3ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
static float urand(float lo, float hi) {
    return lo + (hi - lo) * (float)(rnd() & 0xffffff) / 16777216.0f;
}
static float h16(float x) { return fp16_to_f32(f32_to_fp16(x)); }
static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = h16(urand(lo, hi));
}

struct pair {
    struct ops *cpu, *gpu;
};

/* 0 ok; 1 no GPU (skip) */
static int pair_open(struct pair *p) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 1;
    char err[256];
    if (ops_cpu_create(2, &p->cpu, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "cpu: %s", err);
        return -1;
    }
    if (ops_cuda_create(0, &p->gpu, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "cuda: %s", err);
        return -1;
    }
    return 0;
}
static void pair_close(struct pair *p) {
    ops_destroy(p->cpu);
    ops_destroy(p->gpu);
}

#define OPEN(p)                                                    \
    struct pair p = {0};                                           \
    {                                                              \
        int rc_ = pair_open(&p);                                   \
        if (rc_ == 1) TEST_SKIP("no CUDA device");                 \
        if (rc_) return;                                           \
    }

/* A buffer on both backends with the same contents. */
struct twin {
    struct buf *c, *g;
    size_t n;
    enum buf_kind kind;
};
static struct twin twin_new(struct pair *p, enum buf_kind k, size_t n, const void *host) {
    struct twin t = {p->cpu->alloc(p->cpu->ctx, k, n), p->gpu->alloc(p->gpu->ctx, k, n), n, k};
    if (host && n) {
        p->cpu->upload(p->cpu->ctx, t.c, 0, host, n);
        p->gpu->upload(p->gpu->ctx, t.g, 0, host, n);
    }
    return t;
}
static void twin_free(struct pair *p, struct twin *t) {
    p->cpu->free(p->cpu->ctx, t->c);
    p->gpu->free(p->gpu->ctx, t->g);
}
/* W16 twin from floats (rounded to fp16 first) */
static struct twin twin_w16(struct pair *p, const float *x, size_t n) {
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_fp16(x[i]);
    struct twin t = twin_new(p, BUF_W16, n, h);
    free(h);
    return t;
}

/* Downloads both and checks |gpu - cpu| <= rel * max|cpu| + abs. */
static void twin_check(struct pair *p, struct twin *t, size_t off, size_t n, double rel,
                       double abs_tol, const char *what) {
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    int rc1 = p->cpu->download(p->cpu->ctx, a, t->c, off, n);
    int rc2 = p->gpu->download(p->gpu->ctx, b, t->g, off, n);
    double mx = 0, d = 0;
    size_t at = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(a[i]));
        if (!isfinite(b[i])) nan = 1;
        double e = fabs((double)a[i] - b[i]);
        if (e > d) {
            d = e;
            at = i;
        }
    }
    float ai = n ? a[at] : 0, bi = n ? b[at] : 0;
    free(a);
    free(b);
    ASSERT_MSG(rc1 == 0 && rc2 == 0, "%s: download failed (%d, %d)", what, rc1, rc2);
    ASSERT_MSG(!nan, "%s: non-finite output", what);
    ASSERT_MSG(d <= rel * mx + abs_tol, "%s: max |diff| %g at %zu (cpu %g, cuda %g), max|ref| %g",
               what, d, at, ai, bi, mx);
}

/* ---- buffers -------------------------------------------------------------- */

TEST(ops_cuda, buffers_roundtrip_and_copy) {
    OPEN(p);
    struct ops *g = p.gpu;
    size_t n = 1037;
    float *f = malloc(n * sizeof *f), *back = malloc(n * sizeof *back);
    int32_t *iv = malloc(n * sizeof *iv), *ib = malloc(n * sizeof *ib);
    for (size_t i = 0; i < n; i++) {
        f[i] = h16(urand(-60000, 60000));
        iv[i] = (int32_t)rnd();
    }
    struct buf *a = g->alloc(g->ctx, BUF_ACT, n), *z = g->alloc(g->ctx, BUF_ACT, n);
    struct buf *i32 = g->alloc(g->ctx, BUF_I32, n), *f32 = g->alloc(g->ctx, BUF_F32, n);
    ASSERT(a && z && i32 && f32);
    /* zeroed */
    ASSERT_EQ_INT(g->download(g->ctx, back, z, 0, n), 0);
    for (size_t i = 0; i < n; i++) ASSERT(back[i] == 0.0f);
    ASSERT_EQ_INT(g->upload(g->ctx, a, 0, f, n), 0);
    ASSERT_EQ_INT(g->download(g->ctx, back, a, 0, n), 0);
    for (size_t i = 0; i < n; i++) ASSERT_MSG(back[i] == f[i], "ACT %zu: %g != %g", i, back[i], f[i]);
    ASSERT_EQ_INT(g->upload(g->ctx, i32, 0, iv, n), 0);
    ASSERT_EQ_INT(g->download(g->ctx, ib, i32, 0, n), 0);
    ASSERT(!memcmp(iv, ib, n * sizeof *iv));
    for (size_t i = 0; i < n; i++) f[i] = urand(-1, 1); /* not fp16-exact: F32 keeps all bits */
    ASSERT_EQ_INT(g->upload(g->ctx, f32, 0, f, n), 0);
    ASSERT_EQ_INT(g->download(g->ctx, back, f32, 0, n), 0);
    ASSERT(!memcmp(f, back, n * sizeof *f));
    /* partial upload at an offset, copy between buffers, out of range refused */
    float seven[3] = {7, 8, 9};
    ASSERT_EQ_INT(g->upload(g->ctx, z, 500, seven, 3), 0);
    g->copy(g->ctx, a, 10, z, 499, 5);
    ASSERT_EQ_INT(g->download(g->ctx, back, a, 10, 5), 0);
    ASSERT(back[0] == 0 && back[1] == 7 && back[2] == 8 && back[3] == 9 && back[4] == 0);
    ASSERT_EQ_INT(g->upload(g->ctx, a, n - 1, seven, 3), -ERANGE);
    ASSERT_EQ_INT(g->download(g->ctx, back, a, n, 1), -ERANGE);
    ASSERT_EQ_INT(g->sync(g->ctx), 0);
    g->free(g->ctx, a);
    g->free(g->ctx, z);
    g->free(g->ctx, i32);
    g->free(g->ctx, f32);
    g->free(g->ctx, NULL);
    free(f);
    free(back);
    free(iv);
    free(ib);
    pair_close(&p);
}

/* upload_group: parts packed into one copy + a scatter kernel (and one copy
 * per part past the pinned ring's quarter); the rest of each buffer
 * untouched, empty parts skipped (their buffer may be NULL), the batch
 * description of a step in flight while the next is packed. */
TEST(ops_cuda, upload_group) {
    OPEN(p);
    struct ops *g = p.gpu;
    ASSERT(g->upload_group != NULL);
    const size_t big = (size_t)3 << 20; /* 12 MB: past the ring's quarter */
    size_t cap[5] = {1000, 7, 513, 1, big};
    struct buf *b[5];
    int32_t *h[5], *want[5], *back = malloc(big * sizeof(int32_t));
    for (int i = 0; i < 5; i++) {
        b[i] = g->alloc(g->ctx, i == 1 ? BUF_F32 : BUF_I32, cap[i]);
        h[i] = malloc(cap[i] * sizeof(int32_t));
        want[i] = malloc(cap[i] * sizeof(int32_t));
        ASSERT(b[i] && h[i] && want[i]);
        for (size_t j = 0; j < cap[i]; j++) want[i][j] = -1 - (int32_t)j; /* the old contents */
        ASSERT_EQ_INT(g->upload(g->ctx, b[i], 0, want[i], cap[i]), 0);
    }
    for (int round = 0; round < 4 && !test_failed(); round++) {
        size_t n[6] = {1 + (size_t)round * 300, 7, round == 1 ? 0 : 513, 1, round >= 2 ? big : 0, 0};
        /* rounds 1 and 3: part 0 as 30 rows of 7 written 30 apart (round 1:
         * through the scatter kernel); round 3: part 4 as 2000 rows of 1000
         * written 1500 apart (8 MB: past the ring's quarter, so every part goes
         * up by its own copy, the strided ones as one 2D copy each) */
        size_t wd[6] = {0}, ld[6] = {0};
        if (round & 1) n[0] = 30 * 7, wd[0] = 7, ld[0] = 30;
        if (round == 3) n[4] = 2000 * 1000, wd[4] = 1000, ld[4] = 1500;
        for (int i = 0; i < 5; i++)
            for (size_t j = 0; j < n[i]; j++) {
                float f = (float)round + 0.25f * (float)j;
                if (i == 1) memcpy(&h[i][j], &f, 4);
                else h[i][j] = (int32_t)(rnd() & 0x7fffffff);
                want[i][wd[i] ? j / wd[i] * ld[i] + j % wd[i] : j] = h[i][j];
            }
        struct buf *dst[6] = {b[0], b[1], b[2], b[3], b[4], NULL};
        const void *src[6] = {h[0], h[1], h[2], h[3], h[4], NULL};
        ASSERT_EQ_INT(g->upload_group(g->ctx, dst, src, n, round & 1 ? wd : NULL, ld, 6), 0);
        for (int i = 0; i < 5; i++) /* the host arrays may be reused at once */
            for (size_t j = 0; j < n[i]; j++) h[i][j] = 12345;
        for (int i = 0; i < 5 && !test_failed(); i++) {
            ASSERT_EQ_INT(g->download(g->ctx, back, b[i], 0, cap[i]), 0);
            for (size_t j = 0; j < cap[i] && !test_failed(); j++)
                ASSERT_MSG(back[j] == want[i][j], "round %d part %d [%zu]: %d != %d", round, i, j,
                           back[j], want[i][j]);
        }
    }
    size_t too[1] = {cap[0] + 1};
    const void *s0[1] = {h[0]};
    ASSERT_EQ_INT(g->upload_group(g->ctx, b, s0, too, NULL, NULL, 1), -ERANGE);
    size_t rows_n[1] = {7 * 35}, rows_w[1] = {7}, rows_ld[1] = {30}; /* 34 * 30 + 7 > 1000 */
    ASSERT_EQ_INT(g->upload_group(g->ctx, b, s0, rows_n, rows_w, rows_ld, 1), -ERANGE);
    for (int i = 0; i < 5; i++) {
        g->free(g->ctx, b[i]);
        free(h[i]);
        free(want[i]);
    }
    free(back);
    pair_close(&p);
}

/* ---- embed, add_rmsnorm, silu_mul ----------------------------------------- */

TEST(ops_cuda, embed_shapes) {
    OPEN(p);
    const int dims[] = {256, 33, 1000};
    for (int di = 0; di < 3; di++) {
        int dim = dims[di], rows = 50, n = 23, row_start = 20;
        float *tab = malloc((size_t)rows * dim * sizeof *tab);
        fill(tab, (size_t)rows * dim, -1, 1);
        int32_t ids[23];
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % 90); /* some out of [20, 70) */
        struct twin t = twin_w16(&p, tab, (size_t)rows * dim);
        struct twin id = twin_new(&p, BUF_I32, (size_t)n, ids);
        struct twin out = twin_new(&p, BUF_ACT, (size_t)n * dim, NULL);
        p.cpu->embed(p.cpu->ctx, out.c, t.c, id.c, n, dim, row_start, rows);
        p.gpu->embed(p.gpu->ctx, out.g, t.g, id.g, n, dim, row_start, rows);
        char what[64];
        snprintf(what, sizeof what, "embed dim %d", dim);
        twin_check(&p, &out, 0, (size_t)n * dim, 0, 0, what);
        twin_free(&p, &t);
        twin_free(&p, &id);
        twin_free(&p, &out);
        free(tab);
        if (test_failed()) break;
    }
    pair_close(&p);
}

TEST(ops_cuda, add_rmsnorm_shapes) {
    OPEN(p);
    /* vector kernel (dim % 8 == 0, up to 8192); scalar kernel (4095: dim % 8 != 0; 10000 > 8192) */
    const int dims[] = {256, 1000, 4095, 4096, 5120, 8192, 10000};
    const int ns[] = {1, 5, 37};
    for (int di = 0; di < 7 && !test_failed(); di++)
        for (int ni = 0; ni < 3 && !test_failed(); ni++)
            for (int wd = 0; wd < 2 && !test_failed(); wd++) {
                int dim = dims[di], n = ns[ni];
                size_t e = (size_t)n * dim;
                float *r = malloc(e * sizeof *r), *d = malloc(e * sizeof *d), *w = malloc((size_t)dim * sizeof *w);
                fill(r, e, -3, 3);
                fill(d, e, -2, 2);
                fill(w, (size_t)dim, 0.5f, 1.5f);
                /* the CPU adds in fp32; give it a resid + delta that is fp16-exact */
                if (wd)
                    for (size_t i = 0; i < e; i++) d[i] = h16(r[i] + d[i]) - r[i];
                struct twin R = twin_new(&p, BUF_ACT, e, r), D = twin_new(&p, BUF_ACT, e, d);
                struct twin O = twin_new(&p, BUF_ACT, e, NULL), W = twin_w16(&p, w, (size_t)dim);
                p.cpu->add_rmsnorm(p.cpu->ctx, R.c, wd ? D.c : NULL, O.c, W.c, n, dim, 1e-6f);
                p.gpu->add_rmsnorm(p.gpu->ctx, R.g, wd ? D.g : NULL, O.g, W.g, n, dim, 1e-6f);
                char what[96];
                snprintf(what, sizeof what, "add_rmsnorm dim %d n %d delta %d (resid)", dim, n, wd);
                twin_check(&p, &R, 0, e, 2e-3, 1e-3, what);
                snprintf(what, sizeof what, "add_rmsnorm dim %d n %d delta %d (out)", dim, n, wd);
                twin_check(&p, &O, 0, e, 4e-3, 1e-3, what);
                twin_free(&p, &R);
                twin_free(&p, &D);
                twin_free(&p, &O);
                twin_free(&p, &W);
                free(r);
                free(d);
                free(w);
            }
    pair_close(&p);
}

/* ---- qk_norm_rope_kv ------------------------------------------------------- */

/* A batch geometry on both backends: seqs with (past, rows), block tables
 * from a random permutation of the blocks. */
struct geo {
    int n_seqs, n_rows, max_blocks, block_size, n_blocks;
    int32_t *q_start, *past, *bt, *pos, *slots;
    struct twin tq, tp, tbt, tpos, tsl;
    struct attn_batch abc, abg;
};

static void geo_make(struct pair *p, struct geo *g, int n_seqs, const int *past, const int *rows,
                     int block_size) {
    memset(g, 0, sizeof *g);
    g->n_seqs = n_seqs;
    g->block_size = block_size;
    g->q_start = malloc(((size_t)n_seqs + 1) * sizeof(int32_t));
    g->past = malloc((size_t)n_seqs * sizeof(int32_t));
    int mb = 1, tot_blocks = 0;
    g->q_start[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        g->past[s] = past[s];
        g->q_start[s + 1] = g->q_start[s] + rows[s];
        int nb = (past[s] + rows[s] + block_size - 1) / block_size;
        if (nb > mb) mb = nb;
        tot_blocks += nb;
    }
    g->n_rows = g->q_start[n_seqs];
    g->max_blocks = mb + 1;
    g->n_blocks = tot_blocks + 3;
    int *perm = malloc((size_t)g->n_blocks * sizeof *perm);
    for (int i = 0; i < g->n_blocks; i++) perm[i] = i;
    for (int i = g->n_blocks - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    g->bt = calloc((size_t)n_seqs * g->max_blocks, sizeof(int32_t));
    g->pos = malloc(((size_t)g->n_rows + 1) * sizeof(int32_t));
    g->slots = malloc(((size_t)g->n_rows + 1) * sizeof(int32_t));
    int next = 0;
    for (int s = 0; s < n_seqs; s++) {
        int nb = (past[s] + rows[s] + block_size - 1) / block_size;
        for (int j = 0; j < nb; j++) g->bt[(size_t)s * g->max_blocks + j] = perm[next++];
        for (int r = 0; r < rows[s]; r++) {
            int ps = past[s] + r, i = g->q_start[s] + r;
            g->pos[i] = ps;
            g->slots[i] = g->bt[(size_t)s * g->max_blocks + ps / block_size] * block_size + ps % block_size;
        }
    }
    free(perm);
    g->tq = twin_new(p, BUF_I32, (size_t)n_seqs + 1, g->q_start);
    g->tp = twin_new(p, BUF_I32, (size_t)n_seqs, g->past);
    g->tbt = twin_new(p, BUF_I32, (size_t)n_seqs * g->max_blocks, g->bt);
    g->tpos = twin_new(p, BUF_I32, (size_t)g->n_rows, g->pos);
    g->tsl = twin_new(p, BUF_I32, (size_t)g->n_rows, g->slots);
    struct attn_batch ab = {n_seqs, g->n_rows, g->max_blocks, block_size, NULL, NULL, NULL, NULL,
                            NULL, g->q_start, g->past, 0};
    g->abc = ab;
    g->abc.q_start = g->tq.c;
    g->abc.past = g->tp.c;
    g->abc.block_table = g->tbt.c;
    g->abc.positions = g->tpos.c;
    g->abc.slots = g->tsl.c;
    g->abg = ab;
    g->abg.q_start = g->tq.g;
    g->abg.past = g->tp.g;
    g->abg.block_table = g->tbt.g;
    g->abg.positions = g->tpos.g;
    g->abg.slots = g->tsl.g;
}

static void geo_free(struct pair *p, struct geo *g) {
    twin_free(p, &g->tq);
    twin_free(p, &g->tp);
    twin_free(p, &g->tbt);
    twin_free(p, &g->tpos);
    twin_free(p, &g->tsl);
    free(g->q_start);
    free(g->past);
    free(g->bt);
    free(g->pos);
    free(g->slots);
}

static void inv_freq_of(float *f, int hd, double theta) {
    for (int j = 0; j < hd / 2; j++) f[j] = (float)(1.0 / pow(theta, 2.0 * j / hd));
}

static void rope_case(int hd, int nh, int nkv, int norm, int n_seqs, const int *past,
                      const int *rows) {
    OPEN(p);
    struct geo g;
    geo_make(&p, &g, n_seqs, past, rows, 16);
    int n = g.n_rows, width = (nh + 2 * nkv) * hd;
    size_t cache = (size_t)g.n_blocks * 16 * nkv * hd;
    float *qkv = malloc((size_t)n * width * sizeof *qkv), *qn = malloc((size_t)hd * 4),
          *kn = malloc((size_t)hd * 4), *inv = malloc((size_t)hd / 2 * 4);
    fill(qkv, (size_t)n * width, -2, 2);
    fill(qn, (size_t)hd, 0.5f, 1.5f);
    fill(kn, (size_t)hd, 0.5f, 1.5f);
    inv_freq_of(inv, hd, 1000000.0);
    struct twin Q = twin_new(&p, BUF_ACT, (size_t)n * width, qkv);
    struct twin QN = twin_w16(&p, qn, (size_t)hd), KN = twin_w16(&p, kn, (size_t)hd);
    struct twin IF = twin_new(&p, BUF_F32, (size_t)hd / 2, inv);
    struct twin KC = twin_new(&p, BUF_ACT, cache, NULL), VC = twin_new(&p, BUF_ACT, cache, NULL);
    p.cpu->qk_norm_rope_kv(p.cpu->ctx, Q.c, n, nh, nkv, hd, norm ? QN.c : NULL, norm ? KN.c : NULL,
                           1e-6f, IF.c, &g.abc, KC.c, VC.c);
    p.gpu->qk_norm_rope_kv(p.gpu->ctx, Q.g, n, nh, nkv, hd, norm ? QN.g : NULL, norm ? KN.g : NULL,
                           1e-6f, IF.g, &g.abg, KC.g, VC.g);
    char what[128];
    snprintf(what, sizeof what, "rope hd %d nh %d nkv %d norm %d (qkv)", hd, nh, nkv, norm);
    twin_check(&p, &Q, 0, (size_t)n * width, 4e-3, 1e-3, what);
    snprintf(what, sizeof what, "rope hd %d nh %d nkv %d norm %d (k cache)", hd, nh, nkv, norm);
    if (!test_failed()) twin_check(&p, &KC, 0, cache, 4e-3, 1e-3, what);
    snprintf(what, sizeof what, "rope hd %d nh %d nkv %d norm %d (v cache)", hd, nh, nkv, norm);
    if (!test_failed()) twin_check(&p, &VC, 0, cache, 0, 0, what);
    twin_free(&p, &Q);
    twin_free(&p, &QN);
    twin_free(&p, &KN);
    twin_free(&p, &IF);
    twin_free(&p, &KC);
    twin_free(&p, &VC);
    geo_free(&p, &g);
    free(qkv);
    free(qn);
    free(kn);
    free(inv);
    pair_close(&p);
}

TEST(ops_cuda, qk_norm_rope_kv_shapes) {
    const int past1[] = {0, 31000, 17}, rows1[] = {9, 1, 5};
    rope_case(128, 32, 8, 1, 3, past1, rows1);
    if (test_failed()) return;
    rope_case(128, 4, 2, 0, 3, past1, rows1);
    if (test_failed()) return;
    rope_case(64, 8, 8, 1, 3, past1, rows1);
    if (test_failed()) return;
    rope_case(32, 8, 2, 0, 3, past1, rows1);
    if (test_failed()) return;
    rope_case(256, 16, 2, 1, 3, past1, rows1);
    if (test_failed()) return;
    rope_case(96, 64, 8, 1, 3, past1, rows1);
}

/* ---- attention ------------------------------------------------------------- */

static void attn_case(int hd, int nh, int nkv, int n_seqs, const int *past, const int *rows,
                      int block_size) {
    OPEN(p);
    struct geo g;
    geo_make(&p, &g, n_seqs, past, rows, block_size);
    int n = g.n_rows, width = (nh + 2 * nkv) * hd;
    size_t cache = (size_t)g.n_blocks * block_size * nkv * hd;
    float *qkv = malloc((size_t)n * width * sizeof *qkv), *kc = malloc(cache * sizeof *kc),
          *vc = malloc(cache * sizeof *vc);
    fill(qkv, (size_t)n * width, -1, 1);
    fill(kc, cache, -1, 1);
    fill(vc, cache, -1, 1);
    /* a few peaked rows: scores that dominate the softmax */
    for (size_t i = 0; i < cache; i += 97) kc[i] = h16(kc[i] * 8);
    struct twin Q = twin_new(&p, BUF_ACT, (size_t)n * width, qkv);
    struct twin KC = twin_new(&p, BUF_ACT, cache, kc), VC = twin_new(&p, BUF_ACT, cache, vc);
    struct twin O = twin_new(&p, BUF_ACT, (size_t)n * nh * hd, NULL);
    float scale = 1.0f / sqrtf((float)hd) * 2.0f;
    p.cpu->attention(p.cpu->ctx, O.c, Q.c, nh, nkv, hd, scale, &g.abc, KC.c, VC.c);
    p.gpu->attention(p.gpu->ctx, O.g, Q.g, nh, nkv, hd, scale, &g.abg, KC.g, VC.g);
    char what[160];
    int mx_ctx = 0;
    for (int s = 0; s < n_seqs; s++) mx_ctx = past[s] + rows[s] > mx_ctx ? past[s] + rows[s] : mx_ctx;
    snprintf(what, sizeof what, "attention hd %d nh %d nkv %d seqs %d rows %d max ctx %d bs %d", hd,
             nh, nkv, n_seqs, n, mx_ctx, block_size);
    twin_check(&p, &O, 0, (size_t)n * nh * hd, 0, 4e-3, what);
    /* a second call on the same geometry (cached work list) gives the same bits */
    if (!test_failed()) {
        float *a = malloc((size_t)n * nh * hd * 4), *b = malloc((size_t)n * nh * hd * 4);
        p.gpu->download(p.gpu->ctx, a, O.g, 0, (size_t)n * nh * hd);
        p.gpu->attention(p.gpu->ctx, O.g, Q.g, nh, nkv, hd, scale, &g.abg, KC.g, VC.g);
        p.gpu->download(p.gpu->ctx, b, O.g, 0, (size_t)n * nh * hd);
        int same = !memcmp(a, b, (size_t)n * nh * hd * 4);
        free(a);
        free(b);
        ASSERT_MSG(same, "%s: second call differs", what);
    }
    ASSERT_EQ_INT(p.gpu->sync(p.gpu->ctx), 0);
    twin_free(&p, &Q);
    twin_free(&p, &KC);
    twin_free(&p, &VC);
    twin_free(&p, &O);
    geo_free(&p, &g);
    free(qkv);
    free(kc);
    free(vc);
    pair_close(&p);
}

/* decode batches: one row per sequence, contexts from 1 to thousands; the
 * first K/V tile loaded before the PDL wait (the default on sm_90+) and
 * after it (AWQD_CUDA_DEC_PREWAIT=0); block size 16 (the kernel compiled
 * for powers of two) and 7 (the one with the division), with and without
 * the splits that have no keys (batch 1 / 7) */
TEST(ops_cuda, attention_decode) {
    const int past[] = {0, 15, 16, 100, 3000, 777, 64}, rows[] = {1, 1, 1, 1, 1, 1, 1};
    const int cfg[][3] = {{128, 32, 8}, {128, 8, 8}, {64, 16, 2}, {32, 8, 2}, {256, 8, 1},
                          {128, 64, 8}, {128, 128, 8}};
    /* batch 1: 33 splits; all of the first 16 with keys (511), few (100, 0) */
    const int past1[][1] = {{511}, {100}, {0}, {4095}}, rows1[] = {1};
    for (int m = 0; m < 2 && !test_failed(); m++) {
        if (m) setenv("AWQD_CUDA_DEC_PREWAIT", "0", 1);
        for (int i = 0; i < 7 && !test_failed(); i++) attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 7, past, rows, 16);
        for (int i = 0; i < 4 && !test_failed(); i++) attn_case(128, 32, 8, 1, past1[i], rows1, 16);
        if (!test_failed()) attn_case(64, 16, 2, 1, past1[0], rows1, 7);
        if (!test_failed()) attn_case(128, 32, 8, 7, past, rows, 7);
    }
    unsetenv("AWQD_CUDA_DEC_PREWAIT");
    /* the SIMT kernel at hd <= 128 (AWQD_CUDA_DECODE_ATTN=simt, a tuning
     * switch): 64-key tiles, so a head's scores come from two warps and the
     * barrier between the scores and the softmax is load-bearing */
    setenv("AWQD_CUDA_DECODE_ATTN", "simt", 1);
    if (!test_failed()) attn_case(128, 32, 8, 7, past, rows, 16);
    if (!test_failed()) attn_case(64, 16, 2, 1, past1[0], rows1, 16);
    unsetenv("AWQD_CUDA_DECODE_ATTN");
}

/* batch 1 on 1-4 KV heads: 33-64 splits, merged by the wide combine kernel
 * (from 17 splits; every head size: 2-16 split groups per CTA) and, for
 * comparison, by the plain one (AWQD_CUDA_DEC_WIDE=0); then the wide kernel
 * at every split count (=2) on batches of 7 and 3 (2-10 splits) */
TEST(ops_cuda, attention_decode_many_splits) {
    const int cfg[][3] = {{128, 16, 2}, {64, 16, 2}, {32, 8, 2}, {256, 8, 1}, {128, 32, 4}};
    const int past1[][1] = {{4095}, {2047}, {600}, {33}}, rows1[] = {1};
    for (int w = 0; w < 2 && !test_failed(); w++) {
        if (w) setenv("AWQD_CUDA_DEC_WIDE", "0", 1);
        for (int i = 0; i < 5 && !test_failed(); i++)
            for (int j = 0; j < 4 && !test_failed(); j++) attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 1, past1[j], rows1, 16);
    }
    setenv("AWQD_CUDA_DEC_WIDE", "2", 1);
    const int past7[] = {0, 15, 16, 100, 3000, 777, 64}, rows7[] = {1, 1, 1, 1, 1, 1, 1};
    const int past3[] = {2047, 5, 900}, rows3[] = {1, 1, 1};
    for (int i = 0; i < 5 && !test_failed(); i++) {
        attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 7, past7, rows7, 16);
        if (!test_failed()) attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 3, past3, rows3, 16);
    }
    unsetenv("AWQD_CUDA_DEC_WIDE");
}

/* prefill from scratch, and chunks on top of a cached prefix */
TEST(ops_cuda, attention_prefill_and_chunked) {
    const int p1[] = {0}, r1[] = {130};
    const int p2[] = {200}, r2[] = {37};
    const int p3[] = {0, 64}, r3[] = {1, 64};
    /* hd <= 128: tensor-core kernel; hd 256: the SIMT kernel with 32-pair tiles */
    const int cfg[][3] = {{128, 32, 8}, {64, 4, 4}, {32, 8, 2}, {128, 16, 2}, {256, 8, 2}};
    for (int i = 0; i < 5 && !test_failed(); i++) {
        attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 1, p1, r1, 16);
        if (!test_failed()) attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 1, p2, r2, 16);
        if (!test_failed()) attn_case(cfg[i][0], cfg[i][1], cfg[i][2], 2, p3, r3, 16);
    }
}

/* mixed prefill chunks and decodes in one batch; odd block sizes */
TEST(ops_cuda, attention_mixed_batch) {
    const int past[] = {0, 500, 17, 4000, 64, 1}, rows[] = {33, 1, 16, 1, 5, 2};
    attn_case(128, 32, 8, 6, past, rows, 16);
    if (!test_failed()) attn_case(128, 4, 2, 6, past, rows, 7);
    if (!test_failed()) attn_case(64, 16, 16, 6, past, rows, 32);
    if (!test_failed()) attn_case(32, 8, 1, 6, past, rows, 1);
}

/* one long context crossing many blocks (flash-decoding splits) */
TEST(ops_cuda, attention_long_context) {
    const int past[] = {16383}, rows[] = {1};
    attn_case(128, 32, 8, 1, past, rows, 16);
    const int past2[] = {5000, 9000}, rows2[] = {3, 1};
    if (!test_failed()) attn_case(128, 16, 2, 2, past2, rows2, 16);
}

/* ---- lm_head --------------------------------------------------------------- */

TEST(ops_cuda, lm_head_rows) {
    OPEN(p);
    const int vocabs[] = {512, 999, 4096};
    const int dims[] = {256, 136, 4096};
    for (int c = 0; c < 3 && !test_failed(); c++) {
        for (int m = 1; m <= 9 && !test_failed(); m += (m < 3 ? 1 : 3)) { /* GEMV and GEMM paths */
        int V = vocabs[c], dim = dims[c], n = 9;
        float *x = malloc((size_t)n * dim * 4), *t = malloc((size_t)V * dim * 4);
        fill(x, (size_t)n * dim, -1, 1);
        fill(t, (size_t)V * dim, -0.1f, 0.1f);
        int32_t rows[9] = {8, 0, 3, 3, 7, 1, 2, 6, 5};
        struct twin X = twin_new(&p, BUF_ACT, (size_t)n * dim, x), T = twin_w16(&p, t, (size_t)V * dim);
        struct twin R = twin_new(&p, BUF_I32, (size_t)m, rows), L = twin_new(&p, BUF_F32, (size_t)m * V, NULL);
        p.cpu->lm_head(p.cpu->ctx, L.c, X.c, R.c, m, T.c, dim, V);
        p.gpu->lm_head(p.gpu->ctx, L.g, X.g, R.g, m, T.g, dim, V);
        char what[64];
        snprintf(what, sizeof what, "lm_head V %d dim %d m %d", V, dim, m);
        twin_check(&p, &L, 0, (size_t)m * V, 2e-3, 0, what);
        /* rows NULL: x rows 0..m-1, read in place (no gather) */
        p.cpu->lm_head(p.cpu->ctx, L.c, X.c, NULL, m, T.c, dim, V);
        p.gpu->lm_head(p.gpu->ctx, L.g, X.g, NULL, m, T.g, dim, V);
        snprintf(what, sizeof what, "lm_head V %d dim %d m %d rows 0..m-1", V, dim, m);
        twin_check(&p, &L, 0, (size_t)m * V, 2e-3, 0, what);
        twin_free(&p, &X);
        twin_free(&p, &T);
        twin_free(&p, &R);
        twin_free(&p, &L);
        free(x);
        free(t);
        }
    }
    pair_close(&p);
}

/* lm_head on every path (default cuBLAS, AWQD_CUDA_LM_HEAD=tc: tensor cores
 * for m <= 32, =gemv: the GEMV for m <= 8): vocabularies that are not multiples of the 16-row
 * warp tile or the 128-row CTA tile, dims with a partial last 256-column
 * slice, repeated and permuted rows; every path against the CPU op. */
TEST(ops_cuda, lm_head_tc_rows) {
    OPEN(p);
    const int vocabs[] = {1000, 4099, 20011, 129};
    const int dims[] = {4096, 96, 512, 288};
    const int ms[] = {9, 13, 16, 17, 24, 31, 32, 1, 5, 8};
    const char *modes[] = {NULL, "tc", "gemv"};
    for (int c = 0; c < 4 && !test_failed(); c++) {
        int V = vocabs[c], dim = dims[c], n = 40;
        float *x = malloc((size_t)n * dim * 4), *t = malloc((size_t)V * dim * 4);
        fill(x, (size_t)n * dim, -1, 1);
        fill(t, (size_t)V * dim, -0.1f, 0.1f);
        int32_t rows[32];
        for (int i = 0; i < 32; i++) rows[i] = (i * 7 + 3) % n;
        rows[5] = rows[4]; /* a repeated row */
        struct twin X = twin_new(&p, BUF_ACT, (size_t)n * dim, x), T = twin_w16(&p, t, (size_t)V * dim);
        for (int mi = 0; mi < 10 && !test_failed(); mi++)
            for (int md = 0; md < 3 && !test_failed(); md++) {
                int m = ms[mi];
                if (modes[md]) setenv("AWQD_CUDA_LM_HEAD", modes[md], 1);
                else unsetenv("AWQD_CUDA_LM_HEAD");
                struct twin R = twin_new(&p, BUF_I32, (size_t)m, rows),
                            L = twin_new(&p, BUF_F32, (size_t)m * V, NULL);
                p.cpu->lm_head(p.cpu->ctx, L.c, X.c, R.c, m, T.c, dim, V);
                p.gpu->lm_head(p.gpu->ctx, L.g, X.g, R.g, m, T.g, dim, V);
                char what[96];
                snprintf(what, sizeof what, "lm_head V %d dim %d m %d (%s)", V, dim, m,
                         modes[md] ? modes[md] : "default");
                twin_check(&p, &L, 0, (size_t)m * V, 2e-3, 0, what);
                /* rows NULL: x rows 0..m-1 in place */
                p.cpu->lm_head(p.cpu->ctx, L.c, X.c, NULL, m, T.c, dim, V);
                p.gpu->lm_head(p.gpu->ctx, L.g, X.g, NULL, m, T.g, dim, V);
                snprintf(what, sizeof what, "lm_head V %d dim %d m %d (%s) rows 0..m-1", V, dim, m,
                         modes[md] ? modes[md] : "default");
                twin_check(&p, &L, 0, (size_t)m * V, 2e-3, 0, what);
                twin_free(&p, &R);
                twin_free(&p, &L);
            }
        unsetenv("AWQD_CUDA_LM_HEAD");
        twin_free(&p, &X);
        twin_free(&p, &T);
        free(x);
        free(t);
    }
    pair_close(&p);
}

/* lm_head timing at Qwen3-8B's shape (vocab 151936 x 4096 fp16, 1.24 GB)
 * per path and row count: prints µs per call and the table's read rate
 * (best of 5 after a warm-up). Asserts only that the calls succeed. */
TEST(ops_cuda, bench_lm_head) {
    int nd = 0;
    if (cudaGetDeviceCount(&nd) != cudaSuccess || nd == 0) TEST_SKIP("no CUDA device");
    char err[256];
    struct ops *g = NULL;
    ASSERT_MSG(ops_cuda_create(0, &g, err, sizeof err) == 0, "cuda: %s", err);
    const int V = 151936, dim = 4096, M = 32;
    struct buf *T = g->alloc(g->ctx, BUF_W16, (size_t)V * dim), *X = g->alloc(g->ctx, BUF_ACT, (size_t)M * dim);
    struct buf *R = g->alloc(g->ctx, BUF_I32, (size_t)M), *L = g->alloc(g->ctx, BUF_F32, (size_t)M * V);
    ASSERT(T && X && R && L);
    int32_t rows[32];
    for (int i = 0; i < M; i++) rows[i] = (i * 5) % M;
    g->upload(g->ctx, R, 0, rows, (size_t)M);
    const int ms[] = {1, 8, 9, 16, 24, 32};
    const char *modes[] = {NULL, "gemv", "tc"};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("\nlm_head %d x %d fp16 (%.2f GB): us per call (GB/s of the table)\n", V, dim, (double)V * dim * 2 / 1e9);
    printf("| rows | default (cuBLAS) | gemv (GEMV <= 8, else cuBLAS) | tc |\n|---|---|---|---|\n");
    for (int mi = 0; mi < 6; mi++) {
        int m = ms[mi];
        printf("| %d |", m);
        for (int md = 0; md < 3; md++) {
            if (modes[md]) setenv("AWQD_CUDA_LM_HEAD", modes[md], 1);
            else unsetenv("AWQD_CUDA_LM_HEAD");
            float best = 1e30f;
            for (int r = 0; r < 6; r++) {
                g->sync(g->ctx);
                cudaEventRecord(e0, 0);
                g->lm_head(g->ctx, L, X, R, m, T, dim, V);
                g->sync(g->ctx);
                cudaEventRecord(e1, 0);
                cudaEventSynchronize(e1);
                float ms_ = 0;
                cudaEventElapsedTime(&ms_, e0, e1);
                if (r > 0 && ms_ < best) best = ms_;
            }
            printf(" %.0f (%.0f) |", best * 1e3, (double)V * dim * 2 / (best * 1e-3) / 1e9);
        }
        printf("\n");
    }
    fflush(stdout);
    unsetenv("AWQD_CUDA_LM_HEAD");
    ASSERT_EQ_INT(g->sync(g->ctx), 0);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    g->free(g->ctx, T);
    g->free(g->ctx, X);
    g->free(g->ctx, R);
    g->free(g->ctx, L);
    ops_destroy(g);
}

/* What device memory allocations really take (for the memory plan's
 * rounding and slack): cudaMemGetInfo deltas over many cudaMallocs of the
 * sizes the model makes (norms, scales, KV buffers), and what creating a
 * CUDA backend (stream, cuBLAS handle, pinned ring) takes. Prints; asserts
 * only that the calls succeed. */
TEST(ops_cuda, mem_granularity) {
    int nd = 0;
    if (cudaGetDeviceCount(&nd) != cudaSuccess || nd == 0) TEST_SKIP("no CUDA device");
    cudaSetDevice(0);
    cudaFree(0);
    const size_t sizes[] = {256, 8192, 65536, 393216, 1572864, 6291456, 549584896};
    const int counts[] = {100, 100, 50, 50, 20, 10, 4};
    printf("\n| bytes requested | allocations | bytes taken per allocation |\n|---|---|---|\n");
    for (int i = 0; i < 7; i++) {
        void *p[100];
        size_t f0, f1, t;
        cudaDeviceSynchronize();
        cudaMemGetInfo(&f0, &t);
        int n = 0;
        for (; n < counts[i]; n++)
            if (cudaMalloc(&p[n], sizes[i]) != cudaSuccess) break;
        cudaMemGetInfo(&f1, &t);
        printf("| %zu | %d | %.0f |\n", sizes[i], n, n ? (double)(f0 - f1) / n : 0.0);
        for (int j = 0; j < n; j++) cudaFree(p[j]);
        ASSERT_EQ_INT(n, counts[i]);
    }
    size_t f0, f1, t;
    cudaMemGetInfo(&f0, &t);
    char err[256];
    struct ops *g = NULL;
    ASSERT_MSG(ops_cuda_create(0, &g, err, sizeof err) == 0, "cuda: %s", err);
    cudaMemGetInfo(&f1, &t);
    printf("ops_cuda_create: %.1f MB of device memory\n", ((double)f0 - f1) / 1e6);
    fflush(stdout);
    ops_destroy(g);
}

/* ---- linear (through kernels/cuda/w4a16) --------------------------------- */

TEST(ops_cuda, linear_shapes) {
    OPEN(p);
    const int shapes[][2] = {{256, 1024}, {640, 256}, {4096, 6144}, {384, 208}};
    /* 300: a prefill-sized call, its output buffer 4 x as tall as the call
     * (kernels/ops.h: the rows past n are the call's scratch) */
    const int ms[] = {1, 7, 64, 130, 300};
    for (int si = 0; si < 4 && !test_failed(); si++)
        for (int bias = 0; bias < 2 && !test_failed(); bias++) {
            int K = shapes[si][0], N = shapes[si][1], G = 128;
            uint32_t *qw = malloc((size_t)K * N / 8 * 4), *qz = malloc((size_t)K / G * N / 8 * 4);
            uint16_t *sc = malloc((size_t)K / G * N * 2), *bs = malloc((size_t)N * 2);
            for (size_t i = 0; i < (size_t)K * N / 8; i++) qw[i] = rnd() ^ (rnd() << 16);
            for (size_t i = 0; i < (size_t)K / G * N / 8; i++) qz[i] = rnd() ^ (rnd() << 16);
            for (size_t i = 0; i < (size_t)K / G * N; i++) sc[i] = f32_to_fp16(urand(0.001f, 0.02f));
            for (int i = 0; i < N; i++) bs[i] = f32_to_fp16(urand(-1, 1));
            struct awq_linear l = {K, N, G, qw, qz, sc, bias ? bs : NULL};
            struct op_linear *lc = p.cpu->upload_linear(p.cpu->ctx, &l, LINEAR_PLAIN);
            struct op_linear *lg = p.gpu->upload_linear(p.gpu->ctx, &l, LINEAR_PLAIN);
            struct op_linear *gc = p.cpu->upload_linear(p.cpu->ctx, &l, LINEAR_GATE_UP);
            struct op_linear *gg = p.gpu->upload_linear(p.gpu->ctx, &l, LINEAR_GATE_UP);
            ASSERT_MSG(lc && lg && gc && gg, "upload_linear K %d N %d failed", K, N);
            for (int mi = 0; mi < 5 && !test_failed(); mi++) {
                int m = ms[mi], rows = m >= 256 ? 4 * m : m;
                float *x = malloc((size_t)m * K * 4);
                fill(x, (size_t)m * K, -1, 1);
                struct twin X = twin_new(&p, BUF_ACT, (size_t)m * K, x);
                struct twin Y = twin_new(&p, BUF_ACT, (size_t)rows * N, NULL);
                p.cpu->linear(p.cpu->ctx, Y.c, X.c, m, lc);
                p.gpu->linear(p.gpu->ctx, Y.g, X.g, m, lg);
                char what[80];
                snprintf(what, sizeof what, "linear K %d N %d M %d bias %d", K, N, m, bias);
                twin_check(&p, &Y, 0, (size_t)m * N, 4e-3, 0, what);
                /* gate | up halves through the fused SiLU * mul epilogue */
                if (!test_failed()) {
                    struct twin Z = twin_new(&p, BUF_ACT, (size_t)rows * N / 2, NULL);
                    p.cpu->linear_silu_mul(p.cpu->ctx, Z.c, X.c, m, gc);
                    p.gpu->linear_silu_mul(p.gpu->ctx, Z.g, X.g, m, gg);
                    snprintf(what, sizeof what, "linear_silu_mul K %d N %d M %d bias %d", K, N, m, bias);
                    twin_check(&p, &Z, 0, (size_t)m * N / 2, 1e-2, 0, what);
                    twin_free(&p, &Z);
                }
                twin_free(&p, &X);
                twin_free(&p, &Y);
                free(x);
            }
            p.cpu->free_linear(p.cpu->ctx, lc);
            p.gpu->free_linear(p.gpu->ctx, lg);
            p.cpu->free_linear(p.cpu->ctx, gc);
            p.gpu->free_linear(p.gpu->ctx, gg);
            free(qw);
            free(qz);
            free(sc);
            free(bs);
        }
    pair_close(&p);
}
