/* sample_cpu.c — ops->sample_topk on the CPU: the oracle of the CUDA version
 * (kernels/cuda/sample.cu) and what the CPU backend serves with. One row at a
 * time on the calling thread: sums run in column order, in double, over the
 * same fp32 expf terms engine/sampler.c uses, so at tp = 1 the sums equal the
 * host sampler's bit for bit. The race (kernels/ops.h) scans the columns in
 * id order with sample_race_score, the function the host sampler uses. */
#include "kernels/cpu/sample_cpu.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/util.h"
#include "kernels/cpu/cpu.h"


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

static uint64_t race_mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double sample_race_uniform(uint64_t key, int32_t id) {
    uint64_t h = race_mix(key ^ ((uint64_t)(uint32_t)id * 0x9e3779b97f4a7c15ull));
    /* (h >> 12) + 0.5 < 2^52 is exact; * 2^-52 is exact: u in (0, 1) */
    return ((double)(h >> 12) + 0.5) * (1.0 / 4503599627370496.0);
}

double sample_race_score(uint64_t key, int32_t id, float w, float inv_t) {
    if (!isfinite(w)) return -INFINITY;
    double g = -log(-log(sample_race_uniform(key, id)));
    /* w * inv_t is exact in double (24 x 24 bits): one rounding, FMA or not */
    return (double)w * (double)inv_t + g;
}

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
    const int32_t *race = sb->race ? cpu_i32(sb->race) : NULL; /* [3 m] */
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
            uint64_t key = sample_order_key(w[c], vs + c);
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
        /* the race over the finite columns */
        int32_t wid = -1;
        double ws = -INFINITY;
        if (race && race[3 * r + 2]) {
            uint64_t key = (uint64_t)(uint32_t)race[3 * r] | (uint64_t)(uint32_t)race[3 * r + 1] << 32;
            for (int c = 0; c < nc; c++) {
                if ((double)w[c] * (double)it + SAMPLE_RACE_GMAX < ws) continue;
                double sc = sample_race_score(key, vs + c, w[c], it);
                if (sc > ws) ws = sc, wid = vs + c; /* ascending ids: ties keep the lowest */
            }
        }
        memcpy(&row[7], &wid, sizeof wid);
        put_double(row + 8, ws);
        row[10] = wid >= 0 ? w[wid - vs] : -INFINITY;
        row[11] = wid >= 0 ? raw[wid - vs] : -INFINITY;
    }
}
