/* sample.cu — ops->sample_topk on the GPU: per row, the processed logits'
 * max and sum of exps, the raw logits' max and sum of exps, and the exact top
 * k tokens by (w desc, id asc), without sorting the vocabulary.
 *
 * Selection by threshold. The row's columns are split into groups of 32
 * (thread t of block b owns columns b * 8192 + j * 256 + t, j < 32: loads
 * coalesce). Every element has a distinct 64-bit key (ordered float bits of
 * w, then ~id), so the k-th largest group maximum T is well defined: at
 * least k elements have key >= T (one per group above it), and all of them
 * lie in the k groups whose maximum is >= T — at most 32 k elements. So:
 *   0. adjust   (rows with adjustments) copy the row into work, apply them
 *   1. scan     grid (chunks of 8192, rows): group max keys, block partial
 *               max / sum of exps of w (at 1/T) and of raw
 *   2. thresh   grid rows, 1024 threads: radix select of the k-th largest
 *               group maximum (<= 8192 keys) -> T; combine the partial sums
 *   (k = 1: T is the row's best key; thresh writes it and 3, 4 do not run)
 *   3. gather   grid (chunks, rows): elements with key >= T of the groups
 *               whose max >= T, appended with one atomic per element
 *   4. final    grid rows: radix select of the k-th of the <= 32 k gathered
 *               keys, the k at or above it bitonic-sorted in shared memory;
 *               writes them (w and raw read back from the rows)
 *   R. race     grid (chunks, rows), rows with race[3r + 2] only: per block
 *               the best (score, lowest id) of kernels/ops.h's exponential
 *               race over the finite w; thresh (2) combines the blocks
 *   k = 1 (greedy, plain temperature; session 8) runs 1 + R + 2 as ONE
 *   kernel, smp_scan1_kernel, over chunks of 8 columns per thread (75
 *   blocks for 151936 columns): each block writes its partials and best key,
 *   and the row's last block to arrive (a per-row counter in the backend,
 *   zero between calls) writes the row (smp_row_header). With 32 columns per
 *   thread it is bit for bit the separate kernels (AWQD_CUDA_SAMPLE_GS=32,
 *   tested); at 8 the sums of exps differ in the last bits (other fp32
 *   partials). AWQD_CUDA_SAMPLE_FUSE=0: the separate kernels.
 * Race scores: (double)w * inv_t (exact) + -log(-log(u)), u from a splitmix64
 * hash, with __dadd_rn / __dmul_rn (no contraction) — bit for bit the host's
 * sample_race_score except that CUDA's double log is within 1 ulp of glibc's.
 * Sums: fp32 expf terms, per-thread fp32 partials of 32 terms, combined in
 * double (the CPU reference sums every term in double: they agree to ~1e-7
 * relative). Limits: k <= 256, n_cols <= 262144 (32 chunks).
 *
 * work (floats, offsets rounded to 8 bytes): proc [m, ld] | gkeys u64 [m, G]
 * | ckeys u64 [m, 32 k] | partials double [m, chunks, 4] | race partials
 * double [m, chunks, 2] (score, id) | thresh u64 [m] | count int [m]. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sample.h"

extern "C" {
#include "engine/util.h"
}

#define SMP_GS 32                          /* elements per group (thread) */
#define SMP_THREADS 256                    /* scan / gather block */
#define SMP_CHUNK (SMP_GS * SMP_THREADS)   /* columns per scan block */
#define SMP_MAX_CHUNKS 32                  /* n_cols <= 262144 */
#define SMP_SORT_THREADS 1024
#define SMP_GS1 8                          /* k = 1 (one kernel): columns per thread */
#define SMP_MAX_CHUNKS1 (SMP_MAX_CHUNKS * SMP_GS / SMP_GS1)
#define SMP_SORT_KEYS 8192                 /* most keys a selection sees */
static_assert(SMP_MAX_CHUNKS * SMP_THREADS <= SMP_SORT_KEYS && SMP_GS * SAMPLE_MAX_K <= SMP_SORT_KEYS &&
                  SMP_SORT_KEYS % SMP_SORT_THREADS == 0,
              "selection sizes: group maxima (G) and gathered keys (cap = 32 k)");

typedef unsigned long long u64;

