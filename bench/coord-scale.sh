#!/bin/bash
# bench/coord-scale.sh: the coordinator at scale (issue 37, item 3). Builds the harness
# (ckpt-bench/src/bin/coord-scale.rs) in release mode and runs the real coordinator, in a process
# of its own, against 64, 512 and 4,096 simulated agents that speak the real protocol over TCP;
# prints a markdown table and writes it, with the command, the date and the machine, into
# docs/bench-coord-scale.md between the GENERATED markers (the analysis around it is kept).
#
# Usage: bench/coord-scale.sh [AGENTS=64,512,4096] [extra coord-scale options...]
# e.g. bench/coord-scale.sh 4096 --work-ms 50 --idle-secs 20. CARGO_TARGET_DIR is honoured.
# The harness raises its limit of open files to the hard limit: 4,096 agents need about 8,300
# descriptors (both ends of every connection live on this machine) and 4,100 threads in it, plus
# 4,100 in the coordinator.
set -euo pipefail
cd "$(dirname "$0")/.."
agents=${1:-64,512,4096}
shift || true
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p ckpt-bench --bin coord-scale
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cmd="bench/coord-scale.sh $agents${*:+ $*}"
"$target/release/coord-scale" --agents "$agents" --markdown "$out" "$@" > /dev/null
cores=$(nproc)
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
{
    echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') with \`$cmd\` on $cores cores ($model), $(free -g | awk '/^Mem:/ {print $2}') GiB, Linux $(uname -r); the simulated agents share the machine with the coordinator."
    echo
    cat "$out"
} > "$out.section"
cat "$out.section"
doc=docs/bench-coord-scale.md
if [ -f "$doc" ] && grep -q '^<!-- BEGIN GENERATED -->' "$doc"; then
    awk -v f="$out.section" '
        /^<!-- BEGIN GENERATED -->/ { print; while ((getline l < f) > 0) print l; skip = 1; next }
        /^<!-- END GENERATED -->/ { skip = 0 }
        !skip' "$doc" > "$doc.tmp" && mv "$doc.tmp" "$doc"
else
    { echo "# The coordinator at scale"; echo; echo "<!-- BEGIN GENERATED -->"; cat "$out.section"; echo "<!-- END GENERATED -->"; } > "$doc"
fi
rm -f "$out.section"
echo "written into $doc" >&2
