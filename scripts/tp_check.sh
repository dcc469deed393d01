#!/usr/bin/env bash
# tp_check.sh — issue #7 on a multi-GPU host (4x H200 here): build, the tensor-
# parallel GPU tests, full-size synthetic checkpoints checked at tp=2/4 against
# tp=1, a fault injected at tp=4, and the benchmarks (all-reduce per message
# size, decode step at batch 1 and 32 with the all-reduce share).
#
#   source .deps/env.sh && scripts/tp_check.sh          (on the GPU machine)
#
# env: OUT (logs; default /tmp/tp_check), BUILD (default build-gpu),
#      MODELS (checkpoint dir; default /dev/shm/awqd-tp when it has room, else
#      /tmp/awqd-tp), LIMIT (seconds this script may take, default 540: later
#      phases are skipped when less than they need is left),
#      PHASES (default "build tests bench_ar e2e check fault graphs"),
#      E2E_PLAN (the e2e phase's model/tp pairs, default "q1 q2 q4 l2 l4"),
#      AWQD_TOKENIZER_DIR (default .device/tp/tok); for dry runs: QP / LP (the
#      two presets, default qwen3-32b / llama3-70b), MKARGS (extra mkmodel
#      arguments, e.g. --layers 2), MKBIN (an awqd to run mkmodel with instead
#      of a CPU-only build made here).
# Logs under $OUT: build.log mkmodel.log test.log bench_ar.log e2e.log
# check.log summary.txt.
# Through the device tool: point OUT below the tool's $OUT and tar it at the
# end (only a handful of files come back per call), carry only the .device
# folders the run needs (64 MiB in all), e.g.
#   OUT=$OUT/gc LIMIT=560 scripts/gpu_check.sh >$OUT/log 2>&1; tar czf $OUT/gc.tgz -C $OUT gc
# Timing seen on 4x H200 (2026-11-21): build 17 s, tests 63 s, all-reduce
# benches 5 s, mkmodel (background) 55 s, but model loads of 11-75 s each
# (qwen3-32b tp=1 47 s, llama3-70b tp=2 75 s; --comm-off loads twice): the
# whole plan needs about 700 s, more than one device call (600 s), so run it
# as two calls on the same warm machine (the checkpoints stay on its tmpfs):
# LIMIT=575 PHASES="build tests bench_ar check" (395 s on 2026-11-22), then
# LIMIT=575 PHASES="e2e fault graphs".
set -u
OUT=${OUT:-/tmp/tp_check}
BUILD=${BUILD:-build-gpu}
LIMIT=${LIMIT:-540}
PHASES=${PHASES:-build tests bench_ar e2e check fault graphs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 # never NVLink multicast on shared hosts
export AWQD_TOKENIZER_DIR=${AWQD_TOKENIZER_DIR:-$PWD/.device/tp/tok}
export AWQD_FIXTURES=${AWQD_FIXTURES:-$PWD/.device/tp/fixtures}
export AWQD_BIN=$PWD/$BUILD/awqd
export AWQD_COMM_TIMEOUT_MS=${AWQD_COMM_TIMEOUT_MS:-15000} # a broken p2p wait ends soon
NCPU=$(nproc)
. "$(dirname "$0")/check_lib.sh" # T0, SUM, say, left, has, run

say "host: $(nvidia-smi -L 2>/dev/null | wc -l) GPUs, $NCPU CPUs; commit $(git rev-parse --short HEAD 2>/dev/null) + working tree"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >>"$SUM" 2>&1
nvidia-smi topo -m 2>/dev/null | head -6 >>"$SUM"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

# the checkpoints (~56 GB) in memory, not on a disk of unknown speed: a tmpfs
# of our own when we may mount one (root), else /dev/shm when it is big
# enough, else /tmp
if [ -z "${MODELS:-}" ]; then
    MODELS=/tmp/awqd-tp
    mkdir -p "$MODELS"
    if mountpoint -q "$MODELS"; then
        : # mounted by an earlier run on this machine: the models may be there
    elif [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=120G tmpfs "$MODELS" 2>/dev/null; then
        :
    else
        shm=$(df -B1G --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
        if [ "${shm:-0}" -gt 80 ]; then MODELS=/dev/shm/awqd-tp; fi
    fi
fi
mkdir -p "$MODELS"
say "checkpoints in $MODELS: $(df -h --output=fstype,size,avail "$MODELS" | tail -1)"
QP=${QP:-qwen3-32b}
LP=${LP:-llama3-70b}
MKARGS=${MKARGS:-}
Q=$MODELS/$QP
L=$MODELS/$LP

# 1. synthetic checkpoints, made in the background by a CPU-only build while
#    the CUDA build runs (mkmodel needs no GPU)
MK_PID=
if has e2e || has check || has fault; then
    (
        mk=${MKBIN:-./build-tpcpu/awqd}
        if [ -z "${MKBIN:-}" ]; then
            make -j16 BUILD=build-tpcpu CUDA=0 build-tpcpu/awqd >"$OUT/mkmodel.log" 2>&1 || exit 3
        fi
        # ~40 CPU-s per GB written: split the cores ~1:2 (19 GB vs 37 GB)
        th1=$((NCPU * 3 / 8))
        th2=$((NCPU * 5 / 8))
        [ "$th1" -lt 1 ] && th1=1
        [ "$th2" -lt 1 ] && th2=1
        s=$(date +%s)
        [ -f "$Q/config.json" ] || "$mk" mkmodel "$QP" "$Q" --threads "$th1" $MKARGS >>"$OUT/mkmodel.log" 2>&1 &
        p1=$!
        [ -f "$L/config.json" ] || "$mk" mkmodel "$LP" "$L" --threads "$th2" $MKARGS >>"$OUT/mkmodel.log" 2>&1 &
        p2=$!
        wait $p1
        r1=$?
        echo "$QP done rc=$r1 at $(($(date +%s) - s))s ($th1 threads)" >>"$OUT/mkmodel.log"
        wait $p2
        r2=$?
        echo "$LP done rc=$r2 at $(($(date +%s) - s))s ($th2 threads)" >>"$OUT/mkmodel.log"
        du -sh "$Q" "$L" >>"$OUT/mkmodel.log" 2>&1
        [ $r1 -eq 0 ] && [ $r2 -eq 0 ]
    ) &
    MK_PID=$!
fi

# 2. the CUDA build
if has build; then
    run build 60 "$OUT/build.log" make -j"$NCPU" BUILD="$BUILD" CUDA=1 CUDA_ARCHS=90a \
        "$BUILD/awqd" "$BUILD/awqd-test-gpu" || { say "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 3; }
fi
TBIN=$BUILD/awqd-test-gpu

# 3. GPU tests: all-reduce (all paths, eager and graphs, tp 2/3/4), faults
#    (tp=2 and tp=4), fixtures at tp=2, the CLI
T=tp_cuda
if has tests; then
    # the push kernel first: if it fails, the rest of the run uses the older
    # flags kernel (so that the benchmarks still mean something)
    AWQD_TEST_TIMEOUT=60 run "tests push" 40 "$OUT/test.log" "$TBIN" $T.allreduce_p2p_tp2 \
        $T.allreduce_p2p_tp4 $T.allreduce_graph_p2p_tp2 $T.allreduce_graph_p2p_tp4 \
        $T.allreduce_p2p_many_calls
    if grep -q "FAIL" "$OUT/test.log"; then
        export AWQD_ALLREDUCE=p2p_flags
        say "PUSH KERNEL FAILED: the rest runs with AWQD_ALLREDUCE=p2p_flags"
    fi
    AWQD_TEST_TIMEOUT=90 run "tests rest" 60 "$OUT/test.log" "$TBIN" $T.allreduce_nccl_tp2 \
        $T.allreduce_auto_tp2 $T.allreduce_nccl_tp4 $T.allreduce_p2p_tp3 $T.allreduce_p2pflags_tp2 \
        $T.allreduce_graph_auto_tp2 $T.allreduce_graph_nccl_tp2 $T.fault_rank1_p2p \
        $T.fault_rank1_nccl $T.fault_rank2_tp4_p2p $T.p2p_timeout_in_graph $T.fixture_qwen3_tp2 \
        $T.generate_cli
    grep -E "^tp_cuda.* (ok|FAIL|skip) |passed|reported:|prefill max diff|\.c:[0-9]+:" "$OUT/test.log" |
        grep -v " \.\.\.$" >>"$SUM"
fi

# 4. all-reduce per message size, NCCL vs P2P, tp=2 and tp=4
if has bench_ar; then
    for tp in 2 4; do
        [ "$NGPU" -ge $tp ] || continue
        AWQD_TP_BENCH=1 AWQD_TP_BENCH_TP=$tp run "bench_allreduce tp=$tp" 30 "$OUT/bench_ar.log" \
            "$TBIN" tp_cuda.bench_allreduce
    done
    grep -E "^\||^all-reduce" "$OUT/bench_ar.log" >>"$SUM"
fi

wait_models() {
    if [ -n "$MK_PID" ]; then
        say "waiting for mkmodel"
        wait "$MK_PID"
        local rc=$?
        MK_PID=
        say "mkmodel rc=$rc: $(grep -E 'done rc' "$OUT/mkmodel.log" | tr '\n' ' ')"
        tail -3 "$OUT/mkmodel.log" >>"$SUM"
    fi
}

# 5. decode step at batch 1 and 32 (context 512), qwen3-32b tp=1/2/4 and
#    llama3-70b tp=2/4; --comm-off gives the all-reduce time per step
E2E="--batches 1,32 --contexts 512 --prompts none --steps 24 --sampling greedy"
e2e() { # name need model tp [extra...]
    local name=$1 need=$2 m=$3 tp=$4
    shift 4
    [ "$NGPU" -ge "$tp" ] || return 0
    run "$name" "$need" "$OUT/e2e.log" ./"$BUILD"/awqd bench e2e --model "$m" $E2E --tp "$tp" "$@"
}
E2E_PLAN=${E2E_PLAN:-q1 q2 q4 l2 l4} # which (model, tp) pairs: q = $QP, l = $LP
if has e2e; then
    wait_models
    for p in $E2E_PLAN; do
        case $p in
        q1) e2e "e2e $QP tp=1" 40 "$Q" 1 ;;
        q2) e2e "e2e $QP tp=2" 50 "$Q" 2 --comm-off ;;
        q4) e2e "e2e $QP tp=4" 50 "$Q" 4 --comm-off ;;
        l2) e2e "e2e $LP tp=2" 180 "$L" 2 --comm-off ;;
        l4) e2e "e2e $LP tp=4" 150 "$L" 4 --comm-off ;;
        esac
    done
