//! What every kind of descriptor shares, and nothing of any one kind's logic: the record of a
//! descriptor ([`FdRecord`]: number, flags, position, open file description, locks) and the
//! list of kinds ([`FdKind`]), the trait each kind's record implements ([`DescriptorKind`]),
//! the contexts capture and restore carry across the descriptors of a checkpoint or a restart
//! ([`CaptureCtx`], [`RestoreCtx`]), and the moves of descriptors between processes that many
//! kinds make ([`take_into_self`], [`take_from`], [`give`], [`move_above`]).
//!
//! Each kind's module (`eventfd`, `pipe`, `unix`, ...) holds its record, its capture and its
//! restore, and imports this module; the dispatcher, [`super::fd`], imports the kinds. To add a
//! kind: its module, with a record that implements [`DescriptorKind`], a capture the dispatcher
//! calls where the descriptor's link or type names the kind, and a line at the end of the list
//! in `descriptor_kinds!` below.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::file::{self, StdioIds};
use super::net_namespaces::JobNetworks;
use super::{
    deleted, epoll, eventfd, fanotify, fifo, inet, inotify, locks, memfd, mqueue, netlink, ns_file, packet, pidfd, pipe, pty, removed_dir, removed_symlink,
    signalfd, timerfd, unix,
};
use crate::error::{Context, Error, Result};
use crate::image::StreamReader;
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};
use crate::sys;

/// What a kind of descriptor does besides being recorded: each kind's record implements it in
/// the kind's own module, and the dispatcher reaches it through [`FdKind::object`].
pub trait DescriptorKind {
    /// How messages name the object: `eventfd`, `pipe:[1234]`, a file's path.
    fn describe(&self) -> String;

    /// Opens a new object of this kind in the task, as the first descriptor of its open file
    /// description, and returns its number there (the dispatcher moves it to its own number).
    fn open(&self, at: &mut Opening<'_>) -> Result<u64>;

    /// Whether the kind is made again by itself, with no process holding its open file
    /// description (a descriptor in flight in a Unix socket's queue that its sender closed):
    /// files, devices and pipe ends are.
    fn made_alone(&self) -> bool {
        false
    }
}

/// What opening a descriptor's object at restart works with ([`DescriptorKind::open`]).
pub struct Opening<'a> {
    /// The task being restored, stopped.
    pub task: &'a mut RemoteTask,
    /// Its pid in the job.
    pub ns_pid: Tid,
    /// The descriptor being opened: its number, flags, position and open file description.
    pub rec: &'a FdRecord,
    pub ctx: &'a mut RestoreCtx,
    /// Where in the task's scratch area paths and arguments are passed.
    pub scratch_off: usize,
    /// The lowest number where descriptors kept for a while may go: above every number of the
    /// job's table and the restart's stdio ([`keeping_base`]).
    pub work_base: u64,
    /// The process's stream, where the contents of large deleted files and memfds are; `None`
    /// for a descriptor in flight, opened once every table is restored.
    pub reader: Option<&'a mut StreamReader>,
}

/// The process's stream ([`Opening::reader`]) for a kind whose contents may be there, or an
/// error naming the descriptor if there is none.
pub fn stream<'r>(reader: &'r mut Option<&mut StreamReader>, rec: &FdRecord) -> Result<&'r mut StreamReader> {
    let fd = rec.fd;
    reader.as_deref_mut().ok_or_else(|| Error::Bug(format!("fd {fd}: its contents are in its process's stream, which is not open here")))
}

