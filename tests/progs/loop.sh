#!/bin/bash
# loop.sh: a deterministic bash loop in steps, for checkpoint/restart tests.
#
# Checks that a running bash (its variables and arrays, and the script file it reads as it
# goes, kept open at an offset) survives checkpoint/restart. Builtins only (one child process at
# the start, for the pipe it waits on): each step does integer arithmetic and array updates, then
# waits 10 ms with `read -t` on that pipe (a wait cut short by a restart is harmless).
# Prints START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if the array sum
# kept on the way matches the array.
#
# Usage: loop.sh [SECONDS=5]
echo START
secs=${1:-5}
steps=$(( ${secs%.*} * 100 ))
(( steps > 0 )) || steps=1

# A pipe to wait on (its other end is never written): bash has no builtin sleep, and a sleep
# command would make a child process each step.
exec {tick}<> <(:)

h=1469598103
sum=0
declare -a slots
for (( i = 0; i < 64; i++ )); do slots[i]=0; done

for (( s = 0; s < steps; s++ )); do
    for (( k = 0; k < 100; k++ )); do
        h=$(( (h * 16777619 + s * 131 + k) & 0xffffffff ))
    done
    j=$(( s % 64 ))
    sum=$(( sum - slots[j] + (h & 0xffff) ))
    slots[j]=$(( h & 0xffff ))
    # 10 ms without a busy loop (tests run several jobs at once on few cores): a read that
    # times out on a pipe nobody writes to. Cut short by a restart, it is only a shorter step.
    read -r -t 0.01 -u "$tick" _ || true
done

check=0
for v in "${slots[@]}"; do check=$(( check + v )); done
printf 'RESULT %08x%08x\n' "$h" "$sum"
if (( check == sum )); then echo PASS; else echo "FAIL array sum $check != running sum $sum"; exit 1; fi
