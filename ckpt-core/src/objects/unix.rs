//! Unix domain sockets: stream, datagram and seqpacket; pairs (from socketpair or from a connect
//! that was accepted), listening sockets with their name, and the messages in every receive queue.
//!
//! Capture learns a socket's peer, name, type, state, buffer sizes and queue length from one
//! sock_diag dump, and reads its receive queue without taking anything out (MSG_PEEK with
//! SO_PEEK_OFF, one message at a time, so datagram boundaries are kept), only when the queue
//! length or poll says there is something to read: an idle socket costs no system call of its own
//! when its process was probed (`super::fd::probe`), which told its flags and SO_PASSCRED. Restore rebuilds a connected pair with socketpair(2) in the first process
//! that holds an end, parks the other end for its owner, and sends each queued message again
//! through the peer so that it lands in the same queue. Connections still waiting in a listener's
//! backlog are connected again once every process has its descriptors.
//!
//! A socket whose peer every process has closed (a socketpair's survivor; sock_diag shows its
//! peer as inode 0) keeps what its queue holds: restore makes a pair, fills the survivor's queue
//! through the other end and closes that end, so the kernel gives the survivor the same end of
//! file, POLLHUP and EPIPE (a datagram socket: ECONNREFUSED once, then ENOTCONN) as before. When
//! the closed end had data unread, the kernel had also marked the survivor reset (ECONNRESET,
//! once, after its queue): restore leaves data unread in the other end before closing it.
//!
//! Messages carrying descriptors (SCM_RIGHTS): a peek installs the descriptors a message carries
//! in the restorer, which tells each apart ([`super::fd::capture_carried`]): one whose open file
//! description a descriptor of the job holds too (kcmp) is recorded by its description, one no
//! process holds is captured as a descriptor of its own (pipes, files and devices only; other
//! kinds are refused). Such a socket is its own descriptor kind, [`FdKind::UnixQueue`]. At
//! restore, its queue is filled last, once every process has its descriptors
//! ([`send_carried`]): the restorer keeps a duplicate of the sending end made with the pair and
//! sends each message again with SCM_RIGHTS carrying descriptors taken from their holders. The
//! kernel does not show where, in a stream, a message carrying descriptors began: the bytes
//! queued since the previous such message come back in one message with it, so a read of those
//! earlier bytes alone receives the descriptors already. Datagram and seqpacket messages keep
//! their boundaries.
//!
//! Datagrams sent to a bound socket by senders not connected to it: the peek keeps each one's
//! sender address (recvfrom's), and when one sender had a name the socket is a
//! [`FdKind::UnixQueue`] too (without, every sender was unbound). Its queue is filled last as
//! well ([`send_to_name`]), in one pass in
//! queue order, each datagram sent to the socket's name from inside the process that holds it:
//! from the job's socket of that name, from a socket bound to the name for the moment when the
//! sender closed, from an unbound socket for an unbound sender.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use super::descriptor::take_into_self;
use super::descriptor::{self, CaptureCtx, DescriptorKind, FdKind, FdRecord, Opening, ProbedSocket, RestoreCtx};
use super::net_namespaces::JobNetworks;
use crate::error::{Error, Result};
use crate::procfs;
use crate::ptrace::{batch, RemoteTask, Tid};
use crate::sockdiag::{self, UnixDiag};
use crate::sys::socket as sys;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnixRecord {
    pub ino: u32,
    /// SOCK_STREAM, SOCK_DGRAM or SOCK_SEQPACKET.
    pub sock_type: i32,
    /// The bound name: a path, or an abstract name starting with a NUL byte.
    pub name: Option<Vec<u8>>,
    pub listening: bool,
    /// The connected peer's inode; [`PEER_GONE`] when every process has closed the peer.
    pub peer: Option<u32>,
    /// A connection not accepted yet: the name of the listener it waits on.
    pub pending_on: Option<Vec<u8>>,
    /// Messages in the receive queue, in order (a stream's bytes may come in several pieces).
    pub queue: Vec<Vec<u8>>,
    /// Shutdown state as sock_diag reports it (1: no more receiving, 2: no more sending), and
    /// [`RESET_PENDING`].
    pub shutdown: u8,
    pub sndbuf: i32,
    pub rcvbuf: i32,
    pub passcred: bool,
    /// The bound socket file's owner and mode (uid, gid, permission bits), when the name is a
    /// path and the file was there at the checkpoint: bind(2) makes it anew at restart, owned by
    /// the restorer and with the restorer's umask, which would lock the job's clients out.
    pub file: Option<(u32, u32, u32)>,
    /// SO_RCVTIMEO and SO_SNDTIMEO.
    pub timeouts: super::inet::Timeouts,
    /// SO_PASSSEC: the receiver asks for the sender's security label with each message (what
    /// systemd-journald and dbus-daemon set) (format 31).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub passsec: bool,
}

/// `UnixRecord::peer` of a socket whose peer every process has closed: sock_diag's inode of a
/// peer that has no file any more. No socket of an image has inode 0.
pub const PEER_GONE: u32 = 0;

/// A bit of `UnixRecord::shutdown` that is ckpt's, not sock_diag's (which uses 1 and 2): the
/// peer was closed with data unread, so an ECONNRESET waits for the survivor (POLLERR; its next
/// read after the queue, or next send of a seqpacket, fails so, once). Kept in this byte so
/// that the record's layout, and the image format, stay as they were.
pub const RESET_PENDING: u8 = 4;

/// A Unix socket whose receive queue holds what [`UnixRecord`] does not keep: messages carrying
/// descriptors (SCM_RIGHTS), or datagrams from senders with a name (a socket not connected).
/// The socket as [`UnixRecord`] tells it, and, per queued message, what it carries and who sent
/// it. Its own descriptor kind ([`FdKind::UnixQueue`], the enum's last variant), so that images
/// without it decode as before.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UnixQueueRecord {
    pub socket: UnixRecord,
    /// For each message of `socket.queue`, in order, the descriptors it carries, in the order
    /// the receiver gets them (none for a message without).
    pub carried: Vec<Vec<Carried>>,
    /// For each message of `socket.queue`, in order, its sender's address as recvfrom reports
    /// it (a path without its NUL, or an abstract name starting with a NUL; None for an unbound
    /// sender); empty when the socket is connected (its messages are sent again from its peer)
    /// or every sender was unbound.
    pub senders: Vec<Option<Vec<u8>>>,
}

/// A descriptor in flight: passed with SCM_RIGHTS, not received yet.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Carried {
    /// An open file description that a descriptor of the job holds too ([`FdRecord::description`]):
    /// at restart it is taken from its holder.
    Shared { description: u32 },
    /// One that no process of the job holds (its sender closed it): a pipe end, a file or a
    /// device, made again from its record (whose `fd` is -1).
    Alone(Box<FdRecord>),
}

/// The Unix socket of a descriptor kind, whether its queue carries descriptors or not.
pub fn socket_of(kind: &FdKind) -> Option<&UnixRecord> {
    match kind {
        FdKind::Unix(u) => Some(u),
        FdKind::UnixQueue(r) => Some(&r.socket),
        _ => None,
    }
}

/// Who a socket is connected to, as sock_diag tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// Not connected (or a connection still waiting in a listener's backlog).
    None,
    /// A socket of the job, by inode.
    Job(u32),
    /// Closed by every process.
    Gone,
    /// A socket no process of the job holds.
    Outside,
}

/// Who the socket `d` (not waiting in a job listener's backlog) is connected to. A peer without
/// a file shows as inode 0: one that every process has closed, which also shut a stream or
/// seqpacket survivor for both directions; or a connection that a listener sock_diag does not
/// see (another network namespace's) has not accepted yet, which is outside. Pure.
fn peer_of(d: &UnixDiag, job_sockets: &HashSet<u64>) -> Peer {
    const SHUT_BOTH: u8 = 3;
    match d.peer {
        None => Peer::None,
        Some(0) if d.sock_type as i32 == libc::SOCK_DGRAM || d.shutdown == SHUT_BOTH => Peer::Gone,
        Some(p) if p != 0 && job_sockets.contains(&(p as u64)) => Peer::Job(p),
        Some(_) => Peer::Outside,
    }
}

/// Per-checkpoint state of Unix socket capture.
pub struct UnixCaptureState {
    diag: Option<Diag>,
    prefetch: Option<DiagPrefetch>,
    networks: Arc<JobNetworks>,
}

impl UnixCaptureState {
    /// A state that takes sock_diag's dump from `prefetch` when it needs it, if given, or
    /// else dumps the Unix sockets of the job's network namespaces `networks` itself.
    pub fn new(prefetch: Option<DiagPrefetch>, networks: Arc<JobNetworks>) -> UnixCaptureState {
        UnixCaptureState { diag: None, prefetch, networks }
    }
}

/// sock_diag's dump of the Unix sockets, made on a thread of its own.
pub struct DiagPrefetch(std::thread::JoinHandle<std::io::Result<Diag>>);

impl DiagPrefetch {
    pub fn start(networks: Arc<JobNetworks>) -> DiagPrefetch {
        DiagPrefetch(std::thread::spawn(move || dump_all(&networks)))
    }
}

/// The Unix sockets of every network namespace of the job, in one table: a socket's inode is
/// unique across namespaces, and a connection may join two (a socket bound to a path is
/// reached from any namespace that sees the path).
fn dump_all(networks: &JobNetworks) -> std::io::Result<Diag> {
    let mut all = HashMap::new();
    let mut netns_of = HashMap::new();
    for (netns, via) in networks.diag_sockets() {
        let dumped = sockdiag::unix_sockets(via)?;
        netns_of.extend(dumped.keys().map(|&ino| (ino, netns)));
        all.extend(dumped);
    }
    Ok(Diag { netns_of, ..Diag::of(all) })
}

/// What sock_diag says of the Unix sockets of the job's network namespaces, from one dump of
/// each.
pub struct Diag {
    sockets: HashMap<u32, UnixDiag>,
    /// A connection not accepted yet → the listener it waits on.
    waiting_on: HashMap<u32, u32>,
    /// Each socket's network namespace (an index of the job's networks).
    netns_of: HashMap<u32, usize>,
}

impl Diag {
    /// Indexes a dump. Pure.
    fn of(sockets: HashMap<u32, UnixDiag>) -> Diag {
        let waiting_on = sockets.values().filter(|d| d.state == sockdiag::STATE_LISTEN).flat_map(|l| l.pending.iter().map(|&p| (p, l.ino))).collect();
        Diag { sockets, waiting_on, netns_of: HashMap::new() }
    }
}

/// What sock_diag says, dumped once per checkpoint.
fn diag(state: &mut UnixCaptureState) -> Result<&Diag> {
    if state.diag.is_none() {
        let dumped = match state.prefetch.take() {
            Some(p) => p.0.join().map_err(|_| Error::Other("the sock_diag dump panicked".into()))?,
            None => dump_all(&state.networks),
        };
        state.diag = Some(dumped.map_err(|e| Error::Other(format!("list the Unix sockets (sock_diag): {e}")))?);
    }
    Ok(state.diag.as_ref().expect("just loaded"))
}

fn unsupported(pid: Tid, fd: i32, what: &str) -> Error {
    Error::Unsupported { pid, what: format!("fd {fd} (a Unix socket {what})") }
}

