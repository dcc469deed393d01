/* stamps.cuh — per-block phase timestamps inside the W4A16 kernels (decode,
 * skinny, tc64, the wgmma GEMM's modes 3 / 4) and the decode attention, for
 * finding where a kernel's microseconds go (CUPTI gives a kernel's start and
 * end only). Compiled in only with -DAWQD_STAMPS:
 *
 *   make CUDA=1 NVCCFLAGS="-O3 -lineinfo -DAWQD_STAMPS" ...
 *
 * Without it every macro below is empty and the kernels are unchanged.
 *
 * With it, thread 0 of each block (the first ST_BLOCKS blocks of a launch)
 * writes %globaltimer (ns) at the kernel's marked points into a table of
 * this translation unit, one row per launch key (a kernel and its shape:
 * ST_SLOTS keys per unit, claimed first come). A later launch with the same
 * key overwrites its row, so after a decode run the table holds the last
 * launch of each key: the last layer of the last step. st_dump (host)
 * prints, per key, the blocks' first entry and, per point, the median, min
 * and max over blocks of the time since the earliest entry of the whole
 * table (a timeline of that layer; @b: the block of the max, blockIdx.x +
 * gridDim.x (blockIdx.y + gridDim.y blockIdx.z)), and the median per-block
 * time since the block's own entry. ops_cuda's teardown prints every unit's
 * table to stderr. Not thread- or rank-safe: one GPU, one model (tp = 1). */
#pragma once

#ifdef AWQD_STAMPS
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define ST_SLOTS 12
#define ST_BLOCKS 512
#define ST_POINTS 8

struct st_table {
    unsigned long long key[ST_SLOTS];
    unsigned long long t[ST_SLOTS][ST_BLOCKS][ST_POINTS]; /* 0: not reached */
};
static __device__ st_table g_st;

static __device__ __forceinline__ unsigned long long st_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* the row of key (claimed on first use); -1 when the table is full */
static __device__ __forceinline__ int st_row(unsigned long long key) {
    for (int i = 0; i < ST_SLOTS; i++) {
        const unsigned long long k = atomicCAS(&g_st.key[i], 0ull, key);
        if (k == 0ull || k == key) return i;
    }
    return -1;
}

static __device__ __forceinline__ int st_block(void) {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

/* ST_BEGIN clears the block's later points (a point a launch does not reach
 * reads 0, not the previous launch's time) and stamps point 0 */
#define ST_DECL int st_row_ = -1
/* a device function that stamps too takes the kernel's row: f(... ST_PARAM), f(... ST_ARG) */
#define ST_PARAM , int st_row_
#define ST_ARG , st_row_
#define ST_BEGIN(keyv)                                                               \
    do {                                                                             \
        if (threadIdx.x == 0 && st_block() < ST_BLOCKS) {                            \
            st_row_ = st_row(keyv);                                                  \
            if (st_row_ >= 0) {                                                      \
                for (int p_ = 1; p_ < ST_POINTS; p_++) g_st.t[st_row_][st_block()][p_] = 0; \
                g_st.t[st_row_][st_block()][0] = st_now();                           \
            }                                                                        \
        }                                                                            \
    } while (0)
#define ST_MARK(p)                                                                   \
    do {                                                                             \
        if (threadIdx.x == 0 && st_row_ >= 0) g_st.t[st_row_][st_block()][p] = st_now(); \
    } while (0)
/* a key: kind (1..15) in the top bits, then two shape numbers */
#define ST_KEY(kind, a, b) (((unsigned long long)(kind) << 56) | ((unsigned long long)(a) << 28) | (unsigned long long)(b))

static int st_cmp(const void *a, const void *b) {
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* prints this unit's table (unit: its name; names: one line per point) */
static void st_dump(const char *unit, const char *const *kinds, const char *points) {
    st_table *h = (st_table *)malloc(sizeof(st_table));
    if (!h) return;
    if (cudaMemcpyFromSymbol(h, g_st, sizeof(st_table)) != cudaSuccess) {
        cudaGetLastError();
        free(h);
        return;
    }
    unsigned long long t0 = ~0ull;
    for (int r = 0; r < ST_SLOTS; r++)
        for (int b = 0; b < ST_BLOCKS && h->key[r]; b++)
            if (h->t[r][b][0] && h->t[r][b][0] < t0) t0 = h->t[r][b][0];
    fprintf(stderr, "stamps %s (points: %s); ns from the table's first entry (globaltimer %llu: align the"
                    " units by it): median [min, max] over blocks | median since the block's entry (blocks)\n",
            unit, points, t0);
    long long v[ST_BLOCKS], w[ST_BLOCKS];
    for (int r = 0; r < ST_SLOTS; r++) {
        if (!h->key[r]) continue;
        const unsigned long long k = h->key[r];
        fprintf(stderr, "  %s %llu x %llu:", kinds[(k >> 56) & 15], (k >> 28) & 0xfffffffull, k & 0xfffffffull);
        for (int p = 0; p < ST_POINTS; p++) {
            int n = 0, bmax = -1;
            for (int b = 0; b < ST_BLOCKS; b++)
                if (h->t[r][b][0] && h->t[r][b][p]) {
                    v[n] = (long long)(h->t[r][b][p] - t0);
                    w[n++] = (long long)(h->t[r][b][p] - h->t[r][b][0]);
                    if (bmax < 0 || h->t[r][b][p] > h->t[r][bmax][p]) bmax = b;
                }
            if (!n) continue;
            qsort(v, n, sizeof *v, st_cmp);
            qsort(w, n, sizeof *w, st_cmp);
            fprintf(stderr, "  p%d %lld [%lld, %lld @%d] | %lld (%d)", p, v[n / 2], v[0], v[n - 1], bmax,
                    w[n / 2], n);
        }
        fprintf(stderr, "\n");
    }
    free(h);
}
#else
#define ST_DECL
#define ST_PARAM
#define ST_ARG
#define ST_BEGIN(keyv)
#define ST_MARK(p)
#endif
