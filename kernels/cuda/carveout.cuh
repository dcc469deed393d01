/* carveout.cuh — the shared-memory carveout of every kernel launch of the
 * CUDA backend (C++ / nvcc sources only): the launch helpers of w4a16.cu,
 * w4a16_gemm.cu and ops_cuda_internal.h add cuda_carveout_attr's
 * cudaLaunchAttributePreferredSharedMemoryCarveout (cuda_carveout_pct's
 * value) to each launch, so that a CUDA graph keeps each node's. The rule
 * and why: kernels/cuda/carveout_rule.h. AWQD_CUDA_CARVEOUT_PCT: the
 * floor, 1..100 (default 72), or 0: the driver's choice, as before session
 * 60 (an env_knob: a value out of range reads as the default). */
#ifndef AWQD_CARVEOUT_CUH
#define AWQD_CARVEOUT_CUH

#include <cuda_runtime.h>

#include "kernels/cuda/carveout_rule.h"
#include "kernels/cuda/env_knob.h"

static inline int cuda_carveout_floor(void) {
    static env_knob k = ENV_KNOB_INIT("AWQD_CUDA_CARVEOUT_PCT", CARVEOUT_DEFAULT_PCT, 0, 100);
    return knob_get(&k);
}

struct carveout_ent {
    const void *fn;
    int dev, regs, stat; /* the kernel's registers per thread and static shared memory */
    int sm, sms;         /* the device's shared memory per SM and SMs */
};

/* The carveout for a launch of fn, or -1 (off, or the kernel's attributes
 * unknown). A table per thread (a worker thread drives one device) keeps
 * each (device, function)'s attributes, so a launch costs a lookup. */
static inline int cuda_carveout_pct(const void *fn, dim3 grid, dim3 block, size_t dyn) {
    const int floor_pct = cuda_carveout_floor();
    int dev = 0;
    if (!floor_pct || !fn || cudaGetDevice(&dev) != cudaSuccess) return -1;
    thread_local carveout_ent tab[128];
    const unsigned h0 = (unsigned)(((unsigned long long)(size_t)fn >> 4) * 2654435761u + (unsigned)dev * 40503u);
    carveout_ent *e = nullptr;
    for (int i = 0; i < 128 && !e; i++) {
        carveout_ent *t = &tab[(h0 + i) & 127];
        if (t->fn == fn && t->dev == dev) {
            e = t;
        } else if (!t->fn) {
            cudaFuncAttributes a;
            int sm = 0, sms = 0;
            if (cudaFuncGetAttributes(&a, fn) != cudaSuccess ||
                cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) != cudaSuccess ||
                cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
                cudaGetLastError();
                return -1;
            }
            *t = carveout_ent{fn, dev, a.numRegs, (int)a.sharedSizeBytes, sm, sms};
            e = t;
        }
    }
    if (!e) return -1; /* table full: the driver's choice */
    const struct carveout_launch l = {e->regs, e->stat, (long long)dyn, (int)(block.x * block.y * block.z),
                                      (long long)grid.x * grid.y * grid.z, e->sm, e->sms};
    return carveout_pct(&l, floor_pct);
}

/* Fills *a with the launch's carveout attribute and returns 1, or returns
 * 0 (none: off, unknown, or a CUDA runtime older than 12.6, whose headers
 * may lack the per-launch attribute). */
static inline int cuda_carveout_attr(cudaLaunchAttribute *a, const void *fn, dim3 grid, dim3 block, size_t dyn) {
#if CUDART_VERSION >= 12060
    const int cv = cuda_carveout_pct(fn, grid, block, dyn);
    if (cv < 0) return 0;
    a->id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    a->val.sharedMemCarveout = (unsigned)cv;
    return 1;
#else
    (void)a, (void)fn, (void)grid, (void)block, (void)dyn;
    return 0;
#endif
}

#endif
