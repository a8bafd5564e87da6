#!/bin/bash
# scripts/build-release.sh: the release `ckpt` for the systems clusters run, linked against
# glibc 2.28 (RHEL 8) so that it runs there and on everything newer. The native build links
# against this machine's glibc (2.36 on Debian 12) and asks for 2.34's symbols.
#
# cargo-zigbuild links with zig's copy of each glibc version's symbol lists; both come from PyPI
# into target/zig-venv (Debian's pip refuses to install into the system's Python). The versions
# are pinned: a pair that builds and links is what this script promises.
#
# Usage: scripts/build-release.sh [CARGO OPTION...]   -> target/x86_64-unknown-linux-gnu/release/ckpt
#   (scripts/test.sh adds `--features test-hooks`: the tests' build, docs/PLAN-HOUSE.md)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/zig-venv
if ! [[ -x $venv/bin/cargo-zigbuild && -x $venv/bin/python-zig ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "cargo-zigbuild==0.24.1" "ziglang==0.17.1"
fi
PATH="$PWD/$venv/bin:$PATH" cargo zigbuild --release -p ckpt-launch --target x86_64-unknown-linux-gnu.2.28 "$@"
echo "target/x86_64-unknown-linux-gnu/release/ckpt"
