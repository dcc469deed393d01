/* attn.cu — causal attention over the paged KV cache, one kernel for prefill,
 * chunked prefill, decode and mixed batches: tiled flash attention with
 * split-K (flash-decoding) over long contexts.
 *
 * Work decomposition. For KV head g of sequence s, the "pairs" are (row,
 * query head of g's group) of that sequence's new rows, row-major: pair p is
 * row p / G, head g * G + p % G (G = nh / nkv). A CTA takes QP consecutive
 * pairs (so all G query heads of a KV head share every K/V tile it loads:
 * each KV head is read once per group) and a range [kb, ke) of key
 * positions; the grid is (work items, nkv). When the items are too few to
 * fill the GPU (decode, short batches) the key range of each tile is split
 * and a second kernel merges the partial softmax states.
 *
 * The work list (8 ints per item) is built on the host from ab->h_q_start /
 * h_past, uploaded once and reused while the batch geometry is unchanged
 * (every layer of one forward).
 *
 * Kernel (128 threads, TK = 64 keys per tile):
 *   q       float [QP][HD + 4] pre-scaled by scale * log2(e)   (shared)
 *   k, v    fp16  [TK][HD + 8] one tile, zero past the range     (shared)
 *   S       float [QP][TK + 4] scores, then probabilities      (shared)
 *   o       float [QP / 4][HD / 32] per thread (registers)
 * Scores: thread (tq = tid / 16, tk = tid % 16) computes pairs tq + 8 i and
 * keys tk + 16 j. Softmax: NT / QP threads per pair. P.V: warp w owns pairs
 * w + 4 i, lane l owns dims [l HD/32, (l+1) HD/32). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops_cuda_internal.h"

extern "C" {
#include "engine/util.h"
}

#define ATT_NT 128
#define ATT_TK 64
#define ATT_MIN_SPLIT_TILES 2   /* a split covers at least this many key tiles */

/* work item: [0] row0 (first batch row of s)  [1] rows of s  [2] past of s
 *            [3] s  [4] p0 (first pair)  [5] kb  [6] ke  [7] partial slot or -1
 * combine group: [0] row0 [1] rows [2] p0 [3] first slot [4] n splits */
enum { IT_ROW0, IT_ROWS, IT_PAST, IT_SEQ, IT_P0, IT_KB, IT_KE, IT_PART };

template <int HD, int QP>
struct att_smem {
    float q[QP][HD + 4];
    __half k[ATT_TK][HD + 8];
    __half v[ATT_TK][HD + 8];
    float s[QP][ATT_TK + 4];
    float m[QP], l[QP], alpha[QP];
};

template <int HD, int QP>
static __global__ void __launch_bounds__(ATT_NT)
attn_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc,
            const int *block_table, const int *items, float *part, int nh, int nkv, int G,
            int max_blocks, int block_size, float qscale) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    att_smem<HD, QP> &sm = *reinterpret_cast<att_smem<HD, QP> *>(smem_raw);
    const int *it = items + blockIdx.x * 8;
    const int row0 = it[IT_ROW0], rows = it[IT_ROWS], past = it[IT_PAST], s = it[IT_SEQ];
    const int p0 = it[IT_P0], kb = it[IT_KB], ke = it[IT_KE], slot = it[IT_PART];
    const int g = blockIdx.y, tid = threadIdx.x;
    const int n_pairs = rows * G;
    const size_t width = (size_t)(nh + 2 * nkv) * HD;
    const int *bt = block_table + (size_t)s * max_blocks;

    /* q tile (scaled), softmax state */
    for (int e = tid; e < QP * HD; e += ATT_NT) {
        int p = e / HD, d = e % HD, gp = p0 + p;
        float v = 0.0f;
        if (gp < n_pairs) {
            int row = row0 + gp / G, h = g * G + gp % G;
            v = __half2float(qkv[(size_t)row * width + (size_t)h * HD + d]) * qscale;
        }
        sm.q[p][d] = v;
    }
    for (int p = tid; p < QP; p += ATT_NT) {
        sm.m[p] = -INFINITY;
        sm.l[p] = 0.0f;
    }

    constexpr int PQ = QP / 8;      /* score phase: pairs per thread */
    constexpr int PO = QP / 4;      /* P.V phase: pairs per thread */
    constexpr int DO = HD / 32;     /* P.V phase: dims per thread */
    constexpr int TPP = ATT_NT / QP;/* softmax: threads per pair */
    const int tq = tid / 16, tk = tid % 16, warp = tid / 32, lane = tid % 32;
    float o[PO][DO];
