#!/bin/bash
# Restart-to-running of an incompressible heap, page cache dropped before each run, next to a
# cold read of the same image files in the same run (issue 14, "eager restart at the disk's
# speed"), eager and lazy (`--lazy`: the time to the job's first output, and the time until
# every page is in, from the page server's log line). Needs root (drop_caches, and a lazy
# restart needs CAP_SYS_PTRACE). Prints a table and writes it to docs/bench-restart.md.
#
# Usage: bench/restart.sh [MIB=1024] [ROUNDS=3] [extra ckpt restart options...]
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
MIB=${1:-1024}
ROUNDS=${2:-3}
shift 2 || true
. bench/lib.sh
workload_dir restart
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

    # Lazy: the job runs (and prints) while its memory comes in; it is kept running, its output
    # drained, until the page server says every page is in.
    drop
    rm -f "$work/fifo"; mkfifo "$work/fifo"
    t0=$(now)
    CKPT_LOG=ckpt_core::lazy=info "$CKPT" restart --dir "$work/d" --lazy "$@" > "$work/fifo" 2> "$work/lerr" &
    pid=$!
    exec 3< "$work/fifo"
    head -c1 <&3 > /dev/null
    t1=$(now)
    cat <&3 > /dev/null &
    drain=$!
    exec 3<&-
    for _ in $(seq 6000); do grep -q 'the fill ended' "$work/lerr" && break; sleep 0.01; done
    t2=$(now)
    grep -q 'the fill ended' "$work/lerr" || { echo "the lazy restart did not end its fill: $(tail -3 "$work/lerr")"; exit 1; }
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    wait "$drain" 2>/dev/null || true
    rows+=("| $r | $image_mib | $read_ms | $restart_ms | $(awk -v a="$restart_ms" -v b="$read_ms" 'BEGIN{printf "%.2f", a/b}') | $(ms "$t0" "$t1") | $(ms "$t0" "$t2") |")
done

table=$(printf '%s\n' "| round | image MiB | cold read ms | eager: restart to running ms | eager / read | lazy: to running ms | lazy: every page in ms |" \
    "|---|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Restart against a cold read ($(date -u +%F), heap $MIB MiB incompressible, options: ${*:-none})"
    echo
    echo "Produced by \`bench/restart.sh $MIB $ROUNDS $*\`."
    echo
    echo "$table"
} > docs/bench-restart.md
