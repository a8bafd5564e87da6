//! The descriptor table of a process: which descriptor numbers are open, on what, with which
//! flags, and which of them share one open file description (with each other, or with a
//! descriptor of another process of the job).
//!
//! Each kind of object a descriptor can refer to has its own module (`file`, `pipe`, ...) with
//! its record, its capture and its restore; this module dispatches to them and handles what is
//! common: numbers, flags, close-on-exec, and sharing. To add a kind: a module with
//! `capture(..) -> Result<Record>` and `open(..) -> Result<u64>` (the descriptor it opened in the
//! task), a variant of [`FdKind`], and one line in each of [`capture_one`] and [`open_kind`].

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::file::{self, StdioIds};
use super::pipe::{self, PipeRecord};
use super::unix::{self, UnixRecord};
use super::{deleted, epoll, eventfd, fifo, inet, inotify, locks, memfd, signalfd, timerfd};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum FdKind {
    /// A regular file or directory. `size` is its size at the checkpoint.
    File { path: String, dev: u64, ino: u64, size: u64 },
    /// A character device reopened by path (/dev/null, /dev/zero, /dev/urandom, ...).
    CharDevice { path: String },
    /// The launcher's stdin (0), stdout (1) or stderr (2); the restart binds its own.
    Stdio { which: u8 },
    /// One end of a pipe.
    Pipe(PipeRecord),
    /// A Unix domain socket.
    Unix(UnixRecord),
    /// An eventfd and its counter.
    Eventfd(eventfd::EventfdRecord),
    /// A timerfd, armed or not, and its unread expirations.
    Timerfd(timerfd::TimerfdRecord),
    /// A signalfd and its mask.
    Signalfd(signalfd::SignalfdRecord),
    /// An epoll instance; restored after the process's other descriptors, which it watches.
    Epoll(epoll::EpollRecord),
    /// A named pipe, opened by its path.
    Fifo(fifo::FifoRecord),
    /// A file deleted while open, with its contents.
    Deleted(deleted::DeletedFileRecord),
    /// A memfd, with its contents and seals.
    Memfd(memfd::MemfdRecord),
    /// An inotify instance and its watches.
    Inotify(inotify::InotifyRecord),
    /// A pidfd for a process of the job.
    Pidfd(super::pidfd::PidfdRecord),
    /// A TCP or UDP socket (IPv4 or IPv6).
    Inet(inet::InetRecord),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FdRecord {
    pub fd: i32,
    /// Open flags (O_ACCMODE, O_APPEND, O_NONBLOCK, O_CLOEXEC, ...).
    pub flags: u32,
    pub pos: u64,
    /// Descriptors with the same number here share one open file description (offset, flags),
    /// across the whole node's image.
    pub description: u32,
    pub kind: FdKind,
    /// File locks held through this descriptor (flock, POSIX, OFD).
    pub locks: Vec<locks::LockRecord>,
}

impl FdRecord {
    pub fn writable(&self) -> bool {
        let acc = self.flags & libc::O_ACCMODE as u32;
        acc == libc::O_WRONLY as u32 || acc == libc::O_RDWR as u32
    }

    fn cloexec(&self) -> u64 {
        if self.flags & libc::O_CLOEXEC as u32 != 0 {
            libc::O_CLOEXEC as u64
        } else {
            0
        }
    }
}

/// One descriptor of a process as first listed: its number and what `/proc/<pid>/fd/<n>`
/// points at.
#[derive(Debug, Clone)]
pub struct Listed {
    pub fd: i32,
    pub target: String,
}

/// The descriptors of every process of the job, listed once per checkpoint: capture and the
/// socket modules (which must know every socket of the job before they capture the first) share
/// it, as listing costs a readdir and a readlink per descriptor.
#[derive(Default)]
pub struct Listing {
    /// In the order of the processes given.
    by_pid: Vec<(Tid, Vec<Listed>)>,
}

impl Listing {
    /// Lists the descriptors of the given (stopped) processes.
    pub fn of(pids: &[Tid]) -> Result<Listing> {
        let mut by_pid = Vec::new();
        for &pid in pids {
            let fds = procfs::fds(pid).context(|| format!("list the descriptors of pid {pid}"))?;
            let mut listed = Vec::with_capacity(fds.len());
            for fd in fds {
                listed.push(Listed { fd, target: procfs::readlink(&format!("/proc/{pid}/fd/{fd}"))? });
            }
            by_pid.push((pid, listed));
        }
        Ok(Listing { by_pid })
    }

    /// Every socket: (pid, fd, inode).
    pub fn sockets(&self) -> impl Iterator<Item = (Tid, i32, u64)> + '_ {
        self.by_pid.iter().flat_map(|(pid, l)| l.iter().filter_map(move |d| Some((*pid, d.fd, socket_inode(&d.target)?))))
    }

    /// Inodes of every socket, so capture can tell a peer inside the job from one outside.
    pub fn socket_inodes(&self) -> HashSet<u64> {
        self.sockets().map(|s| s.2).collect()
    }

    fn of_pid(&self, pid: Tid) -> &[Listed] {
        self.by_pid.iter().find(|l| l.0 == pid).map_or(&[], |l| l.1.as_slice())
    }
}

