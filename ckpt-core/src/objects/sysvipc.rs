//! System V IPC: shared memory segments, semaphore sets and message queues, and the IPC
//! namespaces that hold them.
//!
//! The job runs in an IPC namespace of its own (the launcher and the restart create one with its
//! init), so every object of that namespace is the job's. So is every object of an IPC namespace
//! a process of the job made (`unshare --ipc`, a container runtime inside the job): those are
//! kept per namespace ([`IpcNamespacesRecord`]), each namespace made again by its first process
//! at restart (as UTS namespaces are, see `restart-tool`'s tree) and its objects created in it
//! before any process attaches a segment. A POSIX message queue belongs to an IPC namespace too
//! ([`super::mqueue`] makes it again from a process that holds it); one a process holds of
//! another IPC namespace than its own is refused ([`check_queues`]): a restart would make it in
//! the holder's. Capture and restore work from inside
//! that namespace ([`in_namespace_of`]): a helper thread of the agent that enters it (setns on
//! `/proc/<pid>/ns/ipc`; only that thread changes namespace) when the agent is privileged; for an
//! ordinary user, whose job's namespaces belong to the job's user namespaces, a helper process
//! ([`crate::nshelper`]) that enters the user namespace the IPC namespace belongs to first (the
//! process's own, or one above it: which only a single-threaded process may do, and which gives
//! it the capabilities the IPC namespace asks for). Either lists the objects in `/proc/sysvipc/*` (which shows the reading
//! thread's namespace), reads each one's owner, mode and contents with the ordinary calls
//! (IPC_STAT, shmat, GETALL, msgrcv with MSG_COPY, which reads a message without taking it), and
//! at restart creates each again at its id (`kernel.{shm,sem,msg}_next_id` of the new namespace),
//! before any process is rebuilt. Processes then attach their segments at their old addresses
//! ([`attach`]); a segment that was already removed (IPC_RMID while still attached) is removed
//! again once every process has attached it ([`remove_destroyed`]).
//!
//! Not restored: the creator's uid and gid (the restorer creates the objects), times and last
//! pids, and semaphore undo values (SEM_UNDO) of the processes.

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::descriptor::FdKind;
use super::memory::VmaRecord;
use super::namespaces::{MadeNamespaces, Member, StatefulKind};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::ipc;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SysvIpcRecord {
    pub shm: Vec<ShmRecord>,
    pub sem: Vec<SemRecord>,
    pub msg: Vec<MsgRecord>,
}

/// What every IPC object has: its id, key, owner and mode.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IpcPerm {
    pub id: i32,
    pub key: i32,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits, and for a segment SHM_DEST (removed, still attached) and SHM_LOCKED.
    pub mode: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShmRecord {
    pub perm: IpcPerm,
    pub size: u64,
    /// The contents, without the zero bytes at the end.
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SemRecord {
    pub perm: IpcPerm,
    pub values: Vec<u16>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MsgRecord {
    pub perm: IpcPerm,
    /// The queue's byte limit.
    pub qbytes: u64,
    /// Queued messages in order: (type, text).
    pub messages: Vec<(i64, Vec<u8>)>,
}

pub(crate) use ipc::SHM_DEST;
/// Largest total of segment contents a checkpoint keeps (they live in the node's record).
const MAX_SHM_BYTES: u64 = 256 << 20;

/// The ids in a `/proc/sysvipc/*` listing (pure): the second column of every line but the
/// header.
pub fn parse_ids(text: &str) -> std::result::Result<Vec<i32>, String> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let id = l.split_whitespace().nth(1).ok_or_else(|| format!("line {l:?}"))?;
            id.parse().map_err(|_| format!("id {id:?} in line {l:?}"))
        })
        .collect()
}

fn ids(kind: &str) -> Result<Vec<i32>> {
    let path = format!("/proc/sysvipc/{kind}");
    let text = std::fs::read_to_string(&path).context(|| format!("read {path}"))?;
    let mut ids = parse_ids(&text).map_err(|e| Error::Other(format!("{path}: {e}")))?;
    ids.sort_unstable();
    Ok(ids)
}

