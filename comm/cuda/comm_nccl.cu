/* comm_nccl.cu — all-reduce between CUDA tensor-parallel ranks that are
 * threads of one process: NCCL, and one-shot peer-to-peer kernels for small
 * (decode-sized) messages: the default "push" kernel (data written straight
 * into every peer's receive area, the data itself being the flag) and the
 * older "flags" kernel (own staging + a flag barrier, peers pull). See
 * comm_cuda.h for the contract and docs/TENSOR_PARALLEL.md for the
 * protocols. */
#include "comm/cuda/comm_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

extern "C" {
#include "engine/util.h"
#include "kernels/ops.h"
}
#include "kernels/cuda/ops_cuda_access.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/xchg.cuh"

#define P2P_THREADS 256
#define P2P_BLOCKS 32                     /* every call uses all of them (see the kernel) */
#define P2P_CAP_DEFAULT (2u << 20)       /* bytes per message the p2p buffers hold */
#define P2P_CAP_MAX (16u << 20)

#define LP_THREADS 256
#define LP_BLOCKS 64                      /* every call uses all of them (epochs) */

/* ------------------------------------------------------------------------ */
/* The one-shot kernel                                                      */
/* ------------------------------------------------------------------------ */

/* Everything a rank's kernel needs; fixed after attach, so a captured launch
 * stays valid for the life of the group. */
struct p2p_args {
    __half *stage[COMM_CUDA_MAX_RANKS];   /* each rank's staging: fp16 [2][cap_elems] (device r) */
    unsigned *flags[COMM_CUDA_MAX_RANKS]; /* each rank's flags: [MAX_RANKS][P2P_BLOCKS] (device r) */
    unsigned *epoch;                      /* this rank's calls so far, per block: [P2P_BLOCKS] */
    volatile int *ctl;                    /* mapped host [2]: abort, timed-out rank + 1 */
    int rank, size;
    unsigned long long cap_elems;
    unsigned long long timeout_ns;        /* 0: wait forever (still leaves on abort) */
};

/* Block b of every rank owns elements [b * per, (b + 1) * per) (per: a
 * multiple of 8). Call e (the block's epoch, the same on every rank because
 * every call launches all P2P_BLOCKS blocks on every rank) uses staging half
 * e & 1:
 *   1. copy this rank's slice of buf into its own staging[e & 1];
 *   2. __syncthreads, then thread p (p != rank) fences (system scope) and
 *      writes e into rank p's flag [rank][b];
 *   3. thread p spins (volatile) until this rank's flag [p][b] >= e, fences;
 *   4. __syncthreads; every thread sums its elements over ranks 0..size-1 in
 *      order (fp32) from the staging buffers and writes buf.
 * Reuse of staging[e & 1] at call e + 2 is safe: this rank's call e + 1
 * kernel finished only after every peer block signalled e + 1, which each
 * did after its call e kernel (and so its reads) had ended. */
__global__ void __launch_bounds__(P2P_THREADS)
p2p_allreduce_kernel(struct p2p_args a, __half *buf, unsigned long long n, unsigned long long per) {
    __shared__ unsigned s_e;
    __shared__ int s_bad;
    const int b = blockIdx.x, t = threadIdx.x;
    if (t == 0) {
        s_e = a.epoch[b] + 1;
        a.epoch[b] = s_e;
        s_bad = 0;
    }
    __syncthreads();
    const unsigned e = s_e;
    const unsigned long long off = (unsigned long long)(e & 1) * a.cap_elems;
    unsigned long long lo = (unsigned long long)b * per, hi = lo + per;
    if (hi > n) hi = n;
    if (lo > hi) lo = hi;
    const unsigned long long vec_end = lo + (hi - lo) / 8 * 8;
    __half *mine = a.stage[a.rank] + off;

    /* 1. publish */
    for (unsigned long long i = lo + (unsigned long long)t * 8; i < vec_end; i += P2P_THREADS * 8)
        *(uint4 *)(mine + i) = *(const uint4 *)(buf + i);
    for (unsigned long long i = vec_end + t; i < hi; i += P2P_THREADS) mine[i] = buf[i];
    __syncthreads();

    /* 2. signal, 3. wait */
    if (t < a.size && t != a.rank) {
        __threadfence_system();
        volatile unsigned *to = a.flags[t] + a.rank * P2P_BLOCKS + b;
        *to = e;
        volatile unsigned *from = a.flags[a.rank] + t * P2P_BLOCKS + b;
        unsigned spins = 0;
        unsigned long long t0 = 0;
        while ((int)(*from - e) < 0) {
            if ((++spins & 1023) == 0 && xchg_give_up(a.ctl, a.timeout_ns, a.rank, &t0)) {
                s_bad = 1;
                break;
            }
        }
        __threadfence_system();
    }
    __syncthreads();
    if (s_bad) return;

    /* 4. sum in rank order */
    for (unsigned long long i = lo + (unsigned long long)t * 8; i < vec_end; i += P2P_THREADS * 8) {
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.f;
        for (int p = 0; p < a.size; p++) {
            uint4 v = __ldcv((const uint4 *)(a.stage[p] + off + i));
            const __half2 *h = (const __half2 *)&v;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __half22float2(h[j]);
                acc[2 * j] += f.x;
                acc[2 * j + 1] += f.y;
            }
        }
        uint4 o;
        __half2 *oh = (__half2 *)&o;
#pragma unroll
        for (int j = 0; j < 4; j++) oh[j] = __floats2half2_rn(acc[2 * j], acc[2 * j + 1]);
        *(uint4 *)(buf + i) = o;
    }
    for (unsigned long long i = vec_end + t; i < hi; i += P2P_THREADS) {
        float acc = 0.f;
        for (int p = 0; p < a.size; p++) {
            const unsigned short *src = (const unsigned short *)(a.stage[p] + off + i);
            unsigned short bits = *(const volatile unsigned short *)src;
            acc += __half2float(__ushort_as_half(bits));
        }
        buf[i] = __float2half_rn(acc);
    }
}

