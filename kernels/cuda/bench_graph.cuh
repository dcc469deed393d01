/* bench_graph.cuh — the back-to-back timing of `awqd bench kernels` and
 * `awqd bench chain`: `calls` calls of fn(i) captured into one CUDA graph
 * (after one eager pass: lazy loads and allocations) and replayed `reps`
 * times on stream s; the median µs per call of the replays after the first
 * (a warm-up), timed with the events a, b. Header-only (a template). */
#pragma once

#include <algorithm>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

template <typename F>
static double bench_graph_us(cudaEvent_t a, cudaEvent_t b, cudaStream_t s, int calls, int reps, F fn) {
    for (int i = 0; i < calls; i++) fn(i); /* eager once */
    CUDA_CHECK_ABORT(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK_ABORT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++) fn(i);
    CUDA_CHECK_ABORT(cudaStreamEndCapture(s, &g));
    CUDA_CHECK_ABORT(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK_ABORT(cudaGraphDestroy(g));
    std::vector<float> v;
    for (int rep = 0; rep < reps; rep++) {
        CUDA_CHECK_ABORT(cudaEventRecord(a, s));
        CUDA_CHECK_ABORT(cudaGraphLaunch(ge, s));
        CUDA_CHECK_ABORT(cudaEventRecord(b, s));
        CUDA_CHECK_ABORT(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK_ABORT(cudaEventElapsedTime(&ms, a, b));
        if (rep) v.push_back(ms * 1000.f / calls); /* the first is warm-up */
    }
    CUDA_CHECK_ABORT(cudaGraphExecDestroy(ge));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
