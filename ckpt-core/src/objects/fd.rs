//! The descriptor table of a process: which descriptor numbers are open, on what, with which
//! flags, and which of them share one open file description (with each other, or with a
//! descriptor of another process of the job).
//!
//! Each kind of object a descriptor can refer to has its own module (`file`, `pipe`, ...) with
//! its record, its capture and its restore; this module dispatches to them and handles what is
//! common: numbers, flags, close-on-exec, and sharing. To add a kind: a module with
//! `capture(..) -> Result<Record>` and `open(..) -> Result<u64>` (the descriptor it opened in the
//! task), a variant of [`FdKind`], and one line in each of [`capture_one`] and [`open_kind`].
//!
//! The descriptors of every process are listed once per checkpoint ([`Listing`]). Reading a
//! descriptor's link, stat and fdinfo from /proc costs about 10 us; a process holding thousands
//! of sockets is instead asked from inside, in one stop, which of its descriptors are sockets and
//! with which flags ([`probe`]), so that an idle socket costs next to nothing.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::file::{self, StdioIds};
use super::net_namespaces::JobNetworks;
use super::pipe::{self, PipeRecord};
use super::unix::{self, UnixRecord};
use super::{deleted, epoll, eventfd, fifo, inet, inotify, locks, memfd, mqueue, pty, signalfd, timerfd};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{batch, RemoteTask, Tid};

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
    /// One end of a pseudo-terminal.
    Pty(pty::PtyRecord),
    /// A POSIX message queue, with its messages (added last: images without it still decode).
    Mqueue(mqueue::MqueueRecord),
    /// A Unix socket whose queue holds messages carrying descriptors (SCM_RIGHTS), or datagrams
    /// from senders with a name, with them and their senders (added last: images without it
    /// still decode).
    UnixQueue(unix::UnixQueueRecord),
    /// A netlink socket (after `UnixQueue`, the last variant: older images decode unchanged).
    Netlink(super::netlink::NetlinkRecord),
    /// A fanotify group and its marks (after `Netlink`, the last variant: older images decode
    /// unchanged).
    Fanotify(super::fanotify::FanotifyRecord),
    /// A packet socket (after `Fanotify`, the last variant: older images decode unchanged).
    Packet(super::packet::PacketRecord),
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

    /// O_CLOEXEC if the descriptor is closed on exec, for dup3.
    pub(crate) fn cloexec(&self) -> u64 {
        if self.flags & libc::O_CLOEXEC as u32 != 0 {
            libc::O_CLOEXEC as u64
        } else {
            0
        }
    }
}

/// One descriptor of a process as first listed: its number, what `/proc/<pid>/fd/<n>` points at,
/// and for a socket of a probed process what the probe told.
#[derive(Debug, Clone)]
pub struct Listed {
    pub fd: i32,
    pub target: String,
    pub probed: Option<ProbedSocket>,
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
    /// Lists the descriptors of the given (stopped) processes by their /proc links.
    pub fn of(pids: &[Tid]) -> Result<Listing> {
        let mut listing = Listing::default();
        for &pid in pids {
            let fds = procfs::fds(pid).context(|| format!("list the descriptors of pid {pid}"))?;
            listing.add(pid, fds.into_iter().map(|fd| (fd, None)).collect())?;
        }
        Ok(listing)
    }