/* ------------------------------------------------------------------------ */
/* The push kernel (default p2p path)                                       */
/* ------------------------------------------------------------------------ */

/* Fixed after attach, like p2p_args. */
struct lp_args {
    __half *recv[COMM_CUDA_MAX_RANKS];    /* each rank's receive area: fp16 [2][size][cap_elems]
                                           * (device r), every element -0.0 when idle */
    __half *mine;                         /* recv[rank] */
    unsigned *epoch;                      /* this rank's calls so far, per block: [LP_BLOCKS] */
    volatile int *ctl;                    /* mapped host [2]: abort, timed-out rank + 1 */
    int rank, size;
    unsigned long long cap_elems;
    unsigned long long timeout_ns;
};

static __device__ __forceinline__ uint4 lp_fix4(uint4 v) {
    v.x = xchg_fix(v.x);
    v.y = xchg_fix(v.y);
    v.z = xchg_fix(v.z);
    v.w = xchg_fix(v.w);
    return v;
}

static __device__ __forceinline__ void lp_acc(float *acc, uint4 v) {
    const __half2 *h = (const __half2 *)&v;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 f = __half22float2(h[j]);
        acc[2 * j] += f.x;
        acc[2 * j + 1] += f.y;
    }
}

/* One-shot all-reduce, push style, with no flags and no fences: the data is
 * its own flag. Every rank's receive area holds -0.0 (0x8000) in every
 * element while idle; senders never send -0.0 (it becomes +0.0, which sums
 * the same).
 * Block b of every rank owns the 8-element vectors [b * per, (b + 1) * per);
 * thread t handles vectors b * per + t + k * LP_THREADS; the n % 8 tail
 * elements go to the last block's first threads. Call e (the block's epoch:
 * the same on every rank, since every call runs all LP_BLOCKS blocks on every
 * rank) uses parity p = e & 1:
 *   1. send: each vector of buf (16-byte load), -0.0 made +0.0, is stored
 *      (16-byte volatile store over NVLink) into every peer q's
 *      recv[p][rank][v];
 *   2. receive: load every peer q's recv[p][q][v] at once (volatile 16-byte
 *      loads), re-poll each until none of its 8 halves is -0.0; then for
 *      q = 0..size-1 in order add this rank's own vector or peer q's (fp32),
 *      storing -0.0 back into each peer slot (idle again); write the fp16 sum
 *      into buf.
 * Every rank adds the same values in the same order: bit-identical results.
 * A 2-byte store is never torn and each half is checked, so a 16-byte store
 * seen in parts is simply polled again.
 * Reusing parity p at call e + 2 is safe: a sender starts call e + 2 only
 * after its call e + 1 kernel received data from every peer, which each peer
 * sent after its call e kernel (and so its clearing of recv[p]) had ended.
 * Waits leave on the group's abort word or after timeout_ns. */