fn perm_of(id: i32, p: &libc::ipc_perm) -> IpcPerm {
    IpcPerm { id, key: p.__key, uid: p.uid, gid: p.gid, mode: p.mode as u32 }
}

/// A piece of work done inside one of the job's IPC namespaces.
#[derive(Debug, Serialize, Deserialize)]
pub enum Work {
    /// Read every object, and the device of the namespace's POSIX message queues if asked.
    Capture {
        mqueue_device: bool,
    },
    Restore(SysvIpcRecord),
    /// Remove these segments (IPC_RMID).
    Remove(Vec<i32>),
}

/// What a piece of [`Work`] found (nothing but for a capture).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Found {
    pub objects: SysvIpcRecord,
    /// The device number of the namespace's message queues (see
    /// [`super::mqueue::device_of_this_namespace`]), when asked and known.
    pub mqueue_device: Option<u64>,
}

/// Does `work` in the calling thread's IPC namespace.
pub(crate) fn work_here(work: &Work) -> Result<Found> {
    match work {
        Work::Capture { mqueue_device } => Ok(Found {
            objects: SysvIpcRecord { shm: capture_shm()?, sem: capture_sem()?, msg: capture_msg()? },
            mqueue_device: if *mqueue_device { super::mqueue::device_of_this_namespace()? } else { None },
        }),
        Work::Restore(rec) => {
            for s in &rec.shm {
                restore_shm(s)?;
            }
            for s in &rec.sem {
                restore_sem(s)?;
            }
            for m in &rec.msg {
                restore_msg(m)?;
            }
            Ok(Found::default())
        }
        Work::Remove(ids) => {
            for &id in ids {
                ipc::shm_remove(id).context(|| format!("remove segment {id} again"))?;
            }
            Ok(Found::default())
        }
    }
}

/// Does `work` in the IPC namespace of process `pid` (host pid), from a thread of ours or a
/// helper process (see the module's comment).
fn in_namespace_of(pid: Tid, work: Work) -> Result<Found> {
    if !crate::userns::privileged() {
        use crate::nshelper::{run, Enter, Work::SysvIpc};
        // The user namespace that owns it: the process's own, or one above (bubblewrap's).
        let answer = run(pid, &[Enter::OwnerOfIpc, Enter::Ipc], SysvIpc(work))?;
        return postcard::from_bytes(&answer).map_err(|e| Error::Other(format!("the System V IPC helper's answer: {e}")));
    }
    let path = format!("/proc/{pid}/ns/ipc");
    let ns: OwnedFd = std::fs::File::open(&path).context(|| format!("open {path}"))?.into();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Only this thread changes its IPC namespace.
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWIPC)
                .map_err(std::io::Error::from)
                .context(|| format!("enter the IPC namespace of pid {pid} ({path})"))?;
            work_here(&work)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Other("the System V IPC helper thread panicked".into())))
    })
}

/// The IPC namespaces the job made, each with its System V objects (the job's own are the
/// node record's `sysvipc`).
pub type IpcNamespacesRecord = MadeNamespaces<SysvIpcRecord>;

/// What IPC namespaces are to [`MadeNamespaces`].
pub const KIND: StatefulKind = StatefulKind { link: "ipc", name: "IPC" };

/// Captures every System V object of the job's IPC namespace and of each one the job made:
/// `init` is the job's init (host pid), `members` the job's processes in the order of
/// `records`, the image's. Refuses a message queue a process holds of another IPC namespace
/// than its own ([`check_queues`]).
pub fn capture(
    init: Tid,
    members: &[Member],
    users: &super::namespaces::UserNamespaces,
    records: &[super::ProcessRecord],
) -> Result<(SysvIpcRecord, IpcNamespacesRecord)> {
    let mqueue_device = records.iter().any(|r| r.fds.iter().any(|f| matches!(f.kind, FdKind::Mqueue(_))));
    let capture_one = |pid: Tid| {
        in_namespace_of(pid, Work::Capture { mqueue_device }).map_err(|e| match e {
            Error::Unsupported { .. } => e,
            other => Error::Other(format!("System V IPC: {other}")),
        })
    };
    let own = capture_one(init).map_err(|e| match e {
        Error::Other(m) => Error::Other(format!("the job's {m}")),
        e => e,
    })?;
    let mut devices = vec![own.mqueue_device];
    let made = MadeNamespaces::capture(KIND, init, members, users, |pid| {
        let found = capture_one(pid)?;
        devices.push(found.mqueue_device);
        Ok(found.objects)
    })?;
    check_queues(&made, &devices, records)?;
    Ok((own.objects, made))
}

