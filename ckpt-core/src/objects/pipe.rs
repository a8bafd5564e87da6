//! Pipes: each end a descriptor, the pipe's capacity, and the bytes in it at the checkpoint.
//!
//! Capture reads the bytes without taking them out (tee(2) into a pipe of our own), so a job
//! that goes on after the checkpoint loses nothing. Restore creates the pipe in the first process
//! that holds an end, puts the bytes back, and keeps the other end parked there until the process
//! that holds it takes it (pidfd_getfd), so both ends are one pipe again.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use nix::fcntl::{fcntl, tee, FcntlArg, OFlag, SpliceFFlags};

use serde::{Deserialize, Serialize};

use super::descriptor::{self, CaptureCtx, DescriptorKind, FdKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PipeRecord {
    /// The pipe's inode at the checkpoint: both ends have the same.
    pub ino: u64,
    pub capacity: u32,
    /// The bytes in the pipe, carried by the first end captured (the other end has `None`).
    pub data: Option<Vec<u8>>,
}

/// `e`, what failed said before it.
fn failed(what: &str, e: impl Into<std::io::Error>) -> Error {
    let e = e.into();
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// Captures one end of a pipe of a stopped process.
pub fn capture(pid: Tid, fd: i32, ino: u64, ctx: &mut CaptureCtx) -> Result<PipeRecord> {
    // A read-side handle on the same pipe, whichever end the process holds.
    let link = format!("/proc/{pid}/fd/{fd}");
    let handle = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&link).context(|| format!("open {link} to read the pipe"))?;
    let capacity = fcntl(&handle, FcntlArg::F_GETPIPE_SZ).map_err(|e| failed(&format!("pipe size of {link}"), e))?;
    let data = if ctx.pipes_seen.insert(ino) { Some(peek(&handle, capacity as usize)?) } else { None };
    Ok(PipeRecord { ino, capacity: capacity as u32, data })
}

/// Copies the bytes in a pipe without consuming them.
pub(crate) fn peek(pipe: &File, capacity: usize) -> Result<Vec<u8>> {
    let avail = crate::sys::ioctl_int_out(pipe, libc::FIONREAD).map_err(|e| failed("FIONREAD on a pipe", e))?;
    if avail == 0 {
        return Ok(Vec::new());
    }
    let (ours_r, ours_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|e| failed("pipe2", e))?;
    let mut ours_r = File::from(ours_r);
    // (Room for all of it; when the kernel refuses, tee copies less and says so below.)
    let _ = fcntl(&ours_w, FcntlArg::F_SETPIPE_SZ(capacity.max(avail as usize) as libc::c_int));
    // tee duplicates the pipe's buffers without consuming them.
    let copied = tee(pipe, &ours_w, avail as usize, SpliceFFlags::SPLICE_F_NONBLOCK).map_err(|e| failed("tee from a pipe", e))?;
    if copied != avail as usize {
        return Err(Error::Other(format!("pipe holds {avail} bytes but only {copied} could be copied")));
    }
    drop(ours_w);
    let mut data = Vec::with_capacity(avail as usize);
    ours_r.read_to_end(&mut data).context(|| "read the copy of a pipe".to_string())?;
    Ok(data)
}

/// Per-node state of pipes being restored.
#[derive(Default)]
pub struct PipeRestoreState {
    /// Pipe inode → the bytes it held.
    data: HashMap<u64, Vec<u8>>,
    /// Pipe inode → the ends not handed out yet: (pid, parked fd, is the read end).
    waiting_ends: HashMap<u64, Vec<(Tid, u64, bool)>>,
}

impl PipeRestoreState {
    /// Gathers the pipes' contents from every record of the node, before any is restored.
    pub fn collect<'a>(&mut self, fds: impl Iterator<Item = &'a FdRecord>) {
        for rec in fds {
            if let FdKind::Pipe(PipeRecord { ino, data: Some(d), .. }) = &rec.kind {
                self.data.insert(*ino, d.clone());
            }
        }
    }
}

fn is_read_end(rec: &FdRecord) -> bool {
    rec.flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32
}

/// A descriptor opened on a pipe with O_RDWR, through /proc/PID/fd/N (bash's `exec {fd}<> <(:)`
/// makes one to wait on): both ends in one description.
fn is_both_ends(rec: &FdRecord) -> bool {
    rec.flags & libc::O_ACCMODE as u32 == libc::O_RDWR as u32
}

