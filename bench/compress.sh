#!/bin/bash
# Checkpoint time of an incompressible and a compressible heap with and without zstd, in one run
# (issue 14, "compression that pays"): durable ms and stored bytes from `ckpt checkpoint --json`.
# Prints a table and writes it to docs/bench-compress.md.
#
# Usage: bench/compress.sh [MIB=1024] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
MIB=${1:-1024}
ROUNDS=${2:-3}
work=$(mktemp -d /var/tmp/ckpt-compress.XXXXXX)
trap 'pkill -f "$work/workload" 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O2 -o "$work/workload" bench/workload.c
rows=()
for kind in rand comp; do
    for codec in none zstd:1 zstd:3; do
        d="$work/$kind-$codec"
        "$CKPT" launch --dir "$d" --pool "$((MIB * 3 / 2))M" --compress "$codec" -- "$work/workload" heap "$MIB" "$kind" \
            > "$d.out" 2> "$d.err" &
        for _ in $(seq 600); do grep -q '^ready' "$d.out" 2>/dev/null && break; sleep 0.1; done
        sleep 2 # the pool faulted in
        for r in $(seq "$ROUNDS"); do
            j=$("$CKPT" checkpoint --dir "$d" --json)
            durable=$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["durable_ms"]))')
            frozen=$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["frozen_ms"]))')
            stored=$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_stored"] >> 20)')
            rows+=("| $kind | $codec | $r | $frozen | $durable | $stored |")
        done
        "$CKPT" checkpoint --dir "$d" --kill > /dev/null
        wait || true
    done
done
table=$(printf '%s\n' "| heap | codec | round | frozen ms | durable ms | stored MiB |" "|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Compression against none ($(date -u +%F), heap $MIB MiB)"
    echo
    echo "Produced by \`bench/compress.sh $MIB $ROUNDS\`."
    echo
    echo "$table"
} > docs/bench-compress.md
