/* w4a16_gemm.cu — INT4-weight x FP16-activation GEMM for many rows (prefill,
 * large batches) on Hopper: wgmma with the weights as the register A operand.
 *
 * Product (as all W4A16 kernels here): D[n, m] = sum_k W^T[n, k] x^T[k, m],
 * weights = A (rows = output features), tokens = B (columns), fp32 accumulate.
 *
 * Block = 2 warpgroups (256 threads) x (128 * MT weight rows) x BN tokens.
 * Warpgroup g owns MT m64 tiles; warp q of it holds, for each, the n16 tile
 * T = (g MT + mt) 4 + q of the block. The repacked INT4 word t of a lane is
 * exactly the mma.m16n8k16 A fragment of k16 step t (w4a16.cu, "Device weight
 * layout"), and wgmma.m64nNk16 with A in registers wants, per warp, 16 rows in
 * that same fragment layout: each lane LOP3-dequantizes its own words into A
 * registers, (q - z) * s rounded to fp16 (the value a dequantized fp16 weight
 * has), and the weights never pass through a shared-memory transpose.
 *
 * x goes to shared memory in the canonical K-major, 128-byte-swizzle wgmma
 * layout (one 128-byte row per token = the 64-deep chunk, 8-row atoms of 1 KB,
 * 16-byte unit u of row n stored at u ^ (n & 7)). The weight layout permutes k
 * inside a chunk (lane c of step t multiplies k = 16c + 4t + j), so x must be
 * permuted the same way: logical position p = 16t + kk of step t holds
 *     k = 16c + 4t + (kk & 1) + 2 (kk >> 3),  c = (kk >> 1) & 3,
 * i.e. 4-byte word sw = k/2 (c = sw >> 3, t = (sw >> 1) & 3, h = sw & 1) goes
 * to word 8t + 4h + c of the row. The copy does that with one 4-byte cp.async
 * per word: a warp copies one token row (128 contiguous bytes, coalesced) and
 * its 32 destination words are a permutation of the row's 32 banks (no bank
 * conflicts). Step t's descriptor starts 32 t bytes into the rows.
 *
 * Pipeline: ST-stage cp.async ring of (x tile, INT4 tile, scales, zeros) per
 * 64-deep chunk, ST - 2 chunks in flight; every warp commits one wgmma group
 * per k16 step and waits until at most one is pending (A registers of two
 * steps alive), so the slot read two chunks ago is free after the barrier.
 * Split-K across blocks (grid z) for shapes with few tiles: fp32 partials in
 * the caller's workspace, the last block (arrival counter) adds them in split
 * order 0..S-1 (deterministic) and runs the epilogue.
 *
 * The same kernel with mode = mma.sync (template WG = false) replaces each
 * wgmma by ldmatrix (x from the same swizzled tile) + mma.m16n8k16 with the
 * same accumulator layout: a portable check of the data path and the fallback
 * where wgmma is not available.
 *
 * Mode 4 (k_w4gemm_ws with NAT, the automatic choice since session 14) does
 * the opposite: x stays in natural k order and arrives by TMA (one box per
 * stage, 128-byte swizzle = the layout above without the permutation), and
 * each consumer lane gathers its weight words in natural k order from the
 * stage (g_quad_gather; until sessions 37-38 a 4 x 4 transpose across its quad)
 * before the same dequantization.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <type_traits>

#include <cuda.h> /* CUtensorMap (the encoder comes through the runtime's driver entry point) */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "kernels/cuda/carveout.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/smem_limit.cuh"
#include "kernels/cuda/w4a16_common.cuh"
#include "kernels/cuda/w4a16_gemm.h"
#include "kernels/cuda/gemm_sk.h"
#include "kernels/cuda/nat_rule.h"
#include "kernels/cuda/stamps.cuh" /* empty unless -DAWQD_STAMPS */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#else
#define WG_ENABLED 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMA_ENABLED 1
#else
#define MMA_ENABLED 0
#endif

/* ------------------------------------------------------------------------ */
/* Device helpers                                                            */
/* ------------------------------------------------------------------------ */

static __device__ __forceinline__ void g_cp16(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void g_cp4(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
/* cp.async writes (generic proxy) -> visible to wgmma's operand reads (async proxy) */
static __device__ __forceinline__ void g_fence_async(void) {
#if WG_ENABLED
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_fence(void) {
#if WG_ENABLED
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_commit(void) {
#if WG_ENABLED
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N>
static __device__ __forceinline__ void wg_wait(void) {
#if WG_ENABLED
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

/* Matrix descriptor of a K-major operand with 128-byte swizzle whose 8-row
 * atoms are 1 KB apart (start address and strides in 16-byte units; the
 * leading offset is unused for this layout and set to 1). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
/* wg_desc(saddr + 16 u) from d = wg_desc(saddr): a CTA's shared addresses
 * are below 256 KB, so the start address field (bits 0-13) takes the add
 * without a carry: one add per wgmma instead of the mask, shift and or */
static __device__ __forceinline__ uint64_t wg_desc_add(uint64_t d, uint32_t u) {
    return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + u);
}

static __device__ __forceinline__ uint32_t g_lop3(uint32_t w, uint32_t mask) {
    uint32_t d; /* (w & mask) | 0x64006400 */
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(w), "r"(mask), "n"(0x64006400));
    return d;
}

/* Per-lane dequantization constants of one n16 tile and group: s2 = half2
 * {s(r), s(r+8)}, z = z(r) | z(r+8) << 4. */
struct g_deq {
    uint32_t mlo, nzhi, slo, shi;
};
static __device__ __forceinline__ g_deq g_deq_make(uint32_t s2, uint32_t z) {
    g_deq d;
    const uint32_t zz = z * 0x10001u;          /* z (a byte) in both halves */
    d.mlo = (zz & 0x000f000fu) | 0x64006400u;  /* 1024 + z(r) */
    d.nzhi = (zz & 0x00f000f0u) | 0xd400d400u; /* -(64 + z(r+8)) */
    d.slo = __byte_perm(s2, s2, 0x1010);
    d.shi = __byte_perm(s2, s2, 0x3232);
    return d;
}
/* A fragment of one k16 step from one repacked word: rows r -> (q - z) s,
 * rows r + 8 -> (q - z) s (the high nibbles come out as 1024 + 16 q: times
 * 1/16 minus 64 + z). */
static __device__ __forceinline__ void g_deq_word(uint32_t w, const g_deq &d, uint32_t a[4]) {
    const uint32_t sixteenth = 0x2c002c00u;
    uint32_t w8 = w >> 8;
    a[0] = hmul2u(hsub2u(g_lop3(w, 0x000f000fu), d.mlo), d.slo);
    a[1] = hmul2u(hfma2u(g_lop3(w, 0x00f000f0u), sixteenth, d.nzhi), d.shi);
    a[2] = hmul2u(hsub2u(g_lop3(w8, 0x000f000fu), d.mlo), d.slo);
    a[3] = hmul2u(hfma2u(g_lop3(w8, 0x00f000f0u), sixteenth, d.nzhi), d.shi);
}

static __device__ __forceinline__ void g_ldsm4(uint32_t b[4], uint32_t addr) {
#if MMA_ENABLED
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr));
#else
    b[0] = b[1] = b[2] = b[3] = 0;
    (void)addr;
#endif
}

/* wgmma.m64nNk16, fp32 accumulators d[N/2], A (fp16) in registers, B by
 * descriptor (K-major), D += A B. Generated operand lists. */
static __device__ __forceinline__ void wgmma_n64(float *d, const uint32_t *a, uint64_t desc) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}

/* m64n96k16: the 80 / 96-row decode buckets (M = 65-96) without the
 * m64n128 tile's idle quarter (session 44) */
static __device__ __forceinline__ void wgmma_n96(float *d, const uint32_t *a, uint64_t desc) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, "
                 "{%48,%49,%50,%51}, %52, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}

static __device__ __forceinline__ void wgmma_n128(float *d, const uint32_t *a, uint64_t desc) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}


static __device__ __forceinline__ void wgmma_n256(float *d, const uint32_t *a, uint64_t desc) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
                 "{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
#else
    (void)d, (void)a, (void)desc;
#endif
}

/* d += A B for one m64 tile and the block's BN tokens */
template <int BN>
static __device__ __forceinline__ void wgmma_tile(float *d, const uint32_t *a, uint64_t desc) {
    static_assert(BN == 64 || BN == 96 || BN == 128 || BN == 256, "wgmma_tile: BN");
    if (BN == 64) wgmma_n64(d, a, desc);
    else if (BN == 96) wgmma_n96(d, a, desc);
    else if (BN == 128) wgmma_n128(d, a, desc);
    else wgmma_n256(d, a, desc);
}

/* wgmma.m64nNk16 with both operands by descriptor (K-major, 128-byte
 * swizzle): mode 5, A = the weights dequantized into shared memory. */
static __device__ __forceinline__ void wgmma_ss_n64(float *d, uint64_t da, uint64_t db) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(1));
#else
    (void)d, (void)da, (void)db;
#endif
}

static __device__ __forceinline__ void wgmma_ss_n128(float *d, uint64_t da, uint64_t db) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "%64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(1));
#else
    (void)d, (void)da, (void)db;
#endif
}

static __device__ __forceinline__ void wgmma_ss_n256(float *d, uint64_t da, uint64_t db) {
#if WG_ENABLED
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
                 "%128, %129, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(da), "l"(db), "r"(1));
#else
    (void)d, (void)da, (void)db;
#endif
}

template <int BN>
static __device__ __forceinline__ void wgmma_ss_tile(float *d, uint64_t da, uint64_t db) {
    static_assert(BN == 64 || BN == 128 || BN == 256, "wgmma_ss_tile: BN");
    if (BN == 64) wgmma_ss_n64(d, da, db);
    else if (BN == 128) wgmma_ss_n128(d, da, db);
    else wgmma_ss_n256(d, da, db);
}

/* ------------------------------------------------------------------------ */
/* The kernel                                                                */
/* ------------------------------------------------------------------------ */

struct gk_args {
    const uint4 *qw;
    const uint32_t *sc;
    const uint8_t *zr;
    const uint16_t *x; /* XP: its permuted copy (k_xperm; the kernels with x by TMA read x only
                          through the host's tensor map) */
    uint16_t *y;
    const uint16_t *bias;
    float *part;
    int *cnt;
    int K, KC, G, n16a, m, n, ldy, gate_up, cps, ksplit;
    int ntn, ntiles; /* k_w4gemm_ws: column tiles, column tiles x token tiles */
    int skD, skT;    /* k_w4gemm_ws at split 1 (ws_work): tiles [0, skD) whole, then stream-K over the
                        skT chunk steps of the rest (skT = 0: every tile whole, skD = ntiles) */
    int dbg; /* timing experiments only (AWQD_W4A16_GEMM_DBG): 1 no MMA, 2 no x copy, 8 no proxy
                fence; mode 3: 2 no x copy, 32 no weight copy, 64 consumers only pass the
                stages on, 256 no tile-end stores at split 1; mode 5: 1024 no dequantization (results are
                wrong with any of them) */
};

/* Kept within 128 bytes: at 136 (session 51, one more pointer) nvcc read
 * the parameters of every k_w4gemm_ws through the parameter space's address
 * at each use instead of once at entry, 3-6% slower on several shapes at M
 * = 17-64 (docs/PERFORMANCE.md "Session 51" item 6). */
static_assert(sizeof(gk_args) <= 128, "gk_args: keep the kernel parameter block within 128 bytes");

#define GK_THREADS 256

template <int MT, int BN, int ST, int NWG = 2>
struct gk_cfg {
    static constexpr int BT = 4 * NWG * MT;               /* n16 tiles per block (NWG consumer warpgroups) */
    static constexpr int X_BYTES = BN * 128;              /* x tile, first (1 KB aligned) */
    static constexpr int W_BYTES = BT * 512;              /* INT4 tile */
    static constexpr int S_BYTES = BT * 32;               /* scales */
    static constexpr int Z_BYTES = BT * 8;                /* zeros */
    static constexpr int STAGE = (X_BYTES + W_BYTES + S_BYTES + Z_BYTES + 1023) / 1024 * 1024;
    static constexpr int SMEM = STAGE * ST + 1024;        /* + alignment slack */
    static constexpr int NACC = MT * BN / 2;              /* fp32 accumulators per thread */
};

static __device__ __forceinline__ void g_cluster_sync(void) { /* w4a16_common.cuh */
    cl_arrive();
    cl_wait();
}

/* f(mt, nt) for each of this warp's n16 tiles nt = nt0 + (wg MT + mt) 4 + wq
 * that holds real columns (nt < n16a: the same for the whole warp) */
template <int MT, class F>
static __device__ __forceinline__ void g_warp_tiles(int n16a, int nt0, int wg, int wq, F f) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int nt = nt0 + (wg * MT + mt) * 4 + wq;
        if (nt < n16a) f(mt, nt);
    }
}

/* The end of a tile, shared by both kernels. acc: this thread's fp32
 * fragments (warp q of warpgroup wg holds n16 tile nt0 + (wg MT + mt) 4 + q,
 * tokens tok0 + 8 j + 2 c, + 1); tid in 0..255 (the MMA threads). */
template <int MT, int BN, class A>
static __device__ __forceinline__ void gk_store(const A &a, float (&acc)[MT][BN / 2], int nt0, int tok0,
                                                int wg, int wq, int r, int c) {
    g_warp_tiles<MT>(a.n16a, nt0, wg, wq, [&](int mt, int nt) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
            w4_epilogue(a, nt, r, tok0 + 8 * j + 2 * c, acc[mt][4 * j], acc[mt][4 * j + 1], acc[mt][4 * j + 2],
                        acc[mt][4 * j + 3]);
    });
}

/* stmatrix .x4 .trans: four 8x8 b16 matrices from mma C fragments (register
 * i = matrix i; thread (g, c) holds its row g, columns 2c, 2c + 1), each
 * stored transposed: lane 8 i + k gives the address of row k of matrix i,
 * which receives column k (16 bytes). */
static __device__ __forceinline__ void g_stsm4t(uint32_t addr, const uint32_t v[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]),
                 "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
#else
    (void)addr, (void)v;
#endif
}
/* the first n (< 8) fp16 values of v to dst (register-only indexing) */
static __device__ __forceinline__ void g_store_tail(uint16_t *dst, const uint4 &v, int n) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t w = i < 2 ? v.x : i < 4 ? v.y : i < 6 ? v.z : v.w;
        if (i < n) dst[i] = (uint16_t)(w >> (16 * (i & 1)));
    }
}
static __device__ __forceinline__ uint32_t g_pack_h2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}
/* The tile-end helpers of gk_store_staged and gk_store_tma: the bias of
 * rows r, r + 8 of n16 tile nt; and one stmatrix .x4 worth of fp16 values,
 * rounded as gk_store rounds them: PLAIN token blocks j0, j0 + 1 (matrices
 * rows 0-7, rows 8-15 of each), GATE_UP silu(gate) * up of token blocks
 * j0 .. j0 + 3. */
template <class A>
static __device__ __forceinline__ void g_bias_rows(const A &a, int nt, int r, float &blo, float &bhi) {
    blo = bhi = 0.f;
    if (a.bias) {
        blo = __half2float(__ushort_as_half(a.bias[nt * 16 + r]));
        bhi = __half2float(__ushort_as_half(a.bias[nt * 16 + r + 8]));
    }
}
template <int NA>
static __device__ __forceinline__ void g_pack_plain(const float (&c)[NA], int j0, float blo, float bhi, uint32_t v[4]) {
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int j = j0 + u;
        v[2 * u] = g_pack_h2(c[4 * j] + blo, c[4 * j + 1] + blo);
        v[2 * u + 1] = g_pack_h2(c[4 * j + 2] + bhi, c[4 * j + 3] + bhi);
    }
}
template <int NA>
static __device__ __forceinline__ void g_pack_gate_up(const float (&c)[NA], int j0, float blo, float bhi,
                                                      uint32_t v[4]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int j = j0 + u;
        const float d0 = c[4 * j] + blo, d1 = c[4 * j + 1] + blo;
        const float d2 = c[4 * j + 2] + bhi, d3 = c[4 * j + 3] + bhi;
        v[u] = g_pack_h2(w4_silu_mul(d0, d2), w4_silu_mul(d1, d3));
    }
}

/* The end of a tile through shared memory (the warp-specialized kernel,
 * session 17). gk_store's scattered 2-byte stores (128 per thread and tile
 * at 1 x 256) left the tensor cores idle at every tile's end: at M = 4096
 * q|k|v (H100) mode 4 kept them busy 70% of the time, 85% with no stores
 * at all, and cuBLAS 95%. Here each warp rounds its results to fp16 as
 * gk_store does (bias, then silu(gate) * up, in fp32: bit for bit the same
 * values), transposes 16 tokens (gate|up: 32) at a time with one stmatrix
 * into its own SLICE bytes of shared memory `stg` (after the ring, used by
 * nothing else, so no barrier with the other warpgroup) and writes y in
 * 16-byte pieces: 8 consecutive outputs of one token, one piece per lane
 * and round. Needs ldy % 8 == 0 (the upload's shape rules give it; y is
 * 16-byte aligned); rows past m and columns past n (gate|up: ldy) are not
 * written. */
