/* cpu.h — internals of the CPU reference backend shared by its files and by
 * comm/comm_cpu.c (which sums CPU buffers in place). Not for the model.
 *
 * A CPU buffer is plain host memory: BUF_ACT, BUF_F32 and BUF_W16 hold float
 * (W16 converted from fp16 at upload), BUF_I32 holds int32_t. */
#ifndef AWQD_KERNELS_CPU_H
#define AWQD_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

struct buf {
    enum buf_kind kind;
    size_t n;                     /* elements */
    void *data;                   /* float [n] or int32_t [n] */
};

static inline float *cpu_f32(const struct buf *b) { return (float *)b->data; }
static inline int32_t *cpu_i32(const struct buf *b) { return (int32_t *)b->data; }

/* --- a small pthread pool ------------------------------------------------
 * cpu_pool_run splits [0, n) into chunks and calls fn(arg, begin, end) on the
 * pool's threads and the calling thread; it returns when all chunks are done.
 * One caller at a time. n_threads <= 1: runs inline, no threads. */
struct cpu_pool;
int cpu_pool_init(struct cpu_pool **out, int n_threads);
void cpu_pool_free(struct cpu_pool *p);
int cpu_pool_threads(const struct cpu_pool *p);
void cpu_pool_run(struct cpu_pool *p, int n, int min_chunk,
                  void (*fn)(void *arg, int begin, int end), void *arg);

#endif
