//! pidfd: a descriptor that refers to a process (pidfd_open, clone with CLONE_PIDFD).
//!
//! Only a pidfd for a process of the job can be checkpointed: the job's pids are the same after
//! restart, so it is reopened with pidfd_open(pid in the job) from inside the task, once every
//! process of the job exists (a zombie still waiting for its parent included). A pidfd for a
//! process already reaped (a program that waited for its child and keeps the pidfd, as event
//! loops do until they close it) comes back as a pidfd of a process of the restorer's that
//! ended and was reaped: it polls readable and refuses signals, as before (EINVAL where it gave
//! ESRCH: that process ended outside the job's PID namespace); pidfds of the same process share
//! one (the same pidfs inode). A pidfd for a process outside the job is
//! refused at checkpoint time.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{self, DescriptorKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PidfdRecord {
    /// The process it refers to, as a pid in the job's namespace (0 where `reaped`).
    pub pid: Tid,
    /// For a process already reaped: the pidfd's inode at the checkpoint, which pidfds of the
    /// same process share (Linux 6.9's pidfs; before, every pidfd has the same). Format 31.
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub reaped: Option<u64>,
}

/// PIDFD_THREAD: a pidfd for one thread, not a thread group.
const PIDFD_THREAD: u32 = libc::O_EXCL as u32;

/// The `Pid:` of a pidfd's fdinfo (pure): the process as the reader of /proc sees it; -1 when it
/// has been reaped, 0 when it is not visible from there.
pub fn parse_pid(fdinfo: &str) -> std::result::Result<Tid, String> {
    let v = procfs::fdinfo_field(fdinfo, "Pid").ok_or("no Pid line")?;
    v.parse().map_err(|_| format!("Pid {v:?}"))
}

fn pid_ns(host_pid: Tid) -> Option<u64> {
    std::fs::metadata(format!("/proc/{host_pid}/ns/pid")).ok().map(|m| m.ino())
}

/// Captures the pidfd at `fd` of process `pid` (host pids).
pub fn capture(pid: Tid, fd: i32) -> Result<PidfdRecord> {
    let target = parse_pid(&procfs::fdinfo_text(pid, fd)?).map_err(|e| Error::Other(format!("fd {fd} (a pidfd): {e}")))?;
    let refuse = |why: String| Error::Unsupported { pid, what: format!("fd {fd} (a pidfd for {why})") };
    if target == -1 {
        let link = format!("/proc/{pid}/fd/{fd}");
        let ino = std::fs::metadata(&link).map_err(|e| Error::Other(format!("stat {link} (a pidfd): {e}")))?.ino();
        return Ok(PidfdRecord { pid: 0, reaped: Some(ino) });
    }
    if target <= 0 {
        return Err(refuse("a process that ckpt cannot see".into()));
    }
    // The job's processes are the ones in its PID namespace (its init too: restart makes a new one).
    let in_job = pid_ns(target).is_some() && pid_ns(target) == pid_ns(pid) && procfs::ns_tid(target).is_ok_and(|p| p >= 1);
    if !in_job {
        return Err(refuse(format!("pid {target}, a process outside the job")));
    }
    Ok(PidfdRecord { pid: procfs::ns_tid(target)?, reaped: None })
}

impl DescriptorKind for PidfdRecord {
    fn describe(&self) -> String {
        match self.reaped {
            Some(_) => "pidfd of a process reaped".into(),
            None => format!("pidfd of pid {}", self.pid),
        }
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        match self.reaped {
            Some(ino) => open_reaped(at.task, at.ns_pid, at.rec, ino, at.ctx),
            None => open(at.task, at.rec, self),
        }
    }
}

/// Opens the pidfd again inside the task, on the same process of the job.
fn open(task: &mut RemoteTask, rec: &FdRecord, p: &PidfdRecord) -> Result<u64> {
    let flags = rec.flags & (libc::O_NONBLOCK as u32 | PIDFD_THREAD);
    let fd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[p.pid as u64, flags as u64]).context(|| format!("pidfd_open pid {} of the job", p.pid))?;
    Ok(fd)
}

/// `RestoreCtx::objects`'s device number for the pidfds of reaped processes (keyed by their
/// inode at the checkpoint): no file system's.
const REAPED_KEY_DEV: u64 = u64::MAX;

/// A pidfd of a process that ended and was reaped, in the task: the one already made for the
/// same process (`ino`) where there is one (its description shared), else a new one, of a
/// process the restorer starts and reaps.
fn open_reaped(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, ino: u64, ctx: &mut RestoreCtx) -> Result<u64> {
    let key = (REAPED_KEY_DEV, ino);
    let fd = match ctx.objects.get(&key) {
        Some(&(owner, fd)) if owner == ns_pid => task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[fd, libc::F_DUPFD_CLOEXEC as u64, 0])?,
        Some(&(owner, fd)) => descriptor::take_from(task, owner, fd)?,
        None => {
            let pidfd = reaped_pidfd()?;
            descriptor::give(task, &pidfd, 0)?
        }
    };
    let flags = rec.flags & libc::O_NONBLOCK as u32;
    task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, flags as u64])?;
    // The record's descriptor is at its number once this returns.
    ctx.objects.entry(key).or_insert((ns_pid, rec.fd as u64));
    Ok(fd)
}

/// A pidfd of a process of the restorer's that has ended and been reaped: `true`, started,
/// its pidfd taken while it is at least a zombie, then waited for.
fn reaped_pidfd() -> Result<std::os::fd::OwnedFd> {
    let mut child = ["/bin/true", "/usr/bin/true"]
        .iter()
        .find_map(|p| std::process::Command::new(p).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).spawn().ok())
        .ok_or_else(|| Error::Other("start a process to stand for a reaped one (/bin/true)".into()))?;
    let pidfd = crate::sys::pidfd::open(child.id() as Tid);
    let waited = child.wait();
    let pidfd = pidfd.map_err(|e| Error::Other(format!("pidfd_open of a process to stand for a reaped one: {e}")))?;
    waited.map_err(|e| Error::Other(format!("reap the process standing for a reaped one: {e}")))?;
    Ok(pidfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pid() {
        assert_eq!(parse_pid("pos:\t0\nflags:\t02000002\nmnt_id:\t4\nino:\t78989\nPid:\t14067\nNSpid:\t14067\t3\n"), Ok(14067));
        assert_eq!(parse_pid("Pid:\t-1\nNSpid:\t-1\n"), Ok(-1));
        assert!(parse_pid("pos:\t0\n").is_err());
    }
}
