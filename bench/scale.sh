#!/bin/bash
# Frozen time of a checkpoint against the number of processes (issue 37, item 1; docs/PLAN-SCALE.md
# step 1): a job of N processes of 8 MiB of incompressible heap each (bench/workload.c `heap 8
# rand N`: a parent and N-1 children), three checkpoints a second apart and one with --kill,
# with the capture's debug log on. Beside the frozen and durable times it splits the time the
# capture spends per process while the job is frozen, summed over the processes and averaged
# over the three checkpoints (the --kill one, which copies nothing ahead and forks nothing, is
# left out): the vdso, the scratch area and what is asked inside the process (`inject`), the
# incremental delta (`delta`), the fork for the copy after the release (`fork`), on the tracer
# thread; memory (`memory`) and descriptors (`fds`) on the capture's second thread, beside it.
# Then the frozen time's three stages, wall time: the freeze, the capture of every process,
# and the rest (the job's other objects, its files, the release). Last, the restart of the
# --kill checkpoint to running (until the job's first output), eagerly and with --lazy. Prints
# a table and writes it to docs/bench-scale.md.
#
# Usage: bench/scale.sh [N...]   (default: 16 64 256)
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(16 64 256)
. bench/lib.sh
workload_dir scale

rows=()
for n in "${counts[@]}"; do
    settle
    d="$work/d-$n"
    rm -f "$work/out"
    CKPT_LOG=ckpt_core::capture=debug NO_COLOR=1 "$CKPT" launch --dir "$d" -- \
        "$work/workload" heap 8 rand "$n" > "$work/out" 2> "$work/log" &
    wait_line "$work/out" ready "the workload of $n processes (log: $work/log)"
    { read -r frozen; read -r durable; } < <(checkpoints "$d" 3 frozen_ms durable_ms)
    wait || true
    restart=$(restart_to_running "$d")
    lazy=$(restart_to_running "$d" --lazy)
    read -r inject delta fork tables memory fds < <(split "$work/log" 3 "$n")
    read -r freeze capture rest < <(stages "$work/log" 3)
    mean=$(tr -d ' ' <<< "$frozen" | tr '/' '\n' | awk '{s += $1} END {printf "%.0f", s / NR}')
    per=$(awk -v f="$mean" -v n="$n" 'BEGIN {printf "%.2f", f / n}')
    rows+=("| $n | $frozen | $per | $durable | $inject | $delta | $fork | $tables | $memory | $fds | $freeze | $capture | $rest | $restart | $lazy |")
    rm -rf "$d"
done

table=$(printf '%s\n' \
    "| processes | frozen ms (3 checkpoints) | frozen ms per process | durable ms | inject | delta | fork | tables | memory | fds | freeze | capture | rest | restart to running ms | lazy restart to running ms |" \
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Frozen time against the number of processes ($(date -u +%F), $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/scale.sh ${counts[*]}\`: N processes of 8 MiB of incompressible heap"
    echo "each, three checkpoints a second apart (frozen and durable as \`ckpt checkpoint --json\`"
    echo "reports them). The split is the capture's own per-process timing (debug log), summed over"
    echo "the processes and averaged over the three checkpoints, in ms: the vdso, the scratch area"
    echo "and what is asked inside the process (\`inject\`), incremental delta, fork for the copy"
    echo "after the release, on the tracer thread; memory and descriptors on a second thread beside"
    echo "it (docs/PLAN-SCALE.md). Then the frozen time's stages, wall time: until the tree was"
    echo "frozen, the capture of every process, and the rest (the job's other objects, its files,"
    echo "the release). Last, \`ckpt restart\` of the --kill checkpoint until the job's first output"
    echo "(its processes are released together once every one is rebuilt), then again with"
    echo "\`--lazy\` (the job runs while its pages come in)."
    echo
    echo "$table"
} > docs/bench-scale.md
