/* w4a16_chain.cu — o_proj -> residual + RMSNorm -> gate|up (silu * up) ->
 * down_proj of one decode row as one persistent kernel (w4a16_chain.h).
 *
 * Roles (one block per SM, 16 warps in 8 pairs): pair m takes the block's
 * items j = m, m + 8, ... of the three phases in sequence (an item: 128-column
 * block cb, group g = two 64-deep K chunks of 8 n16 tiles) and owns the
 * ring stages m, m + 8, ... (D = S / 8 of them):
 *   lane 0 of its first warp (the issuer) copies the pair's items into its
 *       stages with the bulk-copy engine (weights 8 KB with an L2
 *       evict-first hint, scales 256 B, zeros 64 B; completion counted in
 *       bytes on the stage's "full" mbarrier), D items ahead of the one the
 *       pair computes; the first D before the PDL wait, the next one as
 *       soon as both warps hold a stage in registers (a 64-thread barrier).
 *       The copies never wait for x: across a phase boundary D items of the
 *       next phase are already on their way. (A producer warp, one lane per
 *       pair, was slower: its lanes' divergent waits serialized the ring.)
 *   both warps compute, each 4 of the item's 8 tiles: 8 mma.sync per tile
 *       with the LOP3 halves {1024 + q} / {1024 + 16 q} as they are; the
 *       offset and the zero point leave as (1024 + z) X per tile and group,
 *       X the group's sum of x (computed once per phase), so no HSUB2 per
 *       word.
 *   At the end of a phase each warp's sums are in shared slots [column
 *   block][pair]; the block adds the pairs in order. The block that holds
 *   a column block's last item finishes it; every other block of the
 *   column block writes its sum to the column block's partial slot (slot =
 *   its rank among the column block's blocks) as LL words (below). The
 *   finisher polls those slots, adds them in slot order, its own last, and
 *   applies the phase's epilogue:
 *         o:       rout = fp16(rin + fp16(sum)), ssq[cb] = sum of rout^2
 *         gate|up: act = fp16(silu(gate) * up)
 *         down:    y = fp16(sum)
 *   o's rout and ssq and gate|up's act go out as LL words too.
 *   A phase's x: o's is the call's x; gate|up's block polls all of rout
 *   and ssq and builds x = fp16(w * (rout * r)) (add_rmsnorm's arithmetic,
 *   the squares summed in another order: lane-strided, then a fixed
 *   shuffle tree); down's polls all of act. x lives in shared memory after
 *   the ring. Every sum has a fixed order: the results are bitwise the
 *   same call after call.
 *
 * LL words (as NCCL's low-latency protocol): a 32-bit payload and the
 * call's epoch in one 8-byte store, which is single-copy atomic, so a
 * reader polls the data itself; no fence, counter or flag sits between a
 * writer and its reader. The epoch (a device word, 0 at create) is the
 * last call's; each call's words carry epoch + 1, and the last block to
 * exit (an exit counter, reset by that block) moves the epoch on.
 *
 * Items: phase p's items are its (cb, g) pairs in memory order (cb major);
 * block b < P' = min(grid, I) takes [b I / P', (b + 1) I / P'): the same
 * bytes per block, one contiguous stream per block per matrix.
 *
 * Measured (H200, `awqd bench chain`; docs/PERFORMANCE.md "Session 33"):
 * 0.73-0.92x the three decode kernels on the five model shapes (session
 * 32, with counters and fences at the phase ends: 0.66-0.88x in the same
 * call). As a pure stream (AWQD_CHAIN_DBG=7) the ring moves the three
 * weights 1.17-1.31x faster than the three kernels; what it loses is the
 * consumers' pace (about 1.2x the stream's, so the ring cannot bank the
 * transitions), the blocks' entry spread (a late block's o items hold up
 * every block's gate|up) and the L2 round trips of each phase end. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_chain.h"
#include "kernels/cuda/w4a16_common.cuh"
#include "kernels/cuda/xchg.cuh" /* xchg_now: the wait timeouts */
#include "kernels/cuda/stamps.cuh" /* empty unless -DAWQD_STAMPS */

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define CH_ENABLED 0 /* bulk copies and mbarrier tx counts: sm_90 */
#else
#define CH_ENABLED 1
#endif

#define CH_CONSUMERS 16 /* consumer warps: 8 pairs, a pair per item, 4 of its 8 n16 tiles a warp */
#define CH_PAIRS (CH_CONSUMERS / 2)
#define CH_THREADS (CH_CONSUMERS * 32)
#define CH_W_BYTES 8192                  /* one item's weights: 2 chunks x 8 tiles x 512 B */
#define CH_STAGE (CH_W_BYTES + 256 + 64) /* + scales (8 tiles x 8 half2) + zeros (8 x 8 bytes) */
#define CH_MAX_STAGES 32
#define CH_MAX_LCB 16 /* column blocks a block may touch in one phase (shared slots of 4 KB) */
#define CH_TIMEOUT_NS 2000000000ull

