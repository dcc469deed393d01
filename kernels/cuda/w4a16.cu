/* w4a16.cu — fused INT4-weight x FP16-activation linear layers (w4a16.h).
 *
 * ======================================================================
 * Device weight layout (made by w4a16_upload, repacked on the host by
 * w4a16_repack.c; 4 bits per weight, no fp16 copy)
 * ======================================================================
 * Both kernels compute the transposed product on the tensor cores,
 *     D[n, m] = sum_k W^T[n, k] * x^T[k, m]      (mma.m16n8k16, fp32 accumulate)
 * so the weights are the 16x16 "A" operand and up to 8 rows of x the 16x8 "B"
 * operand. That makes M = 1..8 one mma column block (no 16-row padding).
 *
 * Columns are grouped in n16 tiles. Tile nt holds 16 physical rows rho:
 *   PLAIN:   rho -> column nt*16 + rho (columns >= N are zero padding)
 *   GATE_UP: rho < 8 -> gate column nt*8 + rho, rho >= 8 -> up column
 *            inter + nt*8 + rho - 8, so a thread's accumulator rows r and r+8
 *            are the matching gate and up values of one output column.
 * K is cut in chunks of 64 (kc = k / 64). For every (nt, kc) the 32 lanes of a
 * warp read one uint4 each (512 contiguous bytes):
 *   qw   uint4 [N16a/8][KC][8 tiles][32 lanes] (a 128-column block's chunk kc
 *        is 4 KB contiguous, its whole K range one contiguous stream).
 *        Word t (0..3) of lane (r = lane/4, c =
 *        lane%4) is the mma A fragment of k16 step t, with the k order inside
 *        the chunk permuted so that lane c multiplies x[16c .. 16c+15]:
 *        nibble (j>>1)*2 + hi + (j&1)*4 holds W[k = 64kc + 16c + 4t + j]
 *        [rho = r + 8*hi], j = 0..3. The permutation is applied to x too (it
 *        is just the order of the sum), so x fragments are two 16-byte loads.
 *        With that nibble order the LOP3 trick gives the A registers directly:
 *        (w & 0x000f000f) | 0x64006400     = {1024+q(r,j0), 1024+q(r,j1)}
 *        (w & 0x00f000f0) | 0x64006400     = {1024+16q(r+8,j0), ...+16q(r+8,j1)}
 *        and the same on w >> 8 for j = 2, 3.
 *   sc   uint32 [KG][N16a][8]  half2 {s(rho=r), s(rho=r+8)} of group g
 *   zr   uint8  [KG][N16a][8]  z(rho=r) | z(rho=r+8) << 4
 *   bias fp16   [N16a*16]      in physical (rho) order, optional
 * N16a = N16 rounded up to 8 tiles (zero padding) so a 128-column block never
 * reads out of bounds.
 *
 * Dequantization: subtracting the half2 {1024+z} ({1024+16z} for the high
 * nibbles) leaves q - z (16(q - z)) exactly. The skinny kernel multiplies by
 * the fp32 scale after each 64-deep mma chunk (exact dequantization); the
 * pipelined GEMM multiplies the fp16 value by the fp16 scale before the mma
 * (the fp16 dequantized weight, as a dequantize + cuBLAS path would use).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/carveout.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dc_plan.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/smem_limit.cuh"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_repack.h"
#include "kernels/cuda/w4a16_common.cuh"
#include "kernels/cuda/xchg.cuh"
#include "kernels/cuda/w4a16_gemm.h" /* gemm helper (Session 3): sm_90a large-M GEMM */
#include "kernels/cuda/nat_rule.h"

extern "C" {
#include "engine/ckpt.h"
}

/* ------------------------------------------------------------------------ */
/* The weight object                                                         */
/* ------------------------------------------------------------------------ */

struct w4a16_weight {
    int k, n, group;          /* checkpoint shape */
    int layout;               /* enum w4a16_layout */
    int out_cols;             /* N (PLAIN) or N/2 (GATE_UP) */
    int n16, n16a;            /* n16 tiles used / allocated (multiple of 8) */
    int kc, kg;               /* K/64 chunks, K/G groups */
    uint4 *qw;                /* [n16a][kc][32] */
    uint32_t *sc;             /* [kg][n16a][8] half2 */
    uint8_t *zr;              /* [kg][n16a][8] */
    uint16_t *bias;           /* [n16a*16] fp16 physical order, or NULL */
    int *cnt;                 /* [cnt_len] split-K arrival counters, zero between calls */
    int cnt_len;
    size_t bytes;             /* device bytes held */
    int sms;                  /* multiprocessors of the device */
    int cc_major;             /* compute capability major (PDL needs >= 9) */
    int smem_optin;           /* largest dynamic shared memory per block (opt-in), bytes */
    int smem_sm;              /* shared memory per multiprocessor, bytes */
    int dev;                  /* the device it lives on */
    uint32_t *gsp;            /* the device's K-split poll buffer (gsp_acquire), or NULL */
    size_t gsp_bytes;
};

#define CNT_LEN_MIN 4096

/* The decode K split's poll buffer (DC_F_GSPOLL, gs_poll_on): one a device, shared by its
 * weights (counted: the last w4a16_free frees it), every word GS_IDLE between calls. The
 * linears of a device run on one stream, so no two K-split calls share it at once. Sized for
 * a one-wave grid of two blocks a SM, four tiles a block, one row tile: sms x 2 x 4 x 4 x 32
 * words (w4a16_poll_bytes: 528 KB on 132 SMs; the memory plan counts it with the linear
 * workspace). Without it (no memory) the split counts arrivals instead. */
#define GSP_DEVS 64
static std::mutex g_gsp_mu;
static struct {
    uint32_t *p;
    size_t bytes;
    int refs;
} g_gsp[GSP_DEVS];
static void gsp_acquire(struct w4a16_weight *w) {
    std::lock_guard<std::mutex> lk(g_gsp_mu);
    if (w->dev < 0 || w->dev >= GSP_DEVS || w->sms <= 0) return;
    auto &b = g_gsp[w->dev];
    if (!b.refs) {
        const size_t bytes = w4a16_poll_bytes(w->sms);
        void *p = NULL;
        if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0xff, bytes) != cudaSuccess) {
            cudaFree(p);
            cudaGetLastError();
            return;
        }
        b.p = (uint32_t *)p;
        b.bytes = bytes;
    }
    b.refs++;
    w->gsp = b.p;
    w->gsp_bytes = b.bytes;
}
extern "C" size_t w4a16_poll_bytes(int sms) { return (size_t)(sms > 0 ? sms : 1) * 2 * 4 * 4 * 32 * 4; }
static void gsp_release(struct w4a16_weight *w) {
    if (!w->gsp) return;
    std::lock_guard<std::mutex> lk(g_gsp_mu);
    auto &b = g_gsp[w->dev];
    if (--b.refs == 0) {
        cudaFree(b.p);
        b.p = NULL;
        b.bytes = 0;
    }
    w->gsp = NULL;
}

/* ------------------------------------------------------------------------ */
/* Device helpers                                                            */
/* ------------------------------------------------------------------------ */

static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(bytes));
}
/* the same through L1 (.ca): for data that other blocks on the SM read too */
static __device__ __forceinline__ void cp_async16_ca(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, 16;" ::"r"(smem_u32(dst)), "l"(src));
}

/* The decode and skinny kernels stage x through L1 (session 21, H200:
 * docs/PERFORMANCE.md "Session 21"); AWQD_W4A16_XCG=1 stages it through L2
 * only, as before, for measurements. Read once. */
static int x_via_l2(void) {
    static const int v = getenv("AWQD_W4A16_XCG") && !strcmp(getenv("AWQD_W4A16_XCG"), "1");
    return v;
}

/* Programmatic dependent launch (pdl_wait / pdl_launch, w4a16_common.cuh):
 * x, y, workspace and counters are written by earlier kernels and are read
 * only after pdl_wait(); weights, scales, zeros and bias are constant after
 * upload, so they are prefetched before the wait. */

/* Scaled A fragment: (q - z) * s in fp16. nz_hi = {-(64+z), ...} for rows r+8. */
static __device__ __forceinline__ void deq_scaled(uint32_t w, uint32_t mlo, uint32_t nz_hi,
                                                  uint32_t s_lo, uint32_t s_hi, uint32_t a[4]) {
    const uint32_t sixteenth = 0x2c002c00u; /* {1/16, 1/16} */
    uint32_t w8 = w >> 8;
    a[0] = hmul2u(hsub2u(lop3_lo(w), mlo), s_lo);
    a[1] = hmul2u(hfma2u(lop3_hi(w), sixteenth, nz_hi), s_hi);
    a[2] = hmul2u(hsub2u(lop3_lo(w8), mlo), s_lo);
    a[3] = hmul2u(hfma2u(lop3_hi(w8), sixteenth, nz_hi), s_hi);
}

struct epi_args {
    uint16_t *y;          /* fp16 [M, ldy] */
    const uint16_t *bias; /* fp16 [n16a*16] physical order, or NULL */
    int m;                /* rows */
    int n;                /* PLAIN: valid columns */
    int ldy;              /* output row stride (N, or inter for GATE_UP) */
    int gate_up;          /* 1: silu(gate) * up */
};

/* The decode kernel's optional prologue (w4a16_linear_norm): x = RMSNorm(rin
 * + delta) * w built by every block, rout = rin + delta written by block 0.
 * All fp16 [M, K] (w: [K]); delta may be NULL (x = RMSNorm(rin) * w). */
struct norm_args {
    const uint16_t *rin, *delta, *w;
    uint16_t *rout;
    float eps;
};

/* Split-K: every block of one output tile writes its NACC fp32 values per
 * thread to part[(tile * ksplit + split) * NACC * NT + i * NT + tid]; the
 * last block to arrive (atomic counter) adds the ksplit partials in split
 * order (deterministic) and returns 1 with the sum in acc. The counter is
 * reset for the next call. */
template <int NACC, int NT>
static __device__ __forceinline__ int splitk_reduce(float *acc, float *part, int *cnt, int tile,
                                                    int split, int ksplit, int tid, bool writer) {
    __shared__ int s_last;
    float *mine = part + ((size_t)tile * ksplit + split) * NACC * NT;
    if (writer) {
#pragma unroll
        for (int i = 0; i < NACC; i++) __stcg(mine + i * NT + tid, acc[i]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int old = atomicAdd(cnt + tile, 1);
        s_last = old == ksplit - 1;
        if (s_last) cnt[tile] = 0;
    }
    __syncthreads();
    if (!s_last) return 0;
    __threadfence();
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = 0.f;
    for (int s = 0; s < ksplit; s++) {
        const float *p = part + ((size_t)tile * ksplit + s) * NACC * NT;
#pragma unroll
        for (int i = 0; i < NACC; i++) acc[i] += __ldcg(p + i * NT + tid);
    }
    return 1;
}

/* 16 bytes into rank 0's shared memory at the address p has in this block's */
static __device__ __forceinline__ void cl_store0(const float *p, float a, float b, float c, float d) {
#if W4_CL_OK
    uint32_t ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(ra) : "r"((uint32_t)__cvta_generic_to_shared(p)));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(ra), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#else
    (void)p, (void)a, (void)b, (void)c, (void)d;
#endif
}

/* Split-K inside a thread-block cluster (sm_90): the ksplit blocks of one
 * output tile form a cluster (cluster rank == split). Each writes its NACC
 * values per thread to its own shared memory (red, NACC * NT floats, free at
 * this point), the cluster barrier publishes them, and rank 0 adds the ranks'
 * values in split order 0..S-1 through distributed shared memory (the same
 * additions in the same order as splitk_reduce: bitwise the same result),
 * then a second barrier keeps the other blocks' shared memory alive until it
 * has read it. No workspace, no atomics, no global round trips. Returns 1 in
 * rank 0 (which runs the epilogue). Only launched as a cluster on sm_90+. */
template <int NACC, int NT>
static __device__ __forceinline__ int cluster_reduce(float *acc, float *red, int ksplit, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __syncthreads(); /* every warp is done with the region red reuses */
#pragma unroll
    for (int i = 0; i < NACC; i++) red[i * NT + tid] = acc[i];
    cl_arrive();
    cl_wait();
    const uint32_t rank = (uint32_t)cl_rank();
    if (rank == 0) {
        const uint32_t base = smem_u32(red) + (uint32_t)tid * 4;
#pragma unroll
        for (int i = 0; i < NACC; i++) acc[i] = 0.f;
        for (int sp = 0; sp < ksplit; sp++) {
            uint32_t rb;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(base), "r"(sp));
            float v[NACC];
#pragma unroll
            for (int i = 0; i < NACC; i++)
                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v[i]) : "r"(rb + (uint32_t)(i * NT * 4)) : "memory");
#pragma unroll
            for (int i = 0; i < NACC; i++) acc[i] += v[i];
        }
    }
    cl_arrive();
    cl_wait();
    return rank == 0;
#else
    (void)acc, (void)red, (void)ksplit, (void)tid;
#if defined(__CUDA_ARCH__)
    __trap(); /* launched as a cluster only on sm_90+: code built for less cannot reduce */
#endif
    return 1;
#endif
}

/* ------------------------------------------------------------------------ */
/* Skinny kernel (decode, M <= 8*MT): block = 8 warps = 8 n16 tiles (128     */
/* columns) x one K range (split-K across blocks). The block's x rows and    */
/* scales/zeros for its K range go to shared memory once; each warp then     */
/* streams its tile's 512-byte chunks through a SK_STAGES-deep cp.async ring */
/* (every lane reads back exactly the 16 bytes it copied, so no barrier), so */
/* many loads are in flight without holding registers.                       */
/* ------------------------------------------------------------------------ */

#include "kernels/cuda/stamps.cuh" /* empty unless -DAWQD_STAMPS */

/* SK_WARPS, SK_STAGES, the x slice limits, the shared memory layout and
 * the split at M = 17..32: kernels/cuda/sk_plan.h (plain C, also checked by
 * a CPU test) */
#include "kernels/cuda/sk_plan.h"

template <int MT, int ST, bool CL>
static __global__ void __launch_bounds__(SK_WARPS * 32)
k_skinny(const uint4 *__restrict__ qw, const uint32_t *__restrict__ sc,
         const uint8_t *__restrict__ zr, const uint16_t *__restrict__ x, int K, int n16a,
         int KC, int G, int cps, int ksplit, epi_args ep, float *__restrict__ part,
         int *__restrict__ cnt, int xcg) {
    extern __shared__ __align__(16) unsigned char smem[];
    ST_DECL;
    ST_BEGIN(ST_KEY(5, K, ep.n));
    const int nb = blockIdx.x, split = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, c = lane & 3;
    const int kc0 = split * cps, kc1 = min(KC, kc0 + cps);
    const int n = kc1 - kc0;
    const int nt0 = nb * SK_WARPS, nt = nt0 + warp;
    const sk_smem L = sk_layout(ep.m, cps, G, ST);
    uint16_t *sx = (uint16_t *)(smem + L.x_off);
    uint4 *ring = (uint4 *)(smem + L.w_off) + warp * ST * 32;
    uint32_t *ssc = (uint32_t *)(smem + L.s_off);
    uint8_t *szr = smem + L.z_off;
    const int g0 = kc0 * 64 / G, g1 = (kc1 * 64 + G - 1) / G;

    /* Constant data first (scales, zeros, the first ring stages), before the
     * programmatic-launch wait; x (written by the previous kernel) after it. */
    {
        for (int i = tid; i < (g1 - g0) * 16; i += SK_WARPS * 32) {
            int g = i >> 4, ch = i & 15;
            cp_async16((unsigned char *)ssc + g * 256 + ch * 16,
                       (const unsigned char *)(sc + ((size_t)(g0 + g) * n16a + nt0) * 8) + ch * 16, 16);
        }
        for (int i = tid; i < (g1 - g0) * 4; i += SK_WARPS * 32) {
            int g = i >> 2, ch = i & 3;
            cp_async16(szr + g * 64 + ch * 16, zr + ((size_t)(g0 + g) * n16a + nt0) * 8 + ch * 16, 16);
        }
    }
    /* chunk kc of this warp's tile: qw[((nb * KC + kc) * 8 + warp) * 32 + lane] */
    const uint4 *wp = qw + (((size_t)nb * KC + kc0) * 8 + warp) * 32 + lane;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < n) cp_async16(ring + s * 32 + lane, wp + (size_t)s * 256, 16);
        cp_async_commit();
    }
    pdl_wait();
    ST_MARK(1);
    {   /* x rows [0, M) x K range, through L1: the column blocks of one
         * split on an SM read the same x (xcg: L2 only, as before session 21) */
        const int cpr = n * 8; /* 16-byte chunks per row */
        for (int i = tid; i < ep.m * cpr; i += SK_WARPS * 32) {
            int row = i / cpr, ch = i - row * cpr;
            uint16_t *d = sx + row * L.xstride + ch * 8;
            const uint16_t *g = x + (size_t)row * K + kc0 * 64 + ch * 8;
            if (xcg) cp_async16(d, g, 16);
            else cp_async16_ca(d, g);
        }
        cp_async_commit();
    }
    cp_async_wait<0>(); /* scales, zeros, x and the first ring stages */
    __syncthreads();
    ST_MARK(2);

    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    /* group bookkeeping without divisions: gc = chunk position inside group */
    const int cpg = G / 64;
    int gc = kc0 % cpg;
    const uint32_t *sp = ssc + warp * 8 + r; /* this lane's scale pair, group 0 */
    const uint8_t *zp = szr + warp * 8 + r;
    uint32_t mlo, mhi;
    float slo, shi;
    auto load_group = [&]() {
        uint32_t s2 = *sp, z = *zp;
        sp += 64;
        zp += 64;
        __half2 sh2 = *reinterpret_cast<__half2 *>(&s2);
        slo = __low2float(sh2);
        shi = __high2float(sh2) * 0.0625f;
        mlo = magic_lo(z & 15);
        mhi = magic_hi(z >> 4);
    };
    load_group();
    bool xv[MT];
    const uint16_t *xr[MT];
#pragma unroll
    for (int i = 0; i < MT; i++) {
        int m = i * 8 + r;
        xv[i] = m < ep.m;
        xr[i] = sx + (xv[i] ? m : 0) * L.xstride + 16 * c;
    }
    const uint4 *wnext = wp + (size_t)(ST - 1) * 256; /* next chunk to fetch */

    for (int it0 = 0; it0 < n; it0 += ST) {
#pragma unroll
        for (int st = 0; st < ST; st++) {
            const int it = it0 + st;
            if (it >= n) break;
            if (it + ST - 1 < n)
                cp_async16(ring + ((st + ST - 1) % ST) * 32 + lane, wnext, 16);
            wnext += 256;
            cp_async_commit();
            cp_async_wait<ST - 1>();
            const uint4 wv = ring[st * 32 + lane];
            uint4 xa[MT], xb[MT];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                if (xv[i]) {
                    xa[i] = *(const uint4 *)(xr[i]);
                    xb[i] = *(const uint4 *)(xr[i] + 8);
                } else {
                    xa[i] = xb[i] = make_uint4(0, 0, 0, 0);
                }
                xr[i] += 64;
            }
            /* two chains (t even / odd) started from zero: no accumulator reset */
            float d[MT][4], e[MT][4];
            const uint32_t *wt = &wv.x;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                uint32_t a[4];
                deq_raw(wt[t], mlo, mhi, a);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const uint32_t *xs = t < 2 ? &xa[i].x : &xb[i].x;
                    float *acc4 = t & 1 ? e[i] : d[i];
                    if (t < 2)
                        mma16816_z(acc4, a, xs[(t & 1) * 2], xs[(t & 1) * 2 + 1]);
                    else
                        mma16816(acc4, a, xs[(t & 1) * 2], xs[(t & 1) * 2 + 1]);
                }
            }
#pragma unroll
            for (int i = 0; i < MT; i++) {
                acc[i][0] = fmaf(slo, d[i][0] + e[i][0], acc[i][0]);
                acc[i][1] = fmaf(slo, d[i][1] + e[i][1], acc[i][1]);
                acc[i][2] = fmaf(shi, d[i][2] + e[i][2], acc[i][2]);
                acc[i][3] = fmaf(shi, d[i][3] + e[i][3], acc[i][3]);
            }
            if (++gc == cpg) {
                gc = 0;
                if (it + 1 < n) load_group();
            }
        }
    }
    cp_async_wait<0>();
    ST_MARK(3);
    pdl_launch(); /* after the main loop: measured (H200, session 3) faster for this kernel than
                   * before the wait (q|k|v M = 1 back to back 9.9 -> 11.7 us when moved) */

    if (CL) { /* the ring (>= MT * 4 KB) holds the cluster partials */
        if (!cluster_reduce<MT * 4, SK_WARPS * 32>(&acc[0][0], (float *)(smem + L.w_off), ksplit, tid))
            return;
    } else if (ksplit > 1 &&
               !splitk_reduce<MT * 4, SK_WARPS * 32>(&acc[0][0], part, cnt, nb, split, ksplit, tid, true)) {
        return;
    }
    ST_MARK(4);
#pragma unroll
    for (int i = 0; i < MT; i++)
        w4_epilogue(ep, nt, r, i * 8 + 2 * c, acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    ST_MARK(5);
}

