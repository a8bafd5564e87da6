#!/usr/bin/env bash
# demo.sh: checkpoint a running computation, crash it, restart it, and show that it finishes
# with the same answer as an uninterrupted run.
#
#   bash scripts/demo.sh [SECONDS]      (default 8: how long the computation runs)
# CKPT_BIN overrides the ckpt binary (default target/release/ckpt).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-8}
echo "== building ckpt (cargo build --release) and the test programs"
cargo build --release --quiet
make -s -C tests/progs
ckpt=${CKPT_BIN:-$PWD/target/release/ckpt}
prog=$PWD/tests/progs/bin/compute

work=$(mktemp -d /tmp/ckpt-demo.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

echo "== an uninterrupted run, in the background: $prog $secs"
"$prog" "$secs" >"$work/reference.out" &
ref=$!
pids+=("$ref")

echo "== ckpt launch --dir $work/img -- $prog $secs   (in the background)"
"$ckpt" launch --dir "$work/img" -- "$prog" "$secs" >"$work/launch.out" &
launcher=$!
pids+=("$launcher")
sleep 2

echo "== ckpt checkpoint --dir $work/img --json"
for _ in $(seq 100); do
    if "$ckpt" checkpoint --dir "$work/img" --json 2>"$work/checkpoint.err"; then
        break
    fi
    grep -qi "no running job" "$work/checkpoint.err" || { cat "$work/checkpoint.err" >&2; exit 1; }
    sleep 0.1
done

sleep 1
echo "== kill -9 the launcher (a crash, 1 s after the checkpoint)"
kill -9 "$launcher"
wait "$launcher" 2>/dev/null || true
echo "   the crashed run printed:"
sed 's/^/   | /' "$work/launch.out"

echo "== ckpt restart --dir $work/img   (continues from the checkpoint, in the foreground)"
start=${EPOCHREALTIME/./}
"$ckpt" restart --dir "$work/img" | tee "$work/restart.out" | sed 's/^/   | /'
end=${EPOCHREALTIME/./}
echo "   the restarted run took $(( (end - start) / 1000 )) ms (the whole computation: about $secs s)"

wait "$ref"
want=$(grep '^RESULT' "$work/reference.out")
got=$(grep '^RESULT' "$work/restart.out" || true)
echo "== uninterrupted run: $want"
echo "== restarted run:     ${got:-no RESULT}"
if [[ "$got" == "$want" ]]; then
    echo "== same answer: the checkpointed, crashed and restarted run finished correctly"
else
    echo "== DIFFERENT answers" >&2
    exit 1
fi
