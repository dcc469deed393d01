/* l2_hot_bench.cu — session 52's microbenchmark of "many blocks reading the same lines" after a
 * PDL wait, the step every decode linear takes at batch 1 (x, or the residual and delta rows of
 * the fused norm, staged by every block of a 132-264 block grid right after griddepcontrol.wait;
 * docs/PERFORMANCE.md "Session 31" items 4-5 measured such a trip at 0.4-0.6 us).
 *
 * A CUDA graph of N launches of one kernel, each launched with programmatic dependent launch and
 * triggering its dependents at entry (as the decode kernels do). Launch i waits, stages X bytes
 * into shared memory with 16-byte cp.async from replica (block % R) of buffer i % 2, and writes
 * the next launch's X bytes, R times over, into buffer (i + 1) % 2 (the producer's side of a
 * replicated x). Reported: µs per launch over the graph, and the median / 90th percentile / max
 * over blocks of the staging time (globaltimer, wait released -> staged) in the last launches.
 * R = 1 is what the kernels do today; R > 1 asks whether fewer blocks per line shorten the trip.
 * Not part of the build or the tests:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a scripts/l2_hot_bench.cu -o l2_hot_bench
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "microbench.cuh"


struct args {
    const unsigned char *src; /* this launch's buffer: R replicas of X bytes, stride XS */
    unsigned char *dst;       /* the next launch's */
    int x, xs, r;
    uint32_t *sink;
    unsigned long long *stamp; /* [launch][block] staging ns, or null */
    int launch;
};

/* 256 threads; dynamic shared memory X bytes */
static __global__ void __launch_bounds__(256) k_stage(args a) {
    extern __shared__ __align__(16) unsigned char sm[];
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const uint64_t t0 = gtime();
    const unsigned char *s = a.src + (size_t)(blockIdx.x % a.r) * a.xs;
    for (int o = threadIdx.x * 16; o < a.x; o += 256 * 16) {
        const uint32_t d = (uint32_t)__cvta_generic_to_shared(sm + o);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(s + o) : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
    __syncthreads();
    const uint64_t t1 = gtime();
    /* keep the data: one word summed per thread */
    uint32_t v = 0;
    for (int o = threadIdx.x * 4; o < a.x; o += 256 * 4) v += *(const uint32_t *)(sm + o);
    if (v == 0x12345678u) a.sink[blockIdx.x] = v;
    if (a.stamp && threadIdx.x == 0) a.stamp[(size_t)a.launch * gridDim.x + blockIdx.x] = t1 - t0;
    /* the producer's side: the next launch's x, r replicas, spread over every thread of the grid */
    const int units = a.x / 16, total = units * a.r;
    for (int u = blockIdx.x * 256 + threadIdx.x; u < total; u += gridDim.x * 256) {
        const int rep = u / units, off = (u % units) * 16;
        uint4 w = make_uint4(u, rep, off, a.launch);
        *(uint4 *)(a.dst + (size_t)rep * a.xs + off) = w;
    }
}

static void launch(cudaStream_t st, int grid, const args &a) { launch_pdl(k_stage, grid, 256, a.x, st, a); }

int main(int argc, char **argv) {
    const int N = 200, STAMPED = 100;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int xs = 64 * 1024; /* replica stride: each replica on its own lines */
    const int maxr = 64;
    unsigned char *buf[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&buf[i], (size_t)xs * maxr));
        CK(cudaMemset(buf[i], 1, (size_t)xs * maxr));
    }
    uint32_t *sink;
    CK(cudaMalloc(&sink, 4096 * 4));
    unsigned long long *stamp;
    CK(cudaMalloc(&stamp, (size_t)N * 1024 * 8));
    CK(cudaFuncSetAttribute(k_stage, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int xsz[] = {8192, 10240, 16384, 20480, 40960};
    const int reps[] = {1, 2, 4, 8, 16, 32};
    const int grids[] = {sms, 2 * sms};
    printf("grid  X_bytes  R   us/launch  staging_ns(median p90 max)\n");
    for (int g : grids)
        for (int x : xsz)
            for (int r : reps) {
                if (r > maxr) continue;
                cudaGraph_t graph;
                cudaGraphExec_t ge;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int i = 0; i < N; i++) {
                    args a = {buf[i & 1], buf[(i + 1) & 1], x, xs, r, sink, i >= N - STAMPED ? stamp : nullptr,
                              i - (N - STAMPED)};
                    launch(st, g, a);
                }
                CK(cudaStreamEndCapture(st, &graph));
                CK(cudaGraphInstantiate(&ge, graph, 0));
                const float best = graph_best_ms(ge, st, 5);
                std::vector<unsigned long long> h((size_t)STAMPED * g);
                CK(cudaMemcpy(h.data(), stamp, h.size() * 8, cudaMemcpyDeviceToHost));
                std::sort(h.begin(), h.end());
                printf("%4d  %7d  %2d   %8.3f   %6llu %6llu %6llu\n", g, x, r, best * 1000.f / N, h[h.size() / 2],
                       h[h.size() * 9 / 10], h.back());
                fflush(stdout);
                CK(cudaGraphExecDestroy(ge));
                CK(cudaGraphDestroy(graph));
            }
    (void)argc, (void)argv;
    return 0;
}
