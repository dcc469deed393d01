/* w4a16_common.cuh — device helpers shared by the W4A16 kernels (w4a16.cu,
 * w4a16_gemm.cu, w4a16_chain.cu): shared-memory addresses, cp.async groups,
 * programmatic dependent launch, packed-half arithmetic on raw 32-bit words,
 * the m16n8k16 tensor-core MMA, the LOP3 dequantization, and the mbarrier /
 * bulk-copy wrappers of the sm_90 pipelines. All static inline: each kernel file gets its own
 * copy, as if written there. */
#ifndef AWQD_W4A16_COMMON_CUH
#define AWQD_W4A16_COMMON_CUH

#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

static __device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;");
}
/* wait until at most N committed groups of this thread are pending */
template <int N>
static __device__ __forceinline__ void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* Programmatic dependent launch (sm_90). A kernel launched with the
 * programmatic-stream-serialization attribute may start while the previous
 * kernel on the stream drains; it must not touch memory that kernel writes
 * before pdl_wait(). pdl_launch() lets the next PDL kernel on the stream
 * start early. No-ops before sm_90 and when the kernel was launched without
 * the attribute. */
static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_launch(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Thread-block cluster primitives (w4a16.cu: cluster_reduce, k_tc's
 * cluster split, k_decode's cluster K split; w4a16_gemm.cu: the split
 * reduced in a cluster): sm_90+ only, where the host launches clusters;
 * code built for less traps on the rank and skips the rest. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W4_CL_OK 1
#else
#define W4_CL_OK 0
#endif
static __device__ __forceinline__ int cl_rank(void) {
    uint32_t r = 0;
#if W4_CL_OK
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
    return (int)r;
}
/* barrier.cluster: arrive (relaxed / release), wait (acquire) */
static __device__ __forceinline__ void cl_arrive_relaxed(void) {
#if W4_CL_OK
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cl_arrive(void) {
#if W4_CL_OK
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void cl_wait(void) {
#if W4_CL_OK
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* half2 arithmetic on the raw bits of two fp16 values */
static __device__ __forceinline__ uint32_t hsub2u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t hadd2u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("add.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ uint32_t hfma2u(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
static __device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* d += A * B: mma.sync m16n8k16, fp16 inputs, fp32 accumulators (sm_80+) */
static __device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0,
                                                uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)d, (void)a, (void)b0, (void)b1;
#endif
}

static __device__ __forceinline__ void store_h(uint16_t *p, float v) {
    *p = __half_as_ushort(__float2half_rn(v));
}

/* silu(g) * u in fp32, the gate|up activation of every W4A16 path (one
 * expression, so that each path rounds the same value to fp16).
 * __fdividef (MUFU.RCP and a multiply) instead of the IEEE division, whose
 * subroutine and range check cost the wgmma GEMM's gate|up tile ends ~7% of
 * its cycles at M = 2048 (ncu, session 41). Its error (2 ulp) is far below
 * the fp16 rounding; where 1 + e^-g exceeds 2^126 or overflows (g < -87)
 * it gives 0, which is silu(g) in fp16 there. */
static __device__ __forceinline__ float w4_silu_mul(float g, float u) { return __fdividef(g, 1.f + __expf(-g)) * u; }

/* The output stage of every W4A16 kernel. One thread's mma D fragment of
 * n16 tile nt: d0 = (rho r, m0), d1 = (rho r, m0+1), d2 = (rho r+8, m0),
 * d3 = (rho r+8, m0+1); adds the bias, applies silu(gate) * up for the
 * interleaved gate|up layout (gate rows rho < 8, up rows rho >= 8 of a
 * tile), and stores fp16. A: any struct with y (fp16 [m][ldy]), bias (fp16
 * or NULL), m, n, ldy and gate_up. */
template <class A>
static __device__ __forceinline__ void w4_epilogue(const A &a, int nt, int r, int m0, float d0,
                                                   float d1, float d2, float d3) {
    int plo = nt * 16 + r, phi = plo + 8;
    if (a.bias) {
        float blo = __half2float(__ushort_as_half(a.bias[plo]));
        float bhi = __half2float(__ushort_as_half(a.bias[phi]));
        d0 += blo;
        d1 += blo;
        d2 += bhi;
        d3 += bhi;
    }
    if (a.gate_up) {
        int j = nt * 8 + r;
        if (j >= a.ldy) return; /* padding tiles of the last block */
        if (m0 < a.m) store_h(a.y + (size_t)m0 * a.ldy + j, w4_silu_mul(d0, d2));
        if (m0 + 1 < a.m) store_h(a.y + (size_t)(m0 + 1) * a.ldy + j, w4_silu_mul(d1, d3));
    } else {
        if (m0 < a.m) {
            uint16_t *row = a.y + (size_t)m0 * a.ldy;
            if (plo < a.n) store_h(row + plo, d0);
            if (phi < a.n) store_h(row + phi, d2);
        }
        if (m0 + 1 < a.m) {
            uint16_t *row = a.y + (size_t)(m0 + 1) * a.ldy;
            if (plo < a.n) store_h(row + plo, d1);
            if (phi < a.n) store_h(row + phi, d3);
        }
    }
}

/* The LOP3 dequantization of the repacked layout (w4a16.cu "Device weight
 * layout"): shared by the decode kernels of w4a16.cu and w4a16_chain.cu. */
static __device__ __forceinline__ uint32_t lop3_lo(uint32_t w) {
    uint32_t d; /* (w & 0x000f000f) | 0x64006400 */
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(w), "n"(0x000f000f), "n"(0x64006400));
    return d;
}
static __device__ __forceinline__ uint32_t lop3_hi(uint32_t w) {
    uint32_t d; /* (w & 0x00f000f0) | 0x64006400 */
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(w), "n"(0x00f000f0), "n"(0x64006400));
    return d;
}

/* RMSNorm's last step on one 16-byte piece of x in shared memory, in place:
 * x = fp16(w * (v * r)) (the decode kernel's NORM prologue and the MLP-block
 * chain, as add_rmsnorm in ops_cuda.cu) */
static __device__ __forceinline__ void dc_norm_scale(uint16_t *px, const uint4 &g, float r) {
    uint4 a = *(const uint4 *)px;
    __half2 *a2 = (__half2 *)&a;
    const __half2 *g2 = (const __half2 *)&g;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const float2 fa = __half22float2(a2[u]), fg = __half22float2(g2[u]);
        a2[u] = __floats2half2_rn(fg.x * (fa.x * r), fg.y * (fa.y * r));
    }
    *(uint4 *)px = a;
}

