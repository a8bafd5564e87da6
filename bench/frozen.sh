#!/bin/bash
# Frozen time of a checkpoint against memory size, memory copied while frozen and after the
# release (--copy-memory frozen|later), in one run (issue 14, "frozen time independent of memory
# size"). The workload is an incompressible heap (bench/workload.c); three checkpoints each, the
# first as soon as the heap is filled. Prints a table and writes it to docs/bench-frozen.md.
#
# Usage: bench/frozen.sh [MIB...]   (default: 256 1024 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(256 1024 4096)
work=$(mktemp -d /var/tmp/ckpt-frozen.XXXXXX)
trap 'pkill -f "$work/workload" 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O2 -o "$work/workload" bench/workload.c
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | awk '{printf "%.0f", $1}'; }

rows=()
for mib in "${sizes[@]}"; do
    for mode in frozen later; do
        d="$work/d-$mib-$mode"
        "$CKPT" launch --dir "$d" --pool "$((mib * 3 / 2))M" --copy-memory "$mode" -- \
            "$work/workload" heap "$mib" rand > "$work/out" 2> "$work/err" &
        for _ in $(seq 1200); do grep -q '^ready' "$work/out" 2>/dev/null && break; sleep 0.1; done
        grep -q '^ready' "$work/out" || { echo "workload not ready: $(cat "$work/err")"; exit 1; }
        frozen=() durable=()
        for i in 1 2 3; do
            json=$("$CKPT" checkpoint --dir "$d" --json)
            frozen+=("$(field frozen_ms <<< "$json")")
            durable+=("$(field durable_ms <<< "$json")")
            sleep 1
        done
        "$CKPT" checkpoint --dir "$d" --kill --json > /dev/null
        wait || true
        rm -rf "$d"
        rows+=("| $mib | $mode | ${frozen[0]} | ${frozen[1]} / ${frozen[2]} | ${durable[0]} / ${durable[1]} / ${durable[2]} |")
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
