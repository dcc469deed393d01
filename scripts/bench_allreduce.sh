#!/usr/bin/env bash
# bench_allreduce.sh — NCCL vs the one-shot P2P all-reduces (the "push"
# kernel, the default, and the older "flags" kernel) per message size (4 KB ..
# 1 MB fp16) at tp=2 and tp=4 (as many GPUs as there are), each timed eagerly
# (back-to-back calls, launch included) and inside a CUDA graph (32 calls
# captured, replayed: the GPU-side cost); then the batch-1 decode step time of
# a synthetic qwen3-32b (mkmodel --layers L) at tp=1/2/4 (for the full model
# and the all-reduce share use `awqd bench e2e --tp N --comm-off`, as
# scripts/tp_check.sh does). GPU machine only; see docs/TENSOR_PARALLEL.md.
#
#   scripts/bench_allreduce.sh [BUILD_DIR]        (default build)
#   env: LAYERS=8 (decode model depth), AWQD_TOKENIZER_DIR (for mkmodel),
#        SKIP_DECODE=1, AWQD_FIXTURES
set -euo pipefail
BUILD=${1:-build}
BIN=$BUILD/awqd-test-gpu
[ -x "$BIN" ] || { echo "build first: make BUILD=$BUILD CUDA=1 $BIN"; exit 2; }
export NCCL_NVLS_ENABLE=0         # never NVLink multicast on shared hosts
export AWQD_BIN=${AWQD_BIN:-$(pwd)/$BUILD/awqd}
export AWQD_TP_BENCH=1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "GPUs: $ngpu"
nvidia-smi topo -m 2>/dev/null || true
for tp in 2 4; do
    if [ "$ngpu" -ge "$tp" ]; then
        AWQD_TP_BENCH_TP=$tp "$BIN" tp_cuda.bench_allreduce
    fi
done
if [ -z "${SKIP_DECODE:-}" ]; then
    AWQD_TP_BENCH_LAYERS=${LAYERS:-8} "$BIN" tp_cuda.bench_decode
fi
