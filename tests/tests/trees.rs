//! End-to-end tests of process trees (children, grandchildren, sessions, process groups,
//! zombies): launched under ckpt, checkpointed, crashed, restarted, and finishing with the same
//! RESULT as an uninterrupted run.

use std::path::Path;
use tests::*;

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tree_of_processes() {
    canonical_scenario(&Case::new("tree", |_| vec![os(prog("tree")), os("5")]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_memory_and_append_log() {
    canonical_scenario(&Case::new("shmem", |work: &std::path::Path| vec![os(prog("shmem")), os(work), os("5")]));
}

/// The POSIX shared memory a parent and its workers map (shmem.c) is written back by the restart
/// when its file is gone (a restart on another node, or a node rebooted), before any of them
/// maps it: the image holds it once, in the process captured first, and the others' mappings
/// of it were refused as "mapped file cannot be opened" before the file was written.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_memory_files_the_image_holds_come_back_where_they_are_gone() {
    let sb = Sandbox::new("shmem-gone");
    let work = sb.mkdir("work");
    let argv = [os(prog("shmem")), os(&work), os("6")];
    let shm_files = || -> std::collections::BTreeSet<std::path::PathBuf> {
        std::fs::read_dir("/dev/shm").unwrap().filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.to_string_lossy().contains("ckpt-shmem-")).collect()
    };
    let before = shm_files();
    let mut job = Job::launch(&sb.path("img"), &argv, &sb.path("out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    let theirs: Vec<_> = shm_files().difference(&before).cloned().collect();
    assert!(!theirs.is_empty(), "shmem.c's shared memory files are not in /dev/shm");
    for f in &theirs {
        std::fs::remove_file(f).unwrap();
    }
    let mut again = Job::restart(&sb.path("img"), &sb.path("restart.out"));
    let status = again.wait_timeout(std::time::Duration::from_secs(60));
    let out = again.output();
    assert!(status.success() && has_line(&out, "PASS"), "the restart ended {}\n{}", describe_status(status), again.report());
    for f in &theirs {
        let _ = std::fs::remove_file(f);
    }
}

/// Shared memory written without pause while each checkpoint copies it before the freeze
/// (MAP_SHARED|MAP_ANONYMOUS, POSIX shared memory, a memfd also written with pwrite(2), and
/// children that write it and end between the copy and the freeze): every writer finds each
/// page as it last wrote it after a restart, never as the copy had it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_memory_written_while_copied_ahead() {
    canonical_scenario(&Case::new("sharedwrites", |work: &std::path::Path| vec![os(prog("sharedwrites")), os(work), os("6")]));
}

/// Pages of shared memory objects that only a child wrote and no process has mapped any more
/// (MAP_SHARED|MAP_ANONYMOUS, a memfd, unlinked POSIX shared memory, an unlinked file on disk
/// evicted from the page cache and mapped past its end), and a second PROT_NONE view of the
/// memfd: the objects hold the pages, not the page tables.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_objects_pages_no_process_maps() {
    canonical_scenario(&Case::new("shobjects", |work: &std::path::Path| vec![os(prog("shobjects")), os(work), os("5")]));
}

/// A bash pipeline of several processes (seq | awk | sort | md5sum | awk) with data in its pipes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_pipeline() {
    canonical_scenario(&Case::new("pipeline", |_| vec![os(interpreter("bash")), os(prog("pipeline.sh")), os("5")]).expect_pass(false));
}