/// The inode of a socket from its descriptor's link target (`socket:[12345]`). Pure.
pub fn socket_inode(target: &str) -> Option<u64> {
    target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The device number of the kernel's socket file system, which holds every socket's inode:
/// the same for all, so it is learned once from a socket of our own.
fn sockfs_dev() -> Result<u64> {
    static DEV: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if let Some(dev) = DEV.get() {
        return Ok(*dev);
    }
    let own = std::os::unix::net::UnixDatagram::unbound()?;
    let dev = std::fs::metadata(format!("/proc/self/fd/{}", own.as_raw_fd()))?.dev();
    Ok(*DEV.get_or_init(|| dev))
}

/// What capture remembers across the descriptors of every process of one checkpoint.
pub struct CaptureCtx {
    pub stdio: StdioIds,
    /// Open file descriptions seen so far, by the (dev, ino) of their file: (host pid, fd,
    /// description number).
    descriptions: HashMap<(u64, u64), Vec<(Tid, i32, u32)>>,
    next_description: u32,
    /// Pipes whose contents are already in the image, by inode.
    pub pipes_seen: HashSet<u64>,
    /// Every process's descriptors.
    pub listing: Listing,
    /// Inodes of every socket the job's processes hold.
    pub job_sockets: HashSet<u64>,
    pub unix: unix::UnixCaptureState,
    pub inet: inet::InetCaptureState,
    /// Files (device, inode) whose contents are already in the image: FIFOs, deleted files, memfds.
    pub objects_seen: HashSet<(u64, u64)>,
    /// The job's processes (host pids).
    pub pids: Vec<Tid>,
    /// A pidfd of each process whose descriptors were taken into the restorer.
    pidfds: HashMap<Tid, OwnedFd>,
}

impl CaptureCtx {
    /// A context for capturing the tables of the processes `pids` (host pids), stopped.
    pub fn new(stdio: StdioIds, pids: &[Tid]) -> Result<CaptureCtx> {
        let listing = Listing::of(pids)?;
        Ok(CaptureCtx {
            stdio,
            descriptions: HashMap::new(),
            next_description: 0,
            pipes_seen: Default::default(),
            job_sockets: listing.socket_inodes(),
            listing,
            unix: Default::default(),
            inet: Default::default(),
            objects_seen: Default::default(),
            pids: pids.to_vec(),
            pidfds: HashMap::new(),
        })
    }

    /// The description number of (pid, fd): shared with an earlier descriptor on the same object
    /// when the kernel says they are one open file description.
    fn description_of(&mut self, pid: Tid, fd: i32, dev: u64, ino: u64) -> u32 {
        let seen = self.descriptions.entry((dev, ino)).or_default();
        let id = match seen.iter().find(|d| same_description(d.0, d.1, pid, fd)) {
            Some(d) => d.2,
            None => {
                self.next_description += 1;
                self.next_description - 1
            }
        };
        seen.push((pid, fd, id));
        id
    }

    /// Duplicates descriptor `fd` of the stopped process `pid` into the restorer (the same open
    /// file description), through one pidfd per process.
    pub fn take(&mut self, pid: Tid, fd: i32) -> Result<OwnedFd> {
        if !self.pidfds.contains_key(&pid) {
            self.pidfds.insert(pid, pidfd_open(pid)?);
        }
        take_through(&self.pidfds[&pid], pid, fd)
    }
}

const KCMP_FILE: libc::c_long = 0;

fn same_description(pid1: Tid, fd1: i32, pid2: Tid, fd2: i32) -> bool {
    // SAFETY: kcmp only compares kernel objects; no memory is passed.
    unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1 as libc::c_long, fd2 as libc::c_long) == 0 }
}

