//! Signal state: handlers (per process), pending signals (per thread and process-wide), blocked
//! masks and alternate stacks (per thread; see [`super::thread`]).

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{sys, Injector, Scratch, Tid};

/// The kernel's `struct sigaction` as rt_sigaction(2) takes it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct SigactionRecord {
    pub signo: i32,
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

impl SigactionRecord {
    fn to_bytes(self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, v) in [self.handler, self.flags, self.restorer, self.mask].iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn from_bytes(signo: i32, b: &[u8]) -> SigactionRecord {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        SigactionRecord { signo, handler: word(0), flags: word(1), restorer: word(2), mask: word(3) }
    }

    fn is_default(&self) -> bool {
        self.handler == 0 && self.flags == 0 && self.mask == 0
    }
}

/// A queued signal, as the raw 128-byte siginfo the kernel reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PendingSignal(pub Vec<u8>);

impl PendingSignal {
    pub fn signo(&self) -> i32 {
        // A siginfo shorter than its first field (refused by validation) reads as no signal.
        self.0.get(0..4).and_then(|b| b.try_into().ok()).map_or(0, i32::from_le_bytes)
    }

    /// The POSIX timer whose expiry queued it (si_code SI_TIMER; its id in si_timerid), if one
    /// did.
    pub fn timer(&self) -> Option<i32> {
        const SI_TIMER: i32 = -2;
        let word = |at: usize| self.0.get(at..at + 4).and_then(|b| b.try_into().ok()).map(i32::from_le_bytes);
        (word(8)? == SI_TIMER).then(|| word(12)).flatten()
    }

    /// The signal that stopped a process (its group stop: SIGSTOP, or a terminal's SIGTSTP,
    /// SIGTTIN, SIGTTOU), as kill(2) sends it (SI_USER, from no process of the job): how a
    /// stopped process is recorded. A restart delivers it at the release (SIGSTOP sent then,
    /// the others queued and unblocked then), and the process stops again by the same signal,
    /// as its parent's wait reports. A terminal's stop signal stopped it, so its action was the
    /// default and it was not blocked; its process group was not orphaned (the kernel drops
    /// those signals there), and the restart keeps the groups as they were.
    pub fn stop(signo: i32) -> PendingSignal {
        let mut info = vec![0u8; SIGINFO_LEN];
        info[0..4].copy_from_slice(&signo.to_le_bytes());
        PendingSignal(info)
    }
}

/// Bytes of a siginfo.
const SIGINFO_LEN: usize = 128;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalsRecord {
    /// Handlers that are not the default.
    pub actions: Vec<SigactionRecord>,
    /// Signals pending for the whole process.
    pub shared_pending: Vec<PendingSignal>,
}

impl SignalsRecord {
    /// Whether the process stops as it is released: it was stopped at the checkpoint, or a
    /// SIGSTOP was on its way.
    pub fn stops(&self) -> bool {
        self.shared_pending.iter().any(|s| s.signo() == libc::SIGSTOP)
    }
}

const SIGSET_SIZE: u64 = 8;
const NSIG: i32 = 64;
/// The kernel's struct sigaction (handler, flags, restorer, mask).
const ACTION_LEN: usize = 32;

fn catchable() -> impl Iterator<Item = i32> {
    (1..=NSIG).filter(|&s| s != libc::SIGKILL && s != libc::SIGSTOP)
}

/// The handler reads [`capture`] takes the answers of, by signal.
pub struct ActionsAsked(Vec<(i32, Asked)>);

/// Asks the stopped process its handlers (no /proc file holds them). Each handler read is a
/// call made inside it: only the signals caught or ignored, which /proc says (`status`), can
/// have other than the default. And SIGCHLD always: SIG_DFL with SA_NOCLDWAIT (children reaped
/// by the kernel) shows as neither.
pub fn ask(status: &crate::procfs::Status, q: &mut Questions) -> Result<ActionsAsked> {
    let set = |signo: i32| (status.sigcgt | status.sigign) & (1u64 << (signo - 1)) != 0;
    let mut asked = Vec::new();
    for signo in catchable().filter(|&s| s == libc::SIGCHLD || set(s)) {
        asked.push((signo, q.ask_into("rt_sigaction", libc::SYS_rt_sigaction, 32, |at| [signo as u64, 0, at, SIGSET_SIZE])?));
    }
    Ok(ActionsAsked(asked))
}