struct ch_phase {
    const uint4 *qw;
    const uint32_t *sc;
    const uint8_t *zr;
    int n16a, kc, kg, nb; /* nb: 128-column blocks */
    int items;            /* nb * kg */
    int blocks;           /* blocks with items: min(grid, items), each >= 1 item */
    int k;                /* x length */
    int ncols;            /* valid outputs: N (plain), inter (gate|up) */
    int maxs;             /* partial slots per column block */
    unsigned long long *part; /* [nb][maxs][128] LL words: fp32 partial sums */
};

struct ch_args {
    ch_phase ph[3];
    const uint16_t *x, *rin, *nw;
    uint16_t *rout, *y;
    float eps;
    unsigned long long *ssq;  /* [o's nb] LL: fp32 sums of rout^2 per column block */
    unsigned long long *rll;  /* [o's nb * 64] LL: rout, two halves a word */
    unsigned long long *all;  /* [gate|up's nb * 32] LL: act, two halves a word */
    uint32_t *epoch; /* the last call's epoch (LL words carry this call's: epoch + 1) */
    int *exitc;      /* blocks that finished */
    int *errf;       /* 1: a wait timed out */
    int stages;
    int xoff;    /* byte offset of x in dynamic shared memory */
    int soff;    /* byte offset of the warps' column-block slots */
    int lcb;     /* slots: column blocks per block per phase at most */
    int gsoff;   /* byte offset of the groups' sums of x (maxk / 128 floats) */
    int nwoff;   /* byte offset of norm_w (H halves) */
    int dbg;     /* AWQD_CHAIN_DBG (timing only, results wrong): 1 no math, 2 no phase
                  * waits, 4 no phase ends, 8 weights only (no scale / zero copies),
                  * 16 no copies at all (the consumers' pace), 32 no x builds */
};


/* LL words ("low latency", as NCCL's LL protocol): a 32-bit payload and the
 * call's epoch in one aligned 8-byte store, which is single-copy atomic, so
 * a reader polls the data itself: no fence, no counter, no flag to read
 * first. Every word a call reads is written once per call. */
static __device__ __forceinline__ void ll_st(unsigned long long *p, uint32_t v, uint32_t ep) {
    const unsigned long long w = ((unsigned long long)ep << 32) | v;
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}
static __device__ __forceinline__ unsigned long long ll_ld(const unsigned long long *p) {
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}
/* w reloaded from p until it carries ep (or ~2 s: errf, garbage); bit 2 of
 * dbg (timing) takes it as it is */
static __device__ __noinline__ unsigned long long ll_poll_slow(int *errf, int dbg, const unsigned long long *p,
                                                               unsigned long long w, uint32_t ep) {
    unsigned spins = 0;
    unsigned long long t0 = 0;
    while ((uint32_t)(w >> 32) != ep && !(dbg & 2)) {
        if ((++spins & 255) == 0) {
            const unsigned long long t = xchg_now();
            if (!t0) t0 = t;
            else if (t - t0 > CH_TIMEOUT_NS) {
                atomicExch(errf, 1);
                break;
            }
        }
        __nanosleep(32); /* fewer polls in flight beside the weight stream */
        w = ll_ld(p);
    }
    return w;
}
static __device__ __forceinline__ unsigned long long ll_poll(const ch_args &a, const unsigned long long *p,
                                                             unsigned long long w, uint32_t ep) {
    return (uint32_t)(w >> 32) == ep ? w : ll_poll_slow(a.errf, a.dbg, p, w, ep);
}
/* Block-wide: the payloads of LL words [0, n) of src into dst (shared
 * memory), 4 words in flight per thread before any is checked. */
static __device__ void ll_fetch(const ch_args &a, const unsigned long long *src, int n, uint32_t ep, uint32_t *dst,
                                int tid) {
    for (int base = 0; base < n; base += 4 * CH_THREADS) {
        unsigned long long w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = base + tid + j * CH_THREADS;
            w[j] = i < n ? ll_ld(src + i) : 0;
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = base + tid + j * CH_THREADS;
            if (i >= n) continue;
            if ((uint32_t)(w[j] >> 32) != ep) w[j] = ll_poll(a, src + i, w[j], ep);
            dst[i] = (uint32_t)w[j];
        }
    }
}

/* The shares of a phase's items (host and device: the plan and the kernel
 * use the same arithmetic). Block b < P of the P = ph.blocks <= items blocks
 * with items takes [b I / P, (b + 1) I / P): at least one item each, so the
 * blocks of a column block are consecutive; blocks b >= P take none. */
