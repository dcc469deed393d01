/* attn_decode.cu — attention for decode-only batches (one new row per
 * sequence) with launch geometry that depends on the number of sequences
 * only, so a CUDA graph captured once replays for any contexts.
 *
 * Grid (ns, nkv, S): CTA (k, g, s) owns KV head g of sequence s and split k
 * of its context. The context length is read on the device (past[s] + 1;
 * past[s] < 0 marks a padding row: no keys). Split k takes keys
 * [k * per, min(ctx, (k + 1) * per)) with per = max(ceil(ctx / ns),
 * min_keys), so short contexts use few splits; with DEC_EMPTY_NS splits or
 * more the rest write only an empty state and exit at once
 * (min_keys: c->dec_min_keys, 32; AWQD_CUDA_DEC_MIN_KEYS for tuning — on an
 * H100, Qwen3-8B batch 1 / context 512, 8 and 16 were even, 128 / 256 /
 * 1024 slower: 345, 312, 266 against 364 tok/s).
 * ns = ops_cuda__attn_decode_splits(S, nkv) (kernels/cuda/dec_split.h):
 * ~2 CTAs per SM when S * nkv alone gives fewer than 4, else 1, but 3 where
 * S * nkv is just over one wave of 4 a SM (to 1.25 waves, session 43) and 2
 * from there to 1.5 waves (session 44).
 *
 * GQA: all G = nh / nkv query heads of the group share every K/V tile the
 * CTA loads, so each KV head is read once per sequence. K and V tiles of TK
 * keys stream into shared memory with 16-byte cp.async, double-buffered
 * against the math (the next tile's K loads during this tile's softmax and
 * P.V, its V during the next scores). With PDL the tensor-core variant
 * issues its first tile before griddepcontrol.wait (AWQD_CUDA_DEC_PREWAIT,
 * on by default): the context length, the block table and every cached key
 * but the new one were in memory before the step's first kernel; only the
 * new key's row (written by qk_norm_rope_kv, the previous kernel) is loaded
 * after the wait. From AWQD_CUDA_DEC_QK rows (1: every decode batch)
 * there is no such kernel:
 * qk_norm_rope_kv only records its inputs (c->qk_defer) and this kernel's
 * prologue does its work after the wait (QK: each CTA normalizes and
 * rotates its group's query heads into Q's shared rows, the CTA whose split
 * holds the new key writes that key and value to the cache and into its
 * first tile, bit for bit qk_rope_kv_kernel's arithmetic through
 * qk_norm_rope), so a decode layer has one kernel less; q|k|v then keeps
 * the raw q and k.
 *
 * Shared memory (128 threads):
 *   k, v  fp16  [TK][HD + 8]       one tile (zero past the split's end)
 *   q     float [G][HD]            pre-scaled by scale * log2(e)
 *   s     float [G][TK]            scores, then probabilities
 *   m, l, alpha float [G]          online-softmax state
 * Scores: thread t computes key t % TK for heads t / TK + i (128 / TK),
 * reading its K chunk once for all of them. P.V: thread t owns dims
 * d = t % HDC + 128 j (HDC = min(HD, 128)) of heads t / HDC + i (128 / HDC),
 * 4 keys per step (one float4 of probabilities per head); its fp32
 * accumulators stay in registers for the whole split. G is a template
 * parameter (1, 2, 4, 8, 16): no loop runs over absent heads. ns == 1 writes the normalized output; otherwise the partial
 * (o, m, l) goes to fp32 scratch [S, nh, ns, HD + 2] and a combine kernel
 * (grid (nh, S)) merges the splits in split order (deterministic); from
 * DEC_WIDE_FROM (17) splits the wide combine kernel (512 threads, splits
 * spread over thread groups as well as dims) merges them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attn_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dec_split.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/ops_cuda_internal.h"

extern "C" {
#include "engine/util.h"
}

#include "kernels/cuda/stamps.cuh" /* empty unless -DAWQD_STAMPS */

#define DEC_NT 128
#define DEC_MAX_SPLITS 64
static_assert(DEC_MAX_SPLITS == DEC_SPLIT_MAX, "dec_split.h");
/* From this many splits the tensor-core kernel's splits without keys write
 * only the empty state and exit (batch 1 on 4-8 KV heads: 33-64 splits, of
 * which a context of 512 fills 16; 4x H200, session 29: qwen3-32b batch 1
 * at context 512 1.8% faster at tp = 1, 2.4% at tp = 2; the same at tp = 4,
 * where the 128 CTAs fit one wave either way) */
#define DEC_EMPTY_NS 32
static_assert(DEC_MAX_SPLITS <= DEC_NT, "the combine kernel loads one split per thread");

/* One K or V tile of TK keys from key t0 (keys >= ke zero-filled) into dst,
 * as one cp.async commit group (an empty group past the split's end, so the
 * callers' wait counts stay fixed). BS: the block-size class (KV_BS_*). */
template <int HD, int TK, int BS = KV_BS_ANY>
static __device__ __forceinline__ void dec_tile_load(__half (*dst)[HD + 8], const __half *cache,
                                                     int t0, int ke, int tid, const int *bt,
                                                     int block_size, int nkv, int g) {
    if (t0 < ke) kv_tile_load<HD, TK, DEC_NT, true, false, BS>(dst, cache, tid, t0, ke, bt, block_size, nkv, g);
    cp_async_commit();
}

template <int HD, int G> struct dec_cfg {
    static constexpr int TK = HD <= 128 ? 64 : 32;         /* keys per tile */
    static constexpr int HPH = DEC_NT / TK;               /* score phases: heads hp, hp + HPH, ... */
    static constexpr int SH = (G + HPH - 1) / HPH;        /* score heads per thread */
    static constexpr int HDC = HD < 128 ? HD : 128;       /* dims per P.V column */
    static constexpr int HSTEP = DEC_NT / HDC;            /* heads between a thread's P.V heads */
    static constexpr int DPT = HD / HDC;                  /* P.V dims per thread */
    static constexpr int NHT = (G + HSTEP - 1) / HSTEP;   /* P.V heads per thread */
    static constexpr int KV_BYTES = 2 * TK * (HD + 8) * 2;
};

/* Split k's partial of query head qh of row s in the fp32 scratch
 * [S][nh][ns][HD + 2]: O (HD floats), then m and l. */