/// Captures the descriptor table of a stopped process.
pub fn capture(pid: Tid, ctx: &mut CaptureCtx) -> Result<Vec<FdRecord>> {
    let listed = ctx.listing.of_pid(pid).to_vec();
    let mut out = Vec::with_capacity(listed.len());
    for Listed { fd, target } in listed {
        let fdinfo = procfs::fdinfo_text(pid, fd)?;
        let info = procfs::FdInfo::parse(&fdinfo);
        let (kind, dev, ino) = match socket_inode(&target) {
            // A socket's link names its inode, and all sockets are on one device: no stat.
            Some(ino) => {
                let dev = sockfs_dev()?;
                (capture_socket(pid, fd, dev, ino, ctx)?, dev, ino)
            }
            None => {
                let link = format!("/proc/{pid}/fd/{fd}");
                let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({target})"))?;
                (capture_one(pid, fd, &target, &meta, ctx)?, meta.dev(), meta.ino())
            }
        };
        let description = ctx.description_of(pid, fd, dev, ino);
        let locks = locks::from_fdinfo(pid, fd, &fdinfo)?;
        out.push(FdRecord { fd, flags: info.flags, pos: info.pos, description, kind, locks });
    }
    Ok(out)
}

/// A socket: Unix, TCP or UDP.
fn capture_socket(pid: Tid, fd: i32, dev: u64, ino: u64, ctx: &mut CaptureCtx) -> Result<FdKind> {
    if let Some(which) = ctx.stdio.which(dev, ino) {
        return Ok(FdKind::Stdio { which });
    }
    // sock_diag knows every Unix socket of the network namespace: no need to ask this one.
    if unix::is_unix(ino, ctx)? {
        return Ok(FdKind::Unix(unix::capture(pid, fd, ino, ctx)?));
    }
    let s = ctx.take(pid, fd)?;
    match inet::getopt_int(&s, libc::SOL_SOCKET, libc::SO_DOMAIN)? {
        libc::AF_INET | libc::AF_INET6 => Ok(FdKind::Inet(inet::capture(pid, fd, ino, s, ctx)?)),
        // A Unix socket sock_diag does not list (another network namespace): refused there.
        libc::AF_UNIX => Ok(FdKind::Unix(unix::capture(pid, fd, ino, ctx)?)),
        domain => Err(Error::Unsupported { pid, what: format!("fd {fd} (socket:[{ino}], a socket of address family {domain})") }),
    }
}

