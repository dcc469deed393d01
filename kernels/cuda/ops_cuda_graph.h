/* ops_cuda_graph.h — counters of the CUDA backend's graphs (ops->graph_*),
 * for tests and logs: how many graphs were recorded and replayed by every
 * backend instance of this process since it started; and the knob that
 * decides what a recorded decode step's attention does (tests switch it).
 * Plain C; CUDA builds. */
#ifndef AWQD_OPS_CUDA_GRAPH_H
#define AWQD_OPS_CUDA_GRAPH_H

#ifdef __cplusplus
extern "C" {
#endif

/* recorded: successful graph_end calls; failed: graph_end calls that failed;
 * replayed: graph_run calls (any pointer may be NULL). */
void ops_cuda_graph_counts(long *recorded, long *failed, long *replayed);

/* Decode batches (ops->attention with decode_fixed) of at least min_rows
 * rows fold q/k-norm + RoPE + the K/V write into the decode attention
 * (kernels/cuda/attn_decode.cu; 0: never). The AWQD_CUDA_DEC_QK knob, set
 * for the whole process (tests, measurements); min_rows < 0 only queries.
 * Returns the value in effect. */
int ops_cuda_dec_qk(int min_rows);

#ifdef __cplusplus
}
#endif

#endif
