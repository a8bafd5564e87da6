//! The descriptor table of a process: which descriptor numbers are open, on what, with which
//! flags, and which of them share one open file description (with each other, or with a
//! descriptor of another process of the job).
//!
//! Each kind of object a descriptor can refer to has its own module (`file`, `pipe`, ...) with
//! its record, its capture and its restore. This module is the dispatcher: it tells a
//! descriptor's kind from its link and type and calls that kind's capture, and at restart opens
//! each record through its kind ([`DescriptorKind`]), handling what is common: numbers, flags,
//! close-on-exec, sharing, and the order (epoll instances last). What the kinds share lives in
//! [`super::descriptor`]; no kind imports this module (a Unix socket's descriptors in flight, of any
//! kind, are captured through [`capture_carried`], which this module hands to `unix::capture`).
//!
//! The descriptors of every process are listed once per checkpoint ([`Listing`]). Reading a
//! descriptor's link, stat and fdinfo from /proc costs about 10 us; a process holding thousands
//! of sockets is instead asked from inside, in one stop, which of its descriptors are sockets and
//! with which flags ([`probe`]), so that an idle socket costs next to nothing.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use super::descriptor::{fd_limits, same_description, socket_inode, sockfs_dev, take_from};
pub use super::descriptor::{CaptureCtx, DescriptorKind, FdKind, FdRecord, Listed, Listing, Opening, ProbedSocket, RestoreCtx, SocketTables};
use super::file::{self, DeviceRecord, FileRecord, StdioRecord};
use super::{deleted, epoll, eventfd, fifo, inet, inotify, locks, memfd, mqueue, pipe, pty, signalfd, timerfd, unix};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{batch, RemoteTask, Tid};

// ---------------------------------------------------------------------------------------------
// Probing many descriptors from inside the process

/// Which descriptor numbers a probe asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeScope {
    /// Every number of the table (FDSize): no readdir of /proc/<pid>/fd, whose entries cost more
    /// than asking about a closed number does.
    Table(usize),
    /// The numbers readdir lists (a sparse table).
    Listed,
}

/// Whether and how to probe a process with `count` open descriptors (0 if the kernel does not
/// tell) in a table of `table` numbers. A probe costs about ten ptrace stops; it saves about
/// 10 us per socket (the readlink, fdinfo read and duplicate it replaces), so processes with at
/// least `CKPT_PROBE_MIN_FDS` descriptors (64; 0 probes every process) are probed.
pub fn probe_scope(count: usize, table: usize) -> Option<ProbeScope> {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let min = *MIN.get_or_init(|| std::env::var("CKPT_PROBE_MIN_FDS").ok().and_then(|v| v.parse().ok()).unwrap_or(64));
    decide_probe_scope(count, table, min)
}

fn decide_probe_scope(count: usize, table: usize, min: usize) -> Option<ProbeScope> {
    if count < min {
        return None;
    }
    // An fstat of a closed number is about five times cheaper than a readdir entry.
    Some(if count > 0 && table <= 4 * count { ProbeScope::Table(table) } else { ProbeScope::Listed })
}

/// Bytes of task memory [`probe`] needs.
pub const PROBE_AREA: usize = 1 << 20;
const STAT_LEN: usize = std::mem::size_of::<libc::stat>();
/// Per socket, the options read: SO_PASSCRED's and SO_PASSSEC's values and lengths (8 bytes
/// each), then SO_RCVTIMEO's and SO_SNDTIMEO's, each a timeval and its length, padded (24 bytes
/// each).
const SOCKET_OPTS_LEN: usize = 2 * FLAG_SLOT + 2 * TIMEOUT_SLOT;
const FLAG_SLOT: usize = 8;
const TIMEOUT_SLOT: usize = 24;
/// Per socket: its options and a pollfd.
const SOCKET_BUF_LEN: usize = SOCKET_OPTS_LEN + 8;
const SOCKET_CALLS: usize = 6;

