/* test_tp_cuda.c — tensor parallelism on CUDA (comm/cuda/comm_cuda.h): needs
 * at least 2 GPUs (tests skip with fewer).
 *
 *   tp_cuda.allreduce_*        the all-reduce (NCCL, the one-shot "push" P2P
 *                              kernel and the older "flags" one, forced and
 *                              auto) against the host sum for many sizes, odd
 *                              ones included, repeated so the epoch/parity
 *                              protocol turns over many times; inputs are
 *                              multiples of 1/64 so fp16 sums are exact and
 *                              every rank must equal the host sum; -0.0 (the
 *                              push kernel's "empty" mark) appears among the
 *                              inputs, and a whole rank of it in repetition 1;
 *   tp_cuda.allreduce_graph_*  the same inside a captured CUDA graph, replayed
 *                              (comm->graph_safe must be 1);
 *   tp_cuda.linear_sum_tp*     the all-reduce fused into the decode linear
 *                              (ops->linear_sum, comm->sum_desc) against the
 *                              linear + push all-reduce, bitwise, m = 1-8,
 *                              six shapes, both exchange areas back to back,
 *                              eager and replayed from a graph;
 *   tp_cuda.fused_sum_model_tp2  decode logits with the fused path vs
 *                              AWQD_COMM_FUSED=0: bitwise the same;
 *   tp_cuda.fixture_*          qwen3/qwen2 fixtures at tp=2 vs tp=1 on CUDA:
 *                              prefill logits within 2e-2 x max|logit|, same
 *                              greedy tokens while tp=1's top-2 margin is clear;
 *   tp_cuda.mkmodel_*          synthetic `awqd mkmodel qwen3-32b|llama3-70b
 *                              --layers L` (real widths, few layers, made in the
 *                              test's tmpdir) at tp=2 and tp=4 vs tp=1;
 *   tp_cuda.model_dir          AWQD_TP_MODEL=DIR only (scripts/tp_check.sh): a
 *                              full checkpoint at tp in AWQD_TP_SIZES (default
 *                              2,4) vs tp=1, as the mkmodel tests; with
 *                              AWQD_TP_NOISE=1 the bound is max(2e-2, 1.5 x
 *                              the checkpoint's fp16 noise floor: tp=1 with
 *                              another prefill kernel vs tp=1);
 *   tp_cuda.fault_*            AWQD_FAULT_RANK=1 makes rank 1's forward fail
 *                              mid-way: the error names rank 1, the other ranks
 *                              return (no hang, SIGALRM guards), the next
 *                              forward fails at once, and the group frees; at
 *                              tp=4 (mkmodel qwen3-32b --layers 2) rank 2;
 *                              fault_rank1_fused: at a decode step's fused
 *                              down_proj (rank 0's kernel must be released);
 *   tp_cuda.generate_cli       `awqd generate --backend cuda --tp 2 --devices`;
 *   tp_cuda.bench_allreduce    AWQD_TP_BENCH=1 only: a table of NCCL vs P2P
 *                              (push and flags) time per message
 *                              (scripts/bench_allreduce.sh), eager and inside
 *                              a CUDA graph, AWQD_TP_BENCH_TP ranks (default 2).
 *   tp_cuda.bench_decode       AWQD_TP_BENCH=1 only: batch-1 decode step time of
 *                              mkmodel qwen3-32b --layers $AWQD_TP_BENCH_LAYERS
 *                              (default 8) at tp=1/2/4 (as many as there are GPUs).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cuda_runtime.h>

#include "comm/cuda/comm_cuda.h"
#include "engine/ckpt.h"
#include "engine/kv.h"
#include "engine/model.h"
#include "engine/util.h"
#include "kernels/cuda/ops_cuda_access.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/ops.h"
#include "tests/harness/test.h"
#include "tests/gpu/w4a16_ref.h"

#define TPC_TOL 2e-2
#define TPC_MAXR 8

static int n_gpus(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

/* ======================================================================== */
/* all-reduce against the host sum                                          */
/* ======================================================================== */

enum { AR_PLAIN = 0, AR_GRAPH = 1, AR_BENCH = 2 };

struct ar_ctx {
    int tp, mode;
    int algo;                     /* enum comm_cuda_algo */
    const size_t *sizes;
    int n_sizes, reps;
    struct comm *comm[TPC_MAXR];
    pthread_barrier_t bar;
    /* results */
    int rc[TPC_MAXR];
    char err[TPC_MAXR][256];
    long bad_at[TPC_MAXR];        /* first wrong element, or -1 */
    double us[3][2][64];          /* bench: [nccl, p2p, p2p_flags][eager, graph][size]
                                   * microseconds per call (rank 0) */
    int graph_safe[TPC_MAXR];
};

struct ar_arg {
    struct ar_ctx *x;
    int rank;
};

/* Rank r's element i at repetition k: a multiple of 1/64 in [-2, 2). */
static float ar_val(int r, size_t i, int k) {
    if (k == 1 && r == 0) return -0.0f; /* a whole rank of the push kernel's empty mark */
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + k * 977u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    int v = (int)(h % 256u) - 128;
    if (v == 0 && (h & 0x100u)) return -0.0f; /* scattered -0.0 */
    return (float)v / 64.0f;
}

