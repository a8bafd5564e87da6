#!/bin/bash
# Incremental generations (issue 14, step 3): bytes stored and frozen time of a full generation
# and of the incremental ones after it, for a program that rewrites one sixteenth of its heap
# at a time (tests/progs/slicewrite.c), against the same job with every generation whole
# (--full-every 1), in one run. Four checkpoints a second apart each. Prints a table and writes
# it to docs/bench-incremental.md.
#
# Usage: bench/incremental.sh [MIB]   (default: 1024; a multiple of 16)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
mib=${1:-1024}
make -s -C tests/progs bin/slicewrite 2>/dev/null
work=$(mktemp -d /var/tmp/ckpt-incremental.XXXXXX)
trap 'pkill -f "slicewrite 600" 2>/dev/null || true; rm -rf "$work"' EXIT
. bench/lib.sh

rows=()
for every in 1 8; do
    d="$work/d-$every"
    # A fresh file: the last job's START must not be taken for this one's.
    rm -f "$work/out"
    "$CKPT" launch --dir "$d" --pool "$((mib * 3 / 2))M" --full-every "$every" --keep 8 -- \
        tests/progs/bin/slicewrite 600 "$mib" > "$work/out" 2> "$work/err" &
    wait_line "$work/out" START "slicewrite (log: $work/err)"
    { read -r stored; read -r frozen; read -r durable; } < <(checkpoints "$d" 4 bytes_stored frozen_ms durable_ms)
    stored=$(tr ' ' '\n' <<< "$stored" | awk '$1 ~ /^[0-9]+$/ {$1 = int($1 / 1048576)} {printf "%s ", $1}' | sed 's/ $//')
    wait || true
    rm -rf "$d"
    rows+=("| $every | $stored | $frozen | $durable |")
done

table=$(printf '%s\n' "| --full-every | MiB stored (4 checkpoints) | frozen ms | durable ms |" "|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Incremental generations ($(date -u +%F), $mib MiB incompressible heap, $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/incremental.sh $mib\`: tests/progs/slicewrite rewrites one 1 MiB block"
    echo "of the current sixteenth of its heap every 10 ms and moves to the next sixteenth every"
    echo "1.5 s; four checkpoints a second apart. \`--full-every 1\` stores every generation whole,"
    echo "\`--full-every 8\` (the default) the first whole and then what changed. Frozen: from the"
    echo "freeze to the release; durable: until the generation is committed (\`ckpt checkpoint --json\`)."
    echo
    echo "$table"
} > docs/bench-incremental.md