impl DescriptorKind for PipeRecord {
    fn describe(&self) -> String {
        format!("pipe:[{}]", self.ino)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.work_base)
    }

    fn made_alone(&self) -> bool {
        true
    }
}

/// Opens one end of a pipe in the task (creating the pipe if no end of it exists yet).
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, p: &PipeRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let end = if is_both_ends(rec) {
        open_both_ends(task, ns_pid, p, ctx, work_base)?
    } else {
        let want_read = is_read_end(rec);
        let waiting = ctx.pipes.waiting_ends.entry(p.ino).or_default();
        match waiting.iter().position(|w| w.2 == want_read) {
            Some(i) => {
                let (owner, parked, _) = waiting.remove(i);
                if owner == ns_pid {
                    ctx.unpark(ns_pid, parked);
                    parked
                } else {
                    descriptor::take_from(task, owner, parked)?
                }
            }
            None if !waiting.is_empty() => return Err(Error::Other("two separately opened descriptions of one pipe end".into())),
            None => create(task, ns_pid, p, want_read, ctx, work_base)?,
        }
    };
    let status_flags = rec.flags & (libc::O_NONBLOCK | libc::O_APPEND | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME) as u32;
    task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[end, libc::F_SETFL as u64, status_flags as u64])?;
    Ok(end)
}

fn create(task: &mut RemoteTask, ns_pid: Tid, p: &PipeRecord, want_read: bool, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let out = task.scratch_at(0);
    task.syscall("pipe2", libc::SYS_pipe2, &[out, libc::O_CLOEXEC as u64])?;
    let fds = task.get(out, 8)?;
    let r = i32::from_le_bytes(fds[0..4].try_into().unwrap()) as u64;
    let w = i32::from_le_bytes(fds[4..8].try_into().unwrap()) as u64;
    let r = descriptor::move_above(task, r, work_base)?;
    let w = descriptor::move_above(task, w, work_base)?;
    task.syscall("fcntl(F_SETPIPE_SZ)", libc::SYS_fcntl, &[w, libc::F_SETPIPE_SZ as u64, p.capacity as u64])
        .context(|| format!("give the pipe its capacity of {} bytes", p.capacity))?;
    if let Some(data) = ctx.pipes.data.get(&p.ino).filter(|d| !d.is_empty()) {
        // The bytes go in from outside, through the task's write end.
        let link = format!("/proc/{}/fd/{w}", task.pid);
        let mut f = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&link).context(|| format!("open {link} to refill the pipe"))?;
        f.write_all(data).context(|| format!("put {} bytes back into the pipe", data.len()))?;
    }
    let (wanted, other) = if want_read { (r, w) } else { (w, r) };
    ctx.park(ns_pid, other);
    ctx.pipes.waiting_ends.entry(p.ino).or_default().push((ns_pid, other, !want_read));
    Ok(wanted)
}

/// A new O_RDWR description of the pipe (made if no end of it exists yet), opened in the task
/// through /proc/self/fd of one of its ends; the ends stay waiting for their own descriptors.
fn open_both_ends(task: &mut RemoteTask, ns_pid: Tid, p: &PipeRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let (owner, end) = match ctx.pipes.waiting_ends.get(&p.ino).and_then(|w| w.first()) {
        Some(&(owner, parked, _)) => (owner, parked),
        None => {
            let r = create(task, ns_pid, p, true, ctx, work_base)?;
            ctx.park(ns_pid, r);
            ctx.pipes.waiting_ends.entry(p.ino).or_default().push((ns_pid, r, true));
            (ns_pid, r)
        }
    };
    let (here, borrowed) = if owner == ns_pid { (end, false) } else { (descriptor::take_from(task, owner, end)?, true) };
    let path = task.put_path(0, &format!("/proc/self/fd/{here}"))?;
    let both = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, path, (libc::O_RDWR | libc::O_CLOEXEC) as u64, 0]);
    if borrowed {
        task.syscall("close", libc::SYS_close, &[here])?;
    }
    let both = both.context(|| "open the pipe for reading and writing".to_string())?;
    descriptor::move_above(task, both, work_base)
}