template <int HD, typename T>
static __device__ __forceinline__ T *dec_part_at(T *part, int s, int nh, int qh, int ns, int k) {
    return part + (((size_t)s * nh + qh) * ns + k) * (HD + 2);
}

static size_t dec_smem_bytes(int hd, int G) {
    int tk = hd <= 128 ? 64 : 32;
    return (size_t)2 * tk * (hd + 8) * 2 + (size_t)G * hd * 4 + (size_t)G * tk * 4 + (size_t)3 * G * 4;
}


template <int HD, int G>
static __global__ void __launch_bounds__(DEC_NT)
attn_dec_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc,
                const int *block_table, const int *past, float *part, int nh, int nkv,
                int max_blocks, int block_size, float qscale, int min_keys) {
    typedef dec_cfg<HD, G> C;
    constexpr int TK = C::TK;
    ops_cuda_pdl_wait();
    ops_cuda_pdl_trigger();
    extern __shared__ __align__(16) unsigned char dec_smem[];
    __half(*ks)[HD + 8] = (__half(*)[HD + 8])dec_smem;
    __half(*vs)[HD + 8] = (__half(*)[HD + 8])(dec_smem + TK * (HD + 8) * 2);
    float *qs = (float *)(dec_smem + C::KV_BYTES); /* [G][HD] */
    float *ss = qs + G * HD;                       /* [G][TK] */
    float *ms = ss + G * TK, *ls = ms + G, *as = ls + G;
    const int k = blockIdx.x, g = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
    const int ns = gridDim.x;
    const int ps = past[s];
    const int ctx = ps < 0 ? 0 : ps + 1;
    int per = (ctx + ns - 1) / ns;
    if (per < min_keys) per = min_keys;
    const int kb = k * per < ctx ? k * per : ctx;
    const int ke = kb + per < ctx ? kb + per : ctx;
    const size_t width = (size_t)(nh + 2 * nkv) * HD;
    const int *bt = block_table + (size_t)s * max_blocks;

    for (int e = tid; e < G * HD; e += DEC_NT)
        qs[e] = __half2float(qkv[(size_t)s * width + (size_t)g * G * HD + e]) * qscale;
    for (int h = tid; h < G; h += DEC_NT) {
        ms[h] = -INFINITY;
        ls[h] = 0.0f;
    }
    const int head0 = tid / C::HDC, dim0 = tid % C::HDC;
    float o[C::NHT][C::DPT];
#pragma unroll
    for (int i = 0; i < C::NHT; i++)
#pragma unroll
        for (int j = 0; j < C::DPT; j++) o[i][j] = 0.0f;

    auto load = [&](__half(*dst)[HD + 8], const __half *cache, int t0) {
        dec_tile_load<HD, TK>(dst, cache, t0, ke, tid, bt, block_size, nkv, g);
    };
    load(ks, kc, kb);
    load(vs, vc, kb);
    const int tk = tid % TK, hp = tid / TK;
    const int warp = tid >> 5, lane = tid & 31;
    for (int t0 = kb; t0 < ke; t0 += TK) {
        cp_async_wait1(); /* K(t0) */
        __syncthreads();
        /* scores: key tk against heads hp, hp + HPH, ... (K chunk read once) */
        {
            float acc[C::SH];
#pragma unroll
            for (int i = 0; i < C::SH; i++) acc[i] = 0.0f;
#pragma unroll 4
            for (int d0 = 0; d0 < HD; d0 += 8) {
                uint4 raw = *(const uint4 *)&ks[tk][d0];
                const __half2 *h2 = (const __half2 *)&raw;
                float2 f0 = __half22float2(h2[0]), f1 = __half22float2(h2[1]);
                float2 f2 = __half22float2(h2[2]), f3 = __half22float2(h2[3]);
#pragma unroll
                for (int i = 0; i < C::SH; i++) {
                    int h = hp + i * C::HPH;
                    if (G % C::HPH == 0 || h < G) {
                        const float *q = qs + h * HD + d0;
                        float4 qa = *(const float4 *)q, qb = *(const float4 *)(q + 4);
                        acc[i] += qa.x * f0.x + qa.y * f0.y + qa.z * f1.x + qa.w * f1.y +
                                  qb.x * f2.x + qb.y * f2.y + qb.z * f3.x + qb.w * f3.y;
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < C::SH; i++) {
                int h = hp + i * C::HPH;
                if (G % C::HPH == 0 || h < G) ss[h * TK + tk] = t0 + tk < ke ? acc[i] : -INFINITY;
            }
        }
        __syncthreads();       /* the scores in ss for the softmax warps, K consumed */
        load(ks, kc, t0 + TK); /* K is free: the next tile */
        /* online softmax: one warp per head */
        for (int h = warp; h < G; h += DEC_NT / 32) {
            float mx = -INFINITY;
#pragma unroll
            for (int t = lane; t < TK; t += 32) mx = fmaxf(mx, ss[h * TK + t]);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float m_old = ms[h], m_new = fmaxf(m_old, mx), sum = 0.0f;
#pragma unroll
            for (int t = lane; t < TK; t += 32) {
                float e = m_new == -INFINITY ? 0.0f : exp2f(ss[h * TK + t] - m_new);
                ss[h * TK + t] = e;
                sum += e;
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            __syncwarp(); /* every lane's read of ms[h] before lane 0 writes it (compute-sanitizer's
                             racecheck flagged the pair without a warp barrier) */
            if (lane == 0) {
                float a = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
                as[h] = a;
                ms[h] = m_new;
                ls[h] = ls[h] * a + sum;
            }
        }
        cp_async_wait1(); /* V(t0) */
        __syncthreads();
        /* o = o * alpha + P V; 4 keys at a time (past the tile's valid keys
         * p = 0 and V = 0) */
#pragma unroll
        for (int i = 0; i < C::NHT; i++) {
            int h = head0 + i * C::HSTEP;
            if (G % C::HSTEP == 0 || h < G) {
                float a = as[h];
#pragma unroll
                for (int j = 0; j < C::DPT; j++) o[i][j] *= a;
            }
        }
        const int tn = ke - t0 < TK ? ke - t0 : TK;
        for (int t = 0; t < tn; t += 4) {
            float vv[4][C::DPT];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int j = 0; j < C::DPT; j++) vv[u][j] = __half2float(vs[t + u][dim0 + 128 * j]);
#pragma unroll
            for (int i = 0; i < C::NHT; i++) {
                int h = head0 + i * C::HSTEP;
                if (G % C::HSTEP == 0 || h < G) {
                    float4 p = *(const float4 *)&ss[h * TK + t];
#pragma unroll
                    for (int j = 0; j < C::DPT; j++)
                        o[i][j] += p.x * vv[0][j] + p.y * vv[1][j] + p.z * vv[2][j] + p.w * vv[3][j];
                }
            }
        }
        __syncthreads();       /* V and S consumed */
        load(vs, vc, t0 + TK); /* the next tile's V */
    }
    cp_async_wait0();
    __syncthreads();
#pragma unroll
    for (int i = 0; i < C::NHT; i++) {
        int h = head0 + i * C::HSTEP;
        if (!(G % C::HSTEP == 0 || h < G)) continue;
        int qh = g * G + h;
        if (ns == 1) {
            float l = ls[h], inv = l > 0.0f ? 1.0f / l : 0.0f;
            __half *dst = out + (size_t)s * nh * HD + (size_t)qh * HD;
#pragma unroll
            for (int j = 0; j < C::DPT; j++) dst[dim0 + 128 * j] = __float2half(o[i][j] * inv);
        } else {
            float *pp = dec_part_at<HD>(part, s, nh, qh, ns, k);
#pragma unroll
            for (int j = 0; j < C::DPT; j++) pp[dim0 + 128 * j] = o[i][j];
            if (dim0 == 0) {
                pp[HD] = ms[h];
                pp[HD + 1] = ls[h];
            }
        }
    }
}

/* The weight 2^(m - M) of a partial softmax state (a split's, or a warp's
 * inside the tensor-core kernel) with running max m when the states merge
 * under the overall max M; 0 for a state that saw no keys (m = -inf). */
static __device__ __forceinline__ float dec_split_weight(float m, float M) {
    return m == -INFINITY ? 0.0f : exp2f(m - M);
}

/* ------------------------------------------------------------------------ */
/* Tensor-core variant (HD <= 128): the G query heads of the group are the M
 * rows of mma.m16n8k16 (rows >= G are zero and never written). Each of the 4
 * warps owns 16 keys of every 64-key tile: S = Q K^T (2 n-tiles), online
 * softmax in registers, O += P V (P from the S accumulators, V's fragments
 * from ldmatrix.trans) — each warp keeps its own (m, l, O) over the whole
 * split; the 4 are merged through shared memory (the K/V tile area) at the
 * end. Q sits in shared memory (A fragments read per k-step) to keep the
 * registers at <= 128 (4 CTAs per SM; with Q in registers 167, 3 per SM).
 * Same split rule, partials and combine kernel as the SIMT kernel.
 *
 * P2: compiled for a power-of-two block size (the K/V slots by shift and
 * mask, the first tile's block-table entries loaded together before the
 * wait) or for any other (a division); the host picks by the cache's block
 * size. One path each, not both behind a run-time test: at batch 1 a CTA
 * runs its code once (one or two tiles), and before this the first tile
 * went through the division loop whatever the block size (16 dependent
 * round trips before the wait) and every later tile through the test;
 * <128, 4, true> was 92 KB of SASS, now 40 KB. H200, session 45: Qwen3-8B
 * steps 1.4-4.7% faster at batch 1-16, 1-2.5% at 32-128; the pre-wait
 * loads together alone gave -2% to +1% (docs/PERFORMANCE.md "Session 45"
 * items 5-8, 11). */

/* N fp16 values at x (N * 2-byte aligned) as floats; zeros where !live */
template <int N>
static __device__ __forceinline__ void dec_ld_halves(float (&v)[N], const __half *x, bool live) {
    __align__(8) __half h[N];
    if (N == 4) *(uint2 *)h = live ? *(const uint2 *)x : make_uint2(0u, 0u);
    else if (N == 2) *(unsigned *)h = live ? *(const unsigned *)x : 0u;
    else
#pragma unroll
        for (int i = 0; i < N; i++) h[i] = live ? x[i] : __half();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = __half2float(h[i]);
}

template <int HD, int G, bool EMPTY, bool P2, bool QK>
static __global__ void __launch_bounds__(DEC_NT, 4)
attn_dec_tc_kernel(__half *out, const __half *qkv, const __half *kc, const __half *vc,
                   const int *block_table, const int *past, float *part, int nh, int nkv,
                   int max_blocks, int block_size, float qscale, int min_keys, int prewait, dec_qk qa) {
    constexpr int TK = 64, KS = HD / 16, DT = HD / 8, QE = HD / 32;
    ST_DECL;
    ST_BEGIN(ST_KEY(4, nh, gridDim.x));
    if (!prewait) {
        ops_cuda_pdl_wait();
        ops_cuda_pdl_trigger();
        ST_MARK(1);
    }
    extern __shared__ __align__(16) unsigned char dec_smem[];
    __half(*ks)[HD + 8] = (__half(*)[HD + 8])dec_smem;
    __half(*vs)[HD + 8] = (__half(*)[HD + 8])(dec_smem + TK * (HD + 8) * 2);
    __shared__ __align__(16) float wm[16][4], wl[16][4]; /* [row][warp]: one 16-byte load a row */
    const int k = blockIdx.x, g = blockIdx.y, s = blockIdx.z, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int ns = gridDim.x;
    /* QK: the row's position, KV slot, rotary frequencies and norm weights
     * (in memory before the step's first kernel) requested with past, in
     * one round trip before the wait, and the weights converted only after
     * it. At batch 1 the CTAs with keys reach their wait after the q|k|v
     * linear has ended (session 59 stamps), so every dependent load before
     * it is on the step's path; the weights used to be waited for there
     * (stored to local memory, as an array chosen at run time). */
    int qpos = 0, slot = -1;
    float qf[QE];
    __half hwq[QE], hwk[QE];
    if (QK) {
        qpos = qa.positions[s];
        slot = qa.slots[s];
        qk_rope_freqs<QE>(qa.inv_freq, lane, QE, HD, qf);
#pragma unroll
        for (int i = 0; i < QE; i++) {
            hwq[i] = qa.q_norm ? ((const __half *)qa.q_norm)[lane * QE + i] : __float2half(1.0f);
            hwk[i] = qa.k_norm ? ((const __half *)qa.k_norm)[lane * QE + i] : __float2half(1.0f);
        }
    }
    const int ps = past[s];
    const int ctx = ps < 0 ? 0 : ps + 1;
    int per = (ctx + ns - 1) / ns;
    if (per < min_keys) per = min_keys;
    const int kb = k * per < ctx ? k * per : ctx;
    const int ke = kb + per < ctx ? kb + per : ctx;
    if (EMPTY && kb >= ke) {
        /* a split without keys (ns > 1): only the empty state (m = -inf,
         * l = 0) that the merge skips, after the wait (the previous layer's
         * merge may still read these partials until then) */
        if (prewait) {
            ops_cuda_pdl_wait();
            ops_cuda_pdl_trigger();
            ST_MARK(1);
        }
        for (int r = tid; r < G; r += DEC_NT) {
            float *pp = dec_part_at<HD>(part, s, nh, g * G + r, ns, k);
            pp[HD] = -INFINITY;
            pp[HD + 1] = 0.0f;
        }
        ST_MARK(5); /* an empty split's end */
        return;
    }
    const size_t width = (size_t)(nh + 2 * nkv) * HD;
    const int *bt = block_table + (size_t)s * max_blocks;
    /* Q: 16 rows = the group's query heads (zero past G), in shared memory
     * after the K/V tiles (A fragments are read per tile: fewer registers,
     * 4 CTAs per SM); QK's prologue writes rows 0..G-1 itself */
    __half(*qsh)[HD + 8] = (__half(*)[HD + 8])(dec_smem + 2 * TK * (HD + 8) * 2);

    auto load = [&](__half(*dst)[HD + 8], const __half *cache, int t0) {
        dec_tile_load<HD, TK, P2 ? KV_BS_P2 : KV_BS_GEN>(dst, cache, t0, ke, tid, bt, block_size, nkv, g);
    };
    if (prewait) {
        /* past, the block table and every cached key but the new one (ctx
         * - 1, written by the previous kernel) were in memory before this
         * step's first kernel: the first tile loads before the wait, less
         * the new key's row, which follows it */
        const int nk = ctx - 1, CH = HD / 8;
        /* the first tile less the new key's row (kv_tile_load's SKIP):
         * for a power-of-two block size the block-table entries load
         * together, then the copies (that row predicated off); for any
         * other the division loop, an entry and a copy in turn */
        constexpr int BS = P2 ? KV_BS_P2 : KV_BS_GEN;
        if (kb < ke) kv_tile_load<HD, TK, DEC_NT, true, true, BS>(ks, kc, tid, kb, ke, bt, block_size, nkv, g, nk);
        cp_async_commit();
        if (kb < ke) kv_tile_load<HD, TK, DEC_NT, true, true, BS>(vs, vc, tid, kb, ke, bt, block_size, nkv, g, nk);
        cp_async_commit();
        /* QK: the row's sines and cosines */
        float sn[QE], cs[QE];
        if (QK) qk_rope_sincos_f<QE>((float)qpos, qf, QE, sn, cs);
        ST_MARK(6);
        ops_cuda_pdl_wait();
        ops_cuda_pdl_trigger();
        ST_MARK(1);
        const bool writer = QK && slot >= 0 && nk >= kb && nk < ke; /* this split holds the new key */
        if (QK) {
            /* q/k-norm + RoPE of the group's G query heads into Q's rows
             * (warp w: heads w, w + 4, ...), and where this split holds the
             * new key (a real row) of KV head g into the cache, with its V
             * row: qk_rope_kv_kernel's arithmetic (qk_norm_rope), the same
             * bits. q|k|v itself keeps the raw q and k. */
            const __half *row = qkv + (size_t)s * width;
            constexpr int HPW = (G + 4) / 4; /* heads a warp: of the G q heads and the k head */
            float v[HPW][QE];
            __half vh[QE];
#pragma unroll
            for (int j = 0; j < HPW; j++) { /* every load first: one round trip */
                const int r = warp + 4 * j;
                const bool live = r < G || (r == G && writer);
                const __half *x = row + (size_t)(r < G ? g * G + r : nh + g) * HD + lane * QE;
                dec_ld_halves<QE>(v[j], x, live);
                if (r == G) {
#pragma unroll
                    for (int i = 0; i < QE; i++) vh[i] = live ? x[(size_t)nkv * HD + i] : __half();
                }
            }
            /* every slot's arithmetic, live or not (zeros), with no branch
             * between them: the heads' shuffle chains interleave */
#pragma unroll
            for (int j = 0; j < HPW; j++) {
                float gw[QE]; /* this slot's norm weights: q's or k's, in registers */
#pragma unroll
                for (int i = 0; i < QE; i++) gw[i] = __half2float(warp + 4 * j < G ? hwq[i] : hwk[i]);
                qk_norm_rope<QE>(v[j], gw, qa.q_norm != NULL, qa.eps, HD, QE, sn, cs, lane);
            }
#pragma unroll
            for (int j = 0; j < HPW; j++) {
                const int r = warp + 4 * j;
                if (r < G) {
#pragma unroll
                    for (int i = 0; i < QE; i++) qsh[r][lane * QE + i] = __float2half(v[j][i]);
                } else if (r == G && writer) { /* the cache's row, and the first tile's where it holds the new key */
                    const size_t dst = ((size_t)slot * nkv + g) * HD + lane * QE;
#pragma unroll
                    for (int i = 0; i < QE; i++) {
                        const __half kh = __float2half(v[j][i]);
                        ((__half *)qa.kc)[dst + i] = kh;
                        ((__half *)qa.vc)[dst + i] = vh[i];
                        if (nk < kb + TK) {
                            ks[nk - kb][lane * QE + i] = kh;
                            vs[nk - kb][lane * QE + i] = vh[i];
                        }
                    }
                }
            }
            /* a later tile with the new key loads it from the cache */
            if (writer && nk >= kb + TK) __threadfence_block();
            __syncthreads();
        }
        /* the new key's row of the first tile (left out before the wait):
         * from the cache, or zeros where it is past this split's end (the
         * fused writer has put it into the tile itself) */
        if (!writer && nk >= kb && nk < kb + TK) {
            for (int e = tid; e < 2 * CH; e += DEC_NT)
                kv_chunk_load<HD, P2>(e < CH ? ks : vs, e < CH ? kc : vc, (nk - kb) * CH + e % CH, kb, ke, bt,
                                      block_size, nkv, g, P2 ? __ffs(block_size) - 1 : 0);
        }
        cp_async_commit(); /* waited for (all groups) after Q below */
    } else {
        load(ks, kc, kb);
        load(vs, vc, kb);
    }

    /* Q's rows (under QK only the zero rows G..15: the first tile's barrier
     * orders them before the scores) */
    for (int e = (QK ? G * (HD / 2) : 0) + tid; e < 16 * (HD / 2); e += DEC_NT) {
        int r = e / (HD / 2), d = 2 * (e % (HD / 2));
        unsigned v = 0u;
        if (!QK && r < G) v = *(const unsigned *)(qkv + (size_t)s * width + (size_t)(g * G + r) * HD + d);
        *(unsigned *)&qsh[r][d] = v;
    }
    if (prewait) cp_async_wait0(); /* the first tile with the new key's row */
    ST_MARK(2);
    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};
    const int kw = warp * 16; /* this warp's keys in a tile */

    for (int t0 = kb; t0 < ke; t0 += TK) {
        cp_async_wait1(); /* K(t0) */
        __syncthreads();
        float sc[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const __half *kr = &ks[kw + j * 8 + gq][2 * tq];
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                unsigned qa[4];
                qa[0] = *(const unsigned *)&qsh[gq][kk * 16 + 2 * tq];
                qa[1] = *(const unsigned *)&qsh[gq + 8][kk * 16 + 2 * tq];
                qa[2] = *(const unsigned *)&qsh[gq][kk * 16 + 2 * tq + 8];
                qa[3] = *(const unsigned *)&qsh[gq + 8][kk * 16 + 2 * tq + 8];
                unsigned b0 = *(const unsigned *)(kr + kk * 16);
                unsigned b1 = *(const unsigned *)(kr + kk * 16 + 8);
                mma16816(sc[j], qa, b0, b1);
            }
        }
        /* the next tile's K once every warp is done with this one; on a
         * split's last tile no barrier (the one after the loop guards the
         * tile area), only the group that keeps the wait counts fixed */
        const bool more = t0 + TK < ke;
        if (more) {
            __syncthreads();
            load(ks, kc, t0 + TK);
        } else {
            cp_async_commit();
        }
        /* online softmax over this warp's 16 keys (rows gq: e 0,1; gq + 8: e 2,3) */
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ta = t0 + kw + j * 8 + 2 * tq + (e & 1);
                sc[j][e] = ta < ke ? sc[j][e] * qscale : -INFINITY;
            }
        online_softmax_tile<2, DT>(sc, mrow, lrow, o);
        cp_async_wait1(); /* V(t0) */
        __syncthreads();
        {
            unsigned pa[4];
            pa[0] = pack_half2(sc[0][0], sc[0][1]);
            pa[1] = pack_half2(sc[0][2], sc[0][3]);
            pa[2] = pack_half2(sc[1][0], sc[1][1]);
            pa[3] = pack_half2(sc[1][2], sc[1][3]);
            pv_mma16<DT, HD>(o, pa, vs, kw, lane);
        }
        if (more) {
            __syncthreads();       /* V consumed */
            load(vs, vc, t0 + TK); /* the next tile's V */
        }
    }
    cp_async_wait0();
    __syncthreads(); /* the tile area is free: it takes the warps' O */
    ST_MARK(3);
    /* The warps' O through shared memory, rows HD + 8 floats apart: a
     * half-warp's float2 stores (rows gq = 0-3 or 4-7, dims j * 8 + 2 tq)
     * then cover the 32 banks once. Rows HD floats apart (before session
     * 46) put every row on the same banks: 4-way (G = 4) to 8-way (G = 8)
     * conflicts on DT x 2 scalar stores a thread. */
    constexpr int WS = HD + 8;
    static_assert(4 * 16 * WS * 4 <= 2 * TK * (HD + 8) * 2, "the warps' O fits in the K/V tile area");
    float(*wo)[16][WS] = (float(*)[16][WS])dec_smem; /* [4 warps][16 rows][WS] */
    if (tq == 0) {
        wm[gq][warp] = mrow[0];
        wm[gq + 8][warp] = mrow[1];
        wl[gq][warp] = lrow[0];
        wl[gq + 8][warp] = lrow[1];
    }
