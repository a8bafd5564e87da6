//! End-to-end tests of Open MPI jobs (Debian's openmpi-bin, installed by scripts/test.sh):
//! `ckpt launch -- mpirun -np 2 mpi_ring`, through the canonical scenario (see
//! `tests::canonical_scenario`): checkpointed, crashed, restarted, checkpointed with `--kill` and
//! restarted again, finishing with the answer of an uninterrupted run. The ranks talk over shared
//! memory only (Open MPI's vader transport) in one test and over TCP only in the other;
//! mpirun holds a pseudo-terminal per rank for its output, its PMIx server's Unix sockets and a
//! TCP listener.

use std::time::Duration;

use tests::*;

/// Seconds the MPI program runs (uninterrupted).
const SECONDS: &str = "6";

/// Open MPI refuses to run as root without being told.
fn as_root_flag() -> Option<std::ffi::OsString> {
    jobs_as_root().then(|| os("--allow-run-as-root"))
}

fn mpirun() -> std::path::PathBuf {
    let p = std::path::Path::new("/usr/bin/mpirun");
    assert!(p.exists(), "Open MPI is not installed: apt-get install openmpi-bin libopenmpi-dev (scripts/test.sh does)");
    p.to_path_buf()
}

/// `own_session_dir`: give Open MPI a session directory in the run's work directory. Two
/// reference runs (outside ckpt) starting at once race to create /tmp/ompi.HOST.UID and one
/// fails, so only one test leaves it at its default (under ckpt: /dev/shm/ckpt-job-*).
fn mpi_case(name: &str, transport: &[&'static str], own_session_dir: bool) -> Case {
    let transport = transport.to_vec();
    let mpirun = mpirun();
    Case::new(name, move |work| {
        let mut argv = vec![os(&mpirun)];
        argv.extend(as_root_flag());
        argv.extend([os("--oversubscribe"), os("-np"), os("2")]);
        argv.extend(transport.iter().map(os));
        if own_session_dir {
            argv.extend([os("--mca"), os("orte_tmpdir_base"), os(work)]);
        }
        argv.extend([os(prog("mpi_ring")), os(SECONDS)]);
        argv
    })
    .timing(Timing::MPI)
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_two_ranks_shared_memory() {
    canonical_scenario(&mpi_case("mpi-shm", &["--mca", "btl", "self,vader"], false));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_two_ranks_tcp() {
    // Open MPI's TCP transport listens from port 1024 up by default, on IPv4 and IPv6: every MPI
    // job of the machine (other tests' included) competes for the same ports, and a restarted
    // job needs its own back. Ranges of its own, apart from the other pass's (root's and the
    // user's run at once: a rehearsal's restart found its IPv6 port, 1027, taken by the other
    // pass's job meanwhile), keep the test from depending on what else runs.
    const ROOT_PASS: [&str; 2] = ["46200", "46300"];
    const USER_PASS: [&str; 2] = ["46400", "46500"];
    let [v4, v6] = if jobs_as_root() { ROOT_PASS } else { USER_PASS };
    let ports = [
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_port_min_v4",
        v4,
        "--mca",
        "btl_tcp_port_range_v4",
        "100",
        "--mca",
        "btl_tcp_port_min_v6",
        v6,
        "--mca",
        "btl_tcp_port_range_v6",
        "100",
    ];
    canonical_scenario(&mpi_case("mpi-tcp", &ports, true));
}

/// Two Open MPI jobs launched at once on one node. Each job has a PID namespace of its own, so
/// both mpiruns have the same pid, and Open MPI gives both the same job id, after which it names
/// its shared-memory segments in /dev/shm: before ckpt gave each job a directory of its own for
/// them, the two jobs opened each other's segments and their ranks died of SIGSEGV (and a
/// segment another user made at that foreseeable name would have been opened). Both run with a
/// session directory of their choosing (which must not keep their segments from being
/// separated), each is checkpointed once while both run, and both finish with the answer of an
/// uninterrupted run.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn two_jobs_at_once_keep_their_shared_memory_apart() {
    let case = mpi_case("mpi-twins", &["--mca", "btl", "self,vader"], true);
    let sb = Sandbox::new("mpi-twins");
    let reference = Reference::start(&case.argv(&sb.mkdir("ref-work")), &sb.path("reference.out"));
    let mut jobs: Vec<(Job, std::path::PathBuf)> = ["a", "b"]
        .iter()
        .map(|twin| {
            let dir = sb.mkdir(&format!("img-{twin}"));
            let argv = case.argv(&sb.mkdir(&format!("work-{twin}")));
            (Job::launch(&dir, &argv, &sb.path(&format!("{twin}.out"))), dir)
        })
        .collect();
    for (job, _) in jobs.iter_mut() {
        job.wait_for_line("START", Duration::from_secs(60));
    }
    for (job, _) in jobs.iter_mut() {
        check_checkpoint_json(&job.checkpoint(&[]));
    }
    for (job, dir) in jobs.iter_mut() {
        let status = job.wait_timeout(Duration::from_secs(120));
        let out = job.output();
        assert!(status.success() && has_line(&out, "PASS"), "the job of {} ended {}\n{}", dir.display(), describe_status(status), job.report());
        assert_eq!(result_line(&out), Some(reference.result()), "the job of {}\n{}", dir.display(), job.report());
    }
}

/// The directory a launched job gets for Open MPI's session and segments (any job gets one: ckpt
/// cannot tell an MPI job from its command) is the job's own while it runs, and is gone once the
/// job has ended: each job left one in /dev/shm before, 536 of them on this machine after a day.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn the_job_directory_is_removed_when_the_job_ends() {
    let sb = Sandbox::new("mpi-job-dir");
    let script = r#"echo "DIRS $OMPI_MCA_orte_tmpdir_base $OMPI_MCA_btl_vader_backing_directory"; test -d "$OMPI_MCA_orte_tmpdir_base" && test -w "$OMPI_MCA_orte_tmpdir_base" && echo PASS"#;
    let mut job = Job::launch(&sb.path("img"), &["/bin/sh", "-c", script], &sb.path("out"));
    let status = job.wait_timeout(Duration::from_secs(60));
    let out = job.output();
    assert!(status.success() && has_line(&out, "PASS"), "the job ended {}\n{}", describe_status(status), job.report());
    let dirs: Vec<&str> = out.lines().find_map(|l| l.strip_prefix("DIRS ")).expect("the job's DIRS line").split(' ').collect();
    assert!(dirs.len() == 2 && dirs[0] == dirs[1] && dirs[0].starts_with("/dev/shm/ckpt-job-"), "the job's directories: {dirs:?}");
    assert!(!std::path::Path::new(dirs[0]).exists(), "{} is left after the job ended", dirs[0]);
}

/// The job's directory holds its shared memory files (Open MPI's segments: 4 MiB a rank), which
/// every checkpoint saves: a job ended by `checkpoint --kill` takes them with it, and the
/// directory where nothing else is left (each job left one, segments and all, before); its
/// restart makes the directory again, puts the files back and removes it when the job ends; a
/// directory someone else made at that name meanwhile refuses the restart (the job's files
/// would go into a directory another user owns) until it is gone. (Open MPI's own restart
/// after a `--kill`, with the files the image does not hold left in the directory, is
/// `mpirun_two_ranks_shared_memory`.)
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn the_job_directory_goes_with_a_killed_job_and_comes_back_with_its_restart() {
    use std::os::unix::fs::MetadataExt;
    let sb = Sandbox::new("mpi-job-dir-kill");
    // As Open MPI does, the job removes its file when it ends well.
    let script = format!(r#"d=$OMPI_MCA_btl_vader_backing_directory; echo "DIR $d"; {} "$d" 6; s=$?; rm -f "$d/data"; exit $s"#, prog("tmpfsmap").display());
    let mut job = Job::launch(&sb.path("img"), &["/bin/sh", "-c", &script], &sb.path("out"));
    job.wait_for_line("START", Duration::from_secs(30));
    let out = job.output();
    let dir = std::path::PathBuf::from(out.lines().find_map(|l| l.strip_prefix("DIR ")).expect("the job's DIR line"));
    assert!(dir.join("data").is_file(), "the job's file is not in {}\n{}", dir.display(), job.report());
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    assert!(!dir.exists(), "{} is left after `checkpoint --kill`", dir.display());

    if is_root() {
        // Someone else's directory at the job's name: refused, naming it, and left alone.
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let mut refused = Job::restart(&sb.path("img"), &sb.path("refused.out"));
        let status = refused.wait_timeout(Duration::from_secs(60));
        let err = refused.errors();
        assert!(!status.success() && err.contains(&*dir.to_string_lossy()), "a restart into another user's directory\n{}", refused.report());
        assert_eq!(std::fs::metadata(&dir).map(|m| m.uid()).ok(), Some(65534), "{} changed", dir.display());
        std::fs::remove_dir(&dir).unwrap();
    }

    let mut again = Job::restart(&sb.path("img"), &sb.path("restart.out"));
    let status = again.wait_timeout(Duration::from_secs(60));
    let out = again.output();
    assert!(status.success() && has_line(&out, "PASS"), "the restarted job ended {}\n{}", describe_status(status), again.report());
    assert!(!dir.exists(), "{} is left after the restarted job ended", dir.display());
}

/// An Open MPI job restarted where its directory under /dev/shm is gone, as on a spare node or
/// after a reboot: its session (mpirun's hwloc topology and contact file, a FIFO) comes back
/// from the image's protected copy of the directory, its shared memory from the memory
/// restore, and the job finishes with the answer of an uninterrupted run. Before, the restart
/// was refused: "hwloc.sm: is gone".
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_restarted_where_its_shm_directory_is_gone() {
    let sb = Sandbox::new("mpi-shm-gone");
    let reference = Reference::start(&mpi_case("mpi-shm-gone", &[], true).argv(&sb.mkdir("ref-work")), &sb.path("reference.out"));
    let argv = mpi_case("mpi-shm-gone", &["--mca", "btl", "self,vader"], false).argv(&sb.mkdir("work"));
    let img = sb.path("img");
    let mut job = Job::launch(&img, &argv, &sb.path("out"));
    job.wait_for_line("START", Duration::from_secs(60));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    let recorded: serde_json::Value = serde_json::from_slice(&std::fs::read(img.join("job.json")).unwrap()).unwrap();
    let dir = std::path::PathBuf::from(recorded["shm_dir"].as_str().expect("job.json names the job's directory"));
    let held: Vec<_> = walk(&dir);
    assert!(held.iter().any(|p| p.ends_with("hwloc.sm")), "Open MPI's session is not in {}: {held:?}", dir.display());
    std::fs::remove_dir_all(&dir).unwrap();
    let mut again = Job::restart(&img, &sb.path("restart.out"));
    let status = again.wait_timeout(Duration::from_secs(120));
    let out = again.output();
    assert!(status.success() && has_line(&out, "PASS"), "the restart ended {}\n{}", describe_status(status), again.report());
    assert_eq!(result_line(&out), Some(reference.result()), "{}", again.report());
    assert!(!dir.exists(), "{} is left after the restarted job ended", dir.display());
}

/// Every path below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// Two "nodes": network namespaces of this machine joined by a veth pair, removed on drop.
struct TwoNodes {
    _alone: std::sync::MutexGuard<'static, ()>,
    names: [String; 2],
    addrs: [String; 2],
    /// What makes this pair's names and subnets its own: several tests of this file run at
    /// once in one process (see [`net_id`]).
    id: u32,
}

/// Held by every test that makes namespaced nodes, for its whole run: one job over several
/// nodes at a time. Open MPI jobs starting at once on namespaced nodes that all share this
/// machine's hostname and /tmp were seen to fail in MPI_Init ("orte_ess_init failed: Not
/// found"), once in a full run with the tests two at a time, never alone.
fn one_multi_node_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// An id for one test's network namespaces, links and subnets, unique among the tests running
/// at once in this process (the pid alone is not: tests run on threads) and unlikely to meet
/// another run's: 4 at a time per process.
fn net_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4;
    (std::process::id() % 10_000) * 4 + seq
}

impl TwoNodes {
    fn new() -> TwoNodes {
        let alone = one_multi_node_job_at_a_time();
        let id = net_id();
        let names = [format!("ckpt{id}a"), format!("ckpt{id}b")];
        // A /24 of its own per test.
        let net = format!("10.{}.{}", 100 + (id >> 8) % 100, id % 256);
        let addrs = [format!("{net}.1"), format!("{net}.2")];
        let veth = [format!("cv{}a", id % 100_000), format!("cv{}b", id % 100_000)];
        let nodes = TwoNodes { _alone: alone, names, addrs, id };
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().expect("run ip (install iproute2)");
            assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        for n in &nodes.names {
            ip(&["netns", "add", n]);
        }
        ip(&["link", "add", &veth[0], "netns", &nodes.names[0], "type", "veth", "peer", "name", &veth[1], "netns", &nodes.names[1]]);
        #[allow(clippy::needless_range_loop)] // three arrays indexed alike
        for i in 0..2 {
            ip(&["-n", &nodes.names[i], "addr", "add", &format!("{}/24", nodes.addrs[i]), "dev", &veth[i]]);
            ip(&["-n", &nodes.names[i], "link", "set", &veth[i], "up"]);
            ip(&["-n", &nodes.names[i], "link", "set", "lo", "up"]);
        }
        // A veth pair is running a moment after it is set up: UCX (MPICH's transport) leaves
        // out an interface that is not yet, and finds no way to the other node.
        for (node, link) in nodes.names.iter().zip(&veth) {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let out = std::process::Command::new("ip").args(["-n", node, "-o", "link", "show", "dev", link]).output().expect("run ip");
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "the link {link} of node {node} is not up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        nodes
    }
}

impl TwoNodes {
    /// Crashes both nodes: SIGKILLs the job's tagged processes (see [`kill_job_processes`]) and
    /// every process left in the nodes' network namespaces. As an ordinary user the part the
    /// coordinator started on node B carries no `CKPT_TEST_TAG`: netns-exec.sh enters the
    /// namespace through sudo, which resets the environment. Left alive, node B's old ranks
    /// keep their listeners, and the restart cannot bind the job's ports again. The TIME-WAIT
    /// ends the crash leaves are left: the restart binds beside them (issue 33).
    fn crash(&self, dir: &std::path::Path) {
        kill_job_processes(dir);
        for n in &self.names {
            kill_netns_processes(n);
        }
    }
}

/// A third "node" for a part to come back on: a namespace with a link of its own to node A, in a
/// subnet of its own, routed to A and A to it (not to B: B is lost when a part comes here).
/// Removed on drop.
struct Spare {
    name: String,
    /// Where the spare's copies of node B's files are ([`Spare::with_copies`]): a tmpfs of
    /// this machine, unmounted on drop, with the node's files for netns-exec.sh beside it.
    copies: Option<std::path::PathBuf>,
}

impl TwoNodes {
    fn spare(&self) -> Spare {
        let id = self.id;
        let spare = Spare { name: format!("ckpt{id}c"), copies: None };
        let net2 = format!("10.{}.{}", 200 + (id >> 8) % 50, id % 256);
        let (a2, c2) = (format!("{net2}.1"), format!("{net2}.2"));
        let veth = [format!("cw{}a", id % 100_000), format!("cw{}c", id % 100_000)];
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().expect("run ip");
            assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        ip(&["netns", "add", &spare.name]);
        ip(&["link", "add", &veth[0], "netns", &self.names[0], "type", "veth", "peer", "name", &veth[1], "netns", &spare.name]);
        ip(&["-n", &self.names[0], "addr", "add", &format!("{a2}/24"), "dev", &veth[0]]);
        ip(&["-n", &spare.name, "addr", "add", &format!("{c2}/24"), "dev", &veth[1]]);
        ip(&["-n", &self.names[0], "link", "set", &veth[0], "up"]);
        ip(&["-n", &spare.name, "link", "set", &veth[1], "up"]);
        ip(&["-n", &spare.name, "link", "set", "lo", "up"]);
        ip(&["-n", &spare.name, "route", "add", "default", "via", &a2]);
        spare
    }
}

/// Where netns-exec.sh finds what makes the node `ns` differ from this machine.
fn node_files(ns: &str) -> std::path::PathBuf {
    std::path::Path::new("/run/ckpt-test").join(ns)
}

impl Spare {
    /// The spare becomes a machine with a root file system of its own, as far as `files` go: a
    /// copy of each (the same bytes and mode, another file: another device and inode) on a
    /// tmpfs mounted at `root` is bound over it for every command netns-exec.sh runs on the
    /// spare, which also get `env` (e.g. the other boot id a real other machine has). Returns
    /// each file with its copy.
    fn with_copies(&mut self, root: &std::path::Path, files: &[std::path::PathBuf], env: &[(&str, &str)]) -> Vec<(std::path::PathBuf, std::path::PathBuf)> {
        std::fs::create_dir_all(root).unwrap();
        let out = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "mode=0755", "ckpt-spare-root"]).arg(root).output().expect("run mount");
        assert!(out.status.success(), "mount a tmpfs at {}: {}", root.display(), String::from_utf8_lossy(&out.stderr));
        self.copies = Some(root.to_path_buf());
        let mut pairs = Vec::new();
        for f in files {
            let copy = root.join(f.strip_prefix("/").unwrap());
            std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
            // (std::fs::copy keeps the permission bits, as `cp --preserve=mode`.)
            std::fs::copy(f, &copy).unwrap_or_else(|e| panic!("copy {} to {}: {e}", f.display(), copy.display()));
            pairs.push((f.clone(), copy));
        }
        let dir = node_files(&self.name);
        std::fs::create_dir_all(&dir).unwrap();
        let binds: String = pairs.iter().map(|(f, copy)| format!("{} {}\n", copy.display(), f.display())).collect();
        std::fs::write(dir.join("binds"), binds).unwrap();
        let env: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        std::fs::write(dir.join("env"), env).unwrap();
        pairs
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        kill_netns_processes(&self.name);
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
        if let Some(root) = &self.copies {
            let _ = std::fs::remove_dir_all(node_files(&self.name));
            // Lazily: a mount namespace of the spare may outlive its last process by a moment.
            let _ = std::process::Command::new("umount").arg("--lazy").arg(root).status();
        }
    }
}

