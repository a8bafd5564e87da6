#!/bin/bash
# bench/node-loss.sh: what each level of docs/USER-GUIDE.md "Surviving the loss of a node" costs
# a checkpoint, and how long a recovery takes (docs/PERFORMANCE.md, "Node loss").
#
# An Open MPI ring of two ranks on two nodes (network namespaces of this machine on a bridge), each
# rank holding MIB MiB, under `ckpt coordinator` with each level: the shared directory only,
# --local-dir, --local-dir with --redundancy partner, with xor:2, and with --flush-every 1. For
# each: the median frozen and durable time of ROUNDS checkpoints and the bytes each checkpoint
# sends to other nodes. Then, with partner and with xor:2 and --recover, node B loses power (its
# link down, its processes killed, its local directory deleted) and the time to recover is taken
# from the coordinator's log, as seed 002 breaks MTTR down: detection (from the plug pulled to the
# agent declared lost), choosing (generation and spare), restart (the part fetched or rebuilt
# on the spare, every part restored, every node running again), and back to progress (from the
# plug pulled to rank 0 going past the last step it had reached: the work since the checkpoint
# is done again; the ring prints its steps with the wall clock).
#
# Usage: bench/node-loss.sh [MIB=256] [ROUNDS=3]   (root: it makes network namespaces)
# LEVELS="partner xor" runs those levels only; RECOVER=0 skips the recoveries; CKPT=path/to/ckpt
# measures another build (say, before and after a change). Every generation is whole
# (--full-every 1): an incremental one would move only the few pages the ring wrote since the
# last (about 4 MiB), not the part whose copy and parity cost is measured; FULL_EVERY=0 measures
# the default instead.
set -eu
MIB=${1:-256}
ROUNDS=${2:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
CK=${CKPT:-$HERE/target/release/ckpt}
RING=$HERE/tests/progs/bin/mpi_ring
RSH="$HERE/tests/progs/netns-exec.sh {host}"
[[ $(id -u) -eq 0 ]] || { echo "bench/node-loss.sh: run as root (it makes network namespaces)" >&2; exit 2; }
[[ -x $RING ]] || make -s -C "$HERE/tests/progs" bin/mpi_ring
T=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-bench-nodeloss-XXXXXX")
NS=(cknla cknlb cknlc)
ADDR=(10.253.77.1 10.253.77.2 10.253.77.3)
BR=cknlbr

cleanup() {
    for n in "${NS[@]}"; do
        for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$n" 2>/dev/null || true
    done
    # A namespace's veth end goes with it, a moment later: the host ends are removed here so
    # that a run right after this one can make them again.
    for i in 0 1 2; do ip link del "cknlh$i" 2>/dev/null || true; done
    ip link del "$BR" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT
cleanup 2>/dev/null; T=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-bench-nodeloss-XXXXXX")
ip link add "$BR" type bridge && ip link set "$BR" up
for i in 0 1 2; do
    ip netns add "${NS[$i]}"
    ip link add "cknlh$i" type veth peer name eth0 netns "${NS[$i]}"
    ip link set "cknlh$i" master "$BR" up
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}/24" dev eth0
    ip -n "${NS[$i]}" link set eth0 up
    ip -n "${NS[$i]}" link set lo up
done

median() { sort -g | awk '{a[NR]=$1} END {print (NR ? a[int((NR+1)/2)] : "-")}'; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
stamp() { # seconds since the epoch of a tracing line's ISO timestamp
    python3 -c 'import sys,datetime,re; m=re.search(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", sys.stdin.read()); print(datetime.datetime.fromisoformat(m.group(1)[:26]).replace(tzinfo=datetime.timezone.utc).timestamp() if m else "")'
}

# run NAME LOSE COORDINATOR-OPTIONS...: one job; prints "frozen durable sent" medians, and with
# LOSE=1 "detection choosing restart" after pulling node B's plug.
run() {
    local name=$1 lose=$2; shift 2
    local d=$T/$name
    mkdir -p "$d/local"
    local full=()
    [[ ${FULL_EVERY:-1} == 0 ]] || full=(--full-every "${FULL_EVERY:-1}")
    ip netns exec "${NS[0]}" env CKPT_LOG=info "$CK" coordinator --listen "${ADDR[0]}:0" --dir "$d/img" --rsh "$RSH" "${full[@]}" "$@" > "$d/coord.out" 2> "$d/coord.err" &
    until [[ -s $d/img/coordinator.addr ]]; do sleep 0.1; done
    local coord; coord=$(cat "$d/img/coordinator.addr")
    OMPI_MCA_plm_rsh_agent="$CK agent-rsh" ip netns exec "${NS[0]}" "$CK" launch --coord "$coord" --node a --dir "$d/img" --pool $((MIB * 2))M -- \
        mpirun --allow-run-as-root --host "${ADDR[0]},${ADDR[1]}" -np 2 --mca btl tcp,self --mca orte_tmpdir_base "$d" --mca rtc_hwloc_vmhole none "$RING" 600 $((MIB * 1024)) progress \
        > "$d/launch.out" 2> "$d/launch.err" &
    local launch=$!
    until grep -q START "$d/launch.out" 2>/dev/null; do sleep 0.2; done
    sleep 2
    : > "$d/frozen"; : > "$d/durable"
    for _ in $(seq "$ROUNDS"); do
        "$CK" checkpoint --dir "$d/img" --json > "$d/ckpt.json"
        json '["frozen_ms"]' < "$d/ckpt.json" >> "$d/frozen"
        json '["durable_ms"]' < "$d/ckpt.json" >> "$d/durable"
        sleep 1
    done
    local stored; stored=$(json '["bytes_stored"]' < "$d/ckpt.json")
    local sent=0
    case "$*" in
        *partner*) sent=$stored ;;
        *xor:2*) sent=$stored ;;   # groups of two: each node sends its whole part as segments
    esac
    echo "$(median < "$d/frozen") $(median < "$d/durable") $((sent / 1048576))" > "$d/costs"
    if ((lose)); then
        sleep 2  # the last generation's copies and parity are durable (it committed)
        local t0; t0=$(date +%s.%N)
        ip -n "${NS[1]}" link set eth0 down
        for p in $(ip netns pids "${NS[1]}"); do kill -9 "$p" 2>/dev/null || true; done
        rm -rf "$d/local/${ADDR[1]}"
        for _ in $(seq 300); do grep -q "recovered from generation" "$d/coord.err" && break; sleep 0.2; done
        local lost chosen recovered
        lost=$(grep "agent lost" "$d/coord.err" | head -1 | stamp)
        chosen=$(grep "generation and spares chosen" "$d/coord.err" | head -1 | stamp)
        recovered=$(grep -o "recovered from generation [0-9]* in [0-9.]* s" "$d/coord.err" | awk '{print $(NF-1)}')
        # Back to progress: rank 0's first STEP past the last one it printed before the plug
        # was pulled (the steps between the checkpoint and the loss are done again).
        for _ in $(seq 300); do
            python3 - "$t0" "$d/launch.out" <<'PY' > "$d/back" && break
import sys
t0 = float(sys.argv[1]) * 1000
steps = [(int(w[1]), int(w[2])) for w in (l.split() for l in open(sys.argv[2])) if len(w) == 3 and w[0] == "STEP"]
before = max((s for s, t in steps if t <= t0), default=0)
after = [t for s, t in steps if t > t0 and s > before]
if not after:
    sys.exit(1)
print(f"{(after[0] - t0) / 1000:.2f}")
PY
            sleep 0.2
        done
        python3 -c "t0,l,c,r=$t0,$lost,$chosen,${recovered:-0}; print(f'{l-t0:.2f} {c-l:.3f} {r-(c-l):.2f}', end=' ')" >> "$d/costs"
        echo "$(cat "$d/back" 2>/dev/null || echo -)" >> "$d/costs"
    fi
    kill "$launch" 2>/dev/null || true
    for n in "${NS[@]}"; do for p in $(ip netns pids "$n"); do kill -9 "$p" 2>/dev/null || true; done; done
    ip -n "${NS[1]}" link set eth0 up
    wait 2>/dev/null || true
    cat "$d/costs"
}

