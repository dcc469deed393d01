/* ops_cuda.cu — the CUDA backend of kernels/ops.h on one device and one
 * stream: fp16 activations and KV cache, fp32 accumulation everywhere, AWQ
 * weights kept INT4 (kernels/cuda/w4a16.h), lm_head through cuBLAS (fp16 in,
 * fp32 out). Attention lives in attn.cu.
 *
 * Buffers (struct buf, ops_cuda_internal.h): ACT and W16 are fp16 on the
 * device; upload/download convert from/to host float through a pinned
 * staging buffer. Every op is enqueued on ctx->stream; download and sync wait.
 * A failed launch is remembered and reported by the next download/sync. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/attn_common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stamps.cuh" /* empty unless -DAWQD_STAMPS */
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/ops_cuda_graph.h"
#include "kernels/cuda/ops_cuda_internal.h"
#include "kernels/cuda/sample.h"
#include "kernels/cuda/w4a16.h"

extern "C" {
#include "engine/ckpt.h"
#include "engine/util.h"
}

/* One W4A16 linear on the device (INT4, repacked by w4a16_upload). */
struct op_linear {
    struct w4a16_weight *w;
    enum linear_kind kind;
    int k, n;                     /* as in the checkpoint (GATE_UP: n = 2 * inter) */
    int has_bias;
};

/* split-K workspace: enough for every call with up to this many rows to use
 * the kernels' preferred choice. The default (64) keeps every linear on the
 * INT4 kernels; AWQD_W4A16_WS_ROWS=4096 also lets prefill-sized calls use
 * w4a16's transient-dequantize + cuBLAS path (one layer's fp16 copy lives in
 * the workspace during the call; nothing persists). */
#define LIN_WS_ROWS 64
extern "C" int ops_cuda_ws_rows(void) {
    const char *e = getenv("AWQD_W4A16_WS_ROWS");
    int r = e ? atoi(e) : 0;
    return r > 0 ? r : LIN_WS_ROWS;
}

void ops_cuda__fail(struct cuda_ctx *c, int rc, const char *what, const char *detail) {
    if (c->capturing) { /* the capture fails (graph_end reports it); the backend stays usable */
        if (!c->cap_rc) {
            c->cap_rc = rc;
            snprintf(c->cap_msg, sizeof c->cap_msg, "%.40s: %.200s", what, detail);
        }
        return;
    }
    log_error("cuda backend: %s: %s", what, detail);
    if (c->rc) return;
    c->rc = rc;
    snprintf(c->msg, sizeof c->msg, "%.40s: %.200s", what, detail);
}

/* ---- profiling (AWQD_CUDA_PROFILE=1) -------------------------------------- */
#define PROF_KINDS 48
#define PROF_PENDING 4096
struct cuda_prof {
    struct {
        char name[48];
        long calls;     /* after the first */
        double ms;      /* after the first */
        double first_ms; /* the first call: lazy module loading, cuBLAS setup */
        double host_ms;  /* host time inside the op (launch code), after the first */
        int seen;
    } kind[PROF_KINDS];
    int n_kinds;
    cudaEvent_t ev[PROF_PENDING][2];
    int pend_kind[PROF_PENDING];
    double pend_host[PROF_PENDING];
    int n_pend, open_kind;
    double t_open;      /* host clock at the open op's begin */
    double gap_ms;      /* GPU time between one op's end and the next op's begin */
    long n_gaps;
    /* across syncs: the last op's end event of the previous collect (its
     * handle swapped out of ev[]) against the next collect's first begin:
     * the GPU's time between steps (host turnaround and uploads) */
    cudaEvent_t carry;
    int have_carry;
    double xgap_ms;
    long n_xgaps;
};


static void prof_collect(struct cuda_ctx *c) {
    struct cuda_prof *p = c->prof;
    if (!p) return;
    for (int i = 0; i < p->n_pend; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i][0], p->ev[i][1]) == cudaSuccess) {
            if (!p->kind[p->pend_kind[i]].seen) { /* reported apart: not steady state */
                p->kind[p->pend_kind[i]].seen = 1;
                p->kind[p->pend_kind[i]].first_ms = ms;
                continue;
            }
            p->kind[p->pend_kind[i]].ms += ms;
            p->kind[p->pend_kind[i]].host_ms += p->pend_host[i];
            p->kind[p->pend_kind[i]].calls++;
        }
        /* the GPU's time between ops: idle (the host behind), or uploads,
         * downloads and other unprofiled work */
        if (i > 0 && cudaEventElapsedTime(&ms, p->ev[i - 1][1], p->ev[i][0]) == cudaSuccess) {
            p->gap_ms += ms;
            p->n_gaps++;
        }
        if (i == 0 && p->have_carry &&
            cudaEventElapsedTime(&ms, p->carry, p->ev[0][0]) == cudaSuccess) {
            p->xgap_ms += ms;
            p->n_xgaps++;
        }
    }
    if (p->n_pend > 0) { /* keep the last end event for the next collect */
        cudaEvent_t t = p->carry;
        p->carry = p->ev[p->n_pend - 1][1];
        p->ev[p->n_pend - 1][1] = t;
        p->have_carry = 1;
    }
    cudaGetLastError();
    p->n_pend = 0;
}

void ops_cuda__prof_begin(struct cuda_ctx *c, const char *what, int k, int n) {
    struct cuda_prof *p = c->prof;
    if (p->n_pend == PROF_PENDING) {
        cudaStreamSynchronize(c->stream);
        prof_collect(c);
    }
    char name[48];
    snprintf(name, sizeof name, k || n ? "%s %dx%d" : "%s", what, k, n);
    int i = 0;
    while (i < p->n_kinds && strcmp(p->kind[i].name, name)) i++;
    if (i == p->n_kinds) {
        if (i == PROF_KINDS) i = PROF_KINDS - 1;
        else snprintf(p->kind[p->n_kinds++].name, sizeof p->kind[0].name, "%s", name);
    }
    p->open_kind = i;
    cudaEventRecord(p->ev[p->n_pend][0], c->stream);
    p->t_open = util_now_s() * 1e3;
}

void ops_cuda__prof_end(struct cuda_ctx *c) {
    struct cuda_prof *p = c->prof;
    p->pend_host[p->n_pend] = util_now_s() * 1e3 - p->t_open;
    cudaEventRecord(p->ev[p->n_pend][1], c->stream);
    p->pend_kind[p->n_pend++] = p->open_kind;
}

static void prof_print(struct cuda_ctx *c) {
    struct cuda_prof *p = c->prof;
    double tot = 0;
    for (int i = 0; i < p->n_kinds; i++) tot += p->kind[i].ms;
    fprintf(stderr, "cuda profile (GPU time between events, per op; each op's first call apart; "
                    "host: time in the op's launch code):\n");
    for (int i = 0; i < p->n_kinds; i++)
        fprintf(stderr, "  %-32s %8ld calls %10.2f ms %9.1f us/call %5.1f%%   first call %9.1f us"
                        "   host %7.1f us/call\n",
                p->kind[i].name, p->kind[i].calls, p->kind[i].ms,
                p->kind[i].calls ? p->kind[i].ms * 1e3 / p->kind[i].calls : 0,
                tot > 0 ? 100 * p->kind[i].ms / tot : 0, p->kind[i].first_ms * 1e3,
                p->kind[i].calls ? p->kind[i].host_ms * 1e3 / p->kind[i].calls : 0);
    fprintf(stderr, "  GPU time between ops (idle or unprofiled work): %.2f ms over %ld gaps "
                    "(%.1f us each)\n", p->gap_ms, p->n_gaps,
            p->n_gaps ? p->gap_ms * 1e3 / p->n_gaps : 0);
    fprintf(stderr, "  GPU time between syncs (the last op before a sync to the first op after "
                    "it: host turnaround and uploads): %.2f ms over %ld (%.1f us each)\n",
            p->xgap_ms, p->n_xgaps, p->n_xgaps ? p->xgap_ms * 1e3 / p->n_xgaps : 0);
}

static void prof_free(struct cuda_ctx *c) {
    struct cuda_prof *p = c->prof;
    if (!p) return;
    cudaStreamSynchronize(c->stream);
    prof_collect(c);
    prof_print(c);
    for (int i = 0; i < PROF_PENDING; i++) {
        cudaEventDestroy(p->ev[i][0]);
        cudaEventDestroy(p->ev[i][1]);
    }
    cudaEventDestroy(p->carry);
    free(p);
    c->prof = NULL;
}