/* ------------------------------------------------------------------------ */
/* Decode kernel (M <= 24, G = 128): whole columns per block, no split-K    */
/* across blocks, every weight read once with a register ring.               */
/*                                                                            */
/* Decomposition. Block b owns TB consecutive n16 tiles (16*TB physical      */
/* columns) and all of K; its 8 warps cut the K/128 groups into 8            */
/* contiguous ranges, warp w accumulating its range for the TB tiles. The    */
/* block adds the 8 partials in warp order (= k order) through shared memory */
/* after one barrier: deterministic, no workspace, no atomics, no cluster.   */
/*                                                                            */
/* Streaming. Every lane keeps an 8-deep ring of 16-byte weight loads in     */
/* registers (ld.global.nc, L1 no-allocate): 8 chunks = 4 KB in flight per   */
/* warp, 64 KB per SM at two blocks per SM. One ring turn is UG = 4 / TB     */
/* groups x 2 chunks x TB tiles = 8 chunks, fully unrolled, so every slot is */
/* a compile-time register and a consumed slot is refilled with the chunk    */
/* one turn ahead (a predicated load: no branch in the turn). Scales and     */
/* zeros ride in a ring of their own, one turn ahead too. The first turn is  */
/* requested before the programmatic-launch wait (the weights are constant), */
/* and the kernel triggers its dependents at once, so that the next PDL      */
/* kernel's blocks start as soon as ours retire. (ptxas moves the refills to */
/* the end of each turn; keeping them beside their chunks was measured       */
/* slower, docs/KERNELS.md.)                                                 */
/*                                                                            */
/* Per chunk and tile: deq_raw (w4a16_common.cuh, as the skinny kernel):    */
/* 16 LOP3 (+4 shifts) give {1024 + q} (rows r) and {1024 + 16 q} (rows      */
/* r + 8), 16 HSUB2 of the group's half2 {1024 + z}, {1024 + 16 z} make them */
/* q - z and 16 (q - z), exact in fp16, and one mma per k16 step takes them. */
/* (Until session 34 the zero point was a second mma per step with A =      */
/* -(1024 + z), 4 mma instead of 16 HSUB2; at M = 1 the tensor pipe, ~8      */
/* cycles a mma.sync per scheduler, bounded the work after the wait: one mma */
/* is 0.94-0.99x the time at M = 1, 0.88x at M = 16 on the H200, measured    */
/* as HADD2 of the negated constants, bitwise the same values.) Products     */
/* exact, fp32 sums; one scale                                               */
/* multiply-add per group. x (M rows of the warp's K range) goes to shared   */
/* memory after the wait; lanes of rows >= M read row M - 1 (their mma       */
/* columns are never stored), so no lane needs a predicate. Every block      */
/* reads all of x (M x K x 2 bytes; at M = 8 and 2 tiles per block as many   */
/* bytes as its weights), so x goes through L1 (cp.async.ca): the blocks on  */
/* one SM share its lines. Through L2 only (.cg) Qwen3-8B q|k|v took 5.9 /   */
/* 7.2 / 8.8 / 9.9 us at M = 1 / 2 / 4 / 8 back to back, through L1 6.0 /    */
/* 6.1 / 6.4 / 8.0 (H200, session 21; AWQD_W4A16_XCG=1 goes back). From      */
/* M = 6 (XP) x arrives group by group and the first column's turns wait    */
/* for their own group only (session 42: 128 KB a block at M = 16 took      */
/* 2.0-2.4 us, the SM's share of L2 bandwidth; see dc_xp_min_m).             */
/*                                                                            */
/* ZM (session 69, MT = 1): the zero point leaves through the sums of x per  */
/* group, S = sum of x over the group's 128 k: the codes enter the mma as    */
/* {1024 + q} / {1024 + 16 q} straight from LOP3 (no HSUB2: 6 instead of 10  */
/* instructions a word), and each group's chain ends with d -= (1024 + z) S  */
/* (4 FMA a tile), exact up to fp32 rounding of a sum ~1024 x larger than    */
/* the result (2^-24 of it: far below fp16's 2^-11). S comes from one more   */
/* mma a k16 step, A = ones (16 x 16) and B = the x fragment the weights'   */
/* mma take: D = S in every row, so each lane holds the sums of its own x    */
/* rows (2c, 2c + 1) in the registers its correction needs, for all TB      */
/* tiles at once. The tensor pipe has room at M <= 8 (the ALU pipe bounds    */
/* the loop); the extra mma costs where it doubles the tensor work of a     */
/* short range (one tile a block, one ring turn a warp: dc_zm_form). Session*/
/* 68's sums made by x's producer (the NORM prologue, or the caller) were    */
/* no faster and needed a producer per linear; session 66's sums made by    */
/* the kernel's threads after the wait sat between x and the first mma.    */
/* ZM1 (session 70, form 2, M = 1): every column of x's fragment is then the */
/* same row, so one mma a group can add up the whole group (each column     */
/* takes another 16 of its 128 values; two shuffles add the columns): one   */
/* mma a group instead of one a k16 step, cheap enough for one tile a block.*/
/* ------------------------------------------------------------------------ */

/* DC_WARPS, DC_MAX_M, DC_SMEM_MAX, the shared memory layout and the launch
 * plan: kernels/cuda/dc_plan.h (plain C, also checked by a CPU test) */
#define DC_F_LATE 1 /* k_decode flags: trigger the dependents after the main loop */
#define DC_F_XCG 2  /* x staged through L2 only (cp.async.cg), as before session 21 */
#define DC_F_GSPOLL 4 /* the K split's sums polled by its last rank in part (gs_poll_on), not counted */
#define DC_F_PF_SHIFT 8 /* bits 8-10: L2 prefetch distance in turns beyond the ring (0: none) */

/* Predicated loads (pred == 0: dst keeps its value; no branch). Weights:
 * read-only path, no L1 allocation (each byte is read once). */
static __device__ __forceinline__ void dc_ld16(uint4 &d, const uint4 *p, int pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
                 "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "+r"(d.x), "+r"(d.y), "+r"(d.z), "+r"(d.w)
                 : "l"(p), "r"(pred));
}
static __device__ __forceinline__ void dc_ld4(uint32_t &d, const uint32_t *p, int pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.nc.u32 %0, [%1];\n\t}"
                 : "+r"(d) : "l"(p), "r"(pred));
}
static __device__ __forceinline__ void dc_ld1(uint32_t &d, const uint8_t *p, int pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t@q ld.global.nc.u8 %0, [%1];\n\t}"
                 : "+r"(d) : "l"(p), "r"(pred));
}
/* d (+)= A * B, not volatile: the compiler may interleave independent chains */
template <bool ZERO>
static __device__ __forceinline__ void dc_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (ZERO)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d (+)= ones (16 x 16) * B: every row of D the column sums of B (ZM) */
template <bool ZERO>
static __device__ __forceinline__ void dc_mma_ones(float d[4], uint32_t b0, uint32_t b1) {
    const uint32_t ones[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    dc_mma<ZERO>(d, ones, b0, b1);
}

/* The per-lane state of one warp of the decode kernel. */
template <int MT, int TB>
struct dc_state {
    static constexpr int UG = 4 / TB;     /* groups per ring turn */
    static constexpr int NW = 2 * UG * TB; /* weight slots: 8 chunks */
    static constexpr int NZ = UG * TB;     /* scale / zero slots */
    uint4 wr[NW];       /* chunk (gi, kk, tb) of the turn in slot (gi*2 + kk)*TB + tb */
    uint32_t sr[NZ];    /* half2 {s(r), s(r+8)} of (gi, tb) in slot gi*TB + tb */
    uint32_t zq[NZ];    /* z(r) | z(r+8) << 4 */
    float acc[TB][MT][4];
    const uint4 *wp;    /* chunk 0 of tile 0 of the current turn (+ lane) */
    const uint32_t *sp; /* scales of group 0 of the turn, tile 0 (+ r) */
    const uint8_t *zp;
    size_t gs;          /* elements per group in sc / zr: n16a * 8 */
    const uint16_t *xr[MT]; /* x of the turn's chunk 0 for this lane's rows (+ 16c) */
    int xw;             /* x still arriving: group g < UG of the range is cp.async group g, the rest group UG */
};

/* Requests the weights, scales and zeros of group gi + ahead (counted from
 * the current turn's first) into ring slot gi (pred: this lane's range has
 * that group). */
template <int MT, int TB>
static __device__ __forceinline__ void dc_fetch_group(dc_state<MT, TB> &s, int gi, int ahead, int pred) {
#pragma unroll
    for (int tb = 0; tb < TB; tb++) {
        dc_ld4(s.sr[gi * TB + tb], s.sp + (gi + ahead) * s.gs + tb * 8, pred);
        dc_ld1(s.zq[gi * TB + tb], s.zp + (gi + ahead) * s.gs + tb * 8, pred);
    }
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
        for (int tb = 0; tb < TB; tb++)
            dc_ld16(s.wr[(gi * 2 + kk) * TB + tb], s.wp + (2 * (gi + ahead) + kk) * 256 + tb * 32, pred);
}

/* L2 prefetch (the plan's pf, dc_plan.h: one turn where one block fits per
 * SM; AWQD_W4A16_DC_PF=0..7 forces it): the turn of groups [g, g +
 * UG) of this warp's range, 32 lines of 128 bytes, one per lane (row lane /
 * (4 TB) of the turn's 2 UG chunk rows of TB x 512 bytes, line lane % (4
 * TB)), and each group's scales (lanes 0..UG-1) and zeros (lanes
 * UG..2UG-1); groups past ng are skipped. wb / sb / zb: the current turn's
 * group (the state's pointers less the lane's offset), g and ng counted from
 * it. A hint: it holds no register and no shared memory, so it runs ahead
 * of the register ring, whose loads then come from L2 (docs/PERFORMANCE.md
 * "Session 24"). */
template <int TB>
static __device__ __forceinline__ void dc_prefetch_turn(const uint4 *wb, const uint32_t *sb, const uint8_t *zb,
                                                        size_t gs, int g, int ng, int lane) {
    constexpr int UG = 4 / TB, LPR = 4 * TB;
    const int row = lane / LPR, line = lane - row * LPR;
    if (g + row / 2 < ng) asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + (size_t)(2 * g + row) * 256 + line * 8));
    if (lane < UG && g + lane < ng) asm volatile("prefetch.global.L2 [%0];" ::"l"(sb + (size_t)(g + lane) * gs));
    if (lane >= UG && lane < 2 * UG && g + lane - UG < ng)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(zb + (size_t)(g + lane - UG) * gs));
}

/* This warp's pointers at column tile t0: chunk 0 of its first group (+
 * lane), and that group's scales and zeros (+ r). */
template <int MT, int TB>
static __device__ __forceinline__ void dc_at_column(dc_state<MT, TB> &s, const uint4 *qw, const uint32_t *sc,
                                                    const uint8_t *zr, int t0, int KC, int gw0, int lane, int r) {
    s.wp = qw + (((size_t)(t0 >> 3) * KC + 2 * gw0) * 8 + (t0 & 7)) * 32 + lane;
    s.sp = sc + gw0 * s.gs + t0 * 8 + r;
    s.zp = zr + gw0 * s.gs + t0 * 8 + r;
}

/* cp.async.wait_group n, n in [0, 4] (a constant once dc_turn is unrolled) */
static __device__ __forceinline__ void dc_x_wait(int n) {
    switch (n) {
    case 4: cp_async_wait<4>(); break;
    case 3: cp_async_wait<3>(); break;
    case 2: cp_async_wait<2>(); break;
    case 1: cp_async_wait<1>(); break;
    default: cp_async_wait<0>(); break;
    }
}

/* One ring turn of NG (<= UG) groups; slot contents are refilled with the
 * groups UG later where g0 + gi + UG < ng. XC (the persistent grid's last
 * turn of a column): the state's pointers are already at the block's next
 * column, and the slots get its first turn where hn (there is one). */
template <int MT, int TB, int NG, bool XC = false, int ZM = 0>
static __device__ __forceinline__ void dc_turn(dc_state<MT, TB> &s, int g0, int ng, int hn = 0) {
    constexpr int UG = dc_state<MT, TB>::UG, AHEAD = XC ? 0 : UG;
    static_assert(!ZM || MT == 1, "ZM: one mma column block");
#pragma unroll
    for (int gi = 0; gi < NG; gi++) {
        if (s.xw) { /* the first column: this group's x rows (k_decode's x staging, XP) */
            dc_x_wait(g0 == 0 ? UG - gi : 0);
            __syncwarp();
        }
        const int refill = XC ? hn && gi < ng : g0 + gi + UG < ng;
        uint32_t mlo[TB], mhi[TB]; /* deq_raw's subtrahends for rows r, r + 8 */
        float zl[TB], zh[TB];      /* ZM: the same as floats, {1024 + z}, {1024 + 16 z} */
        float sl[TB], sh[TB];
#pragma unroll
        for (int tb = 0; tb < TB; tb++) {
            const uint32_t z = s.zq[gi * TB + tb], s2 = s.sr[gi * TB + tb];
            if constexpr (ZM) {
                zl[tb] = (float)(1024u + (z & 15u));
                zh[tb] = (float)(1024u + ((z >> 4) << 4));
            } else {
                mlo[tb] = magic_lo(z & 15u);
                mhi[tb] = magic_hi(z >> 4);
            }
            const __half2 h = *reinterpret_cast<const __half2 *>(&s2);
            sl[tb] = __low2float(h);
            sh[tb] = __high2float(h) * 0.0625f;
            dc_ld4(s.sr[gi * TB + tb], s.sp + (gi + AHEAD) * s.gs + tb * 8, refill);
            dc_ld1(s.zq[gi * TB + tb], s.zp + (gi + AHEAD) * s.gs + tb * 8, refill);
        }
        float d[TB][MT][4]; /* this group's sums: independent chains across tiles and groups */
        float sg[4];        /* ZM: the group's sums of x, D = ones (16 x 16) x: every row the same */
        if constexpr (ZM == 2) {
            /* M = 1 (every column of x's fragment the same row): the 8 columns
             * take the group's 8 pieces of 16 instead — lane (r, c) gives the 4
             * values of chunk r / 4 at 16 c + 4 (r % 4) — so that one mma adds
             * up the group in columns, and the lane's two columns and the
             * quad's four lanes (two shuffles) the rest: one mma a group, not
             * eight (ZM1, session 70) */
            const int lane = threadIdx.x & 31;
            const uint2 xv = *(const uint2 *)(s.xr[0] + gi * 128 + (lane >> 4) * 64 + ((lane >> 2) & 3) * 4);
            dc_mma_ones<true>(sg, xv.x, xv.y);
            float p = sg[0] + sg[1];
            p += __shfl_xor_sync(0xffffffffu, p, 1);
            p += __shfl_xor_sync(0xffffffffu, p, 2);
            sg[0] = sg[1] = p;
        }
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint4 xa[MT], xb[MT];
#pragma unroll
            for (int i = 0; i < MT; i++) {
                xa[i] = *(const uint4 *)(s.xr[i] + (gi * 2 + kk) * 64);
                xb[i] = *(const uint4 *)(s.xr[i] + (gi * 2 + kk) * 64 + 8);
            }
            if constexpr (ZM == 1) { /* one mma a k16 step for all TB tiles; x only: before the weights */
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const uint32_t *xs = t < 2 ? &xa[0].x : &xb[0].x;
                    if (kk == 0 && t == 0) dc_mma_ones<true>(sg, xs[(t & 1) * 2], xs[(t & 1) * 2 + 1]);
                    else dc_mma_ones<false>(sg, xs[(t & 1) * 2], xs[(t & 1) * 2 + 1]);
                }
            }
#pragma unroll
            for (int tb = 0; tb < TB; tb++) {
                const int slot = (gi * 2 + kk) * TB + tb;
                const uint32_t *wv = &s.wr[slot].x;
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    uint32_t a[4];
                    if constexpr (ZM) deq_codes(wv[t], a); /* {1024 + q} / {1024 + 16 q} as they are */
                    else deq_raw(wv[t], mlo[tb], mhi[tb], a);
#pragma unroll
                    for (int i = 0; i < MT; i++) {
                        const uint32_t *xs = t < 2 ? &xa[i].x : &xb[i].x;
                        const uint32_t b0 = xs[(t & 1) * 2], b1 = xs[(t & 1) * 2 + 1];
                        if (kk == 0 && t == 0) dc_mma<true>(d[tb][i], a, b0, b1);
                        else dc_mma<false>(d[tb][i], a, b0, b1);
                    }
                }
                dc_ld16(s.wr[slot], s.wp + (2 * (gi + AHEAD) + kk) * 256 + tb * 32, refill);
            }
        }
        if constexpr (ZM) { /* sum (1024 + q) x - (1024 + z) S = sum (q - z) x; rows r + 8: 16 times */
#pragma unroll
            for (int tb = 0; tb < TB; tb++) {
                d[tb][0][0] = fmaf(-zl[tb], sg[0], d[tb][0][0]);
                d[tb][0][1] = fmaf(-zl[tb], sg[1], d[tb][0][1]);
                d[tb][0][2] = fmaf(-zh[tb], sg[0], d[tb][0][2]);
                d[tb][0][3] = fmaf(-zh[tb], sg[1], d[tb][0][3]);
            }
        }
#pragma unroll
        for (int tb = 0; tb < TB; tb++)
#pragma unroll
            for (int i = 0; i < MT; i++) {
                s.acc[tb][i][0] = fmaf(sl[tb], d[tb][i][0], s.acc[tb][i][0]);
                s.acc[tb][i][1] = fmaf(sl[tb], d[tb][i][1], s.acc[tb][i][1]);
                s.acc[tb][i][2] = fmaf(sh[tb], d[tb][i][2], s.acc[tb][i][2]);
                s.acc[tb][i][3] = fmaf(sh[tb], d[tb][i][3], s.acc[tb][i][3]);
            }
    }
}

/* The norm weight is constant: each lane loads its first PRE 16-byte pieces
 * of w (pieces lane + 32 j of the warp's K range) before the PDL wait, so
 * that the prologue after the wait has one dependent round trip (rin +
 * delta) instead of two. PRE = dc_norm_pre<TB>::n covers hidden sizes up to 32
 * pieces * 8 halves * 8 warps * PRE (8192 at TB <= 2; none at TB = 4, where
 * the registers would spill); the pieces past that go into shared memory by
 * cp.async before the wait as well (dc_norm_w_stage; before session 57 they
 * were loaded after the barrier, a round trip of their own). */
template <int TB> struct dc_norm_pre { static constexpr int n = TB >= 4 ? 0 : 4; };

template <int PRE>
static __device__ __forceinline__ void dc_norm_w_stage(const norm_args &na, uint16_t *sw, int k0, int n8, int lane) {
    for (int p = lane + 32 * PRE; p < n8; p += 32) cp_async16(sw + k0 + p * 8, na.w + k0 + p * 8, 16);
    cp_async_commit();
}

template <int PRE>
static __device__ __forceinline__ void dc_norm_w_prefetch(const norm_args &na, int k0, int n8,
                                                          int lane, uint4 *wpre) {
#pragma unroll
    for (int j = 0; j < PRE; j++) {
        const int p = lane + 32 * j;
        wpre[j] = p < n8 ? __ldg((const uint4 *)(na.w + k0 + p * 8)) : make_uint4(0, 0, 0, 0);
    }
}

/* NORM prologue of k_decode: this warp's K range [k0, k0 + 8 n8) of rows
 * [0, m) into sx as v = fp16(rin + delta) (block 0 also writes v to rout),
 * the block's sum of v^2 per row (warps added in order), then x = fp16(w * (v
 * * rsqrt(mean + eps))) in place — add_rmsnorm's arithmetic (ops_cuda.cu),
 * its sum in another order. wpre: dc_norm_w_prefetch's pieces of w. */
template <int PRE>
static __device__ void dc_norm_prologue(const norm_args &na, const uint4 *wpre, const uint16_t *sw,
                                        uint16_t *sx, int xs, int K, int m, int k0, int n8,
                                        int warp, int lane ST_PARAM) {
    __shared__ float ssq[8][DC_WARPS]; /* [row][warp]: m <= 8 (MT = 1 only) */
    const bool first = blockIdx.x == 0;
    for (int row = 0; row < m; row++) {
        float ss = 0.0f;
        for (int p = lane; p < n8; p += 32) {
            const size_t off = (size_t)row * K + k0 + p * 8;
            uint4 a = *(const uint4 *)(na.rin + off);
            __half2 *a2 = (__half2 *)&a;
            if (na.delta) {
                const uint4 b = *(const uint4 *)(na.delta + off);
                const __half2 *b2 = (const __half2 *)&b;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 fa = __half22float2(a2[u]), fb = __half22float2(b2[u]);
                    a2[u] = __floats2half2_rn(fa.x + fb.x, fa.y + fb.y);
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float2 f = __half22float2(a2[u]);
                ss += f.x * f.x + f.y * f.y;
            }
            *(uint4 *)(sx + row * xs + k0 + p * 8) = a;
            if (first) *(uint4 *)(na.rout + off) = a;
#ifdef AWQD_STAMPS
            asm volatile("" ::: "memory"); /* the stores above (of the loaded values) first */
            if (row == 0 && p == lane) ST_MARK(5); /* the first pieces in */
#endif
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) ssq[row][warp] = ss;
    }
    ST_MARK(6); /* this warp's pieces in and summed */
    __syncthreads();
    cp_async_wait<0>(); /* sw: this lane's pieces of w past PRE (copied before the PDL wait) */
    for (int row = 0; row < m; row++) {
        float tot = 0.0f;
        for (int w = 0; w < DC_WARPS; w++) tot += ssq[row][w];
        const float r = rsqrtf(tot / (float)K + na.eps);
#pragma unroll
        for (int j = 0; j < PRE; j++) {
            const int p = lane + 32 * j;
            if (p < n8) dc_norm_scale(sx + row * xs + k0 + p * 8, wpre[j], r);
        }
        for (int p = lane + 32 * PRE; p < n8; p += 32)
            dc_norm_scale(sx + row * xs + k0 + p * 8, *(const uint4 *)(sw + k0 + p * 8), r);
    }
}

/* SUM epilogue of k_decode (w4a16_linear_sum, MT = 1): the warp's output
 * tile nt, v = its fp32 sums (rows 2c, 2c + 1 x columns r, r + 8), is
 * rounded to fp16 as w4_epilogue would store it, sent to every peer's slot
 * (rank, nt, lane) over NVLink (8-byte volatile stores, -0.0 made +0.0),
 * then the peers' slots of the same tile in this rank's area are polled
 * until none of their halves is -0.0, added in rank order in fp32 (this
 * rank's own values at q = rank) and made idle again; the sums are stored
 * as w4_epilogue stores. The push all-reduce adds the same fp16 values in
 * the same order: bitwise its result. Lanes whose rows are all >= m, and
 * tiles with no column < n, take no part (the same on every rank). */
static __device__ __forceinline__ void dc_sum_epilogue(const epi_args &ep, const w4a16_sum &xs,
                                                       int nt, int lane, float v[4]) {
    const int r = lane >> 2, c = lane & 3;
    if (2 * c >= ep.m || nt * 16 >= ep.n) return;
    if (ep.bias) {
        const float blo = __half2float(__ushort_as_half(ep.bias[nt * 16 + r]));
        const float bhi = __half2float(__ushort_as_half(ep.bias[nt * 16 + r + 8]));
        v[0] += blo, v[1] += blo, v[2] += bhi, v[3] += bhi;
    }
    uint2 own;
    own.x = xchg_fix(__half_as_ushort(__float2half_rn(v[0])) | ((unsigned)__half_as_ushort(__float2half_rn(v[1])) << 16));
    own.y = xchg_fix(__half_as_ushort(__float2half_rn(v[2])) | ((unsigned)__half_as_ushort(__float2half_rn(v[3])) << 16));
    const size_t off = (size_t)nt * 128 + lane * 4;
    const size_t mine = (size_t)xs.rank * W4A16_SUM_CAP + off;
#pragma unroll
    for (int q = 0; q < W4A16_SUM_MAX_RANKS; q++)
        if (q < xs.size && q != xs.rank) xchg_st2(xs.area[q] + mine, own);
    uint16_t *const area = xs.mine + off; /* + q * W4A16_SUM_CAP: from rank q */
    uint2 in[W4A16_SUM_MAX_RANKS];
#pragma unroll
    for (int q = 0; q < W4A16_SUM_MAX_RANKS; q++)
        if (q < xs.size && q != xs.rank) in[q] = xchg_ld2(area + (size_t)q * W4A16_SUM_CAP);
#pragma unroll
    for (int q = 0; q < W4A16_SUM_MAX_RANKS; q++) {
        if (q >= xs.size || q == xs.rank) continue;
        unsigned spins = 0;
        unsigned long long t0 = 0;
        while (xchg_empty(in[q].x) | xchg_empty(in[q].y)) {
            if ((++spins & 511) == 0 && xchg_give_up(xs.ctl, xs.timeout_ns, xs.rank, &t0)) return;
            in[q] = xchg_ld2(area + (size_t)q * W4A16_SUM_CAP);
        }
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int q = 0; q < W4A16_SUM_MAX_RANKS; q++) {
        if (q >= xs.size) continue;
        uint2 h = own;
        if (q != xs.rank) {
            h = in[q];
            xchg_st2(area + (size_t)q * W4A16_SUM_CAP, make_uint2(XCHG_EMPTY2, XCHG_EMPTY2));
        }
        const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&h.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2 *>(&h.y));
        acc[0] += a.x, acc[1] += a.y, acc[2] += b.x, acc[3] += b.y;
    }
    epi_args e = ep;
    e.bias = NULL; /* added before the exchange */
    w4_epilogue(e, nt, r, 2 * c, acc[0], acc[1], acc[2], acc[3]);
}