#pragma unroll
    for (int i = 0; i < PO; i++)
#pragma unroll
        for (int d = 0; d < DO; d++) o[i][d] = 0.0f;

    for (int t0 = kb; t0 < ke; t0 += ATT_TK) {
        __syncthreads(); /* previous tile fully consumed; q/m/l visible */
        /* K and V tiles: 16-byte chunks, zeros past ke */
        for (int e = tid; e < ATT_TK * (HD / 8); e += ATT_NT) {
            int t = e / (HD / 8), dc = e % (HD / 8), ta = t0 + t;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (ta < ke) {
                size_t sl = (size_t)bt[ta / block_size] * block_size + ta % block_size;
                size_t off = (sl * nkv + g) * HD + dc * 8;
                kv4 = *(const uint4 *)(kc + off);
                vv4 = *(const uint4 *)(vc + off);
            }
            *(uint4 *)&sm.k[t][dc * 8] = kv4;
            *(uint4 *)&sm.v[t][dc * 8] = vv4;
        }
        __syncthreads();
        /* scores */
        {
            float acc[PQ][4];
#pragma unroll
            for (int i = 0; i < PQ; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll 2
            for (int d0 = 0; d0 < HD; d0 += 8) {
                float kf[4][8];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint4 raw = *(const uint4 *)&sm.k[tk + 16 * j][d0];
                    const __half2 *h2 = (const __half2 *)&raw;
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        float2 f = __half22float2(h2[u]);
                        kf[j][2 * u] = f.x;
                        kf[j][2 * u + 1] = f.y;
                    }
                }
#pragma unroll
                for (int i = 0; i < PQ; i++) {
                    float4 qa = *(const float4 *)&sm.q[tq + 8 * i][d0];
                    float4 qb = *(const float4 *)&sm.q[tq + 8 * i][d0 + 4];
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] += qa.x * kf[j][0] + qa.y * kf[j][1] + qa.z * kf[j][2] +
                                     qa.w * kf[j][3] + qb.x * kf[j][4] + qb.y * kf[j][5] +
                                     qb.z * kf[j][6] + qb.w * kf[j][7];
                }
            }
#pragma unroll
            for (int i = 0; i < PQ; i++) {
                int p = tq + 8 * i, gp = p0 + p;
                int lim = gp < n_pairs ? past + gp / G : -1; /* last key this pair sees */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int t = tk + 16 * j, ta = t0 + t;
                    sm.s[p][t] = (ta < ke && ta <= lim) ? acc[i][j] : -INFINITY;
                }
            }
        }
        __syncthreads();
        /* online softmax, TPP threads per pair */
        {
            int p = tid / TPP, sub = tid % TPP;
            float mx = -INFINITY;
            for (int t = sub; t < ATT_TK; t += TPP) mx = fmaxf(mx, sm.s[p][t]);
#pragma unroll
            for (int off = TPP / 2; off > 0; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float m_old = sm.m[p];
            float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            if (m_new == -INFINITY) {
                for (int t = sub; t < ATT_TK; t += TPP) sm.s[p][t] = 0.0f;
            } else {
                for (int t = sub; t < ATT_TK; t += TPP) {
                    float e = exp2f(sm.s[p][t] - m_new);
                    sm.s[p][t] = e;
                    sum += e;
                }
            }
#pragma unroll
            for (int off = TPP / 2; off > 0; off >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (sub == 0) {
                float a = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
                sm.alpha[p] = a;
                sm.m[p] = m_new;
                sm.l[p] = sm.l[p] * a + sum;
            }
        }
        __syncthreads();
        /* o = o * alpha + P V */
#pragma unroll
        for (int i = 0; i < PO; i++) {
            float a = sm.alpha[warp + 4 * i];
#pragma unroll
            for (int d = 0; d < DO; d++) o[i][d] *= a;
        }
        int tn = ke - t0 < ATT_TK ? ke - t0 : ATT_TK;
        for (int t = 0; t < tn; t++) {
            float vf[DO];
#pragma unroll
            for (int d = 0; d < DO; d++) vf[d] = __half2float(sm.v[t][lane * DO + d]);
#pragma unroll
            for (int i = 0; i < PO; i++) {
                float pv = sm.s[warp + 4 * i][t];
#pragma unroll
                for (int d = 0; d < DO; d++) o[i][d] += pv * vf[d];
            }
        }
    }
    __syncthreads();
    /* results */
#pragma unroll
    for (int i = 0; i < PO; i++) {
        int p = warp + 4 * i, gp = p0 + p;
        if (gp >= n_pairs) continue;
        if (slot < 0) {
            float l = sm.l[p], inv = l > 0.0f ? 1.0f / l : 0.0f;
            int row = row0 + gp / G, h = g * G + gp % G;
            __half *dst = out + (size_t)row * nh * HD + (size_t)h * HD + lane * DO;
#pragma unroll
            for (int d = 0; d < DO; d++) dst[d] = __float2half(o[i][d] * inv);
        } else {
            float *pp = part + (((size_t)slot * nkv + g) * QP + p) * (HD + 2);
#pragma unroll
            for (int d = 0; d < DO; d++) pp[lane * DO + d] = o[i][d];
            if (lane == 0) {
                pp[HD] = sm.m[p];
                pp[HD + 1] = sm.l[p];
            }
        }
    }
}