#define RING_BYTES ((size_t)8 << 20)
#define DOWNLOAD_BOUNCE_BYTES ((size_t)64 << 10)

static size_t elem_bytes(enum buf_kind k) { return k == BUF_ACT || k == BUF_W16 ? 2 : 4; }

/* Makes the pinned host staging buffer hold n fp16 elements. */
static int stage_reserve(struct cuda_ctx *c, size_t n) {
    if (n <= c->h_stage_elems) return 0;
    size_t cap = c->h_stage_elems ? c->h_stage_elems : 4096;
    while (cap < n) cap *= 2;
    if (c->h_stage) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
        cudaFreeHost(c->h_stage);
        c->h_stage = NULL;
        c->h_stage_elems = 0;
    }
    CUDA_CHECK(cudaMallocHost((void **)&c->h_stage, cap * sizeof(uint16_t)), NULL, 0);
    c->h_stage_elems = cap;
    return 0;
}

/* ======================================================================== */
/* buffers                                                                   */
/* ======================================================================== */

/* Ops that cannot be recorded into a graph: refused while capturing (the
 * capture then fails). */
static int refuse_capturing(struct cuda_ctx *c, const char *what) {
    if (!c->capturing) return 0;
    ops_cuda__fail(c, -EBUSY, what, "not allowed while recording a graph");
    return -EBUSY;
}

static struct buf *cu_alloc(void *ctx, enum buf_kind kind, size_t n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "alloc")) return NULL;
    cudaSetDevice(c->device);
    struct buf *b = (struct buf *)calloc(1, sizeof *b);
    if (!b) return NULL;
    b->kind = kind;
    b->n = n;
    size_t bytes = (n ? n : 1) * elem_bytes(kind);
    if (cudaMalloc(&b->d, bytes) != cudaSuccess) {
        cudaGetLastError(); /* clear the (non-sticky) OOM */
        free(b);
        return NULL;
    }
    if (cudaMemsetAsync(b->d, 0, bytes, c->stream) != cudaSuccess) {
        cudaFree(b->d);
        free(b);
        return NULL;
    }
    return b;
}

static void cu_free(void *ctx, struct buf *b) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!b || refuse_capturing(c, "free")) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream); /* nothing queued may still use it */
    cudaFree(b->d);
    free(b);
}

static int cu_upload(void *ctx, struct buf *dst, size_t off, const void *src, size_t n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "upload")) return -EBUSY;
    if (off > dst->n || n > dst->n - off) return -ERANGE;
    if (n == 0) return 0;
    CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
    char *d = (char *)dst->d + off * elem_bytes(dst->kind);
    if (dst->kind == BUF_ACT || dst->kind == BUF_W16) {
        /* chunked through the pinned staging buffer (fp32 -> fp16 for ACT) */
        const size_t chunk = (size_t)1 << 22;
        int rc = stage_reserve(c, n < chunk ? n : chunk);
        if (rc) return rc;
        for (size_t i = 0; i < n; i += chunk) {
            size_t m = n - i < chunk ? n - i : chunk;
            CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0); /* staging free again */
            if (dst->kind == BUF_W16) {
                memcpy(c->h_stage, (const uint16_t *)src + i, m * sizeof(uint16_t));
            } else {
                const float *f = (const float *)src + i;
                for (size_t j = 0; j < m; j++) c->h_stage[j] = f32_to_fp16(f[j]);
            }
            CUDA_CHECK(cudaMemcpyAsync(d + i * 2, c->h_stage, m * 2, cudaMemcpyHostToDevice,
                                       c->stream),
                       NULL, 0);
        }
        CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
        return 0;
    }
    /* F32 / I32: through the pinned ring (no stream sync), or a pageable copy
     * when large; either way the source may be reused once this returns */
    size_t bytes = n * 4;
    if (c->h_ring && bytes <= RING_BYTES / 4) {
        if (c->ring_off + bytes > RING_BYTES) {
            CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
            c->ring_off = 0;
        }
        memcpy(c->h_ring + c->ring_off, src, bytes);
        CUDA_CHECK(cudaMemcpyAsync(d, c->h_ring + c->ring_off, bytes, cudaMemcpyHostToDevice,
                                   c->stream),
                   NULL, 0);
        c->ring_off += (bytes + 255) & ~(size_t)255;
        return 0;
    }
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, c->stream), NULL, 0);
    return 0;
}

/* upload_group: the parts packed back to back in the pinned ring, one copy
 * into the device staging buffer c->d_grp, one kernel scattering them to
 * their buffers (end[i]: the packed end of part i, in elements). */
struct grp_args {
    uint32_t *dst[OPS_UPLOAD_PARTS];
    unsigned end[OPS_UPLOAD_PARTS];
    unsigned w[OPS_UPLOAD_PARTS], ld[OPS_UPLOAD_PARTS]; /* rows of w written ld apart (w = 0: contiguous) */
    int parts;
};

static __global__ void k_upload_scatter(const uint32_t *__restrict__ src, grp_args a) {
    const unsigned total = a.end[a.parts - 1];
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        int p = 0;
        while (i >= a.end[p]) p++;
        const unsigned j = i - (p ? a.end[p - 1] : 0u);
        a.dst[p][a.w[p] ? j / a.w[p] * a.ld[p] + j % a.w[p] : j] = src[i];
    }
}

static int cu_upload_group(void *ctx, struct buf *const *dst, const void *const *src,
                           const size_t *n, const size_t *width, const size_t *stride, int parts) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "upload_group")) return -EBUSY;
    if (parts < 0 || parts > OPS_UPLOAD_PARTS) return -EINVAL;
    size_t total = 0;
    for (int i = 0; i < parts; i++) {
        if (n[i] == 0) continue;
        const size_t w = width ? width[i] : 0;
        if (elem_bytes(dst[i]->kind) != 4) return -ERANGE;
        if (w ? n[i] % w || stride[i] < w || (n[i] / w - 1) * stride[i] + w > dst[i]->n : n[i] > dst[i]->n)
            return -ERANGE;
        total += n[i];
    }
    if (total == 0) return 0;
    if (!c->grp_on || !c->h_ring || total * 4 > RING_BYTES / 4) {
        for (int i = 0; i < parts; i++) { /* one copy each (a 2D copy where strided) */
            if (n[i] == 0) continue;
            const size_t w = width ? width[i] : 0;
            if (!w) {
                int rc = cu_upload(ctx, dst[i], 0, src[i], n[i]);
                if (rc) return rc;
                continue;
            }
            CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
            CUDA_CHECK(cudaMemcpy2DAsync(dst[i]->d, stride[i] * 4, src[i], w * 4, w * 4, n[i] / w,
                                         cudaMemcpyHostToDevice, c->stream),
                       NULL, 0);
        }
        return 0;
    }
    CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
    if (!c->d_grp) { /* once, at the largest group this path takes */
        CUDA_CHECK(cudaMalloc((void **)&c->d_grp, RING_BYTES / 4), NULL, 0);
        c->grp_elems = RING_BYTES / 16;
    }
    AWQD_ASSERT(total <= c->grp_elems);
    size_t bytes = total * 4;
    if (c->ring_off + bytes > RING_BYTES) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
        c->ring_off = 0;
    }
    unsigned char *h = c->h_ring + c->ring_off;
    grp_args a;
    a.parts = 0;
    size_t at = 0;
    for (int i = 0; i < parts; i++) {
        if (n[i] == 0) continue;
        memcpy(h + at * 4, src[i], n[i] * 4);
        at += n[i];
        a.dst[a.parts] = (uint32_t *)dst[i]->d;
        a.w[a.parts] = width ? (unsigned)width[i] : 0u;
        a.ld[a.parts] = width ? (unsigned)stride[i] : 0u;
        a.end[a.parts++] = (unsigned)at;
    }
    CUDA_CHECK(cudaMemcpyAsync(c->d_grp, h, bytes, cudaMemcpyHostToDevice, c->stream), NULL, 0);
    c->ring_off += (bytes + 255) & ~(size_t)255;
    int blocks = (int)((total + 255) / 256);
    if (blocks > 4 * c->n_sms) blocks = 4 * c->n_sms;
    k_upload_scatter<<<blocks, 256, 0, c->stream>>>(c->d_grp, a);
    OPS_CUDA_LAUNCHED(c, "upload_group");
    return c->rc;
}

