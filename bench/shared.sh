#!/bin/bash
# Frozen time of a checkpoint of a job whose memory is shared between its two processes, beside
# the same job with that memory private (issue 37, item 2: "a job with 4 GiB of shared memory
# freezes about as briefly as one with 4 GiB of private memory"). The workload
# (bench/workload.c, mode shared) fills MIB MiB of incompressible memory, private, shared
# anonymous (MAP_SHARED|MAP_ANONYMOUS) or POSIX shared memory (/dev/shm), and rewrites 1 MiB of
# it every 125 ms; three checkpoints each, the first as soon as the memory is filled. With
# CKPT_BEFORE=PATH (a ckpt built before the change), the shared kinds are measured with it too,
# in the same run. Prints a table and writes it to docs/bench-shared.md.
#
# Usage: bench/shared.sh [MIB...]   (default: 1024 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
BEFORE=${CKPT_BEFORE:-}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1024 4096)
. bench/lib.sh
workload_dir shared
trap 'pkill -f "$work/workload" 2>/dev/null || true; rm -rf "$work"; rm -f /dev/shm/ckpt-bench-*' EXIT

rows=()
run() {
    local bin=$1 label=$2 mib=$3 kind=$4 d="$work/d-$2-$3-$4"
    rm -f "$work/out"
    "$bin" launch --dir "$d" --pool "$((mib * 3 / 2))M" -- "$work/workload" shared "$mib" "$kind" > "$work/out" 2> "$work/err" &
    wait_line "$work/out" ready "the workload (log: $work/err)"
    local frozen durable ahead
    { read -r frozen; read -r durable; read -r ahead; } < <(CKPT=$bin checkpoints "$d" 3 frozen_ms durable_ms copied_ahead_bytes)
    wait || true
    rm -rf "$d"
    rm -f /dev/shm/ckpt-bench-*
    local mib_ahead
    mib_ahead=$(tr '/' '\n' <<< "$ahead" | awk '{ printf "%s%d", sep, $1 / 1048576; sep = " / " }')
    rows+=("| $mib | $kind | $label | ${frozen%% / *} | ${frozen#* / } | $durable | $mib_ahead |")
}
for mib in "${sizes[@]}"; do
    for kind in private anon posix; do
        run "$CKPT" this "$mib" "$kind"
        if [ -n "$BEFORE" ] && [ "$kind" != private ]; then
            run "$BEFORE" before "$mib" "$kind"
        fi
    done
done

table=$(printf '%s\n' "| MiB | memory | ckpt | frozen ms, first checkpoint | frozen ms, later ones | durable ms (3 checkpoints) | MiB copied before the freeze |" \
    "|---|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Frozen time with shared memory ($(date -u +%F), incompressible memory, $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/shared.sh ${sizes[*]}\`${BEFORE:+ with CKPT_BEFORE set to a ckpt built before shared memory was copied ahead}."
    echo "Two processes; the memory private to one (anonymous), or shared by both: \`anon\`"
    echo "MAP_SHARED|MAP_ANONYMOUS, \`posix\` a file under /dev/shm. 1 MiB of it rewritten every"
    echo "125 ms. Frozen: from the freeze to the release, as \`ckpt checkpoint --json\` reports it;"
    echo "durable: until the checkpoint is on disk."
    echo
    echo "$table"
} > docs/bench-shared.md
