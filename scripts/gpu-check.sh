#!/usr/bin/env bash
# gpu-check.sh: every test of ckpt on a real NVIDIA GPU, in one go (docs/PLAN-GPU.md).
#
#   bash scripts/gpu-check.sh prepare   # here (no GPU needed): builds what travels into .gpu-check/
#   bash scripts/gpu-check.sh [bench]   # on the GPU machine, as root, from the repository's root
#
# `prepare` builds ckpt and the test binaries of tests/tests/cuda.rs (the real GPU) and
# tests/tests/gpu.rs (the stand-in driver) with the GPU tests on (CKPT_GPU_TESTS=1), in a target
# directory of their own, and puts them, stripped, with the test programs, in .gpu-check/ (about
# 20 MiB; ignored by git; laid out as in the checkout): the GPU machine needs no Rust. The run
# there first runs one CUDA job by hand with ckpt's log (and what a CUDA process and its forked
# worker map of the device), then each GPU test as root, the CUDA C++ test again as an ordinary
# user (ckpt-test, created there) and the stand-in driver's tests, each part with a time limit
# inside the whole run's (CKPT_GPU_CHECK_S, 330 s by default), and writes its log to
# $OUT/gpu-check.log when $OUT is set. About 4 minutes on an H200. With `bench`, bench/gpu.sh
# runs after (its sizes from CKPT_GPU_BENCH_SIZES, bench/gpu.sh's by default; about 2 minutes
# for "256 4096 16384") and docs/bench-gpu.md comes back in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.gpu-check