/// `make -j2` building a small C project in the work directory; the built program's output.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn make_j2_builds_a_project() {
    canonical_scenario(
        &Case::new("make", |work: &std::path::Path| vec![os(interpreter("bash")), os(prog("makeproj.sh")), os(work), os("5")])
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
    // Long enough for 30 checkpoints in a row and the restart's 5 on a loaded machine.
    let case = Case::new("spawn", |_| vec![os(prog("spawn")), os("30")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let (reference, mut launch) = launch_and_checkpoint_many(&sb, &case, &work, 30, std::time::Duration::ZERO);
    launch.kill_launcher();

    restart_checkpoint_kill_and_finish(&sb, &case, reference.output(), 5, std::time::Duration::ZERO);
}

/// A program starting short multithreaded programs all the time, each ending while its threads
/// run (tests/progs/exiters.c), checkpointed many times in a row: a checkpoint that seizes one
/// as it exits still ends, and commits. Before, such checkpoints failed (a held thread gone:
/// "PTRACE_SETSIGMASK: No such process"), or the freeze could wait for ever for the exiting
/// process's main thread; and (until session 21, about one run in three) when a thread the
/// freeze had not stopped yet ended the process (exit from another thread) after its other
/// threads were stopped: the process is now collected and recorded as the zombie it becomes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn programs_exiting_while_their_threads_run() {
    // Long enough for 20 checkpoints in a row while CI's other work shares the two cores (at 5 s
    // it once ended before the crash there).
    let case = Case::new("exiters", |_| vec![os(prog("exiters")), os("8")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let (reference, mut launch) = launch_and_checkpoint_many(&sb, &case, &work, 20, std::time::Duration::from_millis(50));
    launch.kill_launcher();

    restart_checkpoint_kill_and_finish(&sb, &case, reference.output(), 5, std::time::Duration::from_millis(50));
}

/// A child stopped by SIGSTOP (a shell's job after ^Z) stays stopped through a checkpoint, a
/// crash and restart, and a `--kill` and restart: it never runs while stopped (its count in
/// memory shared with its parent does not move) and goes on where it was once continued.
/// Before restarts kept it, the first restart let it run.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_stopped_child_stays_stopped() {
    canonical_scenario(&Case::new("stopped", |_| vec![os(prog("stopped")), os("5")]));
}

/// The same with SIGSTOP sent twice more to the stopped child (kill and tgkill: zdtm's stopped01,
/// 02, 12), which stay pending in it: the checkpoint's calls in the child take such a signal,
/// which failed the checkpoint ("signal 19 arrived during an injected system call"); now it is
/// held back and sent again, and the child, continued, runs to its end.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_stopped_child_with_stops_pending() {
    canonical_scenario(&Case::new("stopped-again", |_| vec![os(prog("stopped")), os("5"), os("again")]));
}

/// A child stopped by SIGTSTP (a terminal's ^Z), in a process group of its own: restarted, it
/// is stopped again by SIGTSTP, and its parent's report of the stop says so (zdtm's stopped03;
/// it came back stopped by SIGSTOP).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_child_stopped_by_its_terminals_signal_is_stopped_by_it_again() {
    canonical_scenario(&Case::new("stopped-tstp", |_| vec![os(prog("stopped")), os("5"), os("tstp")]));
}

/// Process groups whose leader exited (a shell pipeline whose first command ended), one in the
/// program's session and one in a session whose leader exited too (tests/progs/pgroups.c): each
/// member keeps its group and session and gets every signal sent to its group. Before, the
/// checkpoint was taken and the restart refused it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn process_groups_whose_leader_exited() {
    canonical_scenario(&Case::new("pgroups", |_| vec![os(prog("pgroups")), os("5")]));
}

/// A process group whose leader exited in a session whose leader lives (tests/progs/pgroups.c
/// `live`): its member, adopted by the job's init, is in a session the init is not in. The
/// restart makes the group from a stand-in the living leader forks, and the member from a
/// helper of the leader; the leader reaps both, unseen (no SIGCHLD). Before, the checkpoint was
/// refused, naming the process and its session.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_group_whose_leader_exited_in_a_session_whose_leader_lives() {
    canonical_scenario(&Case::new("pgroups-live", |_| vec![os(prog("pgroups")), os("5"), os("live")]));
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