/// Asks the process itself, through `runner`, which of the descriptor numbers `fds` are open and
/// which of those are sockets (fstat), and for each socket its flags, SO_PASSCRED, its timeouts
/// and whether a read would block: about four system calls in the process instead of a readlink, an fdinfo
/// read and a duplicate taken by the restorer. Returns the open descriptors. `area` is
/// [`PROBE_AREA`] bytes of writable memory in the task.
pub fn probe(task: &mut RemoteTask, runner: &batch::Runner, area: u64, fds: &[i32]) -> Result<Vec<(i32, Option<ProbedSocket>)>> {
    let pid = task.pid;
    let failed = |what: &str, fd: i32, r: i64| Error::Other(format!("pid {pid}: {what} of fd {fd}: {}", std::io::Error::from_raw_os_error(-r as i32)));
    // poll refuses more descriptors at once than the process may have open.
    let poll_max = (fd_limits(pid)?.rlim_cur as usize).max(1);
    // Descriptors per round: the area holds round 1's table and stat buffers, and round 2's
    // (three calls and their buffers per socket, and a poll call per `poll_max` sockets).
    let round_1 = STAT_LEN + batch::ENTRY_LEN;
    let round_2 = SOCKET_CALLS * batch::ENTRY_LEN + SOCKET_BUF_LEN + batch::ENTRY_LEN.div_ceil(poll_max);
    let per_round = PROBE_AREA / round_1.max(round_2) - 1;
    let mut out = Vec::with_capacity(fds.len());
    for chunk in fds.chunks(per_round) {
        // Round 1, every number: fstat, for whether it is open, its type and its inode.
        let at = |i: usize| area + (i * STAT_LEN) as u64;
        let calls: Vec<batch::Call> = chunk.iter().enumerate().map(|(i, &fd)| batch::Call::new(libc::SYS_fstat, &[fd as u64, at(i)])).collect();
        let results = runner.run(task, at(chunk.len()), &calls)?;
        let stats = task.get(area, chunk.len() * STAT_LEN)?;
        let mut sockets = Vec::new();
        for (i, (&fd, r)) in chunk.iter().zip(results).enumerate() {
            if r == -libc::EBADF as i64 {
                continue;
            }
            if r < 0 {
                return Err(failed("fstat", fd, r));
            }
            let st = &stats[i * STAT_LEN..(i + 1) * STAT_LEN];
            let field = |off: usize, len: usize| st[off..off + len].iter().rev().fold(0u64, |v, b| v << 8 | *b as u64);
            let mode = field(std::mem::offset_of!(libc::stat, st_mode), 4) as u32;
            if mode & libc::S_IFMT == libc::S_IFSOCK {
                sockets.push((fd, field(std::mem::offset_of!(libc::stat, st_ino), 8), out.len()));
            }
            out.push((fd, None));
        }
        if sockets.is_empty() {
            continue;
        }
        // Round 2, the sockets: F_GETFD, F_GETFL, SO_PASSCRED, SO_PASSSEC, SO_RCVTIMEO and
        // SO_SNDTIMEO each, then poll them all.
        let n = sockets.len();
        let opt = |k: usize| area + (k * SOCKET_OPTS_LEN) as u64;
        let pollfd = |k: usize| area + (n * SOCKET_OPTS_LEN + k * 8) as u64;
        let mut bufs = Vec::with_capacity(n * SOCKET_BUF_LEN);
        let mut calls = Vec::with_capacity(n * SOCKET_CALLS + n / poll_max + 1);
        let timeval_len = super::inet::Timeouts::TIMEVAL_LEN;
        for (k, &(fd, _, _)) in sockets.iter().enumerate() {
            for _ in 0..2 {
                bufs.extend_from_slice(&0i32.to_ne_bytes());
                bufs.extend_from_slice(&4u32.to_ne_bytes());
            }
            for _ in 0..2 {
                bufs.extend_from_slice(&[0u8; 16]);
                bufs.extend_from_slice(&(timeval_len as u32).to_ne_bytes());
                bufs.extend_from_slice(&[0u8; 4]);
            }
            let fd = fd as u64;
            let slot = |i: usize| opt(k) + (2 * FLAG_SLOT + i * TIMEOUT_SLOT) as u64;
            calls.push(batch::Call::new(libc::SYS_fcntl, &[fd, libc::F_GETFD as u64]));
            calls.push(batch::Call::new(libc::SYS_fcntl, &[fd, libc::F_GETFL as u64]));
            for (i, name) in [libc::SO_PASSCRED, libc::SO_PASSSEC].into_iter().enumerate() {
                let at = opt(k) + (i * FLAG_SLOT) as u64;
                calls.push(batch::Call::new(libc::SYS_getsockopt, &[fd, libc::SOL_SOCKET as u64, name as u64, at, at + 4]));
            }
            for (i, name) in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO].into_iter().enumerate() {
                calls.push(batch::Call::new(libc::SYS_getsockopt, &[fd, libc::SOL_SOCKET as u64, name as u64, slot(i), slot(i) + timeval_len as u64]));
            }
        }
        for &(fd, _, _) in &sockets {
            bufs.extend_from_slice(&fd.to_ne_bytes());
            bufs.extend_from_slice(&libc::POLLIN.to_ne_bytes());
            bufs.extend_from_slice(&0i16.to_ne_bytes());
        }
        for first in (0..n).step_by(poll_max) {
            calls.push(batch::Call::new(libc::SYS_poll, &[pollfd(first), poll_max.min(n - first) as u64, 0]));
        }
        task.mem.write_all(area, &bufs)?;
        let results = runner.run(task, area + bufs.len() as u64, &calls)?;
        if let Some(r) = results[n * SOCKET_CALLS..].iter().find(|&&r| r < 0) {
            return Err(failed("poll", sockets[0].0, *r));
        }
        let bufs = task.get(area, bufs.len())?;
        for (k, (&(fd, ino, i), r)) in sockets.iter().zip(results.chunks_exact(SOCKET_CALLS)).enumerate() {
            for (what, &v) in ["F_GETFD", "F_GETFL"].iter().zip(r) {
                if v < 0 {
                    return Err(failed(what, fd, v));
                }
            }
            let opts = &bufs[k * SOCKET_OPTS_LEN..(k + 1) * SOCKET_OPTS_LEN];
            let flag = |i: usize, r: i64| (r >= 0).then(|| i32::from_ne_bytes(opts[i * FLAG_SLOT..i * FLAG_SLOT + 4].try_into().unwrap()) != 0);
            let timeval = |i: usize| {
                let at = 2 * FLAG_SLOT + i * TIMEOUT_SLOT;
                super::inet::Timeouts::from_timeval(&opts[at..at + timeval_len])
            };
            let revents = &bufs[n * SOCKET_OPTS_LEN + k * 8 + 6..n * SOCKET_OPTS_LEN + k * 8 + 8];
            let cloexec = if r[0] & libc::FD_CLOEXEC as i64 != 0 { libc::O_CLOEXEC as u32 } else { 0 };
            out[i].1 = Some(ProbedSocket {
                ino,
                flags: r[1] as u32 | cloexec,
                passcred: flag(0, r[2]),
                passsec: flag(1, r[3]),
                readable: i16::from_ne_bytes(revents.try_into().unwrap()) != 0,
                timeouts: (r[4] >= 0 && r[5] >= 0).then(|| super::inet::Timeouts { rcv: timeval(0), snd: timeval(1) }),
            });
        }
    }
    Ok(out)
}