    /// Adds the open descriptors of a process, with what a probe ([`probe`]) told of each socket;
    /// the links of the others are read from /proc.
    pub fn add(&mut self, pid: Tid, fds: Vec<(i32, Option<ProbedSocket>)>) -> Result<()> {
        let mut listed = Vec::with_capacity(fds.len());
        for (fd, probed) in fds {
            let target = match probed {
                Some(p) => format!("socket:[{}]", p.ino),
                None => procfs::readlink(&format!("/proc/{pid}/fd/{fd}"))?,
            };
            listed.push(Listed { fd, target, probed });
        }
        self.by_pid.push((pid, listed));
        Ok(())
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

// ---------------------------------------------------------------------------------------------
// Probing many descriptors from inside the process

/// What capture needs of a socket besides what sock_diag tells, as the process itself answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbedSocket {
    pub ino: u64,
    /// Open flags as fdinfo shows them: F_GETFL's, with O_CLOEXEC if F_GETFD says so.
    pub flags: u32,
    /// SO_PASSCRED; None where the socket's family refuses the option (TCP, UDP: it is read only
    /// for Unix sockets).
    pub passcred: Option<bool>,
    /// poll(POLLIN): a read would not block (something is queued, or the stream has ended).
    pub readable: bool,
    /// SO_RCVTIMEO and SO_SNDTIMEO; None where either could not be read.
    pub timeouts: Option<super::inet::Timeouts>,
}

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
/// Per socket, the options read: SO_PASSCRED's value and length (8 bytes), then SO_RCVTIMEO's and
/// SO_SNDTIMEO's, each a timeval and its length, padded (24 bytes each).
const SOCKET_OPTS_LEN: usize = 8 + 2 * TIMEOUT_SLOT;
const TIMEOUT_SLOT: usize = 24;
/// Per socket: its options and a pollfd.
const SOCKET_BUF_LEN: usize = SOCKET_OPTS_LEN + 8;
const SOCKET_CALLS: usize = 5;

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
        // Round 2, the sockets: F_GETFD, F_GETFL, SO_PASSCRED, SO_RCVTIMEO and SO_SNDTIMEO
        // each, then poll them all.
        let n = sockets.len();
        let opt = |k: usize| area + (k * SOCKET_OPTS_LEN) as u64;
        let pollfd = |k: usize| area + (n * SOCKET_OPTS_LEN + k * 8) as u64;
        let mut bufs = Vec::with_capacity(n * SOCKET_BUF_LEN);
        let mut calls = Vec::with_capacity(n * SOCKET_CALLS + n / poll_max + 1);
        let timeval_len = super::inet::Timeouts::TIMEVAL_LEN;
        for (k, &(fd, _, _)) in sockets.iter().enumerate() {
            bufs.extend_from_slice(&0i32.to_ne_bytes());
            bufs.extend_from_slice(&4u32.to_ne_bytes());
            for _ in 0..2 {
                bufs.extend_from_slice(&[0u8; 16]);
                bufs.extend_from_slice(&(timeval_len as u32).to_ne_bytes());
                bufs.extend_from_slice(&[0u8; 4]);
            }
            let fd = fd as u64;
            let slot = |i: usize| opt(k) + (8 + i * TIMEOUT_SLOT) as u64;
            calls.push(batch::Call::new(libc::SYS_fcntl, &[fd, libc::F_GETFD as u64]));
            calls.push(batch::Call::new(libc::SYS_fcntl, &[fd, libc::F_GETFL as u64]));
            calls.push(batch::Call::new(libc::SYS_getsockopt, &[fd, libc::SOL_SOCKET as u64, libc::SO_PASSCRED as u64, opt(k), opt(k) + 4]));
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
            let passcred = &opts[..4];
            let timeval = |i: usize| super::inet::Timeouts::from_timeval(&opts[8 + i * TIMEOUT_SLOT..8 + i * TIMEOUT_SLOT + timeval_len]);
            let revents = &bufs[n * SOCKET_OPTS_LEN + k * 8 + 6..n * SOCKET_OPTS_LEN + k * 8 + 8];
            let cloexec = if r[0] & libc::FD_CLOEXEC as i64 != 0 { libc::O_CLOEXEC as u32 } else { 0 };
            out[i].1 = Some(ProbedSocket {
                ino,
                flags: r[1] as u32 | cloexec,
                passcred: (r[2] >= 0).then(|| i32::from_ne_bytes(passcred.try_into().unwrap()) != 0),
                readable: i16::from_ne_bytes(revents.try_into().unwrap()) != 0,
                timeouts: (r[3] >= 0 && r[4] >= 0).then(|| super::inet::Timeouts { rcv: timeval(0), snd: timeval(1) }),
            });
        }
    }
    Ok(out)
}

/// The RLIMIT_NOFILE of a process.
fn fd_limits(host_pid: Tid) -> Result<libc::rlimit64> {
    let (rlim_cur, rlim_max) = crate::ptrace::sys::rlimit(host_pid, libc::RLIMIT_NOFILE).map_err(|e| Error::Other(format!("the descriptor limit of pid {host_pid}: {e}")))?;
    Ok(libc::rlimit64 { rlim_cur, rlim_max })
}