/* Merges the split partials of one group of pairs: grid (groups, nkv). */
template <int HD, int QP>
static __global__ void attn_combine_kernel(__half *out, const float *part, const int *groups,
                                           int nh, int nkv, int G) {
    const int *gr = groups + blockIdx.x * 8;
    const int row0 = gr[0], rows = gr[1], p0 = gr[2], slot0 = gr[3], ns = gr[4];
    const int g = blockIdx.y, n_pairs = rows * G;
    for (int e = threadIdx.x; e < QP * HD; e += blockDim.x) {
        int p = e / HD, d = e % HD, gp = p0 + p;
        if (gp >= n_pairs) continue;
        float M = -INFINITY;
        for (int k = 0; k < ns; k++)
            M = fmaxf(M, part[(((size_t)(slot0 + k) * nkv + g) * QP + p) * (HD + 2) + HD]);
        float L = 0.0f, acc = 0.0f;
        for (int k = 0; k < ns; k++) {
            const float *pp = part + (((size_t)(slot0 + k) * nkv + g) * QP + p) * (HD + 2);
            float m = pp[HD];
            if (m == -INFINITY) continue;
            float w = exp2f(m - M);
            L += w * pp[HD + 1];
            acc += w * pp[d];
        }
        int row = row0 + gp / G, h = g * G + gp % G;
        out[(size_t)row * nh * HD + (size_t)h * HD + d] = __float2half(L > 0.0f ? acc / L : 0.0f);
    }
}

/* ------------------------------------------------------------------------ */
/* host side                                                                 */
/* ------------------------------------------------------------------------ */

void ops_cuda__attn_free(struct cuda_attn *a) {
    if (a->h_items) cudaFreeHost(a->h_items);
    if (a->h_comb) cudaFreeHost(a->h_comb);
    cudaFree(a->d_items);
    cudaFree(a->d_comb);
    cudaFree(a->d_part);
    if (a->uploaded) cudaEventDestroy(a->uploaded);
    free(a->key_q_start);
    free(a->key_past);
    memset(a, 0, sizeof *a);
}

/* Grows a pinned + device int array pair to hold n * 8 ints. */
static int grow_pair(struct cuda_ctx *c, int **h, int **d, int *cap, int n) {
    if (n <= *cap) return 0;
    int nc = *cap ? *cap : 64;
    while (nc < n) nc *= 2;
    CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
    if (*h) cudaFreeHost(*h);
    cudaFree(*d);
    *h = NULL;
    *d = NULL;
    *cap = 0;
    CUDA_CHECK(cudaMallocHost((void **)h, (size_t)nc * 8 * sizeof(int)), NULL, 0);
    CUDA_CHECK(cudaMalloc((void **)d, (size_t)nc * 8 * sizeof(int)), NULL, 0);
    *cap = nc;
    return 0;
}

static int same_key(const struct cuda_attn *a, const struct attn_batch *ab, int nh, int nkv,
                    int hd) {
    if (!a->key_valid || a->key_nh != nh || a->key_nkv != nkv || a->key_hd != hd ||
        a->key_n_seqs != ab->n_seqs || a->key_n_rows != ab->n_rows)
        return 0;
    return !memcmp(a->key_q_start, ab->h_q_start, ((size_t)ab->n_seqs + 1) * sizeof(int32_t)) &&
           !memcmp(a->key_past, ab->h_past, (size_t)ab->n_seqs * sizeof(int32_t));
}

