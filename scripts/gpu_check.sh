#!/usr/bin/env bash
# gpu_check.sh — issues #5/#6 on one GPU in one call: build, the GPU tests,
# the W4A16 kernel benchmark, a synthetic Qwen3-8B through `awqd bench e2e`,
# and `awqd serve` under scripts/loadtest.sh (one greedy client, then 64
# clients at temperature 1.0). Each phase runs only when enough of LIMIT is
# left, so a device call never ends without its summary.
#
#   source .deps/env.sh && scripts/gpu_check.sh          (on the GPU machine)
#
# env: OUT (logs; default /tmp/gpu_check), BUILD (default build-gpu),
#      LIMIT (seconds this script may take, default 540),
#      PHASES (default "build tests kernels e2e serve"; also "audit": the
#      decode-size dispatch's picks against the alternatives, back to back),
#      CUDA (default 1; CUDA=0 dry-runs the build and serve phases on the
#      CPU backend), MODEL (a checkpoint to use instead of making one:
#      e.g. a fixture for a CPU dry run), PRESET (mkmodel preset, default
#      qwen3-8b), TESTS (awqd-test-gpu filters, default: all),
#      AWQD_TOKENIZER_DIR (tokenizers for mkmodel; default .device/tok, which
#      holds qwen3/),
#      E2E_ARGS (extra `bench e2e` arguments), LOAD_N (requests per load
#      test, default 128), PORT (default 8100).
# Logs under $OUT: build.log test.log kernels.txt audit.txt e2e.txt serve.log load.txt
# summary.txt.
# Through the device tool: point OUT below the tool's $OUT and tar it at the
# end (only a handful of files come back per call), carry only the .device
# folders the run needs (64 MiB in all), e.g.
#   OUT=$OUT/gc LIMIT=560 scripts/gpu_check.sh >$OUT/log 2>&1; tar czf $OUT/gc.tgz -C $OUT gc
set -u
OUT=${OUT:-/tmp/gpu_check}
BUILD=${BUILD:-build-gpu}
LIMIT=${LIMIT:-540}
PHASES=${PHASES:-build tests kernels e2e serve}
CUDA=${CUDA:-1}
PRESET=${PRESET:-qwen3-8b}
TESTS=${TESTS:-}
E2E_ARGS=${E2E_ARGS:-}
LOAD_N=${LOAD_N:-128}
PORT=${PORT:-8100}
export AWQD_TOKENIZER_DIR=${AWQD_TOKENIZER_DIR:-$PWD/.device/tok} # holds qwen3/
export AWQD_FIXTURES=${AWQD_FIXTURES:-$PWD/.device/fixtures}
mkdir -p "$OUT"
. "$(dirname "$0")/check_lib.sh" # T0, SUM, say, left, has, run

say "host: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no GPU'); $(nproc) CPUs; commit $(git rev-parse --short HEAD 2>/dev/null) + working tree"
BIN=$BUILD/awqd
export AWQD_BIN=${AWQD_BIN:-$PWD/$BIN} # the binary the tests run
BACKEND=cuda
[ "$CUDA" = 0 ] && BACKEND=cpu

