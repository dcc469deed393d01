/* mem_plan.cu — the CUDA backend's memory plan (mem_plan.h). */
#include "kernels/cuda/mem_plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dec_split.h"
#include "kernels/cuda/w4a16.h"
#include "kernels/cuda/w4a16_gemm.h"

extern "C" {
#include "engine/ckpt.h"
#include "engine/model.h"
#include "engine/util.h"
}

/* What the itemized workspace does not cover, measured on an H200 (Qwen3-8B,
 * `awqd bench e2e`: device memory in use minus weights, KV buffers and the
 * items, ~0.096 GB): the backend itself (stream, cuBLAS handle: 71 MB at
 * ops_cuda_create, test ops_cuda.mem_granularity), allocation rounding of
 * the ~600 weight / norm buffers (small allocations share 2 MiB pages, 1.5 MB
 * ones take a whole page), kernels loaded lazily at first use */
#define PLAN_SLACK ((uint64_t)96 << 20)
/* device allocations are whole 2 MiB pages */
#define PLAN_GRAN ((uint64_t)2 << 20)
/* rows up to which the lm_head runs on its own kernels (ops_cuda.cu); above,
 * the rows are gathered for cuBLAS */
#define PLAN_LM_HEAD_OWN_ROWS 32

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
    int sms = 0; /* the linear workspace's stream-K pieces and the attention partials */
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), err, errlen);
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

    /* workspace: the model's buffers (engine/model.c, one definition) */
    struct model_opts mo;
    model_opts_default(&mo);
    mo.block_size = block_size;
    mo.max_tokens = max_tokens;
    mo.max_seqs = max_seqs;
    mo.max_blocks_per_seq = 0; /* from max_position, as the server sizes it */
    struct model_ws mw;
    model_workspace(cfg, tp, &mo, 2, &mw);
    p->max_tokens = max_tokens;
    p->max_seqs = max_seqs;
    p->ws_act = mw.act;
    p->ws_act_unshared = mw.act_unshared;
    p->ws_batch = mw.batch;
    p->ws_logits = mw.logits;
    p->ws_sample = mw.sample;
    p->logit_chunk = mw.logit_chunk;
    /* W4A16 split-K (ops_cuda.cu sizes it with w4a16_workspace_bytes for
     * AWQD_W4A16_WS_ROWS rows, default 64): the skinny kernel's fp32 partials,
     * n16 column tiles x splits (<= 8, ~K/1024) x 4096 bytes at 64 rows. An
     * estimate of the kernels' choice; `awqd bench e2e` prints the measured
     * total. With AWQD_W4A16_WS_ROWS >= 256: the largest layer dequantized
     * for one call (+ its gate|up output). */
    {
        uint64_t T = (uint64_t)max_tokens;
        uint64_t shapes[4][3] = {{H, (nh + 2 * nkv) * hd, 0}, {nh * hd, H, 0}, {H, 2 * I, 1}, {I, H, 0}};
        uint64_t lin = 0;
        for (int i = 0; i < 4; i++) {
            uint64_t k = shapes[i][0], n = shapes[i][1];
            uint64_t ks = (k / 64 + 15) / 16;
            if (ks > 8) ks = 8;
            uint64_t b = (n + 15) / 16 * ks * 4096;
            if (b > lin) lin = b;
        }
        /* prefill rows: the wgmma GEMM's stream-K parks one piece per SM
         * (w4a16_stream_k_bytes; more than the 64-row partials only for
         * small shards, e.g. Llama-3-70B at tp = 8) */
        const uint64_t sk = w4a16_gemm_sk_workspace(sms);
        if (sk > lin) lin = sk;
        /* the wgmma GEMM's permuted copy of gate|up's x at up to 64 rows
         * (XP, w4a16_gemm_xp), next to the partials */
        lin += 64 * H * 2 + 256;
        /* the device's poll buffer of the decode K split (w4a16.cu, with the first weight) */
        lin += w4a16_poll_bytes(sms);
        const char *wr = getenv("AWQD_W4A16_WS_ROWS");
        if (wr && atoi(wr) >= 256) {
            uint64_t rows = (uint64_t)atoi(wr) < T ? (uint64_t)atoi(wr) : T;
            uint64_t deq = H * 2 * I * 2 + rows * 2 * I * 2;
            if (deq > lin) lin = deq;
        }
        p->ws_linear = lin;
    }
    /* attention (attn_decode.cu dec_reserve, attn.cu build_list): decode
     * partials for every batch up to max(64, max_seqs) sequences (the split
     * rule of dec_split.h at 4,4: a bound of the default 4,2), prefill
     * partials < 4 x SMs x 64 pairs */
    {
        uint64_t dec = 0;
        int smax = max_seqs > 64 ? max_seqs : 64;
        for (int s = 1; s <= smax; s++) {
            uint64_t ctas = (uint64_t)s * nkv;
            uint64_t ns = (uint64_t)dec_split_rule((int)ctas, (int)sms, 4, 4, 1);
            uint64_t f = ns > 1 ? (uint64_t)s * nh * ns * (hd + 2) * 4 : 0;
            if (f > dec) dec = f;
        }
        p->ws_attn = dec + 4 * (uint64_t)sms * 64 * (hd + 2) * 4;
    }
    p->ws_lm_head = (uint64_t)mw.logit_chunk > PLAN_LM_HEAD_OWN_ROWS ? (uint64_t)mw.logit_chunk * H * 2 : 0;
    p->ws_slack = PLAN_SLACK;
    p->workspace = p->ws_act + p->ws_batch + p->ws_logits + p->ws_sample + p->ws_linear +
                   p->ws_attn + p->ws_lm_head + p->ws_slack;

    p->block_size = block_size;
    p->n_layers = (int)L;
    p->kv_block_bytes = 2 * L * (uint64_t)block_size * nkv * hd * 2;
    uint64_t need = p->weights + p->workspace;
    if (need > p->budget)
        return util_err(err, errlen, -ENOMEM,
                        "memory plan: weights %.2f GB + workspace %.2f GB exceed the %.2f GB "
                        "available on device %d (%.0f%% of %.2f GB, %.2f GB already in use)",
                        p->weights / 1e9, p->workspace / 1e9, p->budget / 1e9, device,
                        fraction * 100, total_b / 1e9, p->in_use / 1e9);
    /* 2 L buffers (K, V of each layer), each a whole number of 2 MiB pages */
    uint64_t per_buf = (p->budget - need) / (2 * L) / PLAN_GRAN * PLAN_GRAN;
    uint64_t blocks = per_buf / (p->kv_block_bytes / (2 * L));
    if (blocks > (1u << 24)) blocks = 1u << 24;
    if (blocks < 2)
        return util_err(err, errlen, -ENOMEM, "memory plan: no room for a KV cache on device %d",
                        device);
    p->n_blocks = (int)blocks;
    p->kv_bytes = blocks * p->kv_block_bytes;
    p->kv_alloc = cuda_mem_plan_kv_alloc(p, p->n_blocks);
    p->kv_tokens = blocks * (uint64_t)block_size;
    return 0;
}