/* The decode K split's reducer poll (DC_F_GSPOLL; gs_poll_on says where): the parts' words
 * are their own flags, as in xchg.cuh. Between calls every word of the device's poll buffer
 * (gsp_acquire) holds GS_IDLE, a NaN no fp32 add or mma makes (their NaN is 0x7fffffff); a
 * writer that has one stores 0x7fffffff instead (a NaN sums to a NaN either way). */
#define GS_IDLE 0xffffffffu
#define GS_POLL_NS 2000000000ull /* a poll this long (2 s) traps: a grid not all resident */
static __device__ __forceinline__ void gs_put(uint32_t *p, float v) {
    uint32_t u = __float_as_uint(v);
    if (u == GS_IDLE) u = 0x7fffffffu;
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(u) : "memory");
}
static __device__ __forceinline__ uint32_t gs_get(const uint32_t *p) {
    uint32_t u;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(u) : "l"(p) : "memory");
    return u;
}
/* NQ ranks' NW words a lane (word j of rank q at p + q * RS + j * 32) into t[q * NW + j],
 * once none is idle; then made idle again */
template <int NQ, int NW, int RS>
static __device__ __forceinline__ void gs_poll(uint32_t *p, uint32_t *t) {
    unsigned long long t0 = 0;
    for (unsigned n = 0;; n++) {
        bool idle = false;
#pragma unroll
        for (int q = 0; q < NQ; q++)
#pragma unroll
            for (int j = 0; j < NW; j++) {
                t[q * NW + j] = gs_get(p + q * RS + j * 32);
                idle |= t[q * NW + j] == GS_IDLE;
            }
        if (!idle) break;
        if ((n & 1023) == 1023) {
            const unsigned long long now = xchg_now();
            if (!t0) t0 = now;
            else if (now - t0 > GS_POLL_NS) __trap();
        }
    }
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int j = 0; j < NW; j++)
            asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p + q * RS + j * 32), "r"(GS_IDLE) : "memory");
}

/* The 8 warps' partials of tile tb, row tile i, for this lane, added in
 * warp order (red: [TB][MT * 4][DC_WARPS][32], k_decode's reduction area) */
template <int MT>
static __device__ __forceinline__ void dc_warp_sum(const float *red, int tb, int i, int lane, float v[4]) {
    v[0] = v[1] = v[2] = v[3] = 0.f;
    for (int w = 0; w < DC_WARPS; w++)
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] += red[((tb * MT * 4 + i * 4 + j) * DC_WARPS + w) * 32 + lane];
}

/* MINB: the blocks per SM the registers must allow (__launch_bounds__): 2
 * (128 registers) where the plan's shared memory lets two blocks share an
 * SM, 1 at MT = 2 where it does not (launch_decode) — the MT = 2 persistent
 * grid spilled 108 bytes at 128 registers (session 34, ncu: 242 K local
 * requests on Qwen3-8B gate|up at M = 16) */
template <int MT, int TB, bool NORM, bool SUM, bool PS = false, bool PF = false, int MINB = 2, bool XP = false,
          int CL = 1, bool GS = false, int ZM = 0>
static __global__ void __launch_bounds__(DC_WARPS * 32, MINB)
k_decode(const uint4 *__restrict__ qw, const uint32_t *__restrict__ sc,
         const uint8_t *__restrict__ zr, const uint16_t *__restrict__ x, int K, int n16a, int KC,
         int flags, epi_args ep, norm_args na, w4a16_sum xsum, int ncols, float *__restrict__ part,
         int *__restrict__ cnt) {
    typedef dc_state<MT, TB> S;
    static_assert(CL == 1 || (!NORM && (GS || (!SUM && MT >= 2))), "the cluster K split: plain variant, MT >= 2");
    static_assert(!GS || (CL > 1 && !PS && (!SUM || MT == 1)), "the K split through global memory: the plain grid");
    static_assert(!ZM || MT == 1, "ZM: one mma column block");
    extern __shared__ __align__(16) unsigned char smem[];
    ST_DECL;
    ST_BEGIN(ST_KEY(SUM ? 3 : NORM ? 2 : 1, K, ep.n));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int r = lane >> 2, c = lane & 3;
    /* CL > 1 (dc_plan.h, the cluster K split): the CL blocks of a cluster
     * share each column, block (rank) q taking the q-th of CL equal K
     * ranges (KGc groups, x of those columns only in its shared memory);
     * rank 0 adds the other ranks' sums (in rank order) and stores */
    int rank = 0;
    if constexpr (GS) {
        rank = (int)blockIdx.x % CL;
    } else if constexpr (CL > 1) {
        rank = cl_rank();
        /* every block of the cluster has started before any remote store (arrived here, waited for at
         * the first column's end) */
        cl_arrive_relaxed();
    }
    const int KG = KC >> 1, glo = rank * KG / CL, KGc = (rank + 1) * KG / CL - glo, Kc = (KG + CL - 1) / CL * 128,
              cstride = (int)gridDim.x / CL;
    int col = (int)blockIdx.x / CL, t0 = col * TB; /* PS: columns blockIdx.x / CL + j cstride < ncols */
    const int gw0 = glo + warp * KGc / DC_WARPS, ng = (warp + 1) * KGc / DC_WARPS - warp * KGc / DC_WARPS;
    S s;
    s.gs = (size_t)n16a * 8;
    s.xw = 0;
    dc_at_column(s, qw, sc, zr, t0, KC, gw0, lane, r);
#pragma unroll
    for (int i = 0; i < S::NW; i++) s.wr[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < S::NZ; i++) s.sr[i] = s.zq[i] = 0;
    /* the first turn: constant data, before the wait */
#pragma unroll
    for (int gi = 0; gi < S::UG; gi++) dc_fetch_group(s, gi, 0, gi < ng);
    /* L2 prefetch of the turns after the ring's first (constant data: before the wait); MT = 1
     * only and not SUM (no registers to spare there). PF: compiled in only where the plan has
     * a distance (and on the persistent grid: launch_decode): with the code present and pf =
     * 0 the plain-grid shapes were 2-5% slower (H200, session 27, a bisect over sessions
     * 21-26: Qwen3-32B q|k|v M = 1 10.68 -> 11.18 us, its tp = 4 gate|up 10.85 -> 11.36 at
     * the commit that added it) */
    const int pf = PF && MT == 1 && !SUM ? (flags >> DC_F_PF_SHIFT) & 7 : 0;
    for (int d = 1; d <= pf; d++) dc_prefetch_turn<TB>(s.wp - lane, s.sp - r, s.zp - r, s.gs, d * S::UG, ng, lane);
    constexpr int PRE = dc_norm_pre<TB>::n;
    uint4 wpre[PRE > 0 ? PRE : 1];
    /* NORM: w's pieces past PRE in shared memory after x and the reduction area (dc_norm_smem) */
    uint16_t *sw = (uint16_t *)(smem + dc_x_bytes(ep.m, Kc) + (size_t)TB * MT * 4 * DC_WARPS * 32 * 4);
    if (NORM) {
        dc_norm_w_prefetch<PRE>(na, gw0 * 128, ng * 16, lane, wpre);
        dc_norm_w_stage<PRE>(na, sw, gw0 * 128, ng * 16, lane);
    }
    const int late = flags & DC_F_LATE;
    if (!late) pdl_launch();
    pdl_wait();
    ST_MARK(1);

    /* x rows [0, M) of this warp's K range -> shared memory (only this warp reads them) */
    uint16_t *sx = (uint16_t *)smem;
    /* k0: the warp's first k; k0l: the same in this block's x columns (K / CL of them) */
    const int xs = Kc + 8, k0 = gw0 * 128, k0l = k0 - glo * 128, n8 = ng * 16; /* 16-byte pieces per row */
    if (NORM) {
        dc_norm_prologue<PRE>(na, wpre, sw, sx, xs, K, ep.m, k0, n8, warp, lane ST_ARG);
    } else {
        /* XP: group by group, each of the first UG groups of the range its
         * own cp.async group (the rest one more): the first column's turns
         * wait for each group's rows only (s.xw, dc_turn), so its first
         * groups are multiplied while the later ones arrive */
        const bool via_l1 = !(flags & DC_F_XCG);
        auto stage = [&](int row, int p) { /* 16-byte piece p of the warp's range of row `row` */
            uint16_t *d = sx + row * xs + k0l + p * 8;
            const uint16_t *gp = x + (size_t)row * K + k0 + p * 8;
            if (via_l1) cp_async16_ca(d, gp);
            else cp_async16(d, gp, 16);
        };
        constexpr int G0 = XP ? S::UG : 0; /* the groups staged one by one */
#pragma unroll
        for (int g = 0; g < G0; g++) {
            if (g < ng)
                for (int i = lane; i < ep.m * 16; i += 32) stage(i >> 4, g * 16 + (i & 15));
            cp_async_commit();
        }
        const int rest = n8 - 16 * G0; /* pieces per row past the first G0 groups */
        for (int i = lane; i < ep.m * rest; i += 32) {
            const int row = i / rest;
            stage(row, 16 * G0 + (i - row * rest));
        }
        cp_async_commit();
        if (XP) s.xw = 1;
        else cp_async_wait<0>();
    }
    __syncwarp();
    ST_MARK(2);
#pragma unroll
    for (int i = 0; i < MT; i++) {
        const int m = min(i * 8 + r, ep.m - 1);
        s.xr[i] = sx + m * xs + k0l + 16 * c;
    }
#ifdef AWQD_STAMPS
    if constexpr (!NORM && !PS && CL == 1) {
        /* points 5 / 6 of the plain variant: this lane's first and last ring slots in (a
         * branch on each value waits for its load, so in a stamps build the loop starts only
         * once the whole first turn is in; session 66: on Qwen3-8B o at M = 1 the whole slice
         * is in 0.2-0.3 us after x and the loop still takes 1.5 us after it) */
        if (s.wr[0].x == 0x9e3779b9u && s.wr[0].w == 0x7f4a7c15u) __nanosleep(1);
        ST_MARK(5);
        if (s.wr[S::NW - 1].x == 0x9e3779b9u && s.wr[S::NW - 1].w == 0x7f4a7c15u) __nanosleep(1);
        ST_MARK(6);
    }
#endif
    for (;;) {
#pragma unroll
        for (int tb = 0; tb < TB; tb++)
#pragma unroll
            for (int i = 0; i < MT; i++) s.acc[tb][i][0] = s.acc[tb][i][1] = s.acc[tb][i][2] = s.acc[tb][i][3] = 0.f;

        /* the whole ring turns; PS: all but the last, which every warp's
         * range has (whole turns, ng % UG == 0: the host's condition) */
        int g0 = 0;
        for (; g0 + S::UG <= ng - (PS ? 1 : 0); g0 += S::UG) {
            if (PF && pf) dc_prefetch_turn<TB>(s.wp - lane, s.sp - r, s.zp - r, s.gs, (pf + 1) * S::UG, ng - g0, lane);
            dc_turn<MT, TB, S::UG, false, ZM>(s, g0, ng);
            s.wp += S::UG * 2 * 256;
            s.sp += S::UG * s.gs;
            s.zp += S::UG * s.gs;
#pragma unroll
            for (int i = 0; i < MT; i++) s.xr[i] += S::UG * 128;
        }
        if (PS) {
            /* the last turn refills the ring with the first turn of the
             * block's next column, so that its loads are in flight through
             * this column's reduction and epilogue. The test of rem == UG
             * is always true (whole turns: the host's condition), as is XC's
             * gi < ng in dc_turn; with both the compiled kernel is faster
             * (H200, session 26, back to back against without them, the
             * faster of two runs: Qwen3-8B / Qwen3-32B / its tp = 2 shard /
             * Llama-3-70B gate|up at M = 1-8 0.97-0.99 / 0.96-0.98 /
             * 0.97-0.98 / 0.97-0.99x the time; with either one alone 1-2
             * points less; the shapes that do not run this path unchanged) */
            dc_at_column(s, qw, sc, zr, (col + cstride) * TB, KC, gw0, lane, r);
            if (ng - g0 == S::UG) dc_turn<MT, TB, S::UG, true, ZM>(s, g0, ng, col + cstride < ncols);
#pragma unroll
            for (int i = 0; i < MT; i++) s.xr[i] += S::UG * 128;
        } else {
            /* the last, partial turn (its groups were fetched one turn ago) */
            const int rem = ng - g0;
            if (S::UG > 1 && rem == 1) dc_turn<MT, TB, 1, false, ZM>(s, g0, ng);
            if (S::UG > 2 && rem == 2) dc_turn<MT, TB, (S::UG > 2 ? 2 : 1), false, ZM>(s, g0, ng);
            if (S::UG > 3 && rem == 3) dc_turn<MT, TB, (S::UG > 3 ? 3 : 1), false, ZM>(s, g0, ng);
            if (late) pdl_launch();
        }

        ST_MARK(3);
        s.xw = 0; /* x is in */
        /* the 8 warps' partials, added in warp order */
        float *red = (float *)(smem + dc_x_bytes(ep.m, Kc)); /* [TB][MT*4][8][32] */
#pragma unroll
        for (int tb = 0; tb < TB; tb++)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    red[((tb * MT * 4 + i * 4 + j) * DC_WARPS + warp) * 32 + lane] = s.acc[tb][i][j];
        __syncthreads();
        if (CL == 1 && !PS && warp >= TB) return;
        if constexpr (GS) {
            /* the block's sums of its K range into part [column][rank][TB][MT * 4][32]; the
             * last of the column's CL blocks to arrive adds all CL in rank order (the same
             * order whoever arrives last) and stores. splitk_reduce's form of the same
             * (its layout [column][rank][MT * 4][TB * 32], warps >= TB idle) measured
             * 0.5-1.2% slower on these grids (H200, session 54, back to back, three runs:
             * Qwen3-32B o M = 1-4 8.13-8.43 -> 8.22-8.50 us) */
            __shared__ int s_last;
            float v[MT][4];
            if (flags & DC_F_GSPOLL) {
                /* the reducer's poll (gs_poll_on): ranks 0 .. CL - 2 store their sums as
                 * they are, no fence, no counter, and leave; rank CL - 1 (the longest K
                 * range of the uneven pieces) polls their words until none is the idle
                 * mark, makes them idle again and adds all CL in rank order, its own
                 * from registers: the same sums in the same order as the counter's */
                if (warp >= TB) return;
#pragma unroll
                for (int i = 0; i < MT; i++) dc_warp_sum<MT>(red, warp, i, lane, v[i]);
                uint32_t *pw = (uint32_t *)part + ((size_t)col * CL * TB + warp) * MT * 4 * 32 + lane;
                constexpr int RS = TB * MT * 4 * 32; /* words from one rank's sums to the next's */
                if (rank != CL - 1) {
#pragma unroll
                    for (int i = 0; i < MT; i++)
#pragma unroll
                        for (int j = 0; j < 4; j++) gs_put(pw + rank * RS + (i * 4 + j) * 32, v[i][j]);
                    ST_MARK(4); /* the parts stored */
                    return;
                }
                uint32_t t[CL - 1][MT][4];
                gs_poll<CL - 1, MT * 4, RS>(pw, &t[0][0][0]);
                ST_MARK(5); /* the others' parts in */
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int q = 0; q < CL; q++)
#pragma unroll
                        for (int j = 0; j < 4; j++) a[j] += q == CL - 1 ? v[i][j] : __uint_as_float(t[q < CL - 1 ? q : 0][i][j]);
                    if (SUM) dc_sum_epilogue(ep, xsum, t0 + warp, lane, a); /* MT = 1 */
                    else w4_epilogue(ep, t0 + warp, r, i * 8 + 2 * c, a[0], a[1], a[2], a[3]);
                }
                ST_MARK(6); /* the column stored */
                return;
            }
            if (warp < TB) {
#pragma unroll
                for (int i = 0; i < MT; i++) dc_warp_sum<MT>(red, warp, i, lane, v[i]);
                float *mine = part + (((size_t)col * CL + rank) * TB + warp) * MT * 4 * 32 + lane;
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) __stcg(mine + (i * 4 + j) * 32, v[i][j]);
            }
            __threadfence();
            __syncthreads();
            ST_MARK(4); /* the parts stored and fenced */
            if (tid == 0) {
                const int old = atomicAdd(cnt + col, 1);
                s_last = old == CL - 1;
                if (s_last) cnt[col] = 0;
            }
            __syncthreads();
            ST_MARK(5); /* the column's count known */
            if (!s_last || warp >= TB) return;
            __threadfence();
#pragma unroll
            for (int i = 0; i < MT; i++) {
                float a[4] = {0.f, 0.f, 0.f, 0.f};
                for (int q = 0; q < CL; q++) {
                    const float *p = part + (((size_t)col * CL + q) * TB + warp) * MT * 4 * 32 + lane;
#pragma unroll
                    for (int j = 0; j < 4; j++) a[j] += __ldcg(p + (i * 4 + j) * 32);
                }
                if (SUM) dc_sum_epilogue(ep, xsum, t0 + warp, lane, a); /* MT = 1 */
                else w4_epilogue(ep, t0 + warp, r, i * 8 + 2 * c, a[0], a[1], a[2], a[3]);
            }
            ST_MARK(6); /* the column's last block: stored */
            return;
        } else if constexpr (CL > 1) {
            /* the block's sums of its K range, [TB warps][MT][4] per lane; ranks 1.. store
             * theirs into rank 0's area for them ([CL - 1][TB][MT][32 lanes][4] after red),
             * once rank 0 has read the last column's (the wait: its arrive after the reads) */
            float *xr = red + TB * MT * 4 * DC_WARPS * 32;
            float v[MT][4];
#pragma unroll
            for (int i = 0; i < MT; i++) v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.f;
            if (warp < TB)
#pragma unroll
                for (int i = 0; i < MT; i++) dc_warp_sum<MT>(red, warp, i, lane, v[i]);
            cl_wait();
            if (rank > 0 && warp < TB)
#pragma unroll
                for (int i = 0; i < MT; i++)
                    cl_store0(xr + ((((rank - 1) * TB + warp) * MT + i) * 32 + lane) * 4, v[i][0], v[i][1], v[i][2],
                                 v[i][3]);
            cl_arrive();
            cl_wait();
            if (rank == 0 && warp < TB) {
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    for (int q = 1; q < CL; q++) {
                        const float4 o = *(const float4 *)(xr + ((((q - 1) * TB + warp) * MT + i) * 32 + lane) * 4);
                        v[i][0] += o.x, v[i][1] += o.y, v[i][2] += o.z, v[i][3] += o.w;
                    }
                    w4_epilogue(ep, t0 + warp, r, i * 8 + 2 * c, v[i][0], v[i][1], v[i][2], v[i][3]);
                }
            }
            /* rank 0 has read the area: the next column's stores may go */
            cl_arrive();
            if (!PS) return;
        } else if (warp < TB) {
#pragma unroll
            for (int i = 0; i < MT; i++) {
                float v[4];
                dc_warp_sum<MT>(red, warp, i, lane, v);
                if (SUM) dc_sum_epilogue(ep, xsum, t0 + warp, lane, v); /* MT = 1 (w4a16_linear_sum) */
                else w4_epilogue(ep, t0 + warp, r, i * 8 + 2 * c, v[0], v[1], v[2], v[3]);
            }
        }
        ST_MARK(4);
        if (!PS) return;
        col += cstride;
        if (col >= ncols) return;
        t0 = col * TB;
        __syncthreads(); /* red is rewritten by the next column */
#pragma unroll
        for (int i = 0; i < MT; i++) s.xr[i] -= ng * 128; /* x of this warp's range again */
    }
}

/* ------------------------------------------------------------------------ */
/* Pipelined tensor-core GEMM. Block = (2*WN) n16 tiles x (8*MW*WM) rows,    */
/* warps WN x WM, each 32 columns x 8*MW rows. STAGES-deep cp.async ring of  */
/* (x tile, INT4 tile, scales, zeros) per 64-deep chunk; dequantization from */
/* shared memory to registers right before the mma.                          */
/*                                                                            */
/* Instruction budget (session 11, ncu on H100): the tensor pipe takes ~8    */
/* cycles per m16n8k16 per scheduler, so a warp has ~7 issue slots per mma   */
/* for everything else. Every thread's copy addresses are therefore fixed at */
/* the start (its x rows, its 16-byte pieces of the weight chunk, scales and */
/* zeros by threads 0-19) and advanced by constants (the copy loops with     */
/* their index arithmetic made 487 instructions per warp and chunk, now     */
/* ~350, of which 64 mma).                                                   */
/*                                                                            */
/* Split-K (blockIdx.z = split) is reduced either inside a thread-block      */
/* cluster of the ksplit blocks of one tile (CL, sm_90+): each block parks   */
/* its accumulators in its own shared memory, and block q of the cluster     */
/* sums the pairs (j, i) with (j * MW + i) % ksplit == q over the ranks in   */
/* split order and stores them — no workspace, no atomics, the reduction     */
/* spread over the cluster — or through the global workspace (splitk_reduce,*/
/* the last-arriving block sums). Both add the splits' values in split      */
/* order starting from zero: the results are bitwise the same.              */
/* ------------------------------------------------------------------------ */

#define TC_XS 72 /* x row stride in halves (64 + 8 padding: conflict-free LDS.128) */
#define TC_CLUSTER_MAX 8 /* largest split the GEMM reduces inside a cluster */

template <int WN, int WM, int MW, int STAGES>
struct tc_cfg {
    static constexpr int NT = WN * WM * 32;
    static constexpr int BN16 = 2 * WN;
    static constexpr int BM = 8 * MW * WM;
    static constexpr int X_BYTES = BM * TC_XS * 2;
    static constexpr int W_BYTES = BN16 * 32 * 16;
    static constexpr int S_BYTES = BN16 * 8 * 4;
    static constexpr int Z_BYTES = BN16 * 8 < 16 ? 16 : BN16 * 8;
    static constexpr int STAGE = X_BYTES + W_BYTES + S_BYTES + Z_BYTES;
    static constexpr int SMEM = STAGE * STAGES;
    static constexpr int NACC = 2 * MW * 4;
    static constexpr int XPT = BM * 8 / NT;       /* x copies per thread and stage */
    static constexpr int WPT = BN16 * 32 / NT;    /* weight copies per thread and stage */
    static constexpr int SZ_THREADS = S_BYTES / 16 + Z_BYTES / 16;
    static constexpr int RED_BYTES = NACC * NT * 4; /* the cluster reduction's area */
};