static int cu_download(void *ctx, void *dst, const struct buf *src, size_t off, size_t n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "download")) return -EBUSY;
    if (off > src->n || n > src->n - off) return -ERANGE;
    CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
    if (c->rc) return c->rc;
    if (n == 0) return 0;
    const char *s = (const char *)src->d + off * elem_bytes(src->kind);
    if (src->kind == BUF_ACT || src->kind == BUF_W16) {
        const size_t chunk = (size_t)1 << 22;
        int rc = stage_reserve(c, n < chunk ? n : chunk);
        if (rc) return rc;
        for (size_t i = 0; i < n; i += chunk) {
            size_t m = n - i < chunk ? n - i : chunk;
            CUDA_CHECK(cudaMemcpyAsync(c->h_stage, s + i * 2, m * 2, cudaMemcpyDeviceToHost,
                                       c->stream),
                       NULL, 0);
            CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
            float *f = (float *)dst + i;
            for (size_t j = 0; j < m; j++) f[j] = fp16_to_f32(c->h_stage[j]);
        }
        return c->rc;
    }
    /* small downloads (sampling candidates) bounce through pinned memory: a
     * copy into pageable memory costs ~10 us more on the GPU */
    const size_t bytes = n * 4;
    const int bounce = c->dl_bounce && bytes <= DOWNLOAD_BOUNCE_BYTES;
    if (bounce) {
        int rc = stage_reserve(c, (bytes + 1) / 2);
        if (rc) return rc;
    }
    PROF_BEGIN(c, "download f32/i32", 0, 0);
    CUDA_CHECK(cudaMemcpyAsync(bounce ? (void *)c->h_stage : dst, s, bytes, cudaMemcpyDeviceToHost,
                               c->stream),
               NULL, 0);
    PROF_END(c);
    CUDA_CHECK(cudaStreamSynchronize(c->stream), NULL, 0);
    if (bounce) memcpy(dst, c->h_stage, bytes);
    c->ring_off = 0;
    prof_collect(c);
    return c->rc;
}

static void cu_copy(void *ctx, struct buf *dst, size_t dst_off, const struct buf *src,
                    size_t src_off, size_t n) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(dst->kind == src->kind);
    AWQD_ASSERT(dst_off <= dst->n && n <= dst->n - dst_off);
    AWQD_ASSERT(src_off <= src->n && n <= src->n - src_off);
    if (n == 0) return;
    size_t es = elem_bytes(dst->kind);
    cudaError_t e = cudaMemcpyAsync((char *)dst->d + dst_off * es,
                                    (const char *)src->d + src_off * es, n * es,
                                    cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess) ops_cuda__fail(c, -EIO, "copy", cudaGetErrorString(e));
}

/* ======================================================================== */
/* weights                                                                   */
/* ======================================================================== */

static struct op_linear *cu_upload_linear(void *ctx, const struct awq_linear *l,
                                          enum linear_kind kind) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(kind == LINEAR_PLAIN || kind == LINEAR_GATE_UP);
    if (refuse_capturing(c, "upload_linear")) return NULL;
    cudaSetDevice(c->device);
    struct op_linear *o = (struct op_linear *)calloc(1, sizeof *o);
    if (!o) return NULL;
    char err[256];
    o->kind = kind;
    if (w4a16_upload_staged(l, kind == LINEAR_GATE_UP ? W4A16_LAYOUT_GATE_UP : W4A16_LAYOUT_PLAIN,
                            &c->up_stage, &o->w, err, sizeof err)) {
        log_error("cuda backend: upload of a %dx%d linear: %s", l->k, l->n, err);
        free(o);
        return NULL;
    }
    o->k = l->k;
    o->n = l->n;
    o->has_bias = l->bias != NULL;
    size_t ws = w4a16_workspace_bytes(o->w, ops_cuda_ws_rows());
    const size_t wsk = w4a16_stream_k_bytes(o->w); /* prefill rows: the wgmma GEMM's stream-K */
    if (wsk > ws) ws = wsk;
    if (ws > c->lin_ws_bytes) {
        cudaStreamSynchronize(c->stream);
        if (ops_cuda__retire(c, c->lin_ws)) {
            w4a16_free(o->w);
            free(o);
            return NULL;
        }
        c->lin_ws = NULL;
        c->lin_ws_bytes = 0;
        if (cudaMalloc(&c->lin_ws, ws) != cudaSuccess) {
            cudaGetLastError();
            w4a16_free(o->w);
            free(o);
            return NULL;
        }
        c->lin_ws_bytes = ws;
    }
    return o;
}

static void cu_free_linear(void *ctx, struct op_linear *l) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!l || refuse_capturing(c, "free_linear")) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    w4a16_free(l->w);
    free(l);
}

/* ======================================================================== */
/* kernels                                                                   */
/* ======================================================================== */

static __device__ __forceinline__ float block_sum(float v, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* out[i, :] = table[ids[i] - row_start, :] or zeros. One block per row. */
static __global__ void embed_kernel(__half *out, const __half *table, const int *ids, int dim,
                                    int row_start, int rows) {
    ops_cuda_pdl_wait();
    ops_cuda_pdl_trigger();
    int i = blockIdx.x;
    int id = ids[i] - row_start;
    __half *o = out + (size_t)i * dim;
    bool in = id >= 0 && id < rows;
    const __half *t = table + (size_t)(in ? id : 0) * dim;
    if ((dim & 7) == 0) {
        for (int j = threadIdx.x; j < dim / 8; j += blockDim.x) {
            uint4 v = in ? ((const uint4 *)t)[j] : make_uint4(0, 0, 0, 0);
            ((uint4 *)o)[j] = v;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = in ? t[j] : __float2half(0.0f);
    }
}

/* resid += delta (rounded to fp16), out = resid * rsqrt(mean(resid^2) + eps) * w.
 * One block per row; each thread keeps its own elements between the passes. */
static __global__ void add_rmsnorm_kernel(__half *resid, const __half *delta, __half *out,
                                          const __half *w, int dim, float eps) {
    ops_cuda_pdl_wait();
    ops_cuda_pdl_trigger();
    __shared__ float red[32];
    size_t base = (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = __half2float(resid[base + j]);
        if (delta) {
            __half h = __float2half(v + __half2float(delta[base + j]));
            resid[base + j] = h;
            v = __half2float(h);
        }
        ss += v * v;
    }
    float tot = block_sum(ss, red);
    float r = rsqrtf(tot / (float)dim + eps);
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = __half2float(resid[base + j]);
        out[base + j] = __float2half(__half2float(w[j]) * (v * r));
    }
}

/* The same for dim % 8 == 0: 256 threads, each keeps VPT 16-byte chunks of
 * the row in registers between the passes (dim <= 2048 * VPT). The norm
 * weight (constant) is loaded before the PDL wait. */
template <int VPT>
static __global__ void __launch_bounds__(256)
add_rmsnorm_vec_kernel(__half *resid, const __half *delta, __half *out, const __half *w, int dim,
                       float eps) {
    const int nc = dim / 8;
    const uint4 *w4 = (const uint4 *)w;
    uint4 wv[VPT];
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int c = threadIdx.x + i * 256;
        wv[i] = c < nc ? w4[c] : make_uint4(0, 0, 0, 0);
    }
    ops_cuda_pdl_wait();
    ops_cuda_pdl_trigger();
    __shared__ float red[32];
    uint4 *r4 = (uint4 *)(resid + (size_t)blockIdx.x * dim);
    const uint4 *d4 = delta ? (const uint4 *)(delta + (size_t)blockIdx.x * dim) : NULL;
    float v[VPT][8];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        int c = threadIdx.x + i * 256;
        if (c >= nc) break;
        uint4 a = r4[c];
        __half2 *a2 = (__half2 *)&a;
        if (d4) {
            uint4 b = d4[c];
            const __half2 *b2 = (const __half2 *)&b;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                float2 fa = __half22float2(a2[u]), fb = __half22float2(b2[u]);
                a2[u] = __floats2half2_rn(fa.x + fb.x, fa.y + fb.y);
            }
            r4[c] = a;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float2 f = __half22float2(a2[u]);
            v[i][2 * u] = f.x;
            v[i][2 * u + 1] = f.y;
            ss += f.x * f.x + f.y * f.y;
        }
    }
    float tot = block_sum(ss, red);
    float rr = rsqrtf(tot / (float)dim + eps);
    uint4 *o4 = (uint4 *)(out + (size_t)blockIdx.x * dim);
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        int c = threadIdx.x + i * 256;
        if (c >= nc) break;
        uint4 ov;
        const __half2 *w2 = (const __half2 *)&wv[i];
        __half2 *o2 = (__half2 *)&ov;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float2 wf = __half22float2(w2[u]);
            o2[u] = __floats2half2_rn(wf.x * (v[i][2 * u] * rr), wf.y * (v[i][2 * u + 1] * rr));
        }
        o4[c] = ov;
    }
}

