//! pidfd: a descriptor that refers to a process (pidfd_open, clone with CLONE_PIDFD).
//!
//! Only a pidfd for a process of the job can be checkpointed: the job's pids are the same after
//! restart, so it is reopened with pidfd_open(pid in the job) from inside the task, once every
//! process of the job exists (a zombie still waiting for its parent included). A pidfd for a
//! process outside the job, or for a process already reaped, is refused at checkpoint time.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PidfdRecord {
    /// The process it refers to, as a pid in the job's namespace.
    pub pid: Tid,
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
    if target <= 0 {
        return Err(refuse("a process that has been reaped or that ckpt cannot see".into()));
    }
    // The job's processes are the ones in its PID namespace (its init too: restart makes a new one).
    let in_job = pid_ns(target).is_some() && pid_ns(target) == pid_ns(pid) && procfs::ns_tid(target).is_ok_and(|p| p >= 1);
    if !in_job {
        return Err(refuse(format!("pid {target}, a process outside the job")));
    }
    Ok(PidfdRecord { pid: procfs::ns_tid(target)? })
}

impl DescriptorKind for PidfdRecord {
    fn describe(&self) -> String {
        format!("pidfd of pid {}", self.pid)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self)
    }
}

/// Opens the pidfd again inside the task, on the same process of the job.
fn open(task: &mut RemoteTask, rec: &FdRecord, p: &PidfdRecord) -> Result<u64> {
    let flags = rec.flags & (libc::O_NONBLOCK as u32 | PIDFD_THREAD);
    let fd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[p.pid as u64, flags as u64]).context(|| format!("pidfd_open pid {} of the job", p.pid))?;
    Ok(fd)
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
