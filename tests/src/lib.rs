//! Shared helpers for the end-to-end tests (see `tests/tests/*.rs`).
//!
//! The tests drive the real `ckpt` binary (`target/release/ckpt`, or `$CKPT_BIN`) on the
//! programs of `tests/progs/` (built here with `make -C tests/progs`), and check that a job that
//! was checkpointed, crashed and restarted finishes with the same answer as an uninterrupted run.
//!
//! - [`Sandbox`]: one temporary directory per test (image directory `img/`, program work
//!   directories, captured output); on drop it kills whatever of its job is still running.
//! - [`Job`]: a running `ckpt launch` or `ckpt restart`, with stdout and stderr sent to files.
//! - [`checkpoint`], [`try_checkpoint`], [`ckpt`]: the client commands.
//! - [`reference_run`]: the program run directly, not under ckpt.
//! - [`Case`] and [`canonical_scenario`]: launch, checkpoint, crash, restart, checkpoint --kill,
//!   restart, compare with the reference run.
//!
//! Every process the harness starts under ckpt carries `CKPT_TEST_TAG=<image dir>` in its
//! environment, so that the processes of one test's job (launcher, init, program, restored
//! program) can be found in /proc ([`job_processes`]) and checked for, or killed.
//!
//! Environment: `CKPT_BIN` (the binary to test), `CKPT_SKIP_E2E=1` (every end-to-end test
//! returns at once, see [`skip`]), `CKPT_TEST_KEEP=1` (keep each test's temporary directory),
//! `CKPT_TEST_USER=NAME` (the harness, as root, runs every `ckpt` command and every program as
//! that ordinary user, see [`test_user`]), `CKPT_TEST_PROGS=DIR` (the test programs, when the
//! user cannot reach the checkout's).

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a job (launched or restarted) may run before the harness kills it and fails.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a client command (`checkpoint`, `verify`, ...) may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `ckpt checkpoint` may take: asked while a job is being restarted, it waits for the
/// restart (up to the coordinator's REJOIN_WAIT, 180 s).
pub const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(240);
/// How long `checkpoint` is retried while the job is not ready yet ("no running job", or a
/// job over several nodes still being restarted): as long as a restore may take
/// ([`RESTORE_TIMEOUT`]).
pub const READY_TIMEOUT: Duration = RESTORE_TIMEOUT;
/// How long a job's processes may take to disappear once its foreground command has ended.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed job's processes may take to disappear (after SIGKILL to the launcher, or
/// `checkpoint --kill`): short, so that a surviving job is caught before it could end by itself.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(2);
/// The environment variable that marks the processes of one test's job.
pub const TAG_VAR: &str = "CKPT_TEST_TAG";

// ---------------------------------------------------------------------------------------------
// Locations and building

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests crate has a parent directory").to_path_buf()
}

/// The `ckpt` binary under test: `$CKPT_BIN` if set, else `release/ckpt` in the target directory
/// this test binary was built in (which honours `CARGO_TARGET_DIR`), else
/// `<workspace>/target/release/ckpt`. Panics with what to do if it does not exist, or if it is
/// not the tests' build (with the CKPT_TEST_* hooks several tests use: ckpt_core::testhooks).
pub fn ckpt_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = find_ckpt_bin();
        let version = Command::new(&bin).arg("--version").output().unwrap_or_else(|e| panic!("run {} --version: {e}", bin.display()));
        let version = String::from_utf8_lossy(&version.stdout);
        assert!(
            version.contains("(test hooks)"),
            "{} ({}) is not the tests' build: build it with `cargo build --release -p ckpt-launch --features test-hooks` \
             (scripts/test.sh builds it so)",
            bin.display(),
            version.trim()
        );
        bin
    })
    .clone()
}

fn find_ckpt_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CKPT_BIN") {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "CKPT_BIN={} does not exist", bin.display());
        return bin;
    }
    let mut candidates = Vec::new();
    // <target>/<profile>/deps/<test binary>
    if let Ok(exe) = std::env::current_exe() {
        if let Some(target) = exe.ancestors().nth(3) {
            candidates.push(target.join("release/ckpt"));
        }
    }
    candidates.push(workspace_root().join("target/release/ckpt"));
    candidates.iter().find(|c| c.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "the ckpt binary was not found (looked at {}): run `cargo build --release -p ckpt-launch \
                 --features test-hooks` first, or set CKPT_BIN",
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// `tests/progs/`: the test programs' sources (and scripts); `$CKPT_TEST_PROGS` if set.
pub fn progs_dir() -> PathBuf {
    match std::env::var_os("CKPT_TEST_PROGS") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("tests/progs"),
    }
}

/// A file of the integrations users install (`plugins/`).
pub fn plugin(rel: &str) -> PathBuf {
    let p = workspace_root().join("plugins").join(rel);
    assert!(p.is_file(), "{} does not exist", p.display());
    p
}

// ---------------------------------------------------------------------------------------------
// Running as an ordinary user

/// The ordinary user the tests run jobs as.
#[derive(Debug, Clone)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The user named by `CKPT_TEST_USER`, if set: the harness stays root (it makes network
/// namespaces and reads every process's /proc), and runs every `ckpt` command, every program
/// and every reference run as this user, through `setpriv` ([`command`]). Panics if the user
/// does not exist or the harness is not root.
pub fn test_user() -> Option<&'static TestUser> {
    static USER: OnceLock<Option<TestUser>> = OnceLock::new();
    USER.get_or_init(|| {
        let name = std::env::var("CKPT_TEST_USER").ok().filter(|n| !n.is_empty())?;
        assert!(is_root(), "CKPT_TEST_USER={name}: the harness must run as root to run jobs as {name}");
        let passwd = fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
        let fields: Vec<&str> = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&name.as_str()))
            .unwrap_or_else(|| panic!("CKPT_TEST_USER={name}: no such user (scripts/test.sh creates it)"));
        Some(TestUser {
            name: name.clone(),
            uid: fields[2].parse().expect("uid in /etc/passwd"),
            gid: fields[3].parse().expect("gid in /etc/passwd"),
            home: PathBuf::from(fields[5]),
        })
    })
    .as_ref()
}

/// Whether the harness runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether the jobs of this run belong to root (no [`test_user`]).
pub fn jobs_as_root() -> bool {
    test_user().is_none() && is_root()
}

/// For a test that needs root by its nature (TCP repair to a peer outside the job): panics,
/// naming why, when the jobs run as an ordinary user. scripts/test.sh skips these tests by name
/// in its run as a user, so a test never reports ok without having run.
pub fn needs_root(why: &str) {
    assert!(jobs_as_root(), "this test needs root ({why}); the run as an ordinary user must skip it");
}

/// For a test whose harness must be root (to act as another user than the jobs'), in either run.
pub fn needs_harness_root() {
    assert!(is_root(), "this test must be run by root (scripts/test.sh runs every test as root)");
}

/// The words that run a command as the [`test_user`] (`setpriv --reuid U --regid G
/// --init-groups --`: the groups a login gives), or nothing. For commands built as argument
/// vectors (`ip netns exec NS <prefix> PROG`).
pub fn user_prefix() -> Vec<OsString> {
    match test_user() {
        None => Vec::new(),
        Some(u) => ["setpriv", &format!("--reuid={}", u.uid), &format!("--regid={}", u.gid), "--init-groups", "--"].iter().map(os).collect(),
    }
}

/// A command that runs `program` as the [`test_user`] if there is one, else as the harness.
pub fn command<S: AsRef<OsStr>>(program: S) -> Command {
    let prefix = user_prefix();
    let Some(user) = test_user() else {
        return Command::new(program);
    };
    let mut cmd = Command::new(&prefix[0]);
    cmd.args(&prefix[1..]).arg(program).env("HOME", &user.home).env("USER", &user.name).env("LOGNAME", &user.name);
    cmd
}

