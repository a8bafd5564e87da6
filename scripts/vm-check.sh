#!/usr/bin/env bash
# vm-check.sh: does ckpt restart a job on ANOTHER KERNEL? Boots Debian 12's own kernel 6.1
# (apt-get download, unpacked into target/vm/k, never installed) in QEMU (TCG: software
# emulation, no KVM needed), on this machine's own root file system shared read-only over
# virtio-9p, with a scratch ext4 disk image mounted at the same path on both sides
# ($CKPT_VM_SCRATCH, default /scratch). It boots twice: the root under an overlay with a tmpfs
# upper (`@overlay` in the names: where programs write as usual), then the plain read-only 9p
# root with tmpfs on /tmp, /run, /var/tmp and /root (`@9p`). The checks:
#   host-local                          launch, checkpoint --kill, restart here (the control)
#   vm-ckpt-runs@R                      ckpt --version in the VM (and ckpt kernel --json if it exists)
#   vm-local-static-image-on-ext4@R     compute-static from the scratch disk, launched,
#   vm-local-static-image-on-tmpfs@R      checkpointed --kill and restarted in the VM, the image
#                                         on the scratch disk, then on tmpfs
#   vm-local-dynamic-from-root@R        the same with compute and its libraries from the root
#   host-to-vm-{compute,compute-static,bash}@R   checkpointed here (programs on the scratch
#                                       disk, libraries and bash from /usr), restarted in the VM;
#                                       extensions TCG's CPU lacks go to --ignore-cpu, said
#   host-to-vm-compute-refused@R        the dynamic compute's restart without --ignore-cpu must be
#                                       refused naming them: its libraries chose code for them
#                                       (SHA, VPCLMULQDQ...), so its SIGILL after --ignore-cpu is
#                                       expected: `NOTE host-to-vm-compute@R`, not a failure
#   vm-to-host-{compute,compute-static,bash}@R   checkpointed in the VM, restarted here; the
#                                       VM's root jobs run (setpriv) without the capabilities this
#                                       machine's root lacks in its bounding set, as a job of a
#                                       root with the same rights on both machines would
#   vm-to-host-caps-refused@R           one without that: this machine must refuse its restart
#                                       naming them (CAP_SYS_RESOURCE); skipped (NOTE) where this
#                                       machine's root has the full bounding set
#   host-to-vm-{compute-static,bash}-as-user@R, vm-to-host-{compute,compute-static,bash}-as-user@R
#                                       the same as the ordinary user $CKPT_VM_USER (runuser, on
#                                       both sides; its directories 0700 and its own)
#   host-to-vm-library-changed@R        a bash that preloaded a library of its own from the scratch
#                                       disk, checkpointed here; in the VM another build of that
#                                       library is bound over its path: the restart must be refused
#                                       naming it
#   host-to-vm-library-copied@R         the same with a copy of the library bound there (another
#                                       inode, the same contents): restarted
#   vm-core/TEST@R                      the end-to-end tests of tests/tests/core.rs ($CKPT_VM_CORE_TESTS,
#                                       a listed subset by default) run in the VM, as root, in the
#                                       overlay boot ($CKPT_VM_CORE_ROOTS)
# A check passes when the restarted program prints the RESULT of an uninterrupted run and PASS.
# Each prints `PASS name`, `FAIL name: why` or `NOTE name: what`, quoting ckpt exactly; the
# script exits 1 if any failed. Root only (loop mounts, apt-get). About 10 minutes on 2 cores,
# 4-5 of them the core tests (more with a build running).
#
#   bash scripts/vm-check.sh
# Environment: CKPT_BIN (default target/release/ckpt), CKPT_VM_SCRATCH (default /scratch: an
# empty directory of this machine where the scratch disk is mounted, here and in the VM),
# CKPT_VM_KERNEL (a linux-image package; default the newest linux-image-6.1.0-N-amd64 or its
# -unsigned), CKPT_VM_TIMEOUT (seconds for each boot, default 900), CKPT_VM_CPU (QEMU's -cpu,
# default max,mpx=off,pku=off), CKPT_VM_ROOTS (the boots, default "overlay 9p"), CKPT_VM_USER
# (the ordinary user, default ckpt-test: in this machine's /etc/passwd, which the VM sees).
# Files in target/vm/: k/ (the kernel), initrd.img, scratch.img, vm-check.log (this output),
# console-R.log, vm-R.log, results*.txt, cases/ (each case's outputs and ckpt's messages).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VM=$ROOT/target/vm
SCRATCH=${CKPT_VM_SCRATCH:-/scratch}
CKPT_BIN=${CKPT_BIN:-$ROOT/target/release/ckpt}
VM_TIMEOUT=${CKPT_VM_TIMEOUT:-900}
# QEMU's CPU. TCG's `max` has MPX and protection keys, whose XSAVE state (bits 4 and 9) every
# thread holds there: a machine without them (this one, an AMD EPYC guest) refuses every VM
# checkpoint for that, before the kernel is looked at. Without them, the VM's XSAVE components
# are a subset of this machine's, and what is left differs by the kernel. (TCG lacks SHA,
# VPCLMULQDQ, RDSEED, FSRM: host-to-VM restarts take --ignore-cpu, and say so.)
VM_CPU=${CKPT_VM_CPU:-max,mpx=off,pku=off}
# The ordinary user of the -as-user checks (in this machine's /etc/passwd, which the VM sees).
USER_NAME=${CKPT_VM_USER:-ckpt-test}
PROGS=$ROOT/tests/progs/bin
# The programs: compute SECONDS MIB (a few seconds of 10 ms steps; TCG is slow), a bash loop.
COMPUTE_ARGS=(4 16)
BASH_LOOP='echo START; i=0; while [ $i -lt 40 ]; do i=$((i+1)); sleep 0.1; done; echo "RESULT $i"; echo PASS'
# The end-to-end tests of tests/tests/core.rs run in each boot (names as libtest gives them;
# CKPT_VM_CORE_TESTS, space-separated, replaces the list; empty: none), and how long they may take.
read -r -a CORE_TESTS <<<"${CKPT_VM_CORE_TESTS-compute threads state mmaps five_rounds_threads one_image_restarted_twice credentials_and_file_owner process_and_thread_attributes clocks_continue_across_restarts the_vdso_of_another_kernel_is_reached_through_jumps_at_the_old_place memory_copied_while_the_job_runs_goes_unnoticed incremental_generations_store_what_changed_and_restart_from_the_chain lazy_restart_serves_pages_while_the_job_runs}"
CORE_TIMEOUT=${CKPT_VM_CORE_TIMEOUT:-600}
# The boots they run in (4-5 minutes each under TCG): the overlay root, where files are as a
# container's; CKPT_VM_CORE_ROOTS="overlay 9p" for both.
CORE_ROOTS=${CKPT_VM_CORE_ROOTS:-overlay}