/// The inode of a socket from its descriptor's link target (`socket:[12345]`). Pure.
pub fn socket_inode(target: &str) -> Option<u64> {
    target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The device number of the kernel's socket file system, which holds every socket's inode:
/// the same for all, so it is learned once from a socket of our own.
pub(super) fn sockfs_dev() -> Result<u64> {
    static DEV: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if let Some(dev) = DEV.get() {
        return Ok(*dev);
    }
    let own = std::os::unix::net::UnixDatagram::unbound()?;
    let dev = std::fs::metadata(format!("/proc/self/fd/{}", own.as_raw_fd()))?.dev();
    Ok(*DEV.get_or_init(|| dev))
}

/// The tables capture reads once for many probed sockets: sock_diag's Unix sockets and the
/// kernel's locks. Each takes milliseconds (a dump of thousands of sockets; an RCU grace period),
/// so they are read on threads of their own while the descriptors are probed.
pub struct SocketTables {
    unix: unix::DiagPrefetch,
    locked: std::thread::JoinHandle<Result<HashSet<u64>>>,
}

impl SocketTables {
    /// Starts reading the tables (the job must be frozen already) of the job's network
    /// namespaces `networks`.
    pub fn start(networks: Arc<JobNetworks>) -> SocketTables {
        SocketTables { unix: unix::DiagPrefetch::start(networks), locked: std::thread::spawn(locks::locked_inodes) }
    }
}

/// A descriptor whose description is numbered: (host pid, fd, description number).
type Described = (Tid, i32, u32);

/// What capture remembers across the descriptors of every process of one checkpoint.
pub struct CaptureCtx {
    pub stdio: StdioIds,
    /// Open file descriptions seen so far, by the (dev, ino) of their file.
    descriptions: HashMap<(u64, u64), Vec<Described>>,
    next_description: u32,
    /// Pipes whose contents are already in the image, by inode.
    pub pipes_seen: HashSet<u64>,
    /// Every process's descriptors.
    pub listing: Listing,
    /// Inodes of every socket the job's processes hold.
    pub job_sockets: HashSet<u64>,
    pub unix: unix::UnixCaptureState,
    pub inet: inet::InetCaptureState,
    pub ptys: pty::PtyCaptureState,
    /// Files (device, inode) whose contents are already in the image: FIFOs, deleted files,
    /// memfds, message queues.
    pub objects_seen: HashSet<(u64, u64)>,
    /// Deleted files and memfds too large for their records, whose contents go into their
    /// process's stream once its descriptors are captured (`deleted::save_pending`).
    pub pending_saves: Vec<deleted::PendingSave>,
    /// The job's processes (host pids).
    pub pids: Vec<Tid>,
    /// This is the checkpoint's last try: a state that would pass by itself and can be lost
    /// (events queued on a notification instance) is taken as it is, with a warning.
    pub last_try: bool,
    /// The namespace root of the process whose descriptors are being captured (read once for
    /// all its files, [`CaptureCtx::namespace_root`]).
    namespace_root: Option<(Tid, procfs::NamespaceRoot)>,
    /// A pidfd of each process whose descriptors were taken into the restorer.
    pidfds: HashMap<Tid, OwnedFd>,
    /// Inodes some lock is held on, for probed sockets (whose fdinfo is not read).
    locked: Option<HashSet<u64>>,
    locked_prefetch: Option<std::thread::JoinHandle<Result<HashSet<u64>>>>,
    /// Descriptors in flight that peeks of Unix sockets installed in the restorer, kept open
    /// until the capture ends: descriptors of the job captured after them are matched to them
    /// (kcmp) by their open file description.
    in_flight: Vec<OwnedFd>,
    /// The network namespaces the job's processes are in, each with its sock_diag socket.
    pub networks: Arc<JobNetworks>,
    pub packets: super::packet::PacketCaptureState,
}

impl CaptureCtx {
    /// A context for capturing the tables of the processes `pids` (host pids), stopped, whose
    /// descriptors are `listing`; `tables` if they are being read already.
    pub fn new(stdio: StdioIds, pids: &[Tid], listing: Listing, tables: Option<SocketTables>, networks: Arc<JobNetworks>) -> CaptureCtx {
        let (unix_diag, locked_prefetch) = match tables {
            Some(t) => (Some(t.unix), Some(t.locked)),
            None => (None, None),
        };
        CaptureCtx {
            stdio,
            descriptions: HashMap::new(),
            next_description: 0,
            pipes_seen: Default::default(),
            job_sockets: listing.socket_inodes(),
            listing,
            unix: unix::UnixCaptureState::new(unix_diag, networks.clone()),
            inet: Default::default(),
            ptys: Default::default(),
            objects_seen: Default::default(),
            pending_saves: Vec::new(),
            pids: pids.to_vec(),
            last_try: false,
            namespace_root: None,
            pidfds: HashMap::new(),
            locked: None,
            locked_prefetch,
            in_flight: Vec::new(),
            networks,
            packets: Default::default(),
        }
    }

    /// Where process `pid`'s paths are reached from outside (read once per process).
    fn namespace_root(&mut self, pid: Tid) -> &procfs::NamespaceRoot {
        if self.namespace_root.as_ref().is_none_or(|(of, _)| *of != pid) {
            self.namespace_root = Some((pid, procfs::NamespaceRoot::of(pid)));
        }
        &self.namespace_root.as_ref().expect("just set").1
    }

    /// Inodes some lock is held on, from the kernel's table of locks (read once).
    fn locked(&mut self) -> Result<&HashSet<u64>> {
        if self.locked.is_none() {
            self.locked = Some(match self.locked_prefetch.take() {
                Some(h) => h.join().map_err(|_| Error::Other("reading /proc/locks panicked".into()))??,
                None => locks::locked_inodes()?,
            });
        }
        Ok(self.locked.as_ref().expect("just read"))
    }

    /// Whether no descriptor of the object (dev, ino) was captured before: the process holding
    /// it now is the one a restart makes it in.
    pub fn first_holder(&self, dev: u64, ino: u64) -> bool {
        !self.descriptions.contains_key(&(dev, ino))
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
        let pidfd = match self.pidfds.entry(pid) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(pidfd_open(pid)?),
        };
        take_through(pidfd, pid, fd)
    }
}

