//! The crash hook of the tests: `CKPT_TEST_DIE_AT=PHASE` (or `PHASE@GENERATION`) makes the
//! coordinator or agent that reads it SIGKILL itself at that [`Phase`] of a checkpoint, so that
//! the end-to-end tests can check the failure rules of docs/PROTOCOL.md. Only in a build with
//! the `test-hooks` feature ([`ckpt_core::testhooks`]); elsewhere [`die_at`] does nothing.

use std::sync::OnceLock;

use crate::Phase;

fn target() -> &'static Option<(String, Option<u64>)> {
    static T: OnceLock<Option<(String, Option<u64>)>> = OnceLock::new();
    T.get_or_init(|| {
        let v = ckpt_core::testhooks::var("CKPT_TEST_DIE_AT")?;
        Some(match v.split_once('@') {
            Some((phase, g)) => (phase.to_string(), g.parse().ok()),
            None => (v, None),
        })
    })
}

/// Dies (SIGKILL, as a crash would) if asked to at `phase` of `generation`.
pub fn die_at(phase: Phase, generation: u64) {
    if !ckpt_core::testhooks::BUILT_IN {
        // Nothing of the hook in such a build, its message neither.
        return;
    }
    if let Some((p, g)) = target() {
        if p == phase.name() && g.is_none_or(|g| g == generation) {
            eprintln!("ckpt: CKPT_TEST_DIE_AT={p}: killing myself (pid {}) at generation {generation}", std::process::id());
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
    }
}
