#!/bin/bash
# loop.sh: a deterministic bash loop in steps, for checkpoint/restart tests.
#
# Checks that a running bash (its variables and arrays, and the script file it reads as it
# goes, kept open at an offset) survives checkpoint/restart. Builtins only (no child process):
# each step does integer arithmetic and array updates, then waits 10 ms by polling
# $EPOCHREALTIME (bash has no builtin sleep; a wait cut short by a restart is harmless).
# Prints START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if the array sum
# kept on the way matches the array.
#
# Usage: loop.sh [SECONDS=5]
echo START
secs=${1:-5}
steps=$(( ${secs%.*} * 100 ))
(( steps > 0 )) || steps=1

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
    now=${EPOCHREALTIME/./}
    until=$(( now + 10000 ))
    while (( now < until && until - now <= 10000 )); do now=${EPOCHREALTIME/./}; done
done

check=0
for v in "${slots[@]}"; do check=$(( check + v )); done
printf 'RESULT %08x%08x\n' "$h" "$sum"
if (( check == sum )); then echo PASS; else echo "FAIL array sum $check != running sum $sum"; exit 1; fi