fn capture_one(pid: Tid, fd: i32, target: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<FdKind> {
    use std::os::unix::fs::FileTypeExt;
    // Devices like /dev/null are reopened as they were even when the launcher's stdio is the
    // same device: its mode (say, stdin read-only) need not be the job's.
    if file::is_reopenable_device(target) {
        return Ok(FdKind::CharDevice { path: target.to_string() });
    }
    if let Some(which) = ctx.stdio.which(meta.dev(), meta.ino()) {
        return Ok(FdKind::Stdio { which });
    }
    let ft = meta.file_type();
    if target.starts_with("pipe:") && ft.is_fifo() {
        return Ok(FdKind::Pipe(pipe::capture(pid, fd, meta.ino(), ctx)?));
    }
    match target {
        "anon_inode:[eventfd]" => return Ok(FdKind::Eventfd(eventfd::capture(pid, fd)?)),
        "anon_inode:[timerfd]" => return Ok(FdKind::Timerfd(timerfd::capture(pid, fd)?)),
        "anon_inode:[signalfd]" => return Ok(FdKind::Signalfd(signalfd::capture(pid, fd)?)),
        "anon_inode:[eventpoll]" => return Ok(FdKind::Epoll(epoll::capture(pid, fd)?)),
        "anon_inode:inotify" => return Ok(FdKind::Inotify(inotify::capture(pid, fd)?)),
        "anon_inode:[pidfd]" => return Ok(FdKind::Pidfd(super::pidfd::capture(pid, fd)?)),
        _ => {}
    }
    if ft.is_fifo() && target.starts_with('/') {
        return Ok(FdKind::Fifo(fifo::capture(pid, fd, target, meta, ctx)?));
    }
    if let (true, Some(name)) = (ft.is_file(), memfd::memfd_name(target)) {
        return Ok(FdKind::Memfd(memfd::capture(pid, fd, name, meta, ctx)?));
    }
    if let (true, Some(path)) = (ft.is_file(), deleted::deleted_path(target)) {
        return Ok(FdKind::Deleted(deleted::capture(pid, fd, path, meta, ctx)?));
    }
    if ft.is_file() || ft.is_dir() {
        if target.ends_with(" (deleted)") || !target.starts_with('/') {
            return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, a deleted file)") });
        }
        return Ok(FdKind::File { path: target.to_string(), dev: meta.dev(), ino: meta.ino(), size: meta.size() });
    }
    Err(Error::Unsupported { pid, what: format!("fd {fd} ({target})") })
}

/// What restore remembers across the processes of one node.
#[derive(Default)]
pub struct RestoreCtx {
    /// Description number → (pid in the job, fd) of a descriptor already holding it.
    opened: HashMap<u32, (Tid, i32)>,
    /// Per-kind state shared between processes (the other ends of pipes, ...).
    pub pipes: pipe::PipeRestoreState,
    pub unix: unix::UnixRestoreState,
    pub inet: inet::InetRestoreState,
    /// Files recreated once for several descriptions (FIFOs, deleted files, memfds), by their
    /// device and inode at the checkpoint: where a descriptor on the new one is (pid, fd).
    pub objects: HashMap<(u64, u64), (Tid, u64)>,
    /// Descriptors held only for other processes to take, closed by [`finish`]: (pid, fd).
    parked: Vec<(Tid, u64)>,
}

impl RestoreCtx {
    /// A context for restoring the given processes' tables.
    pub fn new<'a>(tables: impl Iterator<Item = &'a [FdRecord]>) -> RestoreCtx {
        let mut ctx = RestoreCtx::default();
        let all: Vec<&FdRecord> = tables.flatten().collect();
        ctx.pipes.collect(all.iter().copied());
        ctx.unix.collect(all.iter().copied());
        ctx
    }

    pub fn park(&mut self, ns_pid: Tid, fd: u64) {
        self.parked.push((ns_pid, fd));
    }

    /// A parked descriptor that its own process took after all.
    pub fn unpark(&mut self, ns_pid: Tid, fd: u64) {
        self.parked.retain(|&p| p != (ns_pid, fd));
    }

    /// The parked descriptors, to be closed once every process has its table: (pid, fd).
    pub fn take_parked(&mut self) -> Vec<(Tid, u64)> {
        std::mem::take(&mut self.parked)
    }
}

/// The lowest descriptor number above every number the job uses, where the restore keeps
/// descriptors it needs for a while; the task's RLIMIT_NOFILE must allow it.
pub fn park_base(fds: &[FdRecord]) -> u64 {
    fds.iter().map(|r| r.fd).max().unwrap_or(2).max(2) as u64 + 1
}