#define WS_SLICE 512
template <int MT, int BN, class A, int SLICE = WS_SLICE>
static __device__ __forceinline__ void gk_store_staged(const A &a, float (&acc)[MT][BN / 2], unsigned char *stg,
                                                       int nt0, int tok0, int wg, int wq, int lane, int warp) {
    constexpr int RT = SLICE / 32, RG = SLICE / 16; /* tokens per round: plain, gate|up */
    static_assert(RT % 16 == 0 && BN % RG == 0, "gk_store_staged: slice");
    const int r = lane >> 2, mi = lane >> 3, k = lane & 7;
    unsigned char *slice = stg + warp * SLICE;
    const uint32_t sbase = smem_u32(slice);
    const int mrem = a.m - tok0;
    g_warp_tiles<MT>(a.n16a, nt0, wg, wq, [&](int mt, int nt) {
        float blo, bhi;
        g_bias_rows(a, nt, r, blo, bhi);
        if (!a.gate_up) {
            /* token t of a round at t * 32 bytes: rows 0-7, then rows 8-15 */
#pragma unroll
            for (int h = 0; h < BN / RT; h++) {
                __syncwarp(); /* the previous round's reads of the slice are done */
#pragma unroll
                for (int q = 0; q < RT / 16; q++) {
                    uint32_t v[4];
                    g_pack_plain(acc[mt], h * (RT / 8) + 2 * q, blo, bhi, v);
                    g_stsm4t(sbase + (uint32_t)((16 * q + 8 * (mi >> 1) + k) * 32 + (mi & 1) * 16), v);
                }
                __syncwarp();
#pragma unroll
                for (int p = 0; p < RT / 16; p++) {
                    const int piece = lane + 32 * p, m = h * RT + (piece >> 1);
                    const int n0 = nt * 16 + (piece & 1) * 8;
                    const uint4 val = *(const uint4 *)(slice + piece * 16);
                    if (m >= mrem) continue;
                    uint16_t *dst = a.y + (size_t)(tok0 + m) * a.ldy + n0;
                    if (n0 + 8 <= a.n) {
                        *(uint4 *)dst = val;
                    } else {
                        g_store_tail(dst, val, a.n - n0);
                    }
                }
            }
        } else {
            /* gate|up: output column j = 8 nt + r; token t of a round at t * 16 bytes */
#pragma unroll
            for (int h = 0; h < BN / RG; h++) {
                __syncwarp();
#pragma unroll
                for (int q = 0; q < RG / 32; q++) {
                    uint32_t v[4];
                    g_pack_gate_up(acc[mt], h * (RG / 8) + 4 * q, blo, bhi, v);
                    g_stsm4t(sbase + (uint32_t)((32 * q + 8 * mi + k) * 16), v);
                }
                __syncwarp();
#pragma unroll
                for (int p = 0; p < RG / 32; p++) {
                    const int m = h * RG + lane + 32 * p, j0 = nt * 8;
                    const uint4 val = *(const uint4 *)(slice + (lane + 32 * p) * 16);
                    if (m >= mrem) continue;
                    uint16_t *dst = a.y + (size_t)(tok0 + m) * a.ldy + j0;
                    if (j0 + 8 <= a.ldy) {
                        *(uint4 *)dst = val;
                    } else {
                        g_store_tail(dst, val, a.ldy - j0);
                    }
                }
            }
        }
    });
    __syncwarp();
}

/* bulk asynchronous stores (sm_90): shared memory -> a box of a 2-D tensor
 * map, counted in this thread's bulk groups */
static __device__ __forceinline__ void tma_s2g_2d(const void *tmap, int c0, int c1, uint32_t src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(tmap), "r"(c0),
                 "r"(c1), "r"(src)
                 : "memory");
#endif
}
static __device__ __forceinline__ void bulk_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}
/* READ: wait until the groups' shared-memory sources have been read (may be
 * overwritten); else until their writes are done */
template <bool READ>
static __device__ __forceinline__ void bulk_wait0(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (READ) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

/* The end of a tile by bulk asynchronous stores (the warp-specialized
 * kernel at split 1, session 18). gk_store_staged still cost ~5% at large
 * M, likely because its 16-byte stores leave the warp only as fast as the
 * memory system takes them while every block of the persistent grid ends
 * its tile at about the same time (132 x 64 KB at once at 1 x 256; not
 * measured directly). Here each MMA warp writes its whole share of the tile
 * (MT x 16 rows x BN tokens; gate|up: MT x 8 outputs) into its own region
 * of shared memory, token t at t x 32 bytes (gate|up: 16), with the same
 * stmatrix .trans and the same rounding as gk_store_staged, and one lane
 * hands each n16 tile's box to the tensor-memory accelerator
 * (cp.async.bulk.tensor, map `tmy` over y [m][n or ldy], boxes of 16 (8) x
 * BN; rows past m and columns past n are clipped by the map). The warp goes
 * on to its next tile at once; before it writes the region again it waits
 * until the previous boxes have been read out of it. Needs ldy % 8 == 0. */
template <int MT, int BN, class A>
static __device__ __forceinline__ void gk_store_tma(const A &a, float (&acc)[MT][BN / 2], unsigned char *stg,
                                                    int nt0, int tok0, int wg, int wq, int lane, int warp,
                                                    const CUtensorMap *tmy) {
    constexpr int REGION = MT * 16 * BN * 2; /* bytes per warp (gate|up uses half) */
    const int r = lane >> 2, mi = lane >> 3, k = lane & 7;
    const uint32_t rbase = smem_u32(stg) + (uint32_t)(warp * REGION);
    if (lane == 0) bulk_wait0<true>(); /* the previous tile's boxes have left the region */
    __syncwarp();
    g_warp_tiles<MT>(a.n16a, nt0, wg, wq, [&](int mt, int nt) {
        float blo, bhi;
        g_bias_rows(a, nt, r, blo, bhi);
        if (!a.gate_up) {
            const uint32_t mb = rbase + (uint32_t)(mt * 16 * BN * 2);
            /* 16 tokens per stmatrix: matrices (tokens 16 h .. + 7, rows 0-7), (rows 8-15), (tokens + 8 ..) */
#pragma unroll
            for (int h = 0; h < BN / 16; h++) {
                uint32_t v[4];
                g_pack_plain(acc[mt], 2 * h, blo, bhi, v);
                g_stsm4t(mb + (uint32_t)((16 * h + 8 * (mi >> 1) + k) * 32 + (mi & 1) * 16), v);
            }
        } else {
            const uint32_t mb = rbase + (uint32_t)(mt * 8 * BN * 2);
            /* output column 8 nt + r; 32 tokens per stmatrix */
#pragma unroll
            for (int h = 0; h < BN / 32; h++) {
                uint32_t v[4];
                g_pack_gate_up(acc[mt], 4 * h, blo, bhi, v);
                g_stsm4t(mb + (uint32_t)((32 * h + 8 * mi + k) * 16), v);
            }
        }
    });
    g_fence_async(); /* this thread's shared-memory writes -> the bulk copy's reads (async proxy) */
    __syncwarp();
    if (lane == 0) {
        g_warp_tiles<MT>(a.n16a, nt0, wg, wq, [&](int mt, int nt) {
            if (!a.gate_up) tma_s2g_2d(tmy, nt * 16, tok0, rbase + (uint32_t)(mt * 16 * BN * 2));
            else tma_s2g_2d(tmy, nt * 8, tok0, rbase + (uint32_t)(mt * 8 * BN * 2));
        });
        bulk_commit();
    }
}

/* Split-K inside a thread-block cluster (sm_90; cluster = the ksplit blocks
 * of one tile, rank = split): each block parks its partials in its own (now
 * idle) shared memory `red`, and rank rho reduces n8 blocks q with
 * q % ksplit == rho, reading every rank's partials through distributed shared
 * memory in rank order 0..S-1 (the same additions in the same order as the
 * workspace path: bitwise the same result), then runs their epilogue. No
 * workspace, no atomics. The caller makes sure every MMA thread is done with
 * `red` first; both cluster barriers count every thread of the cluster (a
 * thread that does not reduce calls g_cluster_sync() twice). */
template <int MT, int BN, class A>
static __device__ __forceinline__ void gk_cluster_store(const A &a, float (&acc)[MT][BN / 2], float *red, int nt0,
                                                        int tok0, int wg, int wq, int r, int c, int tid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < BN / 2; i++) red[(mt * (BN / 2) + i) * GK_THREADS + tid] = acc[mt][i];
    g_cluster_sync();
    const uint32_t rank = (uint32_t)cl_rank();
    const uint32_t base = smem_u32(red) + (uint32_t)tid * 4;
#pragma unroll
    for (int q = 0; q < MT * BN / 8; q++) {
        if (q % a.ksplit != (int)rank) continue;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        for (int sp = 0; sp < a.ksplit; sp++) {
            uint32_t rb;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                         : "=r"(rb)
                         : "r"(base + (uint32_t)(4 * q * GK_THREADS * 4)), "r"(sp));
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float t;
                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(t) : "r"(rb + (uint32_t)(e * GK_THREADS * 4)) : "memory");
                v[e] += t;
            }
        }
        const int mt = q / (BN / 8), j = q % (BN / 8);
        const int nt = nt0 + (wg * MT + mt) * 4 + wq;
        if (nt < a.n16a) w4_epilogue(a, nt, r, tok0 + 8 * j + 2 * c, v[0], v[1], v[2], v[3]);
    }
    g_cluster_sync(); /* the other ranks' shared memory stays alive until read */
#endif
}

/* A block's accumulators into the workspace at p (per thread, coalesced:
 * [NACC][NC] from p - tid), fenced, the NC consumer threads met at named
 * barrier 1: stream-K's parked pieces (ws_sk_park) and mode 6's partials. */
template <int MT, int BN, int NC>
static __device__ __forceinline__ void gk_park(float *p, const float (&acc)[MT][BN / 2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < BN / 2; i++) __stcg(p + (mt * (BN / 2) + i) * NC, acc[mt][i]);
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
}

/* Mode 6 (session 36): a K split (2..8, one tile per block) reduced by all
 * of its blocks through the workspace, as gk_cluster_store does through
 * distributed shared memory but with any placement: each block parks its
 * partial (per thread, coalesced: [NACC][256] at (tile, split)), raises the
 * tile's counter and waits until all a.ksplit have, then sums the 4-value
 * groups q with q % ksplit == split over the splits in order 0.. (bitwise
 * gk_cluster_store's sums) and stores them. The counter ends each call at
 * zero: a second round of arrivals after the reads, the last resets it. The
 * blocks wait for each other, so the grid (tiles x splits) must be resident
 * at once: the host runs it only where it fits the SMs. */
template <int MT, int BN, int NC, class A>
static __device__ __forceinline__ void gk_dr_store(const A &a, const float (&acc)[MT][BN / 2], int tile, int split,
                                                   int nt0, int tok0, int wg, int wq, int r, int c, int tid) {
    constexpr int NACC = MT * BN / 2; /* NC: the consumer threads (256, or 384 in mode 7) */
    const int ks = a.ksplit;
    const float *base = a.part + (size_t)tile * ks * NACC * NC + tid;
    gk_park<MT, BN, NC>(a.part + ((size_t)tile * ks + split) * NACC * NC + tid, acc);
    int *cnt = a.cnt + tile;
    if (tid == 0) {
        atomicAdd(cnt, 1);
        for (;;) {
            int v;
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(cnt) : "memory");
            if (v >= ks) break;
            __nanosleep(32);
        }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory");
#pragma unroll 1
    for (int q = split; q < MT * BN / 8; q += ks) {
        float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
        for (int sp0 = 0; sp0 < ks; sp0 += 4) { /* 4 splits' loads in flight, added in order */
            float t[4][4];
#pragma unroll
            for (int u = 0; u < 4; u++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    t[u][e] = sp0 + u < ks ? __ldcg(base + ((size_t)(sp0 + u) * NACC + 4 * q + e) * NC) : 0.f;
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (sp0 + u < ks)
#pragma unroll
                    for (int e = 0; e < 4; e++) v[e] += t[u][e];
        }
        const int mt = q / (BN / 8), j = q % (BN / 8);
        const int nt = nt0 + (wg * MT + mt) * 4 + wq;
        if (nt < a.n16a) w4_epilogue(a, nt, r, tok0 + 8 * j + 2 * c, v[0], v[1], v[2], v[3]);
    }
    asm volatile("bar.sync 1, %0;" ::"n"(NC) : "memory"); /* every thread has read the partials */
    if (tid == 0 && atomicAdd(cnt, 1) == 2 * ks - 1) atomicExch(cnt, 0);
}

template <int MT, int BN, int ST, bool WG, bool CL>
static __global__ void __launch_bounds__(GK_THREADS, 1) k_w4gemm(const gk_args a) {
    typedef gk_cfg<MT, BN, ST> C;
    extern __shared__ unsigned char g_smem_raw[];
    __shared__ int s_last;
    const uint32_t sraw = smem_u32(g_smem_raw);
    unsigned char *smem = g_smem_raw + (((sraw + 1023u) & ~1023u) - sraw);
    const uint32_t sbase = smem_u32(smem);

    const int nb = blockIdx.x, mb = blockIdx.y, split = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wg = warp >> 2, wq = warp & 3;
    const int r = lane >> 2, c = lane & 3;
    const int kc0 = split * a.cps, kc1 = min(a.KC, kc0 + a.cps);
    const int nk = kc1 - kc0;
    const int nt0 = nb * C::BT, tok0 = mb * BN;
    const int cpg = a.G / 64, ncb = a.n16a / 8;

    /* weights, scales, zeros of chunk kc into ring slot `slot` (constant data) */
    auto load_w = [&](int slot, int kc) {
        const uint32_t st = sbase + slot * C::STAGE;
        for (int i = tid; i < C::BT * 32; i += GK_THREADS) {
            const int nt = nt0 + (i >> 5), cb = nt >> 3;
            const bool ok = cb < ncb;
            const uint4 *src = a.qw + (((size_t)(ok ? cb : 0) * a.KC + kc) * 8 + (nt & 7)) * 32 + (i & 31);
            g_cp16(st + C::X_BYTES + i * 16, src, ok ? 16 : 0);
        }
        const int g = kc / cpg;
        for (int i = tid; i < 2 * C::BT; i += GK_THREADS) {
            const int nt = nt0 + (i >> 1);
            const bool ok = nt < a.n16a;
            const unsigned char *src =
                (const unsigned char *)(a.sc + ((size_t)g * a.n16a + (ok ? nt : 0)) * 8) + (i & 1) * 16;
            g_cp16(st + C::X_BYTES + C::W_BYTES + i * 16, src, ok ? 16 : 0);
        }
        for (int i = tid; i < C::BT / 2; i += GK_THREADS) {
            const int nt = nt0 + 2 * i;
            const bool ok = nt < a.n16a;
            const unsigned char *src = a.zr + ((size_t)g * a.n16a + (ok ? nt : 0)) * 8;
            g_cp16(st + C::X_BYTES + C::W_BYTES + C::S_BYTES + i * 16, src, ok ? 16 : 0);
        }
    };
    /* x rows [tok0, tok0 + BN) of chunk kc, permuted + swizzled (header comment) */
    /* Warp w copies rows w, w + 8, ...: row & 7 == w, so the destination is
     * one per-thread offset + 1 KB per row step, the source one per-thread
     * pointer + 8 rows per step (rows >= M: zero-filled from a valid dummy). */
    const int dw = ((lane >> 1) & 3) * 8 + (lane & 1) * 4 + (lane >> 3); /* destination word */
    const uint32_t xdst0 = warp * 128 + (((dw >> 2) ^ warp) << 4) + (dw & 3) * 4;
    const int xrows = min(BN, a.m - tok0); /* valid rows of this block */
    const uint16_t *xsrc0 = a.x + (size_t)(tok0 + (warp < xrows ? warp : 0)) * a.K + 2 * lane;
    const size_t xstep = (size_t)8 * a.K;
    auto load_x = [&](int slot, int kc) {
        const uint32_t dst = sbase + slot * C::STAGE + xdst0;
        const uint16_t *src = xsrc0 + kc * 64;
        if (xrows >= BN) {
#pragma unroll
            for (int i = 0; i < BN / 8; i++) g_cp4(dst + i * 1024, src + i * xstep, 4);
        } else {
#pragma unroll
            for (int i = 0; i < BN / 8; i++) {
                const bool ok = warp + 8 * i < xrows;
                g_cp4(dst + i * 1024, ok ? src + i * xstep : a.x, ok ? 4 : 0);
            }
        }
    };

    /* prologue: constant data before the programmatic-launch wait, x after;
     * one group for all prologue stages + empty groups keep the count */
    for (int s = 0; s < ST - 2; s++)
        if (s < nk) load_w(s, kc0 + s);
    pdl_wait();
    for (int s = 0; s < ST - 2; s++)
        if (s < nk && !(a.dbg & 2)) load_x(s, kc0 + s);
    cp_async_commit();
    for (int s = 1; s < ST - 2; s++) cp_async_commit();

    float acc[MT][BN / 2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[mt][i] = 0.f;

    for (int it = 0; it < nk; it++) {
        cp_async_wait<ST - 3>(); /* this thread's copies of chunk it have landed */
        if (!(a.dbg & 8)) g_fence_async();
        __syncthreads(); /* everyone's copies visible; slot (it - 2) % ST no longer read */
        if (it + ST - 2 < nk) {
            load_w((it + ST - 2) % ST, kc0 + it + ST - 2);
            if (!(a.dbg & 2)) load_x((it + ST - 2) % ST, kc0 + it + ST - 2);
        }
        cp_async_commit();
        if (a.dbg & 1) continue;

        const int slot = it % ST;
        const unsigned char *stp = smem + slot * C::STAGE;
        const uint4 *sw = (const uint4 *)(stp + C::X_BYTES);
        const uint32_t *ss = (const uint32_t *)(stp + C::X_BYTES + C::W_BYTES);
        const uint8_t *sz = stp + C::X_BYTES + C::W_BYTES + C::S_BYTES;
        uint4 wv[MT];
        g_deq dq[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int T = (wg * MT + mt) * 4 + wq;
            wv[mt] = sw[T * 32 + lane];
            dq[mt] = g_deq_make(ss[T * 8 + r], sz[T * 8 + r]);
        }
        const uint32_t xb = sbase + slot * C::STAGE;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) g_deq_word((&wv[mt].x)[t], dq[mt], af[mt]);
            if (WG) {
                wg_fence();
                const uint64_t desc = wg_desc(xb + t * 32);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    wgmma_tile<BN>(acc[mt], af[mt], desc);
                }
                wg_commit();
                wg_wait<1>();
            } else {
                /* ldmatrix x4: matrices (tokens 8j.., unit 2t), (8j.., 2t+1),
                 * (8j+8.., 2t), (8j+8.., 2t+1) = b0, b1 of n8 blocks j, j+1 */
                const int mi = lane >> 3, rr = lane & 7;
                const int u = 2 * t + (mi & 1);
#pragma unroll
                for (int j = 0; j < BN / 8; j += 2) {
                    const int row = 8 * j + (mi >> 1) * 8 + rr;
                    uint32_t b[4];
                    g_ldsm4(b, xb + row * 128 + ((u ^ (row & 7)) << 4));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816(&acc[mt][4 * j], af[mt], b[0], b[1]);
                        mma16816(&acc[mt][4 * j + 4], af[mt], b[2], b[3]);
                    }
                }
            }
        }
    }
    if (WG) wg_wait<0>();