#pragma unroll
    for (int j = 0; j < DT; j++) {
        int d = j * 8 + 2 * tq;
        if (gq < G) *(float2 *)&wo[warp][gq][d] = make_float2(o[j][0], o[j][1]);
        if (gq + 8 < G) *(float2 *)&wo[warp][gq + 8][d] = make_float2(o[j][2], o[j][3]);
    }
    __syncthreads();
    /* 4 dims of a row a thread (G = 4: one pass); the row's weights once
     * per 4 dims, not per dim */
    for (int e = tid; e < G * HD / 4; e += DEC_NT) {
        const int r = e / (HD / 4), d = 4 * (e % (HD / 4));
        const float4 m4 = *(const float4 *)wm[r], l4 = *(const float4 *)wl[r];
        const float M = fmaxf(fmaxf(m4.x, m4.y), fmaxf(m4.z, m4.w));
        const float f[4] = {dec_split_weight(m4.x, M), dec_split_weight(m4.y, M), dec_split_weight(m4.z, M),
                            dec_split_weight(m4.w, M)};
        const float L = f[0] * l4.x + f[1] * l4.y + f[2] * l4.z + f[3] * l4.w;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const float4 v = *(const float4 *)&wo[w][r][d];
            acc.x += f[w] * v.x;
            acc.y += f[w] * v.y;
            acc.z += f[w] * v.z;
            acc.w += f[w] * v.w;
        }
        const int qh = g * G + r;
        if (ns == 1) {
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            __half2 h2[2] = {__floats2half2_rn(acc.x * inv, acc.y * inv), __floats2half2_rn(acc.z * inv, acc.w * inv)};
            *(uint2 *)(out + (size_t)s * nh * HD + (size_t)qh * HD + d) = *(const uint2 *)h2;
        } else {
            float *pp = dec_part_at<HD>(part, s, nh, qh, ns, k); /* 8-byte aligned: HD + 2 floats a split */
            *(float2 *)(pp + d) = make_float2(acc.x, acc.y);
            *(float2 *)(pp + d + 2) = make_float2(acc.z, acc.w);
            if (d == 0) {
                pp[HD] = M;
                pp[HD + 1] = L;
            }
        }
    }
    ST_MARK(4);
}

