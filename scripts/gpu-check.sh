#!/usr/bin/env bash
# gpu-check.sh: every test of ckpt on a real NVIDIA GPU, in one go (docs/PLAN-GPU.md).
#
#   bash scripts/gpu-check.sh prepare   # here (no GPU needed): builds what travels into .gpu-check/
#   bash scripts/gpu-check.sh [bench]   # on the GPU machine, as root, from the repository's root
#
# `prepare` builds ckpt and the test binaries of tests/tests/cuda.rs (the real GPU) and
# tests/tests/gpu.rs (the stand-in driver) with the GPU tests on (CKPT_GPU_TESTS=1), in a target
# directory of their own, and puts them, stripped, with the test programs, in .gpu-check/ (about
# 20 MiB; ignored by git): the GPU machine needs no Rust. The run there builds the CUDA program
# with nvcc, runs every GPU test as root, then the CUDA C++ test again as an ordinary user
# (ckpt-test, created there), and writes its log to $OUT/gpu-check.log when $OUT is set. About
# 4 minutes on an H200. With `bench`, bench/gpu.sh runs after (its sizes from
# CKPT_GPU_BENCH_SIZES, "256 4096 16384" by default; a few minutes more) and docs/bench-gpu.md
# comes back in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.gpu-check

if [[ ${1:-} == prepare ]]; then
    export CKPT_GPU_TESTS=1 CARGO_TARGET_DIR=$PWD/target/gpu-check
    cargo build --release -p ckpt-launch
    make -s -C tests/progs
    # The test binaries' paths, from cargo's own report.
    bins=$(cargo test --release -p tests --test cuda --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda", "gpu"):
        print(m["target"]["name"], m["executable"])')
    rm -rf "$pack" && mkdir -p "$pack/progs"
    strip -o "$pack/ckpt" "$CARGO_TARGET_DIR/release/ckpt"
    while read -r name exe; do
        strip -o "$pack/$name" "$exe"
    done <<<"$bins"
    cp -a tests/progs/. "$pack/progs/"
    du -sh "$pack"
    echo "now, on the GPU machine: bash scripts/gpu-check.sh (carrying $pack)"
    exit 0
fi

[[ -x $pack/ckpt && -x $pack/cuda && -x $pack/gpu ]] || { echo "gpu-check.sh: run 'bash scripts/gpu-check.sh prepare' first (where Rust is)" >&2; exit 1; }
log=${OUT:-/tmp}/gpu-check.log
exec > >(tee "$log") 2>&1
export CKPT_BIN=$PWD/$pack/ckpt CKPT_TEST_PROGS=$PWD/$pack/progs
chmod -R a+rX "$pack"
echo "== $(date -u +%FT%TZ) $(uname -r)"
nvidia-smi --query-gpu=name,driver_version,persistence_mode,memory.total --format=csv || true
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' || true
status=0
echo "== the real GPU, as root"
skip=()
if ! [[ -x /usr/bin/mpirun || -x /usr/local/bin/mpirun ]]; then
    echo "(two_open_mpi_ranks_on_one_gpu not run: Open MPI is not installed here)"
    skip=(--skip two_open_mpi_ranks_on_one_gpu)
fi
"$pack/cuda" --test-threads=1 "${skip[@]}" || status=1
echo "== the stand-in driver, as root"
"$pack/gpu" --test-threads=2 || status=1
echo "== a CUDA C++ program, as an ordinary user"
id ckpt-test >/dev/null 2>&1 || useradd --create-home --shell /bin/bash ckpt-test
CKPT_TEST_USER=ckpt-test "$pack/cuda" --test-threads=1 a_cuda_program_holding_256_mib_of_device_memory || status=1
if [[ ${1:-} == bench ]]; then
    echo "== bench/gpu.sh"
    CKPT=$CKPT_BIN bash bench/gpu.sh ${CKPT_GPU_BENCH_SIZES:+"$CKPT_GPU_BENCH_SIZES"} || status=1
    [[ -n ${OUT:-} && -f docs/bench-gpu.md ]] && cp docs/bench-gpu.md "$OUT/"
fi
echo "== exit $status"
exit $status
