#!/bin/bash
# pipeline: a bash pipeline of four processes with data in the pipes between them: seq writes
# far faster than awk passes lines on (awk pauses every 2000 lines), so the first pipe stays
# full; awk's bursts flow through the second pipe to sort, whose sorted output goes through the
# third to md5sum. RESULT is the md5 of the sorted stream (the same for every run). sort keeps
# it all in memory (-S): spilled, its temporary files in /tmp, open at a checkpoint, would have
# the restart check /tmp, where every other test makes and removes files.
#
# Usage: pipeline.sh [SECONDS=4]
echo START
n=$(( ${1:-4} * 40000 ))
seq 1 "$n" \
    | awk '{ print ($1 * $1) % 1000003; if (NR % 2000 == 0) { fflush(); system("sleep 0.05") } }' \
    | sort -n -S 64M \
    | md5sum \
    | awk '{ print "RESULT " $1 }'