/* grid (nh, S): merges the ns partials of query head blockIdx.x of row s in
 * split order. Splits with keys are a prefix (k < n_act). Threads < ns load
 * one split's (m, l) into shared memory while every thread loads its dim of
 * the first DEC_PV splits into registers: one dependent round trip where ns
 * <= DEC_PV (batch 1 at contexts <= 512 on Qwen3-8B), the rest read after
 * the barrier. Each thread then derives M, the active prefix, the weights
 * 2^(m_k - M) and L itself, in split order (the same arithmetic in every
 * thread). DEC_PV stays small: at 64 the registers (79 per thread) kept the
 * next kernel's blocks off the SMs at batch 8 (o_proj 4 us later). */
#define DEC_PV 16
template <int HD>
static __global__ void __launch_bounds__(DEC_NT)
attn_dec_combine_kernel(__half *out, const float *part, int nh, int ns, int early) {
    ST_DECL;
    ST_BEGIN(ST_KEY(5, nh, ns));
    if (early) ops_cuda_pdl_trigger(); /* o_proj launches during the merge (OPS_EARLY_MERGE) */
    ops_cuda_pdl_wait();
    if (!early) ops_cuda_pdl_trigger();
    ST_MARK(1);
    const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
    const float *base = dec_part_at<HD>(part, s, nh, h, ns, 0);
    __shared__ float msh[DEC_MAX_SPLITS], lsh[DEC_MAX_SPLITS];
    if (tid < ns) {
        msh[tid] = base[(size_t)tid * (HD + 2) + HD];
        lsh[tid] = base[(size_t)tid * (HD + 2) + HD + 1];
    }
    float pv[DEC_PV];
    const float *pd = base + (tid < HD ? tid : 0);
    const int nl = tid < HD ? ns : 0;
#pragma unroll
    for (int k = 0; k < DEC_PV; k++) pv[k] = k < nl ? pd[k * (HD + 2)] : 0.0f;
    __syncthreads();
    float M = -INFINITY;
    int na = 0;
    for (int k = 0; k < ns; k++) {
        const float m = msh[k];
        M = fmaxf(M, m);
        if (m != -INFINITY) na = k + 1;
    }
    float L = 0.0f, acc = 0.0f;
#pragma unroll
    for (int k = 0; k < DEC_PV; k++)
        if (k < na) {
            const float w = dec_split_weight(msh[k], M);
            L += w * lsh[k];
            acc += w * pv[k];
        }
    for (int k = DEC_PV; k < na; k++) {
        const float w = dec_split_weight(msh[k], M);
        L += w * lsh[k];
        acc += w * pd[(size_t)k * (HD + 2)];
    }
    const float inv_l = L > 0.0f ? 1.0f / L : 0.0f;
    __half *o = out + (size_t)s * nh * HD + (size_t)h * HD;
    if (tid < HD) o[tid] = __float2half(acc * inv_l);
    for (int d = tid + DEC_NT; d < HD; d += DEC_NT) {
        float a2 = 0.0f;
        for (int k = 0; k < na; k++) a2 += dec_split_weight(msh[k], M) * base[(size_t)k * (HD + 2) + d];
        o[d] = __float2half(a2 * inv_l);
    }
    ST_MARK(4);
}

