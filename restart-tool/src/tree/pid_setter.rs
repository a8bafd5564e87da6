//! Thread ids inside a user namespace the job made.
//!
//! A thread is made with its id by clone3's `set_tid`, which asks for CAP_SYS_ADMIN (or
//! CAP_CHECKPOINT_RESTORE) in the user namespace that owns the job's PID namespace. A process in
//! a user namespace the job made (`unshare --user`, a rootless container) has its capabilities
//! there, not in the job's: its clone3 with `set_tid` fails with EPERM. So its threads are made
//! the older way: a process that does hold that right in the job's PID namespace sets the
//! namespace's last pid (`/proc/sys/kernel/ns_last_pid`, whose check is the writer's rights in
//! the writer's PID namespace) to one less than the thread's id, and the process clones without
//! `set_tid`: the kernel hands out the next id. Nothing else makes a task in the job's PID
//! namespace meanwhile (every process of the job is stopped, the init waits), and the restorer
//! checks the id the thread got.
//!
//! That process is a helper forked, before any process enters its namespaces, from the first
//! process of the image (it inherits the init's rights, as every process being rebuilt does), at
//! an id no process or thread of the image has; it is ended and reaped before the release.

use std::collections::{BTreeMap, HashSet};

use ckpt_core::objects::process::ZombieRecord;
use ckpt_core::ptrace::{RemoteTask, Tid};
use ckpt_core::{Error, Result};

use crate::tracees::Tracees;

/// Where the helper puts the path and the numbers it writes, in its own scratch page.
const TEXT_AT: usize = 1024;

pub struct PidSetter {
    /// Its pid in the job, and its task.
    pid: Tid,
    task: RemoteTask,
    /// The pid in the job of the process it was forked from, which reaps it.
    parent: Tid,
    /// Its descriptor of ns_last_pid, once opened.
    fd: Option<u64>,
}

impl PidSetter {
    /// Forks the helper from `parent` (pid `parent_pid` in the job), at a pid not in `taken`.
    pub(super) fn fork(parent: &mut RemoteTask, parent_pid: Tid, taken: &mut HashSet<Tid>, scratch: u64, tracees: &mut Tracees) -> Result<PidSetter> {
        let (pid, task) = super::fork_helper(parent, taken, scratch, tracees)?;
        Ok(PidSetter { pid, task, parent: parent_pid, fd: None })
    }

    /// Makes `next` the id the job's PID namespace hands out next.
    pub fn next_id_is(&mut self, next: Tid) -> Result<()> {
        let fd = match self.fd {
            Some(fd) => fd,
            None => {
                let path = self.task.put_path(TEXT_AT, "/proc/sys/kernel/ns_last_pid")?;
                let flags = (libc::O_WRONLY | libc::O_CLOEXEC) as u64;
                let fd = self
                    .task
                    .syscall("open", libc::SYS_openat, &[libc::AT_FDCWD as u64, path, flags, 0])
                    .map_err(|e| Error::Other(format!("open the job's ns_last_pid to give threads their ids: {e}")))?;
                *self.fd.insert(fd)
            }
        };
        let text = (next - 1).to_string();
        let at = self.task.put(TEXT_AT, text.as_bytes())?;
        // At offset 0: a sysctl ignores a write that does not start there.
        self.task
            .syscall("pwrite64", libc::SYS_pwrite64, &[fd, at, text.len() as u64, 0])
            .map_err(|e| Error::Other(format!("set the job's ns_last_pid to {text}: {e}")))?;
        Ok(())
    }

    /// Ends the helper, reaped by the process it was forked from (no exit signal: that process
    /// sees nothing).
    pub fn end(self, tasks: &mut BTreeMap<Tid, RemoteTask>, tracees: &mut Tracees) -> Result<()> {
        let (pid, parent) = (self.pid, self.parent);
        super::end_as(ZombieRecord { pid, ppid: 0, pgid: 0, sid: 0, wait_status: 0 }, self.task, tracees)?;
        let reaper =
            tasks.get_mut(&parent).ok_or_else(|| Error::Other(format!("the helper {pid} that gave threads their ids: its parent {parent} is gone")))?;
        reaper
            .syscall("wait4", libc::SYS_wait4, &[pid as u64, 0, libc::__WALL as u64, 0])
            .map(drop)
            .map_err(|e| Error::Other(format!("reap the helper {pid} that gave threads their ids: {e}")))
    }
}