const KCMP_FILE: libc::c_long = 0;

fn same_description(pid1: Tid, fd1: i32, pid2: Tid, fd2: i32) -> bool {
    // SAFETY: kcmp only compares kernel objects; no memory is passed.
    unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1 as libc::c_long, fd2 as libc::c_long) == 0 }
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
        if !matches!(rec.kind, FdKind::Pipe(_) | FdKind::File { .. } | FdKind::CharDevice { .. }) {
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
        if target.ends_with(" (deleted)") || !target.starts_with('/') {
            return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, an O_PATH descriptor of a deleted file)") });
        }
        // (A symbolic link itself is not followed by the check.)
        if !meta.file_type().is_symlink() {
            reachable_by_name(pid, fd, target, &meta, ctx)?;
        }
        FdKind::File { path: target.to_string(), dev: meta.dev(), ino: meta.ino(), size: meta.size() }
    } else {
        capture_one(pid, fd, target, &meta, ctx)?
    };
    let description = ctx.description_of(pid, fd, meta.dev(), meta.ino());
    let locks = locks::from_fdinfo(pid, fd, &fdinfo)?;
    Ok(FdRecord { fd, flags: info.flags, pos: info.pos, description, kind, locks })
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
    Ok(FdRecord { fd, flags: info.flags, pos: info.pos, description, kind, locks })
}