/// The uninterrupted answer (RESULT) of a program whose launched process exits, with `code`,
/// before the processes it leaves behind write RESULT and PASS (to `reference.out`).
fn reference_left_behind(sb: &Sandbox, argv: &[std::ffi::OsString], code: i32, name: &str) -> String {
    let out = std::fs::File::create(sb.path("reference.out")).unwrap();
    let status = command(&argv[0]).args(&argv[1..]).stdout(out).stdin(std::process::Stdio::null()).status().unwrap();
    assert_eq!(status.code(), Some(code), "{name}: the reference run's launched process should exit {code} ({status})");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = read_text(&sb.path("reference.out"));
        if has_line(&text, "PASS") {
            return result_line(&text).expect("a RESULT");
        }
        assert!(std::time::Instant::now() < deadline, "{name}: the reference run's processes left behind did not finish:\n{text}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A server that daemonizes and lets the launched program end (`redis-server --daemonize
/// yes`): the job goes on with the daemon, is checkpointed then, crashed and restarted, and
/// ends when the daemon does, with the launched program's status and the uninterrupted answer.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_daemon_outlives_the_launched_program() {
    let sb = Sandbox::new("daemonize");
    let argv = vec![os(prog("daemonize")), os("5")];
    // The uninterrupted answer: the daemon writes it after the launched process has ended.
    let reference = reference_left_behind(&sb, &argv, 0, "daemonize");

    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(job.try_wait().is_none(), "daemonize: the job ended with the launched program, its daemon with it\n{}", job.report());
    job.checkpoint(&[]);
    let out = ckpt(&[os("inspect"), os(&sb.dir), os("--json")]);
    assert!(out.success() && out.stdout.contains("main_end"), "daemonize: the image should say the main process has ended: {out}");
    job.kill_launcher();

    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = restarted.wait();
    assert!(status.success(), "daemonize: the restarted job should end with the launched program's status 0\n{}", restarted.report());
    assert_eq!(result_line(&restarted.output()).as_deref(), Some(reference.as_str()), "{}", restarted.report());
    assert!(has_line(&restarted.output(), "PASS"), "{}", restarted.report());
}

/// A launched program that starts workers in its own session and exits first (DMTCP's
/// shared-fd2, a batch script ending with background jobs): by default the workers end with
/// it; with `--until all` (kept for the restarts in job.json) the job goes on until the last
/// worker ends, through a crash round and a `--kill` round, and ends with the launched
/// program's status.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn workers_outlive_the_launched_program_with_until_all() {
    let sb = Sandbox::new("orphans");
    let argv = vec![os(prog("orphans")), os("5")];
    // The uninterrupted answer: the consumer writes it after the launched process has ended.
    let reference = reference_left_behind(&sb, &argv, 3, "orphans");

    // By default the workers end with the launched program.
    let plain_dir = sb.mkdir("plain");
    let mut plain = Job::launch(&plain_dir.join("img"), &argv, &sb.path("plain.out"));
    let status = plain.wait_timeout(std::time::Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "orphans: without --until the job should end with the launched program\n{}", plain.report());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(result_line(&plain.output()).is_none(), "orphans: the workers should have ended with the launched program\n{}", plain.report());

    // Once the launched program has ended, a SIGTERM to ckpt reaches the processes left.
    let termed_dir = sb.mkdir("termed");
    let mut termed = Job::launch_with(&termed_dir.join("img"), &["--until", "all"], &argv, &sb.path("termed.out"));
    termed.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(termed.try_wait().is_none(), "orphans: with --until all the job ended with the launched program\n{}", termed.report());
    // SAFETY: kill(2) with plain integers.
    unsafe { libc::kill(termed.pid() as i32, libc::SIGTERM) };
    termed.wait_timeout(std::time::Duration::from_secs(10));
    wait_job_gone(&termed_dir.join("img"), std::time::Duration::from_secs(10), "a SIGTERM to ckpt after the launched program ended");
    // (The consumer may see the producer end first and print what it read so far: never PASS.)
    assert!(!has_line(&termed.output(), "PASS"), "orphans: the workers should have ended on SIGTERM\n{}", termed.report());

    let mut job = Job::launch_with(&sb.dir, &["--until", "all"], &argv, &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(job.try_wait().is_none(), "orphans: with --until all the job ended with the launched program\n{}", job.report());
    job.checkpoint(&[]);
    let out = ckpt(&[os("inspect"), os(&sb.dir), os("--json")]);
    assert!(out.success() && out.stdout.contains("main_end"), "orphans: the image should say the main process has ended: {out}");
    job.kill_launcher();

    // No --until here: the launch's holds (job.json).
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart1.out"));
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(restarted.try_wait().is_none(), "orphans: the restarted job ended early\n{}", restarted.report());
    restarted.checkpoint(&["--kill"]);
    restarted.wait_killed();

    let mut last = Job::restart(&sb.dir, &sb.path("restart2.out"));
    let status = last.wait();
    assert_eq!(status.code(), Some(3), "orphans: the job should end with the launched program's status 3\n{}", last.report());
    assert_eq!(result_line(&last.output()).as_deref(), Some(reference.as_str()), "{}", last.report());
    assert!(has_line(&last.output(), "PASS"), "{}", last.report());
}

/// The breadth issue's held-out tree, all at once (tests/progs/heldtree.c): a child subreaper
/// that adopted an orphaned session and an orphaned process group of a living session, a
/// stopped child, a pipe in flight over SCM_RIGHTS, an unlinked file with a hole, a datagram
/// from a sender closed since and a read lease; each part checked after the crash round and
/// the --kill round. Before, the checkpoint was refused (a process adopted into a session not
/// its parent's).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn the_held_out_tree_all_at_once() {
    canonical_scenario(&Case::new("heldtree", |work: &Path| vec![os(prog("heldtree")), os(work), os("5")]));
}

