//! End-to-end tests of the kernel objects a descriptor can hold beyond files and pipes (eventfd,
//! timerfd, signalfd, epoll, FIFOs, deleted files, memfds, inotify) and of file locks: each C
//! program of tests/progs/ sets its objects up, is checkpointed, crashed and restarted (see
//! `tests::canonical_scenario`), and checks that they behave as before: the same counts, timers
//! firing on time, the same signals, the same events with their data, every byte once, every
//! lock held.

use std::path::Path;
use std::time::Duration;

use tests::*;

/// Seconds each program runs (uninterrupted): long enough for the scenario's checkpoints to
/// land mid-way (about 2.5 s of it is used before the last restart).
const SECONDS: &str = "5";

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn eventfd_counters_and_flags() {
    canonical_scenario(&Case::new("eventfd", |_| vec![os(prog("eventfd")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn timerfd_fires_on_time() {
    canonical_scenario(&Case::new("timerfd", |_| vec![os(prog("timerfd")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn signalfd_reads_blocked_signals() {
    canonical_scenario(&Case::new("signalfd", |_| vec![os(prog("signalfd")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn epoll_interest_list() {
    canonical_scenario(&Case::new("epoll", |_| vec![os(prog("epoll")), os(SECONDS)]));
}

/// Watches whose descriptor number is closed or holds another file (tests/progs/epollmoved.c):
/// an eventfd watched as N, dup'ed to M and N closed; a pipe then at N and watched too. Both
/// report with their data after each restart, and the kernel's keys are as they were (MOD of M
/// finds nothing, DEL of N removes the pipe's). Before, the checkpoint was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn epoll_watches_known_by_a_closed_number() {
    canonical_scenario(&Case::new("epollmoved", |_| vec![os(prog("epollmoved")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn fifo_data_in_flight() {
    canonical_scenario(&Case::new("fifo", |work: &Path| vec![os(prog("fifo")), os(work), os(SECONDS)]));
}

/// A file open under a name that was unlinked while another name of it in the same directory
/// lives on (tests/progs/relinked.c; zdtm's unlink_fstat03): /proc shows it deleted, but after
/// a restart the descriptor holds the file itself, reopened by its other name (records appended
/// through it appear there), not a copy. Before, the checkpoint was refused ("deleted but still
/// linked elsewhere"). The work directory is protected: the restart finds "kept" as it was.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_file_unlinked_under_one_name_and_kept_under_another() {
    canonical_scenario(&Case::new("relinked", |work: &Path| vec![os(prog("relinked")), os(work), os(SECONDS)]).protect_work());
}

/// Descriptors of namespaces (tests/progs/nsfds.c: a process holding its own network, UTS,
/// IPC, mount, PID, cgroup and user namespaces open, and its child's UTS namespace, made in a
/// user namespace of its own as an ordinary user; zdtm's proc-self): after each restart each
/// descriptor is the namespace its process (or the child) is in again. Before, the checkpoint
/// was refused ("net:[...], a deleted file").
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn descriptors_of_namespaces() {
    canonical_scenario(&Case::new("nsfds", |_| vec![os(prog("nsfds")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn deleted_files_keep_their_contents() {
    canonical_scenario(&Case::new("deleted", |work: &Path| vec![os(prog("deleted")), os(work), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn memfd_contents_and_seals() {
    canonical_scenario(&Case::new("memfd", |_| vec![os(prog("memfd")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn inotify_watches_at_their_wds() {
    canonical_scenario(&Case::new("inotify", |work: &Path| vec![os(prog("inotify")), os(work), os(SECONDS)]));
}

/// A fanotify group reporting file handles (tests/progs/fanotify.c): a directory marked for the
/// entries created in it, a file for changes with FAN_OPEN ignored (surviving modify), and as
/// root the work directory's mount; every step's events must come for the right file with the
/// right mask. An ordinary user may make such a group (Linux 5.13). Before, refused at
/// checkpoint as a descriptor of an unknown kind.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn fanotify_marks_and_masks() {
    canonical_scenario(&Case::new("fanotify", |work: &Path| vec![os(prog("fanotify")), os(work), os(SECONDS)]));
}

/// A checkpoint that catches a program with an inotify event not read yet (inotify.c with
/// GO_FILE: a file created in the watched directory, the event read only once GO_FILE exists)
/// lets the job go and tries again until it has read it: the restarted program then finds every
/// event it expects. Before, the event was lost (seen in CI: "create: no event" after a restart,
/// when a checkpoint landed between a step's create and its read).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_checkpoint_that_catches_an_inotify_event_unread_tries_again() {
    let sb = Sandbox::new("inotify-pending");
    let work = sb.mkdir("run");
    let go = work.join("go");
    caught_midway_then_restarted(&sb, &[os(prog("inotify")), os(&work), os(SECONDS), os(&go)], "PENDING", "inotify instance", &go);
}

/// A watch on a file deleted while the program holds it open (tests/progs/inotifydel.c: a log
/// rotated away under `tail -f`), beside one on a file that stays: each write through the
/// program's descriptor gives one IN_MODIFY for its own wd after each restart. The watch is
/// added through the descriptor, on the file's copy. Before, the checkpoint was refused (the
/// inode has no path).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn inotify_watches_on_files_deleted_while_open() {
    canonical_scenario(&Case::new("inotifydel", |work: &Path| vec![os(prog("inotifydel")), os(work), os(SECONDS)]));
}

/// Descriptors of device nodes the job made (tests/progs/devnodes.c: a node of /dev/null, one
/// of /dev/zero whose name was removed, one of the system console, each of a mode of its own)
/// come back as those devices with those modes, the removed one without a name. Before, each
/// was refused (a device outside the few reopened by their /dev path), as zdtm's console, vt
/// and deleted_dev were.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn device_nodes_the_job_made() {
    needs_root("making a device node needs CAP_MKNOD");
    canonical_scenario(&Case::new("devnodes", |work: &Path| vec![os(prog("devnodes")), os(work), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn file_locks_held_again() {
    canonical_scenario(&Case::new("locks", |work: &Path| vec![os(prog("locks")), os(work), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn posix_timers_keep_ids_and_fire_on_time() {
    canonical_scenario(&Case::new("posix_timer", |_| vec![os(prog("posix_timer")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn pidfd_of_a_child_reports_its_exit() {
    canonical_scenario(&Case::new("pidfd", |_| vec![os(prog("pidfd")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn sysv_ipc_shm_semaphores_and_queues() {
    canonical_scenario(&Case::new("sysvipc", |_| vec![os(prog("sysvipc")), os(SECONDS)]));
}

/// Two processes passing numbered messages of several priorities through POSIX message queues
/// (one shared by the fork, one opened by name and then unlinked, one O_NONBLOCK descriptor),
/// with messages queued at every moment, and a SIGEV_SIGNAL notification registered before the
/// checkpoints that must fire once after the restarts.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn posix_mqueue_messages_names_and_notification() {
    canonical_scenario(&Case::new("mqueue", |_| vec![os(prog("mqueue")), os(SECONDS)]));
}

/// The canonical scenario (see `tests::canonical_scenario`) with `--save-files` given to the
/// launch only (the restarts take it from the job): a file changed in place after the
/// checkpoint, before the crash, is put back as it was.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn save_files_restores_a_file_changed_in_place() {
    let case = Case::new("savefiles", |work: &Path| vec![os(prog("savefiles")), os(work), os(SECONDS)]).compare_file("data.bin");
    let sb = Sandbox::new(&case.name);
    let (ref_work, run_work) = (sb.mkdir("ref"), sb.mkdir("run"));
    let reference = Reference::start(&case.argv(&ref_work), &sb.path("reference.out"));

    let mut launch = Job::launch_with(&sb.dir, &["--save-files"], &case.argv(&run_work), &sb.path("launch.out"));
    launch.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(case.timing.before_checkpoint);
    let g1 = check_checkpoint_json(&launch.checkpoint(&[]));
    std::thread::sleep(case.timing.run_on);
    assert!(launch.try_wait().is_none(), "the job ended before the crash\n{}", launch.report());
    launch.kill_launcher();

    let mut first = Job::restart(&sb.dir, &sb.path("restart1.out"));
    std::thread::sleep(case.timing.after_restart);
    let g2 = check_checkpoint_json(&first.checkpoint(&["--kill"]));
    assert!(g2 > g1, "generation {g2} after {g1}");
    first.wait_killed();
    assert_not_rerun(&first);

    let mut second = Job::restart(&sb.dir, &sb.path("restart2.out"));
    assert_matches_reference(&case, &mut second, reference.output());
    assert_same_file(&run_work.join("data.bin"), &ref_work.join("data.bin"));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn pty_output_input_and_settings() {
    canonical_scenario(&Case::new("pty", |_| vec![os(prog("pty")), os(SECONDS)]));
}

/// A session whose controlling terminal it holds only through the pty's master and /dev/tty
/// (tests/progs/ctty.c: the slave closed once taken): after each restart /dev/tty must still
/// read what is typed into the master, and open anew naming the session; and a session holding
/// no end of its terminal, whose master its parent holds, must still have it (the hangup when
/// the parent closes the master reaches it). Before, the restart gave such sessions no terminal
/// (no slave to take it through) and failed to reopen /dev/tty.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_terminal_held_through_its_master_and_dev_tty() {
    canonical_scenario(&Case::new("ctty", |_| vec![os(prog("ctty")), os(SECONDS)]));
}

/// A file of the job's own /proc held open across checkpoints (`/proc/self/status`, which the
/// kernel names `/proc/PID/status` with the job's pid): the restart cannot check it from
/// outside (the restorer's /proc is another), and the restored process, with the same pid,
/// reopens it and reads its own status again.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn own_proc_file_held_open() {
    canonical_scenario(&Case::new("procfile", |_| vec![os(interpreter("python3")), os("-c"), os(HOLDS_PROC_STATUS), os(SECONDS)]));
}

/// `python3 -c HOLDS_PROC_STATUS SECONDS`: opens /proc/self/status once, and a second thread
/// opens its /proc/thread-self/status (/proc/PID/task/TID: the thread exists only once the
/// restore made it); then every step reads both again from the start (seek) and checks that
/// they name this very process and thread.
const HOLDS_PROC_STATUS: &str = r#"
import os, sys, time, hashlib, threading
f = open("/proc/self/status")
held, ready, stop = {}, threading.Event(), threading.Event()
def hold():
    held["tid"] = threading.get_native_id()
    held["f"] = open("/proc/thread-self/status")
    ready.set()
    stop.wait()
t = threading.Thread(target=hold, daemon=True)
t.start()
ready.wait()
print("START", flush=True)
h = hashlib.sha256()
end = int(float(sys.argv[1]) * 100)
for i in range(end):
    f.seek(0)
    pid = [l.split()[1] for l in f.read().splitlines() if l.startswith("Pid:")]
    if pid != [str(os.getpid())]:
        print("FAIL /proc/self/status names", pid, "not", os.getpid(), flush=True)
        sys.exit(1)
    g = held["f"]
    g.seek(0)
    tid = [l.split()[1] for l in g.read().splitlines() if l.startswith("Pid:")]
    if tid != [str(held["tid"])]:
        print("FAIL /proc/thread-self/status names", tid, "not", held["tid"], flush=True)
        sys.exit(1)
    h.update(str(i).encode())
    time.sleep(0.01)
stop.set()
print("RESULT", h.hexdigest()[:16], flush=True)
print("PASS", flush=True)
"#;

/// File systems the job mounted in a mount namespace it made (tests/progs/mounts.c: a tmpfs
/// with files, links, a FIFO, modes and times; binds, one read-only; a proc; a mount undone)
/// come back with their contents as at the checkpoint, and its processes in that namespace: one
/// forked there, one adopted by the job's init (put back in it, not born there).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mounts_in_a_namespace_the_job_made() {
    needs_root("mounting outside a user namespace of the job's own needs CAP_SYS_ADMIN (an ordinary user's case is mounts_in_a_user_namespace_the_job_made)");
    canonical_scenario(&Case::new("mounts", |work: &Path| vec![os(prog("mounts")), os(work.join("m")), os(SECONDS)]));
}

/// The same mounts made in a user namespace the job made, where the program is root
/// (mounts.c `userns`, as `unshare -Urm` and rootless container runtimes do: the only way an
/// ordinary user mounts anything): the user namespace comes back with the same maps, the
/// processes in it root there, the tmpfs's files owned by that root, and the mounts as in
/// `mounts_in_a_namespace_the_job_made`. For root and for an ordinary user alike. Before, the
/// checkpoint was refused (a user namespace of its own).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mounts_in_a_user_namespace_the_job_made() {
    canonical_scenario(&Case::new("mounts-userns", |work: &Path| vec![os(prog("mounts")), os(work.join("m")), os(SECONDS), os("userns")]));
}

/// A UTS namespace the job made (tests/progs/uts.c: `unshare --uts`, in a user namespace of its
/// own where the program is not root, as `unshare -Uru` does): its host and domain names come
/// back, the process that made it and its child share it again (the child sees every name the
/// maker sets), and the job's own names stay the machine's. The image names the namespace.
/// For root and for an ordinary user alike. Before, the checkpoint was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_uts_namespace_the_job_made() {
    let case = Case::new("uts", |_| vec![os(prog("uts")), os(SECONDS)]).check_image(|dir| {
        let i = inspect(dir);
        assert!(
            i.stdout.contains("the UTS namespace pid") && i.stdout.contains("\"ckpt.example\""),
            "uts: the last generation names no UTS namespace of the job's\n{i}"
        );
    });
    canonical_scenario(&case);
}

/// An IPC namespace the job made (tests/progs/ipcns.c: `unshare --ipc`, in a user namespace of
/// its own where the program is not root): its System V segment, semaphores and message queue
/// and its POSIX message queue come back, in it and not in the job's, which holds a segment of
/// the same key and a queue of the same name; the process that made it and its child share
/// them again (every message once and in order, a counter that keeps moving). The image names
/// the namespace. For root and for an ordinary user alike. Before, the checkpoint was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_ipc_namespace_the_job_made() {
    let case = Case::new("ipcns", |_| vec![os(prog("ipcns")), os(SECONDS)]).check_image(|dir| {
        let i = inspect(dir);
        assert!(
            i.stdout.contains("the IPC namespace pid") && i.stdout.contains("1 shared memory segment(s), 1 semaphore set(s), 1 message queue(s)"),
            "ipcns: the last generation names no IPC namespace of the job's with its objects\n{i}"
        );
    });
    canonical_scenario(&case);
}

/// A process that changed its root directory (tests/progs/chroot.c: chroot into a directory
/// of the work directory, in a user namespace of its own where it is not root, as `unshare -Ur
/// chroot` does) and a child: after each restart both are under the same root, the old one out
/// of reach, with the file opened before the chroot still open. Before, refused at checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_root_directory_the_program_changed() {
    canonical_scenario(&Case::new("chroot", |work: &Path| vec![os(prog("chroot")), os(work), os(SECONDS)]));
}

/// A mount namespace made in one user namespace of the job's by a process that then enters a
/// second one below it, while another process stays in the first: `unshare -Ur sh` keeps a
/// shell there, which starts `unshare -m` (a tmpfs at DIR holding DIR/f) that runs `unshare -Ur
/// bash` (tests/progs/tmpfsread.sh reading DIR/f every step). The restart makes the mount
/// namespace when the second process's way down reaches the first user namespace, which the
/// shell made before it. Found by review: that mount namespace was not made at all, silently.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_mount_namespace_made_above_its_process_user_namespace() {
    canonical_scenario(&Case::new("mount-owner-above", |work: &Path| {
        let d = work.join("m");
        std::fs::create_dir_all(&d).unwrap();
        give_to_user(&d);
        let inner = format!(
            "unshare -m sh -c 'mount -t tmpfs x {d} && echo hi > {d}/f && exec unshare -U -r {bash} {script} {d}' & wait",
            d = d.display(),
            bash = interpreter("bash").display(),
            script = prog("tmpfsread.sh").display()
        );
        vec![os("unshare"), os("--user"), os("--map-root-user"), os("/bin/sh"), os("-c"), os(inner)]
    }));
}

/// A container as a runtime without setuid makes it inside the job (tests/progs/pivot.c, as
/// Charliecloud's ch-run does): in a user namespace of its own (as root: a mount namespace
/// alone), an image directory bound onto itself with /dev and /proc bound in recursively and a
/// tmpfs at /tmp, pivoted into (pivot_root), the old root detached and the new root read-only;
/// the program runs inside it with a child. After each restart both find the same world: a
/// read-only root, the tmpfs with the counter of the checkpoint, their file by a kept
/// descriptor and by name, their working directory and /proc/self/exe inside the image, no
/// old root. The image says the root was pivoted. For root and an ordinary user alike. Before,
/// refused at checkpoint (an ext4 file system mounted at / by the job).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_container_root_the_job_pivoted_into() {
    let case = Case::new("pivot", |work: &Path| vec![os(prog("pivot-static")), os(work), os(SECONDS)]).check_image(|dir| {
        let i = inspect(dir);
        assert!(
            i.stdout.contains("the root pivoted into") && i.stdout.contains("recursive bind of /dev"),
            "pivot: the last generation holds no pivoted root\n{i}"
        );
    });
    canonical_scenario(&case);
}

/// The same mounts made in the job's own mount namespace (mounts.c `here`): replayed in the
/// restarted job's namespace, and none of them reaches the machine's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mounts_in_the_jobs_own_namespace() {
    needs_root("mounting needs CAP_SYS_ADMIN");
    let sb = Sandbox::new("mounts-here");
    let work = sb.mkdir("run").join("m");
    let mut job = Job::launch(&sb.dir, &[os(prog("mounts")), os(&work), os("4"), os("here")], &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(500));
    check_checkpoint_json(&job.checkpoint(&["--kill"]));
    job.wait_killed();
    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = again.wait();
    let out = again.output();
    assert!(status.success() && has_line(&out, "PASS"), "{}", again.report());
    assert_eq!(out.lines().filter(|l| l.starts_with("CHILD-OK")).count(), 2, "{}", again.report());
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!host.contains(&*work.to_string_lossy()), "the job's mounts reached the machine's namespace:\n{host}");
}

/// A mount the machine removes from under a running job (here `ip netns delete` of a network
/// namespace made before the launch: the kernel takes the mount on its file away in every mount
/// namespace, the job's too) is recorded as unmounted, and the restart, which finds it gone as
/// well, goes on. Before, the restart failed ("unmount /run/netns/NAME again: find it"); seen
/// when another test's nodes came and went during a checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_mount_the_machine_removed_under_the_job() {
    needs_root("ip netns needs root");
    let sb = Sandbox::new("machine-unmounted");
    let netns = format!("ckptgone{}", std::process::id());
    let ip = |verb: &str| {
        let out = std::process::Command::new("ip").args(["netns", verb, &netns]).output().expect("run ip");
        assert!(out.status.success(), "ip netns {verb} {netns}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ip("add");
    let mut job = Job::launch(&sb.dir, &[os(prog("compute")), os("4"), os("8")], &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(30));
    ip("delete");
    check_checkpoint_json(&job.checkpoint(&["--kill"]));
    job.wait_killed();
    let i = inspect(&sb.dir);
    assert!(i.stdout.contains(&format!("unmounted /run/netns/{netns}")), "the test missed its mark: the job's namespace kept the mount\n{i}");
    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = again.wait();
    assert!(status.success() && has_line(&again.output(), "PASS"), "{}", again.report());
}

/// A mount namespace the job made (here with a user namespace, as bwrap and `unshare -Urm` do)
/// holds a copy of every mount of the machine, here all made private: a file the machine has
/// mounted (a network namespace's, under /run/netns), made read-only in the job's namespace,
/// gets its flags and propagation again at the restart
/// (before, the restart failed: "give mount /run/netns/NAME its propagation Slave again: Not a
/// directory"), and when the machine removed that mount after the checkpoint, the restarted
/// namespace is left without it, as the machine is. Seen when the ordinary user's bwrap sandbox
/// met the network namespaces of the root run's nodes. For root and for an ordinary user alike
/// (the harness makes the network namespace).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_file_the_machine_mounted_in_a_mount_namespace_the_job_made() {
    needs_harness_root();
    struct Netns(String);
    impl Netns {
        fn ip(&self, verb: &str) -> bool {
            let quiet = std::process::Stdio::null;
            std::process::Command::new("ip").args(["netns", verb, &self.0]).stderr(quiet()).status().is_ok_and(|s| s.success())
        }
    }
    impl Drop for Netns {
        fn drop(&mut self) {
            self.ip("delete");
        }
    }
    for removed in [false, true] {
        let sb = Sandbox::new(if removed { "machine-file-mount-removed" } else { "machine-file-mount" });
        let netns = Netns(format!("ckptfile{}{}", std::process::id(), removed as u8));
        assert!(netns.ip("add"), "ip netns add {}", netns.0);
        // Every mount made private, as bwrap does, and the copy of the machine's mount of the
        // network namespace's file made read-only.
        let remount = format!("mount -o remount,bind,ro /run/netns/{} && exec \"$0\" 4 8", netns.0);
        let argv = [
            os("unshare"),
            os("--user"),
            os("--map-root-user"),
            os("--mount"),
            os("--propagation"),
            os("private"),
            os("sh"),
            os("-c"),
            os(remount),
            os(prog("compute")),
        ];
        let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
        job.wait_for_line("START", std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(500));
        check_checkpoint_json(&job.checkpoint(&["--kill"]));
        job.wait_killed();
        let i = inspect(&sb.dir);
        let mark = format!("/run/netns/{} with other flags", netns.0);
        assert!(i.stdout.contains(&mark), "the test missed its mark: no {mark:?} in the job's mount namespace\n{i}");
        if removed {
            assert!(netns.ip("delete"), "ip netns delete {}", netns.0);
        }
        let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
        let status = again.wait();
        assert!(status.success() && has_line(&again.output(), "PASS"), "removed {removed}: {}", again.report());
    }
}

/// Descriptors opened with O_PATH (tests/progs/opath.c: a directory used with openat, a file,
/// a FIFO, a socket file, a symbolic link itself, and a link removed while held, zdtm's
/// symlink01) name the same things after a restart. Before, the checkpoint took them and the
/// restart failed (lseek on an O_PATH descriptor); the removed link was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn o_path_descriptors_name_the_same_places() {
    canonical_scenario(&Case::new("opath", |work: &Path| vec![os(prog("opath")), os(work.join("o")), os(SECONDS)]));
}

/// A FIFO whose name was removed while the job held it (both ends in two processes, bytes in
/// flight) and working directories that were removed (tests/progs/unlinked.c) come back
/// nameless. Before, the FIFO was refused at checkpoint, and the working directory made the
/// restart fail (chdir to a path that is gone).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn unlinked_fifo_and_removed_working_directories() {
    canonical_scenario(&Case::new("unlinked", |work: &Path| vec![os(prog("unlinked")), os(work.join("u")), os(SECONDS)]));
}

/// An executable deleted under the running program (tests/progs/deletedexe.c: a program that
/// runs a copy of itself which deletes its file, as a rebuild or an upgrade does, and a child
/// that runs it too): after each restart, /proc/self/exe names the old path " (deleted)", holds
/// the same bytes and has the same mode, in both processes. The image keeps the contents once.
/// Before, such a process was refused at checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_executable_deleted_under_the_program() {
    canonical_scenario(&Case::new("deletedexe", |work: &Path| vec![os(prog("deletedexe")), os(work), os(SECONDS)]));
}

/// The same, the executable's name taken at once by a new version (deletedexe.c `rebuilt`, as
/// `make` or an upgrade leaves it): the processes come back on a copy of the old bytes in the
/// same directory (without the name, which is taken), and the new version is left as it was.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_executable_rebuilt_under_the_program() {
    canonical_scenario(&Case::new("rebuiltexe", |work: &Path| vec![os(prog("deletedexe")), os(work), os(SECONDS), os("rebuilt")]));
}

/// The same, the program run from a memfd (deletedexe.c `memfd`: fexecve, as runtimes that run
/// a binary from memory do): /proc/self/exe names the memfd again, with the same bytes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_executable_run_from_a_memfd() {
    canonical_scenario(&Case::new("memfdexe", |work: &Path| vec![os(prog("deletedexe")), os(work), os(SECONDS), os("memfd")]));
}

/// A library deleted under the running program (tests/progs/deletedlib.c: loaded, then its file
/// removed, as an upgrade does) comes back with every page, those never read before the
/// checkpoint too. Before, such a mapping was refused at checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_library_deleted_under_the_program() {
    canonical_scenario(&Case::new("deletedlib", |work: &Path| vec![os(prog("deletedlib")), os(work.join("l")), os(SECONDS)]));
}

/// AIO contexts (tests/progs/aio.c: io_setup of 64 and 1000 events, a read submitted and reaped
/// through each at every step, the ring read directly as libaio does) work after a restart at
/// the same ids. Before, the ring came back as plain memory and io_submit failed with EINVAL.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn aio_contexts_keep_working_at_their_ids() {
    canonical_scenario(&Case::new("aio", |work: &Path| vec![os(prog("aio")), os(work.join("a")), os(SECONDS)]));
}

/// The times of the files the job holds (tests/progs/filetimes.c): a file held open, one mapped
/// shared and written, and two deleted (one small, one large with a hole), each given an access
/// time older than its modification time, so that any read would move it. After each restart
/// every one has its times as the job left them. Before, the checkpoint's and the restart's
/// reads moved the mapped file's access time, and the deleted files came back with the
/// restart's times.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn files_keep_their_times() {
    canonical_scenario(&Case::new("filetimes", |work: &Path| vec![os(prog("filetimes")), os(work), os(SECONDS)]));
}

/// Directories removed while open (tests/progs/removeddir.c, zdtm's rmdir_open): each comes
/// back held, removed (no link), with its mode, and shown by its old path where its directory
/// is still there. Before, refused at checkpoint ("a deleted file").
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn directories_removed_while_open() {
    canonical_scenario(&Case::new("removeddir", |work: &Path| vec![os(prog("removeddir")), os(work), os(SECONDS)]));
}

/// Private mappings of objects that others change, across the copy-on-write split
/// (tests/progs/cowsplit.c): a memfd, a /dev/shm file, a deleted file, a file that stays and,
/// as root, MAP_SHARED|MAP_ANONYMOUS memory (through map_files), each also mapped shared, and a
/// memfd's private mapping inherited by a child. After each restart the pages the process
/// wrote must read as its own copies, the others as the object, changed after the split, before
/// the checkpoint and after the restart (as CRIU's memfd02, shmemfd-priv expect). Before, such a
/// mapping came back as anonymous memory: a change of the object after the restart no longer
/// showed in it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn private_mappings_of_changing_objects() {
    canonical_scenario(&Case::new("cowsplit", |work: &Path| vec![os(prog("cowsplit")), os(work), os(SECONDS)]).protect_work());
}

/// Processes in cgroups the job made (tests/progs/cgroups.c, as zdtm's cgroup00-04 and
/// `systemd-run --scope` make them): below the harness's cgroup in cgroup v2 and the v1 pids,
/// cpu and memory hierarchies, a parent with a thread in one cgroup and a child in another
/// below it, each with limits of its own. After each restart each process must be in its
/// cgroups and every limit must read back as set (the program checks at every step). Before,
/// refused at checkpoint ("cgroups of its own"). Then a `--kill` round whose cgroups are all
/// removed before the restart (a restart after a reboot, or on another node): the restart
/// makes them again with their limits. As root, and as the ordinary user in v1 subtrees
/// delegated to them (`CgroupDirs`).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn processes_in_cgroups_the_job_made() {
    let made = CgroupDirs::new("cgroups");
    let dirs = made.dirs.clone();
    let argv = move |_work: &Path| {
        let mut argv = vec![os(prog("cgroups")), os(SECONDS)];
        argv.extend(dirs.iter().map(os));
        argv
    };
    let gone_argv = argv(Path::new("/"));
    canonical_scenario(&Case::new("cgroups", argv));
    // (Its job was pid 2 too.)
    made.remove_below();

    let sb = Sandbox::new("cgroups-gone");
    let mut job = Job::launch(&sb.dir, &gone_argv, &sb.path("launch.out"));
    job.wait_for_line("READY", Duration::from_secs(30));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    made.remove_below();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    restarted.wait();
    let out = restarted.output();
    assert!(
        has_line(&out, "PASS") && fail_lines(&out).is_empty(),
        "the job restarted after its cgroups were removed did not find them as they were\n{}",
        restarted.report()
    );
    drop(made);
}

/// Descriptors that signal their owner when I/O becomes possible (O_ASYNC, F_SETOWN_EX,
/// F_SETSIG; zdtm's file_fown): a pipe's read end owned by its process, another owned by a
/// child (set by its parent), each with a real-time signal of its own. After each restart the
/// kernel names the same owner and signal, and every write still raises one signal, for the
/// right descriptor, in the right process (tests/progs/fown.c). Before, the owners and signals
/// were lost: the restarted processes waited for signals that never came.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn descriptors_signal_their_owners_after_restart() {
    canonical_scenario(&Case::new("fown", |_| vec![os(prog("fown")), os(SECONDS)]));
}
