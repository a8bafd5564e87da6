//! Copying memory after the release, so that the time a checkpoint freezes the job does not grow
//! with its memory.
//!
//! While the job is frozen, each process forks a copy of itself by an injected `clone`: the copy
//! shares the process's private memory copy-on-write, as it is at the freeze, and from then on
//! the kernel copies a page the job writes before the write lands. The copy closes every
//! descriptor at once (the job must not find a pipe or socket kept open by it), makes itself a
//! session of its own (a signal to its process's group must not end it) and waits in `pause(2)`
//! with every signal blocked, never running the program's code. The job is released;
//! a thread of the agent reads each copy's memory into its process's stream, then kills the copy
//! and has the process reap it by an injected `wait4` (one thread stopped for a moment), so that
//! the job never sees a child it did not make.
//!
//! Why a fork, not userfaultfd write-protection (docs/PLAN-INSTANT.md): a write-protect context
//! that also catches the kernel's own writes into the job's memory (a `read(2)` into a protected
//! page) needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd = 1, which ordinary users on
//! clusters do not have. A fork needs nothing, and copy-on-write is copy-before-write done by the
//! kernel.
//!
//! Copied while frozen all the same: shared memory (the job goes on writing it), MADV_DONTFORK
//! and MADV_WIPEONFORK mappings (`memory::can_copy_later`), and all the memory of a process the
//! fork is not made for (below: `refusal`) or refused to (RLIMIT_NPROC, strict overcommit).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::{hold_for_injection, let_go, task_alive, vdso_syscall_insn, wait_for_stop, FrozenThread, Stopped};
use crate::error::{Error, Result};
use crate::objects::memory::{self, CopiedVma, DeferredVma};
use crate::pool::StreamWriter;
use crate::procfs;
use crate::ptrace::regs::Regs;
use crate::ptrace::{sys, Injector, Tid};

/// A copy of a process forked at the freeze, waiting in `pause(2)`.
pub struct Snapshot {
    /// The process it is a copy of (as the agent sees pids).
    parent: Tid,
    /// The copy, as the agent sees it and as its parent does (inside the job's PID namespace).
    child: Tid,
    child_in_job: Tid,
    ended: bool,
}

/// Why a process's memory is copied while frozen rather than from a fork, if it is.
fn refusal(pid: Tid) -> Result<Option<&'static str>> {
    let status = procfs::status(pid)?;
    // A filter might answer the injected clone with death; without one nothing can.
    if status.seccomp.unwrap_or(0) != 0 {
        return Ok(Some("it runs under a seccomp filter"));
    }
    Ok(None)
}

impl Snapshot {
    /// The process it is a copy of.
    pub fn parent(&self) -> Tid {
        self.parent
    }

    /// Forks a copy of process `pid`, whose stopped main thread `inj` drives (every thread of the
    /// process stopped, every signal blocked). `None`, logged, when the fork is not made or
    /// refused: the process's memory is then copied while frozen.
    pub fn take(pid: Tid, inj: &mut Injector, syscall_insn: u64) -> Result<Option<Snapshot>> {
        if let Some(why) = refusal(pid)? {
            debug!(pid, why, "memory copied while frozen");
            return Ok(None);
        }
        // The new task is reported to us, stopped, before it runs a single instruction.
        sys::set_options(inj.tid(), sys::PTRACE_O_TRACESYSGOOD | sys::PTRACE_O_TRACECLONE)?;
        // No flags: a new process sharing nothing, whose end signals nobody (exit signal 0): the
        // job gets no SIGCHLD for it, and wait(2) without __WALL does not see it.
        let made = inj.raw(libc::SYS_clone, &[0, 0, 0, 0, 0]);
        let options_back = sys::set_options(inj.tid(), sys::PTRACE_O_TRACESYSGOOD);
        let made = made?;
        let new_tasks = inj.take_new_tasks();
        options_back?;
        if made < 0 {
            let e = std::io::Error::from_raw_os_error(-made as i32);
            info!(pid, "memory copied while frozen: the process could not fork a copy of itself ({e})");
            return Ok(None);
        }
        let child = *new_tasks.first().ok_or_else(|| Error::Other(format!("pid {pid}: a fork at the freeze was not reported to the tracer")))?;
        let mut snapshot = Snapshot { parent: pid, child, child_in_job: made as Tid, ended: false };
        if let Err(e) = park_child(child, syscall_insn) {
            snapshot.end_frozen(inj);
            return Err(e);
        }
        debug!(pid, copy = child, "forked a copy to read the memory from after the release");
        Ok(Some(snapshot))
    }

    /// The copy's pid, to read its memory.
    pub fn pid(&self) -> Tid {
        self.child
    }

    /// Ends the copy while its parent is still stopped, driven by `inj`.
    fn end_frozen(&mut self, inj: &mut Injector) {
        self.ended = true;
        kill(self.child);
        // Still traced (this failed before the detach) or not: either way it must be dead before
        // its parent can reap it.
        let _ = sys::wait(self.child);
        wait_until_dead(self.child);
        if let Err(e) = reap_with(inj, self.child_in_job) {
            warn!(pid = self.parent, copy = self.child, "reaping the copy of the process: {e}");
        }
    }