/* The merge where there are more than DEC_PV splits (batch 1-2 at 2-8 KV
 * heads; contexts past DEC_PV x 32 keys fill them): the combine kernel above
 * reads splits DEC_PV.. after its barrier, a few loads per round trip (48 of
 * them at 64 splits), and every thread runs the splits' weights in a serial
 * chain. Here DEC_CW_NT threads split the splits as well as the dims: thread
 * (q, d) loads dim d of its PER = DEC_MAX_SPLITS / KQ consecutive splits
 * before the barrier (every split's values in registers after one round
 * trip), and threads k < ns hold split k's (m, l): the max, the active
 * prefix and L are warp reductions over them (warps 0-1), the weights one
 * exp2 per split, shared. The KQ groups' sums (each in split order) are added
 * in group order. The same weights as the combine kernel; its sums in
 * another order (deterministic). */
#define DEC_CW_NT 512
static_assert(DEC_WIDE_FROM == DEC_PV + 1, "the wide merge takes over where the plain one needs a second round trip");
template <int HD>
static __global__ void __launch_bounds__(DEC_CW_NT)
attn_dec_combine_wide_kernel(__half *out, const float *part, int nh, int ns, int early) {
    constexpr int KQ = DEC_CW_NT / HD, PER = DEC_MAX_SPLITS / KQ, NW = DEC_MAX_SPLITS / 32;
    static_assert(KQ >= 1 && PER * KQ == DEC_MAX_SPLITS && NW * 32 <= DEC_CW_NT, "the groups cover every split");
    ST_DECL;
    ST_BEGIN(ST_KEY(6, nh, ns));
    if (early) ops_cuda_pdl_trigger(); /* o_proj launches during the merge (OPS_EARLY_MERGE) */
    ops_cuda_pdl_wait();
    if (!early) ops_cuda_pdl_trigger();
    ST_MARK(1);
    const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
    const int d = tid % HD, q = tid / HD, k0 = q * PER;
    const float *base = dec_part_at<HD>(part, s, nh, h, ns, 0);
    __shared__ float wsh[DEC_MAX_SPLITS], red[KQ][HD], wmax[NW], wsum[NW];
    __shared__ int wna[NW];
    float mk = -INFINITY, lk = 0.0f;
    if (tid < ns) {
        mk = base[(size_t)tid * (HD + 2) + HD];
        lk = base[(size_t)tid * (HD + 2) + HD + 1];
    }
    float pv[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) pv[j] = k0 + j < ns ? base[(size_t)(k0 + j) * (HD + 2) + d] : 0.0f;
    if (tid < NW * 32) { /* the max and the active prefix (splits with keys are a prefix) */
        float m = mk;
        int na = mk != -INFINITY ? tid + 1 : 0;
        for (int o = 16; o > 0; o >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            na = max(na, __shfl_xor_sync(0xffffffffu, na, o));
        }
        if (lane == 0) wmax[tid >> 5] = m, wna[tid >> 5] = na;
    }
    __syncthreads();
    float M = wmax[0];
    int na = wna[0];
#pragma unroll
    for (int w = 1; w < NW; w++) M = fmaxf(M, wmax[w]), na = max(na, wna[w]);
    if (tid < NW * 32) {
        const float w = dec_split_weight(mk, M); /* 0 past ns (mk = -inf) */
        if (tid < DEC_MAX_SPLITS) wsh[tid] = w;
        float wl = w * lk;
        for (int o = 16; o > 0; o >>= 1) wl += __shfl_xor_sync(0xffffffffu, wl, o);
        if (lane == 0) wsum[tid >> 5] = wl;
    }
    __syncthreads();
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (k0 + j < na) acc += wsh[k0 + j] * pv[j];
    red[q][d] = acc;
    __syncthreads();
    ST_MARK(3);
    if (q) return;
    float L = 0.0f, a = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; w++) L += wsum[w];
