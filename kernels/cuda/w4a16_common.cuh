/* w4a16_common.cuh — device helpers shared by the W4A16 kernels (w4a16.cu,
 * w4a16_gemm.cu): shared-memory addresses, cp.async groups, programmatic
 * dependent launch, packed-half arithmetic on raw 32-bit words, and the
 * m16n8k16 tensor-core MMA. All static inline: each kernel file gets its own
 * copy, as if written there. */
#ifndef AWQD_W4A16_COMMON_CUH
#define AWQD_W4A16_COMMON_CUH

#include <stdint.h>

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

#endif