/* Per-head RMSNorm (optional) + RoPE (rotate-half) of q and k, in place, and
 * the write of k, v into the paged cache. One warp per head (qk_norm_rope,
 * attn_common.cuh). Block: 4 warps; grid (n, ceil((nh + nkv) / 4)).
 * Before the PDL wait: the norm weights, the row's position (its sines and
 * cosines) and KV slot — all in memory before the step's first kernel — so
 * that after it only q|k|v is read. Decode batches (from AWQD_CUDA_DEC_QK
 * rows, default 1) do all this inside the decode attention instead
 * (attn_decode.cu); this kernel serves prefill and mixed batches. */
static __global__ void qk_rope_kv_kernel(__half *qkv, int nh, int nkv, int hd,
                                         const __half *q_norm, const __half *k_norm, float eps,
                                         const float *inv_freq, const int *positions,
                                         const int *slots, __half *kc, __half *vc, int early_keys) {
    ST_DECL;
    ST_BEGIN(ST_KEY(1, nh + nkv, gridDim.x));
    const int r = blockIdx.x;
    /* OPS_EARLY_QKNORM: the attention launches now where the step's keys
     * (this row's context times the rows) are few: its CTAs then load their
     * first K/V tiles during the q|k|v linear, and many of them slow it
     * (positions: in memory before the step's first kernel) */
    const int pos_r = positions[r];
    const bool early = (long long)(pos_r + 1) * gridDim.x <= early_keys;
    if (early) ops_cuda_pdl_trigger();
    const int head = blockIdx.y * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    const int E = hd >> 5;
    const bool live = head < nh + nkv;
    const __half *nw = head < nh ? q_norm : k_norm;
    float sn[8], cs[8], g[8];
    int slot = -1;
    if (live) {
        qk_rope_sincos<8>((float)pos_r, inv_freq, lane, E, hd, sn, cs);
#pragma unroll
        for (int i = 0; i < 8; i++) g[i] = i < E && nw ? __half2float(nw[lane * E + i]) : 1.0f;
        if (head >= nh) slot = slots[r];
    }
    ops_cuda_pdl_wait();
    if (!early) ops_cuda_pdl_trigger();
    ST_MARK(1);
    if (!live) return;
    size_t width = (size_t)(nh + 2 * nkv) * hd;
    __half *x = qkv + (size_t)r * width + (size_t)head * hd; /* q heads then k heads */
    /* a K head's V head (copied to the cache below) is loaded with x:
     * after the stores to x the compiler may not move the loads before them
     * (the same buffer), and each element's load and store then made a
     * dependent round trip of its own */
    const __half *vs = x + (size_t)nkv * hd; /* K head head - nh: its V head */
    float v[8];
    __half vh[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = i < E ? __half2float(x[lane * E + i]) : 0.0f;
        vh[i] = i < E && slot >= 0 ? vs[lane * E + i] : __half();
    }
    qk_norm_rope<8>(v, g, nw != NULL, eps, hd, E, sn, cs, lane);
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < E) x[lane * E + i] = __float2half(v[i]);
    if (slot >= 0) { /* a K head of a real row (slot < 0: a padding row, no K/V) */
        int gk = head - nh;
        size_t dst = ((size_t)slot * nkv + gk) * hd;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (i < E) {
                kc[dst + lane * E + i] = __float2half(v[i]);
                vc[dst + lane * E + i] = vh[i];
            }
    }
    ST_MARK(2);
}

#ifdef AWQD_STAMPS
static void ops_stamps_dump(void) {
    static const char *const kinds[16] = {"?", "qk-norm + rope (heads x rows)", "?", "?", "?", "?", "?", "?",
                                          "?", "?", "?", "?", "?", "?", "?", "?"};
    st_dump("small kernels", kinds, "0 entry, 1 after the PDL wait, 2 written");
}
#endif

/* dst[r, :] = x[rows[r], :] */
static __global__ void gather_rows_kernel(__half *dst, const __half *x, const int *rows, int dim) {
    const __half *s = x + (size_t)rows[blockIdx.x] * dim;
    __half *d = dst + (size_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) d[j] = s[j];
}

/* lm_head for a few rows (m <= M): a streaming GEMV. The m selected rows of
 * x are staged in shared memory (fp16 [M][dim], zero rows past m); each warp
 * takes vocabulary rows in turn, reads its table row once with 16-byte loads
 * and accumulates M dot products in fp32. Persistent grid (2 blocks per SM).
 * logits: fp32 [m, vocab_rows]. Needs dim % 8 == 0. */
template <int M>
static __global__ void __launch_bounds__(256)
lm_head_gemv_kernel(float *logits, const __half *x, const int *rows, int m, const __half *table,
                    int dim, int vocab_rows) {
    extern __shared__ __align__(16) unsigned char lm_smem[];
    __half *xs = (__half *)lm_smem;
    const int nc = dim / 8;
    for (int e = threadIdx.x; e < M * nc; e += blockDim.x) {
        int r = e / nc, c = e % nc;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < m) v = ((const uint4 *)(x + (size_t)(rows ? rows[r] : r) * dim))[c];
        ((uint4 *)xs)[e] = v;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int v = blockIdx.x * nw + warp; v < vocab_rows; v += gridDim.x * nw) {
        const uint4 *t = (const uint4 *)(table + (size_t)v * dim);
        float acc[M];
#pragma unroll
        for (int r = 0; r < M; r++) acc[r] = 0.0f;
#pragma unroll 4
        for (int c = lane; c < nc; c += 32) {
            uint4 w = __ldcs(t + c); /* streamed once: do not keep in L2 */
            const __half2 *w2 = (const __half2 *)&w;
            float2 wf[4];
#pragma unroll
            for (int u = 0; u < 4; u++) wf[u] = __half22float2(w2[u]);
#pragma unroll
            for (int r = 0; r < M; r++) {
                uint4 xv = ((const uint4 *)xs)[r * nc + c];
                const __half2 *x2 = (const __half2 *)&xv;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float2 xf = __half22float2(x2[u]);
                    acc[r] += wf[u].x * xf.x + wf[u].y * xf.y;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < M; r++) {
            float a = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
            if (lane == 0 && r < m) logits[(size_t)r * vocab_rows + v] = a;
        }
    }
}

