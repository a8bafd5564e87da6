//! TCP sockets, IPv4 and IPv6: listening sockets, connections (established and half-closed) with
//! the data in flight in both directions, and unconnected sockets.
//!
//! **Capture.** The first TCP socket met in a checkpoint captures every TCP socket of the job at
//! once, through duplicates taken with pidfd_getfd: inet_diag tells each socket's state, its peer
//! (a socket of the job, a connection not accepted yet by a listener of the job, or something
//! outside the job) and a listener's backlog. Connections are put in TCP repair mode (root only),
//! which lets their queues be read without taking anything out: first the send queue of every
//! connection (bytes not acknowledged, then not sent), then the receive queue of every one
//! (bytes received, not read), with their sequence numbers, then MSS, window scaling, SACK,
//! timestamps and windows. Send queues first, receive queues after: while the job is frozen the
//! kernel can still move bytes from one end of a connection of the job to the other, and in this
//! order every byte is in one of the two queues (possibly both: the sender's copy is then cut to
//! start where the receiver's queue ends). Repair mode is then turned off without a window probe
//! and SO_REUSEADDR (which repair mode overrides) and SO_PEEK_OFF put back: the job's sockets are
//! left as they were.
//!
//! **Restore.** `socket(2)` is injected into the process; the restorer does the rest on its own
//! duplicate. A connection is rebuilt in repair mode: sequence numbers, bind to the same local
//! address, connect to the same peer (no packet is sent in repair mode), TCP options, the
//! receive queue put back, windows. Once every process has its descriptors ([`finish`]), repair
//! mode is turned off (a window probe resynchronises the peer), the send queue is sent again
//! (TCP drops what the peer already has), a FIN that had been sent is sent again by
//! shutdown(SHUT_WR), and the options are set. A connection still waiting in a listener's backlog
//! is connected again to the restored listener and its sent bytes written again. A connection to
//! a peer outside the job is rebuilt the same way with `--tcp-established`; otherwise it is
//! rebuilt and reset (the program sees ECONNRESET, as after a network failure, and the bytes it
//! had not read are lost).
//!
//! Repair mode needs CAP_NET_ADMIN over the job's network namespace. Where it is refused (an
//! ordinary user's job), or `CKPT_TCP_RECONNECT=1` says so, connections are drained at capture
//! and made again by connecting at restore instead: [`super::tcp_reconnect`].

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use super::fd::take_into_self;
use super::fd::{CaptureCtx, FdRecord, Listing};
use super::net_namespaces::JobNetworks;
use super::inet::{self, getopt_bytes, getopt_int, setopt_bytes, setopt_int, Addr, Bytes, InetRestoreState, SockOpts};
use super::tcp_reconnect;
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sockdiag::{self, InetDiag};
use crate::sys::socket as sys;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TcpRecord {
    pub ino: u64,
    /// AF_INET or AF_INET6.
    pub family: i32,
    pub state: TcpState,
    pub opts: SockOpts,
    pub tcp_opts: TcpOpts,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum TcpState {
    /// Not connected: never connected (bound to `local` if Some), or closed after a connection
    /// (`shut`: reads return end of file, writes fail).
    Closed {
        local: Option<Addr>,
        shut: bool,
        /// Bytes the connection received that the program has not read (format 13).
        #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
        unread: Bytes,
        /// The connection ended with a reset (or another error: the error is not read, that
        /// would take it from the program), which the program has yet to be told, after `unread`
        /// (format 13).
        #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
        reset: bool,
    },
    Listening {
        local: Addr,
        backlog: u32,
    },
    Connected(Box<Connection>),
}

/// Where the other end of a connection is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Peer {
    /// A socket of the job (its inode).
    Job(u64),
    /// Not accepted yet, in the backlog of a listening socket of the job: the connection is made
    /// again at restart.
    Backlog,
    /// A process outside the job, on this machine or another.
    Outside,
    /// A socket on this machine that its process closed after sending everything (its FIN is
    /// in this end's receive queue, after the bytes not read yet). At restart a stand-in socket
    /// of the restorer sends the FIN again, and is closed as the peer was.
    Closed,
}

/// An established or half-closed connection, with its data in flight.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Connection {
    pub local: Addr,
    pub remote: Addr,
    pub peer: Peer,
    /// The kernel's state at the checkpoint (1 established, 4/5 FIN sent, 8 FIN received, ...).
    pub kstate: u8,
    /// This end sent a FIN (shutdown(SHUT_WR) or close by another holder): sent again at restart.
    pub fin_sent: bool,
    /// The peer's FIN arrived (after the receive queue).
    pub fin_received: bool,
    /// The program shut down reading.
    pub shut_rd: bool,
    /// Sequence number of the first byte of `send_queue`.
    pub send_seq: u32,
    /// Bytes written by the program and not acknowledged by the peer (sent or not).
    pub send_queue: Bytes,
    /// How many bytes at the end of `send_queue` had not been sent at all.
    pub unsent: u32,
    /// Sequence number of the first byte of `recv_queue`.
    pub recv_seq: u32,
    /// Bytes received and not read by the program.
    pub recv_queue: Bytes,
    pub mss: u32,
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    /// The TCP timestamp clock (with its offset) at the checkpoint, when timestamps are on.
    pub timestamp: Option<u32>,
    pub window: Option<Window>,
    /// Captured in TCP repair mode: the sequence numbers, the send queue and the negotiated
    /// options above are the connection's own, and it can be rebuilt by repair mode. False: it was
    /// captured without repair mode ([`super::tcp_reconnect`]): the bytes in flight towards this
    /// end were drained into `recv_queue`, there are no sequence numbers, and it can only be
    /// rebuilt by connecting again.
    pub repaired: bool,
}

/// TCP_REPAIR_WINDOW.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Window {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// TCP-level options kept across a restart.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TcpOpts {
    pub nodelay: bool,
    pub cork: bool,
    pub keepidle: i32,
    pub keepintvl: i32,
    pub keepcnt: i32,
    pub user_timeout: i32,
}

impl TcpRecord {
    pub fn describe(&self) -> String {
        match &self.state {
            TcpState::Closed { local: Some(l), .. } => format!("TCP socket bound to {l}"),
            TcpState::Closed { local: None, shut, reset, .. } => format!("TCP socket, {}", if *reset { "reset" } else if *shut { "closed" } else { "unconnected" }),
            TcpState::Listening { local, .. } => format!("TCP listening on {local}"),
            TcpState::Connected(c) => {
                let peer = match c.peer {
                    Peer::Job(_) => "in the job",
                    Peer::Backlog => "waiting in the backlog of a listener of the job",
                    Peer::Outside => "outside the job",
                    Peer::Closed => "closed by its process",
                };
                format!("TCP {} -> {} (peer {peer})", c.local, c.remote)
            }
        }
    }

    /// The connection, if it is one to a peer outside the job.
    pub fn outside(&self) -> Option<&Connection> {
        match &self.state {
            TcpState::Connected(c) if c.peer == Peer::Outside => Some(c),
            _ => None,
        }
    }
}

// Kernel constants (linux/tcp.h, linux/sockios.h).
const TCP_REPAIR: i32 = 19;
const TCP_REPAIR_QUEUE: i32 = 20;
const TCP_QUEUE_SEQ: i32 = 21;
const TCP_REPAIR_OPTIONS: i32 = 22;
const TCP_TIMESTAMP: i32 = 24;
const TCP_REPAIR_WINDOW: i32 = 29;
const REPAIR_ON: i32 = 1;
const REPAIR_OFF: i32 = 0;
const REPAIR_OFF_NO_WP: i32 = -1;
const NO_QUEUE: i32 = 0;
const RECV_QUEUE: i32 = 1;
const SEND_QUEUE: i32 = 2;
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

const ESTABLISHED: u8 = 1;
const SYN_SENT: u8 = 2;
const SYN_RECV: u8 = 3;
const FIN_WAIT1: u8 = 4;
const FIN_WAIT2: u8 = 5;
const CLOSE_WAIT: u8 = 8;
const LAST_ACK: u8 = 9;
const LISTEN: u8 = 10;
const CLOSING: u8 = 11;

/// States of a connection with data that repair mode can read.
fn is_connected(state: u8) -> bool {
    matches!(state, ESTABLISHED | FIN_WAIT1 | FIN_WAIT2 | CLOSE_WAIT | LAST_ACK | CLOSING)
}

fn fin_sent(state: u8) -> bool {
    matches!(state, FIN_WAIT1 | FIN_WAIT2 | CLOSING | LAST_ACK)
}

fn fin_received(state: u8) -> bool {
    matches!(state, CLOSE_WAIT | LAST_ACK | CLOSING)
}

