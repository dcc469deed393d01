/* attn.cu — causal attention over the paged KV cache, one kernel for prefill,
 * chunked prefill, decode and mixed batches: tiled flash attention with
 * split-K (flash-decoding) over long contexts.
 *
 * Work decomposition. For KV head g of sequence s, the "pairs" are (row,
 * query head of g's group) of that sequence's new rows, row-major: pair p is
 * row p / G, head g * G + p % G (G = nh / nkv). A CTA takes QP consecutive
 * pairs (so all G query heads of a KV head share every K/V tile it loads:
 * each KV head is read once per group) and a range [kb, ke) of key
 * positions; the grid is (work items, nkv) (the FA kernel: work items x nkv
 * in one dimension, the KV head fastest). When the items are too few to
 * fill the GPU (decode, short batches) the key range of each tile is split
 * and a second kernel merges the partial softmax states.
 *
 * The work list (8 ints per item) is built on the host from ab->h_q_start /
 * h_past, uploaded once and reused while the batch geometry is unchanged
 * (every layer of one forward).
 *
 * Kernels. Prefill, chunked prefill and mixed batches with hd <= 128 run
 * attn_fa_kernel (FA2 style, 4 warps x 32 pairs = QP 128; see its comment),
 * its items sorted longest first over all sequences, items longer than
 * 125 % of the mean work per CTA slot split for causal balance, partials
 * merged by attn_combine_fa_kernel; both launched with programmatic
 * dependent launch when the context has it (the FA kernel lets the next one
 * launch after its main loop). Measured on an H100, Qwen3-8B heads (32 / 8
 * x 128), one sequence, graph_cuda.bench_prefill_attention, us per call
 * (causal TFLOP/s), old kernel -> FA kernel:
 *   128 rows           55.2 (2)     -> 13.6 (10)
 *   1024 rows          164.5 (52)   -> 56.4 (152)
 *   4096 rows          1591.7 (86)  -> 483.3 (284)
 *   1024 after 3072    773.0 (78)   -> 228.8 (263)
 * AWQD_ATTN_TC=old selects the previous tensor-core kernel (attn_tc_kernel,
 * 4 warps x 16 pairs) and =2 the FA kernel with 2 warps (64 pairs: 2 CTAs
 * per SM, too few warps: 72 us at 1024 rows), for A/B timing; read at each
 * work-list build.
 * Decode batches (<= 8 pairs per sequence) and hd 256 use the SIMT kernel:
 *
 * SIMT kernel (128 threads, TK = 64 keys per tile):
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

#include "kernels/cuda/attn_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops_cuda_internal.h"

extern "C" {
#include "engine/util.h"
}

#define ATT_NT 128
#define ATT_TK 64
#define ATT_MIN_SPLIT_TILES 1   /* a split covers at least this many key tiles */

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

    /* K and V tiles stream in with cp.async, one group each, so the next
     * tile's K loads while this tile's softmax and P.V run, and V while the
     * scores run: wait_group 1 always leaves exactly the newest group pending */
    auto load = [&](__half (*dst)[HD + 8], const __half *cache, int t0) {
        if (t0 < ke)
            kv_tile_load<HD, ATT_TK, ATT_NT>(dst, cache, tid, t0, ke, bt, block_size, nkv, g); /* keys >= ke zero-filled */
        cp_async_commit();
    };
    load(sm.k, kc, kb);
    load(sm.v, vc, kb);
    for (int t0 = kb; t0 < ke; t0 += ATT_TK) {
        cp_async_wait1(); /* K(t0) landed */
        __syncthreads();  /* ... for every thread; q/m/l visible */
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
        load(sm.k, kc, t0 + ATT_TK); /* K is free: fetch the next tile */
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
        cp_async_wait1(); /* V(t0) landed */
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
        __syncthreads();             /* V and S consumed */
        load(sm.v, vc, t0 + ATT_TK); /* the next tile's V */
    }
    cp_async_wait0();
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


/* ------------------------------------------------------------------------ */
/* Tensor-core variant for prefill (QP = 64 pairs, HD <= 128): each of the 4
 * warps owns 16 pairs (the M of mma.m16n8k16); S = Q K^T and O += P V run on
 * mma.sync with fp32 accumulators, the online softmax stays in registers
 * (FA2 layout: the S accumulator of 2 key n-tiles is the A fragment of P).
 * V's B fragments come from ldmatrix.trans of the [key][d] tile. Same work
 * items, split-K partials and combine kernel as the SIMT kernel. */
#define ATT_TC_QP 64

template <int HD>
struct att_tc_smem {
    __half k[ATT_TK][HD + 8];
    __half v[ATT_TK][HD + 8];
};