    /// Ends the copy once the job runs again: kills it and has its parent reap it.
    pub fn end(mut self) {
        self.end_running();
    }

    fn end_running(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        kill(self.child);
        wait_until_dead(self.child);
        if let Err(e) = reap_in(self.parent, self.child, self.child_in_job) {
            warn!(pid = self.parent, copy = self.child, "reaping the copy of the process forked at the checkpoint: {e}");
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.end_running();
    }
}

/// Readies a just-forked copy: waits for its first stop, closes its descriptors, points it at
/// `pause(2)` and lets it go.
fn park_child(child: Tid, syscall_insn: u64) -> Result<()> {
    loop {
        match sys::wait(child)? {
            sys::StopKind::EventStop(_) | sys::StopKind::Signal(libc::SIGSTOP) => break,
            sys::StopKind::Exited(_) | sys::StopKind::Killed(_) => return Err(Error::Other(format!("the copy {child} forked at the freeze ended at once"))),
            _ => sys::resume(child, 0)?,
        }
    }
    let mut inj = Injector::new(child, syscall_insn)?;
    let closed = inj.raw(libc::SYS_close_range, &[0, u32::MAX as u64, 0])?;
    if closed == -(libc::ENOSYS as i64) {
        // Before Linux 5.9: one by one.
        for fd in procfs::fds(child)? {
            inj.call("close", libc::SYS_close, &[fd as u64])?;
        }
    } else if closed < 0 {
        return Err(std::io::Error::from_raw_os_error(-closed as i32).into());
    }
    // A session and process group of its own: a signal the job sends to its process's group
    // (a shell's `kill 0`, an MPI launcher ending its ranks, a terminal's SIGHUP) must not kill
    // the copy, whose memory the checkpoint still needs. (A fresh fork is never a group
    // leader, so setsid cannot fail with EPERM.)
    inj.call("setsid", libc::SYS_setsid, &[])?;
    // Every signal stays blocked (the mask it inherited from the frozen thread): pause never
    // returns, and the instruction after it is never reached.
    let mut regs: Regs = *inj.base();
    regs.rip = syscall_insn;
    regs.rax = libc::SYS_pause as u64;
    regs.orig_rax = u64::MAX;
    inj.abandon();
    regs.write(child)?;
    sys::detach(child, 0)?;
    Ok(())
}

fn kill(pid: Tid) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// Waits (at most a few seconds) until process `pid` is a zombie or gone.
fn wait_until_dead(pid: Tid) {
    let start = Instant::now();
    while task_alive(pid, pid) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Has `parent` reap its dead child `child_in_job` by an injected wait4, driven by `inj`.
fn reap_with(inj: &mut Injector, child_in_job: Tid) -> Result<()> {
    for _ in 0..1000 {
        let r = inj.raw(libc::SYS_wait4, &[child_in_job as u64, 0, (libc::__WALL | libc::WNOHANG) as u64, 0])?;
        match r {
            // Reaped, or no longer a child (reaped by the job itself with __WALL).
            r if r == child_in_job as i64 || r == -(libc::ECHILD as i64) => return Ok(()),
            0 => std::thread::sleep(Duration::from_millis(1)),
            r if r == -(libc::EINTR as i64) => {}
            r => return Err(std::io::Error::from_raw_os_error(-r as i32).into()),
        }
    }
    Err(Error::Other(format!("its copy {child_in_job} did not end")))
}

/// Has the running process `parent` reap the dead copy: stops one of its threads for a moment
/// (as the freeze does), injects wait4, lets it go. Nothing to do when the copy is no longer
/// its child: the parent ended and the job's init reaps it.
fn reap_in(parent: Tid, child: Tid, child_in_job: Tid) -> Result<()> {
    match procfs::stat(child) {
        Ok(s) if s.ppid == parent => {}
        _ => return Ok(()),
    }
    let syscall_insn = vdso_syscall_insn(parent)?;
    for tid in procfs::tasks(parent)? {
        if sys::seize(tid, sys::PTRACE_O_TRACESYSGOOD).is_err() {
            continue;
        }
        sys::interrupt(tid)?;
        let mut thread = match wait_for_stop(tid)? {
            Stopped::Held { held, .. } => FrozenThread { tid, sigmask: None, held },
            Stopped::Gone => continue,
        };
        let reaped = hold_for_injection(&mut thread).and_then(|()| {
            let mut inj = Injector::new(tid, syscall_insn)?;
            let reaped = reap_with(&mut inj, child_in_job);
            inj.finish()?;
            reaped
        });
        let released = let_go(&thread);
        reaped?;
        released?;
        return Ok(());
    }
    Err(Error::Other(format!("no thread of pid {parent} could be stopped to reap its copy {child}")))
}

/// A process whose private memory is copied after the release: its stream, parked; the
/// mappings to copy; and the copy forked at the freeze to read them from.
pub struct LaterCopy {
    /// Inside the job's PID namespace, as its record names it.
    pub pid_in_job: Tid,
    pub stream: StreamWriter,
    pub deferred: Vec<DeferredVma>,
    pub snapshot: Snapshot,
}

/// What the capture leaves for after the release: the copies to make, and the forks of
/// processes whose capture failed after the fork, only to be ended.
#[derive(Default)]
pub struct AfterRelease {
    pub copies: Vec<LaterCopy>,
    pub to_end: Vec<Snapshot>,
}

/// What a [`LaterCopy`] stored: runs by mapping index, and the stream's final length.
pub struct Copied {
    pub pid_in_job: Tid,
    pub vmas: Vec<CopiedVma>,
    pub stream_len: u64,
}

impl LaterCopy {
    fn run(mut self, cancelled: &dyn Fn() -> bool) -> Result<Copied> {
        let parent = self.snapshot.parent;
        let copy = self.snapshot.pid();
        let vmas = memory::copy_deferred(copy, &self.deferred, &mut self.stream, cancelled).map_err(|e| {
            let problem = if task_alive(copy, copy) {
                e.to_string()
            } else {
                // Only SIGKILL ends it (every other signal is blocked), and only the job's end
                // (its PID namespace's init ending) or a signal to its own pid reaches it.
                let ended = if task_alive(parent, parent) { "" } else { " (the process has ended too: the job ending ends it)" };
                format!("the copy of its memory forked at the freeze (pid {copy}) was killed before it was read{ended}")
            };
            Error::LaterCopy { pid: parent, problem }
        })?;
        let stream_len = self.stream.offset();
        self.stream.finish()?;
        self.snapshot.end();
        Ok(Copied { pid_in_job: self.pid_in_job, vmas, stream_len })
    }
}

/// The copies one checkpoint makes after the release, one process after another (a stream
/// open at a time, so that the pool's chunks go round).
#[derive(Default)]
pub struct Pending {
    copies: Vec<LaterCopy>,
}

impl Pending {
    pub fn new(copies: Vec<LaterCopy>) -> Pending {
        Pending { copies }
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// Starts copying on a thread of its own.
    pub fn start(self) -> Copying {
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("ckpt-later-copy".into())
            .spawn(move || {
                test_pause();
                let t0 = Instant::now();
                let processes = self.copies.len();
                let mut out = Vec::with_capacity(processes);
                let mut copies = self.copies.into_iter();
                for copy in copies.by_ref() {
                    out.push(copy.run(&|| flag.load(Ordering::Relaxed))?);
                }
                let bytes: u64 = out.iter().map(|c| c.vmas.iter().flat_map(|v| &v.runs).map(|r| r.pages).sum::<u64>()).sum::<u64>() * crate::PAGE_SIZE;
                info!(processes, bytes, ms = t0.elapsed().as_secs_f64() * 1e3, "memory copied after the release");
                Ok(out)
            })
            .expect("spawn a thread");
        Copying { handle: Some(handle), cancel }
    }
}

/// For the tests: `CKPT_TEST_LATER_PAUSE_MS` makes the copies start that long after the release,
/// a window in which a test does to the running job what a job may do while its memory is
/// being copied (end a process group).
fn test_pause() {
    if let Some(ms) = crate::testhooks::var("CKPT_TEST_LATER_PAUSE_MS").and_then(|v| v.parse::<u64>().ok()) {
        warn!(ms, "CKPT_TEST_LATER_PAUSE_MS: the copies after the release wait");
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Copies under way after the release.
pub struct Copying {
    handle: Option<std::thread::JoinHandle<Result<Vec<Copied>>>>,
    cancel: Arc<AtomicBool>,
}

impl Copying {
    /// Waits for every copy; their runs and stream lengths.
    pub fn wait(mut self) -> Result<Vec<Copied>> {
        let handle = self.handle.take().expect("waited once");
        handle.join().map_err(|_| Error::Other("the thread copying memory after the release panicked".into()))?
    }
}

impl Drop for Copying {
    /// A checkpoint given up on: stop copying, end the copies.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.cancel.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
    }
}

/// Puts what the copies stored into the records of their processes: the runs of the deferred
/// mappings and the streams' final lengths.
pub fn fill_in(processes: &mut [crate::objects::ProcessRecord], copied: Vec<Copied>) -> Result<()> {
    for c in copied {
        let p = processes
            .iter_mut()
            .find(|p| p.pid == c.pid_in_job)
            .ok_or_else(|| Error::Bug(format!("memory copied after the release for pid {}, which has no record", c.pid_in_job)))?;
        for copied in c.vmas {
            let index = copied.index;
            let vma = p.vmas.get_mut(index).ok_or_else(|| Error::Bug(format!("pid {}: no mapping {index} to copy into", c.pid_in_job)))?;
            vma.runs = copied.runs;
            vma.earlier = copied.earlier;
        }
        p.stream_len = c.stream_len;
    }
    Ok(())
}