__global__ void __launch_bounds__(LP_THREADS)
lp_allreduce_kernel(struct lp_args a, __half *buf, unsigned long long n, unsigned long long per) {
    __shared__ unsigned s_e;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* launched with programmatic dependent launch (cc_all_reduce): wait for
     * the kernel before (buf, and through its own wait every earlier one:
     * the previous call's receive areas and epochs) before touching
     * anything, then let the next kernel start its constant prologue (a
     * linear's weight loads) while this one waits for the peers. No-ops
     * without the launch attribute. */
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const int b = blockIdx.x, t = threadIdx.x;
    const unsigned long long nvec = n / 8;
    unsigned long long lo = (unsigned long long)b * per, hi = lo + per;
    if (hi > nvec) hi = nvec;
    if (lo > hi) lo = hi;
    const unsigned long long v0 = lo + (unsigned long long)t;
    uint4 first = make_uint4(0, 0, 0, 0);
    if (v0 < hi) first = *(const uint4 *)(buf + v0 * 8); /* overlaps the epoch load */
    if (t == 0) {
        unsigned e = a.epoch[b] + 1;
        a.epoch[b] = e;
        s_e = e;
    }
    __syncthreads();
    const unsigned long long par = s_e & 1;
    const unsigned long long cap = a.cap_elems;
    const int rank = a.rank, size = a.size;
    /* tail: elements nvec * 8 + t of the last block's threads t < n % 8 */
    const int tail = b == LP_BLOCKS - 1 && (unsigned long long)t < n - nvec * 8;
    const unsigned long long ti = nvec * 8 + (unsigned long long)t;

    const unsigned long long my_slot = (par * size + rank) * cap; /* in every peer's area */
    __half *const mine = a.mine;

    /* 1. send (the q loop unrolled so that a.recv[q] stays in parameter space) */
    for (unsigned long long v = v0; v < hi; v += LP_THREADS) {
        uint4 x = lp_fix4(v == v0 ? first : *(const uint4 *)(buf + v * 8));
#pragma unroll
        for (int q = 0; q < COMM_CUDA_MAX_RANKS; q++)
            if (q < size && q != rank) xchg_st4(a.recv[q] + my_slot + v * 8, x);
    }
    unsigned short tv = 0;
    if (tail) {
        tv = __half_as_ushort(buf[ti]);
        if (tv == XCHG_NEG0) tv = 0;
#pragma unroll
        for (int q = 0; q < COMM_CUDA_MAX_RANKS; q++)
            if (q < size && q != rank) xchg_st1(a.recv[q] + my_slot + ti, tv);
    }

    /* 2. receive, sum in rank order */
    const uint4 empty = make_uint4(XCHG_EMPTY2, XCHG_EMPTY2, XCHG_EMPTY2, XCHG_EMPTY2);
    for (unsigned long long v = v0; v < hi; v += LP_THREADS) {
        /* every peer's load in flight at once, then re-poll the ones not
         * there yet (q unrolled: y stays in registers) */
        uint4 y[COMM_CUDA_MAX_RANKS];
        __half *const area = mine + par * size * cap + v * 8; /* + q * cap: from rank q */
#pragma unroll
        for (int q = 0; q < COMM_CUDA_MAX_RANKS; q++)
            if (q < size && q != rank) y[q] = xchg_ld4(area + q * cap);
#pragma unroll
        for (int q = 0; q < COMM_CUDA_MAX_RANKS; q++) {
            if (q >= size || q == rank) continue;
            unsigned spins = 0;
            unsigned long long t0 = 0;
            while (xchg_empty(y[q].x) | xchg_empty(y[q].y) | xchg_empty(y[q].z) | xchg_empty(y[q].w)) {
                if ((++spins & 511) == 0 && xchg_give_up(a.ctl, a.timeout_ns, rank, &t0)) return;
                y[q] = xchg_ld4(area + q * cap);
            }
        }
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = 0.f;
#pragma unroll
        for (int q = 0; q < COMM_CUDA_MAX_RANKS; q++) {
            if (q >= size) continue;
            if (q == rank) {
                lp_acc(acc, lp_fix4(v == v0 ? first : *(const uint4 *)(buf + v * 8)));
            } else {
                xchg_st4(area + q * cap, empty); /* the slot is idle again */
                lp_acc(acc, y[q]);
            }
        }
        uint4 o;
        __half2 *oh = (__half2 *)&o;
#pragma unroll
        for (int j = 0; j < 4; j++) oh[j] = __floats2half2_rn(acc[2 * j], acc[2 * j + 1]);
        *(uint4 *)(buf + v * 8) = o;
    }
    if (tail) {
        float acc = 0.f;
        for (int q = 0; q < size; q++) {
            unsigned short y;
            if (q == rank) {
                y = tv;
            } else {
                __half *src = mine + (par * size + q) * cap + ti;
                unsigned spins = 0;
                unsigned long long t0 = 0;
                for (;;) {
                    y = xchg_ld1(src);
                    if (y != XCHG_NEG0) break;
                    if ((++spins & 511) == 0 && xchg_give_up(a.ctl, a.timeout_ns, rank, &t0))
                        return;
                }
                xchg_st1(src, (unsigned short)XCHG_NEG0);
            }
            acc += __half2float(__ushort_as_half(y));
        }
        buf[ti] = __float2half_rn(acc);
    }
}

/* Fills n 32-bit words with v (the receive areas' idle state). */
__global__ void lp_fill_kernel(unsigned *p, unsigned long long n, unsigned v) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = v;
}

/* ------------------------------------------------------------------------ */
/* The group                                                                */
/* ------------------------------------------------------------------------ */

struct cgroup {
    int size;
    int *devices;                 /* [size] */
    ncclComm_t *nccl;             /* [size]; NULL entries after an abort */
    pthread_mutex_t mu;           /* refs */
    int refs;
    pthread_rwlock_t lock;        /* read: an NCCL enqueue; write: abort */
    pthread_barrier_t bar;        /* comm->barrier */
    int aborted;                  /* atomic; under lock (write) when set */
    int abort_rc, abort_rank;
    char msg[256];
    volatile int *ctl;            /* mapped pinned host [2]: abort, timed-out rank + 1 */
    int p2p_ok;
    int nccl_warm;                /* NCCL connected eagerly (capture-safe) */
    int algo;                     /* enum comm_cuda_algo */
    size_t p2p_max, cap_bytes;    /* threshold; largest p2p message */
    /* "flags" kernel */
    __half *stage[COMM_CUDA_MAX_RANKS];   /* fp16 [2][cap] on device r */
    unsigned *flags[COMM_CUDA_MAX_RANKS]; /* u32 [MAX_RANKS][P2P_BLOCKS] on device r */
    unsigned *epoch[COMM_CUDA_MAX_RANKS]; /* u32 [P2P_BLOCKS] on device r */
    /* "push" kernel */
    __half *recv[COMM_CUDA_MAX_RANKS];    /* fp16 [2][size][cap] on device r */
    unsigned *lepoch[COMM_CUDA_MAX_RANKS];/* u32 [LP_BLOCKS] on device r */
    /* the all-reduce fused into the decode kernel (w4a16_linear_sum) */
    uint16_t *xarea[COMM_CUDA_MAX_RANKS]; /* fp16 [2][size][W4A16_SUM_CAP] on device r, -0.0 idle */
    int fused_ok;                 /* the fused path is possible (areas, one device kind) */
    int fused;                    /* 1: sum_desc hands out descriptors (fused_ok && switched on) */
    unsigned long long timeout_ns;
    int fault_rank;
    long fault_call;
};

struct crank {
    struct cgroup *g;
    void *ctx;                    /* ops ctx (CUDA backend) */
    cudaStream_t stream;
    long calls;
    struct p2p_args args;         /* "flags" kernel */
    struct lp_args largs;         /* "push" kernel */
    struct w4a16_sum xs[2];       /* the fused all-reduce, per parity */
};

/* comm_cuda_force_algo: -1, or the algorithm every group uses */
static int g_force_algo = -1;

static void cg_abort(struct cgroup *g, int rank, int rc, const char *what) {
    pthread_rwlock_wrlock(&g->lock);
    if (!__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE)) {
        g->abort_rc = rc;
        g->abort_rank = rank;
        snprintf(g->msg, sizeof g->msg, "rank %d: %s", rank, what);
        g->ctl[0] = 1;
        __atomic_store_n(&g->aborted, 1, __ATOMIC_RELEASE);
        log_error("comm: %s; aborting every rank's collectives", g->msg);
        for (int r = 0; r < g->size; r++)
            if (g->nccl[r]) {
                ncclCommAbort(g->nccl[r]);
                g->nccl[r] = NULL;
            }
    }
    pthread_rwlock_unlock(&g->lock);
}