static __device__ __forceinline__ u64 smp_key(float v, int id) {
    if (v == 0.0f) v = 0.0f; /* -0 == +0 */
    unsigned u = __float_as_uint(v);
    if (v != v) u = 0; /* NaN below everything */
    else u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((u64)u << 32) | (u64)(0xFFFFFFFFu - (unsigned)id);
}

static __device__ __forceinline__ int smp_key_id(u64 key) {
    return (int)(0xFFFFFFFFu - (unsigned)(key & 0xFFFFFFFFull));
}

/* ------------------------------------------------------------------------ */
/* 0. adjustments                                                           */
/* ------------------------------------------------------------------------ */

static __global__ void smp_adjust_kernel(const float *__restrict__ logits, float *proc,
                                         float *__restrict__ adj_raw,
                                         const int *__restrict__ adj_start,
                                         const int *__restrict__ adj, int ld, int n_cols,
                                         int vs) {
    int r = blockIdx.x;
    int a0 = adj_start[r], a1 = adj_start[r + 1];
    if (a1 <= a0) return;
    const float *raw = logits + (size_t)r * ld;
    float *w = proc + (size_t)r * ld;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) w[c] = raw[c];
    __syncthreads();
    for (int e = a0 + threadIdx.x; e < a1; e += blockDim.x) {
        int tok = adj[2 * e] >> 2, col = tok - vs;
        if (col < 0 || col >= n_cols) continue;
        adj_raw[e] = raw[col];
        if (e > a0 && (adj[2 * e - 2] >> 2) == tok) continue; /* not the token's first entry */
        float v = w[col];
        for (int f = e; f < a1 && (adj[2 * f] >> 2) == tok; f++) {
            float x = __int_as_float(adj[2 * f + 1]);
            int op = adj[2 * f] & 3;
            if (op == SAMPLE_ADJ_ADD) v = __fadd_rn(v, x);
            else if (op == SAMPLE_ADJ_REP) v = v > 0 ? __fdiv_rn(v, x) : __fmul_rn(v, x);
            else v = __fsub_rn(v, x);
        }
        w[col] = v;
    }
}

/* ------------------------------------------------------------------------ */
/* 1. scan                                                                  */
/* ------------------------------------------------------------------------ */

static __device__ __forceinline__ float smp_block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ double smp_block_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One chunk of GS * SMP_THREADS columns of row r from column `base` (this
 * thread's: base + j * SMP_THREADS, j < GS): its w values (wv; -inf past
 * n_cols), its best key (gk), and the block's max and sum of exps of w at
 * 1/T (bw, dsw) and of raw (br, dsr). Every thread of the block calls it. */
template <int GS>
static __device__ __forceinline__ void smp_scan_chunk(const float *__restrict__ w,
                                                      const float *__restrict__ raw, int base,
                                                      int n_cols, int vs, float it, float *shf,
                                                      double *shd, float *wv, u64 &gk, float &bw,
                                                      double &dsw, float &br, double &dsr) {
    const bool same = w == raw; /* no adjustments: one load per column */
    float rv[GS];
    float mw = -INFINITY, mr = -INFINITY;
    gk = 0;
#pragma unroll
    for (int j = 0; j < GS; j++) {
        int c = base + j * SMP_THREADS;
        if (c < n_cols) {
            wv[j] = w[c];
            rv[j] = same ? wv[j] : raw[c];
            u64 k = smp_key(wv[j], vs + c);
            gk = k > gk ? k : gk;
            mw = fmaxf(mw, wv[j]);
            mr = fmaxf(mr, rv[j]);
        } else {
            wv[j] = -INFINITY;
            rv[j] = -INFINITY;
        }
    }
    bw = smp_block_max(mw, shf);
    br = smp_block_max(mr, shf);
    float sw = 0.0f, sr = 0.0f;
    if (bw > -INFINITY) {
#pragma unroll
        for (int j = 0; j < GS; j++) sw += expf((wv[j] - bw) * it);
    }
    if (br > -INFINITY) {
#pragma unroll
        for (int j = 0; j < GS; j++) sr += expf(rv[j] - br);
    }
    dsw = smp_block_sum((double)sw, shd);
    dsr = smp_block_sum((double)sr, shd);
}

