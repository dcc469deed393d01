/* ops_cuda_internal.h — what the files of the CUDA backend (ops_cuda.cu,
 * attn.cu) share. Not for the model: it sees only kernels/ops.h.
 *
 * A CUDA buffer is device memory: BUF_ACT and BUF_W16 hold fp16 (__half bit
 * patterns), BUF_F32 float, BUF_I32 int32_t. Compute ops are void: a failed
 * launch is remembered in the context (first error wins) and returned by the
 * next sync/download. */
#ifndef AWQD_OPS_CUDA_INTERNAL_H
#define AWQD_OPS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

extern "C" {
#include "kernels/ops.h"
}

struct buf {
    enum buf_kind kind;
    size_t n;                     /* elements */
    void *d;                      /* device memory: fp16 [n] (ACT, W16), float [n], int32 [n] */
};

/* Attention work list cache and split-K scratch (attn.cu). */
struct cuda_attn {
    int *h_items;                 /* pinned host [cap_items * 8] work items */
    int *d_items;                 /* device copy */
    int cap_items;
    int *h_comb, *d_comb;         /* pinned / device [cap_comb * 8] combine groups */
    int cap_comb;
    cudaEvent_t uploaded;         /* the last upload of h_items/h_comb finished */
    float *d_part;                /* fp32 partials [n_part_slots * nkv * QP * (hd + 2)] */
    size_t part_bytes;
    /* the batch the cached list was built for */
    int key_valid, key_nh, key_nkv, key_hd, key_n_seqs, key_n_rows;
    int32_t *key_q_start, *key_past;   /* host [cap_key + 1], [cap_key] */
    int cap_key;
    /* the list */
    int n_items, n_comb, qp;
};

struct cuda_ctx {
    int device;
    int n_sms;
    cudaStream_t stream;
    void *blas;                   /* cublasHandle_t */
    int rc;                       /* first asynchronous error (negative errno), 0 */
    char msg[256];
    /* linear: split-K workspace shared by all layers (one stream) */
    void *lin_ws;
    size_t lin_ws_bytes;
    /* host staging for fp16 <-> fp32 conversions (pinned) */
    uint16_t *h_stage;
    size_t h_stage_elems;
    /* lm_head: gathered rows, fp16 [cap, dim] */
    uint16_t *d_gather;
    size_t gather_elems;
    struct cuda_attn attn;
    /* pinned ring for small int/float uploads (no stream sync): reset
     * whenever the stream is known to be idle (download, sync) */
    unsigned char *h_ring;
    size_t ring_off;
    /* AWQD_CUDA_PROFILE=1: per-op GPU time from events, printed at destroy */
    struct cuda_prof *prof;
};

void ops_cuda__prof_begin(struct cuda_ctx *c, const char *what, int k, int n);
void ops_cuda__prof_end(struct cuda_ctx *c);
#define PROF_BEGIN(c, what, k, n) do { if ((c)->prof) ops_cuda__prof_begin((c), (what), (k), (n)); } while (0)
#define PROF_END(c) do { if ((c)->prof) ops_cuda__prof_end(c); } while (0)

/* Records the first asynchronous error (kernel launches). */
void ops_cuda__fail(struct cuda_ctx *c, int rc, const char *what, const char *detail);
#define OPS_CUDA_LAUNCHED(c, what)                                                     \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ != cudaSuccess) ops_cuda__fail((c), -EIO, (what), cudaGetErrorString(e_)); \
    } while (0)

/* rows the shared w4a16 workspace is sized for (AWQD_W4A16_WS_ROWS, default 64) */
extern "C" int ops_cuda_ws_rows(void);

/* attn.cu */
void ops_cuda__attention(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                         int nkv, int hd, float scale, const struct attn_batch *ab,
                         const struct buf *k_cache, const struct buf *v_cache);
void ops_cuda__attn_free(struct cuda_attn *a);

#endif