/// Captures a descriptor in flight that a peek of the queue of Unix socket `fd` of process `pid`
/// installed in the restorer (`passed`): shared with a descriptor the job holds (the common case,
/// a process passing one of its own), which the restart takes from its holder; or, when no
/// process holds its open file description, captured as a descriptor of the restorer's own, if
/// it is of a kind made again on its own (a pipe end, a file, a device). Other kinds, and one
/// holding locks, are refused.
pub(crate) fn capture_carried(pid: Tid, fd: i32, passed: OwnedFd, ctx: &mut CaptureCtx) -> Result<unix::Carried> {
    let me = std::process::id() as Tid;
    let n = passed.as_raw_fd();
    let link = format!("/proc/self/fd/{n}");
    let target = procfs::readlink(&link)?;
    let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({target})"))?;
    let refuse = |why: &str| Error::Unsupported { pid, what: format!("fd {fd} (a Unix socket holding a descriptor in flight, {target}, {why})") };
    let held = ctx.listing.by_pid.iter().any(|(p, l)| l.iter().any(|d| d.target == target && same_description(me, n, *p, d.fd)));
    let carried = if held {
        unix::Carried::Shared { description: ctx.description_of(me, n, meta.dev(), meta.ino()) }
    } else {
        if socket_inode(&target).is_some() {
            return Err(refuse("a socket that no process of the job holds"));
        }
        let mut rec = capture_file(me, &Listed { fd: n, target: target.clone(), probed: None }, ctx).map_err(|e| match e {
            Error::Unsupported { .. } => refuse("that no process of the job holds, of a kind not restored in flight"),
            other => other,
        })?;
        if !rec.kind.object().made_alone() {
            return Err(refuse("that no process of the job holds, of a kind not restored in flight (only pipes, files and devices are)"));
        }
        if !rec.locks.is_empty() {
            return Err(refuse("that no process of the job holds, holding a lock"));
        }
        // Close-on-exec was the peek's, not the description's.
        rec.flags &= !(libc::O_CLOEXEC as u32);
        rec.fd = -1;
        unix::Carried::Alone(Box::new(rec))
    };
    ctx.in_flight.push(passed);
    Ok(carried)
}

