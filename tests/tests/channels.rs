//! End-to-end tests of data in flight between the job's processes (pipes, ...): checkpointed
//! while buffers are full and records half read, crashed, restarted; every record must arrive
//! exactly once, in order, with the same final checksum as an uninterrupted run.

use tests::*;

#[test]
fn pipes_between_processes() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("pipes", |_| vec![os(prog("pipes")), os("5")]));
}

#[test]
fn unix_sockets_between_processes() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("unixsock", |work: &std::path::Path| {
        vec![os(prog("unixsock")), os(work), os("5")]
    }));
}