/// Declares [`FdKind`], one variant per kind, each holding its kind's record, and
/// [`FdKind::object`], which gives the record as the kind's [`DescriptorKind`].
///
/// The order is the image format: postcard numbers the variants by position, so a new kind goes
/// at the end, and no kind is ever removed or moved.
macro_rules! descriptor_kinds {
    ($($(#[$doc:meta])* $kind:ident($record:ty),)*) => {
        /// What a descriptor refers to.
        #[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
        pub enum FdKind {
            $($(#[$doc])* $kind($record),)*
        }

        impl FdKind {
            /// The record as its kind, whose module says how it is named and opened.
            pub fn object(&self) -> &dyn DescriptorKind {
                match self {
                    $(FdKind::$kind(record) => record,)*
                }
            }
        }
    };
}

descriptor_kinds! {
    /// A regular file or directory.
    File(file::FileRecord),
    /// A character device reopened by path (/dev/null, /dev/zero, /dev/urandom, ...).
    CharDevice(file::DeviceRecord),
    /// The launcher's stdin, stdout or stderr; the restart binds its own.
    Stdio(file::StdioRecord),
    /// One end of a pipe.
    Pipe(pipe::PipeRecord),
    /// A Unix domain socket.
    Unix(unix::UnixRecord),
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
    Pidfd(pidfd::PidfdRecord),
    /// A TCP or UDP socket (IPv4 or IPv6).
    Inet(inet::InetRecord),
    /// One end of a pseudo-terminal.
    Pty(pty::PtyRecord),
    /// A POSIX message queue, with its messages.
    Mqueue(mqueue::MqueueRecord),
    /// A Unix socket whose queue holds messages carrying descriptors (SCM_RIGHTS), or datagrams
    /// from senders with a name, with them and their senders.
    UnixQueue(unix::UnixQueueRecord),
    /// A netlink socket.
    Netlink(netlink::NetlinkRecord),
    /// A fanotify group and its marks.
    Fanotify(fanotify::FanotifyRecord),
    /// A packet socket.
    Packet(packet::PacketRecord),
    /// A directory removed while open (format 25).
    RemovedDir(removed_dir::RemovedDirRecord),
    /// A namespace (/proc/PID/ns/*) held open (format 31).
    NsFile(ns_file::NsFileRecord),
    /// A symbolic link itself, held with O_PATH, removed while open (format 33).
    RemovedSymlink(removed_symlink::RemovedSymlinkRecord),
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
    /// Who its I/O signals go to (F_SETOWN_EX, F_SETSIG), for a descriptor with O_ASYNC
    /// ([`super::fown`]). Format 31 (none from an older image).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub owner: Option<super::fown::FileOwner>,
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
    pub(super) by_pid: Vec<(Tid, Vec<Listed>)>,
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

    /// Adds the open descriptors of a process, with what a probe ([`super::fd::probe`]) told of each socket;
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

    pub(super) fn of_pid(&self, pid: Tid) -> &[Listed] {
        self.by_pid.iter().find(|l| l.0 == pid).map_or(&[], |l| l.1.as_slice())
    }
}

/// What capture needs of a socket besides what sock_diag tells, as the process itself answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbedSocket {
    pub ino: u64,
    /// Open flags as fdinfo shows them: F_GETFL's, with O_CLOEXEC if F_GETFD says so.
    pub flags: u32,
    /// SO_PASSCRED; None where the socket's family refuses the option (TCP, UDP: it is read only
    /// for Unix sockets).
    pub passcred: Option<bool>,
    /// SO_PASSSEC, likewise.
    pub passsec: Option<bool>,
    /// poll(POLLIN): a read would not block (something is queued, or the stream has ended).
    pub readable: bool,
    /// SO_RCVTIMEO and SO_SNDTIMEO; None where either could not be read.
    pub timeouts: Option<super::inet::Timeouts>,
}

/// The inode of a socket from its descriptor's link target (`socket:[12345]`). Pure.
pub fn socket_inode(target: &str) -> Option<u64> {
    target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The device number of the kernel's socket file system, which holds every socket's inode:
/// the same for all, so it is learned once from a socket of our own.
pub(crate) fn sockfs_dev() -> Result<u64> {
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
    /// Open file descriptions seen so far, by the (dev, ino) of their file: one descriptor
    /// holding each, in the kernel's order of descriptions (kcmp's), so that a descriptor is
    /// placed among them by a binary search. (A file every process opens itself, as each rank of
    /// an MPI job does its devices and libraries' files, made this a quadratic number of kcmp
    /// calls when each was compared with every earlier one.)
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
    pub(super) in_flight: Vec<OwnedFd>,
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
    pub(super) fn namespace_root(&mut self, pid: Tid) -> &procfs::NamespaceRoot {
        if self.namespace_root.as_ref().is_none_or(|(of, _)| *of != pid) {
            self.namespace_root = Some((pid, procfs::NamespaceRoot::of(pid)));
        }
        &self.namespace_root.as_ref().expect("just set").1
    }

    /// Inodes some lock is held on, from the kernel's table of locks (read once).
    pub(super) fn locked(&mut self) -> Result<&HashSet<u64>> {
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
    pub(super) fn description_of(&mut self, pid: Tid, fd: i32, dev: u64, ino: u64) -> u32 {
        let seen = self.descriptions.entry((dev, ino)).or_default();
        // Where kcmp cannot tell (it can for frozen processes the agent traces), the descriptor
        // counts as another description, as `same_description` answers.
        let place = seen.binary_search_by(|d| sys::kcmp::order_files(d.0, d.1, pid, fd).unwrap_or(std::cmp::Ordering::Less));
        match place {
            Ok(at) => seen[at].2,
            Err(at) => {
                let id = self.next_description;
                self.next_description += 1;
                seen.insert(at, (pid, fd, id));
                id
            }
        }
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

/// Opens, in the task, a descriptor in flight that no process held ([`unix::Carried::Alone`]),
/// once every process has its descriptors: any free number will do.
pub(crate) fn open_carried(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, ctx: &mut RestoreCtx) -> Result<u64> {
    let object = rec.kind.object();
    let opened = if object.made_alone() {
        object.open(&mut Opening { task, ns_pid, rec, ctx, scratch_off: 0, work_base: 0, reader: None })
    } else {
        Err(Error::Other(format!("a descriptor in flight of a kind not restored so ({})", object.describe())))
    };
    opened.map_err(|e| Error::Other(format!("the descriptor in flight {}: {e}", object.describe())))
}

/// Whether descriptor `fd1` of `pid1` and `fd2` of `pid2` are one open file description.
pub(super) fn same_description(pid1: Tid, fd1: i32, pid2: Tid, fd2: i32) -> bool {
    sys::kcmp::same_file(pid1, fd1, pid2, fd2)
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
    /// Deleted files, by device and inode at the checkpoint, that the job both holds by a
    /// descriptor and maps: their copy is one object for both, registered in `shared_memory`
    /// by whichever restore makes it (`memory::MemRestoreCtx::mapped_files`).
    pub mapped_files: HashSet<(u64, u64)>,
    /// Descriptors held only for other processes to take, closed by [`finish`]: (pid, fd).
    parked: Vec<(Tid, u64)>,
    /// Files of the job's /proc that name a thread, opened once every thread exists
    /// ([`super::fd::restore_thread_proc_files`]): (pid, record).
    pub(super) thread_proc_files: Vec<(Tid, FdRecord)>,
    /// Descriptors of /dev/tty, opened once the sessions have their controlling terminals again
    /// ([`super::fd::restore_tty_files`]): (pid, record).
    pub(super) tty_files: Vec<(Tid, FdRecord)>,
    /// Whether the process being restored held CAP_SYS_ADMIN at the checkpoint (its main
    /// thread's effective set), for what the kernel grants by it alone.
    pub had_admin: bool,
    /// The file rights of the process being restored while it reopens its files (its own, and
    /// the image owner's where its own are refused: [`crate::fsid::open_with_owner_rights_if_refused`]);
    /// `None` when it has the restorer's.
    pub files_rights: Option<crate::fsid::RemoteRights>,
    /// The restart runs in another boot than the checkpoint ([`super::identity::Place`]): a
    /// watched or reopened file is the one the job had by its inode, device numbers being this
    /// boot's.
    pub elsewhere: bool,
    /// The checkpoint's CPU, from the image (format 21): a thread's extended registers move to
    /// this CPU's layout where it differs.
    pub cpu: Option<super::cpu::CpuRecord>,
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
        ctx.inet.tcp.collect(all.iter().copied());
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
    /// opened it outside [`super::fd::restore`]'s loop).
    pub fn opened_at(&mut self, description: u32, ns_pid: Tid, fd: i32) {
        self.opened.insert(description, (ns_pid, fd));
    }

    pub(super) fn is_parked(&self, ns_pid: Tid, fd: u64) -> bool {
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
    Ok(park_with_room(task, fds)? + 3)
}

/// [`park_base`], with the task's descriptor limit raised to leave room above it.
pub(super) fn park_with_room(task: &RemoteTask, fds: &[FdRecord]) -> Result<u64> {
    let park = park_base(fds);
    let Err(e) = raise_fd_limit(task.pid, park + PARK_ROOM) else { return Ok(park) };
    // Above its hard limit only root may go: an ordinary user whose hard limit is low (4096 is
    // common) parks in what it allows, which a table restored one process at a time rarely
    // outgrows.
    let hard = fd_limits(task.pid)?.rlim_max;
    if hard < park + MIN_PARK_ROOM {
        return Err(Error::Other(format!(
            "{e}: the job's descriptors go up to {} and its processes may open at most {hard} here (the hard limit, ulimit -Hn): restart with a hard limit of at least {}",
            park - 1,
            park + MIN_PARK_ROOM
        )));
    }
    raise_fd_limit(task.pid, hard)?;
    Ok(park)
}

/// The descriptor numbers a restore would like above the job's own, for what it keeps there
/// meanwhile, and the fewest it can work with.
const PARK_ROOM: u64 = 4096;
const MIN_PARK_ROOM: u64 = 64;

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
    sys::pidfd::open(host_pid).map_err(|e| Error::Other(format!("pidfd_open of pid {host_pid}: {e}")))
}

/// pidfd_getfd: descriptor `fd` of the process of `pidfd` (which is `host_pid`).
fn take_through(pidfd: &OwnedFd, host_pid: Tid, fd: i32) -> Result<OwnedFd> {
    sys::pidfd::get_fd(pidfd, fd).map_err(|e| Error::Other(format!("take fd {fd} of pid {host_pid}: {e}")))
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
        sys::socket::send_with_rights(&sender, &[0], std::slice::from_ref(sock), libc::MSG_NOSIGNAL)
            .map_err(|e| Error::Other(format!("pass a socket to pid {}: {e}", task.pid)))?;
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

/// The RLIMIT_NOFILE of a process.
pub(super) fn fd_limits(host_pid: Tid) -> Result<libc::rlimit64> {
    // One prlimit(2) (the probe asks it of every process while the job is frozen); from /proc
    // where that is refused: on a process of another user it needs CAP_SYS_RESOURCE.
    let (rlim_cur, rlim_max) = match crate::ptrace::sys::rlimit(host_pid, libc::RLIMIT_NOFILE) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let limits = crate::procfs::limits(host_pid).map_err(|e| Error::Other(format!("the descriptor limit of pid {host_pid}: {e}")))?;
            (limits[libc::RLIMIT_NOFILE as usize].1, limits[libc::RLIMIT_NOFILE as usize].2)
        }
        r => r.map_err(|e| Error::Other(format!("the descriptor limit of pid {host_pid}: {e}")))?,
    };
    Ok(libc::rlimit64 { rlim_cur, rlim_max })
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

    /// The records that were struct variants of `FdKind` before it held one record per kind
    /// encode as they did: images written before decode unchanged.
    #[test]
    fn records_of_files_devices_and_stdio_encode_as_the_struct_variants_they_were() {
        #[derive(Serialize)]
        enum Before {
            File { path: String, dev: u64, ino: u64, size: u64 },
            CharDevice { path: String },
            Stdio { which: u8 },
        }
        let pairs = [
            (
                Before::File { path: "/tmp/f".into(), dev: 7, ino: 300, size: 1 << 40 },
                FdKind::File(file::FileRecord { path: "/tmp/f".into(), dev: 7, ino: 300, size: 1 << 40 }),
            ),
            (Before::CharDevice { path: "/dev/null".into() }, FdKind::CharDevice(file::DeviceRecord { path: "/dev/null".into(), node: None })),
            (Before::Stdio { which: 2 }, FdKind::Stdio(file::StdioRecord { which: 2 })),
        ];
        for (before, now) in pairs {
            let bytes = postcard::to_allocvec(&before).unwrap();
            // A device's record ends with its node since format 33: read as the format before.
            let old = crate::image::since::decoding(32, || postcard::from_bytes::<FdKind>(&bytes)).unwrap();
            assert_eq!(old, now);
            if !matches!(now, FdKind::CharDevice(_)) {
                assert_eq!(bytes, postcard::to_allocvec(&now).unwrap());
            }
        }
    }

    #[test]
    fn socket_inodes_from_links() {
        assert_eq!(socket_inode("socket:[925115]"), Some(925115));
        assert_eq!(socket_inode("/tmp/socket:[1]"), None);
        assert_eq!(socket_inode("pipe:[7]"), None);
    }
}