# 1. build (the GPU test binary only with CUDA)
if has build; then
    targets="$BIN"
    [ "$CUDA" = 0 ] || targets="$targets $BUILD/awqd-test-gpu"
    extra=""
    [ "$CUDA" = 0 ] || extra="CUDA_ARCHS=${CUDA_ARCHS:-90a}"
    run build 60 "$OUT/build.log" make -j"$(nproc)" BUILD="$BUILD" CUDA="$CUDA" $extra $targets ||
        { say "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 3; }
fi

# 2. the model checkpoint, made in the background while the tests run
M=${MODEL:-}
MK_PID=
if [ -z "$M" ] && { has e2e || has serve; }; then
    M=/dev/shm/awqd-$PRESET
    [ -d /dev/shm ] || M=/tmp/awqd-$PRESET
    if [ ! -f "$M/config.json" ]; then
        "$BIN" mkmodel "$PRESET" "$M" >"$OUT/mkmodel.log" 2>&1 &
        MK_PID=$!
    fi
fi
wait_model() {
    if [ -n "$MK_PID" ]; then
        wait "$MK_PID"
        say "mkmodel $PRESET rc=$? ($(du -sh "$M" 2>/dev/null | cut -f1))"
        MK_PID=
    fi
}

# 3. every GPU test (kernels against the CPU reference, the model against
#    the fixtures' transformers logits, graphs, sampling, tp tests skip on
#    one GPU)
if has tests && [ "$CUDA" != 0 ]; then
    AWQD_TEST_TIMEOUT=300 run tests 90 "$OUT/test.log" "$BUILD/awqd-test-gpu" $TESTS
    grep -E " FAIL|passed|\.c:[0-9]+:" "$OUT/test.log" | grep -v " \.\.\.$" | tail -40 >>"$SUM"
fi

# 4. W4A16 kernels: back to back and single cold calls against cuBLAS FP16
#    and the copy rate, the Qwen3-8B shapes
if has kernels && [ "$CUDA" != 0 ]; then
    run kernels 60 "$OUT/kernels.txt" "$BIN" bench kernels --reps 20 \
        --m 1,2,4,8,16,32,64,128,256,512,1024,2048,4096
    grep -E "^\||copy|cuBLAS" "$OUT/kernels.txt" | head -120 >>"$SUM"
fi

# 4b. the decode-size dispatch audited (phase "audit", not in the default
#     PHASES): on the Qwen3-8B / 32B / Llama-3-70B shapes and their tp
#     shards at M = 1-16, back to back, the dispatch's pick against the
#     decode kernel forced and against the dispatch without it, in one
#     process; points where the pick is > 3% slower are marked SLOW
if has audit && [ "$CUDA" != 0 ]; then
    run audit 60 "$OUT/audit.txt" "$BIN" bench kernels --b2b-only --b2b-audit --set all \
        --b2b-m 1,2,3,4,5,6,7,8,9,10,12,14,16
    grep -E "SLOW|^audit:" "$OUT/audit.txt" >>"$SUM"
fi

# 5. the whole model: decode tok/s, TTFT, memory (as the scheduler samples;
#    `bench e2e` is CUDA-only)
if has e2e && [ "$CUDA" != 0 ]; then
    wait_model
    run e2e 90 "$OUT/e2e.txt" "$BIN" bench e2e --model "$M" $E2E_ARGS
    grep -vE "^\s*$" "$OUT/e2e.txt" | tail -60 >>"$SUM"
    # prefill without the dequantize + cuBLAS column slabs (the INT4 wgmma
    # GEMM instead) against the default above
    AWQD_W4A16_SLABS=0 run "e2e ttft no slabs" 60 "$OUT/e2e_slabs.txt" "$BIN" bench e2e --model "$M" \
        --batches none
    grep -E "^\| [0-9]" "$OUT/e2e_slabs.txt" | head -5 >>"$SUM"
fi

# 6. served: one greedy client (the model's own batch-1 rate), then 64
#    clients at temperature 1.0 (the GPU sampling path under load)
if has serve; then
    wait_model
    if [ "$(left)" -lt 90 ]; then
        say "SKIP serve ($(left)s left, needs 90s)"
    else
        "$BIN" serve --model "$M" --backend "$BACKEND" --port "$PORT" --max-num-seqs 64 \
            >"$OUT/serve.log" 2>&1 &
        pid=$!
        for _ in $(seq 1 240); do
            curl -sf "localhost:$PORT/health" >/dev/null && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        say "serve ready after $(($(date +%s) - T0))s: $(grep -E 'weights|workspace|KV cache' "$OUT/serve.log" | head -3 | tr -s ' ' | tr '\n' ';')"
        ids=""
        [ -f "$M/tokenizer.json" ] || ids=-I
        run "load 1 client t=0" 30 "$OUT/load.txt" scripts/loadtest.sh -u "http://127.0.0.1:$PORT" \
            -c 1 -n 4 -m 256 -t 0 -p 32 -s 0 $ids
        run "load 64 clients t=1" 60 "$OUT/load.txt" scripts/loadtest.sh -u "http://127.0.0.1:$PORT" \
            -c 64 -n "$LOAD_N" -m 128 -t 1.0 -p 128 $ids
        grep -E "^RESULT|^===" "$OUT/load.txt" >>"$SUM"
        curl -s "localhost:$PORT/metrics" | grep -E "^awqd:kv_cache_blocks_used|^awqd:requests" >>"$SUM"
        kill -TERM "$pid"
        wait "$pid"
        say "serve exit=$? (0 = clean drain)"
    fi
fi
wait_model
say "done"
echo "----- summary -----"
cat "$SUM"