#pragma unroll
    for (int g = 0; g < KQ; g++) a += red[g][d];
    out[(size_t)s * nh * HD + (size_t)h * HD + d] = __float2half(L > 0.0f ? a / L : 0.0f);
    ST_MARK(4);
}

#ifdef AWQD_STAMPS
extern "C" void attn_decode_stamps_dump(void) {
    static const char *const kinds[16] = {"?", "?", "?", "?", "attention (heads x splits)",
                                          "merge (heads x splits)", "wide merge (heads x splits)", "?",
                                          "?", "?", "?", "?", "?", "?", "?", "?"};
    st_dump("decode attention", kinds,
            "0 entry, 1 after the PDL wait, 2 first tile in (attention), 3 keys done / sums shared, 4 written, "
            "5 an empty split written, 6 at the PDL wait (attention, its first tile requested)");
}
#endif

/* ------------------------------------------------------------------------ */
/* host side                                                                 */
/* ------------------------------------------------------------------------ */

int ops_cuda__attn_decode_splits(const struct cuda_ctx *c, int n_seqs, int nkv) {
    /* (sequence, KV head) pairs that already give >= dec_lo (4) CTAs per SM
     * run unsplit; fewer are split up to ~dec_hi (2) CTAs per SM (~6 fit at
     * 35-38 KB of shared memory). Swept on an H200 in session 3 (Qwen3-8B
     * heads, lo,hi in 2,4 2,8 4,6 8,8 3,12): 4,4 best or within 4% at batch
     * 1/8/32/64, contexts 512/4096. On an H100 in session 5 (with the decode
     * linears of session 4-5) 4,2 beat 4,4 at every batch below 64 (same run,
     * whole model: batch 1 327 -> 366 tok/s, batch 32 / context 4096 2191 ->
     * 2509), equal at 64; 4,1 and 4,8 were no better at batch 1.
     * AWQD_CUDA_DEC_SPLIT=lo,hi overrides (tuning); AWQD_CUDA_DEC_NS=n forces
     * n splits (tuning); AWQD_CUDA_DEC_WAVE=0 drops the just-over-one-wave
     * clause (dec_split.h) */
    if (c->dec_ns > 0) return c->dec_ns < DEC_MAX_SPLITS ? c->dec_ns : DEC_MAX_SPLITS;
    return dec_split_rule(n_seqs * nkv, c->n_sms, c->dec_lo, c->dec_hi, c->dec_wave);
}

