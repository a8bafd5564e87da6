//! A thread's scheduling attributes: nice value, scheduling policy with its priority and flags
//! (sched_getattr), CPU affinity, timer slack, and the parent-death signal, which Linux also keeps
//! per thread.
//!
//! **Capture**: nice, policy and affinity are read from outside (`/proc`, sched_getattr and
//! sched_getaffinity on the thread's id need no stop); timer slack and the parent-death signal
//! are asked from inside the thread (prctl).
//!
//! **Restore** ([`restore_last`]) runs after the thread's credentials are restored: changing
//! credentials clears the parent-death signal, so it is set after them. Nice, policy and affinity
//! are set from outside with the restorer's rights; what those rights do not allow (an ordinary
//! user asking for a real-time policy or a lower nice value than the restorer's own) is left as
//! it is with a warning: the job runs, at the scheduling the user may have.

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::error::{Error, Result};
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{Injector, Tid};
use crate::sys::sched::{self, SchedAttr};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SchedRecord {
    pub nice: i32,
    /// SCHED_OTHER, SCHED_FIFO, SCHED_RR, SCHED_BATCH, SCHED_IDLE, SCHED_DEADLINE.
    pub policy: u32,
    /// SCHED_FLAG_* (reset-on-fork among them).
    pub flags: u64,
    /// Real-time priority (SCHED_FIFO, SCHED_RR).
    pub priority: u32,
    /// SCHED_DEADLINE's runtime, deadline and period, in nanoseconds.
    pub deadline: [u64; 3],
    /// The CPUs it may run on, as sched_getaffinity's mask.
    pub affinity: Vec<u8>,
    pub timer_slack_ns: u64,
    /// Signal sent to it when its parent dies (0: none).
    pub pdeath_signal: u32,
}

/// Largest affinity mask kept: 8192 CPUs.
const AFFINITY_BYTES: usize = 1024;

/// The calls [`capture`] reads the answers of, made in the thread.
pub struct SchedAsked {
    timer_slack: Asked,
    pdeath_signal: Asked,
}

/// Asks a stopped thread what only it can tell of its scheduling.
pub fn ask(q: &mut Questions) -> Result<SchedAsked> {
    Ok(SchedAsked {
        timer_slack: q.ask("prctl(PR_GET_TIMERSLACK)", libc::SYS_prctl, &[libc::PR_GET_TIMERSLACK as u64]),
        // It writes the signal through a pointer.
        pdeath_signal: q.ask_into("prctl(PR_GET_PDEATHSIG)", libc::SYS_prctl, 4, |at| [libc::PR_GET_PDEATHSIG as u64, at])?,
    })
}

/// Captures a stopped thread's scheduling attributes: from outside, and the answers to [`ask`].
pub fn capture(host_tid: Tid, answers: &Answers, asked: &SchedAsked) -> Result<SchedRecord> {
    let what = |e: std::io::Error, call: &str| Error::Other(format!("thread {host_tid}: {call}: {e}"));
    let attr = sched::getattr(host_tid).map_err(|e| what(e, "sched_getattr"))?;
    let affinity = sched::affinity(host_tid, AFFINITY_BYTES).map_err(|e| what(e, "sched_getaffinity"))?;
    let timer_slack_ns = answers.value(asked.timer_slack)?;
    let pdeath_signal = u32::from_le_bytes(answers.bytes(asked.pdeath_signal)?.try_into().expect("4 bytes asked"));
    Ok(SchedRecord {
        nice: attr.nice,
        policy: attr.policy,
        flags: attr.flags,
        priority: attr.priority,
        deadline: [attr.runtime, attr.deadline, attr.period],
        affinity,
        timer_slack_ns,
        pdeath_signal,
    })
}

/// Restores a thread's scheduling attributes (after its credentials, see the module's comment).
pub fn restore_last(rec: &SchedRecord, host_tid: Tid, inj: &mut Injector) -> Result<()> {
    if !rec.affinity.is_empty() && sched::affinity(host_tid, AFFINITY_BYTES).ok().as_deref() != Some(rec.affinity.as_slice()) {
        if let Err(e) = sched::set_affinity(host_tid, &rec.affinity) {
            // The CPUs may not exist on this machine, or not be in this job's cpuset.
            warn!(thread = host_tid, "CPU affinity not restored: {e}");
        }
    }
    let attr = SchedAttr {
        policy: rec.policy,
        flags: rec.flags,
        nice: rec.nice,
        priority: rec.priority,
        runtime: rec.deadline[0],
        deadline: rec.deadline[1],
        period: rec.deadline[2],
    };
    let now = sched::getattr(host_tid).map_err(|e| Error::Other(format!("thread {host_tid}: sched_getattr: {e}")))?;
    if (now.policy, now.flags, now.nice, now.priority) != (attr.policy, attr.flags, attr.nice, attr.priority) || rec.policy == libc::SCHED_DEADLINE as u32 {
        if let Err(e) = sched::setattr(host_tid, &attr) {
            warn!(thread = host_tid, policy = rec.policy, nice = rec.nice, priority = rec.priority, "scheduling policy and nice value not restored: {e}");
        }
    }
    if rec.timer_slack_ns != 0 {
        inj.call("prctl(PR_SET_TIMERSLACK)", libc::SYS_prctl, &[libc::PR_SET_TIMERSLACK as u64, rec.timer_slack_ns])?;
    }
    if rec.pdeath_signal != 0 {
        inj.call("prctl(PR_SET_PDEATHSIG)", libc::SYS_prctl, &[libc::PR_SET_PDEATHSIG as u64, rec.pdeath_signal as u64])?;
    }
    Ok(())
}
