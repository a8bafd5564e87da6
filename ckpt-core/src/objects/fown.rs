//! File owners: which thread, process or process group an open file description signals when
//! I/O becomes possible on it (`fcntl(F_SETOWN_EX)`, with `O_ASYNC`), and with which signal
//! (`F_SETSIG`; 0 is SIGIO). Programs driven by SIGIO set both (zdtm's file_fown).
//!
//! Capture reads them on the restorer's duplicate of the descriptor (it shares the open file
//! description), for descriptors with `O_ASYNC` only: without it no I/O signal is sent, and
//! every descriptor would cost two calls. The owner's number is the machine's: it is turned
//! into the job's through /proc (a thread's or process's NSpid, a group's NSpgid in a process of
//! the job that is in it). An owner outside the job is refused by name; one that has ended is
//! kept as no owner (its signals went nowhere).
//!
//! Restore sets both from inside the process, with injected fcntl calls (O_ASYNC set again too,
//! so that the signal names the descriptor's own number, not the one it was opened at), once
//! every process and group of the job exists and the process holds its own credentials again:
//! the kernel keeps
//! the caller's uid and euid with the owner and checks them against the owner's at every
//! signal, and no interface reads the original caller's, so the process's own are the honest
//! guess (a restart as root would otherwise let root's pass).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::descriptor::{CaptureCtx, FdRecord};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::fs;

/// Who a descriptor's I/O signals go to, and which signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOwner {
    pub kind: OwnerKind,
    /// In the job's PID namespace; 0 for no owner (a signal alone was set).
    pub pid: i32,
    /// F_SETSIG's signal; 0 for SIGIO.
    pub signal: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OwnerKind {
    Thread,
    Process,
    Group,
}

impl OwnerKind {
    fn from_kernel(kind: i32) -> Option<OwnerKind> {
        match kind {
            fs::F_OWNER_TID => Some(OwnerKind::Thread),
            fs::F_OWNER_PID => Some(OwnerKind::Process),
            fs::F_OWNER_PGRP => Some(OwnerKind::Group),
            _ => None,
        }
    }

    fn to_kernel(self) -> i32 {
        match self {
            OwnerKind::Thread => fs::F_OWNER_TID,
            OwnerKind::Process => fs::F_OWNER_PID,
            OwnerKind::Group => fs::F_OWNER_PGRP,
        }
    }
}

/// The owner of descriptor `fd` of process `pid` (host pid), whose open flags are `flags`: none
/// without `O_ASYNC`, or when neither an owner nor a signal is set.
pub fn capture(pid: Tid, fd: i32, flags: u32, ctx: &mut CaptureCtx) -> Result<Option<FileOwner>> {
    if flags & libc::O_ASYNC as u32 == 0 {
        return Ok(None);
    }
    let held = ctx.take(pid, fd)?;
    let (kind, host, signal) = fs::file_owner(&held).map_err(|e| Error::Other(format!("pid {pid}: fd {fd}: read its owner (F_GETOWN_EX, F_GETSIG): {e}")))?;
    let kind = OwnerKind::from_kernel(kind).ok_or_else(|| Error::Other(format!("pid {pid}: fd {fd}: an owner of unknown type {kind}")))?;
    let outside = |what: String| Error::Unsupported { pid, what: format!("fd {fd} (its I/O signals go to {what}, outside the job)") };
    let in_job = match (kind, host) {
        (_, 0) => 0,
        (OwnerKind::Group, group) => {
            let member = ctx.pids.iter().copied().find(|&p| crate::procfs::stat(p).is_ok_and(|s| s.pgrp == group));
            match member {
                Some(p) => status_last(p, "NSpgid:")?,
                None => return Err(outside(format!("process group {group}"))),
            }
        }
        (_, task) => match status_last(task, "Tgid:") {
            Ok(tgid) if ctx.pids.contains(&tgid) => status_last(task, "NSpid:")?,
            Ok(_) => return Err(outside(format!("{} {task}", if kind == OwnerKind::Thread { "thread" } else { "process" }))),
            // Ended: its signals went nowhere, and so they will.
            Err(_) if !std::path::Path::new(&format!("/proc/{task}")).exists() => 0,
            Err(e) => return Err(e),
        },
    };
    Ok((in_job != 0 || signal != 0).then_some(FileOwner { kind, pid: in_job, signal }))
}

