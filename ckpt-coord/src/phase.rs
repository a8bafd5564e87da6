//! The steps of a coordinated checkpoint (docs/PROTOCOL.md, "A checkpoint, phase by phase") at
//! which the coordinator and the agents reach a point the failure rules speak of: where a crash
//! of either must leave the job running and the last committed generation whole. The crash hook
//! of the tests ([`crate::testhook`]) names them.

/// A point in a checkpoint the coordinator and every agent pass through, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `prepare` reached every agent (agent: received it; coordinator: sent it to all):
    /// every job is freezing.
    Prepare,
    /// Every job is captured and still frozen (coordinator: the barrier).
    Captured,
    /// Every job runs again (agent: just before it resumes its job).
    Release,
    /// Every part is durable (agent: just before it writes its part).
    Persist,
    /// The coordinator is about to write the generation's manifest.
    Commit,
}

impl Phase {
    /// The phase's name in docs/PROTOCOL.md and in `CKPT_TEST_DIE_AT`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prepare => "prepare",
            Phase::Captured => "captured",
            Phase::Release => "release",
            Phase::Persist => "persist",
            Phase::Commit => "commit",
        }
    }
}