#if !WG_ENABLED
    if (WG) __trap(); /* never launched: w4a16_gemm_available() is 0 without sm_90a code */
#endif
    cp_async_wait<0>();
    pdl_launch();

    if (CL) { /* split-K reduced inside the cluster (gk_cluster_store) */
        __syncthreads(); /* every warp is done with the ring */
        gk_cluster_store<MT, BN>(a, acc, (float *)smem, nt0, tok0, wg, wq, r, c, tid);
        return;
    }
    if (a.ksplit > 1) {
        /* deterministic split-K: partials to the workspace, the last block of
         * the tile adds them in split order */
        const int tile = mb * gridDim.x + nb;
        float *mine = a.part + ((size_t)tile * a.ksplit + split) * C::NACC * GK_THREADS;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) __stcg(mine + (mt * (BN / 2) + i) * GK_THREADS + tid, acc[mt][i]);
        __threadfence();
        __syncthreads();
        if (tid == 0) {
            int old = atomicAdd(a.cnt + tile, 1);
            s_last = old == a.ksplit - 1;
            if (s_last) a.cnt[tile] = 0;
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[mt][i] = 0.f;
        for (int sp = 0; sp < a.ksplit; sp++) {
            const float *p = a.part + ((size_t)tile * a.ksplit + sp) * C::NACC * GK_THREADS;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int i = 0; i < BN / 2; i++) acc[mt][i] += __ldcg(p + (mt * (BN / 2) + i) * GK_THREADS + tid);
        }
    }
    gk_store<MT, BN>(a, acc, nt0, tok0, wg, wq, r, c);
}

/* ------------------------------------------------------------------------ */
/* The warp-specialized kernel (mode 3, session 13)                          */
/* ------------------------------------------------------------------------ */
/*
 * Same tiles, shared-memory stage layout, dequantization, wgmma operands and
 * epilogue as k_w4gemm above, with the roles split:
 *
 *   warpgroups 0, 1 (consumers): warpgroup g owns MT m64 tiles of the block's
 *       128 MT weight rows (warp q the n16 tiles (g MT + mt) 4 + q), exactly as
 *       in k_w4gemm. Per chunk: wait for the stage's "full" barrier, proxy
 *       fence, read the INT4 words and the scales/zeros from the stage,
 *       dequantize all 4 k16 steps into one half of a double-buffered set of
 *       A registers, issue the 4 x MT wgmma as one group, wait until at most
 *       one group is pending: chunk i - 1's group has then completed, and
 *       each warp arrives on that stage's "empty" barrier (8 arrivals free
 *       it). Chunk i + 1 is dequantized while chunk i's MMA runs.
 *   warpgroup 2 (producer, registers lowered with setmaxnreg): fills the ST
 *       ring: waits on a stage's "empty" barrier, issues the cp.async copies
 *       of the chunk (INT4 tile, scales, zeros as 16-byte copies; x as 4-byte
 *       copies into the permuted, swizzled rows), then
 *       cp.async.mbarrier.arrive.noinc on the stage's "full" barrier (128
 *       arrivals, each fires when that thread's copies have landed). It never
 *       waits for its own copies, so up to ST chunks are in flight.
 *
 * No block-wide barrier in the main loop. The grid is persistent (one block
 * per SM, tiles blockIdx.x, + gridDim.x, ...; column tile fastest), so the
 * producer runs ahead into the next tile while the consumers store the
 * previous one, each MMA warp through its own shared memory after the ring:
 * mode 4 (TS) its whole share of the tile, handed to the TMA as bulk stores
 * (gk_store_tma, ws_bulk_store says where), else a 512-byte slice and
 * 16-byte stores (gk_store_staged). A K split (2..8) is reduced inside a
 * thread-block cluster as in k_w4gemm (one tile per block then). PDL: the INT4 tiles, scales and
 * zeros of the first ring are requested before griddepcontrol.wait, x after.
 */
#define WS_THREADS 384
/* dynamic shared memory: the ring (+ alignment slack) and one staging slice
 * per MMA warp (gk_store_staged) */
#define WS_SMEM(MT, BN, ST) (gk_cfg<MT, BN, ST>::SMEM + 8 * WS_SLICE)
/* with the bulk-store tile end: a region of a warp's whole share of the tile per MMA warp */
#define WS_SMEM_TS(MT, BN, ST) (gk_cfg<MT, BN, ST>::SMEM + 8 * (MT * 16 * BN * 2))
/* Registers per thread: 168 at launch (65536 / 384, rounded down to 8); the
 * producer gives back (168 - 40) x 128 and the consumers take exactly that,
 * (232 - 168) x 256. setmaxnreg.inc waits until the registers are free, so a
 * consumer count the producer's release does not cover would hang. */
#define WS_REGS_LAUNCH 168
#define WS_REGS_PRODUCER 40
#define WS_REGS_CONSUMER 232
static_assert((WS_REGS_LAUNCH - WS_REGS_PRODUCER) * 128 >= (WS_REGS_CONSUMER - WS_REGS_LAUNCH) * 256,
              "the consumers' registers must come from the producer's");
/* Mode 7 (three consumer warpgroups, 512 threads): 128 at launch, the
 * producer down to 56, the consumers up to 152: (128 - 56) x 128 = (152 -
 * 128) x 384 */
#define WS3_REGS_LAUNCH 128
#define WS3_REGS_PRODUCER 56
#define WS3_REGS_CONSUMER 152
static_assert((WS3_REGS_LAUNCH - WS3_REGS_PRODUCER) * 128 >= (WS3_REGS_CONSUMER - WS3_REGS_LAUNCH) * 384,
              "mode 7: the consumers' registers must come from the producer's");

/* mbarriers beyond w4a16_common.cuh's (the kernel runs only where WG_ENABLED; empty elsewhere) */
/* arrives on bar when every cp.async this thread issued before has landed */
static __device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
#if WG_ENABLED
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
#endif
}
/* one box of a 2-D tensor map (coordinates innermost first) into shared memory */
static __device__ __forceinline__ void tma_g2s_2d(uint32_t dst, const void *tmap, int c0, int c1, uint32_t bar) {
#if WG_ENABLED
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"(tmap), "r"(c0), "r"(c1), "r"(bar) : "memory");
#endif
}

/* Mode 4 (and 6, 7): lane (r, c)'s weight words of one n16 tile in natural
 * k order. The repacked word t of lane (r, c) holds k = 16c + 4t + j
 * (w4a16.cu "Device weight layout"); x arrives by TMA in natural order, so
 * lane c's word t must hold k = 16t + 2c + {0, 1, 8, 9} as j = 0..3 in the
 * same nibble order (byte 0 j = 0, byte 1 j = 2, byte 2 j = 1, byte 3 j =
 * 3): 2 bytes of word c / 2 and 2 of word c / 2 + 2 of quad lane t (bytes
 * 0, 2 for even c, 1, 3 for odd c). The rows (r, r + 8) do not move. The
 * producer stores lane (r, t)'s 16 bytes of an n16 tile at 16-byte slot
 * t ^ (r >> 1) of the quad's 64, and lane (r, c) loads the two words it
 * takes from each quad lane t (words c / 2 and c / 2 + 2, 8 bytes apart)
 * itself: g[2 t], g[2 t + 1], which one prmt (0x6240 for even c, 0x7351
 * for odd) makes natural word t. Until sessions 37-38 each lane read its own
 * 16 bytes and a 4 x 4 transpose across the quad (4 prmt, 4 shuffles, 12
 * selects) delivered them (g_quad_natural). The slot
 * swizzle puts the 16 words a load of a warp reads in 16 banks (bank
 * 16 (r & 1) + 4 ((r >> 1) ^ t) + c / 2 (+ 2)), so 8 conflict-free 4-byte
 * loads replace one 16-byte load, 4 shuffles and 12 selects (session 37:
 * the consumers were ALU-bound, docs/PERFORMANCE.md). */
/* lane (r, c)'s first word in its n16 tile's 512 bytes (slot t: ^ (t << 4)) */
static __device__ __forceinline__ uint32_t g_quad_lane(int r, int c) {
    return (uint32_t)(r * 64 + ((r >> 1) << 4) + (c >> 1) * 4);
}
/* one word / byte at a 32-bit shared address, after the stage's full wait
 * (volatile, with a memory clobber: not hoisted above it): the gathered
 * weight words, a stage's scales and zeros */
static __device__ __forceinline__ uint32_t g_lds32(uint32_t at) {
    uint32_t v;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(at) : "memory");
    return v;
}
static __device__ __forceinline__ void g_lds128(uint32_t at, uint32_t v[4]) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "r"(at) : "memory");
}
static __device__ __forceinline__ uint32_t g_lds8(uint32_t at) {
    uint32_t v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(at) : "memory");
    return v;
}
/* a0: the tile's 512-aligned shared address + g_quad_lane(r, c) */
static __device__ __forceinline__ void g_quad_gather(uint32_t a0, uint32_t g[8]) {
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const uint32_t at = a0 ^ (uint32_t)(t << 4);
        g[2 * t] = g_lds32(at);
        g[2 * t + 1] = g_lds32(at + 8);
    }
}
/* the next stage of a ring of ST stages: its slot, and the phase that
 * flips at each wrap (k_w4gemm_ws where ST is not a power of two) */
template <int ST>
static __device__ __forceinline__ void ring_next(unsigned &slot, unsigned &phase) {
    slot = slot + 1 == ST ? 0 : slot + 1;
    phase ^= slot == 0;
}
/* v in a register from here on: ptxas cannot recompute an asm's result */
static __device__ __forceinline__ uint32_t g_keep(uint32_t v) {
    asm volatile("" : "+r"(v));
    return v;
}
/* g_quad_gather's 8 words -> lane (r, c)'s 4 natural-k words, one prmt each;
 * sel: g_quad_sel(c) */
static __device__ __forceinline__ uint32_t g_quad_sel(int c) { return (c & 1) ? 0x7351u : 0x6240u; }
static __device__ __forceinline__ void g_quad_words(const uint32_t g[8], uint32_t sel, uint32_t nw[4]) {
#pragma unroll
    for (int t = 0; t < 4; t++) nw[t] = __byte_perm(g[2 * t], g[2 * t + 1], sel);
}

/* A block's work in k_w4gemm_ws, one piece at a time (kernels/cuda/gemm_sk.h,
 * whose invariants tests/test_gemm_sk.c checks on the CPU): tile `tile`, chunks
 * [kb, ke) of it. First whole tiles blockIdx.x, + gridDim.x, ... below
 * a.skD (all tiles without stream-K: a.skT == 0); then stream-K over the
 * rest: its a.skT chunk steps (tile-major) cut into gridDim.x contiguous,
 * equal shares, block b taking steps [b T / G, (b + 1) T / G) of it, cut
 * again at tile boundaries. The host leaves the last full wave and the
 * ragged one to stream-K (so the shares are 1-2 tiles long and the blocks
 * at work at any time touch neighbouring tiles, as whole-tile waves do:
 * stream-K over all of a 4-wave grid read x and the weights from DRAM
 * again, 2x slower). A tile cut between blocks has one head (the piece with
 * chunk 0, the last piece of its block), which adds the other pieces (each
 * the first stream-K piece of a later block, parked in the workspace) in
 * block order and stores the tile: every tile's sum has a fixed order
 * (deterministic), and a block parks at most one piece. */
typedef struct sk_work ws_work; /* kernels/cuda/gemm_sk.h */
static __device__ __forceinline__ int ws_share(int b, const gk_args &a, int nk) {
    return sk_share(b, gridDim.x, a.skD, a.skT, nk);
}
static __device__ __forceinline__ void ws_work_init(ws_work &w, const gk_args &a, int nk) {
    /* sk_work_init's three assignments, written out: through the call ptxas
     * orders the block's first instructions differently (session 19 kept the
     * binary the GPU tests ran, byte for byte) */
    w.d = blockIdx.x;
    w.i = a.skT ? ws_share(blockIdx.x, a, nk) : 0;
    w.i1 = a.skT ? ws_share(blockIdx.x + 1, a, nk) : 0;
}
static __device__ __forceinline__ bool ws_work_next(ws_work &w, const gk_args &a, int nk) {
    return sk_work_next(&w, gridDim.x, a.skD, nk);
}

/* Stream-K pieces (ws_work). A piece that is not its tile's head parks its
 * accumulators in the block's slot of the workspace (per thread, coalesced:
 * [NACC][256]) and raises the block's flag (a.cnt[block], zero between
 * calls) after a release fence; the 256 consumer threads meet at named
 * barrier 1 in between. */
template <int MT, int BN>
static __device__ __forceinline__ void ws_sk_park(const gk_args &a, const float (&acc)[MT][BN / 2], int tid) {
    gk_park<MT, BN, GK_THREADS>(a.part + (size_t)blockIdx.x * (MT * BN / 2) * GK_THREADS + tid, acc);
    if (tid == 0) asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(a.cnt + blockIdx.x), "r"(1) : "memory");
}

/* The head of a cut tile: waits for the flags of the later blocks holding
 * the rest of the tile (blocks b + 1, ... whose shares begin before the
 * tile's end), adds their parked pieces in block order and lowers the flags.
 * Every block of the grid is resident (one per SM, grid = the device's SMs;
 * the host runs no stream-K where the context may use fewer: ws_ctx_sms),
 * and the pieces it waits for are the first stream-K work of their blocks. */
template <int MT, int BN>
static __device__ __forceinline__ void ws_sk_gather(const gk_args &a, float (&acc)[MT][BN / 2], int tile, int nk,
                                                    int tid) {
    const int end = (tile + 1) * nk;
    for (int b = blockIdx.x + 1; b < (int)gridDim.x && ws_share(b, a, nk) < end; b++) {
        if (tid == 0) {
            unsigned v = 0;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(a.cnt + b) : "memory");
                if (v) break;
                __nanosleep(64);
            }
            a.cnt[b] = 0;
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const float *p = a.part + (size_t)b * (MT * BN / 2) * GK_THREADS + tid;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[mt][i] += __ldcg(p + (mt * (BN / 2) + i) * GK_THREADS);
    }
}

template <bool INC, int N>
static __device__ __forceinline__ void ws_setmaxnreg(void) {
#if WG_ENABLED
    if (INC) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}

template <int MT, int BN, int ST, bool CL, bool NAT, bool TS = false, bool PIPE = false, bool DR = false,
          int NWG = 2, bool XP = false>
