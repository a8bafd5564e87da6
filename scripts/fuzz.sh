#!/usr/bin/env bash
# fuzz.sh: runs the fuzz target over image decoding and validation (fuzz/fuzz_targets/image.rs:
# procs.bin, files.bin and index.bin records, manifests, chunk headers) for a bounded time, on a seed
# corpus made here from real images: a few test programs are launched under ckpt ($CKPT_BIN,
# else target/release/ckpt), checkpointed with --kill, and their records, manifests and chunk headers become the seeds.
# scripts/test.sh runs it, and so does CI. Any crash (a panic, an arithmetic overflow, a hang
# past 10 s, more than 2 GiB of memory) fails the run and names the input that caused it.
#
#   bash scripts/fuzz.sh [SECONDS]
# SECONDS: how long the fuzzer runs (default: $CKPT_FUZZ_SECONDS, else 60). On top, measured on
# 2 cores: installing cargo-fuzz, once per machine, 1.5 min; building the target from scratch
# (as in CI's fresh clone) 3 min; the seed images 3 s.
#
# The target is built by cargo-fuzz (installed from crates.io when missing) with the default
# toolchain and no sanitizer: stable Rust can build libFuzzer's coverage instrumentation, not
# AddressSanitizer, and the code under test is safe Rust, where the bugs to catch are panics and
# overflows (cargo-fuzz builds with debug assertions and overflow checks on). With nightly,
# `cargo +nightly fuzz run image` adds AddressSanitizer.
#
# What it leaves: fuzz/corpus/image (the corpus the fuzzer grew; kept, it starts the next run
# further on), fuzz/artifacts/image (crashing inputs), target/fuzz-seeds (images, seeds, log).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-${CKPT_FUZZ_SECONDS:-60}}
[[ $secs =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a number, not '$secs'" >&2; exit 2; }
CARGO_FUZZ_VERSION=0.13.2

# --- what it needs ---
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi
# The ckpt that makes the seed images: $CKPT_BIN (scripts/test.sh's release build), else the
# native release build, made when missing.
ckpt=${CKPT_BIN:-$root/target/release/ckpt}
[[ -x $ckpt ]] || cargo build --release -p ckpt-launch
make -s -C tests/progs
progs=$root/tests/progs/bin

echo "== cargo fuzz build image wire (release, debug assertions, no sanitizer)"
start=$SECONDS
cargo fuzz build image --sanitizer none
cargo fuzz build wire --sanitizer none
echo "   built in $((SECONDS - start)) s"

# --- seeds from real images ---
start=$SECONDS
work=$root/target/fuzz-seeds
seeds=$work/seeds
rm -rf "$work"
mkdir -p "$seeds"
launcher=
trap '[[ -n $launcher ]] && kill "$launcher" 2>/dev/null; true' EXIT

# seed_image NAME [LAUNCH OPTIONS] -- PROG ARGS: launches PROG under ckpt, waits for its START
# line, checkpoints it with --kill and turns the committed generation into seeds. The first
# byte of each seed is the fuzz target's mode (fuzz/fuzz_targets/image.rs).
seed_image() {
    local name=$1
    shift
    local dir=$work/img-$name out=$work/$name.out
    "$ckpt" launch --dir "$dir" "$@" >"$out" 2>"$out.err" </dev/null &
    launcher=$!
    local i
    for ((i = 0; i < 200; i++)); do
        grep -q '^START' "$out" 2>/dev/null && break
        kill -0 "$launcher" 2>/dev/null || break
        sleep 0.05
    done
    local msg=
    for ((i = 0; i < 100; i++)); do
        if msg=$("$ckpt" checkpoint --dir "$dir" --kill 2>&1); then
            msg=
            break
        fi
        grep -qi 'no running job' <<<"$msg" || break
        sleep 0.1
    done
    if [[ -n $msg ]]; then
        echo "fuzz.sh: cannot checkpoint $name for the seed corpus: $msg" >&2
        tail -n 20 "$out" "$out.err" >&2
        exit 1
    fi
    wait "$launcher" || true # ended by the checkpoint's --kill
    launcher=
    local gen node n=0
    gen=$(ls -d "$dir"/gen-* | sort | tail -n 1)
    { printf '\x03'; tail -n +2 "$gen/MANIFEST"; } >"$seeds/$name-manifest"
    for node in "$gen"/*/; do
        # 0: procs.bin as it is; 1: its payload (the target makes the header);
        # 6 and 7: the same for files.bin.
        { printf '\x00'; cat "$node/procs.bin"; } >"$seeds/$name-procs"
        { printf '\x01'; tail -c +25 "$node/procs.bin"; } >"$seeds/$name-procs-payload"
        if [[ -f $node/files.bin ]]; then
            { printf '\x06'; cat "$node/files.bin"; } >"$seeds/$name-files"
            { printf '\x07'; tail -c +25 "$node/files.bin"; } >"$seeds/$name-files-payload"
        fi
        # 8 and 9: the same for the node's index (format 29).
        if [[ -f $node/index.bin ]]; then
            { printf '\x08'; cat "$node/index.bin"; } >"$seeds/$name-index"
            { printf '\x09'; tail -c +25 "$node/index.bin"; } >"$seeds/$name-index-payload"
        fi
        # 4: chunk headers, a few per image.
        for c in "$node"/chunks/p*; do
            [[ -f $c ]] || continue
            { printf '\x04'; head -c 56 "$c"; } >"$seeds/$name-chunk-$n"
            ((++n < 4)) || break
        done
    done
}

echo "== seed corpus from real images"
seed_image threads -- "$progs/threads" 30
seed_image tree -- "$progs/tree" 30
seed_image sysvipc -- "$progs/sysvipc" 30
mkdir -p "$work/mmaps" "$work/savefiles" "$work/protected/sub"
echo data >"$work/protected/sub/file"
ln -s sub/file "$work/protected/link"
seed_image mmaps --compress zstd -- "$progs/mmaps" "$work/mmaps" 30
seed_image savefiles --save-files --protect "$work/protected" -- "$progs/savefiles" "$work/savefiles" 30
# Modes 2 and 5 mutate a sample record with the input as the seed of the mutations.
printf '\x02\x01\x02\x03\x04\x05\x06\x07\x08' >"$seeds/mutate"
printf '\x05\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10' >"$seeds/tweak"
echo "   $(ls "$seeds" | wc -l) seeds ($(du -sk "$seeds" | cut -f1) KiB) in $((SECONDS - start)) s"

# --- fuzz ---
corpus=fuzz/corpus/image
artifacts=fuzz/artifacts/image
mkdir -p "$corpus" "$artifacts"
touch "$work/started"
log=$work/fuzz.log
echo "== cargo fuzz run image for $secs s (log: $log)"
status=0
cargo fuzz run image --sanitizer none "$corpus" "$seeds" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
crashes=$(find "$artifacts" -type f -newer "$work/started" | sort)
if ((status != 0)) || [[ -n $crashes ]]; then
    # From the panic (or libFuzzer's report) on; the log's end if there is neither.
    first=$(grep -n -m 1 -E 'panicked at|ERROR: libFuzzer' "$log" | cut -d: -f1 || true)
    if [[ -n $first ]]; then
        sed -n "$first,$((first + 60))p" "$log"
    else
        tail -n 60 "$log"
    fi
    echo "fuzz.sh: the fuzz target failed (exit $status)" >&2
    for c in $crashes; do
        echo "fuzz.sh: reproducer: $root/$c" >&2
        echo "         replay (from $root): cargo fuzz run image --sanitizer none $c" >&2
    done
    exit 1
fi
grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done ' "$log" | sed 's/^/   /'
echo "   corpus: $(ls "$corpus" | wc -l) inputs; no crash"

# --- the network: handshake and frames (fuzz/fuzz_targets/wire.rs) ---
wseeds=$work/wire-seeds
mkdir -p "$wseeds" fuzz/corpus/wire fuzz/artifacts/wire
release=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
# Mode 0: a preamble and a message 1's length; 1: a message 1; 2: a transport message's length.
{ printf '\x00ckpt\x00\x02'; printf "\\x$(printf %02x ${#release})"; printf '%s\x00\x30' "$release"; head -c 48 /dev/zero; } >"$wseeds/preamble"
{ printf '\x01\x00\x30'; head -c 48 /dev/zero; } >"$wseeds/message1"
{ printf '\x02\x00\x20'; head -c 32 /dev/zero; } >"$wseeds/transport"
printf '\x00\x00\x00\x00\x10{"msg":"hello"}' >"$wseeds/old-hello"
wlog=$work/fuzz-wire.log
echo "== cargo fuzz run wire for $secs s (log: $wlog)"
status=0
cargo fuzz run wire --sanitizer none fuzz/corpus/wire "$wseeds" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$wlog" 2>&1 || status=$?
if ((status != 0)) || [[ -n $(find fuzz/artifacts/wire -type f -newer "$work/started") ]]; then
    grep -n -m 1 -A 60 -E 'panicked at|ERROR: libFuzzer' "$wlog" || tail -n 60 "$wlog"
    echo "fuzz.sh: the wire fuzz target failed (exit $status); reproducers in $root/fuzz/artifacts/wire" >&2
    exit 1
fi
grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done ' "$wlog" | sed 's/^/   /'
echo "   wire corpus: $(ls fuzz/corpus/wire | wc -l) inputs; no crash"
