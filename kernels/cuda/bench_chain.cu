/* bench_chain.cu — `awqd bench chain`: a decode layer's o_proj -> residual +
 * RMSNorm -> gate|up (silu * up) -> down_proj at batch 1, as the engine runs
 * it today (three PDL kernels: w4a16_linear, w4a16_linear_norm,
 * w4a16_linear) against the one persistent kernel of w4a16_chain.cu, in the
 * same run, on random AWQ weights of the real shapes.
 *
 * Method: each variant runs back to back over enough weight copies to
 * exceed twice the L2 (so every call streams from DRAM), captured into one
 * CUDA graph and replayed (as the engine runs a forward); median of 7
 * replays after a warm-up. Bytes: the three weights' INT4 words + scales +
 * zeros; "copy" is the cudaMemcpy D2D rate (read + write) over 1 GiB,
 * timed eagerly as `bench kernels` does; the "stream ceiling" line reads
 * the same bytes with one plain read kernel per call, in a graph too. Before
 * timing, both variants run once on the same inputs and their outputs are
 * compared (rout exactly, y within fp16 rounding of another summation
 * order): a mismatch fails the run (exit 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/bench_graph.cuh"
#include "kernels/cuda/bench_rng.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_chain.h"

extern "C" {
#include "engine/bench.h"
#include "engine/ckpt.h"
}

static bench_rng c_rng = {0x9e3779b97f4a7c15ull};
static uint32_t c_rnd(void) { return c_rng.next(); }
static float c_unit(void) { return (float)(c_rnd() & 0xffffff) / 16777216.f; }
static uint16_t c_h(float f) { return __half_as_ushort(__float2half(f)); }
static float c_f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* one random AWQ linear K x N (group 128) on the device */
static struct w4a16_weight *c_upload(int K, int N, int gate_up, size_t *bytes) {
    const int G = 128;
    std::vector<uint32_t> qw((size_t)K * N / 8), qz((size_t)K / G * N / 8);
    std::vector<uint16_t> sc((size_t)K / G * N);
    for (auto &v : qw) v = c_rnd() ^ (c_rnd() << 16);
    for (auto &v : qz) v = c_rnd() ^ (c_rnd() << 16);
    for (auto &v : sc) v = c_h(0.005f + 0.01f * c_unit());
    struct awq_linear l;
    memset(&l, 0, sizeof l);
    l.k = K, l.n = N, l.group = G;
    l.qweight = qw.data(), l.qzeros = qz.data(), l.scales = sc.data();
    struct w4a16_weight *w = NULL;
    char err[256];
    if (w4a16_upload(&l, gate_up ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN, &w, err, sizeof err)) {
        fprintf(stderr, "awqd bench chain: upload %dx%d: %s\n", K, N, err);
        return NULL;
    }
    *bytes += (size_t)K * N / 2 + (size_t)K / G * N * 2 + (size_t)K / G * N / 2;
    return w;
}

/* median µs per call of `calls` calls captured into one graph (7 replays
 * after a warm-up) */
template <typename F>
static double c_graph_us(cudaStream_t s, int calls, F fn) {
    cudaEvent_t a, b;
    CUDA_CHECK_ABORT(cudaEventCreate(&a));
    CUDA_CHECK_ABORT(cudaEventCreate(&b));
    const double us = bench_graph_us(a, b, s, calls, 8, fn);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return us;
}

/* the read-only stream ceiling: n uint4 read once (4 loads in flight per
 * thread per turn), launched like the chain with PDL off */
static __global__ void __launch_bounds__(512) k_chain_stream(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *sink = acc;
}

struct c_shape {
    const char *name;
    int ko, h, inter;
};

