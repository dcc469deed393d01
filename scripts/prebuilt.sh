#!/usr/bin/env bash
# prebuilt.sh — CUDA objects built on the dev machine, linked on the GPU machine: a device call
# then spends ~1 s linking instead of ~80 s compiling (the device's time is the scarce one).
#
#   scripts/prebuilt.sh pack [REV ...]     dev machine (nvcc needed, no GPU): builds the working
#       tree and each REV (in a git worktree) for CUDA_ARCHS (default 90a), strips the debug info
#       and writes .device/prebuilt.tar.xz (~7 MB a tree) with one folder per tree: "work" and
#       the REVs as given. Carry .device/prebuilt.tar.xz (and .deps) to the device.
#       With PB_STAMPS=1 also "stamps": the working tree built with -DAWQD_STAMPS (in build-pbst;
#       per-block phase timestamps in the decode kernels, printed at exit: kernels/cuda/stamps.cuh).
#   scripts/prebuilt.sh link [DEST]        GPU machine, after `source .deps/env.sh`: unpacks it
#       and links DEST/NAME/awqd (and DEST/work/awqd-test-gpu); DEST defaults to /tmp/prebuilt.
#       Prints the binaries; a failed link is an error (exit 3).
#
# The link lines are the Makefile's own, with the build folder replaced; the libraries come from
# the machine that links (.deps/env.sh's LIBRARY_PATH, the CUDA toolkit's lib64), which must
# have the ABI of the dev machine's (both CUDA 13 here).
set -eu
cmd=${1:-}
shift || true
ARCHS=${CUDA_ARCHS:-90a}
PACK=.device/prebuilt.tar.xz

# build one tree (cwd) into $B (default build-pb; extra make arguments: $EXTRA) and stage it
# under $1 with its link lines
stage() {
    local dst=$1 log B=${B:-build-pb}
    log=$(mktemp)
    rm -f $B/awqd $B/awqd-test-gpu
    if ! make -j"$(nproc)" CUDA=1 CUDA_ARCHS="$ARCHS" BUILD=$B ${EXTRA:+"$EXTRA"} $B/awqd $B/awqd-test-gpu >"$log" 2>&1; then
        # an older tree may have no GPU test binary
        rm -f $B/awqd
        make -j"$(nproc)" CUDA=1 CUDA_ARCHS="$ARCHS" BUILD=$B ${EXTRA:+"$EXTRA"} $B/awqd >"$log" 2>&1 || {
            tail -20 "$log" >&2
            echo "prebuilt.sh: build failed in $(pwd)" >&2
            exit 3
        }
    fi
    mkdir -p "$dst"
    cp -r $B/obj "$dst/"
    [ -d $B/llhttp ] && cp -r $B/llhttp "$dst/"
    grep -E "^\S+ +-o $B/awqd " "$log" | tail -1 | sed "s#$B/#@B@/#g" >"$dst/link-awqd.txt"
    grep -E "^\S+ +-o $B/awqd-test-gpu " "$log" | tail -1 | sed "s#$B/#@B@/#g" >"$dst/link-test.txt" || true
    [ -s "$dst/link-awqd.txt" ] || { echo "prebuilt.sh: no link line for awqd in $(pwd)" >&2; exit 3; }
    find "$dst" -name '*.d' -delete
    find "$dst" -name '*.o' -exec strip --strip-debug {} +
    rm -f "$log"
}

case $cmd in
pack)
    top=$(git rev-parse --show-toplevel)
    cd "$top"
    tmp=$(mktemp -d)
    stage "$tmp/work"
    if [ "${PB_STAMPS:-0}" = 1 ]; then
        B=build-pbst EXTRA="NVCCFLAGS=-O3 -lineinfo -DAWQD_STAMPS" stage "$tmp/stamps"
    fi
    for rev in "$@"; do
        wt=$(mktemp -d)
        git worktree add -f -q --detach "$wt" "$rev"
        (cd "$wt" && stage "$tmp/$rev")
        git worktree remove --force "$wt"
    done
    mkdir -p .device
    tar cJf "$PACK" -C "$tmp" .
    rm -rf "$tmp"
    ls -l "$PACK"
    ;;
link)
    dest=${1:-/tmp/prebuilt}
    rm -rf "$dest"
    mkdir -p "$dest"
    tar xJf "$PACK" -C "$dest"
    for d in "$dest"/*/; do
        d=${d%/}
        for f in link-awqd.txt link-test.txt; do
            [ -s "$d/$f" ] || continue
            line=$(cat "$d/$f")
            (cd "$d" && eval "${line//@B@/.}") || { echo "prebuilt.sh: link failed in $d ($f)" >&2; exit 3; }
        done
        ls "$d"/awqd "$d"/awqd-test-gpu 2>/dev/null || true
    done
    ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
