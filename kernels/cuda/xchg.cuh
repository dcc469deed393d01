/* xchg.cuh — device helpers of the one-shot peer-to-peer exchanges between
 * tensor-parallel ranks (threads of one process, peer access between every
 * pair of GPUs): the "push" all-reduce kernel (comm/cuda/comm_nccl.cu) and
 * the all-reduce fused into the decode kernel's epilogue (w4a16.cu,
 * w4a16_linear_sum). docs/TENSOR_PARALLEL.md describes the protocol.
 *
 * The data is its own flag: an idle receive slot holds fp16 -0.0 (0x8000) in
 * every half; a sender never sends -0.0 (it sends +0.0, which sums the same),
 * so a receiver knows a slot has arrived when none of its halves is -0.0, and
 * makes it idle again by storing -0.0 back after reading. Stores and polls
 * are volatile (they bypass the L1 and are not merged or hoisted). */
#ifndef AWQD_XCHG_CUH
#define AWQD_XCHG_CUH

#include <stdint.h>

#define XCHG_NEG0 0x8000u       /* fp16 -0.0: "not yet written" */
#define XCHG_EMPTY2 0x80008000u /* two of them */

static __device__ __forceinline__ unsigned long long xchg_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ uint4 xchg_ld4(const void *p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

static __device__ __forceinline__ void xchg_st4(void *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

static __device__ __forceinline__ uint2 xchg_ld2(const void *p) {
    uint2 v;
    asm volatile("ld.volatile.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void xchg_st2(void *p, uint2 v) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1,%2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

static __device__ __forceinline__ unsigned short xchg_ld1(const void *p) {
    unsigned short v;
    asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
}

static __device__ __forceinline__ void xchg_st1(void *p, unsigned short v) {
    asm volatile("st.volatile.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
}

/* -0.0 -> +0.0 in both halves of a word */
static __device__ __forceinline__ unsigned xchg_fix(unsigned w) {
    if ((w & 0xffffu) == XCHG_NEG0) w &= 0xffff0000u;
    if ((w >> 16) == XCHG_NEG0) w &= 0x0000ffffu;
    return w;
}

/* 1 while either half of w is still the idle mark */
static __device__ __forceinline__ int xchg_empty(unsigned w) {
    return (w & 0xffffu) == XCHG_NEG0 || (w >> 16) == XCHG_NEG0;
}

/* Called every so many polls of a wait: 1 when it must give up — the group
 * was aborted (ctl[0]), or this wait passed timeout_ns (0: none), which
 * records rank + 1 in ctl[1] and aborts the group. ctl is the group's mapped
 * host word pair; *t0 starts at 0. */
static __device__ __noinline__ int xchg_give_up(volatile int *ctl, unsigned long long timeout_ns,
                                                 int rank, unsigned long long *t0) {
    if (ctl[0]) return 1;
    if (!timeout_ns) return 0;
    unsigned long long now = xchg_now();
    if (!*t0) {
        *t0 = now;
    } else if (now - *t0 > timeout_ns) {
        ctl[1] = rank + 1;
        __threadfence_system();
        ctl[0] = 1;
        return 1;
    }
    return 0;
}

#endif