void ops_cuda__attn_decode_free(struct cuda_ctx *c) {
    cudaFree(c->dec_part);
    c->dec_part = NULL;
    c->dec_part_floats = 0;
}

/* Makes dec_part big enough for n_seqs. Sized generously (every n_seqs up
 * to max(n, 64)) so graph captures rarely allocate; a capture that must
 * allocates in relaxed capture mode; the old buffer is retired (a graph may
 * use it), not freed. */
static int dec_reserve(struct cuda_ctx *c, int n_seqs, int nh, int nkv, int hd) {
    int ns = ops_cuda__attn_decode_splits(c, n_seqs, nkv);
    size_t exact = ns > 1 ? (size_t)n_seqs * nh * ns * (hd + 2) : 0;
    if (exact <= c->dec_part_floats) return 0;
    size_t need = exact;
    for (int s = 1; s <= 64; s++) {
        int k = ops_cuda__attn_decode_splits(c, s, nkv);
        size_t f = k > 1 ? (size_t)s * nh * k * (hd + 2) : 0;
        if (f > need) need = f;
    }
    if (c->dec_part && c->n_retired == (int)(sizeof c->retired / sizeof c->retired[0]))
        return -ENOMEM;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (c->capturing) cudaThreadExchangeStreamCaptureMode(&mode);
    float *p = NULL;
    cudaError_t e = cudaMalloc((void **)&p, need * sizeof(float));
    if (c->capturing) cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return -ENOMEM;
    }
    if (c->dec_part) ops_cuda__retire(c, c->dec_part);
    c->dec_part = p;
    c->dec_part_floats = need;
    return 0;
}

/* the tensor-core kernel compiled for these switches (EMPTY, P2 as template
 * arguments; QK fixed by the caller) */
template <int HD, int G, bool QK>
static auto dec_tc_kernel_for(bool empty, bool p2) {
    return empty ? (p2 ? attn_dec_tc_kernel<HD, G, true, true, QK> : attn_dec_tc_kernel<HD, G, true, false, QK>)
                 : (p2 ? attn_dec_tc_kernel<HD, G, false, true, QK> : attn_dec_tc_kernel<HD, G, false, false, QK>);
}

