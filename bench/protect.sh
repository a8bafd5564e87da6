#!/bin/bash
# bench/protect.sh: what `--protect DIR` costs the freeze (docs/PERFORMANCE.md, "Protected
# directories"). For each DIR size (files of FILE_KB KiB) and each number of files the job
# rewrites between checkpoints, runs a job that rewrites CHANGED random files of DIR in place
# every 0.1 s under `ckpt launch --protect DIR`, takes ROUNDS checkpoints and prints the median
# frozen time, the median time the files record took inside it and the bytes copied, next to the
# same job without --protect.
#
# Usage: bench/protect.sh [ROUNDS=5]   (root or a user; needs python3; writes under $TMPDIR)
set -eu
ROUNDS=${1:-5}
FILE_KB=256
CK=${CKPT:-$(dirname "$0")/../target/release/ckpt}
T=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-bench-protect-XXXXXX")
trap 'rm -rf "$T"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR ? a[int((NR+1)/2)] : "-")}'; }

run() { # FILES CHANGED PROTECT(0/1)
    local files=$1 changed=$2 protect=$3 d=$T/data img=$T/img
    rm -rf "$d" "$img"; mkdir -p "$d"
    for i in $(seq "$files"); do head -c $((FILE_KB * 1024)) /dev/urandom > "$d/f$i"; done
    sync
    local opts=(); ((protect)) && opts=(--protect "$d")
    CKPT_LOG=info "$CK" launch --dir "$img" "${opts[@]}" -- python3 -c '
import os, random, sys, time
d, files, changed, kb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print("START", flush=True)
while True:
    for _ in range(changed):
        with open(f"{d}/f{random.randint(1, files)}", "r+b") as f:
            f.seek(random.randrange(kb) * 1024); f.write(os.urandom(1024))
    time.sleep(0.1)
' "$d" "$files" "$changed" "$FILE_KB" > "$T/launch.out" 2>&1 &
    local pid=$!
    until grep -q START "$T/launch.out" 2>/dev/null; do sleep 0.1; done
    : > "$T/frozen"
    for r in $(seq "$ROUNDS"); do
        sleep 0.5
        "$CK" checkpoint --dir "$img" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["frozen_ms"])' >> "$T/frozen"
    done
    "$CK" checkpoint --dir "$img" --kill >/dev/null
    wait $pid || true
    local rec ms bytes
    rec=$(sed 's/\x1b\[[0-9;]*m//g' "$T/launch.out" | grep "files recorded" || true)
    ms=$(echo "$rec" | sed -n 's/.* ms=\([0-9.]*\).*/\1/p' | median)
    bytes=$(echo "$rec" | sed -n 's/.*bytes_copied=\([0-9]*\).*/\1/p' | median)
    printf "%6d files %7d MiB  changed/interval %4d  protect %d  frozen %7.1f ms  files record %7s ms  copied %9s B\n" \
        "$files" $((files * FILE_KB / 1024)) "$changed" "$protect" "$(median < "$T/frozen")" "$ms" "$bytes"
}

for files in 400 4000; do
    for changed in 1 40; do
        run "$files" "$changed" 0
        run "$files" "$changed" 1
    done
done
