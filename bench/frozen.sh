#!/bin/bash
# Frozen time of a checkpoint against memory size, memory copied while frozen, after the
# release and before the freeze (--copy-memory frozen|later|ahead), in one run (issue 14, "frozen
# time independent of memory size"). The workload is an incompressible heap (bench/workload.c); three checkpoints each, the
# first as soon as the heap is filled. Prints a table and writes it to docs/bench-frozen.md.
#
# Usage: bench/frozen.sh [MIB...]   (default: 256 1024 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(256 1024 4096)
. bench/lib.sh
workload_dir frozen

rows=()
for mib in "${sizes[@]}"; do
    for mode in frozen later ahead; do
        d="$work/d-$mib-$mode"
        # A fresh file: the last job's "ready" must not be taken for this one's.
        rm -f "$work/out"
        "$CKPT" launch --dir "$d" --pool "$((mib * 3 / 2))M" --copy-memory "$mode" -- \
            "$work/workload" heap "$mib" rand > "$work/out" 2> "$work/err" &
        wait_line "$work/out" ready "the workload (log: $work/err)"
        { read -r frozen; read -r durable; } < <(checkpoints "$d" 3 frozen_ms durable_ms)
        wait || true
        rm -rf "$d"
        rows+=("| $mib | $mode | ${frozen%% / *} | ${frozen#* / } | $durable |")
    done
done

table=$(printf '%s\n' "| heap MiB | --copy-memory | frozen ms, first checkpoint | frozen ms, later ones | durable ms (3 checkpoints) |" \
    "|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Frozen time against memory size ($(date -u +%F), incompressible heap, $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/frozen.sh ${sizes[*]}\`. Frozen: from the freeze to the release, as"
    echo "\`ckpt checkpoint --json\` reports it; durable: until the checkpoint is on disk."
    echo
    echo "$table"
} > docs/bench-frozen.md