static void *ar_rank(void *p) {
    struct ar_arg *a = p;
    struct ar_ctx *x = a->x;
    int r = a->rank;
    struct comm *c = x->comm[r];
    struct ops *ops = NULL;
    struct buf *b = NULL;
    float *h = NULL, *got = NULL;
    size_t maxn = 0;
    x->bad_at[r] = -1;
    for (int s = 0; s < x->n_sizes; s++)
        if (x->sizes[s] > maxn) maxn = x->sizes[s];
    int rc = ops_cuda_create(r, &ops, x->err[r], sizeof x->err[r]);
    if (!rc) rc = comm_cuda_attach(c, ops, x->err[r], sizeof x->err[r]);
    if (!rc) {
        b = ops->alloc(ops->ctx, BUF_ACT, maxn);
        h = malloc(maxn * sizeof *h);
        got = malloc(maxn * sizeof *got);
        if (!b || !h || !got) rc = -ENOMEM;
    }
    /* every rank must reach the collectives, failed or not: agree first */
    x->rc[r] = rc;
    pthread_barrier_wait(&x->bar);
    for (int q = 0; q < x->tp; q++)
        if (x->rc[q]) goto out;
    if (r == 0) comm_cuda_set_algo(c, (enum comm_cuda_algo)x->algo);
    pthread_barrier_wait(&x->bar);
    cudaStream_t st = (cudaStream_t)ops_cuda_stream(ops->ctx);

    x->graph_safe[r] = c->graph_safe;
    if (x->mode == AR_BENCH) {
        static const int algos[3] = {COMM_CUDA_NCCL, COMM_CUDA_P2P, COMM_CUDA_P2P_FLAGS};
        enum { PER_GRAPH = 32 };
        for (int s = 0; s < x->n_sizes; s++) {
            size_t n = x->sizes[s];
            for (int ai = 0; ai < 3; ai++) {
                if (r == 0) comm_cuda_set_algo(c, (enum comm_cuda_algo)algos[ai]);
                pthread_barrier_wait(&x->bar);
                for (int k = 0; k < 20; k++) c->all_reduce_sum(c, b, n);
                cudaStreamSynchronize(st);
                pthread_barrier_wait(&x->bar);
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                /* eager: back-to-back calls, launch cost included */
                cudaEventRecord(e0, st);
                int iters = x->reps;
                for (int k = 0; k < iters; k++) c->all_reduce_sum(c, b, n);
                cudaEventRecord(e1, st);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r == 0) x->us[ai][0][s] = ms * 1000.0 / iters;
                /* graph: PER_GRAPH calls captured once, replayed */
                cudaGraph_t graph = NULL;
                cudaGraphExec_t exec = NULL;
                int grc = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess;
                for (int k = 0; k < PER_GRAPH && !grc; k++) grc = c->all_reduce_sum(c, b, n) != 0;
                if (cudaStreamEndCapture(st, &graph) != cudaSuccess) grc = 1;
                if (!grc && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) grc = 1;
                if (graph) cudaGraphDestroy(graph);
                cudaGetLastError();
                x->rc[r] = grc;
                pthread_barrier_wait(&x->bar);
                int all = 1;
                for (int q = 0; q < x->tp; q++) all &= x->rc[q] == 0;
                pthread_barrier_wait(&x->bar);
                if (all) {
                    int reps = iters / PER_GRAPH + 1;
                    cudaGraphLaunch(exec, st);
                    cudaStreamSynchronize(st);
                    pthread_barrier_wait(&x->bar);
                    cudaEventRecord(e0, st);
                    for (int k = 0; k < reps; k++) cudaGraphLaunch(exec, st);
                    cudaEventRecord(e1, st);
                    cudaEventSynchronize(e1);
                    cudaEventElapsedTime(&ms, e0, e1);
                    if (r == 0) x->us[ai][1][s] = ms * 1000.0 / (reps * PER_GRAPH);
                } else if (r == 0) {
                    x->us[ai][1][s] = -1; /* capture failed */
                }
                if (exec) cudaGraphExecDestroy(exec);
                x->rc[r] = 0;
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                pthread_barrier_wait(&x->bar);
            }
        }
        goto out;
    }

    cudaGraphExec_t exec = NULL;
    for (int s = 0; s < x->n_sizes && !rc; s++) {
        size_t n = x->sizes[s];
        if (x->mode == AR_GRAPH) {
            /* capture one all-reduce of n elements, replay it reps times */
            cudaGraph_t graph = NULL;
            if (exec) cudaGraphExecDestroy(exec);
            exec = NULL;
            pthread_barrier_wait(&x->bar);
            if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
                rc = -EIO;
            if (!rc) rc = c->all_reduce_sum(c, b, n);
            if (cudaStreamEndCapture(st, &graph) != cudaSuccess) rc = rc ? rc : -EIO;
            if (!rc && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) rc = -EIO;
            if (graph) cudaGraphDestroy(graph);
            if (rc) {
                snprintf(x->err[r], sizeof x->err[r], "graph capture of %zu elements failed", n);
                break;
            }
        }
        for (int k = 0; k < x->reps && !rc; k++) {
            for (size_t i = 0; i < n; i++) h[i] = ar_val(r, i, k);
            if ((rc = ops->upload(ops->ctx, b, 0, h, n))) break;
            if (x->mode == AR_GRAPH) {
                if (cudaGraphLaunch(exec, st) != cudaSuccess) rc = -EIO;
            } else {
                rc = c->all_reduce_sum(c, b, n);
            }
            if (rc) {
                snprintf(x->err[r], sizeof x->err[r], "all_reduce_sum(%zu): %d", n, rc);
                break;
            }
            if ((rc = ops->download(ops->ctx, got, b, 0, n))) {
                snprintf(x->err[r], sizeof x->err[r], "download after all_reduce(%zu): %d", n, rc);
                break;
            }
            /* a wrong sum is recorded, but this rank keeps taking part in
             * the collectives (leaving would hang the others) */
            for (size_t i = 0; i < n && x->bad_at[r] < 0; i++) {
                float want = 0;
                for (int q = 0; q < x->tp; q++) want += ar_val(q, i, k);
                if (got[i] != want) {
                    x->bad_at[r] = (long)i;
                    snprintf(x->err[r], sizeof x->err[r],
                             "n=%zu rep %d: element %zu is %g, host sum %g", n, k, i, got[i], want);
                }
            }
        }
    }
    if (exec) cudaGraphExecDestroy(exec);
    x->rc[r] = rc ? rc : x->bad_at[r] >= 0 ? -EDOM : 0;
out:
    if (ops) {
        ops->free(ops->ctx, b);
        ops_destroy(ops);
    }
    free(h);
    free(got);
    return NULL;
}

/* Runs the ranks; 0 on success, else fails the test. */
static int ar_run(struct ar_ctx *x) {
    char err[512];
    int rc = comm_cuda_group(x->tp, NULL, x->comm, err, sizeof err);
    if (rc) {
        test_fail(__FILE__, __LINE__, "comm_cuda_group(%d): %s", x->tp, err);
        return rc;
    }
    if (x->algo == COMM_CUDA_P2P && !comm_cuda_p2p_available(x->comm[0])) {
        for (int r = 0; r < x->tp; r++) comm_free(x->comm[r]);
        return 1; /* caller skips */
    }
    pthread_barrier_init(&x->bar, NULL, (unsigned)x->tp);
    pthread_t th[TPC_MAXR];
    struct ar_arg args[TPC_MAXR];
    for (int r = 0; r < x->tp; r++) {
        args[r] = (struct ar_arg){x, r};
        pthread_create(&th[r], NULL, ar_rank, &args[r]);
    }
    for (int r = 0; r < x->tp; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&x->bar);
    char st[256];
    int status = comm_cuda_status(x->comm[0], st, sizeof st);
    for (int r = 0; r < x->tp; r++) comm_free(x->comm[r]);
    for (int r = 0; r < x->tp; r++)
        if (x->rc[r]) {
            test_fail(__FILE__, __LINE__, "tp=%d rank %d: %s (%d)", x->tp, r, x->err[r], x->rc[r]);
            return -1;
        }
    if (status) {
        test_fail(__FILE__, __LINE__, "group aborted: %s", st);
        return -1;
    }
    for (int r = 0; r < x->tp; r++)
        if (x->graph_safe[r] != 1) {
            test_fail(__FILE__, __LINE__, "tp=%d rank %d: comm->graph_safe is %d", x->tp, r,
                      x->graph_safe[r]);
            return -1;
        }
    return 0;
}

/* elements; 1500007 (3 MB) is above every default p2p threshold and the
 * p2p capacity, so the auto tests take NCCL there at every tp */
static const size_t ar_sizes[] = {1, 2, 7, 8, 9, 31, 255, 256, 1000, 2047, 4096, 4097, 12289,
                                  32768, 32771, 65536, 131072, 262143, 524288, 1000003, 1500007};

static void ar_check(int tp, int algo, int mode, int reps) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    alarm(90);
    struct ar_ctx x;
    memset(&x, 0, sizeof x);
    x.tp = tp;
    x.algo = algo;
    x.mode = mode;
    x.sizes = ar_sizes;
    x.n_sizes = (int)(sizeof ar_sizes / sizeof ar_sizes[0]);
    x.reps = reps;
    int rc = ar_run(&x);
    if (rc == 1) TEST_SKIP("no peer access between the GPUs");
}

TEST(tp_cuda, allreduce_nccl_tp2) { ar_check(2, COMM_CUDA_NCCL, AR_PLAIN, 3); }
TEST(tp_cuda, allreduce_p2p_tp2) { ar_check(2, COMM_CUDA_P2P, AR_PLAIN, 3); }
TEST(tp_cuda, allreduce_auto_tp2) { ar_check(2, COMM_CUDA_AUTO, AR_PLAIN, 2); }
TEST(tp_cuda, allreduce_nccl_tp4) { ar_check(4, COMM_CUDA_NCCL, AR_PLAIN, 2); }
TEST(tp_cuda, allreduce_p2p_tp4) { ar_check(4, COMM_CUDA_P2P, AR_PLAIN, 2); }
TEST(tp_cuda, allreduce_p2p_tp3) { ar_check(3, COMM_CUDA_P2P, AR_PLAIN, 2); }
TEST(tp_cuda, allreduce_p2pflags_tp2) { ar_check(2, COMM_CUDA_P2P_FLAGS, AR_PLAIN, 3); }
TEST(tp_cuda, allreduce_p2pflags_tp4) { ar_check(4, COMM_CUDA_P2P_FLAGS, AR_PLAIN, 2); }
TEST(tp_cuda, allreduce_graph_p2p_tp2) { ar_check(2, COMM_CUDA_P2P, AR_GRAPH, 3); }
TEST(tp_cuda, allreduce_graph_p2p_tp4) { ar_check(4, COMM_CUDA_P2P, AR_GRAPH, 3); }
TEST(tp_cuda, allreduce_graph_auto_tp2) { ar_check(2, COMM_CUDA_AUTO, AR_GRAPH, 2); }
TEST(tp_cuda, allreduce_graph_p2pflags_tp2) { ar_check(2, COMM_CUDA_P2P_FLAGS, AR_GRAPH, 3); }
TEST(tp_cuda, allreduce_graph_nccl_tp2) { ar_check(2, COMM_CUDA_NCCL, AR_GRAPH, 2); }