extern "C" uint64_t cuda_mem_plan_kv_alloc(const struct cuda_mem_plan *p, int n_blocks) {
    if (p->n_layers < 1) return (uint64_t)n_blocks * p->kv_block_bytes;
    uint64_t per_buf = (uint64_t)n_blocks * (p->kv_block_bytes / (2 * (uint64_t)p->n_layers));
    return 2 * (uint64_t)p->n_layers * ((per_buf + PLAN_GRAN - 1) / PLAN_GRAN * PLAN_GRAN);
}

extern "C" void cuda_mem_plan_print(const struct cuda_mem_plan *p, FILE *f) {
    const double GB = 1e9;
    fprintf(f,
            "memory plan (device %d): %.2f GB total, %.2f GB in use before the model, "
            "fraction %.2f -> budget %.2f GB\n"
            "  weights   %8.3f GB (INT4 linears %.3f GB + fp16 embeddings/norms)\n"
            "  workspace %8.3f GB for %d rows per forward, %d sequences:\n",
            p->device, p->total / GB, p->in_use / GB, p->fraction, p->budget / GB,
            p->weights / GB, p->weights_int4 / GB, p->workspace / GB, p->max_tokens, p->max_seqs);
    fprintf(f,
            "    activations       %8.3f GB  h, x|att, qkv|mlp, proj (%.3f GB unshared)\n"
            "    batch tables      %8.3f GB  ids, positions, slots, block tables\n"
            "    logits            %8.3f GB  lm_head chunk of %d rows, fp32\n"
            "    sampling          %8.3f GB  sample_topk scratch + candidates of %d rows\n"
            "    linear split-K    %8.3f GB  W4A16 partial sums (estimate) and the K split's poll buffer\n"
            "    attention         %8.3f GB  decode + prefill split partials\n"
            "    lm_head gather    %8.3f GB  rows for cuBLAS\n"
            "    slack             %8.3f GB  allocation rounding, cuBLAS, lazily loaded kernels\n",
            p->ws_act / GB, p->ws_act_unshared / GB, p->ws_batch / GB, p->ws_logits / GB,
            p->logit_chunk, p->ws_sample / GB, p->logit_chunk, p->ws_linear / GB, p->ws_attn / GB,
            p->ws_lm_head / GB, p->ws_slack / GB);
    fprintf(f,
            "  weights + workspace %.3f GB = %.3f GiB\n"
            "  KV cache  %8.3f GB = %d blocks x %d tokens = %llu tokens (%.1f KB per token; "
            "%.3f GB allocated in %d buffers)\n",
            (p->weights + p->workspace) / GB, (p->weights + p->workspace) / 1073741824.0,
            p->kv_bytes / GB, p->n_blocks, p->block_size, (unsigned long long)p->kv_tokens,
            p->kv_block_bytes / 1024.0 / p->block_size, p->kv_alloc / GB, 2 * p->n_layers);
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