static __host__ __device__ __forceinline__ void ch_share(const ch_phase &ph, int b, int *i0, int *n) {
    const int P = ph.blocks;
    *i0 = b < P ? (int)((long long)b * ph.items / P) : 0;
    *n = b < P ? (int)((long long)(b + 1) * ph.items / P) - *i0 : 0;
}
/* the block whose share holds item i */
static __host__ __device__ __forceinline__ int ch_owner(const ch_phase &ph, long long i) {
    return (int)(((i + 1) * ph.blocks - 1) / ph.items);
}

/* Column block cb of phase p, by the block that holds its last item (the
 * last of its nsl slots; its own sum, own, from shared memory): the other
 * slots' LL words in slot order, then the phase's epilogue. Every thread of
 * the block calls it. */
static __device__ void ch_finish(const ch_args &a, int p, int cb, int nsl, float own, uint32_t ep, int tid,
                                 float *sv, float *red) {
    const ch_phase &ph = a.ph[p];
    const int col = cb * 128 + tid;
    float v = 0.f;
    if (tid < 128) {
        const unsigned long long *src = ph.part + (size_t)cb * ph.maxs * 128 + tid;
        /* rin (o) with the first slots: one round trip when they are there */
        const uint16_t rh = p == 0 && col < ph.ncols ? a.rin[col] : 0;
        for (int s0 = 0; s0 < nsl - 1; s0 += 8) {
            unsigned long long w[8];
#pragma unroll
            for (int s = 0; s < 8; s++) w[s] = s0 + s < nsl - 1 ? ll_ld(src + (s0 + s) * 128) : 0;
#pragma unroll
            for (int s = 0; s < 8; s++) {
                if (s0 + s >= nsl - 1) continue;
                if ((uint32_t)(w[s] >> 32) != ep) w[s] = ll_poll(a, src + (s0 + s) * 128, w[s], ep);
                v += __uint_as_float((uint32_t)w[s]);
            }
        }
        v += own;
        if (p == 0) {
            const float yo = __half2float(__float2half_rn(v));
            const __half h = __float2half_rn(__half2float(__ushort_as_half(rh)) + yo);
            v = __half2float(h); /* rout */
            if (col < ph.ncols) a.rout[col] = __half_as_ushort(h);
        }
    }
    if (p == 0) {
        /* rout to every block as LL words (lane pairs), its sum of squares */
        float sq = tid < 128 && col < ph.ncols ? v * v : 0.f;
        const uint32_t hb = __half_as_ushort(__float2half_rn(v));
        const uint32_t nb = __shfl_down_sync(0xffffffffu, hb, 1);
        if (tid < 128 && !(tid & 1)) ll_st(a.rll + col / 2, hb | nb << 16, ep);
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if ((tid & 31) == 0 && tid < 128) red[tid >> 5] = sq;
        __syncthreads();
        if (tid == 0) ll_st(a.ssq + cb, __float_as_uint(red[0] + red[1] + red[2] + red[3]), ep);
    } else if (p == 1) {
        if (tid < 128) sv[tid] = v;
        __syncthreads();
        /* act j = cb * 64 + tid: tile tid / 8, gate row tid % 8 (padding
         * columns written too: down's x build reads whole words) */
        uint32_t hb = 0;
        const int j = cb * 64 + tid;
        if (tid < 64 && j < ph.ncols) {
            const int rho = (tid >> 3) * 16 + (tid & 7);
            hb = __half_as_ushort(__float2half_rn(w4_silu_mul(sv[rho], sv[rho + 8])));
        }
        const uint32_t nb = __shfl_down_sync(0xffffffffu, hb, 1);
        if (tid < 64 && !(tid & 1)) ll_st(a.all + j / 2, hb | nb << 16, ep);
    } else {
        if (tid < 128 && col < ph.ncols) store_h(a.y + col, v);
    }
}

/* A pair's next item to copy: its items of the three phases in sequence
 * (pair m takes the block's items j = m, m + 8, ...; j counts across the
 * phases). */