fn unsupported(pid: Tid, fd: i32, what: String) -> Error {
    Error::Unsupported { pid, what: format!("fd {fd} ({what})") }
}

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::EPERM) {
        return Error::Other(format!("{what}: {e} (TCP repair mode needs root: CAP_NET_ADMIN in the job's network namespace)"));
    }
    Error::Other(format!("{what}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Capture

/// Per-checkpoint state: every TCP socket of the job, captured together by the first one met.
#[derive(Default)]
pub struct TcpCaptureState {
    records: Option<HashMap<u64, TcpRecord>>,
    /// Whether repair mode is used ([`tcp_reconnect::repair_available`]), asked once.
    repair: Option<bool>,
    /// Send queues read earlier, while every node of the job was frozen (see
    /// [`snapshot_send_queues`]).
    pub early_sends: EarlySends,
    /// Without repair mode: what the ends of connections between nodes received, drained in
    /// rounds with the other nodes before the capture (see [`tcp_reconnect::CrossNode`]).
    pub cross_node: HashMap<u64, Vec<u8>>,
}

/// Send queues by socket inode: sequence number of the first byte, the bytes, how many of the
/// last were not sent.
#[derive(Default)]
pub struct EarlySends(HashMap<u64, (u32, Vec<u8>, u32)>);

/// Reads the send queue of every TCP connection of the frozen processes `pids`. A job spread
/// over nodes has every node do this before any node reads a receive queue: a byte sent from one
/// node to another is then, in the image, in the receiver's queue if it was acknowledged before
/// the sender's queue was read, and in the sender's otherwise (the receiver drops a copy it
/// already has at restart). Read in one go, node by node, a byte acknowledged between the two
/// reads would be in neither.
/// `networks`: the network namespaces the processes are in.
pub fn snapshot_send_queues(pids: &[Tid], networks: &JobNetworks) -> Result<EarlySends> {
    if !tcp_reconnect::repair_available() {
        // Without repair mode there is no send queue to read (see docs/PLAN-UNPRIVILEGED-TCP.md).
        return Ok(EarlySends::default());
    }
    let diag = all_tcp(networks)?;
    let mut held = held_sockets(&Listing::of(pids)?, &diag)?;
    held.retain(|h| is_connected(h.diag.state));
    let mut repair = RepairGuard::default();
    let mut out = HashMap::new();
    let read = (|| -> Result<()> {
        for h in &held {
            repair.enter(h).map_err(|e| io_err(format!("pid {}: fd {}: TCP repair mode", h.pid, h.fd), e))?;
            let mut snap = Snapshot::default();
            let state = tcp_info(&h.sock)?.0;
            read_send(&h.sock, fin_sent(state), &mut snap)
                .map_err(|e| io_err(format!("pid {}: fd {}: read the send queue", h.pid, h.fd), e))?;
            out.insert(h.ino, (snap.send_seq, snap.send, snap.unsent));
        }
        Ok(())
    })();
    repair.leave()?;
    read.map(|()| EarlySends(out))
}


/// Captures a TCP socket of a stopped process (`s` is the restorer's duplicate of it).
pub fn capture(pid: Tid, fd: i32, ino: u64, s: OwnedFd, ctx: &mut CaptureCtx) -> Result<TcpRecord> {
    if ctx.inet.tcp.records.is_none() {
        let repair = *ctx.inet.tcp.repair.get_or_insert_with(tcp_reconnect::repair_available);
        if !repair {
            debug!("TCP repair mode is not available (or {} is set): connections are drained", tcp_reconnect::FORCE_ENV);
        }
        let mut records = capture_all(&ctx.listing, &ctx.job_sockets, &ctx.networks, &ctx.inet.tcp.early_sends, repair)?;
        for (ino, data) in ctx.inet.tcp.cross_node.drain() {
            if let Some(TcpRecord { state: TcpState::Connected(c), .. }) = records.get_mut(&ino) {
                if c.peer == Peer::Outside && !c.repaired {
                    c.recv_queue = Bytes(data);
                }
            }
        }
        ctx.inet.tcp.records = Some(records);
    }
    if let Some(r) = ctx.inet.tcp.records.as_ref().and_then(|r| r.get(&ino)) {
        return Ok(r.clone());
    }
    // inet_diag lists only sockets the kernel has hashed: this one was never bound, or was
    // closed after its connection.
    let closed = capture_closed(pid, fd, ino, &s)?;
    refuse_stand_in_in_made_namespace(pid, fd, ctx.networks.index_of(pid), &closed, || format!("socket:[{ino}], TCP"))?;
    Ok(closed)
}

/// A connection whose other end is gone comes back through a stand-in peer the restorer makes
/// in its own network namespace: inside a namespace the job made (`netns`, not 0) it would be
/// another namespace's. Refused there, until the stand-in is made inside. Pure.
fn refuse_stand_in_in_made_namespace(pid: Tid, fd: i32, netns: usize, rec: &TcpRecord, what: impl Fn() -> String) -> Result<()> {
    match &rec.state {
        TcpState::Closed { unread, reset, .. } if netns != 0 && (!unread.0.is_empty() || *reset) => Err(stood_in_for(pid, fd, what())),
        _ => Ok(()),
    }
}

fn stood_in_for(pid: Tid, fd: i32, what: String) -> Error {
    unsupported(
        pid,
        fd,
        format!("{what}, a connection whose other end is gone, inside a network namespace the job made: the stand-in a restart gives it is not made inside yet (checkpoint again once it is read to its end)"),
    )
}

/// A socket holding no connection: its bound address, and whether a connection was shut on it.
fn capture_closed(pid: Tid, fd: i32, ino: u64, s: &OwnedFd) -> Result<TcpRecord> {
    let family = getopt_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let state = getopt_bytes(s, libc::SOL_TCP, libc::TCP_INFO, 8)?.first().copied().unwrap_or(0);
    if state == SYN_SENT || state == SYN_RECV {
        return Err(unsupported(pid, fd, "a TCP connection being established".into()));
    }
    // POLLERR: an error the program has not read (SO_ERROR would take it).
    let revents = inet::poll_one(s, libc::POLLRDHUP, 0)?;
    let unread = Bytes(tcp_reconnect::peek_all(s).map_err(|e| Error::Other(format!("pid {pid}: fd {fd}: read what a closed TCP connection holds: {e}")))?);
    let reuse = getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
    Ok(TcpRecord {
        ino,
        family,
        state: TcpState::Closed { local: inet::local_addr(s)?, shut: revents & libc::POLLRDHUP != 0, unread, reset: revents & libc::POLLERR != 0 },
        opts: SockOpts::capture(s, family, libc::SOCK_STREAM, libc::IPPROTO_TCP, reuse)?,
        tcp_opts: TcpOpts::capture(s)?,
    })
}

/// A socket of the job as capture sees it.
pub(super) struct Held {
    pub(super) pid: Tid,
    pub(super) fd: i32,
    pub(super) ino: u64,
    pub(super) diag: InetDiag,
    pub(super) sock: OwnedFd,
}

/// The connections of the frozen processes `pids` whose other end no process of this node
/// holds (on another node of the job, or outside it). Only the node's own network namespace
/// has them: one the job made holds only its loopback.
pub(super) fn outside_connections(pids: &[Tid]) -> Result<Vec<Held>> {
    let listing = Listing::of(pids)?;
    let job_sockets = listing.socket_inodes();
    let diag = all_tcp(&JobNetworks::here()?)?;
    let mut held = held_sockets(&listing, &diag)?;
    held.retain(|h| is_connected(h.diag.state) && classify_peer(&h.diag, &diag, &job_sockets).0 == Peer::Outside);
    Ok(held)
}

/// Whether a connection in kernel state `state` has sent its FIN.
pub(super) fn has_sent_fin(state: u8) -> bool {
    fin_sent(state)
}

/// Every TCP socket of the network namespaces `networks`, IPv4 and IPv6, each tagged with its
/// namespace's index.
fn all_tcp(networks: &JobNetworks) -> Result<Vec<InetDiag>> {
    let mut all = Vec::new();
    for (netns, via) in networks.diag_sockets() {
        for family in [libc::AF_INET, libc::AF_INET6] {
            all.extend(sockdiag::inet_sockets(via, family as u8, libc::IPPROTO_TCP as u8)?.into_iter().map(|d| InetDiag { netns, ..d }));
        }
    }
    Ok(all)
}

/// The job's TCP sockets that inet_diag lists, each once, with a duplicate of one descriptor.
fn held_sockets(listing: &Listing, diag: &[InetDiag]) -> Result<Vec<Held>> {
    let by_ino: HashMap<u64, &InetDiag> = diag.iter().filter(|d| d.ino != 0).map(|d| (d.ino as u64, d)).collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (pid, fd, ino) in listing.sockets() {
        if let Some(d) = by_ino.get(&ino) {
            if seen.insert(ino) {
                out.push(Held { pid, fd, ino, diag: (*d).clone(), sock: take_into_self(pid, fd)? });
            }
        }
    }
    Ok(out)
}

/// Who holds the other end of a connection. Pure: decides from inet_diag's list.
fn classify_peer(conn: &InetDiag, all: &[InetDiag], job_sockets: &HashSet<u64>) -> (Peer, Option<InetDiag>) {
    let (local, remote) = (inet::normalize(conn.local), inet::normalize(conn.remote));
    let other = all.iter().find(|e| e.netns == conn.netns && inet::normalize(e.local) == remote && inet::normalize(e.remote) == local);
    match other {
        Some(e) if e.ino != 0 && job_sockets.contains(&(e.ino as u64)) => (Peer::Job(e.ino as u64), Some(e.clone())),
        Some(e) if e.ino == 0 && matches!(e.state, ESTABLISHED | CLOSE_WAIT | SYN_RECV) && job_listener_on(e, all, job_sockets) => {
            (Peer::Backlog, Some(e.clone()))
        }
        _ => (Peer::Outside, None),
    }
}

/// Whether no process holds the other end of a connection any more (it is gone, or lingers
/// closed in the kernel). Pure.
fn peer_gone(conn: &InetDiag, all: &[InetDiag]) -> bool {
    let (local, remote) = (inet::normalize(conn.local), inet::normalize(conn.remote));
    !all.iter().any(|e| e.ino != 0 && e.netns == conn.netns && inet::normalize(e.local) == remote && inet::normalize(e.remote) == local)
}

/// The addresses of this machine's interfaces (a peer there can be stood in for).
fn local_addresses() -> HashSet<std::net::IpAddr> {
    let mut out: HashSet<std::net::IpAddr> = sys::interface_addresses().unwrap_or_default().iter().filter_map(|raw| Addr::from_sockaddr(raw)).map(|a| a.ip).collect();
    out.insert(std::net::Ipv4Addr::LOCALHOST.into());
    out.insert(std::net::Ipv6Addr::LOCALHOST.into());
    out
}

/// Whether a listening socket of the job listens where `child` was accepted. Pure.
fn job_listener_on(child: &InetDiag, all: &[InetDiag], job_sockets: &HashSet<u64>) -> bool {
    let at = inet::normalize(child.local);
    all.iter().any(|l| {
        l.state == LISTEN
            && l.netns == child.netns
            && job_sockets.contains(&(l.ino as u64))
            && l.local.port() == at.port()
            && (l.local.ip().is_unspecified() || inet::normalize(l.local).ip() == at.ip())
    })
}

/// Captures every TCP socket of the job that inet_diag lists. Retried when a connection changes
/// state while it is read (a FIN arriving, say).
fn capture_all(listing: &Listing, job_sockets: &HashSet<u64>, networks: &JobNetworks, early: &EarlySends, repair: bool) -> Result<HashMap<u64, TcpRecord>> {
    for attempt in 0..5 {
        if let Some(r) = capture_all_once(listing, job_sockets, networks, early, repair)? {
            return Ok(r);
        }
        debug!(attempt, "a TCP connection of the job changed while it was captured; again");
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::Other("the job's TCP connections kept changing state while they were captured (the checkpoint can be tried again)".into()))
}

/// What repair mode reads from one connection.
#[derive(Default, Clone)]
struct Snapshot {
    send_seq: u32,
    send: Vec<u8>,
    unsent: u32,
    recv_seq: u32,
    recv: Vec<u8>,
    state: u8,
    options: u8,
    wscale: u8,
    mss: u32,
    timestamp: Option<u32>,
    window: Option<Window>,
}

fn capture_all_once(
    listing: &Listing,
    job_sockets: &HashSet<u64>,
    networks: &JobNetworks,
    early: &EarlySends,
    repair_mode: bool,
) -> Result<Option<HashMap<u64, TcpRecord>>> {
    let diag = all_tcp(networks)?;
    let held = held_sockets(listing, &diag)?;
    let mut out = HashMap::new();
    let mut conns: Vec<(&Held, Peer)> = Vec::new();
    for h in &held {
        let what = || format!("socket:[{}], TCP {} -> {}", h.ino, h.diag.local, h.diag.remote);
        match h.diag.state {
            LISTEN => {
                out.insert(h.ino, capture_listener(h)?);
            }
            SYN_SENT | SYN_RECV => {
                return Err(unsupported(h.pid, h.fd, format!("{}, a connection being established: checkpoint again once it is", what())));
            }
            s if is_connected(s) => {
                let (peer, other) = classify_peer(&h.diag, &diag, job_sockets);
                if peer == Peer::Backlog {
                    let waiting = other.expect("a backlog peer is listed");
                    if waiting.rqueue > 0 {
                        return Err(unsupported(
                            h.pid,
                            h.fd,
                            format!(
                                "{}, a connection not accepted yet by the job's listener, which already holds {} bytes sent on it: checkpoint again once it is accepted",
                                what(),
                                waiting.rqueue
                            ),
                        ));
                    }
                    if h.diag.rqueue > 0 || fin_received(s) {
                        return Err(unsupported(h.pid, h.fd, format!("{}, a connection not accepted yet that received data", what())));
                    }
                }
                if peer == Peer::Outside && h.diag.netns != 0 {
                    return Err(stood_in_for(h.pid, h.fd, what()));
                }
                conns.push((h, peer));
            }
            _ => {
                let closed = capture_closed(h.pid, h.fd, h.ino, &h.sock)?;
                refuse_stand_in_in_made_namespace(h.pid, h.fd, h.diag.netns, &closed, what)?;
                out.insert(h.ino, closed);
            }
        }
    }
    // Listed sockets no process of the job holds, waiting in one of the job's backlogs, whose
    // other end is outside the job: they are lost (the peer sees a reset when it next sends).
    for d in diag.iter().filter(|d| d.ino == 0 && d.state == ESTABLISHED && job_listener_on(d, &diag, job_sockets)) {
        if !held.iter().any(|h| {
            h.diag.netns == d.netns && inet::normalize(h.diag.local) == inet::normalize(d.remote) && inet::normalize(h.diag.remote) == inet::normalize(d.local)
        }) {
            warn!(from = %d.remote, to = %d.local, "a connection from outside the job waits in a listener's backlog: it is not kept");
        }
    }
    if !repair_mode {
        return capture_drained(&mut conns, &diag, out);
    }

    let mut repair = RepairGuard::default();
    for (h, _) in &conns {
        repair.enter(h).map_err(|e| io_err(format!("pid {}: fd {}: TCP repair mode", h.pid, h.fd), e))?;
    }
    let mut snaps = vec![Snapshot::default(); conns.len()];
    for (snap, (h, _)) in snaps.iter_mut().zip(&conns) {
        let info = tcp_info(&h.sock)?;
        snap.state = info.0;
    }
    // Send queues of every connection first, then receive queues (see the module's comment).
    for (snap, (h, peer)) in snaps.iter_mut().zip(&conns) {
        read_send(&h.sock, fin_sent(snap.state), snap)
            .map_err(|e| io_err(format!("pid {}: fd {}: read the send queue", h.pid, h.fd), e))?;
        // To another node: the queue as it was before any node read a receive queue, if it
        // still ends where it did (the program was frozen; only its head can have been
        // acknowledged since).
        if let (Peer::Outside, Some((seq, data, _))) = (peer, early.0.get(&h.ino)) {
            if seq.wrapping_add(data.len() as u32) == snap.send_seq.wrapping_add(snap.send.len() as u32) {
                snap.send_seq = *seq;
                snap.send = data.clone();
            }
        }
    }
    for (snap, (h, _)) in snaps.iter_mut().zip(&conns) {
        read_recv(&h.sock, fin_received(snap.state), snap)
            .map_err(|e| io_err(format!("pid {}: fd {}: read the receive queue", h.pid, h.fd), e))?;
    }
    let mut changed = false;
    for (snap, (h, _)) in snaps.iter_mut().zip(&conns) {
        read_params(&h.sock, snap).map_err(|e| io_err(format!("pid {}: fd {}: read TCP parameters", h.pid, h.fd), e))?;
        // (A connection reset or closed meanwhile is listed again as what it is now.)
        changed |= tcp_info(&h.sock)?.0 != snap.state || !is_connected(snap.state);
    }
    let reuse = repair.leave()?;
    if changed {
        return Ok(None);
    }

    mark_closed_peers(&mut conns, &snaps.iter().map(|s| s.state).collect::<Vec<_>>(), &diag);

    // Cut each sender's copy of the bytes its peer in the job already has.
    let recv_end: HashMap<u64, u32> =
        conns.iter().zip(&snaps).map(|((h, _), s)| (h.ino, s.recv_seq.wrapping_add(s.recv.len() as u32))).collect();
    for ((h, peer), snap) in conns.iter().zip(snaps.iter_mut()) {
        if let Peer::Job(other) = peer {
            let Some(&end) = recv_end.get(other) else { continue };
            let Some(have) = already_received(snap.send_seq, snap.send.len(), end) else {
                debug!(ino = h.ino, "the two ends of a connection of the job disagree; again");
                return Ok(None);
            };
            snap.send.drain(..have);
            snap.send_seq = end;
            snap.unsent = snap.unsent.min(snap.send.len() as u32);
        }
    }

    for (((h, peer), snap), reuseaddr) in conns.iter().zip(snaps).zip(reuse) {
        let family = h.diag.family as i32;
        let local = inet::local_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.local));
        let remote = inet::peer_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.remote));
        let conn = Connection {
            local,
            remote,
            peer: *peer,
            kstate: snap.state,
            fin_sent: fin_sent(snap.state),
            fin_received: fin_received(snap.state),
            shut_rd: h.diag.shutdown & 1 != 0 && !fin_received(snap.state),
            send_seq: snap.send_seq,
            send_queue: Bytes(snap.send),
            unsent: snap.unsent,
            recv_seq: snap.recv_seq,
            recv_queue: Bytes(snap.recv),
            mss: snap.mss,
            wscale: (snap.options & TCPI_OPT_WSCALE != 0).then_some((snap.wscale & 0xf, snap.wscale >> 4)),
            sack: snap.options & TCPI_OPT_SACK != 0,
            timestamp: snap.timestamp,
            window: snap.window,
            repaired: true,
        };
        let rec = TcpRecord {
            ino: h.ino,
            family,
            state: TcpState::Connected(Box::new(conn)),
            opts: SockOpts::capture(&h.sock, family, libc::SOCK_STREAM, libc::IPPROTO_TCP, reuseaddr)?,
            tcp_opts: TcpOpts::capture(&h.sock)?,
        };
        out.insert(h.ino, rec);
    }
    Ok(Some(out))
}

