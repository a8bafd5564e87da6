#!/bin/bash
# container.sh: what a container runtime inside a job does, with the real tools. Run under
# `unshare --user --map-root-user --mount` (root in a user namespace of its own: what an
# ordinary user can do), it mounts a tmpfs at DIR/root, binds DIR/data read-only inside it and
# computes in steps, keeping its step counter in a file on the tmpfs. Every step checks that it
# is root with the same uid map, that the counter file holds the step it is at (the tmpfs's
# contents are those of the checkpoint), that the bind still shows DIR/data and refuses writes,
# and folds the counter it read into the hash. Builtins in the loop but for the subshell that
# tries the write (one more child at the start, for the pipe it waits on).
# Prints START, then RESULT <hash> (equal to an uninterrupted run's) and PASS, or FAIL <what>.
#
# Usage: unshare -Urm container.sh DIR [SECONDS=5]
set -u
echo START
dir=$1
secs=${2:-5}
steps=$(( ${secs%.*} * 20 ))
fail() { echo "FAIL $*"; exit 1; }

mkdir -p "$dir/root" "$dir/data" || fail "mkdir"
echo "from the host" > "$dir/data/in" || fail "write data/in"
mount -t tmpfs -o size=4m,mode=0750 scratch "$dir/root" || fail "mount tmpfs"
mkdir "$dir/root/data" || fail "mkdir on the tmpfs"
mount --bind "$dir/data" "$dir/root/data" || fail "bind"
mount -o remount,bind,ro "$dir/root/data" || fail "remount read-only"
read -r uid_map < /proc/self/uid_map
state=$dir/root/state
echo 0 > "$state"

exec {tick}<> <(:)
h=2166136261
for (( s = 0; s < steps; s++ )); do
    read -r n < "$state" || fail "read the counter at step $s"
    (( n == s )) || fail "the counter on the tmpfs says $n at step $s"
    read -r now < /proc/self/uid_map
    [[ $now == "$uid_map" ]] || fail "uid_map is now '$now', was '$uid_map'"
    (( EUID == 0 )) || fail "not root in the user namespace"
    read -r line < "$dir/root/data/in" || fail "read through the bind"
    [[ $line == "from the host" ]] || fail "the bind shows '$line'"
    if ( : > "$dir/root/data/new" ) 2>/dev/null; then
        # What the namespace holds there, to tell a bind made writable from one gone.
        fail "the read-only bind took a write at step $s; mounts: $(grep -F "$dir" /proc/self/mountinfo | tr '\n' '|')"
    fi
    h=$(( ((h ^ n) * 16777619) & 0xffffffff ))
    echo $(( s + 1 )) > "$state"
    read -t 0.05 -u "$tick"
done
printf 'RESULT %08x\n' "$h"
echo PASS
