/* attn_common.cuh — device pieces shared by the attention kernels (attn.cu:
 * prefill / general; attn_decode.cu: the fixed-split decode kernel): cp.async
 * copies into shared memory (one 16-byte chunk of a paged KV tile), the
 * m16n8k16 tensor-core MMA, and one step of the online softmax on MMA
 * accumulator fragments. Header-only, static inline: each .cu file gets its
 * own copy. */
#ifndef AWQD_ATTN_COMMON_CUH
#define AWQD_ATTN_COMMON_CUH

#include <cuda_fp16.h>
#include <math.h>

/* 16-byte global -> shared copy; src_bytes < 16 zero-fills the rest. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
/* cp_async16 issued only where pred (a predicated instruction, not a
 * branch: the compiler still requests a tile's block-table entries together
 * before its copies) */
static __device__ __forceinline__ void cp_async16_if(void *smem, const void *gmem, int src_bytes, bool pred) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %3, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16, %2;\n}\n" ::"r"(sa),
                 "l"(gmem), "r"(src_bytes), "r"((int)pred)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most 1 (wait1) / 0 (wait0) committed groups are in flight. */
static __device__ __forceinline__ void cp_async_wait1(void) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}
static __device__ __forceinline__ void cp_async_wait0(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* q/k-norm + RoPE of one head by one warp, shared by qk_rope_kv_kernel
 * (ops_cuda.cu) and the decode attention's fused prologue (attn_decode.cu)
 * so that both give the same bits. Lane l holds elements [l E, (l + 1) E)
 * of the head (E = hd / 32 <= EM; v[i] = 0 for i >= E), so element j's
 * rotation partner j +- hd / 2 lives in lane l ^ 16. qk_rope_sincos: the
 * lane's sines and cosines at position pos (the same for every head of a
 * row), as its two halves qk_rope_freqs (the loads) and qk_rope_sincos_f
 * (the arithmetic) where the loads go first; qk_norm_rope: the optional
 * RMSNorm (g: the lane's norm weights) and the rotation (rotate-half: lo
 * x1 c - x2 s, hi x2 c + x1 s), in place. */
template <int EM>
static __device__ __forceinline__ void qk_rope_freqs(const float *inv_freq, int lane, int E, int hd,
                                                     float (&f)[EM]) {
    const bool lo = lane < 16;
#pragma unroll
    for (int i = 0; i < EM; i++) /* frequency index lane * E + i, less hd / 2 in the high half */
        f[i] = i < E ? inv_freq[lane * E + i - (lo ? 0 : hd >> 1)] : 0.0f;
}
template <int EM>
static __device__ __forceinline__ void qk_rope_sincos_f(float pos, const float (&f)[EM], int E,
                                                        float (&sn)[EM], float (&cs)[EM]) {
#pragma unroll
    for (int i = 0; i < EM; i++) {
        sn[i] = 0.0f, cs[i] = 1.0f;
        if (i < E) sincosf(pos * f[i], &sn[i], &cs[i]);
    }
}
template <int EM>
static __device__ __forceinline__ void qk_rope_sincos(float pos, const float *inv_freq, int lane, int E,
                                                      int hd, float (&sn)[EM], float (&cs)[EM]) {
    float f[EM];
    qk_rope_freqs<EM>(inv_freq, lane, E, hd, f);
    qk_rope_sincos_f<EM>(pos, f, E, sn, cs);
}
template <int EM>
static __device__ __forceinline__ void qk_norm_rope(float (&v)[EM], const float (&g)[EM], bool norm, float eps,
                                                    int hd, int E, const float (&sn)[EM], const float (&cs)[EM],
                                                    int lane) {
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < EM; i++) ss += v[i] * v[i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        const float rr = rsqrtf(ss / (float)hd + eps);
#pragma unroll
        for (int i = 0; i < EM; i++)
            if (i < E) v[i] = g[i] * (v[i] * rr);
    }
    const bool lo = lane < 16;
#pragma unroll
    for (int i = 0; i < EM; i++) {
        const float other = __shfl_xor_sync(0xffffffffu, v[i], 16);
        if (i < E) v[i] = lo ? v[i] * cs[i] - other * sn[i] : v[i] * cs[i] + other * sn[i];
    }
}

/* Chunk e of a KV tile: key t0 + e / (HD / 8), dims (e % (HD / 8)) * 8 ..+7
 * of KV head g, copied from the paged cache (slot = block_table[key /
 * block_size] * block_size + key % block_size; cache [slots][nkv][HD]) into
 * dst[key - t0][...]; keys >= ke are zero-filled. Any block size (a 32-bit
 * division, ~25 instructions a copy); P2: block_size == 1 << bs_shift, the
 * slot by a shift and a mask. */
template <int HD, bool P2 = false>
static __device__ __forceinline__ void kv_chunk_load(__half (*dst)[HD + 8], const __half *cache,
                                                     int e, int t0, int ke, const int *bt,
                                                     int block_size, int nkv, int g, int bs_shift = 0) {
    int t = e / (HD / 8), dc = e % (HD / 8), ta = t0 + t;
    const __half *src = cache;
    int bytes = 0;
    if (ta < ke) {
        size_t sl = P2 ? (size_t)bt[ta >> bs_shift] * block_size + (ta & (block_size - 1))
                       : (size_t)bt[ta / block_size] * block_size + ta % block_size;
        src = cache + (sl * nkv + g) * HD + dc * 8;
        bytes = 16;
    }
    cp_async16(&dst[t][dc * 8], src, bytes);
}

