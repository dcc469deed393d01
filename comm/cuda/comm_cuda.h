/* comm_cuda.h — the communicator of CUDA tensor-parallel ranks that are
 * threads of one process, one GPU each (docs/TENSOR_PARALLEL.md).
 *
 * all_reduce_sum (struct comm, comm/comm.h) sums a BUF_ACT (fp16) buffer of
 * the CUDA backend in place, asynchronously on the rank's backend stream, with
 * no host synchronisation, so it may be captured in a CUDA graph and
 * replayed (comm->graph_safe is 1). comm->sum_desc hands out the exchange
 * areas of the all-reduce fused into the decode linear's epilogue
 * (w4a16_linear_sum, kernels/cuda/w4a16.h), used after o_proj / down_proj of
 * decode batches instead of all_reduce_sum. Paths of all_reduce_sum:
 *   p2p   one-shot "push" kernel for messages <= p2p_max_bytes: each rank
 *         stores its input straight into every peer's receive area over
 *         NVLink; the receive areas hold -0.0 while idle, so the data is its
 *         own flag (no fences, no flag round trip); each rank polls its area,
 *         sums all ranks in rank order (fp32) and resets the slots. The
 *         parity of the per-call epoch (held on the device) picks one of two
 *         areas. Results are bit-identical on every rank.
 *   p2p_flags  the older one-shot kernel (own staging buffer, a flag per
 *         peer and block, peers pull), kept for comparison;
 *   nccl  ncclAllReduce(fp16, sum) for larger messages, or when peer access is
 *         not possible between every pair of devices. Inside a graph capture
 *         auto takes p2p up to the receive-area capacity (2 MiB by default),
 *         NCCL above it (connected eagerly at group creation, so capturable).
 *
 * Usage (model_group does this; one thread per rank):
 *     struct comm *c[2];
 *     comm_cuda_group(2, (int[]){0, 1}, c, err, sizeof err);   // any thread
 *     // in rank r's thread, after ops_cuda_create(devices[r], &ops, ...):
 *     comm_cuda_attach(c[r], ops, err, sizeof err);
 *     c[r]->all_reduce_sum(c[r], buf, n);
 *     comm_free(c[r]);                        // each; the last frees the group
 *
 * Faults: an error on one rank (its backend's sticky error seen at an
 * all-reduce, a p2p wait past AWQD_COMM_TIMEOUT_MS, or the injected fault
 * below) aborts the whole group: waiting p2p kernels on the other ranks leave
 * their spin loops, the NCCL communicators are aborted (ncclCommAbort), every
 * later all_reduce_sum on every rank returns -ECANCELED at once, and
 * comm_cuda_status says which rank failed first. An aborted group stays
 * aborted: free the model group and build a new one. A replayed graph runs
 * none of this host code: call comm->status(c) before a replay and after the
 * step's sync (it also turns a timeout recorded by a replayed kernel into an
 * abort).
 *
 * Environment (read at comm_cuda_group):
 *   AWQD_ALLREDUCE=auto|nccl|p2p|p2p_flags|off
 *                                  path choice (default auto: p2p up to the
 *                                  threshold, nccl above); off = no
 *                                  communication at all (wrong sums; only to
 *                                  time a step without its all-reduces)
 *   AWQD_P2P_MAX_BYTES=N           the threshold (default COMM_CUDA_P2P_MAX_TP2
 *                                  at tp = 2, COMM_CUDA_P2P_MAX_DEFAULT above)
 *   AWQD_P2P_CAP_BYTES=N           largest p2p message (buffer size; default
 *                                  2 MiB, at least the threshold)
 *   AWQD_COMM_TIMEOUT_MS=N         p2p wait limit (default 60000; 0: none)
 *   AWQD_COMM_FUSED=0              no all-reduce fused into the decode linear
 *                                  (comm->sum_desc declines; comm_cuda_set_fused)
 *   AWQD_FAULT_RANK=r              testing: rank r's all-reduce number
 *   AWQD_FAULT_CALL=k              k (0-based, default 1) fails with -EIO
 *                                  instead of running, and aborts the group */