/// Whether the job's socket of inode `ino` is a Unix socket sock_diag knows.
pub fn is_unix(ino: u64, ctx: &mut CaptureCtx) -> Result<bool> {
    Ok(diag(&mut ctx.unix)?.sockets.contains_key(&(ino as u32)))
}

fn sockopt_int(fd: &OwnedFd, level: i32, name: i32) -> Result<i32> {
    Ok(super::inet::getopt_int(fd, level, name)?)
}

fn set_sockopt_int(fd: &OwnedFd, level: i32, name: i32, v: i32) -> Result<()> {
    Ok(super::inet::setopt_int(fd, level, name, v)?)
}

/// How the dispatcher captures a descriptor in flight that a peek installed in the restorer
/// (`super::fd::capture_carried`), given to [`capture`] so that this module need not import the
/// dispatcher: such a descriptor may be of any kind.
pub type CaptureCarried = fn(Tid, i32, OwnedFd, &mut CaptureCtx) -> Result<Carried>;

/// Captures a Unix socket of a stopped process. A socket the probe saw (`probed`) whose queue is
/// empty is captured from sock_diag and the probe alone; the others are taken into the restorer
/// (pidfd_getfd) to read what they need. A socket whose queue holds messages carrying
/// descriptors is captured with them ([`FdKind::UnixQueue`]), each of those through `carry`.
pub fn capture(pid: Tid, fd: i32, ino: u64, probed: Option<&ProbedSocket>, ctx: &mut CaptureCtx, carry: CaptureCarried) -> Result<FdKind> {
    let first_holder = ctx.first_holder(descriptor::sockfs_dev()?, ino);
    let diags = diag(&mut ctx.unix)?;
    let d = diags.sockets.get(&(ino as u32)).cloned().ok_or_else(|| unsupported(pid, fd, "that sock_diag does not know"))?;
    // An abstract name is its network namespace's: a restart binds it in the process's own,
    // the first that holds it (parents first; a child that inherited it shares it again).
    if first_holder
        && d.name.as_ref().is_some_and(|n| n.first() == Some(&0))
        && diags.netns_of.get(&(ino as u32)).is_some_and(|&n| n != ctx.networks.index_of(pid))
    {
        return Err(unsupported(pid, fd, "bound to an abstract name in another network namespace than its process's (made before the process entered one of its own, or passed to it from another): a restart would bind the name in the process's own"));
    }
    let listening = d.state == sockdiag::STATE_LISTEN;
    // A connection not accepted yet shows its listener's backlog as peer (inode 0); the listener
    // lists it (by this socket's inode) among its pending connections.
    let listener = diags.waiting_on.get(&(ino as u32)).and_then(|l| diags.sockets.get(l));
    let pending_on = match listener {
        Some(l) if ctx.job_sockets.contains(&(l.ino as u64)) => {
            if d.rqueue > 0 {
                return Err(unsupported(pid, fd, "that received data before its connection was accepted"));
            }
            // What it sent waits in the listener's half of the connection, which no process
            // holds before accept(2) and no call reads: a restart would connect again without
            // it (a tmux client's greeting: client and server then waited for each other for
            // ever). The listener's program takes it in a moment: the checkpoint is tried again.
            if d.sent_unread > 0 {
                return Err(Error::Passing { pid, what: format!("fd {fd} (a Unix socket that sent data on a connection its listener has not accepted yet)") });
            }
            l.name.clone()
        }
        Some(_) => return Err(unsupported(pid, fd, "connecting to a listener outside the job")),
        None => None,
    };
    let peer = if pending_on.is_some() { Peer::None } else { peer_of(&d, &ctx.job_sockets) };
    if peer == Peer::Outside {
        return Err(unsupported(pid, fd, "connected to a process outside the job"));
    }
    // A datagram socket connected to a bound one that is not connected back is connected again
    // by name at restart; what its own queue holds would have no sender to come back from.
    let one_way = match peer {
        Peer::Job(p) => d.sock_type as i32 == libc::SOCK_DGRAM && diags.sockets.get(&p).is_some_and(|pd| pd.peer != Some(ino as u32) && pd.name.is_some()),
        _ => false,
    };
    if listening && !d.pending.is_empty() && d.name.is_none() {
        return Err(unsupported(pid, fd, "listening without a name"));
    }
    let mut sock = None;
    let (passcred, passsec, readable) = match probed.and_then(|p| Some((p.passcred?, p.passsec?, p.readable))) {
        Some(known) => known,
        None => {
            let s = sock.insert(ctx.take(pid, fd)?);
            let flag = |name| sockopt_int(s, libc::SOL_SOCKET, name).map(|v| v != 0);
            (flag(libc::SO_PASSCRED)?, flag(libc::SO_PASSSEC)?, super::inet::poll_one(s, libc::POLLIN, 0)? != 0)
        }
    };
    // sock_diag's queue length counts bytes, so a queue of zero-length datagrams shows 0; poll
    // tells any message (or the end of a stream) apart from none.
    let mut shutdown = d.shutdown;
    let Peeked { queue, senders, passed } = if peer == Peer::Gone {
        let s = match sock.take() {
            Some(s) => s,
            None => ctx.take(pid, fd)?,
        };
        let (peeked, reset) = gone_peer_queue(&s, pid, fd, &d)?;
        if reset {
            shutdown |= RESET_PENDING;
        }
        sock = Some(s);
        peeked
    } else if listening || (d.rqueue == 0 && !readable) || (d.sock_type as i32 != libc::SOCK_DGRAM && peer == Peer::None) {
        // (A stream or seqpacket socket never connected has no queue, and a peek fails:
        // EINVAL, ENOTCONN; poll reports it hung up.)
        Peeked::default()
    } else {
        let s = match sock.take() {
            Some(s) => s,
            None => ctx.take(pid, fd)?,
        };
        // Shut for reading (the peer's shutdown(SHUT_WR)), a peek at the end answers 0 as a
        // zero-length message does.
        let at_end_zero = d.shutdown & 1 != 0;
        let peeked = peek_queue_upto(&s, pid, fd, None, d.sock_type as i32, at_end_zero)?;
        sock = Some(s);
        peeked
    };
    // Datagrams sent to this socket's name by senders not connected to it: a restart sends
    // them again to that name, each from a socket with its sender's name (or none), so that
    // recvfrom reports the same address ([`send_to_name`]; the senders are recorded when one
    // had a name, none means every one was unbound). A connected datagram socket
    // takes datagrams from its peer only (the kernel refuses the others' with EPERM); those
    // queued before it connected are sent again from its peer, as its own are.
    if !queue.is_empty() && d.peer.is_none() && (d.name.is_none() || d.sock_type as i32 != libc::SOCK_DGRAM) {
        return Err(unsupported(pid, fd, "holding messages without a peer or a name"));
    }
    if one_way && !queue.is_empty() {
        return Err(unsupported(pid, fd, "connected to a bound datagram socket that is not connected back, holding datagrams of its own"));
    }
    let senders = if d.peer.is_none() && senders.iter().any(Option::is_some) { senders } else { Vec::new() };
    let timeouts = match probed.and_then(|p| p.timeouts) {
        Some(t) => t,
        None => {
            let s = match sock.as_ref() {
                Some(s) => s.try_clone().map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}")))?,
                None => ctx.take(pid, fd)?,
            };
            super::inet::Timeouts::capture(&s).map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}: the socket's timeouts")))?
        }
    };
    let (rcvbuf, sndbuf) = match d.bufs {
        Some(b) => b,
        None => {
            let s = ctx.take(pid, fd)?;
            (sockopt_int(&s, libc::SOL_SOCKET, libc::SO_RCVBUF)?, sockopt_int(&s, libc::SOL_SOCKET, libc::SO_SNDBUF)?)
        }
    };
    let socket = UnixRecord {
        ino: ino as u32,
        sock_type: d.sock_type as i32,
        name: d.name.clone(),
        listening,
        peer: match peer {
            Peer::Job(p) => Some(p),
            Peer::Gone => Some(PEER_GONE),
            Peer::None | Peer::Outside => None,
        },
        pending_on,
        queue,
        shutdown,
        sndbuf,
        rcvbuf,
        passcred,
        file: d.name.as_deref().and_then(|n| socket_file(pid, n)),
        timeouts,
        passsec,
    };
    if passed.iter().all(Vec::is_empty) && senders.is_empty() {
        return Ok(FdKind::Unix(socket));
    }
    // Each descriptor the peeks installed in the restorer is told apart: shared with one the job
    // holds, or made again from its own record.
    let mut carried = Vec::with_capacity(passed.len());
    for fds in passed {
        let mut these = Vec::with_capacity(fds.len());
        for f in fds {
            these.push(carry(pid, fd, f, ctx)?);
        }
        carried.push(these);
    }
    Ok(FdKind::UnixQueue(UnixQueueRecord { socket, carried, senders }))
}

/// Owner and mode of the socket file a path name leads to (a relative name is relative to the
/// process's working directory); None for an abstract name or a path that is not a socket now.
fn socket_file(pid: Tid, name: &[u8]) -> Option<(u32, u32, u32)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if name.first() == Some(&0) || name.is_empty() {
        return None;
    }
    let rel = std::path::Path::new(std::ffi::OsStr::from_bytes(name));
    let path = if rel.is_absolute() { rel.to_path_buf() } else { std::path::PathBuf::from(format!("/proc/{pid}/cwd")).join(rel) };
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type().is_socket().then(|| (meta.uid(), meta.gid(), meta.mode() & 0o7777))
}

/// The queue of a socket whose peer is gone, and whether a reset waits for it (POLLERR). A read,
/// even a peek, that finds the queue empty takes the reset (and a seqpacket or datagram socket's
/// first read takes it whatever the queue holds): a stream's queue is read up to the bytes
/// sock_diag counts and no further, and the other types' queue only without a reset.
fn gone_peer_queue(s: &OwnedFd, pid: Tid, fd: i32, d: &UnixDiag) -> Result<(Peeked, bool)> {
    let revents = super::inet::poll_one(s, libc::POLLIN, 0).map_err(|e| Error::Other(format!("poll fd {fd} of pid {pid}: {e}")))?;
    let reset = revents & libc::POLLERR != 0;
    let stream = d.sock_type as i32 == libc::SOCK_STREAM;
    let queue = if d.rqueue == 0 && (reset || revents & libc::POLLIN == 0) {
        // A reset socket's queue shows bytes unless it holds only zero-length messages, which
        // cannot be read without taking the reset.
        Peeked::default()
    } else if stream {
        peek_queue_upto(s, pid, fd, Some(d.rqueue as usize), libc::SOCK_STREAM, true)?
    } else if reset {
        return Err(unsupported(
            pid,
            fd,
            "whose peer was closed with data unread, holding messages that cannot be read without taking the ECONNRESET the process has yet to see",
        ));
    } else {
        peek_queue_upto(s, pid, fd, None, d.sock_type as i32, true)?
    };
    Ok((queue, reset))
}

/// What a peek of a receive queue found.
#[derive(Default)]
struct Peeked {
    /// The messages, in order (a stream's bytes in pieces, each ending where a message carrying
    /// descriptors ends).
    queue: Vec<Vec<u8>>,
    /// For each message, its sender's address, as recvfrom reports it (None: an unbound
    /// sender, or a socketpair's end).
    senders: Vec<Option<Vec<u8>>>,
    /// For each message, the descriptors it carries, as the peek installed them in the restorer.
    passed: Vec<Vec<OwnedFd>>,
}