/* Builds and uploads the work list for this batch geometry. */
static int build_list(struct cuda_ctx *c, const struct attn_batch *ab, int nh, int nkv, int hd) {
    struct cuda_attn *a = &c->attn;
    const int G = nh / nkv, S = ab->n_seqs;
    const int32_t *qs = ab->h_q_start, *past = ab->h_past;
    int max_pairs = 0;
    for (int s = 0; s < S; s++) {
        AWQD_ASSERT(qs[s] <= qs[s + 1] && past[s] >= 0);
        int np = (qs[s + 1] - qs[s]) * G;
        if (np > max_pairs) max_pairs = np;
    }
    const int QP = max_pairs <= 8 ? 8 : 32;
    /* tiles and their key ends */
    int n_tiles = 0;
    for (int s = 0; s < S; s++) n_tiles += ((qs[s + 1] - qs[s]) * G + QP - 1) / QP;
    int target = 2 * c->n_sms;          /* CTAs that keep every SM busy */
    int want = n_tiles * nkv >= target ? 1 : (target + n_tiles * nkv - 1) / (n_tiles * nkv);
    /* count items / groups / partial slots */
    int n_items = 0, n_comb = 0, n_slots = 0;
    for (int pass = 0; pass < 2; pass++) {
        n_items = n_comb = n_slots = 0;
        for (int s = 0; s < S; s++) {
            int rows = qs[s + 1] - qs[s], np = rows * G;
            for (int p0 = 0; p0 < np; p0 += QP) {
                int last = (p0 + QP < np ? p0 + QP : np) - 1;
                int kend = past[s] + last / G + 1;
                int nkt = (kend + ATT_TK - 1) / ATT_TK;
                int per = want > 1 ? (nkt + want - 1) / want : nkt;
                if (per < ATT_MIN_SPLIT_TILES) per = ATT_MIN_SPLIT_TILES;
                int ns = (nkt + per - 1) / per;
                if (ns < 1) ns = 1;
                for (int k = 0; k < ns; k++) {
                    if (pass) {
                        int *it = a->h_items + (size_t)n_items * 8;
                        it[IT_ROW0] = qs[s];
                        it[IT_ROWS] = rows;
                        it[IT_PAST] = past[s];
                        it[IT_SEQ] = s;
                        it[IT_P0] = p0;
                        it[IT_KB] = k * per * ATT_TK;
                        it[IT_KE] = (k + 1) * per * ATT_TK < kend ? (k + 1) * per * ATT_TK : kend;
                        it[IT_PART] = ns > 1 ? n_slots + k : -1;
                    }
                    n_items++;
                }
                if (ns > 1) {
                    if (pass) {
                        int *gr = a->h_comb + (size_t)n_comb * 8;
                        gr[0] = qs[s];
                        gr[1] = rows;
                        gr[2] = p0;
                        gr[3] = n_slots;
                        gr[4] = ns;
                    }
                    n_comb++;
                    n_slots += ns;
                }
            }
        }
        if (!pass) {
            /* the previous upload must be done before the pinned arrays change */
            CUDA_CHECK(cudaEventSynchronize(a->uploaded), NULL, 0);
            int rc = grow_pair(c, &a->h_items, &a->d_items, &a->cap_items, n_items);
            if (!rc) rc = grow_pair(c, &a->h_comb, &a->d_comb, &a->cap_comb, n_comb > 0 ? n_comb : 1);
            if (rc) return rc;
            size_t pb = (size_t)n_slots * nkv * QP * (hd + 2) * sizeof(float);
            if (pb > a->part_bytes) {
                CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
                cudaFree(a->d_part);
                a->d_part = NULL;
                a->part_bytes = 0;
                CUDA_CHECK(cudaMalloc((void **)&a->d_part, pb), NULL, 0);
                a->part_bytes = pb;
            }
        }
    }
    CUDA_CHECK(cudaMemcpyAsync(a->d_items, a->h_items, (size_t)n_items * 8 * sizeof(int),
                               cudaMemcpyHostToDevice, c->stream),
               NULL, 0);
    if (n_comb)
        CUDA_CHECK(cudaMemcpyAsync(a->d_comb, a->h_comb, (size_t)n_comb * 8 * sizeof(int),
                                   cudaMemcpyHostToDevice, c->stream),
                   NULL, 0);
    CUDA_CHECK(cudaEventRecord(a->uploaded, c->stream), NULL, 0);
    a->n_items = n_items;
    a->n_comb = n_comb;
    a->qp = QP;
    /* remember the geometry */
    if (S > a->cap_key) {
        free(a->key_q_start);
        free(a->key_past);
        a->key_q_start = (int32_t *)malloc(((size_t)S + 1) * sizeof(int32_t));
        a->key_past = (int32_t *)malloc((size_t)S * sizeof(int32_t));
        if (!a->key_q_start || !a->key_past) {
            a->cap_key = 0;
            a->key_valid = 0;
            return 0;
        }
        a->cap_key = S;
    }
    memcpy(a->key_q_start, qs, ((size_t)S + 1) * sizeof(int32_t));
    memcpy(a->key_past, past, (size_t)S * sizeof(int32_t));
    a->key_nh = nh;
    a->key_nkv = nkv;
    a->key_hd = hd;
    a->key_n_seqs = S;
    a->key_n_rows = ab->n_rows;
    a->key_valid = 1;
    return 0;
}

