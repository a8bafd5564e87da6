//! Descriptors of namespaces (nsfs files: what `open("/proc/self/ns/net")` gives, and what
//! container runtimes, `ip netns` helpers and sandboxes hold to `setns(2)` into later).
//!
//! Such a descriptor names a namespace, not a file: its inode is the namespace's, which a
//! restart makes anew. So capture records which namespace by a process of the job that is in it
//! (its pid in the job and the entry of its /proc/PID/ns: `net`, `pid_for_children`, ...), and
//! restore opens that entry of that process again, once every process is in its namespaces.
//! A namespace no process of the job is in (one held open by the descriptor alone, or the
//! machine's own while the job is in another) cannot be named so, and is refused at checkpoint,
//! naming the descriptor.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{self, DescriptorKind, Opening};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};

/// The entries of /proc/PID/ns a descriptor may be an open of, by the kind its link names
/// (`net:[4026531833]`): the process's own namespace of that kind, then the one its next
/// children get, where the kind has one.
const ENTRIES: &[(&str, &[&str])] = &[
    ("cgroup", &["cgroup"]),
    ("ipc", &["ipc"]),
    ("mnt", &["mnt"]),
    ("net", &["net"]),
    ("pid", &["pid", "pid_for_children"]),
    ("time", &["time", "time_for_children"]),
    ("user", &["user"]),
    ("uts", &["uts"]),
];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NsFileRecord {
    /// A process of the job in that namespace, by its pid in the job.
    pub pid: Tid,
    /// The entry of its /proc/PID/ns the descriptor is an open of (`net`, `pid_for_children`).
    pub entry: String,
}

/// The kind a descriptor's link names, if it is a namespace's (`net:[4026531833]`). Pure.
pub fn kind_of(target: &str) -> Option<&'static str> {
    let (kind, rest) = target.split_once(":[")?;
    rest.strip_suffix(']').filter(|ino| ino.parse::<u64>().is_ok())?;
    ENTRIES.iter().find(|(k, _)| *k == kind).map(|(k, _)| *k)
}

/// Captures descriptor `fd` of process `pid` (host pid), a namespace of `kind` whose inode is
/// `meta`'s: the first of `job` ((host pid, pid in the job), the process itself first) in it.
pub fn capture(pid: Tid, fd: i32, kind: &str, meta: &std::fs::Metadata, job: &[(Tid, Tid)]) -> Result<NsFileRecord> {
    let entries = ENTRIES.iter().find(|(k, _)| *k == kind).map_or(&[][..], |(_, e)| e);
    let own = job.iter().filter(|(host, _)| *host == pid);
    for &(host, in_job) in own.chain(job.iter().filter(|(host, _)| *host != pid)) {
        for entry in entries {
            let here = std::fs::metadata(format!("/proc/{host}/ns/{entry}"));
            if here.is_ok_and(|m| m.ino() == meta.ino() && m.dev() == meta.dev()) {
                return Ok(NsFileRecord { pid: in_job, entry: entry.to_string() });
            }
        }
    }
    Err(Error::Unsupported {
        pid,
        what: format!(
            "fd {fd} (a {kind} namespace no process of the job is in: held by the descriptor alone, or the machine's own; a restart could not name it)"
        ),
    })
}

/// Checks what [`open`] would act on. Pure.
pub fn validate(r: &NsFileRecord) -> std::result::Result<(), String> {
    if !ENTRIES.iter().any(|(_, entries)| entries.contains(&r.entry.as_str())) {
        return Err(format!("{:?} is not an entry of /proc/PID/ns", r.entry));
    }
    Ok(())
}

impl DescriptorKind for NsFileRecord {
    fn describe(&self) -> String {
        format!("the {} namespace of pid {}", self.entry, self.pid)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, self)
    }
}

/// Opens the namespace again: the restorer opens the entry of the process (found through a
/// pidfd the task makes, so that the pid is the job's) and gives the task the descriptor.
fn open(task: &mut RemoteTask, ns_pid: Tid, r: &NsFileRecord) -> Result<u64> {
    let host = if r.pid == ns_pid { task.pid } else { host_pid_of(task, r.pid)? };
    let path = format!("/proc/{host}/ns/{}", r.entry);
    let ns: OwnedFd = std::fs::File::open(&path).map_err(|e| Error::Other(format!("open {path} (the {} namespace of pid {}): {e}", r.entry, r.pid)))?.into();
    descriptor::give(task, &ns, 0)
}

/// The host pid of the job's process `pid`, as the task's PID namespace names it.
fn host_pid_of(task: &mut RemoteTask, pid: Tid) -> Result<Tid> {
    let pidfd =
        task.syscall("pidfd_open", libc::SYS_pidfd_open, &[pid as u64, 0]).map_err(|e| Error::Other(format!("pidfd_open pid {pid} of the job: {e}")))?;
    let ours = descriptor::take_into_self(task.pid, pidfd as i32);
    task.syscall("close", libc::SYS_close, &[pidfd])?;
    let ours = ours?;
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", std::os::fd::AsRawFd::as_raw_fd(&ours)))?;
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse::<Tid>().ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| Error::Other(format!("the host pid of pid {pid} of the job (its pidfd names none)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_link_names_its_kind() {
        assert_eq!(kind_of("net:[4026531833]"), Some("net"));
        assert_eq!(kind_of("pid:[4026531836]"), Some("pid"));
        assert_eq!(kind_of("anon_inode:[eventfd]"), None);
        assert_eq!(kind_of("socket:[1234]"), None);
        assert_eq!(kind_of("net:[x]"), None);
    }

    #[test]
    fn only_entries_of_proc_pid_ns_are_opened() {
        assert_eq!(validate(&NsFileRecord { pid: 2, entry: "pid_for_children".into() }), Ok(()));
        for bad in ["../../etc/passwd", "netx", "", "fd/3"] {
            assert!(validate(&NsFileRecord { pid: 2, entry: bad.into() }).is_err(), "{bad}");
        }
    }
}