extern "C" int bench_chain(int argc, char **argv) {
    const char *only = NULL;
    int check_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--check")) check_only = 1;
        else {
            fprintf(stderr,
                    "usage: awqd bench chain [--shape NAME] [--check]\n"
                    "  o_proj -> add + RMSNorm -> gate|up -> down at batch 1: three decode kernels\n"
                    "  against the one persistent kernel (kernels/cuda/w4a16_chain.cu), back to back in a graph\n"
                    "  --shape  8b | 32b.tp4 | 32b.tp2 | 32b | 70b.tp4 (default: these) | small (1024 x 1024 x 1024:\n"
                    "           the per-call fixed cost)\n"
                    "  --check  compare the outputs only (no timing)\n");
            return strcmp(argv[i], "--help") && strcmp(argv[i], "-h") ? 2 : 0;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "awqd bench chain: no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop;
    CUDA_CHECK_ABORT(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    cudaStream_t s;
    CUDA_CHECK_ABORT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    double copy_gbs;
    { /* eager, as bench kernels measures it (a memcpy node in a graph runs slower) */
        size_t nb = (size_t)1 << 30;
        void *a, *b;
        cudaEvent_t e0, e1;
        CUDA_CHECK_ABORT(cudaMalloc(&a, nb));
        CUDA_CHECK_ABORT(cudaMalloc(&b, nb));
        CUDA_CHECK_ABORT(cudaMemset(a, 3, nb));
        CUDA_CHECK_ABORT(cudaEventCreate(&e0));
        CUDA_CHECK_ABORT(cudaEventCreate(&e1));
        std::vector<float> v;
        for (int rep = 0; rep < 8; rep++) {
            CUDA_CHECK_ABORT(cudaEventRecord(e0, s));
            CUDA_CHECK_ABORT(cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice, s));
            CUDA_CHECK_ABORT(cudaEventRecord(e1, s));
            CUDA_CHECK_ABORT(cudaEventSynchronize(e1));
            float ms = 0;
            CUDA_CHECK_ABORT(cudaEventElapsedTime(&ms, e0, e1));
            if (rep) v.push_back(ms);
        }
        std::sort(v.begin(), v.end());
        copy_gbs = 2.0 * nb / (v[v.size() / 2] * 1e-3) / 1e9;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(a);
        cudaFree(b);
    }
    printf("copy rate (cudaMemcpy D2D, read+write): %.0f GB/s\n\n", copy_gbs);
    /* Qwen3-8B; qwen3-32b's rank at tp = 4 / 2 and whole; llama3-70b's rank at tp = 4 */
    static const c_shape shapes[] = {
        {"8b", 4096, 4096, 12288},     {"32b.tp4", 2048, 5120, 6400}, {"32b.tp2", 4096, 5120, 12800},
        {"32b", 8192, 5120, 25600},    {"70b.tp4", 2048, 8192, 7168},
        {"small", 1024, 1024, 1024}, /* 2.1 MB: the per-call fixed cost (only with --shape small) */
    };
    printf("%-8s %6s %8s %10s %7s %10s %7s %7s %8s %8s\n", "shape", "copies", "MB", "3 kernels", "%copy",
           "chain", "%copy", "speedup", "max|dy|", "max|y|");
    int bad = 0;
    for (const c_shape &sh : shapes) {
        if (only ? strcmp(only, sh.name) != 0 : !strcmp(sh.name, "small")) continue;
        const int H = sh.h, I = sh.inter, KO = sh.ko;
        size_t one = 0;
        struct w4a16_weight *t0 = c_upload(KO, H, 0, &one);
        if (!t0) return 1;
        struct w4a16_weight *t1 = c_upload(H, 2 * I, 1, &one), *t2 = c_upload(I, H, 0, &one);
        if (!t1 || !t2) return 1;
        int copies = (int)((2.0 * prop.l2CacheSize) / one) + 1;
        if (check_only) copies = 1;
        std::vector<struct w4a16_weight *> wo(copies), wg(copies), wd(copies);
        std::vector<struct w4a16_chain *> chs(copies);
        wo[0] = t0, wg[0] = t1, wd[0] = t2;
        char err[256];
        for (int c = 1; c < copies; c++) {
            if (w4a16_clone(t0, &wo[c], err, sizeof err) || w4a16_clone(t1, &wg[c], err, sizeof err) ||
                w4a16_clone(t2, &wd[c], err, sizeof err)) {
                fprintf(stderr, "awqd bench chain: clone: %s\n", err);
                return 1;
            }
        }
        int rc = 0;
        for (int c = 0; c < copies && !rc; c++) rc = w4a16_chain_create(wo[c], wg[c], wd[c], &chs[c], err, sizeof err);
        if (rc) {
            printf("%-8s the chain does not run here: %s\n", sh.name, err);
            continue;
        }
        /* inputs */
        std::vector<uint16_t> hx(KO), hr(H), hw(H);
        for (auto &v : hx) v = c_h(2.f * c_unit() - 1.f);
        for (auto &v : hr) v = c_h(4.f * c_unit() - 2.f);
        for (auto &v : hw) v = c_h(0.5f + c_unit());
        uint16_t *dx, *dr, *dw, *dyo, *drout, *dact, *dy, *drout2, *dy2;
        CUDA_CHECK_ABORT(cudaMalloc(&dx, KO * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dr, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dw, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dyo, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&drout, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dact, I * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dy, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&drout2, H * 2));
        CUDA_CHECK_ABORT(cudaMalloc(&dy2, H * 2));
        CUDA_CHECK_ABORT(cudaMemcpy(dx, hx.data(), KO * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK_ABORT(cudaMemcpy(dr, hr.data(), H * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK_ABORT(cudaMemcpy(dw, hw.data(), H * 2, cudaMemcpyHostToDevice));
        const float eps = 1e-6f;
        auto three = [&](int c) {
            char e2[256];
            int r = w4a16_linear(wo[c], dx, 1, dyo, W4A16_EPI_NONE, NULL, 0, s, e2, sizeof e2);
            if (!r) r = w4a16_linear_norm(wg[c], dr, dyo, drout, dw, eps, 1, dact, W4A16_EPI_SILU_MUL, s, e2, sizeof e2);
            if (!r) r = w4a16_linear(wd[c], dact, 1, dy, W4A16_EPI_NONE, NULL, 0, s, e2, sizeof e2);
            if (r) {
                fprintf(stderr, "awqd bench chain: three kernels: %s\n", e2);
                exit(1);
            }
        };
        auto chain = [&](int c) {
            char e2[256];
            if (w4a16_chain_run(chs[c], dx, dr, dw, eps, drout2, dy2, s, e2, sizeof e2)) {
                fprintf(stderr, "awqd bench chain: %s\n", e2);
                exit(1);
            }
        };
        /* the outputs, same inputs, twice each (the chain's counters reset) */
        std::vector<uint16_t> r1(H), y1(H), r2(H), y2(H), y3(H);
        CUDA_CHECK_ABORT(cudaMemsetAsync(drout2, 0xff, H * 2, s));
        CUDA_CHECK_ABORT(cudaMemsetAsync(dy2, 0xff, H * 2, s));
        three(0);
        chain(0);
        CUDA_CHECK_ABORT(cudaStreamSynchronize(s));
        CUDA_CHECK_ABORT(cudaMemcpy(y3.data(), dy2, H * 2, cudaMemcpyDeviceToHost));
        chain(0);
        CUDA_CHECK_ABORT(cudaStreamSynchronize(s));
        CUDA_CHECK_ABORT(cudaMemcpy(r1.data(), drout, H * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK_ABORT(cudaMemcpy(y1.data(), dy, H * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK_ABORT(cudaMemcpy(r2.data(), drout2, H * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK_ABORT(cudaMemcpy(y2.data(), dy2, H * 2, cudaMemcpyDeviceToHost));
        double maxy = 0, maxd = 0;
        int rdiff = 0, nan = 0, rerun = 0;
        for (int i = 0; i < H; i++) {
            if (r1[i] != r2[i]) {
                /* fp16(rin + fp16(o)): o may round the other way in another order */
                if (fabsf(c_f(r1[i]) - c_f(r2[i])) > 2e-3f * (1.f + fabsf(c_f(r1[i])))) rdiff++;
            }
            if (std::isnan(c_f(y2[i]))) nan++;
            if (y2[i] != y3[i]) rerun++;
            maxy = std::max(maxy, (double)fabsf(c_f(y1[i])));
            maxd = std::max(maxd, (double)fabsf(c_f(y1[i]) - c_f(y2[i])));
        }
        const int timed_out = w4a16_chain_error(chs[0]);
        const bool dbg = getenv("AWQD_CHAIN_DBG") && (atoi(getenv("AWQD_CHAIN_DBG")) & 63); /* bits that break results */
        const bool ok = dbg || (!rdiff && !nan && !rerun && !timed_out && maxd <= 2e-2 * maxy + 1e-3);
        if (dbg) printf("%-8s AWQD_CHAIN_DBG=%s: timing only, the results are not checked\n", sh.name, getenv("AWQD_CHAIN_DBG"));
        if (!ok) {
            printf("%-8s MISMATCH: rout %d off, y NaN %d, rerun differs at %d, max|dy| %.4g of max|y| %.4g%s\n",
                   sh.name, rdiff, nan, rerun, maxd, maxy, timed_out ? ", a wait TIMED OUT" : "");
            bad = 1;
        }
        if (check_only || !ok) {
            if (ok) printf("%-8s ok: max|dy| %.4g of max|y| %.4g, rout within rounding, the rerun bitwise\n", sh.name, maxd, maxy);
        } else {
            uint4 *sbuf;
            unsigned *sink;
            const size_t sn = one / 16;
            CUDA_CHECK_ABORT(cudaMalloc(&sbuf, sn * 16 * copies));
            CUDA_CHECK_ABORT(cudaMemset(sbuf, 1, sn * 16 * copies));
            CUDA_CHECK_ABORT(cudaMalloc(&sink, 4));
            const double ts = c_graph_us(s, copies * 4, [&](int i) {
                k_chain_stream<<<prop.multiProcessorCount * 4, 512, 0, s>>>(sbuf + (size_t)(i % copies) * sn, sn, sink);
            });
            cudaFree(sbuf);
            cudaFree(sink);
            printf("%-8s stream ceiling (the same bytes, one read kernel per call): %.2f us (%.0f%% of the copy rate)\n",
                   sh.name, ts, 100.0 * one / 1e9 / (ts * 1e-6) / copy_gbs);
            const double t3 = c_graph_us(s, copies * 4, [&](int i) { three(i % copies); });
            const double tc = c_graph_us(s, copies * 4, [&](int i) { chain(i % copies); });
            const double gb = one / 1e9;
            int blocks = 0, stages = 0, sb = 0;
            w4a16_chain_describe(chs[0], &blocks, &stages, &sb);
            printf("%-8s %6d %8.1f %8.2fus %6.0f%% %8.2fus %6.0f%% %6.2fx %8.3g %8.3g   (%d blocks, %d stages of %d B)\n",
                   sh.name, copies, one / 1e6, t3, 100.0 * gb / (t3 * 1e-6) / copy_gbs, tc,
                   100.0 * gb / (tc * 1e-6) / copy_gbs, t3 / tc, maxd, maxy, blocks, stages, sb);
            if (w4a16_chain_error(chs[0])) {
                printf("%-8s a wait TIMED OUT during timing\n", sh.name);
                bad = 1;
            }
        }
        fflush(stdout);
        for (int c = 0; c < copies; c++) {
            w4a16_chain_free(chs[c]);
            w4a16_free(wo[c]);
            w4a16_free(wg[c]);
            w4a16_free(wd[c]);
        }
        cudaFree(dx), cudaFree(dr), cudaFree(dw), cudaFree(dyo), cudaFree(drout), cudaFree(dact);
        cudaFree(dy), cudaFree(drout2), cudaFree(dy2);
    }
    cudaStreamDestroy(s);
    w4a16_chain_stamps_dump(); /* the last call's timeline in a -DAWQD_STAMPS build */
    return bad;
}