/// A peer on this machine that no process holds any more, whose FIN arrived: closed.
fn mark_closed_peers(conns: &mut [(&Held, Peer)], states: &[u8], diag: &[InetDiag]) {
    let local_ips = local_addresses();
    for ((h, peer), &state) in conns.iter_mut().zip(states) {
        if *peer == Peer::Outside && fin_received(state) && peer_gone(&h.diag, diag) && local_ips.contains(&inet::normalize(h.diag.remote).ip()) {
            *peer = Peer::Closed;
        }
    }
}

/// The job's connections captured without repair mode: the bytes in flight towards each end
/// drained into its record (see [`tcp_reconnect`]).
fn capture_drained(conns: &mut [(&Held, Peer)], diag: &[InetDiag], mut out: HashMap<u64, TcpRecord>) -> Result<Option<HashMap<u64, TcpRecord>>> {
    let before: Vec<u8> = conns.iter().map(|(h, _)| tcp_info(&h.sock).map(|i| i.0)).collect::<Result<_>>()?;
    mark_closed_peers(conns, &before, diag);
    let ends: Vec<tcp_reconnect::End> = conns
        .iter()
        .zip(&before)
        .map(|((h, peer), &state)| tcp_reconnect::End {
            sock: &h.sock,
            ino: h.ino,
            peer: *peer,
            fin_sent: fin_sent(state),
            what: format!("pid {}: fd {}", h.pid, h.fd),
        })
        .collect();
    let mut drained = tcp_reconnect::drain(&ends)?;
    for (h, peer) in conns.iter() {
        // After the drain: a FIN that was in flight has arrived.
        let state = tcp_info(&h.sock)?.0;
        if !is_connected(state) {
            return Ok(None);
        }
        let family = h.diag.family as i32;
        let reuse = getopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
        let conn = Connection {
            local: inet::local_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.local)),
            remote: inet::peer_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.remote)),
            peer: *peer,
            kstate: state,
            fin_sent: fin_sent(state),
            fin_received: fin_received(state),
            shut_rd: h.diag.shutdown & 1 != 0 && !fin_received(state),
            send_seq: 0,
            send_queue: Bytes::default(),
            unsent: 0,
            recv_seq: 0,
            recv_queue: Bytes(drained.remove(&h.ino).unwrap_or_default()),
            mss: 0,
            wscale: None,
            sack: false,
            timestamp: None,
            window: None,
            repaired: false,
        };
        let rec = TcpRecord {
            ino: h.ino,
            family,
            state: TcpState::Connected(Box::new(conn)),
            opts: SockOpts::capture(&h.sock, family, libc::SOCK_STREAM, libc::IPPROTO_TCP, reuse)?,
            tcp_opts: TcpOpts::capture(&h.sock)?,
        };
        out.insert(h.ino, rec);
    }
    Ok(Some(out))
}

