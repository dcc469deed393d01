/* bench.h — benchmarks run by `awqd bench WHAT` (engine/cmd_bench.c). Each
 * takes argv with argv[0] = its name and returns an exit status.
 *   bench_kernels    kernels/cuda/ (CUDA builds); engine/bench_stubs.c otherwise
 *   bench_chain      kernels/cuda/bench_chain.cu (CUDA builds); the same stubs otherwise
 *   bench_e2e        engine/bench_e2e.c
 *   bench_tokenizer  engine/bench_tokenizer.c */
#ifndef AWQD_BENCH_H
#define AWQD_BENCH_H

int bench_kernels(int argc, char **argv);
int bench_chain(int argc, char **argv);
int bench_e2e(int argc, char **argv);
int bench_tokenizer(int argc, char **argv);

#endif
