#!/bin/bash
# Checkpoint time of an incompressible and a compressible heap with and without zstd, in one run
# (issue 14, "compression that pays"): durable ms and stored bytes from `ckpt checkpoint --json`,
# every generation whole (--full-every 1), so that each round stores the whole heap.
# Prints a table and writes it to docs/bench-compress.md (docs/bench-compress-slow-disk.md with
# WRITE_MBPS).
#
# Usage: bench/compress.sh [MIB=1024] [ROUNDS=3]
# Environment: KINDS (default "rand comp"), CODECS (default "none auto zstd:1 zstd:3");
# WRITE_MBPS=N (root, cgroup v1 blkio): the launchers' writes to the disk of /var/tmp are capped
# at N MB/s, as a slower disk or a shared file system would take them.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${CKPT:-$PWD/target/release/ckpt}
MIB=${1:-1024}
ROUNDS=${2:-3}
work=$(mktemp -d /var/tmp/ckpt-compress.XXXXXX)
cgroup=
cleanup() {
    pkill -f "$work/workload" 2>/dev/null || true
    rm -rf "$work"
    [[ -z $cgroup ]] || rmdir "$cgroup" 2>/dev/null || true
}
trap cleanup EXIT
gcc -O2 -o "$work/workload" bench/workload.c
report=docs/bench-compress.md
disk="the disk as it is"
if [[ -n ${WRITE_MBPS:-} ]]; then
    blkio=/sys/fs/cgroup/blkio
    [[ -d $blkio ]] || { echo "WRITE_MBPS needs cgroup v1's blkio controller at $blkio" >&2; exit 1; }
    dev=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE --target /var/tmp)" | head -1 | tr -d ' ')
    cgroup=$blkio/ckpt-bench-$$
    mkdir "$cgroup"
    echo "$dev $((WRITE_MBPS * 1000000))" > "$cgroup/blkio.throttle.write_bps_device"
    # The launcher (and so its IO threads) starts in the capped group.
    cat > "$work/ckpt" <<EOS
#!/bin/sh
echo \$\$ > $cgroup/cgroup.procs
exec $CKPT "\$@"
EOS
    chmod +x "$work/ckpt"
    CKPT=$work/ckpt
    report=docs/bench-compress-slow-disk.md
    disk="writes capped at $WRITE_MBPS MB/s (blkio.throttle.write_bps_device $dev)"
fi
rows=()
for kind in rand comp; do
    for codec in ${CODECS:-none auto zstd:1 zstd:3}; do
        d="$work/$kind-$codec"
        "$CKPT" launch --dir "$d" --pool "$((MIB * 3 / 2))M" --full-every 1 --compress "$codec" -- "$work/workload" heap "$MIB" "$kind" \
            > "$d.out" 2> "$d.err" &
        for _ in $(seq 600); do grep -q '^ready' "$d.out" 2>/dev/null && break; sleep 0.1; done
        sleep 2 # the pool faulted in
        for r in $(seq "$ROUNDS"); do
            j=$("$CKPT" checkpoint --dir "$d" --json)
            durable=$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["durable_ms"]))')
            frozen=$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["frozen_ms"]))')
            stored=$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_stored"] >> 20)')
            rows+=("| $kind | $codec | $r | $frozen | $durable | $stored |")
        done
        "$CKPT" checkpoint --dir "$d" --kill > /dev/null
        wait || true
    done
done
table=$(printf '%s\n' "| heap | codec | round | frozen ms | durable ms | stored MiB |" "|---|---|---|---|---|---|" "${rows[@]}")
echo "$table"
{
    echo "# Compression against none ($(date -u +%F), heap $MIB MiB, $disk)"
    echo
    echo "Produced by \`${WRITE_MBPS:+WRITE_MBPS=$WRITE_MBPS }bench/compress.sh $MIB $ROUNDS\`."
    echo
    echo "$table"
} > "$report"