template <int HD, int G>
static void dec_launch_g(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                         const __half *vc, const int *bt, const int *past, int nh, int nkv, int S,
                         int ns, const struct attn_batch *ab, float qscale, const struct dec_qk *qk) {
    cudaError_t e;
    if (HD <= 128 && !c->dec_simt) {
        /* tensor cores; K/V tiles only (the warps' O reuse them at the end) */
        constexpr int HDT = HD <= 128 ? HD : 128;
        size_t smem = (size_t)(2 * 64 + 16) * (HDT + 8) * 2; /* K, V tiles + Q */
        /* many splits (batch 1-4 by KV heads): the splits without keys skip
         * the work (DEC_EMPTY_NS); else the kernel without that branch (measured
         * 0.3-0.9% faster at batch 8 / 32, where every split has keys); qk:
         * the q/k-norm + RoPE + K/V write in the prologue */
        const bool p2 = (ab->block_size & (ab->block_size - 1)) == 0; /* the slot by shift and mask */
        const bool empty = ns >= DEC_EMPTY_NS;
        auto *kern = qk ? dec_tc_kernel_for<HDT, G, true>(empty, p2) : dec_tc_kernel_for<HDT, G, false>(empty, p2);
        dec_qk qa = qk ? *qk : dec_qk{};
        e = ops_cuda_launch(c, kern, dim3(ns, nkv, S), dim3(DEC_NT), smem, out, qkv, kc, vc, bt,
                            past, c->dec_part, nh, nkv, ab->max_blocks, ab->block_size, qscale,
                            c->dec_min_keys, c->pdl && c->dec_prewait, qa);
    } else {
        size_t smem = dec_smem_bytes(HD, G);
        if (smem > 48 * 1024)
            cudaFuncSetAttribute(attn_dec_kernel<HD, G>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        e = ops_cuda_launch(c, attn_dec_kernel<HD, G>, dim3(ns, nkv, S), dim3(DEC_NT), smem, out,
                            qkv, kc, vc, bt, past, c->dec_part, nh, nkv, ab->max_blocks,
                            ab->block_size, qscale, c->dec_min_keys);
    }
    if (e != cudaSuccess) {
        ops_cuda__fail(c, -EIO, "attention (decode)", cudaGetErrorString(e));
        return;
    }
    if (ns > 1 && !(c->skip & OPS_SKIP_COMBINE)) {
        if (c->dec_wide && ns >= c->dec_wide)
            e = ops_cuda_launch(c, attn_dec_combine_wide_kernel<HD>, dim3(nh, S), dim3(DEC_CW_NT), 0, out,
                                (const float *)c->dec_part, nh, ns, c->early & OPS_EARLY_MERGE);
        else
            e = ops_cuda_launch(c, attn_dec_combine_kernel<HD>, dim3(nh, S), dim3(DEC_NT), 0, out,
                                (const float *)c->dec_part, nh, ns, c->early & OPS_EARLY_MERGE);
        if (e != cudaSuccess) ops_cuda__fail(c, -EIO, "attention (decode combine)", cudaGetErrorString(e));
    }
}

template <int HD>
static void dec_launch(struct cuda_ctx *c, __half *out, const __half *qkv, const __half *kc,
                       const __half *vc, const int *bt, const int *past, int nh, int nkv, int S,
                       int ns, const struct attn_batch *ab, float qscale, const struct dec_qk *qk) {
    switch (nh / nkv) {
    case 1: dec_launch_g<HD, 1>(c, out, qkv, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qk); break;
    case 2: dec_launch_g<HD, 2>(c, out, qkv, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qk); break;
    case 4: dec_launch_g<HD, 4>(c, out, qkv, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qk); break;
    case 8: dec_launch_g<HD, 8>(c, out, qkv, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qk); break;
    default: dec_launch_g<HD, 16>(c, out, qkv, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qk); break;
    }
}

/* AWQD_CUDA_DEC_QK: decode batches of at least this many rows (graph
 * buckets) fold q/k-norm + RoPE + the K/V write into the attention; 0:
 * never. A process-wide knob (ops_cuda_dec_qk sets it for tests). Default 1,
 * every decode batch (H200 / 2x H200, session 59, the prologue's loads
 * first, against the separate kernel in one binary): Qwen3-8B batch 1 / 2 /
 * 4 1.005 / 0.995 / 0.976x a step at context 512, 0.974 / 0.990 / 1.00x at
 * 2048; qwen3-32b (64 layers) batch 1 / 2 / 4 0.993 / 0.979 / 0.976x at tp =
 * 1, 0.995 / 1.010 / 0.988x at tp = 2. Session 58 had it from 8 rows (batch
 * 8 0.965-0.986x): below 8 its first form lost 1-2% (docs/PERFORMANCE.md
 * "Session 58", "Session 59"). */
static env_knob g_dec_qk = ENV_KNOB_INIT("AWQD_CUDA_DEC_QK", 1, 0, 1 << 20);

extern "C" int ops_cuda_dec_qk(int min_rows) { return knob_set(&g_dec_qk, min_rows); }

int ops_cuda__attn_decode_fuse_qk(const struct cuda_ctx *c, const struct attn_batch *ab, int nh, int nkv,
                                  int hd) {
    const int from = knob_get(&g_dec_qk);
    if (!from || !ab->decode_fixed || ab->n_seqs < from || ab->n_rows != ab->n_seqs) return 0;
    if (hd > 128 || hd % 32 || c->dec_simt || !c->pdl || !c->dec_prewait || nkv <= 0 || nh % nkv ||
        !ops_cuda__attn_decode_ok(nh / nkv))
        return 0;
    return 1;
}

/* query heads per KV head the decode kernel handles */
int ops_cuda__attn_decode_ok(int G) { return G == 1 || G == 2 || G == 4 || G == 8 || G == 16; }

void ops_cuda__attn_decode(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                           int nkv, int hd, float scale, const struct attn_batch *ab,
                           const struct buf *k_cache, const struct buf *v_cache) {
    const int S = ab->n_seqs;
    /* the q/k-norm + RoPE + K/V write this batch's qk_norm_rope_kv left to us */
    struct dec_qk qk = c->qk_defer;
    c->qk_defer.on = 0;
    AWQD_ASSERT(ab->n_rows == S && nkv > 0 && nh % nkv == 0 && ops_cuda__attn_decode_ok(nh / nkv));
    AWQD_ASSERT(hd == 32 || hd == 64 || hd == 128 || hd == 256);
    if (S <= 0) return;
    if (c->rc && !c->capturing) return;
    int ns = ops_cuda__attn_decode_splits(c, S, nkv);
    int rc = dec_reserve(c, S, nh, nkv, hd);
    if (rc) {
        ops_cuda__fail(c, rc, "attention (decode)", "out of memory for the split partials");
        return;
    }
    const float qscale = scale * 1.4426950408889634f; /* exp2 domain */
    __half *o = (__half *)out->d;
    const __half *q = (const __half *)qkv->d, *kc = (const __half *)k_cache->d,
                 *vc = (const __half *)v_cache->d;
    const int *bt = (const int *)ab->block_table->d, *past = (const int *)ab->past->d;
    const struct dec_qk *qp = qk.on ? &qk : NULL;
    /* the fused prologue runs in the pre-wait path only (ops_cuda__attn_decode_fuse_qk) */
    AWQD_ASSERT(!qp || (hd <= 128 && c->pdl && c->dec_prewait && (void *)qk.kc == k_cache->d &&
                        (void *)qk.vc == v_cache->d));
    switch (hd) {
    case 32: dec_launch<32>(c, o, q, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qp); break;
    case 64: dec_launch<64>(c, o, q, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qp); break;
    case 128: dec_launch<128>(c, o, q, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, qp); break;
    default: dec_launch<256>(c, o, q, kc, vc, bt, past, nh, nkv, S, ns, ab, qscale, NULL); break;
    }
}