/* The push kernel with programmatic dependent launch: when the backend's
 * kernels use it (sm_90+) and AWQD_COMM_PDL is not 0. Without it the kernel
 * after every all-reduce is launched only when the all-reduce has ended. */
static int lp_pdl(void *ctx) {
    static const int env = !util_env_is_zero("AWQD_COMM_PDL"); /* thread-safe initialization (C++) */
    return env && ops_cuda_pdl(ctx);
}

/* The bookkeeping of one all-reduce call of rank c (plain or fused): its
 * number, the group's abort state, a timeout a kernel recorded, this rank's
 * backend error, the injected fault. 0 or the negative errno to return. */
static int cc_begin(struct comm *c) {
    struct crank *k = (struct crank *)c->priv;
    struct cgroup *g = k->g;
    long call = k->calls++;
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE)) return -ECANCELED;
    if (g->ctl[1]) {
        char what[96];
        snprintf(what, sizeof what, "p2p all-reduce waited past AWQD_COMM_TIMEOUT_MS for a peer");
        cg_abort(g, g->ctl[1] - 1, -ETIMEDOUT, what);
        return -ETIMEDOUT;
    }
    int be = ops_cuda_error(k->ctx);
    if (be) {
        cg_abort(g, c->rank, be, "CUDA backend error before an all-reduce");
        return be;
    }
    if (c->rank == g->fault_rank && call == g->fault_call) {
        char what[96];
        snprintf(what, sizeof what, "injected fault (AWQD_FAULT_RANK) at all-reduce %ld", call);
        cg_abort(g, c->rank, -EIO, what);
        return -EIO;
    }
    return 0;
}

/* The algorithm in effect (comm_cuda_force_algo over the group's own). */
static int cc_algo(const struct cgroup *g) {
    int algo = __atomic_load_n(&g_force_algo, __ATOMIC_RELAXED);
    return algo < 0 ? g->algo : algo;
}

static int cc_all_reduce(struct comm *c, struct buf *b, size_t n) {
    struct crank *k = (struct crank *)c->priv;
    struct cgroup *g = k->g;
    if (!k->ctx) return -EINVAL;  /* not attached */
    if (ops_cuda_buf_kind(b) != BUF_ACT || n > ops_cuda_buf_len(b)) return -EINVAL;
    int rc = cc_begin(c);
    if (rc) return rc;
    if (n == 0 || g->size == 1) return 0;
    const int algo = cc_algo(g);
    if (algo == COMM_CUDA_OFF) return 0; /* benchmarks only: the sum is not made */
    cudaSetDevice(g->devices[c->rank]);
    size_t bytes = n * 2;
    void *d = ops_cuda_buf_ptr(b);
    /* the kernels move 16-byte vectors; every rank's buffer is a cudaMalloc
     * of the same workspace layout, so all ranks decide alike */
    int p2p = g->p2p_ok && algo != COMM_CUDA_NCCL && bytes <= g->cap_bytes &&
              ((uintptr_t)d & 15) == 0;
    /* above the threshold NCCL (measured faster there inside the model, in
     * graphs too: docs/TENSOR_PARALLEL.md) */
    if (p2p && algo == COMM_CUDA_AUTO && bytes > g->p2p_max) p2p = 0;
    cudaError_t lerr = cudaSuccess;
    if (p2p && algo == COMM_CUDA_P2P_FLAGS) {
        unsigned long long per = ((n + P2P_BLOCKS - 1) / P2P_BLOCKS + 7) / 8 * 8;
        p2p_allreduce_kernel<<<P2P_BLOCKS, P2P_THREADS, 0, k->stream>>>(
            k->args, (__half *)d, (unsigned long long)n, per);
    } else if (p2p) {
        unsigned long long nvec = (unsigned long long)n / 8;
        unsigned long long per = (nvec + LP_BLOCKS - 1) / LP_BLOCKS;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(LP_BLOCKS);
        cfg.blockDim = dim3(LP_THREADS);
        cfg.stream = k->stream;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = lp_pdl(k->ctx);
        lerr = cudaLaunchKernelEx(&cfg, lp_allreduce_kernel, k->largs, (__half *)d,
                                  (unsigned long long)n, per);
    }
    if (p2p) {
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess) e = lerr;
        if (e != cudaSuccess) {
            char what[160];
            snprintf(what, sizeof what, "p2p all-reduce launch: %s", cudaGetErrorString(e));
            cg_abort(g, c->rank, -EIO, what);
            return -EIO;
        }
        return 0;
    }
    pthread_rwlock_rdlock(&g->lock);
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE) || !g->nccl[c->rank]) {
        pthread_rwlock_unlock(&g->lock);
        return -ECANCELED;
    }
    ncclResult_t r = ncclAllReduce(d, d, n, ncclFloat16, ncclSum, g->nccl[c->rank], k->stream);
    pthread_rwlock_unlock(&g->lock);
    if (r != ncclSuccess) {
        char what[160];
        snprintf(what, sizeof what, "ncclAllReduce: %s", ncclGetErrorString(r));
        cg_abort(g, c->rank, -EIO, what);
        return -EIO;
    }
    return 0;
}

