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

#include "kernels/cuda/carveout.cuh"

extern "C" {
#include "kernels/cuda/w4a16.h"
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

/* q/k-norm + RoPE + the K/V write of a decode batch done by the decode
 * attention (attn_decode.cu, AWQD_CUDA_DEC_QK): qk_norm_rope_kv records its
 * inputs here (on), the attention launch takes them. fp16 as uint16_t. */
struct dec_qk {
    const uint16_t *q_norm, *k_norm; /* NULL: no norm */
    const float *inv_freq;           /* [hd / 2] */
    const int *positions, *slots;    /* [rows] */
    uint16_t *kc, *vc;               /* the caches the new key and value go to */
    float eps;
    int on;
};

#ifdef AWQD_STAMPS /* kernels/cuda/stamps.cuh: each unit's table, printed at teardown */
extern "C" void w4a16_stamps_dump(void);
extern "C" void w4a16_gemm_stamps_dump(void);
extern "C" void attn_decode_stamps_dump(void);
#endif

/* the decode split merge by the wide combine kernel from this many splits
 * (attn_decode.cu: more than the plain kernel loads before its barrier) */
#define DEC_WIDE_FROM 17

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
    /* upload_linear's repack buffer (pinned), freed by weights_done */
    struct w4a16_stage up_stage;
    /* lm_head: gathered rows, fp16 [cap, dim] */
    uint16_t *d_gather;
    size_t gather_elems;
    struct cuda_attn attn;
    /* pinned ring for small int/float uploads (no stream sync): reset
     * whenever the stream is known to be idle (download, sync) */
    unsigned char *h_ring;
    size_t ring_off;
    int dl_bounce;                /* small downloads through h_stage (AWQD_CUDA_DL_BOUNCE, 1) */
    /* upload_group: device staging [grp_elems] 4-byte elements; grp_on:
     * AWQD_CUDA_UPLOAD_GROUP (1; 0: one copy per part) */
    uint32_t *d_grp;
    size_t grp_elems;
    int grp_on;
    /* sample_topk with k = 1 as one kernel (AWQD_CUDA_SAMPLE_FUSE, 1): its
     * per-row arrival counters [smp_arrive_cap], zero between calls */
    int smp_fuse;
    int smp_gs;                   /* its columns per thread (AWQD_CUDA_SAMPLE_GS: 8, or 32) */
    int *smp_arrive;
    int smp_arrive_cap;
    /* AWQD_CUDA_PROFILE=1: per-op GPU time from events, printed at destroy */
    struct cuda_prof *prof;
    /* graphs: while capturing (graph_begin .. graph_end), failures go to
     * cap_rc / cap_msg (the capture fails, the backend stays usable) */
    int capturing;
    int cap_rc;
    char cap_msg[256];
    /* decode attention (attn_decode.cu): fp32 partials of the fixed-split
     * kernel [dec_part_floats]; a buffer a graph may use is never freed
     * before destroy: replaced ones wait in dec_retired */
    float *dec_part;
    size_t dec_part_floats;
    /* device memory a live graph may still use, freed at destroy */
    void *retired[32];
    int n_retired;
    int n_graphs;                 /* live graphs (graph_end .. graph_free) */
    int pdl;                      /* launch the small kernels with programmatic dependent launch */
    int dec_off;                  /* AWQD_CUDA_DECODE_ATTN=0: eager decode uses the general kernel */
    int dec_simt;                 /* AWQD_CUDA_DECODE_ATTN=simt: the decode kernel without tensor cores */
    int dec_lo, dec_hi;           /* split rule (attn_decode.cu), AWQD_CUDA_DEC_SPLIT=lo,hi */
    int dec_wave;                 /* 3 / 2 splits just over one wave (dec_split.h; AWQD_CUDA_DEC_WAVE, 1) */
    int dec_min_keys;             /* keys a decode split covers at least (AWQD_CUDA_DEC_MIN_KEYS) */
    int dec_ns;                   /* > 0: splits forced (AWQD_CUDA_DEC_NS=1..64, tuning) */
    int dec_wide;                 /* the wide combine kernel from this many splits (0: never;
                                   * AWQD_CUDA_DEC_WIDE=0 / n >= 2, default DEC_WIDE_FROM) */
    int dec_prewait;              /* decode attention loads its first K/V tile before the PDL wait
                                   * (AWQD_CUDA_DEC_PREWAIT, 1) */
    int early;                    /* OPS_EARLY_*: small kernels that trigger their dependents
                                   * before their own PDL wait (AWQD_CUDA_EARLY, a bit mask;
                                   * default both) */
    struct dec_qk qk_defer;       /* a decode batch's q/k-norm + RoPE + K/V write left to the
                                   * attention (ops_cuda__attn_decode_fuse_qk) */
    int early_qk_keys;            /* OPS_EARLY_QKNORM only where a row's context x the rows
                                   * <= this (AWQD_CUDA_EARLY_QK_KEYS, default 1024) */
    /* AWQD_CUDA_SKIP (measurement only: the results are wrong): ops whose
     * kernels are not launched, to measure what each costs inside a step */
    unsigned skip;                /* OPS_SKIP_* */
    int skip_lin[8][2], n_skip_lin; /* linears (k, n) not launched */
};
/* AWQD_CUDA_EARLY bits: a dependent's launch takes ~2.2 us after the last
 * block's trigger (H200, session 31 stamps), so a short kernel that triggers
 * only after its wait holds the next one back by that much */
