#!/usr/bin/env bash
# test.sh: installs what the tests need (Debian 12, as root), checks the formatting (cargo fmt,
# rustfmt.toml), builds everything and runs every test: the crates' unit tests (in a debug build, with overflow checks), then the end-to-end
# tests of tests/ (which launch, checkpoint, crash and restart real programs, and submit batch
# jobs to a one-node Slurm that scripts/slurm-up.sh starts) twice at once: as root, and with
# every job run by an ordinary user (ckpt-test, created here), as cluster users run ckpt; beside
# them, at the lowest priority, clippy with warnings as errors and the fuzz targets over image
# decoding and the wire for a minute each (scripts/fuzz.sh). The ckpt the end-to-end tests run
# is the release binary users get (scripts/build-release.sh: glibc 2.28 and later), with the
# tests' hooks (`--features test-hooks`). At the end,
# whatever the end, the time of each phase.
#
#   bash scripts/test.sh [extra arguments for the test binaries]
# Environment: CKPT_SKIP_E2E=1 builds the end-to-end tests ignored (reported as such); CKPT_TEST_KEEP=1 keeps their files;
# CKPT_SKIP_USER_RUN=1 skips the run as an ordinary user; CKPT_SKIP_FUZZ=1 skips the fuzzing,
# CKPT_FUZZ_SECONDS=N fuzzes N seconds instead of 60.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase is announced with `phase NAME`; at the end, whatever the end, the time each took
# is printed (the time goes where the tests wait: this says where).
phase_names=()
phase_starts=()
phase() {
    echo "== $*"
    phase_names+=("$*")
    phase_starts+=("$SECONDS")
}
print_phase_times() {
    ((${#phase_names[@]})) || return 0
    echo "== time of each phase (s)"
    local i end
    for i in "${!phase_names[@]}"; do
        end=${phase_starts[i + 1]:-$SECONDS}
        printf '%6d  %s\n' "$((end - phase_starts[i]))" "${phase_names[i]}"
    done
    printf '%6d  total\n' "$SECONDS"
}
cleanup() {
    local status=$?
    # Passes still running (the script stopped early) go with it.
    local running
    running=$(jobs -p)
    [[ -n $running ]] && kill $running 2>/dev/null
    rm -f /etc/sudoers.d/ckpt-test
    [[ -n ${shared:-} ]] && rm -rf "$shared"
    print_phase_times
    return "$status"
}
trap cleanup EXIT

# --- system packages (only when something is missing) ---
missing=()
command -v gcc >/dev/null || missing+=(gcc)
command -v make >/dev/null || missing+=(make)
[[ -e /usr/lib/x86_64-linux-gnu/libc.a ]] || missing+=(libc6-dev) # static test programs
[[ -x /usr/bin/python3 ]] || missing+=(python3)
[[ -x /usr/bin/perl ]] || missing+=(perl)
command -v ip >/dev/null || missing+=(iproute2)
command -v ps >/dev/null || missing+=(procps)
[[ -x /usr/bin/redis-server ]] || missing+=(redis-server) # a real server under ckpt (channels.rs)
[[ -x /usr/sbin/nginx ]] || missing+=(nginx-light) # master and workers serving a download (real_programs.rs)
command -v curl >/dev/null || missing+=(curl)                   # its client (real_programs.rs)
[[ -x /usr/bin/mpirun.openmpi ]] || missing+=(openmpi-bin) # MPI jobs under ckpt (mpi.rs)
[[ -x /usr/bin/mpicc.openmpi ]] || missing+=(libopenmpi-dev)
# MPICH beside it (mpich.rs): Debian's alternatives keep Open MPI's mpirun and mpicc (priority
# 50 against 40); the tests call MPICH's by their own names.
[[ -x /usr/bin/mpiexec.mpich ]] || missing+=(mpich)
[[ -x /usr/bin/mpicc.mpich ]] || missing+=(libmpich-dev)
[[ -x /usr/bin/javac ]] || missing+=(default-jdk-headless) # a JVM under ckpt (real_programs.rs)
[[ -x /usr/bin/node ]] || missing+=(nodejs) # Node.js under ckpt (real_programs.rs)
[[ -x /usr/bin/script ]] || missing+=(bsdutils)             # bash in a pty (real_programs.rs)
[[ -x /usr/bin/tmux ]] || missing+=(tmux)                    # a terminal multiplexer's server (real_programs.rs)
[[ -x /usr/lib/postgresql/15/bin/postgres ]] || missing+=(postgresql) # a database under ckpt --protect (postgres.rs)
[[ -x /usr/bin/setpriv ]] || missing+=(util-linux)           # jobs run as an ordinary user
command -v ipcmk >/dev/null && command -v nsenter >/dev/null || missing+=(util-linux) # IPC namespaces (real_programs.rs, errors.rs)
command -v mount >/dev/null || missing+=(mount)              # a namespace file bound (errors.rs)
[[ -x /usr/bin/ch-run ]] || missing+=(charliecloud-runtime)   # a container without privileges (real_programs.rs)
[[ -x /usr/bin/bwrap ]] || missing+=(bubblewrap)               # a sandbox with a network of its own (real_programs.rs)
command -v domainname >/dev/null || missing+=(hostname)       # bash naming its machine (real_programs.rs)
[[ -x /usr/bin/sudo ]] || missing+=(sudo)                    # that user's "ssh" into a node (netns-exec.sh)
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)         # an OpenSSH server and its sandboxed child (real_programs.rs)
[[ -x /usr/sbin/nft ]] || missing+=(nftables)                # the network lock of --kill --tcp-established (channels.rs)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv) # zig for the glibc 2.28 build (scripts/build-release.sh)
if ((${#missing[@]})); then
    phase "installing: ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "test.sh: missing packages (${missing[*]}); run as root or install them" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    # The tests run servers of their own; the cluster Debian starts with the package is not one.
    command -v pg_ctlcluster >/dev/null && pg_ctlcluster 15 main stop 2>/dev/null || true
fi
command -v cargo >/dev/null || { echo "test.sh: cargo not found (install Rust)" >&2; exit 1; }

# --- formatting ---
# The code is as `cargo fmt` writes it (rustfmt.toml): checked first, it takes a second.
phase "cargo fmt --check"
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo fmt --all --check
(cd fuzz && cargo fmt --check)

# --- build ---
# One release build, the binary users get (glibc 2.28: RHEL 8 and later) with the tests' hooks
# added (the `test-hooks` feature: CKPT_TEST_* variables, which a user's build has none of),
# which every end-to-end test runs and tests/release.rs checks. Everything else is built once, in the debug
# profile, every crate of the workspace at once (a subset of it would resolve the
# dependencies' features anew and build them all again).
phase "scripts/build-release.sh"
ckpt_bin=$PWD/$(bash scripts/build-release.sh --features test-hooks | tail -1)
export CKPT_BIN=$ckpt_bin CKPT_RELEASE_BIN=$ckpt_bin
phase "make -C tests/progs"
make -s -C tests/progs
phase "cargo test --workspace --no-run (debug: overflow checks on)"
cargo test --workspace --no-run

# The unit tests (every crate's, not the end-to-end tests) in the debug build, where debug
# assertions and arithmetic overflow checks are on: an overflow on a forged or unexpected value
# panics here instead of wrapping unseen in release. Before the end-to-end tests start: a few
# bound how long something may take.
phase "cargo test --workspace --lib --bins (debug build: overflow checks on)"
cargo test --workspace --lib --bins -- "$@"

# A one-node Slurm for the batch-job tests (tests/tests/slurm.rs): installed and started when
# none answers, left running for the next run.
if [[ -z ${CKPT_SKIP_E2E:-} ]]; then
    phase "scripts/slurm-up.sh"
    bash scripts/slurm-up.sh
fi

# --- the end-to-end tests, as root and as an ordinary user at once ---
# Their binaries (built above; the harness is light, its speed does not matter), the MPI jobs'
# first (the heaviest, see e2e_pass), the rest by name. Asked of the very build above: another
# choice of targets (`--test '*'`) would leave out dev-dependencies and build everything again.
mapfile -t e2e_bins < <(cargo test --workspace --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
bins = []
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        bins.append((not m["target"]["name"].startswith("mpi"), m["target"]["name"], m["executable"]))
for _, _, exe in sorted(bins):
    print(exe)')
((${#e2e_bins[@]})) || { echo "test.sh: no end-to-end test binary was built" >&2; exit 1; }

# The second pass runs every job as an ordinary user: the harness stays root (it makes network
# namespaces and watches every process); each ckpt command, program and reference run is
# started as the user (tests/src/lib.rs, CKPT_TEST_USER). Skipped by name: the tests that need
# root by their nature.
ROOT_ONLY_TESTS=(
    tcp_peer_outside_the_job_kept_with_tcp_established # TCP repair mode to a peer outside the job
    credentials_of_a_job_that_dropped_to_another_user  # only root can drop to another user
    a_job_that_dropped_to_another_user_keeps_what_it_opened_as_root # the same
    root_reads_a_users_image_with_the_users_rights # root acting on a user's image
    a_directory_swapped_while_root_acts_on_it_never_gives_roots_image # the same
    a_link_planted_for_job_json_never_makes_root_write_roots_file # the same
    a_link_on_the_way_to_a_protected_directory_never_makes_root_write_there # a root job
    a_users_link_cannot_make_a_root_restart_write_roots_files # the same
    mounts_in_a_namespace_the_job_made # mounting outside a user namespace of the job's own needs CAP_SYS_ADMIN
    device_nodes_the_job_made          # making a device node needs CAP_MKNOD
    mounts_in_the_jobs_own_namespace   # the same
    a_mount_the_machine_removed_under_the_job # ip netns needs root
    a_mount_of_a_kind_not_kept_is_refused # the same
    a_process_in_a_cgroup_outside_its_inits_is_refused # only root may move the launcher into a cgroup
    an_ebpf_socket_filter_is_refused_not_dropped # Debian lets no ordinary user load a BPF program
    a_fanotify_group_of_a_permission_class_is_refused # such a group needs CAP_SYS_ADMIN
    namespaces_made_before_the_user_namespace_of_their_process # a UTS namespace outside a user namespace of the job's needs CAP_SYS_ADMIN
    packet_sockets_keep_their_interface_filter_and_memberships # a packet socket needs CAP_NET_RAW
    a_packet_socket_with_a_ring_is_refused # the same
    a_process_in_the_machines_ipc_namespace_is_refused # entering it needs CAP_SYS_ADMIN there
    an_openssh_server_with_a_session_and_a_sandboxed_child # sshd runs as root; TCP repair mode
)
user_run=yes
if [[ -n ${CKPT_SKIP_USER_RUN:-} || -n ${CKPT_SKIP_E2E:-} ]]; then
    user_run=
elif [[ $(id -u) -ne 0 ]]; then
    echo "== not root: the run as an ordinary user needs root to create the user; skipped" >&2
    user_run=
fi
user=ckpt-test
user_env=()
if [[ -n $user_run ]]; then
    id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
    # The user's "ssh" into another node of the multi-node tests (a network namespace).
    netns_exec=$(readlink -f tests/progs/netns-exec.sh)
    if ! runuser -u "$user" -- test -x "$CKPT_BIN" -a -r "$netns_exec"; then
        # The checkout is out of the user's reach (under /root, say): give them a copy.
        # A fresh directory of root's (mktemp: nobody can have made or swapped it first), which
        # the sudoers line below lets the user run a script of as root: only root may write in it.
        shared=$(mktemp -d /var/tmp/ckpt-test-run.XXXXXX)
        # The programs keep their place beside plugins/libckpt, which their Makefile builds on.
        cp -a "$CKPT_BIN" "$shared/ckpt"
        mkdir -p "$shared/tests" "$shared/plugins"
        cp -a tests/progs "$shared/tests/progs"
        cp -a plugins/libckpt "$shared/plugins/libckpt"
        chmod -R a+rX "$shared"
        netns_exec=$shared/tests/progs/netns-exec.sh
        user_env=(CKPT_BIN="$shared/ckpt" CKPT_TEST_PROGS="$shared/tests/progs")
    fi
    # !fqdn: inside a node the hostname is the node's (netns-exec.sh), which no resolver knows;
    # Debian's sudo would look it up and warn on every call.
    printf 'Defaults:%s !fqdn\n%s ALL=(root) NOPASSWD: %s\n' "$user" "$user" "$netns_exec" >/etc/sudoers.d/ckpt-test
    chmod 0440 /etc/sudoers.d/ckpt-test
    # The user's way to root ends with the run, whatever its end (cleanup, above).
fi
# A machine under systemd has tracefs mounted at /sys/kernel/tracing (root's, mode 0700), and
# the jobs' mount namespaces hold it (bubblewrap binds /sys with it): mounted here where it is
# not, so that the tests meet what users' machines have (an ordinary user's restart of a
# bubblewrap sandbox failed on it, "give mount /sys/kernel/tracing its flags again").
if [[ $(id -u) -eq 0 ]] && ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || echo "== tracefs could not be mounted at /sys/kernel/tracing" >&2
fi
skips=()
for t in "${ROOT_ONLY_TESTS[@]}"; do
    skips+=(--skip "$t")
done

# One pass: each test binary in turn, two tests at a time (each runs programs for seconds,
# some with 256 MiB heaps), from tests/ as cargo runs them; its output to LOG, a line per
# binary to the terminal. Fails if a test failed.
#   e2e_pass NAME LOG ORDER -- ENV... -- TEST-ARGS...
e2e_pass() {
    local name=$1 log=$2 order=$3
    shift 4
    local env=()
    while [[ $1 != -- ]]; do env+=("$1"); shift; done
    shift
    local bins=("${e2e_bins[@]}") failed=0 bin i start
    if [[ $order == reversed ]]; then
        bins=()
        for ((i = ${#e2e_bins[@]} - 1; i >= 0; i--)); do bins+=("${e2e_bins[i]}"); done
    fi
    : >"$log"
    for bin in "${bins[@]}"; do
        start=$SECONDS
        echo "== [$name] ${bin##*/}" >>"$log"
        if (cd tests && env "${env[@]}" "$bin" --test-threads=2 "$@") >>"$log" 2>&1; then
            echo "== [$name] ${bin##*/}: ok ($((SECONDS - start)) s)"
        else
            echo "== [$name] ${bin##*/}: FAILED ($((SECONDS - start)) s)"
            failed=1
        fi
    done
    return "$failed"
}

# The two passes go on at once: the tests mostly wait (for programs that sleep between steps,
# for timeouts), and what the two could meet in (the Slurm cluster) is taken one test at a
# time (tests/src/lib.rs, machine_wide). The user's pass takes the binaries in the other order,
# so the heaviest of the two do not meet.
phase "end-to-end tests: as root${user_run:+, and every job as the ordinary user $user, at once}"
mkdir -p target/e2e
root_status=0 user_status=0
e2e_pass root target/e2e/root.log forward -- -- "$@" &
root_pid=$!
if [[ -n $user_run ]]; then
    # --exact: a skipped name is matched whole (a later test whose name holds one is still
    # run); filters given to this script are matched whole in this pass too.
    e2e_pass user target/e2e/user.log reversed -- "${user_env[@]}" CKPT_TEST_USER="$user" -- --exact "${skips[@]}" "$@" &
    user_pid=$!
fi

# Beside them, at the lowest priority (they take only the processors the tests leave idle):
# clippy, with warnings as errors (its findings are fixed, or allowed with a reason, as they
# come), and the fuzz targets over image decoding and validation and over the wire, seeded
# with real images, for a bounded time.
lint_status=0 fuzz_status=0
if ! cargo clippy --version >/dev/null 2>&1; then
    echo "== installing clippy"
    rustup component add clippy
fi
phase "beside them: cargo clippy --workspace --all-targets -- -D warnings"
nice -n 19 cargo clippy --workspace --all-targets -- -D warnings || lint_status=$?
if [[ -z ${CKPT_SKIP_FUZZ:-} ]]; then
    phase "beside them: scripts/fuzz.sh"
    nice -n 19 bash scripts/fuzz.sh || fuzz_status=$?
fi

phase "the end-to-end tests' end"
if [[ -n $user_run ]]; then
    wait "$user_pid" || user_status=$?
fi
wait "$root_pid" || root_status=$?
for pass in root ${user_run:+user}; do
    echo "== the end-to-end tests as $pass (target/e2e/$pass.log)"
    cat "target/e2e/$pass.log"
done
# What each failed test said, short (the end of CI's output is what its report keeps): the
# panic's message up to its backtrace, 14 lines at most.
for pass in root ${user_run:+user}; do
    awk -v pass="$pass" '/^---- .* stdout ----$/ { name = $2; n = 0; print "== [" pass "] " name " said:"; next }
        name != "" && (/^stack backtrace:/ || /^failures:$/ || /^---- / || /^test result:/) { name = ""; next }
        name != "" && n < 14 && NF { print "   " substr($0, 1, 400); n++ }' "target/e2e/$pass.log"
done
for pass in root ${user_run:+user}; do
    awk -v pass="$pass" '/^test result:/ { for (i = 1; i <= NF; i++) if ($i ~ /^(passed|failed|ignored);?$/) { k = $i; sub(";", "", k); n[k] += $(i - 1) } }
        END { printf "== %s: %d passed, %d failed, %d ignored\n", pass, n["passed"], n["failed"], n["ignored"] }' "target/e2e/$pass.log"
    grep -h "^test .* FAILED$" "target/e2e/$pass.log" | sed "s/^/   [$pass] /" || true
done
((lint_status == 0)) || echo "== FAILED: cargo clippy (above)"
((fuzz_status == 0)) || echo "== FAILED: scripts/fuzz.sh (above)"
((root_status == 0 && user_status == 0 && lint_status == 0 && fuzz_status == 0))