/// How many bytes at the head of a send queue (`len` bytes from sequence number `send_seq`) the
/// peer, whose receive queue ends at `peer_end`, already has; None if the two cannot be the two
/// ends of one connection (a gap, or bytes never sent). Pure.
pub(super) fn already_received(send_seq: u32, len: usize, peer_end: u32) -> Option<usize> {
    let have = peer_end.wrapping_sub(send_seq) as i32;
    (have >= 0 && have as usize <= len).then_some(have as usize)
}

fn capture_listener(h: &Held) -> Result<TcpRecord> {
    let family = h.diag.family as i32;
    let reuse = getopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
    Ok(TcpRecord {
        ino: h.ino,
        family,
        state: TcpState::Listening { local: inet::local_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.local)), backlog: h.diag.wqueue },
        opts: SockOpts::capture(&h.sock, family, libc::SOCK_STREAM, libc::IPPROTO_TCP, reuse)?,
        tcp_opts: TcpOpts::capture(&h.sock)?,
    })
}

/// Connections of the job in repair mode, with what repair mode changes on them; put back as they
/// were by [`RepairGuard::leave`], or on drop if capture fails half-way.
#[derive(Default)]
struct RepairGuard {
    /// Duplicate, SO_REUSEADDR, SO_PEEK_OFF before.
    socks: Vec<(OwnedFd, i32, i32)>,
}

impl RepairGuard {
    fn enter(&mut self, h: &Held) -> std::io::Result<()> {
        let reuse = getopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
        let peek_off = getopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF)?;
        let dup = h.sock.try_clone()?;
        setopt_int(&dup, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON)?;
        self.socks.push((dup, reuse, peek_off));
        if peek_off >= 0 {
            // Peeking must start at the first unread byte and must not move the job's offset.
            setopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF, -1)?;
        }
        Ok(())
    }

    /// Turns repair mode off on every socket (without a window probe: nothing is sent) and puts
    /// back what it changed. Returns each socket's SO_REUSEADDR, in order.
    fn leave(&mut self) -> Result<Vec<bool>> {
        let mut first_err = None;
        let mut reuse = Vec::new();
        for (s, r, peek_off) in self.socks.drain(..) {
            let res = setopt_int(&s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)
                .and_then(|_| setopt_int(&s, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP))
                .and_then(|_| setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, r))
                .and_then(|_| if peek_off >= 0 { setopt_int(&s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, peek_off) } else { Ok(()) });
            if let Err(e) = res {
                warn!("a TCP socket of the job could not be taken out of repair mode: {e}");
                first_err.get_or_insert(e);
            }
            reuse.push(r != 0);
        }
        match first_err {
            None => Ok(reuse),
            Some(e) => Err(Error::Other(format!("take a TCP socket of the job out of repair mode: {e}"))),
        }
    }
}

impl Drop for RepairGuard {
    fn drop(&mut self) {
        let _ = self.leave();
    }
}

/// (state, options, window scales) from TCP_INFO.
fn tcp_info(s: &OwnedFd) -> Result<(u8, u8, u8)> {
    let b = getopt_bytes(s, libc::SOL_TCP, libc::TCP_INFO, 8)?;
    if b.len() < 7 {
        return Err(Error::Other("TCP_INFO: short answer".into()));
    }
    Ok((b[0], b[5], b[6]))
}

/// Peeks up to `max` bytes of the queue repair mode points at; nothing is taken out.
fn peek(s: &OwnedFd, max: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    match sys::recv(s, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(n) => buf.truncate(n),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    Ok(buf)
}

/// The send queue: bytes written and not acknowledged, and the sequence number of the first.
fn read_send(s: &OwnedFd, fin_sent: bool, snap: &mut Snapshot) -> std::io::Result<()> {
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, SEND_QUEUE)?;
    for _ in 0..50 {
        let write_seq = getopt_int(s, libc::SOL_TCP, TCP_QUEUE_SEQ)? as u32;
        // Both counts include the FIN while it is not acknowledged; it carries no byte.
        let outq = inet::ioctl_int(s, SIOCOUTQ)? as u32;
        let unsent = inet::ioctl_int(s, SIOCOUTQNSD)? as u32;
        let len = if fin_sent && outq > 0 { outq - 1 } else { outq } as usize;
        // Peeking copies whole buffers, possibly with bytes already acknowledged at the head:
        // the queue is the last `len` bytes.
        let data = peek(s, len + (1 << 20))?;
        if data.len() < len {
            continue; // acknowledged meanwhile
        }
        let end = write_seq.wrapping_sub(fin_sent as u32);
        snap.send = data[data.len() - len..].to_vec();
        snap.send_seq = end.wrapping_sub(len as u32);
        snap.unsent = (if fin_sent && unsent > 0 { unsent - 1 } else { unsent }).min(len as u32);
        return Ok(());
    }
    Err(std::io::Error::other("the send queue kept changing"))
}