static __global__ void __launch_bounds__(SMP_THREADS)
smp_scan_kernel(const float *__restrict__ logits, const float *__restrict__ proc,
                const int *__restrict__ adj_start, const float *__restrict__ inv_t,
                u64 *__restrict__ gkeys, double *__restrict__ part, int ld, int n_cols, int vs,
                int G, int n_chunks) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
    const float *raw = logits + (size_t)r * ld;
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : raw;
    float wv[SMP_GS], bw, br;
    double dsw, dsr;
    u64 gk;
    smp_scan_chunk<SMP_GS>(w, raw, b * SMP_CHUNK + t, n_cols, vs, inv_t[r], shf, shd, wv, gk, bw,
                           dsw, br, dsr);
    gkeys[(size_t)r * G + (size_t)b * SMP_THREADS + t] = gk;
    if (t == 0) {
        double *p = part + ((size_t)r * n_chunks + b) * 4;
        p[0] = bw;
        p[1] = dsw;
        p[2] = br;
        p[3] = dsr;
    }
}

/* ------------------------------------------------------------------------ */
/* R. race                                                                  */
/* ------------------------------------------------------------------------ */

static __device__ __forceinline__ u64 smp_mix(u64 x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* kernels/cpu/sample_cpu.c's sample_race_score, for a finite w */
static __device__ __forceinline__ double smp_race_score(u64 key, int id, float w, float it) {
    u64 h = smp_mix(key ^ ((u64)(unsigned)id * 0x9e3779b97f4a7c15ull));
    double u = __dmul_rn(__dadd_rn((double)(h >> 12), 0.5), 1.0 / 4503599627370496.0);
    double g = -log(-log(u));
    return __dadd_rn(__dmul_rn((double)w, (double)it), g);
}

/* a beats b: higher score, then lower id (id < 0: nothing) */
static __device__ __forceinline__ bool smp_race_better(double sa, int ia, double sb, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    return sa > sb || (sa == sb && ia < ib);
}

static __global__ void __launch_bounds__(SMP_THREADS)
smp_race_kernel(const float *__restrict__ logits, const float *__restrict__ proc,
                const int *__restrict__ adj_start, const float *__restrict__ inv_t,
                const int *__restrict__ race, double *__restrict__ rpart, int ld, int n_cols,
                int vs, int n_chunks) {
    __shared__ double shs[SMP_THREADS / 32];
    __shared__ int shi[SMP_THREADS / 32];
    int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
    double *rp = rpart + ((size_t)r * n_chunks + b) * 2;
    if (!race[3 * r + 2]) {
        if (t == 0) {
            rp[0] = -INFINITY;
            rp[1] = -1.0;
        }
        return;
    }
    u64 key = (u64)(unsigned)race[3 * r] | ((u64)(unsigned)race[3 * r + 1] << 32);
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : logits + (size_t)r * ld;
    float it = inv_t[r];
    double bs = -INFINITY;
    int bi = -1;
    for (int j = 0; j < SMP_GS; j++) { /* ascending columns: ties keep the lowest id */
        int c = b * SMP_CHUNK + j * SMP_THREADS + t;
        if (c >= n_cols) break;
        float v = w[c];
        if (!isfinite(v)) continue;
        double sc = smp_race_score(key, vs + c, v, it);
        if (bi < 0 || sc > bs) bs = sc, bi = vs + c;
    }
    for (int o = 16; o > 0; o >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, bs, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (smp_race_better(os, oi, bs, bi)) bs = os, bi = oi;
    }
    int lane = t & 31, wid = t >> 5;
    if (lane == 0) {
        shs[wid] = bs;
        shi[wid] = bi;
    }
    __syncthreads();
    if (t == 0) {
        for (int i = 1; i < SMP_THREADS / 32; i++)
            if (smp_race_better(shs[i], shi[i], bs, bi)) bs = shs[i], bi = shi[i];
        rp[0] = bi >= 0 ? bs : -INFINITY;
        rp[1] = (double)bi;
    }
}

/* ------------------------------------------------------------------------ */
/* 2 + 4. selection and the final sort in shared memory                     */
/* ------------------------------------------------------------------------ */

#define SMP_SEL_PER (SMP_SORT_KEYS / SMP_SORT_THREADS) /* keys per thread */

/* The k-th largest (1 <= k <= n) of the n keys in[0, n) (n <= SMP_SORT_KEYS),
 * on every thread of the block (SMP_SORT_THREADS): a radix select over 8-bit
 * digits from the top. Each pass counts the keys that match the digits chosen
 * so far by their next digit (shared-memory histogram), and warp 0 finds the
 * digit whose bin holds the k-th; when that bin holds one key, that key is
 * the answer and the passes stop (usually after 2-3 of the 8). */
static __device__ u64 smp_select(const u64 *__restrict__ in, int n, int k) {
    __shared__ unsigned hist[256];
    __shared__ unsigned sel[3];   /* digit, keys above its bin, keys in it */
    __shared__ u64 found;
    const int t = threadIdx.x;
    u64 v[SMP_SEL_PER];
#pragma unroll
    for (int j = 0; j < SMP_SEL_PER; j++) {
        int i = t + j * SMP_SORT_THREADS;
        v[j] = i < n ? in[i] : 0ull;
    }
    u64 prefix = 0, mask = 0;
    unsigned kk = (unsigned)k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        if (t < 256) hist[t] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SMP_SEL_PER; j++)
            if (t + j * SMP_SORT_THREADS < n && (v[j] & mask) == prefix)
                atomicAdd(&hist[(unsigned)(v[j] >> shift) & 255u], 1u);
        __syncthreads();
        if (t < 32) { /* lane l: digits 255 - 8 l down to 248 - 8 l */
            unsigned c[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = hist[255 - 8 * t - i];
                sum += c[i];
            }
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
                if (t >= o) incl += y;
            }
            unsigned above = incl - sum;
            if (above < kk && kk <= incl) {
                int i = 0;
                while (above + c[i] < kk) above += c[i++];
                sel[0] = 255u - 8u * (unsigned)t - (unsigned)i;
                sel[1] = above;
                sel[2] = c[i];
            }
        }
        __syncthreads();
        prefix |= (u64)sel[0] << shift;
        mask |= 255ull << shift;
        kk -= sel[1];
        if (sel[2] == 1 && shift > 0) { /* one key has these digits: it */
#pragma unroll
            for (int j = 0; j < SMP_SEL_PER; j++)
                if (t + j * SMP_SORT_THREADS < n && (v[j] & mask) == prefix) found = v[j];
            __syncthreads();
            return found;
        }
    }
    return prefix;
}