impl TwoNodes {
    /// Node `i` is lost: its network links go down, then every process in it is killed.
    fn pull_the_plug(&self, i: usize) {
        let out = std::process::Command::new("ip").args(["-n", &self.names[i], "-o", "link", "show"]).output().expect("run ip");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "2: cv123b@if3: <...>": the name before the '@' or ':'.
            let Some(name) = line.split(": ").nth(1).and_then(|n| n.split('@').next()) else { continue };
            if name != "lo" {
                let _ = std::process::Command::new("ip").args(["-n", &self.names[i], "link", "set", name, "down"]).status();
            }
        }
        kill_netns_processes(&self.names[i]);
    }
}

/// The regular files the job's part on `node` only reads in the last generation of `dir`
/// (`ckpt inspect --json`): its processes' executables and the files they hold or map without
/// writing, outside the sandbox `sb` (its output and checkpoint directories) and /dev, /proc,
/// /sys, /run.
fn files_only_read(dir: &std::path::Path, node: &str, sb: &Sandbox) -> Vec<std::path::PathBuf> {
    let out = ckpt(&[os("inspect"), os(dir), os("--json")]);
    assert!(out.success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("inspect --json: {e}: {out}"));
    let part = v["nodes"].as_array().unwrap().iter().find(|n| n["node"] == node).unwrap_or_else(|| panic!("no node {node} in {out}"));
    let exes = part["processes"].as_array().unwrap().iter().filter_map(|p| p["exe"].as_str());
    let read_only = part["files"]["watched"].as_array().unwrap().iter().filter(|w| w["writable"] == false).filter_map(|w| w["path"].as_str());
    let sandbox = sb.path("");
    let mut files: Vec<std::path::PathBuf> = exes
        .chain(read_only)
        .map(std::path::PathBuf::from)
        .filter(|p| !p.starts_with(&sandbox) && !["/dev", "/proc", "/sys", "/run"].iter().any(|d| p.starts_with(d)))
        .filter(|p| p.metadata().is_ok_and(|m| m.is_file()))
        .collect();
    files.sort();
    files.dedup();
    // At least the program, Open MPI's daemon, its libraries and the C library.
    for want in ["mpi_ring", "orted", "libmpi.so", "libopen-pal.so", "libc.so"] {
        assert!(
            files.iter().any(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with(want))),
            "node {node}'s part reads no {want}: {files:?}\n{out}"
        );
    }
    files
}