/* The p2p threshold's default (comm_cuda.h): 2 MiB at tp = 2, 128 KiB at
 * tp >= 3 (as many ranks as there are GPUs); AWQD_P2P_MAX_BYTES overrides
 * both. The sums on either side of it are checked by the auto tests above
 * (ar_sizes run to 3 MB). */
static size_t p2p_max_of(int tp) {
    struct comm *c[TPC_MAXR];
    char err[512];
    if (comm_cuda_group(tp, NULL, c, err, sizeof err)) {
        test_fail(__FILE__, __LINE__, "comm_cuda_group(%d): %s", tp, err);
        return 0;
    }
    const size_t m = comm_cuda_p2p_max(c[0]);
    for (int r = 0; r < tp; r++) comm_free(c[r]);
    return m;
}
TEST(tp_cuda, p2p_threshold_default) {
    if (n_gpus() < 2) TEST_SKIP("fewer than two GPUs");
    const char *env = getenv("AWQD_P2P_MAX_BYTES");
    char *keep = env ? strdup(env) : NULL;
    unsetenv("AWQD_P2P_MAX_BYTES");
    alarm(90);
    size_t m = p2p_max_of(2);
    ASSERT_MSG(m == COMM_CUDA_P2P_MAX_TP2, "tp=2: p2p_max %zu, want %d", m, COMM_CUDA_P2P_MAX_TP2);
    for (int tp = 3; tp <= 4 && tp <= n_gpus() && !test_failed(); tp++) {
        m = p2p_max_of(tp);
        ASSERT_MSG(m == COMM_CUDA_P2P_MAX_DEFAULT, "tp=%d: p2p_max %zu, want %d", tp, m,
                   COMM_CUDA_P2P_MAX_DEFAULT);
    }
    setenv("AWQD_P2P_MAX_BYTES", "65536", 1);
    m = p2p_max_of(2);
    ASSERT_MSG(m == 65536, "tp=2 with AWQD_P2P_MAX_BYTES=65536: p2p_max %zu", m);
    if (keep) setenv("AWQD_P2P_MAX_BYTES", keep, 1);
    else unsetenv("AWQD_P2P_MAX_BYTES");
    free(keep);
}

/* Many back-to-back small p2p calls without a host sync in between (the
 * decode pattern: 2 per layer), then one check: the epochs must not slip. */
static void many_calls(int tp) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    static const size_t sz[] = {4096, 5120, 8192, 16, 4096};
    alarm(120);
    struct ar_ctx x;
    memset(&x, 0, sizeof x);
    x.tp = tp;
    x.algo = COMM_CUDA_P2P;
    x.mode = AR_PLAIN;
    x.sizes = sz;
    x.n_sizes = 5;
    x.reps = 64;
    int rc = ar_run(&x);
    if (rc == 1) TEST_SKIP("no peer access between the GPUs");
}

TEST(tp_cuda, allreduce_p2p_many_calls) { many_calls(2); }
TEST(tp_cuda, allreduce_p2p_many_calls_tp4) { many_calls(4); }

/* ======================================================================== */
/* the all-reduce fused into the decode linear (ops->linear_sum)            */
/* ======================================================================== */

/* Row-parallel shapes (K = this rank's rows, N = hidden): every rank's
 * linear_sum must give bitwise what linear + all_reduce_sum gives (the push
 * kernel adds the same fp16 tiles in the same order), for m = 1, 2, 3, 8,
 * over calls that cycle both exchange areas back to back (sites 0, 1, 2,
 * ...) with no other all-reduce between, eager and replayed from a graph.
 * Rank 0's weight has a bias (added once, as the model's row-parallel
 * linears do). N = 2056 leaves a half tile; N = 16384 fills the area; K =
 * 8192 x N = 5120 runs as three blocks a column through the workspace (the
 * decode kernel's K split, the last block making the sum). */
#define LS_NSHAPE 7
static const int ls_shape[LS_NSHAPE][2] = {{1024, 4096}, {2048, 5120}, {4096, 8192},
                                           {1536, 2056}, {512, 16384}, {256, 24},
                                           {8192, 5120}}; /* the decode kernel's K split (dc_gs_pick) */
static const int ls_m[] = {1, 2, 3, 8};

struct ls_ctx {
    int tp;
    struct comm *comm[TPC_MAXR];
    struct ref_layer lay[TPC_MAXR][LS_NSHAPE];
    pthread_barrier_t bar;
    int rc[TPC_MAXR];
    char err[TPC_MAXR][256];
    long fused_calls[TPC_MAXR];
};

struct ls_arg {
    struct ls_ctx *x;
    int rank;
};

static uint64_t ls_rs = 0x9e3779b97f4a7c15ull;
static uint32_t ls_rnd(void) {
    ls_rs ^= ls_rs << 13;
    ls_rs ^= ls_rs >> 7;
    ls_rs ^= ls_rs << 17;
    return (uint32_t)(ls_rs >> 16);
}