static __global__ void __launch_bounds__(128 * (NWG + 1), 1)
k_w4gemm_ws(const gk_args a, const __grid_constant__ CUtensorMap tmx, const __grid_constant__ CUtensorMap tmy) {
    /* NWG = 3 (mode 7, session 36; picked since session 37): three consumer
     * warpgroups of one m64 tile each, 192 weight rows a block; only with
     * the pipelined loop and mode 6's split */
    static_assert(NWG == 2 || (NWG == 3 && MT == 1 && (BN == 64 || BN == 96 || BN == 128) && NAT && PIPE && DR && !CL && !TS),
                  "k_w4gemm_ws: three consumer warpgroups only as mode 7");
    /* XP (session 51): x by TMA from a copy permuted within each 64-deep
     * chunk (k_xperm) into the repacked words' k order, so the weight words
     * are read as they are stored (one 16-byte load a tile, no gathers) */
    static_assert(!XP || NAT, "k_w4gemm_ws: XP only with x by TMA");
    constexpr bool GW = NAT && !XP; /* the weight words gathered in natural k order */
    typedef gk_cfg<MT, BN, ST, NWG> C;
    constexpr int NCW = 4 * NWG; /* consumer warps */
    /* NAT: the weight words by g_quad_gather instead of the quad exchange
     * (H200, back to back, against it): mode 6 0.96-0.975x at 2 x 64
     * (session 37), mode 4's plain loop (M > 64) 0.88-0.975x at M =
     * 128-2048, mode 4's pipelined loop and mode 7 0.95-1.0x (session 38).
     * GE: mode 6 gathers chunk i + 1's words with its scales and zeros before
     * chunk i's group; the other pipelined loops gather each chunk's words
     * right before its dequantization (holding 8 gathered words a tile
     * through the group made them 1.02-1.03x slower, session 37). */
    constexpr bool GE = PIPE && DR && NWG == 2 && !XP;
    constexpr bool XE = PIPE && DR && NWG == 2 && XP; /* mode 6 with XP: chunk i + 1's words early, as GE */
    /* A ring of ST stages where ST is not a power of two (5 at 1 x 256
     * without the bulk stores, 7 at 2 x 128): the slot and phase of a chunk
     * are kept running instead of computed as it % ST and it / ST (a
     * multiply-high sequence on the consumers' path every chunk). H200, back
     * to back, against the division (session 40): geometric mean 0.989 over
     * the 56 points of --set all at M = 256 / 512. Mode 3 (not NAT) keeps
     * the division (its 2 x 128 spilled with the counters). */
    constexpr bool POW2 = (ST & (ST - 1)) == 0 || !NAT;
    static_assert(POW2 || !PIPE, "k_w4gemm_ws: the pipelined loop counts stages by division");
    extern __shared__ unsigned char g_smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST]; /* full[ST], empty[ST] */
    const uint32_t sraw = smem_u32(g_smem_raw);
    unsigned char *smem = g_smem_raw + (((sraw + 1023u) & ~1023u) - sraw);
    const uint32_t sbase = smem_u32(smem);
    const uint32_t full0 = smem_u32(bars), empty0 = full0 + 8 * ST;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int split = blockIdx.z;
    const int kc0 = split * a.cps, nk = min(a.KC, kc0 + a.cps) - kc0;
    const int cpg = a.G / 64, ncb = a.n16a / 8;

    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(full0 + 8 * s, NAT ? 129 : 128); /* NAT: + the x box's expect_tx */
            mbar_init(empty0 + 8 * s, NCW);
        }
    }
    /* stamps (thread 0: consumer warpgroup 0): 1 its first stage full, 2
     * the first tile's MMA done, 3 ready to store (stream-K: its pieces
     * gathered), 4 stored (split in a cluster: reduced and stored), 5 the
     * last tile's MMA done, 6 the end */
    ST_DECL;
    ST_BEGIN(ST_KEY(NAT ? 4 : 3, a.K, a.n));
    __syncthreads();

    if (warp >= NCW) {
        /* ---------------- producer warpgroup ---------------- */
        ws_setmaxnreg<false, NWG == 2 ? WS_REGS_PRODUCER : WS3_REGS_PRODUCER>();
        const int pt = tid - 32 * NCW, pw = warp - NCW;
        int it = 0;
        unsigned ps = 0, pph = 0; /* !POW2: the slot and phase of chunk it */
        bool waited = false;
        ws_work w;
        ws_work_init(w, a, nk);
        /* x: warp pw copies the rows n with n & 7 in {2 pw, 2 pw + 1}; lane
         * copies source word `lane` of each row (k = 2 lane, 2 lane + 1) to
         * its permuted, swizzled word (header of k_w4gemm) */
        const int dw = ((lane >> 1) & 3) * 8 + (lane & 1) * 4 + (lane >> 3);
        /* NAT: lane (r, t)'s 16 weight bytes of a tile at (r, t ^ (r >> 1))
         * (g_quad_gather); else in lane order */
        const int wl = lane ^ ((lane >> 3) & 3);
        const uint32_t xo0 = (2 * pw) * 128 + (((dw >> 2) ^ (2 * pw)) << 4) + (dw & 3) * 4;
        const uint32_t xo1 = (2 * pw + 1) * 128 + (((dw >> 2) ^ (2 * pw + 1)) << 4) + (dw & 3) * 4;
        const uint32_t kc256 = (uint32_t)a.KC * 256u; /* a column block's 16-byte units */
        while (ws_work_next(w, a, nk)) {
            const int tile = w.tile;
            const int nb = tile % a.ntn, mb = tile / a.ntn;
            const int nt0 = nb * C::BT, tok0 = mb * BN;
            const int xrows = min(BN, a.m - tok0);
            /* the block's first n16 tile: column block cb0, half h0 of it
             * (mode 7's 12 tiles may start in the second half) */
            const int cb0 = nt0 >> 3, h0 = C::BT % 8 ? (nt0 >> 2) & 1 : 0;
            /* row 2 pw of the tile, word `lane`; rows advance by K halves */
            const uint16_t *xrow = a.x + (size_t)(tok0 + 2 * pw) * a.K + 2 * lane;
            /* running, one division a piece (register-lean: the producer
             * has 40 registers; 32-bit offsets, rolled x loop): the
             * lane's weight offset of column block cb0 at the next chunk
             * (16-byte units), that chunk's group offset g n16a and its
             * chunk within the group */
            const int kcs = kc0 + w.kb;
            uint32_t wo = ((uint32_t)cb0 * (uint32_t)a.KC + (uint32_t)kcs) * 256u + (uint32_t)pw * 32u +
                          (uint32_t)lane;
            uint32_t go = (uint32_t)(kcs / cpg) * (uint32_t)a.n16a;
            int gin = kcs % cpg;
            /* the next chunk's weights, scales and zeros into stage st */
            auto load_w = [&](uint32_t st) {
                if (!(a.dbg & 32)) {
#pragma unroll
                    for (int j = 0; j < C::BT / 4; j++) {
                        /* n16 tile nt0 + pw + 4 j: column block cb0 + (h0 + j) / 2, tile pw + 4 ((h0 + j) & 1) in it */
                        const int q = h0 + j;
                        const bool ok = cb0 + (q >> 1) < ncb;
                        const uint32_t off = wo + (uint32_t)(q >> 1) * kc256 + (uint32_t)(q & 1) * 128u;
                        g_cp16(st + C::X_BYTES + (GW ? 128 * j + 32 * pw + wl : pt + 128 * j) * 16,
                               a.qw + (ok ? off : 0u), ok ? 16 : 0);
                    }
                    if (pt < 2 * C::BT) {
                        const bool ok = nt0 + (pt >> 1) < a.n16a;
                        const uint32_t off = (go + (uint32_t)nt0) * 32u + (uint32_t)pt * 16u;
                        g_cp16(st + C::X_BYTES + C::W_BYTES + pt * 16,
                               (const unsigned char *)a.sc + (ok ? off : 0u), ok ? 16 : 0);
                    }
                    if (pt < C::BT / 2) {
                        const bool ok = nt0 + 2 * pt < a.n16a;
                        const uint32_t off = (go + (uint32_t)nt0) * 8u + (uint32_t)pt * 16u;
                        g_cp16(st + C::X_BYTES + C::W_BYTES + C::S_BYTES + pt * 16, a.zr + (ok ? off : 0u),
                               ok ? 16 : 0);
                    }
                }
                wo += 256u;
                if (++gin == cpg) gin = 0, go += (uint32_t)a.n16a;
            };
            auto load_x = [&](uint32_t st, int kc, uint32_t bar) {
                if (NAT) { /* one box of BN tokens x 64 k; rows past m read as zeros */
                    if (pt == 0) {
                        if (a.dbg & 2) {
                            mbar_arrive(bar);
                        } else {
                            mbar_expect_tx(bar, BN * 128);
                            tma_g2s_2d(st, &tmx, kc * 64, tok0, bar);
                        }
                    }
                    return;
                }
                const uint16_t *src = xrow + kc * 64;
                const size_t k8 = (size_t)8 * a.K;
                if (xrows >= BN) {
#pragma unroll 2
                    for (int i = 0; i < BN / 8; i++, src += k8) {
                        g_cp4(st + i * 1024 + xo0, src, 4);
                        g_cp4(st + i * 1024 + xo1, src + a.K, 4);
                    }
                } else {
#pragma unroll 1
                    for (int i = 0; i < BN / 8; i++, src += k8) {
                        const int n = 8 * i + 2 * pw;
                        g_cp4(st + i * 1024 + xo0, n < xrows ? src : a.x, n < xrows ? 4 : 0);
                        g_cp4(st + i * 1024 + xo1, n + 1 < xrows ? src + a.K : a.x, n + 1 < xrows ? 4 : 0);
                    }
                }
            };
            int k0 = w.kb;
            if (!waited) {
                /* first piece: constant data of the first ring before the wait */
                const int n0 = min(ST, w.ke - w.kb);
                for (int s = 0; s < n0; s++) load_w(sbase + s * C::STAGE);
                pdl_wait();
                waited = true;
                for (int s = 0; s < n0; s++) {
                    if (NAT || !(a.dbg & 2)) load_x(sbase + s * C::STAGE, kc0 + w.kb + s, full0 + 8 * s);
                    mbar_arrive_cp_async(full0 + 8 * s);
                }
                k0 = w.kb + n0;
                it = n0;
                ps = n0 == ST ? 0 : n0, pph = n0 == ST;
            }
#pragma unroll 1
            for (int kk = k0; kk < w.ke; kk++, it++) {
                const int slot = POW2 ? it % ST : (int)ps;
                mbar_wait(empty0 + 8 * slot, (POW2 ? (it / ST) & 1 : pph) ^ 1);
                if (!POW2) ring_next<ST>(ps, pph);
                load_w(sbase + slot * C::STAGE);
                if (NAT || !(a.dbg & 2)) load_x(sbase + slot * C::STAGE, kc0 + kk, full0 + 8 * slot);
                mbar_arrive_cp_async(full0 + 8 * slot);
            }
        }
        if (!waited) pdl_wait();
        if (CL) { /* the cluster barriers count every thread of the cluster */
            g_cluster_sync();
            g_cluster_sync();
        }
        return;
    }

    /* ---------------- consumer warpgroups ---------------- */
    ws_setmaxnreg<true, NWG == 2 ? WS_REGS_CONSUMER : WS3_REGS_CONSUMER>();
    const int wg = warp >> 2, wq = warp & 3;
    const int r = lane >> 2, c = lane & 3;
    /* the ring's and barriers' shared addresses held in registers (ptxas
     * recomputed them from SR_CgaCtaId every chunk) */
    const uint32_t sb = g_keep(sbase), f0 = g_keep(full0), e0 = f0 + 8 * ST;
    float acc[MT][BN / 2];
    /* chunk counter, unsigned (never negative): a stage's slot and phase
     * without the signed division's corrections */
    unsigned it = 0;
    /* !POW2 (the plain loop only): chunk it's slot and phase, and the
     * previous chunk's slot */
    unsigned cs = 0, cph = 0, cprev = ST - 1;
    /* A registers and wgmma groups.
     *   MT = 1: one group per chunk, A double-buffered by chunk parity, at
     *     most one group pending while the next chunk is dequantized.
     *   MT = 2: one group per (chunk, tile), A of one chunk (one buffer per
     *     tile), one group pending while the other tile is dequantized. With
     *     both tiles in one group and A of two chunks alive (64 registers
     *     next to 128 accumulators at BN = 128) ptxas ran out of registers
     *     and serialized the wgmma (C7512). Measured on an H100 (session 14):
     *     the same speed as that at M = 1024-4096; two groups pending with A
     *     of two chunks at BN = 64 was no faster at M = 64. */
    constexpr int NB = MT == 1 ? 2 : 1;
    uint32_t cf[NB][4][MT][4];
    ws_work w;
    ws_work_init(w, a, nk);
    /* the lane's shared offsets from a stage's start, tile mt = 0 (tile mt:
     * n16 tile T0 + 4 mt): its gathered weight words (NAT), scales, zeros */
    const int T0 = wg * MT * 4 + wq;
    const uint32_t ow = g_keep(C::X_BYTES + T0 * 512 + (GW ? g_quad_lane(r, c) : (uint32_t)lane * 16u));
    const uint32_t os = g_keep(C::X_BYTES + C::W_BYTES + (T0 * 8 + r) * 4);
    const uint32_t oz = g_keep(C::X_BYTES + C::W_BYTES + C::S_BYTES + T0 * 8 + r);
    const uint32_t gsel = XP ? 0u : g_keep(g_quad_sel(c));
    /* chunk kk into buffer B (compile-time register indices): dequantize,
     * issue, wait until one group is pending, free the previous
     * chunk's stage once its last group has completed. Measured against one
     * group per k16 step (A of two steps alive): 2-13% faster at M >= 1024
     * (H200, docs/PERFORMANCE.md session 13). No runtime branch around the wgmma: with one,
     * ptxas closes the group inside it and commit_group opens an empty one,
     * and wait_group 1 then waits for this chunk's MMA (seen in the SASS of
     * an experiment: a dummy HGMMA.64x8x16 + DEPBAR after every group). */
    auto chunk = [&](auto bufc, int kk) {
        constexpr int B = decltype(bufc)::value < NB ? decltype(bufc)::value : 0;
        const unsigned slot = POW2 ? it % ST : cs;
        mbar_wait(f0 + 8 * slot, POW2 ? (it / ST) & 1 : cph);
        if (it == 0) ST_MARK(1);
        /* mode 3: x by cp.async (generic proxy) -> wgmma's reads (async
         * proxy). NAT: x by TMA (async proxy), the weights read by ld.shared:
         * no fence (as in the pipelined loop) */
        if constexpr (!NAT) g_fence_async();
        const uint32_t xb = sb + slot * C::STAGE;
        auto deq = [&](auto mtc) {
            constexpr int mt = decltype(mtc)::value;
            uint32_t nw[4];
            if constexpr (GW) {
                uint32_t g[8];
                g_quad_gather(xb + ow + mt * 2048, g);
                g_quad_words(g, gsel, nw);
            } else {
                const uint4 wv = ((const uint4 *)(smem + slot * C::STAGE + C::X_BYTES))[(T0 + 4 * mt) * 32 + lane];
                nw[0] = wv.x, nw[1] = wv.y, nw[2] = wv.z, nw[3] = wv.w;
            }
            const g_deq dq = g_deq_make(g_lds32(xb + os + mt * 128), g_lds8(xb + oz + mt * 32));
#pragma unroll
            for (int t = 0; t < 4; t++) g_deq_word(nw[t], dq, cf[B][t][mt]);
        };
        const uint64_t d0 = wg_desc(xb);
        auto issue = [&](auto mtc) {
            constexpr int mt = decltype(mtc)::value;
#pragma unroll
            for (int t = 0; t < 4; t++) wgmma_tile<BN>(acc[mt], cf[B][t][mt], wg_desc_add(d0, 2 * t));
        };
        if constexpr (MT == 1) {
            deq(std::integral_constant<int, 0>());
            wg_fence();
            issue(std::integral_constant<int, 0>());
            wg_commit();
            wg_wait<1>();
            if (kk > w.kb && lane == 0) mbar_arrive(e0 + 8 * (POW2 ? (it - 1) % ST : cprev));
        } else {
            deq(std::integral_constant<int, 0>());
            wg_fence();
            issue(std::integral_constant<int, 0>());
            wg_commit();
            wg_wait<1>(); /* (kk - 1, 1) has completed: the previous stage is free */
            if (kk > w.kb && lane == 0) mbar_arrive(e0 + 8 * (POW2 ? (it - 1) % ST : cprev));
            deq(std::integral_constant<int, 1>());
            wg_fence();
            issue(std::integral_constant<int, 1>());
            wg_commit();
            wg_wait<1>(); /* (kk, 0) has completed */
        }
        it++;
        if (!POW2) {
            cprev = cs;
            ring_next<ST>(cs, cph);
        }
    };
    if (a.dbg & 64) { /* timing experiment: the consumers only pass the stages on */
        unsigned total = 0;
        for (ws_work t = w; ws_work_next(t, a, nk);) total += t.ke - t.kb;
        for (; it < total; it++) {
            mbar_wait(f0 + 8 * (it % ST), (it / ST) & 1);
            if (lane == 0) mbar_arrive(e0 + 8 * (it % ST));
        }
        return;
    }
    /* PIPE (mode 4 at M <= 64, session 36): a warp issues nothing past its
     * own in-flight register-A wgmma group until the group has read its A
     * registers (measured on the H200 with .device/wgbench.cu: work placed
     * after a group never overlaps it, at any wait depth; only the other
     * warpgroup's MMA covers it). So the work between two groups must be
     * short: the shared-memory loads of chunk i + 1 (scales, zeros and, in
     * mode 6, its gathered weight words: GE; its "full" wait) are issued
     * before chunk i's dequantization and MMA, and their latency passes
     * under chunk i's group. No proxy fence: x arrives by TMA (async proxy) and is read by
     * wgmma (async proxy) through the mbarrier; the weights are read by
     * ld.shared. The wgmma sequence of a tile is the plain loop's: results
     * are bit for bit the same. */
    struct pipe_raw {
        uint32_t g[MT][GE ? 8 : XE ? 4 : 1]; /* g_quad_gather's words (GE), the stored words (XE) */
        uint32_t s2[MT], z[MT];
    };
    uint32_t pa[PIPE ? 2 : 1][4][MT][4];
    auto pipe_fetch = [&](pipe_raw &rw, unsigned itn) {
        const unsigned slot = itn % ST;
        mbar_wait(f0 + 8 * slot, (itn / ST) & 1);
        const uint32_t st = sb + slot * C::STAGE;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if constexpr (GE) g_quad_gather(st + ow + mt * 2048, rw.g[mt]);
            if constexpr (XE) g_lds128(st + ow + mt * 2048, rw.g[mt]);
            rw.s2[mt] = g_lds32(st + os + mt * 128);
            rw.z[mt] = g_lds8(st + oz + mt * 32);
        }
    };
    /* chunk it (fetched into rw) into A buffer B, its group issued; frees
     * the previous chunk's stage once that group has completed */
    auto pipe_step = [&](auto bufc, const pipe_raw &rw, unsigned itc, bool free_prev) {
        constexpr int B = decltype(bufc)::value < (PIPE ? 2 : 1) ? decltype(bufc)::value : 0;
        const uint32_t xb = sb + (itc % ST) * C::STAGE;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t nw[4];
            if constexpr (GE) {
                g_quad_words(rw.g[mt], gsel, nw);
            } else if constexpr (XE) {
#pragma unroll
                for (int t = 0; t < 4; t++) nw[t] = rw.g[mt][t];
            } else if constexpr (XP) { /* the lane's own 16 bytes, as stored */
                g_lds128(xb + ow + mt * 2048, nw);
            } else {
                uint32_t g[8];
                g_quad_gather(xb + ow + mt * 2048, g);
                g_quad_words(g, gsel, nw);
            }
            const g_deq dq = g_deq_make(rw.s2[mt], rw.z[mt]);
#pragma unroll
            for (int t = 0; t < 4; t++) g_deq_word(nw[t], dq, pa[B][t][mt]);
        }
        const uint64_t d0 = wg_desc(xb);
        wg_fence();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int t = 0; t < 4; t++) wgmma_tile<BN>(acc[mt], pa[B][t][mt], wg_desc_add(d0, 2 * t));
        wg_commit();
        wg_wait<1>();
        if (free_prev && lane == 0) mbar_arrive(e0 + 8 * ((itc - 1) % ST));
    };
    int tiles_done = 0;
    while (ws_work_next(w, a, nk)) {
        const int tile = w.tile;
        const int nb = tile % a.ntn, mb = tile / a.ntn;
        const int nt0 = nb * C::BT, tok0 = mb * BN;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[mt][i] = 0.f;
        if constexpr (PIPE) { /* chunk i + 1 fetched before chunk i's group */
            const int n = w.ke - w.kb;
            const unsigned it0 = it;
            pipe_raw r0, r1;
            if (n > 0) {
                pipe_fetch(r0, it0);
                if (it0 == 0) ST_MARK(1);
            }
            int i = 0;
            for (; i + 1 < n; i += 2) {
                pipe_fetch(r1, it0 + i + 1);
                pipe_step(std::integral_constant<int, 0>(), r0, it0 + i, i > 0);
                if (i + 2 < n) pipe_fetch(r0, it0 + i + 2);
                pipe_step(std::integral_constant<int, 1>(), r1, it0 + i + 1, true);
            }
            if (i < n) pipe_step(std::integral_constant<int, 0>(), r0, it0 + i, i > 0);
            it = it0 + n;
        } else {
            int kk = w.kb; /* the buffers alternate: two chunks per turn */
            for (; kk + 1 < w.ke; kk += 2) {
                chunk(std::integral_constant<int, 0>(), kk);
                chunk(std::integral_constant<int, 1>(), kk + 1);
            }
            if (kk < w.ke) chunk(std::integral_constant<int, 0>(), kk);
        }
        wg_wait<0>();
        ST_MARK(tiles_done == 0 ? 2 : 5);
#if !WG_ENABLED
        __trap(); /* never launched: w4a16_gemm_available() is 0 without sm_90a code */
#endif
        if (w.ke > w.kb && lane == 0) mbar_arrive(e0 + 8 * (POW2 ? (it - 1) % ST : cprev));
        if (!CL && w.kb > 0) { /* stream-K: not the tile's head */
            ws_sk_park<MT, BN>(a, acc, tid);
            continue;
        }
        if (!CL && w.ke < nk) ws_sk_gather<MT, BN>(a, acc, tile, nk, tid); /* stream-K: the head of a cut tile */
        if (tiles_done == 0) ST_MARK(3);
        if (CL) {
            /* the producer takes part in both cluster barriers */
            asm volatile("bar.sync 1, 256;" ::: "memory"); /* every consumer is done with the ring */
            gk_cluster_store<MT, BN>(a, acc, (float *)smem, nt0, tok0, wg, wq, r, c, tid);
        } else if (DR) { /* modes 6, 7: the split reduced by all its blocks */
            gk_dr_store<MT, BN, 32 * NCW>(a, acc, tile, split, nt0, tok0, wg, wq, r, c, tid);
        } else {
            if (a.dbg & 256) { /* timing experiment: no tile-end stores */
            } else if (TS && (a.ldy & 7) == 0) /* always, with the upload's shape rules */
                gk_store_tma<MT, BN>(a, acc, smem + ST * C::STAGE, nt0, tok0, wg, wq, lane, warp, &tmy);
            else if ((a.ldy & 7) == 0)
                gk_store_staged<MT, BN>(a, acc, smem + ST * C::STAGE, nt0, tok0, wg, wq, lane, warp);
            else
                gk_store<MT, BN>(a, acc, nt0, tok0, wg, wq, r, c);
        }
        if (tiles_done++ == 0) ST_MARK(4);
    }
    if (TS && lane == 0) bulk_wait0<false>(); /* the last tile's boxes are written */
    ST_MARK(6);
    pdl_launch();
}