/// Whether a process in the network namespace `ns` runs the executable `exe` (the very file:
/// device and inode).
fn netns_runs(ns: &str, exe: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = exe.metadata() else { return false };
    let Ok(out) = std::process::Command::new("ip").args(["netns", "pids", ns]).output() else { return false };
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .any(|pid| std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|m| (m.dev(), m.ino()) == (want.dev(), want.ino())))
}

/// SIGKILLs every process in the network namespace `name` (`ip netns pids`), until none is left.
fn kill_netns_processes(name: &str) {
    for _ in 0..20 {
        let Ok(out) = std::process::Command::new("ip").args(["netns", "pids", name]).output() else { return };
        let pids: Vec<i32> = String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) with a pid just listed; at worst the process is already gone.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for n in &self.names {
            // Nothing of the test outlives its namespaces (a process would keep one alive).
            kill_netns_processes(n);
            let _ = std::process::Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// mpirun on node A starts its daemon on node B through `ckpt agent-rsh`, which asks the
/// coordinator to start an agent there: the job spans two agents joined to one coordinator,
/// ranks talking over TCP between the nodes. Checkpointed, crashed (every agent and the
/// coordinator killed), restarted on both nodes under a new coordinator, checkpointed with
/// `--kill`, restarted again: the answer is the uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_across_two_namespaced_nodes() {
    across_two_namespaced_nodes("mpi-2nodes", &[], Level::Shared, BAfterCrash::Home);
}

/// MPICH's mpiexec (Hydra) on node A starts its proxy on node B through the remote shell users
/// install from plugins/ (`HYDRA_LAUNCHER_EXEC=plugins/bin/ckpt-agent-rsh`), ranks talking over
/// UCX's TCP transport between the nodes; the same rounds as
/// `mpirun_across_two_namespaced_nodes`, and the same uninterrupted answer.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpiexec_mpich_across_two_namespaced_nodes() {
    across_two_namespaced_nodes_with(Library::Mpich, "mpich-2nodes", &[], Level::Shared, BAfterCrash::Home);
}

/// The same without TCP repair mode (`CKPT_TCP_RECONNECT=1`, what an ordinary user gets): the
/// connections between the nodes are drained in rounds at each checkpoint and made again by
/// connecting at each restart (ckpt-core/src/objects/tcp_reconnect.rs).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_across_two_namespaced_nodes_without_repair_mode() {
    across_two_namespaced_nodes("mpi-2nodes-reconnect", &[("CKPT_TCP_RECONNECT", "1")], Level::Shared, BAfterCrash::Home);
}

/// `extra_env`: for the coordinator and every agent.
/// The same two-node job, each node keeping its parts on its own storage
/// (`ckpt coordinator --local-dir`) and a copy of the other's (`--redundancy partner`): the
/// shared directory holds only the manifests and the nodes' records, each node's directory its
/// part and the other's, byte for byte. After the crash node B's directory is deleted (its disk
/// is lost): its restart fetches its part from node A's copy, and the answer is still the
/// uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_across_two_namespaced_nodes_with_node_local_parts() {
    across_two_namespaced_nodes("mpi-2nodes-local", &[], Level::NodeLocalWithPartner, BAfterCrash::Home);
}

/// Node B is lost with its disk: its part comes back on a spare node, another host with another
/// address, from node A's copy; the connections between the nodes are made again there (as
/// root, captured in repair mode and rebuilt by connecting, none of their bytes twice), and the
/// answer is the uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_node_b_lost_comes_back_on_a_spare_from_its_partner_copy() {
    across_two_namespaced_nodes("mpi-2nodes-spare", &[], Level::NodeLocalWithPartner, BAfterCrash::OnSpare);
}

/// Node B is lost with its disk and its part comes back on a spare that is another machine in
/// its files too: the executables, libraries and other files node B's part only reads are, on
/// the spare, copies (the same bytes, other files: a tmpfs bound over their paths in the
/// spare's own mount namespace) and the spare has another boot id (`CKPT_TEST_BOOT_ID`), as a
/// machine with its own root file system has. The spare's restart judges those files by their
/// contents and takes them, its part runs from the copies, and the answer is the uninterrupted
/// run's. (Without the other boot id the restart refuses the copies: on the checkpoint's boot
/// another inode is another file.)
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_node_b_lost_comes_back_on_a_spare_with_copies_of_its_files() {
    across_two_namespaced_nodes("mpi-2nodes-spare-copies", &[], Level::NodeLocalWithPartner, BAfterCrash::OnSpareWithCopies);
}

/// Every node keeps its parts on its own storage, and each generation is also copied to the
/// shared directory in the background (`--flush-every 1`). After the crash every node's storage
/// is lost: the job comes back from the global level with the uninterrupted answer.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_every_node_disk_lost_comes_back_from_the_global_level() {
    across_two_namespaced_nodes("mpi-2nodes-global", &[], Level::NodeLocalFlushed, BAfterCrash::Home);
}

/// XOR parity (`--redundancy xor:2`): node B is lost with its disk; its part is rebuilt on a
/// spare from node A's part and parity piece, and the answer is the uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_node_b_lost_rebuilt_from_xor_parity_on_a_spare() {
    across_two_namespaced_nodes("mpi-2nodes-xor", &[], Level::NodeLocalXor, BAfterCrash::OnSpare);
}

