/* sample_cpu.c — ops->sample_topk on the CPU: the oracle of the CUDA version
 * (kernels/cuda/sample.cu) and what the CPU backend serves with. One row at a
 * time on the calling thread: sums run in column order, in double, over the
 * same fp32 expf terms engine/sampler.c uses, so at tp = 1 the sums equal the
 * host sampler's bit for bit. */
#include "kernels/cpu/sample_cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/util.h"
#include "kernels/cpu/cpu.h"

/* The order of kernels/ops.h as one integer: w descending, then id ascending;
 * NaN below everything, -0 == +0. */
static uint64_t key_of(float v, int32_t id) {
    uint32_t u;
    if (v == 0.0f) v = 0.0f;
    memcpy(&u, &v, sizeof u);
    if (v != v) u = 0;
    else u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)id);
}

static void sift_down(uint64_t *h, int n, int i) { /* min-heap */
    for (;;) {
        int l = 2 * i + 1, r = l + 1, s = i;
        if (l < n && h[l] < h[s]) s = l;
        if (r < n && h[r] < h[s]) s = r;
        if (s == i) return;
        uint64_t t = h[i];
        h[i] = h[s];
        h[s] = t;
        i = s;
    }
}

static void put_double(float *dst, double v) { memcpy(dst, &v, sizeof v); }

void cpu_sample_topk(void *ctx, struct buf *out, const struct buf *logits, struct buf *work,
                     const struct sample_batch *sb) {
    (void)ctx;
    int m = sb->m, k = sb->k, ld = sb->ld, nc = sb->n_cols, vs = sb->vocab_start;
    AWQD_ASSERT(k >= 1 && k <= SAMPLE_MAX_K && nc >= 0 && nc <= ld && m >= 0);
    const int32_t *as = cpu_i32(sb->adj_start);
    int n_adj = as[m];
    AWQD_ASSERT(out->n >= SAMPLE_OUT_FLOATS(m, k, n_adj));
    AWQD_ASSERT(logits->n >= (size_t)m * ld && work->n >= sample_work_floats(m, ld, k));
    const int32_t *adj = n_adj ? cpu_i32(sb->adj) : NULL;
    const float *inv = cpu_f32(sb->inv_t);
    float *o = cpu_f32(out);
    uint64_t heap[SAMPLE_MAX_K];
    for (int r = 0; r < m; r++) {
        const float *raw = cpu_f32(logits) + (size_t)r * ld;
        const float *w = raw;
        float *row = o + (size_t)r * SAMPLE_ROW_FLOATS(k);
        /* processed row: copy + adjustments in order */
        if (as[r + 1] > as[r]) {
            float *pw = cpu_f32(work) + (size_t)r * ld;
            memcpy(pw, raw, (size_t)nc * sizeof *pw);
            for (int e = as[r]; e < as[r + 1]; e++) {
                int tok = adj[2 * e] >> 2, op = adj[2 * e] & 3;
                float v;
                memcpy(&v, &adj[2 * e + 1], sizeof v);
                int c = tok - vs;
                if (c < 0 || c >= nc) continue;
                o[(size_t)m * SAMPLE_ROW_FLOATS(k) + e] = raw[c];
                if (op == SAMPLE_ADJ_ADD) pw[c] += v;
                else if (op == SAMPLE_ADJ_REP) pw[c] = pw[c] > 0 ? pw[c] / v : pw[c] * v;
                else pw[c] -= v;
            }
            w = pw;
        }
        /* stats */
        float mw = -INFINITY, mr = -INFINITY;
        for (int c = 0; c < nc; c++) {
            if (w[c] > mw) mw = w[c];
            if (raw[c] > mr) mr = raw[c];
        }
        double sw = 0, sr = 0;
        float it = inv[r];
        if (mw > -INFINITY)
            for (int c = 0; c < nc; c++) sw += expf((w[c] - mw) * it);
        if (mr > -INFINITY)
            for (int c = 0; c < nc; c++) sr += expf(raw[c] - mr);
        row[0] = mw;
        put_double(row + 1, sw);
        row[3] = mr;
        put_double(row + 4, sr);
        /* top k by key: a min-heap of the k best */
        int kk = nc < k ? nc : k, n = 0;
        for (int c = 0; c < nc; c++) {
            uint64_t key = key_of(w[c], vs + c);
            if (n < kk) {
                heap[n++] = key;
                if (n == kk)
                    for (int i = kk / 2 - 1; i >= 0; i--) sift_down(heap, kk, i);
            } else if (key > heap[0]) {
                heap[0] = key;
                sift_down(heap, kk, 0);
            }
        }
        /* pop ascending into the tail: best first */
        for (int i = kk - 1; i >= 0; i--) {
            uint64_t key = heap[0];
            heap[0] = heap[i];
            sift_down(heap, i, 0);
            int32_t id = (int32_t)(0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFu));
            row[SAMPLE_HDR + i] = w[id - vs];
            row[SAMPLE_HDR + k + i] = raw[id - vs];
            memcpy(&row[SAMPLE_HDR + 2 * k + i], &id, sizeof id);
        }
        int32_t none = -1;
        for (int i = kk; i < k; i++) {
            row[SAMPLE_HDR + i] = -INFINITY;
            row[SAMPLE_HDR + k + i] = -INFINITY;
            memcpy(&row[SAMPLE_HDR + 2 * k + i], &none, sizeof none);
        }
        memcpy(&row[6], &kk, sizeof kk);
        row[7] = 0;
    }
}