/// A job that kills one of its own process groups (`kill -KILL -PGID`, as a shell's `kill 0` or
/// an MPI launcher ending its ranks does) while a checkpoint copies that group's memory after
/// the release: the copy forked at the freeze is in a session of its own, so the signal does
/// not reach it, and the checkpoint commits with the group's memory as it was at the freeze.
/// The job goes on without the group; a restart brings the group back and the job finishes as
/// if never interrupted. Before, the copy died with the group and the checkpoint failed
/// ("copying its memory after the job was released: open /proc/N/pagemap: No such file").
/// `CKPT_TEST_LATER_PAUSE_MS` holds the copy back long enough to kill the group first.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_process_group_killed_while_its_memory_is_copied_after_the_release() {
    let sb = Sandbox::new("group-killed");
    let script = "setsid sleep 3 & w=$!; echo START; wait $w; echo \"WORKER ENDED $?\"; \
                  i=0; while [ $i -lt 20 ]; do i=$((i+1)); sleep 0.1; done; echo \"RESULT $i\"; echo PASS";
    let args = [os("launch"), os("--dir"), os(&sb.dir), os("--copy-memory"), os("later"), os("--"), os("bash"), os("-c"), os(script)];
    let mut job = Job::start(&sb.dir, &sb.dir, &args, &[("CKPT_TEST_LATER_PAUSE_MS", "2500")], &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    // bash says START once it forked; its child becomes sleep (through setsid) a moment later.
    let started = std::time::Instant::now();
    let worker = loop {
        let sleep = job_processes(&sb.dir).into_iter().find(|&pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep"));
        match sleep {
            Some(pid) => break pid,
            None if started.elapsed() < std::time::Duration::from_secs(10) => std::thread::sleep(std::time::Duration::from_millis(20)),
            None => panic!("the job's sleep is not among its processes\n{}", job.report()),
        }
    };
    let dir = sb.dir.clone();
    let checkpoint = std::thread::spawn(move || ckpt(&[os("checkpoint"), os("--dir"), os(&dir), os("--json")]));
    // The freeze takes milliseconds; the copy waits 2.5 s after it.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // SAFETY: kill(2) of a process group the job made (its leader's pid, read from /proc).
    let rc = unsafe { libc::kill(-(worker as libc::pid_t), libc::SIGKILL) };
    assert_eq!(rc, 0, "kill the worker's group: {}", std::io::Error::last_os_error());
    let out = checkpoint.join().expect("the checkpoint thread");
    assert!(out.success(), "the checkpoint should commit with the killed group's memory as at the freeze: {out}\n{}", job.report());
    let status = job.wait_timeout(std::time::Duration::from_secs(30));
    assert!(
        has_line(&job.output(), "WORKER ENDED 137") && has_line(&job.output(), "PASS"),
        "the job should go on without the group ({status})\n{}",
        job.report()
    );
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = restarted.wait_timeout(std::time::Duration::from_secs(30));
    let output = restarted.output();
    assert!(
        status.success() && has_line(&output, "WORKER ENDED 0") && has_line(&output, "RESULT 20") && has_line(&output, "PASS"),
        "the restarted job should have its group back and finish ({status})\n{}",
        restarted.report()
    );
}