[[ $(id -u) -eq 0 ]] || { echo "vm-check.sh: run as root (loop mounts, apt-get)" >&2; exit 1; }
[[ -x $CKPT_BIN ]] || { echo "vm-check.sh: no ckpt at $CKPT_BIN: cargo build --release -p ckpt-launch --features test-hooks, or set CKPT_BIN" >&2; exit 1; }
mkdir -p "$VM"
exec > >(tee "$VM/vm-check.log") 2>&1

T0=$(date +%s.%N)
TP=$T0
PHASE=
# phase NAME: the time the phase before took, then NAME's heading.
phase() {
    if [[ -n $PHASE ]]; then echo "   ($PHASE: $(since "$TP") s)"; fi
    TP=$(date +%s.%N)
    PHASE=$1
    if [[ $1 != end ]]; then echo "== $1"; fi
}

# ---------------------------------------------------------------------------------------------
# The checks' helpers, run here and, copied into run.sh with `declare -f`, in the VM. Each case
# has a directory C: C/img (the image), C/launch.out|err, C/checkpoint.json|err, C/restart.out|err.
# ---------------------------------------------------------------------------------------------
say() { echo "$*" | tee -a "$RESULTS"; }
# oneline FILE…: the files' non-empty lines joined with " | ", colour codes removed.
oneline() {
    local f
    for f in "$@"; do
        if [[ -f $f ]]; then sed 's/\x1b\[[0-9;]*m//g' "$f"; fi
    done | awk 'NF { printf "%s%s", sep, $0; sep = " | " }'
}
# since T: seconds since the date +%s.%N T, one decimal.
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }

# Who runs ckpt (launch, checkpoint, restart): AS is the command's prefix, OWNER the user who
# owns the case's directories (empty: root). as_root [CAPS]: root, its bounding set without CAPS
# (setpriv names, space-separated: sys_resource) when given; as_user USER: runuser -u USER.
as_root() {
    OWNER=
    AS=()
    if [[ -n ${1:-} ]]; then
        AS=(setpriv "--bounding-set=$(echo "$1" | sed -E 's/(^| +)/,-/g; s/^,//')" --inh-caps=-all)
    fi
}
as_user() {
    OWNER=$1
    AS=(runuser -u "$1" --)
}

