/* cuda_check.h — one CHECK macro for every CUDA runtime and cuBLAS call.
 *
 * Usage (in a function returning int, with `char *err, size_t errlen` in scope
 * or NULL/0):
 *     CUDA_CHECK(cudaMalloc(&p, n), err, errlen);       // returns -EIO on failure
 *     CUBLAS_CHECK(cublasGemmEx(...), err, errlen);
 * On failure the message "cudaMalloc(&p, n) failed at kernels/cuda/x.cu:42:
 * out of memory" is written into err (and logged at ERROR level) and the
 * enclosing function returns a negative errno (-ENOMEM for out-of-memory,
 * -EIO otherwise). CUDA_CHECK_LAUNCH() checks cudaGetLastError after a <<<>>>.
 * For code that cannot fail (tests, benchmarks' setup) CUDA_CHECK_ABORT aborts
 * with the same message. Usable from C and C++ (nvcc) sources. */
#ifndef AWQD_CUDA_CHECK_H
#define AWQD_CUDA_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "engine/util.h"
#ifdef __cplusplus
}
#endif

#define CUDA_CHECK_RC_(e) ((e) == cudaErrorMemoryAllocation ? -ENOMEM : -EIO)

#define CUDA_CHECK(call, err, errlen)                                                  \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            log_error("%s failed at %s:%d: %s", #call, __FILE__, __LINE__,             \
                      cudaGetErrorString(e_));                                         \
            return util_err((err), (errlen), CUDA_CHECK_RC_(e_), "%s failed at %s:%d: %s", \
                            #call, __FILE__, __LINE__, cudaGetErrorString(e_));        \
        }                                                                              \
    } while (0)

#define CUDA_CHECK_LAUNCH(err, errlen) CUDA_CHECK(cudaGetLastError(), err, errlen)

#define CUDA_CHECK_ABORT(call)                                                         \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__,     \
                    cudaGetErrorString(e_));                                           \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* cuBLAS: include <cublas_v2.h> before this header to get CUBLAS_CHECK. */
#ifdef CUBLAS_V2_H_
#define CUBLAS_CHECK(call, err, errlen)                                                \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
            log_error("%s failed at %s:%d: cublas status %d", #call, __FILE__,         \
                      __LINE__, (int)s_);                                              \
            return util_err((err), (errlen),                                           \
                            s_ == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO,         \
                            "%s failed at %s:%d: cublas status %d", #call, __FILE__,   \
                            __LINE__, (int)s_);                                        \
        }                                                                              \
    } while (0)
#define CUBLAS_CHECK_ABORT(call)                                                       \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
            fprintf(stderr, "%s failed at %s:%d: cublas status %d\n", #call, __FILE__, \
                    __LINE__, (int)s_);                                                \
            abort();                                                                   \
        }                                                                              \
    } while (0)
#endif

#endif