/// The receive queue: bytes received and not read, and the sequence number of the first.
fn read_recv(s: &OwnedFd, fin_received: bool, snap: &mut Snapshot) -> std::io::Result<()> {
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, RECV_QUEUE)?;
    for _ in 0..50 {
        let rcv_nxt = getopt_int(s, libc::SOL_TCP, TCP_QUEUE_SEQ)? as u32;
        // SIOCINQ does not count a FIN.
        let inq = inet::ioctl_int(s, SIOCINQ)? as usize;
        let data = peek(s, inq + 1)?;
        let again = getopt_int(s, libc::SOL_TCP, TCP_QUEUE_SEQ)? as u32;
        if again != rcv_nxt || data.len() != inq {
            continue; // bytes arrived meanwhile
        }
        snap.recv_seq = rcv_nxt.wrapping_sub(fin_received as u32).wrapping_sub(inq as u32);
        snap.recv = data;
        return Ok(());
    }
    Err(std::io::Error::other("the receive queue kept changing"))
}

fn read_params(s: &OwnedFd, snap: &mut Snapshot) -> std::io::Result<()> {
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)?;
    let b = getopt_bytes(s, libc::SOL_TCP, libc::TCP_INFO, 8)?;
    snap.options = b.get(5).copied().unwrap_or(0);
    snap.wscale = b.get(6).copied().unwrap_or(0);
    // In repair mode TCP_MAXSEG tells the MSS clamp.
    snap.mss = getopt_int(s, libc::SOL_TCP, libc::TCP_MAXSEG)? as u32;
    if snap.options & TCPI_OPT_TIMESTAMPS != 0 {
        snap.timestamp = Some(getopt_int(s, libc::SOL_TCP, TCP_TIMESTAMP)? as u32);
    }
    snap.window = match getopt_bytes(s, libc::SOL_TCP, TCP_REPAIR_WINDOW, 20) {
        Ok(w) if w.len() == 20 => {
            let at = |i: usize| u32::from_ne_bytes(w[i * 4..i * 4 + 4].try_into().unwrap());
            Some(Window { snd_wl1: at(0), snd_wnd: at(1), max_window: at(2), rcv_wnd: at(3), rcv_wup: at(4) })
        }
        Ok(_) => None,
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => None,
        Err(e) => return Err(e),
    };
    Ok(())
}

impl TcpOpts {
    fn capture(s: &OwnedFd) -> std::io::Result<TcpOpts> {
        let t = libc::SOL_TCP;
        Ok(TcpOpts {
            nodelay: getopt_int(s, t, libc::TCP_NODELAY)? != 0,
            cork: getopt_int(s, t, libc::TCP_CORK)? != 0,
            keepidle: getopt_int(s, t, libc::TCP_KEEPIDLE)?,
            keepintvl: getopt_int(s, t, libc::TCP_KEEPINTVL)?,
            keepcnt: getopt_int(s, t, libc::TCP_KEEPCNT)?,
            user_timeout: getopt_int(s, t, libc::TCP_USER_TIMEOUT)?,
        })
    }

    pub(super) fn restore(&self, s: &OwnedFd) -> std::io::Result<()> {
        let t = libc::SOL_TCP;
        setopt_int(s, t, libc::TCP_NODELAY, self.nodelay as i32)?;
        setopt_int(s, t, libc::TCP_KEEPIDLE, self.keepidle)?;
        setopt_int(s, t, libc::TCP_KEEPINTVL, self.keepintvl)?;
        setopt_int(s, t, libc::TCP_KEEPCNT, self.keepcnt)?;
        setopt_int(s, t, libc::TCP_USER_TIMEOUT, self.user_timeout)?;
        setopt_int(s, t, libc::TCP_CORK, self.cork as i32)
    }
}