/* One rank; fails (x->rc, x->err) but keeps taking part in every exchange. */
static void *ls_rank(void *p) {
    struct ls_arg *a = p;
    struct ls_ctx *x = a->x;
    const int r = a->rank;
    struct comm *c = x->comm[r];
    struct ops *ops = NULL;
    struct buf *bx = NULL, *bref = NULL, *bout = NULL;
    float *hx = NULL, *ref = NULL, *got = NULL;
    const size_t maxk = 8192, maxn = 16384, maxm = 8; /* the largest of ls_shape */
    char *err = x->err[r];
    const size_t el = sizeof x->err[r];
    int rc = ops_cuda_create(r, &ops, err, el);
    if (!rc) rc = comm_cuda_attach(c, ops, err, el);
    if (!rc) {
        bx = ops->alloc(ops->ctx, BUF_ACT, maxm * maxk);
        bref = ops->alloc(ops->ctx, BUF_ACT, maxm * maxn);
        bout = ops->alloc(ops->ctx, BUF_ACT, maxm * maxn);
        hx = malloc(maxm * maxk * sizeof *hx);
        ref = malloc(maxm * maxn * sizeof *ref);
        got = malloc(maxm * maxn * sizeof *got);
        if (!bx || !bref || !bout || !hx || !ref || !got) rc = -ENOMEM;
    }
    x->rc[r] = rc;
    pthread_barrier_wait(&x->bar);
    for (int q = 0; q < x->tp; q++)
        if (x->rc[q]) goto out;
    cudaStream_t st = (cudaStream_t)ops_cuda_stream(ops->ctx);
    int site = 0;
    /* every rank runs every step (the barriers), a failed one without its
     * exchanges: the others' waits then time out, recorded, never hang */
    for (int si = 0; si < LS_NSHAPE; si++) {
        const int K = ls_shape[si][0], N = ls_shape[si][1];
        struct op_linear *l = ops->upload_linear(ops->ctx, &x->lay[r][si].l, LINEAR_PLAIN);
        if (!l && !rc) {
            snprintf(err, el, "upload_linear K=%d N=%d failed", K, N);
            rc = -ENOMEM;
        }
        for (int mi = 0; mi < (int)(sizeof ls_m / sizeof ls_m[0]); mi++) {
            const int m = ls_m[mi];
            /* the decision must not depend on the rank: all ranks or none */
            const int fuse = l && ops->linear_sum_ok(ops->ctx, m, l);
            x->rc[r] = fuse;
            pthread_barrier_wait(&x->bar);
            int agree = 1;
            for (int q = 0; q < x->tp; q++) agree &= x->rc[q] == x->rc[0];
            pthread_barrier_wait(&x->bar);
            if (!agree && !rc) {
                snprintf(err, el, "K=%d N=%d m=%d: linear_sum_ok differs between ranks", K, N, m);
                rc = -EPROTO;
            }
            if (!fuse || !agree) {
                if (!rc && N <= 8192 && m <= 2) { /* the decode kernel's shapes must fuse */
                    snprintf(err, el, "K=%d N=%d m=%d: not fused", K, N, m);
                    rc = -ENOTSUP;
                }
                continue;
            }
            for (int rep = 0; rep < 3 && !rc; rep++) {
                for (size_t i = 0; i < (size_t)m * K; i++)
                    hx[i] = (float)((int)((i * 2654435761u + (size_t)r * 977u + (size_t)rep * 131u) % 255u) - 127) / 64.0f;
                rc = ops->upload(ops->ctx, bx, 0, hx, (size_t)m * K);
                /* reference: the linear, then the push all-reduce */
                if (!rc) ops->linear(ops->ctx, bref, bx, m, l);
                if (!rc) rc = c->all_reduce_sum(c, bref, (size_t)m * N);
                /* fused, twice in a row (both areas), the second kept;
                 * rep 2 captures the two calls and replays the graph 3 times */
                cudaGraph_t graph = NULL;
                cudaGraphExec_t exec = NULL;
                if (!rc && rep == 2 &&
                    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
                    rc = -EIO;
                for (int t = 0; t < 2 && !rc; t++) {
                    const void *d = NULL;
                    rc = c->sum_desc(c, site++, (size_t)m * N, &d);
                    if (!rc && !d) {
                        snprintf(err, el, "sum_desc gave no descriptor");
                        rc = -ENOTSUP;
                    }
                    if (!rc) {
                        ops->linear_sum(ops->ctx, bout, bx, m, l, d);
                        x->fused_calls[r]++;
                    }
                }
                if (rep == 2) {
                    if (cudaStreamEndCapture(st, &graph) != cudaSuccess && !rc) rc = -EIO;
                    if (!rc && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) rc = -EIO;
                    for (int t = 0; t < 3 && !rc; t++)
                        if (cudaGraphLaunch(exec, st) != cudaSuccess) rc = -EIO;
                    if (graph) cudaGraphDestroy(graph);
                    if (exec) cudaGraphExecDestroy(exec);
                }
                if (!rc) rc = ops->sync(ops->ctx);
                if (!rc && c->status) rc = c->status(c);
                if (!rc) rc = ops->download(ops->ctx, ref, bref, 0, (size_t)m * N);
                if (!rc) rc = ops->download(ops->ctx, got, bout, 0, (size_t)m * N);
                if (rc && !*err) snprintf(err, el, "K=%d N=%d m=%d rep %d: %d", K, N, m, rep, rc);
                for (size_t i = 0; i < (size_t)m * N && !rc; i++)
                    if (memcmp(&ref[i], &got[i], sizeof(float)) != 0) {
                        snprintf(err, el, "K=%d N=%d m=%d rep %d: y[%zu] fused %.6g, linear + all-reduce %.6g",
                                 K, N, m, rep, i, got[i], ref[i]);
                        rc = -EDOM;
                    }
            }
        }
        if (l) ops->free_linear(ops->ctx, l);
    }
    x->rc[r] = rc;
out:
    if (ops) {
        ops->free(ops->ctx, bx);
        ops->free(ops->ctx, bref);
        ops->free(ops->ctx, bout);
        ops_destroy(ops);
    }
    free(hx);
    free(ref);
    free(got);
    return NULL;
}

static void linear_sum_check(int tp) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    alarm(120);
    setenv("AWQD_COMM_TIMEOUT_MS", "5000", 1);
    struct ls_ctx *x = calloc(1, sizeof *x);
    ASSERT(x != NULL);
    x->tp = tp;
    char err[512];
    int rc = comm_cuda_group(tp, NULL, x->comm, err, sizeof err);
    unsetenv("AWQD_COMM_TIMEOUT_MS");
    if (rc) {
        free(x);
        ASSERT_MSG(0, "comm_cuda_group(%d): %s", tp, err);
    }
    if (!comm_cuda_p2p_available(x->comm[0]) || !comm_cuda_set_fused(x->comm[0], -1)) {
        for (int r = 0; r < tp; r++) comm_free(x->comm[r]);
        free(x);
        TEST_SKIP("no peer access between the GPUs (or AWQD_COMM_FUSED=0)");
    }
    /* the reference is the push all-reduce at every size: above its default
     * threshold (128 KB: m = 8 at N = 16384) the group takes NCCL, whose
     * fp16 sum rounds at each hop of its ring and so differs in the last
     * bit from one fp32 sum at tp >= 3 (4x H200, session 28: y 3.40234
     * fused, 3.40039 through NCCL) */
    comm_cuda_set_p2p_max(x->comm[0], (size_t)-1);
    for (int r = 0; r < tp; r++)
        for (int si = 0; si < LS_NSHAPE; si++)
            ASSERT(ref_layer_make(&x->lay[r][si], ls_shape[si][0], ls_shape[si][1], 128, r == 0,
                                  ls_rnd) == 0);
    pthread_barrier_init(&x->bar, NULL, (unsigned)tp);
    pthread_t th[TPC_MAXR];
    struct ls_arg args[TPC_MAXR];
    for (int r = 0; r < tp; r++) {
        args[r] = (struct ls_arg){x, r};
        pthread_create(&th[r], NULL, ls_rank, &args[r]);
    }
    for (int r = 0; r < tp; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&x->bar);
    char st[256];
    int status = comm_cuda_status(x->comm[0], st, sizeof st);
    for (int r = 0; r < tp; r++) comm_free(x->comm[r]);
    for (int r = 0; r < tp; r++)
        for (int si = 0; si < LS_NSHAPE; si++) ref_layer_free(&x->lay[r][si]);
    int bad = -1;
    for (int r = 0; r < tp && bad < 0; r++)
        if (x->rc[r]) bad = r;
    fprintf(stderr, "  tp=%d: %ld fused calls per rank\n", tp, x->fused_calls[0]);
    if (bad >= 0) {
        test_fail(__FILE__, __LINE__, "tp=%d rank %d: %s (%d)", tp, bad, x->err[bad], x->rc[bad]);
    } else if (status) {
        test_fail(__FILE__, __LINE__, "group aborted: %s", st);
    } else if (x->fused_calls[0] < 20) {
        test_fail(__FILE__, __LINE__, "tp=%d: only %ld fused calls", tp, x->fused_calls[0]);
    }
    free(x);
}

TEST(tp_cuda, linear_sum_tp2) { linear_sum_check(2); }
TEST(tp_cuda, linear_sum_tp3) { linear_sum_check(3); }
TEST(tp_cuda, linear_sum_tp4) { linear_sum_check(4); }

/* A captured p2p all-reduce replayed on rank 0 only: its wait must end at
 * AWQD_COMM_TIMEOUT_MS (no hang), and comm->status must then report the
 * timeout, which the replayed graph itself cannot. */
struct to_ctx {
    struct comm *comm[2];
    pthread_barrier_t bar;
    int rc[2], status;
    double waited;
};

struct to_arg {
    struct to_ctx *x;
    int rank;
};