/// One line per IPC namespace the job made, for `ckpt inspect`.
pub fn describe_namespaces(made: &IpcNamespacesRecord) -> Vec<String> {
    made.describe(KIND, |o| format!("{} shared memory segment(s), {} semaphore set(s), {} message queue(s) of System V", o.shm.len(), o.sem.len(), o.msg.len()))
}

/// Refuses a POSIX message queue a process holds of another IPC namespace than its own (it
/// opened the queue, then made a namespace of its own and kept the descriptor): a restart makes
/// a queue in the namespace of the process that opens it. A namespace's queues are the files of
/// its own mqueue file system: `devices` holds each namespace's device (the job's first, then
/// those of `made`'s in order; None where it is not known, and then only two namespaces holding
/// one queue can tell).
fn check_queues(made: &IpcNamespacesRecord, devices: &[Option<u64>], records: &[super::ProcessRecord]) -> Result<()> {
    let mut namespace_of_device: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for r in records {
        let ns = made.namespace_of(r.pid);
        for fd in &r.fds {
            let FdKind::Mqueue(q) = &fd.kind else { continue };
            let foreign = match devices.get(ns).copied().flatten() {
                Some(dev) => q.dev != dev,
                None => devices.iter().enumerate().any(|(other, d)| other != ns && *d == Some(q.dev)) || *namespace_of_device.entry(q.dev).or_insert(ns) != ns,
            };
            if foreign {
                return Err(Error::Unsupported {
                    pid: r.pid,
                    what: format!(
                        "message queue {} (fd {}) of another IPC namespace than its own (opened before unshare --ipc?): \
                         a restart would make it in its own",
                        q.name, fd.fd
                    ),
                });
            }
        }
    }
    Ok(())
}

fn capture_shm() -> Result<Vec<ShmRecord>> {
    let mut out = Vec::new();
    let mut total = 0;
    for id in ids("shm")? {
        let ds = ipc::shm_stat(id).context(|| format!("shmctl(IPC_STAT) of segment {id}"))?;
        let size = ds.shm_segsz as u64;
        total += size;
        if total > MAX_SHM_BYTES {
            return Err(Error::Unsupported { pid: 0, what: format!("System V shared memory of more than {MAX_SHM_BYTES} bytes (segment {id})") });
        }
        let mut data = ipc::Attached::new(id, false).context(|| format!("shmat segment {id} to read it"))?.bytes().to_vec();
        let used = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        data.truncate(used);
        out.push(ShmRecord { perm: perm_of(id, &ds.shm_perm), size, data });
    }
    Ok(out)
}

fn capture_sem() -> Result<Vec<SemRecord>> {
    let mut out = Vec::new();
    for id in ids("sem")? {
        let ds = ipc::sem_stat(id).context(|| format!("semctl(IPC_STAT) of semaphore set {id}"))?;
        let values = ipc::sem_values(id).context(|| format!("semctl(GETALL) of semaphore set {id}"))?;
        out.push(SemRecord { perm: perm_of(id, &ds.sem_perm), values });
    }
    Ok(out)
}