/* ------------------------------------------------------------------------ */
/* Mode 5: the weights dequantized into shared memory (session 15)           */
/* ------------------------------------------------------------------------ */
/*
 * Mode 4 with the dequantization moved off the MMA warps. Same tiles, stage
 * ring (x tile, INT4 tile, scales, zeros per 64-deep chunk), persistent grid,
 * cluster split-K and epilogue; the roles:
 *
 *   warp 8, lane 0 (copies): the INT4 tile (4 KB per 8 n16 tiles,
 *       contiguous), scales and zeros as cp.async.bulk, x as one TMA box,
 *       all completing on the stage's "raw" barrier; it refills a stage as
 *       soon as the MMA of its last chunk is done (its "empty" barrier), so
 *       ST - 1 chunks are in flight. W, scales and zeros of the first ring
 *       are requested before the PDL wait, x after.
 *   warps 9-11 (dequantizers): per chunk, wait for an A buffer (its "A
 *       empty" barrier: the MMA of the chunk NA before is done) and the
 *       stage, dequantize the INT4 tile into one of NA fp16 A buffers in the
 *       canonical K-major 128-byte-swizzle layout (row R = 16 T + r of n16
 *       tile T at R * 128 bytes, 16-byte unit u at u ^ (R & 7)), fence the
 *       generic writes to the async proxy and arrive on the buffer's "A
 *       full" barrier. A lane's repacked uint4 holds rows r and r + 8 at
 *       k = 16 c .. 16 c + 15 (w4a16.cu "Device weight layout"), so it
 *       becomes four 16-byte stores (units 2c, 2c + 1 of both rows; no bank
 *       conflicts, no transpose). Warp d takes the n16 tiles d, d + 3, ...
 *   warpgroups 0, 1 (MMA): per chunk, wait for the A buffer and the stage,
 *       issue 4 x MT wgmma with both operands in shared memory as one group,
 *       wait until one group is pending, and free the previous chunk's A
 *       buffer and stage (8 arrivals each). No registers for A.
 *
 * The fp16 products and their order are those of mode 4 (natural k order,
 * the same k16 steps), so its results are bit for bit mode 4's (tested).
 * Measured slower than mode 4 (H100, session 15, docs/PERFORMANCE.md): the
 * MMA + copies alone (AWQD_W4A16_GEMM_DBG=1024) already take mode 4's whole
 * time, and three warps do not hide the dequantization. Not in the
 * automatic choice; AWQD_W4A16_GEMM_SS=1 or a forced mode 5 runs it.
 */
#define SS_THREADS 384

/* fp16 A buffers (one per chunk in flight between the dequantizers and the
 * MMA) after the ST-stage ring */
template <int MT, int BN, int ST, int NA>
struct ss_cfg {
    typedef gk_cfg<MT, BN, ST> G;
    static constexpr int A_BYTES = G::BT * 16 * 128;
    static constexpr int SMEM = G::STAGE * ST + A_BYTES * NA + 1024;
};

static __device__ __forceinline__ void mbar_expect_tx_noarrive(uint32_t bar, uint32_t bytes) {
#if WG_ENABLED
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
static __device__ __forceinline__ void sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}

template <int MT, int BN, int ST, int NA, bool CL>
static __global__ void __launch_bounds__(SS_THREADS, 1)
k_w4gemm_ss(const gk_args a, const __grid_constant__ CUtensorMap tmx) {
    typedef gk_cfg<MT, BN, ST> C;
    typedef ss_cfg<MT, BN, ST, NA> S;
    static_assert(ST > NA, "k_w4gemm_ss: the ring must be deeper than the A buffers");
    extern __shared__ unsigned char g_smem_raw[];
    __shared__ __align__(8) uint64_t bars[2 * ST + 2 * NA]; /* raw[ST], empty[ST], afull[NA], aempty[NA] */
    const uint32_t sraw = smem_u32(g_smem_raw);
    unsigned char *smem = g_smem_raw + (((sraw + 1023u) & ~1023u) - sraw);
    const uint32_t sbase = smem_u32(smem), abase = sbase + ST * C::STAGE;
    const uint32_t raw0 = smem_u32(bars), empty0 = raw0 + 8 * ST, afull0 = empty0 + 8 * ST,
                   aempty0 = afull0 + 8 * NA;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int split = blockIdx.z;
    const int kc0 = split * a.cps, nk = min(a.KC, kc0 + a.cps) - kc0;
    const int cpg = a.G / 64, ncb = a.n16a / 8;
    const int mytiles = (a.ntiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int total = mytiles * nk; /* chunks this block runs */

    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(raw0 + 8 * s, 1);
            mbar_init(empty0 + 8 * s, 8);
        }
        for (int b = 0; b < NA; b++) {
            mbar_init(afull0 + 8 * b, 3);
            mbar_init(aempty0 + 8 * b, 8);
        }
#if WG_ENABLED
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* the inits -> the copy engine */
#endif
    }
    __syncthreads();

    if (warp == 8) {
        /* ---------------- copy issuer (one lane) ---------------- */
        if (lane == 0) {
            /* chunk j of this block -> its stage: INT4 tile, scales, zeros
             * (part 1) and/or the x box (part 2); arrive: this is the
             * barrier's one arrival */
            auto issue = [&](int j, int part, bool arrive) {
                const int tile = (int)blockIdx.x + (j / nk) * (int)gridDim.x, kc = kc0 + j % nk;
                const int nb = tile % a.ntn, mb = tile / a.ntn;
                const int slot = j % ST;
                const uint32_t st = sbase + slot * C::STAGE, bar = raw0 + 8 * slot;
                const int cb0 = nb * MT, ncbk = min(MT, ncb - cb0); /* column blocks of 8 n16 tiles in range */
                uint32_t bytes = 0;
                if (part & 1) bytes += ncbk * (4096u + 256u + 64u);
                if (part & 2) bytes += BN * 128u;
                if (arrive) mbar_expect_tx(bar, bytes);
                else mbar_expect_tx_noarrive(bar, bytes);
                if (part & 1) {
                    const uint32_t g = (uint32_t)(kc / cpg);
                    for (int q = 0; q < ncbk; q++)
                        bulk_g2s(st + C::X_BYTES + q * 4096, a.qw + ((size_t)(cb0 + q) * a.KC + kc) * 256, 4096u,
                                 bar);
                    const size_t so = (size_t)g * a.n16a + (size_t)cb0 * 8;
                    bulk_g2s(st + C::X_BYTES + C::W_BYTES, a.sc + so * 8, ncbk * 256u, bar);
                    bulk_g2s(st + C::X_BYTES + C::W_BYTES + C::S_BYTES, a.zr + so * 8, ncbk * 64u, bar);
                }
                if (part & 2) tma_g2s_2d(st, &tmx, kc * 64, mb * BN, bar);
            };
            /* the first ring: constant data before the PDL wait, x after */
            const int n0 = min(ST, total);
            for (int j = 0; j < n0; j++) issue(j, 1, false);
            pdl_wait();
            for (int j = 0; j < n0; j++) issue(j, 2, true);
            /* then each stage as soon as the MMA of its last chunk is done */
#pragma unroll 1
            for (int j = ST; j < total; j++) {
                mbar_wait(empty0 + 8 * (j % ST), ((j / ST) & 1) ^ 1);
                issue(j, 3, true);
            }
        }
        __syncwarp();
        if (CL) { /* the cluster barriers count every thread of the cluster */
            g_cluster_sync();
            g_cluster_sync();
        }
        return;
    }
    if (warp > 8) {
        /* ---------------- dequantizers (warps 9-11) ---------------- */
        const int dw = warp - 9, r = lane >> 2, c = lane & 3;
        constexpr int TPW = (C::BT + 2) / 3; /* n16 tiles per warp and chunk (at most) */
#pragma unroll 1
        for (int i = 0; i < total; i++) {
            const int b = i % NA, slot = i % ST;
            if (i >= NA) mbar_wait(aempty0 + 8 * b, ((i / NA) & 1) ^ 1); /* chunk i - NA's MMA is done */
            mbar_wait(raw0 + 8 * slot, (i / ST) & 1);
            if (!(a.dbg & 1024)) { /* timing switch 1024: no dequantization (A is stale) */
                const unsigned char *stp = smem + slot * C::STAGE;
                const uint4 *sw = (const uint4 *)(stp + C::X_BYTES);
                const uint32_t *ss = (const uint32_t *)(stp + C::X_BYTES + C::W_BYTES);
                const uint8_t *sz = stp + C::X_BYTES + C::W_BYTES + C::S_BYTES;
                const uint32_t ab = abase + b * S::A_BYTES;
                uint4 wv[TPW];
                uint32_t s2[TPW], z2[TPW];
#pragma unroll
                for (int j = 0; j < TPW; j++) { /* loads first */
                    const int T = dw + 3 * j;
                    if (T >= C::BT) break;
                    wv[j] = sw[T * 32 + lane];
                    s2[j] = ss[T * 8 + r];
                    z2[j] = sz[T * 8 + r];
                }
#pragma unroll
                for (int j = 0; j < TPW; j++) {
                    const int T = dw + 3 * j;
                    if (T >= C::BT) break;
                    const g_deq dq = g_deq_make(s2[j], z2[j]);
                    uint32_t f[4][4];
#pragma unroll
                    for (int t = 0; t < 4; t++) g_deq_word((&wv[j].x)[t], dq, f[t]);
                    const uint32_t row = ab + (16 * T + r) * 128;
                    const uint32_t u0 = (uint32_t)(((2 * c) ^ r) << 4), u1 = (uint32_t)(((2 * c + 1) ^ r) << 4);
                    sts128(row + u0, f[0][0], f[0][2], f[1][0], f[1][2]);
                    sts128(row + u1, f[2][0], f[2][2], f[3][0], f[3][2]);
                    sts128(row + 8 * 128 + u0, f[0][1], f[0][3], f[1][1], f[1][3]);
                    sts128(row + 8 * 128 + u1, f[2][1], f[2][3], f[3][1], f[3][3]);
                }
                g_fence_async(); /* these generic writes -> the wgmma's reads (async proxy) */
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(afull0 + 8 * b);
        }
        if (CL) {
            g_cluster_sync();
            g_cluster_sync();
        }
        return;
    }

    /* ---------------- MMA warpgroups ---------------- */
    const int wg = warp >> 2, wq = warp & 3;
    const int r = lane >> 2, c = lane & 3;
    float acc[MT][BN / 2];
    int it = 0;
    for (int tile = blockIdx.x; tile < a.ntiles; tile += gridDim.x) {
        const int nb = tile % a.ntn, mb = tile / a.ntn;
        const int nt0 = nb * C::BT, tok0 = mb * BN;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 2; i++) acc[mt][i] = 0.f;
#pragma unroll 1
        for (int kk = 0; kk < nk; kk++, it++) {
            const int b = it % NA, slot = it % ST;
            mbar_wait(afull0 + 8 * b, (it / NA) & 1);
            mbar_wait(raw0 + 8 * slot, (it / ST) & 1); /* x landed (the dequantizers saw it too) */
            const uint32_t xb = sbase + slot * C::STAGE, ab = abase + b * S::A_BYTES;
            wg_fence();
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int t = 0; t < 4; t++)
                    wgmma_ss_tile<BN>(acc[mt], wg_desc(ab + (wg * MT + mt) * 8192 + t * 32), wg_desc(xb + t * 32));
            wg_commit();
            wg_wait<1>(); /* chunk it - 1's MMA is done: free its A buffer and stage */
            if (kk > 0 && lane == 0) {
                mbar_arrive(aempty0 + 8 * ((it - 1) % NA));
                mbar_arrive(empty0 + 8 * ((it - 1) % ST));
            }
        }
        wg_wait<0>();
        if (nk > 0 && lane == 0) {
            mbar_arrive(aempty0 + 8 * ((it - 1) % NA));
            mbar_arrive(empty0 + 8 * ((it - 1) % ST));
        }
#if !WG_ENABLED
        __trap(); /* never launched: w4a16_gemm_available() is 0 without sm_90a code */
#endif
        if (CL) {
            asm volatile("bar.sync 1, 256;" ::: "memory"); /* every MMA warp is done with the ring */
            gk_cluster_store<MT, BN>(a, acc, (float *)smem, nt0, tok0, wg, wq, r, c, tid);
        } else {
            gk_store<MT, BN>(a, acc, nt0, tok0, wg, wq, r, c);
        }
    }
    pdl_launch();
}


/* ------------------------------------------------------------------------ */
/* Host: configurations, choice, launch                                      */
/* ------------------------------------------------------------------------ */

/* Ring depth per tile shape (fits 227 KB of shared memory, one block per SM). */
#define GK_ST_1_64 8
#define GK_ST_2_64 8
#define GK_ST_1_96 8
#define GK_ST_1_128 8
#define GK_ST_2_128 7
#define GK_ST_1_256 5 /* modes 3 and 4 (6 before session 17; 5 leaves room for the staging slices; 4 with the
                               bulk stores: GK_TS_ST_1_256) */

#define GK_KSPLIT_MAX 16
#define GK_CLUSTER_MAX 8

struct gk_choice {
    int mt, bn, ks, mode;
    int sk; /* mode 4 at split 1: stream-K (ws_work; needs ws_sk_bytes of workspace) */
};

