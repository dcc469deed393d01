/* gemm_lt.h — fp16 GEMMs (fp32 accumulation) through cuBLASLt with each
 * shape's algorithm chosen once per thread (kernels/cuda/gemm_lt.cu).
 *
 * cublasGemmEx picks its algorithm on every call: on an H100 with CUDA 13 that
 * is ~50 µs of host time per call, which made the prefill's column-slab
 * linears (w4a16.cu launch_cublas: ~20 GEMMs per layer) host-bound. Here the
 * descriptors and the heuristic's first choice are kept per (op, m, n, k,
 * ld, beta != 0) in a small per-thread cache (each worker thread owns one
 * device), so a call costs one cublasLtMatmul.
 *
 * Column-major, as cuBLAS: C [m x n] (ldc) = op(A) [m x k] * op(B) [k x n]
 * (+ beta * C). The workspace is the thread's own (GEMM_LT_WS bytes, allocated
 * at the first call): a thread's GEMMs must not run on two streams at once
 * (each backend has one stream and, with tensor parallelism, its own thread).
 * C++ (nvcc) only. */
#ifndef AWQD_CUDA_GEMM_LT_H
#define AWQD_CUDA_GEMM_LT_H

#include <stddef.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define GEMM_LT_WS (4u << 20)

/* 0, or a negative errno with a message naming the call in err. */
int gemm_lt_f16(cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc,
                char *err, size_t errlen);

/* Frees the calling thread's handle, cache and workspace (at backend teardown;
 * the next call starts again). */
void gemm_lt_thread_free(void);

#endif
