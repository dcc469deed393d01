/* bench_stubs.c — benchmarks whose code is not built in this binary. */
#include "engine/bench.h"
#include "server/cmd.h"

#ifndef AWQD_CUDA
int bench_kernels(int argc, char **argv) {
    return cmd_not_built("bench kernels", "this build has no CUDA backend: build with nvcc present or CUDA=1");
}
int bench_chain(int argc, char **argv) {
    return cmd_not_built("bench chain", "this build has no CUDA backend: build with nvcc present or CUDA=1");
}
#endif