/* Sorts s[0, P) descending, P a power of two. Each stage runs over the P/2
 * compare-exchange pairs (i, i + j) with i & j == 0. */
static __device__ void smp_bitonic_desc(u64 *s, int P) {
    const int half = P >> 1;
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int p = threadIdx.x; p < half; p += blockDim.x) {
                const int i = ((p & ~(j - 1)) << 1) | (p & (j - 1)), x = i + j;
                u64 a = s[i], b = s[x];
                bool desc = (i & k) == 0;
                if (desc ? a < b : a > b) {
                    s[i] = b;
                    s[x] = a;
                }
            }
            __syncthreads();
        }
}

/* Row r's header (maxima, sums of exps, the race's winner) and, for k = 1,
 * its candidate T, from the n_chunks blocks' partials; by the block's first
 * warp (blockDim.x >= 32). Lane b computes block b's terms (exp in double),
 * lane 0 adds them in block order (the sequential sum's bits). */
static __device__ void smp_row_header(int r, u64 T, const double *__restrict__ part,
                                      const float *__restrict__ inv_t, float *__restrict__ out,
                                      int n_chunks, int k, int n_cols,
                                      const double *__restrict__ rpart,
                                      const float *__restrict__ logits,
                                      const float *__restrict__ proc,
                                      const int *__restrict__ adj_start, int ld, int vs) {
    __shared__ double tw[SMP_MAX_CHUNKS1], tr[SMP_MAX_CHUNKS1];
    const int lane = threadIdx.x;
    if (lane >= 32) return;
    /* __ldcg: other blocks of this kernel may have written them (smp_scan1_kernel) */
    const double *p = part + (size_t)r * n_chunks * 4;
    float mw = -INFINITY, mr = -INFINITY;
    for (int b = lane; b < n_chunks; b += 32) {
        mw = fmaxf(mw, (float)__ldcg(p + 4 * b));
        mr = fmaxf(mr, (float)__ldcg(p + 4 * b + 2));
    }
    for (int o = 16; o > 0; o >>= 1) {
        mw = fmaxf(mw, __shfl_xor_sync(0xffffffffu, mw, o));
        mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, o));
    }
    const float it = inv_t[r];
    for (int b = lane; b < n_chunks; b += 32) {
        float bw = (float)__ldcg(p + 4 * b), br = (float)__ldcg(p + 4 * b + 2);
        tw[b] = bw > -INFINITY ? __ldcg(p + 4 * b + 1) * exp((double)((bw - mw) * it)) : 0.0;
        tr[b] = br > -INFINITY ? __ldcg(p + 4 * b + 3) * exp((double)(br - mr)) : 0.0;
    }
    __syncwarp();
    if (lane) return;
    double sw = 0, sr = 0;
    for (int b = 0; b < n_chunks; b++) {
        sw += tw[b];
        sr += tr[b];
    }
    float *row = out + (size_t)r * (SAMPLE_HDR + 3 * (size_t)k);
    row[0] = mw;
    memcpy(row + 1, &sw, sizeof sw);
    row[3] = mr;
    memcpy(row + 4, &sr, sizeof sr);
    int kk = n_cols < k ? n_cols : k;
    row[6] = __int_as_float(kk);
    /* the race: the best block (rpart NULL: no race in the batch) */
    double bs = -INFINITY;
    int bi = -1;
    for (int b = 0; rpart && b < n_chunks; b++) {
        const double *rp = rpart + ((size_t)r * n_chunks + b) * 2;
        const double s0 = __ldcg(rp), s1 = __ldcg(rp + 1);
        if (smp_race_better(s0, (int)s1, bs, bi)) bs = s0, bi = (int)s1;
    }
    row[7] = __int_as_float(bi);
    memcpy(row + 8, &bs, sizeof bs);
    const float *raw = logits + (size_t)r * ld;
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : raw;
    row[10] = bi >= 0 ? w[bi - vs] : -INFINITY;
    row[11] = bi >= 0 ? raw[bi - vs] : -INFINITY;
    if (k == 1) { /* the largest group maximum is the candidate: no gather / final */
        int id = n_cols > 0 ? smp_key_id(T) : -1;
        row[SAMPLE_HDR] = id >= 0 ? w[id - vs] : -INFINITY;
        row[SAMPLE_HDR + 1] = id >= 0 ? raw[id - vs] : -INFINITY;
        row[SAMPLE_HDR + 2] = __int_as_float(id);
    }
}