/* comm->sum_desc: the fused all-reduce's descriptor for call site `site`
 * (parity site & 1), when the group has the exchange areas and the
 * algorithm in effect is auto or p2p (every rank decides alike: the areas
 * exist on all ranks or none, the algorithm is group-wide). */
static int cc_sum_desc(struct comm *c, int site, size_t n, const void **desc) {
    struct crank *k = (struct crank *)c->priv;
    struct cgroup *g = k->g;
    *desc = NULL;
    const int algo = cc_algo(g);
    if (!k->ctx || !__atomic_load_n(&g->fused, __ATOMIC_RELAXED) || g->size == 1 || n == 0 || site < 0 ||
        (algo != COMM_CUDA_AUTO && algo != COMM_CUDA_P2P))
        return 0;
    int rc = cc_begin(c);
    if (rc) return rc;
    *desc = &k->xs[site & 1];
    return 0;
}

/* comm->status: the group's first failure; a p2p timeout recorded by a
 * kernel (perhaps of a replayed graph) aborts the group here. */
static int cc_status(struct comm *c) {
    struct cgroup *g = ((struct crank *)c->priv)->g;
    if (__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE)) return g->abort_rc ? g->abort_rc : -EIO;
    if (g->ctl[1]) {
        cg_abort(g, g->ctl[1] - 1, -ETIMEDOUT,
                 "p2p all-reduce waited past AWQD_COMM_TIMEOUT_MS for a peer");
        return -ETIMEDOUT;
    }
    if (g->ctl[0]) { /* set by a kernel (or cg_free) without a host-side abort */
        cg_abort(g, c->rank, -EIO, "p2p all-reduce: abort word set");
        return -EIO;
    }
    return 0;
}

/* Host-side: waits for this rank's stream, then for every rank's thread. */
static void cc_barrier(struct comm *c) {
    struct crank *k = (struct crank *)c->priv;
    if (k->stream) cudaStreamSynchronize(k->stream);
    pthread_barrier_wait(&k->g->bar);
}

static void cg_free(struct cgroup *g) {
    int prev = 0;
    cudaGetDevice(&prev);
    if (g->ctl) g->ctl[0] = 1;    /* any kernel still spinning leaves */
    if (g->nccl)
        for (int r = 0; r < g->size; r++)
            if (g->nccl[r]) ncclCommDestroy(g->nccl[r]);
    for (int r = 0; r < g->size && r < COMM_CUDA_MAX_RANKS; r++) {
        if (!g->stage[r] && !g->flags[r] && !g->epoch[r] && !g->recv[r] && !g->lepoch[r] &&
            !g->xarea[r])
            continue;
        cudaSetDevice(g->devices[r]);
        cudaDeviceSynchronize();
        cudaFree(g->stage[r]);
        cudaFree(g->flags[r]);
        cudaFree(g->epoch[r]);
        cudaFree(g->recv[r]);
        cudaFree(g->lepoch[r]);
        cudaFree(g->xarea[r]);
    }
    if (g->ctl) cudaFreeHost((void *)g->ctl);
    cudaSetDevice(prev);
    pthread_rwlock_destroy(&g->lock);
    pthread_barrier_destroy(&g->bar);
    pthread_mutex_destroy(&g->mu);
    free(g->nccl);
    free(g->devices);
    free(g);
}

static void cc_destroy(struct comm *c) {
    struct crank *k = (struct crank *)c->priv;
    struct cgroup *g = k->g;
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    free(k);
    free(c);
    if (last) cg_free(g);
}

static long env_long(const char *name, long def) {
    const char *s = getenv(name);
    if (!s || !*s) return def;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? def : v;
}

/* One small and one large eager all-reduce on every rank, driven from this
 * thread in an NCCL group, so that every protocol's connections and buffers
 * exist before any rank's first collective (which may be captured). */
