//! POSIX message queues (`mq_open`): the queue's name, attributes, owner and mode, its messages
//! with their priorities, and a notification registration (`mq_notify`).
//!
//! A queue descriptor is a file of the kernel's mqueue file system, one per IPC namespace; its
//! /proc link reads `/NAME`, or `/NAME (deleted)` once the queue is unlinked. The job runs in an
//! IPC namespace of its own, so its queues are its own, and at restart they are made again in
//! the job's new one, from inside the restored processes.
//!
//! Capture opens a description of its own on the queue (through /proc/PID/fd/N, read-write and
//! non-blocking, so that the job's descriptor, its flags and its position are not touched) and
//! from it reads the status line (`QSIZE: NOTIFY: SIGNO: NOTIFY_PID:`; fdinfo does not show
//! it), the attributes, and every message; then it sends them back in the order they came out.
//! Receive order is by priority, then arrival, so the queue is as it was: the job is frozen and
//! none of its threads waits in the queue. A queue is captured once, with its first descriptor
//! (by device and inode), however many descriptors and processes hold it.
//!
//! Restore: the first process that holds the queue creates it by name (`O_CREAT|O_EXCL`, its
//! attributes, mode and owner) and the restorer puts the messages back through a duplicate;
//! every descriptor, the first included, is then opened by name with its own flags. Once every
//! process holds its descriptors ([`finish`]): a queue unlinked at the checkpoint is unlinked
//! again, and a notification is registered again by the process that had registered it (after
//! the descriptors are in place, because any close of a descriptor of the queue by that process
//! drops its registration).
//!
//! Refused at the checkpoint: a SIGEV_THREAD notification (glibc's thread behind a netlink
//! socket), a notification on a queue that holds messages (reading them would fire it), or one
//! registered by a process outside the job. The value a SIGEV_SIGNAL notification carries
//! (`sigev_value`) is not shown by the kernel: it comes back as zero. Not saved: queues that no
//! process of the job holds open at the checkpoint (they live on in the namespace unseen).

use std::fs::OpenOptions;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use serde::{Deserialize, Serialize};

use super::descriptor::{self, CaptureCtx, DescriptorKind, FdKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::mqueue as sys;

/// The mqueue file system's magic (statfs f_type).
const MQUEUE_MAGIC: i64 = 0x1980_0202;
/// The highest message priority plus one (MQ_PRIO_MAX on Linux).
pub const PRIO_MAX: u32 = 32768;
/// The kernel's ceilings on a queue's attributes, whatever the sysctls say (HARD_MSGMAX,
/// HARD_MSGSIZEMAX).
pub const HARD_MSGMAX: u64 = 65536;
pub const HARD_MSGSIZEMAX: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MqueueRecord {
    /// The queue's name as `mq_open` takes it: `/NAME`.
    pub name: String,
    /// The queue's identity at the checkpoint: descriptors with the same are one queue.
    pub dev: u64,
    pub ino: u64,
    /// The queue was unlinked (`mq_unlink`) while open: it is unlinked again at restart once
    /// every process has its descriptors.
    pub unlinked: bool,
    /// The queue itself, carried by its first descriptor captured (the others have `None`).
    pub queue: Option<QueueState>,
}

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct QueueState {
    /// `mq_maxmsg` and `mq_msgsize`.
    pub maxmsg: u64,
    pub msgsize: u64,
    /// Permission bits, owner and group of the queue.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The queued messages in the order a receiver takes them.
    pub messages: Vec<Message>,
    pub notify: Option<Notification>,
}

impl std::fmt::Debug for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueState")
            .field("maxmsg", &self.maxmsg)
            .field("msgsize", &self.msgsize)
            .field("mode", &format_args!("{:o}", self.mode))
            .field("owner", &format_args!("{}:{}", self.uid, self.gid))
            .field("messages", &self.messages.len())
            .field("notify", &self.notify)
            .finish()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Message {
    pub priority: u32,
    pub data: Vec<u8>,
}

/// A registration made with `mq_notify`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Notification {
    /// The process that registered (its pid in the job).
    pub pid: Tid,
    pub how: Notify,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Notify {
    /// SIGEV_SIGNAL with this signal (0: registered, but no signal is sent); the signal's value
    /// is not known and comes back as zero.
    Signal(i32),
    /// SIGEV_NONE: registered, nothing sent.
    Nothing,
}

/// What a read of the queue file tells (the kernel's status line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub qsize: u64,
    /// sigev_notify: 0 SIGEV_SIGNAL, 1 SIGEV_NONE, 2 SIGEV_THREAD.
    pub notify: i32,
    pub signo: i32,
    /// The registering process as the reader's PID namespace sees it; 0 if none.
    pub notify_pid: Tid,
}