static __device__ __forceinline__ void cp_async16_u(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

template <int WN, int WM, int MW, int STAGES, int MINB, bool CL>
static __global__ void __launch_bounds__(WN *WM * 32, MINB)
k_tc(const uint4 *__restrict__ qw, const uint32_t *__restrict__ sc,
     const uint8_t *__restrict__ zr, const uint16_t *__restrict__ x, int K, int n16a, int KC,
     int G, int cps, int ksplit, epi_args ep, float *__restrict__ part, int *__restrict__ cnt) {
    typedef tc_cfg<WN, WM, MW, STAGES> C;
    static_assert(C::BN16 == 8, "a block's chunk is the 4 KB of its 8 tiles");
    static_assert(C::XPT * C::NT == C::BM * 8 && C::WPT * C::NT == C::BN16 * 32, "copy split");
    static_assert(C::SZ_THREADS <= C::NT, "scale/zero copies");
    static_assert(!CL || C::RED_BYTES <= C::SMEM, "cluster reduction area");
    extern __shared__ __align__(16) unsigned char smem[];
    ST_DECL;
    ST_BEGIN(ST_KEY(4, K, ep.n));
    const int nb = blockIdx.x, mb = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wn = warp % WN, wm = warp / WN;
    const int r = lane >> 2, c = lane & 3;
    const int kc0 = split * cps, kc1 = min(KC, kc0 + cps);
    const int nk = kc1 - kc0;
    const int cpg = G / 64;
    const int nt0 = nb * C::BN16; /* first n16 tile of the block */
    const int m0 = mb * C::BM;
    const uint32_t sbase = smem_u32(smem);

    /* This thread's copies, fixed for the whole K range. */
    const uint4 *wsrc = qw + ((size_t)nb * KC + kc0) * 256 + tid; /* + i * NT, + 256 per chunk */
    const uint32_t wdst = sbase + C::X_BYTES + tid * 16;
    const int xrow = tid >> 3, xch = tid & 7;
    const uint16_t *xsrc[C::XPT];
    int xbytes[C::XPT];
#pragma unroll
    for (int i = 0; i < C::XPT; i++) {
        const int gm = m0 + xrow + i * (C::NT / 8);
        xbytes[i] = gm < ep.m ? 16 : 0; /* rows >= M: zero-filled */
        xsrc[i] = x + (size_t)(gm < ep.m ? gm : 0) * K + kc0 * 64 + xch * 8;
    }
    const uint32_t xdst = sbase + (xrow * TC_XS + xch * 8) * 2;
    /* threads [0, S_BYTES/16) copy scales, the next Z_BYTES/16 zeros */
    const bool is_s = tid < C::S_BYTES / 16, is_z = !is_s && tid < C::SZ_THREADS;
    const unsigned char *szsrc;
    size_t szstride;
    uint32_t szdst;
    int g = kc0 / cpg, gc = kc0 - g * cpg;
    if (is_s) {
        szstride = (size_t)n16a * 8 * 4;
        szsrc = (const unsigned char *)(sc + (size_t)nt0 * 8) + tid * 16 + g * szstride;
        szdst = sbase + C::X_BYTES + C::W_BYTES + tid * 16;
    } else {
        const int zt = is_z ? tid - C::S_BYTES / 16 : 0;
        szstride = (size_t)n16a * 8;
        szsrc = zr + (size_t)nt0 * 8 + zt * 16 + g * szstride;
        szdst = sbase + C::X_BYTES + C::W_BYTES + C::S_BYTES + zt * 16;
    }
    int koff = 0; /* halves of x consumed so far */

    /* a stage: its weights, scales and zeros (constant), then its x */
    auto load_w = [&](int slot) {
        const uint32_t so = (uint32_t)slot * C::STAGE;
#pragma unroll
        for (int i = 0; i < C::WPT; i++) cp_async16_u(wdst + so + i * C::NT * 16, wsrc + i * C::NT, 16);
        if (is_s || is_z) cp_async16_u(szdst + so, szsrc, 16);
        wsrc += 256;
        if (++gc == cpg) {
            gc = 0;
            szsrc += szstride;
        }
    };
    auto load_x = [&](int slot) {
        const uint32_t so = (uint32_t)slot * C::STAGE;
#pragma unroll
        for (int i = 0; i < C::XPT; i++)
            cp_async16_u(xdst + so + i * (C::NT / 8) * TC_XS * 2, xsrc[i] + koff, xbytes[i]);
        koff += 64;
    };

    float acc[2][MW][4];
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < MW; i++) acc[j][i][0] = acc[j][i][1] = acc[j][i][2] = acc[j][i][3] = 0.f;

    /* the first stages' weights, scales and zeros (constant) before the
     * programmatic-launch wait, their x after it: commit group 0 holds the
     * early weights and stage 0's x (H200, session 35, back to back against
     * everything after the wait: 21 of 24 Qwen3-8B points at M = 32 / 64
     * 1-3% faster) */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < nk) load_w(s);
    pdl_wait();
    ST_MARK(1);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load_x(s);
        cp_async_commit();
    }

    /* (a loop unrolled over the STAGES slots measured the same: H100, session 11) */
    for (int it = 0; it < nk; it++) {
        const int st = it % STAGES;
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (it == 0) ST_MARK(2);
        if (it + STAGES - 1 < nk) {
            load_w((it + STAGES - 1) % STAGES);
            load_x((it + STAGES - 1) % STAGES);
        }
        cp_async_commit();

        const unsigned char *stp = smem + st * C::STAGE;
        const uint16_t *sx = (const uint16_t *)stp;
        const uint4 *sw = (const uint4 *)(stp + C::X_BYTES);
        const uint32_t *ss = (const uint32_t *)(stp + C::X_BYTES + C::W_BYTES);
        const uint8_t *sz = stp + C::X_BYTES + C::W_BYTES + C::S_BYTES;

        uint32_t a[2][4][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int tl = wn * 2 + j;
            const uint4 wv = sw[tl * 32 + lane];
            const uint32_t s2 = ss[tl * 8 + r];
            const uint32_t z = sz[tl * 8 + r];
            const uint32_t mlo = magic_lo(z & 15);
            uint32_t nz = 0xd400u | ((z >> 4) << 4); /* -(64 + z_hi) */
            nz |= nz << 16;
            const uint32_t slo = (s2 & 0xffffu) | (s2 << 16), shi = (s2 >> 16) | (s2 & 0xffff0000u);
            const uint32_t *wt = &wv.x;
#pragma unroll
            for (int t = 0; t < 4; t++) deq_scaled(wt[t], mlo, nz, slo, shi, a[j][t]);
        }
#pragma unroll
        for (int i = 0; i < MW; i++) {
            const uint16_t *xr = sx + (wm * MW * 8 + i * 8 + r) * TC_XS + 16 * c;
            const uint4 xa = *(const uint4 *)xr, xb = *(const uint4 *)(xr + 8);
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const uint32_t *xs = t < 2 ? &xa.x : &xb.x;
#pragma unroll
                for (int j = 0; j < 2; j++) mma16816(acc[j][i], a[j][t], xs[(t & 1) * 2], xs[(t & 1) * 2 + 1]);
            }
        }
    }
    cp_async_wait<0>();
    ST_MARK(3);
    pdl_launch();

    /* pairs (j, i), bit j * MW + i: the ones this block stores */
    uint32_t mine = (1u << (2 * MW)) - 1;
    if (ksplit > 1) {
        if (CL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            __syncthreads(); /* every warp is done with the stages the area reuses */
            float *red = (float *)smem;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < MW; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) red[((j * MW + i) * 4 + e) * C::NT + tid] = acc[j][i][e];
            cl_arrive();
            cl_wait();
            const uint32_t rank = (uint32_t)cl_rank();
            mine = 0;
            for (int q = (int)rank; q < 2 * MW; q += ksplit) mine |= 1u << q;
            const uint32_t base = smem_u32(red) + (uint32_t)tid * 4;
            uint32_t rb[TC_CLUSTER_MAX]; /* each rank's area (this thread's word) */
#pragma unroll
            for (int sp = 0; sp < TC_CLUSTER_MAX; sp++)
                if (sp < ksplit) asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb[sp]) : "r"(base), "r"(sp));
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < MW; i++) {
                    if (!((mine >> (j * MW + i)) & 1)) continue;
                    /* every rank's 4 values requested at once, added in rank order
                     * (one after the other: H200, session 35, the Qwen3-8B gate|up
                     * points at M = 32-64 2.8% slower back to back) */
                    float t[TC_CLUSTER_MAX][4];
#pragma unroll
                    for (int sp = 0; sp < TC_CLUSTER_MAX; sp++)
                        if (sp < ksplit) {
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(t[sp][e])
                                             : "r"(rb[sp] + (uint32_t)(((j * MW + i) * 4 + e) * C::NT * 4)) : "memory");
                        }
                    float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int sp = 0; sp < TC_CLUSTER_MAX; sp++)
                        if (sp < ksplit) {
#pragma unroll
                            for (int e = 0; e < 4; e++) v[e] += t[sp][e];
                        }
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[j][i][e] = v[e];
                }
            /* the other blocks' areas stay alive until every remote read is done */
            cl_arrive();
            cl_wait();
#elif defined(__CUDA_ARCH__)
            __trap(); /* launched as a cluster only on sm_90+: code built for less cannot reduce */
#endif
        } else {
            int tile = mb * gridDim.x + nb;
            if (!splitk_reduce<C::NACC, C::NT>(&acc[0][0][0], part, cnt, tile, split, ksplit, tid, true))
                return;
        }
    }
    ST_MARK(4);
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int i = 0; i < MW; i++)
            if ((mine >> (j * MW + i)) & 1)
                w4_epilogue(ep, nt0 + wn * 2 + j, r, m0 + wm * MW * 8 + i * 8 + 2 * c, acc[j][i][0],
                            acc[j][i][1], acc[j][i][2], acc[j][i][3]);
    ST_MARK(5);
}

/* The two GEMM configurations. */
#define TC64_ARGS 4, 1, 8, 4, 1   /* 128 n x 64 m, 4 warps */
#define TC128_ARGS 4, 2, 8, 4, 1  /* 128 n x 128 m, 8 warps */

/* ------------------------------------------------------------------------ */
/* Large M: dequantize to a transient fp16 W^T in the caller's workspace and */
/* run cuBLAS (measured faster than the mma.sync GEMM from M ~ 256 on; the   */
/* fp16 copy lives only in the workspace for the duration of the call).     */
/* ------------------------------------------------------------------------ */

/* wt: fp16 [n16*16][K] physical row order, each lane writes two 32-byte runs */
static __global__ void k_dequant_t(const uint4 *__restrict__ qw, const uint32_t *__restrict__ sc,
                                   const uint8_t *__restrict__ zr, int n16, int n16a, int KC,
                                   int ld, int G, uint16_t *__restrict__ wt, int nt0, int n_tiles,
                                   int kc0, int kcn) {
    /* n_tiles: a multiple of 8 (whole blocks; idx runs block, chunk, tile,
     * lane); chunks [kc0, kc0 + kcn) of K (64 each) go to wt's columns
     * [0, 64 kcn) of row (tile - nt0) * 16 + r, row stride ld */
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)n_tiles * kcn * 32) return;
    int lane = (int)(idx & 31);
    size_t wi = idx >> 5;
    int kcl = (int)((wi >> 3) % kcn), blk = (int)((wi >> 3) / kcn), tile = (int)(wi & 7);
    int kc = kc0 + kcl, ntr = blk * 8 + tile;
    int nt = nt0 + ntr; /* qw and wt start at tile nt0 (a multiple of 8) */
    if (nt >= n16) return;
    int r = lane >> 2, c = lane & 3;
    uint4 wv = qw[(((size_t)blk * KC + kc) * 8 + tile) * 32 + lane];
    int g = kc * 64 / G;
    uint32_t s2 = sc[((size_t)g * n16a + nt) * 8 + r];
    uint32_t z = zr[((size_t)g * n16a + nt) * 8 + r];
    uint32_t mlo = magic_lo(z & 15);
    uint32_t nz = 0xd400u | ((z >> 4) << 4);
    nz |= nz << 16;
    uint32_t slo = (s2 & 0xffffu) | (s2 << 16), shi = (s2 >> 16) | (s2 & 0xffff0000u);
    uint32_t lo[8], hi[8];
    const uint32_t *wt_ = &wv.x;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        uint32_t a[4];
        deq_scaled(wt_[t], mlo, nz, slo, shi, a);
        lo[2 * t] = a[0];
        lo[2 * t + 1] = a[2];
        hi[2 * t] = a[1];
        hi[2 * t + 1] = a[3];
    }
    uint4 *plo = (uint4 *)(wt + (size_t)(ntr * 16 + r) * ld + kcl * 64 + 16 * c);
    uint4 *phi = (uint4 *)(wt + (size_t)(ntr * 16 + r + 8) * ld + kcl * 64 + 16 * c);
    plo[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    plo[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    phi[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    phi[1] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
}

/* y[m][n] += bias[n] (fp16 in place) */
static __global__ void k_bias(uint16_t *y, const uint16_t *__restrict__ bias, int m, int n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)m * n) return;
    float v = __half2float(__ushort_as_half(y[i])) + __half2float(__ushort_as_half(bias[i % n]));
    y[i] = __half_as_ushort(__float2half_rn(v));
}

/* y[m][j] = silu(Y[m][pg] + b[pg]) * (Y[m][pu] + b[pu]), pg = (j/8)*16 + j%8, pu = pg + 8,
 * j < cols; y rows ldy apart, Y rows ldY apart */
static __global__ void k_silu_mul(const uint16_t *__restrict__ Y, const uint16_t *__restrict__ bias,
                                  uint16_t *__restrict__ y, int m, int cols, int ldy, int ldY) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)m * cols) return;
    int row = (int)(i / cols), j = (int)(i % cols);
    int pg = (j >> 3) * 16 + (j & 7), pu = pg + 8;
    float g = __half2float(__ushort_as_half(Y[(size_t)row * ldY + pg]));
    float u = __half2float(__ushort_as_half(Y[(size_t)row * ldY + pu]));
    if (bias) {
        g += __half2float(__ushort_as_half(bias[pg]));
        u += __half2float(__ushort_as_half(bias[pu]));
    }
    y[(size_t)row * ldy + j] = __half_as_ushort(__float2half_rn(w4_silu_mul(g, u)));
}

/* ------------------------------------------------------------------------ */
/* Host: upload / repack                                                     */
/* ------------------------------------------------------------------------ */

/* Threads for the host repack of a K x N matrix: the CPUs of the affinity
 * mask (util_cpus), at most 16 (a Qwen3-32B gate|up matrix: 0.5-0.8 s on one thread before w4a16_repack.c;
 * tensor-parallel ranks load at the same time, each with its own pool), and
 * one below 4 MB of weights (~10 ms on one thread: not worth starting
 * threads for). */
static int repack_threads(int K, int N) {
    if ((size_t)K * N / 2 < ((size_t)4 << 20)) return 1;
    return util_cpus(16);
}

extern "C" void w4a16_stage_free(struct w4a16_stage *st) {
    if (!st || !st->p) return;
    if (st->pinned) cudaFreeHost(st->p);
    else free(st->p);
    st->p = NULL;
    st->cap = 0;
    st->pinned = 0;
}

/* st's buffer with room for bytes: grown (a quarter more, so that the next
 * larger linear seldom grows it again), pinned where cudaMallocHost gives
 * it, else plain; NULL when out of host memory */
static void *stage_room(struct w4a16_stage *st, size_t bytes) {
    if (st->cap >= bytes) return st->p;
    w4a16_stage_free(st);
    const size_t cap = bytes + bytes / 4;
    if (cudaMallocHost(&st->p, cap) == cudaSuccess) {
        st->pinned = 1;
    } else {
        cudaGetLastError(); /* not sticky; fall back to pageable memory */
        st->p = malloc(cap);
        if (!st->p) return NULL;
    }
    st->cap = cap;
    return st->p;
}

extern "C" int w4a16_upload(const struct awq_linear *l, enum w4a16_layout layout,
                            struct w4a16_weight **out, char *err, size_t errlen) {
    return w4a16_upload_staged(l, layout, NULL, out, err, errlen);
}

extern "C" int w4a16_upload_staged(const struct awq_linear *l, enum w4a16_layout layout,
                                   struct w4a16_stage *st, struct w4a16_weight **out, char *err,
                                   size_t errlen) {
    *out = NULL;
    if (!l || !l->qweight || !l->qzeros || !l->scales)
        return util_err(err, errlen, -EINVAL, "w4a16_upload: missing tensors");
    if (layout != W4A16_LAYOUT_PLAIN && layout != W4A16_LAYOUT_GATE_UP)
        return util_err(err, errlen, -EINVAL, "w4a16_upload: bad layout %d", (int)layout);
    const int K = l->k, N = l->n, G = l->group;
    struct w4a16_dims d;
    if (w4a16_dims_of(K, N, G, layout == W4A16_LAYOUT_GATE_UP, &d))
        return util_err(err, errlen, -EINVAL,
                        layout == W4A16_LAYOUT_GATE_UP
                            ? "w4a16_upload: unsupported gate|up shape K=%d N=%d group=%d (need K %% 64 == 0, "
                              "group %% 64 == 0, K %% group == 0, N / 2 %% 8 == 0)"
                            : "w4a16_upload: unsupported shape K=%d N=%d group=%d (need K %% 64 == 0, "
                              "group %% 64 == 0, K %% group == 0, N %% 8 == 0)",
                        K, N, G);

    struct w4a16_weight *w = (struct w4a16_weight *)calloc(1, sizeof *w);
    if (!w) return util_err(err, errlen, -ENOMEM, "w4a16_upload: out of memory");
    w->k = K;
    w->n = N;
    w->group = G;
    w->layout = layout;
    w->out_cols = layout == W4A16_LAYOUT_GATE_UP ? N / 2 : N;
    w->n16 = d.n16;
    w->n16a = d.n16a;
    w->kc = d.kc;
    w->kg = d.kg;
    const int n16a = w->n16a;

    /* repacked on the host (kernels/cuda/w4a16_repack.c), on up to 16 threads,
     * into st's buffer (qw | scales | bias | zeros, each 16-byte aligned) or,
     * without st, into buffers of this call */
    const size_t qw_n = w4a16_repack_qw_words(&d), sc_n = w4a16_repack_sz_count(&d);
    const size_t bias_b = l->bias ? (size_t)n16a * 16 * 2 : 0;
    uint32_t *hq = NULL, *hs = NULL;
    uint8_t *hz = NULL;
    uint16_t *hb = NULL;
    unsigned char *sp = NULL;
    if (st) {
        const size_t o_s = (qw_n * 4 + 15) / 16 * 16, o_b = o_s + (sc_n * 4 + 15) / 16 * 16,
                     o_z = o_b + (bias_b + 15) / 16 * 16;
        sp = (unsigned char *)stage_room(st, o_z + sc_n);
        if (sp) {
            hq = (uint32_t *)sp;
            hs = (uint32_t *)(sp + o_s);
            hb = l->bias ? (uint16_t *)(sp + o_b) : NULL;
            hz = sp + o_z;
        }
    } else {
        hq = (uint32_t *)malloc(qw_n * 4);
        hs = (uint32_t *)malloc(sc_n * 4);
        hz = (uint8_t *)malloc(sc_n);
        hb = l->bias ? (uint16_t *)malloc(bias_b) : NULL;
    }
    int rc = 0;
    if (!hq || !hs || !hz || (l->bias && !hb) || w4a16_repack(l, &d, hq, hs, hz, hb, repack_threads(K, N))) {
        rc = util_err(err, errlen, -ENOMEM, "w4a16_upload: out of host memory (K=%d N=%d)", K, N);
        goto done;
    }

    {
        int dev = 0;
        cudaError_t e = cudaGetDevice(&dev);
        w->dev = dev;
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&w->sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&w->cc_major, cudaDevAttrComputeCapabilityMajor, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&w->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (e == cudaSuccess)
            e = cudaDeviceGetAttribute(&w->smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
        if (e != cudaSuccess) {
            rc = util_err(err, errlen, -EIO, "w4a16_upload: no CUDA device: %s", cudaGetErrorString(e));
            goto done;
        }
    }
    w->cnt_len = n16a * 8 > CNT_LEN_MIN ? n16a * 8 : CNT_LEN_MIN;
#define UP_CHECK(call)                                                                         \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            rc = util_err(err, errlen, CUDA_CHECK_RC_(e_), "w4a16_upload K=%d N=%d: %s failed at %s:%d: %s", \
                          K, N, #call, __FILE__, __LINE__, cudaGetErrorString(e_));            \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)
    UP_CHECK(cudaMalloc((void **)&w->qw, qw_n * 4));
    UP_CHECK(cudaMalloc((void **)&w->sc, sc_n * 4));
    UP_CHECK(cudaMalloc((void **)&w->zr, sc_n));
    UP_CHECK(cudaMalloc((void **)&w->cnt, sizeof(int) * (size_t)w->cnt_len));
    if (hb) UP_CHECK(cudaMalloc((void **)&w->bias, (size_t)n16a * 16 * 2));
    UP_CHECK(cudaMemcpy(w->qw, hq, qw_n * 4, cudaMemcpyHostToDevice));
    UP_CHECK(cudaMemcpy(w->sc, hs, sc_n * 4, cudaMemcpyHostToDevice));
    UP_CHECK(cudaMemcpy(w->zr, hz, sc_n, cudaMemcpyHostToDevice));
    UP_CHECK(cudaMemset(w->cnt, 0, sizeof(int) * (size_t)w->cnt_len));
    if (hb) UP_CHECK(cudaMemcpy(w->bias, hb, (size_t)n16a * 16 * 2, cudaMemcpyHostToDevice));
#undef UP_CHECK
    w->bytes = qw_n * 4 + sc_n * 5 + sizeof(int) * (size_t)w->cnt_len + (hb ? (size_t)n16a * 32 : 0);
    gsp_acquire(w);
    *out = w;
    w = NULL;
done:
    if (!sp) { /* buffers of this call (st's are kept) */
        free(hq);
        free(hs);
        free(hz);
        free(hb);
    }
    if (w) w4a16_free(w);
    return rc;
}

#ifdef AWQD_STAMPS
extern "C" void w4a16_stamps_dump(void) {
    static const char *const kinds[16] = {"?", "decode", "decode+norm", "decode+sum", "tc", "skinny", "?", "?",
                                          "?", "?", "?", "?", "?", "?", "?", "?"};
    st_dump("w4a16 (K x N)", kinds, "0 entry, 1 after the PDL wait, 2 x / norm staged (decode from M = 6: x requested; tc: the first chunk in), 3 main loop done, 4 stored (tc, skinny: split-K reduced; decode K split: its parts stored and fenced, with the poll: a writer's parts stored), 5 norm: first pieces in (tc, skinny: stored; decode K split: the column's count known, with the poll: the last rank has the others' parts; plain decode: warp 0 lane 0's first ring slot in), 6 norm: warp 0's pieces summed (decode K split: the column stored; plain decode: its last ring slot in)");
}
#endif

extern "C" void w4a16_free(struct w4a16_weight *w) {
    if (!w) return;
    cudaFree(w->qw);
    cudaFree(w->sc);
    cudaFree(w->zr);
    cudaFree(w->bias);
    cudaFree(w->cnt);
    gsp_release(w);
    free(w);
}

extern "C" int w4a16_k(const struct w4a16_weight *w) { return w->k; }
extern "C" int w4a16_n(const struct w4a16_weight *w) { return w->n; }
extern "C" int w4a16_out_cols(const struct w4a16_weight *w) { return w->out_cols; }
extern "C" size_t w4a16_device_bytes(const struct w4a16_weight *w) { return w->bytes; }
extern "C" void w4a16_view_of(const struct w4a16_weight *w, struct w4a16_view *v) {
    v->qw = w->qw;
    v->sc = w->sc;
    v->zr = w->zr;
    v->bias = w->bias;
    v->k = w->k, v->n = w->n, v->group = w->group, v->gate_up = w->layout == W4A16_LAYOUT_GATE_UP;
    v->out_cols = w->out_cols, v->n16a = w->n16a, v->kc = w->kc, v->kg = w->kg;
    v->sms = w->sms, v->cc_major = w->cc_major, v->smem_optin = w->smem_optin;
}

extern "C" int w4a16_clone(const struct w4a16_weight *src, struct w4a16_weight **out, char *err,
                           size_t errlen) {
    *out = NULL;
    struct w4a16_weight *w = (struct w4a16_weight *)calloc(1, sizeof *w);
    if (!w) return util_err(err, errlen, -ENOMEM, "w4a16_clone: out of memory");
    *w = *src;
    w->qw = NULL;
    w->sc = NULL;
    w->zr = NULL;
    w->bias = NULL;
    w->cnt = NULL;
    w->gsp = NULL;
    if (cudaGetDevice(&w->dev) != cudaSuccess) { /* the copy lives on the current device */
        cudaGetLastError();
        w->dev = -1; /* no poll buffer */
    }
    const size_t qb = (size_t)src->n16a * src->kc * 32 * 16, sb = (size_t)src->kg * src->n16a * 8;
    int rc = 0;
#define CL_CHECK(call)                                                                          \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            rc = util_err(err, errlen, CUDA_CHECK_RC_(e_), "w4a16_clone: %s failed: %s", #call, \
                          cudaGetErrorString(e_));                                              \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)
    CL_CHECK(cudaMalloc((void **)&w->qw, qb));
    CL_CHECK(cudaMalloc((void **)&w->sc, sb * 4));
    CL_CHECK(cudaMalloc((void **)&w->zr, sb));
    CL_CHECK(cudaMalloc((void **)&w->cnt, sizeof(int) * (size_t)w->cnt_len));
    CL_CHECK(cudaMemcpy(w->qw, src->qw, qb, cudaMemcpyDeviceToDevice));
    CL_CHECK(cudaMemcpy(w->sc, src->sc, sb * 4, cudaMemcpyDeviceToDevice));
    CL_CHECK(cudaMemcpy(w->zr, src->zr, sb, cudaMemcpyDeviceToDevice));
    CL_CHECK(cudaMemset(w->cnt, 0, sizeof(int) * (size_t)w->cnt_len));
    if (src->bias) {
        CL_CHECK(cudaMalloc((void **)&w->bias, (size_t)src->n16a * 32));
        CL_CHECK(cudaMemcpy(w->bias, src->bias, (size_t)src->n16a * 32, cudaMemcpyDeviceToDevice));
    }