/// Gives a path the harness made to the [`test_user`], so that the job can write there.
pub fn give_to_user(path: &Path) {
    if let Some(u) = test_user() {
        std::os::unix::fs::chown(path, Some(u.uid), Some(u.gid)).unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

/// Builds the C test programs (`make -C tests/progs`) once per test process. Concurrent test
/// processes are serialized with `flock` on `tests/progs/bin/.build.lock`; the Makefile also
/// compiles to a temporary name and renames, so a program is never seen half-written.
pub fn build_progs() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = progs_dir();
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("mkdir {}: {e}", bin.display()));
        let lock_path = bin.join(".build.lock");
        let lock = File::create(&lock_path).unwrap_or_else(|e| panic!("create {}: {e}", lock_path.display()));
        // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock {}: {}", lock_path.display(), std::io::Error::last_os_error());
        let out = Command::new("make").arg("-s").arg("-C").arg(&dir).output().unwrap_or_else(|e| panic!("cannot run make (install make and gcc): {e}"));
        assert!(out.status.success(), "make -C {} failed:\n{}{}", dir.display(), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        drop(lock);
    });
}

/// The path of a test program: a C program's binary in `tests/progs/bin/` (built first), or a
/// script in `tests/progs/` when `name` has an extension (`compute.py`).
pub fn prog(name: &str) -> PathBuf {
    if name.contains('.') {
        let p = progs_dir().join(name);
        assert!(p.is_file(), "{} does not exist", p.display());
        return p;
    }
    build_progs();
    let p = progs_dir().join("bin").join(name);
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// Copies the program `from` to `to` for a test to run from there. The copy is written by `cp`,
/// not by this process: a write descriptor open here would be inherited by any child another
/// test thread forks at that moment, and `to` would then fail to run with "Text file busy"
/// (ETXTBSY) until that child execs, as it once did in CI.
pub fn copy_program(from: &Path, to: &Path) {
    let status = Command::new("cp").arg("--").arg(from).arg(to).status().unwrap_or_else(|e| panic!("cannot run cp: {e}"));
    assert!(status.success(), "cp {} {} failed: {status}", from.display(), to.display());
}

/// An interpreter by name, as an absolute path: `/usr/bin/NAME` (Debian's) if present, else the
/// first `NAME` on `PATH`.
pub fn interpreter(name: &str) -> PathBuf {
    let system = Path::new("/usr/bin").join(name);
    if system.is_file() {
        return system;
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("{name} not found (scripts/test.sh installs it)"))
}

/// Converts anything path- or string-like to an `OsString` (for building argument vectors).
pub fn os<S: AsRef<OsStr>>(s: S) -> OsString {
    s.as_ref().to_os_string()
}

// ---------------------------------------------------------------------------------------------
// Output files

/// The contents of a file as text (empty if it does not exist).
pub fn read_text(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The value of the `RESULT <value>` line of a program's output, if any (the last one).
pub fn result_line(text: &str) -> Option<String> {
    text.lines().rev().find_map(|l| l.trim().strip_prefix("RESULT ").map(|v| v.trim().to_string()))
}

/// Whether this kernel tracks a process's writes (PAGEMAP_SCAN and WP_ASYNC, Linux 6.7). Where
/// it does not, memory is copied while the job is frozen and every generation is whole: the
/// tests of copy-ahead and incremental generations check that fallback there, as the user
/// guide's kernel table promises it, instead of what needs the kernel.
pub fn kernel_tracks_writes() -> bool {
    ckpt_core::objects::dirty::kernel_can_track_writes()
}

/// The warning a job's agent gives once on a kernel that cannot track writes.
pub const NO_WRITE_TRACKING: &str = "this kernel has no PAGEMAP_SCAN";

/// Whether `text` has a line equal to `line` (surrounding whitespace ignored).
pub fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.trim() == line)
}

/// The `FAIL ...` lines a self-checking program printed.
pub fn fail_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.trim_start().starts_with("FAIL")).collect()
}

/// The last `n` lines of a file, for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = read_text(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Client commands

/// What a finished client command printed.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }
    /// stdout and stderr together, for searching a message wherever it was printed.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl std::fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n--- stdout:\n{}--- stderr:\n{}", self.status, self.stdout, self.stderr)
    }
}

/// After a recovery from a lost node: no restart waited for an end still closing towards it
/// (FIN-WAIT-1: a FIN nothing will acknowledge, retransmitted for minutes). The recovery's kill
/// resets the job's connections (`tcp::reset_at_recovery_kill`); without it, a restart in place
/// as an ordinary user says it waits for such an end (as root the restart ends them itself and
/// says nothing: the check means something in the run as an ordinary user). `said`: what the
/// launchers and the coordinator wrote.
pub fn assert_nothing_lingered_towards_the_lost_node(said: &str) {
    assert!(!said.contains("FIN-WAIT"), "a restart in place waited for an end of the old job still closing towards the lost node\n{said}");
}

/// No restart waited for any end of the old job's connections (issue 33): the TIME-WAIT ends
/// between the survivors carry SO_REUSEADDR, which every checkpoint without repair mode sets,
/// and the restart binds beside them. A restart that waits says so ("... of the old job's
/// closed connections ...: waiting for them to go"). As root the restart ends them itself: the
/// check means something in the run as an ordinary user.
pub fn assert_no_restart_waited_for_old_connections(said: &str) {
    assert_nothing_lingered_towards_the_lost_node(said);
    assert!(!said.contains("of the old job's closed connections"), "a restart in place waited for ends of the old job's connections\n{said}");
}

/// Runs a command to completion with a timeout (killed and panics if it takes longer).
pub fn run_command(mut cmd: Command, timeout: Duration) -> CmdOutput {
    let what = format!("{cmd:?}");
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    CmdOutput {
        status,
        stdout: String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned(),
    }
}

/// Runs `ckpt ARGS...` (a client command) with [`COMMAND_TIMEOUT`].
pub fn ckpt<S: AsRef<OsStr>>(args: &[S]) -> CmdOutput {
    let mut cmd = command(ckpt_bin());
    cmd.args(args);
    run_command(cmd, COMMAND_TIMEOUT)
}

/// `ckpt verify DIR`.
pub fn verify(dir: &Path) -> CmdOutput {
    ckpt(&[os("verify"), os(dir)])
}

/// `ckpt inspect DIR`.
pub fn inspect(dir: &Path) -> CmdOutput {
    ckpt(&[os("inspect"), os(dir)])
}

/// Whether a failed `ckpt checkpoint` said that the job is not (yet) running.
pub fn not_ready(out: &CmdOutput) -> bool {
    let text = out.all().to_lowercase();
    text.contains("no running job") || text.contains("the job is being restarted")
}

/// One attempt at `ckpt checkpoint --dir DIR --json EXTRA...`: the JSON object it printed, or
/// the command's output if it failed or printed no JSON object.
pub fn try_checkpoint(dir: &Path, extra: &[&str]) -> Result<Value, CmdOutput> {
    let mut args = vec![os("checkpoint"), os("--dir"), os(dir), os("--json")];
    args.extend(extra.iter().map(os));
    let mut cmd = command(ckpt_bin());
    cmd.args(&args);
    let out = run_command(cmd, CHECKPOINT_TIMEOUT);
    if !out.success() {
        return Err(out);
    }
    parse_json_object(&out.stdout).ok_or(out)
}

/// The JSON object in a command's stdout: the whole text, or else its last line that is one.
pub fn parse_json_object(stdout: &str) -> Option<Value> {
    let whole = serde_json::from_str::<Value>(stdout.trim()).ok().filter(Value::is_object);
    whole.or_else(|| stdout.lines().rev().find_map(|l| serde_json::from_str::<Value>(l.trim()).ok().filter(Value::is_object)))
}

