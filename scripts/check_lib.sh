# check_lib.sh — shared by scripts/gpu_check.sh and scripts/tp_check.sh
# (sourced, not run): the phase and time-budget helpers of a device call.
# Needs OUT, LIMIT (seconds the calling script may take) and PHASES set; sets
# T0 and SUM ($OUT/summary.txt, emptied).
T0=$(date +%s)
SUM=$OUT/summary.txt
: >"$SUM"
# say MSG: MSG with the seconds since the start, to stdout and the summary
say() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$SUM"; }
# left: seconds of LIMIT left
left() { echo $((LIMIT - ($(date +%s) - T0))); }
# has PHASE: whether PHASES names it
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
# run NAME NEED_S LOG CMD...: CMD with a timeout of what is left (minus a
# margin) when at least NEED_S seconds are left, appending to LOG; 99 when
# skipped
run() {
    local name=$1 need=$2 log=$3
    shift 3
    local l
    l=$(left)
    if [ "$l" -lt "$need" ]; then
        say "SKIP $name (${l}s left, needs ${need}s)"
        return 99
    fi
    echo "=== $name: $*" >>"$log"
    timeout $((l - 8)) "$@" >>"$log" 2>&1
    local rc=$?
    say "$name rc=$rc"
    return $rc
}
