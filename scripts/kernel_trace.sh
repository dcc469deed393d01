#!/usr/bin/env bash
# kernel_trace.sh — a kernel timeline of any awqd command on the GPU machine:
# builds scripts/kernel_trace.c against the toolkit's CUPTI, runs the
# command under it, demangles the names and summarizes the last decode step
# (scripts/kernel_trace_step.py). Example (batch-1 decode, graphs replayed):
#   scripts/kernel_trace.sh ./build-gpu/awqd bench e2e --model /dev/shm/q8 \
#       --prompts none --batches 1 --contexts 512 --steps 8
# env: OUT (default /tmp/kernel_trace): trace.csv (raw), trace_d.csv
#      (demangled), step.txt (the summary, also printed); CUPTI_TRACE_DEVICE=N
#      keeps device N's kernels only (one rank of a tensor-parallel run).
# The tracing costs ~1 us a graph node at each replay's launch: the gap before
# a step's first kernel (and the ranks' skew at its first all-reduce) is the
# trace's, not the engine's (docs/PERFORMANCE.md "Session 56" item 6); the
# kernels' times and end increments inside a step are not affected.
set -eu
OUT=${OUT:-/tmp/kernel_trace}
mkdir -p "$OUT"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
INC=$(dirname "$(find "$CUDA_HOME/" -name cupti.h 2>/dev/null | head -1)")
LIB=$(dirname "$(find "$CUDA_HOME/" -name 'libcupti.so' 2>/dev/null | head -1)")
[ -f "$INC/cupti.h" ] && [ -n "$LIB" ] || { echo "kernel_trace: no CUPTI under $CUDA_HOME" >&2; exit 2; }
KREC=$(grep -ho 'CUpti_ActivityKernel[0-9]*' "$INC/cupti_activity.h" | sort -V | tail -1)
D=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -shared -fPIC -DKREC="$KREC" -I"$INC" -o "$OUT/libkernel_trace.so" "$D/kernel_trace.c" \
    -L"$LIB" -lcupti -Wl,-rpath,"$LIB"
CUPTI_TRACE_OUT="$OUT/trace.csv" LD_PRELOAD="$OUT/libkernel_trace.so" "$@"
"$CUDA_HOME/bin/cu++filt" < "$OUT/trace.csv" > "$OUT/trace_d.csv"
python3 "$D/kernel_trace_step.py" "$OUT/trace_d.csv" | tee "$OUT/step.txt"