static void *to_rank(void *p) {
    struct to_arg *a = p;
    struct to_ctx *x = a->x;
    int r = a->rank;
    struct comm *c = x->comm[r];
    struct ops *ops = NULL;
    struct buf *b = NULL;
    char err[256];
    cudaGraphExec_t exec = NULL;
    int rc = ops_cuda_create(r, &ops, err, sizeof err);
    if (!rc) rc = comm_cuda_attach(c, ops, err, sizeof err);
    if (!rc && !(b = ops->alloc(ops->ctx, BUF_ACT, 4096))) rc = -ENOMEM;
    if (!rc) {
        cudaStream_t st = (cudaStream_t)ops_cuda_stream(ops->ctx);
        cudaGraph_t graph = NULL;
        if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) rc = -EIO;
        if (!rc) rc = c->all_reduce_sum(c, b, 4096);
        if (cudaStreamEndCapture(st, &graph) != cudaSuccess) rc = rc ? rc : -EIO;
        if (!rc && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) rc = -EIO;
        if (graph) cudaGraphDestroy(graph);
    }
    x->rc[r] = rc;
    pthread_barrier_wait(&x->bar);
    if (r == 0 && !x->rc[0] && !x->rc[1]) {
        cudaStream_t st = (cudaStream_t)ops_cuda_stream(ops->ctx);
        double t0 = util_now_s();
        cudaGraphLaunch(exec, st);
        cudaStreamSynchronize(st);
        x->waited = util_now_s() - t0;
        x->status = c->status ? c->status(c) : 0;
    }
    pthread_barrier_wait(&x->bar);
    if (exec) cudaGraphExecDestroy(exec);
    if (ops) {
        ops->free(ops->ctx, b);
        ops_destroy(ops);
    }
    return NULL;
}

TEST(tp_cuda, p2p_timeout_in_graph) {
    if (n_gpus() < 2) TEST_SKIP("needs 2 GPUs");
    alarm(60);
    struct to_ctx x;
    memset(&x, 0, sizeof x);
    char err[512];
    setenv("AWQD_COMM_TIMEOUT_MS", "300", 1);
    setenv("AWQD_ALLREDUCE", "p2p", 1);
    int rc = comm_cuda_group(2, NULL, x.comm, err, sizeof err);
    unsetenv("AWQD_COMM_TIMEOUT_MS");
    unsetenv("AWQD_ALLREDUCE");
    ASSERT_MSG(rc == 0, "comm_cuda_group: %s", err);
    if (!comm_cuda_p2p_available(x.comm[0])) {
        comm_free(x.comm[0]);
        comm_free(x.comm[1]);
        TEST_SKIP("no peer access");
    }
    pthread_barrier_init(&x.bar, NULL, 2);
    pthread_t th[2];
    struct to_arg args[2] = {{&x, 0}, {&x, 1}};
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, to_rank, &args[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&x.bar);
    char st[256];
    int status = comm_cuda_status(x.comm[0], st, sizeof st);
    comm_free(x.comm[0]);
    comm_free(x.comm[1]);
    ASSERT_MSG(x.rc[0] == 0 && x.rc[1] == 0, "capture failed: %d %d", x.rc[0], x.rc[1]);
    fprintf(stderr, "  rank 0 waited %.3f s; status %d: %s\n", x.waited, x.status, st);
    ASSERT_MSG(x.status == -ETIMEDOUT, "comm->status after the timed-out replay: %d", x.status);
    ASSERT_MSG(status == -ETIMEDOUT, "comm_cuda_status: %d", status);
    ASSERT_MSG(x.waited >= 0.25 && x.waited < 10, "waited %.3f s for a 0.3 s timeout", x.waited);
    ASSERT_CONTAINS(st, "rank 0");
}

/* ======================================================================== */
/* models: tp = N on CUDA vs tp = 1 on CUDA                                  */
/* ======================================================================== */

static int tp_group(struct ckpt *ck, int tp, int max_tokens, struct model_group **g) {
    struct model_group_opts o;
    model_group_opts_default(&o);
    o.backend = "cuda";
    o.tp = tp;
    o.model.n_blocks = 64;
    o.model.block_size = 16;
    o.model.max_tokens = max_tokens;
    o.model.max_seqs = 4;
    o.model.max_blocks_per_seq = 32;
    char err[512];
    int rc = model_group_init(ck, &o, g, err, sizeof err);
    if (rc) test_fail(__FILE__, __LINE__, "model_group_init tp=%d: %s", tp, err);
    return rc;
}

struct run_out {
    float *prefill;               /* [plen, V] */
    float *step;                  /* [n_greedy, V] logits before each greedy token */
    int32_t tok[64];
    int n_greedy;
};

/* Prefill ids (chunks of `chunk`, all rows' logits), then n_greedy greedy
 * decode steps. */
static int run_greedy(struct model_group *g, const int32_t *ids, int n, int V, int chunk,
                      int n_greedy, struct run_out *o) {
    memset(o, 0, sizeof *o);
    const struct model_opts *mo = model_opts(model_group_rank0(g));
    struct kv kv;
    struct kv_seq seq = {0};
    char err[512];
    int rc = kv_init(&kv, mo->n_blocks, mo->block_size);
    if (rc) return rc;
    o->prefill = malloc((size_t)n * V * sizeof(float));
    o->step = malloc((size_t)(n_greedy + 1) * V * sizeof(float));
    o->n_greedy = n_greedy;
    for (int pos = 0; pos < n && !rc; pos += chunk) {
        int m = n - pos < chunk ? n - pos : chunk;
        if ((rc = kv_seq_reserve(&kv, &seq, pos + m))) break;
        struct batch_seq s = {ids + pos, m, pos, seq.blocks, seq.n_blocks, MODEL_LOGITS_ALL};
        struct batch b = {&s, 1};
        rc = model_group_forward(g, &b, o->prefill + (size_t)pos * V, err, sizeof err);
        if (rc) test_fail(__FILE__, __LINE__, "prefill: %s", err);
    }
    if (!rc) memcpy(o->step, o->prefill + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    for (int t = 0; t < n_greedy && !rc; t++) {
        const float *lg = o->step + (size_t)t * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        o->tok[t] = best;
        if (t + 1 == n_greedy) break;
        if ((rc = kv_seq_reserve(&kv, &seq, n + t + 1))) break;
        struct batch_seq s = {&o->tok[t], 1, n + t, seq.blocks, seq.n_blocks, MODEL_LOGITS_LAST};
        struct batch b = {&s, 1};
        rc = model_group_forward(g, &b, o->step + (size_t)(t + 1) * V, err, sizeof err);
        if (rc) test_fail(__FILE__, __LINE__, "decode step %d: %s", t, err);
    }
    kv_seq_free(&kv, &seq);
    kv_free(&kv);
    return rc;
}

static void run_out_free(struct run_out *o) {
    free(o->prefill);
    free(o->step);
}

/* Prefill rows of b against a: the worst row's max |diff| / max |logit|, the
 * mean |diff| over all rows / mean max|logit| (rounding noise grows with
 * depth and shows as a small mean, a sharding error as a mean of the order
 * of the logits), and the rows over tol. */
struct diff_stats {
    double worst, mean;
    int over, first_over;
};

static struct diff_stats prefill_diff(const struct run_out *a, const struct run_out *b, int n, int V,
                                      double tol) {
    struct diff_stats st = {0, 0, 0, -1};
    double sum_d = 0, sum_mx = 0;
    for (int i = 0; i < n; i++) {
        const float *x = a->prefill + (size_t)i * V, *y = b->prefill + (size_t)i * V;
        double mx = 0, d = 0, s = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(x[v]));
            double e = fabs((double)x[v] - y[v]);
            d = test_err_max(d, e);
            s += e;
        }
        sum_d += s / V;
        sum_mx += mx;
        double rel = d / (mx > 0 ? mx : 1);
        if (rel > st.worst) st.worst = rel;
        if (rel > tol && st.over++ == 0) st.first_over = i;
    }
    st.mean = sum_d / (sum_mx > 0 ? sum_mx : 1);
    return st;
}

/* b (tp = N) against a (tp = 1): prefill rows within tol x max|logit|, same
 * greedy tokens until a's top-2 margin there is not clear. */
