#!/usr/bin/env bash
# test.sh: installs what the tests need (Debian 12, as root), builds everything and runs every
# test: the crates' unit tests and the end-to-end tests of tests/ (which launch, checkpoint,
# crash and restart real programs with target/release/ckpt).
#
#   bash scripts/test.sh [extra arguments for the test binaries]
# Environment: CKPT_SKIP_E2E=1 skips the end-to-end tests; CKPT_TEST_KEEP=1 keeps their files.
set -euo pipefail
cd "$(dirname "$0")/.."

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
[[ -x /usr/bin/mpirun ]] || missing+=(openmpi-bin)       # MPI jobs under ckpt (mpi.rs)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
[[ -x /usr/bin/script ]] || missing+=(bsdutils)             # bash in a pty (real_programs.rs)
[[ -x /usr/lib/postgresql/15/bin/postgres ]] || missing+=(postgresql) # a database under ckpt --protect (postgres.rs)
if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
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

# --- build ---
echo "== cargo build --release --workspace"
cargo build --release --workspace
echo "== make -C tests/progs"
make -s -C tests/progs

# --- test ---
# The end-to-end tests are heavy (each runs programs for seconds, some with 256 MiB heaps):
# at most 2 at a time.
echo "== cargo test --release --workspace"
cargo test --release --workspace -- --test-threads=2 "$@"
