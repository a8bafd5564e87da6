//! File locks a descriptor holds: flock(2) locks and OFD locks (owned by the open file
//! description) and POSIX record locks (owned by the process, taken through this descriptor).
//!
//! fdinfo shows, on each descriptor, the locks taken through its description by their owner (the
//! description itself, or the process for POSIX locks); processes waiting for a lock are not
//! listed, and ask again after a restart since their system call is repeated. Restore takes each
//! lock again, without waiting, once every descriptor of the process is open: a lock that cannot
//! be had is held by someone outside the job, and the restart stops saying so. A description
//! shared by several processes shows its flock and OFD locks in each; taking one again through
//! the same description is a no-op.
//!
//! Leases (F_SETLEASE) are taken again the same way, by the process whose descriptor shows
//! them, which the kernel makes the file's owner for the lease's signal (SIGIO; a signal chosen
//! with F_SETSIG is not kept). A lease being broken (an open of the file that conflicts with it
//! waits for the holder to give it up, or gave up waiting: O_NONBLOCK) is taken again as it was
//! before the break, once per open file description (a second F_SETLEASE through it would end
//! the break), and broken again by an open of the file from the restorer that conflicts the same
//! way, without waiting. The holder was told of the break before the checkpoint: this second
//! break's signal is not sent (no owner while the file is opened, set back after). The kernel's
//! break timer starts anew (/proc/sys/fs/lease-break-time, 45 s by default); an opener that
//! waited is in the job and opens again after the restart, or is outside it and was let through
//! when the old holder ended.

use serde::{Deserialize, Serialize};

use std::os::unix::fs::OpenOptionsExt;

use super::descriptor::{FdRecord, RestoreCtx};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum LockKind {
    /// flock(2): the whole file, owned by the open file description.
    Flock,
    /// fcntl(F_SETLK): a range, owned by the process.
    Posix,
    /// fcntl(F_OFD_SETLK): a range, owned by the open file description.
    Ofd,
    /// fcntl(F_SETLEASE): a read or write lease on the whole file, held through the open file
    /// description by the process that took it (the lease's signal goes to it). Added last:
    /// images without it decode as before.
    Lease,
    /// A lease being broken, to a read lease or to none (`to_read`); the record's `write` is
    /// its type before the break. The kernel shows only the type it breaks to: a break to a
    /// read lease is a write lease's; a break to none is taken as a write lease's where the
    /// description was opened for writing (no read lease can be had so), else as a read
    /// lease's (a write lease held through a description opened to read breaks the same way).
    /// Since format 33.
    LeaseBreaking { to_read: bool },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct LockRecord {
    pub kind: LockKind,
    /// A write (exclusive) lock; else a read (shared) one.
    pub write: bool,
    /// The first byte locked.
    pub start: u64,
    /// The last byte locked; `None` to the end of the file, however far it grows.
    pub end: Option<u64>,
}

/// Reads the locks from a descriptor's fdinfo text (pure). Leases being broken, delegations
/// and unknown kinds are refused with what they are.
pub fn parse(text: &str) -> std::result::Result<Vec<LockRecord>, String> {
    let mut out = Vec::new();
    let opened_for_writing = crate::procfs::FdInfo::parse(text).flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
    for line in text.lines().filter_map(|l| l.strip_prefix("lock:")) {
        // "1: POSIX  ADVISORY  WRITE 16542 fe:00:10051593 10 29"; "-> ..." is a waiter.
        let words: Vec<&str> = line.split_whitespace().collect();
        let (kind, mode, access, start, end) = match words.as_slice() {
            [_, "->", ..] => continue,
            [_, kind, mode, access, _pid, _id, start, end] => (*kind, *mode, *access, *start, *end),
            _ => return Err(format!("unexpected lock line {line:?}")),
        };
        let kind = match kind {
            "FLOCK" => LockKind::Flock,
            "POSIX" => LockKind::Posix,
            "OFDLCK" => LockKind::Ofd,
            "LEASE" => LockKind::Lease,
            "DELEG" => return Err("an NFS delegation".into()),
            other => return Err(format!("a lock of kind {other}")),
        };
        let (kind, write) = match (kind, mode, access) {
            (LockKind::Lease, "BREAKING", "READ") => (LockKind::LeaseBreaking { to_read: true }, true),
            (LockKind::Lease, "BREAKING", "UNLCK") => (LockKind::LeaseBreaking { to_read: false }, opened_for_writing),
            (LockKind::Lease, "BREAKING", other) => return Err(format!("a lease being broken to {other}")),
            (LockKind::Lease, "ACTIVE", _) | (_, "ADVISORY", _) => match access {
                "READ" => (kind, false),
                "WRITE" => (kind, true),
                other => return Err(format!("a lock for {other}")),
            },
            (LockKind::Lease, mode, _) => return Err(format!("a lease {mode}")),
            (_, mode, _) => return Err(format!("a {mode} lock")),
        };
        let start = start.parse().map_err(|_| format!("lock start {start:?}"))?;
        let end = match end {
            "EOF" => None,
            n => Some(n.parse().map_err(|_| format!("lock end {n:?}"))?),
        };
        out.push(LockRecord { kind, write, start, end });
    }
    Ok(out)
}

/// The locks held through the descriptor `fd` of a stopped process, from its fdinfo text.
pub fn from_fdinfo(pid: Tid, fd: i32, text: &str) -> Result<Vec<LockRecord>> {
    parse(text).map_err(|what| Error::Unsupported { pid, what: format!("fd {fd} (holding {what})") })
}

/// Inodes that some lock is held on or waited for, from the kernel's table of every lock
/// (/proc/locks). Reading it costs one RCU grace period (the kernel blocks lock changes while it
/// lists them; a few milliseconds) however many locks there are, so it is read once, for many
/// descriptors whose fdinfo is not read. An inode of another device with the same number only
/// makes capture read a descriptor's fdinfo needlessly.
pub fn locked_inodes() -> Result<std::collections::HashSet<u64>> {
    let text = std::fs::read_to_string("/proc/locks").map_err(|e| Error::Other(format!("read /proc/locks: {e}")))?;
    Ok(parse_locked_inodes(&text))
}

/// The inodes of /proc/locks lines ("1: FLOCK  ADVISORY  WRITE 23406 00:09:925115 0 EOF"). Pure.
fn parse_locked_inodes(text: &str) -> std::collections::HashSet<u64> {
    text.lines()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| {
            let mut parts = w.split(':');
            let (maj, min, ino) = (parts.next()?, parts.next()?, parts.next()?);
            let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
            (parts.next().is_none() && hex(maj) && hex(min)).then(|| ino.parse().ok()).flatten()
        })
        .collect()
}