template <int M>
static void lm_head_gemv(struct cuda_ctx *c, float *logits, const __half *x, const int *rows, int m,
                         const __half *table, int dim, int vocab_rows) {
    size_t smem = (size_t)M * dim * 2;
    if (smem > 48 * 1024)
        cudaFuncSetAttribute(lm_head_gemv_kernel<M>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
    lm_head_gemv_kernel<M><<<2 * c->n_sms, 256, smem, c->stream>>>(logits, x, rows, m, table, dim,
                                                                   vocab_rows);
}

/* lm_head on tensor cores for up to 8 * NT rows (AWQD_CUDA_LM_HEAD=tc; not
 * the default: cuBLAS measured 3-6% faster on an H200). A skinny GEMM logits[m, V] = x[m, dim] . table[V, dim]^T
 * that streams the table once at the copy rate: each warp owns 16 vocabulary
 * rows (the M of mma.m16n8k16, A fragments loaded straight from global
 * memory, 16 bytes per thread, never kept in L2), the x rows are the N (NT
 * n-tiles of 8), staged per 256-column slice in shared memory (cp.async,
 * double-buffered) and shared by the CTA's 8 warps (128 vocabulary rows).
 * The dot product's k order is permuted identically for A and B (thread tq
 * loads 8 consecutive columns, which feed two k-steps), so one 16-byte load
 * per row and thread feeds two MMAs. fp32 accumulation; dim % 32 == 0. */
#define LMT_WARPS 8
#define LMT_KS 256                       /* columns per x slice */
#define LMT_XLD (LMT_KS + 32)            /* x slice row stride (halves): 576 B, conflict-free */

template <int NT>
static __global__ void __launch_bounds__(LMT_WARPS * 32, 2)
lm_head_tc_kernel(float *logits, const __half *x, const int *rows, int m, const __half *table,
                  int dim, int vocab_rows) {
    __shared__ __align__(16) __half xs[2][NT * 8][LMT_XLD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
    const int v0 = (blockIdx.x * LMT_WARPS + warp) * 16;
    const int nsl = (dim + LMT_KS - 1) / LMT_KS;
    /* x rows of slice sl into xs[buf] (rows >= m: zeros) */
    auto load_x = [&](int sl, int buf) {
        const int k0 = sl * LMT_KS, kn = dim - k0 < LMT_KS ? dim - k0 : LMT_KS;
        for (int e = tid; e < NT * 8 * (LMT_KS / 8); e += LMT_WARPS * 32) {
            int r = e / (LMT_KS / 8), c8 = (e % (LMT_KS / 8)) * 8;
            const __half *src = x;
            int bytes = 0;
            if (r < m && c8 < kn) {
                src = x + (size_t)(rows ? rows[r] : r) * dim + k0 + c8;
                bytes = 16;
            }
            cp_async16(&xs[buf][r][c8], src, bytes);
        }
        cp_async_commit();
    };
    const bool r0ok = v0 + gq < vocab_rows, r1ok = v0 + gq + 8 < vocab_rows;
    const __half *ta = table + (size_t)(r0ok ? v0 + gq : 0) * dim + tq * 8;
    const __half *tb = table + (size_t)(r1ok ? v0 + gq + 8 : 0) * dim + tq * 8;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    load_x(0, 0);
    for (int sl = 0; sl < nsl; sl++) {
        const int k0 = sl * LMT_KS, nch = (dim - k0 < LMT_KS ? dim - k0 : LMT_KS) / 32;
        /* this slice's table rows: up to 8 chunks of 32 columns, in flight together */
        uint4 ra[LMT_KS / 32], rb[LMT_KS / 32];
#pragma unroll
        for (int c = 0; c < LMT_KS / 32; c++) {
            ra[c] = rb[c] = make_uint4(0, 0, 0, 0);
            if (c < nch) {
                if (r0ok) ra[c] = __ldcs((const uint4 *)(ta + k0 + c * 32));
                if (r1ok) rb[c] = __ldcs((const uint4 *)(tb + k0 + c * 32));
            }
        }
        cp_async_wait0();
        __syncthreads(); /* xs[sl & 1] is in; everyone is done with xs[(sl + 1) & 1] */
        if (sl + 1 < nsl) load_x(sl + 1, (sl + 1) & 1);
        const int buf = sl & 1;
#pragma unroll
        for (int c = 0; c < LMT_KS / 32; c++) {
            if (c < nch) {
                unsigned a0[4] = {ra[c].x, rb[c].x, ra[c].y, rb[c].y};
                unsigned a1[4] = {ra[c].z, rb[c].z, ra[c].w, rb[c].w};
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    uint4 xb = *(const uint4 *)&xs[buf][j * 8 + gq][c * 32 + tq * 8];
                    mma16816(acc[j], a0, xb.x, xb.y);
                    mma16816(acc[j], a1, xb.z, xb.w);
                }
            }
        }
    }
    /* acc[j]: vocabulary rows v0 + gq (0, 1) and v0 + gq + 8 (2, 3), x rows j * 8 + 2 tq (+1) */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int n0 = j * 8 + 2 * tq;
        if (n0 < m) {
            if (r0ok) logits[(size_t)n0 * vocab_rows + v0 + gq] = acc[j][0];
            if (r1ok) logits[(size_t)n0 * vocab_rows + v0 + gq + 8] = acc[j][2];
        }
        if (n0 + 1 < m) {
            if (r0ok) logits[(size_t)(n0 + 1) * vocab_rows + v0 + gq] = acc[j][1];
            if (r1ok) logits[(size_t)(n0 + 1) * vocab_rows + v0 + gq + 8] = acc[j][3];
        }
    }
}

template <int NT>
static void lm_head_tc(struct cuda_ctx *c, float *logits, const __half *x, const int *rows, int m,
                       const __half *table, int dim, int vocab_rows) {
    int blocks = (vocab_rows + LMT_WARPS * 16 - 1) / (LMT_WARPS * 16);
    lm_head_tc_kernel<NT><<<blocks, LMT_WARPS * 32, 0, c->stream>>>(logits, x, rows, m, table, dim,
                                                                    vocab_rows);
}

/* lm_head path: cuBLAS (rows gathered, then cublasGemmEx) for every row
 * count — measured fastest on an H200 at 1..32 rows (301-316 us for Qwen3-8B's
 * 1.24 GB table, ~4 TB/s; the GEMV 344 us at 1 row and 659 at 8, the
 * tensor-core kernel 322-332). AWQD_CUDA_LM_HEAD (read per call: tests
 * switch it) for comparisons: gemv = the previous default (GEMV <= 8 rows,
 * cuBLAS above); tc = the tensor-core kernel for every m <= 32. */
static int lm_head_mode(void) {
    const char *e = getenv("AWQD_CUDA_LM_HEAD");
    return !e ? 0 : !strcmp(e, "tc") ? 2 : !strcmp(e, "gemv") ? 4 : 0;
}

/* ======================================================================== */
/* ops                                                                       */
/* ======================================================================== */

#define H(b) ((__half *)(b)->d)
#define CH(b) ((const __half *)(b)->d)
#define I32(b) ((const int *)(b)->d)

static void cu_embed(void *ctx, struct buf *out, const struct buf *table, const struct buf *ids,
                     int n, int dim, int row_start, int rows) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(out->n >= (size_t)n * dim && ids->n >= (size_t)n &&
                table->n >= (size_t)rows * dim);
    if (n <= 0) return;
    PROF_BEGIN(c, "embed", 0, 0);
    ops_cuda_launch(c, embed_kernel, dim3(n), dim3(128), 0, H(out), CH(table), I32(ids), dim,
                    row_start, rows);
    OPS_CUDA_LAUNCHED(c, "embed");
    PROF_END(c);
}

static void cu_add_rmsnorm(void *ctx, struct buf *resid, const struct buf *delta, struct buf *out,
                           const struct buf *w, int n, int dim, float eps) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(resid->n >= (size_t)n * dim && out->n >= (size_t)n * dim && w->n >= (size_t)dim);
    AWQD_ASSERT(!delta || delta->n >= (size_t)n * dim);
    if (n <= 0) return;
    PROF_BEGIN(c, "add_rmsnorm", 0, 0);
    const __half *dl = delta ? CH(delta) : NULL;
    int vpt = (dim / 8 + 255) / 256;
    if (dim % 8 == 0 && vpt <= 1)
        ops_cuda_launch(c, add_rmsnorm_vec_kernel<1>, dim3(n), dim3(256), 0, H(resid), dl, H(out),
                        CH(w), dim, eps);
    else if (dim % 8 == 0 && vpt <= 2)
        ops_cuda_launch(c, add_rmsnorm_vec_kernel<2>, dim3(n), dim3(256), 0, H(resid), dl, H(out),
                        CH(w), dim, eps);
    else if (dim % 8 == 0 && vpt <= 4)
        ops_cuda_launch(c, add_rmsnorm_vec_kernel<4>, dim3(n), dim3(256), 0, H(resid), dl, H(out),
                        CH(w), dim, eps);
    else {
        int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
        ops_cuda_launch(c, add_rmsnorm_kernel, dim3(n), dim3(threads), 0, H(resid), dl, H(out),
                        CH(w), dim, eps);
    }
    OPS_CUDA_LAUNCHED(c, "add_rmsnorm");
    PROF_END(c);
}

/* The scratch a linear call gets: the backend's linear workspace, or — for
 * prefill-sized calls (n >= LIN_TAIL_MIN_ROWS) when it is larger — the part
 * of y past this call's n rows of `cols` (kernels/ops.h: scratch during the
 * call). A prefill chunk shorter than the model's row workspace leaves most
 * of the activation buffers free; w4a16's dequantize + cuBLAS slabs are the
 * wider (fewer, fuller GEMMs) the more scratch they get: on an H100, Qwen3-8B
 * TTFT(1024) with 4096 rows of buffers 45.0 -> ~38 ms (the same as a 62 MB
 * linear workspace, which the memory budget has no room for). */
#define LIN_TAIL_MIN_ROWS 256
static void lin_scratch(const struct cuda_ctx *c, const struct buf *y, const struct buf *x, int n,
                        int cols, void **ws, size_t *bytes) {
    *ws = c->lin_ws;
    *bytes = c->lin_ws_bytes;
    if (n < LIN_TAIL_MIN_ROWS || c->capturing || x->d == y->d) return;
    size_t used = ((size_t)n * cols * sizeof(uint16_t) + 255) & ~(size_t)255;
    size_t cap = y->n * sizeof(uint16_t);
    if (cap > used && cap - used > *bytes) {
        *ws = (char *)y->d + used;
        *bytes = cap - used;
    }
}

