/* bench_kernels.cu — `awqd bench kernels`: the W4A16 kernels on Qwen3-8B's
 * layer shapes for M = 1 .. 4096, against cuBLAS FP16 (cublasGemmEx on a
 * dequantized fp16 copy made only here) and the device-to-device copy rate,
 * all measured in the same run.
 *
 * Method: CUDA events around each call, L2 flushed before every timed call
 * (a kernel reads 2x L2 of other memory), warm-up first, median of --reps.
 * GB/s counts the INT4 weight traffic (qweight + scales + zeros, each read
 * once); TFLOP/s is 2 M N K / time; "copy" is cudaMemcpy D2D bytes read +
 * written per second over 1 GiB. The gate|up row runs the silu*up epilogue
 * (writes [M, N/2]) while cuBLAS writes the whole [M, N]. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/bench_graph.cuh"
#include "kernels/cuda/bench_rng.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_gemm.h"
#ifdef AWQD_STAMPS
extern "C" void w4a16_stamps_dump(void);      /* w4a16.cu */
extern "C" void w4a16_gemm_stamps_dump(void); /* w4a16_gemm.cu */
#endif

extern "C" {
#include "engine/bench.h"
#include "engine/ckpt.h"
}

static bench_rng b_rng = {0x243f6a8885a308d3ull};
static uint32_t b_rnd(void) { return b_rng.next(); }

static __global__ void k_flush(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* practically never; keeps the loads */
}

/* Streaming-read ceiling, back to back: each call reads n 16-byte words (the
 * bytes of one weight). WAIT_FIRST = 0: triggers its dependents and loads
 * everything before griddepcontrol.wait (what a kernel whose reads do not
 * depend on the previous kernel can overlap); 1: waits first (no overlap but
 * the launch). */
template <int WAIT_FIRST>
static __global__ void __launch_bounds__(512) k_stream_pdl(const uint4 *p, size_t n, unsigned *sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* PDL is sm_90+ (release builds: sm_80/89 too) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (WAIT_FIRST) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ b.z ^ b.w ^ c.x ^ c.w ^ d.y ^ d.z;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.w;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!WAIT_FIRST) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* kern<<<blocks, threads, 0, s>>>(p, n, sink) with programmatic dependent launch */
static cudaError_t launch_stream(void (*kern)(const uint4 *, size_t, unsigned *), int blocks, int threads,
                                 const uint4 *p, size_t n, unsigned *sink, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, p, n, sink);
}

template <int WAIT_FIRST>
static cudaError_t stream_pdl(const uint4 *p, size_t n, unsigned *sink, int sms, cudaStream_t s) {
    return launch_stream(k_stream_pdl<WAIT_FIRST>, sms * 4, 512, p, n, sink, s);
}

/* The read-only stream with the decode kernel's memory-level parallelism
 * (--mlp-sweep): B blocks of 256 threads, block b reading a contiguous 1/B
 * of the buffer, every thread NL 16-byte loads in flight (NL = 8: 4 KB per
 * warp, as k_decode's ring), all before the PDL wait. Its rate against B
 * says whether a grid that fills only part of the SMs' block slots streams
 * at that part of the rate (docs/PERFORMANCE.md "Session 23"). */
