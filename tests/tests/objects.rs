//! End-to-end tests of the kernel objects a descriptor can hold beyond files and pipes (eventfd,
//! timerfd, signalfd, epoll, FIFOs, deleted files, memfds, inotify) and of file locks: each C
//! program of tests/progs/ sets its objects up, is checkpointed, crashed and restarted (see
//! `tests::canonical_scenario`), and checks that they behave as before: the same counts, timers
//! firing on time, the same signals, the same events with their data, every byte once, every
//! lock held.

use std::path::Path;

use tests::*;

/// Seconds each program runs (uninterrupted): long enough for the scenario's checkpoints to
/// land mid-way (about 2.5 s of it is used before the last restart).
const SECONDS: &str = "5";

#[test]
fn eventfd_counters_and_flags() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("eventfd", |_| {
        vec![os(prog("eventfd")), os(SECONDS)]
    }));
}

#[test]
fn timerfd_fires_on_time() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("timerfd", |_| {
        vec![os(prog("timerfd")), os(SECONDS)]
    }));
}

#[test]
fn signalfd_reads_blocked_signals() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("signalfd", |_| {
        vec![os(prog("signalfd")), os(SECONDS)]
    }));
}

#[test]
fn epoll_interest_list() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("epoll", |_| {
        vec![os(prog("epoll")), os(SECONDS)]
    }));
}

#[test]
fn fifo_data_in_flight() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("fifo", |work: &Path| {
        vec![os(prog("fifo")), os(work), os(SECONDS)]
    }));
}

#[test]
fn deleted_files_keep_their_contents() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("deleted", |work: &Path| {
        vec![os(prog("deleted")), os(work), os(SECONDS)]
    }));
}

#[test]
fn memfd_contents_and_seals() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("memfd", |_| {
        vec![os(prog("memfd")), os(SECONDS)]
    }));
}

#[test]
fn inotify_watches_at_their_wds() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("inotify", |work: &Path| {
        vec![os(prog("inotify")), os(work), os(SECONDS)]
    }));
}

#[test]
fn file_locks_held_again() {
    if skip() {
        return;
    }
    canonical_scenario(&Case::new("locks", |work: &Path| {
        vec![os(prog("locks")), os(work), os(SECONDS)]
    }));
}
