#!/bin/bash
# Restart-to-running of an incompressible heap, page cache dropped before each run, next to a
# cold read of the same image files in the same run (issue 14, "eager restart at the disk's
# speed"). Needs root (drop_caches). Prints a table and writes it to docs/bench-restart.md.
#
# Usage: bench/restart.sh [MIB=1024] [ROUNDS=3] [extra ckpt restart options...]
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
MIB=${1:-1024}
ROUNDS=${2:-3}
shift 2 || true
work=$(mktemp -d /var/tmp/ckpt-restart.XXXXXX)
trap 'pkill -f "$work/workload" 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O2 -o "$work/workload" bench/workload.c
ms() { echo $(( ($2 - $1) / 1000000 )); }
now() { date +%s%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

"$CKPT" launch --dir "$work/d" --pool "$((MIB * 3 / 2))M" -- "$work/workload" heap "$MIB" rand \
    > "$work/out" 2> "$work/err" &
for _ in $(seq 600); do grep -q '^ready' "$work/out" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready' "$work/out" || { echo "workload not ready: $(cat "$work/err")"; exit 1; }
"$CKPT" checkpoint --dir "$work/d" --kill --json > "$work/ckpt.json"
wait || true
image_mib=$(( $(du -sb "$work/d" | cut -f1) / 1048576 ))

rows=()
for r in $(seq "$ROUNDS"); do
    drop
    t0=$(now); find "$work/d" -type f -exec cat {} + > /dev/null; t1=$(now)
    read_ms=$(ms "$t0" "$t1")
    drop
    rm -f "$work/fifo"; mkfifo "$work/fifo"
    t0=$(now)
    "$CKPT" restart --dir "$work/d" "$@" > "$work/fifo" 2> "$work/rerr" &
    pid=$!
    head -c1 < "$work/fifo" > /dev/null
    t1=$(now)
    restart_ms=$(ms "$t0" "$t1")
    wait "$pid" 2>/dev/null || true
    rows+=("| $r | $image_mib | $read_ms | $restart_ms | $(awk -v a="$restart_ms" -v b="$read_ms" 'BEGIN{printf "%.2f", a/b}') |")
done

table=$(printf '%s\n' "| round | image MiB | cold read ms | restart to running ms | restart / read |" \
    "|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Restart against a cold read ($(date -u +%F), heap $MIB MiB incompressible, options: ${*:-none})"
    echo
    echo "Produced by \`bench/restart.sh $MIB $ROUNDS $*\`."
    echo
    echo "$table"
} > docs/bench-restart.md