use libc::{SIGEV_NONE, SIGEV_SIGNAL, SIGEV_THREAD};

/// Parses the queue file's status line, `QSIZE:2 NOTIFY:0 SIGNO:0 NOTIFY_PID:0` (pure).
pub fn parse_status(text: &str) -> std::result::Result<Status, String> {
    let field = |name: &str| -> std::result::Result<i64, String> {
        let rest = text.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix(':')).ok_or(format!("no {name} field"))?;
        rest.parse().map_err(|_| format!("{name}:{rest:?}"))
    };
    let small = |name: &str| -> std::result::Result<i32, String> { i32::try_from(field(name)?).map_err(|_| format!("{name} out of range")) };
    Ok(Status {
        qsize: u64::try_from(field("QSIZE")?).map_err(|_| "negative QSIZE".to_string())?,
        notify: small("NOTIFY")?,
        signo: small("SIGNO")?,
        notify_pid: small("NOTIFY_PID")?,
    })
}

/// The queue's name from its descriptor's link (pure): `/NAME`, without the ` (deleted)` an
/// unlinked queue's link ends with.
pub fn name_from_link(target: &str, unlinked: bool) -> Option<&str> {
    let name = if unlinked { target.strip_suffix(" (deleted)")? } else { target };
    (name.len() > 1 && name.starts_with('/') && !name[1..].contains('/')).then_some(name)
}

/// Whether the descriptor's link (`/proc/PID/fd/N`) leads to a file of the mqueue file system.
pub fn is_mqueue(link: &str) -> Result<bool> {
    let fs = nix::sys::statfs::statfs(link).map_err(|e| Error::Other(format!("statfs {link}: {e}")))?;
    Ok(fs.filesystem_type().0 as i64 == MQUEUE_MAGIC)
}

/// The device number of the queues of the calling thread's IPC namespace: each namespace has
/// a mqueue file system of its own, which nothing shows unless it is mounted, so a queue of one
/// byte is made for the moment under a name of ours, looked at, and unlinked. None when the
/// namespace takes no more queues (queues_max, RLIMIT_MSGQUEUE).
pub(crate) fn device_of_this_namespace() -> Result<Option<u64>> {
    let name = format!("/.ckpt-probe-{}", nix::unistd::gettid());
    let create = || sys::create(&name, libc::O_EXCL | libc::O_RDONLY, 0o600, 1, 1);
    let made = match create() {
        // Left by an agent that died between making and unlinking it.
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => sys::unlink(&name).and_then(|()| create()),
        other => other,
    };
    let q = match made {
        Ok(q) => q,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EMFILE | libc::ENFILE)) => return Ok(None),
        Err(e) => return Err(e).context(|| format!("make a queue to find this IPC namespace's queues ({name})")),
    };
    let dev = nix::sys::stat::fstat(&q).map(|st| st.st_dev);
    let _ = sys::unlink(&name);
    Ok(Some(dev.map_err(std::io::Error::from).context(|| format!("fstat the queue {name}"))?))
}