/// struct flock as fcntl reads it on x86_64: l_type, l_whence (i16), l_start, l_len (i64),
/// l_pid (i32), padded to 32 bytes.
fn flock_struct(l: &LockRecord) -> [u8; 32] {
    let l_type = if l.write { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
    // A length of 0 locks to the end of the file.
    let len = l.end.map_or(0, |end| end - l.start + 1);
    let mut s = [0u8; 32];
    s[0..2].copy_from_slice(&l_type.to_le_bytes());
    s[2..4].copy_from_slice(&(libc::SEEK_SET as i16).to_le_bytes());
    s[8..16].copy_from_slice(&l.start.to_le_bytes());
    s[16..24].copy_from_slice(&len.to_le_bytes());
    s
}

/// Takes every lock of the process's descriptors again, inside the task (`ns_pid` in the job),
/// once all are open.
pub fn restore(task: &mut RemoteTask, ns_pid: Tid, fds: &[FdRecord], ctx: &RestoreCtx, scratch_off: usize) -> Result<()> {
    for rec in fds {
        for l in &rec.locks {
            let fd = rec.fd as u64;
            if let LockKind::LeaseBreaking { to_read } = l.kind {
                // Once per description: by the descriptor that opened it again.
                if ctx.holder(rec.description) == Some((ns_pid, rec.fd)) {
                    restore_breaking(task, rec.fd, l.write, to_read)?;
                }
                continue;
            }
            let r = match l.kind {
                LockKind::Flock => {
                    let op = if l.write { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
                    task.syscall("flock", libc::SYS_flock, &[fd, op as u64])
                }
                LockKind::Posix | LockKind::Ofd => {
                    let cmd = if l.kind == LockKind::Posix { libc::F_SETLK } else { libc::F_OFD_SETLK };
                    let addr = task.put(scratch_off, &flock_struct(l))?;
                    task.syscall("fcntl(F_SETLK)", libc::SYS_fcntl, &[fd, cmd as u64, addr])
                }
                LockKind::Lease => {
                    let kind = if l.write { libc::F_WRLCK } else { libc::F_RDLCK };
                    task.syscall("fcntl(F_SETLEASE)", libc::SYS_fcntl, &[fd, libc::F_SETLEASE as u64, kind as u64])
                }
                LockKind::LeaseBreaking { .. } => unreachable!("restored above"),
            };
            r.map_err(|e| {
                let range = l.end.map_or(format!("{}..EOF", l.start), |end| format!("{}..={end}", l.start));
                Error::Other(format!(
                    "fd {}: take the {:?} {} lock on bytes {range} again: {e} (held now by a process outside the job, or for a lease, the file open for writing elsewhere?)",
                    rec.fd,
                    l.kind,
                    if l.write { "write" } else { "read" }
                ))
            })?;
        }
    }
    Ok(())
}

/// A lease being broken, made again (see the module's comment): taken as it was before the
/// break, then broken by the restorer's open of the file through the task's descriptor, to
/// read for a break to a read lease, to write for a break to none.
fn restore_breaking(task: &mut RemoteTask, fd: i32, write: bool, to_read: bool) -> Result<()> {
    let what = |e: &dyn std::fmt::Display| {
        Error::Other(format!(
            "fd {fd}: take the {} lease being broken to {} again: {e}",
            if write { "write" } else { "read" },
            if to_read { "a read lease" } else { "none" }
        ))
    };
    let kind = if write { libc::F_WRLCK } else { libc::F_RDLCK };
    task.syscall("fcntl(F_SETLEASE)", libc::SYS_fcntl, &[fd as u64, libc::F_SETLEASE as u64, kind as u64])
        .map_err(|e| what(&format!("{e} (the file open for writing elsewhere?)")))?;
    task.syscall("fcntl(F_SETOWN)", libc::SYS_fcntl, &[fd as u64, libc::F_SETOWN as u64, 0])?;
    let access = if to_read { libc::O_RDONLY } else { libc::O_WRONLY };
    let opened = std::fs::OpenOptions::new()
        .read(to_read)
        .write(!to_read)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC | access)
        .open(format!("/proc/{}/fd/{fd}", task.pid));
    match opened {
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
        Err(e) => return Err(what(&format!("open the file to break it: {e}"))),
        Ok(_) => return Err(what(&"open the file to break it: the open went through, the lease did not stop it")),
    }
    let pid = task.syscall("getpid", libc::SYS_getpid, &[])?;
    task.syscall("fcntl(F_SETOWN)", libc::SYS_fcntl, &[fd as u64, libc::F_SETOWN as u64, pid])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_skips_waiters() {
        let text = "pos:\t0\nflags:\t0100002\nmnt_id:\t27\nino:\t10051593\n\
                    lock:\t1: POSIX  ADVISORY  WRITE 16542 fe:00:10051593 10 29\n\
                    lock:\t2: POSIX  ADVISORY  READ 16542 fe:00:10051593 100 EOF\n\
                    lock:\t3: FLOCK  ADVISORY  READ 16542 fe:00:10051591 0 EOF\n\
                    lock:\t3: -> FLOCK  ADVISORY  WRITE 16543 fe:00:10051591 0 EOF\n\
                    lock:\t4: OFDLCK ADVISORY  READ -1 fe:00:10051594 0 4\n";
        assert_eq!(
            parse(text),
            Ok(vec![
                LockRecord { kind: LockKind::Posix, write: true, start: 10, end: Some(29) },
                LockRecord { kind: LockKind::Posix, write: false, start: 100, end: None },
                LockRecord { kind: LockKind::Flock, write: false, start: 0, end: None },
                LockRecord { kind: LockKind::Ofd, write: false, start: 0, end: Some(4) },
            ])
        );
        assert_eq!(parse("pos:\t0\n"), Ok(vec![]));
    }

    #[test]
    fn inodes_of_the_lock_table() {
        let text = "1: FLOCK  ADVISORY  WRITE 23406 00:09:925115 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 23406 fe:01:17 0 9\n\
                    2: -> POSIX  ADVISORY  WRITE 23407 fe:01:17 0 9\n\
                    3: OFDLCK ADVISORY  READ  -1 00:09:925116 0 EOF\n";
        assert_eq!(parse_locked_inodes(text), [925115, 17, 925116].into_iter().collect());
        assert!(parse_locked_inodes("").is_empty());
    }

    #[test]
    fn reads_leases_active_and_being_broken() {
        let lease = "lock:\t1: LEASE  ACTIVE    READ 16542 fe:00:10051593 0 EOF\n";
        assert_eq!(parse(lease), Ok(vec![LockRecord { kind: LockKind::Lease, write: false, start: 0, end: None }]));
        let breaking = |flags: &str, to: &str| parse(&format!("flags:\t{flags}\nlock:\t1: LEASE  BREAKING  {to} 16542 fe:00:10051593 0 EOF\n"));
        let broken = |to_read, write| Ok(vec![LockRecord { kind: LockKind::LeaseBreaking { to_read }, write, start: 0, end: None }]);
        // To a read lease: only a write lease breaks so, whatever the description's access.
        assert_eq!(breaking("0100000", "READ"), broken(true, true));
        // To none: a write lease where the description was opened for writing (or both).
        assert_eq!(breaking("0100001", "UNLCK"), broken(false, true));
        assert_eq!(breaking("02", "UNLCK"), broken(false, true));
        assert_eq!(breaking("0100000", "UNLCK"), broken(false, false));
        assert_eq!(breaking("0", "WRITE"), Err("a lease being broken to WRITE".into()));
        assert_eq!(parse("lock:\t1: DELEG  ACTIVE    READ 1 fe:00:1 0 EOF\n"), Err("an NFS delegation".into()));
        assert!(parse("lock:\t1: POSIX\n").is_err());
    }

    #[test]
    fn flock_struct_layout() {
        let s = flock_struct(&LockRecord { kind: LockKind::Posix, write: true, start: 10, end: Some(29) });
        assert_eq!(i16::from_le_bytes([s[0], s[1]]), libc::F_WRLCK as i16);
        assert_eq!(i64::from_le_bytes(s[8..16].try_into().unwrap()), 10);
        assert_eq!(i64::from_le_bytes(s[16..24].try_into().unwrap()), 20);
        let eof = flock_struct(&LockRecord { kind: LockKind::Ofd, write: false, start: 100, end: None });
        assert_eq!(i16::from_le_bytes([eof[0], eof[1]]), libc::F_RDLCK as i16);
        assert_eq!(i64::from_le_bytes(eof[16..24].try_into().unwrap()), 0);
    }
}
