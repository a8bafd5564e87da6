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
use crate::ptrace::{Injector, Scratch, Tid};

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

/// `struct sched_attr` (the fields up to sched_period; utilization clamps are not kept).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Largest affinity mask kept: 8192 CPUs.
const AFFINITY_BYTES: usize = 1024;

fn sched_getattr(tid: Tid) -> std::io::Result<SchedAttr> {
    let mut attr = SchedAttr { size: std::mem::size_of::<SchedAttr>() as u32, ..Default::default() };
    // SAFETY: the kernel writes at most `size` bytes into `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr as *mut SchedAttr, attr.size, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr)
}

fn sched_setattr(tid: Tid, attr: &SchedAttr) -> std::io::Result<()> {
    // SAFETY: the kernel reads `size` bytes from `attr`.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, attr as *const SchedAttr, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn getaffinity(tid: Tid) -> std::io::Result<Vec<u8>> {
    let mut mask = vec![0u8; AFFINITY_BYTES];
    // SAFETY: the raw system call writes at most `mask.len()` bytes and returns how many.
    let n = unsafe { libc::syscall(libc::SYS_sched_getaffinity, tid, mask.len(), mask.as_mut_ptr()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    mask.truncate(n as usize);
    Ok(mask)
}

fn setaffinity(tid: Tid, mask: &[u8]) -> std::io::Result<()> {
    // SAFETY: the kernel reads `mask.len()` bytes.
    let r = unsafe { libc::syscall(libc::SYS_sched_setaffinity, tid, mask.len(), mask.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Captures a stopped thread's scheduling attributes.
pub fn capture(host_tid: Tid, inj: &mut Injector, scratch: Scratch) -> Result<SchedRecord> {
    let what = |e: std::io::Error, call: &str| Error::Other(format!("thread {host_tid}: {call}: {e}"));
    let attr = sched_getattr(host_tid).map_err(|e| what(e, "sched_getattr"))?;
    let affinity = getaffinity(host_tid).map_err(|e| what(e, "sched_getaffinity"))?;
    let timer_slack_ns = inj.call("prctl(PR_GET_TIMERSLACK)", libc::SYS_prctl, &[libc::PR_GET_TIMERSLACK as u64])?;
    // PR_GET_PDEATHSIG writes the signal through a pointer.
    scratch.put(0, &[0u8; 4])?;
    inj.call("prctl(PR_GET_PDEATHSIG)", libc::SYS_prctl, &[libc::PR_GET_PDEATHSIG as u64, scratch.at(0)])?;
    let pdeath_signal = u32::from_le_bytes(scratch.get(0, 4)?.try_into().expect("4 bytes"));
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
    if !rec.affinity.is_empty() && getaffinity(host_tid).ok().as_deref() != Some(rec.affinity.as_slice()) {
        if let Err(e) = setaffinity(host_tid, &rec.affinity) {
            // The CPUs may not exist on this machine, or not be in this job's cpuset.
            warn!(thread = host_tid, "CPU affinity not restored: {e}");
        }
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: rec.policy,
        flags: rec.flags,
        nice: rec.nice,
        priority: rec.priority,
        runtime: rec.deadline[0],
        deadline: rec.deadline[1],
        period: rec.deadline[2],
    };
    let now = sched_getattr(host_tid).map_err(|e| Error::Other(format!("thread {host_tid}: sched_getattr: {e}")))?;
    if (now.policy, now.flags, now.nice, now.priority) != (attr.policy, attr.flags, attr.nice, attr.priority) || rec.policy == libc::SCHED_DEADLINE as u32 {
        if let Err(e) = sched_setattr(host_tid, &attr) {
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