/// `ckpt checkpoint --dir DIR --json EXTRA...`, retried every 100 ms for up to
/// [`READY_TIMEOUT`] while it fails with "no running job" (the launcher or restart is not ready
/// yet). Panics if it fails otherwise. Returns the JSON object it printed.
pub fn checkpoint(dir: &Path, extra: &[&str]) -> Value {
    checkpoint_while(dir, extra, || Ok(()))
}

/// [`checkpoint`], giving up early when `alive()` says the job has gone.
fn checkpoint_while(dir: &Path, extra: &[&str], mut alive: impl FnMut() -> Result<(), String>) -> Value {
    let start = Instant::now();
    loop {
        match try_checkpoint(dir, extra) {
            Ok(v) => return v,
            Err(out) if not_ready(&out) && start.elapsed() < READY_TIMEOUT => {
                if let Err(why) = alive() {
                    panic!("ckpt checkpoint --dir {}: the job is gone: {why}\n{out}", dir.display());
                }
                thread::sleep(Duration::from_millis(100));
            }
            Err(out) => panic!("ckpt checkpoint --dir {} {extra:?} failed: {out}", dir.display()),
        }
    }
}

/// Checks that a `checkpoint --json` object has the documented fields; returns its generation.
pub fn check_checkpoint_json(v: &Value) -> u64 {
    for field in ["frozen_ms", "durable_ms", "bytes_raw", "bytes_stored"] {
        assert!(v.get(field).is_some_and(Value::is_number), "checkpoint JSON lacks {field}: {v}");
    }
    v.get("generation").and_then(Value::as_u64).unwrap_or_else(|| panic!("checkpoint JSON lacks a numeric generation: {v}"))
}

// ---------------------------------------------------------------------------------------------
// The processes of a job

fn tag_of(dir: &Path) -> OsString {
    os(dir)
}

/// The tag of one process group of a test that runs several under one image directory (the
/// coordinator, each node's agent): `<dir>#<name>`. [`job_processes`] of `dir` includes them.
pub fn sub_tag(dir: &Path, name: &str) -> PathBuf {
    let mut t = dir.as_os_str().to_os_string();
    t.push("#");
    t.push(name);
    PathBuf::from(t)
}

/// The processes (not zombies) whose environment has `CKPT_TEST_TAG=<dir>` (or a
/// [`sub_tag`] of it): everything the harness started under ckpt for the image directory
/// `dir`, and their descendants.
pub fn job_processes(dir: &Path) -> Vec<u32> {
    let mut needle = format!("{TAG_VAR}=").into_bytes();
    needle.extend_from_slice(tag_of(dir).as_bytes());
    let mut sub = needle.clone();
    sub.push(b'#');
    needle.push(0);
    let me = std::process::id();
    let mut pids = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = fs::read(entry.path().join("environ")) else {
            continue;
        };
        let tagged =
            env.split_inclusive(|&b| b == 0).any(|var| var == needle.as_slice() || var.starts_with(&sub)) || env.ends_with(&needle[..needle.len() - 1]);
        if tagged && !is_zombie(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// The job's processes that carry the restorer's name ("exe", from /proc/self/exe) instead of
/// their own: a restart must give every thread its name back.
pub fn misnamed_processes(dir: &Path) -> Vec<String> {
    let ckpt = ckpt_bin().canonicalize().unwrap_or_else(|_| ckpt_bin());
    job_processes(dir)
        .into_iter()
        .filter(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e != ckpt))
        .filter_map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "exe").then(|| format!("pid {pid}: {}", read_text(Path::new(&format!("/proc/{pid}/cmdline"))).replace('\0', " ")))
        })
        .collect()
}

/// How long a restore may take to finish before [`misnamed_after_restore`] gives up (a loaded
/// machine, 256 MiB jobs restored two at a time).
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(75);

/// [`misnamed_processes`] once the restore has had time to finish: a process is renamed late in
/// its rebuild, so until then it is "misnamed" without anything being wrong. Polls until none is
/// and the job has a process that is no longer the restorer (before that, none is misnamed only
/// because none is rebuilt yet), or the job has no process left, or [`RESTORE_TIMEOUT`] has
/// passed.
pub fn misnamed_after_restore(dir: &Path) -> Vec<String> {
    let ckpt = ckpt_bin().canonicalize().unwrap_or_else(|_| ckpt_bin());
    let start = Instant::now();
    loop {
        let misnamed = misnamed_processes(dir);
        let processes = job_processes(dir);
        let rebuilt = processes.iter().any(|pid| fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e != ckpt));
        if (misnamed.is_empty() && (rebuilt || processes.is_empty())) || start.elapsed() > RESTORE_TIMEOUT {
            return misnamed;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn is_zombie(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|(state, _, _)| matches!(state, 'Z' | 'X'))
}

/// A process, identified across PID reuse by its start time (clock ticks after boot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcId {
    pub pid: u32,
    pub start: u64,
}

impl ProcId {
    /// Whether this very process still runs (exists, same start time, not a zombie).
    pub fn alive(self) -> bool {
        proc_stat(self.pid).is_some_and(|(state, _, start)| start == self.start && !matches!(state, 'Z' | 'X'))
    }
}

/// State, parent pid and start time of a process, from /proc/PID/stat.
fn proc_stat(pid: u32) -> Option<(char, u32, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the fields follow the command name, which is in parentheses and may contain anything
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?; // field 22 of stat(5)
    Some((state, ppid, start))
}

/// Every living descendant of process `root` (children, their children, ...).
pub fn descendants(root: u32) -> Vec<ProcId> {
    let mut all = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((state, ppid, start)) = proc_stat(pid) {
                if !matches!(state, 'Z' | 'X') {
                    all.push((ProcId { pid, start }, ppid));
                }
            }
        }
    }
    let mut found: Vec<ProcId> = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for &(p, ppid) in &all {
            if ppid == parent && !found.contains(&p) {
                found.push(p);
                parents.push(p.pid);
            }
        }
    }
    found
}

