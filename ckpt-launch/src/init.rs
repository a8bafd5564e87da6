//! The job's init: pid 1 of the job's PID namespace. It starts the program (launch) or creates
//! the empty processes the restorer turns into the program's (restart), reaps every orphan, and
//! reports the main process's end to the launcher.
//!
//! When the main process ends, the processes still in its session or in the init's end with it,
//! as a terminal's session ends with its shell; those that left for a session of their own
//! (daemons: a server that forks, calls setsid and lets its parent exit) keep the job going, as
//! they would go on without ckpt. With `--until all` every process left keeps the job going,
//! whatever its session. The init then says `main-ended ...` and reports the main process's
//! end once the last of them has ended.
//!
//! It talks to the launcher over an inherited socket, one text line per message:
//! init → launcher, first: `ready` (set up: the launcher reads the mount table); launcher → init:
//! `start` (launch: start the program now), `clocks <monotonic ns> <boottime ns>` (restart, before any `spawn`: the
//! processes it creates from now on are in a new time namespace with these offsets, see
//! `ckpt_core::objects::timens`), `spawn <pid>` (restart: create an empty process with that
//! pid), `main <pid>` (the process whose end ends the job), `main-ended exited|killed <n>` (the
//! main process had ended, the job runs on with its daemons); init → launcher: `clocks set`,
//! `started <pid>`, `spawned <pid>`, `error <text>`, `main-ended exited|killed <n>`, `exited
//! <code>`, `killed <signal>`.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use ckpt_core::objects::timens::{self, Offsets};
use ckpt_core::sys::process;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::Until;

pub enum Mode {
    /// Run PROG ARGS as the job's main process.
    Launch(Vec<String>),
    /// Wait for `spawn` and `main` commands.
    Restart,
}

pub fn run(control_fd: RawFd, mode: Mode, until: Until) -> ! {
    // SAFETY: taking ownership of an inherited descriptor cannot be checked: the launcher put
    // the control socket at this number for our exclusive use.
    let control = unsafe { UnixStream::from_raw_fd(control_fd) };
    // The job must not inherit it.
    let _ = fcntl(&control, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    let code = match init_main(control, mode, until) {
        Ok(()) => 0,
        Err(e) => {
            say!("ckpt init: {e}");
            1
        }
    };
    std::process::exit(code)
}

fn init_main(control: UnixStream, mode: Mode, until: Until) -> std::io::Result<()> {
    // The job dies with its launcher. (getppid() cannot tell whether the launcher is already
    // gone: our parent is outside our PID namespace, so it always reads 0.)
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // The launcher blocks the signals it forwards; the job must not inherit that.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    // A /proc of our own PID namespace, so that /proc/<getpid()> means the job's own process.
    let _ = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>);
    if let Err(e) = mount(Some("proc"), "/proc", Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>) {
        say!("ckpt init: cannot mount /proc for the job ({e}); /proc shows the host's pids");
    }
    let _ = nix::unistd::setsid();

    let mut reader = BufReader::new(control.try_clone()?);
    let mut out = control;
    // The launcher reads our mount table now, as the job's baseline.
    writeln!(out, "ready")?;
    let main_pid = match mode {
        Mode::Launch(argv) => {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 || line.trim_end() != "start" {
                return Ok(()); // launcher gone, or it gave up
            }
            let pid = start_program(&argv)?;
            writeln!(out, "started {pid}")?;
            pid
        }
        Mode::Restart => loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(()); // launcher gone
            }
            match Command::parse(&line) {
                Some(Command::Clocks(offsets)) => match timens::enter_for_children(&offsets) {
                    Ok(()) => writeln!(out, "clocks set")?,
                    Err(e) => writeln!(out, "error {e}")?,
                },
                // A process with exactly `pid`, which waits to be seized and rebuilt by the restorer.
                Some(Command::Spawn(pid)) => match process::spawn_idle_at(pid) {
                    Ok(()) => writeln!(out, "spawned {pid}")?,
                    Err(e) => writeln!(out, "error cannot create pid {pid}: {e}")?,
                },
                Some(Command::Main(pid)) => break pid,
                Some(Command::MainEnded(end)) => {
                    reap_all();
                    writeln!(out, "{end}")?;
                    return Ok(());
                }
                None => writeln!(out, "error unknown command {line:?}")?,
            }
        },
    };
    reap_until_main_ends(main_pid, until, &mut out)
}

/// A message from the launcher, in restart mode.
enum Command {
    /// The processes created from now on are in a new time namespace with these offsets.
    Clocks(Offsets),
    /// Create an empty process with this pid.
    Spawn(i32),
    /// This process's end ends the job.
    Main(i32),
    /// The main process had ended (`exited N` or `killed N`): the job ends with the last of its
    /// processes.
    MainEnded(String),
}

impl Command {
    fn parse(line: &str) -> Option<Command> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["clocks", monotonic, boottime] => Some(Command::Clocks(Offsets { monotonic_ns: monotonic.parse().ok()?, boottime_ns: boottime.parse().ok()? })),
            ["spawn", pid] => Some(Command::Spawn(pid.parse().ok()?)),
            ["main", pid] => Some(Command::Main(pid.parse().ok()?)),
            ["main-ended", how @ ("exited" | "killed"), n] => Some(Command::MainEnded(format!("{how} {}", n.parse::<i32>().ok()?))),
            _ => None,
        }
    }
}

