/* gemm_lt.cu — see gemm_lt.h. */
#include <errno.h>
#include <string.h>

#include <new>

#include <cublasLt.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_lt.h"

#define LT_SLOTS 64

struct lt_key {
    int ta, tb, m, n, k, lda, ldb, ldc, beta;
};

struct lt_plan {
    struct lt_key key;
    int used;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

struct lt_thread {
    cublasLtHandle_t h;
    void *ws;                     /* GEMM_LT_WS bytes on the thread's device */
    int device;
    struct lt_plan plan[LT_SLOTS];
    int n_plans, next_evict;
};

static thread_local struct lt_thread *tl_lt = NULL;

static void plan_release(struct lt_plan *p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
    p->used = 0;
}

void gemm_lt_thread_free(void) {
    struct lt_thread *t = tl_lt;
    if (!t) return;
    for (int i = 0; i < t->n_plans; i++) plan_release(&t->plan[i]);
    if (t->ws) {
        int cur = 0;
        cudaGetDevice(&cur);
        cudaSetDevice(t->device);
        cudaDeviceSynchronize(); /* queued GEMMs may still use the workspace */
        cudaFree(t->ws);
        cudaSetDevice(cur);
    }
    if (t->h) cublasLtDestroy(t->h);
    delete t;
    tl_lt = NULL;
}

#define LT_CHECK(call)                                                                         \
    do {                                                                                       \
        cublasStatus_t s_ = (call);                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            rc = util_err(err, errlen, s_ == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO,     \
                          "%s failed at %s:%d: cublas status %d", #call, __FILE__, __LINE__,  \
                          (int)s_);                                                            \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* The plan of key k: descriptors and the heuristic's first algorithm. */
static int plan_make(struct lt_thread *t, struct lt_plan *p, const struct lt_key *k, char *err,
                     size_t errlen) {
    int rc = 0;
    cublasOperation_t ta = (cublasOperation_t)k->ta, tb = (cublasOperation_t)k->tb;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    size_t ws = GEMM_LT_WS;
    memset(p, 0, sizeof *p);
    p->key = *k;
    LT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    /* stored shapes: A is m x k (k x m transposed), B is k x n (n x k) */
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16F, ta == CUBLAS_OP_N ? k->m : k->k,
                                        ta == CUBLAS_OP_N ? k->k : k->m, k->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16F, tb == CUBLAS_OP_N ? k->k : k->n,
                                        tb == CUBLAS_OP_N ? k->n : k->k, k->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_16F, k->m, k->n, k->ldc));
    p->used = 1;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws));
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(t->h, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
                                            &res, &n_res));
    if (n_res < 1) {
        rc = util_err(err, errlen, -EIO, "cublasLt: no algorithm for a %dx%dx%d fp16 GEMM",
                      k->m, k->n, k->k);
        goto fail;
    }
    p->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return 0;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (p->used) plan_release(p);
    else {
        if (p->desc) cublasLtMatmulDescDestroy(p->desc);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    }
    memset(p, 0, sizeof *p);
    return rc;
}

int gemm_lt_f16(cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                char *err, size_t errlen) {
    int rc = 0;
    struct lt_thread *t = tl_lt;
    int dev = 0;
    cudaGetDevice(&dev);
    if (t && t->device != dev) { /* the thread moved to another device: start again there */
        gemm_lt_thread_free();
        t = NULL;
    }
    if (!t) {
        t = new (std::nothrow) lt_thread();
        if (!t) return util_err(err, errlen, -ENOMEM, "cublasLt: out of memory");
        memset(t, 0, sizeof *t);
        t->device = dev;
        cublasStatus_t st = cublasLtCreate(&t->h);
        if (st != CUBLAS_STATUS_SUCCESS) {
            delete t;
            return util_err(err, errlen, -EIO, "cublasLtCreate failed: cublas status %d", (int)st);
        }
        cudaError_t e = cudaMalloc(&t->ws, GEMM_LT_WS);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cublasLtDestroy(t->h);
            delete t;
            return util_err(err, errlen, -ENOMEM, "cublasLt: no device memory for its %u-byte workspace",
                            GEMM_LT_WS);
        }
        tl_lt = t;
    }
    const lt_key key = {(int)ta, (int)tb, m, n, k, lda, ldb, ldc, beta != 0.0f};
    struct lt_plan *p = NULL;
    for (int i = 0; i < t->n_plans && !p; i++)
        if (t->plan[i].used && !memcmp(&t->plan[i].key, &key, sizeof key)) p = &t->plan[i];
    if (!p) {
        if (t->n_plans < LT_SLOTS) {
            p = &t->plan[t->n_plans++];
        } else { /* full: replace in turn */
            p = &t->plan[t->next_evict];
            t->next_evict = (t->next_evict + 1) % LT_SLOTS;
            plan_release(p);
        }
        if ((rc = plan_make(t, p, &key, err, errlen))) return rc;
    }
    const float one = 1.0f;
    LT_CHECK(cublasLtMatmul(t->h, p->desc, &one, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc,
                            &p->algo, t->ws, GEMM_LT_WS, s));
    return 0;
fail:
    return rc;
}
