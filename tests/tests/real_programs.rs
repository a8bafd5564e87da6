//! End-to-end tests on real interpreters (python3, perl, bash) running the scripts of
//! tests/progs/, through the canonical scenario (see `tests::canonical_scenario`).

use tests::*;

/// Seconds each script runs (uninterrupted); see tests/core.rs.
const SECONDS: &str = "5";

#[test]
fn python3() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("python3", |_| {
        vec![
            os(interpreter("python3")),
            os(prog("compute.py")),
            os(SECONDS),
        ]
    }));
}

#[test]
fn perl() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("perl", |_| {
        vec![os(interpreter("perl")), os(prog("compute.pl")), os(SECONDS)]
    }));
}

#[test]
fn bash() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("bash", |_| {
        vec![os(interpreter("bash")), os(prog("loop.sh")), os(SECONDS)]
    }));
}