static int nccl_warmup(struct cgroup *g, char *err, size_t errlen) {
    enum { WARM_ELEMS = 1 << 19 }; /* 1 MiB of fp16 */
    void *tmp[COMM_CUDA_MAX_RANKS * 4] = {0};
    cudaStream_t st[COMM_CUDA_MAX_RANKS * 4] = {0};
    int n = g->size < COMM_CUDA_MAX_RANKS * 4 ? g->size : 0, rc = 0;
    if (!n) return 0; /* very large groups: lazy connection */
    for (int r = 0; r < n && !rc; r++) {
        if (cudaSetDevice(g->devices[r]) != cudaSuccess ||
            cudaMalloc(&tmp[r], WARM_ELEMS * 2) != cudaSuccess ||
            cudaMemset(tmp[r], 0, WARM_ELEMS * 2) != cudaSuccess ||
            cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking) != cudaSuccess)
            rc = util_err(err, errlen, -ENOMEM, "comm: warm-up buffers on device %d",
                          g->devices[r]);
    }
    size_t sizes[2] = {1, WARM_ELEMS};
    for (int i = 0; i < 2 && !rc; i++) {
        ncclResult_t nr = ncclGroupStart();
        for (int r = 0; r < n && nr == ncclSuccess; r++)
            nr = ncclAllReduce(tmp[r], tmp[r], sizes[i], ncclFloat16, ncclSum, g->nccl[r], st[r]);
        ncclResult_t ne = ncclGroupEnd();
        if (nr == ncclSuccess) nr = ne;
        if (nr != ncclSuccess)
            rc = util_err(err, errlen, -EIO, "comm: NCCL warm-up all-reduce: %s",
                          ncclGetErrorString(nr));
        for (int r = 0; r < n && !rc; r++)
            if (cudaStreamSynchronize(st[r]) != cudaSuccess)
                rc = util_err(err, errlen, -EIO, "comm: NCCL warm-up on device %d failed",
                              g->devices[r]);
    }
    for (int r = 0; r < n; r++) {
        cudaSetDevice(g->devices[r]);
        if (st[r]) cudaStreamDestroy(st[r]);
        cudaFree(tmp[r]);
    }
    return rc;
}

#define CG_CUDA(call)                                                                  \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            rc = util_err(err, errlen, e_ == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, \
                          "comm: %s: %s", #call, cudaGetErrorString(e_));              \
            goto fail;                                                                 \
        }                                                                              \
    } while (0)