struct ch_cursor {
    int p, q, n, cb, g, jb; /* phase (3: none left), item in the block's share, share size, (cb, g), items before */
};
/* from phase c.p on (c.jb: the block's items before it), the pair's first item */
static __device__ void ch_cursor_phase(const ch_args &a, ch_cursor &c, int b, int m) {
    for (; c.p < 3; c.p++) {
        const ch_phase &ph = a.ph[c.p];
        int i0;
        ch_share(ph, b, &i0, &c.n);
        c.q = ((m - c.jb) % CH_PAIRS + CH_PAIRS) % CH_PAIRS;
        if (c.q < c.n) {
            c.cb = (i0 + c.q) / ph.kg;
            c.g = (i0 + c.q) - c.cb * ph.kg;
            return;
        }
        c.jb += c.n;
    }
}
static __device__ __forceinline__ void ch_cursor_next(const ch_args &a, ch_cursor &c, int b, int m) {
    c.q += CH_PAIRS;
    if (c.q < c.n) {
        const int kg = a.ph[c.p].kg;
        c.g += CH_PAIRS;
        while (c.g >= kg) c.g -= kg, c.cb++;
        return;
    }
    c.jb += c.n;
    c.p++;
    ch_cursor_phase(a, c, b, m);
}
/* the item at c into the stage at st (full barrier fb): weights, scales, zeros */
static __device__ __forceinline__ void ch_issue(const ch_args &a, const ch_cursor &c, uint32_t st, uint32_t fb,
                                                uint64_t pol) {
    const ch_phase &ph = a.ph[c.p];
    if (a.dbg & 16) { /* no copies: the consumers' own pace */
        mbar_arrive(fb);
        return;
    }
    const size_t gi = ((size_t)c.g * ph.n16a + c.cb * 8) * 8;
    const uint4 *wsrc = ph.qw + ((size_t)c.cb * ph.kc + 2 * c.g) * 256;
    mbar_expect_tx(fb, a.dbg & 8 ? CH_W_BYTES : CH_STAGE);
#if CH_ENABLED
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(st), "l"(wsrc), "r"(CH_W_BYTES), "r"(fb), "l"(pol) : "memory");
#else
    asm volatile("" ::"l"(wsrc), "l"(pol)); /* built below sm_90, never run there */
#endif
    if (!(a.dbg & 8)) {
        bulk_g2s(st + CH_W_BYTES, ph.sc + gi, 256, fb);
        bulk_g2s(st + CH_W_BYTES + 256, ph.zr + gi, 64, fb);
    }
}

