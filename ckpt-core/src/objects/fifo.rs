//! FIFOs (named pipes): the path, and the bytes in the FIFO at the checkpoint.
//!
//! Capture reads the bytes without taking them out, as for pipes ([`super::pipe::peek`]); they
//! are kept once per FIFO, with its first descriptor. Restore opens the FIFO by its path, first
//! through a holder open for both reading and writing: opening one end of a FIFO waits for the
//! other end, and the holder is both. The holder also keeps the FIFO's buffer, with the bytes put
//! back into it, alive until every process has its descriptors; it is parked, and closed at the
//! end of the restore.
//!
//! A FIFO whose name was removed while the job held it open (its path shows ` (deleted)`) is
//! made again under its old name (or beside it, if something took the name) for the moment the
//! holder opens it, and its name removed again: the job's descriptors are then opened through
//! the holder's (`/proc/PID/fd/N`), as the name is gone.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

use serde::{Deserialize, Serialize};

use super::descriptor::{self, CaptureCtx, DescriptorKind, FdRecord, Opening, RestoreCtx};
use super::{file, pipe};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FifoRecord {
    pub path: String,
    /// The FIFO's identity, checked at restore.
    pub dev: u64,
    pub ino: u64,
    pub capacity: u32,
    /// The bytes in the FIFO, carried by its first descriptor captured (the others have `None`).
    pub data: Option<Vec<u8>>,
}

impl std::fmt::Debug for FifoRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoRecord")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .field("capacity", &self.capacity)
            .field("data", &self.data.as_ref().map(|d| format!("{} bytes", d.len())))
            .finish()
    }
}

/// Captures a descriptor on a FIFO of a stopped process; `path` is where the FIFO is.
pub fn capture(pid: Tid, fd: i32, path: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<FifoRecord> {
    // A read side of our own on the same FIFO. Non-blocking, an open for reading never waits.
    let link = format!("/proc/{pid}/fd/{fd}");
    let handle = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&link).context(|| format!("open {link} ({path}) to read the FIFO"))?;
    let capacity =
        nix::fcntl::fcntl(&handle, nix::fcntl::FcntlArg::F_GETPIPE_SZ).map_err(std::io::Error::from).context(|| format!("size of the FIFO {path}"))?;
    let first = ctx.objects_seen.insert((meta.dev(), meta.ino()));
    let data = if first { Some(pipe::peek(&handle, capacity as usize)?) } else { None };
    Ok(FifoRecord { path: path.to_string(), dev: meta.dev(), ino: meta.ino(), capacity: capacity as u32, data })
}

/// Checks that the path is still the FIFO the job had (in another boot, by its inode alone:
/// devices are numbered anew).
fn check(f: &FifoRecord, elsewhere: bool) -> Result<()> {
    let changed = |problem: String| Error::FileChanged { path: f.path.clone(), problem };
    let meta = std::fs::metadata(&f.path).map_err(|e| changed(format!("FIFO is gone ({e})")))?;
    if !meta.file_type().is_fifo() {
        return Err(changed("is no longer a FIFO".into()));
    }
    if meta.ino() != f.ino || (!elsewhere && meta.dev() != f.dev) {
        return Err(changed("FIFO was replaced by another one (different inode)".into()));
    }
    Ok(())
}

impl DescriptorKind for FifoRecord {
    fn describe(&self) -> String {
        format!("FIFO {}", self.path)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.scratch_off, at.work_base)
    }
}

/// Opens the record's end of the FIFO inside the task (recreating its contents the first time).
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, f: &FifoRecord, ctx: &mut RestoreCtx, scratch_off: usize, work_base: u64) -> Result<u64> {
    let unlinked = f.path.strip_suffix(" (deleted)");
    if !ctx.objects.contains_key(&(f.dev, f.ino)) {
        let at = match unlinked {
            None if std::fs::symlink_metadata(&f.path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) => {
                // A FIFO keeps nothing on disk: one gone since (from a tmpfs, on another node or
                // after a reboot: an Open MPI job's session directory) is made again at its
                // place, by the process, and filled from the image as any.
                let addr = task.put_path(scratch_off, &f.path)?;
                task.syscall("mknodat", libc::SYS_mknodat, &[libc::AT_FDCWD as u64, addr, (libc::S_IFIFO | 0o600) as u64, 0])
                    .context(|| format!("make the FIFO {} again", f.path))?;
                f.path.clone()
            }
            None => {
                check(f, ctx.elsewhere)?;
                f.path.clone()
            }
            Some(path) => {
                let mknod =
                    |t: &mut RemoteTask, addr| t.syscall("mknodat", libc::SYS_mknodat, &[libc::AT_FDCWD as u64, addr, (libc::S_IFIFO | 0o600) as u64, 0]);
                file::make_for_a_moment(task, path, ".ckpt-removed-fifo", "removed FIFO", scratch_off, mknod)?.0
            }
        };
        let addr = task.put_path(scratch_off, &at)?;
        let flags = libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let holder =
            task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0]).context(|| format!("open the FIFO {}", f.path))?;
        if unlinked.is_some() {
            let addr = task.put_path(scratch_off, &at)?;
            task.syscall("unlink", libc::SYS_unlink, &[addr]).context(|| format!("remove the FIFO {at} again"))?;
        }
        let holder = descriptor::move_above(task, holder, work_base)?;
        ctx.park(ns_pid, holder);
        ctx.objects.insert((f.dev, f.ino), (ns_pid, holder));
        task.syscall("fcntl(F_SETPIPE_SZ)", libc::SYS_fcntl, &[holder, libc::F_SETPIPE_SZ as u64, f.capacity as u64])
            .context(|| format!("give the FIFO {} its capacity of {} bytes", f.path, f.capacity))?;
        let data = f.data.as_ref().ok_or_else(|| Error::Damaged { what: format!("the image lacks the contents of the FIFO {}", f.path) })?;
        if !data.is_empty() {
            // The bytes go in from outside, through the FIFO itself (the holder is its reader).
            let link = format!("/proc/{}/fd/{holder}", task.pid);
            let mut w =
                OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&link).context(|| format!("open {link} ({}) to refill the FIFO", f.path))?;
            w.write_all(data).context(|| format!("put {} bytes back into the FIFO {}", data.len(), f.path))?;
        }
    }
    match unlinked {
        None => file::open(task, rec, &f.path, scratch_off),
        Some(_) => {
            let (holder_pid, holder) = ctx.objects[&(f.dev, f.ino)];
            file::open(task, rec, &format!("/proc/{holder_pid}/fd/{holder}"), scratch_off)
        }
    }
}