template <int HD, int QP>
static void launch(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                   const __half *vc, const int *bt, int nh, int nkv, const struct attn_batch *ab,
                   float qscale) {
    struct cuda_attn *a = &c->attn;
    size_t smem = sizeof(att_smem<HD, QP>);
    cudaFuncSetAttribute(attn_kernel<HD, QP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)smem);
    dim3 grid(a->n_items, nkv);
    attn_kernel<HD, QP><<<grid, ATT_NT, smem, c->stream>>>(
        out, qkv, kc, vc, bt, a->d_items, a->d_part, nh, nkv, nh / nkv, ab->max_blocks,
        ab->block_size, qscale);
    OPS_CUDA_LAUNCHED(c, "attention");
    if (a->n_comb) {
        dim3 g2(a->n_comb, nkv);
        attn_combine_kernel<HD, QP><<<g2, 256, 0, c->stream>>>(out, a->d_part, a->d_comb, nh,
                                                               nkv, nh / nkv);
        OPS_CUDA_LAUNCHED(c, "attention combine");
    }
}

template <int HD>
static void launch_hd(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                      const __half *vc, const int *bt, int nh, int nkv,
                      const struct attn_batch *ab, float qscale) {
    if (c->attn.qp == 8) launch<HD, 8>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
    else launch<HD, 32>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
}

void ops_cuda__attention(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                         int nkv, int hd, float scale, const struct attn_batch *ab,
                         const struct buf *k_cache, const struct buf *v_cache) {
    AWQD_ASSERT(nkv > 0 && nh % nkv == 0);
    AWQD_ASSERT(hd == 32 || hd == 64 || hd == 128 || hd == 256);
    AWQD_ASSERT(out->n >= (size_t)ab->n_rows * nh * hd);
    AWQD_ASSERT(qkv->n >= (size_t)ab->n_rows * (nh + 2 * nkv) * hd);
    AWQD_ASSERT(ab->h_q_start[ab->n_seqs] == ab->n_rows);
    for (int s = 0; s < ab->n_seqs; s++) {
        int ctx_len = ab->h_past[s] + ab->h_q_start[s + 1] - ab->h_q_start[s];
        AWQD_ASSERT((ctx_len + ab->block_size - 1) / ab->block_size <= ab->max_blocks);
    }
    if (ab->n_rows <= 0) return;
    if (c->rc) return;
    if (!same_key(&c->attn, ab, nh, nkv, hd)) {
        int rc = build_list(c, ab, nh, nkv, hd);
        if (rc) {
            c->attn.key_valid = 0;
            ops_cuda__fail(c, rc, "attention", "cannot build the work list");
            return;
        }
    }
    const float qscale = scale * 1.4426950408889634f; /* exp2 domain */
    __half *o = (__half *)out->d;
    const __half *q = (const __half *)qkv->d, *kc = (const __half *)k_cache->d,
                 *vc = (const __half *)v_cache->d;
    const int *bt = (const int *)ab->block_table->d;
    switch (hd) {
    case 32: launch_hd<32>(c, o, q, kc, vc, bt, nh, nkv, ab, qscale); break;
    case 64: launch_hd<64>(c, o, q, kc, vc, bt, nh, nkv, ab, qscale); break;
    case 128: launch_hd<128>(c, o, q, kc, vc, bt, nh, nkv, ab, qscale); break;
    default: launch_hd<256>(c, o, q, kc, vc, bt, nh, nkv, ab, qscale); break;
    }
}