/// Moves a descriptor to a free number at or above `base`, so that it cannot collide with a
/// number the job's table will use.
pub fn move_above(task: &mut RemoteTask, fd: u64, base: u64) -> Result<u64> {
    if fd >= base {
        return Ok(fd);
    }
    let high = task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[fd, libc::F_DUPFD_CLOEXEC as u64, base])?;
    task.syscall("close", libc::SYS_close, &[fd])?;
    Ok(high)
}

/// Duplicates a descriptor of a stopped process into the restorer (the same open file).
pub fn take_into_self(host_pid: Tid, fd: i32) -> Result<OwnedFd> {
    take_through(&pidfd_open(host_pid)?, host_pid, fd)
}

fn pidfd_open(host_pid: Tid) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers; the returned descriptor is owned at once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, host_pid, 0);
        if pidfd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::Other(format!("pidfd_open of pid {host_pid}: {e}")));
        }
        Ok(OwnedFd::from_raw_fd(pidfd as i32))
    }
}

/// pidfd_getfd: descriptor `fd` of the process of `pidfd` (which is `host_pid`).
fn take_through(pidfd: &OwnedFd, host_pid: Tid, fd: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes integers; the returned descriptor is owned at once.
    unsafe {
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if dup < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::Other(format!("take fd {fd} of pid {host_pid}: {e}")));
        }
        Ok(OwnedFd::from_raw_fd(dup as i32))
    }
}

/// Takes a descriptor of another process of the job (same open file description), from inside
/// `task`. Returns the new descriptor's number in `task`.
pub fn take_from(task: &mut RemoteTask, owner_ns_pid: Tid, owner_fd: u64) -> Result<u64> {
    let pidfd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[owner_ns_pid as u64, 0])?;
    let r = task.syscall("pidfd_getfd", libc::SYS_pidfd_getfd, &[pidfd, owner_fd, 0]);
    task.syscall("close", libc::SYS_close, &[pidfd])?;
    Ok(r.context(|| format!("take fd {owner_fd} of pid {owner_ns_pid}"))?)
}

/// Recreates the descriptor table inside the task, whose pid in the job is `ns_pid`. The task
/// starts with the restart's stdio at 0, 1, 2; `scratch_off` is where paths are passed.
pub fn restore(task: &mut RemoteTask, ns_pid: Tid, fds: &[FdRecord], ctx: &mut RestoreCtx, scratch_off: usize) -> Result<()> {
    // Whatever the empty process still holds of its creator's beyond stdio goes first.
    for fd in procfs::fds(task.pid)?.into_iter().filter(|&fd| fd > 2) {
        task.syscall("close", libc::SYS_close, &[fd as u64])?;
    }
    let park = park_base(fds);
    raise_fd_limit(task.pid, park + 4096)?;
    // The restart's stdio, parked above every descriptor the job uses.
    for std_fd in 0..3u64 {
        task.syscall("dup3", libc::SYS_dup3, &[std_fd, park + std_fd, libc::O_CLOEXEC as u64])?;
        task.syscall("close", libc::SYS_close, &[std_fd])?;
    }
    let work_base = park + 3;
    // Epoll instances last: they watch the process's other descriptors by number.
    let (epolls, others): (Vec<&FdRecord>, Vec<&FdRecord>) = fds.iter().partition(|r| epoll::is_epoll(r));
    for rec in others.into_iter().chain(epolls) {
        let (opened, fresh) = match (&rec.kind, ctx.opened.get(&rec.description).copied()) {
            (FdKind::Stdio { which }, _) => (park + *which as u64, false),
            (_, Some((owner, owner_fd))) if owner == ns_pid => (owner_fd as u64, false),
            (_, Some((owner, owner_fd))) => (take_from(task, owner, owner_fd as u64)?, true),
            (kind, None) => {
                let fd = open_kind(task, ns_pid, rec, kind, ctx, scratch_off, work_base)
                    .map_err(|e| Error::Other(format!("fd {} ({}): {e}", rec.fd, kind_name(kind))))?;
                ctx.opened.insert(rec.description, (ns_pid, rec.fd));
                (fd, true)
            }
        };
        // (A descriptor opened right at its number carries O_CLOEXEC from its open flags.)
        if opened != rec.fd as u64 {
            task.syscall("dup3", libc::SYS_dup3, &[opened, rec.fd as u64, rec.cloexec()])?;
            if fresh {
                task.syscall("close", libc::SYS_close, &[opened])?;
            }
        }
    }
    for std_fd in 0..3u64 {
        task.syscall("close", libc::SYS_close, &[park + std_fd])?;
    }
    // Last: closing any descriptor of a file drops the process's POSIX locks on it.
    locks::restore(task, fds, scratch_off)
}