template <int HD>
static __global__ void __launch_bounds__(ATT_NT)
attn_tc_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc,
               const int *block_table, const int *items, float *part, int nh, int nkv, int G,
               int max_blocks, int block_size, float qscale) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    att_tc_smem<HD> &sm = *reinterpret_cast<att_tc_smem<HD> *>(smem_raw);
    const int *it = items + blockIdx.x * 8;
    const int row0 = it[IT_ROW0], rows = it[IT_ROWS], past = it[IT_PAST], s = it[IT_SEQ];
    const int p0 = it[IT_P0], kb = it[IT_KB], ke = it[IT_KE], slot = it[IT_PART];
    const int g = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gq = lane >> 2, tq = lane & 3; /* mma group / thread in group */
    const int n_pairs = rows * G;
    const size_t width = (size_t)(nh + 2 * nkv) * HD;
    const int *bt = block_table + (size_t)s * max_blocks;
    constexpr int KS = HD / 16;  /* k-steps of Q K^T */
    constexpr int NT = ATT_TK / 8; /* key n-tiles per tile */
    constexpr int DT = HD / 8;   /* d n-tiles of O */

    /* this thread's two pairs: rows gq and gq + 8 of the warp's 16 */
    int pr[2], lim[2];
    const __half *qp[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int gp = p0 + warp * 16 + gq + 8 * h;
        pr[h] = gp;
        lim[h] = gp < n_pairs ? past + gp / G : -1;
        qp[h] = gp < n_pairs
                    ? qkv + (size_t)(row0 + gp / G) * width + (size_t)(g * G + gp % G) * HD
                    : NULL;
    }
    /* Q fragments (A, row-major 16 x HD) */
    unsigned qa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; k++) {
        int d = k * 16 + 2 * tq;
        qa[k][0] = qp[0] ? *(const unsigned *)(qp[0] + d) : 0u;
        qa[k][1] = qp[1] ? *(const unsigned *)(qp[1] + d) : 0u;
        qa[k][2] = qp[0] ? *(const unsigned *)(qp[0] + d + 8) : 0u;
        qa[k][3] = qp[1] ? *(const unsigned *)(qp[1] + d + 8) : 0u;
    }
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

    auto load = [&](__half (*dst)[HD + 8], const __half *cache, int t0) {
        if (t0 < ke)
            kv_tile_load<HD, ATT_TK, ATT_NT>(dst, cache, tid, t0, ke, bt, block_size, nkv, g); /* keys >= ke zero-filled */
        cp_async_commit();
    };
    load(sm.k, kc, kb);
    load(sm.v, vc, kb);
    const bool active = p0 + warp * 16 < n_pairs; /* this warp has a valid pair */
    for (int t0 = kb; t0 < ke; t0 += ATT_TK) {
        cp_async_wait1();
        __syncthreads();
        /* S = Q K^T (16 pairs x 64 keys per warp) */
        float sc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if (!active) break;
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const __half *kr = &sm.k[j * 8 + gq][2 * tq];
#pragma unroll
            for (int k = 0; k < KS; k++) {
                unsigned b0 = *(const unsigned *)(kr + k * 16);
                unsigned b1 = *(const unsigned *)(kr + k * 16 + 8);
                mma16816(sc[j], qa[k], b0, b1);
            }
        }
        __syncthreads();
        load(sm.k, kc, t0 + ATT_TK);
        /* mask, online softmax (rows gq: elements 0,1; gq + 8: elements 2,3) */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int h = e >> 1, ta = t0 + j * 8 + 2 * tq + (e & 1);
                sc[j][e] = (ta < ke && ta <= lim[h]) ? sc[j][e] * qscale : -INFINITY;
            }
        online_softmax_tile<NT, DT>(sc, mrow, lrow, o);
        cp_async_wait1();
        __syncthreads();
        /* O += P V: P's A fragments are the S accumulators of key tiles 2kk, 2kk+1 */