#undef CL_CHECK
    gsp_acquire(w);
    *out = w;
    return 0;
fail:
    w4a16_free(w);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                  */
/* ------------------------------------------------------------------------ */

#define CLUSTER_MAX 4  /* largest split reduced inside a cluster (8 measured slower: down) */

/* Crossovers measured on an H100 (docs/PERFORMANCE.md). */
/* The decode kernel: M <= 2 everywhere, M = 3..16 by dc_dispatch_takes
 * (kernels/cuda/dc_plan.h; H200, sessions 4, 21 and 22). */
#define DISPATCH_SKINNY_MAX_M 32
/* tc64 up to M = 256 (H100, session 11: at 256 10-30% faster than
 * dequantize + cuBLAS on every Qwen3-8B shape, at 384 4-33% slower; its
 * time steps with the 64-row blocks). On sm_90a the wgmma GEMM's window
 * (nat_window below) takes M = 65 and up first. */
#define DISPATCH_CUBLAS_MIN_M 257

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* Resident blocks per SM of each kernel (cached; 1 if the query fails). */
template <typename F>
static int occ_query(F *fn, int threads, size_t smem) {
    int n = 0, dev = 0, optin = 160 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
        optin > 160 * 1024)
        optin = 160 * 1024;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, smem) != cudaSuccess) {
        cudaGetLastError();
        return 1;
    }
    return n < 1 ? 1 : n;
}

static int sk_stages(void) { return SK_STAGES; }

static int kernel_occupancy(enum w4a16_kernel k, int m) {
    static int cache[16];
    int mt = (m + 7) / 8, slot;
    if (k == W4A16_KERNEL_TC64) slot = 0;
    else if (k == W4A16_KERNEL_TC128) slot = 1;
    else slot = mt <= 1 ? 2 : mt <= 2 ? 3 : mt <= 4 ? 4 : 5;
    if (cache[slot]) return cache[slot];
    int n = 1;
    switch (slot) {
    case 0: n = occ_query(k_tc<TC64_ARGS, false>, tc_cfg<4, 1, 8, 4>::NT, tc_cfg<4, 1, 8, 4>::SMEM); break;
    case 1: n = occ_query(k_tc<TC128_ARGS, false>, tc_cfg<4, 2, 8, 4>::NT, tc_cfg<4, 2, 8, 4>::SMEM); break;
    case 2: n = occ_query(k_skinny<1, SK_STAGES, false>, SK_WARPS * 32, sk_layout(8, 16, 128, sk_stages()).total); break;
    case 3: n = occ_query(k_skinny<2, SK_STAGES, false>, SK_WARPS * 32, sk_layout(16, 16, 128, sk_stages()).total); break;
    case 4: n = occ_query(k_skinny<4, SK_STAGES, false>, SK_WARPS * 32, sk_layout(32, 12, 128, sk_stages()).total); break;
    default: n = occ_query(k_skinny<8, SK_STAGES, false>, SK_WARPS * 32, sk_layout(64, 6, 128, sk_stages()).total); break;
    }
    cache[slot] = n;
    return n;
}

/* Skinny: the block's x slice (m rows x K range) must fit sk_x_limit(m)
 * (sk_plan.h: 96 KB at M = 9..32, where the split rule picks among 48, 64
 * and 96 KB slices; 48 KB elsewhere). The first M of that rule is
 * SK_MID_MIN_M (9); AWQD_W4A16_SK_MID16=0 gives 17, the rule before session
 * 48 (measurements). */
static int dc_env_int(const char *name, int def, int lo, int hi);
static int sk_mid_lo(void) {
    static const int v = dc_env_int("AWQD_W4A16_SK_MID16", 1, 0, 1) ? SK_MID_MIN_M : 17;
    return v;
}
static int sk_max_cps(int m) { return sk_cps_limit(m, sk_x_limit_from(m, sk_mid_lo())); }
static int sk_min_split(const struct w4a16_weight *w, int m) {
    return ceil_div(w->kc, sk_max_cps(m));
}

static void grid_of(const struct w4a16_weight *w, int m, enum w4a16_kernel k, int *nb, int *mbk,
                    int *nacc_threads) {
    switch (k) {
    case W4A16_KERNEL_SKINNY:
        *nb = ceil_div(w->n16, SK_WARPS);
        *mbk = 1;
        *nacc_threads = (ceil_div(m, 8) <= 2 ? ceil_div(m, 8) : ceil_div(m, 8) <= 4 ? 4 : 8) * 4 *
                        SK_WARPS * 32;
        break;
    case W4A16_KERNEL_TC64:
        *nb = ceil_div(w->n16, 8);
        *mbk = ceil_div(m, 64);
        *nacc_threads = 128 * 64;
        break;
    default:
        *nb = ceil_div(w->n16, 8);
        *mbk = ceil_div(m, 128);
        *nacc_threads = 128 * 128;
        break;
    }
}

/* ---- gemm helper (Session 3): the sm_90a wgmma INT4 GEMM (w4a16_gemm.cu) ---- */
/* With AWQD_W4A16_WGMMA=1 the dispatch uses it from this M on where
 * available (9.0 device, sm_90a build), replacing dequantize + cuBLAS; it is
 * also the no-workspace path from here (gemm_fallback_ok). By default it runs
 * inside nat_window's M range (session 14). Measured: docs/PERFORMANCE.md. */
#define DISPATCH_WGMMA_MIN_M 512 /* measured (H200, Session 3): from here it beats tc64 */

/* Where dequantize + cuBLAS has no room (no / too small workspace: the
 * INT4-only default), large M runs the wgmma GEMM instead of tc64 (1.0x at
 * M = 512, 1.4 - 1.9x from 1024 on, no workspace). AWQD_W4A16_WGMMA=0 turns
 * that off; AWQD_W4A16_WGMMA=1 uses it for every M >= DISPATCH_WGMMA_MIN_M
 * even where cuBLAS could run (measured slower there: experiments only). */
static int gemm_env(void) {
    static const int v = getenv("AWQD_W4A16_WGMMA") ? atoi(getenv("AWQD_W4A16_WGMMA")) : -1;
    return v;
}
/* The mid-M window of the wgmma GEMM's mode 4 (x by TMA in natural k
 * order), measured on an H100 in session 14 against tc64 and dequantize +
 * cuBLAS with its modelled tile and split (docs/PERFORMANCE.md): 1.05-1.8x
 * at M = 96-384 on the Qwen3-8B/32B shapes and shards (Qwen3-8B q|k|v at 384:
 * 0.97x, the one loss); at 385-768 a win only
 * for the large matrices (K N >= 48 Mi: 8B gate|up and down, 32B q|k|v,
 * gate|up, down and the larger shards), at 769-2048 only for gate|up (its
 * SiLU-mul is a second pass in dequantize + cuBLAS; at 4096 the two tie).
 * Session 19 (H100, with stream-K, docs/PERFORMANCE.md): 1.12-1.36x
 * dequantize + cuBLAS at M = 512-768 on every Qwen3-8B/32B shape and shard,
 * and at 1024 1.02-1.25x wherever x fits stream-K's limit (32 MiB; 32B down,
 * x 52 MB, lost: 532 vs 493 us): every shape to 768, to 1024 where x fits,
 * gate|up to 2048. Session 38 (H200, back to back, after mode 4's plain
 * loop took its weight words by gathers): gate|up to 4096, mode 4 against
 * dequantize + cuBLAS at M = 3072 / 4096 0.915 / 0.951x on Qwen3-8B, 0.93-0.98x
 * on Qwen3-32B and its tp = 2 / 4 shards, 0.98-1.02x on Llama-3-70B's (the
 * H100 tied there in session 19). Session 39 (H200, the consumers trimmed):
 * the other layouts to 4096 too where N >= 4096, the 1 x 256 tiles fill
 * >= 1.8 waves and stream-K or whole rounds even the last wave
 * (nat_wide_takes, kernels/cuda/nat_rule.h: 0.80-0.98x). */
#define DISPATCH_NAT_MIN_M 65
#define DISPATCH_NAT_ALL_MAX_M 384    /* without stream-K (AWQD_W4A16_GEMM_SK=0) */
#define DISPATCH_NAT_BIG_MAX_M 768    /* where K N >= 48 Mi, or with stream-K any shape */
#define DISPATCH_NAT_BIG_KN (48ll << 20)
#define DISPATCH_NAT_SK_MAX_M 1024    /* with stream-K, where x is within its limit */
#define DISPATCH_NAT_GU_MAX_M 4096
/* M = 17-64 and 1025-4096: kernels/cuda/nat_rule.h */
/* The back-to-back rules of nat_rule.h (measured on the H200 in sessions
 * 28-49, on the H100 in session 71: Qwen3-8B batch 40-64 +24-28% end to
 * end there) apply on every sm_90a device; AWQD_W4A16_NAT_BIG=0 goes back to
 * session 19's rule from single cold calls on the H100 (for measurements);
 * read once */
static int nat_b2b(void) {
    static const int v = getenv("AWQD_W4A16_NAT_BIG") ? atoi(getenv("AWQD_W4A16_NAT_BIG")) : 1;
    return v != 0;
}
static int nat_window(const struct w4a16_weight *w, int m) {
    if (gemm_env() == 0 || w4a16_gemm_auto_mode() < 4 || !w4a16_gemm_available()) return 0;
    const int sk = w4a16_gemm_stream_k();
    if (m < DISPATCH_NAT_MIN_M)
        return sk && nat_mid_takes(m, w->k, (long long)w->n16 * 16, nat_b2b());
    if (m <= DISPATCH_NAT_ALL_MAX_M) return 1;
    if (m <= DISPATCH_NAT_BIG_MAX_M && (sk || (long long)w->k * w->n16 * 16 >= DISPATCH_NAT_BIG_KN)) return 1;
    if (m <= DISPATCH_NAT_SK_MAX_M && sk && (size_t)m * w->k * 2 <= W4A16_GEMM_SK_X_MAX_BYTES) return 1;
    if (m <= DISPATCH_NAT_GU_MAX_M && w->layout == W4A16_LAYOUT_GATE_UP) return 1;
    static_assert(NAT_WIDE_SK_X_MAX == (long long)W4A16_GEMM_SK_X_MAX_BYTES, "nat_rule.h: stream-K's x limit");
    return m > DISPATCH_NAT_SK_MAX_M && nat_wide_takes(m, w->k, (long long)w->n16 * 16, w->sms, nat_b2b());
}

static int gemm_fallback_ok(const struct w4a16_weight *w, int m) {
    (void)w;
    return m >= DISPATCH_WGMMA_MIN_M && gemm_env() != 0 && w4a16_gemm_available();
}

static int pdl_mode(void);

static void gemm_args_of(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                         const uint16_t *bias, int gate_up, int ksplit, struct w4a16_gemm_args *ga) {
    memset(ga, 0, sizeof *ga);
    ga->qw = w->qw;
    ga->sc = w->sc;
    ga->zr = w->zr;
    ga->bias = bias;
    ga->cnt = w->cnt;
    ga->cnt_len = w->cnt_len;
    ga->k = w->k;
    ga->group = w->group;
    ga->n16 = w->n16;
    ga->n16a = w->n16a;
    ga->kc = w->kc;
    ga->n = w->n;
    ga->ldy = w->out_cols;
    ga->gate_up = gate_up;
    ga->sms = w->sms;
    ga->x = x;
    ga->y = y;
    ga->m = m;
    ga->ksplit = ksplit;
}

/* Picks the wgmma GEMM for *kern (AUTO at m >= DISPATCH_WGMMA_MIN_M, or
 * forced); returns 1 with *kern, *ksplit set, else 0 (forced but not
 * available: *kern becomes TC64). */
static int gemm_pick(const struct w4a16_weight *w, int m, enum w4a16_kernel *kern, int *ksplit) {
    const int want = *kern == W4A16_KERNEL_WGMMA ||
                     (*kern == W4A16_KERNEL_AUTO &&
                      ((m >= DISPATCH_WGMMA_MIN_M && gemm_env() == 1) || nat_window(w, m)));
    if (!want) return 0;
    if (!w4a16_gemm_available()) {
        if (*kern == W4A16_KERNEL_WGMMA) *kern = W4A16_KERNEL_TC64;
        return 0;
    }
    struct w4a16_gemm_args ga;
    gemm_args_of(w, NULL, m, NULL, NULL, w->layout == W4A16_LAYOUT_GATE_UP, *ksplit, &ga);
    int mt, bn, ks, mode;
    w4a16_gemm_choice(&ga, &mt, &bn, &ks, &mode);
    *kern = W4A16_KERNEL_WGMMA;
    *ksplit = ks;
    return 1;
}

static size_t gemm_ws(const struct w4a16_weight *w, int m, int ksplit) {
    struct w4a16_gemm_args ga;
    gemm_args_of(w, NULL, m, NULL, NULL, w->layout == W4A16_LAYOUT_GATE_UP, ksplit, &ga);
    return w4a16_gemm_workspace(&ga);
}
/* ---- end gemm helper ---- */

/* Dequantize + cuBLAS in column slabs when the workspace cannot hold the
 * whole fp16 copy: process-wide switch (default ON: measured on H200,
 * session 4, Qwen3-8B TTFT(1024) 49.7 -> 44.1 ms, TTFT(4096) 225.7 -> 171.8
 * ms against the wgmma GEMM; AWQD_W4A16_SLABS=0 turns it off,
 * w4a16_cublas_slabs() overrides both). */
static env_switch g_slabs = {{-1}, "AWQD_W4A16_SLABS"};

static int slabs_mode(void) { return switch_get(&g_slabs); }

/* The slabs' GEMMs through cuBLASLt with each shape's algorithm kept
 * (gemm_lt.h; default) or through cublasGemmEx (AWQD_W4A16_LT=0: it picks an
 * algorithm on every call, ~50 µs of host time on an H100). */
static env_switch g_lt = {{-1}, "AWQD_W4A16_LT"};

/* K-slabs for plain layouts whose column slabs would be narrow (launch_cublas;
 * default; AWQD_W4A16_KSLABS=0: column slabs only). */
static env_switch g_kslabs = {{-1}, "AWQD_W4A16_KSLABS"};
static int kslabs_mode(void) { return switch_get(&g_kslabs); }
extern "C" int w4a16_cublas_kslabs(int mode) { return switch_set(&g_kslabs, mode); }

extern "C" int w4a16_cublas_slabs(int mode) { return switch_set(&g_slabs, mode); }

/* Decode kernel: process-wide switch (default ON: measured 1.0-1.8x the
 * skinny kernel back to back at M <= 2 on every Qwen3-8B/32B shape and
 * shard, H200, docs/PERFORMANCE.md session 4; AWQD_W4A16_DECODE=0 turns it
 * off, w4a16_decode_kernel() overrides both). */
static env_switch g_decode = {{-1}, "AWQD_W4A16_DECODE"};

static int decode_mode(void) { return switch_get(&g_decode); }

extern "C" int w4a16_decode_kernel(int mode) { return switch_set(&g_decode, mode); }

static int dc_env_int(const char *name, int def, int lo, int hi) {
    const char *e = getenv(name);
    int v = e ? atoi(e) : def;
    return v < lo || v > hi ? def : v;
}

static struct dc_gpu dc_gpu_of(const struct w4a16_weight *w) {
    struct dc_gpu g;
    g.sms = w->sms;
    g.smem_sm = w->smem_sm;
    g.smem_optin = w->smem_optin;
    return g;
}

/* AWQD_W4A16_DC_TB (the tiles per block forced; 0: the plan's rule), read once */
static int dc_tb_env(void) {
    static const int v = dc_env_int("AWQD_W4A16_DC_TB", 0, 1, 4);
    return v;
}

/* the plan's pf as AWQD_W4A16_DC_PF forces it (after each rule that sets it) */
static void dc_pf_env(struct dc_plan *pl) {
    static const int v = dc_env_int("AWQD_W4A16_DC_PF", -1, 0, 7);
    if (v >= 0) pl->pf = v;
}

/* The decode kernel's launch plan (dc_plan_make, kernels/cuda/dc_plan.h);
 * 0 where it does not apply (the skinny kernel runs instead). Measurement
 * knobs, read once: AWQD_W4A16_DC_TB=1|2|4 forces the tiles per block,
 * AWQD_W4A16_DC_WAVES=0 keeps the width where the M <= 4 rule would halve
 * it, AWQD_W4A16_DC_PLAN=21 plans as session 21 did, AWQD_W4A16_DC_PF=0..7
 * forces the L2 prefetch distance (the plan's pf), AWQD_W4A16_DC_TB1=0 keeps
 * M = 9..16 at two tiles per block on the persistent grid (dc_ps_tb1). */
static int dc_ps_usable(void);
static int dc_cl_mode(void);
static int dc_cl_sms(const struct w4a16_weight *w);

/* What the plan knows of the GPU for pl: at pl->cl > 1 the clusters that fit
 * at once (one block per SM) stand for its SMs */
static struct dc_gpu dc_gpu_for(const struct w4a16_weight *w, const struct dc_plan *pl) {
    struct dc_gpu g = dc_gpu_of(w);
    if (pl && pl->cl > 1) g.sms = dc_cl_sms(w);
    return g;
}

static int decode_plan(const struct w4a16_weight *w, int m, struct dc_plan *pl) {
    static const int flags = (dc_env_int("AWQD_W4A16_DC_WAVES", 1, 0, 1) ? DC_PLAN_HALVE : 0) |
                             (dc_env_int("AWQD_W4A16_DC_PLAN", 22, 21, 22) == 21 ? DC_PLAN_S21 : 0) |
                             (dc_env_int("AWQD_W4A16_DC_TB1", 1, 0, 1) ? DC_PLAN_TB1 : 0) |
                             (dc_env_int("AWQD_W4A16_DC_TB4", 1, 0, 1) ? DC_PLAN_TB4 : 0);
    const struct dc_gpu g = dc_gpu_of(w);
    /* the cluster K split: by its rule (mode 0, the default), wherever it applies (2), never (1) */
    const int mode = dc_cl_mode(), cl = mode == 2 || (mode == 0 && dc_cl_takes(m, w->k, w->n)) ? 2 : 1;
    struct dc_gpu gc = g;
    gc.sms = cl > 1 ? dc_cl_sms(w) : 0;
    if (!(cl > 1 && gc.sms > 0 && dc_plan_cluster(m, w->k, w->n16, w->group, &gc, cl, dc_tb_env(), flags, pl)) &&
        !dc_plan_make(m, w->k, w->n16, w->group, &g, dc_tb_env(), flags, pl))
        return 0;
    /* the four-tile grid is a persistent one: without it the dispatch must
     * not take the decode kernel for it (dc_ps_tb4_takes) */
    if (!dc_ps_usable()) pl->flags &= ~DC_PLAN_TB4;
    dc_pf_env(pl);
    return 1;
}

/* The decode kernel's K split through global memory at M <= 8 (dc_plan.h,
 * dc_plan_gs / dc_gs_pick): AWQD_W4A16_DC_KS (w4a16_decode_ksplit) 1 by
 * the rule (the default), 2 by the rule without session 56's cases
 * (dc_gs_pick_flags), 0 never, 10 ks + tb (ks 2, 3 or 4 with tb 2 or 4;
 * ks 6 or 8 with tb 4) wherever that grid is one wave, 100 + 10 ks + tb
 * wherever it fits at all (for measurements). */
static env_knob g_dc_ks = ENV_KNOB_INIT("AWQD_W4A16_DC_KS", 1, 0, 199);
extern "C" int w4a16_decode_ksplit(int v) { return knob_set(&g_dc_ks, v); }

/* For measurements: AWQD_W4A16_DC_KS_MINK=K0 leaves the split out below K = K0 at M <=
 * AWQD_W4A16_DC_KS_MINK_M (default 8): the rule's e2e check, matrix by matrix (6144: the rule
 * before session 63) */
