/* microbench.cuh — what the stand-alone CUDA microbenchmarks in scripts/ share (l2_hot_bench.cu,
 * handoff_bench.cu, ring_bench.cu): the error check, the global timer, a launch with programmatic dependent launch, and the best time of a
 * piece of stream work over a few repetitions. Header only; the scripts are built by hand with
 * nvcc (see each script's header). */
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                                            \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
            exit(1);                                                                                     \
        }                                                                                                \
    } while (0)

static __device__ __forceinline__ uint64_t gtime(void) {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* kernel<<<grid, block, smem, st>>>(a) with programmatic dependent launch allowed (the kernel
 * triggers and waits with griddepcontrol itself) */
template <class A> static void launch_pdl(void (*kernel)(A), int grid, int block, size_t smem, cudaStream_t st,
                                          const A &a) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kernel, a));
}

/* enqueue() once to warm up, then reps times between two events: the fastest, in ms */
template <class F> static float best_ms(cudaStream_t st, int reps, F &&enqueue) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    enqueue();
    CK(cudaStreamSynchronize(st));
    float best = 1e30f;
    for (int t = 0; t < reps; t++) {
        CK(cudaEventRecord(e0, st));
        enqueue();
        CK(cudaEventRecord(e1, st));
        CK(cudaStreamSynchronize(st));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = std::min(best, ms);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return best;
}

/* the same for a graph replayed whole */
static float graph_best_ms(cudaGraphExec_t ge, cudaStream_t st, int reps) {
    return best_ms(st, reps, [&] { CK(cudaGraphLaunch(ge, st)); });
}