/// `pid: command line` of each process, for messages.
pub fn describe_processes(pids: &[u32]) -> String {
    pids.iter()
        .map(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd: Vec<String> = cmd.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            format!("{pid}: {}", cmd.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until no process of the job of `dir` remains; if some do after `timeout`, kills them
/// and panics naming them (`what` says what should have ended them).
pub fn wait_job_gone(dir: &Path, timeout: Duration, what: &str) {
    wait_gone(dir, &[], timeout, what);
}

/// [`wait_job_gone`], also waiting for the processes `also` (e.g. a launcher's descendants
/// listed before it was killed, in case the job's environment was not carried over).
pub fn wait_gone(dir: &Path, also: &[ProcId], timeout: Duration, what: &str) {
    let start = Instant::now();
    loop {
        let mut pids = job_processes(dir);
        for p in also {
            if p.alive() && !pids.contains(&p.pid) {
                pids.push(p.pid);
            }
        }
        if pids.is_empty() {
            return;
        }
        if start.elapsed() > timeout {
            let described = describe_processes(&pids);
            kill_job_processes(dir);
            for p in also.iter().filter(|p| p.alive()) {
                // SAFETY: kill(2) on a process we just checked is the one we listed.
                unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGKILL) };
            }
            panic!(
                "{what}, but these processes of the job were still running after {timeout:?}:\n\
                 {described}"
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs every process of the job of `dir` (cleanup).
pub fn kill_job_processes(dir: &Path) {
    for _ in 0..20 {
        let pids = job_processes(dir);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            // SAFETY: kill(2) with a pid read from /proc; at worst the process is already gone.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Jobs

/// A running `ckpt launch` or `ckpt restart` (the foreground command of a job), its stdout and
/// stderr sent to files. Dropping a `Job` that still runs SIGKILLs it.
pub struct Job {
    child: Child,
    status: Option<ExitStatus>,
    /// The image directory.
    pub dir: PathBuf,
    /// What marks this job's processes (`CKPT_TEST_TAG`): `dir`, or a [`sub_tag`] of it.
    pub tag: PathBuf,
    /// Where the job's stdout goes (the program's output).
    pub stdout: PathBuf,
    /// Where the job's stderr goes: `stdout` with `.err` appended.
    pub stderr: PathBuf,
    what: String,
}

impl Job {
    /// `ckpt launch --dir DIR -- ARGV...`, stdout to `stdout`, stderr to `<stdout>.err`.
    pub fn launch<S: AsRef<OsStr>>(dir: &Path, argv: &[S], stdout: &Path) -> Job {
        let mut args = vec![os("launch"), os("--dir"), os(dir), os("--")];
        args.extend(argv.iter().map(os));
        Job::spawn(dir, &args, stdout)
    }

    /// `ckpt launch --dir DIR OPTIONS -- ARGV`: a launch with options (triggers, pool, ...).
    pub fn launch_with<S: AsRef<OsStr>>(dir: &Path, options: &[&str], argv: &[S], stdout: &Path) -> Job {
        let mut args = vec![os("launch"), os("--dir"), os(dir)];
        args.extend(options.iter().map(os));
        args.push(os("--"));
        args.extend(argv.iter().map(os));
        Job::spawn(dir, &args, stdout)
    }

    /// `ckpt restart --dir DIR`, stdout to `stdout`, stderr to `<stdout>.err`.
    pub fn restart(dir: &Path, stdout: &Path) -> Job {
        Job::restart_with(dir, &[], stdout)
    }

    /// `ckpt restart --dir DIR EXTRA...` (e.g. `["--generation", "3"]`).
    pub fn restart_with(dir: &Path, extra: &[&str], stdout: &Path) -> Job {
        let mut args = vec![os("restart"), os("--dir"), os(dir)];
        args.extend(extra.iter().map(os));
        Job::spawn(dir, &args, stdout)
    }

    fn spawn(dir: &Path, args: &[OsString], stdout: &Path) -> Job {
        Job::start(dir, dir, args, &[], stdout)
    }

    /// `ckpt ARGS...` for the image directory `dir`, its processes tagged with `tag` (`dir`, or
    /// a [`sub_tag`] when several jobs share `dir`), with extra environment variables `env`.
    pub fn start<S: AsRef<OsStr>>(dir: &Path, tag: &Path, args: &[S], env: &[(&str, &str)], stdout: &Path) -> Job {
        Job::start_in(None, dir, tag, args, env, stdout)
    }

    /// [`Job::start`] inside a network namespace (`ip netns exec NETNS ckpt ARGS`): a node of
    /// the multi-node tests. `ip` execs ckpt, so the job's pid is ckpt's.
    pub fn start_in<S: AsRef<OsStr>>(netns: Option<&str>, dir: &Path, tag: &Path, args: &[S], env: &[(&str, &str)], stdout: &Path) -> Job {
        Job::start_with(netns, None, dir, tag, args, env, stdout)
    }

    /// [`Job::start`] through a node's remote shell (`RSH HOST 'ckpt ARGS'`: the multi-node
    /// tests' tests/progs/netns-exec.sh), as `ckpt coordinator --rsh` starts a part: the one
    /// way into a node that differs from this machine in more than its network (its own
    /// mounts, its own environment: see netns-exec.sh). As an ordinary user the remote shell
    /// goes through sudo, which resets the environment: `env` and the tag reach the job only
    /// when the jobs run as root.
    pub fn start_through<S: AsRef<OsStr>>(rsh: &Path, host: &str, dir: &Path, tag: &Path, args: &[S], env: &[(&str, &str)], stdout: &Path) -> Job {
        // The remote shell joins its words and runs them with a shell, as ssh does.
        let quote = |w: &OsStr| format!("'{}'", w.to_string_lossy().replace('\'', r"'\''"));
        let line = std::iter::once(ckpt_bin().into_os_string()).chain(args.iter().map(os)).map(|w| quote(&w)).collect::<Vec<_>>().join(" ");
        let mut cmd = command(rsh);
        cmd.arg(host).arg(line);
        let what = format!("{} {host} ckpt {}", rsh.display(), args.iter().map(|a| a.as_ref().to_string_lossy()).collect::<Vec<_>>().join(" "));
        Job::spawn_command(cmd, what, dir, tag, env, stdout)
    }

    /// [`Job::start`] as the user `(uid, gid)` instead of the run's ([`test_user`] or root).
    pub fn start_as<S: AsRef<OsStr>>(uid: u32, gid: u32, dir: &Path, args: &[S], stdout: &Path) -> Job {
        Job::start_with(None, Some((uid, gid)), dir, dir, args, &[], stdout)
    }

    fn start_with<S: AsRef<OsStr>>(
        netns: Option<&str>,
        as_user: Option<(u32, u32)>,
        dir: &Path,
        tag: &Path,
        args: &[S],
        env: &[(&str, &str)],
        stdout: &Path,
    ) -> Job {
        let args: Vec<OsString> = args.iter().map(os).collect();
        let what = format!("ckpt {}", args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "));
        let mut cmd = match (netns, as_user) {
            (None, Some((uid, gid))) => {
                let mut c = Command::new("setpriv");
                c.args([format!("--reuid={uid}"), format!("--regid={gid}"), "--init-groups".into(), "--".into()]).arg(ckpt_bin());
                c
            }
            (None, None) => command(ckpt_bin()),
            (Some(ns), _) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).args(user_prefix()).arg(ckpt_bin());
                if let Some(u) = test_user() {
                    c.env("HOME", &u.home).env("USER", &u.name).env("LOGNAME", &u.name);
                }
                c
            }
        };
        cmd.args(&args);
        Job::spawn_command(cmd, what, dir, tag, env, stdout)
    }

    /// Starts `cmd` (which runs `ckpt`), tagged, with `env`, stdout to `stdout` and stderr to
    /// `<stdout>.err`; `what` names it in reports.
    fn spawn_command(mut cmd: Command, what: String, dir: &Path, tag: &Path, env: &[(&str, &str)], stdout: &Path) -> Job {
        let stderr = err_path(stdout);
        let out = File::create(stdout).unwrap_or_else(|e| panic!("{}: {e}", stdout.display()));
        let err = File::create(&stderr).unwrap_or_else(|e| panic!("{}: {e}", stderr.display()));
        let child = cmd
            .env(TAG_VAR, tag_of(tag))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        Job { child, status: None, dir: dir.to_path_buf(), tag: tag.to_path_buf(), stdout: stdout.to_path_buf(), stderr, what }
    }

    /// The pid of the `ckpt` command.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the command has ended (reaping it), else `None`.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits for the command to end, at most [`JOB_TIMEOUT`].
    pub fn wait(&mut self) -> ExitStatus {
        self.wait_timeout(JOB_TIMEOUT)
    }

    /// Waits for the command to end; if it runs longer than `timeout`, kills the job and panics.
    pub fn wait_timeout(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            if start.elapsed() > timeout {
                self.kill();
                kill_job_processes(&self.tag);
                panic!("{} did not end within {timeout:?} (hung?)\n{}", self.what, self.report());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the job's stdout has the line `line` (e.g. `START`); panics if the command
    /// ends first or after `timeout`.
    pub fn wait_for_line(&mut self, line: &str, timeout: Duration) {
        self.wait_for_output(|out| has_line(out, line), &format!("{line:?}"), timeout);
    }

    /// Waits until the job's stdout has a line that starts with `prefix`; panics as
    /// [`wait_for_line`](Self::wait_for_line) does.
    pub fn wait_for_line_starting(&mut self, prefix: &str, timeout: Duration) {
        self.wait_for_output(|out| out.lines().any(|l| l.trim_start().starts_with(prefix)), &format!("a line starting {prefix:?}"), timeout);
    }

    /// Waits until `seen` holds of the job's stdout (`what` names it in the panic if the
    /// command ends first or after `timeout`).
    fn wait_for_output(&mut self, seen: impl Fn(&str) -> bool, what: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            if seen(&self.output()) {
                return;
            }
            if let Some(status) = self.try_wait() {
                panic!("{} ended ({status}) before printing {what}\n{}", self.what, self.report());
            }
            if start.elapsed() > timeout {
                panic!("{} did not print {what} within {timeout:?}\n{}", self.what, self.report());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `ckpt checkpoint --dir DIR --json EXTRA...` for this job, retried while it is not ready
    /// (panics at once if this job's command has ended).
    pub fn checkpoint(&mut self, extra: &[&str]) -> Value {
        let dir = self.dir.clone();
        let v = checkpoint_while(&dir, extra, || match self.try_wait() {
            Some(status) => Err(format!("{} ended ({status})\n{}", self.what, self.report())),
            None => Ok(()),
        });
        check_checkpoint_json(&v);
        v
    }

    /// Crashes the job: SIGKILL to the `ckpt` command, which must take the whole job with it;
    /// waits until no process of the job remains (panics if some survive).
    pub fn kill_launcher(&mut self) {
        let family = descendants(self.pid());
        self.kill();
        wait_gone(&self.tag, &family, KILL_TIMEOUT, &format!("SIGKILL was sent to `{}`", self.what));
    }

    /// After `ckpt checkpoint --kill` returned: waits (at most 10 s) for this command to end
    /// and (at most [`KILL_TIMEOUT`]) for every process of the job to go; panics otherwise.
    pub fn wait_killed(&mut self) -> ExitStatus {
        let family = descendants(self.pid());
        let status = self.wait_timeout(Duration::from_secs(10));
        wait_gone(&self.tag, &family, KILL_TIMEOUT, "`ckpt checkpoint --kill` returned");
        status
    }

    fn kill(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            self.status = Some(self.child.wait().expect("wait"));
        }
    }

    /// The job's stdout so far.
    pub fn output(&self) -> String {
        read_text(&self.stdout)
    }

    /// The job's stderr so far.
    pub fn errors(&self) -> String {
        read_text(&self.stderr)
    }

    /// The command, its status, and the tails of its stdout and stderr (for failure messages).
    pub fn report(&self) -> String {
        format!(
            "`{}` ({})\n--- stdout ({}):\n{}\n--- stderr:\n{}",
            self.what,
            self.status.map_or("still running".to_string(), describe_status),
            self.stdout.display(),
            tail(&self.stdout, 20),
            tail(&self.stderr, 30)
        )
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}

fn err_path(stdout: &Path) -> PathBuf {
    let mut s = stdout.as_os_str().to_os_string();
    s.push(".err");
    PathBuf::from(s)
}

/// Describes how a job ended: `exit N` or `signal N`.
pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => format!("{status}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Sandbox

/// A test's own temporary directory: the image directory `img/` (not created: `ckpt launch`
/// creates it), and any work directories and output files the test wants. On drop, kills every
/// process still running for its image directory (so a failed test leaves nothing behind).
pub struct Sandbox {
    tmp: tempfile::TempDir,
    /// The image directory, `<sandbox>/img`.
    pub dir: PathBuf,
}

impl Sandbox {
    /// A new sandbox; `name` prefixes the temporary directory's name (for debugging).
    pub fn new(name: &str) -> Sandbox {
        let tmp = tempfile::Builder::new().prefix(&format!("ckpt-test-{name}-")).tempdir().expect("create a temporary directory");
        give_to_user(tmp.path());
        let dir = tmp.path().join("img");
        Sandbox { tmp, dir }
    }

    /// A path inside the sandbox.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// A new (empty) directory inside the sandbox.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        give_to_user(&p);
        p
    }

    /// The tails of every `*.out` and `*.err` file in the sandbox (for failure messages).
    pub fn report(&self) -> String {
        let mut files: Vec<PathBuf> = fs::read_dir(self.tmp.path()).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        files.retain(|p| p.extension().is_some_and(|e| e == "out" || e == "err"));
        files.sort();
        files.iter().map(|p| format!("--- {}:\n{}\n", p.display(), tail(p, 20))).collect()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        kill_job_processes(&self.dir);
        if std::env::var_os("CKPT_TEST_KEEP").is_some() {
            eprintln!("CKPT_TEST_KEEP: keeping {}", self.tmp.path().display());
            self.tmp.disable_cleanup(true);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared resources

/// Held while a test uses what the suite's runs share on this machine and only one test at a
/// time may use (the one-node Slurm cluster): an exclusive lock on a file of the temporary
/// directory. scripts/test.sh runs the tests as root and as an ordinary user at once, two
/// processes whose harness is root in both: a lock inside one process would not keep them apart.
pub struct MachineWide {
    _locked: File,
}

/// A TCP port of this test process's own in the machine's network namespace (or a name for a
/// server's Unix socket): below the ephemeral range, where no socket bound to port 0 lands, and
/// apart from another run's (the suite runs as root and as a user at once); `k` tells a test's
/// ports apart.
pub fn port_of_this_run(k: u16) -> u16 {
    20000 + (std::process::id() % 5000) as u16 * 2 + k
}

/// Waits for and takes the machine-wide lock named `what` (see [`MachineWide`]).
pub fn machine_wide(what: &str) -> MachineWide {
    let path = std::env::temp_dir().join(format!("ckpt-tests-{what}.lock"));
    let file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    loop {
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return MachineWide { _locked: file };
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "flock {}: {e}", path.display());
    }
}

// ---------------------------------------------------------------------------------------------
// Reference runs and comparisons

/// Runs `argv` directly (not under ckpt), stdout to `stdout`, stderr to `<stdout>.err`, with
/// [`JOB_TIMEOUT`]; returns its output, or a message if it failed.
pub fn reference_run<S: AsRef<OsStr>>(argv: &[S], stdout: &Path) -> Result<String, String> {
    reference_run_with(command(argv[0].as_ref()), argv, stdout)
}

/// A [`reference_run`] in a thread of its own. The run takes as long as the program, so a test
/// starts it first and goes on with its job meanwhile; [`Reference::output`] waits for it.
pub struct Reference {
    run: Mutex<Option<thread::JoinHandle<Result<String, String>>>>,
    output: OnceLock<String>,
}

impl Reference {
    pub fn start<S: AsRef<OsStr>>(argv: &[S], stdout: &Path) -> Reference {
        let argv: Vec<OsString> = argv.iter().map(|a| a.as_ref().to_owned()).collect();
        let stdout = stdout.to_owned();
        let run = thread::spawn(move || reference_run(&argv, &stdout));
        Reference { run: Mutex::new(Some(run)), output: OnceLock::new() }
    }

    /// The run's output, once it ended; a failed run fails the test.
    pub fn output(&self) -> &str {
        self.output.get_or_init(|| {
            let run = self.run.lock().unwrap_or_else(|p| p.into_inner()).take().expect("a reference run");
            match run.join() {
                Ok(done) => done.unwrap_or_else(|e| panic!("the reference run: {e}")),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// The run's RESULT line; a run without one fails the test.
    pub fn result(&self) -> String {
        result_line(self.output()).unwrap_or_else(|| panic!("the reference run printed no RESULT line:\n{}", self.output()))
    }
}

/// [`reference_run`] of a command that the harness itself starts (as root, even when the jobs
/// run as a [`test_user`]): `ip netns exec NS <user_prefix()> PROG ...`.
pub fn reference_run_as_harness<S: AsRef<OsStr>>(argv: &[S], stdout: &Path) -> Result<String, String> {
    reference_run_with(Command::new(argv[0].as_ref()), argv, stdout)
}

fn reference_run_with<S: AsRef<OsStr>>(mut cmd: Command, argv: &[S], stdout: &Path) -> Result<String, String> {
    let out = File::create(stdout).map_err(|e| format!("{}: {e}", stdout.display()))?;
    let err_file = err_path(stdout);
    let err = File::create(&err_file).map_err(|e| format!("{}: {e}", err_file.display()))?;
    let what = argv.iter().map(|a| a.as_ref().to_string_lossy()).collect::<Vec<_>>().join(" ");
    if let Some(u) = test_user() {
        cmd.env("HOME", &u.home).env("USER", &u.name).env("LOGNAME", &u.name);
    }
    let mut child = cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(out).stderr(err).spawn().map_err(|e| format!("cannot run {what}: {e}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if start.elapsed() > JOB_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("reference run `{what}` did not end within {JOB_TIMEOUT:?}"));
        }
        thread::sleep(Duration::from_millis(20));
    };
    let text = read_text(stdout);
    if !status.success() {
        return Err(format!("reference run `{what}` failed ({})\n{text}\n{}", describe_status(status), read_text(&err_file)));
    }
    if result_line(&text).is_none() {
        return Err(format!("reference run `{what}` printed no RESULT line:\n{text}"));
    }
    Ok(text)
}

/// Inverts the byte at `fraction` of the chunk file `chunk`; returns its name.
pub fn damage_chunk(chunk: &Path, fraction: f64) -> String {
    let mut bytes = fs::read(chunk).unwrap_or_else(|e| panic!("{}: {e}", chunk.display()));
    let at = ((bytes.len() as f64 * fraction) as usize).min(bytes.len() - 1);
    bytes[at] ^= 0xff;
    fs::write(chunk, bytes).unwrap_or_else(|e| panic!("{}: {e}", chunk.display()));
    chunk.file_name().unwrap().to_string_lossy().into_owned()
}

/// Panics unless files `a` and `b` have the same contents (saying where they first differ).
pub fn assert_same_file(a: &Path, b: &Path) {
    let x = fs::read(a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    let y = fs::read(b).unwrap_or_else(|e| panic!("{}: {e}", b.display()));
    if x != y {
        let at = x.iter().zip(&y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
        panic!("{} ({} bytes) differs from {} ({} bytes) from byte {at} on", a.display(), x.len(), b.display(), y.len());
    }
}

/// Asserts that a restarted run did not run the program from its beginning (no `START` line).
/// A connection to a server outside the job (tests/progs/tcpunread.c) holding bytes the program
/// had not read: checkpointed with `--kill`, restarted (the connection comes back reset), the
/// program reads every byte, then the reset. `what` names the way the restart took.
pub fn unread_bytes_come_before_the_reset(what: &str) {
    use std::io::Write;
    let sb = Sandbox::new(what);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the server");
    let port = listener.local_addr().unwrap().port();
    // Sends the message, then holds the connection open until the test ends.
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        if let Ok((mut c, _)) = listener.accept() {
            let _ = c.write_all(b"sent before the checkpoint, read after the restart");
            held.push(c);
        }
        std::thread::sleep(Duration::from_secs(30));
        drop(held);
    });
    let mut launch = Job::launch(&sb.dir, &[os(prog("tcpunread")), os(port.to_string()), os("2")], &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    launch.checkpoint(&["--kill"]);
    launch.wait_killed();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = restarted.wait_timeout(Duration::from_secs(60));
    let out = restarted.output();
    assert!(status.success() && has_line(&out, "PASS"), "the restarted program did not read its bytes ({})\n{}", describe_status(status), restarted.report());
    assert!(has_line(&out, "AFTER RESET"), "the restarted program did not see the reset after its bytes\n{}", restarted.report());
    assert_not_rerun(&restarted);
    drop(server);
}

pub fn assert_not_rerun(job: &Job) {
    assert!(!has_line(&job.output(), "START"), "the program was run again from its start (its output has START)\n{}", job.report());
}

// ---------------------------------------------------------------------------------------------
// The canonical scenario

/// When the canonical scenario acts, relative to what it has seen.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// From `START` in the launched job's output to the first checkpoint.
    pub before_checkpoint: Duration,
    /// From the first checkpoint's commit to the crash (SIGKILL of the launcher).
    pub run_on: Duration,
    /// From spawning the first restart to `checkpoint --kill`.
    pub after_restart: Duration,
}

impl Timing {
    /// An MPI job (the ring of tests/progs/mpi_ring.c, 2 ranks): its launcher and ranks take
    /// longer to start and to settle after a restart than a single program.
    pub const MPI: Timing =
        Timing { before_checkpoint: Duration::from_millis(1500), run_on: Duration::from_millis(700), after_restart: Duration::from_millis(1000) };
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { before_checkpoint: Duration::from_millis(1000), run_on: Duration::from_millis(500), after_restart: Duration::from_millis(1000) }
    }
}

type ArgvFn = Box<dyn Fn(&Path) -> Vec<OsString> + Send + Sync>;

/// A program to run through the canonical scenario.
pub struct Case {
    /// A short name, used for the sandbox and messages.
    pub name: String,
    /// The command line, given the run's work directory (each run, reference or under ckpt,
    /// gets its own fresh one; the program may write files there).
    argv: ArgvFn,
    /// Files (relative to the work directory) that must end up equal to the reference run's.
    pub files: Vec<String>,
    /// Whether the program prints `PASS` (and must).
    pub expect_pass: bool,
    pub timing: Timing,
    /// Launch with `--protect WORK` (the run's work directory): for programs that change files
    /// there after the checkpoint, which a restart otherwise refuses.
    pub protect_work: bool,
    /// More options for `ckpt launch`.
    pub launch_options: Vec<String>,
    /// A check of the checkpoint directory, once its last generation is verified.
    pub check_image: Option<ImageCheck>,
    /// A path below the run's work directory where the machine mounts a tmpfs of its own
    /// between the crash and the first restart, kept until the test ends: what another job or
    /// an administrator mounts meanwhile below a directory the job binds (see
    /// [`Case::machine_mounts_below`]).
    pub machine_mount: Option<String>,
}

/// A check of a checkpoint directory (see [`Case::check_image`]).
pub type ImageCheck = Box<dyn Fn(&Path) + Send + Sync>;

impl Case {
    /// A case whose command line is `argv(work_dir)`; expects `PASS` by default.
    pub fn new(name: &str, argv: impl Fn(&Path) -> Vec<OsString> + Send + Sync + 'static) -> Case {
        Case {
            name: name.to_string(),
            argv: Box::new(argv),
            files: Vec::new(),
            expect_pass: true,
            timing: Timing::default(),
            protect_work: false,
            launch_options: Vec::new(),
            check_image: None,
            machine_mount: None,
        }
    }

    /// Between the crash and the first restart, the machine mounts a tmpfs at `rel` below the
    /// run's work directory (made if missing), unmounted when the test ends. Only the harness
    /// as root can; otherwise the scenario runs without it and says so.
    pub fn machine_mounts_below(mut self, rel: &str) -> Case {
        self.machine_mount = Some(rel.to_string());
        self
    }

    /// Also compare this file of the work directory with the reference run's.
    pub fn compare_file(mut self, rel: &str) -> Case {
        self.files.push(rel.to_string());
        self
    }

    /// Whether the program prints `PASS`.
    pub fn expect_pass(mut self, yes: bool) -> Case {
        self.expect_pass = yes;
        self
    }

    /// Launch with `--protect WORK`.
    pub fn protect_work(mut self) -> Case {
        self.protect_work = true;
        self
    }

    /// Launch with these options too.
    pub fn launch_options(mut self, options: &[&str]) -> Case {
        self.launch_options = options.iter().map(|o| o.to_string()).collect();
        self
    }

    /// Check the checkpoint directory with `check` after its last generation is verified.
    pub fn check_image(mut self, check: impl Fn(&Path) + Send + Sync + 'static) -> Case {
        self.check_image = Some(Box::new(check));
        self
    }

    pub fn timing(mut self, timing: Timing) -> Case {
        self.timing = timing;
        self
    }

    /// The command line for a work directory.
    pub fn argv(&self, work: &Path) -> Vec<OsString> {
        (self.argv)(work)
    }
}

/// Checks a finished run's output against the reference run's: exit 0, same RESULT, PASS if
/// expected and no FAIL line.
pub fn assert_matches_reference(case: &Case, job: &mut Job, reference: &str) {
    let status = job.wait();
    let out = job.output();
    assert!(status.success(), "{}: ended with {}\n{}", case.name, describe_status(status), job.report());
    let want = result_line(reference).expect("reference has a RESULT");
    match result_line(&out) {
        Some(got) => assert_eq!(got, want, "{}: RESULT differs from the reference run's\n{}", case.name, job.report()),
        None => panic!("{}: no RESULT line\n{}", case.name, job.report()),
    }
    if case.expect_pass {
        assert!(has_line(&out, "PASS"), "{}: no PASS line\n{}", case.name, job.report());
    }
    let fails = fail_lines(&out);
    assert!(fails.is_empty(), "{}: the program's self-checks failed: {fails:?}\n{}", case.name, job.report());
}

/// Runs `each` on every item at once, a thread each, and returns the results in the items'
/// order: for the rounds of a test that are independent of each other and mostly wait for their
/// programs. A round that panics fails the test with its own message.
pub fn at_once<T: Sync, R: Send>(items: &[T], each: impl Fn(&T) -> R + Sync) -> Vec<R> {
    thread::scope(|scope| {
        let rounds: Vec<_> = items.iter().map(|item| scope.spawn(|| each(item))).collect();
        rounds.into_iter().map(|round| round.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// The first half of a many-checkpoints scenario: the reference run, then the
/// launch, `rounds` checkpoints `pause` apart while it runs, and the check that it still runs.
/// Returns the reference run (going on beside the job, in a work directory of its own) and the
/// running launch (for the caller to crash).
pub fn launch_and_checkpoint_many(sb: &Sandbox, case: &Case, work: &Path, rounds: usize, pause: Duration) -> (Reference, Job) {
    let reference = Reference::start(&case.argv(&sb.mkdir("ref-work")), &sb.path("reference.out"));
    let mut launch = Job::launch(&sb.dir, &case.argv(work), &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    for _ in 0..rounds {
        launch.checkpoint(&[]);
        thread::sleep(pause);
    }
    assert!(launch.try_wait().is_none(), "{}: the job ended before the crash: make it run longer\n{}", case.name, launch.report());
    (reference, launch)
}

/// The second half of a many-checkpoints scenario, after the launch was crashed: restart,
/// `rounds` checkpoints `pause` apart, `--kill`, restart again and finish with the reference's
/// answer, neither restart running the job again from its start.
pub fn restart_checkpoint_kill_and_finish(sb: &Sandbox, case: &Case, reference: &str, rounds: usize, pause: Duration) {
    let mut first = Job::restart(&sb.dir, &sb.path("restart1.out"));
    thread::sleep(pause);
    for _ in 0..rounds {
        first.checkpoint(&[]);
        thread::sleep(pause);
    }
    first.checkpoint(&["--kill"]);
    first.wait_killed();
    assert_not_rerun(&first);

    let mut second = Job::restart(&sb.dir, &sb.path("restart2.out"));
    second.wait();
    assert_not_rerun(&second);
    assert_matches_reference(case, &mut second, reference);
}

/// A program caught in a passing state by a checkpoint (see `ckpt_core::Error::Passing`): it
/// prints `marker` once it is in that state and stays there until the file `go` exists. The
/// checkpoint (`--kill`) is asked for; once the launcher's log shows a try given up for a
/// reason that says `says`, `go` is made; the checkpoint must succeed with a later generation,
/// and the job restarted from it must finish with PASS and no FAIL.
pub fn caught_midway_then_restarted(sb: &Sandbox, argv: &[OsString], marker: &str, says: &str, go: &Path) {
    let mut launch = Job::launch(&sb.dir, argv, &sb.path("launch.out"));
    launch.wait_for_line(marker, Duration::from_secs(30));
    thread::scope(|scope| {
        let checkpoint = scope.spawn(|| try_checkpoint(&sb.dir, &["--kill"]));
        let start = Instant::now();
        while !launch.errors().contains("aborting the generation") {
            assert!(!checkpoint.is_finished(), "the checkpoint ended before the first try was given up\n{}", launch.report());
            assert!(start.elapsed() < Duration::from_secs(60), "no try was given up in a minute\n{}", launch.report());
            thread::sleep(Duration::from_millis(5));
        }
        assert!(launch.errors().contains(says), "the try was given up for another reason than {says:?}\n{}", launch.report());
        std::fs::write(go, b"").unwrap();
        let v = checkpoint.join().unwrap().unwrap_or_else(|out| panic!("the checkpoint was not tried again until it succeeded: {out}\n{}", launch.report()));
        assert!(check_checkpoint_json(&v) > 1, "the first try was not given up: {v}");
    });
    launch.wait_killed();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    restarted.wait();
    assert!(has_line(&restarted.output(), "PASS") && fail_lines(&restarted.output()).is_empty(), "{}", restarted.report());
}

/// The canonical scenario:
///
/// 1. reference run of the program, directly (in a thread, meanwhile);
/// 2. `ckpt launch`; wait for `START`, then `timing.before_checkpoint`;
/// 3. `ckpt checkpoint` (generation G1); let the job run on `timing.run_on`;
/// 4. SIGKILL the launcher (a crash; every process of the job must go);
/// 5. `ckpt restart`; after `timing.after_restart`, `ckpt checkpoint --kill` (G2 > G1);
/// 6. `ckpt verify` and `ckpt inspect` succeed on the image;
/// 7. `ckpt restart` again and let it finish;
/// 8. assert: exit 0, RESULT equal to the reference's, PASS (if expected), no FAIL, no `START` in
///    either restarted run's output, and the compared files equal the reference run's.
pub fn canonical_scenario(case: &Case) {
    let sb = Sandbox::new(&case.name);
    let ref_work = sb.mkdir("ref");
    let run_work = sb.mkdir("run");
    let ref_argv = case.argv(&ref_work);
    let run_argv = case.argv(&run_work);
    let ref_out = sb.path("reference.out");
    let dir = sb.dir.clone();

    thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&ref_argv, &ref_out));

        // launch, checkpoint, run on, crash
        let protect = run_work.to_string_lossy().into_owned();
        let mut options: Vec<&str> = if case.protect_work { vec!["--protect", &protect] } else { Vec::new() };
        options.extend(case.launch_options.iter().map(String::as_str));
        let mut launch = Job::launch_with(&dir, &options, &run_argv, &sb.path("launch.out"));
        launch.wait_for_line("START", Duration::from_secs(30));
        thread::sleep(case.timing.before_checkpoint);
        let g1_json = launch.checkpoint(&[]);
        let g1 = check_checkpoint_json(&g1_json);
        thread::sleep(case.timing.run_on);
        assert!(
            launch.try_wait().is_none(),
            "{}: the job ended before the crash (its first checkpoint took {} ms to be durable): make it run longer\n{}",
            case.name,
            g1_json.get("durable_ms").map_or_else(|| "?".to_string(), Value::to_string),
            launch.report()
        );
        launch.kill_launcher();
        let _machine_mount = case.machine_mount.as_ref().and_then(|rel| MachineMount::make(&run_work.join(rel)));

        // restart, checkpoint --kill
        let mut first = Job::restart(&dir, &sb.path("restart1.out"));
        thread::sleep(case.timing.after_restart);
        let misnamed = misnamed_after_restore(&dir);
        assert!(misnamed.is_empty(), "{}: restored processes lost their names: {misnamed:?}", case.name);
        let g2 = check_checkpoint_json(&first.checkpoint(&["--kill"]));
        assert!(g2 > g1, "{}: generation {g2} after {g1}", case.name);
        first.wait_killed();
        assert_not_rerun(&first);

        let v = verify(&dir);
        assert!(v.success(), "{}: ckpt verify failed on a healthy image: {v}", case.name);
        let i = inspect(&dir);
        assert!(i.success(), "{}: ckpt inspect failed: {i}", case.name);
        if let Some(check) = &case.check_image {
            check(&dir);
        }

        // restart again and finish
        let mut second = Job::restart(&dir, &sb.path("restart2.out"));
        second.wait();
        assert_not_rerun(&second);

        let reference = reference.join().expect("reference thread").unwrap_or_else(|e| panic!("{e}"));
        assert_matches_reference(case, &mut second, &reference);
        for f in &case.files {
            assert_same_file(&run_work.join(f), &ref_work.join(f));
        }
    });
}

/// A tmpfs the machine mounted (see [`Case::machine_mounts_below`]), lazily unmounted when
/// dropped, the test failed or not.
struct MachineMount(PathBuf);

impl MachineMount {
    fn make(at: &Path) -> Option<MachineMount> {
        if !is_root() {
            eprintln!("not root: no tmpfs mounted at {} by the machine before the restart", at.display());
            return None;
        }
        fs::create_dir_all(at).unwrap_or_else(|e| panic!("mkdir {}: {e}", at.display()));
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "machine"]).arg(at).status().expect("run mount");
        assert!(status.success(), "mount a tmpfs at {}: {status}", at.display());
        Some(MachineMount(at.to_path_buf()))
    }
}

impl Drop for MachineMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Reads a whole file into memory and writes it back with byte `at` inverted (damage).
pub fn flip_byte(path: &Path, at: u64) {
    let mut data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let at = at as usize;
    assert!(at < data.len(), "{} has only {} bytes", path.display(), data.len());
    data[at] ^= 0xff;
    let mut f = fs::OpenOptions::new().write(true).open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.sync_all().ok();
}

/// Every file under `dir` (recursively) whose parent directory is named `chunks` and whose
/// path has a `gen-*` component: the chunk files of an image.
pub fn chunk_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(p: &Path, in_gen: bool, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let path = e.path();
            let name = e.file_name();
            let gen = in_gen || name.to_string_lossy().starts_with("gen-");
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&path, gen, out),
                Ok(t) if t.is_file() && gen && p.file_name().is_some_and(|n| n == "chunks") => out.push(path),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, false, &mut out);
    out.sort();
    out
}

/// Cgroup directories the harness makes for one test's jobs to make cgroups in (tests of
/// `ckpt_core::objects::cgroups`): one below the harness's own cgroup in each hierarchy the
/// jobs' user may use, removed with everything made in them when dropped (once every process
/// of the test ended: a cgroup holding a process cannot be removed).
pub struct CgroupDirs {
    pub dirs: Vec<PathBuf>,
}

impl CgroupDirs {
    /// As root: cgroup v2 and the v1 hierarchies of the pids, cpu and memory controllers, where
    /// mounted. As the ordinary user ([`test_user`]) the directories are given to them
    /// (delegated, as systemd delegates a user's subtree): v1 hierarchies only, because cgroup
    /// v2 lets a process move only where its user may write the `cgroup.procs` of the common
    /// ancestor of where it is and where it goes, here the root cgroup.
    pub fn new(name: &str) -> CgroupDirs {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        // The harness's cgroup in a hierarchy, by its controllers in any order.
        let sorted = |list: &str| {
            let mut v: Vec<String> = list.split(',').map(str::to_string).collect();
            v.sort();
            v
        };
        let place = |hierarchy: &str| {
            own.lines().find_map(|l| {
                let mut fields = l.splitn(3, ':');
                let (_, h, path) = (fields.next()?, fields.next()?, fields.next()?);
                (sorted(h) == sorted(hierarchy)).then(|| path.to_string())
            })
        };
        let mut wanted: Vec<(String, String)> = Vec::new(); // (hierarchy, mount point)
        for line in mountinfo.lines() {
            let (head, tail) = line.split_once(" - ").unwrap();
            let at = head.split(' ').nth(4).unwrap().to_string();
            let mut tail = tail.split(' ');
            let (fstype, options) = (tail.next().unwrap(), tail.nth(1).unwrap_or(""));
            let root = head.split(' ').nth(3).unwrap();
            if root != "/" {
                continue; // a mount of part of a hierarchy: not this test's concern
            }
            if fstype == "cgroup2" && test_user().is_none() {
                wanted.push((String::new(), at));
            } else if fstype == "cgroup" {
                let controllers: Vec<&str> = options.split(',').filter(|o| ["pids", "cpu", "memory", "cpuacct"].contains(o)).collect();
                if controllers.iter().any(|c| *c != "cpuacct") {
                    wanted.push((controllers.join(","), at));
                }
            }
        }
        let mut dirs = Vec::new();
        for (hierarchy, at) in wanted {
            let Some(path) = place(&hierarchy) else { continue };
            if dirs.iter().any(|d: &PathBuf| d.starts_with(&at)) {
                continue;
            }
            let dir = Path::new(&at).join(path.trim_start_matches('/')).join(format!("ckpt-test-{}-{name}", std::process::id()));
            fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            if let Some(user) = test_user() {
                for file in [dir.clone(), dir.join("cgroup.procs"), dir.join("tasks")] {
                    std::os::unix::fs::chown(&file, Some(user.uid), Some(user.gid)).unwrap_or_else(|e| panic!("chown {}: {e}", file.display()));
                }
            }
            dirs.push(dir);
        }
        assert!(!dirs.is_empty(), "no cgroup hierarchy here where the jobs' user may make cgroups");
        CgroupDirs { dirs }
    }
}

impl CgroupDirs {
    /// Removes every cgroup made in the directories (not the directories), as a reboot would:
    /// once the processes in them ended (a few seconds at most).
    pub fn remove_below(&self) {
        for dir in &self.dirs {
            for entry in fs::read_dir(dir).unwrap().flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let start = std::time::Instant::now();
                while let Err(e) = remove_cgroup_tree(&entry.path()) {
                    assert!(start.elapsed() < std::time::Duration::from_secs(10), "cgroup {} still busy after 10 s: {e}", entry.path().display());
                    thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
    }
}

/// Removes cgroup `dir` and every cgroup below it.
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}

impl Drop for CgroupDirs {
    fn drop(&mut self) {
        for dir in &self.dirs {
            if let Err(e) = remove_cgroup_tree(dir) {
                eprintln!("cgroup {} left: {e}", dir.display());
            }
        }
    }
}

/// Whether a job runs in `dir` and the generations committed there, as `ckpt status --json`
/// reports them. A status without the list fails the test (it would read as "none committed",
/// which some tests expect at first).
pub fn status_generations(dir: &Path) -> (bool, Vec<u64>) {
    let out = ckpt(&[os("status"), os("--dir"), os(dir), os("--json")]);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("status --json: {e}: {out}"));
    let list = v["generations"].as_array().unwrap_or_else(|| panic!("status --json has no list of generations: {out}"));
    let generations = list.iter().map(|g| g.as_u64().unwrap_or_else(|| panic!("status --json: generation {g} is not a number: {out}"))).collect();
    (v["running"] == serde_json::Value::Bool(true), generations)
}

/// The generations `ckpt status` reports as committed in `dir` ([`status_generations`]).
pub fn committed(dir: &Path) -> Vec<u64> {
    status_generations(dir).1
}