#ifndef AWQD_COMM_CUDA_H
#define AWQD_COMM_CUDA_H

#include <stddef.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ops;

#define COMM_CUDA_MAX_RANKS 8                  /* p2p path; nccl has no limit */
/* The p2p threshold in bytes where AWQD_P2P_MAX_BYTES is not set: 2 MiB (the
 * default capacity) at tp = 2 (session 47, 2x H200: qwen3-32b decode at
 * batch 12-128 0.90-0.93x the step with NCCL above 128 KiB, llama3-70b at
 * batch 16 / 32 0.91 / 0.93x; session 3's slow push kernel above ~160 KB
 * inside the model is gone), 128 KiB at tp >= 3 (session 3's crossover, 4x
 * H200, not measured since: no 4x host lent). docs/TENSOR_PARALLEL.md */
#define COMM_CUDA_P2P_MAX_TP2 (2 * 1024 * 1024)
#define COMM_CUDA_P2P_MAX_DEFAULT (128 * 1024)

enum comm_cuda_algo {
    COMM_CUDA_AUTO = 0,
    COMM_CUDA_NCCL = 1,
    COMM_CUDA_P2P = 2,            /* the push kernel (up to the capacity; NCCL above) */
    COMM_CUDA_P2P_FLAGS = 3,      /* the flag-barrier kernel (likewise) */
    COMM_CUDA_OFF = 4             /* no communication: benchmarks only */
};

/* `size` ranks on CUDA devices devices[0..size) (NULL: 0..size-1), all in
 * this process: creates the NCCL communicators (ncclCommInitAll), enables
 * peer access between every pair and allocates each rank's staging buffer and
 * flags. Restores the calling thread's current device. out: [size]. 0 /
 * negative errno with a message. */
int comm_cuda_group(int size, const int *devices, struct comm **out, char *err, size_t errlen);

/* Binds rank c to the CUDA backend instance its thread uses (its stream and
 * sticky error); call from that thread before the first collective. */
int comm_cuda_attach(struct comm *c, struct ops *ops, char *err, size_t errlen);

/* Group-wide settings (call while no collective is in flight, e.g. between
 * forwards; affect every rank of c's group). */
void comm_cuda_set_algo(struct comm *c, enum comm_cuda_algo algo);
/* p2p threshold in bytes, clamped to the staging capacity. */
void comm_cuda_set_p2p_max(struct comm *c, size_t bytes);
size_t comm_cuda_p2p_max(const struct comm *c);
/* Largest message the p2p kernels take (bytes). */
size_t comm_cuda_p2p_cap(const struct comm *c);
/* Benchmarks: every group of the process uses `algo` (enum comm_cuda_algo)
 * from now on, -1 restores each group's own choice. Call between forwards,
 * when no collective is in flight; graphs captured before keep the path they
 * recorded. */
void comm_cuda_force_algo(int algo);
/* The all-reduce fused into the decode linear's epilogue (comm->sum_desc,
 * ops->linear_sum; on by default where the p2p path exists and the devices
 * are of one kind, AWQD_COMM_FUSED=0 turns it off). on 1 / 0 sets it for the
 * whole group (between forwards; graphs captured before keep what they
 * recorded), < 0 only queries. Returns the setting in effect. */
int comm_cuda_set_fused(struct comm *c, int on);
/* 1 when peer access works between every pair (the p2p path exists). */
int comm_cuda_p2p_available(const struct comm *c);

/* 0 while the group is healthy; else the first failure's errno, with
 * "rank R: what" in msg (may be NULL). */
int comm_cuda_status(const struct comm *c, char *msg, size_t msglen);

#ifdef __cplusplus
}
#endif

#endif
