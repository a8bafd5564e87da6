#!/bin/bash
# CUDA jobs on a real GPU (issue 36, "as cheap as the hardware allows"): for a CUDA program
# holding 256 MiB, 4 GiB and 16 GiB of device memory (tests/progs/cuda/counter.cu), and a PyTorch
# training loop (tests/progs/torch_train.py, with `torch` among the sizes), in one run:
#   - under ckpt: `ckpt checkpoint --json`'s frozen_ms, gpu_ms (the driver's lock to its unlock,
#     as ckpt drives it), gpu_bytes and durable_ms; after a crash, how long `ckpt restart` took
#     until every process ran again with its GPU back (restart_ms, from its log);
#   - the driver alone on the same program (no ckpt): lock, checkpoint, restore, unlock, timed
#     through libcuda.so.1 directly;
#   - the GPU's own copy bandwidth, device to pinned host and back (PyTorch).
# What ckpt adds to the driver's own calls is gpu_ms less the driver's four calls. Prints a
# table and writes it to docs/bench-gpu.md. Needs an NVIDIA GPU, nvcc and python3 with torch;
# scripts/gpu-check.sh runs it with `bench` (CKPT and the test programs from its pack).
#
# Usage: bench/gpu.sh [SIZES="256 4096 16384 torch"]   (MiB of device memory, or torch)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
CKPT=${CKPT:-$PWD/target/release/ckpt}
PROGS=${CKPT_TEST_PROGS:-$PWD/tests/progs}
SIZES=${1:-256 4096 16384 torch}
work=$(mktemp -d /var/tmp/ckpt-gpu.XXXXXX)
trap 'pkill -f "$work/counter" 2>/dev/null || true; rm -rf "$work"' EXIT
nvcc -O2 -o "$work/counter" "$PROGS/cuda/counter.cu"

# The driver's four calls on process $1, timed (ms), through ctypes.
driver_alone() {
    python3 - "$1" <<'EOF'
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
pid = int(sys.argv[1])
class Lock(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_uint), ("r0", ctypes.c_uint), ("r1", ctypes.c_ulonglong * 7)]
def timed(name, *args):
    t = time.perf_counter()
    r = getattr(cu, name)(pid, *args)
    if r != 0:
        sys.exit(f"{name}: CUresult {r}")
    return (time.perf_counter() - t) * 1e3
lock = Lock(10000)
t = [timed("cuCheckpointProcessLock", ctypes.byref(lock)), timed("cuCheckpointProcessCheckpoint", None),
     timed("cuCheckpointProcessRestore", None), timed("cuCheckpointProcessUnlock", None)]
print(" ".join(f"{x:.0f}" for x in t))
EOF
}

bandwidth() {
    python3 - "$1" <<'EOF'
import sys, time, torch
n = int(sys.argv[1]) << 20
d = torch.empty(n, dtype=torch.uint8, device="cuda")
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
def gbps(copy):
    copy(); torch.cuda.synchronize()
    t = time.perf_counter(); copy(); torch.cuda.synchronize()
    return n / (time.perf_counter() - t) / 1e9
print(f"{gbps(lambda: h.copy_(d)):.1f} {gbps(lambda: d.copy_(h)):.1f}")
EOF
}

# restart_ms DIR TAG: restarts the job in DIR (with ckpt's log), prints how long the restart
# took until every process ran again with its GPU back, then ends the job.
restart_ms() {
    CKPT_LOG=info "$CKPT" restart --dir "$1" > "$work/rout$2" 2> "$work/rerr$2" &
    local restart=$!
    for _ in $(seq 1200); do grep -q "rebuilt and released" "$work/rerr$2" && break; sleep 0.1; done
    sed 's/\x1b\[[0-9;]*m//g' "$work/rerr$2" | sed -n 's/.*rebuilt and released ms=\([0-9]*\).*/\1/p' | tail -1
    kill -KILL "$restart" 2>/dev/null || true
    wait "$restart" 2>/dev/null || true
}

# measure LABEL TAG PROGRAM...: PROGRAM (which prints START once CUDA is up, and runs for
# minutes) under ckpt: two checkpoints it runs on after, a crash, a restart; then alone, under
# the driver's four calls. Adds a row (without the copy bandwidth, added by the caller).
measure() {
    local label=$1 tag=$2
    shift 2
    "$CKPT" launch --dir "$work/d$tag" -- "$@" > "$work/out$tag" 2> "$work/err$tag" &
    local launcher=$!
    wait_line "$work/out$tag" START "$label" || { cat "$work/err$tag"; exit 1; }
    local frozen gpu_ms gpu_bytes durable
    read -r frozen gpu_ms gpu_bytes durable < <(for i in 1 2; do
        json=$("$CKPT" checkpoint --dir "$work/d$tag" --json)
        echo "$(field frozen_ms <<<"$json") $(field gpu_ms <<<"$json") $(field gpu_bytes <<<"$json") $(field durable_ms <<<"$json")"
        sleep 1
    done | tail -1)
    # Ended by a crash rather than `--kill`, which would store the memory once more.
    kill -KILL "$launcher"
    wait "$launcher" 2>/dev/null || true
    local restart
    restart=$(restart_ms "$work/d$tag" "$tag")
    rm -rf "$work/d$tag"
    # The driver alone.
    "$@" > "$work/alone$tag" &
    local alone=$!
    wait_line "$work/alone$tag" START "$label alone"
    local lock ckpt restore unlock
    read -r lock ckpt restore unlock < <(driver_alone "$alone")
    kill "$alone"; wait "$alone" 2>/dev/null || true
    local driver=$((lock + ckpt + restore + unlock))
    row="| $label | $frozen | $gpu_ms | $((gpu_bytes >> 20)) MiB | $durable | ${restart:-?} | $lock + $ckpt + $restore + $unlock = $driver | $((gpu_ms - driver))"
}

rows=()
for size in $SIZES; do
    if [[ $size == torch ]]; then
        measure "PyTorch training loop" torch python3 "$PROGS/torch_train.py" 600
        rows+=("$row | |")
    else
        measure "$size MiB" "$size" "$work/counter" "$size" 600
        read -r d2h h2d < <(bandwidth "$size")
        rows+=("$row | $d2h / $h2d |")
    fi
    # As it comes: a run stopped at its time limit still tells what it measured.
    echo "${rows[-1]}"
done

table=$(
    echo "| job | ckpt frozen_ms | ckpt gpu_ms | gpu_bytes | durable_ms | restart_ms | driver alone: lock + checkpoint + restore + unlock (ms) | ckpt's part of gpu_ms (ms) | copy GB/s, to host / to device |"
    echo "|---|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
)
echo "$table"
{
    echo "# CUDA jobs: ckpt against the driver's own calls"
    echo
    echo "Written by bench/gpu.sh on $(date -u +%F), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "an NVIDIA GPU"), kernel $(uname -r)."
    echo "The second of two checkpoints the job ran on after; the driver alone on the same program"
    echo "without ckpt; copy bandwidth with pinned host memory (PyTorch)."
    echo
    echo "$table"
} > docs/bench-gpu.md