/// A whole job restarted on another set of hosts with one command where the coordinator runs
/// (`ckpt coordinator --restart-on A,C`): node B's part on the spare, and the answer is the
/// uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_restarted_on_another_set_of_hosts_with_restart_on() {
    across_two_namespaced_nodes("mpi-2nodes-restart-on", &[], Level::Shared, BAfterCrash::RestartOn);
}

/// Where the nodes keep their parts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    /// In the shared checkpoint directory.
    Shared,
    /// In `SANDBOX/local/{node}` (`--local-dir`), each also kept by the other node
    /// (`--redundancy partner`).
    NodeLocalWithPartner,
    /// In `SANDBOX/local/{node}`, every generation also copied by the nodes into the shared
    /// directory in the background (`--flush-every 1`): the global level.
    NodeLocalFlushed,
    /// In `SANDBOX/local/{node}`, with XOR parity in groups of two (`--redundancy xor:2`).
    NodeLocalXor,
}

/// Where node B's part comes back after the crash.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BAfterCrash {
    /// On node B.
    Home,
    /// On a spare node with another address (node B is lost).
    OnSpare,
    /// On a spare node with another address, whose copies of the files node B's part only
    /// reads are other files with the same bytes, and another boot id ([`Spare::with_copies`]).
    /// Its restarts are started through netns-exec.sh, which gives them its mounts.
    OnSpareWithCopies,
    /// Both parts, node B's on the spare, started by the coordinator itself (`--restart-on`).
    RestartOn,
}

fn across_two_namespaced_nodes(name: &str, extra_env: &[(&str, &str)], level: Level, b_after: BAfterCrash) {
    across_two_namespaced_nodes_with(Library::OpenMpi, name, extra_env, level, b_after);
}

/// The MPI library a multi-node test runs the ring with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Library {
    /// `mpirun`, its daemons started through `ckpt agent-rsh` (OMPI_MCA_plm_rsh_agent).
    OpenMpi,
    /// MPICH's `mpiexec.mpich` (Hydra), its proxies started through the installable remote
    /// shell plugins/bin/ckpt-agent-rsh (HYDRA_LAUNCHER_EXEC).
    Mpich,
}

impl Library {
    /// The ring, one rank on each of `hosts`.
    fn ring_argv(self, hosts: &[String], work: &std::path::Path, seconds: &str) -> Vec<std::ffi::OsString> {
        match self {
            Library::OpenMpi => ring_argv_on(hosts, work, seconds),
            Library::Mpich => {
                build_progs();
                let mut a = vec![os("/usr/bin/mpiexec.mpich"), os("-hosts"), os(hosts.join(",")), os("-n"), os(hosts.len().to_string())];
                // UCX over TCP between the nodes, in the reference run (outside ckpt) as under
                // ckpt; and MPICH 4.0.2's hang in MPI_Finalize worked around (tests/mpich.rs).
                for (k, v) in [("UCX_TLS", os("tcp,self")), ("LD_PRELOAD", os(progs_dir().join("bin/libmpich_finalize_progress.so")))] {
                    a.extend([os("-genv"), os(k), v]);
                }
                a.extend([os(prog("mpi_ring_mpich")), os(seconds)]);
                a
            }
        }
    }