template <int NL>
static __global__ void __launch_bounds__(256, 2) k_stream_mlp(const uint4 *p, size_t n, unsigned *sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const size_t per = (n + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per;
    const size_t e = b0 + per < n ? b0 + per : n;
    unsigned acc = 0;
    for (size_t i = b0 + threadIdx.x; i < e; i += (size_t)NL * 256) {
        uint4 v[NL];
#pragma unroll
        for (int j = 0; j < NL; j++) v[j] = i + j * 256 < e ? __ldcs(p + i + j * 256) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < NL; j++) acc ^= v[j].x ^ v[j].w;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (acc == 0x9e3779b9u) *sink = acc;
}

template <int NL>
static cudaError_t stream_mlp(const uint4 *p, size_t n, unsigned *sink, int blocks, cudaStream_t s) {
    return launch_stream(k_stream_mlp<NL>, blocks, 256, p, n, sink, s);
}

/* The back-to-back calls are captured into one CUDA graph and replayed, as
 * the engine replays a forward pass (since session 30). Issued from the host
 * one by one (--b2b-host, as before), a call shorter than its launch
 * measures the host, not the kernel: on an H200 a 5 MB read-only stream took
 * 3.0-4.4 µs issued, 1.6 µs replayed (docs/PERFORMANCE.md "Session 30"). */
static int g_b2b_graph = 1;

/* Median µs per call of `calls` calls issued back to back on stream s (in
 * a graph unless g_b2b_graph is 0). */
template <typename F>
static double b2b_us(cudaEvent_t a, cudaEvent_t b, cudaStream_t s, int calls, F fn) {
    if (g_b2b_graph) return bench_graph_us(a, b, s, calls, 7, fn);
    std::vector<float> v;
    for (int rep = 0; rep < 7; rep++) {
        CUDA_CHECK_ABORT(cudaEventRecord(a, s));
        for (int i = 0; i < calls; i++) fn(i);
        CUDA_CHECK_ABORT(cudaEventRecord(b, s));
        CUDA_CHECK_ABORT(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK_ABORT(cudaEventElapsedTime(&ms, a, b));
        if (rep) v.push_back(ms * 1000.f / calls); /* the first is warm-up */
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct timer {
    cudaEvent_t a, b;
    uint4 *flush;
    size_t flush_n;
    unsigned *sink;
    int sms;
};

template <typename F>
static double time_median_us(timer &t, int reps, F fn) {
    std::vector<float> v;
    for (int i = 0; i < reps + 2; i++) {
        k_flush<<<t.sms * 4, 512>>>(t.flush, t.flush_n, t.sink);
        CUDA_CHECK_ABORT(cudaEventRecord(t.a));
        fn();
        CUDA_CHECK_ABORT(cudaEventRecord(t.b));
        CUDA_CHECK_ABORT(cudaEventSynchronize(t.b));
        float ms = 0;
        CUDA_CHECK_ABORT(cudaEventElapsedTime(&ms, t.a, t.b));
        if (i >= 2) v.push_back(ms); /* first two are warm-up */
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] * 1000.0;
}

struct shape {
    const char *name;
    int k, n, gate_up;
};

static const char *kname(enum w4a16_kernel k) {
    switch (k) {
    case W4A16_KERNEL_SKINNY: return "skinny";
    case W4A16_KERNEL_TC64: return "tc64";
    case W4A16_KERNEL_TC128: return "tc128";
    case W4A16_KERNEL_CUBLAS: return "deq+cublas";
    case W4A16_KERNEL_WGMMA: return "wgmma"; /* gemm helper */
    case W4A16_KERNEL_DECODE: return "decode";
    default: return "auto";
    }
}

static float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

extern "C" int bench_kernels(int argc, char **argv) {
    int reps = 30, variants = 0, sweep = 0, sweep_gemm = 0, b2b_only = 0, audit = 0, mlp_sweep = 0;
    const char *csv_path = NULL, *ms_arg = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096";
    const char *only = NULL, *set = "8b", *b2b_arg = "1,2,4,8,16";
    int b2b_kernel = W4A16_KERNEL_AUTO; /* --b2b-kernel: forces the "new" column's kernel */
    int b2b_split = 0;                  /* --b2b-split: and its split count (0: its own rule) */
    int b2b_copies = 0;                 /* --b2b-copies: weight copies back to back (0: > 2x L2) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) set = argv[++i];
        else if (!strcmp(argv[i], "--b2b-m") && i + 1 < argc) b2b_arg = argv[++i];
        else if (!strcmp(argv[i], "--b2b-only")) b2b_only = 1;
        else if (!strcmp(argv[i], "--b2b-audit")) audit = 1;
        else if (!strcmp(argv[i], "--mlp-sweep")) mlp_sweep = 1;
        else if (!strcmp(argv[i], "--b2b-kernel") && i + 1 < argc) {
            const char *kn = argv[++i];
            b2b_kernel = !strcmp(kn, "decode") ? W4A16_KERNEL_DECODE
                         : !strcmp(kn, "skinny") ? W4A16_KERNEL_SKINNY
                         : !strcmp(kn, "tc64")   ? W4A16_KERNEL_TC64
                                                 : -1;
            if (b2b_kernel < 0) {
                fprintf(stderr, "awqd bench kernels: --b2b-kernel decode|skinny|tc64\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--b2b-split") && i + 1 < argc) b2b_split = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--b2b-copies") && i + 1 < argc) b2b_copies = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--b2b-host")) g_b2b_graph = 0;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) ms_arg = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--variants")) variants = 1;
        else if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--sweep-gemm")) sweep_gemm = 1;
        else {
            fprintf(stderr,
                    "usage: awqd bench kernels [--reps N] [--m 1,2,4,...] [--shape NAME] [--set 8b|32b|70b|all]\n"
                    "                          [--b2b-m 1,2,4,8,16] [--b2b-only] [--b2b-kernel K [--b2b-split N]] [--b2b-audit] [--mlp-sweep]\n"
                    "                          [--b2b-copies N] [--b2b-host]\n"
                    "                          [--variants] [--csv FILE]\n"
                    "  --set       Qwen3-8B shapes (default), Qwen3-32B or Llama-3-70B at tp = 1, 2, 4, or all\n"
                    "  --b2b-only  only the back-to-back table (no single cold calls, no cuBLAS at all)\n"
                    "  --b2b-kernel decode|skinny|tc64  the back-to-back \"new\" column with that kernel forced\n"
                    "  --b2b-split N  and with N splits of K (skinny, tc64; 0: the dispatch's count)\n"
                    "  --b2b-copies N  back to back over N copies of the weight (default: enough for twice the L2;\n"
                    "              1: the weight stays in L2 where it fits, to tell latency from DRAM bandwidth)\n"
                    "  --b2b-host  the back-to-back calls issued from the host one by one (before session 30) instead\n"
                    "              of captured into one CUDA graph and replayed as the engine runs them; a call\n"
                    "              shorter than its launch then times the host\n"
                    "  --mlp-sweep the read-only stream with 4 / 8 KB in flight per warp on grids of 0.5-3x\n"
                    "              two blocks per SM (beside the stream-read ceiling)\n"
                    "  --b2b-audit also time the decode kernel forced (M <= 16), from M = 9 skinny (to 64), tc64,\n"
                    "              the wgmma GEMM and from M = 65 deq+cublas forced, and print, per point, the dispatch's pick against\n"
                    "              the fastest other kernel (SLOW: > 3%% slower), and a summary\n"
                    "  --variants  also time every kernel (skinny, tc64, tc128, deq+cublas, decode, wgmma) at each M\n"
                    "  --sweep     time the split counts of skinny (M = 1, 2, 4, 16), tc64 (64, 128)\n"
                    "  --sweep-gemm  time every tile and split of the wgmma GEMM (mode 4, 5 or 3) at each --m\n"
                    "                (ksplit=0: mode 4 stream-K)\n");
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    if (reps < 3) reps = 3;
    int ms[32];
    int nms = util_parse_int_list(ms_arg, ms, 32);
    if (nms <= 0) {
        fprintf(stderr, "awqd bench kernels: bad --m list \"%s\"\n", ms_arg);
        return 2;
    }
    int bms[16];
    int nbms = util_parse_int_list(b2b_arg, bms, 16);
    if (nbms <= 0) {
        fprintf(stderr, "awqd bench kernels: bad --b2b-m list \"%s\"\n", b2b_arg);
        return 2;
    }
    int maxm = 1;
    for (int i = 0; i < nbms; i++) maxm = std::max(maxm, bms[i]);
    for (int i = 0; i < nms && !b2b_only; i++) maxm = std::max(maxm, ms[i]);
    if (sweep) maxm = std::max(maxm, 128); /* the sweep runs M up to 128 */

    int dev = 0, ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "awqd bench kernels: no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK_ABORT(cudaGetDeviceProperties(&prop, dev));
    int clk_khz = 0, memclk_khz = 0;
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, dev);
    cudaDeviceGetAttribute(&memclk_khz, cudaDevAttrMemoryClockRate, dev);
    printf("device: %s, %d SMs, L2 %d MiB, sm clock %d MHz, mem clock %d MHz\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, clk_khz / 1000, memclk_khz / 1000);

    timer t;
    t.sms = prop.multiProcessorCount;
    CUDA_CHECK_ABORT(cudaEventCreate(&t.a));
    CUDA_CHECK_ABORT(cudaEventCreate(&t.b));
    t.flush_n = (size_t)std::max(prop.l2CacheSize, 32 << 20) * 4 / 16;
    CUDA_CHECK_ABORT(cudaMalloc(&t.flush, t.flush_n * 16));
    CUDA_CHECK_ABORT(cudaMemset(t.flush, 1, t.flush_n * 16));
    CUDA_CHECK_ABORT(cudaMalloc(&t.sink, 4));

    /* copy rate: 1 GiB device to device */
    double copy_gbs;
    {
        size_t nb = (size_t)1 << 30;
        void *a, *b;
        CUDA_CHECK_ABORT(cudaMalloc(&a, nb));
        CUDA_CHECK_ABORT(cudaMalloc(&b, nb));
        CUDA_CHECK_ABORT(cudaMemset(a, 3, nb));
        double us = time_median_us(t, 10, [&] { cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice); });
        copy_gbs = 2.0 * nb / (us * 1e-6) / 1e9;
        cudaFree(a);
        cudaFree(b);
    }
    printf("copy rate (cudaMemcpy D2D, read+write): %.0f GB/s\n", copy_gbs);

    cublasHandle_t cb;
    CUBLAS_CHECK_ABORT(cublasCreate(&cb));

    /* Qwen3-8B (hidden 4096, 32/8 heads x 128, inter 12288) and Qwen3-32B
     * (hidden 5120, 64/8 heads x 128, inter 25600) and its tensor-parallel
     * shards: q|k|v 5120 -> (64 + 16) 128 / tp, o (64 128 / tp) -> 5120,
     * gate|up 5120 -> 2 25600 / tp, down 25600 / tp -> 5120; Llama-3-70B
     * (hidden 8192, 64/8 heads x 128, inter 28672) and its shards. */
    static const shape shapes[] = {
        {"qkv", 4096, 6144, 0},
        {"o", 4096, 4096, 0},
        {"gate_up", 4096, 24576, 1},
        {"down", 12288, 4096, 0},
        {"32b.qkv", 5120, 10240, 0},
        {"32b.o", 8192, 5120, 0},
        {"32b.gate_up", 5120, 51200, 1},
        {"32b.down", 25600, 5120, 0},
        {"32b.qkv.tp2", 5120, 5120, 0},
        {"32b.o.tp2", 4096, 5120, 0},
        {"32b.gate_up.tp2", 5120, 25600, 1},
        {"32b.down.tp2", 12800, 5120, 0},
        {"32b.qkv.tp4", 5120, 2560, 0},
        {"32b.o.tp4", 2048, 5120, 0},
        {"32b.gate_up.tp4", 5120, 12800, 1},
        {"32b.down.tp4", 6400, 5120, 0},
        {"70b.qkv", 8192, 10240, 0},
        {"70b.o", 8192, 8192, 0},
        {"70b.gate_up", 8192, 57344, 1},
        {"70b.down", 28672, 8192, 0},
        {"70b.qkv.tp2", 8192, 5120, 0},
        {"70b.o.tp2", 4096, 8192, 0},
        {"70b.gate_up.tp2", 8192, 28672, 1},
        {"70b.down.tp2", 14336, 8192, 0},
        {"70b.qkv.tp4", 8192, 2560, 0},
        {"70b.o.tp4", 2048, 8192, 0},
        {"70b.gate_up.tp4", 8192, 14336, 1},
        {"70b.down.tp4", 7168, 8192, 0},
    };
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "shape,K,N,M,kernel,ksplit,us,weight_GBs,pct_copy,TFLOPs,cublas_us,"
                     "speedup_vs_cublas,skinny_us,tc64_us,tc128_us,deqcublas_us,decode_us,nocluster_us,old_dispatch_us,wgmma_us\n");
    printf("\n%-8s %5s %-10s %3s %9s %8s %6s %7s %10s %8s", "shape", "M", "kernel", "ks", "us",
           "GB/s", "%copy", "TFLOP/s", "cublas_us", "speedup");
    if (variants) printf(" %9s %9s %9s %9s %9s %9s %9s", "skinny", "tc64", "tc128", "deq+cubl", "decode", "nocluster", "wgmma");
    printf("\n");

    int audit_n = 0, audit_slow = 0, audit_wm = 0;
    double audit_worst = 0;
    const char *audit_ws = "";
    for (const shape &sh : shapes) {
        if (only && strcmp(only, sh.name)) continue;
        const char *sset = !strncmp(sh.name, "32b.", 4) ? "32b" : !strncmp(sh.name, "70b.", 4) ? "70b" : "8b";
        if (!only && strcmp(set, "all") && strcmp(set, sset)) continue;
        int K = sh.k, N = sh.n, G = 128;
        size_t nq = (size_t)K * N / 8, nz = (size_t)K / G * N / 8, ns = (size_t)K / G * N;
        std::vector<uint32_t> qw(nq), qz(nz);
        std::vector<uint16_t> sc(ns);
        for (auto &v : qw) v = b_rnd() ^ (b_rnd() << 16);
        for (auto &v : qz) v = b_rnd() ^ (b_rnd() << 16);
        for (auto &v : sc) v = __half_as_ushort(__float2half(0.005f + 0.01f * (b_rnd() & 0xffff) / 65536.f));
        struct awq_linear l;
        l.k = K;
        l.n = N;
        l.group = G;
        l.qweight = qw.data();
        l.qzeros = qz.data();
        l.scales = sc.data();
        l.bias = NULL;
        struct w4a16_weight *w = NULL;
        char err[256];
        if (w4a16_upload(&l, sh.gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &w, err,
                         sizeof err)) {
            fprintf(stderr, "upload %s: %s\n", sh.name, err);
            return 1;
        }
        /* dequantized fp16 copy for cuBLAS (benchmark only) */
        static const int ord[8] = {0, 4, 1, 5, 2, 6, 3, 7};
        std::vector<uint16_t> wd(b2b_only ? 0 : (size_t)K * N);
        for (int k = 0; k < (b2b_only ? 0 : K); k++)
            for (int n = 0; n < N; n++) {
                int q = (qw[(size_t)k * (N / 8) + n / 8] >> (4 * ord[n % 8])) & 15;
                int z = (qz[(size_t)(k / G) * (N / 8) + n / 8] >> (4 * ord[n % 8])) & 15;
                wd[(size_t)k * N + n] =
                    __half_as_ushort(__float2half((float)(q - z) * h2f(sc[(size_t)(k / G) * N + n])));
            }
        uint16_t *dW, *dx, *dy, *dyc;
        CUDA_CHECK_ABORT(cudaMalloc(&dW, std::max<size_t>(wd.size(), 8) * 2));
        if (!wd.empty()) CUDA_CHECK_ABORT(cudaMemcpy(dW, wd.data(), wd.size() * 2, cudaMemcpyHostToDevice));
        std::vector<uint16_t> hx((size_t)maxm * K);
        for (auto &v : hx) v = __half_as_ushort(__float2half((b_rnd() & 0xffff) / 32768.f - 1.f));
        CUDA_CHECK_ABORT(cudaMalloc(&dx, hx.size() * 2));
        CUDA_CHECK_ABORT(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK_ABORT(cudaMalloc(&dy, (size_t)maxm * N * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dyc, (size_t)maxm * N * 2));
        /* the baseline: cuBLAS FP16 on a dequantized weight W (K x N), M rows of x */
        auto cublas_ref = [&](const uint16_t *W, int M) {
            const float fone = 1.f, fzero = 0.f;
            cublasGemmEx(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &fone, W, CUDA_R_16F, N, dx, CUDA_R_16F, K, &fzero,
                         dyc, CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        };
        size_t wsb = w4a16_workspace_bytes(w, maxm);
        { /* room for the session-2 dispatch (decode kernel off) too */
            const int dc0 = w4a16_decode_kernel(-1);
            w4a16_decode_kernel(0);
            wsb = std::max(wsb, w4a16_workspace_bytes(w, maxm));
            w4a16_decode_kernel(dc0);
        }
        /* forced variants may split more than the dispatch does */
        size_t np = (N + 127) / 128 * 128;
        size_t wsb_var = std::max(wsb, (size_t)16 * np * 256 * 4 + np * K * 2 + (size_t)maxm * np * 2 + 4096);
        void *ws;
        CUDA_CHECK_ABORT(cudaMalloc(&ws, wsb_var));
        int epi = sh.gate_up ? W4A16_EPI_SILU_MUL : 0;
        double wbytes = (double)K * N / 2 + (double)K / G * N * 2.5;

        {
            /* reference: a plain streaming read of the same INT4 bytes, one cold call */
            size_t qn = (size_t)((N + 127) / 128 * 128) * K / 2 / 16;
            void *qcopy;
            CUDA_CHECK_ABORT(cudaMalloc(&qcopy, qn * 16));
            CUDA_CHECK_ABORT(cudaMemset(qcopy, 7, qn * 16));
            double rus = time_median_us(t, reps, [&] {
                k_flush<<<t.sms * 8, 512>>>((const uint4 *)qcopy, qn, t.sink);
            });
            printf("%-8s read-only stream of the %.1f MB INT4 weight: %.2f us = %.0f GB/s (%.1f%% of copy)\n",
                   sh.name, qn * 16 / 1e6, rus, qn * 16 / (rus * 1e-6) / 1e9,
                   100.0 * qn * 16 / (rus * 1e-6) / 1e9 / copy_gbs);
            cudaFree(qcopy);
        }
        {
            /* back to back, as in a forward pass: R device copies of the weight
             * (> 2x L2 together) called in turn between two events, no flush,
             * on a non-blocking stream (programmatic dependent launch does not
             * apply on the legacy default stream) */
            int R = (int)std::min<double>(64.0, std::ceil(2.0 * prop.l2CacheSize / wbytes)) + 1;
            if (b2b_copies > 0) R = b2b_copies;
            std::vector<struct w4a16_weight *> cp(R, nullptr);
            cp[0] = w;
            for (int i = 1; i < R; i++)
                if (w4a16_clone(w, &cp[i], err, sizeof err)) {
                    fprintf(stderr, "clone: %s\n", err);
                    return 1;
                }
            cudaStream_t bs;
            CUDA_CHECK_ABORT(cudaStreamCreateWithFlags(&bs, cudaStreamNonBlocking));
            const int calls = std::max(R * 4, 64);
            /* the streaming-read ceiling over R buffers of the same size */
            {
                size_t qn = (size_t)((N + 127) / 128 * 128) * K / 2 / 16;
                uint4 *big;
                CUDA_CHECK_ABORT(cudaMalloc(&big, qn * 16 * R));
                CUDA_CHECK_ABORT(cudaMemset(big, 5, qn * 16 * R));
                double s0 = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                    CUDA_CHECK_ABORT(stream_pdl<0>(big + (size_t)(i % R) * qn, qn, t.sink, t.sms, bs));
                });
                double s1 = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                    CUDA_CHECK_ABORT(stream_pdl<1>(big + (size_t)(i % R) * qn, qn, t.sink, t.sms, bs));
                });
                printf("%-8s b2b stream-read ceiling (%.2f MB): reads before the PDL wait %.2f us (%.1f%% of copy), "
                       "after it %.2f us (%.1f%%)\n",
                       sh.name, qn * 16 / 1e6, s0, 100.0 * qn * 16 / (s0 * 1e-6) / 1e9 / copy_gbs, s1,
                       100.0 * qn * 16 / (s1 * 1e-6) / 1e9 / copy_gbs);
                if (csv)
                    fprintf(csv, "%s,%d,%d,0,b2b_stream_ceiling,0,%.3f,%.1f,%.2f,,,,,,,,,\n", sh.name, K, N,
                            s0, qn * 16 / (s0 * 1e-6) / 1e9, 100.0 * qn * 16 / (s0 * 1e-6) / 1e9 / copy_gbs);
                if (mlp_sweep) { /* the same stream with k_decode's loads in flight, by grid size */
                    const double f[] = {0.5, 0.61, 0.75, 0.91, 1.0, 1.5, 2.0, 3.0};
                    for (int nl = 8; nl <= 16; nl += 8) {
                        printf("%-8s b2b mlp %2d x 16 B per thread:", sh.name, nl);
                        for (double fr : f) {
                            const int B = (int)(fr * 2 * t.sms + 0.5);
                            const double us = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                                const uint4 *pp = big + (size_t)(i % R) * qn;
                                CUDA_CHECK_ABORT(nl == 8 ? stream_mlp<8>(pp, qn, t.sink, B, bs)
                                                         : stream_mlp<16>(pp, qn, t.sink, B, bs));
                            });
                            printf("  %d blk %.2f us (%.0f%%)", B, us, 100.0 * qn * 16 / (us * 1e-6) / 1e9 / copy_gbs);
                        }
                        printf("\n");
                    }
                }
                cudaFree(big);
            }
            /* the baseline back to back too: cuBLAS FP16 over Rc device copies of
             * the dequantized weight (> 2x L2 together), the same calls on the
             * same stream (not with --b2b-only, which makes no fp16 weight) */
            const double fpb = (double)K * N * 2;
            const int Rc = wd.empty() ? 0 : (int)std::min<double>(64.0, std::ceil(2.0 * prop.l2CacheSize / fpb)) + 1;
            std::vector<uint16_t *> cw(Rc, dW); /* cw[0]: the weight itself */
            for (int i = 1; i < Rc; i++) {
                CUDA_CHECK_ABORT(cudaMalloc(&cw[i], (size_t)fpb));
                CUDA_CHECK_ABORT(cudaMemcpy(cw[i], dW, (size_t)fpb, cudaMemcpyDeviceToDevice));
            }
            const int pdl0 = w4a16_pdl(-1), cl0 = w4a16_cluster_reduce(-1), dc0 = w4a16_decode_kernel(-1);
            /* modes: 0 = this session's dispatch (decode kernel, PDL), 1 = the
             * session-2 default (skinny + cluster split-K, PDL), 2 = decode
             * without PDL, 3 = skinny without PDL or cluster (--variants) */
            static const char *mname[4] = {"new", "old", "new,nopdl", "old,nopdl"};
            for (int bi = 0; bi < nbms; bi++) {
                double us_mode[4] = {0, 0, 0, 0};
                int mm = bms[bi], rc2 = 0;
                enum w4a16_kernel kc;
                int ks;
                w4a16_choice(w, mm, &kc, &ks);
                for (int mode = 0; mode < (variants ? 4 : 2); mode++) {
                    w4a16_pdl(mode < 2 ? pdl0 : 0);
                    w4a16_cluster_reduce(mode == 3 ? 0 : cl0);
                    w4a16_decode_kernel(mode == 0 || mode == 2);
                    us_mode[mode] = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                        if (mode == 0 && b2b_kernel != W4A16_KERNEL_AUTO)
                            rc2 |= w4a16_linear_ex(cp[i % R], dx, mm, dy, epi, (enum w4a16_kernel)b2b_kernel,
                                                   b2b_split, ws, wsb_var, bs, err, sizeof err);
                        else
                            rc2 |= w4a16_linear(cp[i % R], dx, mm, dy, epi, ws, wsb, bs, err, sizeof err);
                    });
                }
                w4a16_pdl(pdl0);
                w4a16_cluster_reduce(cl0);
                enum w4a16_kernel ko; /* the "old" column's choice (the dispatch without decode) */
                int kso;
                w4a16_decode_kernel(0);
                w4a16_choice(w, mm, &ko, &kso);
                w4a16_decode_kernel(dc0);
                if (audit) { /* the pick against the other kernel: decode forced, or the dispatch without it */
                    const int dec_ok = w4a16_decode_applies(w, mm);
                    double ud = 0;
                    if (dec_ok) {
                        w4a16_decode_kernel(1);
                        ud = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                            rc2 |= w4a16_linear_ex(cp[i % R], dx, mm, dy, epi, W4A16_KERNEL_DECODE, 0, ws,
                                                   wsb_var, bs, err, sizeof err);
                        });
                        w4a16_decode_kernel(dc0);
                    }
                    /* from M = 9 also the GEMV / GEMM kernels forced (skinny to M = 64, tc64,
                     * the wgmma GEMM where it is built for this device, from M = 65 dequantize
                     * + cuBLAS), each that is neither the pick nor the dispatch-without-decode's
                     * kernel timed above; one that fails (no room in the workspace) is left
                     * out (err) */
                    static const enum w4a16_kernel alt[4] = {W4A16_KERNEL_SKINNY, W4A16_KERNEL_TC64,
                                                             W4A16_KERNEL_WGMMA, W4A16_KERNEL_CUBLAS};
                    double ua[4] = {0, 0, 0, 0};
                    char atxt[128] = "";
                    for (int ai = 0; ai < 4 && mm > 8; ai++) {
                        const enum w4a16_kernel k = alt[ai];
                        if (k == kc || k == ko || (k == W4A16_KERNEL_SKINNY && mm > 64) ||
                            (k == W4A16_KERNEL_WGMMA && !w4a16_gemm_available()) ||
                            (k == W4A16_KERNEL_CUBLAS && mm <= 64))
                            continue;
                        int rca = 0;
                        char erra[256];
                        const double u = b2b_us(t.a, t.b, bs, calls, [&](int i) {
                            rca |= w4a16_linear_ex(cp[i % R], dx, mm, dy, epi, k, 0, ws, wsb_var, bs, erra,
                                                   sizeof erra);
                        });
                        if (!rca) ua[ai] = u;
                        const size_t l = strlen(atxt);
                        if (rca) snprintf(atxt + l, sizeof atxt - l, " | %s err", kname(k));
                        else snprintf(atxt + l, sizeof atxt - l, " | %s %7.2f", kname(k), u);
                    }
                    /* the pick's time over the fastest other kernel's (a forced decode where
                     * the pick is not decode, the dispatch without decode where it is, and
                     * from M = 9 the forced kernels above); two timings of one kernel are
                     * noise, not a choice, and are not compared */
                    double other = 0;
                    enum w4a16_kernel okind = W4A16_KERNEL_AUTO;
                    auto take = [&](double u, enum w4a16_kernel k) {
                        if (u > 0 && k != kc && (other == 0 || u < other)) other = u, okind = k;
                    };
                    if (kc == W4A16_KERNEL_DECODE) take(us_mode[1], ko);
                    else if (dec_ok) take(ud, W4A16_KERNEL_DECODE);
                    for (int ai = 0; ai < 4; ai++) take(ua[ai], alt[ai]);
                    const int cmp = other > 0;
                    const double r = cmp ? us_mode[0] / other : 1.0;
                    char dtxt[16] = "    n/a", rtxt[32] = "    -";
                    if (dec_ok) snprintf(dtxt, sizeof dtxt, "%7.2f", ud);
                    if (cmp) snprintf(rtxt, sizeof rtxt, "%.3f (%s)", r, kname(okind));
                    printf("audit %-16s M=%-2d pick %-6s %7.2f us | decode forced %s | without decode (%s) %7.2f%s | "
                           "pick/other %s%s\n", sh.name, mm, kname(kc), us_mode[0], dtxt, kname(ko), us_mode[1],
                           atxt, rtxt, r > 1.03 ? "  SLOW" : "");
                    audit_n += cmp;
                    audit_slow += r > 1.03;
                    if (r > audit_worst) audit_worst = r, audit_ws = sh.name, audit_wm = mm;
                }
                printf("%-8s b2b M=%-2d %-6s over %2d copies:", sh.name, mm,
                       kname(b2b_kernel != W4A16_KERNEL_AUTO ? (enum w4a16_kernel)b2b_kernel : kc), R);
                for (int mode = 0; mode < (variants ? 4 : 2); mode++)
                    printf("  %s %.2f us (%.1f%%)", mname[mode], us_mode[mode],
                           100.0 * wbytes / (us_mode[mode] * 1e-6) / 1e9 / copy_gbs);
                printf("  new/old %.2fx", us_mode[1] / us_mode[0]);
                if (Rc) {
                    CUBLAS_CHECK_ABORT(cublasSetStream(cb, bs));
                    const double cus =
                        b2b_us(t.a, t.b, bs, std::max(Rc * 4, 64), [&](int i) { cublas_ref(cw[i % Rc], mm); });
                    CUBLAS_CHECK_ABORT(cublasSetStream(cb, 0));
                    CUDA_CHECK_ABORT(cudaGetLastError());
                    printf("  cuBLAS b2b over %d copies %.2f us, vs cuBLAS %.2fx", Rc, cus, cus / us_mode[0]);
                    if (csv)
                        fprintf(csv, "%s,%d,%d,%d,b2b_cublas,0,%.3f,%.1f,%.2f,,,,,,,,,\n", sh.name, K, N, mm, cus,
                                fpb / (cus * 1e-6) / 1e9, 100.0 * fpb / (cus * 1e-6) / 1e9 / copy_gbs);
                }
                int dtb, dcols, dgrid; /* the decode kernel's tiles per block, columns and grid */
                if ((b2b_kernel != W4A16_KERNEL_AUTO ? (enum w4a16_kernel)b2b_kernel : kc) == W4A16_KERNEL_DECODE &&
                    w4a16_decode_describe(w, mm, &dtb, &dcols, &dgrid))
                    printf("  [TB %d, %d columns on %d blocks]", dtb, dcols, dgrid);
                if (b2b_kernel != W4A16_KERNEL_AUTO && b2b_split > 0) /* and the "old" column's split */
                    printf("  split %d (old: %s, split %d)", b2b_split, kname(ko), kso);
                printf("%s\n", rc2 ? " (error)" : "");
                if (csv)
                    for (int mode = 0; mode < (variants ? 4 : 2); mode++)
                        fprintf(csv, "%s,%d,%d,%d,b2b_%s,0,%.3f,%.1f,%.2f,,,,,,,,,\n", sh.name, K, N, mm,
                                mname[mode], us_mode[mode], wbytes / (us_mode[mode] * 1e-6) / 1e9,
                                100.0 * wbytes / (us_mode[mode] * 1e-6) / 1e9 / copy_gbs);
                if (rc2) fprintf(stderr, "b2b %s M=%d: %s\n", sh.name, mm, err);
            }
            fflush(stdout);
            CUDA_CHECK_ABORT(cudaStreamDestroy(bs));
            for (int i = 1; i < R; i++) w4a16_free(cp[i]);
            for (int i = 1; i < Rc; i++) cudaFree(cw[i]);
        }
        /* single cold calls (sweep, table): PDL off, so that no kernel
         * overlaps the L2 flush kernel */
        const int pdl_keep = w4a16_pdl(-1);
        w4a16_pdl(0);
        if (sweep) {
            static const int sms_[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
            static const int sweep_m[] = {1, 2, 4, 1, 16, 64, 128};
            for (int mi2 = 0; mi2 < 7; mi2++)
                for (int si = 0; si < 10; si++) {
                    int rc2 = 0, mm = sweep_m[mi2];
                    enum w4a16_kernel fk = mm <= 16 ? W4A16_KERNEL_SKINNY : W4A16_KERNEL_TC64;
                    double sus = time_median_us(t, reps, [&] {
                        rc2 |= w4a16_linear_ex(w, dx, mm, dy, epi, fk, sms_[si], ws, wsb_var, 0, err,
                                               sizeof err);
                    });
                    printf("  sweep %-8s M=%-3d %s ksplit=%-3d %8.2f us %6.0f GB/s%s\n", sh.name, mm,
                           kname(fk), sms_[si], sus, wbytes / (sus * 1e-6) / 1e9, rc2 ? " (error)" : "");
                }
        }
        if (sweep_gemm && !b2b_only && w4a16_gemm_available()) { /* x holds max(--m) rows */
            /* the warp-specialized wgmma GEMM in the automatic choice's mode
             * (4, or 5 with AWQD_W4A16_GEMM_SS=1; 3 with AWQD_W4A16_GEMM_NAT=0),
             * every tile and split */
            const int gmode = w4a16_gemm_auto_mode() >= 4 ? w4a16_gemm_auto_mode() : 3;
            static const int tl[5][2] = {{1, 64}, {2, 64}, {1, 128}, {2, 128}, {1, 256}};
            static const int sk[7] = {0, 1, 2, 3, 4, 6, 8}; /* 0: stream-K at split 1 (mode 4) */
            for (int mi = 0; mi < nms; mi++) {
                const int M = ms[mi];
                double best = 1e30;
                int bt = 0, bk = 0;
                for (int ti = 0; ti < 5; ti++)
                    for (int ki = 0; ki < 7; ki++) {
                        if (w4a16_gemm_config(tl[ti][0], tl[ti][1], sk[ki], gmode)) continue;
                        int rc2 = 0;
                        double sus = time_median_us(t, reps, [&] {
                            rc2 |= w4a16_linear_ex(w, dx, M, dy, epi, W4A16_KERNEL_WGMMA, sk[ki], ws, wsb_var, 0,
                                                   err, sizeof err);
                        });
                        printf("  sweep-gemm %-8s M=%-4d %dx%-3d ksplit=%d %8.2f us%s\n", sh.name, M, tl[ti][0],
                               tl[ti][1], sk[ki], sus, rc2 ? " (error)" : "");
                        if (!rc2 && sus < best) best = sus, bt = ti, bk = ki;
                    }
                w4a16_gemm_config(0, 0, 0, 0);
                printf("  sweep-gemm %-8s M=%-4d best %dx%d ksplit=%d %.2f us\n", sh.name, M, tl[bt][0], tl[bt][1],
                       sk[bk], best);
            }
            fflush(stdout);
        }
        for (int mi = 0; mi < (b2b_only ? 0 : nms); mi++) {
            int M = ms[mi];
            enum w4a16_kernel kc;
            int ks;
            w4a16_choice(w, M, &kc, &ks);
            int rc = 0;
            double us = time_median_us(t, reps, [&] {
                rc |= w4a16_linear(w, dx, M, dy, epi, ws, wsb, 0, err, sizeof err);
            });
            if (rc) {
                fprintf(stderr, "w4a16_linear %s M=%d: %s\n", sh.name, M, err);
                return 1;
            }
            double cus = time_median_us(t, reps, [&] { cublas_ref(dW, M); });
            CUDA_CHECK_ABORT(cudaGetLastError());
            double var[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (kc == W4A16_KERNEL_DECODE) { /* the session-2 dispatch (skinny) for the same M */
                const int dc0 = w4a16_decode_kernel(-1);
                w4a16_decode_kernel(0);
                var[6] = time_median_us(t, reps, [&] {
                    rc |= w4a16_linear(w, dx, M, dy, epi, ws, wsb, 0, err, sizeof err);
                });
                w4a16_decode_kernel(dc0);
            }
            if (variants && kc == W4A16_KERNEL_SKINNY) { /* the dispatch without cluster split-K */
                const int cl0 = w4a16_cluster_reduce(-1);
                w4a16_cluster_reduce(0);
                var[5] = time_median_us(t, reps, [&] {
                    rc |= w4a16_linear(w, dx, M, dy, epi, ws, wsb, 0, err, sizeof err);
                });
                w4a16_cluster_reduce(cl0);
            }
            if (variants) {
                static const enum w4a16_kernel vk[5] = {W4A16_KERNEL_SKINNY, W4A16_KERNEL_TC64,
                                                        W4A16_KERNEL_TC128, W4A16_KERNEL_CUBLAS,
                                                        W4A16_KERNEL_DECODE};
                for (int v = 0; v < 5; v++) {
                    enum w4a16_kernel fk = vk[v];
                    if (fk == W4A16_KERNEL_SKINNY && M > 64) continue;
                    if (fk == W4A16_KERNEL_DECODE && M > 16) continue;
                    if (fk != W4A16_KERNEL_SKINNY && fk != W4A16_KERNEL_DECODE && M < 8) continue;
                    var[v] = time_median_us(t, reps, [&] {
                        rc |= w4a16_linear_ex(w, dx, M, dy, epi, fk, 0, ws, wsb_var, 0, err, sizeof err);
                    });
                }
                if (M >= 16 && w4a16_gemm_available()) /* the wgmma GEMM, its own tile and split choice */
                    var[7] = time_median_us(t, reps, [&] {
                        rc |= w4a16_linear_ex(w, dx, M, dy, epi, W4A16_KERNEL_WGMMA, 0, ws, wsb_var, 0, err,
                                              sizeof err);
                    });
                if (rc) {
                    fprintf(stderr, "w4a16_linear_ex %s M=%d: %s\n", sh.name, M, err);
                    return 1;
                }
            }
            double gbs = wbytes / (us * 1e-6) / 1e9;
            double tfl = 2.0 * M * N * (double)K / (us * 1e-6) / 1e12;
            printf("%-8s %5d %-10s %3d %9.2f %8.0f %5.1f%% %7.1f %10.2f %7.2fx", sh.name, M,
                   kname(kc), ks, us, gbs, 100.0 * gbs / copy_gbs, tfl, cus, cus / us);
            if (variants)
                printf(" %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f", var[0], var[1], var[2], var[3], var[4], var[5],
                       var[7]);
            if (var[6] > 0) printf("  old %.2f us (new/old %.2fx)", var[6], var[6] / us);
            printf("\n");
            fflush(stdout);
            if (csv)
                fprintf(csv, "%s,%d,%d,%d,%s,%d,%.3f,%.1f,%.2f,%.2f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n",
                        sh.name, K, N, M, kname(kc), ks, us, gbs, 100.0 * gbs / copy_gbs, tfl, cus,
                        cus / us, var[0], var[1], var[2], var[3], var[4], var[5], var[6], var[7]);
        }
        w4a16_pdl(pdl_keep);
        cudaFree(ws);
        cudaFree(dW);
        cudaFree(dx);
        cudaFree(dy);
        cudaFree(dyc);
        w4a16_free(w);
    }
    if (csv) fclose(csv);
    cublasDestroy(cb);
    cudaFree(t.flush);
    cudaFree(t.sink);
    if (audit)
        printf("audit: %d points with two kernels to choose from, %d with the pick > 3%% slower than the other; "
               "worst %.3f (%s M=%d)\n", audit_n, audit_slow, audit_worst, audit_ws, audit_wm);
#ifdef AWQD_STAMPS
    w4a16_stamps_dump(); /* the last launch of each shape and kernel kind, -DAWQD_STAMPS builds only */
    w4a16_gemm_stamps_dump();
#endif
    return 0;
}