static std::atomic<int> g_force_set{-1}; /* -1: env not read yet, 0: auto, 1: forced */
static gk_choice g_force = {0, 0, 0, 0, 0};

/* tiles of every mode; 1 x 256 (m64n256 wgmma) in modes 3, 4 and 5 only;
 * 1 x 96 (m64n96) in modes 3, 4, 6 and 7 */
static int cfg_valid(int mt, int bn, int mode) {
    return ((mt == 1 || mt == 2) && (bn == 64 || bn == 128)) || (mt == 1 && bn == 256 && mode >= 3) ||
           (mt == 1 && bn == 96 && mode >= 3 && mode != 5);
}

extern "C" int w4a16_gemm_config(int mt, int bn, int ksplit, int mode) {
    if (mt == 0) {
        g_force_set.store(0);
        return 0;
    }
    if (ksplit == 0 && mode != 4) return -EINVAL; /* stream-K: mode 4 only */
    if (mode >= 6 && (bn == 256 || (bn != 64 && mt != 1) || ksplit < 2 || ksplit > GK_DR_MAX_SPLIT || (mode == 7 && mt != 1))) return -EINVAL;
    if (!cfg_valid(mt, bn, mode) || ksplit < 0 || ksplit > 64 || mode < 0 || mode > 7) return -EINVAL;
    if (mode >= 3 && ksplit > GK_CLUSTER_MAX) return -EINVAL; /* its split is reduced in a cluster only */
    g_force.mt = mt;
    g_force.bn = bn;
    g_force.ks = ksplit > 0 ? ksplit : 1;
    g_force.mode = mode;
    g_force.sk = ksplit == 0;
    g_force_set.store(1);
    return 0;
}

static int forced(gk_choice *out) {
    int v = g_force_set.load();
    if (v < 0) {
        const char *e = getenv("AWQD_W4A16_GEMM_CFG");
        int mt = 0, bn = 0, ks = 1, mode = 0;
        if (e && sscanf(e, "%d,%d,%d,%d", &mt, &bn, &ks, &mode) >= 2 && w4a16_gemm_config(mt, bn, ks, mode) == 0)
            v = 1;
        else {
            g_force_set.store(0);
            v = 0;
        }
    }
    if (v == 1) *out = g_force;
    return v == 1;
}

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static int tiles_of(const struct w4a16_gemm_args *a, int mt, int bn) {
    return cdiv(a->n16, 8 * mt) * cdiv(a->m, bn);
}

/* Stream-K (mode 4, split 1): one block per SM; whole-tile waves but the
 * last full one, stream-K over that and the ragged wave (ws_work), at least
 * 2 chunk steps per block; the workspace holds one parked piece per block. */
static int sk_grid(const struct w4a16_gemm_args *a) { return a->sms > 0 ? a->sms : 1; }
static int sk_whole(const struct w4a16_gemm_args *a, int mt, int bn) {
    return sk_whole_tiles(tiles_of(a, mt, bn), sk_grid(a));
}
/* x must fit well inside L2: a stream-K block reads its tiles' x at its own
 * chunk step, not in step with the blocks of the same token tile, so where x
 * comes from DRAM it is read once per column tile (H100, session 19: Qwen3-32B
 * down at M = 1024, x 52 MB, 682 us against 490 for dequantize + cuBLAS;
 * Qwen3-8B down at M = 4096, x 100 MB, 667 against 585 with whole tiles). */
/* A driver function through the runtime's driver entry point (no -lcuda),
 * looked up once (fn, tried: the caller's statics); NULL where unavailable. */
static void *ws_driver_fn(const char *name, int version, std::atomic<void *> &fn, std::atomic<int> &tried) {
    void *f = fn.load();
    if (!f && !tried.load()) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        cudaGetLastError();
        fn.store(f);
        tried.store(1);
    }
    return f;
}

/* SMs the current context may use, per device, cached (cuCtxGetExecAffinity:
 * fewer than the device has under MPS with an active-thread percentage
 * below 100); 0 where unknown. Stream-K's head blocks wait for later blocks
 * of its one-per-SM grid, so it needs them all resident at once. */
static int ws_ctx_sms(void) {
    static std::atomic<int> cache[16]; /* 0: not asked yet, -1: unknown */
    static std::atomic<void *> fn{nullptr};
    static std::atomic<int> tried{0};
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) {
        cudaGetLastError();
        return 0;
    }
    int v = cache[dev].load();
    if (v) return v > 0 ? v : 0;
    void *f = ws_driver_fn("cuCtxGetExecAffinity", 11040, fn, tried);
    v = -1;
    CUexecAffinityParam p;
    memset(&p, 0, sizeof p);
    if (f && ((PFN_cuCtxGetExecAffinity_v11040)f)(&p, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS &&
        p.param.smCount.val > 0)
        v = (int)p.param.smCount.val;
    cache[dev].store(v);
    return v > 0 ? v : 0;
}

static int sk_fits(const struct w4a16_gemm_args *a, int mt, int bn) {
    const int lim = ws_ctx_sms();
    return (long long)(tiles_of(a, mt, bn) - sk_whole(a, mt, bn)) * a->kc >= 2ll * sk_grid(a) &&
           a->cnt_len >= sk_grid(a) && (size_t)a->m * a->k * 2 <= W4A16_GEMM_SK_X_MAX_BYTES &&
           !(lim > 0 && lim < sk_grid(a));
}
static size_t ws_sk_bytes(const struct w4a16_gemm_args *a, int mt, int bn) {
    return (size_t)sk_grid(a) * (mt * bn / 2) * GK_THREADS * sizeof(float);
}

/* Modelled time (SM clocks) of one configuration: waves of one block per SM,
 * each chunk costs the larger of its tensor-core time (2048 FMA / clock / SM,
 * 80% reached) and its memory time (INT4 tile from HBM at ~17 B / clock / SM,
 * the x tile from L2 at half that cost), plus a per-chunk and a per-block
 * fixed cost and the split-K round trip. */
static double gk_cost(const struct w4a16_gemm_args *a, int mt, int bn, int ks) {
    const int cps = cdiv(a->kc, ks), kse = cdiv(a->kc, cps);
    const double blocks = (double)tiles_of(a, mt, bn) * kse;
    const int sms = a->sms > 0 ? a->sms : 1;
    const double waves = (double)(long)((blocks + sms - 1) / sms);
    const double tensor = mt * bn * 4.0 / 0.8;
    const double mem = (4096.0 * mt + 0.5 * bn * 128.0) / 17.0;
    const double chunk = (tensor > mem ? tensor : mem) + 120.0;
    double t = waves * (cps * chunk + 2500.0 + mt * bn * 4.0);
    if (kse > 1) t += 3000.0 + blocks * mt * bn * 128.0 * 4.0 / (sms * 30.0);
    return t;
}

static gk_choice gk_choose_cfg(const struct w4a16_gemm_args *a);

/* The automatic choice runs the warp-specialized kernel (mode 3) unless
 * AWQD_W4A16_GEMM_WS=0 (then mode 0, the session-3 kernel). */
static int ws_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_WS");
    return on;
}
/* The automatic choice runs mode 4 (x by TMA in natural k order; H100,
 * session 14: 1.12-1.19x mode 3 at M >= 2048) unless AWQD_W4A16_GEMM_NAT=0
 * (then mode 3). */
static int nat_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_NAT");
    return on;
}

/* Clusters of ks blocks (one block per SM) that can be resident at once on
 * device dev (-1: unknown): cudaOccupancyMaxActiveClusters for mode 4's
 * kernel (the GPCs do not all hold a multiple of ks SMs), cached per device;
 * ~3/4 of SMs / ks where the query fails. */
static int ws_cluster_guess(int ks, int sms) {
    const int n = 3 * sms / 4 / (ks > 1 ? ks : 1);
    return n > 0 ? n : 1;
}
static int ws_cluster_cap(int dev, int ks, int sms) {
    static std::atomic<int> cache[16][GK_CLUSTER_MAX + 1];
    if (ks < 2 || ks > GK_CLUSTER_MAX || dev < 0 || dev >= 16) return ws_cluster_guess(ks, sms);
    int v = cache[dev][ks].load();
    if (v > 0) return v;
    const int smem = WS_SMEM(1, 128, GK_ST_1_128);
    const void *fn = (const void *)k_w4gemm_ws<1, 128, GK_ST_1_128, true, true>;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = dim3(1, 1, ks);
    cfg.blockDim = dim3(WS_THREADS);
    cfg.dynamicSmemBytes = smem;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = ks;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess || n < 1)
        n = ws_cluster_guess(ks, sms);
    cudaGetLastError();
    cache[dev][ks].store(n);
    return n;
}

/* the tile's index in gk_cost4's tables */
static int gk_cost_index(int mt, int bn) {
    return bn == 256 ? 4 : bn == 128 ? 2 + (mt - 1) : bn == 96 ? 5 : mt - 1;
}

/* BN = 96 (wgmma m64n96) at M = 65-96, the 80 and 96 decode buckets, where
 * the 1 x 128 tile computes a quarter or more of zero rows (session 44);
 * AWQD_W4A16_GEMM_BN96=0 leaves them to 1 x 128 / 1 x 64 (read once) */
static int bn96_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_BN96");
    return on;
}

/* Mode 4's modelled time (µs) of tile mt x bn with split ks: launch + rounds
 * x (chunks per block x chunk cost + tile cost) + the cluster reduction. A
 * round is one tile per SM (persistent grid, ks = 1) or one cluster per
 * resident cluster slot (ks > 1, one tile per cluster). The constants were
 * fitted (least squares on relative error) to 3840 timings of every tile and
 * split at M = 96-1024 on 16 Qwen3-8B/32B shapes and shards (H100, session
 * 14, docs/PERFORMANCE.md): the choice is within 5% of the measured best at
 * 123 of the 128 (shape, M) points, at worst 1.27x. */
static double gk_cost4(const struct w4a16_gemm_args *a, int mt, int bn, int ks, const int *caps) {
    /* 1 x 96 (index 5): halfway between 1 x 64 and 1 x 128, not fitted
     * (gk_choose_cfg4 weighs it only at M = 65-96) */
    static const double chunk[6] = {0.391, 0.658, 0.474, 0.908, 0.717, 0.433}; /* 1x64 2x64 1x128 2x128 1x256 1x96 */
    static const double tile[6] = {5.70, 8.16, 7.82, 14.15, 13.44, 6.76};
    static const double red[6] = {2.52, 2.68, 3.83, 8.71, 10.85, 3.18};
    const int ti = gk_cost_index(mt, bn);
    const int sms = a->sms > 0 ? a->sms : 1;
    const int cps = cdiv(a->kc, ks), kse = cdiv(a->kc, cps), tiles = tiles_of(a, mt, bn);
    const int rounds = kse == 1 ? cdiv(tiles, sms) : cdiv(tiles, caps[kse]);
    return 2.84 + rounds * ((kse == 1 ? a->kc : cps) * chunk[ti] + tile[ti]) + (kse > 1 ? red[ti] : 0.0);
}

/* The same for stream-K at split 1: every block runs tiles x KC / SMs chunk
 * steps and ends about tiles / SMs + 1 pieces, one of them parked or
 * gathered; fix: the rest, fitted (gk_cost4's constants kept) to the
 * choice's regret over sweeps of every tile and split at M = 96-1024 on the
 * Qwen3-8B shapes (H100) and M = 128-1024 on the 12 Qwen3-32B shapes and
 * shards (H200), session 19: geometric mean 1.007, worst 1.12 over 104
 * points (docs/PERFORMANCE.md). */
static double gk_cost4_sk(const struct w4a16_gemm_args *a, int mt, int bn) {
    static const double chunk[6] = {0.391, 0.658, 0.474, 0.908, 0.717, 0.433}; /* as gk_cost4 */
    static const double tile[6] = {5.70, 8.16, 7.82, 14.15, 13.44, 6.76};
    static const double fix[6] = {0.0, 0.0, 2.0, -2.0, 0.0, 1.0};
    const int ti = gk_cost_index(mt, bn);
    const double g = sk_grid(a), tiles = tiles_of(a, mt, bn);
    return 2.84 + tiles * a->kc / g * chunk[ti] + (tiles / g + 1.0) * tile[ti] + fix[ti];
}

/* Stream-K in mode 4's automatic choice (default on; AWQD_W4A16_GEMM_SK=0
 * off). A call whose workspace cannot hold the parked pieces runs split 1
 * without it. */
static int sk_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_SK");
    return on;
}
extern "C" int w4a16_gemm_stream_k(void) { return sk_default(); }

static std::atomic<unsigned long> g_sk_launches{0};
static std::atomic<unsigned long> g_dr_launches{0};
extern "C" unsigned long w4a16_gemm_dr_launches(void) { return g_dr_launches.load(std::memory_order_relaxed); }
extern "C" unsigned long w4a16_gemm_sk_launches(void) { return g_sk_launches.load(std::memory_order_relaxed); }

static gk_choice gk_choose_cfg4(const struct w4a16_gemm_args *a) {
    static const int cands[6][2] = {{1, 64}, {2, 64}, {1, 128}, {2, 128}, {1, 256}, {1, 96}};
    const int nc = a->m > 64 && a->m <= 96 && bn96_default() ? 6 : 5;
    gk_choice ch = {1, 64, 1, 4, 0};
    /* the device and its cluster slots once per choice (a host hot path) */
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        dev = -1;
    }
    int caps[GK_CLUSTER_MAX + 1];
    for (int ks = 2; ks <= GK_CLUSTER_MAX; ks++) caps[ks] = ws_cluster_cap(dev, ks, a->sms > 0 ? a->sms : 1);
    double best = 1e30;
    for (int ci = 0; ci < nc; ci++) {
        for (int ks = 1; ks <= GK_CLUSTER_MAX && ks <= a->kc; ks++) {
            if (cdiv(a->kc, cdiv(a->kc, ks)) != ks) continue;
            const double t = gk_cost4(a, cands[ci][0], cands[ci][1], ks, caps);
            if (t < best * 0.999) {
                best = t;
                ch.mt = cands[ci][0];
                ch.bn = cands[ci][1];
                ch.ks = ks;
                ch.sk = 0;
            }
        }
        if (sk_default() && sk_fits(a, cands[ci][0], cands[ci][1])) {
            const double t = gk_cost4_sk(a, cands[ci][0], cands[ci][1]);
            if (t < best * 0.999) {
                best = t;
                ch.mt = cands[ci][0];
                ch.bn = cands[ci][1];
                ch.ks = 1;
                ch.sk = 1;
            }
        }
    }
    return ch;
}

/* AWQD_W4A16_GEMM_SS=1: mode 5 (the weights dequantized into shared memory
 * by the producer warpgroup) where the automatic choice runs mode 4 */
static int ss_default(void) {
    static const int on = getenv("AWQD_W4A16_GEMM_SS") && !strcmp(getenv("AWQD_W4A16_GEMM_SS"), "1");
    return on;
}

extern "C" int w4a16_gemm_auto_mode(void) {
    return ws_default() ? (nat_default() ? (ss_default() ? 5 : 4) : 3) : 0;
}

static gk_choice gk_choose(const struct w4a16_gemm_args *a) {
    gk_choice ch = gk_choose_cfg(a);
    if (a->ksplit > 0) ch.ks = a->ksplit < a->kc ? a->ksplit : a->kc;
    if (ch.ks > 1 || ch.mode != 4) ch.sk = 0;
    return ch;
}

static gk_choice gk_choose_cfg(const struct w4a16_gemm_args *a) {
    gk_choice ch;
    if (forced(&ch)) return ch;
    const int mode = w4a16_gemm_auto_mode();
    if (mode >= 4) {
        ch = gk_choose_cfg4(a);
        ch.mode = mode;
        return ch;
    }
    static const int cands[4][2] = {{1, 64}, {2, 64}, {1, 128}, {2, 128}};
    double best = 1e30;
    ch.mt = 1;
    ch.bn = 64;
    ch.ks = 1;
    ch.mode = mode;
    const int ksmax = ch.mode >= 3 ? GK_CLUSTER_MAX : GK_KSPLIT_MAX;
    for (int ci = 0; ci < 4; ci++) {
        const int mt = cands[ci][0], bn = cands[ci][1];
        const int tiles = tiles_of(a, mt, bn);
        for (int ks = 1; ks <= ksmax && ks <= a->kc / 4 + 1; ks++) {
            if (ks > 1 && tiles > a->cnt_len) break;
            /* mode 3's persistent grid absorbs a ragged last wave: split only
             * when the tiles fill less than half the SMs (H200, session 13:
             * q|k|v M = 1024, 192 tiles of 2x128: split 1 156 us, 2 174 us) */
            if (ks > 1 && ch.mode >= 3 && 2 * tiles >= (a->sms > 0 ? a->sms : 1)) break;
            const int kse = cdiv(a->kc, cdiv(a->kc, ks));
            if (kse != ks) continue;
            const double t = gk_cost(a, mt, bn, ks);
            if (t < best * 0.999) {
                best = t;
                ch.mt = mt;
                ch.bn = bn;
                ch.ks = ks;
            }
        }
    }
    return ch;
}

/* Split-K reduced in a cluster (no workspace): wgmma modes 0, 3 and 4, 2..8
 * splits (modes 3 and 4 never split more). */
static int use_cluster(const gk_choice &ch, int kse) {
    return (ch.mode == 0 || (ch.mode >= 3 && ch.mode <= 5)) && kse > 1 && kse <= GK_CLUSTER_MAX;
}

/* Mode 6 (the split reduced by all its blocks through the workspace,
 * session 36): its partials, and whether a call can run it (the grid of
 * tiles x splits resident at once, a counter per tile, the workspace). */