    /// The RESULT of the ring over the two nodes run without ckpt (the library's remote shell
    /// going straight into the other namespace).
    fn reference(self, nodes: &TwoNodes, sb: &Sandbox, seconds: &str) -> String {
        match self {
            Library::OpenMpi => ring_reference(nodes, sb, seconds),
            Library::Mpich => remembered_ring_reference("mpich", nodes.addrs.len(), seconds, || {
                let ref_work = sb.mkdir("ref");
                let mut ref_argv = vec![os("ip"), os("netns"), os("exec"), os(&nodes.names[0])];
                ref_argv.extend(user_prefix());
                let mut job_argv = self.ring_argv(&nodes.addrs, &ref_work, seconds);
                job_argv.splice(1..1, [os("-launcher"), os("rsh"), os("-launcher-exec"), os(progs_dir().join("netns-exec.sh"))]);
                ref_argv.extend(job_argv);
                let reference = reference_run_as_harness(&ref_argv, &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
                result_line(&reference).expect("the reference run printed a RESULT")
            }),
        }
    }
}

fn across_two_namespaced_nodes_with(library: Library, name: &str, extra_env: &[(&str, &str)], level: Level, b_after: BAfterCrash) {
    let sb = Sandbox::new(name);
    let nodes = TwoNodes::new();
    let mut spare = (b_after != BAfterCrash::Home).then(|| nodes.spare());
    // The namespace node B's part runs in after the crash.
    let b_after_ns = spare.as_ref().map_or(nodes.names[1].clone(), |s| s.name.clone());
    let local_template = (level != Level::Shared).then(|| {
        sb.mkdir("local");
        sb.path("local/{node}").display().to_string()
    });
    let rsh = progs_dir().join("netns-exec.sh");
    let argv = |work: &std::path::Path| library.ring_argv(&nodes.addrs, work, SECONDS);
    let want = library.reference(&nodes, &sb, SECONDS);

    let ckpt_exe = ckpt_bin();
    let agent_rsh = format!("{} agent-rsh", ckpt_exe.display());
    let hydra_rsh = plugin("bin/ckpt-agent-rsh").display().to_string();
    let mut env = match library {
        Library::OpenMpi => vec![("OMPI_MCA_plm_rsh_agent", agent_rsh.as_str())],
        // Hydra's ssh launcher passes `-x HOST COMMAND`: agent-rsh skips ssh's options.
        Library::Mpich => vec![("HYDRA_LAUNCHER", "ssh"), ("HYDRA_LAUNCHER_EXEC", hydra_rsh.as_str())],
    };
    env.extend_from_slice(extra_env);
    let rsh_template = format!("{} {{host}}", rsh.display());
    let coordinator_with = |name: &str, extra: &[std::ffi::OsString]| -> (Job, String) {
        let addr_file = sb.dir.join("coordinator.addr");
        let _ = std::fs::remove_file(&addr_file);
        let mut args = vec![os("coordinator"), os("--listen"), os(format!("{}:0", nodes.addrs[0])), os("--dir"), os(&sb.dir), os("--rsh"), os(&rsh_template)];
        args.extend_from_slice(extra);
        if let Some(t) = &local_template {
            args.extend([os("--local-dir"), os(t)]);
        }
        match level {
            Level::NodeLocalWithPartner => args.extend([os("--redundancy"), os("partner")]),
            Level::NodeLocalFlushed => args.extend([os("--flush-every"), os("1")]),
            Level::NodeLocalXor => args.extend([os("--redundancy"), os("xor:2")]),
            Level::Shared => {}
        }
        // Its log says what it waits for, should a test find it hung.
        let mut coord_env = vec![("CKPT_LOG", "info")];
        coord_env.extend_from_slice(extra_env);
        let mut job = Job::start_in(Some(&nodes.names[0]), &sb.dir, &sub_tag(&sb.dir, name), &args, &coord_env, &sb.path(&format!("{name}.out")));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let addr = read_text(&addr_file).trim().to_string();
            if !addr.is_empty() {
                return (job, addr);
            }
            assert!(job.try_wait().is_none() && std::time::Instant::now() < deadline, "the coordinator wrote no address\n{}", job.report());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let coordinator = |name: &str| coordinator_with(name, &[]);
    let agent = |i: usize, verb: &str, addr: &str, out: &str, extra: Vec<std::ffi::OsString>| -> Job {
        let node = if i == 0 { "a".to_string() } else { nodes.addrs[1].clone() };
        let mut args = vec![os(verb), os("--coord"), os(addr), os("--node"), os(&node), os("--dir"), os(&sb.dir), os("--pool"), os("256M")];
        args.extend(extra);
        let ns = if i == 1 && verb == "restart" { &b_after_ns } else { &nodes.names[i] };
        if ns == &b_after_ns && b_after == BAfterCrash::OnSpareWithCopies {
            return Job::start_through(&rsh, ns, &sb.dir, &sub_tag(&sb.dir, out), &args, &env, &sb.path(out));
        }
        Job::start_in(Some(ns), &sb.dir, &sub_tag(&sb.dir, out), &args, &env, &sb.path(out))
    };

    // Launch on node A (node B's agent is started by the coordinator for mpirun), checkpoint,
    // run on, crash everything.
    let (coord1, addr) = coordinator("coord1");
    let run_work = sb.mkdir("run");
    let mut launch_args = vec![os("--")];
    launch_args.extend(argv(&run_work));
    let mut launch = agent(0, "launch", &addr, "launch.out", launch_args);
    // (Node B's agent is the coordinator's child: what it says is in the coordinator's output.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !has_line(&launch.output(), "START") {
        assert!(launch.try_wait().is_none() && std::time::Instant::now() < deadline, "the job did not start\n{}\n{}", launch.report(), coord1.report());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let g1 = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    let i = inspect(&sb.dir);
    assert!(i.success() && i.stdout.contains(&nodes.addrs[1]), "generation {g1} should hold both nodes: {i}");
    if level == Level::NodeLocalFlushed {
        // The nodes copy their parts to the shared directory after the commit: the manifest
        // says so when both have.
        let gen = sb.dir.join(format!("gen-{g1:06}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !read_text(&gen.join("MANIFEST")).contains("\"global\": true") {
            assert!(std::time::Instant::now() < deadline, "generation {g1} did not reach the global level\n{}", read_text(&sb.path("coord1.out.err")));
            std::thread::sleep(Duration::from_millis(100));
        }
        for node in ["a", nodes.addrs[1].as_str()] {
            let chunks = std::fs::read_dir(gen.join(node).join("chunks")).map(|d| d.count()).unwrap_or(0);
            assert!(chunks > 0, "node {node}: no chunk files in the shared directory after the flush");
        }
    }
    if let (Some(t), Level::NodeLocalXor) = (&local_template, level) {
        let gen = format!("gen-{g1:06}");
        for node in ["a", nodes.addrs[1].as_str()] {
            let parity = std::path::PathBuf::from(t.replace("{node}", node)).join(&gen).join("parity.xor");
            assert!(parity.metadata().map(|m| m.len()).unwrap_or(0) > 0, "node {node} keeps no parity piece: {}", parity.display());
        }
        let manifest = read_text(&sb.dir.join(&gen).join("MANIFEST"));
        assert!(manifest.contains("\"xor\""), "the manifest does not record the XOR groups:\n{manifest}");
    }
    if let (Some(t), Level::NodeLocalWithPartner) = (&local_template, level) {
        let gen = format!("gen-{g1:06}");
        for node in ["a", nodes.addrs[1].as_str()] {
            let shared = sb.dir.join(&gen).join(node);
            assert!(
                shared.join("procs.bin").is_file() && !shared.join("chunks").exists(),
                "node {node}: the shared directory should hold its records only: {}",
                shared.display()
            );
            let local = std::path::PathBuf::from(t.replace("{node}", node)).join(&gen).join(node).join("chunks");
            let chunks = std::fs::read_dir(&local).map(|d| d.count()).unwrap_or(0);
            assert!(chunks > 0, "node {node}: no chunk files in its local directory {}", local.display());
        }
        // Each node's part is in the other node's directory too, the same bytes.
        let nodes_ab = ["a", nodes.addrs[1].as_str()];
        for (owner, holder) in [(nodes_ab[0], nodes_ab[1]), (nodes_ab[1], nodes_ab[0])] {
            let own = std::path::PathBuf::from(t.replace("{node}", owner)).join(&gen).join(owner);
            let copy = std::path::PathBuf::from(t.replace("{node}", holder)).join(&gen).join(owner);
            let files = tree_files(&own);
            assert!(!files.is_empty(), "node {owner}'s part is empty: {}", own.display());
            for f in files {
                let (a, b) = (std::fs::read(own.join(&f)).unwrap(), std::fs::read(copy.join(&f)).unwrap_or_default());
                assert!(a == b, "node {holder}'s copy of node {owner}'s {} differs or is missing ({} vs {} bytes)", f.display(), a.len(), b.len());
            }
        }
        let manifest = read_text(&sb.dir.join(&gen).join("MANIFEST"));
        assert!(manifest.contains("\"copies\""), "the manifest does not say where the copies are:\n{manifest}");
    }
    if matches!(level, Level::NodeLocalWithPartner | Level::NodeLocalXor) {
        // A second generation, incremental (it refers to the first for what the ranks did not
        // write since): a node lost now comes back only if its parts of both are fetched or
        // rebuilt.
        std::thread::sleep(Duration::from_millis(300));
        let g2 = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
        let manifest = read_text(&sb.dir.join(format!("gen-{g2:06}")).join("MANIFEST"));
        assert!(manifest.contains("\"needs\""), "generation {g2} should refer to generation {g1}:\n{manifest}");
    } else {
        std::thread::sleep(Duration::from_millis(700));
    }
    assert!(launch.try_wait().is_none(), "the job ended before the crash\n{}", launch.report());
    // The spare's copies of what node B's part only reads, as the last generation records it.
    let copies = match (b_after, spare.as_mut()) {
        (BAfterCrash::OnSpareWithCopies, Some(spare)) => {
            let files = files_only_read(&sb.dir, &nodes.addrs[1], &sb);
            let env = [("CKPT_TEST_BOOT_ID", "00000000-0000-4000-8000-00000000c0b1"), ("CKPT_LOG", "info")];
            spare.with_copies(&sb.path("spare-root"), &files, &env)
        }
        _ => Vec::new(),
    };
    nodes.crash(&sb.dir);
    match (&local_template, level) {
        (Some(t), Level::NodeLocalWithPartner | Level::NodeLocalXor) => {
            // Node B's disk is lost with it: its part comes back from node A's copy or parity.
            let lost = std::path::PathBuf::from(t.replace("{node}", &nodes.addrs[1]));
            std::fs::remove_dir_all(&lost).unwrap();
        }
        // Every node's disk is lost: the parts come back from the global level.
        (Some(_), Level::NodeLocalFlushed) => std::fs::remove_dir_all(sb.path("local")).unwrap(),
        _ => {}
    }

    // Restart both nodes under a new coordinator; checkpoint --kill.
    if b_after == BAfterCrash::RestartOn {
        // One command where the coordinator runs starts every part on its new host; the parts'
        // output comes to the coordinator's, and it ends when the job has.
        let hosts = os(format!("{},{}", nodes.names[0], b_after_ns));
        let (mut coord2, _) = coordinator_with("coord2", &[os("--restart-on"), hosts]);
        let status = coord2.wait_timeout(Duration::from_secs(300));
        assert!(status.success(), "{}", coord2.report());
        // Rank 0 writes where its standard output was restored: the restart's (the
        // coordinator's) or, kept from the launch, the launch's file (the launch was crashed
        // before the job printed its RESULT).
        let printed = coord2.output() + &read_text(&sb.path("launch.out"));
        assert_eq!(result_line(&printed).as_deref(), Some(want.as_str()), "RESULT differs from the uninterrupted run's\n{}", coord2.report());
        assert!(has_line(&printed, "PASS"), "{}", coord2.report());
        assert!(coord2.errors().contains("restarts on another host"), "node B did not see it restarts elsewhere\n{}", coord2.report());
        kill_job_processes(&sb.dir);
        return;
    } else {
        let (mut coord2, addr) = coordinator("coord2");
        let mut first_a = agent(0, "restart", &addr, "restart1a.out", vec![]);
        let mut first_b = agent(1, "restart", &addr, "restart1b.out", vec![]);
        std::thread::sleep(Duration::from_millis(1500));
        if !copies.is_empty() {
            // Node B's part runs on the spare from the copies: its processes' executables are them.
            let spare = &b_after_ns;
            let ring = std::fs::canonicalize(prog("mpi_ring")).unwrap();
            for exe in [ring.as_path(), std::path::Path::new("orted")] {
                let copy = copies
                    .iter()
                    .find(|(f, _)| f == exe || f.file_name() == Some(exe.as_os_str()))
                    .map(|(_, c)| c)
                    .unwrap_or_else(|| panic!("no copy of {} among {copies:?}", exe.display()));
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while !netns_runs(spare, copy) {
                    assert!(
                        std::time::Instant::now() < deadline && first_b.try_wait().is_none(),
                        "no process on the spare runs {}\n{}",
                        copy.display(),
                        first_b.report()
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            // It took them by their contents, as a restart on another machine must.
            assert!(
                first_b.errors().contains("another boot than the checkpoint's"),
                "the spare's restart did not judge the files by their contents\n{}",
                first_b.report()
            );
        }
        let g2 = check_checkpoint_json(&checkpoint(&sb.dir, &["--kill"]));
        assert!(g2 > g1, "generation {g2} after {g1}");
        first_a.wait_killed();
        first_b.wait_killed();
        assert_not_rerun(&first_a);
        // Restarted seconds after the crash, node A's part found the old job's ends on its ports
        // and bound beside them (see mpirun_recovers_by_itself_when_node_b_is_lost).
        assert_no_restart_waited_for_old_connections(&(first_a.errors() + &first_b.errors()));
        if matches!(level, Level::NodeLocalWithPartner | Level::NodeLocalXor) {
            assert!(first_b.errors().contains("fetched node"), "node B did not say it fetched its part from its partner\n{}", first_b.report());
        }
        if spare.is_some() {
            assert!(first_b.errors().contains("restarts on another host"), "node B did not see it restarts elsewhere\n{}", first_b.report());
            // Root rebuilds the connections between nodes by repair mode at the new addresses; an
            // ordinary user makes them again by connecting.
            let repair = jobs_as_root() && !extra_env.iter().any(|(k, _)| *k == "CKPT_TCP_RECONNECT");
            let how = if repair { "rebuilt by TCP repair mode with their new addresses" } else { "made again by connecting" };
            assert!(first_a.errors().contains(how), "node A did not say its connections to node B are {how}\n{}", first_a.report());
        }
        // Every agent gone, the coordinator ends (an agent that vanished without closing its
        // connection is noticed after 3 s of silence).
        assert!(coord2.wait_timeout(Duration::from_secs(30)).success(), "{}", coord2.report());
    }
    let v = verify(&sb.dir);
    assert!(v.success(), "ckpt verify failed on a healthy two-node image: {v}");

    // And again, to the end.
    let (_coord3, addr) = coordinator("coord3");
    let mut second_a = agent(0, "restart", &addr, "restart2a.out", vec![]);
    let mut second_b = agent(1, "restart", &addr, "restart2b.out", vec![]);
    let status = second_a.wait();
    assert!(status.success(), "node A's restarted job failed\n{}\n{}", second_a.report(), second_b.report());
    second_b.wait();
    assert_eq!(result_line(&second_a.output()).as_deref(), Some(want.as_str()), "RESULT differs from the uninterrupted run's\n{}", second_a.report());
    assert!(has_line(&second_a.output(), "PASS"), "{}", second_a.report());
    assert_not_rerun(&second_a);
    kill_job_processes(&sb.dir);
}

/// Without TCP repair mode, node B's part comes back on another host (a third namespace with
/// another address, routed to node A): the connections between the nodes are found again through
/// the coordinator (each node says where its server ends listen now), and the answer is the
/// uninterrupted run's.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_across_two_nodes_one_restarted_elsewhere_without_repair_mode() {
    let sb = Sandbox::new("mpi-2nodes-moved");
    let nodes = TwoNodes::new();
    let spare = nodes.spare();
    let c_name = spare.name.clone();
    let rsh = progs_dir().join("netns-exec.sh");
    let run_work = sb.mkdir("run");
    let argv = ring_argv(&nodes, &run_work, SECONDS);
    let want = ring_reference(&nodes, &sb, SECONDS);

    let force = [("CKPT_TCP_RECONNECT", "1")];
    let agent_rsh = format!("{} agent-rsh", ckpt_bin().display());
    let env = [("OMPI_MCA_plm_rsh_agent", agent_rsh.as_str()), force[0]];
    let rsh_template = format!("{} {{host}}", rsh.display());
    let coordinator = |name: &str| -> (Job, String) {
        let addr_file = sb.dir.join("coordinator.addr");
        let _ = std::fs::remove_file(&addr_file);
        // Listening on every address of node A: node C reaches it through its own link.
        let args = [os("coordinator"), os("--listen"), os("0.0.0.0:0"), os("--dir"), os(&sb.dir), os("--rsh"), os(&rsh_template)];
        let mut job = Job::start_in(Some(&nodes.names[0]), &sb.dir, &sub_tag(&sb.dir, name), &args, &force, &sb.path(&format!("{name}.out")));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let addr = read_text(&addr_file).trim().to_string();
            if !addr.is_empty() {
                // The coordinator writes the address it bound (the wildcard): A's address then.
                return (job, addr.replace("0.0.0.0", &nodes.addrs[0]));
            }
            assert!(job.try_wait().is_none() && std::time::Instant::now() < deadline, "the coordinator wrote no address\n{}", job.report());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let agent = |ns: &str, node: &str, verb: &str, addr: &str, out: &str, extra: Vec<std::ffi::OsString>| -> Job {
        let mut args = vec![os(verb), os("--coord"), os(addr), os("--node"), os(node), os("--dir"), os(&sb.dir), os("--pool"), os("256M")];
        args.extend(extra);
        Job::start_in(Some(ns), &sb.dir, &sub_tag(&sb.dir, out), &args, &env, &sb.path(out))
    };

    let (coord1, addr) = coordinator("coord1");
    let mut launch_args = vec![os("--")];
    launch_args.extend(argv.clone());
    let mut launch = agent(&nodes.names[0], "a", "launch", &addr, "launch.out", launch_args);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !has_line(&launch.output(), "START") {
        assert!(launch.try_wait().is_none() && std::time::Instant::now() < deadline, "the job did not start\n{}\n{}", launch.report(), coord1.report());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    check_checkpoint_json(&checkpoint(&sb.dir, &["--kill"]));
    launch.wait_killed();
    nodes.crash(&sb.dir);

    // Node A restarts where it was; node B's part (named by its old address) on node C.
    let (_coord2, addr) = coordinator("coord2");
    let mut a = agent(&nodes.names[0], "a", "restart", &addr, "restart-a.out", vec![]);
    let mut b = agent(&c_name, &nodes.addrs[1], "restart", &addr, "restart-b-on-c.out", vec![]);
    let status = a.wait();
    assert!(status.success(), "node A's restarted job failed\n{}\n{}", a.report(), b.report());
    b.wait();
    assert_eq!(result_line(&a.output()).as_deref(), Some(want.as_str()), "RESULT differs from the uninterrupted run's\n{}\n{}", a.report(), b.report());
    assert!(has_line(&a.output(), "PASS"), "{}", a.report());
    kill_job_processes(&sb.dir);
}

/// Without TCP repair mode, checkpoints of a job over two nodes that then runs on: the bytes the
/// drain takes out of the connections between the nodes are written back by their senders, so
/// the job that goes on loses and repeats nothing (its answer is the uninterrupted run's).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_across_two_nodes_checkpointed_while_running_without_repair_mode() {
    let sb = Sandbox::new("mpi-2nodes-live");
    let nodes = TwoNodes::new();
    let rsh = progs_dir().join("netns-exec.sh");
    let argv = |work: &std::path::Path| ring_argv_on(&nodes.addrs, work, SECONDS);
    let ref_work = sb.mkdir("ref");
    let mut ref_argv = vec![os("ip"), os("netns"), os("exec"), os(&nodes.names[0])];
    ref_argv.extend(user_prefix());
    let mut job_argv = argv(&ref_work);
    job_argv.splice(1..1, [os("--mca"), os("plm_rsh_agent"), os(&rsh)]);
    ref_argv.extend(job_argv);
    let reference = reference_run_as_harness(&ref_argv, &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    let want = result_line(&reference).expect("the reference run printed a RESULT");

    let force = [("CKPT_TCP_RECONNECT", "1")];
    let agent_rsh = format!("{} agent-rsh", ckpt_bin().display());
    let env = [("OMPI_MCA_plm_rsh_agent", agent_rsh.as_str()), force[0]];
    let coord_args = [
        os("coordinator"),
        os("--listen"),
        os(format!("{}:0", nodes.addrs[0])),
        os("--dir"),
        os(&sb.dir),
        os("--rsh"),
        os(format!("{} {{host}}", rsh.display())),
    ];
    let (coord, addr) = start_coordinator(&nodes.names[0], &sb, &coord_args, &force, "coord");
    let run_work = sb.mkdir("run");
    let mut args = vec![os("launch"), os("--coord"), os(&addr), os("--node"), os("a"), os("--dir"), os(&sb.dir), os("--pool"), os("256M"), os("--")];
    args.extend(argv(&run_work));
    let mut launch = Job::start_in(Some(&nodes.names[0]), &sb.dir, &sub_tag(&sb.dir, "launch.out"), &args, &env, &sb.path("launch.out"));
    wait_for_start(&mut launch, &coord);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(600));
        check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    }
    let status = launch.wait();
    assert!(status.success(), "the job failed after its checkpoints\n{}\n{}", launch.report(), coord.report());
    assert_eq!(result_line(&launch.output()).as_deref(), Some(want.as_str()), "RESULT differs from the uninterrupted run's\n{}", launch.report());
    assert!(has_line(&launch.output(), "PASS"), "{}", launch.report());
    kill_job_processes(&sb.dir);
}

/// Every file under `dir`, as paths relative to it.
fn tree_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

/// Automatic recovery (`ckpt coordinator --recover`): node B is lost with its disk while the job
/// runs; without any command, the coordinator restarts the job from the last generation, node
/// B's part on a spare from node A's copy and node A's in the user's own `ckpt launch`, which
/// stays in the foreground and exits with the job's status and the uninterrupted answer.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_recovers_by_itself_when_node_b_is_lost() {
    let sb = Sandbox::new("mpi-recover");
    let nodes = TwoNodes::new();
    let spare = nodes.spare();
    sb.mkdir("local");
    let local_template = sb.path("local/{node}").display().to_string();
    let rsh = progs_dir().join("netns-exec.sh");
    let want = ring_reference(&nodes, &sb, "8");
    let agent_rsh = format!("{} agent-rsh", ckpt_bin().display());
    let env = [("OMPI_MCA_plm_rsh_agent", agent_rsh.as_str())];
    let coord_args = [
        os("coordinator"),
        os("--listen"),
        os(format!("{}:0", nodes.addrs[0])),
        os("--dir"),
        os(&sb.dir),
        os("--rsh"),
        os(format!("{} {{host}}", rsh.display())),
        os("--local-dir"),
        os(&local_template),
        os("--redundancy"),
        os("partner"),
        os("--recover"),
        os("--spares"),
        os(&spare.name),
    ];
    let (mut coord, addr) = start_coordinator(&nodes.names[0], &sb, &coord_args, &[], "coord");
    let run_work = sb.mkdir("run");
    let mut launch_args = vec![os("launch"), os("--coord"), os(&addr), os("--node"), os("a"), os("--dir"), os(&sb.dir), os("--pool"), os("256M"), os("--")];
    launch_args.extend(ring_argv(&nodes, &run_work, "8"));
    let mut launch = Job::start_in(Some(&nodes.names[0]), &sb.dir, &sub_tag(&sb.dir, "launch"), &launch_args, &env, &sb.path("launch.out"));
    wait_for_start(&mut launch, &coord);
    std::thread::sleep(Duration::from_millis(1500));
    let g1 = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    std::thread::sleep(Duration::from_millis(500));
    assert!(launch.try_wait().is_none(), "the job ended before node B was lost\n{}", launch.report());

    // Node B is lost, its disk with it: its links go down first, as when a node loses power
    // (nothing it had open says goodbye; the coordinator finds out from the missing heartbeats,
    // and mpirun on node A, waiting on TCP, may not find out at all).
    nodes.pull_the_plug(1);
    std::fs::remove_dir_all(local_template.replace("{node}", &nodes.addrs[1])).unwrap();

    let status = launch.wait_timeout(Duration::from_secs(180));
    assert!(status.success(), "the launch did not finish well after the recovery ({status})\n{}\n{}", launch.report(), coord.report());
    assert_eq!(
        result_line(&launch.output()).as_deref(),
        Some(want.as_str()),
        "RESULT differs from the uninterrupted run's\n{}\n{}",
        launch.report(),
        coord.report()
    );
    assert!(has_line(&launch.output(), "PASS"), "{}", launch.report());
    assert!(launch.errors().contains("restarting this node's part"), "node A did not restart in its launch\n{}", launch.report());
    let coord_status = coord.wait_timeout(Duration::from_secs(30));
    let said = coord.errors();
    assert!(said.contains(&format!("recovered from generation {g1}")), "the coordinator did not say it recovered from generation {g1}\n{}", coord.report());
    // Open MPI's ranks connect to each other from both sides at once and close one of the two
    // connections, at every start: its end lingers a minute, on a listener's port, with the
    // listener's SO_REUSEADDR as it was when the connection came (Open MPI clears it). The
    // launch's watcher sets it on every listener of the job as soon as it sees it, so node A's
    // part, restarted in place seconds later, binds beside that end instead of waiting for it.
    assert_no_restart_waited_for_old_connections(&(launch.errors() + &said));
    assert!(coord_status.success(), "{}", coord.report());
    kill_job_processes(&sb.dir);
}

/// Starts `ckpt ARGS` (a coordinator writing its address to D/coordinator.addr) in namespace
/// `ns`; returns it and its address.
fn start_coordinator(ns: &str, sb: &Sandbox, args: &[std::ffi::OsString], env: &[(&str, &str)], name: &str) -> (Job, String) {
    let addr_file = sb.dir.join("coordinator.addr");
    let _ = std::fs::remove_file(&addr_file);
    let mut coord = Job::start_in(Some(ns), &sb.dir, &sub_tag(&sb.dir, name), args, env, &sb.path(&format!("{name}.out")));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let addr = read_text(&addr_file).trim().to_string();
        if !addr.is_empty() {
            return (coord, addr);
        }
        assert!(coord.try_wait().is_none() && std::time::Instant::now() < deadline, "the coordinator wrote no address\n{}", coord.report());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the launched job has printed START.
fn wait_for_start(launch: &mut Job, coord: &Job) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !has_line(&launch.output(), "START") {
        assert!(launch.try_wait().is_none() && std::time::Instant::now() < deadline, "the job did not start\n{}\n{}", launch.report(), coord.report());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `mpirun ... mpi_ring SECONDS` over the two nodes' addresses, Open MPI's session files in `work`.
fn ring_argv(nodes: &TwoNodes, work: &std::path::Path, seconds: &str) -> Vec<std::ffi::OsString> {
    ring_argv_on(&nodes.addrs, work, seconds)
}

/// `mpirun ... mpi_ring SECONDS`, one rank on each of `hosts`.
fn ring_argv_on(hosts: &[String], work: &std::path::Path, seconds: &str) -> Vec<std::ffi::OsString> {
    let mut a = vec![os(mpirun())];
    a.extend(as_root_flag());
    a.extend([os("--host"), os(hosts.join(",")), os("-np"), os(hosts.len().to_string())]);
    // rtc_hwloc_vmhole none: Open MPI 4's orted, started on another node, now and then
    // crashes (SIGSEGV in hwloc_shmem_topology_write) placing the hardware topology in a hole
    // of its address space for the ranks to share, without ckpt as with it; the ranks then read
    // the topology themselves.
    for kv in [["btl", "tcp,self"], ["orte_tmpdir_base", &work.to_string_lossy()], ["rtc_hwloc_vmhole", "none"]] {
        a.extend([os("--mca"), os(kv[0]), os(kv[1])]);
    }
    a.extend([os(prog("mpi_ring")), os(seconds)]);
    a
}

/// The RESULT of the ring over the two nodes run without ckpt (Open MPI's remote shell going
/// straight into the other namespace), in the sandbox's `ref/`.
fn ring_reference(nodes: &TwoNodes, sb: &Sandbox, seconds: &str) -> String {
    ring_reference_on(&nodes.names[0], &nodes.addrs, sb, seconds)
}

/// The RESULT of the uninterrupted ring of `ranks` ranks for `seconds`, with `library`, made
/// by `make` once in this process. The ring's answer is a function of those alone (each rank's
/// data comes from its rank and the step, tests/progs/mpi_ring.c), so the tests that run the
/// same ring compare with one reference run rather than each making its own (seconds each, and
/// the multi-node tests run one at a time). An answer that came to depend on anything else
/// would fail a test, never pass one.
fn remembered_ring_reference(library: &str, ranks: usize, seconds: &str, make: impl FnOnce() -> String) -> String {
    static MADE: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{library}, {ranks} ranks, {seconds} s");
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, result)) = made.iter().find(|(k, _)| *k == key) {
        return result.clone();
    }
    let result = make();
    made.push((key, result.clone()));
    result
}

/// The same, one rank on each of `hosts`, mpirun in the namespace `first`.
fn ring_reference_on(first: &str, hosts: &[String], sb: &Sandbox, seconds: &str) -> String {
    remembered_ring_reference("open-mpi", hosts.len(), seconds, || ring_reference_made_on(first, hosts, sb, seconds))
}

fn ring_reference_made_on(first: &str, hosts: &[String], sb: &Sandbox, seconds: &str) -> String {
    let ref_work = sb.mkdir("ref");
    let mut ref_argv = vec![os("ip"), os("netns"), os("exec"), os(first)];
    ref_argv.extend(user_prefix());
    let mut job_argv = ring_argv_on(hosts, &ref_work, seconds);
    job_argv.splice(1..1, [os("--mca"), os("plm_rsh_agent"), os(progs_dir().join("netns-exec.sh"))]);
    ref_argv.extend(job_argv);
    // The harness (root) enters the namespace; the program runs as the job's user.
    let reference = reference_run_as_harness(&ref_argv, &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    result_line(&reference).expect("the reference run printed a RESULT")
}

/// Nodes: network namespaces of this machine, each with its own address in one subnet, joined
/// by a bridge in the machine's own namespace; removed on drop.
struct Cluster {
    _alone: std::sync::MutexGuard<'static, ()>,
    names: Vec<String>,
    addrs: Vec<String>,
    bridge: String,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        let alone = one_multi_node_job_at_a_time();
        let id = net_id();
        let net = format!("10.{}.{}", 250 + (id >> 8) % 5, id % 256);
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().expect("run ip (install iproute2)");
            assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        let bridge = format!("cb{}", id % 100_000);
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["link", "set", &bridge, "up"]);
        let mut cluster = Cluster { _alone: alone, names: Vec::new(), addrs: Vec::new(), bridge };
        for i in 0..n {
            let (name, addr, outside) = (format!("ckpt{id}n{i}"), format!("{net}.{}", i + 1), format!("ck{}h{i}", id % 100_000));
            ip(&["netns", "add", &name]);
            cluster.names.push(name.clone());
            cluster.addrs.push(addr.clone());
            ip(&["link", "add", &outside, "type", "veth", "peer", "name", "eth0", "netns", &name]);
            ip(&["link", "set", &outside, "master", &cluster.bridge]);
            ip(&["link", "set", &outside, "up"]);
            ip(&["-n", &name, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(&["-n", &name, "link", "set", "eth0", "up"]);
            ip(&["-n", &name, "link", "set", "lo", "up"]);
        }
        cluster
    }

    /// Node `i` is lost: its network link goes down, then every process in it is killed.
    fn pull_the_plug(&self, i: usize) {
        let _ = std::process::Command::new("ip").args(["-n", &self.names[i], "link", "set", "eth0", "down"]).status();
        kill_netns_processes(&self.names[i]);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &self.names {
            kill_netns_processes(n);
            let _ = std::process::Command::new("ip").args(["netns", "del", n]).status();
        }
        let _ = std::process::Command::new("ip").args(["link", "del", &self.bridge]).status();
    }
}

/// As the issue checks it: an Open MPI ring of 3 ranks on 3 nodes, 1 spare, each node with its
/// own local directory, `--recover`. After a checkpoint node 2 loses power and its local
/// directory; with no command from anyone the job comes back, node 2's part on the spare, and the
/// user's `ckpt launch` exits 0 with the uninterrupted answer.
/// Three nodes, one of them lost: its part comes back on the spare if `with_spare`, else on a
/// surviving node's host (the one holding its copy, with partner copies).
/// With `local_beside_output`, the local directories are `RUN/local-{node}`, beside the job's
/// output in RUN (each rank's log, the launch's stdout, Open MPI's session directory), as users
/// lay them out; else under the sandbox's `local/`, apart from them.
fn three_nodes_lose_one(name: &str, redundancy: &str, with_spare: bool, local_beside_output: bool) {
    let sb = Sandbox::new(name);
    let cluster = Cluster::new(if with_spare { 4 } else { 3 });
    let hosts = cluster.addrs[..3].to_vec();
    let run_work = sb.mkdir("run");
    let local_template = if local_beside_output {
        run_work.join("local-{node}")
    } else {
        sb.mkdir("local");
        sb.path("local/{node}")
    }
    .display()
    .to_string();
    let want = ring_reference_on(&cluster.names[0], &hosts, &sb, "8");
    let agent_rsh = format!("{} agent-rsh", ckpt_bin().display());
    let env = [("OMPI_MCA_plm_rsh_agent", agent_rsh.as_str())];
    let rsh = format!("{} {{host}}", progs_dir().join("netns-exec.sh").display());
    let coord_args = [
        os("coordinator"),
        os("--listen"),
        os(format!("{}:0", hosts[0])),
        os("--dir"),
        os(&sb.dir),
        os("--rsh"),
        os(&rsh),
        os("--local-dir"),
        os(&local_template),
        os("--redundancy"),
        os(redundancy),
        os("--recover"),
    ];
    let mut coord_args = coord_args.to_vec();
    if with_spare {
        coord_args.extend([os("--spares"), os(&cluster.names[3])]);
    }
    let (mut coord, addr) = start_coordinator(&cluster.names[0], &sb, &coord_args, &[], "coord");
    let mut launch_args = vec![os("launch"), os("--coord"), os(&addr), os("--node"), os("a"), os("--dir"), os(&sb.dir), os("--pool"), os("256M"), os("--")];
    let mut ring = ring_argv_on(&hosts, &run_work, "8");
    if local_beside_output {
        // Each rank's output file in RUN: the directory of files the job writes (as the issue's).
        ring.extend([os("1024"), os(format!("log={}", run_work.display()))]);
    }
    if !with_spare {
        // Two ranks' parts on one host: Open MPI's TCP transport must not listen on the same
        // fixed port (1024 up) on every node; the kernel picks them (docs/USER-GUIDE.md).
        ring.splice(1..1, ["--mca", "btl_tcp_port_min_v4", "0", "--mca", "btl_tcp_port_min_v6", "0"].map(os));
    }
    launch_args.extend(ring);
    // The job's output beside its local directories too: `ckpt launch ... > RUN/launch.out`.
    let launch_out = if local_beside_output { run_work.join("launch.out") } else { sb.path("launch.out") };
    let mut launch = Job::start_in(Some(&cluster.names[0]), &sb.dir, &sub_tag(&sb.dir, "launch"), &launch_args, &env, &launch_out);
    wait_for_start(&mut launch, &coord);
    std::thread::sleep(Duration::from_millis(1500));
    let mut g1 = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    if local_beside_output {
        // The first checkpoint made the local directories: the second's record lists them in RUN.
        std::thread::sleep(Duration::from_millis(300));
        g1 = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    }
    std::thread::sleep(Duration::from_millis(500));
    // The last node, or with the local directories beside the output the second, as in the
    // issue's report (node 10.x.x.2).
    let lost = if local_beside_output { 1 } else { 2 };
    assert!(launch.try_wait().is_none(), "the job ended before node {lost} was lost\n{}", launch.report());

    cluster.pull_the_plug(lost);
    std::fs::remove_dir_all(local_template.replace("{node}", &hosts[lost])).unwrap();

    let status = launch.wait_timeout(Duration::from_secs(180));
    assert!(status.success(), "the launch did not finish well after the recovery ({status})\n{}\n{}", launch.report(), coord.report());
    assert_eq!(
        result_line(&launch.output()).as_deref(),
        Some(want.as_str()),
        "RESULT differs from the uninterrupted run's\n{}\n{}",
        launch.report(),
        coord.report()
    );
    assert!(has_line(&launch.output(), "PASS"), "{}", launch.report());
    let coord_status = coord.wait_timeout(Duration::from_secs(30));
    assert!(
        coord.errors().contains(&format!("recovered from generation {g1}")),
        "the coordinator did not say it recovered from generation {g1}\n{}",
        coord.report()
    );
    assert_no_restart_waited_for_old_connections(&(launch.errors() + &coord.errors()));
    if !with_spare {
        // Its part goes where its copy is (the next node in the ring of the join order).
        let manifest = ckpt_core::image::Manifest::load(&sb.dir.join(format!("gen-{g1:06}"))).unwrap();
        let survivor = manifest.copies[&hosts[lost]][0].clone();
        let survivor = if survivor == "a" { hosts[0].clone() } else { survivor };
        assert!(
            coord.errors().contains(&format!("no spare host left: node {}'s part goes on {survivor}", hosts[lost])),
            "the coordinator did not say where the lost part went\n{}",
            coord.report()
        );
    }
    assert!(coord_status.success(), "{}", coord.report());
    if local_beside_output {
        // Every rank's log, the lost one's included, has each eighth step once (cut back to the
        // checkpoint at restart, not written twice).
        for rank in 0..3 {
            let log = read_text(&run_work.join(format!("rank-{rank}.log")));
            let steps: Vec<&str> = log.lines().collect();
            let want: Vec<String> = (0..steps.len()).map(|k| (k * 8 + 7).to_string()).collect();
            assert_eq!(steps, want, "rank {rank}'s log has a step lost or twice");
        }
    }
    kill_job_processes(&sb.dir);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn three_nodes_and_a_spare_lose_one_with_partner_copies() {
    three_nodes_lose_one("mpi-3+1-partner", "partner", true, false);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn three_nodes_and_no_spare_lose_one_its_part_goes_beside_a_survivors() {
    three_nodes_lose_one("mpi-3-no-spare", "partner", false, false);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn three_nodes_and_a_spare_lose_one_with_xor_parity() {
    three_nodes_lose_one("mpi-3+1-xor", "xor:3", true, false);
}

/// The same with each node's local directory beside the job's output (`--local-dir
/// RUN/local-{node}`, each rank writing its log in RUN): the lost node's directory, gone from
/// beside the output, must not refuse the survivors' restart (issue 33), and the job comes back
/// with its part on the spare, every rank's log with each step once.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn three_nodes_and_a_spare_lose_one_with_local_directories_beside_the_output() {
    three_nodes_lose_one("mpi-3+1-beside", "partner", true, true);
}
