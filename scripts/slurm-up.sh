#!/usr/bin/env bash
# slurm-up.sh: a one-node Slurm cluster on this machine, for the tests of ckpt under Slurm
# (tests/tests/slurm.rs). Installs Debian's slurmctld, slurmd, slurm-client and munge when they
# are missing, writes /etc/slurm/slurm.conf (one node named after this host, its CPUs as slurmd
# sees them), starts munged, slurmctld and slurmd as daemons (no systemd here: the binaries
# themselves), and waits until `sinfo` shows the node idle. Run as root.
#
#   bash scripts/slurm-up.sh         # start it, or use the Slurm that already answers
#   bash scripts/slurm-up.sh stop    # stop the slurmctld and slurmd this script started
#
# Idempotent: a Slurm that answers with a node up is used as it is; daemons of an earlier run
# are reused. It refuses to overwrite a slurm.conf it did not write. State, spool, logs and pid
# files are in /var/tmp/ckpt-slurm.
set -euo pipefail

state=/var/tmp/ckpt-slurm
conf=/etc/slurm/slurm.conf
marker="# Written by ckpt's scripts/slurm-up.sh: a one-node cluster for its tests."
# The layout of the file this script writes now: a cluster of ours running an older one is
# restarted with it (the tests expect its partitions).
layout="# Layout 2: partitions debug and urgent, urgent preempting debug."

# The pid in a pid file, if that process runs.
running() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}

if [[ ${1:-} == stop ]]; then
    for d in slurmd slurmctld; do
        if running "$state/$d.pid"; then
            kill "$(cat "$state/$d.pid")"
            echo "slurm-up.sh: stopped $d"
        fi
    done
    exit 0
fi

if grep -qxF "$marker" "$conf" 2>/dev/null && ! grep -qxF "$layout" "$conf"; then
    echo "slurm-up.sh: $conf is an older one of ours: restarting Slurm with the current one"
    for d in slurmd slurmctld; do
        if running "$state/$d.pid"; then
            kill "$(cat "$state/$d.pid")"
        fi
    done
    for _ in $(seq 100); do
        running "$state/slurmd.pid" || running "$state/slurmctld.pid" || break
        sleep 0.1
    done
fi

# The node's state as sinfo says it (idle, mix, alloc, down, drain, ...), or nothing.
node_state() {
    sinfo --noheader --Node --format=%t 2>/dev/null | head -n1 | tr -d '*~#!%$@^-'
}

# A Slurm that answers with a node that runs jobs: use it, whoever started it. (Not asked when
# this script's own controller is not running: sinfo would wait 10 s for it.)
ours_down() { grep -qxF "$marker" "$conf" 2>/dev/null && ! running "$state/slurmctld.pid"; }
if ! ours_down && command -v sinfo >/dev/null && [[ $(node_state) =~ ^(idle|mix|alloc)$ ]]; then
    echo "slurm-up.sh: Slurm is up (node $(node_state))"
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "slurm-up.sh: no Slurm answers, and starting one needs root" >&2
    exit 1
fi

started=$(date +%s%N)
missing=()
[[ -x /usr/sbin/slurmctld ]] || missing+=(slurmctld)
[[ -x /usr/sbin/slurmd ]] || missing+=(slurmd)
command -v sbatch >/dev/null || missing+=(slurm-client)
[[ -x /usr/sbin/munged ]] || missing+=(munge)
if ((${#missing[@]})); then
    echo "== slurm-up.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The basic plugins (a dependency) hold every plugin slurm.conf below names; the recommended
    # slurm-wlm-plugins would add a dozen packages nothing here uses.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- munge: the authentication every Slurm message carries ---
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    # munged refuses to run as root; the package's service runs it as munge.
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n | unmunge >/dev/null || { echo "slurm-up.sh: munged does not answer (see /var/log/munge/munged.log)" >&2; exit 1; }
fi

# --- slurm.conf ---
if [[ -e $conf ]] && ! grep -qxF "$marker" "$conf"; then
    echo "slurm-up.sh: $conf exists and was not written by this script; start that cluster's daemons yourself" >&2
    exit 1
fi
host=$(hostname -s)
# This node as slurmd measures it (CPUs, sockets, cores, memory): a node configured with more
# than it has would be drained.
node=$(slurmd -C | head -n1)
[[ $node == "NodeName=$host "* ]] || { echo "slurm-up.sh: slurmd -C said: $node" >&2; exit 1; }
mkdir -p "$state/ctld" "$state/d" /etc/slurm
cat >"$conf.new" <<EOF
$marker
$layout
ClusterName=ckpt
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
# No cgroups: processes are tracked by their parents, and tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Batch jobs may be requeued (scontrol requeue, ckpt's requeue on Slurm's warning).
JobRequeue=1
# Seconds between SIGTERM and SIGKILL when a job is ended (time limit, scancel, requeue).
KillWait=30
ReturnToService=2
# Preemption, as a site that lets urgent work in: a job of urgent requeues one of debug, which
# is sent its --signal warning at once (not SIGTERM) and given GraceTime seconds to end.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=urgent Nodes=$host MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
mv "$conf.new" "$conf"

# --- the daemons (each forks into the background) ---
if ! running "$state/slurmctld.pid"; then
    # -c: a fresh controller forgets the jobs of an earlier cluster.
    slurmctld -c
fi
if ! running "$state/slurmd.pid"; then
    slurmd
fi
for _ in $(seq 300); do
    [[ $(node_state) == idle ]] && break
    sleep 0.1
done
if [[ $(node_state) != idle ]]; then
    echo "slurm-up.sh: the node is not idle after 30 s: $(sinfo --Node --long 2>&1)" >&2
    echo "--- $state/slurmctld.log:" >&2
    tail -n 20 "$state/slurmctld.log" >&2 || true
    echo "--- $state/slurmd.log:" >&2
    tail -n 20 "$state/slurmd.log" >&2 || true
    exit 1
fi
echo "slurm-up.sh: Slurm is up (node $host idle) after $((($(date +%s%N) - started) / 1000000)) ms"