/* consumer warpgroups of a mode's kernel: 3 in mode 7 (mode 6 with three,
 * tiles of 12 n16 tiles = 192 rows), else 2; a tile is 4 x that x mt n16
 * tiles, the consumers 128 x that threads */
static int gk_nwg(int mode) { return mode == 7 ? 3 : 2; }
static int dr_tiles(const struct w4a16_gemm_args *a, int mt, int bn, int mode) {
    return cdiv(a->n16, 4 * gk_nwg(mode) * mt) * cdiv(a->m, bn);
}
static size_t dr_bytes(const struct w4a16_gemm_args *a, int mt, int bn, int ks, int mode) {
    return (size_t)dr_tiles(a, mt, bn, mode) * ks * (mt * bn / 2) * (128 * gk_nwg(mode)) * sizeof(float);
}
static int dr_fits(const struct w4a16_gemm_args *a, int mt, int bn, int ks, size_t ws_bytes, int mode) {
    const int sms = a->sms > 0 ? a->sms : 1, lim = ws_ctx_sms(), tiles = dr_tiles(a, mt, bn, mode);
    return ks >= 2 && ks <= GK_DR_MAX_SPLIT && cdiv(a->kc, cdiv(a->kc, ks)) == ks && (long long)tiles * ks <= sms &&
           !(lim > 0 && lim < sms) && tiles <= a->cnt_len && dr_bytes(a, mt, bn, ks, mode) <= ws_bytes &&
           (mode == 6 || mt == 1);
}
/* AWQD_W4A16_GEMM_WG3=0: the automatic choice never runs mode 7 (its
 * picks go to mode 6's tiles) */
static int wg3_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_WG3");
    return on;
}
/* AWQD_W4A16_GEMM_DR=0: the automatic choice never runs mode 6 or 7 */
static int dr_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_DR");
    return on;
}
/* Modes 6 / 7 also at M = 65-96 (one token tile of 96) where BN = 96 is
 * on, and at M = 97-128 (one tile of 128), at one m64 tile a warpgroup
 * (session 44, H200, back to back against mode 4, --set all: at 65-96
 * 0.64-0.99x on 81 of 84 points with BN = 96; at 97-128 0.76-1.0x but for
 * Llama-3-70B o tp = 2 (mode 7, 1.07-1.09x), Qwen3-8B batch 112 / 128 -1.5%
 * at context 512). AWQD_W4A16_GEMM_DR96=0 / _DR128=0 leave those M to mode
 * 4 (read once) */
static int dr96_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_DR96");
    return on;
}
static int dr128_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_DR128");
    return on;
}
static int pipe_default(void);
#define GK_PIPE_MAX_M 64
/* The token tile modes 6 / 7 take for m rows (one tile), 0 where they do not run */
static int dr_bn(int m) {
    if (m <= GK_PIPE_MAX_M) return 64;
    if (m <= 96) return bn96_default() && dr96_default() ? 96 : 0;
    return m <= 128 && dr128_default() ? 128 : 0;
}
/* The automatic choice's mode 6 / 7 at one token tile (dr_bn): gk_dr_pick's
 * tile, split and mode (kernels/cuda/gemm_sk.h, checked on the real shapes
 * by tests/test_gemm_sk.c), where this call can run it. */
static int dr_pick(const struct w4a16_gemm_args *a, size_t ws_bytes, gk_choice *out) {
    int mt = 1, mode = 6;
    const int bn = dr_bn(a->m);
    const int ks = gk_dr_pick(a->kc, a->n16, a->sms > 0 ? a->sms : 1, wg3_default(), &mt, &mode);
    /* above 64 tokens only the picks of one m64 tile a warpgroup: 2 x 96 spills
     * (152 bytes of stack) and was 1.03-1.34x mode 4's 1 x 96 at M = 80 on
     * the 11 shapes of --set all that pick it, 1 x 96 0.74-0.94x on 7 of 8
     * (H200, session 44) */
    if (!bn || !ks || (bn > 64 && mt != 1) || !dr_fits(a, mt, bn, ks, ws_bytes, mode)) return 0;
    *out = gk_choice{mt, bn, ks, mode, 0};
    return 1;
}
static int dr_auto(const struct w4a16_gemm_args *a, size_t ws_bytes, gk_choice *out) {
    gk_choice f;
    return !forced(&f) && a->ksplit <= 0 && w4a16_gemm_auto_mode() == 4 && pipe_default() && dr_default() &&
           dr_pick(a, ws_bytes, out);
}

static size_t ws_of(const struct w4a16_gemm_args *a, const gk_choice &ch) {
    if (ch.mode == 6 || ch.mode == 7) return dr_bytes(a, ch.mt, ch.bn, ch.ks, ch.mode);
    if (ch.sk) return sk_fits(a, ch.mt, ch.bn) ? ws_sk_bytes(a, ch.mt, ch.bn) : 0;
    const int kse = cdiv(a->kc, cdiv(a->kc, ch.ks));
    if (kse <= 1 || use_cluster(ch, kse)) return 0;
    return (size_t)tiles_of(a, ch.mt, ch.bn) * kse * (ch.mt * ch.bn / 2) * GK_THREADS * sizeof(float);
}

extern "C" void w4a16_gemm_choice(const struct w4a16_gemm_args *a, int *mt, int *bn, int *ksplit,
                                  int *mode) {
    gk_choice ch = gk_choose(a), d;
    if (dr_auto(a, (size_t)-1, &d)) ch = d; /* where the workspace holds its partials */
    *mt = ch.mt;
    *bn = ch.bn;
    *ksplit = cdiv(a->kc, cdiv(a->kc, ch.ks));
    *mode = ch.mode;
}

static int xp_mode(void);
static size_t xp_bytes(const struct w4a16_gemm_args *a);
static bool xp_path(const struct w4a16_gemm_args *a, const gk_choice &ch);
extern "C" size_t w4a16_gemm_workspace(const struct w4a16_gemm_args *a) {
    gk_choice d;
    const gk_choice c = gk_choose(a);
    const bool dr = dr_auto(a, (size_t)-1, &d);
    const size_t w = ws_of(a, c), wd = dr ? ws_of(a, d) : 0;
    /* XP: x's permuted copy at the end (and its 256-byte alignment) */
    const size_t xb = xp_path(a, dr ? d : c) ? xp_bytes(a) + 256 : 0;
    return (wd > w ? wd : w) + xb;
}

extern "C" size_t w4a16_gemm_sk_workspace(int sms) {
    if (sms < 1 || !sk_default() || !w4a16_gemm_available()) return 0;
    struct w4a16_gemm_args a;
    memset(&a, 0, sizeof a);
    a.sms = sms;
    return ws_sk_bytes(&a, 1, 256); /* the largest tile (2 x 128 parks as much) */
}

/* Probe: its static shared memory is 64 bytes in an sm_90a image (wgmma
 * compiled in) and 32 in any other (an sm_90 build without "a" has no-op
 * stubs). cudaFuncGetAttributes reads that from the image the driver loaded
 * for this device, and is no stream operation (safe during graph capture). */
static __global__ void k_w4gemm_probe(int *out) {
    __shared__ int buf[WG_ENABLED ? 16 : 8];
    buf[threadIdx.x & 7] = (int)threadIdx.x;
    __syncthreads();
    if (out) *out = buf[0];
}

#ifdef AWQD_STAMPS
extern "C" void w4a16_gemm_stamps_dump(void) {
    static const char *const kinds[16] = {"?", "?", "?", "ws (mode 3)", "ws (mode 4)", "?", "?", "?",
                                          "?", "?", "?", "?", "?", "?", "?", "?"};
    st_dump("w4a16_gemm (K x N)", kinds, "0 entry, 1 the first stage full (consumer warpgroup 0), 2 the first tile's MMA done, 3 ready to store (stream-K: gathered), 4 stored (cluster split: reduced and stored), 5 the last tile's MMA done, 6 the end");
}
#endif

extern "C" int w4a16_gemm_available(void) {
    static std::atomic<int> avail{-1};
    int v = avail.load();
    if (v >= 0) return v;
    int dev = 0, major = 0, minor = 0;
    cudaFuncAttributes fa;
    v = 0;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major == 9 && minor == 0 && cudaFuncGetAttributes(&fa, k_w4gemm_probe) == cudaSuccess &&
        fa.sharedSizeBytes == 64)
        v = 1;
    cudaGetLastError();
    avail.store(v);
    return v;
}

/* Launches kernel k (smem bytes of dynamic shared memory, its limit raised
 * once per device through *smem_set) with a cluster of grid.z blocks along z
 * when cl, and programmatic dependent launch when pdl (retried without it
 * where the attribute is refused). */
template <class K, class... Args>
static int gk_launch_ex(K k, std::atomic<unsigned long long> *smem_set, dim3 grid, int threads, int smem, bool cl,
                        int pdl, cudaStream_t s, char *err, size_t errlen, const Args &...args) {
    int rc = cuda_smem_limit_once(smem_set, (const void *)k, smem, err, errlen);
    if (rc) return rc;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[3] = {};
    int na = 0;
    if (cl) { /* required: the kernel reduces inside the cluster */
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 1;
        at[na].val.clusterDim.y = 1;
        at[na].val.clusterDim.z = grid.z;
        na++;
    }
    /* the carveout before PDL: the fallback below drops the last attribute */
    na += cuda_carveout_attr(&at[na], (const void *)k, cfg.gridDim, cfg.blockDim, cfg.dynamicSmemBytes);
    if (pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = at;
    cfg.numAttrs = na;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
    if (e != cudaSuccess && pdl && e != cudaErrorStreamCaptureInvalidated &&
        e != cudaErrorStreamCaptureUnsupported) {
        cudaGetLastError(); /* PDL attribute refused: launch without it */
        cfg.numAttrs = na - 1;
        e = cudaLaunchKernelEx(&cfg, k, args...);
    }
    CUDA_CHECK(e, err, errlen);
    return 0;
}

template <int MT, int BN, int ST, bool WG, bool CL>
static int gk_launch(const gk_args &ka, dim3 grid, int pdl, cudaStream_t s, char *err, size_t errlen) {
    static std::atomic<unsigned long long> smem_set{0};
    return gk_launch_ex(k_w4gemm<MT, BN, ST, WG, CL>, &smem_set, grid, GK_THREADS, gk_cfg<MT, BN, ST>::SMEM, CL,
                        pdl, s, err, errlen, ka);
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda) */
static PFN_cuTensorMapEncodeTiled_v12000 ws_encoder(void) {
    static std::atomic<void *> fn{nullptr};
    static std::atomic<int> tried{0};
    return (PFN_cuTensorMapEncodeTiled_v12000)ws_driver_fn("cuTensorMapEncodeTiled", 12000, fn, tried);
}

/* an fp16 [rows][cols] matrix (row stride ld elements) as a 2-D tensor map
 * with boxes of bc columns x br rows; what = "x" or "y" for the message */
static int ws_map2d(CUtensorMap *tm, const void *p, int rows, int cols, int ld, int bc, int br,
                    CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, const char *what, char *err, size_t errlen) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = ws_encoder();
    if (!enc) return util_err(err, errlen, -ENOTSUP, "w4a16_gemm: cuTensorMapEncodeTiled is not available");
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {(cuuint32_t)bc, (cuuint32_t)br};
    cuuint32_t es[2] = {1, 1};
    CUresult r = enc(tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)p, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, sw, l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return util_err(err, errlen, -EINVAL, "w4a16_gemm: cuTensorMapEncodeTiled failed (%d) for %s %dx%d", (int)r,
                        what, rows, cols);
    return 0;
}

/* x [m][k] fp16 as a 2-D tensor map for mode 4: boxes of 64 k x bn tokens,
 * 128-byte swizzle (the canonical K-major wgmma layout), rows past m read as
 * zeros */
static int ws_xmap(CUtensorMap *tm, const uint16_t *x, int m, int k, int bn, char *err, size_t errlen) {
    return ws_map2d(tm, x, m, k, k, 64, bn, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, "x",
                    err, errlen);
}

/* y [m][ldy] fp16 as a 2-D tensor map for gk_store_tma: columns = n (PLAIN)
 * or ldy (GATE_UP), boxes of one n16 tile's outputs (16 or 8) x bn tokens,
 * no swizzle; rows and columns past the ends are not written */
static int ws_ymap(CUtensorMap *tm, uint16_t *y, int m, int cols, int ldy, int boxc, int bn, char *err,
                   size_t errlen) {
    return ws_map2d(tm, y, m, cols, ldy, boxc, bn, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, "y",
                    err, errlen);
}

template <int MT, int BN, int ST, bool CL, bool NAT, bool TS = false, bool PIPE = false, bool DR = false,
          int NWG = 2, bool XP = false>
static int ws_launch(const gk_args &ka, dim3 grid, int pdl, cudaStream_t s, char *err, size_t errlen) {
    static std::atomic<unsigned long long> smem_set{0};
    CUtensorMap tm, tmy;
    memset(&tm, 0, sizeof tm);
    memset(&tmy, 0, sizeof tmy);
    if (NAT) {
        const int rc = ws_xmap(&tm, ka.x, ka.m, ka.K, BN, err, errlen);
        if (rc) return rc;
    }
    if (TS && ka.ldy % 8 == 0) {
        const int rc = ka.gate_up ? ws_ymap(&tmy, ka.y, ka.m, ka.ldy, ka.ldy, 8, BN, err, errlen)
                                  : ws_ymap(&tmy, ka.y, ka.m, ka.n, ka.ldy, 16, BN, err, errlen);
        if (rc) return rc;
    }
    if (NWG == 3) /* mode 7: no staging slices (its tiles end in gk_dr_store) */
        return gk_launch_ex(k_w4gemm_ws<MT, BN, ST, CL, NAT, TS, PIPE, DR, NWG, XP>, &smem_set, grid, 512,
                            gk_cfg<MT, BN, ST, NWG>::SMEM, CL, pdl, s, err, errlen, ka, tm, tmy);
    return gk_launch_ex(k_w4gemm_ws<MT, BN, ST, CL, NAT, TS, PIPE, DR, NWG, XP>, &smem_set, grid, WS_THREADS,
                        TS ? WS_SMEM_TS(MT, BN, ST) : WS_SMEM(MT, BN, ST), CL, pdl, s, err, errlen, ka, tm, tmy);
}

/* mode 5: ring depth and fp16 A buffers per tile (fits 227 KB) */
#define SS_ST_1_64 8
#define SS_NA_1_64 4
#define SS_ST_2_64 7
#define SS_NA_2_64 3
#define SS_ST_1_128 7
#define SS_NA_1_128 3
#define SS_ST_2_128 6
#define SS_NA_2_128 2
#define SS_ST_1_256 5
#define SS_NA_1_256 2

template <int MT, int BN, int ST, int NA, bool CL>
static int ss_launch(const gk_args &ka, dim3 grid, int pdl, cudaStream_t s, char *err, size_t errlen) {
    static std::atomic<unsigned long long> smem_set{0};
    CUtensorMap tm;
    memset(&tm, 0, sizeof tm);
    const int rc = ws_xmap(&tm, ka.x, ka.m, ka.K, BN, err, errlen);
    if (rc) return rc;
    return gk_launch_ex(k_w4gemm_ss<MT, BN, ST, NA, CL>, &smem_set, grid, SS_THREADS, ss_cfg<MT, BN, ST, NA>::SMEM,
                        CL, pdl, s, err, errlen, ka, tm);
}

template <bool CL>
static int ss_dispatch(const gk_choice &ch, const gk_args &ka, dim3 grid, int pdl, cudaStream_t s, char *err,
                       size_t errlen) {
#define SS_CASE(M_, N_)                                                                                        \
    if (ch.mt == M_ && ch.bn == N_)                                                                            \
        return ss_launch<M_, N_, SS_ST_##M_##_##N_, SS_NA_##M_##_##N_, CL>(ka, grid, pdl, s, err, errlen);
    SS_CASE(1, 64)
    SS_CASE(2, 64)
    SS_CASE(1, 128)
    SS_CASE(2, 128)
    SS_CASE(1, 256)
#undef SS_CASE
    return util_err(err, errlen, -EINVAL, "w4a16_gemm: bad tile configuration %d x %d", ch.mt, ch.bn);
}

/* mode 4 at split 1 with the bulk-store tile end (gk_store_tma): ring
 * depths that leave room for the warps' regions (WS_SMEM_TS within 227 KB).
 * 1 x 256 gives up one stage for them (5 -> 4) and 2 x 128 would too (7 ->
 * 6); the shallower ring loses where the weights come from DRAM rather than
 * L2 (H100, session 18, against the staged tile end: Qwen3-8B gate|up
 * (50 MB) M = 384 at 1 x 256 8% slower, M = 128 at 2 x 128 3% slower; q|k|v
 * and o at M = 384-512 5-9% faster, every shape 1-11% faster from M = 768).
 * So: the bulk stores wherever the ring keeps its depth, at 1 x 256 from
 * three token tiles on or where the weights take at most half an H100's L2,
 * never at 2 x 128. */
#define GK_TS_ST_1_64 GK_ST_1_64
#define GK_TS_ST_2_64 GK_ST_2_64
#define GK_TS_ST_1_96 GK_ST_1_96
#define GK_TS_ST_1_128 GK_ST_1_128
#define GK_TS_ST_1_256 4
static bool ws_bulk_store(const gk_choice &ch, const gk_args &ka) {
    static const int on = getenv("AWQD_W4A16_GEMM_TS") ? atoi(getenv("AWQD_W4A16_GEMM_TS")) : 1;
    if (!on || ka.ldy % 8) return false;
    if (ch.bn == 256) return ka.m > 512 || (size_t)ka.K * (size_t)ka.n16a * 8 <= ((size_t)25 << 20);
    return !(ch.mt == 2 && ch.bn == 128);
}