static __global__ void __launch_bounds__(SMP_SORT_THREADS)
smp_thresh_kernel(const u64 *__restrict__ gkeys, const double *__restrict__ part,
                  const float *__restrict__ inv_t, u64 *__restrict__ thresh, int *__restrict__ count,
                  float *__restrict__ out, int G, int n_chunks, int k, int n_cols,
                  const double *__restrict__ rpart, const float *__restrict__ logits,
                  const float *__restrict__ proc, const int *__restrict__ adj_start, int ld,
                  int vs) {
    int r = blockIdx.x;
    u64 T = k <= G ? smp_select(gkeys + (size_t)r * G, G, k) : 0ull;
    if (threadIdx.x == 0) {
        thresh[r] = T;
        count[r] = 0;
    }
    smp_row_header(r, T, part, inv_t, out, n_chunks, k, n_cols, rpart, logits, proc, adj_start,
                   ld, vs);
}

/* ------------------------------------------------------------------------ */
/* 1+R+2 for k = 1, one kernel                                              */
/* ------------------------------------------------------------------------ */

/* scan (and the race where the row races) of one chunk of GS * SMP_THREADS
 * columns as smp_scan_kernel / smp_race_kernel compute them, the block's
 * best key instead of its group keys; the row's last block to arrive
 * (arrive[r], reset to 0 by it) writes the row as smp_thresh_kernel does for
 * k = 1. part / rpart / bkeys: [m, n_chunks] of this kernel's chunks. */