/// Every handler, from the answers to [`ask`], and the process-wide pending queue.
pub fn capture(host_pid: Tid, answers: &Answers, asked: &ActionsAsked) -> Result<SignalsRecord> {
    let mut actions = Vec::new();
    for &(signo, a) in &asked.0 {
        let act = SigactionRecord::from_bytes(signo, answers.bytes(a)?);
        if !act.is_default() {
            actions.push(act);
        }
    }
    let shared_pending = sys::peek_pending(host_pid, true)?.into_iter().map(|s| PendingSignal(s.to_vec())).collect();
    Ok(SignalsRecord { actions, shared_pending })
}

/// Installs the handlers, and queues the process-wide pending signals (the task must have every
/// signal blocked until it is released, so that none is delivered while it is being rebuilt).
pub fn restore(rec: &SignalsRecord, ns_pid: Tid, inj: &mut Injector, scratch: Scratch, runner: Option<&crate::ptrace::batch::Runner>) -> Result<()> {
    // Every handler is set, to the default where the image has none: the task may have inherited
    // others from the restorer (which ignores SIGPIPE, for one). Only those that can differ are
    // set (64 injected calls took about a millisecond a process): the image's, the task's own
    // caught or ignored ones, and SIGCHLD, as [`ask`] reads them; in one stop where the task
    // has the batch runner.
    let status = crate::procfs::status(inj.tid())?;
    let now_set = |signo: i32| (status.sigcgt | status.sigign) & (1u64 << (signo - 1)) != 0;
    let in_image = |signo: i32| rec.actions.iter().any(|a| a.signo == signo);
    let actions: Vec<SigactionRecord> = catchable()
        .filter(|&s| s == libc::SIGCHLD || now_set(s) || in_image(s))
        .map(|signo| rec.actions.iter().find(|a| a.signo == signo).copied().unwrap_or(SigactionRecord { signo, handler: 0, flags: 0, restorer: 0, mask: 0 }))
        .collect();
    // SIGTRAP's own handler is set last and alone: the runner stops at a breakpoint, whose
    // SIGTRAP would reset an ignored one to the default (see `batch`).
    let (trap, others): (Vec<SigactionRecord>, Vec<SigactionRecord>) = actions.into_iter().partition(|a| a.signo == libc::SIGTRAP);
    let (batched, single) = match runner {
        Some(_) => (others, trap),
        None => (Vec::new(), [others, trap].concat()),
    };
    if let (Some(runner), false) = (runner, batched.is_empty()) {
        // Each action's structure at its own place, the table of calls after them all.
        let mut calls = Vec::with_capacity(batched.len());
        for (k, act) in batched.iter().enumerate() {
            scratch.put(k * ACTION_LEN, &act.to_bytes())?;
            calls.push(crate::ptrace::batch::Call::new(libc::SYS_rt_sigaction, &[act.signo as u64, scratch.at(k * ACTION_LEN), 0, SIGSET_SIZE]));
        }
        let table = scratch.at(NSIG as usize * ACTION_LEN);
        for (raw, act) in runner.run_in(inj, scratch.mem, table, &calls)?.into_iter().zip(&batched) {
            crate::ptrace::inject::call_result(inj.tid(), "rt_sigaction", raw)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{e} (the handler of signal {})", act.signo)))?;
        }
    }
    for act in &single {
        scratch.put(0, &act.to_bytes())?;
        inj.call("rt_sigaction", libc::SYS_rt_sigaction, &[act.signo as u64, scratch.at(0), 0, SIGSET_SIZE])?;
    }
    // A SIGSTOP cannot be blocked: queued now, it would stop the task while it is rebuilt. It
    // is sent at the release instead (see [`SignalsRecord::stops`]).
    for sig in rec.shared_pending.iter().filter(|s| s.signo() != libc::SIGSTOP) {
        scratch.put(0, &sig.0)?;
        inj.call("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[ns_pid as u64, sig.signo() as u64, scratch.at(0)])?;
    }
    Ok(())
}

/// Queues signals pending for one thread, from inside that thread.
pub fn restore_thread_pending(pending: &[PendingSignal], ns_pid: Tid, ns_tid: Tid, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    for sig in pending {
        scratch.put(0, &sig.0)?;
        inj.call("rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[ns_pid as u64, ns_tid as u64, sig.signo() as u64, scratch.at(0)])?;
    }
    Ok(())
}