extern "C" int comm_cuda_group(int size, const int *devices, struct comm **out, char *err,
                               size_t errlen) {
    if (size < 1) return util_err(err, errlen, -EINVAL, "comm: group size %d", size);
    for (int r = 0; r < size; r++) out[r] = NULL;
    int n_dev = 0, prev = 0, rc = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    cudaGetDevice(&prev);
    struct cgroup *g = (struct cgroup *)calloc(1, sizeof *g);
    if (!g) return util_err(err, errlen, -ENOMEM, "comm: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_rwlock_init(&g->lock, NULL);
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
    g->size = size;
    g->devices = (int *)calloc((size_t)size, sizeof(int));
    g->nccl = (ncclComm_t *)calloc((size_t)size, sizeof(ncclComm_t));
    if (!g->devices || !g->nccl) {
        rc = util_err(err, errlen, -ENOMEM, "comm: out of memory");
        goto fail;
    }
    for (int r = 0; r < size; r++) {
        int d = devices ? devices[r] : r;
        if (d < 0 || d >= n_dev) {
            rc = util_err(err, errlen, -ENODEV, "comm: rank %d: no CUDA device %d (%d present)",
                          r, d, n_dev);
            goto fail;
        }
        for (int q = 0; q < r; q++)
            if (g->devices[q] == d) {
                rc = util_err(err, errlen, -EINVAL,
                              "comm: ranks %d and %d both on device %d (one GPU per rank)", q, r,
                              d);
                goto fail;
            }
        g->devices[r] = d;
    }
    {
        const char *a = getenv("AWQD_ALLREDUCE");
        g->algo = !a || !*a || !strcmp(a, "auto") ? COMM_CUDA_AUTO
                  : !strcmp(a, "nccl")            ? COMM_CUDA_NCCL
                  : !strcmp(a, "p2p")             ? COMM_CUDA_P2P
                  : !strcmp(a, "p2p_flags")       ? COMM_CUDA_P2P_FLAGS
                  : !strcmp(a, "off")             ? COMM_CUDA_OFF
                                                  : -1;
        if (g->algo < 0) {
            rc = util_err(err, errlen, -EINVAL,
                          "comm: AWQD_ALLREDUCE=%s (auto, nccl, p2p, p2p_flags, off)", a);
            goto fail;
        }
    }
    {
        long m = env_long("AWQD_P2P_MAX_BYTES",
                          g->size == 2 ? COMM_CUDA_P2P_MAX_TP2 : COMM_CUDA_P2P_MAX_DEFAULT);
        if (m < 0) m = 0;
        g->p2p_max = (size_t)m;
        /* the buffers hold batch-decode messages (captured graphs take p2p
         * up to here) and forced p2p in benchmarks */
        long capl = env_long("AWQD_P2P_CAP_BYTES", P2P_CAP_DEFAULT);
        size_t cap = capl > 0 ? (size_t)capl : P2P_CAP_DEFAULT;
        if (cap < g->p2p_max) cap = g->p2p_max;
        if (cap < 4096) cap = 4096;
        if (cap > P2P_CAP_MAX) cap = P2P_CAP_MAX;
        g->cap_bytes = (cap + 255) / 256 * 256;
        if (g->p2p_max > g->cap_bytes) g->p2p_max = g->cap_bytes;
        long to = env_long("AWQD_COMM_TIMEOUT_MS", 60000);
        g->timeout_ns = to > 0 ? (unsigned long long)to * 1000000ull : 0;
        g->fault_rank = (int)env_long("AWQD_FAULT_RANK", -1);
        g->fault_call = env_long("AWQD_FAULT_CALL", 1);
    }
    /* NVLink multicast (NVLS) stays off: see docs/TENSOR_PARALLEL.md. All
     * NCCL connections are made now, not lazily at the first collective,
     * which may then be inside a CUDA graph capture (lazy connection there
     * failed with "internal error" on 2x H200). Neither overrides the user. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    if (size > 1) {
        ncclResult_t nr = ncclCommInitAll(g->nccl, size, g->devices);
        if (nr != ncclSuccess) {
            memset(g->nccl, 0, sizeof(ncclComm_t) * (size_t)size);
            rc = util_err(err, errlen, -EIO, "comm: ncclCommInitAll(%d ranks): %s", size,
                          ncclGetErrorString(nr));
            goto fail;
        }
        if ((rc = nccl_warmup(g, err, errlen))) goto fail;
        g->nccl_warm = 1;
    }
    {
        void *h = NULL;
        CG_CUDA(cudaHostAlloc(&h, 2 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
        g->ctl = (volatile int *)h;
        g->ctl[0] = g->ctl[1] = 0;
    }
    /* peer access between every pair, then each rank's staging and flags */
    g->p2p_ok = size > 1 && size <= COMM_CUDA_MAX_RANKS;
    for (int r = 0; r < size && g->p2p_ok; r++)
        for (int q = 0; q < size && g->p2p_ok; q++) {
            int ok = 0;
            if (q != r && (cudaDeviceCanAccessPeer(&ok, g->devices[r], g->devices[q]) !=
                               cudaSuccess ||
                           !ok))
                g->p2p_ok = 0;
        }
    for (int r = 0; r < size && g->p2p_ok; r++) {
        CG_CUDA(cudaSetDevice(g->devices[r]));
        for (int q = 0; q < size; q++) {
            if (q == r) continue;
            cudaError_t e = cudaDeviceEnablePeerAccess(g->devices[q], 0);
            if (e == cudaErrorPeerAccessAlreadyEnabled) {
                cudaGetLastError();
            } else if (e != cudaSuccess) {
                log_warn("comm: peer access %d -> %d: %s; using NCCL only", g->devices[r],
                         g->devices[q], cudaGetErrorString(e));
                cudaGetLastError();
                g->p2p_ok = 0;
                break;
            }
        }
    }
    for (int r = 0; r < size && g->p2p_ok; r++) {
        CG_CUDA(cudaSetDevice(g->devices[r]));
        CG_CUDA(cudaMalloc((void **)&g->stage[r], 2 * g->cap_bytes));
        CG_CUDA(cudaMalloc((void **)&g->flags[r],
                           sizeof(unsigned) * COMM_CUDA_MAX_RANKS * P2P_BLOCKS));
        CG_CUDA(cudaMalloc((void **)&g->epoch[r], sizeof(unsigned) * P2P_BLOCKS));
        CG_CUDA(cudaMemset(g->flags[r], 0, sizeof(unsigned) * COMM_CUDA_MAX_RANKS * P2P_BLOCKS));
        CG_CUDA(cudaMemset(g->epoch[r], 0, sizeof(unsigned) * P2P_BLOCKS));
        size_t recv_elems = 2 * (size_t)size * (g->cap_bytes / 2);
        CG_CUDA(cudaMalloc((void **)&g->recv[r], recv_elems * 2));
        CG_CUDA(cudaMalloc((void **)&g->lepoch[r], sizeof(unsigned) * LP_BLOCKS));
        CG_CUDA(cudaMemset(g->lepoch[r], 0, sizeof(unsigned) * LP_BLOCKS));
        lp_fill_kernel<<<256, 256>>>((unsigned *)g->recv[r], recv_elems / 2, XCHG_EMPTY2);
        CG_CUDA(cudaGetLastError());
        const size_t xelems = 2 * (size_t)size * W4A16_SUM_CAP;
        CG_CUDA(cudaMalloc((void **)&g->xarea[r], xelems * 2));
        lp_fill_kernel<<<256, 256>>>((unsigned *)g->xarea[r], xelems / 2, XCHG_EMPTY2);
        CG_CUDA(cudaGetLastError());
        CG_CUDA(cudaDeviceSynchronize());
    }
    /* the fused all-reduce: every rank must take the same kernel plan for a
     * call, which depends on the device (SM count, shared memory): only
     * between devices of one kind. AWQD_COMM_FUSED=0 turns it off. */
    g->fused_ok = g->p2p_ok && size <= W4A16_SUM_MAX_RANKS;
    for (int r = 1; r < size && g->fused_ok; r++) {
        int a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        if (cudaDeviceGetAttribute(&a0, cudaDevAttrMultiProcessorCount, g->devices[0]) ||
            cudaDeviceGetAttribute(&a1, cudaDevAttrMultiProcessorCount, g->devices[r]) ||
            cudaDeviceGetAttribute(&b0, cudaDevAttrMaxSharedMemoryPerMultiprocessor, g->devices[0]) ||
            cudaDeviceGetAttribute(&b1, cudaDevAttrMaxSharedMemoryPerMultiprocessor, g->devices[r]) ||
            a0 != a1 || b0 != b1) {
            cudaGetLastError();
            g->fused_ok = 0;
        }
    }
    g->fused = g->fused_ok && !util_env_is_zero("AWQD_COMM_FUSED");
    cudaSetDevice(prev);
    for (int r = 0; r < size; r++) {
        struct comm *c = (struct comm *)calloc(1, sizeof *c);
        struct crank *k = (struct crank *)calloc(1, sizeof *k);
        if (!c || !k) {
            free(c);
            free(k);
            for (int q = 0; q < r; q++) {
                free(out[q]->priv);
                free(out[q]);
                out[q] = NULL;
            }
            rc = util_err(err, errlen, -ENOMEM, "comm: out of memory");
            goto fail;
        }
        k->g = g;
        c->rank = r;
        c->size = size;
        c->all_reduce_sum = cc_all_reduce;
        c->barrier = cc_barrier;
        c->status = cc_status;
        c->sum_desc = cc_sum_desc;
        c->destroy = cc_destroy;
        c->priv = k;
        /* captured all-reduces replay: the p2p kernels keep their epochs on
         * the device and read fixed buffers; NCCL was connected eagerly
         * (NCCL_RUNTIME_CONNECT=0 + warm-up), so its capture is safe too */
        c->graph_safe = size == 1 || g->p2p_ok || g->nccl_warm;
        out[r] = c;
    }
    g->refs = size;
    return 0;
fail:
    cudaSetDevice(prev);
    cg_free(g);
    return rc;
}

extern "C" int comm_cuda_attach(struct comm *c, struct ops *ops, char *err, size_t errlen) {
    struct crank *k = (struct crank *)c->priv;
    struct cgroup *g = k->g;
    if (!ops || !ops->name || strcmp(ops->name, "cuda") != 0)
        return util_err(err, errlen, -EINVAL, "comm: rank %d: not a CUDA backend", c->rank);
    int dev = ops_cuda_device(ops->ctx);
    if (dev != g->devices[c->rank])
        return util_err(err, errlen, -EINVAL, "comm: rank %d is on device %d, its backend on %d",
                        c->rank, g->devices[c->rank], dev);
    if (cudaSetDevice(dev) != cudaSuccess)
        return util_err(err, errlen, -EIO, "comm: rank %d: cudaSetDevice(%d) failed", c->rank, dev);
    k->ctx = ops->ctx;
    k->stream = (cudaStream_t)ops_cuda_stream(ops->ctx);
    memset(&k->args, 0, sizeof k->args);
    for (int r = 0; r < g->size && r < COMM_CUDA_MAX_RANKS; r++) {
        k->args.stage[r] = g->stage[r];
        k->args.flags[r] = g->flags[r];
    }
    k->args.epoch = c->rank < COMM_CUDA_MAX_RANKS ? g->epoch[c->rank] : NULL;
    k->args.ctl = g->ctl;
    k->args.rank = c->rank;
    k->args.size = g->size;
    k->args.cap_elems = g->cap_bytes / 2;
    k->args.timeout_ns = g->timeout_ns;
    memset(&k->largs, 0, sizeof k->largs);
    for (int r = 0; r < g->size && r < COMM_CUDA_MAX_RANKS; r++) k->largs.recv[r] = g->recv[r];
    k->largs.mine = c->rank < COMM_CUDA_MAX_RANKS ? g->recv[c->rank] : NULL;
    k->largs.epoch = c->rank < COMM_CUDA_MAX_RANKS ? g->lepoch[c->rank] : NULL;
    k->largs.ctl = g->ctl;
    k->largs.rank = c->rank;
    k->largs.size = g->size;
    k->largs.cap_elems = g->cap_bytes / 2;
    k->largs.timeout_ns = g->timeout_ns;
    memset(k->xs, 0, sizeof k->xs);
    for (int p = 0; p < 2; p++) {
        for (int r = 0; r < g->size && r < COMM_CUDA_MAX_RANKS; r++)
            k->xs[p].area[r] = g->xarea[r] ? g->xarea[r] + (size_t)p * g->size * W4A16_SUM_CAP : NULL;
        k->xs[p].mine = c->rank < COMM_CUDA_MAX_RANKS ? k->xs[p].area[c->rank] : NULL;
        k->xs[p].ctl = g->ctl;
        k->xs[p].timeout_ns = g->timeout_ns;
        k->xs[p].rank = c->rank;
        k->xs[p].size = g->size;
    }
    return 0;
}

static struct cgroup *group_of(const struct comm *c) { return ((struct crank *)c->priv)->g; }

extern "C" void comm_cuda_set_algo(struct comm *c, enum comm_cuda_algo algo) {
    group_of(c)->algo = algo;
}

extern "C" void comm_cuda_set_p2p_max(struct comm *c, size_t bytes) {
    struct cgroup *g = group_of(c);
    g->p2p_max = bytes > g->cap_bytes ? g->cap_bytes : bytes;
}

extern "C" size_t comm_cuda_p2p_max(const struct comm *c) { return group_of(c)->p2p_max; }

extern "C" size_t comm_cuda_p2p_cap(const struct comm *c) { return group_of(c)->cap_bytes; }

extern "C" int comm_cuda_set_fused(struct comm *c, int on) {
    struct cgroup *g = group_of(c);
    if (on >= 0) __atomic_store_n(&g->fused, on && g->fused_ok, __ATOMIC_RELAXED);
    return __atomic_load_n(&g->fused, __ATOMIC_RELAXED);
}

extern "C" void comm_cuda_force_algo(int algo) {
    __atomic_store_n(&g_force_algo, algo, __ATOMIC_RELAXED);
}

extern "C" int comm_cuda_p2p_available(const struct comm *c) { return group_of(c)->p2p_ok; }

extern "C" int comm_cuda_status(const struct comm *c, char *msg, size_t msglen) {
    struct cgroup *g = group_of(c);
    if (!__atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE)) {
        if (msg && msglen) msg[0] = 0;
        return 0;
    }
    if (msg && msglen) snprintf(msg, msglen, "%s", g->msg);
    return g->abort_rc ? g->abort_rc : -EIO;
}