fi

# 6. full checkpoints at tp=2/4 against tp=1 (logits to fp16 tolerance: 2e-2
#    of max|logit| or 1.5x the checkpoint's own noise floor, tp=1 with another
#    prefill kernel vs tp=1; greedy tokens where the margin is clear)
if has check; then
    wait_models
    for m in "$Q" "$L"; do
        AWQD_TP_MODEL=$m AWQD_TP_SIZES=2,4 AWQD_TP_NOISE=1 AWQD_TEST_TIMEOUT=450 run "check $(basename "$m") tp=2,4 vs tp=1" 45 \
            "$OUT/check.log" "$TBIN" tp_cuda.model_dir
    done
    grep -E "prefill max diff|noise floor|FAIL|\.c:[0-9]+:|passed" "$OUT/check.log" >>"$SUM"
fi

# 7. a fault injected on rank 2 of 4 through the CLI: reported with the rank,
#    no hang (the timeout would say 124), a clean non-zero exit
if has fault && [ "$NGPU" -ge 4 ]; then
    wait_models
    for algo in p2p nccl; do
        echo "=== fault: AWQD_FAULT_RANK=2 AWQD_ALLREDUCE=$algo generate --tp 4" >>"$OUT/check.log"
        s=$(date +%s)
        AWQD_FAULT_RANK=2 AWQD_FAULT_CALL=5 AWQD_ALLREDUCE=$algo timeout 90 ./"$BUILD"/awqd generate \
            --model "$Q" --backend cuda --tp 4 --prompt-ids 1,2,3,4,5 --max-tokens 4 --ignore-eos \
            >>"$OUT/check.log" 2>&1
        rc=$?
        msg=$(grep -E "rank 2" "$OUT/check.log" | tail -1)
        say "fault tp=4 rank 2 ($algo): exit $rc after $(($(date +%s) - s))s (124 = hang); message: $msg"
    done
fi

# 8. CUDA graphs off vs on (the default), qwen3-32b tp=1 and tp=2
if has graphs; then
    AWQD_CUDA_GRAPHS=0 e2e "e2e $QP tp=1 graphs off" 40 "$Q" 1
    AWQD_CUDA_GRAPHS=0 e2e "e2e $QP tp=2 graphs off" 40 "$Q" 2
fi

# the e2e tables into the summary
if [ -f "$OUT/e2e.log" ]; then
    grep -E "^===|^\| [0-9]|^all-reduce time|^model " "$OUT/e2e.log" >>"$SUM"
fi
say "done"
echo "----- summary -----"
cat "$SUM"