/// Puts the job's TCP connections in repair mode before it is killed (see [`inet::before_kill`]);
/// without repair mode, makes those between the job's processes close with a reset.
pub fn silence(pids: &[Tid], outside_too: bool) {
    let repair = tcp_reconnect::repair_available();
    let result = (|| -> Result<()> {
        let listing = Listing::of(pids)?;
        let job_sockets = listing.socket_inodes();
        let diag = all_tcp(&JobNetworks::here()?)?;
        for h in held_sockets(&listing, &diag)? {
            if !is_connected(h.diag.state) {
                continue;
            }
            let (peer, _) = classify_peer(&h.diag, &diag, &job_sockets);
            if !repair {
                // Without repair mode the connections close at the kill. Those between the
                // job's processes close with a reset (SO_LINGER 0) rather than a FIN, so that no
                // TIME_WAIT is left on the ports the restart binds again (an ordinary user cannot
                // end one); peers outside the job see the usual close.
                if peer != Peer::Outside {
                    reset_on_close(&h.sock);
                }
                continue;
            }
            if peer == Peer::Outside && !outside_too {
                continue;
            }
            // An acknowledgement still delayed would never leave: the peer would send its bytes
            // again to a socket that no longer exists and get a reset. Send it now.
            let _ = setopt_int(&h.sock, libc::SOL_TCP, libc::TCP_QUICKACK, 1);
            if let Err(e) = setopt_int(&h.sock, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON) {
                warn!(pid = h.pid, fd = h.fd, "TCP repair mode before the kill: {e}");
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        warn!("TCP connections of the job are closed as usual at the kill: {e}");
    }
}

/// Makes every TCP connection the job's processes `pids` hold close with a reset when the job
/// is killed to be recovered from a lost node (SO_LINGER 0). Closed as usual, a connection to
/// the lost node would send a FIN nothing acknowledges: its end would stay in FIN-WAIT-1,
/// retransmitting for minutes, on a port the restart in place binds again (which only root can
/// end), and connections between the surviving processes would leave TIME-WAITs there. Every
/// one of them comes back from the generation the recovery restarts, or not at all.
pub fn reset_at_recovery_kill(pids: &[Tid]) {
    // Only the node's own network namespace: one the job made goes with its processes.
    let connected: HashSet<u64> = match JobNetworks::here().and_then(|n| all_tcp(&n)) {
        Ok(diag) => diag.iter().filter(|d| d.ino != 0 && is_connected(d.state)).map(|d| d.ino as u64).collect(),
        Err(e) => {
            warn!("the job's TCP connections close as usual at the recovery's kill (a restart in place may wait for them): {e}");
            return;
        }
    };
    let mut reset = HashSet::new();
    // The job runs (mpirun aborts as its daemons go): a process or a descriptor gone meanwhile
    // is passed over, not the others.
    for &pid in pids {
        let Ok(listing) = Listing::of(&[pid]) else { continue };
        for (pid, fd, ino) in listing.sockets() {
            if connected.contains(&ino) && !reset.contains(&ino) {
                if let Ok(sock) = take_into_self(pid, fd) {
                    reset_on_close(&sock);
                    reset.insert(ino);
                }
            }
        }
    }
}

/// Makes the socket's last close send a reset and leave nothing behind (SO_LINGER 0); best
/// effort.
fn reset_on_close(s: &OwnedFd) {
    let _ = setopt_bytes(s, libc::SOL_SOCKET, libc::SO_LINGER, &[1i32.to_ne_bytes(), 0i32.to_ne_bytes()].concat());
}

// ---------------------------------------------------------------------------------------------
// Restore

/// A socket rebuilt and waiting for [`finish`].
struct Waiting {
    sock: OwnedFd,
    conn: Box<Connection>,
    opts: SockOpts,
    tcp_opts: TcpOpts,
    /// "pid N: fd M" for messages.
    what: String,
    /// For a peer that had closed: the restorer's stand-in for it (see [`Peer::Closed`]).
    twin: Option<OwnedFd>,
}

/// Per-node state of TCP sockets being restored.
#[derive(Default)]
pub struct TcpRestoreState {
    /// Connections rebuilt in repair mode.
    repaired: Vec<Waiting>,
    /// Connections that were waiting in a listener's backlog, to be made again.
    backlog: Vec<Waiting>,
}

/// The (local, remote) addresses of every TCP connection held by the processes of an image.
pub fn connections<'a>(fds: impl Iterator<Item = &'a FdRecord>) -> Vec<(Addr, Addr)> {
    fds.filter_map(|rec| match &rec.kind {
        super::fd::FdKind::Inet(inet::InetRecord::Tcp(TcpRecord { state: TcpState::Connected(c), .. })) => Some((c.local, c.remote)),
        _ => None,
    })
    .collect()
}

/// Opens a TCP socket in the task.
pub fn open(
    task: &mut RemoteTask,
    ns_pid: Tid,
    rec: &FdRecord,
    t: &TcpRecord,
    state: &mut InetRestoreState,
    work_base: u64,
) -> Result<u64> {
    let (fd, s) = inet::new_socket(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
    let what = format!("pid {ns_pid}: fd {}", rec.fd);
    let opts_err = |e| Error::Other(format!("{what}: set socket options: {e}"));
    match &t.state {
        TcpState::Closed { local, unread, reset, .. } if *reset || !unread.0.is_empty() => {
            tcp_reconnect::ended_with_unread(&s, t, local.as_ref(), &unread.0, *reset)
                .map_err(|e| Error::Other(format!("{what}: make again a TCP connection that ended, {} bytes unread: {e}", unread.0.len())))?;
            t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(opts_err)?;
        }
        TcpState::Closed { local, shut, .. } => {
            t.opts.restore_before_bind(&s, t.family).map_err(opts_err)?;
            if let Some(a) = local {
                bind_forced(&s, &state.readdress(a))?;
            }
            if *shut {
                shutdown(&s, libc::SHUT_RDWR);
            }
            t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(opts_err)?;
        }
        TcpState::Listening { local, backlog } => listen_as_recorded(&s, t, &state.readdress(local), *backlog).map_err(|e| match e {
            Error::Other(m) => Error::Other(format!("{what}: {m}")),
            other => other,
        })?,
        TcpState::Connected(c) => {
            // To the job's other nodes: a node that moved has a new address, at both ends.
            let across_nodes = state.on_other_nodes(c);
            let readdressed;
            let c = if across_nodes && !state.readdressed.is_empty() {
                readdressed = Box::new(Connection { local: state.readdress(&c.local), remote: state.readdress(&c.remote), ..(**c).clone() });
                &readdressed
            } else {
                c
            };
            let waiting = |sock| Waiting {
                sock,
                conn: c.clone(),
                opts: t.opts.clone(),
                tcp_opts: t.tcp_opts.clone(),
                what: what.clone(),
                twin: None,
            };
            match c.peer {
                Peer::Backlog => {
                    t.opts.restore_before_bind(&s, t.family).map_err(opts_err)?;
                    bind_forced(&s, &c.local)?;
                    state.tcp.backlog.push(waiting(s.try_clone()?));
                }
                Peer::Outside if !(state.tcp_established || across_nodes) || c.fin_received || c.shut_rd => {
                    if state.tcp_established {
                        warn!("{what}: connection {} -> {} was half-closed: it is restored reset", c.local, c.remote);
                    }
                    restore_reset(&s, t, c, &what)?;
                    t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(opts_err)?;
                }
                _ => {
                    let in_context = |e| Error::Other(format!("{what}: TCP {} -> {}: {e}", c.local, c.remote));
                    match (restore_repaired(&s, t, c), c.peer) {
                        (Ok(()), _) => {}
                        (Err(e), Peer::Outside) => {
                            // The old connection still lingers (the job crashed rather than
                            // being killed after its checkpoint): it cannot be taken over.
                            warn!("{what}: connection {} -> {} comes back closed: {e}", c.local, c.remote);
                            let _ = setopt_int(&s, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP);
                            shutdown(&s, libc::SHUT_RDWR);
                            inet::set_status_flags(&s, rec)?;
                            return Ok(fd);
                        }
                        (Err(e), _) => return Err(in_context(e)),
                    }
                    let mut w = waiting(s.try_clone()?);
                    if c.peer == Peer::Closed {
                        w.twin = Some(stand_in(t.family, c).map_err(in_context)?);
                    }
                    state.tcp.repaired.push(w);
                }
            }
        }
    }
    inet::set_status_flags(&s, rec)?;
    Ok(fd)
}

/// A listening socket bound and listening where the record says, with its options.
pub(super) fn listen_as_recorded(s: &OwnedFd, t: &TcpRecord, local: &Addr, backlog: u32) -> Result<()> {
    let opts_err = |e| Error::Other(format!("set socket options: {e}"));
    t.opts.restore_before_bind(s, t.family).map_err(opts_err)?;
    // Connections the old job accepted on this port may linger in TIME_WAIT.
    setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).map_err(opts_err)?;
    bind_listener(s, local)?;
    sys::listen(s, backlog as i32).map_err(|e| inet::port_error("listen on", local, e))?;
    t.opts.restore(s).and_then(|_| t.tcp_opts.restore(s)).map_err(opts_err)
}

pub(super) fn shutdown(s: &OwnedFd, how: i32) {
    // On a socket with no connection it fails with ENOTCONN but still marks it shut, which is
    // what is wanted.
    let _ = sys::shutdown(s, how);
}

/// Binds a listener. After a crash the ends of the old job's connections on its port linger
/// (TIME_WAIT, FIN_WAIT2, ...: orphans no process holds) and, unless the old sockets had
/// SO_REUSEADDR, they keep the port from a new listener: root ends them (SOCK_DESTROY); an
/// ordinary user cannot, and waits for them to go ([`wait_for_lingering`]).
fn bind_listener(s: &OwnedFd, local: &Addr) -> Result<()> {
    let taken = |e| inet::port_error("bind a listening TCP socket to", local, e);
    let at = std::net::SocketAddr::new(local.ip, local.port);
    match inet::bind(s, local) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {}
        r => return r.map_err(taken),
    }
    match crate::sockdiag::destroy_lingering(at, None) {
        Ok(0) => {}
        Ok(n) => {
            info!("ended {n} lingering connection(s) of the old job on {local} to listen there again");
            match inet::bind(s, local) {
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {}
                r => return r.map_err(taken),
            }
        }
        // An ordinary user cannot end them (EPERM): they go by themselves.
        Err(e) => debug!("{local}: lingering connections not ended: {e}"),
    }
    wait_for_lingering(s, local, at)
}

/// TCP's TIME_WAIT lasts 60 s on Linux (TCP_TIMEWAIT_LEN, not tunable).
const TIME_WAIT_LEN: Duration = Duration::from_secs(60);

/// The longest an orphaned end of a closed connection lingers: FIN_WAIT2 for up to
/// net.ipv4.tcp_fin_timeout (of this network namespace), then TIME_WAIT if the peer's FIN comes
/// meanwhile; a few seconds more for the timers' slack.
fn lingering_limit() -> Duration {
    let fin_timeout = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fin_timeout").ok().and_then(|t| t.trim().parse::<u64>().ok()).unwrap_or(60);
    TIME_WAIT_LEN + Duration::from_secs(fin_timeout.min(300) + 5)
}

/// While the port is held only by lingering ends of the old job's connections (after a crash;
/// `--kill` leaves none), waits for them to go, then binds. Fails at once, naming them, when
/// nothing lingers there (another program, or a socket of this restore, holds it).
fn wait_for_lingering(s: &OwnedFd, local: &Addr, at: std::net::SocketAddr) -> Result<()> {
    let taken_by = |h: &crate::sockdiag::PortHolders, e: std::io::Error| {
        let mut what = String::new();
        if !h.held.is_empty() {
            what = format!("; held by {}", h.held_list());
        }
        if !h.lingering.is_empty() {
            what.push_str(&format!("; ended connections still lingering: {}", h.lingering_summary()));
        }
        Error::Other(format!(
            "bind a listening TCP socket to {local}: port {} is taken ({e}){what}: free it (stop whatever holds it) and restart again",
            local.port
        ))
    };
    let limit = lingering_limit();
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        let e = match inet::bind(s, local) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => e,
            r => return r.map_err(|e| inet::port_error("bind a listening TCP socket to", local, e)),
        };
        let h = crate::sockdiag::PortHolders::of(at).map_err(|d| inet::port_error("bind a listening TCP socket to", local, std::io::Error::other(format!("{e}; what holds it is unknown: {d}"))))?;
        // Sockets a process holds may share the port without taking it (SO_REUSEADDR on both,
        // an IPv6-only socket): only when nothing lingers any more is what remains the cause.
        if h.lingering.is_empty() || start.elapsed() > limit {
            return Err(taken_by(&h, e));
        }
        if !said {
            warn!(
                "port {} is held by {} end(s) of the old job's closed connections ({}), which no process holds and only root can end: waiting for them to go (at most {} s)",
                local.port,
                h.lingering.len(),
                h.lingering_summary(),
                limit.as_secs()
            );
            if !h.held.is_empty() {
                warn!("port {} also has sockets a process holds: {}", local.port, h.held_list());
            }
            said = true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Binds even where an old connection of the job lingers on the port (repair mode forces it;
/// without it, SO_REUSEADDR for the time of the bind, and a fresh port if the old one is taken).
fn bind_forced(s: &OwnedFd, a: &Addr) -> Result<()> {
    if setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON).is_err() {
        let reuse = getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
        setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        let r = match inet::bind(s, a) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
                warn!("{a} is taken: bound to a fresh port of its address instead");
                inet::bind(s, &Addr { port: 0, ..*a })
            }
            r => r,
        };
        setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, reuse)?;
        return r.map_err(|e| inet::port_error("bind a TCP socket to", a, e));
    }
    let r = inet::bind(s, a);
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP)?;
    r.map_err(|e| inet::port_error("bind a TCP socket to", a, e))
}