static int skip_linear(const struct cuda_ctx *c, int k, int n) {
    for (int i = 0; i < c->n_skip_lin; i++)
        if (c->skip_lin[i][0] == k && c->skip_lin[i][1] == n) return 1;
    return 0;
}

/* AWQD_CUDA_SKIP=name[,name...] (measurement only): qknorm, attn, combine,
 * lm_head, KxN (the linears of that shape) */
static void parse_skip(struct cuda_ctx *c, const char *e) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", e);
    for (char *sv = NULL, *t = strtok_r(buf, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
        int k, n;
        if (!strcmp(t, "qknorm")) c->skip |= OPS_SKIP_QKNORM;
        else if (!strcmp(t, "attn")) c->skip |= OPS_SKIP_ATTN;
        else if (!strcmp(t, "combine")) c->skip |= OPS_SKIP_COMBINE;
        else if (!strcmp(t, "lm_head")) c->skip |= OPS_SKIP_LM_HEAD;
        else if (!strcmp(t, "normdelta")) c->skip |= OPS_SKIP_NORMDELTA;
        else if (sscanf(t, "%dx%d", &k, &n) == 2 && c->n_skip_lin < 8) {
            c->skip_lin[c->n_skip_lin][0] = k;
            c->skip_lin[c->n_skip_lin++][1] = n;
        } else
            fprintf(stderr, "awqd: AWQD_CUDA_SKIP: unknown op '%s'\n", t);
    }
    fprintf(stderr, "awqd: AWQD_CUDA_SKIP=%s: measurement only, results are wrong\n", e);
}

static void cu_linear(void *ctx, struct buf *y, const struct buf *x, int n,
                      const struct op_linear *l) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(l->kind == LINEAR_PLAIN);
    AWQD_ASSERT(x->n >= (size_t)n * l->k && y->n >= (size_t)n * l->n);
    if (n <= 0 || skip_linear(c, l->k, l->n)) return;
    char err[256];
    PROF_BEGIN(c, "linear", l->k, l->n);
    void *ws;
    size_t wsb;
    lin_scratch(c, y, x, n, l->n, &ws, &wsb);
    int rc = w4a16_linear(l->w, (const uint16_t *)x->d, n, (uint16_t *)y->d,
                          l->has_bias ? W4A16_EPI_BIAS : W4A16_EPI_NONE, ws, wsb, c->stream, err,
                          sizeof err);
    PROF_END(c);
    if (rc) ops_cuda__fail(c, rc, "linear", err);
}

static int cu_linear_sum_ok(void *ctx, int n, const struct op_linear *l) {
    (void)ctx;
    return l->kind == LINEAR_PLAIN && w4a16_linear_sum_ok(l->w, n);
}

static void cu_linear_sum(void *ctx, struct buf *y, const struct buf *x, int n,
                          const struct op_linear *l, const void *desc) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(l->kind == LINEAR_PLAIN && desc);
    AWQD_ASSERT(x->n >= (size_t)n * l->k && y->n >= (size_t)n * l->n);
    if (n <= 0 || skip_linear(c, l->k, l->n)) return; /* skipped alike on every rank */
    char err[256];
    PROF_BEGIN(c, "linear+all_reduce", l->k, l->n);
    void *ws;
    size_t wsb;
    lin_scratch(c, y, x, n, l->n, &ws, &wsb);
    int rc = w4a16_linear_sum(l->w, (const uint16_t *)x->d, n, (uint16_t *)y->d,
                              l->has_bias ? W4A16_EPI_BIAS : W4A16_EPI_NONE,
                              (const struct w4a16_sum *)desc, ws, wsb, c->stream, err, sizeof err);
    PROF_END(c);
    if (rc) ops_cuda__fail(c, rc, "linear_sum", err);
}

static void cu_qk_norm_rope_kv(void *ctx, struct buf *qkv, int n, int nh, int nkv, int hd,
                               const struct buf *q_norm, const struct buf *k_norm, float eps,
                               const struct buf *inv_freq, const struct attn_batch *ab,
                               struct buf *k_cache, struct buf *v_cache) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(n == ab->n_rows && qkv->n >= (size_t)n * (nh + 2 * nkv) * hd);
    AWQD_ASSERT(hd % 32 == 0 && hd <= 256 && inv_freq->n >= (size_t)hd / 2);
    AWQD_ASSERT(k_cache->n == v_cache->n && k_cache->n % ((size_t)nkv * hd) == 0);
    AWQD_ASSERT(!q_norm == !k_norm);
    c->qk_defer.on = 0;
    if (n <= 0 || (c->skip & OPS_SKIP_QKNORM)) return;
    if (ops_cuda__attn_decode_fuse_qk(c, ab, nh, nkv, hd)) { /* the attention does it (attn_decode.cu) */
        c->qk_defer = dec_qk{q_norm ? (const uint16_t *)q_norm->d : NULL,
                             k_norm ? (const uint16_t *)k_norm->d : NULL,
                             (const float *)inv_freq->d, I32(ab->positions), I32(ab->slots),
                             (uint16_t *)k_cache->d, (uint16_t *)v_cache->d, eps, 1};
        return;
    }
    dim3 grid(n, (nh + nkv + 3) / 4);
    PROF_BEGIN(c, "qk_norm_rope_kv", 0, 0);
    ops_cuda_launch(c, qk_rope_kv_kernel, grid, dim3(128), 0, H(qkv), nh, nkv, hd,
                    q_norm ? CH(q_norm) : NULL, k_norm ? CH(k_norm) : NULL, eps,
                    (const float *)inv_freq->d, I32(ab->positions), I32(ab->slots), H(k_cache),
                    H(v_cache), c->early & OPS_EARLY_QKNORM ? c->early_qk_keys : 0);
    OPS_CUDA_LAUNCHED(c, "qk_norm_rope_kv");
    PROF_END(c);
}

static void cu_attention(void *ctx, struct buf *out, const struct buf *qkv, int nh, int nkv,
                         int hd, float scale, const struct attn_batch *ab,
                         const struct buf *k_cache, const struct buf *v_cache) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (c->skip & OPS_SKIP_ATTN) {
        c->qk_defer.on = 0;
        return;
    }
    PROF_BEGIN(c, "attention", 0, 0);
    ops_cuda__attention(c, out, qkv, nh, nkv, hd, scale, ab, k_cache, v_cache);
    PROF_END(c);
}

static int cu_add_rmsnorm_linear(void *ctx, const struct buf *rin, const struct buf *delta,
                                 struct buf *rout, const struct buf *w, int n, int dim, float eps,
                                 struct buf *y, const struct op_linear *l) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    const int gu = l->kind == LINEAR_GATE_UP;
    AWQD_ASSERT(dim == l->k && rin->n >= (size_t)n * dim && rout->n >= (size_t)n * dim);
    AWQD_ASSERT(!delta || delta->n >= (size_t)n * dim);
    AWQD_ASSERT(y->n >= (size_t)n * (gu ? l->n / 2 : l->n) && w->n >= (size_t)dim);
    if (n <= 0 || !w4a16_linear_norm_ok(l->w, n)) return -ENOTSUP;
    if (skip_linear(c, l->k, l->n)) return 0;
    char err[256];
    PROF_BEGIN(c, gu ? "add_rmsnorm+linear_silu_mul" : "add_rmsnorm+linear", l->k, l->n);
    int rc = w4a16_linear_norm(l->w, (const uint16_t *)rin->d,
                               delta && !(c->skip & OPS_SKIP_NORMDELTA) ? (const uint16_t *)delta->d : NULL,
                               (uint16_t *)rout->d,
                               (const uint16_t *)w->d, eps, n, (uint16_t *)y->d,
                               (gu ? W4A16_EPI_SILU_MUL : 0) | (l->has_bias ? W4A16_EPI_BIAS : 0),
                               c->stream, err, sizeof err);
    PROF_END(c);
    if (rc) ops_cuda__fail(c, rc, "add_rmsnorm_linear", err);
    return 0;
}