static __global__ void __launch_bounds__(CH_THREADS, 1) k_chain(const ch_args a) {
    extern __shared__ __align__(128) unsigned char ch_smem[];
    __shared__ __align__(8) uint64_t bars[CH_MAX_STAGES]; /* full[S] */
    __shared__ float sv[128], red[4];
    const uint32_t ring0 = smem_u32(ch_smem), full0 = smem_u32(bars);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int P = gridDim.x, b = blockIdx.x, S = a.stages, D = S / CH_PAIRS;
    ST_DECL;
    ST_BEGIN(ST_KEY(1, a.ph[0].ncols, a.ph[1].ncols)); /* points: w4a16_chain_stamps_dump */

    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(full0 + 8 * s, 1);
#if CH_ENABLED
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    __syncthreads();

    /* Each pair feeds itself: lane 0 of its first warp (the issuer) copies
     * the pair's items into its D stages (m, m + 8, ...), D ahead of the one
     * the pair computes; the first D before the PDL wait (weights are
     * constant). No producer warp: its lanes' divergent waits serialized
     * the ring (session 32). */
    const int pair = warp >> 1, half = warp & 1; /* item j = pair + 8 k of the block; tiles 4 half .. + 3 */
    const bool issuer = half == 0 && lane == 0;
    uint64_t pol = 0; /* weights are read once: evict them first */
    ch_cursor cur = {0, 0, 0, 0, 0, 0};
    if (issuer) {
#if CH_ENABLED
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
        ch_cursor_phase(a, cur, b, pair);
        for (int k = 0; k < D && cur.p < 3; k++, ch_cursor_next(a, cur, b, pair))
            ch_issue(a, cur, ring0 + (pair + CH_PAIRS * k) * CH_STAGE, full0 + 8 * (pair + CH_PAIRS * k), pol);
    }
    ST_MARK(1);

    /* ---------------- consumers ---------------- */
    const int r = lane >> 2, c = lane & 3;
    uint16_t *sx = (uint16_t *)(ch_smem + a.xoff);
    int ks = 0;          /* this pair's next item's stage: pair + 8 ks */
    uint32_t kpar = 0;   /* and its fill's parity */
    int jb = 0;          /* the block's items in earlier phases */
    float *slots = (float *)(ch_smem + a.soff); /* [column block of the block][pair][128], zero */
    float *sxs = (float *)(ch_smem + a.gsoff);  /* [groups of x]: the sums of x */
    uint16_t *snw = (uint16_t *)(ch_smem + a.nwoff);  /* norm_w (constant: before the wait) */
    for (int i = tid; i < a.lcb * CH_PAIRS * 128; i += CH_CONSUMERS * 32) slots[i] = 0.f;
    for (int i = tid; i < a.ph[1].k / 8; i += CH_CONSUMERS * 32) ((uint4 *)snw)[i] = __ldg((const uint4 *)a.nw + i);
    pdl_wait(); /* x, rin, the epoch: written by earlier kernels */
    const uint32_t ep = *(volatile const uint32_t *)a.epoch + 1; /* this call's LL words */
    for (int p = 0; p < 3; p++) {
        const ch_phase &ph = a.ph[p];
        /* ---- this phase's x into shared memory ---- */
        if (a.dbg & 32) {
            /* timing: no x */
        } else if (p == 0) {
#pragma unroll 4
            for (int i = tid; i < ph.k / 8; i += CH_CONSUMERS * 32)
                ((uint4 *)sx)[i] = __ldcg((const uint4 *)a.x + i);
        } else if (p == 1) {
            /* o's column blocks' sums of squares (lane l polls l, l + 32, ...;
             * at most 2 a lane: H <= 8192 is checked at create) and rout, all
             * requested before any is checked; then lane l adds its sums in
             * order and a fixed shuffle tree adds the lanes (every block the
             * same sum) */
            const int nbo = a.ph[0].nb;
            unsigned long long q0 = lane < nbo ? ll_ld(a.ssq + lane) : 0;
            unsigned long long q1 = lane + 32 < nbo ? ll_ld(a.ssq + lane + 32) : 0;
            ll_fetch(a, a.rll, ph.k / 2, ep, (uint32_t *)sx, tid);
            float tot = 0.f;
            if (lane < nbo) tot += __uint_as_float((uint32_t)ll_poll(a, a.ssq + lane, q0, ep));
            if (lane + 32 < nbo) tot += __uint_as_float((uint32_t)ll_poll(a, a.ssq + lane + 32, q1, ep));
            for (int o = 16; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o);
            tot = __shfl_sync(0xffffffffu, tot, 0); /* lane 0's association for all */
            const float rr = rsqrtf(tot / (float)ph.k + a.eps);
            __syncthreads();
#pragma unroll 4
            for (int i = tid; i < ph.k / 8; i += CH_CONSUMERS * 32)
                dc_norm_scale(sx + i * 8, ((const uint4 *)snw)[i], rr);
        } else {
            pdl_launch();
            ll_fetch(a, a.all, ph.k / 2, ep, (uint32_t *)sx, tid); /* act */
        }
        __syncthreads();
        /* the sum of x over each group of 128 (warp w groups w, w + 16, ...;
         * lane l its 4 values, a fixed shuffle tree): the zero point and the
         * 1024 offset of the LOP3 halves come out as (1024 + z) X */
        for (int gq = warp; gq < ph.kg; gq += CH_CONSUMERS) {
            const uint2 v = *(const uint2 *)(sx + gq * 128 + lane * 4);
            const float2 f0 = __half22float2(*(const __half2 *)&v.x), f1 = __half22float2(*(const __half2 *)&v.y);
            float sum = (f0.x + f0.y) + (f1.x + f1.y);
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) sxs[gq] = sum;
        }
        __syncthreads();
        ST_MARK(2 + 2 * p); /* this phase's x ready */

        /* ---- this block's items: pair m the block's items j = m, m + 8, ... ---- */
        int i0, n;
        ch_share(ph, b, &i0, &n);
        const int cb0 = i0 / ph.kg, ncb = n ? (i0 + n - 1) / ph.kg - cb0 + 1 : 0;
        int q = ((pair - jb) % CH_PAIRS + CH_PAIRS) % CH_PAIRS;
        int cb = (i0 + q) / ph.kg, g = (i0 + q) - cb * ph.kg;
        float acc[4][2];
#pragma unroll
        for (int t = 0; t < 4; t++) acc[t][0] = acc[t][1] = 0.f;
        for (; q < n; q += CH_PAIRS) {
            const int js = pair + CH_PAIRS * ks;
            mbar_wait(full0 + 8 * js, kpar);
            const unsigned char *st = ch_smem + (size_t)js * CH_STAGE;
            uint4 wv[2][4];
            uint32_t s2[4], zz[4];
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int t = 0; t < 4; t++) wv[h][t] = ((const uint4 *)st)[(h * 8 + half * 4 + t) * 32 + lane];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                s2[t] = ((const uint32_t *)(st + CH_W_BYTES))[(half * 4 + t) * 8 + r];
                zz[t] = (st + CH_W_BYTES + 256)[(half * 4 + t) * 8 + r];
            }
            /* both warps of the pair have the stage in registers: refill it
             * with the pair's item D ahead (the generic reads before the
             * bulk copy's async-proxy writes) */
            asm volatile("bar.sync %0, 64;" ::"r"(2 + pair) : "memory"); /* barriers 2-9: the pairs */
            if (issuer && cur.p < 3) {
#if CH_ENABLED
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
                ch_issue(a, cur, ring0 + js * CH_STAGE, full0 + 8 * js, pol);
                ch_cursor_next(a, cur, b, pair);
            }
            if (++ks == D) ks = 0, kpar ^= 1;
            if (!(a.dbg & 1)) {
                /* x of chunks 2g, 2g + 1: lane c multiplies x[16c, 16c + 16); the
                 * lanes of rows r > 0 (mma columns never used: M = 1) read row 0 too */
                uint4 xa[2], xb[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint16_t *xp = sx + (2 * g + h) * 64 + 16 * c;
                    xa[h] = *(const uint4 *)xp;
                    xb[h] = *(const uint4 *)(xp + 8);
                }
                const float X = sxs[g]; /* the group's sum of x */
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    /* A = the LOP3 halves {1024 + q} (rows r) and {1024 + 16 q}
                     * (rows r + 8) as they are: the offset and the zero point
                     * leave as (1024 + z) X per group (no HSUB2 per word) */
                    const __half2 sh2 = *reinterpret_cast<const __half2 *>(&s2[t]);
                    const float slo = __low2float(sh2), shi = __high2float(sh2) * 0.0625f;
                    const float clo = (1024.f + (float)(zz[t] & 15)) * X;
                    const float chi = (1024.f + 16.f * (float)(zz[t] >> 4)) * X;
                    float d[4], e[4];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t *wt = &wv[h][t].x;
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            uint32_t af[4];
                            deq_codes(wt[u], af);
                            const uint32_t *xs = u < 2 ? &xa[h].x : &xb[h].x;
                            float *acc4 = u & 1 ? e : d;
                            if (h == 0 && u < 2) mma16816_z(acc4, af, xs[(u & 1) * 2], xs[(u & 1) * 2 + 1]);
                            else mma16816(acc4, af, xs[(u & 1) * 2], xs[(u & 1) * 2 + 1]);
                        }
                    }
                    acc[t][0] = fmaf(slo, (d[0] + e[0]) - clo, acc[t][0]);
                    acc[t][1] = fmaf(shi, (d[2] + e[2]) - chi, acc[t][1]);
                }
            }
            /* the next item of this warp: in another column block (or none)? */
            const int cbw = cb;
            g += CH_PAIRS;
            while (g >= ph.kg) g -= ph.kg, cb++;
            if (q + CH_PAIRS < n && cb == cbw) continue;
            if (c == 0) { /* this warp's sums of column block cbw: slot (cbw - cb0, pair), its tiles */
                float *dst = slots + ((cbw - cb0) * CH_PAIRS + pair) * 128 + half * 64 + r;
#pragma unroll
                for (int t = 0; t < 4; t++) dst[t * 16] = acc[t][0], dst[t * 16 + 8] = acc[t][1];
            }