/// Messages a queue's peek takes at most (a queue is bounded by its socket's receive buffer,
/// some thousands of messages).
const MAX_PEEKED_MESSAGES: usize = 1 << 20;

/// Bytes of the buffer a queue is peeked with: a larger message is refused.
const PEEK_BUF: usize = 256 * 1024;

/// Reads the receive queue without taking anything out, stopping once `limit` bytes are read
/// when given (a stream's queue length). A peek installs the descriptors a message carries in
/// the restorer (a stream's peek stops after the piece that carries them); they are returned.
/// `at_end_zero`: the socket is shut for reading (or its peer gone), so that a peek past its
/// last message answers 0: the first zero-length answer then ends the queue (a zero-length
/// message just before the end is taken for the end).
fn peek_queue_upto(sock: &OwnedFd, pid: Tid, fd: i32, limit: Option<usize>, sock_type: i32, at_end_zero: bool) -> Result<Peeked> {
    let old_off = sockopt_int(sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF)?;
    set_sockopt_int(sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0)?;
    let result = (|| {
        let mut out = Vec::new();
        let mut passed = Vec::new();
        let mut senders = Vec::new();
        let mut buf = vec![0u8; PEEK_BUF];
        let mut total = 0;
        loop {
            if limit.is_some_and(|l| total >= l) {
                return Ok(Peeked { queue: out, senders, passed });
            }
            let got = match sys::recv_with_rights(sock, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) {
                Ok(got) => got,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(Peeked { queue: out, senders, passed }),
                Err(e) => return Err(Error::Other(format!("read the queue of fd {fd} of pid {pid}: {e}"))),
            };
            let (n, fds) = (got.len, got.fds);
            if got.flags & libc::MSG_CTRUNC != 0 {
                return Err(unsupported(pid, fd, "with a message carrying more descriptors or credentials than a peek takes"));
            }
            // A stream's peek that fills the buffer may end inside the piece that carries
            // descriptors, and the next would install them again.
            if !fds.is_empty() && sock_type == libc::SOCK_STREAM && n == buf.len() {
                return Err(unsupported(pid, fd, "with more than 256 KiB queued up to the end of a message carrying descriptors"));
            }
            if n == 0 && fds.is_empty() && (sock_type == libc::SOCK_STREAM || at_end_zero) {
                // The end of the queue of a socket shut for reading: no message (one sent
                // again to a socket shut before it connected would fail with EPIPE).
                return Ok(Peeked { queue: out, senders, passed });
            }
            senders.push(sender_name(&got.from));
            if got.flags & libc::MSG_TRUNC != 0 {
                return Err(unsupported(pid, fd, "with a message larger than 256 KiB in its queue"));
            }
            out.push(buf[..n].to_vec());
            passed.push(fds);
            total += n;
            // A zero-length datagram is a message of its own, and more may follow it: the
            // kernel's next peek goes past it, as it does past one peeked before. (So a
            // zero-length message that an earlier checkpoint's peek saw is not seen again:
            // the second checkpoint of a job that runs on leaves it out.) The queue is bounded
            // by the socket's receive buffer; a kernel that kept answering the same empty
            // message would not be.
            if out.len() > MAX_PEEKED_MESSAGES {
                return Err(unsupported(pid, fd, "whose queue peeks as more than a million messages"));
            }
        }
    })();
    set_sockopt_int(sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old_off)?;
    result
}

/// The name in the address `from` (sockaddr_un bytes, as long as recvmsg reported), as
/// sock_diag gives names (a path without its NUL); None for an unbound sender (no address).
/// Pure.
fn sender_name(from: &[u8]) -> Option<Vec<u8>> {
    let path = from.get(std::mem::size_of::<libc::sa_family_t>()..).filter(|p| !p.is_empty())?;
    let path = &path[..path.len().min(SUN_PATH_LEN)];
    if path.first() == Some(&0) {
        return Some(path.to_vec());
    }
    Some(path.split(|&b| b == 0).next().unwrap_or(&[]).to_vec())
}

/// Per-node state of Unix sockets being restored.
#[derive(Default)]
pub struct UnixRestoreState {
    /// Every socket of the image, by inode, for the other end's queue and type.
    sockets: HashMap<u32, UnixRecord>,
    /// An end created with its peer, waiting for its owner: inode → (pid, parked fd).
    waiting: HashMap<u32, (Tid, u64)>,
    /// Connections to make once every listener exists: (pid, fd, the name connected to, and
    /// the socket it names when the image says which), taken with [`UnixRestoreState::take_connects`].
    connects: Vec<(Tid, u64, Vec<u8>, Option<u32>)>,
    /// What the queued messages of a socket carry, by its inode, for the sockets whose messages
    /// carry descriptors.
    carried: HashMap<u32, Vec<Vec<Carried>>>,
    /// Who sent each queued message, by inode, for the sockets not connected that hold
    /// datagrams from senders with a name.
    senders: HashMap<u32, Vec<Option<Vec<u8>>>>,
    /// Queues to fill once every process has its descriptors ([`send_carried`]).
    pending: Vec<PendingQueue>,
    /// Paths bound at restart whose socket file was not there at the checkpoint (the job
    /// removed it, and perhaps its directory, while the socket lived on): removed again once the
    /// restart's connects and sends no longer need them ([`remove_names_gone`]).
    names_gone: Vec<NameGone>,
    /// Where each socket of `names_gone` can be reached meanwhile, by its inode: its socket file
    /// moved aside at once (a name the job bound twice, to sockets both alive, names one file).
    aliases: HashMap<u32, Vec<u8>>,
}

impl UnixRestoreState {
    /// The connections to make now that every socket exists: (pid, fd, name), a socket whose
    /// name's file the restart moved aside reached there.
    pub fn take_connects(&mut self) -> Vec<(Tid, u64, Vec<u8>)> {
        std::mem::take(&mut self.connects)
            .into_iter()
            .map(|(pid, fd, name, target)| {
                let by_inode = target.and_then(|ino| self.aliases.get(&ino));
                // A listener reached by name: the one socket of that name moved aside, if one was.
                let by_name = || {
                    let mut moved = self.names_gone.iter().filter(|g| g.path == name).filter_map(|g| self.aliases.get(&g.ino));
                    match (moved.next(), moved.next()) {
                        (Some(alias), None) => Some(alias),
                        _ => None,
                    }
                };
                let to = by_inode.or_else(|| if target.is_none() { by_name() } else { None }).cloned().unwrap_or(name);
                (pid, fd, to)
            })
            .collect()
    }
}

/// A socket file the restart made that the checkpoint did not find ([`UnixRestoreState::names_gone`]).
struct NameGone {
    /// The process that bound it (pid in the job): its names resolve as the bind's did.
    owner: Tid,
    /// The socket's inode at the checkpoint.
    ino: u32,
    path: Vec<u8>,
    /// The socket file's (device, inode) right after the bind: another file there later is not
    /// removed.
    file: (u64, u64),
    /// The directories made for the bind, deepest last.
    made_dirs: Vec<Vec<u8>>,
}

/// A queue whose messages carry descriptors or came from senders not connected, filled once
/// every descriptor exists.
struct PendingQueue {
    /// The socket whose queue it is.
    ino: u32,
    /// What sends the messages.
    sending: Sending,
    /// The process that made the sending socket, or holds the receiver (pid in the job): where
    /// descriptors in flight that no process holds are opened.
    owner: Tid,
}

enum Sending {
    /// The restorer's duplicate of a socket connected to the receiver.
    Through(OwnedFd),
    /// Each message from a socket with its sender's name (or an unbound one), to the name of
    /// the receiver, which `owner` holds at `fd` ([`send_to_name`]).
    ToName { fd: i32 },
}

impl UnixRestoreState {
    pub fn collect<'a>(&mut self, fds: impl Iterator<Item = &'a FdRecord>) {
        for rec in fds {
            if let Some(u) = socket_of(&rec.kind) {
                self.sockets.insert(u.ino, u.clone());
            }
            if let FdKind::UnixQueue(r) = &rec.kind {
                if r.carried.iter().any(|c| !c.is_empty()) {
                    self.carried.insert(r.socket.ino, r.carried.clone());
                }
                if !r.senders.is_empty() {
                    self.senders.insert(r.socket.ino, r.senders.clone());
                }
            }
        }
    }
}

/// The records of the descriptors in flight in a socket's queue that no process holds. Pure.
pub fn alone_in_flight(kind: &FdKind) -> impl Iterator<Item = &FdRecord> {
    let carried = match kind {
        FdKind::UnixQueue(r) => r.carried.as_slice(),
        _ => &[],
    };
    carried.iter().flatten().filter_map(|c| match c {
        Carried::Alone(rec) => Some(rec.as_ref()),
        Carried::Shared { .. } => None,
    })
}

/// sun_path's size: a path takes up to one byte less (its terminating NUL); an abstract name,
/// which starts with a NUL and has none at its end, may fill it (programs that bind with
/// `sizeof(struct sockaddr_un)` make names of exactly this length).
const SUN_PATH_LEN: usize = 108;

fn sockaddr(name: &[u8]) -> Result<Vec<u8>> {
    let abstract_name = name.first() == Some(&0);
    let room = if abstract_name { SUN_PATH_LEN } else { SUN_PATH_LEN - 1 };
    if name.len() > room {
        return Err(Error::Other(format!("a Unix socket name of {} bytes, longer than the {room} a name may have", name.len())));
    }
    let mut addr = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    addr.extend_from_slice(name);
    if !abstract_name {
        addr.push(0);
    }
    Ok(addr)
}

/// Whether `u` is a datagram socket connected to `peer` (a bound socket of the job), which is
/// not connected back: a socketpair would connect both ways and leave `peer` without its name.
/// Pure.
fn connected_one_way(u: &UnixRecord, peer: &UnixRecord) -> bool {
    u.sock_type == libc::SOCK_DGRAM && u.peer == Some(peer.ino) && peer.peer != Some(u.ino) && peer.name.is_some()
}

impl DescriptorKind for UnixRecord {
    fn describe(&self) -> String {
        format!("socket:[{}]", self.ino)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.work_base)
    }
}

impl DescriptorKind for UnixQueueRecord {
    fn describe(&self) -> String {
        format!("socket:[{}] with descriptors in flight or datagrams from named senders", self.socket.ino)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, &self.socket, at.ctx, at.work_base)
    }
}