/* Mode 4's pipelined consumer loop (k_w4gemm_ws's PIPE) at BN = 64 and M <=
 * GK_PIPE_MAX_M, where it was measured (H200, session 36, back to back,
 * Qwen3-8B M = 64, the dispatch's choice): q|k|v 20.80 -> 18.92 us, o 17.83
 * -> 16.25, down 34.35 -> 31.35; the same results bit for bit.
 * AWQD_W4A16_GEMM_PIPE=0 turns it off (read once). */
static int pipe_default(void) {
    static const int on = !util_env_is_zero("AWQD_W4A16_GEMM_PIPE");
    return on;
}

/* XP (session 51): x permuted within each 64-deep chunk into the repacked
 * weight words' k order, so that the consumer loops read the words as
 * stored instead of gathering them in natural k order (g_quad_gather: 8
 * 4-byte loads and 4 prmt per tile and chunk -> one 16-byte load). The
 * repacked word t of lane c holds k = 16c + 4t + j (w4a16.cu "Device weight
 * layout"); with TMA delivering xp in wgmma's canonical order, k16 step t
 * must hold at positions 2c + {0, 1} and 2c + 8 + {0, 1} the k 16c + 4t +
 * {0, 1} and {2, 3}. In 32-bit pairs of a chunk: xp pair 4u + c = x pair
 * 8c + u (u = 2t + h, h the half of the step): a 4 x 8 transpose of pairs.
 * A thread per 16-byte unit, through shared memory. PDL: lets the GEMM
 * launch at once (its weights are requested before its own wait, which
 * returns when this kernel has finished) and waits for x's producer. */
#define XP_THREADS 256
static __global__ void __launch_bounds__(XP_THREADS) k_xperm(const uint4 *__restrict__ x, uint4 *__restrict__ xp,
                                                             int units) {
    /* a block: 32 chunks (4 KB), one 16-byte unit a thread, coalesced in
     * and out; the chunks 40 words apart in shared memory, so that the 32
     * lanes of a warp (4 chunks x 8 units) read 32 banks for each c */
    __shared__ __align__(16) uint32_t sm[32 * 40];
    pdl_launch();
    const int t = threadIdx.x, ch = t >> 3, q = t & 7;
    const int u = blockIdx.x * XP_THREADS + t;
    pdl_wait();
    if (u < units) *(uint4 *)&sm[ch * 40 + q * 4] = x[u];
    __syncthreads();
    if (u < units) /* unit q of the permuted chunk: pairs 4q + c = pairs 8c + q of x's */
        xp[u] = make_uint4(sm[ch * 40 + q], sm[ch * 40 + 8 + q], sm[ch * 40 + 16 + q], sm[ch * 40 + 24 + q]);
}

/* XP: 0 off, 1 (default) by nat_xp_takes (kernels/cuda/nat_rule.h), 2
 * wherever x comes by TMA (modes 4, 6, 7), 3 as 2 without k_xperm (x read
 * as if permuted: wrong results, timing only); each where the workspace
 * also holds x's copy. AWQD_W4A16_GEMM_XP sets it at the first call. */
static env_knob g_xp = ENV_KNOB_INIT("AWQD_W4A16_GEMM_XP", 1, 0, 3);
static int xp_mode(void) { return knob_get(&g_xp); }
extern "C" int w4a16_gemm_xp(int mode) { return knob_set(&g_xp, mode); }
static std::atomic<unsigned long> g_xp_launches{0};
extern "C" unsigned long w4a16_gemm_xp_launches(void) { return g_xp_launches.load(std::memory_order_relaxed); }

/* the permuted copy's bytes (whole 256-byte units) */
static size_t xp_bytes(const struct w4a16_gemm_args *a) { return ((size_t)a->m * a->k * 2 + 255) / 256 * 256; }

/* The pipelined loops (modes 6, 7; mode 4 at BN = 64 and M <= GK_PIPE_MAX_M),
 * with or without XP. Returns 1 with *rc set where the call took one of
 * them. */
template <bool CL, bool XP>
static int ws_dispatch_pipe(const gk_choice &ch, const gk_args &ka, dim3 grid, int pdl, cudaStream_t s,
                            char *err, size_t errlen, int *rc) {
    if (!CL && ch.mode == 7) { /* mode 6 with three consumer warpgroups (192-row tiles) */
        *rc = ch.bn == 96    ? ws_launch<1, 96, GK_ST_1_96, false, true, false, true, true, 3, XP>(ka, grid, pdl, s, err, errlen)
              : ch.bn == 128 ? ws_launch<1, 128, GK_ST_1_128, false, true, false, true, true, 3, XP>(ka, grid, pdl, s, err, errlen)
                             : ws_launch<1, 64, GK_ST_1_64, false, true, false, true, true, 3, XP>(ka, grid, pdl, s, err, errlen);
        return 1;
    }
    if (!CL && ch.mode == 6) { /* the pipelined loop, the split reduced by all its blocks */
        /* 1 x 96 only (w4a16_gemm_config, dr_pick) */
        *rc = ch.bn == 96    ? ws_launch<1, 96, GK_ST_1_96, false, true, false, true, true, 2, XP>(ka, grid, pdl, s, err, errlen)
              : ch.bn == 128 ? ws_launch<1, 128, GK_ST_1_128, false, true, false, true, true, 2, XP>(ka, grid, pdl, s, err, errlen)
              : ch.mt == 1   ? ws_launch<1, 64, GK_ST_1_64, false, true, false, true, true, 2, XP>(ka, grid, pdl, s, err, errlen)
                             : ws_launch<2, 64, GK_ST_2_64, false, true, false, true, true, 2, XP>(ka, grid, pdl, s, err, errlen);
        return 1;
    }
    if (ch.bn == 64 && ka.m <= GK_PIPE_MAX_M && pipe_default() && (ch.mt == 1 || ch.mt == 2)) { /* PIPE */
        const bool ts = !CL && ws_bulk_store(ch, ka);
        if (ch.mt == 1)
            *rc = ts ? ws_launch<1, 64, GK_TS_ST_1_64, false, true, true, true, false, 2, XP>(ka, grid, pdl, s, err, errlen)
                     : ws_launch<1, 64, GK_ST_1_64, CL, true, false, true, false, 2, XP>(ka, grid, pdl, s, err, errlen);
        else
            *rc = ts ? ws_launch<2, 64, GK_TS_ST_2_64, false, true, true, true, false, 2, XP>(ka, grid, pdl, s, err, errlen)
                     : ws_launch<2, 64, GK_ST_2_64, CL, true, false, true, false, 2, XP>(ka, grid, pdl, s, err, errlen);
        return 1;
    }
    return 0;
}

/* Where a call runs XP: mode 4, 6 or 7 (x by TMA), and by xp_mode(): 2 /
 * 3 always, 1 by the rule (nat_rule.h nat_xp_takes) */
static bool xp_path(const struct w4a16_gemm_args *a, const gk_choice &ch) {
    const int v = xp_mode();
    if (!v || !(ch.mode == 4 || ch.mode == 6 || ch.mode == 7)) return false;
    return v >= 2 || nat_xp_takes(a->m, a->k, (long long)a->n16 * 16, a->gate_up);
}

template <bool CL, bool NAT, bool XP>
static int ws_dispatch_x(const gk_choice &ch, const gk_args &ka, dim3 grid, int pdl, cudaStream_t s,
                         char *err, size_t errlen) {
    if (NAT) {
        int rc = 0;
        if (ws_dispatch_pipe<CL, XP>(ch, ka, grid, pdl, s, err, errlen, &rc)) return rc;
    }
    if (!CL && NAT && ws_bulk_store(ch, ka)) {
#define TS_CASE(M_, N_)                                                                                        \
    if (ch.mt == M_ && ch.bn == N_)                                                                            \
        return ws_launch<M_, N_, GK_TS_ST_##M_##_##N_, false, true, true, false, false, 2, XP>(ka, grid, pdl, s, err, \
                                                                                             errlen);
        TS_CASE(1, 64)
        TS_CASE(2, 64)
        TS_CASE(1, 96)
        TS_CASE(1, 128)
        TS_CASE(1, 256)
#undef TS_CASE
    }
    if (ch.mt == 1 && ch.bn == 64) return ws_launch<1, 64, GK_ST_1_64, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 2 && ch.bn == 64) return ws_launch<2, 64, GK_ST_2_64, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 1 && ch.bn == 96) return ws_launch<1, 96, GK_ST_1_96, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 1 && ch.bn == 128) return ws_launch<1, 128, GK_ST_1_128, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 2 && ch.bn == 128) return ws_launch<2, 128, GK_ST_2_128, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 1 && ch.bn == 256) return ws_launch<1, 256, GK_ST_1_256, CL, NAT, false, false, false, 2, XP>(ka, grid, pdl, s, err, errlen);
    return util_err(err, errlen, -EINVAL, "w4a16_gemm: bad tile configuration %d x %d", ch.mt, ch.bn);
}
/* xp: ka.x is x's permuted copy (XP) */
template <bool CL, bool NAT>
static int ws_dispatch(const gk_choice &ch, const gk_args &ka, bool xp, dim3 grid, int pdl, cudaStream_t s,
                       char *err, size_t errlen) {
    if (NAT && xp) return ws_dispatch_x<CL, true, true>(ch, ka, grid, pdl, s, err, errlen);
    return ws_dispatch_x<CL, NAT, false>(ch, ka, grid, pdl, s, err, errlen);
}

template <bool WG, bool CL>
static int gk_dispatch(const gk_choice &ch, const gk_args &ka, dim3 grid, int pdl, cudaStream_t s,
                       char *err, size_t errlen) {
    if (ch.mt == 1 && ch.bn == 64) return gk_launch<1, 64, GK_ST_1_64, WG, CL>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 2 && ch.bn == 64) return gk_launch<2, 64, GK_ST_2_64, WG, CL>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 1 && ch.bn == 128) return gk_launch<1, 128, GK_ST_1_128, WG, CL>(ka, grid, pdl, s, err, errlen);
    if (ch.mt == 2 && ch.bn == 128) return gk_launch<2, 128, GK_ST_2_128, WG, CL>(ka, grid, pdl, s, err, errlen);
    return util_err(err, errlen, -EINVAL, "w4a16_gemm: bad tile configuration %d x %d", ch.mt, ch.bn);
}

extern "C" int w4a16_gemm_run(const struct w4a16_gemm_args *a, void *ws, size_t ws_bytes, int pdl,
                              cudaStream_t s, char *err, size_t errlen) {
    if (!a || !a->qw || !a->sc || !a->zr || !a->x || !a->y || a->m < 1 || a->kc < 1 || a->k != a->kc * 64 ||
        a->group < 64 || a->group % 64 || a->n16a % 8 || a->n16 > a->n16a)
        return util_err(err, errlen, -EINVAL, "w4a16_gemm: bad arguments");
    if (((uintptr_t)a->x | (uintptr_t)a->y) & 15)
        return util_err(err, errlen, -EINVAL, "w4a16_gemm: x and y must be 16-byte aligned");
    gk_choice ch = gk_choose(a);
    if (ch.mode != 1 && !w4a16_gemm_available())
        return util_err(err, errlen, -ENOTSUP, "w4a16_gemm: the wgmma kernel needs an sm_90a build on a 9.0 device");
    {   /* mode 6: chosen at M <= 64 where it fills the SMs; forced, it runs
         * where it fits, else as mode 4 (its split in a cluster) */
        gk_choice d;
        if (dr_auto(a, ws ? ws_bytes : 0, &d)) ch = d;
        const int kse = cdiv(a->kc, cdiv(a->kc, ch.ks > 0 ? ch.ks : 1));
        if (ch.mode == 7 && !(ws && dr_fits(a, ch.mt, ch.bn, kse, ws_bytes, 7))) ch.mode = 6;
        if (ch.mode == 6 && !(ws && dr_fits(a, ch.mt, ch.bn, kse, ws_bytes, 6))) ch.mode = 4;
    }
    /* XP: x's permuted copy at the workspace's end, where the rest still
     * holds what the call needs (else the gathers, as before) */
    uint16_t *xp = NULL;
    if (xp_path(a, ch) && ws) {
        const size_t xb = xp_bytes(a);
        const uintptr_t end = ((uintptr_t)ws + ws_bytes) & ~(uintptr_t)255;
        if (end >= (uintptr_t)ws + xb) {
            const size_t rest = end - xb - (uintptr_t)ws;
            gk_choice t = ch;
            t.ks = cdiv(a->kc, cdiv(a->kc, ch.ks > 0 ? ch.ks : 1));
            const bool dr = ch.mode == 6 || ch.mode == 7;
            if (dr ? dr_fits(a, t.mt, t.bn, t.ks, rest, t.mode) != 0 : ws_of(a, t) <= rest) {
                xp = (uint16_t *)(end - xb);
                ws_bytes = rest;
            }
        }
    }
    /* split: in a cluster (no workspace), else what fits the workspace and
     * the counters */
    int ks = ch.ks > 0 ? ch.ks : 1;
    if (ch.mode >= 3 && ks > GK_CLUSTER_MAX) ks = GK_CLUSTER_MAX;
    ks = cdiv(a->kc, cdiv(a->kc, ks));
    const int cl = use_cluster(ch, ks);
    if (!cl && ks > 1 && tiles_of(a, ch.mt, ch.bn) > a->cnt_len) ks = 1;
    while (!cl && ks > 1) {
        gk_choice t = ch;
        t.ks = ks;
        if (ws && ws_of(a, t) <= ws_bytes) break;
        ks--;
        ks = cdiv(a->kc, cdiv(a->kc, ks));
    }
    const int cps = cdiv(a->kc, ks);
    ks = cdiv(a->kc, cps);

    gk_args ka;
    ka.qw = (const uint4 *)a->qw;
    ka.sc = a->sc;
    ka.zr = a->zr;
    ka.x = xp ? xp : a->x; /* XP: the kernel's tensor map of x is made from its copy */
    ka.y = a->y;
    ka.bias = a->bias;
    ka.part = (float *)ws;
    ka.cnt = a->cnt;
    ka.K = a->k;
    ka.KC = a->kc;
    ka.G = a->group;
    ka.n16a = a->n16a;
    ka.m = a->m;
    ka.n = a->n;
    ka.ldy = a->ldy;
    ka.gate_up = a->gate_up;
    ka.cps = cps;
    ka.ksplit = ks;
    static const int dbg = getenv("AWQD_W4A16_GEMM_DBG") ? atoi(getenv("AWQD_W4A16_GEMM_DBG")) : 0;
    ka.dbg = dbg;
    ka.ntn = cdiv(a->n16, 4 * gk_nwg(ch.mode) * ch.mt);
    ka.ntiles = ka.ntn * cdiv(a->m, ch.bn);
    /* stream-K where chosen and the workspace holds the parked pieces */
    const bool sk = ch.sk && ch.mode == 4 && ks == 1 && sk_fits(a, ch.mt, ch.bn) && ws &&
                    ws_bytes >= ws_sk_bytes(a, ch.mt, ch.bn);
    ka.skD = sk ? sk_whole(a, ch.mt, ch.bn) : ka.ntiles;
    ka.skT = sk ? (ka.ntiles - ka.skD) * a->kc : 0;
    if (sk) g_sk_launches.fetch_add(1, std::memory_order_relaxed);
    if (xp) { /* x's permuted copy first (XP) */
        g_xp_launches.fetch_add(1, std::memory_order_relaxed);
        if (xp_mode() != 3) {
            static std::atomic<unsigned long long> xset{0};
            const int units = a->m * a->kc * 8;
            const int rc = gk_launch_ex(k_xperm, &xset, dim3(cdiv(units, XP_THREADS)), XP_THREADS, 0, false, pdl, s,
                                        err, errlen, (const uint4 *)a->x, (uint4 *)xp, units);
            if (rc) return rc;
        }
    }
    if (ch.mode >= 3) { /* persistent: one block per SM; a split: one tile per block, in a cluster */
        const int sms = a->sms > 0 ? a->sms : 1;
        const dim3 grid = ks > 1 ? dim3(ka.ntiles, 1, ks)
                          : sk   ? dim3(sk_grid(a), 1, 1)
                                 : dim3(ka.ntiles < sms ? ka.ntiles : sms, 1, 1);
        if (ch.mode == 5)
            return ks > 1 ? ss_dispatch<true>(ch, ka, grid, pdl, s, err, errlen)
                          : ss_dispatch<false>(ch, ka, grid, pdl, s, err, errlen);
        if (ch.mode == 6 || ch.mode == 7) {
            g_dr_launches.fetch_add(1, std::memory_order_relaxed);
            return ws_dispatch<false, true>(ch, ka, xp, grid, pdl, s, err, errlen);
        }
        if (ch.mode == 4)
            return ks > 1 ? ws_dispatch<true, true>(ch, ka, xp, grid, pdl, s, err, errlen)
                          : ws_dispatch<false, true>(ch, ka, xp, grid, pdl, s, err, errlen);
        return ks > 1 ? ws_dispatch<true, false>(ch, ka, false, grid, pdl, s, err, errlen)
                      : ws_dispatch<false, false>(ch, ka, false, grid, pdl, s, err, errlen);
    }
    dim3 grid(cdiv(a->n16, 8 * ch.mt), cdiv(a->m, ch.bn), ks);
    if (grid.y > 65535) return util_err(err, errlen, -EINVAL, "w4a16_gemm: m=%d too large", a->m);
    if (ch.mode == 1) return gk_dispatch<false, false>(ch, ka, grid, pdl, s, err, errlen);
    if (cl) return gk_dispatch<true, true>(ch, ka, grid, pdl, s, err, errlen);
    return gk_dispatch<true, false>(ch, ka, grid, pdl, s, err, errlen);
}
