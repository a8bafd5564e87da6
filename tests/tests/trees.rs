//! End-to-end tests of process trees (children, grandchildren, sessions, process groups,
//! zombies): launched under ckpt, checkpointed, crashed, restarted, and finishing with the same
//! RESULT as an uninterrupted run.

use tests::*;

#[test]
fn tree_of_processes() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("tree", |_| vec![os(prog("tree")), os("5")]));
}

#[test]
fn shared_memory_and_append_log() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("shmem", |work: &std::path::Path| {
        vec![os(prog("shmem")), os(work), os("5")]
    }));
}