#define OPS_EARLY_MERGE 1
#define OPS_EARLY_QKNORM 2
#define OPS_SKIP_QKNORM 1u
#define OPS_SKIP_ATTN 2u
#define OPS_SKIP_COMBINE 4u
#define OPS_SKIP_LM_HEAD 8u
#define OPS_SKIP_NORMDELTA 16u /* the fused norm linear reads no delta (its prologue's bytes) */

void ops_cuda__prof_begin(struct cuda_ctx *c, const char *what, int k, int n);
void ops_cuda__prof_end(struct cuda_ctx *c);
#define PROF_BEGIN(c, what, k, n) do { if ((c)->prof && !(c)->capturing) ops_cuda__prof_begin((c), (what), (k), (n)); } while (0)
#define PROF_END(c) do { if ((c)->prof && !(c)->capturing) ops_cuda__prof_end(c); } while (0)

/* Records the first asynchronous error (kernel launches). */
void ops_cuda__fail(struct cuda_ctx *c, int rc, const char *what, const char *detail);
#define OPS_CUDA_LAUNCHED(c, what)                                                     \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ != cudaSuccess) ops_cuda__fail((c), -EIO, (what), cudaGetErrorString(e_)); \
    } while (0)

/* Programmatic dependent launch (sm_90+). A kernel launched through
 * ops_cuda_launch with c->pdl may start before the previous kernel on the
 * stream has finished: it must call ops_cuda_pdl_wait() before reading or
 * writing anything another kernel touches (every CTA, unconditionally, before
 * it may exit). ops_cuda_pdl_trigger() lets the next PDL-launched kernel
 * start its prologue while this one drains (it still waits for our
 * completion before touching memory). Both are no-ops without PDL. */
__device__ __forceinline__ void ops_cuda_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ops_cuda_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/* kernel<<<grid, block, smem, c->stream>>>(args...), with the PDL attribute
 * when c->pdl (sm_90+, AWQD_CUDA_PDL != 0). */
template <typename... KArgs, typename... Args>
static inline cudaError_t ops_cuda_launch(struct cuda_ctx *c, void (*kernel)(KArgs...), dim3 grid,
                                          dim3 block, size_t smem, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cudaLaunchAttribute attr[2];
    int na = 0;
    na += cuda_carveout_attr(&attr[na], (const void *)kernel, grid, block, smem);
    if (c->pdl) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

/* rows the shared w4a16 workspace is sized for (AWQD_W4A16_WS_ROWS, default 64) */
extern "C" int ops_cuda_ws_rows(void);

/* attn.cu */
void ops_cuda__attention(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                         int nkv, int hd, float scale, const struct attn_batch *ab,
                         const struct buf *k_cache, const struct buf *v_cache);
void ops_cuda__attn_free(struct cuda_attn *a);

/* attn_decode.cu: decode-only batches (one row per sequence) with launch
 * geometry from n_seqs only (graph-safe); contexts read from ab->past on the
 * device, past < 0 = padding row (zeros). */
void ops_cuda__attn_decode(struct cuda_ctx *c, struct buf *out, const struct buf *qkv, int nh,
                           int nkv, int hd, float scale, const struct attn_batch *ab,
                           const struct buf *k_cache, const struct buf *v_cache);
/* 1 when the decode attention of this decode batch (ab->decode_fixed, n_seqs
 * rows) does the q/k-norm + RoPE + K/V write itself (AWQD_CUDA_DEC_QK: from
 * that many rows, default 1; the tensor-core kernel with its pre-wait tile): then
 * qk_norm_rope_kv records its inputs in c->qk_defer instead of launching */
int ops_cuda__attn_decode_fuse_qk(const struct cuda_ctx *c, const struct attn_batch *ab, int nh, int nkv,
                                  int hd);
/* 1 when the decode kernel handles G = nh / nkv query heads per KV head
 * (1, 2, 4, 8, 16) */
int ops_cuda__attn_decode_ok(int G);
/* splits per (sequence, KV head) for a decode batch of n_seqs */
int ops_cuda__attn_decode_splits(const struct cuda_ctx *c, int n_seqs, int nkv);
void ops_cuda__attn_decode_free(struct cuda_ctx *c);

/* Frees device memory that is being replaced, or keeps it until destroy when
 * a graph exists or is being recorded (it may use it). 0 / -ENOMEM (list full). */
int ops_cuda__retire(struct cuda_ctx *c, void *d);

#endif