template <int GS>
static __global__ void __launch_bounds__(SMP_THREADS)
smp_scan1_kernel(const float *__restrict__ logits, const float *__restrict__ proc,
                 const int *__restrict__ adj_start, const float *__restrict__ inv_t,
                 const int *__restrict__ race, double *__restrict__ part,
                 double *__restrict__ rpart, u64 *__restrict__ bkeys, int *__restrict__ arrive,
                 float *__restrict__ out, int ld, int n_cols, int vs, int n_chunks) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    __shared__ u64 shk[SMP_THREADS / 32];
    __shared__ double shs[SMP_THREADS / 32];
    __shared__ int shi[SMP_THREADS / 32];
    __shared__ int last;
    int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x, lane = t & 31, wid = t >> 5;
    const float *raw = logits + (size_t)r * ld;
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : raw;
    const int base = b * (GS * SMP_THREADS) + t;
    const float it = inv_t[r];
    float wv[GS], bw, br;
    double dsw, dsr;
    u64 gk;
    smp_scan_chunk<GS>(w, raw, base, n_cols, vs, it, shf, shd, wv, gk, bw, dsw, br, dsr);
    for (int o = 16; o > 0; o >>= 1) {
        u64 ok = __shfl_xor_sync(0xffffffffu, gk, o);
        gk = ok > gk ? ok : gk;
    }
    if (lane == 0) shk[wid] = gk;
    __syncthreads();
    const bool races = rpart && race[3 * r + 2];
    double bs = -INFINITY;
    int bi = -1;
    if (races) { /* smp_race_kernel's loop over the same columns, from registers */
        u64 key = (u64)(unsigned)race[3 * r] | ((u64)(unsigned)race[3 * r + 1] << 32);
#pragma unroll
        for (int j = 0; j < GS; j++) {
            int c = base + j * SMP_THREADS;
            if (c < n_cols && isfinite(wv[j])) {
                double sc = smp_race_score(key, vs + c, wv[j], it);
                if (bi < 0 || sc > bs) bs = sc, bi = vs + c;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            double os = __shfl_xor_sync(0xffffffffu, bs, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (smp_race_better(os, oi, bs, bi)) bs = os, bi = oi;
        }
        if (lane == 0) {
            shs[wid] = bs;
            shi[wid] = bi;
        }
        __syncthreads();
    }
    if (t == 0) {
        u64 k = shk[0];
        for (int i = 1; i < SMP_THREADS / 32; i++) k = shk[i] > k ? shk[i] : k;
        bkeys[(size_t)r * n_chunks + b] = k;
        double *p = part + ((size_t)r * n_chunks + b) * 4;
        p[0] = bw;
        p[1] = dsw;
        p[2] = br;
        p[3] = dsr;
        if (rpart) {
            double *rp = rpart + ((size_t)r * n_chunks + b) * 2;
            if (races) {
                for (int i = 1; i < SMP_THREADS / 32; i++)
                    if (smp_race_better(shs[i], shi[i], bs, bi)) bs = shs[i], bi = shi[i];
                rp[0] = bi >= 0 ? bs : -INFINITY;
                rp[1] = (double)bi;
            } else {
                rp[0] = -INFINITY;
                rp[1] = -1.0;
            }
        }
        __threadfence();
        last = atomicAdd(&arrive[r], 1) == n_chunks - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence(); /* the other blocks' partials, seen after their arrival */
    u64 T = 0;
    if (t < 32) {
        for (int i = t; i < n_chunks; i += 32) {
            u64 k = __ldcg(bkeys + (size_t)r * n_chunks + i);
            T = k > T ? k : T;
        }
        for (int o = 16; o > 0; o >>= 1) {
            u64 ok = __shfl_xor_sync(0xffffffffu, T, o);
            T = ok > T ? ok : T;
        }
        if (t == 0) arrive[r] = 0;
    }
    smp_row_header(r, T, part, inv_t, out, n_chunks, 1, n_cols, rpart, logits, proc, adj_start,
                   ld, vs);
}

/* ------------------------------------------------------------------------ */
/* 3. gather                                                                */
/* ------------------------------------------------------------------------ */

static __global__ void __launch_bounds__(SMP_THREADS)
smp_gather_kernel(const float *__restrict__ logits, const float *__restrict__ proc,
                  const int *__restrict__ adj_start, const u64 *__restrict__ gkeys,
                  const u64 *__restrict__ thresh, int *__restrict__ count, u64 *__restrict__ ckeys,
                  int ld, int n_cols, int vs, int G, int cap) {
    int r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
    u64 T = thresh[r];
    if (gkeys[(size_t)r * G + (size_t)b * SMP_THREADS + t] < T) return;
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : logits + (size_t)r * ld;
    int base = b * SMP_CHUNK + t;
    for (int j = 0; j < SMP_GS; j++) {
        int c = base + j * SMP_THREADS;
        if (c >= n_cols) break;
        u64 key = smp_key(w[c], vs + c);
        if (key >= T) {
            int pos = atomicAdd(&count[r], 1);
            if (pos < cap) ckeys[(size_t)r * cap + pos] = key;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* 4. final                                                                 */
/* ------------------------------------------------------------------------ */

static __global__ void __launch_bounds__(SMP_SORT_THREADS)
smp_final_kernel(const float *__restrict__ logits, const float *__restrict__ proc,
                 const int *__restrict__ adj_start, const int *__restrict__ count,
                 const u64 *__restrict__ ckeys, float *__restrict__ out, int ld, int n_cols, int vs,
                 int k, int cap) {
    __shared__ u64 smp_sh[SAMPLE_MAX_K];
    __shared__ int n_top;
    int r = blockIdx.x;
    int n = count[r] < cap ? count[r] : cap;
    /* the best min(k, n) of the n gathered keys (distinct), sorted */
    const u64 *ck = ckeys + (size_t)r * cap;
    u64 T = k < n ? smp_select(ck, n, k) : 0ull;
    int m = k < n ? k : n, P = 1;
    while (P < m) P <<= 1;
    if (threadIdx.x == 0) n_top = 0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) smp_sh[i] = 0ull;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (ck[i] >= T) smp_sh[atomicAdd(&n_top, 1)] = ck[i];
    __syncthreads();
    smp_bitonic_desc(smp_sh, P);
    const float *raw = logits + (size_t)r * ld;
    const float *w = adj_start[r + 1] > adj_start[r] ? proc + (size_t)r * ld : raw;
    float *row = out + (size_t)r * (SAMPLE_HDR + 3 * (size_t)k);
    int kk = n_cols < k ? n_cols : k;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        if (i < kk && i < n) {
            int id = smp_key_id(smp_sh[i]);
            row[SAMPLE_HDR + i] = w[id - vs];
            row[SAMPLE_HDR + k + i] = raw[id - vs];
            row[SAMPLE_HDR + 2 * k + i] = __int_as_float(id);
        } else {
            row[SAMPLE_HDR + i] = -INFINITY;
            row[SAMPLE_HDR + k + i] = -INFINITY;
            row[SAMPLE_HDR + 2 * k + i] = __int_as_float(-1);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* entry                                                                    */
/* ------------------------------------------------------------------------ */

static size_t even(size_t x) { return (x + 1) & ~(size_t)1; }

void ops_cuda__sample_topk(void *ctx, struct buf *out, const struct buf *logits,
                           struct buf *work, const struct sample_batch *sb) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    int m = sb->m, k = sb->k, ld = sb->ld, nc = sb->n_cols, vs = sb->vocab_start;
    if (m <= 0) return;
    AWQD_ASSERT(k >= 1 && k <= SAMPLE_MAX_K && nc >= 0 && nc <= ld);
    AWQD_ASSERT(nc <= SMP_MAX_CHUNKS * SMP_CHUNK);
    int n_adj = sb->h_adj_start[m];
    AWQD_ASSERT(out->n >= SAMPLE_OUT_FLOATS(m, k, n_adj) && logits->n >= (size_t)m * ld);
    AWQD_ASSERT(work->n >= sample_work_floats(m, ld, k));
    int n_chunks = (nc + SMP_CHUNK - 1) / SMP_CHUNK;
    if (n_chunks < 1) n_chunks = 1;
    int G = n_chunks * SMP_THREADS;
    int cap = SMP_GS * k;
    float *wb = (float *)work->d;
    size_t off = 0;
    float *proc = wb + off;
    off = even(off + (size_t)m * ld);
    u64 *gkeys = (u64 *)(wb + off);
    off = even(off + 2 * (size_t)m * G);
    u64 *ckeys = (u64 *)(wb + off);
    off = even(off + 2 * (size_t)m * cap);
    double *part = (double *)(wb + off);
    off = even(off + 2 * 4 * (size_t)m * n_chunks);
    double *rpart = sb->race ? (double *)(wb + off) : NULL;
    off = even(off + 2 * 2 * (size_t)m * n_chunks);
    u64 *thresh = (u64 *)(wb + off);
    off = even(off + 2 * (size_t)m);
    int *count = (int *)(wb + off);
    off += (size_t)m;
    AWQD_ASSERT(off <= work->n);
    const float *lg = (const float *)logits->d;
    const int *as = (const int *)sb->adj_start->d;
    const float *it = (const float *)sb->inv_t->d;
    float *o = (float *)out->d;
    cudaStream_t st = c->stream;
    const bool fused = k == 1 && c->smp_fuse;
    if (fused && m > c->smp_arrive_cap) { /* arrival counters, zero between calls */
        if (c->smp_arrive) {
            cudaStreamSynchronize(st);
            cudaFree(c->smp_arrive);
            c->smp_arrive = NULL;
            c->smp_arrive_cap = 0;
        }
        int cap = m < 64 ? 64 : m;
        cudaError_t e = cudaMalloc((void **)&c->smp_arrive, sizeof(int) * (size_t)cap);
        if (e == cudaSuccess) e = cudaMemsetAsync(c->smp_arrive, 0, sizeof(int) * (size_t)cap, st);
        if (e != cudaSuccess) {
            ops_cuda__fail(c, -ENOMEM, "sample_topk", cudaGetErrorString(e));
            return;
        }
        c->smp_arrive_cap = cap;
    }
    PROF_BEGIN(c, "sample_topk", m, nc);
    if (n_adj > 0)
        smp_adjust_kernel<<<m, 256, 0, st>>>(lg, proc, o + (size_t)m * SAMPLE_ROW_FLOATS(k), as,
                                             (const int *)sb->adj->d, ld, nc, vs);
    dim3 grid(n_chunks, m);
    if (fused) {
        /* its partials [m, n1] in the group keys' space (2 m G floats >= 14 m n1) */
        const int gs = c->smp_gs == 32 ? 32 : SMP_GS1;
        const int n1 = nc > 0 ? (nc + gs * SMP_THREADS - 1) / (gs * SMP_THREADS) : 1;
        double *part1 = (double *)gkeys, *rpart1 = rpart ? part1 + 4 * (size_t)m * n1 : NULL;
        u64 *bkeys = (u64 *)(part1 + 6 * (size_t)m * n1);
        AWQD_ASSERT(14 * (size_t)m * n1 <= 2 * (size_t)m * G);
        const int *rc3 = sb->race ? (const int *)sb->race->d : NULL;
        dim3 g1(n1, m);
        if (gs == 32)
            smp_scan1_kernel<32><<<g1, SMP_THREADS, 0, st>>>(lg, proc, as, it, rc3, part1, rpart1,
                                                             bkeys, c->smp_arrive, o, ld, nc, vs, n1);
        else
            smp_scan1_kernel<SMP_GS1><<<g1, SMP_THREADS, 0, st>>>(
                lg, proc, as, it, rc3, part1, rpart1, bkeys, c->smp_arrive, o, ld, nc, vs, n1);
        OPS_CUDA_LAUNCHED(c, "sample_topk");
        PROF_END(c);
        return;
    }
    smp_scan_kernel<<<grid, SMP_THREADS, 0, st>>>(lg, proc, as, it, gkeys, part, ld, nc, vs, G,
                                                  n_chunks);
    if (rpart)
        smp_race_kernel<<<grid, SMP_THREADS, 0, st>>>(lg, proc, as, it, (const int *)sb->race->d,
                                                      rpart, ld, nc, vs, n_chunks);
    smp_thresh_kernel<<<m, SMP_SORT_THREADS, 0, st>>>(gkeys, part, it, thresh, count, o, G,
                                                      n_chunks, k, nc, rpart, lg, proc, as, ld, vs);
    if (k > 1) {
        smp_gather_kernel<<<grid, SMP_THREADS, 0, st>>>(lg, proc, as, gkeys, thresh, count, ckeys,
                                                        ld, nc, vs, G, cap);
        smp_final_kernel<<<m, SMP_SORT_THREADS, 0, st>>>(lg, proc, as, count, ckeys, o, ld, nc, vs,
                                                         k, cap);
    }
    OPS_CUDA_LAUNCHED(c, "sample_topk");
    PROF_END(c);
}
