#!/bin/bash
# netns-exec.sh HOST COMMAND...: runs a shell command line in the network namespace that holds
# the address HOST (or is named HOST), as `ssh HOST COMMAND...` would on another machine: the
# words of COMMAND are joined with spaces and run by a shell. The multi-node tests use
# namespaces of this machine as nodes, with this script as the remote shell of the coordinator
# (`ckpt coordinator --rsh 'netns-exec.sh {host}'`) and of Open MPI's reference runs.
#
# Entering a network namespace needs root. Run by an ordinary user (the tests' run as a user),
# the script runs itself again through `sudo -n` (scripts/test.sh allows exactly this script)
# and, in the namespace, drops back to that user, as ssh would log them in on the other node.
#
# Each node also gets a hostname of its own (the namespace's name, in a UTS namespace made for
# the command), as real nodes have: Open MPI names its session directory and PMIx its shared
# data store after the hostname, and two daemons on "different nodes" that share this
# machine's hostname and /tmp would share those files and crash each other (seen: a segfault
# in pmix_common_dstor_register_job_info while three nodes started).
set -eu
if [[ $(id -u) -ne 0 ]]; then
    exec sudo -n "$(readlink -f "$0")" "$@"
fi
host=$1
shift
as_user=()
if [[ -n ${SUDO_UID:-} && ${SUDO_UID} != 0 ]]; then
    as_user=(setpriv "--reuid=$SUDO_UID" "--regid=$SUDO_GID" --init-groups --)
    export HOME=$(getent passwd "$SUDO_UID" | cut -d: -f6) USER=${SUDO_USER:-} LOGNAME=${SUDO_USER:-}
fi
for ns in $(ip netns list | awk '{print $1}'); do
    # (The addresses are read whole first: grep -q leaving early would kill `ip` with SIGPIPE.)
    addrs=$(ip -n "$ns" -o addr show 2>/dev/null || true)
    if [[ $ns == "$host" ]] || grep -qw "inet $host/[0-9]*" <<<"$addrs"; then
        exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' \
            "$ns" "${as_user[@]}" /bin/sh -c "$*"
    fi
done
echo "netns-exec.sh: no network namespace has the address or name $host" >&2
exit 1