/// Takes every message out of the queue (non-blocking `q`), in receive order.
fn receive_all(q: &OwnedFd, msgsize: usize, at_most: usize) -> std::io::Result<Vec<Message>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; msgsize];
    while out.len() < at_most {
        match sys::receive(q, &mut buf) {
            Ok((n, priority)) => out.push(Message { priority, data: buf[..n].to_vec() }),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Sends messages into the queue (non-blocking `q`), in order.
fn send_all(q: &OwnedFd, messages: &[Message]) -> std::result::Result<(), (usize, std::io::Error)> {
    for (i, m) in messages.iter().enumerate() {
        loop {
            match sys::send(q, &m.data, m.priority) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err((i, e)),
            }
        }
    }
    Ok(())
}

/// Captures a descriptor on a POSIX message queue of a stopped process; `target` is its link.
pub fn capture(pid: Tid, fd: i32, target: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<MqueueRecord> {
    let refuse = |why: String| Error::Unsupported { pid, what: format!("fd {fd} (POSIX message queue {target}: {why})") };
    let unlinked = meta.nlink() == 0;
    let name = name_from_link(target, unlinked).ok_or_else(|| refuse("a name mq_open cannot take".into()))?.to_string();
    let key = (meta.dev(), meta.ino());
    if !ctx.objects_seen.insert(key) {
        return Ok(MqueueRecord { name, dev: key.0, ino: key.1, unlinked, queue: None });
    }
    // A description of our own: the job's keeps its flags, and its blocking mode does not
    // make our reads wait.
    let link = format!("/proc/{pid}/fd/{fd}");
    let mut own = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&link)
        .map_err(|e| refuse(format!("the checkpoint cannot open it to read its messages ({e}; its mode is {:o})", meta.mode() & 0o7777)))?;
    let mut text = String::new();
    own.read_to_string(&mut text).map_err(|e| Error::Other(format!("read the status of queue {name} ({link}): {e}")))?;
    let status = parse_status(&text).map_err(|e| Error::Other(format!("queue {name}: status {text:?}: {e}")))?;
    let own = OwnedFd::from(own);
    let attr = sys::attributes(&own).context(|| format!("mq_getattr of queue {name}"))?;
    let (maxmsg, msgsize, curmsgs) = (attr.maxmsg as u64, attr.msgsize as u64, attr.curmsgs as u64);
    let notify = match status.notify_pid {
        0 => None,
        owner => {
            if !ctx.pids.contains(&owner) {
                return Err(refuse(format!("a notification is registered by pid {owner}, a process outside the job")));
            }
            let how = match status.notify {
                SIGEV_SIGNAL => Notify::Signal(status.signo),
                SIGEV_NONE => Notify::Nothing,
                SIGEV_THREAD => {
                    return Err(refuse(format!(
                        "pid {owner} registered a SIGEV_THREAD notification (a thread glibc starts, behind a netlink socket), which cannot be made again"
                    )))
                }
                other => return Err(refuse(format!("a notification of unknown kind {other}"))),
            };
            if curmsgs > 0 {
                return Err(refuse(format!(
                    "pid {owner} registered a notification and the queue holds {curmsgs} message(s): reading them would fire it; checkpoint again once the queue is empty"
                )));
            }
            Some(Notification { pid: procfs::ns_tid(owner)?, how })
        }
    };
    let messages = receive_all(&own, msgsize as usize, curmsgs as usize).map_err(|e| Error::Other(format!("read the messages of queue {name}: {e}")))?;
    // Back at once, whatever else fails: the job must find its queue as it left it.
    send_all(&own, &messages).map_err(|(i, e)| {
        Error::Other(format!("queue {name}: put message {} of {} back after reading it: {e} (the job lost the rest)", i + 1, messages.len()))
    })?;
    if messages.len() as u64 != curmsgs {
        return Err(Error::Other(format!("queue {name}: {} messages read, the queue said {curmsgs} (a process outside the job uses it?)", messages.len())));
    }
    let queue = QueueState { maxmsg, msgsize, mode: meta.mode() & 0o7777, uid: meta.uid(), gid: meta.gid(), messages, notify };
    Ok(MqueueRecord { name, dev: key.0, ino: key.1, unlinked, queue: Some(queue) })
}

/// The name without its leading '/', NUL-terminated, as the mq_open and mq_unlink system calls
/// take it (the C library strips the '/').
fn syscall_name(name: &str) -> &str {
    name.strip_prefix('/').unwrap_or(name)
}

/// The name a queue is made again under at restart. An unlinked queue gets one of its own until
/// [`finish`] unlinks it: the job may have made another queue of its old name since the unlink
/// (DMTCP's posix-mq1 does: its child opens the name with O_CREAT after the parent unlinked it),
/// and the two must not meet. Pure.
pub fn restore_name(m: &MqueueRecord) -> String {
    if m.unlinked {
        format!("/.ckpt-unlinked-{:x}-{:x}", m.dev, m.ino)
    } else {
        m.name.clone()
    }
}

impl DescriptorKind for MqueueRecord {
    fn describe(&self) -> String {
        format!("POSIX message queue {}", self.name)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.scratch_off, at.work_base)
    }
}

