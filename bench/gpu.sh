#!/bin/bash
# CUDA jobs on a real GPU (issue 36, "as cheap as the hardware allows"): for a CUDA program
# holding 256 MiB, 4 GiB and 16 GiB of device memory (tests/progs/cuda/counter.cu), in one run:
#   - under ckpt: `ckpt checkpoint --json`'s frozen_ms, gpu_ms (the driver's lock to its unlock,
#     as ckpt drives it), gpu_bytes and durable_ms;
#   - the driver alone on the same program (no ckpt): lock, checkpoint, restore, unlock, timed
#     through libcuda.so.1 directly;
#   - the GPU's own copy bandwidth, device to pinned host and back (PyTorch).
# What ckpt adds to the driver's own calls is gpu_ms less the driver's four calls. Prints a
# table and writes it to docs/bench-gpu.md. Needs an NVIDIA GPU, nvcc and python3 with torch;
# scripts/gpu-check.sh runs it with `bench` (CKPT and the test programs from its pack).
#
# Usage: bench/gpu.sh [SIZES_MIB="256 4096 16384"]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
CKPT=${CKPT:-$PWD/target/release/ckpt}
PROGS=${CKPT_TEST_PROGS:-$PWD/tests/progs}
SIZES=${1:-256 4096 16384}
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

rows=()
for mib in $SIZES; do
    # Under ckpt: two checkpoints the job runs on after, then a crash.
    "$CKPT" launch --dir "$work/d$mib" -- "$work/counter" "$mib" 600 > "$work/out$mib" 2> "$work/err$mib" &
    wait_line "$work/out$mib" START "the $mib MiB program" || { cat "$work/err$mib"; exit 1; }
    read -r frozen gpu_ms gpu_bytes durable < <(for i in 1 2; do
        json=$("$CKPT" checkpoint --dir "$work/d$mib" --json)
        echo "$(field frozen_ms <<<"$json") $(field gpu_ms <<<"$json") $(field gpu_bytes <<<"$json") $(field durable_ms <<<"$json")"
        sleep 1
    done | tail -1)
    # Ended by a crash rather than `--kill`, which would store the memory once more.
    kill -KILL %1
    wait || true
    rm -rf "$work/d$mib"
    # The driver alone.
    "$work/counter" "$mib" 600 > "$work/alone$mib" &
    alone=$!
    wait_line "$work/alone$mib" START "the $mib MiB program alone"
    read -r lock ckpt restore unlock < <(driver_alone "$alone")
    kill "$alone"; wait "$alone" 2>/dev/null || true
    read -r d2h h2d < <(bandwidth "$mib")
    driver=$((lock + ckpt + restore + unlock))
    rows+=("| $mib MiB | $frozen | $gpu_ms | $((gpu_bytes >> 20)) MiB | $durable | $lock + $ckpt + $restore + $unlock = $driver | $((gpu_ms - driver)) | $d2h / $h2d |")
done

table=$(
    echo "| device memory | ckpt frozen_ms | ckpt gpu_ms | gpu_bytes | durable_ms | driver alone: lock + checkpoint + restore + unlock (ms) | ckpt's part of gpu_ms (ms) | copy GB/s, to host / to device |"
    echo "|---|---|---|---|---|---|---|---|"
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
