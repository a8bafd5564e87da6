//! End-to-end tests on real interpreters (python3, perl, bash) running the scripts of
//! tests/progs/, through the canonical scenario (see `tests::canonical_scenario`).

use tests::*;

/// Seconds each script runs (uninterrupted); see tests/core.rs. Longer than the C programs':
/// bash's loop ended before the crash once on a loaded machine, its first checkpoint slow.
const SECONDS: &str = "8";

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn python3() {
    canonical_scenario(&Case::new("python3", |_| {
        vec![
            os(interpreter("python3")),
            os(prog("compute.py")),
            os(SECONDS),
        ]
    }));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn perl() {
    canonical_scenario(&Case::new("perl", |_| {
        vec![os(interpreter("perl")), os(prog("compute.pl")), os(SECONDS)]
    }));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash() {
    canonical_scenario(&Case::new("bash", |_| {
        vec![os(interpreter("bash")), os(prog("loop.sh")), os(SECONDS)]
    }));
}

/// util-linux `script` runs bash in a pseudo-terminal and copies its output: a master and a
/// slave in two processes, with the output crossing the terminal, and `script` waiting in
/// poll(2) with a timeout (which must be repeated after a restart, not fail with EINTR: script
/// takes EINTR as the end and kills its child).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn script_runs_bash_in_a_pseudo_terminal() {
    canonical_scenario(&Case::new("script", |_| {
        let inner = format!("{} {} {SECONDS}", interpreter("bash").display(), prog("loop.sh").display());
        vec![os("/usr/bin/script"), os("-qfec"), os(inner), os("/dev/null")]
    }));
}