static void cu_linear_silu_mul(void *ctx, struct buf *out, const struct buf *x, int n,
                               const struct op_linear *l) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(l->kind == LINEAR_GATE_UP);
    AWQD_ASSERT(x->n >= (size_t)n * l->k && out->n >= (size_t)n * (l->n / 2));
    if (n <= 0 || skip_linear(c, l->k, l->n)) return;
    char err[256];
    PROF_BEGIN(c, "linear_silu_mul", l->k, l->n);
    void *ws;
    size_t wsb;
    lin_scratch(c, out, x, n, l->n / 2, &ws, &wsb);
    int rc = w4a16_linear(l->w, (const uint16_t *)x->d, n, (uint16_t *)out->d,
                          W4A16_EPI_SILU_MUL | (l->has_bias ? W4A16_EPI_BIAS : 0), ws, wsb,
                          c->stream, err, sizeof err);
    PROF_END(c);
    if (rc) ops_cuda__fail(c, rc, "linear_silu_mul", err);
}

static void cu_lm_head(void *ctx, struct buf *logits, const struct buf *x, const struct buf *rows,
                       int m, const struct buf *table, int dim, int vocab_rows) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    AWQD_ASSERT(logits->n >= (size_t)m * vocab_rows && table->n >= (size_t)vocab_rows * dim);
    AWQD_ASSERT((rows ? rows->n >= (size_t)m : x->n >= (size_t)m * dim) && x->n >= (size_t)dim);
    if (m <= 0 || (c->skip & OPS_SKIP_LM_HEAD)) return;
    const int mode = lm_head_mode();
    const int *rw = rows ? I32(rows) : NULL; /* NULL: rows 0..m-1 */
    if (mode == 2 && dim % 32 == 0 && m <= 32) {
        PROF_BEGIN(c, "lm_head tc", m, 0);
        float *lg = (float *)logits->d;
        if (m <= 8) lm_head_tc<1>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        else if (m <= 16) lm_head_tc<2>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        else lm_head_tc<4>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        OPS_CUDA_LAUNCHED(c, "lm_head");
        PROF_END(c);
        return;
    }
    if (mode == 4 && m <= 8 && dim % 8 == 0 && (size_t)8 * dim * 2 <= 160 * 1024) {
        PROF_BEGIN(c, "lm_head gemv", m, 0);
        float *lg = (float *)logits->d;
        if (m == 1) lm_head_gemv<1>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        else if (m == 2) lm_head_gemv<2>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        else if (m <= 4) lm_head_gemv<4>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        else lm_head_gemv<8>(c, lg, CH(x), rw, m, CH(table), dim, vocab_rows);
        OPS_CUDA_LAUNCHED(c, "lm_head");
        PROF_END(c);
        return;
    }
    if (rows && (size_t)m * dim > c->gather_elems) {
        cudaStreamSynchronize(c->stream);
        cudaFree(c->d_gather);
        c->d_gather = NULL;
        c->gather_elems = 0;
        if (cudaMalloc((void **)&c->d_gather, (size_t)m * dim * 2) != cudaSuccess) {
            ops_cuda__fail(c, -ENOMEM, "lm_head", "out of memory for the gathered rows");
            return;
        }
        c->gather_elems = (size_t)m * dim;
    }
    PROF_BEGIN(c, "lm_head", 0, 0);
    if (rows) {
        gather_rows_kernel<<<m, 256, 0, c->stream>>>((__half *)c->d_gather, CH(x), I32(rows), dim);
        OPS_CUDA_LAUNCHED(c, "lm_head gather");
    }
    /* column-major view: logits^T [vocab_rows, m] = table [dim, vocab_rows]^T . xs [dim, m] */
    float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx((cublasHandle_t)c->blas, CUBLAS_OP_T, CUBLAS_OP_N, vocab_rows,
                                    m, dim, &one, table->d, CUDA_R_16F, dim,
                                    rows ? (const void *)c->d_gather : x->d,
                                    CUDA_R_16F, dim, &zero, logits->d, CUDA_R_32F, vocab_rows,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    PROF_END(c);
    if (s != CUBLAS_STATUS_SUCCESS) {
        char d[64];
        snprintf(d, sizeof d, "cublasGemmEx status %d", (int)s);
        ops_cuda__fail(c, -EIO, "lm_head", d);
    }
}

static int cu_sync(void *ctx) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "sync")) return -EBUSY;
    CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) ops_cuda__fail(c, -EIO, "sync", cudaGetErrorString(e));
    else c->ring_off = 0;
    prof_collect(c);
    return c->rc;
}

/* ======================================================================== */
/* graphs                                                                    */
/* ======================================================================== */

struct op_graph {
    cudaGraphExec_t exec;
};

static long g_recorded, g_failed, g_replayed; /* process-wide, atomic */

extern "C" void ops_cuda_graph_counts(long *recorded, long *failed, long *replayed) {
    if (recorded) *recorded = __atomic_load_n(&g_recorded, __ATOMIC_RELAXED);
    if (failed) *failed = __atomic_load_n(&g_failed, __ATOMIC_RELAXED);
    if (replayed) *replayed = __atomic_load_n(&g_replayed, __ATOMIC_RELAXED);
}

int ops_cuda__retire(struct cuda_ctx *c, void *d) {
    if (!d) return 0;
    if (c->n_graphs == 0 && !c->capturing) {
        cudaFree(d);
        return 0;
    }
    if (c->n_retired == (int)(sizeof c->retired / sizeof c->retired[0])) return -ENOMEM;
    c->retired[c->n_retired++] = d;
    return 0;
}

static int cu_graph_begin(void *ctx) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (c->capturing) return -EBUSY;
    if (c->rc) return c->rc;
    CUDA_CHECK(cudaSetDevice(c->device), NULL, 0);
    cudaGetLastError();
    /* thread-local: tensor-parallel ranks record their own streams at once */
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        log_warn("cuda backend: cannot start recording a graph: %s", cudaGetErrorString(e));
        return -EIO;
    }
    c->capturing = 1;
    c->cap_rc = 0;
    c->cap_msg[0] = 0;
    return 0;
}

static int cu_graph_end(void *ctx, struct op_graph **out) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    *out = NULL;
    if (!c->capturing) return -EINVAL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = 0;
    int rc = c->cap_rc;
    if (!rc && e != cudaSuccess) {
        rc = -EIO;
        snprintf(c->cap_msg, sizeof c->cap_msg, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    }
    cudaGraphExec_t ex = NULL;
    if (!rc && g) {
        e = cudaGraphInstantiateWithFlags(&ex, g, 0);
        if (e != cudaSuccess) {
            rc = -EIO;
            ex = NULL;
            snprintf(c->cap_msg, sizeof c->cap_msg, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
        }
    } else if (!rc) {
        rc = -EIO;
        snprintf(c->cap_msg, sizeof c->cap_msg, "empty capture");
    }
    if (g) cudaGraphDestroy(g);
    cudaGetLastError(); /* errors of a failed capture are not the stream's */
    struct op_graph *og = NULL;
    if (!rc) {
        og = (struct op_graph *)calloc(1, sizeof *og);
        if (!og) {
            cudaGraphExecDestroy(ex);
            rc = -ENOMEM;
            snprintf(c->cap_msg, sizeof c->cap_msg, "out of memory");
        }
    }
    if (rc) {
        __atomic_add_fetch(&g_failed, 1, __ATOMIC_RELAXED);
        log_warn("cuda backend: cannot record a graph (%s); running eagerly", c->cap_msg);
        return rc;
    }
    __atomic_add_fetch(&g_recorded, 1, __ATOMIC_RELAXED);
    og->exec = ex;
    c->n_graphs++;
    *out = og;
    return 0;
}

static int cu_graph_run(void *ctx, struct op_graph *g) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (refuse_capturing(c, "graph_run")) return -EBUSY;
    if (c->rc) return c->rc;
    PROF_BEGIN(c, "graph replay", 0, 0);
    cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
    PROF_END(c);
    __atomic_add_fetch(&g_replayed, 1, __ATOMIC_RELAXED);
    if (e != cudaSuccess) ops_cuda__fail(c, -EIO, "graph_run", cudaGetErrorString(e));
    return c->rc;
}

static void cu_graph_free(void *ctx, struct op_graph *g) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    if (!g || refuse_capturing(c, "graph_free")) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream); /* a replay may still run */
    cudaGraphExecDestroy(g->exec);
    free(g);
    c->n_graphs--;
}

/* the load is over: the repack buffer goes (a later upload_linear makes a new one) */
static void cu_weights_done(void *ctx) {
    struct cuda_ctx *c = (struct cuda_ctx *)ctx;
    cudaSetDevice(c->device);
    w4a16_stage_free(&c->up_stage);
}