static void check_agree(const char *what, const struct run_out *a, const struct run_out *b, int n,
                        int V, double tol) {
    struct diff_stats st = prefill_diff(a, b, n, V, tol);
    ASSERT_MSG(st.over == 0,
               "%s: %d of %d prefill rows differ by more than %.3g of max|logit| (first: row %d; "
               "worst %.4g; mean |diff| %.3g of max|logit|)",
               what, st.over, n, tol, st.first_over, st.worst, st.mean);
    const double worst = st.worst, mean_rel = st.mean;
    int same = 0;
    for (int t = 0; t < a->n_greedy; t++) {
        const float *lg = a->step + (size_t)t * V;
        float top = -INFINITY, second = -INFINITY, mx = 0;
        for (int v = 0; v < V; v++) {
            if (lg[v] > top) {
                second = top;
                top = lg[v];
            } else if (lg[v] > second) {
                second = lg[v];
            }
            mx = fmaxf(mx, fabsf(lg[v]));
        }
        if (top - second <= tol * mx) break; /* past here fp16 may branch */
        ASSERT_MSG(a->tok[t] == b->tok[t], "%s: greedy token %d: tp1 %d, tpN %d (margin %.4g)",
                   what, t, a->tok[t], b->tok[t], top - second);
        same++;
    }
    fprintf(stderr,
            "  %s: prefill max diff %.3g of max|logit| (mean %.3g), %d/%d greedy tokens compared\n",
            what, worst, mean_rel, same, a->n_greedy);
}

static void check_ckpt_tp(struct ckpt *ck, const char *name, const int32_t *const *prompts,
                          const int *plens, int n_prompts, int tp, int n_greedy) {
    int V = ckpt_config(ck)->vocab;
    struct model_group *g1 = NULL, *gt = NULL;
    if (tp_group(ck, 1, 64, &g1)) return;
    if (tp_group(ck, tp, 64, &gt)) {
        model_group_free(g1);
        return;
    }
    for (int i = 0; i < n_prompts && !test_failed(); i++) {
        struct run_out a, b;
        char what[128];
        snprintf(what, sizeof what, "%s tp=%d prompt %d", name, tp, i);
        if (!run_greedy(g1, prompts[i], plens[i], V, 64, n_greedy, &a) &&
            !run_greedy(gt, prompts[i], plens[i], V, 64, n_greedy, &b))
            check_agree(what, &a, &b, plens[i], V, TPC_TOL);
        run_out_free(&a);
        run_out_free(&b);
    }
    model_group_free(gt);
    model_group_free(g1);
}

static void check_fixture(const char *name, int tp) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    char rel[256], err[512];
    snprintf(rel, sizeof rel, "%s/reference/reference.json", name);
    char *js = NULL;
    size_t len;
    if (util_read_file(test_fixture(rel), 0, &js, &len, err, sizeof err))
        TEST_SKIP("fixture not installed");
    struct ckpt *ck = NULL;
    if (ckpt_open(test_fixture(name), &ck, err, sizeof err)) {
        free(js);
        ASSERT_MSG(0, "ckpt_open %s: %s", name, err);
    }
    cJSON *root = cJSON_Parse(js);
    free(js);
    cJSON *prompts = cJSON_GetObjectItem(root, "prompts");
    int np = cJSON_GetArraySize(prompts);
    if (np > 4) np = 4;
    int32_t *p[4] = {0};
    int pl[4] = {0};
    for (int i = 0; i < np; i++) {
        cJSON *a = cJSON_GetArrayItem(prompts, i);
        pl[i] = cJSON_GetArraySize(a);
        p[i] = malloc((size_t)pl[i] * sizeof(int32_t));
        for (int j = 0; j < pl[i]; j++) p[i][j] = cJSON_GetArrayItem(a, j)->valueint;
    }
    cJSON_Delete(root);
    alarm(120);
    check_ckpt_tp(ck, name, (const int32_t *const *)p, pl, np, tp, 24);
    for (int i = 0; i < np; i++) free(p[i]);
    ckpt_close(ck);
}

/* The whole model with the all-reduce fused into o_proj / down_proj
 * (default) and without it (AWQD_COMM_FUSED=0): decode logits bitwise the
 * same, greedy tokens the same. */
static void check_fused_model(const char *name, int tp) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    char err[512];
    struct ckpt *ck = NULL;
    if (ckpt_open(test_fixture(name), &ck, err, sizeof err)) TEST_SKIP("fixture not installed");
    const int V = ckpt_config(ck)->vocab;
    int32_t ids[13];
    for (int i = 0; i < 13; i++) ids[i] = (int32_t)((i * 7919 + 11) % V);
    alarm(120);
    struct run_out a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    struct model_group *g = NULL;
    int ok = 0;
    if (!tp_group(ck, tp, 64, &g)) {
        ok = !run_greedy(g, ids, 13, V, 64, 16, &a);
        model_group_free(g);
        g = NULL;
    }
    setenv("AWQD_COMM_FUSED", "0", 1);
    if (ok && !tp_group(ck, tp, 64, &g)) {
        ok = !run_greedy(g, ids, 13, V, 64, 16, &b);
        model_group_free(g);
    } else {
        ok = 0;
    }
    unsetenv("AWQD_COMM_FUSED");
    ckpt_close(ck);
    if (ok) {
        ASSERT(a.n_greedy == b.n_greedy && a.n_greedy == 16);
        for (int t = 0; t < a.n_greedy && !test_failed(); t++) {
            ASSERT_MSG(a.tok[t] == b.tok[t], "%s tp=%d: greedy token %d fused %d, unfused %d", name,
                       tp, t, a.tok[t], b.tok[t]);
            ASSERT_MSG(memcmp(a.step + (size_t)t * V, b.step + (size_t)t * V, (size_t)V * 4) == 0,
                       "%s tp=%d: decode step %d logits differ (fused vs unfused)", name, tp, t);
        }
    }
    run_out_free(&a);
    run_out_free(&b);
    ASSERT_MSG(ok, "%s tp=%d: a run failed", name, tp);
}

TEST(tp_cuda, fused_sum_model_tp2) { check_fused_model("qwen3-tiny-awq", 2); }

TEST(tp_cuda, fixture_qwen3_tp2) { check_fixture("qwen3-tiny-awq", 2); }
TEST(tp_cuda, fixture_qwen2_tp2) { check_fixture("qwen2-tiny-awq", 2); }

/* `awqd mkmodel PRESET DIR --layers L` in dir; 0, or skips / fails. */
static int make_model(const char *preset, int layers, char *dir, size_t dirlen) {
    snprintf(dir, dirlen, "%s/%s", test_tmpdir(), preset);
    char cmd[1400], *out = NULL;
    const char *tokdir = getenv("AWQD_TOKENIZER_DIR");
    char tokarg[600] = "";
    if (tokdir && *tokdir) snprintf(tokarg, sizeof tokarg, " --tokenizer %s", tokdir);
    snprintf(cmd, sizeof cmd, "%s mkmodel %s %s --layers %d%s 2>&1", test_awqd_bin(), preset, dir,
             layers, tokarg);
    if (test_run(cmd, &out) != 0) {
        fprintf(stderr, "%s\n", out ? out : "");
        free(out);
        return 1;
    }
    free(out);
    return 0;
}

static void check_mkmodel(const char *preset, int tp) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    char dir[600], err[512];
    if (make_model(preset, 2, dir, sizeof dir))
        TEST_SKIP("awqd mkmodel failed (tokenizer not installed? set AWQD_TOKENIZER_DIR)");
    struct ckpt *ck = NULL;
    ASSERT_MSG(ckpt_open(dir, &ck, err, sizeof err) == 0, "%s", err);
    int V = ckpt_config(ck)->vocab;
    int32_t p0[37], p1[5];
    unsigned seed = 7;
    for (int i = 0; i < 37; i++) p0[i] = rand_r(&seed) % V;
    for (int i = 0; i < 5; i++) p1[i] = rand_r(&seed) % V;
    const int32_t *ps[2] = {p0, p1};
    const int pl[2] = {37, 5};
    alarm(280);
    check_ckpt_tp(ck, preset, ps, pl, 2, tp, 8);
    ckpt_close(ck);
}

