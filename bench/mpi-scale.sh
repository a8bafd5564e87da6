#!/bin/bash
# Frozen time of an Open MPI job against its number of ranks (issue 37, item 1's second goal):
# `mpirun -np N --mca btl self,vader` of tests/progs/mpi_ring.c (ring and collective traffic,
# 1 MiB of working memory a rank, the shared-memory transport on), three checkpoints a second
# apart and one with --kill, with the capture's debug log on; the same split as bench/scale.sh
# (summed over the job's processes: the ranks, mpirun and its helpers), plus the bytes each
# checkpoint stored. Prints a table and writes it to docs/bench-mpi-scale.md.
#
# Usage: bench/mpi-scale.sh [N...]   (default: 16 32 64; Open MPI's mpirun and mpicc needed)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(16 32 64)
. bench/lib.sh
workload_dir mpi-scale
mpicc -O2 -I tests/progs -o "$work/mpi_ring" tests/progs/mpi_ring.c
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)

rows=()
for n in "${counts[@]}"; do
    settle
    d="$work/d-$n"
    rm -f "$work/out"
    CKPT_LOG=ckpt_core::capture=debug NO_COLOR=1 "$CKPT" launch --dir "$d" -- \
        /usr/bin/mpirun "${root_flag[@]}" --oversubscribe -np "$n" --mca btl self,vader "$work/mpi_ring" 600 1024 \
        > "$work/out" 2> "$work/log" &
    wait_line "$work/out" START "the Open MPI job of $n ranks (log: $work/log)"
    sleep 2
    { read -r frozen; read -r durable; read -r stored; } < <(checkpoints "$d" 3 frozen_ms durable_ms bytes_stored)
    wait || true
    procs=$(($(grep -c "process captured" "$work/log") / 4))
    read -r inject delta fork tables memory fds < <(split "$work/log" 3 "$procs")
    read -r freeze capture rest < <(stages "$work/log" 3)
    mean=$(tr -d ' ' <<< "$frozen" | tr '/' '\n' | awk '{s += $1} END {printf "%.0f", s / NR}')
    mb=$(tr -d ' ' <<< "$stored" | tr '/' '\n' | awk '{printf "%s%.0f", (NR > 1 ? " / " : ""), $1 / 1e6}')
    rows+=("| $n | $procs | $frozen | $durable | $mb | $inject | $delta | $fork | $tables | $memory | $fds | $freeze | $capture | $rest |")
    rm -rf "$d"
done

table=$(printf '%s\n' \
    "| ranks | processes | frozen ms (3 checkpoints) | durable ms | stored MB | inject | delta | fork | tables | memory | fds | freeze | capture | rest |" \
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Frozen time of an Open MPI job against its ranks ($(date -u +%F), $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/mpi-scale.sh ${counts[*]}\`: \`mpirun -np N --mca btl self,vader\` of"
    echo "tests/progs/mpi_ring.c (1 MiB a rank, shared-memory transport), three checkpoints a second"
    echo "apart; the split as in docs/bench-scale.md (ms, summed over the job's processes, averaged"
    echo "over the three checkpoints). The first checkpoint is full, the next two incremental."
    echo
    echo "$table"
} > docs/bench-mpi-scale.md