# job_caps NAME C: the capability sets of the launcher and every process below it (C/caps.txt),
# read without starting a program (each costs a lot under TCG, while the job runs on).
job_caps() {
    local name=$1 c=$2 p t k v comm line out=""
    local todo=("$LAUNCHER") kids
    while ((${#todo[@]})); do
        p=${todo[0]}
        todo=("${todo[@]:1}")
        line=
        comm=
        while read -r k v; do
            case $k in
            Name:) comm=$v ;;
            CapPrm: | CapEff: | CapBnd:) line+=" ${k:3:3} $v" ;;
            esac
        done 2>/dev/null <"/proc/$p/status" || continue
        out+="${out:+; }$p $comm$line"
        for t in /proc/"$p"/task/*/children; do
            kids=()
            read -r -a kids 2>/dev/null <"$t" || true
            todo+=("${kids[@]}")
        done
    done
    echo "$out" >"$c/caps.txt"
    echo "   $name: capabilities (pid name Prm Eff Bnd): $out"
}

# launch_job NAME C CWD ARGV…: `ckpt launch` in the background (pid in LAUNCHER) until the
# program printed START; as AS, C and CWD OWNER's, 0700.
launch_job() {
    local name=$1 c=$2 cwd=$3 i
    shift 3
    rm -rf "$c"
    mkdir -p "$c" "$cwd"
    if [[ -n ${OWNER:-} ]]; then
        chown "$OWNER:" "$c" "$cwd"
        chmod 0700 "$c" "$cwd"
    fi
    (cd "$cwd" && exec "${AS[@]}" "$CKPT" launch --dir "$c/img" -- "$@" >"$c/launch.out" 2>"$c/launch.err" </dev/null) &
    LAUNCHER=$!
    for ((i = 0; i < 1200; i++)); do
        grep -q '^START' "$c/launch.out" 2>/dev/null && return 0
        kill -0 "$LAUNCHER" 2>/dev/null || break
        sleep 0.1
    done
    say "FAIL $name: the launched program never printed START: $(oneline "$c/launch.err" "$c/launch.out")"
    kill -9 "$LAUNCHER" 2>/dev/null || true
    wait "$LAUNCHER" 2>/dev/null || true
    return 1
}

# checkpoint_kill NAME C: `ckpt checkpoint --kill` of the job launch_job started; the launcher ends.
checkpoint_kill() {
    local name=$1 c=$2 i
    if ! timeout 300 "${AS[@]}" "$CKPT" checkpoint --dir "$c/img" --kill --json >"$c/checkpoint.json" 2>"$c/checkpoint.err"; then
        say "FAIL $name: ckpt checkpoint --kill failed: $(oneline "$c/checkpoint.err")"
        kill -9 "$LAUNCHER" 2>/dev/null || true
        wait "$LAUNCHER" 2>/dev/null || true
        return 1
    fi
    for ((i = 0; i < 300; i++)); do
        kill -0 "$LAUNCHER" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$LAUNCHER" 2>/dev/null || true
    wait "$LAUNCHER" 2>/dev/null || true
    if grep -q '^RESULT' "$c/launch.out"; then
        say "FAIL $name: the program ended before its checkpoint (make it run longer)"
        return 1
    fi
    echo "   $name: checkpointed $(cat "$c/checkpoint.json")"
}

# restart_job NAME C EXPECT [MODE]: `ckpt restart` as AS in the foreground; passes when it exits
# 0 and the program printed `RESULT EXPECT` and PASS. MODE `cpu`: a refusal naming extensions
# this CPU lacks is retried once with the --ignore-cpu list it gives, and said. MODE
# `cpu-refusal`: as `cpu`, but that refusal is expected and passes as NAME-refused, and a SIGILL
# (exit 132) after --ignore-cpu, the risk it names, is a NOTE. MODE `caps-refusal`: passes when
# ckpt refuses the restart naming every one of CAPS_LACKED (CAP_SYS_RESOURCE…). MODE
# `refusal:TEXT`: passes when ckpt refuses the restart with TEXT in its message (after the
# --ignore-cpu retry of `cpu`, so that the refusal looked for is the one that shows).
restart_job() {
    local name=$1 c=$2 expect=$3 mode=${4:-} rc note="" list="" refused="" why out
    local args=()
    while :; do
        rc=0
        (cd / && timeout 300 "${AS[@]}" "$CKPT" restart --dir "$c/img" "${args[@]}" >"$c/restart.out" 2>"$c/restart.err" </dev/null) || rc=$?
        if [[ $rc -ne 0 && ($mode == cpu* || $mode == refusal:*) && ${#args[@]} -eq 0 ]] && grep -q -- 'this CPU lacks .* --ignore-cpu [A-Za-z0-9_,.-]' "$c/restart.err"; then
            list=$(grep -o -- '--ignore-cpu [A-Za-z0-9_,.-]*' "$c/restart.err" | head -1 | cut -d' ' -f2)
            cp "$c/restart.err" "$c/restart-without-ignore-cpu.err"
            if [[ $mode == cpu-refusal ]]; then
                say "PASS ${name%@*}-refused@${name##*@}: refused as expected: $(oneline "$c/restart.err")"
                refused=1
                note=" [restarted with --ignore-cpu $list]"
            else
                note=" [restarted with --ignore-cpu $list; without it ckpt said: $(oneline "$c/restart.err")]"
            fi
            args=(--ignore-cpu "$list")
            continue
        fi
        break
    done
    why=$(oneline "$c/restart.err")
    out=$(oneline "$c/restart.out")
    if [[ $mode == refusal:* ]]; then
        if [[ $rc -ne 0 ]] && grep -qF -- "${mode#refusal:}" "$c/restart.err"; then
            say "PASS $name: refused as expected (exit $rc): $why${note}"
        else
            say "FAIL $name: expected a refusal naming ${mode#refusal:}; ckpt restart exited $rc: ${why:-(nothing on stderr)}${out:+; the program printed: $out}${note}"
        fi
        return 0
    fi
    if [[ $mode == caps-refusal ]]; then
        local cap missing=""
        for cap in $CAPS_LACKED; do
            grep -q "CAP_${cap^^}" "$c/restart.err" || missing+="${missing:+, }CAP_${cap^^}"
        done
        if [[ $rc -ne 0 && -z $missing ]]; then
            say "PASS $name: refused as expected (exit $rc): $why"
        else
            say "FAIL $name: expected a refusal naming $(for cap in $CAPS_LACKED; do printf 'CAP_%s ' "${cap^^}"; done)(not named: ${missing:-none}); ckpt restart exited $rc: ${why:-(nothing on stderr)}${out:+; the program printed: $out}"
        fi
        return 0
    fi
    if [[ $mode == cpu-refusal && -z $refused ]]; then
        say "NOTE ${name%@*}-refused@${name##*@}: not refused: this CPU has the extensions the checkpoint's had"
    fi
    if [[ $rc -eq 0 ]] && grep -qx PASS "$c/restart.out" && grep -qx "RESULT $expect" "$c/restart.out"; then
        say "PASS $name${note}${why:+ [ckpt said: $why]}"
    elif [[ -n $refused && $rc -eq 132 ]]; then
        say "NOTE $name: with --ignore-cpu $list the program stopped with SIGILL (exit 132), the risk --ignore-cpu names (code the host's libraries chose for them at start): ${why:-(nothing on stderr)}${out:+; the program printed: $out}"
    else
        say "FAIL $name: ckpt restart exited $rc: ${why:-(nothing on stderr)}${out:+; the program printed: $out}${note}"
    fi
}

# one_cycle NAME C CWD EXPECT WAIT ARGV…: launch, WAIT seconds, checkpoint --kill, restart here.
one_cycle() {
    local name=$1 c=$2 cwd=$3 expect=$4 wait=$5
    shift 5
    launch_job "$name" "$c" "$cwd" "$@" || return 0
    sleep "$wait"
    checkpoint_kill "$name" "$c" || return 0
    restart_job "$name" "$c" "$expect"
}

# ---------------------------------------------------------------------------------------------
# What runs in the VM (run.sh calls it; the variables come with it).
# ---------------------------------------------------------------------------------------------
vm_main() {
    local t0 tp m=$CKPT_VM_ROOT v c
    t0=$(date +%s.%N)
    tp=$t0
    vphase() {
        echo "   (vm) $1: $(since "$tp") s"
        tp=$(date +%s.%N)
    }
    echo "   (vm) kernel $(uname -r), root file system: $m ($(awk '$2 == "/" { print $3 }' /proc/mounts | tail -1)), cpus $(nproc)"
    echo "   (vm) cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)"
    # The host's descriptor limits (NOFILE: this script's soft, hard there), here and for init,
    # whose runuser's pam_limits starts from (else 1024, 4096): an unprivileged restart raises a
    # restored process's limit to its highest descriptor + 4096 while it rebuilds descriptors,
    # and cannot above the hard limit (with 4096: "restore pid 2: raise the descriptor limit of
    # pid N to 4099: Operation not permitted (os error 1)").
    prlimit --pid 1 --nofile="${NOFILE[0]}:${NOFILE[1]}"
    ulimit -HSn "${NOFILE[1]}" && ulimit -Sn "${NOFILE[0]}"
    echo "   (vm) descriptor limits as the host's: root's soft $(ulimit -Sn), hard $(ulimit -Hn); $USER_NAME's (runuser) $(runuser -u "$USER_NAME" -- bash -c 'echo soft $(ulimit -Sn), hard $(ulimit -Hn)')"

    # a. ckpt runs at all
    if v=$("$CKPT" --version 2>&1); then
        say "PASS vm-ckpt-runs@$m ($v on $(uname -r))"
    else
        say "FAIL vm-ckpt-runs@$m: ckpt --version: $v"
    fi
    if "$CKPT" --help 2>/dev/null | grep -q '^  kernel '; then
        if v=$("$CKPT" kernel --json 2>&1); then
            say "PASS vm-ckpt-kernel@$m: $v"
        else
            say "FAIL vm-ckpt-kernel@$m: ckpt kernel --json: $v"
        fi
    else
        echo "   (vm) ckpt has no 'kernel' subcommand: vm-ckpt-kernel skipped"
    fi
    vphase "ckpt runs"

    # b. inside the VM alone. compute-static from the scratch disk (no file through 9p): the
    # image on the scratch ext4 disk, then on tmpfs; then compute, with its executable and
    # libraries through the root file system.
    local d=$SCRATCH/vm-$m
    mkdir -p "$d" /tmp/ckpt-vm
    one_cycle "vm-local-static-image-on-ext4@$m" "$d/static-ext4" "$d/static-ext4.cwd" "$COMPUTE_RESULT" 1 \
        "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
    vphase "vm-local-static-image-on-ext4@$m"
    one_cycle "vm-local-static-image-on-tmpfs@$m" /tmp/ckpt-vm/static-tmpfs /tmp/ckpt-vm/static-tmpfs.cwd "$COMPUTE_RESULT" 1 \
        "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
    mkdir -p "$d/static-tmpfs"
    cp /tmp/ckpt-vm/static-tmpfs/*.out /tmp/ckpt-vm/static-tmpfs/*.err /tmp/ckpt-vm/static-tmpfs/*.json "$d/static-tmpfs/" 2>/dev/null || true
    vphase "vm-local-static-image-on-tmpfs@$m"
    one_cycle "vm-local-dynamic-from-root@$m" "$d/dynamic" "$d/dynamic.cwd" "$COMPUTE_RESULT" 1 \
        "$PROGS/compute" "${COMPUTE_ARGS[@]}"
    vphase "vm-local-dynamic-from-root@$m"

    # c. host -> VM: the images the host left on the scratch disk (a refused restart leaves an
    # image as it was: each boot restarts them); C/user: restarted as that user, C/mode:
    # restart_job's MODE (cpu by default)
    for c in "$SCRATCH"/h2v/*/; do
        c=${c%/}
        [[ -f $c/expect ]] || continue
        if [[ -f $c/user ]]; then as_user "$(cat "$c/user")"; else as_root; fi
        if [[ $(cat "$c/mode" 2>/dev/null) == library ]]; then
            library_restarts "$c" "$m"
        else
            restart_job "host-to-vm-$(basename "$c")@$m" "$c" "$(cat "$c/expect")" "$(cat "$c/mode" 2>/dev/null || echo cpu)"
        fi
        mkdir -p "$d/h2v-$(basename "$c")"
        cp "$c"/restart* "$d/h2v-$(basename "$c")/" 2>/dev/null || true
        vphase "host-to-vm-$(basename "$c")@$m"
    done

    # d. VM -> host: checkpointed here, restarted on the host after the VM ends. Root's jobs
    # run with the host root's bounding set (without CAPS_LACKED, the capabilities the host's
    # root lacks), as a job run by a root with the same rights on both machines; one
    # (caps-refused) without, whose restart the host must refuse, naming them. Then the same as
    # the ordinary user USER.
    d=$SCRATCH/v2h-$m
    mkdir -p "$d"
    v2h() {
        local name=$1 expect=$2
        shift 2
        if launch_job "vm-to-host-$name@$m" "$d/$name" "$d/$name.cwd" "$@"; then
            job_caps "vm-to-host-$name@$m" "$d/$name"
            if checkpoint_kill "vm-to-host-$name@$m" "$d/$name"; then
                echo "$expect" >"$d/$name/expect"
                [[ -z $OWNER ]] || echo "$OWNER" >"$d/$name/user"
            fi
        fi
    }
    as_root "$CAPS_LACKED"
    local as="as they are (the host root has the full bounding set)"
    ((${#AS[@]} == 0)) || as=${AS[*]}
    echo "   (vm) root's jobs for the host: $as"
    v2h compute "$COMPUTE_RESULT" "$SCRATCH/bin/compute" "${COMPUTE_ARGS[@]}"
    v2h compute-static "$COMPUTE_RESULT" "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
    v2h bash 40 bash -c "$BASH_LOOP"
    as_root
    if [[ -n $CAPS_LACKED ]]; then
        v2h caps-refused "$COMPUTE_RESULT" "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
        [[ ! -f $d/caps-refused/expect ]] || echo caps-refusal >"$d/caps-refused/mode"
    else
        say "NOTE vm-to-host-caps-refused@$m: skipped: the host's root has the full bounding set"
    fi
    as_user "$USER_NAME"
    v2h compute-as-user "$COMPUTE_RESULT" "$SCRATCH/bin/compute" "${COMPUTE_ARGS[@]}"
    v2h compute-static-as-user "$COMPUTE_RESULT" "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
    v2h bash-as-user 40 bash -c "$BASH_LOOP"
    as_root
    vphase "vm-to-host checkpoints@$m"

    # e. ckpt's own end-to-end tests of core.rs on this kernel
    if [[ -x $SCRATCH/bin/core-tests && " $CORE_ROOTS " == *" $m "* ]]; then
        core_tests "$m"
        vphase "core end-to-end tests@$m"
    fi
    echo "   (vm) all checks: $(since "$t0") s"
}

# library_restarts C M: the host's checkpoint of a bash that preloaded $SCRATCH/lib/libvmmark.so,
# restarted in the VM twice: with another build of that library bound over its path (other
# contents, other build-id: refused naming it), then with a copy of the same library (another
# inode, the same contents: restarted). The binds end with the boot.
library_restarts() {
    local c=$1 m=$2 lib=$SCRATCH/lib/libvmmark.so
    mount --bind "$SCRATCH/lib/libvmmark-v2.so" "$lib"
    restart_job "host-to-vm-library-changed@$m" "$c" "$(cat "$c/expect")" "refusal:$lib"
    umount "$lib"
    mkdir -p "$c/changed"
    cp "$c"/restart* "$c/changed/" 2>/dev/null || true
    mount --bind "$SCRATCH/lib/libvmmark-copy.so" "$lib"
    restart_job "host-to-vm-library-copied@$m" "$c" "$(cat "$c/expect")" cpu
    umount "$lib"
}

# core_tests M: the end-to-end tests CORE_TESTS of tests/tests/core.rs (the test binary the host
# built, on the scratch disk), as root, one at a time, their sandboxes on the scratch disk and
# the test programs from a copy there (the harness runs make, which needs a writable
# directory). One line each: PASS vm-core/NAME@M, or FAIL with the test's panic.
core_tests() {
    local m=$1 out=$SCRATCH/vm-$1/core-tests.out t status why
    mkdir -p "$SCRATCH/tmp-$m"
    (cd / && TMPDIR=$SCRATCH/tmp-$m CKPT_BIN=$CKPT CKPT_TEST_PROGS=$SCRATCH/w/tests/progs \
        timeout "$CORE_TIMEOUT" "$SCRATCH/bin/core-tests" --exact --test-threads=1 "${CORE_TESTS[@]}") >"$out" 2>&1 || true
    for t in "${CORE_TESTS[@]}"; do
        status=$(awk -v t="$t" '$1 == "test" && $2 == t && $3 == "..." { print $4 }' "$out" | tail -1)
        case $status in
        ok) say "PASS vm-core/$t@$m" ;;
        ignored) say "NOTE vm-core/$t@$m: ignored: $(awk -v t="$t" '$1 == "test" && $2 == t { $1 = $2 = $3 = $4 = ""; print }' "$out" | tail -1)" ;;
        FAILED)
            why=$(awk -v t="$t" '$0 == "---- " t " stdout ----" { on = 1; next } on && /^(---- |failures:$)/ { exit } on' "$out" | grep -v '^note: run with' | head -12 | awk 'NF { printf "%s%s", sep, $0; sep = " | " }')
            say "FAIL vm-core/$t@$m: $why"
            ;;
        *) say "FAIL vm-core/$t@$m: no result (the test binary ran past ${CORE_TIMEOUT}s or did not start): $(tail -3 "$out" | awk 'NF { printf "%s%s", sep, $0; sep = " | " }')" ;;
        esac
    done
}