static env_knob g_dc_ks_mink = ENV_KNOB_INIT("AWQD_W4A16_DC_KS_MINK", 0, 0, 1 << 20);
static env_knob g_dc_ks_mink_m = ENV_KNOB_INIT("AWQD_W4A16_DC_KS_MINK_M", 8, 1, 8);

/* pl (decode_plan's) replaced by the K split's where it applies (the plain
 * and SUM variants; the caller checks the workspace): 1 if so */
static int decode_plan_gs(const struct w4a16_weight *w, int m, struct dc_plan *pl) {
    const int v0 = knob_get(&g_dc_ks), v = v0 % 100, any_wave = v0 >= 100, ks = v / 10, tb = v % 10;
    const struct dc_gpu g = dc_gpu_of(w);
    struct dc_plan q;
    if (!v || pl->mt != 1 || pl->cl != 1) return 0;
    if (w->k < knob_get(&g_dc_ks_mink) && m <= knob_get(&g_dc_ks_mink_m)) return 0;
    if (v <= 2 ? !dc_gs_pick_flags(pl, &g, v == 1 ? DC_GS_S56 : 0, &q)
               : (ks < 2 || (ks > 4 && ks != 6 && ks != 8)) || (tb != 2 && tb != 4) || (ks > 4 && tb != 4) ||
                     !dc_plan_gs(m, w->k, w->n16, w->group, &g, ks, tb, pl->flags, &q) ||
                     (!any_wave && !dc_gs_one_wave(&q, &g)))
        return 0;
    if (q.blocks > w->cnt_len) return 0;
    *pl = q;
    return 1;
}

/* The decode kernel's plan at m rows for the plain and SUM variants: the
 * one-block plan (with the K split where decode_plan_gs takes it), or, where
 * x of all of K leaves no one-block plan (M <= 8), the K split alone (its
 * pick against a plan with no block resident). 0 where neither applies.
 * has: decode_plan's result, its plan in *pl (made once by the callers). */
static int decode_plan_any_of(const struct w4a16_weight *w, int m, int has, struct dc_plan *pl) {
    if (has) {
        decode_plan_gs(w, m, pl);
        return 1;
    }
    if (m < 1 || m > 8 || w->group != 128) return 0;
    struct dc_plan one;
    dc_plan_none(m, w->k, w->n16, DC_PLAN_HALVE | DC_PLAN_TB1 | DC_PLAN_TB4, &one);
    if (!decode_plan_gs(w, m, &one)) return 0;
    *pl = one;
    return 1;
}
static int decode_plan_any(const struct w4a16_weight *w, int m, struct dc_plan *pl) {
    return decode_plan_any_of(w, m, decode_plan(w, m, pl), pl);
}

/* The dispatch takes the decode kernel with the K split at M = 3-8 also
 * where it would not take the one-block plan (or there is none), before the
 * skinny kernel. H200, session 53, back to back, `--set all` at M = 3 / 4 /
 * 6 / 8, on against off: Qwen3-32B down at M = 3 / 4 26.09 / 30.65 ->
 * 19.76 / 20.11 us (no split fits one wave at M = 6-8), its tp = 2 down at
 * M = 6 / 8 16.59 / 16.71 -> 12.31 / 12.60; no other point changed by more
 * than 2.2%; qwen3-32b batch 3 / 4 0.926x a step. AWQD_W4A16_DC_KSX=0 turns
 * that off (w4a16_decode_ksplit_dispatch) */
static env_knob g_dc_ksx = ENV_KNOB_INIT("AWQD_W4A16_DC_KSX", 1, 0, 1);
extern "C" int w4a16_decode_ksplit_dispatch(int v) { return knob_set(&g_dc_ksx, v); }

extern "C" int w4a16_decode_applies(const struct w4a16_weight *w, int m) {
    struct dc_plan pl;
    return w && decode_plan(w, m, &pl);
}

/* Whether the automatic dispatch runs the decode kernel at M = m with plan
 * pl (decode_plan's, or NULL when there is none; dc_dispatch_takes;
 * AWQD_W4A16_DC_MAX_M=2..16 lowers the last M, for measurements). */
static int dc_in_dispatch(const struct w4a16_weight *w, int m, const struct dc_plan *pl) {
    static const int max_m = dc_env_int("AWQD_W4A16_DC_MAX_M", DC_DISPATCH_MAX_M, 2, DC_DISPATCH_MAX_M);
    if (pl && pl->cl > 1) return m <= max_m; /* the split's own rule (dc_cl_takes) */
    const struct dc_gpu g = dc_gpu_of(w);
    return dc_dispatch_takes(m, max_m, pl, &g);
}

/* The skinny kernel's last M in the dispatch (w4a16_skinny_max_m). */
static std::atomic<int> g_skinny_max_m{DISPATCH_SKINNY_MAX_M};

/* gate|up with K <= 4096 (Qwen3-8B) from M = 28 to the skinny kernel's
 * default last M: tc64 instead. H100, session 20, single cold calls at
 * M = 28 / 32: Qwen3-8B gate|up 1.11x / 1.14x, batch-32 decode of Qwen3-8B
 * 5190 -> 5347 tok/s; Qwen3-32B 1.04x / 1.06x but its tp = 2 and tp = 4
 * shards 1.3-1.5% slower. H200, session 27, back to back at M = 28-32:
 * Qwen3-8B 1.00-1.02x (batch 32 end to end the same), but every K >= 5120
 * gate|up lost: Qwen3-32B 0.84-0.86x, its tp = 2 / 4 shards 0.78-0.81x /
 * 0.73-0.75x, Llama-3-70B and its shards 0.74-0.95x; qwen3-32b batch 32
 * (8 layers) 2.75 -> 2.60 ms at tp = 1, 1.41 -> 1.25 at tp = 4 without it.
 * Hopper only (measured there; tc64 reduces its split in a cluster there),
 * and not where w4a16_skinny_max_m moved the skinny kernel's range. On an
 * H200 the wgmma GEMM takes Qwen3-8B gate|up from M = 25 first (session 43,
 * nat_rule.h: 0.81x tc64's time at M = 28-32), so this applies on the H100.
 * AWQD_W4A16_GU_TC64=0 turns it off. docs/PERFORMANCE.md "Session 20",
 * "Session 27". */
#define DISPATCH_GU_TC64_MIN_M 28
#define DISPATCH_GU_TC64_MAX_K 4096
static env_switch g_gu_tc64 = {{-1}, "AWQD_W4A16_GU_TC64"};
static int gu_tc64(const struct w4a16_weight *w, int m) {
    return w->layout == W4A16_LAYOUT_GATE_UP && w->cc_major >= 9 && m >= DISPATCH_GU_TC64_MIN_M &&
           m <= DISPATCH_SKINNY_MAX_M && w->k <= DISPATCH_GU_TC64_MAX_K &&
           g_skinny_max_m.load(std::memory_order_relaxed) == DISPATCH_SKINNY_MAX_M && switch_get(&g_gu_tc64);
}

extern "C" int w4a16_skinny_max_m(int m) {
    if (m > 0) g_skinny_max_m.store(m > 64 ? 64 : m, std::memory_order_relaxed);
    return g_skinny_max_m.load(std::memory_order_relaxed);
}

static int tc_use_cluster(const struct w4a16_weight *w, int mbk, int ksplit);

static void choose(const struct w4a16_weight *w, int m, enum w4a16_kernel *kern, int *ksplit) {
    enum w4a16_kernel k = *kern;
    /* the decode kernel's plan, made once for its questions below */
    struct dc_plan pl = {};
    const int has = decode_plan(w, m, &pl);
    /* its cluster K split before the GEMM's rules */
    if (k == W4A16_KERNEL_AUTO && decode_mode() && has && pl.cl > 1 && dc_in_dispatch(w, m, &pl)) {
        *kern = W4A16_KERNEL_DECODE;
        *ksplit = 1;
        return;
    }
    if (gemm_pick(w, m, kern, ksplit)) return; /* gemm helper: large M on sm_90a */
    k = *kern;
    {   /* the decode kernel for small M */
        struct dc_plan gs = pl;
        const int has_gs = decode_plan_any_of(w, m, has, &gs) && gs.gs;
        if (k == W4A16_KERNEL_AUTO && decode_mode() &&
            (dc_in_dispatch(w, m, has ? &pl : NULL) || (has_gs && knob_get(&g_dc_ksx))))
            k = W4A16_KERNEL_DECODE;
        if (k == W4A16_KERNEL_DECODE) {
            if (has || has_gs) {
                *kern = k;
                *ksplit = 1;
                return;
            }
            k = *kern == W4A16_KERNEL_AUTO ? W4A16_KERNEL_AUTO : W4A16_KERNEL_SKINNY;
        }
    }
    if (k == W4A16_KERNEL_AUTO)
        k = m <= g_skinny_max_m.load(std::memory_order_relaxed) && !gu_tc64(w, m) ? W4A16_KERNEL_SKINNY
            : m < DISPATCH_CUBLAS_MIN_M ? W4A16_KERNEL_TC64
                                        : W4A16_KERNEL_CUBLAS;
    if (k == W4A16_KERNEL_SKINNY && m > 64) k = W4A16_KERNEL_TC64;
    if (k == W4A16_KERNEL_CUBLAS) {
        *kern = k;
        *ksplit = 1;
        return;
    }
    int nb, mbk, na;
    grid_of(w, m, k, &nb, &mbk, &na);
    int ks = *ksplit;
    if (ks <= 0) {
        /* Measured on H100 (bench --sweep): the skinny kernel is best with ~16
         * chunks per warp as long as the grid stays one wave; the GEMM with the
         * most splits that still fit one wave of resident blocks. */
        const int occ = kernel_occupancy(k, m), slots = occ * w->sms;
        if (k == W4A16_KERNEL_SKINNY) {
            ks = sk_split_rule(m, w->kc, nb, w->sms, occ);
            /* M = 9..32 (17..32 before session 48, sk_mid_lo): the split
             * among the 48 / 64 / 96 KB x slices that loads the busiest SM
             * least (sk_plan.h, session 35); AWQD_W4A16_SK_MID=0: the 48 KB
             * slice as before */
            if (m >= sk_mid_lo() && m <= 32) {
                static env_switch sk_mid = {{-1}, "AWQD_W4A16_SK_MID"};
                const int cps48 = sk_cps_limit(m, SK_X_BYTES_MAX);
                /* also one wave of two blocks per SM: M <= 16 since session 48, every M <= 32
                 * since session 49 (AWQD_W4A16_SK_WAVE1=0: not; =1: M <= 16 only) */
                static const int wave1 = dc_env_int("AWQD_W4A16_SK_WAVE1", 2, 0, 2);
                ks = switch_get(&sk_mid) ? sk_split_mid_w(m, w->kc, nb, w->group, ks, w->sms, w->smem_sm, wave1)
                                         : std::max(ks, ceil_div(w->kc, cps48));
            }
        } else {
            ks = slots / (nb * mbk);
            if (mbk == 1 && tc_use_cluster(w, 1, 2)) {
                /* reduced in a cluster: ~1.5 blocks per SM, at least 2 splits
                 * (H100 sweep, session 11: M = 64 q|k|v 4 splits 23.0 us vs
                 * 8 (one wave) 26.7; o 6: 18.9; down 6: 37.2; gate|up 2:
                 * 50.9 vs 1: 63.7) */
                const int want = (3 * w->sms + nb) / (2 * nb);
                ks = std::min(std::max(want, 2), std::max(ks, 1));
                if (ks > TC_CLUSTER_MAX) ks = TC_CLUSTER_MAX;
            }
            if (ks > w->kc / 8) ks = w->kc / 8;
            if (ks > 16) ks = 16;
        }
        if (ks < 1) ks = 1;
    }
    if (k == W4A16_KERNEL_SKINNY && ks < sk_min_split(w, m)) ks = sk_min_split(w, m);
    if (ks > w->kc) ks = w->kc;
    *kern = k;
    *ksplit = ks;
}

static size_t ws_need(const struct w4a16_weight *w, int m, enum w4a16_kernel k, int ksplit) {
    /* gemm helper: its run takes the caller's split (0 in the automatic
     * choice) and picks its own; the split it reports, passed back, would
     * force a different choice (mode 6's split read as a cluster split) */
    if (k == W4A16_KERNEL_WGMMA) return gemm_ws(w, m, 0);
    if (k == W4A16_KERNEL_CUBLAS)
        return align256((size_t)w->n16 * 16 * w->k * 2) +
               (w->layout == W4A16_LAYOUT_GATE_UP ? align256((size_t)m * w->n16 * 16 * 2) : 0);
    if (k == W4A16_KERNEL_DECODE) { /* the K split's sums (decode_plan_any) */
        struct dc_plan pl;
        return decode_plan_any(w, m, &pl) && pl.gs ? dc_gs_ws_bytes(&pl) : 0;
    }
    if (ksplit <= 1) return 0;
    int nb, mbk, na;
    grid_of(w, m, k, &nb, &mbk, &na);
    return (size_t)nb * mbk * ksplit * na * sizeof(float);
}

extern "C" void w4a16_choice(const struct w4a16_weight *w, int m, enum w4a16_kernel *kernel,
                             int *ksplit) {
    enum w4a16_kernel k = W4A16_KERNEL_AUTO;
    int ks = 0;
    choose(w, m, &k, &ks);
    *kernel = k;
    *ksplit = ks;
}

extern "C" size_t w4a16_workspace_bytes(const struct w4a16_weight *w, int max_m) {
    size_t best = 0;
    for (int m = 1; m <= max_m; m = (m < 512 || m == max_m) ? m + 1 : (2 * m < max_m ? 2 * m : max_m)) {
        enum w4a16_kernel k = W4A16_KERNEL_AUTO;
        int ks = 0;
        choose(w, m, &k, &ks);
        size_t b = ws_need(w, m, k, ks);
        if (b > best) best = b;
    }
    return best;
}

extern "C" size_t w4a16_stream_k_bytes(const struct w4a16_weight *w) {
    return w ? w4a16_gemm_sk_workspace(w->sms) : 0;
}

/* Programmatic dependent launch: on by default on sm_90+, AWQD_CUDA_PDL=0 turns it
 * off, w4a16_pdl() overrides both. */
static env_switch g_pdl = {{-1}, "AWQD_CUDA_PDL"};

static int pdl_mode(void) { return switch_get(&g_pdl); }

extern "C" int w4a16_pdl(int mode) { return switch_set(&g_pdl, mode); }

/* Split-K reduction inside a thread-block cluster (sm_90+, ksplit <= 8): on by
 * default, AWQD_W4A16_CLUSTER=0 turns it off, w4a16_cluster_reduce() overrides. */
static env_switch g_cluster = {{-1}, "AWQD_W4A16_CLUSTER"};

static int cluster_mode(void) { return switch_get(&g_cluster); }

static int cluster_on(const struct w4a16_weight *w) { return w->cc_major >= 9 && cluster_mode(); }

/* Where the skinny kernel reduces its split inside a cluster. Measured (H200,
 * back to back and single calls): a clear gain for M <= 8 when there are more
 * blocks than SMs (gate|up M = 2..8: 25 -> 22 us, q|k|v 12.7 -> 11.7), a loss
 * when there is about one block per SM (o, 128 blocks: the cluster placement
 * leaves SMs idle), for clusters of 8 (down: 14.9 -> 17.9 us) and for M > 8. */
static int sk_use_cluster(const struct w4a16_weight *w, int m, int ksplit) {
    return cluster_on(w) && ksplit > 1 && ksplit <= CLUSTER_MAX && m <= 8 &&
           ceil_div(w->n16, SK_WARPS) * ksplit > w->sms;
}

extern "C" int w4a16_cluster_reduce(int mode) { return switch_set(&g_cluster, mode); }

/* Where the tensor-core GEMM reduces its split inside a cluster (sm_90+,
 * ksplit <= TC_CLUSTER_MAX, one row block): on with the cluster switch
 * above, and AWQD_W4A16_TC_CLUSTER=0 turns it off for this kernel alone.
 * Measured (H100, session 11, best split of each, Qwen3-8B): M = 64 q|k|v
 * 22.2-23.0 us in a cluster vs 25.1-25.4 through the workspace, o 18.8 vs
 * 20.4, gate|up and down within 3%; with two row blocks (M = 128) the
 * workspace won by 7-12% (q|k|v 32.7 vs 35.9, down 52.5 vs 58.8). */
static env_switch g_tc_cluster = {{-1}, "AWQD_W4A16_TC_CLUSTER"};

static int tc_use_cluster(const struct w4a16_weight *w, int mbk, int ksplit) {
    return cluster_on(w) && switch_get(&g_tc_cluster) && mbk == 1 && ksplit > 1 &&
           ksplit <= TC_CLUSTER_MAX;
}

/* Workspace a call really needs: none for a skinny split reduced in a cluster
 * (skinny recomputes the split from the chunks per split; same here). */
static size_t ws_call(const struct w4a16_weight *w, int m, enum w4a16_kernel k, int ks) {
    if (k == W4A16_KERNEL_SKINNY && ks > 1) {
        int cps = ceil_div(w->kc, ks);
        if (cps > sk_max_cps(m)) cps = sk_max_cps(m);
        if (sk_use_cluster(w, m, ceil_div(w->kc, cps))) return 0;
    }
    if ((k == W4A16_KERNEL_TC64 || k == W4A16_KERNEL_TC128) && ks > 1) {
        int nb, mbk, na;
        grid_of(w, m, k, &nb, &mbk, &na);
        if (tc_use_cluster(w, mbk, ceil_div(w->kc, ceil_div(w->kc, ks)))) return 0;
    }
    return ws_need(w, m, k, ks);
}

/* Launches kern<<<grid, block, smem, s>>>(args...), with the programmatic
 * stream serialization attribute when PDL is on (the kernels call pdl_wait()
 * before touching anything an earlier kernel writes). */
