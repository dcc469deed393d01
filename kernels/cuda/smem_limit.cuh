/* smem_limit.cuh — raising a kernel's dynamic shared-memory limit, once per
 * device (C++ / nvcc sources only).
 *
 *     static std::atomic<unsigned long long> set{0};
 *     int rc = cuda_smem_limit_once(&set, (const void *)my_kernel, bytes, err, errlen);
 *
 * cudaFuncSetAttribute is per device, and tensor-parallel ranks call from one
 * thread per device, so each kernel keeps a bit per device id that already
 * has the limit (setting it twice is harmless; the mask only saves driver
 * calls on the hot path). The limit is clamped to the device's opt-in
 * maximum (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on H100/H200,
 * 163 KB on A100, 99 KB on sm_89): callers ask for the most any of their
 * plans could use and keep each launch within the device's maximum. Returns
 * 0 or a negative errno with a message in err (CUDA_CHECK). */
#ifndef AWQD_SMEM_LIMIT_CUH
#define AWQD_SMEM_LIMIT_CUH

#include <atomic>

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

static inline int cuda_smem_limit_once(std::atomic<unsigned long long> *done, const void *fn,
                                       int bytes, char *err, size_t errlen) {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev), err, errlen);
    const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
    if (bit && (done->load(std::memory_order_acquire) & bit)) return 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err,
               errlen);
    if (optin > 0 && bytes > optin) bytes = optin;
    CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), err,
               errlen);
    if (bit) done->fetch_or(bit, std::memory_order_release);
    return 0;
}

#endif