/* d = A * B (no accumulator input) */
static __device__ __forceinline__ void mma16816_z(float d[4], const uint32_t a[4], uint32_t b0,
                                                  uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

/* Zero-point subtrahends: {1024+z, 1024+z} and {1024+16z, 1024+16z} as half2 bits. */
static __device__ __forceinline__ uint32_t magic_lo(uint32_t z) {
    uint32_t h = 0x6400u | z;
    return h | (h << 16);
}
static __device__ __forceinline__ uint32_t magic_hi(uint32_t z) {
    uint32_t h = 0x6400u | (z << 4);
    return h | (h << 16);
}

/* Unscaled A fragment: rows r -> q - z, rows r+8 -> 16 (q - z); exact. */
/* The word's 8 codes as LOP3 makes them, {1024 + q} (a[0], a[2]) and {1024 +
 * 16 q} (a[1], a[3]): the mma's A fragment where the zero point leaves through
 * the sums of x (the decode kernel's ZM, the MLP-block chain) */
static __device__ __forceinline__ void deq_codes(uint32_t w, uint32_t a[4]) {
    const uint32_t w8 = w >> 8;
    a[0] = lop3_lo(w);
    a[1] = lop3_hi(w);
    a[2] = lop3_lo(w8);
    a[3] = lop3_hi(w8);
}
/* deq_codes less the zero point, each LOP3 output's subtraction beside it (that
 * order is the code sessions 4-69 measured) */
static __device__ __forceinline__ void deq_raw(uint32_t w, uint32_t mlo, uint32_t mhi,
                                               uint32_t a[4]) {
    uint32_t w8 = w >> 8;
    a[0] = hsub2u(lop3_lo(w), mlo);
    a[1] = hsub2u(lop3_hi(w), mhi);
    a[2] = hsub2u(lop3_lo(w8), mlo);
    a[3] = hsub2u(lop3_hi(w8), mhi);
}

/* mbarriers and bulk copies (sm_90: empty below, where the kernels that use
 * them never run) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W4_MBAR_ENABLED 1
#else
#define W4_MBAR_ENABLED 0
#endif
static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if W4_MBAR_ENABLED
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
/* until the phase of the given parity has completed */
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if W4_MBAR_ENABLED
    asm volatile("{\n.reg .pred p;\nMBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra MBAR_WAIT;\n}\n" ::"r"(bar), "r"(parity)
                 : "memory");
#endif
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if W4_MBAR_ENABLED
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}
/* arrive, expecting bytes more of bulk-copy completion on bar */
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if W4_MBAR_ENABLED
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/* bytes (multiple of 16) from global to shared, completion on bar */
static __device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
#if W4_MBAR_ENABLED
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

#endif
