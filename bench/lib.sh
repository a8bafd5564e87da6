# Shared by the bench scripts (sourced): a work directory with bench/workload.c built in it,
# checkpoints of a launched job, their numbers.

# workload_dir NAME: makes $work (/var/tmp/ckpt-NAME.XXXXXX), compiles bench/workload.c to
# $work/workload, and on exit ends the workloads still running and removes $work.
workload_dir() {
    work=$(mktemp -d "/var/tmp/ckpt-$1.XXXXXX")
    trap 'pkill -f "$work/workload" 2>/dev/null || true; rm -rf "$work"' EXIT
    gcc -O2 -o "$work/workload" bench/workload.c
}

# settle: before a measured job, the machine's dirty pages written out and (as root) its page
# cache dropped, then a pause. The earlier job's images are still being written back and their
# deleted files' inodes freed; measured without this, each run of a series froze longer than the
# one before (256 processes: 172, 229, 319 ms, the same build three times in a row).
settle() {
    sync
    [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches
    sleep 3
}

# field NAME: the number NAME of a `ckpt checkpoint --json` answer on stdin, rounded.
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" | awk '{printf "%.0f", $1}'; }

# wait_line FILE WORD WHAT: waits (2 min at most) for a line starting with WORD in FILE.
wait_line() {
    for _ in $(seq 1200); do grep -q "^$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "$3 did not print $2" >&2
    return 1
}

# checkpoints DIR N FIELD...: N checkpoints of the job in DIR a second apart, then one with
# --kill; prints one line per FIELD, its N values separated by " / ".
checkpoints() {
    local dir=$1 n=$2 i f json
    shift 2
    declare -A got
    for ((i = 0; i < n; i++)); do
        json=$("$CKPT" checkpoint --dir "$dir" --json)
        for f in "$@"; do got[$f]+="${got[$f]:+ / }$(field "$f" <<< "$json")"; done
        sleep 1
    done
    "$CKPT" checkpoint --dir "$dir" --kill --json > /dev/null
    for f in "$@"; do echo "${got[$f]}"; done
}

# restart_to_running DIR [OPTION...]: restarts the job of DIR (its last checkpoint was taken
# with --kill; `ckpt restart` given OPTION..., e.g. --lazy) and prints the milliseconds until its
# first byte of output (a workload's tick: every process is released together once all are
# rebuilt), then ends it (its output closed, the tick dies of SIGPIPE, its children of their
# parent-death signal). The checkpoint stays the last: it can be restarted again.
restart_to_running() {
    local fifo=$work/restart-fifo t0 t1 pid dir=$1
    shift
    rm -f "$fifo"; mkfifo "$fifo"
    t0=$(date +%s%N)
    "$CKPT" restart --dir "$dir" "$@" > "$fifo" 2> "$work/restart-err" &
    pid=$!
    head -c1 < "$fifo" > /dev/null
    t1=$(date +%s%N)
    wait "$pid" 2>/dev/null || true
    echo $(( (t1 - t0) / 1000000 ))
}

# split LOG CHECKPOINTS PROCESSES: the mean per checkpoint of each phase's time over the
# "process captured" lines of LOG's first CHECKPOINTS checkpoints, as "inject delta fork tables
# memory fds" (ms, one decimal). The first four run on the tracer threads (tables: the walk of
# the page tables the reading needs), the last two on the capture's reading thread, beside them
# (docs/PLAN-SCALE.md).
split() {
    grep "process captured" "$1" | head -n $(($2 * $3)) | awk -v n="$2" '{
        for (i = 1; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] ~ /^(inject|delta|fork|tables|memory|fds)_ms$/) sum[kv[1]] += kv[2]
        }
    }
    END { printf "%.1f %.1f %.1f %.1f %.1f %.1f\n", sum["inject_ms"] / n, sum["delta_ms"] / n, sum["fork_ms"] / n, sum["tables_ms"] / n, sum["memory_ms"] / n, sum["fds_ms"] / n }'
}

# stages LOG CHECKPOINTS: the mean per checkpoint, over LOG's first CHECKPOINTS captures, of the
# frozen time's three stages, as "freeze capture rest" (ms): until the tree was frozen, the
# capture of every process, and from there to the release (the job's other objects, the
# files, the coordinator's answer). Each capture's "every process captured" line is paired
# with the "tree frozen" line before it and the "tree released" line after it (a copy ahead's
# own moment of freeze logs those too).
stages() {
    awk -v n="$2" '
        function ms(line) { for (i = 1; i <= split(line, w, " "); i++) if (w[i] ~ /^ms=/) return substr(w[i], 4) + 0 }
        /tree frozen/ { frozen = ms($0) }
        /every process captured/ { if (done < n) { captured = ms($0); waiting = 1 } }
        /tree released/ && waiting { f += frozen; c += captured - frozen; r += ms($0) - captured; waiting = 0; done++ }
        END { printf "%.0f %.0f %.0f\n", f / n, c / n, r / n }
    ' "$1"
}
