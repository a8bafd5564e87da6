//! End-to-end tests of process trees (children, grandchildren, sessions, process groups,
//! zombies): launched under ckpt, checkpointed, crashed, restarted, and finishing with the same
//! RESULT as an uninterrupted run.

use tests::*;

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tree_of_processes() {
    canonical_scenario(&Case::new("tree", |_| vec![os(prog("tree")), os("5")]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_memory_and_append_log() {
    canonical_scenario(&Case::new("shmem", |work: &std::path::Path| {
        vec![os(prog("shmem")), os(work), os("5")]
    }));
}

/// Pages of shared memory objects that only a child wrote and no process has mapped any more
/// (MAP_SHARED|MAP_ANONYMOUS, a memfd, unlinked POSIX shared memory, an unlinked file on disk
/// evicted from the page cache and mapped past its end), and a second PROT_NONE view of the
/// memfd: the objects hold the pages, not the page tables.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_objects_pages_no_process_maps() {
    canonical_scenario(&Case::new("shobjects", |work: &std::path::Path| {
        vec![os(prog("shobjects")), os(work), os("5")]
    }));
}

/// A bash pipeline of several processes (seq | awk | sort | md5sum | awk) with data in its pipes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_pipeline() {
    canonical_scenario(
        &Case::new("pipeline", |_| vec![os(interpreter("bash")), os(prog("pipeline.sh")), os("5")]).expect_pass(false),
    );
}

/// `make -j2` building a small C project in the work directory; the built program's output.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn make_j2_builds_a_project() {
    canonical_scenario(
        &Case::new("make", |work: &std::path::Path| {
            vec![os(interpreter("bash")), os(prog("makeproj.sh")), os(work), os("5")]
        })
        .expect_pass(false)
        // make writes object files after the checkpoint: without --protect the restart refuses
        // (the files are newer than the job's memory); with it they are put back.
        .protect_work(),
    );
}

/// A Python multiprocessing pool filling a shared Array and a SharedMemory block.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn python_multiprocessing_pool_on_shared_memory() {
    canonical_scenario(&Case::new("mp_shm", |_| vec![os(interpreter("python3")), os(prog("mp_shm.py")), os("5")]));
}

/// A program starting short programs all the time (posix_spawn, vfork + execve, fork + execve),
/// checkpointed many times in a row: a checkpoint that finds a child of vfork before its exec
/// still ends (it once waited forever for the parent, which waits for the child), and the restart
/// finishes with the uninterrupted result.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_program_starting_programs_all_the_time() {
    let case = Case::new("spawn", |_| vec![os(prog("spawn")), os("20")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let (reference, mut launch) = launch_and_checkpoint_many(&sb, &case, &work, 30, std::time::Duration::ZERO);
    launch.kill_launcher();

    restart_checkpoint_kill_and_finish(&sb, &case, &reference, 5, std::time::Duration::ZERO);
}

/// A daemon made the classic way (fork, setsid, fork, the middle process gone): its session and
/// process group are named after a process that no longer exists, and its parent is the job's
/// init. It comes back in the same session and group, adopted by the init, with its child in
/// the session too (a stand-in for the session's leader is made at restart, then ends).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_daemon_whose_session_leader_exited() {
    canonical_scenario(&Case::new("daemon", |_| vec![os(prog("daemon")), os("5")]));
}
