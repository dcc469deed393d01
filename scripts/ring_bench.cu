/* ring_bench.cu — does a deeper register ring raise what one block of the decode kernel streams?
 *
 * The decode kernel (kernels/cuda/w4a16.cu, k_decode) keeps one ring turn of 8 16-byte loads a lane
 * in registers and refills a slot right after consuming it (dequantization + mma.sync), so a warp
 * has at most 4 KB in flight; its blocks stream ~15 GB/s each whatever the shape
 * (docs/PERFORMANCE.md "Session 23" item 4), which leaves the 160-block grids (104 SMs with one
 * block) at ~60% of the copy rate. This kernel does the same per-chunk work (deq_raw of four words,
 * four mma.sync on four independent accumulators, as TB = 4) on a stream of 16-byte loads with the
 * ring D turns deep (D = 1: the decode kernel; D = 2: 8 KB a warp in flight), or less work (W = 2:
 * the codes raw, no HSUB2; W = 4: no mma; W = 0: only the loads, an xor each) or more independent chains (W = 3: eight), on grids of 132 / 160 / 264 blocks of 8 warps, compiled for
 * one or two blocks a SM. Reported: GB/s over the grid and per block (the best of 3 rounds of 8
 * back-to-back launches over two 384 MB buffers, a launch's time). Not part of the build or the tests:
 *   nvcc -std=c++17 -O3 -I. -gencode arch=compute_90a,code=sm_90a scripts/ring_bench.cu -o ring_bench
 */
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "microbench.cuh"
#include "kernels/cuda/w4a16_common.cuh"


static __device__ __forceinline__ void ldnc(uint4 &d, const uint4 *p, int pred) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
                 "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "+r"(d.x), "+r"(d.y), "+r"(d.z), "+r"(d.w)
                 : "l"(p), "r"(pred));
}

template <int D, int MINB, int W, int IL = 0>
static __global__ void __launch_bounds__(256, MINB) k_ring(const uint4 *w, int nturns, float *out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t wid = (size_t)blockIdx.x * 8 + warp;
    /* IL = 0: each warp a contiguous range (as k_decode's K ranges); IL = 1: the block's range with
     * its 8 warps' chunks interleaved (warp w takes chunks w, w + 8, ...) */
    constexpr int CS = IL ? 8 : 1; /* chunk stride in 512-byte chunks */
    const uint4 *p = IL ? w + (size_t)blockIdx.x * 8 * nturns * 8 * 32 + warp * 32 + lane
                        : w + wid * (size_t)nturns * 8 * 32 + lane;
    uint4 r[8 * D];
#pragma unroll
    for (int s = 0; s < 8 * D; s++) {
        r[s] = make_uint4(0, 0, 0, 0);
        ldnc(r[s], p + s * 32 * CS, 1);
    }
    float d[8][4] = {};
    uint32_t x = 0;
    const uint32_t mlo = magic_lo(3), mhi = magic_hi(3), b0 = 0x3c003c00u ^ lane, b1 = 0x3c003c00u;
    for (int t = 0; t < nturns; t += D) {
#pragma unroll
        for (int dd = 0; dd < D; dd++) {
#pragma unroll
            for (int s = 0; s < 8; s++) {
                const int slot = dd * 8 + s;
                const uint32_t *wv = &r[slot].x;
                if (W) {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        uint32_t a[4];
                        if (W == 2) { /* the codes raw (1024 + q): no HSUB2 */
                            const uint32_t w8 = wv[q] >> 8;
                            a[0] = lop3_lo(wv[q]), a[1] = lop3_hi(wv[q]), a[2] = lop3_lo(w8), a[3] = lop3_hi(w8);
                        } else {
                            deq_raw(wv[q], mlo, mhi, a);
                        }
                        const int c = W == 3 ? (s * 4 + q) & 7 : s & 3; /* W = 3: eight chains */
                        if (W == 4) { /* no mma */
                            x ^= a[0] ^ a[1] ^ a[2] ^ a[3];
                            continue;
                        }
                        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                            : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
                    }
                } else {
                    x ^= wv[0] ^ wv[3];
                }
                ldnc(r[slot], p + ((size_t)(t + dd + D) * 8 + s) * 32 * CS, t + dd + D < nturns);
            }
        }
    }
    float acc = (float)x;
#pragma unroll
    for (int i = 0; i < 8; i++) acc += d[i][0] + d[i][1] + d[i][2] + d[i][3];
    if (__float_as_uint(acc) == (uint32_t)nturns * 0x9e3779b9u) out[wid * 32 + lane] = acc; /* never: keeps the work */
}

template <int D, int MINB, int W, int IL = 0>
static void run(const char *name, uint4 *buf[2], size_t bytes, int blocks, float *out, cudaStream_t st) {
    /* whole turns of 4 KB a warp, a multiple of D */
    int nturns = (int)(bytes / ((size_t)blocks * 8 * 4096));
    nturns -= nturns % D;
    const double moved = (double)blocks * 8 * nturns * 4096;
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, k_ring<D, MINB, W, IL>));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_ring<D, MINB, W, IL>, 256, 0));
    /* 8 launches between two events, alternating buffers */
    const float best = best_ms(st, 3, [&] {
        for (int j = 0; j < 8; j++) k_ring<D, MINB, W, IL><<<blocks, 256, 0, st>>>(buf[j & 1], nturns, out);
    }) / 8;
    CK(cudaGetLastError());
    const double gbs = moved / (best * 1e-3) / 1e9;
    printf("%-22s blocks %3d  regs %3d  blocks/SM %d  turns %3d  %8.2f us  %7.0f GB/s  %5.1f GB/s a block\n", name,
           blocks, fa.numRegs, occ, nturns, best * 1e3, gbs, gbs / std::min(blocks, 132 * occ));
}

int main(void) {
    const size_t bytes = (size_t)384 << 20;
    uint4 *buf[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&buf[i], bytes));
        CK(cudaMemset(buf[i], 0x11, bytes));
    }
    float *out;
    CK(cudaMalloc(&out, (size_t)1 << 22));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    { /* the copy rate, read + write, as awqd bench kernels reports it */
        const float best = best_ms(st, 3, [&] { CK(cudaMemcpyAsync(buf[1], buf[0], bytes, cudaMemcpyDeviceToDevice, st)); });
        printf("copy rate (cudaMemcpy D2D, read + write): %.0f GB/s\n", 2.0 * bytes / (best * 1e-3) / 1e9);
    }
    for (int blocks : {132, 160, 264}) {
        run<1, 2, 1>("D1 minb2 work", buf, bytes, blocks, out, st);
        run<1, 2, 1, 1>("D1 minb2 work IL", buf, bytes, blocks, out, st);
        run<2, 2, 1>("D2 minb2 work", buf, bytes, blocks, out, st);
        run<2, 2, 1, 1>("D2 minb2 work IL", buf, bytes, blocks, out, st);
        run<1, 2, 0>("D1 minb2 loads only", buf, bytes, blocks, out, st);
        run<1, 2, 0, 1>("D1 minb2 loads only IL", buf, bytes, blocks, out, st);
        run<2, 1, 0, 1>("D2 minb1 loads only IL", buf, bytes, blocks, out, st);
        run<1, 2, 2>("D1 minb2 no HSUB2", buf, bytes, blocks, out, st);
    }
    return 0;
}
