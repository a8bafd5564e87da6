//! A thread: registers, FPU state, signal mask and queue, alternate stack, rseq area, and the
//! exit bookkeeping glibc relies on (clear_child_tid for pthread_join, the robust futex list).

use serde::{Deserialize, Serialize};

use super::signals::PendingSignal;
use crate::error::Result;
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{sys, Injector, Regs, Scratch, Tid, XState};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AltStack {
    pub sp: u64,
    pub flags: i32,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RseqRecord {
    pub area: u64,
    pub size: u32,
    pub signature: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ThreadRecord {
    /// Thread id inside the job's PID namespace; recreated exactly.
    pub tid: Tid,
    pub regs: Regs,
    pub xstate: XState,
    pub sigmask: u64,
    pub pending: Vec<PendingSignal>,
    pub altstack: AltStack,
    pub rseq: Option<RseqRecord>,
    pub clear_child_tid: u64,
    pub robust_list: (u64, u64),
    pub comm: String,
    /// Ids, groups, capabilities, restored last ([`super::creds::restore_last`]).
    pub creds: super::creds::CredsRecord,
    /// Nice, policy, affinity, timer slack, parent-death signal; restored after the credentials.
    pub sched: super::sched::SchedRecord,
}

const PR_GET_TID_ADDRESS: u64 = 40;
const RSEQ_FLAG_UNREGISTER: u64 = 1;
const SS_ONSTACK: i32 = 1;

/// The calls [`capture`] reads the answers of, made in the thread itself.
pub struct ThreadAsked {
    clear_child_tid: Asked,
    altstack: Asked,
    creds: super::creds::CredsAsked,
    sched: super::sched::SchedAsked,
}

/// Asks a stopped thread what only it can tell (its clear-child-tid address, its signal stack,
/// part of its credentials and scheduling).
pub fn ask(q: &mut Questions) -> Result<ThreadAsked> {
    Ok(ThreadAsked {
        clear_child_tid: q.ask_into("prctl(PR_GET_TID_ADDRESS)", libc::SYS_prctl, 8, |at| [PR_GET_TID_ADDRESS, at])?,
        altstack: q.ask_into("sigaltstack", libc::SYS_sigaltstack, 24, |at| [0, at])?,
        creds: super::creds::ask(q),
        sched: super::sched::ask(q)?,
    })
}

/// Captures a stopped thread: from outside, and the answers to [`ask`]. `regs` are its
/// registers as it was stopped; `sigmask` is the mask it had before the tracer blocked every
/// signal for the capture; `held` is a signal taken from it while it was being stopped;
/// `status` its status, read once it was stopped (its credentials come from there).
#[allow(clippy::too_many_arguments)]
pub fn capture(
    host_pid: Tid,
    host_tid: Tid,
    ns_tid: Tid,
    status: &crate::procfs::Status,
    regs: Regs,
    sigmask: u64,
    held: Option<PendingSignal>,
    answers: &Answers,
    asked: &ThreadAsked,
) -> Result<ThreadRecord> {
    let xstate = XState::read(host_tid)?;
    let mut pending: Vec<PendingSignal> = sys::peek_pending(host_tid, false)?.into_iter().map(|s| PendingSignal(s.to_vec())).collect();
    pending.extend(held);

    let rseq = sys::get_rseq(host_tid)?;
    let rseq = (rseq.abi_pointer != 0).then_some(RseqRecord { area: rseq.abi_pointer, size: rseq.abi_size, signature: rseq.signature });

    let clear_child_tid = u64::from_le_bytes(answers.bytes(asked.clear_child_tid)?.try_into().expect("8 bytes asked"));
    let ss = answers.bytes(asked.altstack)?;
    let altstack = AltStack {
        sp: u64::from_le_bytes(ss[0..8].try_into().unwrap()),
        flags: i32::from_le_bytes(ss[8..12].try_into().unwrap()) & !SS_ONSTACK,
        size: u64::from_le_bytes(ss[16..24].try_into().unwrap()),
    };

    let robust_list = get_robust_list(host_tid)?;
    let comm = std::fs::read_to_string(format!("/proc/{host_pid}/task/{host_tid}/comm")).unwrap_or_default().trim_end().to_string();
    let creds = super::creds::capture(status, answers, &asked.creds)?;
    let sched = super::sched::capture(host_tid, answers, &asked.sched)?;
    Ok(ThreadRecord { tid: ns_tid, regs, xstate, sigmask, pending, altstack, rseq, clear_child_tid, robust_list, comm, creds, sched })
}

fn get_robust_list(tid: Tid) -> Result<(u64, u64)> {
    crate::sys::process::robust_list(tid).map_err(|e| std::io::Error::new(e.kind(), format!("get_robust_list of task {tid}: {e}")).into())
}

/// Drops the rseq registration and robust list a fresh helper thread inherited from the restorer,
/// before the memory they point into is replaced by the restored program's.
pub fn forget_inherited(host_tid: Tid, inj: &mut Injector) -> Result<()> {
    let rseq = sys::get_rseq(host_tid)?;
    if rseq.abi_pointer != 0 {
        inj.call("rseq(unregister)", libc::SYS_rseq, &[rseq.abi_pointer, rseq.abi_size as u64, RSEQ_FLAG_UNREGISTER, rseq.signature as u64])?;
    }
    inj.call("set_robust_list", libc::SYS_set_robust_list, &[0, 24])?;
    inj.call("set_tid_address", libc::SYS_set_tid_address, &[0])?;
    Ok(())
}

/// Restores a thread's state that must be set from inside it (alternate stack, rseq, exit
/// bookkeeping) and its FPU state. Registers, mask and pending signals come last, from the
/// orchestration, once nothing more will be injected.
/// `cpu`: the checkpoint's CPU, whose layout of the extended state is moved to this one's where
/// they differ.
pub fn restore_inside(rec: &ThreadRecord, host_tid: Tid, inj: &mut Injector, scratch: Scratch, cpu: Option<&super::cpu::CpuRecord>) -> Result<()> {
    if rec.altstack.sp != 0 || rec.altstack.flags != 0 {
        let mut ss = [0u8; 24];
        ss[0..8].copy_from_slice(&rec.altstack.sp.to_le_bytes());
        ss[8..12].copy_from_slice(&rec.altstack.flags.to_le_bytes());
        ss[16..24].copy_from_slice(&rec.altstack.size.to_le_bytes());
        scratch.put(0, &ss)?;
        inj.call("sigaltstack", libc::SYS_sigaltstack, &[scratch.at(0), 0])?;
    }
    if let Some(rseq) = rec.rseq {
        inj.call("rseq", libc::SYS_rseq, &[rseq.area, rseq.size as u64, 0, rseq.signature as u64])?;
    }
    inj.call("set_tid_address", libc::SYS_set_tid_address, &[rec.clear_child_tid])?;
    if rec.robust_list.0 != 0 {
        inj.call("set_robust_list", libc::SYS_set_robust_list, &[rec.robust_list.0, rec.robust_list.1])?;
    }
    let xstate = match cpu.map(|from| (from, super::cpu::CpuRecord::here())) {
        // Test hook `CKPT_TEST_XSTATE=move`: the state goes through the move on one CPU.
        Some((from, here_cpu))
            if super::cpu::layout_differs(&rec.xstate.0, from, here_cpu) || crate::testhooks::var("CKPT_TEST_XSTATE").is_some_and(|v| v == "move") =>
        {
            let template = crate::ptrace::XState::read(host_tid)?;
            let moved = super::cpu::to_layout(&rec.xstate.0, from, here_cpu, &template.0)
                .map_err(|why| super::cpu::size_refused(rec.tid, rec.xstate.0.len(), template.0.len(), &why))?;
            crate::ptrace::XState(moved)
        }
        _ => rec.xstate.clone(),
    };
    if let Err(e) = xstate.write(host_tid) {
        // The kernel takes only its own size: tell a CPU of another layout from other failures.
        let here = crate::ptrace::XState::read(host_tid).map(|x| x.0.len()).unwrap_or(0);
        if here != 0 && here != xstate.0.len() {
            return Err(super::cpu::size_refused(rec.tid, rec.xstate.0.len(), here, "the layout of the checkpoint's CPU is not recorded"));
        }
        return Err(e.into());
    }
    if !rec.comm.is_empty() {
        // Only the thread itself may rename itself (/proc/PID/comm refuses other processes);
        // without it ps, top and pgrep would see every restored thread named after the restorer.
        let mut name = rec.comm.as_bytes()[..rec.comm.len().min(15)].to_vec();
        name.push(0);
        scratch.put(0, &name)?;
        inj.call("prctl(PR_SET_NAME)", libc::SYS_prctl, &[libc::PR_SET_NAME as u64, scratch.at(0)])?;
    }
    Ok(())
}
