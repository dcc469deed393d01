/* mem_plan.cu — the CUDA backend's memory plan (mem_plan.h). */
#include "kernels/cuda/mem_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

extern "C" {
#include "engine/ckpt.h"
#include "engine/util.h"
}

/* cuBLAS workspace, attention/split-K scratch, allocator slack */
#define PLAN_RESERVE ((uint64_t)512 << 20)

/* Bytes of one AWQ linear as the device holds it: 4-bit weights, fp16 scales,
 * 4-bit zeros per group of G rows, optional fp16 bias. */
static uint64_t awq_bytes(uint64_t k, uint64_t n, uint64_t g, int bias) {
    uint64_t groups = (k + g - 1) / g;
    return k * n / 2 + groups * n * 2 + groups * n / 2 + (bias ? n * 2 : 0);
}

static int div_up(int a, int b) { return (a + b - 1) / b; }

extern "C" int cuda_mem_plan_make(const struct model_config *cfg, int tp, int device,
                                  double fraction, int block_size, int max_tokens, int max_seqs,
                                  struct cuda_mem_plan *p, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    if (tp < 1 || block_size < 1 || max_tokens < 1 || max_seqs < 1 || !(fraction > 0) ||
        fraction > 1)
        return util_err(err, errlen, -EINVAL, "memory plan: bad arguments");
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaSetDevice(device), err, errlen);
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b), err, errlen);
    p->device = device;
    p->total = total_b;
    p->in_use = total_b - free_b;
    p->fraction = fraction;
    uint64_t cap = (uint64_t)((double)total_b * fraction);
    p->budget = cap > p->in_use ? cap - p->in_use : 0;

    /* this rank's geometry (model.h / ckpt.h sharding) */
    uint64_t H = (uint64_t)cfg->hidden, hd = (uint64_t)cfg->head_dim;
    uint64_t nh = (uint64_t)div_up(cfg->n_heads, tp);
    uint64_t nkv = (uint64_t)(cfg->n_kv_heads >= tp ? div_up(cfg->n_kv_heads, tp) : 1);
    uint64_t I = (uint64_t)div_up(cfg->intermediate, tp), V = (uint64_t)div_up(cfg->vocab, tp);
    uint64_t G = cfg->group_size > 0 ? (uint64_t)cfg->group_size : 128;
    uint64_t L = (uint64_t)cfg->n_layers;
    uint64_t per_layer = awq_bytes(H, (nh + 2 * nkv) * hd, G, cfg->qkv_bias) +
                         awq_bytes(nh * hd, H, G, 0) + awq_bytes(H, 2 * I, G, 0) +
                         awq_bytes(I, H, G, 0);
    p->weights_int4 = per_layer * L;
    uint64_t tables = V * H * 2 * (cfg->tie_embeddings ? 1 : 2);
    uint64_t norms = L * (2 * H * 2 + (cfg->qk_norm ? 2 * hd * 2 : 0)) + H * 2;
    p->weights = p->weights_int4 + tables + norms;

    /* workspace (engine/model.c): h, x, proj [T, H]; qkv; att; mlp; logits [32, V] */
    uint64_t T = (uint64_t)max_tokens;
    uint64_t act = T * (3 * H + (nh + 2 * nkv) * hd + nh * hd + I) * 2;
    uint64_t tables_ws = (uint64_t)max_seqs * div_up(cfg->max_position, block_size) * 4 + T * 16;
    uint64_t logits = 32 * V * 4 + 32 * H * 2;
    p->workspace = act + tables_ws + logits + PLAN_RESERVE;
    /* AWQD_W4A16_WS_ROWS >= 256 (ops_cuda.cu): the linear workspace may hold
     * the largest layer dequantized for one call (+ its gate|up output) */
    const char *wr = getenv("AWQD_W4A16_WS_ROWS");
    if (wr && atoi(wr) >= 256) {
        uint64_t rows = (uint64_t)atoi(wr) < T ? (uint64_t)atoi(wr) : T;
        p->workspace += H * 2 * I * 2 + rows * 2 * I * 2;
    }

    p->block_size = block_size;
    p->kv_block_bytes = 2 * L * (uint64_t)block_size * nkv * hd * 2;
    uint64_t need = p->weights + p->workspace;
    if (need > p->budget)
        return util_err(err, errlen, -ENOMEM,
                        "memory plan: weights %.2f GB + workspace %.2f GB exceed the %.2f GB "
                        "available on device %d (%.0f%% of %.2f GB, %.2f GB already in use)",
                        p->weights / 1e9, p->workspace / 1e9, p->budget / 1e9, device,
                        fraction * 100, total_b / 1e9, p->in_use / 1e9);
    uint64_t blocks = (p->budget - need) / p->kv_block_bytes;
    if (blocks > (1u << 24)) blocks = 1u << 24;
    if (blocks < 2)
        return util_err(err, errlen, -ENOMEM, "memory plan: no room for a KV cache on device %d",
                        device);
    p->n_blocks = (int)blocks;
    p->kv_bytes = blocks * p->kv_block_bytes;
    p->kv_tokens = blocks * (uint64_t)block_size;
    return 0;
}

