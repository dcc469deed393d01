/* mem_plan.h — how one GPU's memory is shared between the INT4 weights, the
 * workspace and the paged KV cache (the CUDA backend's memory plan).
 *
 * Usage (before model_group_init, on the device the rank will use):
 *     struct cuda_mem_plan p;
 *     if (cuda_mem_plan_make(cfg, 1, 0, 0.90, 16, 8192, 256, &p, err, sizeof err)) ...
 *     cuda_mem_plan_print(&p, stderr);      // one block of lines for the log
 *     go.model.n_blocks = p.n_blocks;
 *
 * The budget is total * gpu_memory_fraction minus what other processes (and
 * this one, so far) already hold; from it come the weights (INT4 linears with
 * their fp16 scales and packed zeros, fp16 embeddings / lm_head / norms — never
 * a dequantized copy), the workspace (itemized: the model's activations for
 * max_tokens rows, batch tables, the lm_head's logits chunk, the sampling
 * scratch; the backend's split-K, attention partials, lm_head gather and a
 * small slack), and what is left becomes KV blocks. -ENOMEM with a message when the weights and
 * workspace alone do not fit; -EIO when the device cannot be queried.
 *
 * Thread safety: any thread; it only reads device properties. */
#ifndef AWQD_CUDA_MEM_PLAN_H
#define AWQD_CUDA_MEM_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct model_config;

struct cuda_mem_plan {
    int device;
    uint64_t total;               /* device memory, bytes */
    uint64_t in_use;              /* held before the model (other processes, contexts) */
    double fraction;              /* gpu_memory_fraction */
    uint64_t budget;              /* total * fraction - in_use */
    uint64_t weights;             /* INT4 linears + fp16 tables of one rank */
    uint64_t weights_int4;        /* of which the quantized linears */
    uint64_t workspace;           /* the sum of the ws_* items below */
    /* workspace, itemized: the model's buffers (engine/model.h model_workspace)
     * and the CUDA backend's own (kernels/cuda/ops_cuda.cu, attn*.cu) */
    int max_tokens, max_seqs;     /* rows per forward (T), sequences per forward */
    uint64_t ws_act;              /* h, x|att, qkv|mlp, proj [T rows] */
    uint64_t ws_act_unshared;     /* the same without sharing (for comparison) */
    uint64_t ws_batch;            /* ids, positions, slots, logit rows, block tables */
    uint64_t ws_logits;           /* F32 [logit_chunk, vocab]: the lm_head's rows */
    uint64_t ws_sample;           /* sample_topk scratch + a chunk's inputs and outputs */
    int logit_chunk;
    uint64_t ws_linear;           /* W4A16 split-K (and, with AWQD_W4A16_WS_ROWS >= 256, the
                                     transient dequantized layer): estimate */
    uint64_t ws_attn;             /* decode split partials (exact) + prefill split partials
                                     (bound) */
    uint64_t ws_lm_head;          /* lm_head row gather (cuBLAS path, > LM_HEAD_TC_MAX rows) */
    uint64_t ws_slack;            /* allocator rounding, cuBLAS handle, lazily loaded kernels */
    uint64_t kv_bytes;            /* n_blocks * kv_block_bytes */
    uint64_t kv_block_bytes;      /* one block: K and V, all layers, fp16 */
    uint64_t kv_alloc;            /* what the 2 x n_layers K/V buffers take, each rounded up to
                                     the allocation granularity (2 MiB) */
    int n_layers;
    int block_size;
    int n_blocks;                 /* KV blocks the cache holds */
    uint64_t kv_tokens;           /* n_blocks * block_size */
};

/* Plans rank `rank` of `tp` on `device` (tp = 1: the whole model). */
int cuda_mem_plan_make(const struct model_config *cfg, int tp, int device, double fraction,
                       int block_size, int max_tokens, int max_seqs, struct cuda_mem_plan *p,
                       char *err, size_t errlen);

/* Device bytes the KV cache of n_blocks takes under plan p: 2 x n_layers
 * buffers (K and V per layer), each rounded up to 2 MiB. */
uint64_t cuda_mem_plan_kv_alloc(const struct cuda_mem_plan *p, int n_blocks);

/* Writes the plan as a few human-readable lines. */
void cuda_mem_plan_print(const struct cuda_mem_plan *p, FILE *f);

/* Rooflines for benchmarks, measured on `device` (needs ~2.2 GB free):
 * copy_gbs = device-to-device copy rate counting bytes read + written (GB/s),
 * gemm_tflops = cuBLAS fp16 8192^3 GEMM with fp32 accumulation (TFLOP/s). */
int cuda_measure_rates(int device, double *copy_gbs, double *gemm_tflops, char *err,
                       size_t errlen);

/* CUDA devices usable by this process: 0 when there is no GPU, no driver or a
 * driver older than the runtime (the error is cleared, nothing is logged). */
int cuda_device_count(void);

/* Device memory in use (total - free) and total, bytes. */
int cuda_mem_in_use(int device, uint64_t *used, uint64_t *total);

#ifdef __cplusplus
}
#endif

#endif