#pragma unroll
            for (int t = 0; t < 4; t++) acc[t][0] = acc[t][1] = 0.f;
        }
        jb += n;
        __syncthreads(); /* every warp's slots written */
        ST_MARK(3 + 2 * p); /* this block's items of the phase done */
        if (a.dbg & 4) continue;
        /* ---- the block's part of each of its column blocks: the 8 pairs'
         * slots in pair order; the block with a column block's last item
         * finishes it, the others write their partial slot (slot = rank
         * among the column block's blocks) as LL words ---- */
        for (int l = tid >> 7; l < ncb; l += CH_CONSUMERS / 4) {
            const int cbl = cb0 + l, t = tid & 127;
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < CH_PAIRS; w++) v += slots[(l * CH_PAIRS + w) * 128 + t];
            const long long f = (long long)cbl * ph.kg;
            if (ch_owner(ph, f + ph.kg - 1) == b) slots[l * CH_PAIRS * 128 + t] = v; /* own: kept */
            else ll_st(ph.part + ((size_t)cbl * ph.maxs + (b - ch_owner(ph, f))) * 128 + t, __float_as_uint(v), ep);
        }
        __syncthreads();
        for (int l = 0; l < ncb; l++) {
            const long long f = (long long)(cb0 + l) * ph.kg;
            const int bl = ch_owner(ph, f + ph.kg - 1);
            if (bl != b) continue;
            ch_finish(a, p, cb0 + l, bl - ch_owner(ph, f) + 1, tid < 128 ? slots[l * CH_PAIRS * 128 + tid] : 0.f,
                      ep, tid, sv, red);
            __syncthreads(); /* sv, red reused */
        }
        /* zero the slots for the next phase (warps without items in a column
         * block leave its slot as it is) */
        for (int i = tid; i < ncb * CH_PAIRS * 128; i += CH_CONSUMERS * 32) slots[i] = 0.f;
    }
    /* the last block out moves the epoch on for the next call (every block
     * has read this call's by then) */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        if (atomicAdd(a.exitc, 1) == P - 1) {
            *a.epoch = ep;
            *a.exitc = 0;
            __threadfence();
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Host side                                                                */
/* ------------------------------------------------------------------------ */

struct w4a16_chain {
    ch_args a;
    int blocks, smem;
    void *dev; /* one allocation: the LL words, the epoch, two counters */
};

static void ch_err(char *err, size_t n, const char *fmt, const char *what) {
    if (err && n) snprintf(err, n, fmt, what);
}

/* Phase p's plan from its weight: the blocks with items, the partial slots
 * a column block needs (the most blocks sharing one) and, into *lcb, the
 * most column blocks one block's share touches. */
static void ch_plan_phase(ch_phase &ph, const struct w4a16_view &v, int grid, int *lcb) {
    ph.qw = (const uint4 *)v.qw;
    ph.sc = v.sc;
    ph.zr = v.zr;
    ph.n16a = v.n16a, ph.kc = v.kc, ph.kg = v.kg, ph.nb = v.n16a / 8;
    ph.items = ph.nb * ph.kg;
    ph.k = v.k;
    ph.ncols = v.out_cols;
    ph.blocks = ph.items < grid ? ph.items : grid;
    ph.maxs = 1;
    for (int cb = 0; cb < ph.nb; cb++) {
        const long long f = (long long)cb * ph.kg;
        const int m = ch_owner(ph, f + ph.kg - 1) - ch_owner(ph, f) + 1;
        if (m > ph.maxs) ph.maxs = m;
    }
    for (int b = 0; b < ph.blocks; b++) {
        int i0, n;
        ch_share(ph, b, &i0, &n);
        const int m = (i0 + n - 1) / ph.kg - i0 / ph.kg + 1;
        if (m > *lcb) *lcb = m;
    }
}

extern "C" int w4a16_chain_create(const struct w4a16_weight *o, const struct w4a16_weight *gu,
                                  const struct w4a16_weight *down, struct w4a16_chain **out,
                                  char *err, size_t errlen) {
    *out = NULL;
    struct w4a16_view v[3];
    w4a16_view_of(o, &v[0]);
    w4a16_view_of(gu, &v[1]);
    w4a16_view_of(down, &v[2]);
    if (v[0].cc_major < 9) return ch_err(err, errlen, "%s", "w4a16_chain: needs sm_90 (bulk copies)"), -ENOTSUP;
    for (int p = 0; p < 3; p++)
        if (v[p].group != 128 || v[p].bias || v[p].gate_up != (p == 1))
            return ch_err(err, errlen, "w4a16_chain: %s: group 128, no bias, layouts plain / gate|up / plain",
                          p == 0 ? "o" : p == 1 ? "gate|up" : "down"), -ENOTSUP;
    const int H = v[0].n, inter = v[1].out_cols;
    if (v[1].k != H || v[2].k != inter || v[2].n != H)
        return ch_err(err, errlen, "%s", "w4a16_chain: the shapes do not chain (o: K -> H, gate|up: H -> 2 I, down: I -> H)"), -ENOTSUP;
    if (H > 8192 || inter % 8)
        return ch_err(err, errlen, "%s", "w4a16_chain: hidden > 8192 or intermediate not a multiple of 8"), -ENOTSUP;
    int maxk = v[0].k > H ? v[0].k : H;
    if (inter > maxk) maxk = inter;
    const int P = v[0].sms;
    ch_args a = {};
    int lcb = 1;
    for (int p = 0; p < 3; p++) ch_plan_phase(a.ph[p], v[p], P, &lcb);
    if (lcb > CH_MAX_LCB)
        return ch_err(err, errlen, "%s", "w4a16_chain: too many column blocks per block (K too small for the grid)"), -ENOTSUP;
    const int xbytes = (maxk * 2 + 127) / 128 * 128, sbytes = lcb * CH_PAIRS * 128 * 4;
    const int gbytes = (maxk / 128 * 4 + 127) / 128 * 128, nwbytes = (H * 2 + 127) / 128 * 128;
    int stages = (v[0].smem_optin - xbytes - sbytes - gbytes - nwbytes - 1024) / CH_STAGE;
    if (stages > CH_MAX_STAGES) stages = CH_MAX_STAGES;
    const char *st_env = getenv("AWQD_CHAIN_STAGES"); /* timing: fewer stages */
    if (st_env && atoi(st_env) >= CH_PAIRS && atoi(st_env) < stages) stages = atoi(st_env);
    /* stage s belongs to pair s % 8 (it fills and takes it), so each
     * stage's rounds are met in order (with stages shared by two owners, one
     * running a round ahead passed the other's parity wait: session 32's
     * fault) */
    stages -= stages % CH_PAIRS;
    if (stages < CH_PAIRS) return ch_err(err, errlen, "%s", "w4a16_chain: x too large for shared memory beside the ring"), -ENOTSUP;

    struct w4a16_chain *ch = (struct w4a16_chain *)calloc(1, sizeof *ch);
    if (!ch) return ch_err(err, errlen, "%s", "w4a16_chain: out of memory"), -ENOMEM;
    /* LL words: the partial slots, o's sums of squares, rout, act; then the
     * epoch and two counters (all zero: epoch 0, no word carries call 1's) */
    size_t words = (size_t)a.ph[0].nb * 65 + (size_t)a.ph[1].nb * 32;
    for (int p = 0; p < 3; p++) words += (size_t)a.ph[p].nb * a.ph[p].maxs * 128;
    const size_t bytes = words * 8 + 16;
    if (cudaMalloc(&ch->dev, bytes) != cudaSuccess) {
        cudaGetLastError();
        free(ch);
        return ch_err(err, errlen, "%s", "w4a16_chain: out of device memory"), -ENOMEM;
    }
    if (cudaMemset(ch->dev, 0, bytes) != cudaSuccess) {
        cudaGetLastError();
        w4a16_chain_free(ch);
        return ch_err(err, errlen, "%s", "w4a16_chain: cudaMemset failed"), -ENOMEM;
    }
    unsigned long long *q = (unsigned long long *)ch->dev;
    for (int p = 0; p < 3; p++) {
        a.ph[p].part = q;
        q += (size_t)a.ph[p].nb * a.ph[p].maxs * 128;
    }
    a.ssq = q;
    q += a.ph[0].nb;
    a.rll = q;
    q += (size_t)a.ph[0].nb * 64;
    a.all = q;
    q += (size_t)a.ph[1].nb * 32;
    a.epoch = (uint32_t *)q;
    a.exitc = (int *)q + 1;
    a.errf = (int *)q + 2;
    a.stages = stages;
    a.xoff = stages * CH_STAGE;
    a.xoff = (a.xoff + 127) / 128 * 128;
    a.soff = a.xoff + xbytes;
    a.lcb = lcb;
    a.gsoff = a.soff + sbytes;
    a.nwoff = a.gsoff + gbytes;
    ch->smem = a.nwoff + nwbytes;
    ch->blocks = P;
    ch->a = a;
    cudaError_t e = cudaFuncSetAttribute(k_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, ch->smem);
    int per_sm = 0;
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_chain, CH_THREADS, ch->smem);
    if (e != cudaSuccess || per_sm < 1) {
        cudaGetLastError();
        w4a16_chain_free(ch);
        return ch_err(err, errlen, "w4a16_chain: the kernel does not fit an SM (%s)",
                      e != cudaSuccess ? cudaGetErrorString(e) : "occupancy 0"), -ENOTSUP;
    }
    *out = ch;
    return 0;
}