/// Captures the descriptor table of a stopped process.
pub fn capture(pid: Tid, ctx: &mut CaptureCtx) -> Result<Vec<FdRecord>> {
    let listed = ctx.listing.of_pid(pid).to_vec();
    let mut out = Vec::with_capacity(listed.len());
    for l in &listed {
        out.push(match socket_inode(&l.target) {
            Some(ino) => capture_socket(pid, l, ino, ctx)?,
            None => capture_file(pid, l, ctx)?,
        });
    }
    Ok(out)
}

/// A descriptor of anything but a socket.
fn capture_file(pid: Tid, l: &Listed, ctx: &mut CaptureCtx) -> Result<FdRecord> {
    let (fd, target) = (l.fd, &l.target);
    let link = format!("/proc/{pid}/fd/{fd}");
    let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({target})"))?;
    let fdinfo = procfs::fdinfo_text(pid, fd)?;
    let info = procfs::FdInfo::parse(&fdinfo);
    let kind = if info.flags & libc::O_PATH as u32 != 0 {
        // A descriptor that only names a place (open with O_PATH): whatever it names (a
        // directory, a file, a FIFO, a socket file, a symbolic link with O_NOFOLLOW), it reads
        // and writes nothing, so its path is all there is to keep. (`meta` is of what the
        // descriptor names: the /proc link leads to it and no further, a symbolic link too.)
        if let (true, Some(path)) = (meta.file_type().is_symlink(), deleted::deleted_path(target)) {
            // A link itself, removed: its target is all it is.
            let link = ctx.take(pid, fd)?;
            FdKind::RemovedSymlink(super::removed_symlink::capture(pid, fd, path, &meta, &link)?)
        } else {
            if target.ends_with(" (deleted)") || !target.starts_with('/') {
                return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, an O_PATH descriptor of a deleted file)") });
            }
            // (A symbolic link itself is not followed by the check.)
            if !meta.file_type().is_symlink() {
                reachable_by_name(pid, fd, target, &meta, ctx)?;
            }
            FdKind::File(FileRecord { path: target.to_string(), dev: meta.dev(), ino: meta.ino(), size: meta.size() })
        }
    } else {
        capture_one(pid, fd, target, &meta, ctx)?
    };
    let description = ctx.description_of(pid, fd, meta.dev(), meta.ino());
    let locks = locks::from_fdinfo(pid, fd, &fdinfo)?;
    let owner = super::fown::capture(pid, fd, info.flags, ctx)?;
    Ok(FdRecord { fd, flags: info.flags, pos: info.pos, description, kind, locks, owner })
}