/// Opens a new object of the given kind in the task (the first descriptor of its description).
fn open_kind(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, kind: &FdKind, ctx: &mut RestoreCtx, scratch_off: usize, work_base: u64) -> Result<u64> {
    match kind {
        FdKind::File { path, .. } | FdKind::CharDevice { path } => file::open(task, rec, path, scratch_off),
        FdKind::Pipe(p) => pipe::open(task, ns_pid, rec, p, ctx, work_base),
        FdKind::Unix(u) => unix::open(task, ns_pid, rec, u, ctx, work_base),
        FdKind::Eventfd(e) => eventfd::open(task, rec, e, scratch_off),
        FdKind::Timerfd(t) => timerfd::open(task, rec, t, scratch_off),
        FdKind::Signalfd(s) => signalfd::open(task, rec, s, scratch_off),
        FdKind::Epoll(e) => epoll::open(task, rec, e, scratch_off),
        FdKind::Fifo(f) => fifo::open(task, ns_pid, rec, f, ctx, scratch_off, work_base),
        FdKind::Deleted(d) => deleted::open(task, ns_pid, rec, d, ctx, scratch_off),
        FdKind::Memfd(m) => memfd::open(task, ns_pid, rec, m, ctx, scratch_off),
        FdKind::Inotify(n) => inotify::open(task, rec, n, scratch_off),
        FdKind::Pidfd(p) => super::pidfd::open(task, rec, p),
        FdKind::Inet(i) => inet::open(task, ns_pid, rec, i, ctx, work_base),
        FdKind::Stdio { .. } => unreachable!("stdio is bound, not opened"),
    }
}

fn kind_name(kind: &FdKind) -> String {
    match kind {
        FdKind::File { path, .. } | FdKind::CharDevice { path } => path.clone(),
        FdKind::Stdio { which } => format!("stdio {which}"),
        FdKind::Eventfd(_) => "eventfd".into(),
        FdKind::Timerfd(_) => "timerfd".into(),
        FdKind::Signalfd(_) => "signalfd".into(),
        FdKind::Epoll(_) => "epoll".into(),
        FdKind::Fifo(f) => format!("FIFO {}", f.path),
        FdKind::Deleted(d) => format!("{} (deleted)", d.path),
        FdKind::Memfd(m) => format!("memfd:{}", m.name),
        FdKind::Inotify(_) => "inotify".into(),
        FdKind::Pidfd(p) => format!("pidfd of pid {}", p.pid),
        FdKind::Pipe(p) => format!("pipe:[{}]", p.ino),
        FdKind::Unix(u) => format!("socket:[{}]", u.ino),
        FdKind::Inet(i) => i.describe(),
    }
}

fn raise_fd_limit(host_pid: Tid, at_least: u64) -> Result<()> {
    let mut cur = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid out-pointer.
    unsafe { libc::prlimit64(host_pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut cur) };
    if cur.rlim_cur >= at_least {
        return Ok(());
    }
    let new = libc::rlimit64 { rlim_cur: at_least, rlim_max: cur.rlim_max.max(at_least) };
    // SAFETY: `new` is a valid in-pointer. The process's own limits are restored at the end.
    if unsafe { libc::prlimit64(host_pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) } != 0 {
        return Err(Error::Other(format!("raise the descriptor limit of pid {host_pid} to {at_least}: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}