extern "C" void w4a16_chain_free(struct w4a16_chain *ch) {
    if (!ch) return;
    if (ch->dev) cudaFree(ch->dev);
    free(ch);
}

extern "C" int w4a16_chain_run(struct w4a16_chain *ch, const uint16_t *x, const uint16_t *rin,
                               const uint16_t *norm_w, float eps, uint16_t *rout, uint16_t *y,
                               cudaStream_t s, char *err, size_t errlen) {
    if (!x || !rin || !norm_w || !rout || !y || rout == rin)
        return ch_err(err, errlen, "%s", "w4a16_chain_run: bad arguments"), -EINVAL;
    ch_args a = ch->a;
    a.x = x, a.rin = rin, a.nw = norm_w, a.rout = rout, a.y = y, a.eps = eps;
    static const int dbg = getenv("AWQD_CHAIN_DBG") ? atoi(getenv("AWQD_CHAIN_DBG")) : 0;
    a.dbg = dbg;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(ch->blocks);
    cfg.blockDim = dim3(CH_THREADS);
    cfg.dynamicSmemBytes = ch->smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = w4a16_pdl(-1) ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_chain, (const ch_args)a);
    if (e != cudaSuccess) {
        ch_err(err, errlen, "w4a16_chain_run: launch: %s", cudaGetErrorString(e));
        return -EIO;
    }
    return 0;
}

extern "C" int w4a16_chain_error(struct w4a16_chain *ch) {
    int v = 0;
    if (cudaMemcpy(&v, ch->a.errf, 4, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    return v != 0;
}

extern "C" void w4a16_chain_stamps_dump(void) {
#ifdef AWQD_STAMPS
    static const char *const kinds[16] = {"?", "chain (H x inter)", "?", "?", "?", "?", "?", "?",
                                          "?", "?", "?", "?", "?", "?", "?", "?"};
    st_dump("w4a16_chain", kinds,
            "0 entry, 1 first copies issued, 2 o's x ready, 3 o's items done, 4 gate|up's x ready, "
            "5 its items done, 6 down's x ready, 7 its items done");
#endif
}

extern "C" void w4a16_chain_describe(const struct w4a16_chain *ch, int *blocks, int *stages,
                                     int *stage_bytes) {
    if (blocks) *blocks = ch->blocks;
    if (stages) *stages = ch->a.stages;
    if (stage_bytes) *stage_bytes = CH_STAGE;
}