/// A socket: Unix, TCP or UDP. Its link names its inode, and all sockets are on one device: no
/// stat. A probed socket's flags come from the probe (a socket has no position), and its locks
/// (rare) from fdinfo only if the kernel's lock table lists its inode.
fn capture_socket(pid: Tid, l: &Listed, ino: u64, ctx: &mut CaptureCtx) -> Result<FdRecord> {
    let fd = l.fd;
    let dev = sockfs_dev()?;
    let (info, locks) = match &l.probed {
        Some(p) if !ctx.locked()?.contains(&ino) => (procfs::FdInfo { pos: 0, flags: p.flags }, Vec::new()),
        _ => {
            let fdinfo = procfs::fdinfo_text(pid, fd)?;
            (procfs::FdInfo::parse(&fdinfo), locks::from_fdinfo(pid, fd, &fdinfo)?)
        }
    };
    let kind = socket_kind(pid, fd, dev, ino, l.probed.as_ref(), ctx)?;
    let description = ctx.description_of(pid, fd, dev, ino);
    let owner = super::fown::capture(pid, fd, info.flags, ctx)?;
    Ok(FdRecord { fd, flags: info.flags, pos: info.pos, description, kind, locks, owner })
}

fn socket_kind(pid: Tid, fd: i32, dev: u64, ino: u64, probed: Option<&ProbedSocket>, ctx: &mut CaptureCtx) -> Result<FdKind> {
    if let Some(which) = ctx.stdio.which(dev, ino) {
        return Ok(FdKind::Stdio(StdioRecord { which }));
    }
    // sock_diag knows every Unix socket of the network namespace: no need to ask this one.
    if unix::is_unix(ino, ctx)? {
        return unix::capture(pid, fd, ino, probed, ctx, capture_carried);
    }
    let s = ctx.take(pid, fd)?;
    let domain = inet::getopt_int(&s, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    // A Unix socket's namespace matters only for an abstract name (unix.rs checks that). A
    // restart makes a socket in its first holder (parents first): a child that inherited it
    // into a namespace of its own shares it again.
    if domain != libc::AF_UNIX && ctx.first_holder(dev, ino) {
        ctx.networks.check_socket(pid, fd, ino, &s)?;
    }
    match domain {
        libc::AF_INET | libc::AF_INET6 => Ok(FdKind::Inet(inet::capture(pid, fd, ino, s, ctx)?)),
        // A Unix socket sock_diag does not list (another network namespace): refused there.
        libc::AF_UNIX => unix::capture(pid, fd, ino, probed, ctx, capture_carried),
        libc::AF_NETLINK => Ok(FdKind::Netlink(super::netlink::capture(pid, fd, ino, &s, ctx.last_try)?)),
        libc::AF_PACKET => Ok(FdKind::Packet(super::packet::capture(pid, fd, ino, &s, (&ctx.networks, &mut ctx.packets), ctx.last_try)?)),
        domain => Err(Error::Unsupported { pid, what: format!("fd {fd} (socket:[{ino}], a socket of address family {domain})") }),
    }
}

fn capture_one(pid: Tid, fd: i32, target: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<FdKind> {
    use std::os::unix::fs::FileTypeExt;
    // Devices like /dev/null are reopened as they were even when the launcher's stdio is the
    // same device: its mode (say, stdin read-only) need not be the job's.
    // An NVIDIA device held here is one a process inherited and does not use (a CUDA process
    // holds none after the driver's checkpoint, crate::gpu; one that maps a device is refused
    // with its memory): it is opened again, as the device, at restart.
    if file::is_reopenable_device(target) || crate::gpu::is_gpu_device(target) {
        return Ok(FdKind::CharDevice(DeviceRecord { path: target.to_string(), node: None }));
    }
    if let Some(which) = ctx.stdio.which(meta.dev(), meta.ino()) {
        return Ok(FdKind::Stdio(StdioRecord { which }));
    }
    if let Some(master) = pty::which_end(meta) {
        return Ok(FdKind::Pty(pty::capture(pid, fd, master, meta, &ctx.pids, &mut ctx.ptys)?));
    }
    let ft = meta.file_type();
    if ft.is_char_device() && file::is_reopenable_device_number(meta.rdev()) {
        let (path, removed) = match deleted::deleted_path(target) {
            Some(path) => (path, true),
            None => (target, false),
        };
        if path.starts_with('/') {
            if !removed {
                reachable_by_name(pid, fd, target, meta, ctx)?;
            }
            let node = file::DeviceNode { rdev: meta.rdev(), mode: meta.mode(), uid: meta.uid(), gid: meta.gid(), removed };
            return Ok(FdKind::CharDevice(DeviceRecord { path: path.to_string(), node: Some(node) }));
        }
    }
    if target.starts_with("pipe:") && ft.is_fifo() {
        return Ok(FdKind::Pipe(pipe::capture(pid, fd, meta.ino(), ctx)?));
    }
    match target {
        "anon_inode:[eventfd]" => return Ok(FdKind::Eventfd(eventfd::capture(pid, fd)?)),
        "anon_inode:[timerfd]" => return Ok(FdKind::Timerfd(timerfd::capture(pid, fd)?)),
        "anon_inode:[signalfd]" => return Ok(FdKind::Signalfd(signalfd::capture(pid, fd)?)),
        "anon_inode:[eventpoll]" => return Ok(FdKind::Epoll(epoll::capture(pid, fd)?)),
        "anon_inode:inotify" => return Ok(FdKind::Inotify(inotify::capture(pid, fd, ctx.last_try)?)),
        "anon_inode:[fanotify]" => return Ok(FdKind::Fanotify(super::fanotify::capture(pid, fd, ctx.last_try)?)),
        "anon_inode:[pidfd]" => return Ok(FdKind::Pidfd(super::pidfd::capture(pid, fd)?)),
        _ => {}
    }
    if let Some(kind) = super::ns_file::kind_of(target) {
        let job: Vec<(Tid, Tid)> = ctx.pids.iter().map(|&host| (host, crate::procfs::ns_tid(host).unwrap_or(host))).collect();
        return Ok(FdKind::NsFile(super::ns_file::capture(pid, fd, kind, meta, &job)?));
    }
    if ft.is_fifo() && target.starts_with('/') {
        return Ok(FdKind::Fifo(fifo::capture(pid, fd, target, meta, ctx)?));
    }
    // A queue's link looks like a file's (`/NAME`): only its file system tells them apart.
    if ft.is_file() && target.starts_with('/') && mqueue::is_mqueue(&format!("/proc/{pid}/fd/{fd}"))? {
        return Ok(FdKind::Mqueue(mqueue::capture(pid, fd, target, meta, ctx)?));
    }
    if let (true, Some(name)) = (ft.is_file(), memfd::memfd_name(target)) {
        return Ok(FdKind::Memfd(memfd::capture(pid, fd, name, meta, ctx)?));
    }
    if let (true, Some(path)) = (ft.is_file(), deleted::deleted_path(target)) {
        // Unlinked from that name, but living on under another in the same directory: the file
        // itself, reopened there.
        if meta.nlink() > 0 {
            if let Some(other) = deleted::another_name(pid, path, meta, ctx.namespace_root(pid)) {
                return Ok(FdKind::File(FileRecord { path: other, dev: meta.dev(), ino: meta.ino(), size: meta.size() }));
            }
        }
        return Ok(FdKind::Deleted(deleted::capture(pid, fd, path, meta, ctx)?));
    }
    if let (true, Some(path)) = (ft.is_dir(), deleted::deleted_path(target)) {
        return Ok(FdKind::RemovedDir(super::removed_dir::capture(pid, fd, path, meta)?));
    }
    if ft.is_file() || ft.is_dir() {
        if target.ends_with(" (deleted)") || !target.starts_with('/') {
            return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, a deleted file)") });
        }
        reachable_by_name(pid, fd, target, meta, ctx)?;
        return Ok(FdKind::File(FileRecord { path: target.to_string(), dev: meta.dev(), ino: meta.ino(), size: meta.size() }));
    }
    Err(Error::Unsupported { pid, what: format!("fd {fd} ({target})") })
}

/// Refuses a file the descriptor holds that its name, as the process sees it, no longer leads
/// to: a file hidden under a mount made over it (or over its directory) since it was opened,
/// whose link in /proc still shows its old path. A restart reopens files by name, and would
/// give the descriptor the file on top, without a word.
fn reachable_by_name(pid: Tid, fd: i32, target: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<()> {
    let root = ctx.namespace_root(pid);
    super::memory::identify_file(pid, root, target, meta.dev(), meta.ino()).map(drop).map_err(|problem| Error::Unsupported {
        pid,
        what: format!("fd {fd} ({target}): {problem}; the file the descriptor holds is hidden (a mount made over it since it was opened?), and a restart would open the other one"),
    })
}

/// Recreates the descriptor table inside the task, whose pid in the job is `ns_pid`. The task
/// starts with the restart's stdio at 0, 1, 2; `scratch_off` is where paths are passed.
/// `reader` is the process's stream (the contents of large deleted files and memfds).
pub fn restore(
    task: &mut RemoteTask,
    ns_pid: Tid,
    fds: &[FdRecord],
    ctx: &mut RestoreCtx,
    scratch_off: usize,
    reader: &mut crate::image::StreamReader,
) -> Result<()> {
    // Whatever the empty process still holds of its creator's beyond stdio goes first (not what
    // the memory restore parked in it).
    for fd in procfs::fds(task.pid)?.into_iter().filter(|&fd| fd > 2 && !ctx.is_parked(ns_pid, fd as u64)) {
        task.syscall("close", libc::SYS_close, &[fd as u64])?;
    }
    let park = super::descriptor::park_with_room(task, fds)?;
    // The restart's stdio, parked above every descriptor the job uses.
    for std_fd in 0..3u64 {
        task.syscall("dup3", libc::SYS_dup3, &[std_fd, park + std_fd, libc::O_CLOEXEC as u64])?;
        task.syscall("close", libc::SYS_close, &[std_fd])?;
    }
    let work_base = park + 3;
    // Pairs of Unix sockets held by this process alone, all at once (thousands are common).
    unix::restore_pairs(task, ns_pid, fds, ctx)?;
    // Epoll instances last: they watch the process's other descriptors (and each other) by number;
    // before them, inotify instances that watch a deleted file through its descriptor.
    for rec in epoll::restore_order(fds) {
        match &rec.kind {
            FdKind::File(FileRecord { path, .. }) if names_another_thread(path) => {
                ctx.thread_proc_files.push((ns_pid, rec.clone()));
                continue;
            }
            FdKind::CharDevice(DeviceRecord { path, .. }) if path == CONTROLLING_TTY => {
                ctx.tty_files.push((ns_pid, rec.clone()));
                continue;
            }
            _ => {}
        }
        let (opened, fresh) = match (&rec.kind, ctx.holder(rec.description)) {
            (FdKind::Stdio(StdioRecord { which }), _) => (park + *which as u64, false),
            (_, Some((owner, owner_fd))) if owner == ns_pid => (owner_fd as u64, false),
            (_, Some((owner, owner_fd))) => (take_from(task, owner, owner_fd as u64)?, true),
            (kind, None) => {
                let object = kind.object();
                let mut at = Opening { task: &mut *task, ns_pid, rec, ctx: &mut *ctx, scratch_off, work_base, reader: Some(&mut *reader) };
                let fd = object.open(&mut at).map_err(|e| e.of_descriptor(rec.fd, object.describe()))?;
                ctx.opened_at(rec.description, ns_pid, rec.fd);
                (fd, true)
            }
        };
        put_at_its_number(task, opened, rec, fresh)?;
    }
    for std_fd in 0..3u64 {
        task.syscall("close", libc::SYS_close, &[park + std_fd])?;
    }
    // Last: closing any descriptor of a file drops the process's POSIX locks on it.
    locks::restore(task, ns_pid, fds, ctx, scratch_off)
}

/// Whether `path` is a file of the job's /proc that belongs to a thread other than its
/// process's main one (`/proc/P/task/T/...`, T ≠ P: what /proc/thread-self leads to): such a
/// thread does not exist yet when its process's descriptors are restored. Pure.
pub fn names_another_thread(path: &str) -> bool {
    let mut parts = path.strip_prefix("/proc/").unwrap_or("").split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(p), Some("task"), Some(t)) => p.parse::<u32>().is_ok() && t.parse::<u32>().is_ok() && p != t,
        _ => false,
    }
}

