/* comm.h — collectives between the tensor-parallel ranks of one model.
 *
 * A struct comm is one rank's handle. The forward pass calls all_reduce_sum
 * after each row-parallel linear (o_proj, down_proj) and after the
 * vocab-parallel embedding; nothing else crosses ranks inside a forward.
 * Logits need no gather: each rank writes its vocabulary columns straight
 * into the caller's host array (see model.h).
 *
 * Implementations:
 *   comm_cpu_single   size 1, every collective a no-op (any backend);
 *   comm_cpu_group    `size` ranks in one process, one thread per rank, CPU
 *                     backend buffers (kernels/cpu); sums in rank order, so
 *                     every rank gets bit-identical results;
 *   comm/cuda/        NCCL (CUDA builds).
 *
 * Thread safety: each rank's handle is used by that rank's thread only; the
 * collectives of a group must be entered by all `size` ranks in the same
 * order (they block until all have arrived). */
#ifndef AWQD_COMM_H
#define AWQD_COMM_H

#include <stddef.h>

struct buf;

struct comm {
    int rank, size;
    /* In place: buf[0..n) (BUF_ACT elements of this rank's backend) becomes
     * the sum over ranks. 0 / negative errno. */
    int (*all_reduce_sum)(struct comm *c, struct buf *b, size_t n);
    /* Blocks until every rank has called it. */
    void (*barrier)(struct comm *c);
    void (*destroy)(struct comm *c);
    void *priv;
    /* 1 when all_reduce_sum may be recorded into a CUDA graph of this rank's
     * stream (between ops->graph_begin and graph_end) and replayed; 0 when
     * it must run eagerly (the model then runs that step without a graph). */
    int graph_safe;
    /* 0 while the group is healthy, else the negative errno of its first
     * failure on any rank: an abort (a rank's error at an all-reduce, an
     * injected fault) or a peer that never arrived in a p2p wait — which a
     * replayed graph cannot report itself (its kernels leave the wait and the
     * step's sums are garbage). Host-only and cheap: call it before a graph
     * replay and after the step's sync. NULL: nothing to check (CPU comms). */
    int (*status)(struct comm *c);
    /* Optional (NULL: not offered; CUDA groups with peer access): the
     * all-reduce after a row-parallel linear made in the linear's own
     * epilogue (ops->linear_sum). For the all-reduce of `n` elements at call
     * site `site` (the model numbers them 2 l for o_proj and 2 l + 1 for
     * down_proj: consecutive sites alternate the exchange area): *desc = the
     * descriptor to pass to ops->linear_sum, and the call counts as this
     * rank's all-reduce (aborts, faults and errors as all_reduce_sum: a
     * negative errno); or *desc = NULL and 0 when this group does not fuse
     * (forced algorithm, AWQD_COMM_FUSED=0, no peer access): then nothing is
     * counted — run the linear and all_reduce_sum. The same answer on every
     * rank for the same call. */
    int (*sum_desc)(struct comm *c, int site, size_t n, const void **desc);
};

/* One rank, no-op collectives. */
int comm_cpu_single(struct comm **out);

/* `size` in-process ranks over CPU-backend buffers: out[r] is rank r's handle
 * (out: [size]). Free each with comm_free; the shared state goes with the
 * last one. */
int comm_cpu_group(int size, struct comm **out);

/* Calls c->destroy (NULL ok). */
void comm_free(struct comm *c);

#endif
