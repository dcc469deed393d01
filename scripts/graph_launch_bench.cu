/* graph_launch_bench.cu — how long a CUDA graph of N kernel nodes takes from its launch to its first
 * kernel, the way a decode step is issued: a small kernel on the stream (the batch upload, here one
 * that stamps its end), then cudaGraphLaunch of the step's graph (here N launches of a kernel that
 * stamps its start, one block or 132, with programmatic dependent launch between the nodes or
 * without). Reported, median and max over 30 launches: first node's start - the small kernel's end
 * (the GPU's gap), and the graph's whole span. Variants: the graph uploaded once after instantiation
 * (cudaGraphUpload) or not; the host call issued while the stream is busy or idle. Not part of the
 * build or the tests:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a scripts/graph_launch_bench.cu -o graph_launch_bench
 */
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
#include "microbench.cuh"

struct stamp_args {
    unsigned long long *t; /* [0] the small kernel's end, [1] the first node's start, [2] the last node's end */
    int first, last, pdl;
};

static __global__ void k_small(unsigned long long *t) {
    if (threadIdx.x == 0) t[0] = gtime();
}

static __global__ void k_node(stamp_args a) {
    if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (a.first && blockIdx.x == 0 && threadIdx.x == 0) a.t[1] = gtime();
    if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    __syncthreads();
    if (a.last && blockIdx.x == 0 && threadIdx.x == 0) a.t[2] = gtime();
}

int main(void) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    unsigned long long *t;
    CK(cudaMalloc(&t, 64));
    printf("nodes  blocks  pdl  upload  gap_us(median max)  span_us(median)\n");
    for (int nodes : {8, 64, 512})
        for (int blocks : {1, 132})
            for (int pdl : {0, 1})
                for (int up : {0, 1}) {
                    cudaGraph_t g;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                    for (int i = 0; i < nodes; i++) {
                        stamp_args a = {t, i == 0, i == nodes - 1, pdl};
                        if (pdl)
                            launch_pdl(k_node, blocks, 128, 0, st, a);
                        else
                            k_node<<<blocks, 128, 0, st>>>(a);
                    }
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiateWithFlags(&ge, g, 0));
                    if (up) CK(cudaGraphUpload(ge, st));
                    CK(cudaStreamSynchronize(st));
                    std::vector<double> gap, span;
                    for (int r = 0; r < 31; r++) {
                        k_small<<<1, 32, 0, st>>>(t);
                        CK(cudaGraphLaunch(ge, st));
                        CK(cudaStreamSynchronize(st));
                        unsigned long long h[3];
                        CK(cudaMemcpy(h, t, sizeof h, cudaMemcpyDeviceToHost));
                        if (r == 0) continue; /* the first launch uploads where cudaGraphUpload did not */
                        gap.push_back((double)(h[1] - h[0]) / 1e3);
                        span.push_back((double)(h[2] - h[1]) / 1e3);
                    }
                    std::sort(gap.begin(), gap.end());
                    std::sort(span.begin(), span.end());
                    printf("%5d  %6d  %3d  %6d  %8.2f %8.2f  %10.2f\n", nodes, blocks, pdl, up, gap[gap.size() / 2],
                           gap.back(), span[span.size() / 2]);
                    fflush(stdout);
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(g));
                }
    return 0;
}