printf 'Open MPI ring, 2 ranks on 2 namespaced nodes, %d MiB per rank, median of %d checkpoints\n\n' "$MIB" "$ROUNDS"
printf '| level | frozen (ms) | durable (ms) | sent between nodes per checkpoint, all nodes (MiB) |\n|---|---|---|---|\n'
for level in ${LEVELS:-shared local partner xor flush}; do
    case $level in
        shared) opts=(); label="shared directory only" ;;
        local) opts=(--local-dir "$T/$level/local/{node}"); label="--local-dir" ;;
        partner) opts=(--local-dir "$T/$level/local/{node}" --redundancy partner); label="--local-dir --redundancy partner" ;;
        xor) opts=(--local-dir "$T/$level/local/{node}" --redundancy xor:2); label="--local-dir --redundancy xor:2" ;;
        flush) opts=(--local-dir "$T/$level/local/{node}" --flush-every 1); label="--local-dir --flush-every 1 (copy after the commit)" ;;
    esac
    read -r f du s < <(run "$level" 0 "${opts[@]}" 2>>"$T/errors" | head -1)
    printf '| %s | %.1f | %.1f | %s |\n' "$label" "$f" "$du" "$s"
done
[[ ${RECOVER:-1} == 0 ]] && exit 0
printf '\nTime to recover when node B loses power (seed 002: detection, choosing, restart, back to progress)\n\n'
printf '| redundancy | detection (s) | choosing (s) | restart on the spare (s) | back to progress, from the loss (s) |\n|---|---|---|---|---|\n'
for level in partner xor; do
    case $level in
        partner) red=partner ;;
        xor) red=xor:2 ;;
    esac
    out=$(run "r$level" 1 --local-dir "$T/r$level/local/{node}" --redundancy "$red" --recover --spares "${NS[2]}" 2>>"$T/errors")
    read -r det cho res back < <(echo "$out" | sed -n 2p)
    printf '| %s | %s | %s | %s | %s |\n' "$red" "$det" "$cho" "$res" "$back"
done