#pragma unroll
        for (int kk = 0; kk < ATT_TK / 16; kk++) {
            if (!active) break;
            unsigned pa[4];
            pa[0] = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            pv_mma16<DT, HD>(o, pa, sm.v, kk * 16, lane);
        }
        __syncthreads();
        load(sm.v, vc, t0 + ATT_TK);
    }
    cp_async_wait0();
    /* results: O rows gq (o[.][0..1]) and gq + 8 (o[.][2..3]), dims j*8 + 2tq */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int gp = pr[h];
        if (gp >= n_pairs) continue;
        int p = warp * 16 + gq + 8 * h; /* pair index within the tile */
        if (slot < 0) {
            float inv = lrow[h] > 0.0f ? 1.0f / lrow[h] : 0.0f;
            int row = row0 + gp / G, hh = g * G + gp % G;
            __half *dst = out + (size_t)row * nh * HD + (size_t)hh * HD;
#pragma unroll
            for (int j = 0; j < DT; j++)
                *(__half2 *)(dst + j * 8 + 2 * tq) =
                    __floats2half2_rn(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
        } else {
            float *pp = part + (((size_t)slot * nkv + g) * ATT_TC_QP + p) * (HD + 2);
#pragma unroll
            for (int j = 0; j < DT; j++) {
                pp[j * 8 + 2 * tq] = o[j][2 * h];
                pp[j * 8 + 2 * tq + 1] = o[j][2 * h + 1];
            }
            if (tq == 0) {
                pp[HD] = mrow[h];
                pp[HD + 1] = lrow[h];
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* FA2-style tensor-core kernel for prefill (the default for hd <= 128; the
 * kernel above stays behind AWQD_ATTN_TC=old for A/B timing). NW warps, each
 * owning 32 pairs as two m16 tiles, so every K / V B fragment read from
 * shared memory feeds two MMAs; QP = 32 NW pairs per CTA (128 for NW = 4:
 * 32 rows x 4 heads at G = 4).
 *   q     fp16 [QP][HD + 8]        unscaled, A fragments by ldmatrix per k-step
 *   k, v  fp16 [2][TK][HD + 8]     two stages: tile t + 1 is copied while
 *                                  tile t is computed (one __syncthreads per tile)
 *   o     fp32 [2][HD / 8][4] per thread (registers), S [2][TK / 8][4]
 * K's B fragments come from ldmatrix of the [key][d] tile, V's from
 * ldmatrix.trans. A warp skips the math of a key tile that is masked for all
 * its pairs (past their causal limit) and of a tile with no valid pair; the
 * mask is evaluated only on the tiles that need it (the diagonal, the end of
 * a split). Softmax in registers with the scale inside ex2.approx, the row
 * sums reduced across the quad only at the end, O rescaled only when a max
 * moved. 255 registers (a few bytes spilled, outside the MMA loops), 104 KB
 * shared at HD 128: 2 CTAs per SM. Same work items (with QP) and split-K
 * partials as the other kernels, merged by attn_combine_fa_kernel. ncu at
 * 1024 rows (before the balance split): issue slots 21 % busy, 1.5 warps
 * per scheduler, mostly latency-bound; a wgmma kernel is the next step. */
template <int HD, int NW>
struct att_fa_smem {
    __half q[NW * 32][HD + 8];
    __half k[2][ATT_TK][HD + 8];
    __half v[2][ATT_TK][HD + 8];
};

static __device__ __forceinline__ void ldsm_x4(unsigned *r, const void *p) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa));
}
static __device__ __forceinline__ void ldsm_x4_t(unsigned *r, const void *p) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sa));
}

static __device__ __forceinline__ float fast_ex2(float x) { /* 2^x, -inf -> 0 */
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* One online-softmax step over a key tile of raw scores sc[NJ][4] (the
 * MMA accumulators, -INFINITY = masked) of one m16 tile; qscale = scale *
 * log2(e) is applied inside the exponent. The thread's rows gq (elements
 * 0, 1) and gq + 8 (2, 3): running max mrow[2] (scaled, quad-uniform) and
 * this thread's share of the row sum lrow[2] (the quad's shares are added at
 * the end); sc becomes P = 2^(s qscale - max). Returns in alpha[2] the
 * factors the output rows must be scaled by (1 when the max held). Max and
 * sum reduce as trees (short dependency chains). */
template <int NJ>
static __device__ __forceinline__ void fa_softmax_tile(float (*sc)[4], float *mrow, float *lrow,
                                                       float *alpha, float qscale) {
    static_assert(NJ % 4 == 0, "NJ");
    float mx[2][4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        mx[0][u] = fmaxf(sc[u][0], sc[u][1]);
        mx[1][u] = fmaxf(sc[u][2], sc[u][3]);
    }
#pragma unroll
    for (int j = 4; j < NJ; j++) {
        mx[0][j & 3] = fmaxf(mx[0][j & 3], fmaxf(sc[j][0], sc[j][1]));
        mx[1][j & 3] = fmaxf(mx[1][j & 3], fmaxf(sc[j][2], sc[j][3]));
    }
    float mb[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float m = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        float mn = fmaxf(mrow[h], m * qscale);
        mb[h] = mn == -INFINITY ? 0.0f : mn; /* all masked so far: every p is 0 */
        alpha[h] = fast_ex2(mrow[h] - mb[h]);  /* -inf - finite -> 0; o, l are 0 then */
        mrow[h] = mn;
    }
    float sum[2][4];
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int h = e >> 1;
            float pv = fast_ex2(fmaf(sc[j][e], qscale, -mb[h]));
            sc[j][e] = pv;
            int u = (j & 1) * 2 + (e & 1);
            sum[h][u] = j < 2 ? pv : sum[h][u] + pv;
        }
#pragma unroll
    for (int h = 0; h < 2; h++)
        lrow[h] = lrow[h] * alpha[h] + ((sum[h][0] + sum[h][1]) + (sum[h][2] + sum[h][3]));
}