/* The block-size class a kernel was compiled for: KV_BS_ANY tests it at run
 * time (both loops compiled), KV_BS_P2 / KV_BS_GEN know it (one loop: the
 * decode kernel, whose code runs once per CTA at batch 1, keeps only the
 * path it takes). */
#define KV_BS_ANY 0
#define KV_BS_P2 1
#define KV_BS_GEN 2

/* A whole TK-key tile from key t0 (< ke: the callers skip tiles past the
 * end) by NT threads, keys >= ke zero-filled; no commit (the callers group
 * it). block_size = 1 << sh: thread tid copies dim chunk tid % CH of keys
 * t0 + tid / CH + (NT / CH) it; a key past the end reads the last key's
 * block entry (in bounds) and copies 0 bytes (zero fill), so the loop has
 * no branch and each copy ~20 instructions (session 44). UNROLL: the whole
 * loop unrolled, its block-table loads issued together before the copies
 * (the decode kernel, which has the registers); the general kernels keep a
 * rolled loop, whose registers bound their occupancy. SKIP: key `skip` is
 * not copied at all (a predicated copy, not a branch, so the block-table
 * loads stay together; the decode kernel's first tile before its PDL wait
 * leaves out the new key, whose row the previous kernel writes). BS: the
 * block-size class (KV_BS_*). */
template <int HD, int TK, int NT, bool UNROLL = false, bool SKIP = false, int BS = KV_BS_ANY>
static __device__ __forceinline__ void kv_tile_load(__half (*dst)[HD + 8], const __half *cache, int tid,
                                                    int t0, int ke, const int *bt, int block_size, int nkv,
                                                    int g, int skip = -1) {
    constexpr int CH = HD / 8; /* 16-byte chunks per key */
    static_assert(NT % CH == 0 && (TK * CH) % NT == 0, "a thread copies one dim chunk of whole key rows");
    constexpr int UF = UNROLL ? TK * CH / NT : 1;
    if (BS == KV_BS_P2 || (BS == KV_BS_ANY && (block_size & (block_size - 1)) == 0)) {
        const int sh = __ffs(block_size) - 1, dc = tid % CH;
        const __half *base = cache + (size_t)g * HD + dc * 8;
        const size_t row = (size_t)nkv * HD; /* halves per cache slot */
#pragma unroll(UF)
        for (int it = 0; it < TK * CH / NT; it++) {
            const int t = tid / CH + it * (NT / CH), ta = t0 + t;
            const int tc = ta < ke ? ta : ke - 1;
            const unsigned slot = ((unsigned)bt[tc >> sh] << sh) | (unsigned)(tc & (block_size - 1));
            if (SKIP) cp_async16_if(&dst[t][dc * 8], base + (size_t)slot * row, ta < ke ? 16 : 0, ta != skip);
            else cp_async16(&dst[t][dc * 8], base + (size_t)slot * row, ta < ke ? 16 : 0);
        }
    } else {
#pragma unroll(UF)
        for (int it = 0; it < TK * CH / NT; it++)
            if (!SKIP || t0 + (tid + it * NT) / CH != skip)
                kv_chunk_load<HD>(dst, cache, tid + it * NT, t0, ke, bt, block_size, nkv, g);
    }
}

/* c[4] += A (16x16 fp16, row) * B (16x8 fp16, col), fp32 accumulate. */
static __device__ __forceinline__ void mma16816(float *c, const unsigned *a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(unsigned *)&h;
}

/* O += P V for 16 keys: pa = this warp's P as the m16n8k16 A fragments
 * (16 rows x keys k0 .. k0+15), V rows k0.. in shared memory (row stride
 * HD + 8), whose B fragments come transposed by ldmatrix; o = the DT n8
 * output fragments of the warp's rows (DT even). */
template <int DT, int HD>
static __device__ __forceinline__ void pv_mma16(float (*o)[4], const unsigned *pa,
                                                const __half (*v)[HD + 8], int k0, int lane) {
    int key = k0 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int j = 0; j < DT; j += 2) {
        int d = j * 8 + (lane >> 4) * 8;
        unsigned sa = (unsigned)__cvta_generic_to_shared(&v[key][d]);
        unsigned b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(sa));
        mma16816(o[j], pa, b0, b1);
        mma16816(o[j + 1], pa, b2, b3);
    }
}

/* One online-softmax step of a thread over a key tile held as NJ m16n8k16
 * accumulator fragments sc[NJ][4] of scaled scores in log2 units (-INFINITY
 * = masked). The thread's two rows are gq (elements 0, 1) and gq + 8
 * (elements 2, 3); the 4 lanes of a quad share them. Updates the running
 * max mrow[2] and sum lrow[2], turns sc into the P tile exp2(s - max), and
 * rescales the DT output fragments o[DT][4] by exp2(old max - new max). */
template <int NJ, int DT>
static __device__ __forceinline__ void online_softmax_tile(float (*sc)[4], float *mrow, float *lrow,
                                                           float (*o)[4]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        float mn = fmaxf(mrow[h], mx[h]);
        alpha[h] = mn == -INFINITY ? 1.0f : exp2f(mrow[h] - mn);
        mrow[h] = mn;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int h = e >> 1;
            float pv = mrow[h] == -INFINITY ? 0.0f : exp2f(sc[j][e] - mrow[h]);
            sc[j][e] = pv;
            sum[h] += pv;
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
        sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
        lrow[h] = lrow[h] * alpha[h] + sum[h];
    }
#pragma unroll
    for (int j = 0; j < DT; j++) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
    }
}

#endif
