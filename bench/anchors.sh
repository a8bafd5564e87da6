#!/bin/bash
# CRIU and DMTCP on the job of bench/scale.sh (issue 37, item 5): N processes of 8 MiB of
# incompressible heap each (bench/workload.c `heap 8 rand N`), as root.
#
# CRIU 4.2: three `criu dump --leave-running` a second apart (the job is frozen for the whole
# dump: its frozen time is the dump's), then a dump that ends the job and `criu restore -d` of it
# (restore ms: until criu returns, the tree running). DMTCP 4.2.0: three checkpoints a second
# apart (`dmtcp_command -c`; every process writes its image while the job is suspended, so the
# frozen time is the checkpoint's, timed until the coordinator says RUNNING again with a new
# image), images uncompressed (--no-gzip: the heap is incompressible). Prints a table and
# writes it to docs/bench-anchors.md; bench/scale.sh measures ckpt on the same job.
#
# Usage: bench/anchors.sh build             (fetch and build both under $ANCHORS, a few minutes)
#        bench/anchors.sh [N...]            (default: 16 64 256)
# Environment: ANCHORS (default /var/tmp/ckpt-anchors): where the sources and builds are;
# CRIU_GIT, DMTCP_GIT: where to clone them from (default: their GitHub repositories).
set -euo pipefail
cd "$(dirname "$0")/.."
ANCHORS=${ANCHORS:-/var/tmp/ckpt-anchors}
CRIU=$ANCHORS/criu/criu/criu
DMTCP=$ANCHORS/dmtcp/bin

if [ "${1:-}" = build ]; then
    [ "$(id -u)" = 0 ] || { echo "anchors.sh build: run as root (apt-get)" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq build-essential libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler \
        protobuf-compiler python3-protobuf libcap-dev libnl-3-dev libnet1-dev libaio-dev \
        libgnutls28-dev pkg-config libbsd-dev iproute2 libnftables-dev uuid-dev > /dev/null
    mkdir -p "$ANCHORS"
    [ -d "$ANCHORS/criu" ] || git clone -q "${CRIU_GIT:-https://github.com/checkpoint-restore/criu}" "$ANCHORS/criu"
    [ -d "$ANCHORS/dmtcp" ] || git clone -q "${DMTCP_GIT:-https://github.com/dmtcp/dmtcp}" "$ANCHORS/dmtcp"
    git -C "$ANCHORS/criu" checkout -q v4.2
    git -C "$ANCHORS/dmtcp" checkout -q v4.2.0
    make -C "$ANCHORS/criu" -j"$(nproc)" criu > "$ANCHORS/criu.build.log"
    (cd "$ANCHORS/dmtcp" && ./configure > ../dmtcp.configure.log && make -j"$(nproc)" > ../dmtcp.build.log)
    "$CRIU" --version
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "anchors.sh: CRIU dumps as root; run as root" >&2; exit 1; }
[ -x "$CRIU" ] && [ -x "$DMTCP/dmtcp_launch" ] || { echo "anchors.sh: run 'bench/anchors.sh build' first (looked in $ANCHORS)" >&2; exit 1; }
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(16 64 256)
. bench/lib.sh
workload_dir anchors
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# The workload in a session of its own, stdio to files (CRIU then needs no --shell-job); waits
# until it is ready, prints its pid.
start_job() {
    setsid "$@" < /dev/null > "$work/out" 2> "$work/err" &
    local pid=$!
    wait_line "$work/out" ready "the workload (log: $work/err)" >&2
    echo "$pid"
}

# Waits until no process of session SID is left (CRIU's restore needs the pids free).
gone() {
    for _ in $(seq 600); do ps -o pid= -s "$1" > /dev/null || return 0; sleep 0.05; done
}

criu_row() {
    local n=$1 pid t0 dumps="" restore img=$work/criu-img
    pid=$(start_job "$work/workload" heap 8 rand "$n")
    for i in 1 2 3; do
        rm -rf "$img"; mkdir -p "$img"
        t0=$(date +%s%N)
        "$CRIU" dump -t "$pid" -D "$img" --leave-running -v0 -o dump.log
        dumps+="${dumps:+ / }$(ms_since "$t0")"
        sleep 1
    done
    rm -rf "$img"; mkdir -p "$img"
    "$CRIU" dump -t "$pid" -D "$img" -v0 -o dump.log
    gone "$pid"
    t0=$(date +%s%N)
    "$CRIU" restore -D "$img" -d -v0 -o restore.log
    restore=$(ms_since "$t0")
    kill -9 -- "-$pid" 2> /dev/null || true
    gone "$pid"
    rm -rf "$img"
    echo "$dumps|$restore"
}

dmtcp_row() {
    local n=$1 port=$((7700 + RANDOM % 200)) t0 ckpts="" dir=$work/dmtcp-img
    rm -rf "$dir"; mkdir -p "$dir"
    local pid
    pid=$(start_job "$DMTCP/dmtcp_launch" --new-coordinator --coord-port "$port" --ckptdir "$dir" --no-gzip "$work/workload" heap 8 rand "$n")
    for i in 1 2 3; do
        touch "$work/mark"; sleep 0.01
        t0=$(date +%s%N)
        "$DMTCP/dmtcp_command" -p "$port" -c > /dev/null
        # Done when a new restart script is there and the job runs again.
        for _ in $(seq 6000); do
            [ -n "$(find "$dir" -name 'dmtcp_restart_script*.sh' -newer "$work/mark" 2> /dev/null)" ] &&
                "$DMTCP/dmtcp_command" -p "$port" -s 2> /dev/null | grep -q "RUNNING=yes" && break
            sleep 0.01
        done
        ckpts+="${ckpts:+ / }$(ms_since "$t0")"
        sleep 1
    done
    "$DMTCP/dmtcp_command" -p "$port" -k > /dev/null 2>&1 || true
    gone "$pid"
    rm -rf "$dir"
    echo "$ckpts"
}

rows=()
for n in "${counts[@]}"; do
    settle
    IFS='|' read -r dumps restore < <(criu_row "$n")
    settle
    ckpts=$(dmtcp_row "$n")
    rows+=("| $n | $dumps | $restore | $ckpts |")
done
table=$(printf '%s\n' \
    "| processes | CRIU 4.2 dump ms, job frozen throughout (3 dumps) | CRIU restore ms | DMTCP 4.2.0 checkpoint ms, job suspended throughout (3) |" \
    "|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# CRIU and DMTCP on bench/scale.sh's job ($(date -u +%F), $(nproc) CPUs)"
    echo
    echo "Produced by \`bench/anchors.sh ${counts[*]}\` (CRIU $("$CRIU" --version | sed -n 's/Version: //p'), DMTCP"
    echo "4.2.0, built by \`bench/anchors.sh build\`): N processes of 8 MiB of incompressible heap each;"
    echo "three dumps or checkpoints a second apart, the job going on after each. CRIU freezes the"
    echo "job for the whole dump (\`--leave-running\`; this kernel has no soft-dirty bits, so no"
    echo "pre-dump), DMTCP suspends it while every process writes its image (\`--no-gzip\`). ckpt's"
    echo "frozen times for the same job: docs/bench-scale.md."
    echo
    echo "$table"
} > docs/bench-anchors.md