/// Opens a Unix socket in the task.
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, u: &UnixRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let sock = if let Some((owner, parked)) = ctx.unix.waiting.remove(&u.ino) {
        if owner == ns_pid {
            ctx.unpark(ns_pid, parked);
            parked
        } else {
            descriptor::take_from(task, owner, parked)?
        }
    } else if u.peer == Some(PEER_GONE) {
        create_survivor(task, ns_pid, u, ctx, work_base)?
    } else if u.peer == Some(u.ino) {
        create_connected_to_itself(task, ns_pid, u, ctx, work_base)?
    } else if let Some(peer) = u.peer.filter(|p| ctx.unix.sockets.get(p).is_some_and(|pr| !connected_one_way(u, pr))) {
        create_pair(task, ns_pid, u, peer, ctx, work_base)?
    } else {
        let s = task.syscall("socket", libc::SYS_socket, &[libc::AF_UNIX as u64, (u.sock_type | libc::SOCK_CLOEXEC) as u64, 0])?;
        let s = descriptor::move_above(task, s, work_base)?;
        bind_as_recorded(task, ns_pid, s, u, &mut ctx.unix)?;
        if u.listening {
            task.syscall("listen", libc::SYS_listen, &[s, libc::SOMAXCONN as u64])?;
        }
        if let Some(listener) = &u.pending_on {
            ctx.unix.connects.push((ns_pid, rec.fd as u64, listener.clone(), None));
        }
        // A datagram socket connected to a bound one of the job that is not connected back (a
        // client's connect to a server's name): connected again to that name once every socket
        // exists, as a pending connection is.
        if let Some(target) = u.peer.and_then(|p| ctx.unix.sockets.get(&p)).filter(|pr| connected_one_way(u, pr)) {
            ctx.unix.connects.push((ns_pid, rec.fd as u64, target.name.clone().expect("connected_one_way: the peer has a name"), Some(target.ino)));
        }
        s
    };
    set_options(task, sock, u)?;
    if u.peer.is_none() && !u.queue.is_empty() {
        // Datagrams sent to its name by senders not connected to it: sent again from their
        // names once every socket exists ([`send_to_name`]).
        ctx.unix.pending.push(PendingQueue { ino: u.ino, sending: Sending::ToName { fd: rec.fd }, owner: ns_pid });
    }
    task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[sock, libc::F_SETFL as u64, status_flags(rec)])?;
    Ok(sock)
}

/// Binds socket `s` to `u`'s name, if it had one, and gives its socket file the owner and mode
/// it had.
fn bind_as_recorded(task: &mut RemoteTask, ns_pid: Tid, s: u64, u: &UnixRecord, state: &mut UnixRestoreState) -> Result<()> {
    let Some(name) = &u.name else { return Ok(()) };
    // A path whose socket file was gone at the checkpoint: its file is made for the bind and
    // moved aside at once, where its new name fits an address (the job may have bound the name
    // again, to another socket restored later, or put something else there), then removed at
    // the end of the restore with the directories made for it.
    let gone = u.file.is_none() && name.first() != Some(&0);
    let alias = [name.as_slice(), format!(".ckpt-{}", u.ino).as_bytes()].concat();
    let aside = (gone && alias.len() < UNIX_PATH_MAX).then_some(alias.as_slice());
    let Bound { made_dirs, file, moved_aside } = bind(task, s, name, aside)?;
    match u.file {
        Some(file) => set_file_owner_mode(task, name, file)?,
        None if gone => {
            // Known where `bind` moved it aside; otherwise it is still at the name.
            let file = match file {
                Some(file) => file,
                None => path_identity(task, name)?
                    .ok_or_else(|| Error::Other(format!("the socket file {:?} just bound is not there", String::from_utf8_lossy(name))))?,
            };
            if moved_aside {
                state.aliases.insert(u.ino, alias);
            }
            state.names_gone.push(NameGone { owner: ns_pid, ino: u.ino, path: name.clone(), file, made_dirs });
        }
        None => {}
    }
    Ok(())
}

/// What [`bind`] did besides binding.
struct Bound {
    /// The directories it made, deepest last.
    made_dirs: Vec<Vec<u8>>,
    /// The socket file's (device, inode), read where it was asked to be moved aside (None
    /// otherwise: it is at the name).
    file: Option<(u64, u64)>,
    /// Whether the socket file is at the name it was asked to be moved to.
    moved_aside: bool,
}

/// Binds the task's socket `s` to `name`. A path whose directory is missing (removed since the
/// checkpoint, or before it with the socket file; a restart on another machine) gets the
/// directories made, mode 0700, by the task. With `aside` (a name whose file was gone at the
/// checkpoint), the socket file is moved there once bound; and where something else took the
/// name since (zdtm's fifo_upon_unix_socket00: a FIFO), that is moved away for the moment of
/// the bind and put back.
fn bind(task: &mut RemoteTask, s: u64, name: &[u8], aside: Option<&[u8]>) -> Result<Bound> {
    if name.first() != Some(&0) {
        remove_stale_socket_file(task, name)?;
    }
    let shown = || String::from_utf8_lossy(name).into_owned();
    let addr = sockaddr(name)?;
    let try_bind = |task: &mut RemoteTask| -> std::io::Result<u64> {
        let at = task.put(0, &addr)?;
        task.syscall("bind", libc::SYS_bind, &[s, at, addr.len() as u64])
    };
    let failed = |e: std::io::Error| Error::Other(format!("bind a Unix socket to {:?}: {e}", shown()));
    let mut bound = Bound { made_dirs: Vec::new(), file: None, moved_aside: false };
    let mut occupant = None;
    match try_bind(task) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && name.first() != Some(&0) => {
            bound.made_dirs = make_missing_dirs(task, name).map_err(|e| Error::Other(format!("make the directories of the Unix socket {:?}: {e}", shown())))?;
            try_bind(task).map_err(failed)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && aside.is_some() => {
            let away = [name, b".ckpt-occupant"].concat();
            move_aside(task, name, &away).map_err(|_| failed(e))?;
            occupant = Some(away);
            if let Err(e) = try_bind(task) {
                let _ = move_aside(task, occupant.as_deref().expect("just set"), name);
                return Err(failed(e));
            }
        }
        r => {
            r.map_err(failed)?;
        }
    }
    if let Some(alias) = aside {
        bound.file = path_identity(task, name)?;
        bound.moved_aside = move_aside(task, name, alias).is_ok();
    }
    if let Some(away) = occupant {
        let back = if bound.moved_aside { move_aside(task, &away, name) } else { Err(std::io::Error::other("the socket file is in its place")) };
        back.map_err(|e| Error::Other(format!("put back what was at {:?} (moved to {:?} for the bind): {e}", shown(), String::from_utf8_lossy(&away))))?;
    }
    Ok(bound)
}

/// Makes the missing directories on the way to the path `name` in the task (mode 0700: only the
/// job's user may use what the restart made), deepest last. Nothing is made where the path's
/// directories all exist.
fn make_missing_dirs(task: &mut RemoteTask, name: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut missing = Vec::new();
    let mut dir = name;
    while let Some(cut) = dir.iter().rposition(|&b| b == b'/') {
        dir = &dir[..cut];
        if dir.is_empty() || path_identity(task, dir)?.is_some() {
            break;
        }
        missing.push(dir.to_vec());
    }
    missing.reverse();
    for d in &missing {
        let at = task.put(0, &[d.as_slice(), &[0]].concat())?;
        task.syscall("mkdirat", libc::SYS_mkdirat, &[libc::AT_FDCWD as u64, at, 0o700])?;
    }
    Ok(missing)
}

/// The longest path an address holds (sun_path, with its terminating NUL).
const UNIX_PATH_MAX: usize = 108;

/// Renames the socket file at `from` to `to` in the task, never over something there.
fn move_aside(task: &mut RemoteTask, from: &[u8], to: &[u8]) -> std::io::Result<u64> {
    const RENAME_NOREPLACE: u64 = 1;
    let from_at = task.put(0, &[from, &[0]].concat())?;
    let to_at = task.put(from.len() + 1, &[to, &[0]].concat())?;
    let cwd = libc::AT_FDCWD as u64;
    task.syscall("renameat2", libc::SYS_renameat2, &[cwd, from_at, cwd, to_at, RENAME_NOREPLACE])
}

/// The (device, inode) of what is at `path` in the task (not followed), None when nothing is.
fn path_identity(task: &mut RemoteTask, path: &[u8]) -> Result<Option<(u64, u64)>> {
    // struct statx: stx_ino (u64) at 32, stx_dev_major and _minor (u32) at 136 and 140.
    const STATX_INO: u64 = 0x100;
    const STATX_SIZE: usize = 256;
    let path_addr = task.put(STATX_SIZE, &[path, &[0]].concat())?;
    let buf = task.scratch_at(0);
    let flags = (libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC) as u64;
    match task.syscall("statx", libc::SYS_statx, &[libc::AT_FDCWD as u64, path_addr, flags, STATX_INO, buf]) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => return Ok(None),
        r => r?,
    };
    let b = task.get(buf, STATX_SIZE)?;
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as u64;
    let ino = u64::from_le_bytes(b[32..40].try_into().expect("8 bytes"));
    Ok(Some((libc::makedev(u32_at(136) as u32, u32_at(140) as u32), ino)))
}

/// Removes the socket files the restart made for names whose file the checkpoint did not find,
/// and the directories made for them, once every connect and send of the restore is done: each
/// by the process that bound it, and only what is still the file the bind made.
pub fn remove_names_gone(ctx: &mut RestoreCtx, tasks: &mut std::collections::BTreeMap<Tid, RemoteTask>) -> Result<()> {
    let aliases = std::mem::take(&mut ctx.unix.aliases);
    let gone = std::mem::take(&mut ctx.unix.names_gone);
    // Every file first: a directory made for one name may hold the others'.
    for g in &gone {
        let task = tasks.get_mut(&g.owner).ok_or_else(|| Error::not_created(g.owner))?;
        let at_now = aliases.get(&g.ino).unwrap_or(&g.path);
        if path_identity(task, at_now)? == Some(g.file) {
            let at = task.put(0, &[at_now.as_slice(), &[0]].concat())?;
            // With the process's own rights by now, which a sticky directory may refuse for a
            // file the restorer's made: left, and said.
            if let Err(e) = task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, at, 0]) {
                tracing::warn!(pid = g.owner, path = %String::from_utf8_lossy(at_now), "the socket file made for a name the checkpoint found without one is left: {e}");
            }
        }
    }
    for g in gone.iter().rev() {
        let task = tasks.get_mut(&g.owner).ok_or_else(|| Error::not_created(g.owner))?;
        for dir in g.made_dirs.iter().rev() {
            let at = task.put(0, &[dir.as_slice(), &[0]].concat())?;
            // Something else put in it meanwhile keeps it.
            let _ = task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, at, libc::AT_REMOVEDIR as u64]);
        }
    }
    Ok(())
}

/// A socket file left by the job's previous life is in the way of bind; anything else at the
/// path is not ours and stays (bind then says the address is in use). The process removes it
/// itself, with its own file rights (see [`crate::fsid`]) and as its own relative names
/// resolve, and the path's last component is never followed.
fn remove_stale_socket_file(task: &mut RemoteTask, name: &[u8]) -> Result<()> {
    // struct statx: stx_mode (u16) at offset 28; STATX_TYPE asks for nothing more.
    const STATX_TYPE: u64 = 1;
    const STATX_SIZE: usize = 256;
    const MODE_AT: usize = 28;
    let mut path = name.split(|&b| b == 0).next().unwrap_or(name).to_vec();
    path.push(0);
    let path_addr = task.put(STATX_SIZE, &path)?;
    let buf = task.scratch_at(0);
    let flags = (libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC) as u64;
    let stat = task.syscall("statx", libc::SYS_statx, &[libc::AT_FDCWD as u64, path_addr, flags, STATX_TYPE, buf]);
    let Ok(_) = stat else { return Ok(()) };
    let mode = task.get(buf + MODE_AT as u64, 2)?;
    if u16::from_le_bytes([mode[0], mode[1]]) as u32 & libc::S_IFMT == libc::S_IFSOCK {
        // Gone meanwhile, or not ours to remove: bind reports what is left.
        let _ = task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, path_addr, 0]);
    }
    Ok(())
}