template <typename... KArgs, typename... Args>
static cudaError_t launch_pdl_cl(const struct w4a16_weight *w, void (*kern)(KArgs...), dim3 grid,
                                 dim3 block, size_t smem, cudaStream_t s, dim3 cluster,
                                 Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[3] = {};
    int na = 0;
    if (cluster.x * cluster.y * cluster.z > 1) { /* required: the kernel reduces in the cluster */
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = cluster.x;
        at[na].val.clusterDim.y = cluster.y;
        at[na].val.clusterDim.z = cluster.z;
        na++;
    }
    /* the carveout before PDL: the fallback below drops the last attribute */
    na += cuda_carveout_attr(&at[na], (const void *)kern, grid, block, smem);
    const int npdl = pdl_mode() && w->cc_major >= 9 ? 1 : 0;
    if (npdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    if (e != cudaSuccess && npdl && e != cudaErrorStreamCaptureInvalidated &&
        e != cudaErrorStreamCaptureUnsupported) {
        /* PDL attribute refused (driver, stream kind): launch without it */
        cudaGetLastError();
        cfg.numAttrs = na - 1;
        e = cudaLaunchKernelEx(&cfg, kern, ((KArgs)args)...);
    }
    return e;
}

template <typename... KArgs, typename... Args>
static cudaError_t launch_pdl(const struct w4a16_weight *w, void (*kern)(KArgs...), dim3 grid,
                              dim3 block, size_t smem, cudaStream_t s, Args... args) {
    return launch_pdl_cl(w, kern, grid, block, smem, s, dim3(1, 1, 1), args...);
}

template <int WN, int WM, int MW, int STAGES, int MINB>
static int launch_tc(const struct w4a16_weight *w, const uint16_t *x, int m, epi_args ep,
                     int ksplit, float *part, cudaStream_t s, char *err, size_t errlen) {
    typedef tc_cfg<WN, WM, MW, STAGES> C;
    static std::atomic<unsigned long long> smem_set{0}, smem_set_cl{0};
    int cps = ceil_div(w->kc, ksplit);
    ksplit = ceil_div(w->kc, cps);
    dim3 grid(ceil_div(w->n16, C::BN16), ceil_div(m, C::BM), ksplit);
    if (tc_use_cluster(w, (int)grid.y, ksplit)) {
        int rc = cuda_smem_limit_once(&smem_set_cl, (const void *)k_tc<WN, WM, MW, STAGES, MINB, true>,
                                      C::SMEM, err, errlen);
        if (rc) return rc;
        CUDA_CHECK(launch_pdl_cl(w, k_tc<WN, WM, MW, STAGES, MINB, true>, grid, dim3(C::NT), C::SMEM, s,
                                 dim3(1, 1, ksplit), w->qw, w->sc, w->zr, x, w->k, w->n16a, w->kc,
                                 w->group, cps, ksplit, ep, part, w->cnt),
                   err, errlen);
        return 0;
    }
    int rc = cuda_smem_limit_once(&smem_set, (const void *)k_tc<WN, WM, MW, STAGES, MINB, false>,
                                  C::SMEM, err, errlen);
    if (rc) return rc;
    if (ksplit > 1 && (int)(grid.x * grid.y) > w->cnt_len) return -ERANGE;
    CUDA_CHECK(launch_pdl(w, k_tc<WN, WM, MW, STAGES, MINB, false>, grid, dim3(C::NT), C::SMEM, s, w->qw,
                          w->sc, w->zr, x, w->k, w->n16a, w->kc, w->group, cps, ksplit, ep, part,
                          w->cnt),
               err, errlen);
    return 0;
}

static thread_local cublasHandle_t tl_cublas = NULL;

/* C [rows, m] (column-major, ldc) = wt^T [rows, k] (wt: k x rows, lda) @ x
 * [k, m] (ldb) (+ beta * C), fp16 with fp32 compute: one slab's GEMM,
 * through cuBLASLt with the shape's algorithm kept (default) or
 * cublasGemmEx (AWQD_W4A16_LT=0). */
static int slab_gemm(int rows, int m, int k, const uint16_t *wt, int lda, const uint16_t *x,
                     int ldb, float beta, uint16_t *C, int ldc, cudaStream_t s, char *err,
                     size_t errlen) {
    if (switch_get(&g_lt))
        return gemm_lt_f16(s, CUBLAS_OP_T, CUBLAS_OP_N, rows, m, k, wt, lda, x, ldb, beta, C, ldc,
                           err, errlen);
    if (!tl_cublas) CUBLAS_CHECK(cublasCreate(&tl_cublas), err, errlen);
    CUBLAS_CHECK(cublasSetStream(tl_cublas, s), err, errlen);
    const float one = 1.f;
    CUBLAS_CHECK(cublasGemmEx(tl_cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, m, k, &one, wt, CUDA_R_16F,
                              lda, x, CUDA_R_16F, ldb, &beta, C, CUDA_R_16F, ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 err, errlen);
    return 0;
}

/* y [m, n] += bias (plain layouts, after all slabs) */
static int slab_bias(const epi_args &ep, int m, int n, cudaStream_t s, char *err, size_t errlen) {
    if (!ep.bias) return 0;
    size_t e = (size_t)m * n;
    k_bias<<<(unsigned)((e + 255) / 256), 256, 0, s>>>(ep.y, ep.bias, m, n);
    CUDA_CHECK_LAUNCH(err, errlen);
    return 0;
}

/* Bytes of workspace one slab of `cols` physical columns needs: its fp16
 * copy [cols][K] and, for gate|up, its fp16 output [m][cols]. */
static size_t slab_bytes(const struct w4a16_weight *w, int m, int cols) {
    return align256((size_t)cols * w->k * 2) +
           (w->layout == W4A16_LAYOUT_GATE_UP ? align256((size_t)m * cols * 2) : 0);
}

/* Dequantize + cuBLAS over K-slabs of kr rows (a multiple of 128) of every
 * column: y = sum over slabs of x[:, k0:k0+kr] * W[k0:k0+kr, :] (plain
 * layouts only: gate|up needs all of K before its SiLU). */
static int launch_kslabs(const struct w4a16_weight *w, const uint16_t *x, int m, epi_args ep,
                         void *workspace, int kr, cudaStream_t s, char *err, size_t errlen) {
    const int K = w->k, nblk = w->n16a / 8;
    uint16_t *wt = (uint16_t *)workspace;
    for (int k0 = 0; k0 < K; k0 += kr) {
        int kn = K - k0 < kr ? K - k0 : kr; /* a multiple of 64: K is */
        size_t nthr = (size_t)nblk * 8 * (kn / 64) * 32;
        k_dequant_t<<<(unsigned)((nthr + 255) / 256), 256, 0, s>>>(
            w->qw, w->sc, w->zr, w->n16, w->n16a, w->kc, kn, w->group, wt, 0, nblk * 8, k0 / 64,
            kn / 64);
        CUDA_CHECK_LAUNCH(err, errlen);
        int rc = slab_gemm(w->n, m, kn, wt, kn, x + k0, K, k0 ? 1.0f : 0.0f, ep.y, ep.ldy, s, err,
                           errlen);
        if (rc) return rc;
    }
    return slab_bias(ep, m, w->n, s, err, errlen);
}

/* Dequantize + cuBLAS in column slabs: tiles [nt0, nt1) at a time (whole
 * 8-tile blocks, 128 physical columns, as the repacked weight stores them)
 * are dequantized into the workspace and multiplied, so the transient fp16
 * copy is at most `cols` x K (the slab stays in L2 between the two); one
 * slab of every column is the whole-matrix path. Plain: the slab's output
 * columns are written in place (physical column = checkpoint column); gate|up:
 * the slab's physical output goes to the workspace and silu(gate) * up writes
 * its columns [nt0 * 8, nt1 * 8). A bias is added to the whole output at the
 * end (plain) or in the silu stage (gate|up). -ENOSPC when not even one block
 * of 128 columns fits. */
static int launch_cublas(const struct w4a16_weight *w, const uint16_t *x, int m, epi_args ep,
                         void *workspace, size_t ws_bytes, cudaStream_t s, char *err, size_t errlen) {
    const int K = w->k, nblk = w->n16a / 8;
    const int n_phys = w->n16 * 16;
    int per = nblk; /* blocks of 8 tiles per slab: as many as fit */
    while (per > 0 && slab_bytes(w, m, per * 128 < n_phys ? per * 128 : n_phys) > ws_bytes) per--;
    if (per <= 0)
        return util_err(err, errlen, -ENOSPC, "w4a16_linear: workspace of %zu bytes holds no slab",
                        ws_bytes);
    const int lt = switch_get(&g_lt);
    if (!ep.gate_up && per < nblk && lt && kslabs_mode()) {
        /* K-slabs: when the widest column slab leaves the GEMM under two
         * waves of 128 x 128 tiles (measured on an H100: a 1024-row down_proj
         * in 6 slabs of 768 columns ran at ~40% of cuBLAS's rate), dequantize
         * every column over a range of K instead and accumulate the slabs'
         * products in y (beta = 1; fp16 between slabs, like a split-K with
         * fp16 partials: a few ulp). */
        const int mt = ceil_div(m, 128);
        int kr = (int)(ws_bytes / ((size_t)n_phys * 2));
        kr -= kr % 128;
        if (kr > K) kr = K;
        if (per * mt < 2 * w->sms && kr >= 512 && kr < K) {
            /* as many slabs, of even height, a multiple of 128 rows: x + k0
             * stays 256-byte aligned, as cuBLASLt's chosen algorithms assume */
            const int nks = ceil_div(K, kr);
            kr = ceil_div(K, 128 * nks) * 128;
            return launch_kslabs(w, x, m, ep, workspace, kr, s, err, errlen);
        }
    }
    per = ceil_div(nblk, ceil_div(nblk, per)); /* as many slabs, of even width */
    uint16_t *wt = (uint16_t *)workspace;
    const int slab_cols = per * 128 < n_phys ? per * 128 : n_phys; /* the widest slab */
    uint16_t *Y = (uint16_t *)((char *)workspace + align256((size_t)slab_cols * K * 2));
    for (int b0 = 0; b0 < nblk; b0 += per) {
        int nt0 = b0 * 8, nt1 = (b0 + per < nblk ? b0 + per : nblk) * 8;
        if (nt1 > w->n16) nt1 = w->n16;
        int np = (nt1 - nt0) * 16; /* physical columns of this slab */
        int nt_blk = (nt1 - nt0 + 7) / 8 * 8; /* whole blocks: tiles past n16 return at once */
        size_t nthr = (size_t)nt_blk * w->kc * 32;
        k_dequant_t<<<(unsigned)((nthr + 255) / 256), 256, 0, s>>>(
            w->qw + (size_t)b0 * w->kc * 8 * 32, w->sc, w->zr, w->n16, w->n16a, w->kc, K, w->group,
            wt, nt0, nt_blk, 0, w->kc);
        CUDA_CHECK_LAUNCH(err, errlen);
        if (ep.gate_up) {
            int rc = slab_gemm(np, m, K, wt, K, x, K, 0.0f, Y, np, s, err, errlen);
            if (rc) return rc;
            int j0 = nt0 * 8, j1 = nt1 * 8 < ep.ldy ? nt1 * 8 : ep.ldy;
            if (j1 <= j0) continue;
            size_t n = (size_t)m * (j1 - j0);
            k_silu_mul<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(
                Y, ep.bias ? ep.bias + nt0 * 16 : NULL, ep.y + j0, m, j1 - j0, ep.ldy, np);
            CUDA_CHECK_LAUNCH(err, errlen);
        } else {
            int c1 = nt1 * 16 < w->n ? nt1 * 16 : w->n, ng = c1 - nt0 * 16;
            if (ng <= 0) continue;
            int rc = slab_gemm(ng, m, K, wt, K, x, K, 0.0f, ep.y + nt0 * 16, ep.ldy, s, err, errlen);
            if (rc) return rc;
        }
    }
    return ep.gate_up ? 0 : slab_bias(ep, m, w->n, s, err, errlen);
}

template <int MT, int ST>
static int launch_skinny_st(const struct w4a16_weight *w, const uint16_t *x, epi_args ep, int ksplit,
                            float *part, cudaStream_t s, char *err, size_t errlen) {
    static std::atomic<unsigned long long> smem_set{0}, smem_set_cl{0};
    int rc = cuda_smem_limit_once(&smem_set, (const void *)k_skinny<MT, ST, false>, 200 * 1024, err, errlen);
    if (rc) return rc;
    int cps = ceil_div(w->kc, ksplit);
    if (cps > sk_max_cps(ep.m)) cps = sk_max_cps(ep.m);
    ksplit = ceil_div(w->kc, cps);
    if (ksplit > 1 && ceil_div(w->n16, SK_WARPS) > w->cnt_len) return -ERANGE;
    sk_smem L = sk_layout(ep.m, cps, w->group, ST);
    dim3 grid(ceil_div(w->n16, SK_WARPS), ksplit);
    if (sk_use_cluster(w, ep.m, ksplit)) {
        rc = cuda_smem_limit_once(&smem_set_cl, (const void *)k_skinny<MT, ST, true>, 200 * 1024, err, errlen);
        if (rc) return rc;
        CUDA_CHECK(launch_pdl_cl(w, k_skinny<MT, ST, true>, grid, dim3(SK_WARPS * 32), L.total, s,
                                 dim3(1, ksplit, 1), w->qw, w->sc, w->zr, x, w->k, w->n16a, w->kc,
                                 w->group, cps, ksplit, ep, part, w->cnt, x_via_l2()),
                   err, errlen);
        return 0;
    }
    CUDA_CHECK(launch_pdl(w, k_skinny<MT, ST, false>, grid, dim3(SK_WARPS * 32), L.total, s, w->qw,
                          w->sc, w->zr, x, w->k, w->n16a, w->kc, w->group, cps, ksplit, ep, part,
                          w->cnt, x_via_l2()),
               err, errlen);
    return 0;
}

/* launches of the decode kernel's K split through global memory (dc_plan_gs) */
static std::atomic<unsigned long> g_gs_launches{0}, g_gs_polls{0};
extern "C" unsigned long w4a16_decode_ksplit_launches(void) { return g_gs_launches.load(std::memory_order_relaxed); }
/* ZM (k_decode, session 69): the zero point through the sums of x made by one more mma a k16
 * step, at MT = 1 up to this many rows (AWQD_W4A16_DC_ZM, w4a16_decode_zm; 0 off) in every
 * variant, where dc_zm_form's shape rule takes it. The tensor-parallel sum (w4a16_linear_sum)
 * takes it by the same rule, so that it stays bitwise w4a16_linear + the push all-reduce (its
 * ZM form has run on no 2-GPU host yet: tp_cuda's bitwise tests check it there). */
static env_knob g_dc_zm = ENV_KNOB_INIT("AWQD_W4A16_DC_ZM", 8, 0, 8);
/* The rule: dc_plan.h dc_zm_form (checked on the CPU by tests/test_dc_plan.c), with the
 * measurements behind it. The XP kernels (x group by group, M >= dc_xp_min_m) at TB < 4 have
 * no ZM form compiled (they spilled 4-40 bytes with it); where AWQD_W4A16_DC_XP_MIN_M puts XP
 * at M <= 4, those points run without ZM (dc_kernel). AWQD_W4A16_DC_ZM1 (ZM1, session 70):
 * 0 no form 2, 1 its rule (the default), 2 form 2 wherever ZM runs at M = 1. */
static env_knob g_dc_zm1 = ENV_KNOB_INIT("AWQD_W4A16_DC_ZM1", 1, 0, 2);
static int dc_zm_form_of(int m, int tb, int k, int grid) {
    return dc_zm_form(m, tb, k, grid, knob_get(&g_dc_zm), knob_get(&g_dc_zm1));
}
extern "C" int w4a16_decode_zm(int v) { return knob_set(&g_dc_zm, v); }
extern "C" int w4a16_decode_zm1(int v) { return knob_set(&g_dc_zm1, v); }
static std::atomic<unsigned long> g_zm_launches{0}, g_zm1_launches{0};
extern "C" unsigned long w4a16_zm1_launches(void) { return g_zm1_launches.load(std::memory_order_relaxed); }
extern "C" unsigned long w4a16_zm_launches(void) { return g_zm_launches.load(std::memory_order_relaxed); }
extern "C" unsigned long w4a16_decode_ksplit_polls(void) { return g_gs_polls.load(std::memory_order_relaxed); }

/* The K split's reducer poll (DC_F_GSPOLL): rank CL - 1 of each column waits for the other
 * ranks' sums in the device's poll buffer instead of the last block to arrive adding them
 * (a fence, a counter and the loads, each a round trip to L2 after the column's slowest block;
 * docs/PERFORMANCE.md "Session 62" item 4, "Session 63"). A block that waits for others must
 * know they run: only where the whole grid is resident at once (the kernel's occupancy at
 * this shared memory, asked once per size, times the SMs), at one row tile, in the plain
 * variant (the tensor-parallel sum keeps the counter: it needs two GPUs to test), where the
 * buffer holds the grid's sums. AWQD_W4A16_GS_POLL=0 turns it off (w4a16_decode_ksplit_poll). */
static env_knob g_gs_poll = ENV_KNOB_INIT("AWQD_W4A16_GS_POLL", 1, 0, 1);
extern "C" int w4a16_decode_ksplit_poll(int v) { return knob_set(&g_gs_poll, v); }
static int gs_poll_on(const struct w4a16_weight *w, const struct dc_plan *pl, int cl, int tb, int mt,
                      const void *kern, std::atomic<long long> *resident) {
    if (!knob_get(&g_gs_poll) || !w->gsp || mt != 1 || w->sms <= 0 ||
        (size_t)pl->blocks * cl * tb * mt * 4 * 32 * 4 > w->gsp_bytes)
        return 0;
    long long r = resident->load(std::memory_order_relaxed);
    if (r < 0 || (size_t)(r >> 8) != pl->smem) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, DC_WARPS * 32, pl->smem) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        r = ((long long)pl->smem << 8) | (n & 255);
        resident->store(r, std::memory_order_relaxed);
    }
    return (long long)pl->blocks * cl <= (long long)w->sms * (r & 255);
}

/* For measurements: AWQD_W4A16_DC_LATE=1 triggers the dependents after the
 * decode kernel's main loop instead of at its start. */
static int dc_flags(void) {
    static const int v = (getenv("AWQD_W4A16_DC_LATE") && !strcmp(getenv("AWQD_W4A16_DC_LATE"), "1") ? DC_F_LATE : 0) |
                         (x_via_l2() ? DC_F_XCG : 0);
    return v;
}

/* Shared memory of a NORM launch: the plan's, with w's pieces past PRE
 * (dc_norm_w_stage) after x and the reduction area where a warp's range has
 * such pieces (more than 32 PRE of 8 halves: at TB = 4, or K > 8192) — not
 * otherwise, so that the block still fits beside the previous kernel's as
 * early as before */
template <int PRE>
static size_t dc_norm_smem(const struct dc_plan *pl, int K) {
    if (PRE > 0 && (K / 128 + DC_WARPS - 1) / DC_WARPS * 16 <= 32 * PRE) return pl->smem;
    const size_t sw = dc_smem_bytes(pl->m, K, pl->tb, pl->mt) + (size_t)K * 2;
    return pl->smem > sw ? pl->smem : sw;
}

/* k_decode in ZM form *zm (dc_zm_form's pick) where that form is compiled,
 * else the nearest below it; *zm becomes the form launched. Compiled: form 1
 * at MT = 1 but in the XP kernels below four tiles (they spilled 4-40 bytes
 * with it), form 2 at MT = 1 without XP (any tiles a block). */
template <int MT, int TB, bool NORM, bool SUM, bool PS, bool PF, int MINB, bool XP, int CL, bool GS>
static decltype(&k_decode<MT, TB, NORM, SUM, PS, PF, MINB, XP, CL, GS, 0>) dc_kernel(int *zm) {
    constexpr bool Z1 = MT == 1 && (TB >= 4 || !XP), Z2 = MT == 1 && !XP;
    if constexpr (Z2) {
        if (*zm == 2) return k_decode<MT, TB, NORM, SUM, PS, PF, MINB, XP, CL, GS, 2>;
    }
    if (*zm == 2) *zm = 1;
    if constexpr (Z1) {
        if (*zm == 1) return k_decode<MT, TB, NORM, SUM, PS, PF, MINB, XP, CL, GS, 1>;
    }
    *zm = 0;
    return k_decode<MT, TB, NORM, SUM, PS, PF, MINB, XP, CL, GS, 0>;
}

/* Before a decode launch: kern's shared-memory limit, once per device (set:
 * the launch site's flags, one per ZM form), and the ZM launch counters */
static int dc_kernel_ready(std::atomic<unsigned long long> set[3], const void *kern, int zm, int mt, char *err,
                           size_t errlen) {
    const int rc = cuda_smem_limit_once(&set[zm], kern, dc_smem_max(mt), err, errlen);
    if (rc == 0 && zm) g_zm_launches.fetch_add(1, std::memory_order_relaxed);
    if (rc == 0 && zm == 2) g_zm1_launches.fetch_add(1, std::memory_order_relaxed);
    return rc;
}

/* PS: the persistent grid (dc_ps_plan), each block streaming ncols / grid
 * columns back to back through one register ring (plain and NORM only).
 * The NORM, K-split, tensor-parallel-sum and plain launches each take the ZM
 * form dc_zm_form gives (the sum by the same rule as w4a16_linear, so that
 * it stays bitwise w4a16_linear + the push all-reduce). */
template <int MT, int TB, bool PS, bool PF, int MINB = 2, bool XP = false, int CL = 1, bool GS = false>
static int launch_decode_t(const struct w4a16_weight *w, const uint16_t *x, epi_args ep,
                           const norm_args *na, const w4a16_sum *xs, const struct dc_plan *pl, int grid,
                           float *part, cudaStream_t s, char *err, size_t errlen) {
    const norm_args none = {NULL, NULL, NULL, NULL, 0.0f};
    w4a16_sum nosum;
    memset(&nosum, 0, sizeof nosum);
    const int flags = dc_flags() | (pl->pf << DC_F_PF_SHIFT);
    int zm = dc_zm_form_of(ep.m, TB, pl->k, GS ? DC_GRID_GS : PS ? DC_GRID_PS : DC_GRID_PLAIN), rc;
    if (na) {
        /* the NORM variant is compiled for MT = 1 only (launch_decode gives
         * it no other: the prologue's row sums hold 8 rows) */
        if constexpr (MT == 1) {
            static std::atomic<unsigned long long> set[3];
            auto *kern = dc_kernel<MT, TB, true, false, PS, PF, 2, false, 1, false>(&zm);
            if ((rc = dc_kernel_ready(set, (const void *)kern, zm, MT, err, errlen))) return rc;
            CUDA_CHECK(launch_pdl(w, kern, dim3(grid), dim3(DC_WARPS * 32), dc_norm_smem<dc_norm_pre<TB>::n>(pl, w->k), s,
                                  w->qw, w->sc, w->zr, x, w->k, w->n16a, w->kc, flags, ep, *na, nosum, pl->blocks,
                                  nullptr, nullptr),
                       err, errlen);
            return 0;
        } else {
            return util_err(err, errlen, -EINVAL, "w4a16_linear_norm: m=%d > 8", ep.m);
        }
    }
    if (xs && (MT != 1 || PS || PF)) /* launch_decode gives SUM only the plain grid without prefetch */
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: m=%d > 8 or not the plain grid", ep.m);
    if constexpr (GS) { /* the K split through global memory: CL blocks a column, plain grid; with xs
                         * the last block of a column makes the sum */
        const char *fn = xs ? "w4a16_linear_sum" : "w4a16_linear";
        if (pl->cl != CL || !pl->gs || !part)
            return util_err(err, errlen, -EINVAL, "%s: decode plan cl=%d gs=%d", fn, pl->cl, pl->gs);
        static std::atomic<unsigned long long> set[3], set_s[3];
        auto *kern = xs ? dc_kernel<1, TB, false, true, false, false, 2, false, CL, true>(&zm)
                        : dc_kernel<MT, TB, false, false, false, false, MINB, XP, CL, true>(&zm);
        g_gs_launches.fetch_add(1, std::memory_order_relaxed);
        if ((rc = dc_kernel_ready(xs ? set_s : set, (const void *)kern, zm, MT, err, errlen))) return rc;
        /* (smem << 8) | blocks a SM, of kern (plain), one per ZM form */
        static std::atomic<long long> resident[3] = {{-1}, {-1}, {-1}};
        const int poll = !xs && gs_poll_on(w, pl, CL, TB, MT, (const void *)kern, &resident[zm]);
        if (poll) g_gs_polls.fetch_add(1, std::memory_order_relaxed);
        CUDA_CHECK(launch_pdl(w, kern, dim3(pl->blocks * CL), dim3(DC_WARPS * 32), pl->smem, s, w->qw, w->sc, w->zr,
                              x, w->k, w->n16a, w->kc, poll ? flags | DC_F_GSPOLL : flags, ep, none,
                              xs ? *xs : nosum, pl->blocks, poll ? (float *)w->gsp : part, w->cnt),
                   err, errlen);
        return 0;
    }
    if (xs) {
        static std::atomic<unsigned long long> set[3];
        auto *kern = dc_kernel<1, TB, false, true, false, false, 2, false, 1, false>(&zm);
        if ((rc = dc_kernel_ready(set, (const void *)kern, zm, MT, err, errlen))) return rc;
        CUDA_CHECK(launch_pdl(w, kern, dim3(pl->blocks),
                              dim3(DC_WARPS * 32), pl->smem, s, w->qw, w->sc, w->zr, x, w->k,
                              w->n16a, w->kc, flags, ep, none, *xs, pl->blocks, nullptr, nullptr),
                   err, errlen);
        return 0;
    }
    static std::atomic<unsigned long long> set[3];
    if constexpr (CL > 1 && !GS) { /* the cluster K split (MT >= 2: no ZM): grid in clusters of CL blocks */
        if (pl->cl != CL) return util_err(err, errlen, -EINVAL, "w4a16_linear: decode plan cl=%d", pl->cl);
        auto *kern = dc_kernel<MT, TB, false, false, PS, PF, MINB, XP, CL, false>(&zm);
        if ((rc = dc_kernel_ready(set, (const void *)kern, zm, MT, err, errlen))) return rc;
        CUDA_CHECK(launch_pdl_cl(w, kern, dim3(grid * CL), dim3(DC_WARPS * 32), pl->smem, s, dim3(CL, 1, 1), w->qw,
                                 w->sc, w->zr, x, w->k, w->n16a, w->kc, flags, ep, none, nosum, pl->blocks, nullptr,
                                 nullptr),
                   err, errlen);
        return 0;
    }
    auto *kern = dc_kernel<MT, TB, false, false, PS, PF, MINB, XP, 1, false>(&zm);
    if ((rc = dc_kernel_ready(set, (const void *)kern, zm, MT, err, errlen))) return rc;
    CUDA_CHECK(launch_pdl(w, kern, dim3(grid), dim3(DC_WARPS * 32), pl->smem, s, w->qw, w->sc, w->zr, x, w->k,
                          w->n16a, w->kc, flags, ep, none, nosum, pl->blocks, nullptr, nullptr),
               err, errlen);
    return 0;
}

/* The cluster K split (dc_plan_cluster), process-wide: 0 by its rule
 * (dc_cl_takes, the default), 1 never, 2 wherever it applies
 * (AWQD_W4A16_DC_CL, w4a16_decode_cluster) */
static env_knob g_dc_cl = ENV_KNOB_INIT("AWQD_W4A16_DC_CL", 0, 0, 2);
static int dc_cl_mode(void) { return knob_get(&g_dc_cl); }
extern "C" int w4a16_decode_cluster(int mode) { return knob_set(&g_dc_cl, mode); }

/* Clusters of 2 blocks of one block per SM that the GPU holds at once
 * (cudaOccupancyMaxActiveClusters on the MT = 3 kernel at its shared
 * memory limit; not all GPCs need pair up their SMs), once per process;
 * 0 where that cannot be asked (no clusters) */