/// The last number of a line of /proc/`task`/status (`NSpid:` lists a task's ids from the
/// outermost PID namespace in).
fn status_last(task: Tid, field: &str) -> Result<Tid> {
    let path = format!("/proc/{task}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Other(format!("read {path}: {e}")))?;
    last_number(&text, field).ok_or_else(|| Error::Other(format!("{path} has no {field} line")))
}

/// The last number of the line starting with `field` in a status text. Pure.
fn last_number(status: &str, field: &str) -> Option<Tid> {
    status.lines().find_map(|l| l.strip_prefix(field))?.split_whitespace().last()?.parse().ok()
}

/// Gives the descriptors of `fds` (the process's table, every one in place) their owners and
/// signals, once per open file description (`done` holds those given already, by whichever
/// process holds them too). Run by the process itself, with its own credentials.
pub fn restore(task: &mut RemoteTask, fds: &[FdRecord], done: &mut HashSet<u32>) -> Result<()> {
    for rec in fds {
        let Some(owner) = rec.owner else { continue };
        if !done.insert(rec.description) {
            continue;
        }
        let fd = rec.fd as u64;
        // The kernel tells the owner which descriptor is ready (si_fd) by the number O_ASYNC
        // was set at, which was where the restore opened it: set again at its own.
        let flags = task.syscall("fcntl(F_GETFL)", libc::SYS_fcntl, &[fd, libc::F_GETFL as u64])?;
        if flags & libc::O_ASYNC as u64 != 0 {
            task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, flags & !(libc::O_ASYNC as u64)])?;
            task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, flags])?;
        }
        if owner.pid != 0 {
            let mut ex = owner.kind.to_kernel().to_ne_bytes().to_vec();
            ex.extend_from_slice(&owner.pid.to_ne_bytes());
            let at = task.put(0, &ex)?;
            task.syscall("fcntl(F_SETOWN_EX)", libc::SYS_fcntl, &[fd, fs::F_SETOWN_EX as u64, at])
                .map_err(|e| Error::Other(format!("fd {}: give it its owner again ({:?} {}): {e}", rec.fd, owner.kind, owner.pid)))?;
        }
        if owner.signal != 0 {
            task.syscall("fcntl(F_SETSIG)", libc::SYS_fcntl, &[fd, fs::F_SETSIG as u64, owner.signal as u64])
                .map_err(|e| Error::Other(format!("fd {}: give it its I/O signal {} again: {e}", rec.fd, owner.signal)))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_innermost_numbers_of_status() {
        let status = "Name:\tx\nTgid:\t4012\nNSpid:\t4012\t7\nNSpgid:\t4000\t1\n";
        assert_eq!(last_number(status, "NSpid:"), Some(7));
        assert_eq!(last_number(status, "NSpgid:"), Some(1));
        assert_eq!(last_number(status, "Tgid:"), Some(4012));
        assert_eq!(last_number(status, "NSsid:"), None);
    }

    #[test]
    fn owner_kinds_are_the_kernels() {
        for k in [OwnerKind::Thread, OwnerKind::Process, OwnerKind::Group] {
            assert_eq!(OwnerKind::from_kernel(k.to_kernel()), Some(k));
        }
        assert_eq!(OwnerKind::from_kernel(7), None);
    }

    /// What a descriptor of this process says, through the same call capture uses.
    #[test]
    fn the_kernel_reports_an_owner_and_signal_set_here() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let me = std::process::id() as i32;
        fs::set_file_owner(&r, fs::F_OWNER_PID, me, libc::SIGRTMIN() + 1).unwrap();
        assert_eq!(fs::file_owner(&r).unwrap(), (fs::F_OWNER_PID, me, libc::SIGRTMIN() + 1));
    }
}