/// Opens the record's descriptor inside the task (creating the queue and putting its messages
/// back the first time). Returns it at or above `work_base`.
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, m: &MqueueRecord, ctx: &mut RestoreCtx, scratch_off: usize, work_base: u64) -> Result<u64> {
    let key = (m.dev, m.ino);
    if let std::collections::hash_map::Entry::Vacant(first) = ctx.objects.entry(key) {
        create(task, m, scratch_off)?;
        first.insert((ns_pid, rec.fd as u64));
    }
    // mq_open takes the access mode and O_NONBLOCK; it always sets close-on-exec, which the
    // descriptor's move to its number sets as the record says.
    let flags = rec.flags & (libc::O_ACCMODE | libc::O_NONBLOCK) as u32;
    let addr = task.put_path(scratch_off, syscall_name(&restore_name(m)))?;
    let q = task.syscall("mq_open", libc::SYS_mq_open, &[addr, flags as u64, 0, 0]).map_err(|e| Error::Other(format!("open queue {}: {e}", m.name)))?;
    descriptor::move_above(task, q, work_base)
}

/// Creates the queue in the task's IPC namespace, with its mode, owner and messages.
fn create(task: &mut RemoteTask, m: &MqueueRecord, scratch_off: usize) -> Result<()> {
    let q = m.queue.as_ref().ok_or_else(|| Error::Damaged { what: format!("the image lacks the state of queue {}", m.name) })?;
    // struct mq_attr: flags, maxmsg, msgsize, curmsgs (longs); then the name.
    let mut attr = Vec::with_capacity(32);
    for v in [0u64, q.maxmsg, q.msgsize, 0] {
        attr.extend_from_slice(&v.to_ne_bytes());
    }
    let attr_addr = task.put(scratch_off, &attr)?;
    let name_addr = task.put_path(scratch_off + 32, syscall_name(&restore_name(m)))?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NONBLOCK;
    let r = task.main.raw(libc::SYS_mq_open, &[name_addr, flags as u64, q.mode as u64, attr_addr])?;
    if r < 0 {
        return Err(create_error(m, q, -r as i32));
    }
    let holder = r as u64;
    let result = (|| -> Result<()> {
        // The mode went through the task's umask.
        task.syscall("fchmod", libc::SYS_fchmod, &[holder, q.mode as u64])
            .map_err(|e| Error::Other(format!("give queue {} its mode {:o}: {e}", m.name, q.mode)))?;
        let own = descriptor::take_into_self(task.pid, holder as i32)?;
        let made = std::fs::metadata(format!("/proc/self/fd/{}", own.as_raw_fd()))?;
        if (made.uid(), made.gid()) != (q.uid, q.gid) {
            task.syscall("fchown", libc::SYS_fchown, &[holder, q.uid as u64, q.gid as u64])
                .map_err(|e| Error::Other(format!("give queue {} its owner {}:{}: {e}", m.name, q.uid, q.gid)))?;
        }
        send_all(&own, &q.messages).map_err(|(i, e)| Error::Other(format!("queue {}: put message {} of {} back: {e}", m.name, i + 1, q.messages.len())))
    })();
    task.syscall("close", libc::SYS_close, &[holder])?;
    result
}

/// Why mq_open could not create the queue, and what to do.
fn create_error(m: &MqueueRecord, q: &QueueState, errno: i32) -> Error {
    let e = std::io::Error::from_raw_os_error(errno);
    let (name, maxmsg, msgsize) = (&m.name, q.maxmsg, q.msgsize);
    Error::Other(match errno {
        libc::EINVAL => format!(
            "create queue {name} ({maxmsg} messages of {msgsize} bytes): {e}: more than the job's IPC namespace allows \
             (/proc/sys/fs/mqueue/msg_max and msgsize_max, 10 and 8192 in a new namespace; above them needs CAP_SYS_RESOURCE)"
        ),
        libc::EMFILE => format!("create queue {name} ({maxmsg} messages of {msgsize} bytes): {e}: more than the user's RLIMIT_MSGQUEUE allows (ulimit -q)"),
        libc::ENOSPC => format!("create queue {name}: {e}: more queues than /proc/sys/fs/mqueue/queues_max allows"),
        libc::EEXIST => format!("create queue {name}: {e}: a queue of that name is there already (two queues of one name in the image?)"),
        _ => format!("create queue {name}: {e}"),
    })
}

/// What the restore of queues keeps until [`finish`]: registrations to make again and queues
/// to unlink again.
#[derive(Default)]
pub struct MqRestoreState {
    notify: std::collections::HashMap<(u64, u64), Notification>,
    /// Queues to unlink again, by identity: each from a process that holds it, which is in
    /// the queue's IPC namespace (see [`super::sysvipc`]'s check of queues).
    unlink: std::collections::HashMap<(u64, u64), String>,
}

