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