/// Opens the files of the job's /proc that name a thread (see [`names_another_thread`]) of
/// process `ns_pid`, at their numbers: called once every process and thread of the job exists.
pub fn restore_thread_proc_files(task: &mut RemoteTask, ns_pid: Tid, ctx: &mut RestoreCtx, scratch_off: usize) -> Result<()> {
    let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut ctx.thread_proc_files).into_iter().partition(|(pid, _)| *pid == ns_pid);
    ctx.thread_proc_files = others;
    for (_, rec) in mine {
        let FdKind::File(FileRecord { path, .. }) = &rec.kind else { continue };
        let fd = file::open(task, &rec, path, scratch_off).map_err(|e| e.of_descriptor(rec.fd, path.as_str()))?;
        put_at_its_number(task, fd, &rec, true)?;
    }
    Ok(())
}

/// The device that is each process's controlling terminal.
const CONTROLLING_TTY: &str = "/dev/tty";

/// Opens the descriptors of /dev/tty of process `ns_pid` at their numbers (the same open file
/// description as another process's where it was): called once every session has its
/// controlling terminal again, without which /dev/tty does not open (ENXIO).
pub fn restore_tty_files(task: &mut RemoteTask, ns_pid: Tid, ctx: &mut RestoreCtx, scratch_off: usize) -> Result<()> {
    let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut ctx.tty_files).into_iter().partition(|(pid, _)| *pid == ns_pid);
    ctx.tty_files = others;
    for (_, rec) in mine {
        let (opened, fresh) = match ctx.holder(rec.description) {
            Some((owner, owner_fd)) if owner == ns_pid => (owner_fd as u64, false),
            Some((owner, owner_fd)) => (take_from(task, owner, owner_fd as u64)?, true),
            None => {
                let fd = file::open(task, &rec, CONTROLLING_TTY, scratch_off).map_err(|e| e.of_descriptor(rec.fd, CONTROLLING_TTY))?;
                ctx.opened_at(rec.description, ns_pid, rec.fd);
                (fd, true)
            }
        };
        put_at_its_number(task, opened, &rec, fresh)?;
    }
    Ok(())
}