template <int HD, int NW>
static __global__ void __launch_bounds__(NW * 32, 8 / NW)
attn_fa_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc,
               const int *block_table, const int *items, float *part, int nh, int nkv, int G,
               int max_blocks, int block_size, float qscale, int late_trigger) {
    constexpr int NT = NW * 32, QP = NW * 32;
    constexpr int MT = 2;           /* m16 tiles per score pass (see there) */
    constexpr int KS = HD / 16;     /* k-steps of Q K^T */
    constexpr int NJ = ATT_TK / 8;  /* key n-tiles per tile */
    constexpr int DT = HD / 8;      /* d n-tiles of O */
    constexpr int CK = HD / 8;      /* 16-byte chunks per key / pair */
    constexpr int KPP = NT / CK;    /* keys per loader pass */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    att_fa_smem<HD, NW> &sm = *reinterpret_cast<att_fa_smem<HD, NW> *>(smem_raw);
    ops_cuda_pdl_wait(); /* q and the KV cache come from the previous kernel */
    if (!late_trigger) ops_cuda_pdl_trigger();
    /* 1-D grid, the KV head fastest: CTAs start in work-list order over all
     * heads (the longest tiles first) */
    const int *it = items + (blockIdx.x / nkv) * 8;
    const int row0 = it[IT_ROW0], rows = it[IT_ROWS], past = it[IT_PAST], s = it[IT_SEQ];
    const int p0 = it[IT_P0], kb = it[IT_KB], ke = it[IT_KE], slot = it[IT_PART];
    const int g = blockIdx.x % nkv, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gq = lane >> 2, tq = lane & 3;
    const int n_pairs = rows * G;
    const size_t width = (size_t)(nh + 2 * nkv) * HD;
    const int *bt = block_table + (size_t)s * max_blocks;

    /* Q tile, pairs past the end zero-filled */
    for (int e = tid; e < QP * CK; e += NT) {
        int p = e / CK, c = e % CK, gp = p0 + p;
        const __half *src = qkv;
        int bytes = 0;
        if (gp < n_pairs) {
            src = qkv + (size_t)(row0 + gp / G) * width + (size_t)(g * G + gp % G) * HD + c * 8;
            bytes = 16;
        }
        cp_async16(&sm.q[p][c * 8], src, bytes);
    }
    /* K and V of key tile t0 into stage st: a warp copies whole keys (HD / 8
     * 16-byte chunks each, one slot lookup per key for K and V); block sizes
     * that are powers of two (the usual 16) divide by shifts; keys >= ke are
     * zero-filled (P is 0 there, V must be finite). (One key per thread, its
     * TPK threads covering 32-byte sectors, measured 12 % slower.) */
    const __half *kcg = kc + (size_t)g * HD + (tid % CK) * 8, *vcg = vc + (size_t)g * HD + (tid % CK) * 8;
    const int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    auto load_kv = [&](int st, int t0) {
#pragma unroll
        for (int i = 0; i < ATT_TK / KPP; i++) {
            int t = tid / CK + i * KPP, ta = t0 + t, bytes = 0;
            size_t off = 0;
            if (ta < ke) {
                int blk = bs_shift >= 0 ? ta >> bs_shift : ta / block_size;
                int in = ta - blk * block_size;
                off = ((size_t)bt[blk] * block_size + in) * nkv * HD;
                bytes = 16;
            }
            cp_async16(&sm.k[st][t][(tid % CK) * 8], kcg + off, bytes);
            cp_async16(&sm.v[st][t][(tid % CK) * 8], vcg + off, bytes);
        }
    };
    load_kv(0, kb);
    cp_async_commit();

    const int wp0 = p0 + warp * 32; /* the warp's first pair */
    const bool active = wp0 < n_pairs;
    const int wlast = (wp0 + 31 < n_pairs ? wp0 + 31 : n_pairs - 1);
    const int wmin_lim = past + wp0 / G, wmax_lim = active ? past + wlast / G : -1;
    float o[2][DT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int j = 0; j < DT; j++) o[m][j][0] = o[m][j][1] = o[m][j][2] = o[m][j][3] = 0.0f;
    float mrow[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
    float lrow[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};

    int st = 0;
    for (int t0 = kb; t0 < ke; t0 += ATT_TK, st ^= 1) {
        cp_async_wait0(); /* tile t0 (and Q) landed for this thread ... */
        __syncthreads();  /* ... for all; stage st ^ 1 is no longer read */
        if (t0 + ATT_TK < ke) load_kv(st ^ 1, t0 + ATT_TK);
        cp_async_commit();
        if (!active || t0 > wmax_lim) continue; /* nothing this warp sees */
        /* S = Q K^T, softmax, P: MT m16 tiles per pass (MT = 2: each K
         * fragment feeds two MMAs; MT = 1, half the score registers with K
         * read twice, measured 2-5 % slower on an H100) */
        float alpha[2][2];
        unsigned pa[2][ATT_TK / 16][4]; /* P as fp16 A fragments (keys 16 kk .. +15) */
#pragma unroll
        for (int ps = 0; ps < 2 / MT; ps++) {
            float sc[MT][NJ][4];
#pragma unroll
            for (int mm = 0; mm < MT; mm++)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    sc[mm][j][0] = sc[mm][j][1] = sc[mm][j][2] = sc[mm][j][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                unsigned qa[MT][4];
#pragma unroll
                for (int mm = 0; mm < MT; mm++)
                    ldsm_x4(qa[mm], &sm.q[warp * 32 + (ps * MT + mm) * 16 + (lane & 15)][k * 16 + (lane >> 4) * 8]);
#pragma unroll
                for (int j = 0; j < NJ; j += 2) {
                    unsigned b[4]; /* n-tile j: b0 b1, j + 1: b2 b3 */
                    ldsm_x4(b, &sm.k[st][j * 8 + (lane & 7) + (lane >> 4) * 8][k * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
                    for (int mm = 0; mm < MT; mm++) {
                        mma16816(sc[mm][j], qa[mm], b[0], b[1]);
                        mma16816(sc[mm][j + 1], qa[mm], b[2], b[3]);
                    }
                }
            }
            if (t0 + ATT_TK > ke || t0 + ATT_TK - 1 > wmin_lim) { /* diagonal / split end */
#pragma unroll
                for (int mm = 0; mm < MT; mm++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int gp = wp0 + (ps * MT + mm) * 16 + gq + 8 * h; /* keys > lim masked */
                        int lim = gp < n_pairs ? past + gp / G : -1;
                        lim = lim < ke - 1 ? lim : ke - 1;
#pragma unroll
                        for (int j = 0; j < NJ; j++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                if (t0 + j * 8 + 2 * tq + e > lim) sc[mm][j][2 * h + e] = -INFINITY;
                    }
            }
#pragma unroll
            for (int mm = 0; mm < MT; mm++) {
                const int m = ps * MT + mm;
                fa_softmax_tile<NJ>(sc[mm], mrow[m], lrow[m], alpha[m], qscale);
#pragma unroll
                for (int kk = 0; kk < ATT_TK / 16; kk++) {
                    pa[m][kk][0] = pack_half2(sc[mm][2 * kk][0], sc[mm][2 * kk][1]);
                    pa[m][kk][1] = pack_half2(sc[mm][2 * kk][2], sc[mm][2 * kk][3]);
                    pa[m][kk][2] = pack_half2(sc[mm][2 * kk + 1][0], sc[mm][2 * kk + 1][1]);
                    pa[m][kk][3] = pack_half2(sc[mm][2 * kk + 1][2], sc[mm][2 * kk + 1][3]);
                }
            }
        }
        /* rescale O only when some row's max moved (rare after the first tiles) */
        if (__any_sync(0xffffffffu, alpha[0][0] != 1.0f || alpha[0][1] != 1.0f ||
                                        alpha[1][0] != 1.0f || alpha[1][1] != 1.0f)) {
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < DT; j++) {
                    o[m][j][0] *= alpha[m][0];
                    o[m][j][1] *= alpha[m][0];
                    o[m][j][2] *= alpha[m][1];
                    o[m][j][3] *= alpha[m][1];
                }
        }
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < ATT_TK / 16; kk++) {
#pragma unroll
            for (int j = 0; j < DT; j += 2) {
                unsigned b[4]; /* d n-tile j: b0 b1, j + 1: b2 b3 */
                ldsm_x4_t(b, &sm.v[st][kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][j * 8 + (lane >> 4) * 8]);
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    mma16816(o[m][j], pa[m][kk], b[0], b[1]);
                    mma16816(o[m][j + 1], pa[m][kk], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait0();
    /* the next kernel may launch now (only the stores below remain): a
     * trigger at the start let it take the slots of our early-finishing CTAs,
     * two of its longest CTAs on one SM */
    if (late_trigger) ops_cuda_pdl_trigger();
    /* the row sums were kept per thread: add the quad's */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            lrow[m][h] += __shfl_xor_sync(0xffffffffu, lrow[m][h], 1);
            lrow[m][h] += __shfl_xor_sync(0xffffffffu, lrow[m][h], 2);
        }
    /* results: O rows gq (o[.][.][0..1]) and gq + 8 (o[.][.][2..3]), dims j*8 + 2tq */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int p = warp * 32 + m * 16 + gq + 8 * h, gp = p0 + p;
            if (gp >= n_pairs) continue;
            if (slot < 0) {
                float inv = lrow[m][h] > 0.0f ? 1.0f / lrow[m][h] : 0.0f;
                int row = row0 + gp / G, hh = g * G + gp % G;
                __half *dst = out + (size_t)row * nh * HD + (size_t)hh * HD;
#pragma unroll
                for (int j = 0; j < DT; j++)
                    *(__half2 *)(dst + j * 8 + 2 * tq) =
                        __floats2half2_rn(o[m][j][2 * h] * inv, o[m][j][2 * h + 1] * inv);
            } else {
                float *pp = part + (((size_t)slot * nkv + g) * QP + p) * (HD + 2);
#pragma unroll
                for (int j = 0; j < DT; j++)
                    *(float2 *)(pp + j * 8 + 2 * tq) = make_float2(o[m][j][2 * h], o[m][j][2 * h + 1]);
                if (tq == 0) {
                    pp[HD] = mrow[m][h];
                    pp[HD + 1] = lrow[m][h];
                }
            }
        }
}

/* Merges the split partials of the FA kernel: one warp per pair, grid
 * (QP / 4, groups, nkv) x 128 threads; the split weights 2^(m_k - M) are
 * computed once per pair and the partial rows read coalesced. */
template <int HD, int QP>
static __global__ void __launch_bounds__(128)
attn_combine_fa_kernel(__half *out, const float *part, const int *groups, int nh, int nkv, int G) {
    ops_cuda_pdl_wait(); /* the partials come from the previous kernel */
    ops_cuda_pdl_trigger();
    const int *gr = groups + blockIdx.y * 8;
    const int row0 = gr[0], rows = gr[1], p0 = gr[2], slot0 = gr[3], ns = gr[4];
    const int g = blockIdx.z, lane = threadIdx.x & 31;
    const int p = blockIdx.x * 4 + (threadIdx.x >> 5), gp = p0 + p;
    if (gp >= rows * G) return;
    const size_t stride = (size_t)nkv * QP * (HD + 2); /* between slots */
    const float *pp = part + (((size_t)slot0 * nkv + g) * QP + p) * (HD + 2);
    float M = -INFINITY;
    for (int k = lane; k < ns; k += 32) M = fmaxf(M, pp[k * stride + HD]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    float L = 0.0f, acc[HD / 32];
#pragma unroll
    for (int i = 0; i < HD / 32; i++) acc[i] = 0.0f;
    if (M != -INFINITY) {
        for (int k = lane; k < ns; k += 32) {
            float m = pp[k * stride + HD];
            if (m != -INFINITY) L += exp2f(m - M) * pp[k * stride + HD + 1];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
        for (int k = 0; k < ns; k++) {
            const float *q = pp + k * stride;
            float m = q[HD];
            if (m == -INFINITY) continue;
            float w = exp2f(m - M);
#pragma unroll
            for (int i = 0; i < HD / 32; i++) acc[i] += w * q[lane + 32 * i];
        }
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    __half *dst = out + (size_t)(row0 + gp / G) * nh * HD + (size_t)(g * G + gp % G) * HD;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) dst[lane + 32 * i] = __float2half(acc[i] * inv);
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

/* The tensor-core prefill kernel for hd <= 128, from AWQD_ATTN_TC: "old"
 * -> 1 (attn_tc_kernel), "2" -> 2 (attn_fa_kernel with 2 warps, 64 pairs),
 * otherwise 4 (attn_fa_kernel, 4 warps, 128 pairs). Read at every work-list
 * build (once per batch geometry), so a benchmark can time both. */
#define ATT_FA_CODE 1000
static int tc_mode(void) {
    const char *e = getenv("AWQD_ATTN_TC");
    if (e && !strcmp(e, "old")) return 1;
    if (e && !strcmp(e, "2")) return 2;
    return 4;
}

/* 1 when the FA kernel with nw warps fits this device's shared memory per
 * block (hd 128, 4 warps: 102 KiB; sm_86 / sm_89 offer 99 KiB: there the
 * previous tensor-core kernel runs instead) */
static int fa_fits(const struct cuda_ctx *c, int hd, int nw) {
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device) !=
        cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return (size_t)(nw * 32 + 4 * ATT_TK) * (hd + 8) * sizeof(__half) <= (size_t)optin;
}

/* Orders the FA kernel's items (CTA = item * nkv + head) by key range,
 * longest first over all sequences (stable), so that the longest CTAs start
 * in the first wave. */
struct att_item {
    int v[8];
    int idx;
};
static int item_cmp(const void *x, const void *y) {
    const struct att_item *a = (const struct att_item *)x, *b = (const struct att_item *)y;
    int la = a->v[IT_KE] - a->v[IT_KB], lb = b->v[IT_KE] - b->v[IT_KB];
    if (la != lb) return la > lb ? -1 : 1;
    return a->idx - b->idx;
}
static void order_items(int *items, int n_items) {
    if (n_items < 2) return;
    struct att_item *t = (struct att_item *)malloc((size_t)n_items * sizeof *t);
    if (!t) return; /* the unsorted order is still correct */
    for (int i = 0; i < n_items; i++) {
        memcpy(t[i].v, items + (size_t)i * 8, sizeof t[i].v);
        t[i].idx = i;
    }
    qsort(t, (size_t)n_items, sizeof *t, item_cmp);
    for (int i = 0; i < n_items; i++) memcpy(items + (size_t)i * 8, t[i].v, sizeof t[i].v);
    free(t);
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
    /* decode (<= 8 pairs per sequence): the SIMT kernel with 8-pair tiles
     * (measured faster than the tensor-core kernel there: 790 vs 600-700
     * tok/s at batch 8, context 4096, H100); prefill and mixed batches with
     * hd <= 128: the tensor-core kernel (64 pairs; warps without a valid
     * pair skip the math); hd 256: SIMT with 32-pair tiles */
    int tc = hd <= 128 ? tc_mode() : 0;
    if (tc >= 2 && !fa_fits(c, hd, tc)) tc = 1;
    const int QP = max_pairs <= 8 ? 8 : tc == 1 ? ATT_TC_QP : tc ? 32 * tc : 32;
    /* a->qp names the kernel: 8 / 32 SIMT, ATT_TC_QP the one-m-tile TC
     * kernel, ATT_FA_CODE + NW the FA kernel with NW warps (QP = 32 NW) */
    const int code = max_pairs <= 8 || tc <= 1 ? QP : ATT_FA_CODE + tc;
    /* tiles and their key ends */
    int n_tiles = 0;
    double work = 0; /* key tiles over all CTAs */
    for (int s = 0; s < S; s++) {
        int np = (qs[s + 1] - qs[s]) * G;
        n_tiles += (np + QP - 1) / QP;
        for (int p0 = 0; p0 < np; p0 += QP) {
            int last = (p0 + QP < np ? p0 + QP : np) - 1;
            work += (double)((past[s] + last / G + 1 + ATT_TK - 1) / ATT_TK) * nkv;
        }
    }
    /* CTAs that keep every SM busy: 2 per SM; the FA kernel (two per SM
     * resident, partials of 128 pairs) splits only below 1 per SM unless
     * AWQD_ATTN_SPLIT=n asks for n per SM */
    int per_sm = 2;
    if (code >= ATT_FA_CODE) {
        const char *se = getenv("AWQD_ATTN_SPLIT");
        per_sm = se && atoi(se) > 0 ? atoi(se) : 1;
    }
    int target = per_sm * c->n_sms;
    /* FA kernel, causal balance: with two CTAs resident per SM, a CTA longer
     * than AWQD_ATTN_BAL % (default 125) of the mean work per slot would
     * form the tail of a short grid (a 1024-row prefill: 16 key tiles for
     * the last query tile against 8 per slot); such items are split into
     * equal parts (split-K partials + combine). 0 disables. */
    int cap = 1 << 30;
    if (code >= ATT_FA_CODE) {
        const char *be = getenv("AWQD_ATTN_BAL");
        int pct = be ? atoi(be) : 125;
        if (pct > 0) {
            cap = (int)ceil(pct / 100.0 * work / (2.0 * c->n_sms));
            if (cap < 4) cap = 4;
        }
    }
    int want = n_tiles * nkv >= target ? 1 : (target + n_tiles * nkv - 1) / (n_tiles * nkv);
    /* count items / groups / partial slots */
    int n_items = 0, n_comb = 0, n_slots = 0;
    for (int pass = 0; pass < 2; pass++) {
        n_items = n_comb = n_slots = 0;
        for (int s = 0; s < S; s++) {
            int rows = qs[s + 1] - qs[s], np = rows * G;
            /* the last (longest, causal) tiles first: the CTAs that read the
             * most keys start in the first wave instead of forming a tail */
            for (int p0 = np > 0 ? (np - 1) / QP * QP : -1; p0 >= 0; p0 -= QP) {
                int last = (p0 + QP < np ? p0 + QP : np) - 1;
                int kend = past[s] + last / G + 1;
                int nkt = (kend + ATT_TK - 1) / ATT_TK;
                int per = want > 1 ? (nkt + want - 1) / want : nkt;
                if (per < ATT_MIN_SPLIT_TILES) per = ATT_MIN_SPLIT_TILES;
                if (per > cap) per = cap;
                int ns = (nkt + per - 1) / per;
                if (ns < 1) ns = 1;
                if (code >= ATT_FA_CODE) per = (nkt + ns - 1) / ns; /* equal parts, same ns */
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
    if (code >= ATT_FA_CODE) order_items(a->h_items, n_items);
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
    a->qp = code;
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
static void launch_tc(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                      const __half *vc, const int *bt, int nh, int nkv,
                      const struct attn_batch *ab, float qscale) {
    if constexpr (HD <= 128) {
        struct cuda_attn *a = &c->attn;
        size_t smem = sizeof(att_tc_smem<HD>);
        cudaFuncSetAttribute(attn_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        dim3 grid(a->n_items, nkv);
        attn_tc_kernel<HD><<<grid, ATT_NT, smem, c->stream>>>(
            out, qkv, kc, vc, bt, a->d_items, a->d_part, nh, nkv, nh / nkv, ab->max_blocks,
            ab->block_size, qscale);
        OPS_CUDA_LAUNCHED(c, "attention (tensor cores)");
        if (a->n_comb) {
            dim3 g2(a->n_comb, nkv);
            attn_combine_kernel<HD, ATT_TC_QP><<<g2, 256, 0, c->stream>>>(out, a->d_part, a->d_comb,
                                                                          nh, nkv, nh / nkv);
            OPS_CUDA_LAUNCHED(c, "attention combine");
        }
    }
}

/* AWQD_ATTN_PDL_TRIGGER=start: the FA kernel lets the next kernel launch
 * as soon as it starts; otherwise after its main loop (read per launch) */
static int pdl_late(void) {
    const char *e = getenv("AWQD_ATTN_PDL_TRIGGER");
    return !(e && !strcmp(e, "start"));
}

template <int HD, int NW>
static void launch_fa(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                      const __half *vc, const int *bt, int nh, int nkv,
                      const struct attn_batch *ab, float qscale) {
    if constexpr (HD <= 128) {
        struct cuda_attn *a = &c->attn;
        static_assert(sizeof(att_fa_smem<HD, NW>) == (size_t)(NW * 32 + 4 * ATT_TK) * (HD + 8) * 2,
                      "fa_fits computes this size");
        size_t smem = sizeof(att_fa_smem<HD, NW>);
        cudaFuncSetAttribute(attn_fa_kernel<HD, NW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        cudaError_t e = ops_cuda_launch(c, attn_fa_kernel<HD, NW>, dim3(a->n_items * nkv),
                                        dim3(NW * 32), smem, out, qkv, kc, vc, bt,
                                        (const int *)a->d_items, a->d_part, nh, nkv, nh / nkv,
                                        ab->max_blocks, ab->block_size, qscale, pdl_late());
        if (e != cudaSuccess) {
            ops_cuda__fail(c, -EIO, "attention (tensor cores)", cudaGetErrorString(e));
            return;
        }
        if (a->n_comb) {
            e = ops_cuda_launch(c, attn_combine_fa_kernel<HD, NW * 32>, dim3(NW * 8, a->n_comb, nkv),
                                dim3(128), 0, out, (const float *)a->d_part,
                                (const int *)a->d_comb, nh, nkv, nh / nkv);
            if (e != cudaSuccess)
                ops_cuda__fail(c, -EIO, "attention combine", cudaGetErrorString(e));
        }
    }
}

template <int HD>
static void launch_hd(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                      const __half *vc, const int *bt, int nh, int nkv,
                      const struct attn_batch *ab, float qscale) {
    if (c->attn.qp == 8) launch<HD, 8>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
    else if (c->attn.qp == ATT_TC_QP) launch_tc<HD>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
    else if (c->attn.qp == ATT_FA_CODE + 4) launch_fa<HD, 4>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
    else if (c->attn.qp == ATT_FA_CODE + 2) launch_fa<HD, 2>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
    else launch<HD, 32>(c, out, qkv, kc, vc, bt, nh, nkv, ab, qscale);
}

void ops_cuda__attention(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                         int nkv, int hd, float scale, const struct attn_batch *ab,
                         const struct buf *k_cache, const struct buf *v_cache) {
    AWQD_ASSERT(nkv > 0 && nh % nkv == 0);
    AWQD_ASSERT(hd == 32 || hd == 64 || hd == 128 || hd == 256);
    AWQD_ASSERT(out->n >= (size_t)ab->n_rows * nh * hd);
    AWQD_ASSERT(qkv->n >= (size_t)ab->n_rows * (nh + 2 * nkv) * hd);
    /* decode-only batches: the fixed-split kernel (attn_decode.cu), whose
     * geometry depends on n_seqs only (graph replays) */
    if (ab->decode_fixed) {
        if (!ops_cuda__attn_decode_ok(nh / nkv)) { /* the capture fails, the step runs eagerly */
            ops_cuda__fail(c, -ENOTSUP, "attention", "decode_fixed needs 1, 2, 4, 8 or 16 query heads per KV head");
            return;
        }
        ops_cuda__attn_decode(c, out, qkv, nh, nkv, hd, scale, ab, k_cache, v_cache);
        return;
    }
    AWQD_ASSERT(ab->h_q_start[ab->n_seqs] == ab->n_rows);
    if (ab->n_rows == ab->n_seqs && ab->n_seqs > 0 && ops_cuda__attn_decode_ok(nh / nkv) && !c->dec_off) {
        int one = 1;
        for (int s = 0; s < ab->n_seqs && one; s++) one = ab->h_q_start[s + 1] - ab->h_q_start[s] == 1;
        if (one) {
            for (int s = 0; s < ab->n_seqs; s++)
                AWQD_ASSERT((ab->h_past[s] + 1 + ab->block_size - 1) / ab->block_size <= ab->max_blocks);
            ops_cuda__attn_decode(c, out, qkv, nh, nkv, hd, scale, ab, k_cache, v_cache);
            return;
        }
    }
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
