#!/bin/bash
# netns-exec.sh HOST COMMAND...: runs a shell command line in the network namespace that holds
# the address HOST (or is named HOST), as `ssh HOST COMMAND...` would on another machine: the
# words of COMMAND are joined with spaces and run by a shell. The multi-node tests use
# namespaces of this machine as nodes, with this script as the remote shell of the coordinator
# (`ckpt coordinator --rsh 'netns-exec.sh {host}'`) and of Open MPI's reference runs.
set -eu
host=$1
shift
for ns in $(ip netns list | awk '{print $1}'); do
    # (The addresses are read whole first: grep -q leaving early would kill `ip` with SIGPIPE.)
    addrs=$(ip -n "$ns" -o addr show 2>/dev/null || true)
    if [[ $ns == "$host" ]] || grep -qw "inet $host/[0-9]*" <<<"$addrs"; then
        exec ip netns exec "$ns" /bin/sh -c "$*"
    fi
done
echo "netns-exec.sh: no network namespace has the address or name $host" >&2
exit 1