/// Gives a socket file just bound the owner and mode it had at the checkpoint. Done by the task
/// itself, so that a relative name resolves as bind's did. A chown the restorer's rights do not
/// allow (an ordinary user's restart of a file another user owned) leaves the restorer's owner,
/// with a warning; the mode is always put back.
fn set_file_owner_mode(task: &mut RemoteTask, name: &[u8], (uid, gid, mode): (u32, u32, u32)) -> Result<()> {
    let path = String::from_utf8_lossy(name).into_owned();
    let at = task.put_path(0, &path)?;
    let nofollow = libc::AT_SYMLINK_NOFOLLOW as u64;
    if let Err(e) = task.syscall("fchownat", libc::SYS_fchownat, &[libc::AT_FDCWD as u64, at, uid as u64, gid as u64, nofollow]) {
        tracing::warn!(path, uid, gid, "cannot give the socket file its owner back: {e}");
    }
    task.syscall("fchmodat", libc::SYS_fchmodat, &[libc::AT_FDCWD as u64, at, (mode & 0o7777) as u64])
        .map_err(|e| Error::Other(format!("give the Unix socket file {path} its mode {mode:o} back: {e}")))?;
    Ok(())
}

/// The SOL_SOCKET options a restored socket is given, with their values' bytes and a name for
/// errors. Buffer sizes are halved: the kernel doubles what setsockopt gives it. Pure.
fn options_of(u: &UnixRecord) -> [(i32, &'static str, Vec<u8>); 6] {
    use super::inet::Timeouts;
    [
        (libc::SO_SNDBUF, "setsockopt(SO_SNDBUF)", (u.sndbuf / 2).to_ne_bytes().to_vec()),
        (libc::SO_RCVBUF, "setsockopt(SO_RCVBUF)", (u.rcvbuf / 2).to_ne_bytes().to_vec()),
        (libc::SO_PASSCRED, "setsockopt(SO_PASSCRED)", (u.passcred as i32).to_ne_bytes().to_vec()),
        (libc::SO_PASSSEC, "setsockopt(SO_PASSSEC)", (u.passsec as i32).to_ne_bytes().to_vec()),
        (libc::SO_RCVTIMEO, "setsockopt(SO_RCVTIMEO)", Timeouts::timeval(u.timeouts.rcv)),
        (libc::SO_SNDTIMEO, "setsockopt(SO_SNDTIMEO)", Timeouts::timeval(u.timeouts.snd)),
    ]
}

/// The status flags a restored socket is given (fcntl(F_SETFL)): its blocking mode.
fn status_flags(rec: &FdRecord) -> u64 {
    (rec.flags & libc::O_NONBLOCK as u32) as u64
}

fn set_options(task: &mut RemoteTask, s: u64, u: &UnixRecord) -> Result<()> {
    for (name, _, v) in options_of(u) {
        let at = task.put(0, &v)?;
        task.syscall("setsockopt", libc::SYS_setsockopt, &[s, libc::SOL_SOCKET as u64, name as u64, at, v.len() as u64])?;
    }
    Ok(())
}

/// Connected pairs both of whose ends this process holds and opens first (neither end opened by
/// an earlier process, each the other's peer): (index of one end, index of the other) in `fds`,
/// each socket once, by the first descriptor that holds it. Pure.
fn pairs_within(fds: &[FdRecord], opened_before: impl Fn(&FdRecord, &UnixRecord) -> bool) -> Vec<(usize, usize)> {
    let unix = |i: usize| socket_of(&fds[i].kind);
    let mut first_holder: HashMap<u32, usize> = HashMap::new();
    for i in 0..fds.len() {
        if let Some(u) = unix(i) {
            first_holder.entry(u.ino).or_insert(i);
        }
    }
    let mut paired = HashSet::new();
    let mut pairs = Vec::new();
    for i in 0..fds.len() {
        let Some(u) = unix(i) else { continue };
        let Some(peer) = u.peer.filter(|&p| p != PEER_GONE && p != u.ino) else { continue };
        let Some(&j) = first_holder.get(&peer) else { continue };
        let Some(p) = unix(j) else { continue };
        let first = first_holder[&u.ino] == i;
        // A pair with a side shut before it connected is made by a connection
        // (`create_pair`), one call at a time.
        let shut_early = shut_before_connect(u, p) | shut_before_connect(p, u) != 0;
        if !first
            || p.peer != Some(u.ino)
            || paired.contains(&u.ino)
            || opened_before(&fds[i], u)
            || opened_before(&fds[j], p)
            || named_datagram_pair(u, p)
            || shut_early
        {
            continue;
        }
        paired.extend([u.ino, peer]);
        pairs.push((i, j));
    }
    pairs
}

/// Whether `u` and `p`, connected to each other, are datagram sockets of which one at least has a
/// name (two bound sockets each connected to the other): [`create_pair`] binds their names, in
/// the process that makes the pair, which may be either end's: only abstract names and absolute
/// paths, which do not depend on the process's working directory. Pure.
fn named_datagram_pair(u: &UnixRecord, p: &UnixRecord) -> bool {
    let portable = |r: &UnixRecord| r.name.as_ref().is_none_or(|n| n.first().is_some_and(|&c| c == 0 || c == b'/'));
    u.sock_type == libc::SOCK_DGRAM && (u.name.is_some() || p.name.is_some()) && portable(u) && portable(p)
}

/// Calls inside the process per end of a pair restored by [`restore_pairs`]: two moves to a
/// number of its own, six options, shutdown, flags, two moves to its number.
const CALLS_PER_END: usize = 12;
/// Bytes of the area per end: its calls, its options' values (two ints, SO_PASSCRED's and
/// SO_PASSSEC's, two timevals), and half of the pair's socketpair result.
const AREA_PER_END: usize = CALLS_PER_END * batch::ENTRY_LEN + 4 * 4 + 2 * super::inet::Timeouts::TIMEVAL_LEN + 4 + 4;

/// Restores, in two runs of calls inside the process, every connected pair both of whose ends
/// the process opens first ([`pairs_within`]), instead of about twenty injected calls a pair
/// (4,000 idle pairs: 612 ms that way on the machine of 2026-11-26, 85 ms so): socketpair for all; the queues sent again from the restorer;
/// then every new end moved above every open number, given its options, shutdown and flags,
/// and put at its number. The descriptors are then opened as far as [`super::fd::restore`] is
/// concerned. A process whose SIGTRAP is not free for the runner (see [`batch::trap_is_free`])
/// keeps the one-call-at-a-time path.
pub fn restore_pairs(task: &mut RemoteTask, ns_pid: Tid, fds: &[FdRecord], ctx: &mut RestoreCtx) -> Result<()> {
    let pairs = pairs_within(fds, |rec, u| ctx.is_opened(rec.description) || ctx.unix.waiting.contains_key(&u.ino));
    if pairs.is_empty() || !batch::trap_is_free(task.pid)? {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let area_len = (2 * pairs.len() * AREA_PER_END).next_multiple_of(4096) as u64;
    let state = &mut ctx.unix;
    batch::with_runner(task, area_len, |task, runner, area| -> Result<()> {
        let ends = make_pairs(task, runner, area, fds, &pairs)?;
        for (k, &(i, j)) in pairs.iter().enumerate() {
            let (Some(u), Some(p)) = (socket_of(&fds[i].kind), socket_of(&fds[j].kind)) else { unreachable!("pairs_within pairs Unix sockets") };
            // Each end's queue is sent again from the other end.
            fill_queue(task, ns_pid, ends[2 * k + 1], u, state)?;
            fill_queue(task, ns_pid, ends[2 * k], p, state)?;
        }
        let records: Vec<&FdRecord> = pairs.iter().flat_map(|&(i, j)| [&fds[i], &fds[j]]).collect();
        settle_ends(task, runner, area, &records, &ends)
    })?;
    for &(i, j) in &pairs {
        ctx.opened_at(fds[i].description, ns_pid, fds[i].fd);
        ctx.opened_at(fds[j].description, ns_pid, fds[j].fd);
    }
    tracing::debug!(pid = ns_pid, pairs = pairs.len(), ms = started.elapsed().as_secs_f64() * 1e3, "Unix socket pairs restored in a batch");
    Ok(())
}

/// Runs socketpair for each pair; returns the new descriptors, two per pair, in order.
fn make_pairs(task: &mut RemoteTask, runner: &batch::Runner, area: u64, fds: &[FdRecord], pairs: &[(usize, usize)]) -> Result<Vec<u64>> {
    let out = |k: usize| area + 8 * k as u64;
    let calls: Vec<batch::Call> = pairs
        .iter()
        .enumerate()
        .map(|(k, &(i, _))| {
            let u = socket_of(&fds[i].kind).expect("pairs_within pairs Unix sockets");
            batch::Call::new(libc::SYS_socketpair, &[libc::AF_UNIX as u64, (u.sock_type | libc::SOCK_CLOEXEC) as u64, 0, out(k)])
        })
        .collect();
    let results = runner.run(task, out(pairs.len()), &calls)?;
    if let Some((k, r)) = results.iter().enumerate().find(|(_, &r)| r < 0) {
        return Err(Error::Other(format!("socketpair for fd {}: {}", fds[pairs[k].0].fd, std::io::Error::from_raw_os_error(-*r as i32))));
    }
    let made = task.get(area, 8 * pairs.len())?;
    Ok(made.chunks_exact(4).map(|b| i32::from_ne_bytes(b.try_into().unwrap()) as u64).collect())
}

/// Moves each new end (`ends[k]` is the end for `records[k]`; `records[2i]` and `records[2i + 1]`
/// are a pair's ends) above every open descriptor, gives it its options, shutdown and flags,
/// then puts it at its number: one run, whose moves make sure that no end lands on a number
/// another end still occupies.
fn settle_ends(task: &mut RemoteTask, runner: &batch::Runner, area: u64, records: &[&FdRecord], ends: &[u64]) -> Result<()> {
    let above = procfs::fds(task.pid)?.into_iter().max().unwrap_or(2) as u64 + 1;
    descriptor::raise_fd_limit(task.pid, above + ends.len() as u64)?;
    let mut values = Vec::new();
    let mut calls = Vec::with_capacity(records.len() * CALLS_PER_END);
    let mut what = Vec::with_capacity(records.len() * CALLS_PER_END);
    let mut call = |calls: &mut Vec<batch::Call>, name: &'static str, k: usize, nr: libc::c_long, args: &[u64]| {
        calls.push(batch::Call::new(nr, args));
        what.push((name, k));
    };
    for (k, &low) in ends.iter().enumerate() {
        call(&mut calls, "dup3", k, libc::SYS_dup3, &[low, above + k as u64, libc::O_CLOEXEC as u64]);
        call(&mut calls, "close", k, libc::SYS_close, &[low]);
    }
    for (k, rec) in records.iter().enumerate() {
        let u = socket_of(&rec.kind).expect("pairs_within pairs Unix sockets");
        let s = above + k as u64;
        for (name, label, v) in options_of(u) {
            let at = area + values.len() as u64;
            values.extend_from_slice(&v);
            call(&mut calls, label, k, libc::SYS_setsockopt, &[s, libc::SOL_SOCKET as u64, name as u64, at, v.len() as u64]);
        }
        let peer = records[k ^ 1];
        if let Some(how) = shut_again(u, socket_of(&peer.kind)) {
            call(&mut calls, "shutdown", k, libc::SYS_shutdown, &[s, how as u64]);
        }
        call(&mut calls, "fcntl(F_SETFL)", k, libc::SYS_fcntl, &[s, libc::F_SETFL as u64, status_flags(rec)]);
    }
    for (k, rec) in records.iter().enumerate() {
        call(&mut calls, "dup3", k, libc::SYS_dup3, &[above + k as u64, rec.fd as u64, rec.cloexec()]);
        call(&mut calls, "close", k, libc::SYS_close, &[above + k as u64]);
    }
    task.mem.write_all(area, &values)?;
    let table = area + (values.len() as u64).next_multiple_of(8);
    let results = runner.run(task, table, &calls)?;
    if let Some((n, r)) = results.iter().enumerate().find(|(_, &r)| r < 0) {
        let (name, k) = what[n];
        return Err(Error::Other(format!("fd {} (a Unix socket): {name}: {}", records[k].fd, std::io::Error::from_raw_os_error(-*r as i32))));
    }
    Ok(())
}

/// How to shut an end of a pair again, once both exist and their queues are filled. A stream or
/// seqpacket end's shutdown(SHUT_WR) also shuts its peer's receiving side (and SHUT_RD the
/// peer's sending side: recorded as that peer's SHUT_WR), so each end does its sending side
/// alone, where the peer's receiving side says it was shut so (`peer`: its record, when known);
/// a side shut before the connection ([`shut_before_connect`]) is shut as the pair is made. A
/// datagram end's shutdown touches no peer: each end does exactly what it recorded.
fn shut_again(u: &UnixRecord, peer: Option<&UnixRecord>) -> Option<i32> {
    if u.sock_type == libc::SOCK_DGRAM {
        return crate::sys::socket::how_to_shut(u.shutdown);
    }
    (u.shutdown & 2 != 0 && peer.is_none_or(|p| p.shutdown & 1 != 0)).then_some(libc::SHUT_WR)
}

/// The sides of stream or seqpacket end `u` shut without its peer's matching side (sock_diag's
/// bits: 1 receiving, 2 sending): shut before the end was connected, which leaves the peer as it
/// was (zdtm's sockets03: a client shut for receiving, then connected; its server's writes fail
/// with EPIPE, its own sending side open). 0 when the two ends' states mirror each other. Pure.
fn shut_before_connect(u: &UnixRecord, peer: &UnixRecord) -> u8 {
    if u.sock_type == libc::SOCK_DGRAM {
        return 0;
    }
    let mirrored = ((peer.shutdown & 1) << 1) | ((peer.shutdown & 2) >> 1);
    u.shutdown & 3 & !mirrored
}

/// A connected pair made the way such a pair was: the end that was shut before it connected
/// (`early`, with shutdown's `how`) made, shut and connected to a listener of a name of the
/// restorer's own (abstract, in the task's network namespace), the other end accepted, the
/// listener closed. Returns (the early end, the accepted one).
fn connect_shut_pair(task: &mut RemoteTask, ns_pid: Tid, sock_type: i32, how: i32, work_base: u64) -> Result<(u64, u64)> {
    let flags = (sock_type | libc::SOCK_CLOEXEC) as u64;
    let listener = task.syscall("socket", libc::SYS_socket, &[libc::AF_UNIX as u64, flags, 0])?;
    let name = format!("\0ckpt-restore-pair-{ns_pid}-{}-{}", std::process::id(), listener);
    let addr = sockaddr(name.as_bytes())?;
    let at = task.put(0, &addr)?;
    let made = (|| -> Result<(u64, u64)> {
        task.syscall("bind", libc::SYS_bind, &[listener, at, addr.len() as u64])?;
        task.syscall("listen", libc::SYS_listen, &[listener, 1])?;
        let early = task.syscall("socket", libc::SYS_socket, &[libc::AF_UNIX as u64, flags, 0])?;
        let early = descriptor::move_above(task, early, work_base)?;
        task.syscall("shutdown", libc::SYS_shutdown, &[early, how as u64])?;
        task.syscall("connect", libc::SYS_connect, &[early, at, addr.len() as u64])?;
        let accepted = task.syscall("accept4", libc::SYS_accept4, &[listener, 0, 0, libc::SOCK_CLOEXEC as u64])?;
        Ok((early, descriptor::move_above(task, accepted, work_base)?))
    })();
    task.syscall("close", libc::SYS_close, &[listener])?;
    made
}

/// Creates both ends of a connected pair in this task; the end for `u` is returned, the other
/// parked for its owner. Both queues are filled again (each through the opposite end).
fn create_pair(task: &mut RemoteTask, ns_pid: Tid, u: &UnixRecord, peer: u32, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let peer_rec = ctx.unix.sockets.get(&peer).cloned();
    let early = peer_rec.as_ref().map_or((0, 0), |p| (shut_before_connect(u, p), shut_before_connect(p, u)));
    let how = |bits: u8| crate::sys::socket::how_to_shut(bits).expect("some side is shut");
    let (ours, theirs) = match early {
        (0, 0) => {
            let out = task.scratch_at(0);
            task.syscall("socketpair", libc::SYS_socketpair, &[libc::AF_UNIX as u64, (u.sock_type | libc::SOCK_CLOEXEC) as u64, 0, out])?;
            let fds = task.get(out, 8)?;
            let ours = descriptor::move_above(task, i32::from_ne_bytes(fds[0..4].try_into().unwrap()) as u64, work_base)?;
            (ours, descriptor::move_above(task, i32::from_ne_bytes(fds[4..8].try_into().unwrap()) as u64, work_base)?)
        }
        (bits, 0) => connect_shut_pair(task, ns_pid, u.sock_type, how(bits), work_base)?,
        (0, bits) => {
            let (theirs, ours) = connect_shut_pair(task, ns_pid, u.sock_type, how(bits), work_base)?;
            (ours, theirs)
        }
        (a, b) => {
            return Err(Error::Unsupported {
                pid: ns_pid,
                what: format!("a Unix socket pair (inodes {} and {peer}) both of whose ends were shut before they were connected ({a} and {b}): only one end can be made so again", u.ino),
            })
        }
    };
    // Datagram sockets bound and then connected to each other: each end takes its name again
    // (a socketpair's ends have none, and binding one keeps its connection), before the queues
    // are sent, so that each datagram comes from its sender's name as it did.
    if let Some(p) = peer_rec.as_ref().filter(|p| named_datagram_pair(u, p)) {
        bind_as_recorded(task, ns_pid, ours, u, &mut ctx.unix)?;
        bind_as_recorded(task, ns_pid, theirs, p, &mut ctx.unix)?;
    }
    // Each end's queue is sent again from the other end.
    fill_queue(task, ns_pid, theirs, u, &mut ctx.unix)?;
    if let Some(p) = &peer_rec {
        fill_queue(task, ns_pid, ours, p, &mut ctx.unix)?;
    }
    for (end, rec, other) in [(ours, Some(u), peer_rec.as_ref()), (theirs, peer_rec.as_ref(), Some(u))] {
        if let Some(how) = rec.and_then(|r| shut_again(r, other)) {
            task.syscall("shutdown", libc::SYS_shutdown, &[end, how as u64])?;
        }
    }
    ctx.park(ns_pid, theirs);
    ctx.unix.waiting.insert(peer, (ns_pid, theirs));
    Ok(ours)
}

/// Creates the socket of `u`, whose peer every process had closed: a pair whose other end
/// sends `u`'s queue and is closed, leaving the kernel's own state of a survivor (for a stream or
/// seqpacket socket, shut both ways; for a datagram socket, connected to a dead peer). Data left
/// unread in the other end when it closes marks the survivor reset, as it was.
fn create_survivor(task: &mut RemoteTask, ns_pid: Tid, u: &UnixRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let out = task.scratch_at(0);
    task.syscall("socketpair", libc::SYS_socketpair, &[libc::AF_UNIX as u64, (u.sock_type | libc::SOCK_CLOEXEC) as u64, 0, out])?;
    let fds = task.get(out, 8)?;
    let ours = descriptor::move_above(task, i32::from_ne_bytes(fds[0..4].try_into().unwrap()) as u64, work_base)?;
    let theirs = descriptor::move_above(task, i32::from_ne_bytes(fds[4..8].try_into().unwrap()) as u64, work_base)?;
    // (When the messages carry descriptors, the restorer's duplicate of the other end keeps
    // the peer open until they are sent.)
    fill_queue(task, ns_pid, theirs, u, &mut ctx.unix)?;
    if u.shutdown & RESET_PENDING != 0 {
        send_queue(task, ours, &[vec![0]])?;
    }
    if u.sock_type == libc::SOCK_DGRAM {
        // The peer's close shuts nothing of a datagram socket: what is shut, it shut itself.
        if let Some(how) = shut_again(u, None) {
            task.syscall("shutdown", libc::SYS_shutdown, &[ours, how as u64])?;
        }
    }
    task.syscall("close", libc::SYS_close, &[theirs])?;
    Ok(ours)
}

/// Creates the socket of `u`, a datagram socket connected to itself (bound, then connected to
/// its own name: a queue a program posts to and reads from), and puts back its queue, sent from
/// itself as every datagram a socket connected to itself holds was. The connect follows the
/// bind at once, in the same process, so the name reaches the socket just bound.
fn create_connected_to_itself(task: &mut RemoteTask, ns_pid: Tid, u: &UnixRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let name = u.name.as_deref().ok_or_else(|| Error::Forged { what: format!("socket:[{}] connected to itself without a name", u.ino) })?;
    let s = task.syscall("socket", libc::SYS_socket, &[libc::AF_UNIX as u64, (u.sock_type | libc::SOCK_CLOEXEC) as u64, 0])?;
    let s = descriptor::move_above(task, s, work_base)?;
    bind_as_recorded(task, ns_pid, s, u, &mut ctx.unix)?;
    // Its socket file where the bind left it, or where it was moved aside.
    let name = ctx.unix.aliases.get(&u.ino).cloned().unwrap_or_else(|| name.to_vec());
    connect_pending(task, s, &name).map_err(|e| e.of_object(ns_pid, format!("socket:[{}]: connect it to its own name again", u.ino)))?;
    fill_queue(task, ns_pid, s, u, &mut ctx.unix)?;
    // What it shut, once its queue is back (a queue carrying descriptors is sent later, and a
    // socket shut for sending could not: it stays open then).
    if let Some(how) = shut_again(u, None).filter(|_| !ctx.unix.carried.contains_key(&u.ino)) {
        task.syscall("shutdown", libc::SYS_shutdown, &[s, how as u64])?;
    }
    Ok(s)
}

/// Fills the queue of `u` with its messages, sent from the task's socket `from` (connected to
/// it): now, or, when they carry descriptors, once every process has its descriptors
/// ([`send_carried`]), the restorer keeping a duplicate of `from` until then.
fn fill_queue(task: &RemoteTask, ns_pid: Tid, from: u64, u: &UnixRecord, state: &mut UnixRestoreState) -> Result<()> {
    if !state.carried.contains_key(&u.ino) {
        return send_queue(task, from, &u.queue);
    }
    let sender = take_into_self(task.pid, from as i32)?;
    state.pending.push(PendingQueue { ino: u.ino, sending: Sending::Through(sender), owner: ns_pid });
    Ok(())
}

/// Sends the queued messages that carry descriptors or came from senders not connected, now that
/// every process of the node has its descriptors (`tables`: each process's records, by pid in
/// the job; `tasks`: the processes): each carried descriptor is taken from a process holding its
/// open file description, or, for one no process holds, first opened in the process that made
/// the sending socket (and parked there). Every message is sent once, in order, with its
/// descriptors in their order, from its sender's name when it had one ([`send_to_name`]).
pub fn send_carried(ctx: &mut RestoreCtx, tables: &[(Tid, &[FdRecord])], tasks: &mut std::collections::BTreeMap<Tid, RemoteTask>) -> Result<()> {
    for pending in std::mem::take(&mut ctx.unix.pending) {
        let u = ctx.unix.sockets.get(&pending.ino).cloned().ok_or_else(|| Error::Bug(format!("socket:[{}]: no record", pending.ino)))?;
        let carried = ctx.unix.carried.get(&pending.ino).cloned().unwrap_or_default();
        let sender = match pending.sending {
            Sending::Through(s) => s,
            Sending::ToName { fd } => {
                send_to_name(ctx, &u, pending.owner, fd, &carried, tables, tasks)?;
                continue;
            }
        };
        for (k, msg) in u.queue.iter().enumerate() {
            let mut passed = Vec::new();
            for c in carried.get(k).map_or(&[][..], Vec::as_slice) {
                passed.push(carried_fd(c, pending.owner, ctx, tables, tasks).map_err(|e| Error::Other(format!("socket:[{}]: message {k}: {e}", u.ino)))?);
            }
            send_with_rights(&sender, msg, &passed)
                .map_err(|e| Error::Other(format!("socket:[{}]: put message {k} ({} bytes, {} descriptors) back: {e}", u.ino, msg.len(), passed.len())))?;
        }
    }
    Ok(())
}

/// A duplicate, in the restorer, of the descriptor in flight `c`.
fn carried_fd(
    c: &Carried,
    owner: Tid,
    ctx: &mut RestoreCtx,
    tables: &[(Tid, &[FdRecord])],
    tasks: &mut std::collections::BTreeMap<Tid, RemoteTask>,
) -> Result<OwnedFd> {
    let (holder, fd) = carried_holder(c, owner, ctx, tables, tasks)?;
    let host = tasks.get(&holder).ok_or_else(|| Error::not_created(holder))?.pid;
    take_into_self(host, fd)
}

/// A process of the job holding the descriptor in flight `c`, and its descriptor there: (pid in
/// the job, fd). One that no process holds is opened in `owner` and parked there first.
fn carried_holder(
    c: &Carried,
    owner: Tid,
    ctx: &mut RestoreCtx,
    tables: &[(Tid, &[FdRecord])],
    tasks: &mut std::collections::BTreeMap<Tid, RemoteTask>,
) -> Result<(Tid, i32)> {
    let held = |description: u32| tables.iter().find_map(|(pid, fds)| fds.iter().find(|r| r.description == description).map(|r| (*pid, r.fd)));
    let (holder, fd) = match c {
        Carried::Shared { description } => held(*description).ok_or_else(|| Error::Damaged { what: format!("no process holds description {description}") })?,
        Carried::Alone(rec) => match ctx.holder(rec.description) {
            Some(h) => h,
            None => {
                let task = tasks.get_mut(&owner).ok_or_else(|| Error::not_created(owner))?;
                let fd = descriptor::open_carried(task, owner, rec, ctx)?;
                ctx.park(owner, fd);
                ctx.opened_at(rec.description, owner, fd as i32);
                (owner, fd as i32)
            }
        },
    };
    Ok((holder, fd))
}

/// A datagram socket of the job bound to `name`, not listening: (pid in the job, fd), from the
/// restored tables. Pure.
fn named_holder(tables: &[(Tid, &[FdRecord])], name: &[u8]) -> Option<(Tid, i32)> {
    tables.iter().find_map(|(pid, fds)| {
        fds.iter()
            .find(|r| socket_of(&r.kind).is_some_and(|u| u.sock_type == libc::SOCK_DGRAM && !u.listening && u.name.as_deref() == Some(name)))
            .map(|r| (*pid, r.fd))
    })
}

/// Where [`send_to_name`] lays out a sendmsg in the task's area: the header, its iovec, the
/// destination's address, the control message (SCM_MAX_FD descriptors at most), the bytes.
const AREA_IOV: u64 = 64;
const AREA_NAME: u64 = 128;
const AREA_CONTROL: u64 = 256;
const AREA_DATA: u64 = 4096;

/// Puts back, in queue order, the datagrams of the socket `u` (not connected; `owner` holds it
/// at `fd`) whose senders had names, each sent again to `u`'s name from the task `owner`, so
/// that the name resolves as the job's own would (its namespaces, working directory and file
/// rights): from the job's socket bound to the sender's name when a process holds one (the
/// task takes a duplicate of it); from a socket of its own bound to that name when none does
/// any more (the sender closed it): an abstract name is bound, used and closed; a path only if
/// nothing is there, and its socket file is removed afterwards; otherwise the restart is refused.
/// An unbound sender's datagrams come from an unbound socket of the task's. Messages carrying
/// descriptors carry them again, taken into the task from their holders.
fn send_to_name(
    ctx: &mut RestoreCtx,
    u: &UnixRecord,
    owner: Tid,
    fd: i32,
    carried: &[Vec<Carried>],
    tables: &[(Tid, &[FdRecord])],
    tasks: &mut std::collections::BTreeMap<Tid, RemoteTask>,
) -> Result<()> {
    let senders = ctx.unix.senders.get(&u.ino).cloned().unwrap_or_default();
    let name = u.name.as_deref().ok_or_else(|| Error::Other(format!("pid {owner}: fd {fd}: datagrams queued on a Unix socket without a name")))?;
    // Sent where the receiver's socket file is meanwhile, if the restart moved it aside.
    let aliased = ctx.unix.aliases.get(&u.ino).cloned();
    let name = aliased.as_deref().unwrap_or(name);
    let shown = |n: &[u8]| String::from_utf8_lossy(n).replace('\0', "@");
    let dest = sockaddr(name)?;
    let longest = u.queue.iter().map(Vec::len).max().unwrap_or(0) as u64;
    let area_len = (AREA_DATA + longest).next_multiple_of(4096);
    let task = tasks.get_mut(&owner).ok_or_else(|| Error::not_created(owner))?;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let area = task.syscall("mmap", libc::SYS_mmap, &[0, area_len, prot, (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64, u64::MAX, 0])?;
    task.mem.write_all(area + AREA_NAME, &dest)?;
    // Every socket made or taken in the task here, closed at the end; the paths bound.
    let mut opened: Vec<u64> = Vec::new();
    let mut bound_paths: Vec<Vec<u8>> = Vec::new();
    let mut sockets: HashMap<Option<Vec<u8>>, u64> = HashMap::new();
    let sent = (|| -> Result<()> {
        for (k, msg) in u.queue.iter().enumerate() {
            let mut holders = Vec::new();
            for c in carried.get(k).map_or(&[][..], Vec::as_slice) {
                holders.push(carried_holder(c, owner, ctx, tables, tasks).map_err(|e| e.of_object(owner, format!("fd {fd}: message {k}")))?);
            }
            let task = tasks.get_mut(&owner).ok_or_else(|| Error::not_created(owner))?;
            let sender = senders.get(k).cloned().flatten();
            let from = match sockets.get(&sender) {
                Some(&s) => s,
                None => {
                    let s = match sender.as_deref().and_then(|n| named_holder(tables, n)) {
                        Some((pid, held)) => descriptor::take_from(task, pid, held as u64)?,
                        None => task.syscall("socket", libc::SYS_socket, &[libc::AF_UNIX as u64, (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64, 0])?,
                    };
                    opened.push(s);
                    if let Some(n) = sender.as_deref().filter(|n| named_holder(tables, n).is_none()) {
                        bind_if_free(task, s, n).map_err(|e| {
                            Error::Other(format!(
                                "pid {owner}: fd {fd} (a Unix socket bound to {}): datagram {k} of its queue came from {}, which no process of the job holds now, and cannot be sent from there again: {e}",
                                shown(name),
                                shown(n)
                            ))
                        })?;
                        if n.first() != Some(&0) {
                            bound_paths.push(n.to_vec());
                        }
                    }
                    sockets.insert(sender.clone(), s);
                    s
                }
            };
            let mut passed = Vec::with_capacity(holders.len());
            let taken = (|| -> Result<()> {
                for (pid, held) in holders {
                    passed.push(descriptor::take_from(task, pid, held as u64)?);
                }
                send_in_task(task, area, from, dest.len(), msg, &passed)
            })();
            for f in passed {
                task.syscall("close", libc::SYS_close, &[f])?;
            }
            let from_what = sender.as_deref().map_or("an unbound sender".to_string(), |n| format!("{:?}", shown(n)));
            taken.map_err(|e| e.of_object(owner, format!("fd {fd}: put datagram {k} ({} bytes, from {from_what}) back", msg.len())))?;
        }
        Ok(())
    })();
    let task = tasks.get_mut(&owner).ok_or_else(|| Error::not_created(owner))?;
    for s in opened {
        task.syscall("close", libc::SYS_close, &[s])?;
    }
    for path in bound_paths {
        let at = task.put(0, &[path.as_slice(), &[0]].concat())?;
        task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, at, 0])?;
    }
    task.syscall("munmap", libc::SYS_munmap, &[area, area_len])?;
    sent
}

/// Binds the task's socket `s` to `name`: an abstract name as it is, a path only if nothing is
/// there (a file in the way is the job's, and stays).
fn bind_if_free(task: &mut RemoteTask, s: u64, name: &[u8]) -> Result<()> {
    if name.first() != Some(&0) {
        // struct statx (256 bytes) first, the path after it.
        let path = task.put(256, &[name, &[0]].concat())?;
        let flags = (libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_DONT_SYNC) as u64;
        if task.syscall("statx", libc::SYS_statx, &[libc::AT_FDCWD as u64, path, flags, 0, task.scratch_at(0)]).is_ok() {
            return Err(Error::Other("a file is at that path".into()));
        }
    }
    let addr = sockaddr(name)?;
    let at = task.put(0, &addr)?;
    task.syscall("bind", libc::SYS_bind, &[s, at, addr.len() as u64])?;
    Ok(())
}

/// sendmsg, in the task, of `msg` from its socket `from` to the address at [`AREA_NAME`] of
/// `area` (`name_len` bytes), with the task's descriptors `fds` (SCM_RIGHTS, when there are any).
fn send_in_task(task: &mut RemoteTask, area: u64, from: u64, name_len: usize, msg: &[u8], fds: &[u64]) -> Result<()> {
    let (cmsg_len, space) = sys::control_sizes((fds.len() * 4) as u32);
    if !fds.is_empty() {
        let mut control = Vec::with_capacity(space);
        control.extend_from_slice(&cmsg_len.to_ne_bytes());
        control.extend_from_slice(&libc::SOL_SOCKET.to_ne_bytes());
        control.extend_from_slice(&libc::SCM_RIGHTS.to_ne_bytes());
        for &f in fds {
            control.extend_from_slice(&(f as i32).to_ne_bytes());
        }
        control.resize(space, 0);
        task.mem.write_all(area + AREA_CONTROL, &control)?;
    }
    task.mem.write_all(area + AREA_DATA, msg)?;
    let mut iov = (area + AREA_DATA).to_ne_bytes().to_vec();
    iov.extend_from_slice(&(msg.len() as u64).to_ne_bytes());
    task.mem.write_all(area + AREA_IOV, &iov)?;
    // struct msghdr: name, namelen (and padding), iov, iovlen, control, controllen, flags.
    let mut hdr = Vec::with_capacity(56);
    hdr.extend_from_slice(&(area + AREA_NAME).to_ne_bytes());
    hdr.extend_from_slice(&(name_len as u64).to_ne_bytes());
    hdr.extend_from_slice(&(area + AREA_IOV).to_ne_bytes());
    hdr.extend_from_slice(&1u64.to_ne_bytes());
    hdr.extend_from_slice(&(if fds.is_empty() { 0 } else { area + AREA_CONTROL }).to_ne_bytes());
    hdr.extend_from_slice(&(if fds.is_empty() { 0 } else { space as u64 }).to_ne_bytes());
    hdr.extend_from_slice(&0u64.to_ne_bytes());
    task.mem.write_all(area, &hdr)?;
    let n = task.syscall("sendmsg", libc::SYS_sendmsg, &[from, area, (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u64])?;
    if n != msg.len() as u64 {
        return Err(Error::Other(format!("{n} bytes sent of {}", msg.len())));
    }
    Ok(())
}

/// sendmsg of `msg` with the descriptors `fds` (SCM_RIGHTS, when there are any).
fn send_with_rights(sock: &OwnedFd, msg: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    let n = sys::send_with_rights(sock, msg, fds, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)?;
    if n != msg.len() {
        return Err(std::io::Error::other(format!("{n} bytes sent of {}", msg.len())));
    }
    Ok(())
}

/// Sends `msgs` from the task's socket `from`, one message each, so that they land in its
/// peer's receive queue.
fn send_queue(task: &RemoteTask, from: u64, msgs: &[Vec<u8>]) -> Result<()> {
    if msgs.is_empty() {
        return Ok(());
    }
    let sock = take_into_self(task.pid, from as i32)?;
    for m in msgs {
        send_with_rights(&sock, m, &[]).map_err(|e| Error::Other(format!("put {} bytes back into a Unix socket: {e}", m.len())))?;
    }
    Ok(())
}

/// Connects again the connections that were waiting in a listener's backlog.
pub fn connect_pending(task: &mut RemoteTask, fd: u64, listener: &[u8]) -> Result<()> {
    let addr = sockaddr(listener)?;
    let at = task.put(0, &addr)?;
    task.syscall("connect", libc::SYS_connect, &[fd, at, addr.len() as u64])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(sock_type: i32, peer: Option<u32>, shutdown: u8) -> UnixDiag {
        UnixDiag { ino: 10, sock_type: sock_type as u8, state: 1, peer, shutdown, ..UnixDiag::default() }
    }

    #[test]
    fn a_peer_without_a_file_is_gone_or_outside() {
        let job: HashSet<u64> = [10, 11].into();
        let (stream, seqpacket, dgram) = (libc::SOCK_STREAM, libc::SOCK_SEQPACKET, libc::SOCK_DGRAM);
        assert_eq!(peer_of(&diag(stream, None, 0), &job), Peer::None);
        assert_eq!(peer_of(&diag(stream, Some(11), 0), &job), Peer::Job(11));
        assert_eq!(peer_of(&diag(stream, Some(11), 3), &job), Peer::Job(11), "both ends shut, both open");
        assert_eq!(peer_of(&diag(stream, Some(12), 0), &job), Peer::Outside);
        assert_eq!(peer_of(&diag(stream, Some(0), 3), &job), Peer::Gone, "a socketpair's survivor");
        assert_eq!(peer_of(&diag(seqpacket, Some(0), 3), &job), Peer::Gone);
        assert_eq!(peer_of(&diag(dgram, Some(0), 0), &job), Peer::Gone, "a datagram peer's close shuts nothing");
        // A connection that a listener in another network namespace has not accepted yet.
        assert_eq!(peer_of(&diag(stream, Some(0), 0), &job), Peer::Outside);
        assert_eq!(peer_of(&diag(stream, Some(0), 2), &job), Peer::Outside);
    }

    fn socket(fd: i32, ino: u32, peer: Option<u32>) -> FdRecord {
        let u = UnixRecord { ino, sock_type: libc::SOCK_STREAM, peer, ..UnixRecord::default() };
        FdRecord { fd, flags: libc::O_RDWR as u32, pos: 0, description: ino, kind: FdKind::Unix(u), locks: Vec::new(), owner: None }
    }

    #[test]
    fn a_side_shut_before_connecting_is_told_from_one_shut_after() {
        let end = |sock_type: i32, shutdown: u8| UnixRecord { sock_type, shutdown, ..Default::default() };
        let stream = |sd: u8| end(libc::SOCK_STREAM, sd);
        // Shut after connecting: each side mirrored in the peer; the sending side's end shuts again.
        assert_eq!(shut_before_connect(&stream(1), &stream(2)), 0);
        assert_eq!(shut_before_connect(&stream(2), &stream(1)), 0);
        assert_eq!(shut_again(&stream(2), Some(&stream(1))), Some(libc::SHUT_WR));
        assert_eq!(shut_again(&stream(1), Some(&stream(2))), None);
        // sockets03: the client shut for receiving, then connected; its server unshut.
        assert_eq!(shut_before_connect(&stream(1), &stream(0)), 1);
        assert_eq!(shut_before_connect(&stream(0), &stream(1)), 0);
        assert_eq!(shut_again(&stream(1), Some(&stream(0))), None);
        // Shut for sending before connecting: not shut again after, which would shut the peer.
        assert_eq!(shut_before_connect(&stream(2), &stream(0)), 2);
        assert_eq!(shut_again(&stream(2), Some(&stream(0))), None);
        // The peer's record unknown (its end gone): as recorded.
        assert_eq!(shut_again(&stream(2), None), Some(libc::SHUT_WR));
        // Datagram ends shut nothing of their peer.
        assert_eq!(shut_before_connect(&end(libc::SOCK_DGRAM, 1), &end(libc::SOCK_DGRAM, 0)), 0);
    }

    #[test]
    fn pairs_within_one_process_are_found_once_each() {
        let fds = vec![
            socket(3, 10, Some(11)),
            socket(4, 11, Some(10)),
            socket(5, 10, Some(11)), // a duplicate of fd 3
            socket(6, 20, Some(21)), // its peer is in another process
            socket(7, 30, Some(PEER_GONE)),
            socket(8, 40, None),
            socket(9, 50, Some(51)), // a datagram socket connected to one that is not connected back
            socket(10, 51, Some(52)),
            socket(11, 60, Some(61)), // its peer was opened by an earlier process
            socket(12, 61, Some(60)),
            socket(13, 71, Some(70)),
            socket(14, 70, Some(71)),
        ];
        let pairs = pairs_within(&fds, |_, u| u.ino == 61);
        assert_eq!(pairs, vec![(0, 1), (10, 11)], "each pair once, by the first descriptor of each end");
        assert_eq!(pairs_within(&fds[..1], |_, _| false), vec![], "the other end elsewhere");
    }

    #[test]
    fn sockets_carrying_descriptors_are_the_last_kind_and_list_what_is_alone() {
        let file = FdRecord {
            fd: -1,
            flags: 0,
            pos: 5,
            description: 9,
            kind: FdKind::File(crate::objects::file::FileRecord { path: "/f".into(), dev: 1, ino: 2, size: 3 }),
            locks: Vec::new(),
            owner: None,
        };
        let FdKind::Unix(u) = socket(3, 10, Some(11)).kind else { unreachable!() };
        let kind = FdKind::UnixQueue(UnixQueueRecord {
            socket: u.clone(),
            carried: vec![vec![Carried::Shared { description: 4 }, Carried::Alone(Box::new(file.clone()))], vec![]],
            senders: Vec::new(),
        });
        assert_eq!(socket_of(&kind), Some(&u));
        assert_eq!(alone_in_flight(&kind).collect::<Vec<_>>(), vec![&file]);
        assert_eq!(alone_in_flight(&FdKind::Unix(u)).count(), 0);
        // Postcard tags a variant by its index: the new kind comes after every older one, so
        // images written before it decode unchanged.
        let bytes = postcard::to_allocvec(&kind).unwrap();
        assert_eq!(bytes[0], 17, "FdKind::UnixQueue is not the 18th variant");
        assert_eq!(postcard::from_bytes::<FdKind>(&bytes).unwrap(), kind);
    }

    #[test]
    fn a_datagram_socket_connected_to_a_bound_one_not_connected_back_is_one_way() {
        let rec = |ino, sock_type, name: Option<&[u8]>, peer| {
            let FdKind::Unix(mut u) = socket(3, ino, peer).kind else { unreachable!() };
            u.sock_type = sock_type;
            u.name = name.map(<[u8]>::to_vec);
            u
        };
        let dgram = libc::SOCK_DGRAM;
        let server = rec(10, dgram, Some(b"\0srv"), None);
        assert!(connected_one_way(&rec(11, dgram, None, Some(10)), &server), "a client's connect to a server's name");
        assert!(!connected_one_way(&rec(11, dgram, None, Some(10)), &rec(10, dgram, Some(b"\0srv"), Some(11))), "connected both ways");
        assert!(!connected_one_way(&rec(11, dgram, None, Some(10)), &rec(10, dgram, None, None)), "a peer without a name");
        assert!(!connected_one_way(&rec(11, libc::SOCK_STREAM, None, Some(10)), &server), "not a datagram socket");
        assert!(!connected_one_way(&rec(11, dgram, None, None), &server), "not connected");
    }

    #[test]
    fn senders_named_as_sock_diag_names_them() {
        let mut from = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        from.extend_from_slice(b"/tmp/s\0");
        assert_eq!(sender_name(&from[..0]), None, "an unbound sender");
        assert_eq!(sender_name(&from[..2]), None, "an unbound sender");
        assert_eq!(sender_name(&from[..2 + 7]).as_deref(), Some(&b"/tmp/s"[..]), "a path without its NUL");
        from[2] = 0;
        assert_eq!(sender_name(&from[..2 + 6]).as_deref(), Some(&b"\0tmp/s"[..]), "an abstract name whole");
    }

    #[test]
    fn names_as_long_as_the_kernel_takes_them() {
        let mut full_abstract = vec![0u8];
        full_abstract.extend(std::iter::repeat_n(b'x', SUN_PATH_LEN - 1));
        assert_eq!(sockaddr(&full_abstract).unwrap().len(), 2 + SUN_PATH_LEN, "no NUL added after an abstract name");
        full_abstract.push(b'y');
        assert!(sockaddr(&full_abstract).is_err());
        let longest_path = vec![b'p'; SUN_PATH_LEN - 1];
        assert_eq!(sockaddr(&longest_path).unwrap().len(), 2 + SUN_PATH_LEN, "a path ends with its NUL");
        assert!(sockaddr(&[b'p'; SUN_PATH_LEN]).is_err());
    }
}