static void cu_destroy(struct ops *ops) {
    if (!ops) return;
    struct cuda_ctx *c = (struct cuda_ctx *)ops->ctx;
    if (c) {
        cudaSetDevice(c->device);
        w4a16_stage_free(&c->up_stage);
        if (c->stream) cudaStreamSynchronize(c->stream);
        log_info("cuda backend: device scratch at exit: linear split-K %.1f MB, decode attention "
                 "partials %.1f MB, attention partials %.1f MB, lm_head gather %.1f MB; decode K split "
                 "launches enqueued by the process %lu, %lu of them polled (a graph's replays not counted)",
                 c->lin_ws_bytes / 1e6, c->dec_part_floats * 4 / 1e6, c->attn.part_bytes / 1e6,
                 c->gather_elems * 2 / 1e6, w4a16_decode_ksplit_launches(), w4a16_decode_ksplit_polls());
#ifdef AWQD_STAMPS
        w4a16_stamps_dump();
        w4a16_gemm_stamps_dump();
        attn_decode_stamps_dump();
        ops_stamps_dump();
#endif
        prof_free(c);
        ops_cuda__attn_free(&c->attn);
        ops_cuda__attn_decode_free(c);
        for (int i = 0; i < c->n_retired; i++) cudaFree(c->retired[i]);
        if (c->h_ring) cudaFreeHost(c->h_ring);
        cudaFree(c->lin_ws);
        cudaFree(c->d_gather);
        cudaFree(c->d_grp);
        cudaFree(c->smp_arrive);
        if (c->h_stage) cudaFreeHost(c->h_stage);
        if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
        gemm_lt_thread_free(); /* this thread's cuBLASLt plans (w4a16 column slabs) */
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(ops);
}

extern "C" int ops_cuda_create(int device, struct ops **out, char *err, size_t errlen) {
    *out = NULL;
    int n_dev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n_dev), err, errlen);
    if (device < 0 || device >= n_dev)
        return util_err(err, errlen, -ENODEV, "cuda backend: no device %d (%d present)", device,
                        n_dev);
    struct ops *o = (struct ops *)calloc(1, sizeof *o);
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    if (!o || !c) {
        free(o);
        free(c);
        return util_err(err, errlen, -ENOMEM, "cuda backend: out of memory");
    }
    o->ctx = c;
    o->destroy = cu_destroy;
    c->device = device;
#define TRY(call)                                                                      \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            int rc_ = util_err(err, errlen, CUDA_CHECK_RC_(e_), "cuda backend: %s: %s", #call, \
                               cudaGetErrorString(e_));                                \
            cu_destroy(o);                                                             \
            return rc_;                                                                \
        }                                                                              \
    } while (0)
    TRY(cudaSetDevice(device));
    TRY(cudaDeviceGetAttribute(&c->n_sms, cudaDevAttrMultiProcessorCount, device));
    int cc_major = 0;
    TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
    /* one switch for every kernel: w4a16 reads AWQD_CUDA_PDL (w4a16_pdl) */
    c->pdl = cc_major >= 9 && w4a16_pdl(-1);
    const char *dec_env = getenv("AWQD_CUDA_DECODE_ATTN");
    c->dec_off = dec_env && !strcmp(dec_env, "0");
    c->dec_simt = dec_env && !strcmp(dec_env, "simt");
    c->dec_lo = 4;
    c->dec_hi = 2;
    const char *mk_env = getenv("AWQD_CUDA_DEC_MIN_KEYS");
    c->dec_min_keys = mk_env && atoi(mk_env) >= 1 ? atoi(mk_env) : 32;
    const char *ns_env = getenv("AWQD_CUDA_DEC_NS");
    c->dec_ns = ns_env && atoi(ns_env) >= 1 && atoi(ns_env) <= 64 ? atoi(ns_env) : 0;
    const char *split_env = getenv("AWQD_CUDA_DEC_SPLIT");
    if (split_env) {
        int lo = 0, hi = 0;
        if (sscanf(split_env, "%d,%d", &lo, &hi) == 2 && lo >= 1 && hi >= 1 && lo <= 64 && hi <= 64) {
            c->dec_lo = lo;
            c->dec_hi = hi;
        }
    }
    const char *skip_env = getenv("AWQD_CUDA_SKIP");
    if (skip_env && *skip_env) parse_skip(c, skip_env);
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    c->dec_prewait = !util_env_is_zero("AWQD_CUDA_DEC_PREWAIT");
    c->dec_wave = !util_env_is_zero("AWQD_CUDA_DEC_WAVE");
    /* OPS_EARLY_* bits, default both (session 31, H200, docs/PERFORMANCE.md "Session 31"): the
     * merge's made Qwen3-8B batch 1-2 1-2% faster; the q/k-norm's made the tp = 4 rank proxy 3%
     * faster at contexts 256-1024 and 1% slower at 2048, Qwen3-8B batch 2 1% slower from 1024:
     * hence only up to AWQD_CUDA_EARLY_QK_KEYS (default 1024) keys a step (context x rows) */
    const char *early_env = getenv("AWQD_CUDA_EARLY");
    c->early = early_env && *early_env ? atoi(early_env) & (OPS_EARLY_MERGE | OPS_EARLY_QKNORM)
                                       : OPS_EARLY_MERGE | OPS_EARLY_QKNORM;
    const char *eqk_env = getenv("AWQD_CUDA_EARLY_QK_KEYS");
    c->early_qk_keys = eqk_env && *eqk_env ? atoi(eqk_env) : 1024;
    const char *wide_env = getenv("AWQD_CUDA_DEC_WIDE"); /* 0: off; n >= 2: from n splits */
    c->dec_wide = wide_env && *wide_env ? (atoi(wide_env) >= 2 ? atoi(wide_env) : 0) : DEC_WIDE_FROM;
    c->grp_on = !util_env_is_zero("AWQD_CUDA_UPLOAD_GROUP");
    c->smp_fuse = !util_env_is_zero("AWQD_CUDA_SAMPLE_FUSE");
    const char *sg_env = getenv("AWQD_CUDA_SAMPLE_GS");
    c->smp_gs = sg_env && !strcmp(sg_env, "32") ? 32 : 8;
    c->dl_bounce = !util_env_is_zero("AWQD_CUDA_DL_BOUNCE");
    TRY(cudaEventCreateWithFlags(&c->attn.uploaded, cudaEventDisableTiming));
    TRY(cudaMallocHost((void **)&c->h_ring, RING_BYTES));
    const char *pe = getenv("AWQD_CUDA_PROFILE");
    if (pe && *pe && strcmp(pe, "0")) {
        c->prof = (struct cuda_prof *)calloc(1, sizeof *c->prof);
        if (c->prof)
            for (int i = 0; i < PROF_PENDING; i++) {
                cudaEventCreate(&c->prof->ev[i][0]);
                cudaEventCreate(&c->prof->ev[i][1]);
            }
        if (c->prof) cudaEventCreate(&c->prof->carry);
    }
#undef TRY
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        cu_destroy(o);
        return util_err(err, errlen, -EIO, "cuda backend: cublasCreate failed");
    }
    c->blas = h;
    cublasSetStream(h, c->stream);
    o->name = "cuda";
    o->alloc = cu_alloc;
    o->free = cu_free;
    o->upload = cu_upload;
    o->upload_group = cu_upload_group;
    o->download = cu_download;
    o->copy = cu_copy;
    o->upload_linear = cu_upload_linear;
    o->weights_done = cu_weights_done;
    o->free_linear = cu_free_linear;
    o->embed = cu_embed;
    o->add_rmsnorm = cu_add_rmsnorm;
    if (!util_env_is_zero("AWQD_CUDA_NORM_FUSE"))
        o->add_rmsnorm_linear = cu_add_rmsnorm_linear; /* AWQD_CUDA_NORM_FUSE=0: separate ops */
    o->linear = cu_linear;
    o->linear_sum_ok = cu_linear_sum_ok;
    o->linear_sum = cu_linear_sum;
    o->qk_norm_rope_kv = cu_qk_norm_rope_kv;
    o->attention = cu_attention;
    o->linear_silu_mul = cu_linear_silu_mul;
    o->lm_head = cu_lm_head;
    o->sample_topk = ops_cuda__sample_topk;
    o->sync = cu_sync;
    if (!util_env_is_zero("AWQD_CUDA_GRAPHS")) {
        o->graph_begin = cu_graph_begin;
        o->graph_end = cu_graph_end;
        o->graph_run = cu_graph_run;
        o->graph_free = cu_graph_free;
    }
    *out = o;
    return 0;
}