extern "C" void cuda_mem_plan_print(const struct cuda_mem_plan *p, FILE *f) {
    fprintf(f,
            "memory plan (device %d): %.2f GB total, %.2f GB in use before the model, "
            "fraction %.2f -> budget %.2f GB\n"
            "  weights   %8.3f GB (INT4 linears %.3f GB + fp16 embeddings/norms)\n"
            "  workspace %8.3f GB\n"
            "  KV cache  %8.3f GB = %d blocks x %d tokens = %llu tokens (%.1f KB per token)\n",
            p->device, p->total / 1e9, p->in_use / 1e9, p->fraction, p->budget / 1e9,
            p->weights / 1e9, p->weights_int4 / 1e9, p->workspace / 1e9, p->kv_bytes / 1e9,
            p->n_blocks, p->block_size, (unsigned long long)p->kv_tokens,
            p->kv_block_bytes / 1024.0 / p->block_size);
}

extern "C" int cuda_mem_in_use(int device, uint64_t *used, uint64_t *total) {
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaSetDevice(device), NULL, 0);
    CUDA_CHECK(cudaMemGetInfo(&f, &t), NULL, 0);
    *used = t - f;
    *total = t;
    return 0;
}

static int measure(int device, double *copy_gbs, double *gemm_tflops, void *buf, char *err,
                   size_t errlen) {
    const size_t half_bytes = (size_t)1 << 30; /* 1 GiB copied per rep */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0), err, errlen);
    CUDA_CHECK(cudaEventCreate(&e1), err, errlen);
    char *a = (char *)buf, *b = a + half_bytes;
    float ms = 0;
    for (int i = 0; i < 3; i++) CUDA_CHECK(cudaMemcpyAsync(b, a, half_bytes, cudaMemcpyDeviceToDevice, 0), err, errlen);
    CUDA_CHECK(cudaEventRecord(e0, 0), err, errlen);
    for (int i = 0; i < 10; i++) CUDA_CHECK(cudaMemcpyAsync(b, a, half_bytes, cudaMemcpyDeviceToDevice, 0), err, errlen);
    CUDA_CHECK(cudaEventRecord(e1, 0), err, errlen);
    CUDA_CHECK(cudaEventSynchronize(e1), err, errlen);
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1), err, errlen);
    *copy_gbs = 2.0 * 10 * half_bytes / (ms * 1e-3) / 1e9;
    /* GEMM: 8192^3 fp16 (A, B, C each 128 MiB) inside the same buffer */
    const int n = 8192;
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        return util_err(err, errlen, -EIO, "cuda_measure_rates: cublasCreate failed");
    CUDA_CHECK(cudaMemset(buf, 0, (size_t)3 * n * n * 2), err, errlen);
    void *A = buf, *B = a + (size_t)n * n * 2, *C = a + (size_t)2 * n * n * 2;
    float one = 1, zero = 0;
    int rc = 0;
    for (int i = 0; i < 13 && !rc; i++) {
        if (i == 3) cudaEventRecord(e0, 0);
        if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16F, n, B,
                         CUDA_R_16F, n, &zero, C, CUDA_R_16F, n, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            rc = util_err(err, errlen, -EIO, "cuda_measure_rates: cublasGemmEx failed");
    }
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    *gemm_tflops = 10 * 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
    cublasDestroy(h);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

extern "C" int cuda_measure_rates(int device, double *copy_gbs, double *gemm_tflops, char *err,
                                  size_t errlen) {
    CUDA_CHECK(cudaSetDevice(device), err, errlen);
    void *buf = NULL;
    CUDA_CHECK(cudaMalloc(&buf, (size_t)2 << 30), err, errlen);
    int rc = measure(device, copy_gbs, gemm_tflops, buf, err, errlen);
    cudaFree(buf);
    return rc;
}

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}