TEST(tp_cuda, mkmodel_qwen3_32b_tp2) { check_mkmodel("qwen3-32b", 2); }
TEST(tp_cuda, mkmodel_qwen3_32b_tp4) { check_mkmodel("qwen3-32b", 4); }
TEST(tp_cuda, mkmodel_llama3_70b_tp2) { check_mkmodel("llama3-70b", 2); }
TEST(tp_cuda, mkmodel_llama3_70b_tp4) { check_mkmodel("llama3-70b", 4); }

/* A whole checkpoint (scripts/tp_check.sh: full-size mkmodel qwen3-32b and
 * llama3-70b): tp=1 once, then each tp of AWQD_TP_SIZES against it. */
TEST(tp_cuda, model_dir) {
    const char *dir = getenv("AWQD_TP_MODEL");
    if (!dir || !*dir) TEST_SKIP("AWQD_TP_MODEL not set");
    const char *sz = getenv("AWQD_TP_SIZES");
    int tps[8], ntp = util_parse_int_list(sz && *sz ? sz : "2,4", tps, 8);
    ASSERT_MSG(ntp > 0, "AWQD_TP_SIZES=%s", sz);
    char err[512];
    struct ckpt *ck = NULL;
    ASSERT_MSG(ckpt_open(dir, &ck, err, sizeof err) == 0, "%s", err);
    int V = ckpt_config(ck)->vocab;
    int32_t p0[37], p1[5];
    unsigned seed = 11;
    for (int i = 0; i < 37; i++) p0[i] = rand_r(&seed) % V;
    for (int i = 0; i < 5; i++) p1[i] = rand_r(&seed) % V;
    const int32_t *ps[2] = {p0, p1};
    const int pl[2] = {37, 5};
    alarm(520);
    struct model_group *g1 = NULL;
    if (tp_group(ck, 1, 64, &g1)) {
        ckpt_close(ck);
        return;
    }
    struct run_out a[2];
    memset(a, 0, sizeof a);
    for (int i = 0; i < 2 && !test_failed(); i++) run_greedy(g1, ps[i], pl[i], V, 64, 8, &a[i]);
    /* AWQD_TP_NOISE=1: the fp16 noise floor of this checkpoint. tp = 1 again
     * with the 37-token prefill in the skinny kernel instead of tc64 (fp32
     * per-chunk scaling instead of the fp16-rounded dequantized weight: an
     * equally valid fp16 computation of the same model); tp = N must then
     * agree with tp = 1 within max(TPC_TOL, 1.5 x that difference). */
    double tol = TPC_TOL;
    const char *nz = getenv("AWQD_TP_NOISE");
    if (nz && !strcmp(nz, "1") && !test_failed()) {
        const int sk0 = w4a16_skinny_max_m(0);
        w4a16_skinny_max_m(64);
        struct run_out a2;
        if (!run_greedy(g1, ps[0], pl[0], V, 64, 8, &a2)) {
            struct diff_stats st = prefill_diff(&a[0], &a2, pl[0], V, TPC_TOL);
            if (1.5 * st.worst > tol) tol = 1.5 * st.worst;
            fprintf(stderr, "  %s noise floor (tp=1 skinny vs tc64 prefill): worst row %.4g, mean %.3g "
                    "of max|logit|; tolerance %.4g\n", dir, st.worst, st.mean, tol);
        }
        run_out_free(&a2);
        w4a16_skinny_max_m(sk0);
    }
    model_group_free(g1);
    for (int t = 0; t < ntp && !test_failed(); t++) {
        if (n_gpus() < tps[t]) {
            fprintf(stderr, "  tp=%d skipped: %d GPUs\n", tps[t], n_gpus());
            continue;
        }
        struct model_group *gt = NULL;
        if (tp_group(ck, tps[t], 64, &gt)) break;
        for (int i = 0; i < 2 && !test_failed(); i++) {
            struct run_out b;
            char what[700];
            snprintf(what, sizeof what, "%s tp=%d prompt %d", dir, tps[t], i);
            if (!run_greedy(gt, ps[i], pl[i], V, 64, 8, &b)) check_agree(what, &a[i], &b, pl[i], V, tol);
            run_out_free(&b);
        }
        model_group_free(gt);
    }
    for (int i = 0; i < 2; i++) run_out_free(&a[i]);
    ckpt_close(ck);
}

/* ======================================================================== */
/* fault injection                                                          */
/* ======================================================================== */

/* tp ranks on the checkpoint at dir (NULL: the qwen3 fixture); rank `bad`
 * fails at its 4th all-reduce. */
static void check_fault(const char *algo, int tp, int bad, const char *dir) {
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    char err[512], rs[16];
    struct ckpt *ck = NULL;
    if (ckpt_open(dir ? dir : test_fixture("qwen3-tiny-awq"), &ck, err, sizeof err))
        TEST_SKIP("fixture not installed");
    snprintf(rs, sizeof rs, "%d", bad);
    setenv("AWQD_FAULT_RANK", rs, 1);
    setenv("AWQD_FAULT_CALL", "3", 1); /* layer 1's o_proj all-reduce of the first forward */
    setenv("AWQD_ALLREDUCE", algo, 1);
    alarm(90); /* a hang is a failure */
    struct model_group *g = NULL;
    int rc = tp_group(ck, tp, 64, &g);
    unsetenv("AWQD_FAULT_RANK");
    unsetenv("AWQD_FAULT_CALL");
    unsetenv("AWQD_ALLREDUCE");
    if (rc) {
        ckpt_close(ck);
        return;
    }
    int V = ckpt_config(ck)->vocab;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (i * 37 + 11) % V;
    int32_t blocks[4] = {0, 1, 2, 3};
    float *logits = malloc((size_t)40 * V * sizeof(float));
    struct batch_seq s = {ids, 40, 0, blocks, 4, MODEL_LOGITS_ALL};
    struct batch b = {&s, 1};
    rc = model_group_forward(g, &b, logits, err, sizeof err);
    ASSERT_MSG(rc < 0, "the injected fault was not reported");
    fprintf(stderr, "  reported: %s (%d)\n", err, rc);
    char want[32];
    snprintf(want, sizeof want, "rank %d", bad);
    ASSERT_CONTAINS(err, want);
    /* the group stays failed, and says so at once */
    rc = model_group_forward(g, &b, logits, err, sizeof err);
    ASSERT_MSG(rc < 0, "a forward after the fault succeeded");
    model_group_free(g); /* every worker must join */
    free(logits);
    ckpt_close(ck);
}

/* A fault at the all-reduce fused into a decode step's down_proj (call 9:
 * the 40-token prefill makes calls 0-6 of the 3-layer fixture, the decode
 * step's embedding 7, layer 0's o_proj 8): rank 0's decode kernel waits for
 * rank 1's tiles, which never come; the abort must release it, the error
 * name rank 1, the next forward fail at once and the workers join. */