fn start_program(argv: &[String]) -> std::io::Result<i32> {
    let cargs: Vec<CString> = argv.iter().map(|a| CString::new(a.as_bytes()).expect("argv has no NUL")).collect();
    // SAFETY: init is single-threaded, so the child may allocate (its messages, execvp's
    // arguments) before it execs. fork is unsafe by nature, wherever it is called: what the
    // child may do is the caller's to answer for.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            // Ignored signals stay ignored across exec; Rust ignores SIGPIPE, a program expects it.
            process::default_action(libc::SIGPIPE);
            // In the job's own user namespace init holds its capabilities; the program must
            // not (as root, execve gives root's back).
            if let Err(e) = ckpt_core::userns::drop_all_caps() {
                say!("ckpt: cannot drop the init's capabilities before running {}: {e}", argv[0]);
                std::process::exit(127);
            }
            let err = nix::unistd::execvp(&cargs[0], &cargs).unwrap_err();
            say!("ckpt: cannot run {}: {err}", argv[0]);
            std::process::exit(127);
        }
        nix::unistd::ForkResult::Parent { child } => Ok(child.as_raw()),
    }
}

fn reap_until_main_ends(main_pid: i32, until: Until, out: &mut UnixStream) -> std::io::Result<()> {
    let end = loop {
        // __WALL: also the orphans whose end signals nobody, such as a copy a checkpoint forked
        // (`ckpt_core::capture::later`) whose parent ended before the copy was done with.
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == Pid::from_raw(main_pid) => break format!("exited {code}"),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == Pid::from_raw(main_pid) => break format!("killed {}", sig as i32),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::ECHILD) => {
                writeln!(out, "exited 0")?;
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
    };
    // What is left in the main process's session or the init's ends with it (unless the job
    // runs until all have ended); daemons go on. All of them are stopped before any is killed:
    // killed one by one, one could see another's end first (the end of file of a pipe whose
    // writer was killed) and act on it before its own end came.
    let mut stopped = std::collections::HashSet::new();
    let daemons = loop {
        let (daemons, others) = left_behind(main_pid, until);
        let new: Vec<i32> = others.into_iter().filter(|pid| stopped.insert(*pid)).collect();
        if new.is_empty() {
            break daemons;
        }
        // Stopped, a process runs nothing more of its own; one forked meanwhile is found by
        // the next look.
        for pid in new {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        }
    };
    for &pid in &stopped {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    if !daemons.is_empty() {
        writeln!(out, "main-ended {end}")?;
    }
    reap_all();
    writeln!(out, "{end}")?;
    Ok(())
}

/// Reaps every child, the orphans it inherits meanwhile too, until none is left.
fn reap_all() {
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The job's processes left when its main process `main_pid` has ended (the init's /proc is
/// the job's): those that run on (in sessions of their own, daemons; with `Until::All`, every
/// one), and the others (in the init's session, 1, or the main process's).
fn left_behind(main_pid: i32, until: Until) -> (Vec<i32>, Vec<i32>) {
    let mut daemons = Vec::new();
    let mut others = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if pid == 1 {
            continue;
        }
        let Some(sid) = std::fs::read_to_string(entry.path().join("stat")).ok().and_then(|s| session_of_stat(&s)) else { continue };
        if until == Until::All || is_daemon_session(sid, main_pid) {
            daemons.push(pid);
        } else {
            others.push(pid);
        }
    }
    (daemons, others)
}

/// Whether a process of session `sid` outlives the main process `main_pid`: it left both the
/// init's session and the main process's (pure).
fn is_daemon_session(sid: i32, main_pid: i32) -> bool {
    sid != 1 && sid != main_pid && sid != 0
}

/// The session field of a /proc/PID/stat line (pure).
fn session_of_stat(stat: &str) -> Option<i32> {
    // pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
    stat.rsplit_once(") ")?.1.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_launchers_commands() {
        let offsets = |line| match Command::parse(line) {
            Some(Command::Clocks(o)) => Some((o.monotonic_ns, o.boottime_ns)),
            _ => None,
        };
        assert_eq!(offsets("clocks -6000000000 12\n"), Some((-6_000_000_000, 12)));
        assert_eq!(offsets("clocks 1"), None);
        assert!(matches!(Command::parse("spawn 42\n"), Some(Command::Spawn(42))));
        assert!(matches!(Command::parse("main 2"), Some(Command::Main(2))));
        assert!(matches!(Command::parse("main-ended exited 3\n"), Some(Command::MainEnded(e)) if e == "exited 3"));
        assert!(matches!(Command::parse("main-ended killed 9"), Some(Command::MainEnded(e)) if e == "killed 9"));
        assert!(Command::parse("main-ended gone 9").is_none());
        assert!(Command::parse("spawn 42 43").is_none());
        assert!(Command::parse("spawn x").is_none());
    }

    #[test]
    fn daemons_are_those_that_left_both_sessions() {
        assert_eq!(session_of_stat("42 (a) b (c)) S 1 40 40 0 -1"), Some(40));
        assert_eq!(session_of_stat("7 (x) R 2 7 1 0"), Some(1));
        assert!(is_daemon_session(40, 2));
        assert!(!is_daemon_session(1, 2), "in the init's session");
        assert!(!is_daemon_session(2, 2), "in the main process's own session");
    }
}