fn socket_kind(pid: Tid, fd: i32, dev: u64, ino: u64, probed: Option<&ProbedSocket>, ctx: &mut CaptureCtx) -> Result<FdKind> {
    if let Some(which) = ctx.stdio.which(dev, ino) {
        return Ok(FdKind::Stdio { which });
    }
    // sock_diag knows every Unix socket of the network namespace: no need to ask this one.
    if unix::is_unix(ino, ctx)? {
        return unix::capture(pid, fd, ino, probed, ctx);
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
        libc::AF_UNIX => unix::capture(pid, fd, ino, probed, ctx),
        libc::AF_NETLINK => Ok(FdKind::Netlink(super::netlink::capture(pid, fd, ino, &s, ctx.last_try)?)),
        libc::AF_PACKET => Ok(FdKind::Packet(super::packet::capture(pid, fd, ino, &s, (&ctx.networks, &mut ctx.packets), ctx.last_try)?)),
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
    if let Some(master) = pty::which_end(meta) {
        return Ok(FdKind::Pty(pty::capture(pid, fd, master, meta, &ctx.pids, &mut ctx.ptys)?));
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
        "anon_inode:inotify" => return Ok(FdKind::Inotify(inotify::capture(pid, fd, ctx.last_try)?)),
        "anon_inode:[fanotify]" => return Ok(FdKind::Fanotify(super::fanotify::capture(pid, fd, ctx.last_try)?)),
        "anon_inode:[pidfd]" => return Ok(FdKind::Pidfd(super::pidfd::capture(pid, fd)?)),
        _ => {}
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
        return Ok(FdKind::Deleted(deleted::capture(pid, fd, path, meta, ctx)?));
    }
    if ft.is_file() || ft.is_dir() {
        if target.ends_with(" (deleted)") || !target.starts_with('/') {
            return Err(Error::Unsupported { pid, what: format!("fd {fd} ({target}, a deleted file)") });
        }
        reachable_by_name(pid, fd, target, meta, ctx)?;
        return Ok(FdKind::File { path: target.to_string(), dev: meta.dev(), ino: meta.ino(), size: meta.size() });
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

/// What restore remembers across the processes of one node.
#[derive(Default)]
pub struct RestoreCtx {
    /// Description number → (pid in the job, fd) of a descriptor already holding it.
    opened: HashMap<u32, (Tid, i32)>,
    /// Per-kind state shared between processes (the other ends of pipes, ...).
    pub pipes: pipe::PipeRestoreState,
    pub unix: unix::UnixRestoreState,
    pub inet: inet::InetRestoreState,
    pub ptys: pty::PtyRestoreState,
    /// Queue notifications to register and queues to unlink once every table is restored.
    pub mqueues: mqueue::MqRestoreState,
    /// Files recreated once for several descriptions (FIFOs, deleted files, memfds, message
    /// queues), by their device and inode at the checkpoint: where a descriptor on the new one
    /// is (pid, fd).
    pub objects: HashMap<(u64, u64), (Tid, u64)>,
    /// The contents of deleted files and memfds that the process being restored saved in its
    /// stream (its record's `saved_files`), by device and inode.
    pub saved_files: HashMap<(u64, u64), deleted::SavedFileContents>,
    /// Shared memory objects the memory restore made with a descriptor (memfds, and memory more
    /// than one mapping shares), by their inode at the checkpoint: where that descriptor is
    /// parked (pid, fd), for other mappings and memfd descriptors of the same object.
    pub shared_memory: HashMap<u64, (Tid, u64)>,
    /// Descriptors held only for other processes to take, closed by [`finish`]: (pid, fd).
    parked: Vec<(Tid, u64)>,
    /// Files of the job's /proc that name a thread, opened once every thread exists
    /// ([`restore_thread_proc_files`]): (pid, record).
    thread_proc_files: Vec<(Tid, FdRecord)>,
    /// Whether the process being restored held CAP_SYS_ADMIN at the checkpoint (its main
    /// thread's effective set), for what the kernel grants by it alone.
    pub had_admin: bool,
}

impl RestoreCtx {
    /// A context for restoring the given processes' tables.
    pub fn new<'a>(tables: impl Iterator<Item = &'a [FdRecord]>) -> RestoreCtx {
        let mut ctx = RestoreCtx::default();
        // Descriptors in flight that no process holds are restored as the job's are: a pipe's
        // contents may be in their records.
        let all: Vec<&FdRecord> = tables.flatten().flat_map(|r| std::iter::once(r).chain(unix::alone_in_flight(&r.kind))).collect();
        ctx.pipes.collect(all.iter().copied());
        ctx.unix.collect(all.iter().copied());
        ctx.ptys.collect(all.iter().copied());
        ctx.mqueues.collect(all.iter().copied());
        ctx.inet.reconnect.collect(all.iter().copied());
        ctx.had_admin = true;
        ctx
    }

    pub fn park(&mut self, ns_pid: Tid, fd: u64) {
        self.parked.push((ns_pid, fd));
    }

    /// A parked descriptor that its own process took after all.
    pub fn unpark(&mut self, ns_pid: Tid, fd: u64) {
        self.parked.retain(|&p| p != (ns_pid, fd));
    }

    /// Whether a descriptor of this open file description was opened already.
    pub fn is_opened(&self, description: u32) -> bool {
        self.opened.contains_key(&description)
    }

    /// A process (pid in the job) and descriptor already holding `description`.
    pub fn holder(&self, description: u32) -> Option<(Tid, i32)> {
        self.opened.get(&description).copied()
    }

    /// Records that process `ns_pid` holds `description` at descriptor `fd` (for a restore that
    /// opened it outside [`restore`]'s loop).
    pub fn opened_at(&mut self, description: u32, ns_pid: Tid, fd: i32) {
        self.opened.insert(description, (ns_pid, fd));
    }

    fn is_parked(&self, ns_pid: Tid, fd: u64) -> bool {
        self.parked.contains(&(ns_pid, fd))
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

/// Where descriptors that other restores keep in a task while its table is restored may go (at
/// or above; they are parked, see [`RestoreCtx::park`]): above every number of the job's table
/// `fds` and the restart's stdio. Raises the task's descriptor limit to allow them.
pub fn keeping_base(task: &RemoteTask, fds: &[FdRecord]) -> Result<u64> {
    let park = park_base(fds);
    raise_fd_limit(task.pid, park + 4096)?;
    Ok(park + 3)
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

/// Gives a descriptor of the restorer to the task (same open file description); returns its
/// number there, at or above `base`. The task cannot take it by pidfd (the restorer is outside
/// its PID namespace), so it is passed over a Unix socket pair made in the task, one end of
/// which the restorer takes: sendmsg(SCM_RIGHTS) here, recvmsg injected there.
pub fn give(task: &mut RemoteTask, sock: &OwnedFd, base: u64) -> Result<u64> {
    let out = task.scratch_at(0);
    task.syscall("socketpair", libc::SYS_socketpair, &[libc::AF_UNIX as u64, (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64, 0, out])?;
    let pair = task.get(out, 8)?;
    let (theirs, ours) = (i32::from_ne_bytes(pair[0..4].try_into().unwrap()) as u64, i32::from_ne_bytes(pair[4..8].try_into().unwrap()) as u64);
    let result = (|| -> Result<u64> {
        let sender = take_into_self(task.pid, ours as i32)?;
        send_fd(&sender, sock).map_err(|e| Error::Other(format!("pass a socket to pid {}: {e}", task.pid)))?;
        // recvmsg's arguments in scratch: msghdr (56) | iovec (16) | one byte | control (24).
        let (msg, iov, byte, control) = (0usize, 64usize, 80usize, 88usize);
        let base_addr = task.scratch_at(0);
        let at = |off: usize| base_addr + off as u64;
        let mut hdr = Vec::with_capacity(56);
        for v in [0u64, 0, at(iov), 1, at(control), CMSG_SPACE_INT as u64, 0] {
            hdr.extend_from_slice(&v.to_ne_bytes());
        }
        task.put(msg, &hdr)?;
        let mut iovec = at(byte).to_ne_bytes().to_vec();
        iovec.extend_from_slice(&1u64.to_ne_bytes());
        task.put(iov, &iovec)?;
        task.put(control, &[0u8; CMSG_SPACE_INT])?;
        task.syscall("recvmsg", libc::SYS_recvmsg, &[theirs, at(msg), libc::MSG_CMSG_CLOEXEC as u64])?;
        let cmsg = task.get(at(control), CMSG_SPACE_INT)?;
        let (level, ty) = (i32::from_ne_bytes(cmsg[8..12].try_into().unwrap()), i32::from_ne_bytes(cmsg[12..16].try_into().unwrap()));
        if level != libc::SOL_SOCKET || ty != libc::SCM_RIGHTS {
            return Err(Error::Other(format!("pass a socket to pid {}: no descriptor arrived", task.pid)));
        }
        let fd = i32::from_ne_bytes(cmsg[16..20].try_into().unwrap()) as u64;
        move_above(task, fd, base)
    })();
    task.syscall("close", libc::SYS_close, &[theirs])?;
    task.syscall("close", libc::SYS_close, &[ours])?;
    result
}

/// CMSG_SPACE(sizeof(int)) on 64-bit Linux: a 16-byte header and the int, padded to 8.
const CMSG_SPACE_INT: usize = 24;

/// sendmsg with one byte and `fd` in an SCM_RIGHTS message.
fn send_fd(over: &OwnedFd, fd: &OwnedFd) -> std::io::Result<()> {
    let mut control = [0u8; CMSG_SPACE_INT];
    control[0..8].copy_from_slice(&(20u64).to_ne_bytes()); // CMSG_LEN(sizeof(int))
    control[8..12].copy_from_slice(&libc::SOL_SOCKET.to_ne_bytes());
    control[12..16].copy_from_slice(&libc::SCM_RIGHTS.to_ne_bytes());
    control[16..20].copy_from_slice(&fd.as_raw_fd().to_ne_bytes());
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut _, iov_len: 1 };
    // SAFETY: zeroed msghdr, then pointers to the live buffers above, of their lengths.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut _;
    msg.msg_controllen = control.len();
    // SAFETY: `msg` points to valid buffers for the duration of the call.
    if unsafe { libc::sendmsg(over.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Takes a descriptor of another process of the job (same open file description), from inside
/// `task`. Returns the new descriptor's number in `task`.
///
/// A task in a user namespace the job made may not reach the owner: a process that entered a
/// user namespace is not dumpable, and then only a capability in the user namespace its memory
/// was made in (the job's) lets another take its descriptors; the task has none there. The
/// restorer has (it runs as the job's owner, above the job's user namespace): it takes the
/// descriptor itself, through the task's own pidfd of the owner, and gives it to the task.
pub fn take_from(task: &mut RemoteTask, owner_ns_pid: Tid, owner_fd: u64) -> Result<u64> {
    let pidfd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[owner_ns_pid as u64, 0])?;
    let r = match task.syscall("pidfd_getfd", libc::SYS_pidfd_getfd, &[pidfd, owner_fd, 0]) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => take_into_self(task.pid, pidfd as i32)
            .and_then(|owner| take_through(&owner, owner_ns_pid, owner_fd as i32))
            .and_then(|fd| give(task, &fd, 0))
            .map_err(|by_restorer| Error::Other(format!("{e}, nor could the restorer pass it on: {by_restorer}"))),
        r => r.map_err(Error::from),
    };
    task.syscall("close", libc::SYS_close, &[pidfd])?;
    r.map_err(|e| Error::Other(format!("take fd {owner_fd} of pid {owner_ns_pid}: {e}")))
}

/// Recreates the descriptor table inside the task, whose pid in the job is `ns_pid`. The task
/// starts with the restart's stdio at 0, 1, 2; `scratch_off` is where paths are passed.
/// `reader` is the process's stream (the contents of large deleted files and memfds).
pub fn restore(task: &mut RemoteTask, ns_pid: Tid, fds: &[FdRecord], ctx: &mut RestoreCtx, scratch_off: usize, reader: &mut crate::image::StreamReader) -> Result<()> {
    // Whatever the empty process still holds of its creator's beyond stdio goes first (not what
    // the memory restore parked in it).
    for fd in procfs::fds(task.pid)?.into_iter().filter(|&fd| fd > 2 && !ctx.is_parked(ns_pid, fd as u64)) {
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
    // Pairs of Unix sockets held by this process alone, all at once (thousands are common).
    unix::restore_pairs(task, ns_pid, fds, ctx)?;
    // Epoll instances last: they watch the process's other descriptors (and each other) by number;
    // before them, inotify instances that watch a deleted file through its descriptor.
    for rec in epoll::restore_order(fds) {
        if let FdKind::File { path, .. } = &rec.kind {
            if names_another_thread(path) {
                ctx.thread_proc_files.push((ns_pid, rec.clone()));
                continue;
            }
        }
        let (opened, fresh) = match (&rec.kind, ctx.opened.get(&rec.description).copied()) {
            (FdKind::Stdio { which }, _) => (park + *which as u64, false),
            (_, Some((owner, owner_fd))) if owner == ns_pid => (owner_fd as u64, false),
            (_, Some((owner, owner_fd))) => (take_from(task, owner, owner_fd as u64)?, true),
            (kind, None) => {
                let fd = open_kind(task, ns_pid, rec, kind, ctx, scratch_off, work_base, reader)
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
        let FdKind::File { path, .. } = &rec.kind else { continue };
        let fd = file::open(task, &rec, path, scratch_off).map_err(|e| Error::Other(format!("fd {} ({path}): {e}", rec.fd)))?;
        if fd != rec.fd as u64 {
            task.syscall("dup3", libc::SYS_dup3, &[fd, rec.fd as u64, rec.cloexec()])?;
            task.syscall("close", libc::SYS_close, &[fd])?;
        }
    }
    Ok(())
}

/// Opens a new object of the given kind in the task (the first descriptor of its description).
#[allow(clippy::too_many_arguments)]
fn open_kind(
    task: &mut RemoteTask,
    ns_pid: Tid,
    rec: &FdRecord,
    kind: &FdKind,
    ctx: &mut RestoreCtx,
    scratch_off: usize,
    work_base: u64,
    reader: &mut crate::image::StreamReader,
) -> Result<u64> {
    match kind {
        FdKind::File { path, .. } | FdKind::CharDevice { path } => file::open(task, rec, path, scratch_off),
        FdKind::Pipe(p) => pipe::open(task, ns_pid, rec, p, ctx, work_base),
        FdKind::Unix(u) => unix::open(task, ns_pid, rec, u, ctx, work_base),
        FdKind::UnixQueue(r) => unix::open(task, ns_pid, rec, &r.socket, ctx, work_base),
        FdKind::Eventfd(e) => eventfd::open(task, rec, e, scratch_off),
        FdKind::Timerfd(t) => timerfd::open(task, rec, t, scratch_off),
        FdKind::Signalfd(s) => signalfd::open(task, rec, s, scratch_off),
        FdKind::Epoll(e) => epoll::open(task, rec, e, scratch_off, work_base),
        FdKind::Fifo(f) => fifo::open(task, ns_pid, rec, f, ctx, scratch_off, work_base),
        FdKind::Deleted(d) => deleted::open(task, ns_pid, rec, d, ctx, scratch_off, reader),
        FdKind::Memfd(m) => memfd::open(task, ns_pid, rec, m, ctx, scratch_off, reader),
        FdKind::Inotify(n) => inotify::open(task, rec, n, scratch_off),
        FdKind::Pidfd(p) => super::pidfd::open(task, rec, p),
        FdKind::Inet(i) => inet::open(task, ns_pid, rec, i, ctx, work_base),
        FdKind::Pty(p) => pty::open(task, ns_pid, rec, p, ctx, scratch_off, work_base),
        FdKind::Mqueue(m) => mqueue::open(task, ns_pid, rec, m, ctx, scratch_off, work_base),
        FdKind::Netlink(n) => super::netlink::open(task, ns_pid, rec, n, work_base),
        FdKind::Packet(p) => super::packet::open(task, ns_pid, rec, p, work_base),
        FdKind::Fanotify(f) => super::fanotify::open(task, rec, f, scratch_off, ctx.had_admin),
        FdKind::Stdio { .. } => unreachable!("stdio is bound, not opened"),
    }
}

/// Opens, in the task, a descriptor in flight that no process held ([`unix::Carried::Alone`]),
/// once every process has its descriptors: any free number will do.
pub(crate) fn open_carried(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, ctx: &mut RestoreCtx) -> Result<u64> {
    let opened = match &rec.kind {
        FdKind::File { path, .. } | FdKind::CharDevice { path } => file::open(task, rec, path, 0),
        FdKind::Pipe(p) => pipe::open(task, ns_pid, rec, p, ctx, 0),
        other => Err(Error::Other(format!("a descriptor in flight of a kind not restored so ({})", kind_name(other)))),
    };
    opened.map_err(|e| Error::Other(format!("the descriptor in flight {}: {e}", kind_name(&rec.kind))))
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
        FdKind::UnixQueue(r) => format!("socket:[{}] with descriptors in flight or datagrams from named senders", r.socket.ino),
        FdKind::Inet(i) => i.describe(),
        FdKind::Pty(p) => p.describe(),
        FdKind::Mqueue(m) => format!("POSIX message queue {}", m.name),
        FdKind::Netlink(n) => n.describe(),
        FdKind::Packet(p) => p.describe(),
        FdKind::Fanotify(_) => "fanotify".into(),
    }
}

pub(crate) fn raise_fd_limit(host_pid: Tid, at_least: u64) -> Result<()> {
    let cur = fd_limits(host_pid)?;
    if cur.rlim_cur >= at_least {
        return Ok(());
    }
    // The process's own limits are restored at the end.
    crate::ptrace::sys::set_rlimit(host_pid, libc::RLIMIT_NOFILE, at_least, cur.rlim_max.max(at_least))
        .map_err(|e| Error::Other(format!("raise the descriptor limit of pid {host_pid} to {at_least}: {e}")))
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

    #[test]
    fn socket_inodes_from_links() {
        assert_eq!(socket_inode("socket:[925115]"), Some(925115));
        assert_eq!(socket_inode("/tmp/socket:[1]"), None);
        assert_eq!(socket_inode("pipe:[7]"), None);
    }
}