static int dc_cl_sms(const struct w4a16_weight *w) {
    static std::atomic<int> n{-1};
    int v = n.load(std::memory_order_relaxed);
    if (v >= 0) return v;
    v = 0;
    if (w->cc_major >= 9) {
        auto kern = k_decode<3, 2, false, false, true, false, 1, true, 2>;
        static std::atomic<unsigned long long> smem_set{0};
        char e[128];
        if (cuda_smem_limit_once(&smem_set, (const void *)kern, dc_smem_max(3), e, sizeof e) == 0) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(2 * w->sms);
            cfg.blockDim = dim3(DC_WARPS * 32);
            cfg.dynamicSmemBytes = dc_smem_max(3);
            cudaLaunchAttribute at[1] = {};
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = 2;
            at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            int c = 0;
            if (cudaOccupancyMaxActiveClusters(&c, kern, &cfg) == cudaSuccess && c > 0) v = c;
            else cudaGetLastError();
        }
    }
    n.store(v, std::memory_order_relaxed);
    return v;
}

/* The decode kernel stages x group by group (XP) at MT = 1 from this many
 * rows (MT >= 2 always). H200, session 42, back to back, 28 shapes, the
 * two stagings of one binary alternated twice: geometric mean 0.965x at M
 * = 8 (none slower), 0.972x at M = 6 (3 of 28 2-3% slower), 0.985-0.991x
 * at M = 2-5 but 2-4 points 2-6% slower each, 1.0025x at M = 1 (8 slower);
 * so from 6. Default DC_XP_MIN_M, AWQD_W4A16_DC_XP_MIN_M=1..99 or
 * w4a16_decode_x_groups() set it. */
#define DC_XP_MIN_M 6
static env_knob g_dc_xp = ENV_KNOB_INIT("AWQD_W4A16_DC_XP_MIN_M", DC_XP_MIN_M, 1, 99);
static int dc_xp_min_m(void) { return knob_get(&g_dc_xp); }
extern "C" int w4a16_decode_x_groups(int min_m) { return knob_set(&g_dc_xp, min_m); }

/* The decode kernel's persistent grid (dc_ps_plan, kernels/cuda/dc_plan.h):
 * process-wide switch, default ON (AWQD_W4A16_DC_PS=0 turns it off,
 * w4a16_decode_persistent() overrides both). */
static env_switch g_dc_ps = {{-1}, "AWQD_W4A16_DC_PS"};

extern "C" int w4a16_decode_persistent(int mode) { return switch_set(&g_dc_ps, mode); }

/* Whether the persistent grid can run at all (not with the late trigger) */
static int dc_ps_usable(void) { return switch_get(&g_dc_ps) && !(dc_flags() & DC_F_LATE); }

/* The persistent grid for the plan (0: the plain grid of pl->blocks): not
 * for the SUM epilogue nor with the late trigger; the rule is dc_ps_plan,
 * which may choose other tiles per block (rewriting pl) unless
 * AWQD_W4A16_DC_TB forces them. */
static int decode_ps_grid(const struct w4a16_weight *w, struct dc_plan *pl, int sum) {
    if (!dc_ps_usable() || sum) return 0;
    const struct dc_gpu g = dc_gpu_for(w, pl);
    const int grid = dc_ps_plan(pl, &g, dc_tb_env() != 0);
    if (grid) dc_pf_env(pl);
    return grid;
}

extern "C" int w4a16_decode_blocks_per_column(const struct w4a16_weight *w, int m) {
    struct dc_plan pl;
    return w && decode_plan(w, m, &pl) ? pl.cl : 0;
}

extern "C" int w4a16_decode_describe(const struct w4a16_weight *w, int m, int *tb, int *cols, int *grid) {
    struct dc_plan pl;
    if (!w || !decode_plan_any(w, m, &pl)) return 0;
    const int gs = pl.gs, ps = gs ? 0 : decode_ps_grid(w, &pl, 0);
    *tb = pl.tb;
    *cols = pl.blocks;
    *grid = ps ? ps : gs ? pl.blocks * pl.cl : pl.blocks;
    return 1;
}

/* na: the NORM prologue (x unused), or NULL; xs: the SUM epilogue, or NULL */
static int launch_decode(const struct w4a16_weight *w, const uint16_t *x, epi_args ep,
                         const norm_args *na, const w4a16_sum *xs, float *part, size_t ws_bytes,
                         cudaStream_t s, char *err, size_t errlen) {
    struct dc_plan pl = {};
    const int has1 = decode_plan(w, ep.m, &pl);
    {   /* the K split through global memory (decode_plan_any), where the workspace holds its sums;
         * with the SUM epilogue only as one wave (its last blocks wait for the other ranks' sums:
         * every block must be resident, as w4a16_linear_sum_ok asks of the one-block plan; the
         * rule splits past one wave only where there is no one-block plan, but the forced knob
         * can) */
        struct dc_plan q = pl;
        q.gs = 0;
        const struct dc_gpu g1 = dc_gpu_of(w);
        if (!na && decode_plan_any_of(w, ep.m, has1, &q) && q.gs && part && dc_gs_ws_bytes(&q) <= ws_bytes &&
            (!xs || dc_gs_one_wave(&q, &g1)))
            pl = q;
        else if (!has1)
            return util_err(err, errlen, -EINVAL, "w4a16_linear: decode kernel does not fit m=%d K=%d G=%d%s",
                            ep.m, w->k, w->group, !na && q.gs ? " (no workspace for its K split)" : "");
    }
    if (na && pl.mt != 1) /* the prologue's row sums hold 8 rows */
        return util_err(err, errlen, -ENOTSUP, "w4a16_linear_norm: m=%d > 8", ep.m);
    const int ps = pl.gs ? 0 : decode_ps_grid(w, &pl, xs != NULL);
    /* The prefetch compiled in (PF) on the plain grid only where the plan
     * prefetches (MT = 1, not SUM). The persistent grid at MT = 1 keeps it
     * compiled in whatever its distance: that is the code session 26
     * measured and tuned there (docs/PERFORMANCE.md "Session 27", item 6). */
    const int pf = !ps && pl.pf > 0 && pl.mt == 1 && !xs;
    const int g = ps ? ps : pl.blocks;
    /* MT = 2 where one block fits per SM: no 128-register cap
     * (AWQD_W4A16_DC_REG_CAP=1 keeps it, for measurements); MT = 3 never;
     * one or four tiles per block at MT = 2 are planned only there (dc_ps_tb1, dc_ps_tb4) */
    static const int reg_cap = dc_env_int("AWQD_W4A16_DC_REG_CAP", 0, 0, 1);
    const struct dc_gpu gpu = dc_gpu_for(w, &pl);
    const int one = pl.mt == 3 || (pl.mt == 2 && ((!reg_cap && dc_blocks_per_sm(&gpu, pl.smem) < 2) || pl.tb != 2));
    /* x staged group by group (XP, k_decode): at MT >= 2 always but where
     * two MT = 2 blocks share an SM (cases 22, 122: it spilled at 128
     * registers), at MT = 1 from M = dc_xp_min_m() rows (not the NORM or
     * SUM variants) */
    const int xp = pl.mt == 1 && !na && !xs && ep.m >= dc_xp_min_m();
    if (pl.cl > 1 && !pl.gs && (na || xs)) return util_err(err, errlen, -EINVAL, "w4a16_linear: decode cluster split at m=%d", ep.m);
    switch (pl.mt * 10 + pl.tb + (ps ? 100 : 0) + (pf ? 1000 : 0) + (one ? 10000 : 0) + (xp ? 100000 : 0) +
            (pl.gs ? 10000000 * pl.cl : pl.cl > 1 ? 1000000 : 0)) {
    /* the K split through global memory (dc_plan_gs), MT = 1 */
    case 20000012: return launch_decode_t<1, 2, false, false, 2, false, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 20000014: return launch_decode_t<1, 4, false, false, 2, false, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 30000012: return launch_decode_t<1, 2, false, false, 2, false, 3, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 30000014: return launch_decode_t<1, 4, false, false, 2, false, 3, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 20100012: return launch_decode_t<1, 2, false, false, 2, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 20100014: return launch_decode_t<1, 4, false, false, 2, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 30100012: return launch_decode_t<1, 2, false, false, 2, true, 3, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 30100014: return launch_decode_t<1, 4, false, false, 2, true, 3, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 40000012: return launch_decode_t<1, 2, false, false, 2, false, 4, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 40000014: return launch_decode_t<1, 4, false, false, 2, false, 4, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 40100012: return launch_decode_t<1, 2, false, false, 2, true, 4, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 40100014: return launch_decode_t<1, 4, false, false, 2, true, 4, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 60000014: return launch_decode_t<1, 4, false, false, 2, false, 6, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 60100014: return launch_decode_t<1, 4, false, false, 2, true, 6, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 80000014: return launch_decode_t<1, 4, false, false, 2, false, 8, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 80100014: return launch_decode_t<1, 4, false, false, 2, true, 8, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 11: return launch_decode_t<1, 1, false, false>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 12: return launch_decode_t<1, 2, false, false>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 14: return launch_decode_t<1, 4, false, false>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1011: return launch_decode_t<1, 1, false, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1012: return launch_decode_t<1, 2, false, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1014: return launch_decode_t<1, 4, false, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 111: return launch_decode_t<1, 1, true, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 112: return launch_decode_t<1, 2, true, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 114: return launch_decode_t<1, 4, true, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100011: return launch_decode_t<1, 1, false, false, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100012: return launch_decode_t<1, 2, false, false, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100014: return launch_decode_t<1, 4, false, false, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 101011: return launch_decode_t<1, 1, false, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 101012: return launch_decode_t<1, 2, false, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 101014: return launch_decode_t<1, 4, false, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100111: return launch_decode_t<1, 1, true, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100112: return launch_decode_t<1, 2, true, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 100114: return launch_decode_t<1, 4, true, true, 2, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 22: return launch_decode_t<2, 2, false, false>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 122: return launch_decode_t<2, 2, true, false>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 10022: return launch_decode_t<2, 2, false, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 10122: return launch_decode_t<2, 2, true, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 10032: return launch_decode_t<3, 2, false, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 10132: return launch_decode_t<3, 2, true, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    /* MT = 2 on the persistent grid, one tile per block (dc_ps_tb1) */
    case 10121: return launch_decode_t<2, 1, true, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    /* MT = 2 on the persistent grid, four tiles per block (dc_ps_tb4) */
    case 10124: return launch_decode_t<2, 4, true, false, 1, true>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    /* the cluster K split (dc_plan_cluster), MT >= 2 */
    case 1000022: return launch_decode_t<2, 2, false, false, 2, false, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1000122: return launch_decode_t<2, 2, true, false, 2, false, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010022: return launch_decode_t<2, 2, false, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010122: return launch_decode_t<2, 2, true, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010121: return launch_decode_t<2, 1, true, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010124: return launch_decode_t<2, 4, true, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010032: return launch_decode_t<3, 2, false, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    case 1010132: return launch_decode_t<3, 2, true, false, 1, true, 2>(w, x, ep, na, xs, &pl, g, part, s, err, errlen);
    }
    return util_err(err, errlen, -EINVAL, "w4a16_linear: decode plan mt=%d tb=%d", pl.mt, pl.tb);
}

template <int MT>
static int launch_skinny(const struct w4a16_weight *w, const uint16_t *x, epi_args ep, int ksplit,
                         float *part, cudaStream_t s, char *err, size_t errlen) {
    return launch_skinny_st<MT, SK_STAGES>(w, x, ep, ksplit, part, s, err, errlen);
}

/* The epilogue of a call writing y [m, out_cols] */
static epi_args epi_of(const struct w4a16_weight *w, uint16_t *y, int m, int bias, int silu) {
    epi_args ep;
    ep.y = y;
    ep.bias = bias ? w->bias : NULL;
    ep.m = m;
    ep.n = w->n;
    ep.ldy = w->out_cols;
    ep.gate_up = silu;
    return ep;
}

extern "C" int w4a16_linear_ex(const struct w4a16_weight *w, const uint16_t *x, int m,
                               uint16_t *y, int epilogue_flags, enum w4a16_kernel kernel,
                               int ksplit, void *workspace, size_t ws_bytes, cudaStream_t s,
                               char *err, size_t errlen) {
    if (!w || !x || !y || m < 0)
        return util_err(err, errlen, -EINVAL, "w4a16_linear: bad arguments");
    if (m == 0) return 0;
    int silu = (epilogue_flags & W4A16_EPI_SILU_MUL) != 0;
    int bias = (epilogue_flags & W4A16_EPI_BIAS) != 0;
    if (epilogue_flags & ~(W4A16_EPI_SILU_MUL | W4A16_EPI_BIAS))
        return util_err(err, errlen, -EINVAL, "w4a16_linear: unknown epilogue flags 0x%x", epilogue_flags);
    if (silu != (w->layout == W4A16_LAYOUT_GATE_UP))
        return util_err(err, errlen, -EINVAL,
                        "w4a16_linear: the silu_mul epilogue needs (and the gate|up layout "
                        "requires) W4A16_LAYOUT_GATE_UP (K=%d N=%d)", w->k, w->n);
    if (bias && !w->bias)
        return util_err(err, errlen, -EINVAL, "w4a16_linear: bias epilogue on a weight without bias");
    if (((uintptr_t)x | (uintptr_t)y) & 15)
        return util_err(err, errlen, -EINVAL, "w4a16_linear: x and y must be 16-byte aligned");
    switch (kernel) {
    case W4A16_KERNEL_AUTO: case W4A16_KERNEL_SKINNY: case W4A16_KERNEL_TC64:
    case W4A16_KERNEL_TC128: case W4A16_KERNEL_CUBLAS: case W4A16_KERNEL_DECODE:
    case W4A16_KERNEL_WGMMA:
        break;
    default:
        return util_err(err, errlen, -EINVAL, "w4a16_linear: unknown kernel %d", (int)kernel);
    }

    epi_args ep = epi_of(w, y, m, bias, silu);

    enum w4a16_kernel k = kernel;
    int ks = ksplit;
    choose(w, m, &k, &ks);
    if (k == W4A16_KERNEL_WGMMA) { /* gemm helper: sizes its split to the workspace itself */
        struct w4a16_gemm_args ga;
        gemm_args_of(w, x, m, y, ep.bias, silu, ksplit, &ga);
        return w4a16_gemm_run(&ga, workspace, ws_bytes, pdl_mode() && w->cc_major >= 9, s, err, errlen);
    }
    if (ks > 1 && (ws_call(w, m, k, ks) > ws_bytes || (!workspace && ws_call(w, m, k, ks) > 0))) {
        /* fall back to the largest split that fits */
        while (ks > 1 && ws_call(w, m, k, ks) > ws_bytes) ks--;
        if (!workspace && ws_call(w, m, k, ks) > 0) ks = 1;
    }
    if (k == W4A16_KERNEL_CUBLAS && (!workspace || ws_need(w, m, k, 1) > ws_bytes) &&
        !(workspace && slabs_mode() && slab_bytes(w, m, 128) <= ws_bytes)) {
        if (gemm_fallback_ok(w, m)) { /* gemm helper: INT4 wgmma GEMM, needs no workspace */
            struct w4a16_gemm_args ga;
            gemm_args_of(w, x, m, y, ep.bias, silu, 0, &ga);
            return w4a16_gemm_run(&ga, workspace, ws_bytes, pdl_mode() && w->cc_major >= 9, s, err, errlen);
        }
        k = W4A16_KERNEL_TC64; /* no room for the transient fp16 copy */
        ks = 0;
        choose(w, m, &k, &ks);
        while (ks > 1 && ws_call(w, m, k, ks) > ws_bytes) ks--;
        if (!workspace && ws_call(w, m, k, ks) > 0) ks = 1;
    }
    if (k == W4A16_KERNEL_SKINNY && ks < sk_min_split(w, m)) {
        k = W4A16_KERNEL_TC64; /* no room for the split the skinny kernel needs */
        ks = 1;
    }
    float *part = (float *)workspace;
    int rc;
    if (k == W4A16_KERNEL_DECODE) {
        rc = launch_decode(w, x, ep, NULL, NULL, part, workspace ? ws_bytes : 0, s, err, errlen);
    } else if (k == W4A16_KERNEL_SKINNY) {
        int mt = ceil_div(m, 8);
        switch (mt) {
        case 1: rc = launch_skinny<1>(w, x, ep, ks, part, s, err, errlen); break;
        case 2: rc = launch_skinny<2>(w, x, ep, ks, part, s, err, errlen); break;
        case 3:
        case 4: rc = launch_skinny<4>(w, x, ep, ks, part, s, err, errlen); break;
        case 5:
        case 6:
        case 7:
        case 8: rc = launch_skinny<8>(w, x, ep, ks, part, s, err, errlen); break;
        default: return util_err(err, errlen, -EINVAL, "w4a16_linear: skinny kernel with m=%d > 64", m);
        }
    } else if (k == W4A16_KERNEL_CUBLAS) {
        rc = launch_cublas(w, x, m, ep, workspace, ws_bytes, s, err, errlen);
    } else if (k == W4A16_KERNEL_TC64) {
        rc = launch_tc<TC64_ARGS>(w, x, m, ep, ks, part, s, err, errlen);
        if (rc == -ERANGE) rc = launch_tc<TC64_ARGS>(w, x, m, ep, 1, part, s, err, errlen);
    } else {
        rc = launch_tc<TC128_ARGS>(w, x, m, ep, ks, part, s, err, errlen);
        if (rc == -ERANGE) rc = launch_tc<TC128_ARGS>(w, x, m, ep, 1, part, s, err, errlen);
    }
    return rc;
}

extern "C" int w4a16_linear(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                            int epilogue_flags, void *workspace, size_t ws_bytes, cudaStream_t s,
                            char *err, size_t errlen) {
    return w4a16_linear_ex(w, x, m, y, epilogue_flags, W4A16_KERNEL_AUTO, 0, workspace, ws_bytes,
                           s, err, errlen);
}

/* The largest M the fused prologue takes (AWQD_W4A16_NORM_MAX_M, 1-8; for measurements) */
static env_knob g_norm_max_m = ENV_KNOB_INIT("AWQD_W4A16_NORM_MAX_M", 2, 1, 8);
static int norm_max_m(void) { return knob_get(&g_norm_max_m); }

extern "C" int w4a16_linear_norm_ok(const struct w4a16_weight *w, int m) {
    /* m <= 2: at m = 4 the prologue (rows one after another) cost more than
     * the add_rmsnorm kernel it saves (H100, Qwen3-8B batch 4: 1163 -> 1131
     * tok/s; batch 1: 346 -> 361). Again on the H200 with session 68's ZS
     * (the prologue's sums of x, since replaced by ZM; AWQD_W4A16_NORM_MAX_M=4
     * / 8 against 2): Qwen3-8B batch 3 / 4 / 6 / 8
     * 1.08-1.10 / 1.09 / 1.17 / 1.25x a step, qwen3-32b batch 3 / 4 / 8
     * 1.05-1.07 / 1.05-1.07 / 1.17-1.19x */
    if (!w || m < 1 || m > norm_max_m()) return 0;
    enum w4a16_kernel k = W4A16_KERNEL_AUTO;
    int ks = 0;
    choose(w, m, &k, &ks);
    return k == W4A16_KERNEL_DECODE && w4a16_decode_applies(w, m); /* the one-block plan: the prologue has no K split */
}

extern "C" int w4a16_linear_norm(const struct w4a16_weight *w, const uint16_t *rin,
                                 const uint16_t *delta, uint16_t *rout, const uint16_t *norm_w,
                                 float eps, int m, uint16_t *y, int epilogue_flags, cudaStream_t s,
                                 char *err, size_t errlen) {
    if (!w || !rin || !rout || !norm_w || !y || m < 1 || rin == rout || (delta && delta == rout))
        return util_err(err, errlen, -EINVAL, "w4a16_linear_norm: bad arguments");
    const int silu = (epilogue_flags & W4A16_EPI_SILU_MUL) != 0;
    const int bias = (epilogue_flags & W4A16_EPI_BIAS) != 0;
    if ((epilogue_flags & ~(W4A16_EPI_SILU_MUL | W4A16_EPI_BIAS)) ||
        silu != (w->layout == W4A16_LAYOUT_GATE_UP) || (bias && !w->bias))
        return util_err(err, errlen, -EINVAL, "w4a16_linear_norm: bad epilogue flags 0x%x",
                        epilogue_flags);
    if (((uintptr_t)rin | (uintptr_t)delta | (uintptr_t)rout | (uintptr_t)norm_w | (uintptr_t)y) & 15)
        return util_err(err, errlen, -EINVAL, "w4a16_linear_norm: pointers must be 16-byte aligned");
    if (!w4a16_linear_norm_ok(w, m))
        return util_err(err, errlen, -ENOTSUP, "w4a16_linear_norm: m=%d does not take the decode kernel", m);
    const epi_args ep = epi_of(w, y, m, bias, silu);
    const norm_args na = {rin, delta, norm_w, rout, eps};
    return launch_decode(w, rin, ep, &na, NULL, NULL, 0, s, err, errlen);
}

extern "C" int w4a16_linear_sum_ok(const struct w4a16_weight *w, int m) {
    if (!w || m < 1 || m > 8 || w->layout != W4A16_LAYOUT_PLAIN || (size_t)w->n16a * 128 > W4A16_SUM_CAP)
        return 0;
    enum w4a16_kernel k = W4A16_KERNEL_AUTO;
    int ks = 0;
    choose(w, m, &k, &ks);
    struct dc_plan pl;
    if (k != W4A16_KERNEL_DECODE || !decode_plan(w, m, &pl) || pl.mt != 1) return 0;
    /* every block resident at once (2 per SM by __launch_bounds__, if the
     * shared memory allows): a block waiting for its peers never keeps a
     * block of this grid from starting, on any rank */
    const int per_sm = w->smem_sm > 0 ? (int)((size_t)w->smem_sm / (pl.smem + 1024)) : 1;
    return pl.blocks <= (per_sm < 2 ? per_sm : 2) * w->sms;
}

extern "C" int w4a16_linear_sum(const struct w4a16_weight *w, const uint16_t *x, int m, uint16_t *y,
                                int epilogue_flags, const struct w4a16_sum *xs, void *workspace,
                                size_t ws_bytes, cudaStream_t s, char *err, size_t errlen) {
    if (!w || !x || !y || !xs || xs->size < 1 || xs->size > W4A16_SUM_MAX_RANKS || xs->rank < 0 ||
        xs->rank >= xs->size || !xs->ctl)
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: bad arguments");
    for (int q = 0; q < xs->size; q++)
        if (!xs->area[q]) return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: no area for rank %d", q);
    if (xs->mine != xs->area[xs->rank])
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: mine is not area[rank]");
    if (epilogue_flags & ~W4A16_EPI_BIAS)
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: bad epilogue flags 0x%x", epilogue_flags);
    const int bias = (epilogue_flags & W4A16_EPI_BIAS) != 0;
    if (bias && !w->bias)
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: bias epilogue on a weight without bias");
    if (((uintptr_t)x | (uintptr_t)y) & 15)
        return util_err(err, errlen, -EINVAL, "w4a16_linear_sum: x and y must be 16-byte aligned");
    if (!w4a16_linear_sum_ok(w, m))
        return util_err(err, errlen, -ENOTSUP, "w4a16_linear_sum: m=%d does not take the decode kernel", m);
    return launch_decode(w, x, epi_of(w, y, m, bias, 0), NULL, xs, (float *)workspace, workspace ? ws_bytes : 0, s,
                         err, errlen);
}