static void check_fault_fused(void) {
    if (n_gpus() < 2) TEST_SKIP("needs 2 GPUs");
    char err[512];
    struct ckpt *ck = NULL;
    if (ckpt_open(test_fixture("qwen3-tiny-awq"), &ck, err, sizeof err)) TEST_SKIP("fixture not installed");
    setenv("AWQD_FAULT_RANK", "1", 1);
    setenv("AWQD_FAULT_CALL", "9", 1);
    alarm(90); /* a hang is a failure */
    struct model_group *g = NULL;
    int rc = tp_group(ck, 2, 64, &g);
    unsetenv("AWQD_FAULT_RANK");
    unsetenv("AWQD_FAULT_CALL");
    if (rc) {
        ckpt_close(ck);
        return;
    }
    int V = ckpt_config(ck)->vocab;
    int32_t ids[41];
    for (int i = 0; i < 41; i++) ids[i] = (i * 37 + 11) % V;
    int32_t blocks[4] = {0, 1, 2, 3};
    float *logits = malloc((size_t)40 * V * sizeof(float));
    struct batch_seq s = {ids, 40, 0, blocks, 4, MODEL_LOGITS_LAST};
    struct batch b = {&s, 1};
    rc = model_group_forward(g, &b, logits, err, sizeof err);
    ASSERT_MSG(rc == 0, "the prefill failed: %s", err);
    struct batch_seq d = {ids + 40, 1, 40, blocks, 4, MODEL_LOGITS_LAST};
    struct batch bd = {&d, 1};
    rc = model_group_forward(g, &bd, logits, err, sizeof err);
    ASSERT_MSG(rc < 0, "the injected fault was not reported");
    fprintf(stderr, "  reported: %s (%d)\n", err, rc);
    ASSERT_CONTAINS(err, "rank 1");
    rc = model_group_forward(g, &bd, logits, err, sizeof err);
    ASSERT_MSG(rc < 0, "a forward after the fault succeeded");
    model_group_free(g); /* every worker must join */
    free(logits);
    ckpt_close(ck);
}

TEST(tp_cuda, fault_rank1_fused) { check_fault_fused(); }
TEST(tp_cuda, fault_rank1_p2p) { check_fault("p2p", 2, 1, NULL); }
TEST(tp_cuda, fault_rank1_p2pflags) { check_fault("p2p_flags", 2, 1, NULL); }
TEST(tp_cuda, fault_rank1_nccl) { check_fault("nccl", 2, 1, NULL); }

static void fault_tp4(const char *algo) {
    if (n_gpus() < 4) TEST_SKIP("needs 4 GPUs");
    char dir[600];
    if (make_model("qwen3-32b", 2, dir, sizeof dir))
        TEST_SKIP("awqd mkmodel failed (tokenizer not installed? set AWQD_TOKENIZER_DIR)");
    check_fault(algo, 4, 2, dir);
}

TEST(tp_cuda, fault_rank2_tp4_p2p) { fault_tp4("p2p"); }
TEST(tp_cuda, fault_rank2_tp4_nccl) { fault_tp4("nccl"); }

/* ======================================================================== */
/* command line                                                             */
/* ======================================================================== */

TEST(tp_cuda, generate_cli) {
    if (n_gpus() < 2) TEST_SKIP("needs 2 GPUs");
    const char *dir = test_fixture("qwen3-tiny-awq");
    char probe[700];
    snprintf(probe, sizeof probe, "%s/config.json", dir);
    if (access(probe, R_OK)) TEST_SKIP("fixture not installed");
    char cmd[1400], *o1 = NULL, *o2 = NULL;
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --backend cuda --prompt-ids 1,2,3,4,5 --max-tokens 6 "
             "--ignore-eos --json 2>/dev/null",
             test_awqd_bin(), dir);
    int rc1 = test_run(cmd, &o1);
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --backend cuda --tp 2 --devices 1,0 --prompt-ids 1,2,3,4,5 "
             "--max-tokens 6 --ignore-eos --json 2>&1",
             test_awqd_bin(), dir);
    alarm(120);
    int rc2 = test_run(cmd, &o2);
    fprintf(stderr, "  tp1: %s  tp2: %s", o1 ? o1 : "", o2 ? o2 : "");
    int ok = rc1 == 0 && rc2 == 0 && o2 && strstr(o2, "\"output_ids\"");
    free(o1);
    free(o2);
    ASSERT_MSG(ok, "generate --tp 2 failed (rc %d / %d)", rc1, rc2);
    /* bad device lists are refused with a message */
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --backend cuda --tp 2 --devices 0 --prompt-ids 1 2>&1",
             test_awqd_bin(), dir);
    char *o3 = NULL;
    int rc3 = test_run(cmd, &o3);
    int ok3 = rc3 != 0 && o3 && strstr(o3, "--devices");
    free(o3);
    ASSERT_MSG(ok3, "--tp 2 --devices 0 was not refused");
}

/* ======================================================================== */
/* benchmarks (AWQD_TP_BENCH=1)                                             */
/* ======================================================================== */

TEST(tp_cuda, bench_allreduce) {
    if (!getenv("AWQD_TP_BENCH")) TEST_SKIP("AWQD_TP_BENCH not set");
    const char *t = getenv("AWQD_TP_BENCH_TP");
    int tp = t ? atoi(t) : 2;
    if (tp < 2 || tp > TPC_MAXR) TEST_SKIP("AWQD_TP_BENCH_TP out of range");
    if (n_gpus() < tp) TEST_SKIP("fewer GPUs than ranks");
    static const size_t kb[] = {4, 8, 16, 32, 64, 128, 256, 512, 1024};
    size_t sizes[9];
    for (int i = 0; i < 9; i++) sizes[i] = kb[i] * 1024 / 2;
    struct ar_ctx x;
    memset(&x, 0, sizeof x);
    x.tp = tp;
    x.algo = COMM_CUDA_P2P;
    x.mode = AR_BENCH;
    x.sizes = sizes;
    x.n_sizes = 9;
    x.reps = 500;
    alarm(200);
    int rc = ar_run(&x);
    if (rc == 1) TEST_SKIP("no peer access");
    if (rc) return;
    printf("all-reduce fp16, tp=%d, us per call on rank 0's stream: eager = %d calls back to "
           "back (launch included), graph = 32 calls captured in one CUDA graph, replayed; "
           "p2p = push kernel, flags = the older flag-barrier kernel; -1 = capture failed\n",
           tp, x.reps);
    printf("| bytes | nccl eager | p2p eager | flags eager | nccl graph | p2p graph | flags graph "
           "| p2p/nccl graph |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < 9; i++)
        printf("| %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", kb[i] * 1024,
               x.us[0][0][i], x.us[1][0][i], x.us[2][0][i], x.us[0][1][i], x.us[1][1][i],
               x.us[2][1][i], x.us[0][1][i] > 0 ? x.us[1][1][i] / x.us[0][1][i] : 0.0);
    fflush(stdout);
}

TEST(tp_cuda, bench_decode) {
    if (!getenv("AWQD_TP_BENCH")) TEST_SKIP("AWQD_TP_BENCH not set");
    int ng = n_gpus();
    if (ng < 1) TEST_SKIP("no GPU");
    const char *ls = getenv("AWQD_TP_BENCH_LAYERS");
    int layers = ls ? atoi(ls) : 8;
    char dir[600], err[512];
    if (make_model("qwen3-32b", layers, dir, sizeof dir)) TEST_SKIP("awqd mkmodel failed");
    struct ckpt *ck = NULL;
    ASSERT_MSG(ckpt_open(dir, &ck, err, sizeof err) == 0, "%s", err);
    int V = ckpt_config(ck)->vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    printf("decode step, batch 1, mkmodel qwen3-32b --layers %d (ms per step; x%.1f for 64 layers "
           "is a rough full-model figure)\n",
           layers, 64.0 / layers);
    for (int tp = 1; tp <= 4 && tp <= ng; tp *= 2) {
        struct model_group *g = NULL;
        if (tp_group(ck, tp, 64, &g)) break;
        int32_t blocks[32];
        for (int i = 0; i < 32; i++) blocks[i] = i;
        int32_t tok = 1;
        double t0 = 0;
        int steps = 64, warm = 8, rc = 0;
        for (int i = 0; i < steps + warm && !rc; i++) {
            if (i == warm) t0 = util_now_s();
            struct batch_seq s = {&tok, 1, i, blocks, 32, MODEL_LOGITS_LAST};
            struct batch b = {&s, 1};
            rc = model_group_forward(g, &b, logits, err, sizeof err);
        }
        double ms = (util_now_s() - t0) * 1000.0 / steps;
        model_group_free(g);
        ASSERT_MSG(rc == 0, "decode: %s", err);
        printf("  tp=%d: %.3f ms/step\n", tp, ms);
        fflush(stdout);
    }
    free(logits);
    ckpt_close(ck);
}