fn capture_msg() -> Result<Vec<MsgRecord>> {
    let mut out = Vec::new();
    for id in ids("msg")? {
        let ds = ipc::msg_stat(id).context(|| format!("msgctl(IPC_STAT) of message queue {id}"))?;
        let max = ds.msg_qbytes.max(ds.__msg_cbytes) as usize;
        let messages = (0..ds.msg_qnum as usize)
            .map(|i| ipc::msg_copy(id, i, max).context(|| format!("read message {i} of queue {id} (msgrcv MSG_COPY, needs CONFIG_CHECKPOINT_RESTORE)")))
            .collect::<Result<Vec<_>>>()?;
        out.push(MsgRecord { perm: perm_of(id, &ds.msg_perm), qbytes: ds.msg_qbytes as u64, messages });
    }
    Ok(out)
}

fn set_next_id(kind: &str, id: i32) -> Result<()> {
    let path = format!("/proc/sys/kernel/{kind}_next_id");
    std::fs::write(&path, id.to_string()).context(|| format!("write {id} to {path} (in the job's IPC namespace)"))?;
    Ok(())
}

/// The id an object of `kind` was created with (`made`), which must be the record's.
fn check_id(kind: &str, made: std::io::Result<i32>, want: &IpcPerm) -> Result<i32> {
    let got = made.context(|| format!("create {kind} {} (key {:#x})", want.id, want.key))?;
    if got != want.id {
        return Err(Error::Other(format!("{kind} {} (key {:#x}) was created with id {got}", want.id, want.key)));
    }
    Ok(got)
}

fn set_perm(p: &mut libc::ipc_perm, want: &IpcPerm) {
    p.uid = want.uid;
    p.gid = want.gid;
    p.mode = (want.mode & 0o777) as _;
}

/// Creates every object of the record again, at its id, in the IPC namespace of process `pid`
/// (host pid; a process of the restarted job, whose namespace is new and empty).
pub fn restore(rec: &SysvIpcRecord, pid: Tid) -> Result<()> {
    if *rec == SysvIpcRecord::default() {
        return Ok(());
    }
    in_namespace_of(pid, Work::Restore(rec.clone())).map(drop).map_err(|e| Error::Other(format!("restore System V IPC: {e}")))
}

fn create_flags(p: &IpcPerm) -> i32 {
    libc::IPC_CREAT | libc::IPC_EXCL | (p.mode & 0o777) as i32
}

fn restore_shm(s: &ShmRecord) -> Result<()> {
    // The contents are copied into the segment below: never more than it holds (validation
    // refuses such a record too; this is the check at the site, where the write happens).
    let size = usize::try_from(s.size).ok().filter(|&n| n >= s.data.len()).ok_or_else(|| Error::Forged {
        what: format!("System V segment {}: {} bytes of contents for a segment of {} bytes", s.perm.id, s.data.len(), s.size),
    })?;
    set_next_id("shm", s.perm.id)?;
    let id = check_id("shared memory segment", ipc::shm_get(s.perm.key, size, create_flags(&s.perm)), &s.perm)?;
    if !s.data.is_empty() {
        // The segment made is the one asked for (IPC_EXCL), but the copy below fits what the
        // kernel holds, whatever the record says.
        let mut segment = ipc::Attached::new(id, true).context(|| format!("shmat segment {id} to fill it"))?;
        let held = segment.bytes().len();
        let into = segment
            .bytes_mut()
            .get_mut(..s.data.len())
            .ok_or_else(|| Error::Forged { what: format!("System V segment {id}: {} bytes of contents for a segment of {held} bytes", s.data.len()) })?;
        into.copy_from_slice(&s.data);
    }
    let mut ds = ipc::shm_stat(id).context(|| format!("shmctl(IPC_STAT) of segment {id}"))?;
    set_perm(&mut ds.shm_perm, &s.perm);
    ipc::shm_set(id, &ds).context(|| format!("shmctl(IPC_SET) of segment {id}"))?;
    Ok(())
}

fn restore_sem(s: &SemRecord) -> Result<()> {
    set_next_id("sem", s.perm.id)?;
    let id = check_id("semaphore set", ipc::sem_get(s.perm.key, s.values.len() as i32, create_flags(&s.perm)), &s.perm)?;
    ipc::set_sem_values(id, &s.values).context(|| format!("semctl(SETALL) of semaphore set {id}"))?;
    let mut ds = ipc::sem_stat(id).context(|| format!("semctl(IPC_STAT) of semaphore set {id}"))?;
    set_perm(&mut ds.sem_perm, &s.perm);
    ipc::sem_set(id, &ds).context(|| format!("semctl(IPC_SET) of semaphore set {id}"))?;
    Ok(())
}

