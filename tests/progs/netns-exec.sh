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
#
# A node may also differ from this machine in what a real other machine would (files only root
# writes, in /run/ckpt-test/NS/, where NS is the namespace's name; without them, nothing
# changes):
# - `binds`, lines `COPY PATH`: the command runs in a mount namespace of its own where each
#   COPY is bound over PATH (a spare whose executables and libraries are other files with the
#   same bytes, as on a machine with its own root file system). COPY holds no white space.
# - `env`, lines `NAME=VALUE`: exported for the command (sudo resets the environment, so a file
#   is the one channel that reaches the command on both paths), e.g. another boot's id
#   (CKPT_TEST_BOOT_ID) for a node that stands for another machine.
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
# The path of the node's file NAME, or nothing where there is none. Run by root for an ordinary
# user, the script binds and exports what these files say: a file (or its directory) that
# anyone but root could have written is refused.
node_file() {
    local dir=/run/ckpt-test/$1
    [[ -e $dir/$2 ]] || return 0
    local f
    for f in /run/ckpt-test "$dir" "$dir/$2"; do
        if [[ -L $f || $(stat -c %u "$f") != 0 ]] || (( 8#$(stat -c %a "$f") & 8#022 )); then
            echo "netns-exec.sh: $f is not root's alone (owned by root, written by no one else): not used" >&2
            return 1
        fi
    done
    echo "$dir/$2"
}
for ns in $(ip netns list | awk '{print $1}'); do
    # (The addresses are read whole first: grep -q leaving early would kill `ip` with SIGPIPE.)
    addrs=$(ip -n "$ns" -o addr show 2>/dev/null || true)
    if [[ $ns == "$host" ]] || grep -qw "inet $host/[0-9]*" <<<"$addrs"; then
        node_env=$(node_file "$ns" env)
        if [[ -n $node_env ]]; then
            while IFS= read -r line || [[ -n $line ]]; do
                [[ -z $line || $line == \#* ]] && continue
                if [[ ! $line =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
                    echo "netns-exec.sh: $node_env: not NAME=VALUE: $line" >&2
                    exit 1
                fi
                export "$line"
            done <"$node_env"
        fi
        binds=$(node_file "$ns" binds)
        if [[ -n $binds ]]; then
            # The binds live and die with the command's mount namespace: this machine's mounts
            # are never touched (private propagation).
            exec ip netns exec "$ns" unshare --mount --propagation private --uts -- /bin/sh -c '
                node=$0 binds=$1
                shift
                while read -r copy path || [ -n "$copy" ]; do
                    [ -n "$copy" ] || continue
                    mount --bind "$copy" "$path" || exit 1
                done <"$binds"
                hostname "$node" && exec "$@"' "$ns" "$binds" "${as_user[@]}" /bin/sh -c "$*"
        fi
        exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' \
            "$ns" "${as_user[@]}" /bin/sh -c "$*"
    fi
done
echo "netns-exec.sh: no network namespace has the address or name $host" >&2
exit 1