impl MqRestoreState {
    pub fn collect<'a>(&mut self, records: impl Iterator<Item = &'a FdRecord>) {
        for r in records {
            if let FdKind::Mqueue(m) = &r.kind {
                if let Some(n) = m.queue.as_ref().and_then(|q| q.notify) {
                    self.notify.insert((m.dev, m.ino), n);
                }
                if m.unlinked && m.queue.is_some() {
                    self.unlink.insert((m.dev, m.ino), restore_name(m));
                }
            }
        }
    }
}

/// Once every process holds its descriptors: registers again the notifications process
/// `ns_pid` had (on one of its descriptors of the queue), and unlinks the queues it holds that
/// were unlinked (once each, from the first process that holds it).
pub fn finish(task: &mut RemoteTask, ns_pid: Tid, fds: &[FdRecord], state: &mut MqRestoreState, scratch_off: usize) -> Result<()> {
    for rec in fds {
        let FdKind::Mqueue(m) = &rec.kind else { continue };
        let key = (m.dev, m.ino);
        let Some(n) = state.notify.get(&key).copied().filter(|n| n.pid == ns_pid) else { continue };
        // struct sigevent: sigev_value (8), sigev_signo, sigev_notify, then a union: 64 bytes.
        let (signo, how) = match n.how {
            Notify::Signal(s) => (s, SIGEV_SIGNAL),
            Notify::Nothing => (0, SIGEV_NONE),
        };
        let mut sev = [0u8; 64];
        sev[8..12].copy_from_slice(&signo.to_ne_bytes());
        sev[12..16].copy_from_slice(&how.to_ne_bytes());
        let addr = task.put(scratch_off, &sev)?;
        task.syscall("mq_notify", libc::SYS_mq_notify, &[rec.fd as u64, addr])
            .map_err(|e| Error::Other(format!("register the notification of queue {} again (fd {}): {e}", m.name, rec.fd)))?;
        state.notify.remove(&key);
    }
    for rec in fds {
        let FdKind::Mqueue(m) = &rec.kind else { continue };
        let Some(name) = state.unlink.remove(&(m.dev, m.ino)) else { continue };
        let addr = task.put_path(scratch_off, syscall_name(&name))?;
        task.syscall("mq_unlink", libc::SYS_mq_unlink, &[addr])
            .map_err(|e| Error::Other(format!("unlink queue {name} (made again for an unlinked queue) again: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_status_line() {
        let s = parse_status("QSIZE:2          NOTIFY:0     SIGNO:10    NOTIFY_PID:25311 \n").unwrap();
        assert_eq!(s, Status { qsize: 2, notify: 0, signo: 10, notify_pid: 25311 });
        let t = parse_status("QSIZE:0          NOTIFY:2     SIGNO:0     NOTIFY_PID:7 ").unwrap();
        assert_eq!((t.notify, t.notify_pid), (SIGEV_THREAD, 7));
        assert!(parse_status("QSIZE:0 NOTIFY:0 SIGNO:0").unwrap_err().contains("NOTIFY_PID"));
        assert!(parse_status("QSIZE:-1 NOTIFY:0 SIGNO:0 NOTIFY_PID:0").is_err());
        assert!(parse_status("QSIZE:x NOTIFY:0 SIGNO:0 NOTIFY_PID:0").is_err());
    }

    #[test]
    fn unlinked_queues_come_back_under_names_of_their_own() {
        let rec = |name: &str, ino: u64, unlinked: bool| MqueueRecord { name: name.into(), dev: 9, ino, unlinked, queue: None };
        assert_eq!(restore_name(&rec("/jobs", 1, false)), "/jobs");
        let (a, b) = (restore_name(&rec("/jobs", 1, true)), restore_name(&rec("/jobs", 2, true)));
        assert_ne!(a, "/jobs");
        assert_ne!(a, b, "two unlinked queues of one name");
        assert!(a.starts_with('/') && !a[1..].contains('/') && a.len() < 255, "{a}: a name mq_open takes");
    }

    #[test]
    fn names_from_links() {
        assert_eq!(name_from_link("/jobs", false), Some("/jobs"));
        assert_eq!(name_from_link("/jobs (deleted)", true), Some("/jobs"));
        // A live queue whose name happens to end so keeps it.
        assert_eq!(name_from_link("/jobs (deleted)", false), Some("/jobs (deleted)"));
        assert_eq!(name_from_link("/", false), None);
        assert_eq!(name_from_link("/a/b", false), None);
        assert_eq!(name_from_link("jobs", false), None);
        assert_eq!(syscall_name("/jobs"), "jobs");
    }
}
