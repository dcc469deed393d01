/* handoff_bench.cu — how long a kernel boundary takes in a PDL chain, with the dependent released
 * by griddepcontrol.wait (what every decode kernel does) or by polling a counter that each block
 * of the previous launch raises after its stores (red.release.gpu; the dependent's thread 0 polls
 * with ld.acquire.gpu, then a block barrier).
 *
 * A CUDA graph: a memset of the counter, then N launches of one kernel, each launched with
 * programmatic dependent launch and triggering its dependents at entry. Launch i waits (one way or
 * the other), stages X bytes with 16-byte cp.async written by launch i - 1, spins W ns (the
 * kernel's own work), writes the next launch's X bytes spread over its grid, and (poll mode) adds 1
 * to the counter per block. Launch i's blocks go on once the counter reaches i x grid: every block
 * of launches 0 .. i - 1 has signalled (launch i + 1's blocks only signal after their own wait).
 * Reported: µs per launch over the graph (best of 5), and the median / max over blocks of
 * "released -> staged" in the last launches. Poll mode also checks the data it staged (each word
 * carries its launch), counting stale words. Not part of the build or the tests:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a scripts/handoff_bench.cu -o handoff_bench
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include "microbench.cuh"


struct args {
    const unsigned char *src;
    unsigned char *dst;
    int x, spin_ns, mode; /* mode 0: griddepcontrol.wait; 1: poll the counter; 2: both (check) */
    unsigned *count;
    unsigned *stale;
    unsigned long long *stamp;
    int launch; /* this launch's index in the graph */
    int stamped;
};

static __global__ void __launch_bounds__(256) k_step(args a) {
    extern __shared__ __align__(16) unsigned char sm[];
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (a.mode != 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (a.mode != 0) {
        if (threadIdx.x == 0) {
            const unsigned want = (unsigned)a.launch * gridDim.x;
            unsigned v;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a.count) : "memory");
            } while ((int)(v - want) < 0);
        }
        __syncthreads();
    }
    const uint64_t t0 = gtime();
    for (int o = threadIdx.x * 16; o < a.x; o += 256 * 16) {
        const uint32_t d = (uint32_t)__cvta_generic_to_shared(sm + o);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(a.src + o) : "memory");
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
    __syncthreads();
    const uint64_t t1 = gtime();
    /* the data must be launch - 1's: word 3 of every 16-byte unit is the writer's launch */
    unsigned bad = 0;
    if (a.launch > 0)
        for (int o = threadIdx.x * 16; o < a.x; o += 256 * 16)
            bad += *(const uint32_t *)(sm + o + 12) != (uint32_t)(a.launch - 1);
    if (bad) atomicAdd(a.stale, bad);
    if (a.stamp && threadIdx.x == 0) a.stamp[(size_t)a.stamped * gridDim.x + blockIdx.x] = t1 - t0;
    if (a.spin_ns > 0) {
        const uint64_t e = gtime() + a.spin_ns;
        while (gtime() < e) {
        }
    }
    const int units = a.x / 16;
    for (int u = blockIdx.x * 256 + threadIdx.x; u < units; u += gridDim.x * 256)
        *(uint4 *)(a.dst + (size_t)u * 16) = make_uint4(u, 0, 0, (unsigned)a.launch);
    if (a.mode != 0) {
        __syncthreads();
        if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.count) : "memory");
    }
}

static void launch(cudaStream_t st, int grid, const args &a) { launch_pdl(k_step, grid, 256, a.x, st, a); }

int main(void) {
    const int N = 200, STAMPED = 100;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned char *buf[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&buf[i], 64 * 1024));
        CK(cudaMemset(buf[i], 0xff, 64 * 1024));
    }
    unsigned *count, *stale;
    CK(cudaMalloc(&count, 4));
    CK(cudaMalloc(&stale, 4));
    unsigned long long *stamp;
    CK(cudaMalloc(&stamp, (size_t)STAMPED * 1024 * 8));
    CK(cudaFuncSetAttribute(k_step, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int grids[] = {sms, 2 * sms};
    const int spins[] = {0, 2000};
    const char *names[] = {"wait", "poll", "both"};
    printf("grid  X_bytes  spin_ns  mode   us/launch  released->staged_ns(median max)  stale\n");
    for (int g : grids)
        for (int sp : spins)
            for (int x : {8192, 16384})
                for (int mode = 0; mode < 3; mode++) {
                    cudaGraph_t graph;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    CK(cudaMemsetAsync(count, 0, 4, st));
                    for (int i = 0; i < N; i++) {
                        const int s = i - (N - STAMPED);
                        args a = {buf[i & 1], buf[(i + 1) & 1], x, sp, mode, count, stale,
                                  s >= 0 ? stamp : nullptr, i, s};
                        launch(st, g, a);
                    }
                    CK(cudaStreamEndCapture(st, &graph));
                    CK(cudaGraphInstantiate(&ge, graph, 0));
                    CK(cudaMemset(stale, 0, 4));
                    const float best = graph_best_ms(ge, st, 5);
                    std::vector<unsigned long long> h((size_t)STAMPED * g);
                    CK(cudaMemcpy(h.data(), stamp, h.size() * 8, cudaMemcpyDeviceToHost));
                    unsigned nstale = 0;
                    CK(cudaMemcpy(&nstale, stale, 4, cudaMemcpyDeviceToHost));
                    std::sort(h.begin(), h.end());
                    printf("%4d  %7d  %7d  %-5s  %8.3f   %6llu %6llu   %u\n", g, x, sp, names[mode],
                           best * 1000.f / N, h[h.size() / 2], h.back(), nstale);
                    fflush(stdout);
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(graph));
                }
    return 0;
}
