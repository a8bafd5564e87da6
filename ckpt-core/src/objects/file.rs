//! Descriptors: regular files (path, flags, offset, identity and size), character devices such as
//! /dev/null, and stdio inherited from the launcher (bound at restart to the restart's own stdio).

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

/// Device and inode of the launcher's stdin, stdout and stderr, to recognise the job's stdio.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdioIds(pub [Option<(u64, u64)>; 3]);

impl StdioIds {
    /// The identities of this process's own fds 0, 1 and 2.
    pub fn of_self() -> StdioIds {
        let id = |fd: i32| std::fs::metadata(format!("/proc/self/fd/{fd}")).ok().map(|m| (m.dev(), m.ino()));
        StdioIds([id(0), id(1), id(2)])
    }

    fn which(&self, dev: u64, ino: u64) -> Option<u8> {
        self.0.iter().position(|s| *s == Some((dev, ino))).map(|i| i as u8)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FdKind {
    /// A regular file or directory. `size` is its size at the checkpoint.
    File { path: String, dev: u64, ino: u64, size: u64 },
    /// A character device reopened by path (/dev/null, /dev/zero, /dev/urandom, ...).
    CharDevice { path: String },
    /// The launcher's stdin (0), stdout (1) or stderr (2); the restart binds its own.
    Stdio { which: u8 },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FdRecord {
    pub fd: i32,
    /// Open flags (O_ACCMODE, O_APPEND, O_NONBLOCK, O_CLOEXEC, ...).
    pub flags: u32,
    pub pos: u64,
    pub kind: FdKind,
}

impl FdRecord {
    pub fn writable(&self) -> bool {
        let acc = self.flags & libc::O_ACCMODE as u32;
        acc == libc::O_WRONLY as u32 || acc == libc::O_RDWR as u32
    }
}

const REOPENABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

pub fn capture(pid: Tid, stdio: &StdioIds) -> Result<Vec<FdRecord>> {
    let mut out = Vec::new();
    for fd in procfs::fds(pid)? {
        let link = format!("/proc/{pid}/fd/{fd}");
        let target = procfs::readlink(&link)?;
        let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({target})"))?;
        let info = procfs::fdinfo(pid, fd)?;
        // Devices like /dev/null are reopened as they were even when the launcher's stdio is the
        // same device: its mode (say, stdin read-only) need not be the job's.
        let kind = if REOPENABLE_DEVICES.contains(&target.as_str()) {
            FdKind::CharDevice { path: target }
        } else if let Some(which) = stdio.which(meta.dev(), meta.ino()) {
            FdKind::Stdio { which }
        } else if meta.file_type().is_file() || meta.file_type().is_dir() {
            if target.ends_with(" (deleted)") || !target.starts_with('/') {
                return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, a deleted file)") });
            }
            FdKind::File { path: target, dev: meta.dev(), ino: meta.ino(), size: meta.size() }
        } else {
            return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target})") });
        };
        out.push(FdRecord { fd, flags: info.flags, pos: info.pos, kind });
    }
    Ok(out)
}

/// What restart does with a file the job had open for writing that has grown since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrownFiles {
    /// Cut it back to its size at the checkpoint: the job will write the rest again.
    Truncate,
    /// Leave it as it is.
    Keep,
}

/// Checks that each file is the one the job had, and puts files open for writing back to their
/// size at the checkpoint. Runs before any process is created, so a refusal leaves nothing behind.
pub fn check_and_prepare(fds: &[FdRecord], grown: GrownFiles) -> Result<()> {
    for rec in fds {
        let FdKind::File { path, dev, ino, size } = &rec.kind else { continue };
        let changed = |problem: String| Error::FileChanged { path: path.clone(), problem };
        let meta = std::fs::metadata(path).map_err(|e| changed(format!("file is gone ({e})")))?;
        if (meta.dev(), meta.ino()) != (*dev, *ino) {
            return Err(changed("file was replaced by another file (different inode)".into()));
        }
        if meta.is_dir() {
            continue;
        }
        if meta.size() < *size {
            return Err(changed(format!("file shrank from {size} to {} bytes since the checkpoint", meta.size())));
        }
        if meta.size() > *size {
            if !rec.writable() {
                return Err(changed(format!("file grew from {size} to {} bytes since the checkpoint", meta.size())));
            }
            if grown == GrownFiles::Truncate {
                let f = std::fs::OpenOptions::new().write(true).open(path).context(|| format!("open {path} to cut it back"))?;
                f.set_len(*size).context(|| format!("truncate {path} to its checkpoint size {size}"))?;
            }
        }
    }
    Ok(())
}

/// Recreates the descriptors inside the task. The task starts with the restart's stdio at 0, 1, 2
/// and nothing else; `scratch_off` is where paths are passed.
pub fn restore(task: &mut RemoteTask, fds: &[FdRecord], scratch_off: usize) -> Result<()> {
    // Whatever the empty process still holds of its creator's beyond stdio goes first.
    for fd in procfs::fds(task.pid)?.into_iter().filter(|&fd| fd > 2) {
        task.syscall("close", libc::SYS_close, &[fd as u64])?;
    }
    // Park the restart's stdio above every descriptor the job uses, then build the table.
    let park = fds.iter().map(|r| r.fd).max().unwrap_or(2).max(2) as u64 + 1;
    for std_fd in 0..3u64 {
        task.syscall("dup3", libc::SYS_dup3, &[std_fd, park + std_fd, libc::O_CLOEXEC as u64])?;
        task.syscall("close", libc::SYS_close, &[std_fd])?;
    }
    for rec in fds {
        let cloexec = if rec.flags & libc::O_CLOEXEC as u32 != 0 { libc::O_CLOEXEC as u64 } else { 0 };
        let opened = match &rec.kind {
            FdKind::Stdio { which } => park + *which as u64,
            FdKind::File { path, .. } | FdKind::CharDevice { path } => {
                let addr = task.put_path(scratch_off, path)?;
                let flags = rec.flags & !((libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_NOCTTY) as u32);
                task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, (flags | libc::O_NOCTTY as u32) as u64, 0])
                    .context(|| format!("reopen fd {} ({path})", rec.fd))?
            }
        };
        if opened != rec.fd as u64 {
            task.syscall("dup3", libc::SYS_dup3, &[opened, rec.fd as u64, cloexec])?;
            if !matches!(rec.kind, FdKind::Stdio { .. }) {
                task.syscall("close", libc::SYS_close, &[opened])?;
            }
        } else if cloexec == 0 && matches!(rec.kind, FdKind::Stdio { .. }) {
            unreachable!("parked stdio is above every job descriptor");
        }
        if matches!(rec.kind, FdKind::File { .. }) {
            task.syscall("lseek", libc::SYS_lseek, &[rec.fd as u64, rec.pos, libc::SEEK_SET as u64])
                .context(|| format!("seek fd {} to {}", rec.fd, rec.pos))?;
        }
    }
    for std_fd in 0..3u64 {
        task.syscall("close", libc::SYS_close, &[park + std_fd])?;
    }
    Ok(())
}