if [[ ${1:-} == prepare ]]; then
    export CKPT_GPU_TESTS=1 CARGO_TARGET_DIR=$PWD/target/gpu-check
    cargo build --release -p ckpt-launch --features test-hooks
    make -s -C tests/progs
    # The test binaries' paths, from cargo's own report.
    bins=$(cargo test --release -p tests --test cuda --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda", "gpu"):
        print(m["target"]["name"], m["executable"])')
    rm -rf "$pack" && mkdir -p "$pack/tests/progs" "$pack/plugins"
    strip -o "$pack/ckpt" "$CARGO_TARGET_DIR/release/ckpt"
    while read -r name exe; do
        strip -o "$pack/$name" "$exe"
    done <<<"$bins"
    # As in the checkout: the test programs' Makefile reaches ../../plugins/libckpt.
    cp -a tests/progs/. "$pack/tests/progs/"
    cp -a plugins/libckpt "$pack/plugins/"
    du -sh "$pack"
    echo "now, on the GPU machine: bash scripts/gpu-check.sh (carrying $pack)"
    exit 0
fi

[[ -x $pack/ckpt && -x $pack/cuda && -x $pack/gpu ]] || { echo "gpu-check.sh: run 'bash scripts/gpu-check.sh prepare' first (where Rust is)" >&2; exit 1; }
log=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$log") 2>&1
# The pack where an ordinary user can read it too (the checkout may sit under root's home).
here=/var/tmp/ckpt-gpu-check
rm -rf "$here" && cp -a "$pack" "$here" && chmod -R a+rX "$here"
export here CKPT_BIN=$here/ckpt CKPT_TEST_PROGS=$here/tests/progs
# Every part has a time limit, and the whole run one (CKPT_GPU_CHECK_S, 330 s by default): a part
# that would start with too little time left is named as not run.
deadline=$((SECONDS + ${CKPT_GPU_CHECK_S:-330}))
status=0
part() {
    local name=$1 limit=$2
    shift 2
    local left=$((deadline - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        echo "== $name: NOT RUN (out of time)"
        status=1
        return
    fi
    echo "== $name ($(date -u +%T), at most ${limit} s)"
    local t=$SECONDS
    timeout --kill-after=5 "$limit" "$@" || { echo "== $name: FAILED (exit $?)"; status=1; }
    echo "== $name: $((SECONDS - t)) s"
}

echo "== $(date -u +%FT%TZ) $(uname -r) $(nproc) cpus, ptrace_scope $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)"
nvidia-smi --query-gpu=name,driver_version,persistence_mode,memory.total --format=csv || true
ls -l /dev/nvidia* || true
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' || true
command -v nvcc mpirun gcc || true

# One job by hand, with ckpt's log, before the tests: what they report if something is wrong.
smoke() {
    local d=/var/tmp/ckpt-gpu-smoke
    rm -rf "$d" && mkdir -p "$d"
    nvcc -O2 -o "$d/counter" "$CKPT_TEST_PROGS/cuda/counter.cu" || return 1
    export CKPT_LOG=info
    "$CKPT_BIN" launch --dir "$d/job" -- "$d/counter" 256 12 --worker > "$d/out" 2> "$d/err" &
    for _ in $(seq 300); do grep -q START "$d/out" && break; sleep 0.1; done
    # What of the device a CUDA process and its forked worker map (fork copies some of it).
    local parent
    parent=$(pgrep -f "^$d/counter" | head -1)
    for p in $parent $(pgrep -P "$parent"); do
        echo "-- pid $p maps of /dev/nvidia*:"
        grep nvidia "/proc/$p/maps" | awk '{print $2, $6, $1}' | sort | uniq -c | head -20
    done
    "$CKPT_BIN" checkpoint --dir "$d/job" --json; echo " (checkpoint: exit $?)"
    sleep 1
    "$CKPT_BIN" checkpoint --dir "$d/job" --kill --json; echo " (checkpoint --kill: exit $?)"
    wait
    echo "-- launch stdout:"; cat "$d/out"; echo "-- launch stderr:"; tail -40 "$d/err"
    "$CKPT_BIN" restart --dir "$d/job" > "$d/rout" 2> "$d/rerr"; echo "(restart: exit $?)"
    echo "-- restart stdout:"; cat "$d/rout"; echo "-- restart stderr:"; tail -40 "$d/rerr"
    "$CKPT_BIN" inspect "$d/job" | tail -30
    grep -q '^PASS' "$d/rout"
}
part "one CUDA job by hand, with ckpt's log" 90 bash -c "$(declare -f smoke); smoke"

skip=()
if ! command -v mpirun >/dev/null; then
    echo "(two_open_mpi_ranks_on_one_gpu not run: Open MPI is not installed here)"
    skip=(--skip two_open_mpi_ranks_on_one_gpu)
fi
for t in a_cuda_program_with_a_child_that_uses_no_gpu a_pytorch_training_loop_with_dataloader_workers two_open_mpi_ranks_on_one_gpu \
    a_cuda_program_holding_256_mib_of_device_memory a_pytorch_training_loop two_cuda_programs_under_a_shell a_lazy_restart_of_a_cuda_program; do
    [[ " ${skip[*]} " == *" $t "* ]] && continue
    part "$t, as root" 120 "$here/cuda" --exact "$t" --test-threads=1
done
id ckpt-test >/dev/null 2>&1 || useradd --create-home --shell /bin/bash ckpt-test
CKPT_TEST_USER=ckpt-test part "a CUDA C++ program and its lazy restart, as an ordinary user" 150 "$here/cuda" --exact a_cuda_program_holding_256_mib_of_device_memory a_lazy_restart_of_a_cuda_program --test-threads=1
part "the stand-in driver, as root" 60 "$here/gpu" --test-threads=2
if [[ ${1:-} == bench ]]; then
    part "bench/gpu.sh" 600 env CKPT="$CKPT_BIN" bash bench/gpu.sh ${CKPT_GPU_BENCH_SIZES:+"$CKPT_GPU_BENCH_SIZES"}
    [[ -n ${OUT:-} && -f docs/bench-gpu.md ]] && cp docs/bench-gpu.md "$OUT/"
fi
echo "== exit $status"
exit $status