fn set_queue_seq(s: &OwnedFd, queue: i32, seq: u32) -> std::io::Result<()> {
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, queue)?;
    setopt_int(s, libc::SOL_TCP, TCP_QUEUE_SEQ, seq as i32)
}

/// Bound, connected and in ESTABLISHED state, in repair mode, with the sequence numbers of the
/// record's queues. A FIN received is not part of it (it is sent again by the peer's owner).
fn connect_repaired(s: &OwnedFd, t: &TcpRecord, c: &Connection) -> Result<()> {
    t.opts.restore_before_bind(s, t.family)?;
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON).map_err(|e| io_err("TCP repair mode", e))?;
    t.opts.make_room(s, c.recv_queue.0.len(), c.send_queue.0.len())?;
    set_queue_seq(s, RECV_QUEUE, c.recv_seq)?;
    set_queue_seq(s, SEND_QUEUE, c.send_seq)?;
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)?;
    inet::bind(s, &c.local).map_err(|e| inet::port_error("bind to", &c.local, e))?;
    connect_over_lingering(s, &c.local, &c.remote)
}

/// Connects a socket in repair mode. After a crash the old job's end of this very connection
/// may linger (TIME_WAIT, FIN_WAIT2, ...: an orphan no process holds) and the kernel refuses a
/// second socket with the same address pair (EADDRNOTAVAIL). Repair mode needs root over the
/// network namespace, and so does ending that orphan (SOCK_DESTROY): it is ended, and the
/// connect tried again.
fn connect_over_lingering(s: &OwnedFd, local: &Addr, remote: &Addr) -> Result<()> {
    let taken = |e| inet::port_error(&format!("connect from {local} to"), remote, e);
    match inet::connect(s, remote) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
            let pair = (std::net::SocketAddr::new(local.ip, local.port), std::net::SocketAddr::new(remote.ip, remote.port));
            match crate::sockdiag::destroy_lingering(pair.0, Some(pair.1)) {
                Ok(0) => Err(taken(e)),
                Ok(n) => {
                    info!("ended {n} lingering end(s) of the old job's connection {local} -> {remote} to rebuild it");
                    inet::connect(s, remote).map_err(taken)
                }
                Err(d) => Err(taken(std::io::Error::other(format!("{e}; the old connection's lingering end was not ended: {d}")))),
            }
        }
        r => r.map_err(taken),
    }
}

/// A connection rebuilt in repair mode, its receive queue in place; [`finish`] ends the repair.
fn restore_repaired(s: &OwnedFd, t: &TcpRecord, c: &Connection) -> Result<()> {
    connect_repaired(s, t, c)?;
    set_repair_options(s, c, c.wscale)?;
    if let Some(ts) = c.timestamp {
        setopt_int(s, libc::SOL_TCP, TCP_TIMESTAMP, ts as i32).map_err(|e| io_err("TCP_TIMESTAMP", e))?;
    }
    // The bytes received and not read go back into the receive queue.
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, RECV_QUEUE)?;
    let data = &c.recv_queue.0;
    let mut off = 0;
    let mut chunk = 64 << 10;
    while off < data.len() {
        let len = chunk.min(data.len() - off);
        let e = match sys::send(s, &data[off..off + len], libc::MSG_DONTWAIT) {
            Ok(n) if n > 0 => {
                off += n;
                continue;
            }
            Ok(_) => std::io::Error::from_raw_os_error(libc::EAGAIN),
            Err(e) => e,
        };
        if e.raw_os_error() == Some(libc::ENOMEM) && chunk > 4096 {
            chunk /= 2;
            continue;
        }
        return Err(io_err(format!("put {} bytes back into the receive queue", data.len()), e));
    }
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)?;
    if let Some(w) = c.window {
        // The FIN received is not restored with the queue: its sequence number is not either.
        let (rcv_wup, rcv_wnd) = if c.fin_received { (w.rcv_wup.wrapping_sub(1), w.rcv_wnd + 1) } else { (w.rcv_wup, w.rcv_wnd) };
        let mut b = Vec::new();
        for v in [w.snd_wl1, w.snd_wnd, w.max_window, rcv_wnd, rcv_wup] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        setopt_bytes(s, libc::SOL_TCP, TCP_REPAIR_WINDOW, &b).map_err(|e| io_err("TCP_REPAIR_WINDOW", e))?;
    }
    Ok(())
}

/// The options a connection negotiated (SACK, window scales as (send, receive), timestamps,
/// MSS), set on a socket in repair mode.
fn set_repair_options(s: &OwnedFd, c: &Connection, wscale: Option<(u8, u8)>) -> Result<()> {
    let mut opts: Vec<u8> = Vec::new();
    let mut opt = |code: u32, val: u32| {
        opts.extend_from_slice(&code.to_ne_bytes());
        opts.extend_from_slice(&val.to_ne_bytes());
    };
    if c.sack {
        opt(TCPOPT_SACK_PERM, 0);
    }
    if let Some((snd, rcv)) = wscale {
        opt(TCPOPT_WINDOW, snd as u32 | (rcv as u32) << 16);
    }
    if c.timestamp.is_some() {
        opt(TCPOPT_TIMESTAMP, 0);
    }
    opt(TCPOPT_MAXSEG, c.mss);
    setopt_bytes(s, libc::SOL_TCP, TCP_REPAIR_OPTIONS, &opts).map_err(|e| io_err("TCP_REPAIR_OPTIONS", e))?;
    Ok(())
}

/// The other end of a connection whose peer had closed, made by the restorer in repair mode:
/// bound to the peer's address, connected, expecting what `c` had not had acknowledged, and
/// about to send its FIN right after what `c` had received.
fn stand_in(family: i32, c: &Connection) -> Result<OwnedFd> {
    let s = inet::plain_socket(family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
    let recv_end = c.recv_seq.wrapping_add(c.recv_queue.0.len() as u32);
    setopt_int(&s, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON).map_err(|e| io_err("TCP repair mode", e))?;
    set_queue_seq(&s, RECV_QUEUE, c.send_seq)?;
    set_queue_seq(&s, SEND_QUEUE, recv_end)?;
    setopt_int(&s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)?;
    inet::bind(&s, &c.remote).map_err(|e| inet::port_error("bind a stand-in for the closed peer to", &c.remote, e))?;
    inet::connect(&s, &c.local).map_err(|e| inet::port_error("connect a stand-in for the closed peer to", &c.local, e))?;
    // Seen from the peer's side, the two window scales swap.
    set_repair_options(&s, c, c.wscale.map(|(snd, rcv)| (rcv, snd)))?;
    // Windows open both ways, so that the FIN can leave at once.
    let wnd = |w: Option<u32>| w.unwrap_or(0).max(65535);
    let (snd_wnd, rcv_wnd) = (wnd(c.window.map(|w| w.rcv_wnd)), wnd(c.window.map(|w| w.snd_wnd)));
    let mut b = Vec::new();
    for v in [c.send_seq, snd_wnd, snd_wnd, rcv_wnd, c.send_seq] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    setopt_bytes(&s, libc::SOL_TCP, TCP_REPAIR_WINDOW, &b).map_err(|e| io_err("TCP_REPAIR_WINDOW", e))?;
    Ok(s)
}

/// A connection to a peer outside the job, restored reset: connected in repair mode as it was,
/// then disconnected, which sends a reset to the peer and leaves ECONNRESET for the program.
fn restore_reset(s: &OwnedFd, t: &TcpRecord, c: &Connection, what: &str) -> Result<()> {
    match connect_repaired(s, t, c) {
        Ok(()) => {
            setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP)?;
            // A connect to family AF_UNSPEC disconnects.
            let _ = sys::connect(s, &(libc::AF_UNSPEC as u16).to_ne_bytes());
        }
        Err(e) => {
            // Its port is taken: a socket that only says its connection is gone.
            warn!("{what}: connection {} -> {} comes back as a closed socket: {e}", c.local, c.remote);
            let _ = setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP);
        }
    }
    shutdown(s, libc::SHUT_RDWR);
    Ok(())
}