/// Puts descriptor `opened` at the record's number with the record's close-on-exec flag
/// (closing `opened` where it was `fresh`ly opened for this record). A descriptor opened right
/// at its number (the lowest free one: 0, 1 and 2 often are, the restart's stdio being parked)
/// carries the flag its opener chose, which is not always the record's: a pty's slave is opened
/// close-on-exec, and a shell whose stdio came back so lost it at its next exec (tmux's pane
/// went, its terminal hung up).
fn put_at_its_number(task: &mut RemoteTask, opened: u64, rec: &FdRecord, fresh: bool) -> Result<()> {
    let fd = rec.fd as u64;
    if opened == fd {
        let flag = if rec.cloexec() != 0 { libc::FD_CLOEXEC as u64 } else { 0 };
        task.syscall("fcntl(F_SETFD)", libc::SYS_fcntl, &[fd, libc::F_SETFD as u64, flag])?;
        return Ok(());
    }
    task.syscall("dup3", libc::SYS_dup3, &[opened, fd, rec.cloexec()])?;
    if fresh {
        task.syscall("close", libc::SYS_close, &[opened])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_of_other_threads_are_told_apart() {
        assert!(names_another_thread("/proc/2/task/3/status"));
        assert!(!names_another_thread("/proc/2/task/2/status"));
        assert!(!names_another_thread("/proc/2/status"));
        assert!(!names_another_thread("/proc/self/task/3/status"));
        assert!(!names_another_thread("/procfs/2/task/3/status"));
        assert!(!names_another_thread("/tmp/proc/2/task/3"));
    }

    #[test]
    fn probe_scope_by_count_and_table() {
        assert_eq!(decide_probe_scope(10, 64, 64), None);
        assert_eq!(decide_probe_scope(8003, 8192, 64), Some(ProbeScope::Table(8192)));
        // Three descriptors, one of them at 60000: readdir lists them.
        assert_eq!(decide_probe_scope(100, 65536, 64), Some(ProbeScope::Listed));
        // A kernel that does not tell the count: probed only when told to probe everything.
        assert_eq!(decide_probe_scope(0, 256, 64), None);
        assert_eq!(decide_probe_scope(0, 256, 0), Some(ProbeScope::Listed));
    }
}
