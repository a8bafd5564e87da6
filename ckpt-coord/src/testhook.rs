//! Test-only failure injection: `CKPT_TEST_DIE_AT=STEP` (or `STEP@GENERATION`) makes the
//! coordinator or agent that reads it SIGKILL itself at that step of a checkpoint, so that the
//! end-to-end tests can check the failure rules of docs/PROTOCOL.md. Steps: `prepare`,
//! `captured`, `release`, `persist` (agents and coordinator) and `commit` (coordinator, just
//! before it writes the manifest). Not for production use.

use std::sync::OnceLock;

pub const VAR: &str = "CKPT_TEST_DIE_AT";

fn target() -> &'static Option<(String, Option<u64>)> {
    static T: OnceLock<Option<(String, Option<u64>)>> = OnceLock::new();
    T.get_or_init(|| {
        let v = std::env::var(VAR).ok()?;
        Some(match v.split_once('@') {
            Some((step, g)) => (step.to_string(), g.parse().ok()),
            None => (v, None),
        })
    })
}

/// Dies (SIGKILL, as a crash would) if asked to at `step` of `generation`.
pub fn die_at(step: &str, generation: u64) {
    if let Some((s, g)) = target() {
        if s == step && g.is_none_or(|g| g == generation) {
            eprintln!("ckpt: {VAR}={step}: killing myself (pid {}) at generation {generation}", std::process::id());
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
    }
}