fn restore_msg(m: &MsgRecord) -> Result<()> {
    set_next_id("msg", m.perm.id)?;
    let id = check_id("message queue", ipc::msg_get(m.perm.key, create_flags(&m.perm)), &m.perm)?;
    let mut ds = ipc::msg_stat(id).context(|| format!("msgctl(IPC_STAT) of queue {id}"))?;
    // The byte limit first, so that every queued message fits again.
    ds.msg_qbytes = m.qbytes as _;
    set_perm(&mut ds.msg_perm, &m.perm);
    ipc::msg_set(id, &ds).context(|| format!("msgctl(IPC_SET) of queue {id} (byte limit {})", m.qbytes))?;
    for (mtype, text) in &m.messages {
        ipc::msg_send(id, *mtype, text).context(|| format!("queue a message of {} bytes on queue {id}", text.len()))?;
    }
    Ok(())
}

/// Removes again, once every process has attached them, the segments that were removed while
/// still attached, in the IPC namespace of process `pid` (host pid).
pub fn remove_destroyed(rec: &SysvIpcRecord, pid: Tid) -> Result<()> {
    let dead: Vec<i32> = rec.shm.iter().filter(|s| s.perm.mode & SHM_DEST != 0).map(|s| s.perm.id).collect();
    if dead.is_empty() {
        return Ok(());
    }
    in_namespace_of(pid, Work::Remove(dead)).map(drop)
}

/// Attaches segment `shmid` inside the task so that exactly `vma` (a part of the segment, at its
/// offset in it) is mapped at its address with its protection. The segment is attached where the
/// kernel chooses, the VMA's part moved into place, and the rest detached.
pub fn attach(task: &mut RemoteTask, vma: &VmaRecord, shmid: i32, size: u64) -> Result<()> {
    let what = || format!("attach System V segment {shmid} at {:#x}-{:#x}", vma.start, vma.end);
    let readonly = if vma.prot & libc::PROT_WRITE as u32 == 0 { libc::SHM_RDONLY } else { 0 };
    let exec = if vma.prot & libc::PROT_EXEC as u32 != 0 { libc::SHM_EXEC } else { 0 };
    let base = task.syscall("shmat", libc::SYS_shmat, &[shmid as u64, 0, (readonly | exec) as u64]).context(what)?;
    // Saturating: validation keeps the VMA inside the segment, and a record that got past it
    // makes a call fail, not the arithmetic wrap.
    let size = size.div_ceil(crate::PAGE_SIZE).saturating_mul(crate::PAGE_SIZE);
    let part = base.saturating_add(vma.file_offset);
    task.syscall("mremap", libc::SYS_mremap, &[part, vma.len(), vma.len(), (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64, vma.start]).context(what)?;
    if vma.file_offset > 0 {
        task.syscall("munmap", libc::SYS_munmap, &[base, vma.file_offset]).context(what)?;
    }
    let after = vma.file_offset.saturating_add(vma.len());
    if after < size {
        task.syscall("munmap", libc::SYS_munmap, &[base.saturating_add(after), size - after]).context(what)?;
    }
    task.syscall("mprotect", libc::SYS_mprotect, &[vma.start, vma.len(), vma.prot as u64]).context(what)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ids_from_proc_listings() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   1234567890          0   600                 65536  1234  1234      1     0     0     0     0 1700000000          0 1700000000                 65536                     0\n\
                            0      32769  1600                  4096  1234  1234      2     0     0     0     0          0          0 1700000000                     0                     0\n";
        assert_eq!(parse_ids(shm), Ok(vec![0, 32769]));
        assert_eq!(
            parse_ids("       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime\n"),
            Ok(vec![])
        );
        assert!(parse_ids("header\n  12 x 600\n").unwrap_err().contains("id"));
    }
}
