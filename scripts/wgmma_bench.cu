/* wgmma_bench.cu — session 36's microbenchmark of Hopper's warpgroup MMA, outside the GEMM:
 * cycles per wgmma.m64nNk16 (fp16 in, fp32 accumulate) per SM, A in registers (RS) or shared
 * memory (SS), 1-3 warpgroups per block, one block per SM; and the "latency" runs, where a
 * dependent chain of shuffles before each group of 4 MMAs stands for a consumer's per-chunk
 * work (transpose, dequantization), with 2-4 A buffers and wait depths 0-3. What it showed on an
 * H200 (docs/PERFORMANCE.md "Session 36", docs/KERNELS.md "Mode 4"): m64n64k16 reaches the
 * tensor peak with two warpgroups, and a warpgroup's work after its own register-A group never
 * overlaps that group. Not part of the build or the tests:
 *   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a scripts/wgmma_bench.cu -o wgmma_bench
 */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
static __device__ __forceinline__ uint64_t desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void wgrs64(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
static __device__ __forceinline__ void wgss64(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(1));
}
static __device__ __forceinline__ void wgrs128(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
static __device__ __forceinline__ void wgss128(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
}
static __device__ __forceinline__ void wgrs256(float *d, const uint32_t *a, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
static __device__ __forceinline__ void wgss256(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(1));
}

template <int N> struct W {
    static __device__ __forceinline__ void rs(float *d, const uint32_t *a, uint64_t db) {
        if constexpr (N == 64) wgrs64(d, a, db); else if constexpr (N == 128) wgrs128(d, a, db); else wgrs256(d, a, db);
    }
    static __device__ __forceinline__ void ss(float *d, uint64_t da, uint64_t db) {
        if constexpr (N == 64) wgss64(d, da, db); else if constexpr (N == 128) wgss128(d, da, db); else wgss256(d, da, db);
    }
};
// MODE: 0 RS, 1 SS, 2 RS with the A registers rewritten every group (as a dequantization would)
template <int N, int NACC, int WAIT, int MODE>
__global__ void __launch_bounds__((N == 64 && NACC <= 2) ? 384 : 256, 1) kb(float *out, int iters, long long *cyc) {
    extern __shared__ __align__(1024) unsigned char smraw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smraw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x;
    for (int i = tid; i < (N + 64) * 128 / 4; i += blockDim.x) ((uint32_t *)sm)[i] = 0x00003c00u * ((i & 7) == 0);
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint32_t sb = (uint32_t)__cvta_generic_to_shared(sm);
    const uint32_t sa = sb + N * 128;
    float acc[NACC][N / 2];
    for (int j = 0; j < NACC; j++) for (int i = 0; i < N / 2; i++) acc[j][i] = 0.f;
    uint32_t a[2][4][4];
    for (int b = 0; b < 2; b++) for (int t = 0; t < 4; t++) for (int j = 0; j < 4; j++) a[b][t][j] = 0x3c003c00u ^ (tid + t + j + b);
    long long t0 = clock64();
    for (int it = 0; it < iters; it += 2) {
#pragma unroll
        for (int b = 0; b < 2; b++) {
            if (MODE == 2) {
#pragma unroll
                for (int t = 0; t < 4; t++) for (int j = 0; j < 4; j++) a[b][t][j] = (a[b][t][j] & 0xfffefffeu) ^ (uint32_t)(it & 1);
            }
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int t = 0; t < 4; t++) {
                if (MODE == 1) W<N>::ss(acc[t % NACC], desc(sa + t * 32), desc(sb + t * 32));
                else W<N>::rs(acc[t % NACC], a[b][t], desc(sb + t * 32));
            }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(WAIT) : "memory");
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    long long t1 = clock64();
    float s = 0.f;
    for (int j = 0; j < NACC; j++) for (int i = 0; i < N / 2; i++) s += acc[j][i];
    out[blockIdx.x * blockDim.x + tid] = s;
    if (tid % 128 == 0) cyc[blockIdx.x * 4 + tid / 128] = t1 - t0;
}
template <int N, int NACC, int WAIT, int MODE>
static void run(int nwg, int iters, const char *name) {
    float *out; long long *cyc;
    cudaMalloc(&out, 132 * 384 * 4); cudaMalloc(&cyc, 132 * 4 * 8);
    auto k = kb<N, NACC, WAIT, MODE>;
    const int smem = (N + 64) * 128 + 1024;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<132, 128 * nwg, smem>>>(out, iters, cyc);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0);
    k<<<132, 128 * nwg, smem>>>(out, iters, cyc);
    cudaEventRecord(e1);
    cudaError_t err = cudaDeviceSynchronize();
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    long long h[132 * 4]; cudaMemcpy(h, cyc, sizeof h, cudaMemcpyDeviceToHost);
    double mx = 0; for (int b = 0; b < 132; b++) for (int w = 0; w < nwg; w++) if (h[b * 4 + w] > mx) mx = h[b * 4 + w];
    const double wg_per_sm = (double)iters * 4 * nwg;
    const double flop = 2.0 * 64 * N * 16 * wg_per_sm * 132;
    printf("%-28s N=%3d WGs=%d acc=%d wait=%d: %6.1f cycles per wgmma per SM (ideal %d), %5.1f%% of peak, %.0f TFLOP/s %s\n", name, N, nwg, NACC, WAIT,
           mx / wg_per_sm, N / 2, 100.0 * (N / 2) / (mx / wg_per_sm), flop / (ms * 1e-3) / 1e12, err ? cudaGetErrorString(err) : "");
    cudaFree(out); cudaFree(cyc);
}
// latency experiment: a dependent chain of PL shuffles rewrites buffer b's A before its group; NB buffers, wait<W>
template <int PL, int NB, int WT, bool SSM = false>
__global__ void __launch_bounds__(256, 1) kl(float *out, int iters, long long *cyc) {
    extern __shared__ __align__(1024) unsigned char smraw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smraw + 1023) & ~(uintptr_t)1023);
    const int tid = threadIdx.x;
    for (int i = tid; i < 128 * 128 / 4; i += blockDim.x) ((uint32_t *)sm)[i] = 0x00003c00u * ((i & 7) == 0);
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint32_t sb = (uint32_t)__cvta_generic_to_shared(sm);
    float acc[32];
    for (int i = 0; i < 32; i++) acc[i] = 0.f;
    uint32_t a[NB][4][4];
    for (int b = 0; b < NB; b++) for (int t = 0; t < 4; t++) for (int j = 0; j < 4; j++) a[b][t][j] = 0x3c003c00u ^ (tid + t + j + b);
    uint32_t sink = 0;
    long long t0 = clock64();
    for (int it = 0; it < iters; it += NB) {
#pragma unroll
        for (int b = 0; b < NB; b++) {
            uint32_t v = a[b][0][0];
#pragma unroll
            for (int j = 0; j < PL; j++) v = __shfl_xor_sync(0xffffffffu, v, 1) ^ (uint32_t)j;
            a[b][0][0] = v;
            sink ^= v;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int t = 0; t < 4; t++) { if (SSM) W<64>::ss(acc, desc(sb + 8192 + t * 32), desc(sb + t * 32)); else W<64>::rs(acc, a[b][t], desc(sb + t * 32)); }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(WT) : "memory");
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    long long t1 = clock64();
    float s = 0.f;
    for (int i = 0; i < 32; i++) s += acc[i];
    out[blockIdx.x * blockDim.x + tid] = s + (float)sink;
    if (tid % 128 == 0) cyc[blockIdx.x * 4 + tid / 128] = t1 - t0;
}
template <int PL, int NB, int WT, bool SSM = false>
static void runl(int nwg, int iters) {
    float *out; long long *cyc;
    cudaMalloc(&out, 132 * 384 * 4); cudaMalloc(&cyc, 132 * 4 * 8);
    auto k = kl<PL, NB, WT, SSM>;
    const int smem = 128 * 128 + 1024;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    k<<<132, 128 * nwg, smem>>>(out, iters, cyc);
    cudaDeviceSynchronize();
    long long h[132 * 4]; cudaMemcpy(h, cyc, sizeof h, cudaMemcpyDeviceToHost);
    double mx = 0; for (int b = 0; b < 132; b++) for (int w = 0; w < nwg; w++) if (h[b * 4 + w] > mx) mx = h[b * 4 + w];
    printf("latency%s: %2d dependent shuffles before each group, %d A buffers, wait<%d>, %d WGs: %6.1f cycles per group of 4 m64n64k16 per WG (tensor-bound: %d)\n",
           SSM ? " SS" : " RS", PL, NB, WT, nwg, mx / iters, 128 * nwg);
    cudaFree(out); cudaFree(cyc);
}
int main() {
    const int it = 4096;
    run<64, 1, 1, 0>(1, it, "RS same acc");
    run<64, 1, 1, 0>(2, it, "RS same acc");
    run<64, 1, 1, 0>(3, it, "RS same acc");
    run<64, 2, 1, 0>(2, it, "RS 2 acc");
    run<64, 4, 1, 0>(2, it, "RS 4 acc");
    run<64, 1, 0, 0>(2, it, "RS wait0");
    run<64, 1, 1, 2>(2, it, "RS A rewritten");
    run<64, 2, 1, 2>(2, it, "RS A rewritten 2 acc");
    run<64, 1, 1, 2>(3, it, "RS A rewritten");
    run<64, 1, 1, 1>(2, it, "SS");
    run<64, 1, 1, 1>(3, it, "SS");
    run<128, 1, 1, 0>(2, it, "RS same acc");
    run<128, 1, 1, 2>(2, it, "RS A rewritten");
    run<128, 1, 1, 1>(2, it, "SS");
    run<256, 1, 1, 0>(2, it / 2, "RS same acc");
    run<256, 1, 1, 1>(2, it / 2, "SS");
    for (int nwg = 1; nwg <= 2; nwg++) {
        runl<0, 2, 1>(nwg, it); runl<16, 2, 1>(nwg, it); runl<16, 4, 3>(nwg, it);
        runl<0, 2, 1, true>(nwg, it); runl<16, 2, 1, true>(nwg, it); runl<16, 4, 3, true>(nwg, it); runl<16, 2, 0, true>(nwg, it);
    }
    return 0;
}