cleanup() {
    local p
    for p in $(jobs -p); do kill -9 "$p" 2>/dev/null || true; done
    mountpoint -q "$SCRATCH" && umount "$SCRATCH" 2>/dev/null || true
}
trap cleanup EXIT
declare -A QEMU_RC

# ---------------------------------------------------------------------------------------------
phase "packages"
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
command -v depmod >/dev/null && command -v modprobe >/dev/null || missing+=(kmod)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v capsh >/dev/null || missing+=(libcap2-bin)
if ((${#missing[@]})); then
    echo "   installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

phase "kernel"
if [[ -z ${CKPT_VM_KERNEL:-} ]]; then
    pick() { apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$' | awk '{ print $1 }' | sort -V | tail -1; }
    CKPT_VM_KERNEL=$(pick)
    [[ -n $CKPT_VM_KERNEL ]] || { apt-get update -qq; CKPT_VM_KERNEL=$(pick); }
    [[ -n $CKPT_VM_KERNEL ]] || { echo "vm-check.sh: apt knows no linux-image-6.1.0-N-amd64" >&2; exit 1; }
fi
KREL=$(echo "$CKPT_VM_KERNEL" | sed -E 's/^linux-image-//; s/-unsigned$//')
if [[ ! -f $VM/k/boot/vmlinuz-$KREL ]]; then
    rm -rf "$VM/k" "$VM"/linux-image-*.deb
    (cd "$VM" && apt-get download -q "$CKPT_VM_KERNEL" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    dpkg-deb -x "$VM"/linux-image-*.deb "$VM/k"
    rm -f "$VM"/linux-image-*.deb
    depmod -b "$VM/k" "$KREL"
fi
echo "   $CKPT_VM_KERNEL ($KREL)"

phase "initramfs"
MODS=$(modprobe -a -d "$VM/k" -S "$KREL" --show-depends virtio_pci virtio_blk 9pnet_virtio 9p overlay ext4 |
    awk '$1 == "insmod" { print $2 }' | sed "s|.*/lib/modules/$KREL/||" | awk '!seen[$0]++')
rm -rf "$VM/initramfs"
mkdir -p "$VM/initramfs/bin" "$VM/initramfs/lib/modules"
cp /bin/busybox "$VM/initramfs/bin/busybox"
for m in $MODS; do
    case $m in
    *.ko) cp "$VM/k/lib/modules/$KREL/$m" "$VM/initramfs/lib/modules/" ;;
    *.ko.xz) xz -dc "$VM/k/lib/modules/$KREL/$m" >"$VM/initramfs/lib/modules/$(basename "$m" .xz)" ;;
    *.ko.zst) zstd -qdc "$VM/k/lib/modules/$KREL/$m" >"$VM/initramfs/lib/modules/$(basename "$m" .zst)" ;;
    esac
    basename "${m%.xz}" | sed 's/\.zst$//' >>"$VM/initramfs/modules"
done
echo "   modules: $(paste -sd' ' "$VM/initramfs/modules")"
# init: modules, this machine's root (9p) under an overlay with a tmpfs upper, then
# switch_root into it running stage 2, which mounts the rest, runs $SCRATCH/run.sh and powers off.
cat >"$VM/initramfs/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /lower /rw /newroot
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules); do insmod /lib/modules/$m || echo "init: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /lower || echo "init: the 9p mount failed"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
# CKPT_VM_ROOT (from the kernel's command line): overlay, or 9p (read-only, tmpfs where
# programs write).
if [ "$CKPT_VM_ROOT" != overlay ]; then
    mount --bind /lower /newroot
elif ! mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot; then
    echo "init: the overlay over 9p failed: the 9p root read-only instead"
    mount --bind /lower /newroot
    CKPT_VM_ROOT=9p-as-overlay-failed
fi
export CKPT_VM_ROOT
# Moved, not mounted anew by stage 2: until then /proc would be this machine's, through 9p, and
# busybox runs its applets through /proc/self/exe (QEMU's own binary, read over 9p).
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /bin/busybox sh -c "$(cat /stage2)"
EOF
cat >"$VM/initramfs/stage2" <<EOF
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
if [ "\$CKPT_VM_ROOT" != overlay ]; then mount -t tmpfs tmpfs /var/tmp; mount -t tmpfs tmpfs /root; fi
mount -t ext4 /dev/vda $SCRATCH || echo "stage2: mounting the scratch disk failed"
hostname ckpt-vm
if [ -f $SCRATCH/run.sh ]; then bash $SCRATCH/run.sh </dev/null 2>&1 | tee $SCRATCH/vm-\$CKPT_VM_ROOT.log; else echo "stage2: no $SCRATCH/run.sh"; fi
sync
umount $SCRATCH
busybox poweroff -f
echo o >/proc/sysrq-trigger
EOF
mkdir -p "$VM/initramfs/dev"
mknod -m 600 "$VM/initramfs/dev/console" c 5 1
chmod +x "$VM/initramfs/init"
(cd "$VM/initramfs" && find . | cpio -o -H newc --quiet | gzip -1 >"$VM/initrd.img")

phase "host: checks and checkpoints for the VM"
mkdir -p "$SCRATCH"
# A scratch disk an interrupted run left mounted.
if mountpoint -q "$SCRATCH" && [[ -f $VM/scratch.img ]] &&
    losetup -j "$VM/scratch.img" | cut -d: -f1 | grep -qx "$(findmnt -n -o SOURCE "$SCRATCH")"; then
    umount "$SCRATCH"
fi
mountpoint -q "$SCRATCH" && { echo "vm-check.sh: $SCRATCH is already a mount point" >&2; exit 1; }
[[ -z $(ls -A "$SCRATCH") ]] || { echo "vm-check.sh: $SCRATCH is not empty" >&2; exit 1; }
[[ -x $PROGS/compute && -x $PROGS/compute-static ]] || make -s -C tests/progs bin/compute bin/compute-static
rm -f "$VM/scratch.img"
truncate -s 2G "$VM/scratch.img"
mkfs.ext4 -q -F -L ckpt-scratch "$VM/scratch.img"
mount -o loop "$VM/scratch.img" "$SCRATCH"
mkdir -p "$SCRATCH/bin" "$SCRATCH/h2v"
cp "$CKPT_BIN" "$SCRATCH/bin/ckpt"
cp "$PROGS/compute" "$PROGS/compute-static" "$SCRATCH/bin/"
# The capabilities this machine's root lacks (its bounding set against every one the kernel
# knows: sys_resource here): root's jobs in the VM run without them.
BND=$(awk '$1 == "CapBnd:" { print $2 }' /proc/self/status)
LACKED=$(( ((1 << ($(cat /proc/sys/kernel/cap_last_cap) + 1)) - 1) & ~0x$BND ))
CAPS_LACKED=
if ((LACKED)); then
    CAPS_LACKED=$(capsh --decode="$(printf '%x' "$LACKED")" | cut -d= -f2 | sed 's/cap_//g; s/,/ /g')
fi
echo "   this machine's root: CapBnd $BND; lacks: ${CAPS_LACKED:-nothing}"
NOFILE=("$(ulimit -Sn)" "$(ulimit -Hn)")
getent passwd "$USER_NAME" >/dev/null || { echo "vm-check.sh: no user $USER_NAME (useradd -m $USER_NAME, or set CKPT_VM_USER)" >&2; exit 1; }
# The answer of an uninterrupted run (compute and compute-static compute the same).
CKPT=$CKPT_BIN
as_root
RESULTS=$VM/results-host.txt
: >"$RESULTS"
COMPUTE_RESULT=$("$PROGS/compute" "${COMPUTE_ARGS[@]}" | awk '$1 == "RESULT" { print $2 }')
echo "   an uninterrupted compute ${COMPUTE_ARGS[*]}: RESULT $COMPUTE_RESULT"
# The same cycle here first: what fails later fails because of the other kernel.
one_cycle host-local "$VM/host-local" "$VM/host-local.cwd" "$COMPUTE_RESULT" 0.5 "$PROGS/compute" "${COMPUTE_ARGS[@]}"
# For the VM: programs on the scratch disk (the same file on both sides, the libraries from
# this machine's /usr, seen through 9p there), and bash from /usr.
# C/user: the user who runs them, there too; C/mode: restart_job's MODE there. The dynamic
# compute: its libraries chose code for extensions TCG lacks (cpu-refusal).
h2v() {
    local name=$1 expect=$2 c=$SCRATCH/h2v/$1
    shift 2
    if launch_job "host-to-vm-$name" "$c" "$c.cwd" "$@"; then
        sleep 0.5
        if checkpoint_kill "host-to-vm-$name" "$c"; then
            echo "$expect" >"$c/expect"
            [[ -z $OWNER ]] || echo "$OWNER" >"$c/user"
        fi
    fi
}
h2v compute "$COMPUTE_RESULT" "$SCRATCH/bin/compute" "${COMPUTE_ARGS[@]}"
[[ ! -f $SCRATCH/h2v/compute/expect ]] || echo cpu-refusal >"$SCRATCH/h2v/compute/mode"
h2v compute-static "$COMPUTE_RESULT" "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
h2v bash 40 bash -c "$BASH_LOOP"
# A library of the program's own, on the scratch disk: the VM binds another build of it, then a
# copy, over its path (library_restarts).
mkdir -p "$SCRATCH/lib"
for v in 1 2; do
    echo "int ckpt_vmmark_version(void) { return $v; }" |
        cc -O2 -shared -fPIC -Wl,--build-id -x c -o "$SCRATCH/lib/libvmmark-v$v.so" -
done
cp "$SCRATCH/lib/libvmmark-v1.so" "$SCRATCH/lib/libvmmark.so"
cp "$SCRATCH/lib/libvmmark-v1.so" "$SCRATCH/lib/libvmmark-copy.so"
h2v library 40 env LD_PRELOAD="$SCRATCH/lib/libvmmark.so" bash -c "$BASH_LOOP"
[[ ! -f $SCRATCH/h2v/library/expect ]] || echo library >"$SCRATCH/h2v/library/mode"
as_user "$USER_NAME"
h2v compute-static-as-user "$COMPUTE_RESULT" "$SCRATCH/bin/compute-static" "${COMPUTE_ARGS[@]}"
h2v bash-as-user 40 bash -c "$BASH_LOOP"
as_root
# core.rs's test binary (built here if cargo is at hand) and a copy of the test programs.
CORE_EXE=
if ((${#CORE_TESTS[@]})) && command -v cargo >/dev/null; then
    CORE_EXE=$(cargo test --release -p tests --test core --no-run --message-format=json 2>/dev/null |
        grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4) || true
fi
if [[ -n $CORE_EXE && -x $CORE_EXE ]]; then
    cp "$CORE_EXE" "$SCRATCH/bin/core-tests"
    # (the Makefile includes ../../plugins/libckpt/ckpt.h)
    mkdir -p "$SCRATCH/w/tests"
    cp -a tests/progs "$SCRATCH/w/tests/progs"
    cp -a plugins "$SCRATCH/w/plugins"
    echo "   core.rs tests for the VM: ${CORE_TESTS[*]}"
elif ((${#CORE_TESTS[@]})); then
    say "NOTE vm-core: skipped: core.rs's test binary could not be built here (cargo test --release -p tests --test core --no-run)"
fi
{
    echo '#!/bin/bash'
    echo "# written by scripts/vm-check.sh; runs in the VM"
    declare -p ROOT SCRATCH PROGS COMPUTE_ARGS BASH_LOOP COMPUTE_RESULT CAPS_LACKED USER_NAME NOFILE CORE_TESTS CORE_TIMEOUT CORE_ROOTS
    echo "CKPT=$SCRATCH/bin/ckpt"
    echo "RESULTS=$SCRATCH/results-vm-\$CKPT_VM_ROOT.txt"
    declare -f say oneline since as_root as_user job_caps launch_job checkpoint_kill restart_job one_cycle library_restarts core_tests vm_main
    echo 'as_root'
    echo 'vm_main'
    echo 'echo "   (vm) run.sh done"'
} >"$SCRATCH/run.sh"
sync
for i in $(seq 50); do umount "$SCRATCH" 2>/dev/null && break; sleep 0.2; done
mountpoint -q "$SCRATCH" && { echo "vm-check.sh: cannot unmount $SCRATCH:"; fuser -vm "$SCRATCH"; exit 1; }

for root in ${CKPT_VM_ROOTS:-overlay 9p}; do
    phase "vm: boot $KREL, root file system $root, run.sh, power off (QEMU TCG, timeout ${VM_TIMEOUT}s)"
    set +e
    timeout "$VM_TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu "$VM_CPU" -smp 2 -m 4G -nographic -no-reboot \
        -kernel "$VM/k/boot/vmlinuz-$KREL" -initrd "$VM/initrd.img" \
        -append "console=ttyS0 panic=-1 quiet CKPT_VM_ROOT=$root" \
        -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
        -drive file="$VM/scratch.img",if=virtio,format=raw -nic none </dev/null 2>&1 |
        tee "$VM/console-$root.log" | sed -u 's/\r$//' | grep --line-buffered -E '^   |^(PASS|FAIL|NOTE) |^init:|^stage2:|Kernel panic'
    rc=${PIPESTATUS[0]}
    set -e
    [[ $rc -eq 0 ]] || echo "   qemu exited $rc$( ((rc == 124)) && echo ' (timeout)')"
    QEMU_RC[$root]=$rc
done

phase "host: restarts of the VM's checkpoints"
mount -o loop "$VM/scratch.img" "$SCRATCH"
RESULTS=$VM/results-host-after.txt
: >"$RESULTS"
VM_RESULTS=()
for root in ${CKPT_VM_ROOTS:-overlay 9p}; do
    VM_RESULTS+=("$VM/results-vm-$root.txt")
    cp "$SCRATCH/results-vm-$root.txt" "$VM/" 2>/dev/null || : >"$VM/results-vm-$root.txt"
    cp "$SCRATCH/vm-$root.log" "$VM/" 2>/dev/null || true
    [[ -s $VM/results-vm-$root.txt ]] ||
        say "FAIL vm-run@$root: no results from the VM (qemu exit ${QEMU_RC[$root]}): $(sed -e 's/\r$//' "$VM/console-$root.log" | tail -20 | awk 'NF { printf "%s%s", sep, $0; sep = " | " }')"
done
for c in "$SCRATCH"/v2h-*/*/; do
    c=${c%/}
    [[ -f $c/expect ]] || continue
    root=${c#"$SCRATCH"/v2h-}
    if [[ -f $c/user ]]; then as_user "$(cat "$c/user")"; else as_root; fi
    restart_job "vm-to-host-$(basename "$c")@${root%%/*}" "$c" "$(cat "$c/expect")" "$(cat "$c/mode" 2>/dev/null || echo cpu)"
done
as_root
rm -rf "$VM/cases"
mkdir -p "$VM/cases"
cp -r "$SCRATCH"/h2v "$SCRATCH"/v2h-* "$SCRATCH"/vm-* "$VM/cases/" 2>/dev/null || true
find "$VM/cases" -name img -type d -prune -exec rm -rf {} +
sync
umount "$SCRATCH"

phase end
echo "== results ($(since "$T0") s in all; logs in $VM: vm-check.log, console-ROOT.log, vm-ROOT.log, cases/)"
cat "$VM/results-host.txt" "${VM_RESULTS[@]}" "$VM/results-host-after.txt" | grep -E '^(PASS|FAIL|NOTE) ' >"$VM/results.txt" || true
cat "$VM/results.txt"
if grep -q '^FAIL ' "$VM/results.txt"; then
    exit 1
fi