/// How long finishing one connection may wait for the kernel (a connect, a full send buffer).
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes again the connections that were waiting in a backlog, then takes every repaired
/// connection out of repair mode and sends what it had to send.
pub fn finish(state: &mut TcpRestoreState) -> Result<()> {
    for w in state.backlog.drain(..) {
        connect_again(&w).map_err(|e| {
            Error::Other(format!("{}: connect again to {} (the connection was waiting in its backlog): {e}", w.what, w.conn.remote))
        })?;
        after_repair(&w)?;
    }
    let mut repaired: Vec<Waiting> = state.repaired.drain(..).collect();
    // Every end leaves repair mode before any byte is sent: a peer in the job is ready for it.
    for w in &repaired {
        setopt_int(&w.sock, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF)
            .map_err(|e| Error::Other(format!("{}: leave TCP repair mode: {e}", w.what)))?;
    }
    // Stand-ins for closed peers send their FIN, and are closed as the peers were.
    for w in &mut repaired {
        if let Some(t) = w.twin.take() {
            setopt_int(&t, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF_NO_WP)
                .map_err(|e| Error::Other(format!("{}: the stand-in for the closed peer: leave TCP repair mode: {e}", w.what)))?;
            shutdown(&t, libc::SHUT_WR);
        }
    }
    for w in &repaired {
        after_repair(w)?;
    }
    Ok(())
}

fn connect_again(w: &Waiting) -> std::io::Result<()> {
    let flags = inet::get_fl(&w.sock)?;
    inet::set_fl(&w.sock, flags | libc::O_NONBLOCK)?;
    let r = (|| {
        match inet::connect(&w.sock, &w.conn.remote) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        inet::poll_one(&w.sock, libc::POLLOUT, FINISH_TIMEOUT.as_millis() as i32)?;
        match getopt_int(&w.sock, libc::SOL_SOCKET, libc::SO_ERROR)? {
            0 => Ok(()),
            e => Err(std::io::Error::from_raw_os_error(e)),
        }
    })();
    inet::set_fl(&w.sock, flags)?;
    r
}

/// The send queue sent again, the FIN sent again, the options.
fn after_repair(w: &Waiting) -> Result<()> {
    let c = &w.conn;
    inet::send_all(&w.sock, &c.send_queue.0, FINISH_TIMEOUT)
        .map_err(|e| Error::Other(format!("{}: send again the {} bytes of the send queue: {e}", w.what, c.send_queue.0.len())))?;
    if c.fin_sent {
        shutdown(&w.sock, libc::SHUT_WR);
    }
    if c.shut_rd {
        shutdown(&w.sock, libc::SHUT_RD);
    }
    w.opts
        .restore(&w.sock)
        .and_then(|_| w.tcp_opts.restore(&w.sock))
        .map_err(|e| Error::Other(format!("{}: set socket options: {e}", w.what)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(state: u8, local: &str, remote: &str, ino: u32) -> InetDiag {
        InetDiag {
            family: libc::AF_INET as u8,
            state,
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            ino,
            rqueue: 0,
            wqueue: 0,
            shutdown: 0,
            netns: 0,
        }
    }

    /// A crash can leave the old end of a connection orphaned in FIN_WAIT1 (its unsent data
    /// waiting on a full window): the kernel refuses the rebuilt socket its address pair until
    /// that end is gone. Needs root (repair mode and SOCK_DESTROY).
    #[test]
    fn repaired_connect_ends_the_lingering_end_of_the_same_connection() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: TCP repair mode and SOCK_DESTROY need CAP_NET_ADMIN; the root run covers this");
            return;
        }
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (local, remote) = (Addr::from_std(client.local_addr().unwrap()), Addr::from_std(listener.local_addr().unwrap()));
        // Fill the peer's window, then close: the orphan keeps the data and its FIN queued.
        client.set_nonblocking(true).unwrap();
        while client.write(&[7u8; 65536]).is_ok() {}
        drop(client);
        let lingering = crate::sockdiag::PortHolders::of(local.normalized()).unwrap().lingering;
        assert!(lingering.iter().any(|d| d.state == 4), "no FIN_WAIT1 orphan: {lingering:?}");

        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
        let s = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
        setopt_int(&s, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON).unwrap();
        inet::bind(&s, &local).unwrap();
        let refused = inet::connect(&s, &remote).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::EADDRNOTAVAIL), "{refused}");
        connect_over_lingering(&s, &local, &remote).unwrap();
        drop(accepted);
    }

    #[test]
    fn peers_in_the_job_in_a_backlog_or_outside() {
        let listener = d(LISTEN, "0.0.0.0:5000", "0.0.0.0:0", 10);
        let client = d(ESTABLISHED, "127.0.0.1:40000", "127.0.0.1:5000", 11);
        let accepted = d(ESTABLISHED, "127.0.0.1:5000", "127.0.0.1:40000", 12);
        let job: HashSet<u64> = [10, 11, 12].into_iter().collect();
        let all = vec![listener.clone(), client.clone(), accepted.clone()];
        assert_eq!(classify_peer(&client, &all, &job).0, Peer::Job(12));
        // Not accepted yet: no inode.
        let waiting = d(ESTABLISHED, "127.0.0.1:5000", "127.0.0.1:40000", 0);
        let all = vec![listener.clone(), client.clone(), waiting];
        assert_eq!(classify_peer(&client, &all, &job).0, Peer::Backlog);
        // A socket of another process.
        let job: HashSet<u64> = [11].into_iter().collect();
        assert_eq!(classify_peer(&client, &all, &job).0, Peer::Outside);
        // Nobody on this machine.
        assert_eq!(classify_peer(&client, std::slice::from_ref(&client), &job).0, Peer::Outside);
    }

    #[test]
    fn ipv6_socket_talking_ipv4_finds_its_peer() {
        let mut v6 = d(ESTABLISHED, "127.0.0.1:40000", "127.0.0.1:5000", 11);
        v6.local = "[::ffff:127.0.0.1]:40000".parse().unwrap();
        v6.remote = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        let v4 = d(ESTABLISHED, "127.0.0.1:5000", "127.0.0.1:40000", 12);
        let job: HashSet<u64> = [11, 12].into_iter().collect();
        assert_eq!(classify_peer(&v6, &[v4.clone(), v6.clone()], &job).0, Peer::Job(12));
        assert_eq!(classify_peer(&v4, &[v4.clone(), v6.clone()], &job).0, Peer::Job(11));
    }

    #[test]
    fn inet_diag_lists_a_listener_its_backlog_and_a_connection() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let ino = |fd: i32| std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap().ino() as u32;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let all = all_tcp(&JobNetworks::here().unwrap()).unwrap();
        let listener = all.iter().find(|d| d.ino == ino(l.as_raw_fd())).expect("the listener is listed");
        assert_eq!((listener.state, listener.local), (LISTEN, l.local_addr().unwrap()));
        assert_eq!(listener.wqueue, 128, "the backlog std gives listen(2)");
        let client = all.iter().find(|d| d.ino == ino(c.as_raw_fd())).expect("the client is listed");
        let job: HashSet<u64> = [listener.ino as u64, client.ino as u64].into_iter().collect();
        // Not accepted yet: the other end waits in the backlog.
        assert_eq!(classify_peer(client, &all, &job).0, Peer::Backlog);
        let (accepted, _) = l.accept().unwrap();
        let all = all_tcp(&JobNetworks::here().unwrap()).unwrap();
        let client = all.iter().find(|d| d.ino == ino(c.as_raw_fd())).unwrap();
        let job: HashSet<u64> = [ino(c.as_raw_fd()) as u64, ino(accepted.as_raw_fd()) as u64].into_iter().collect();
        assert_eq!(classify_peer(client, &all, &job).0, Peer::Job(ino(accepted.as_raw_fd()) as u64));
    }

    #[test]
    fn a_sender_keeps_only_what_its_peer_has_not() {
        assert_eq!(already_received(1000, 50, 1000), Some(0));
        assert_eq!(already_received(1000, 50, 1020), Some(20));
        assert_eq!(already_received(1000, 50, 1050), Some(50));
        // Sequence numbers wrap around.
        assert_eq!(already_received(u32::MAX - 9, 50, 10), Some(20));
        // A gap: the receiver lacks bytes the sender no longer has.
        assert_eq!(already_received(1000, 50, 990), None);
        // The receiver has bytes never written.
        assert_eq!(already_received(1000, 50, 1051), None);
    }

    #[test]
    fn states_with_a_fin() {
        assert!(fin_sent(FIN_WAIT2) && !fin_received(FIN_WAIT2));
        assert!(fin_received(CLOSE_WAIT) && !fin_sent(CLOSE_WAIT));
        assert!(fin_sent(LAST_ACK) && fin_received(LAST_ACK));
        assert!(is_connected(CLOSING) && !is_connected(LISTEN) && !is_connected(SYN_SENT));
    }
}
