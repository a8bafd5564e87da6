//! TCP connections without repair mode: the path an ordinary user takes (TCP_REPAIR needs
//! CAP_NET_ADMIN over the job's network namespace, which a job in the host's network namespace
//! does not have), and root's too when `CKPT_TCP_RECONNECT=1` forces it. It keeps the promise of
//! [`super::tcp`]'s repair path for connections whose two ends are both in the job: every byte
//! in flight is in the image once, and the connection comes back with it.
//!
//! **Which path.** Chosen by probing, not by uid ([`repair_available`]): TCP_REPAIR is tried on a
//! fresh socket of the restorer's network namespace, which is the job's.
//!
//! **Capture (drain).** Without repair mode a send queue cannot be read, so the bytes in flight
//! are all brought to the receiving end: for each direction of a connection of the job, the
//! receiver's pending acknowledgement is pushed (TCP_QUICKACK) and a corked sender uncorked until
//! the sender's SIOCOUTQ is 0 (on loopback the bytes then sit in the receiver's queue). If the
//! sender's queue stops moving because the receiver's buffer is full, the receiver's queue is
//! read out (consumed) through the restorer's duplicate, which opens the window, until the send
//! queue is empty; the bytes read are then written back through the sender's duplicate, in
//! order, before anything else can write (the job is frozen until it is released), so that the
//! job finds its connection as it was. A receive queue that needed no consuming is only peeked.
//! The receiver's record holds every byte in flight towards it (`recv_queue`); the sender's
//! `send_queue` is empty; [`Connection::repaired`] is false. A sender that has sent its FIN
//! cannot be written through again: such a connection with bytes stuck behind a full receiver
//! is refused (checkpoint again once the program has read them), before anything is consumed.
//!
//! **Restore (reconnect).** The first end of a pair of the job met by the restore makes both in
//! its process: a listening socket there (the job's own restored listener when it is restored
//! already and the server end was accepted on its address, else a temporary one bound to the
//! server end's address, or to a fresh port of that address if it is taken), the client end
//! created by socket(2) in the process, bound to its old address when it is free, connected from
//! the restorer's duplicate, and the server end accepted by accept4(2) injected into the process.
//! Each direction's bytes are written again from its sender (what the receiver had, then what
//! the sender had not had acknowledged, for an image taken in repair mode), FINs and shutdowns
//! are made again, options set; the other end is parked for its own process, which takes it
//! (pidfd_getfd), as Unix socket pairs are.
//!
//! **Between nodes of the job.** At the checkpoint the coordinator pairs the nodes' off-node
//! ends and drains them in rounds ([`CrossNode`]): each node reads out what arrived until no
//! sender of any node has anything left, then the senders write back what their receivers gave
//! up. At restart the restorer makes those connections again before any process exists
//! ([`connect_across_nodes`]): the server end listens at its old address, the client end
//! connects there and sends a tag naming the connection, and the sockets are given to their
//! processes later over SCM_RIGHTS ([`descriptor::give`]). docs/PLAN-UNPRIVILEGED-TCP.md has the details.
//!
//! A connection whose peer had closed comes back connected to a stand-in of the restorer that
//! sends the bytes the program had not read, then its FIN, and closes. A connection to a peer
//! outside the job comes back reset: connected to a temporary listener whose accepted end is
//! closed with SO_LINGER 0, so the program's next call sees ECONNRESET, as after a network
//! failure.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::descriptor::{self, take_into_self, FdRecord, RestoreCtx};
use super::inet::{self, getopt_int, setopt_bytes, setopt_int, Addr};
use super::tcp::{shutdown, Connection, Peer, TcpRecord, TcpState};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::socket as sys;

/// Environment setting that makes capture and restore take this path even where repair mode is
/// allowed (for tests, and for images meant to be restarted by an ordinary user).
pub const FORCE_ENV: &str = "CKPT_TCP_RECONNECT";

const TCP_REPAIR: i32 = 19;
const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;

/// How long one direction of a connection may take to drain at a checkpoint.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// A send queue that has not moved for this long waits behind a full receiver.
const STALL: Duration = Duration::from_millis(20);
/// How long a write of the bytes in flight may wait for room.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether TCP repair mode can be used here: not forced off by [`FORCE_ENV`], and TCP_REPAIR
/// accepted on a fresh socket of this network namespace (the job's).
pub fn repair_available() -> bool {
    if std::env::var_os(FORCE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    match new_tcp_socket(libc::AF_INET) {
        Ok(s) => setopt_int(&s, libc::SOL_TCP, TCP_REPAIR, 1).is_ok(),
        Err(_) => false,
    }
}

fn new_tcp_socket(family: i32) -> std::io::Result<OwnedFd> {
    super::inet::plain_socket(family, libc::SOCK_STREAM, libc::IPPROTO_TCP)
}

// ---------------------------------------------------------------------------------------------
// Capture

/// One connection of the job as the drain sees it: the restorer's duplicate of it, its inode,
/// where its peer is, its kernel state, and "pid N: fd M" for messages.
pub struct End<'a> {
    /// The process holding it (host pid), for a passing state's error.
    pub pid: i32,
    pub sock: &'a OwnedFd,
    pub ino: u64,
    pub peer: Peer,
    pub fin_sent: bool,
    pub what: String,
}

/// Every byte in flight towards each end (by inode), in order; the job's connections are left
/// as they were. Ends whose peer is outside the job get nothing (they come back reset).
pub fn drain(ends: &[End]) -> Result<HashMap<u64, Vec<u8>>> {
    let by_ino: HashMap<u64, &End> = ends.iter().map(|e| (e.ino, e)).collect();
    let mut out = HashMap::new();
    for r in ends {
        let data = match r.peer {
            Peer::Job(s) => match by_ino.get(&s) {
                Some(sender) => drain_direction(sender, r)?,
                None => Vec::new(),
            },
            // Its peer is gone: nothing more can come; its FIN is behind the bytes.
            Peer::Closed => peek_all(r.sock).map_err(|e| Error::Other(format!("{}: read the receive queue: {e}", r.what)))?,
            Peer::Backlog => {
                let outq = inet::ioctl_int(r.sock, SIOCOUTQ)?;
                if outq > 0 {
                    // The listener accepts it in a moment: tried again then. (The error names
                    // the pid already.)
                    let end = r.what.strip_prefix(&format!("pid {}: ", r.pid)).unwrap_or(&r.what);
                    return Err(Error::Passing {
                        pid: r.pid,
                        what: format!("{end}: a connection not accepted yet by the job's listener holds {outq} bytes not delivered, which cannot be read without TCP repair mode"),
                    });
                }
                Vec::new()
            }
            // Comes back reset: what it has received by now is still the program's to read
            // first (what arrives while the job is frozen is lost with the connection).
            Peer::Outside => peek_all(r.sock).map_err(|e| Error::Other(format!("{}: read the receive queue: {e}", r.what)))?,
        };
        out.insert(r.ino, data);
    }
    Ok(out)
}

/// The bytes in flight from `s` to `r`: `s`'s send queue brought into `r`'s receive queue, read.
fn drain_direction(s: &End, r: &End) -> Result<Vec<u8>> {
    let ctx = |what: &str, e: std::io::Error| Error::Other(format!("{} -> {}: {what}: {e}", s.what, r.what));
    // A corked sender holds a partial segment back: uncork it (put back below).
    let corked = getopt_int(s.sock, libc::SOL_TCP, libc::TCP_CORK).map_err(|e| ctx("TCP_CORK", e))? != 0;
    if corked {
        setopt_int(s.sock, libc::SOL_TCP, libc::TCP_CORK, 0).map_err(|e| ctx("uncork", e))?;
    }
    // Peeking must start at the first unread byte and must not move the job's offset.
    let peek_off = getopt_int(r.sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF).map_err(|e| ctx("SO_PEEK_OFF", e))?;
    if peek_off >= 0 {
        setopt_int(r.sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF, -1).map_err(|e| ctx("SO_PEEK_OFF", e))?;
    }
    let result = drain_queues(s, r);
    let put_back = || -> std::io::Result<()> {
        if peek_off >= 0 {
            setopt_int(r.sock, libc::SOL_SOCKET, libc::SO_PEEK_OFF, peek_off)?;
        }
        if corked {
            setopt_int(s.sock, libc::SOL_TCP, libc::TCP_CORK, 1)?;
        }
        Ok(())
    };
    let (data, consumed) = result?;
    if consumed {
        refill(s.sock, &data).map_err(|e| {
            Error::Other(format!(
                "{} -> {}: write back the {} bytes drained from the connection: {e} (the job's connection lost them: restart it from this checkpoint)",
                s.what,
                r.what,
                data.len()
            ))
        })?;
    }
    put_back().map_err(|e| ctx("put the socket options back", e))?;
    Ok(data)
}

/// Waits until the sender's queue is empty, consuming the receiver's queue when it stops moving
/// (a full receive buffer). Returns every byte in flight, and whether any was consumed (then the
/// caller writes them back).
fn drain_queues(s: &End, r: &End) -> Result<(Vec<u8>, bool)> {
    let io = |what: &str, e: std::io::Error| Error::Other(format!("{} -> {}: {what}: {e}", s.what, r.what));
    let start = Instant::now();
    let mut consumed: Vec<u8> = Vec::new();
    let mut last = (-1, Instant::now());
    loop {
        // A delayed acknowledgement leaves the bytes counted in the sender's queue: send it.
        let _ = setopt_int(r.sock, libc::SOL_TCP, libc::TCP_QUICKACK, 1);
        let outq = inet::ioctl_int(s.sock, SIOCOUTQ).map_err(|e| io("SIOCOUTQ", e))?;
        if outq == 0 {
            break;
        }
        if outq != last.0 {
            last = (outq, Instant::now());
        } else if last.1.elapsed() > STALL {
            let inq = inet::ioctl_int(r.sock, SIOCINQ).map_err(|e| io("SIOCINQ", e))?;
            if inq > 0 {
                if s.fin_sent {
                    return Err(Error::Other(format!(
                        "{} -> {}: a half-closed TCP connection has {outq} bytes waiting behind a full receive buffer, which cannot be drained without TCP repair mode: checkpoint again once the program has read them",
                        s.what, r.what
                    )));
                }
                read_out(r.sock, &mut consumed).map_err(|e| io("read the receive queue", e))?;
                last = (-1, Instant::now());
            }
        }
        if start.elapsed() > DRAIN_TIMEOUT {
            return Err(Error::Other(format!(
                "{} -> {}: {outq} bytes sent were still not delivered after {} s (not a connection on this machine, or the network is stuck); checkpoint again",
                s.what,
                r.what,
                DRAIN_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if consumed.is_empty() {
        let data = peek_all(r.sock).map_err(|e| io("peek the receive queue", e))?;
        Ok((data, false))
    } else {
        read_out(r.sock, &mut consumed).map_err(|e| io("read the receive queue", e))?;
        debug!(bytes = consumed.len(), from = %s.what, to = %r.what, "drained a full TCP receive queue");
        Ok((consumed, true))
    }
}

/// The whole receive queue, left in place.
pub(super) fn peek_all(s: &OwnedFd) -> std::io::Result<Vec<u8>> {
    let inq = inet::ioctl_int(s, SIOCINQ)? as usize;
    if inq == 0 {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; inq];
    let n = sys::recv(s, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)?;
    if n != inq {
        return Err(std::io::Error::other(format!("peeked {n} of the {inq} bytes queued")));
    }
    Ok(buf)
}

/// Takes every byte of the receive queue out (SIOCINQ counts them; a FIN behind them stays).
fn read_out(s: &OwnedFd, into: &mut Vec<u8>) -> std::io::Result<()> {
    loop {
        let inq = inet::ioctl_int(s, SIOCINQ)? as usize;
        if inq == 0 {
            return Ok(());
        }
        let at = into.len();
        into.resize(at + inq, 0);
        let n = sys::recv(s, &mut into[at..], libc::MSG_DONTWAIT).and_then(|n| {
            if n == 0 {
                Err(std::io::Error::other("end of file before the queued bytes"))
            } else {
                Ok(n)
            }
        });
        match n {
            Ok(n) => into.truncate(at + n),
            Err(e) => {
                into.truncate(at);
                return Err(e);
            }
        }
    }
}

/// Writes bytes drained from a connection back through its sender, raising the sender's buffer
/// (within net.core.wmem_max) while they do not fit, and putting its size back after.
fn refill(s: &OwnedFd, data: &[u8]) -> std::io::Result<()> {
    let sndbuf = getopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
    let lock = getopt_int(s, libc::SOL_SOCKET, inet::SO_BUF_LOCK).ok();
    let need = data.len() as i64 * 2 + (64 << 10);
    let raised = (sndbuf as i64) < need;
    if raised {
        // The kernel doubles the value and caps it at wmem_max; what it gives is enough or not.
        setopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, need.min(i32::MAX as i64 / 2) as i32 / 2)?;
    }
    let sent = inet::send_all(s, data, SEND_TIMEOUT);
    if raised {
        // The kernel lets a queue above the size stay; the program's size and lock come back.
        setopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, sndbuf / 2)?;
        if let Some(l) = lock {
            setopt_int(s, libc::SOL_SOCKET, inet::SO_BUF_LOCK, l)?;
        }
    }
    sent
}

// ---------------------------------------------------------------------------------------------
// Capture across nodes

/// `(local, remote)`, both normalized (an IPv4-mapped IPv6 address as IPv4).
type Key = (SocketAddr, SocketAddr);

/// The ends on this node of TCP connections between nodes of the job, while the coordinator
/// drains them in rounds (docs/PLAN-UNPRIVILEGED-TCP.md): each round reads out what arrived at
/// each end; once no sender of any node has anything left, the last round keeps what each end
/// received for the capture, and the bytes taken out go back to the other node, whose sender
/// writes them again ([`CrossNode::refill`]).
#[derive(Default)]
pub struct CrossNode {
    ends: HashMap<Key, CrossEnd>,
    /// The ends were looked up (once per checkpoint).
    found: bool,
}

struct CrossEnd {
    sock: OwnedFd,
    ino: u64,
    what: String,
    /// Bytes taken out of its receive queue so far.
    taken: Vec<u8>,
    /// What it received, once the last round is done.
    received: Option<Vec<u8>>,
}

fn key(local: SocketAddr, remote: SocketAddr) -> Key {
    (inet::normalize(local), inet::normalize(remote))
}

/// Where a server end of a connection between nodes listens at a restart: (its old address, its
/// client's old address, where it listens now).
pub type Listening = (SocketAddr, SocketAddr, SocketAddr);

/// One end of a connection as the coordinator lists them: (local, remote, FIN sent).
pub type EndInfo = (SocketAddr, SocketAddr, bool);
/// Bytes to write again through the end (local, remote).
pub type RefillInfo = (SocketAddr, SocketAddr, Vec<u8>);

impl CrossNode {
    /// Without repair mode, the connections of the frozen processes `pids` whose other end is
    /// not on this node (empty with repair mode, which needs no drain).
    pub fn outside_ends(pids: &[Tid]) -> Result<Vec<EndInfo>> {
        if repair_available() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for h in super::tcp::outside_connections(pids)? {
            out.push((h.diag.local, h.diag.remote, super::tcp::has_sent_fin(h.diag.state)));
        }
        Ok(out)
    }

    /// One round: `ends` lists the ends of every node paired with an end on another node. Returns
    /// what this node's ends still have to send, and, with `last`, the bytes to write back.
    pub fn round(&mut self, pids: &[Tid], ends: &[EndInfo], last: bool) -> Result<(u64, Vec<RefillInfo>)> {
        if !self.found {
            self.found = true;
            let wanted: HashMap<Key, ()> = ends.iter().map(|e| (key(e.0, e.1), ())).collect();
            for h in super::tcp::outside_connections(pids)? {
                let k = key(h.diag.local, h.diag.remote);
                if wanted.contains_key(&k) {
                    let what = format!("pid {}: fd {} (TCP {} -> {}, to another node of the job)", h.pid, h.fd, h.diag.local, h.diag.remote);
                    self.ends.insert(k, CrossEnd { sock: h.sock, ino: h.ino, what, taken: Vec::new(), received: None });
                }
            }
        }
        // Whether the other end of (local, remote) has sent its FIN.
        let peer_fin = |k: &Key| ends.iter().any(|e| key(e.0, e.1) == (k.1, k.0) && e.2);
        let mut outq = 0u64;
        let mut refills = Vec::new();
        for (k, e) in self.ends.iter_mut() {
            let io = |what: &str, err: std::io::Error| Error::Other(format!("{}: {what}: {err}", e.what));
            let _ = setopt_int(&e.sock, libc::SOL_TCP, libc::TCP_QUICKACK, 1);
            // Its sender cannot write again after its FIN: only peeked, never taken out.
            if !peer_fin(k) {
                let mut taken = std::mem::take(&mut e.taken);
                let r = read_out(&e.sock, &mut taken);
                e.taken = taken;
                r.map_err(|err| io("read the receive queue", err))?;
            }
            outq += inet::ioctl_int(&e.sock, SIOCOUTQ).map_err(|err| io("SIOCOUTQ", err))? as u64;
            if last {
                if e.taken.is_empty() {
                    e.received = Some(peek_all(&e.sock).map_err(|err| io("peek the receive queue", err))?);
                } else {
                    debug!(bytes = e.taken.len(), end = %e.what, "drained from another node; written back by its sender");
                    refills.push((k.1, k.0, e.taken.clone()));
                    e.received = Some(std::mem::take(&mut e.taken));
                }
            }
        }
        Ok((outq, refills))
    }

    /// Writes back, through the ends this node holds, the bytes taken out of their peers.
    pub fn refill(&self, refills: &[RefillInfo]) -> Result<()> {
        for (local, remote, data) in refills {
            if let Some(e) = self.ends.get(&key(*local, *remote)) {
                refill(&e.sock, data).map_err(|err| {
                    Error::Other(format!(
                        "{}: write back the {} bytes drained from its peer: {err} (the job's connection lost them: restart it from the last checkpoint)",
                        e.what,
                        data.len()
                    ))
                })?;
            }
        }
        Ok(())
    }

    /// What each end (by inode) received, for the capture; empty unless the last round ran.
    pub fn received(&self) -> HashMap<u64, Vec<u8>> {
        self.ends.values().filter_map(|e| e.received.clone().map(|r| (e.ino, r))).collect()
    }

    /// Before a `--kill`: the ends close with a reset rather than a FIN, so that no TIME_WAIT is
    /// left on the ports the restart binds again (as [`super::tcp::silence`] does for the
    /// connections within a node).
    pub fn close_with_reset(&self) {
        let linger = [1i32.to_ne_bytes(), 0i32.to_ne_bytes()].concat();
        for e in self.ends.values() {
            let _ = setopt_bytes(&e.sock, libc::SOL_SOCKET, libc::SO_LINGER, &linger);
        }
    }

    /// Bytes taken out and not given back (an abandoned drain): logged, since the running job
    /// lost them.
    pub fn warn_lost(&self) {
        for e in self.ends.values().filter(|e| !e.taken.is_empty()) {
            warn!("{}: {} bytes drained at an abandoned checkpoint could not be written back: the job's connection lost them", e.what, e.taken.len());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Restore

/// Per-node state of connections rebuilt by reconnecting.
#[derive(Default)]
pub struct ReconnectState {
    /// Every TCP record of the node's image, by inode (the other end of a pair is read here).
    records: HashMap<u64, TcpRecord>,
    /// Listening sockets already restored: their address → (pid in the job, fd).
    listeners: HashMap<Addr, (Tid, i32)>,
    /// An end made with its peer, waiting for its own process: inode → (pid, parked fd).
    waiting: HashMap<u64, (Tid, u64)>,
    /// Sockets the restorer made before any process (connections between nodes, and listeners
    /// of the job they were accepted from), given to their processes when their turn comes.
    ready: HashMap<u64, OwnedFd>,
}

impl ReconnectState {
    /// Remembers every TCP record of the image.
    pub fn collect<'a>(&mut self, all: impl Iterator<Item = &'a FdRecord>) {
        for rec in all {
            if let descriptor::FdKind::Inet(inet::InetRecord::Tcp(t)) = &rec.kind {
                self.records.insert(t.ino, t.clone());
            }
        }
    }

    /// A listening socket of the job now restored at `fd` of `ns_pid`.
    pub fn listener_restored(&mut self, local: Addr, ns_pid: Tid, fd: i32) {
        self.listeners.insert(local, (ns_pid, fd));
    }
}

/// Whether this connection is rebuilt by reconnecting rather than by repair mode.
pub fn takes_this_path(c: &Connection, repair: bool) -> bool {
    !repair || !c.repaired
}

/// A socket of the image made early, with another (the other end of a pair, or a listener that
/// a pair needed), and parked for its process: taken (or unparked) now. None if there is none.
pub fn take_waiting(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, t: &TcpRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<Option<u64>> {
    if let Some(sock) = ctx.inet.reconnect.ready.remove(&t.ino) {
        let fd = descriptor::give(task, &sock, work_base)?;
        inet::set_status_flags(&sock, rec)?;
        if let TcpState::Listening { local, .. } = &t.state {
            ctx.inet.reconnect.listener_restored(*local, ns_pid, rec.fd);
        }
        return Ok(Some(fd));
    }
    let Some((owner, parked)) = ctx.inet.reconnect.waiting.remove(&t.ino) else { return Ok(None) };
    let fd = if owner == ns_pid {
        ctx.unpark(ns_pid, parked);
        parked
    } else {
        descriptor::take_from(task, owner, parked)?
    };
    inet::set_status_flags(&take_into_self(task.pid, fd as i32)?, rec)?;
    if let TcpState::Listening { local, .. } = &t.state {
        // From now on it is at its own number (the parked one is closed).
        ctx.inet.reconnect.listener_restored(*local, ns_pid, rec.fd);
    }
    Ok(Some(fd))
}

/// Opens a TCP connection of the job in the task without repair mode (see the module's doc).
/// Connections waiting in a backlog are not handled here (they connect again at the end as with
/// repair mode).
pub fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, t: &TcpRecord, c: &Connection, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    let what = format!("pid {ns_pid}: fd {}", rec.fd);
    let peer_rec = match c.peer {
        Peer::Job(other) => ctx.inet.reconnect.records.get(&other).cloned(),
        _ => None,
    };
    if let (Some(p), Peer::Job(other)) = (peer_rec, c.peer) {
        if let TcpState::Connected(pc) = &p.state {
            let mut parked = Vec::new();
            let (ours, theirs) = make_pair(task, ns_pid, t, c, &p, pc, work_base, &mut ctx.inet.reconnect, &mut parked)
                .map_err(|e| e.of_object(ns_pid, format!("fd {}: TCP {} -> {} (both ends in the job)", rec.fd, c.local, c.remote)))?;
            for fd in parked.into_iter().chain([theirs]) {
                ctx.park(ns_pid, fd);
            }
            ctx.inet.reconnect.waiting.insert(other, (ns_pid, theirs));
            inet::set_status_flags(&take_into_self(task.pid, ours as i32)?, rec)?;
            return Ok(ours);
        }
    }
    let (fd, s) = inet::new_socket(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
    let in_context = |e: std::io::Error| Error::from(e).of_object(ns_pid, format!("fd {}: TCP {} -> {}", rec.fd, c.local, c.remote));
    let listener = inet::socket_beside(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
    match c.peer {
        Peer::Closed => {
            closed_peer(&s, t, c, listener).map_err(in_context)?;
        }
        _ => {
            if ctx.inet.tcp_established || ctx.inet.on_other_nodes(c) {
                warn!(
                    "{what}: connection {} -> {} comes back reset: it was {} (TCP repair mode, which keeping it needs, is not available to this restart or was not used at the checkpoint)",
                    c.local,
                    c.remote,
                    if c.repaired { "captured in repair mode" } else { "captured without repair mode" }
                );
            }
            reset(&s, t, c, listener).map_err(in_context)?;
        }
    }
    t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(|e| Error::from(e).of_object(ns_pid, format!("fd {}: set socket options", rec.fd)))?;
    inet::set_status_flags(&s, rec)?;
    Ok(fd)
}

/// Whether a listener on `l` takes connections to `at`. Pure.
fn listens_on(l: &Addr, at: &Addr) -> bool {
    let at = at.normalized();
    l.port == at.port() && (l.is_unspecified() || l.normalized().ip() == at.ip())
}

/// Which end of a pair is the server (is accepted): the one on the address of a listener of
/// the job, else the lower port. Pure.
fn first_is_server(a: &Connection, b: &Connection, listening: &[Addr]) -> bool {
    let on_listener = |c: &Connection| listening.iter().any(|l| listens_on(l, &c.local));
    match (on_listener(a), on_listener(b)) {
        (true, false) => true,
        (false, true) => false,
        _ => a.local.port <= b.local.port,
    }
}

/// Both ends of a connection of the job, made in this task: the one for `mine` (returned first)
/// and its peer's; bytes in flight written again, shutdowns made again, options set. A listener
/// of the job it needed and that was not restored yet is made too, and parked (`parked`) for its
/// own process: otherwise the accepted end, on its port, would keep it from binding there.
#[allow(clippy::too_many_arguments)]
fn make_pair(
    task: &mut RemoteTask,
    ns_pid: Tid,
    mine: &TcpRecord,
    mc: &Connection,
    theirs: &TcpRecord,
    tc: &Connection,
    work_base: u64,
    state: &mut ReconnectState,
    parked: &mut Vec<u64>,
) -> Result<(u64, u64)> {
    let image_listeners: Vec<(&TcpRecord, Addr, u32)> = state
        .records
        .values()
        .filter_map(|r| match &r.state {
            TcpState::Listening { local, backlog } => Some((r, *local, *backlog)),
            _ => None,
        })
        .collect();
    let listening: Vec<Addr> = image_listeners.iter().map(|l| l.1).collect();
    let mine_serves = first_is_server(mc, tc, &listening);
    let ((srv, sc), (cli, cc)) = if mine_serves { ((mine, mc), (theirs, tc)) } else { ((theirs, tc), (mine, mc)) };

    // The listening socket, in this task: the job's own if there is one on the server end's
    // address (made now if its process has not come yet), else a temporary one.
    let restored = state.listeners.iter().find(|(l, _)| listens_on(l, &sc.local)).map(|(l, &at)| (*l, at));
    let unrestored = image_listeners
        .iter()
        .find(|(r, l, _)| {
            listens_on(l, &sc.local) && !state.listeners.contains_key(l) && !state.waiting.contains_key(&r.ino) && !state.ready.contains_key(&r.ino)
        })
        .map(|(r, l, b)| ((*r).clone(), *l, *b));
    let (lfd, close_lfd, connect_to) = match (restored, unrestored) {
        (Some((l, (owner, ofd))), _) => {
            let fd = if owner == ns_pid { ofd as u64 } else { descriptor::take_from(task, owner, ofd as u64)? };
            let to = if l.is_unspecified() { sc.local } else { l };
            (fd, owner != ns_pid, to)
        }
        (None, Some((lrec, l, backlog))) => {
            let (fd, s) = inet::new_socket(task, lrec.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
            super::tcp::listen_as_recorded(&s, &lrec, &l, backlog, false).map_err(|e| Error::Other(format!("the job's listener on {l}, made early: {e}")))?;
            parked.push(fd);
            state.waiting.insert(lrec.ino, (ns_pid, fd));
            state.listeners.insert(l, (ns_pid, fd as i32));
            (fd, false, if l.is_unspecified() { sc.local } else { l })
        }
        (None, None) => {
            let (fd, l) = inet::new_socket(task, srv.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
            srv.opts.restore_before_bind(&l, srv.family)?;
            setopt_int(&l, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
            let bound = bind_or_fresh_port(&l, &sc.local).map_err(|e| inet::port_error("bind a temporary listener to", &sc.local, e))?;
            sys::listen(&l, 1).map_err(|e| inet::port_error("listen on", &bound, e))?;
            (fd, true, bound)
        }
    };
    // The client end, connected from the restorer's duplicate.
    let (cfd, cs) = inet::new_socket(task, cli.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
    cli.opts.restore_before_bind(&cs, cli.family)?;
    setopt_int(&cs, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    bind_or_fresh_port(&cs, &cc.local).map_err(|e| inet::port_error("bind the client end to", &cc.local, e))?;
    inet::connect(&cs, &connect_to).map_err(|e| inet::port_error(&format!("connect from {} to", cc.local), &connect_to, e))?;

    // The server end, accepted inside the task.
    let sfd = task.syscall("accept4", libc::SYS_accept4, &[lfd, 0, 0, libc::SOCK_CLOEXEC as u64])?;
    let sfd = descriptor::move_above(task, sfd, work_base)?;
    if close_lfd {
        task.syscall("close", libc::SYS_close, &[lfd])?;
    }
    let ss = take_into_self(task.pid, sfd as i32)?;
    let (got, want) = (inet::peer_addr(&ss)?, inet::local_addr(&cs)?);
    if got.map(|a| a.normalized()) != want.map(|a| a.normalized()) {
        return Err(Error::Other(format!(
            "the listener on {connect_to} accepted a connection from {} instead of the job's own from {}: something outside the job connected to it during the restart; restart again",
            got.map_or("?".into(), |a| a.to_string()),
            want.map_or("?".into(), |a| a.to_string())
        )));
    }
    debug!(server = %sc.local, client = %cc.local, now_client = ?want, "TCP connection of the job made again");

    // Bytes in flight, each direction from its sender: what the receiver had, then what the
    // sender had not had acknowledged (an image taken in repair mode; empty otherwise).
    for (from, to, sender, receiver) in [(&cs, &ss, cc, sc), (&ss, &cs, sc, cc)] {
        let mut data = receiver.recv_queue.0.clone();
        data.extend_from_slice(&sender.send_queue.0);
        if !data.is_empty() {
            make_room(from, to, data.len())?;
            inet::send_all(from, &data, SEND_TIMEOUT)
                .map_err(|e| Error::Other(format!("write again the {} bytes in flight from {} to {}: {e}", data.len(), sender.local, receiver.local)))?;
        }
    }
    for (sock, c, r) in [(&cs, cc, cli), (&ss, sc, srv)] {
        if c.fin_sent {
            shutdown(sock, libc::SHUT_WR);
        }
        if c.shut_rd {
            shutdown(sock, libc::SHUT_RD);
        }
        r.opts.restore(sock).and_then(|_| r.tcp_opts.restore(sock))?;
    }
    Ok(if mine_serves { (sfd, cfd) } else { (cfd, sfd) })
}

/// Buffers large enough for `len` bytes written from `from` to `to` while neither reads (within
/// net.core.[rw]mem_max; the recorded sizes are set after).
fn make_room(from: &OwnedFd, to: &OwnedFd, len: usize) -> std::io::Result<()> {
    let want = (len as i64 + (256 << 10)).min(i32::MAX as i64 / 2) as i32;
    if getopt_int(from, libc::SOL_SOCKET, libc::SO_SNDBUF)? < want {
        setopt_int(from, libc::SOL_SOCKET, libc::SO_SNDBUF, want)?;
    }
    if getopt_int(to, libc::SOL_SOCKET, libc::SO_RCVBUF)? < want {
        setopt_int(to, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    }
    Ok(())
}

/// Binds to `a`, or to a fresh port of its address when the port is taken (an old connection of
/// the job lingering in TIME_WAIT, or another program). Returns the address bound.
fn bind_or_fresh_port(s: &OwnedFd, a: &Addr) -> std::io::Result<Addr> {
    match inet::bind(s, a) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
            debug!(%a, "port taken: a fresh port instead");
            inet::bind(s, &Addr { port: 0, ..*a })?;
        }
        Err(e) => return Err(e),
    }
    let mut at = inet::local_addr(s)?.unwrap_or(*a);
    if at.is_unspecified() {
        at.ip = a.ip;
    }
    Ok(at)
}

/// A listener of the restorer on a fresh port, for the program's socket `s` (already bound or
/// not) to connect to from `local` (its old address, if it is free, so that the program finds
/// it bound where it was); returns the restorer's accepted end.
fn connect_to_stand_in(s: &OwnedFd, t: &TcpRecord, local: Option<&Addr>, listener: OwnedFd) -> std::io::Result<OwnedFd> {
    t.opts.restore_before_bind(s, t.family)?;
    setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let loopback = if t.family == libc::AF_INET6 { IpAddr::V6(Ipv6Addr::LOCALHOST) } else { IpAddr::V4(Ipv4Addr::LOCALHOST) };
    let ip = match local.map(|l| (l, inet::bind(s, l))) {
        Some((l, Ok(()))) if !l.is_unspecified() => l.ip,
        _ => loopback,
    };
    let scope_id = local.map_or(0, |l| l.scope_id);
    let l = listener;
    if t.family == libc::AF_INET6 {
        setopt_int(&l, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
    }
    inet::bind(&l, &Addr { ip, port: 0, flowinfo: 0, scope_id })?;
    sys::listen(&l, 1)?;
    let to = inet::local_addr(&l)?.ok_or_else(|| std::io::Error::other("the stand-in listener has no address"))?;
    inet::connect(s, &to)?;
    sys::accept(&l)
}

/// A connection to a peer outside the job, restored reset: the stand-in's end is closed with
/// SO_LINGER 0, which sends a reset; the program's next call on it fails with ECONNRESET, once
/// it has read the bytes it had received and not read (see [`ended_with_unread`]).
fn reset(s: &OwnedFd, t: &TcpRecord, c: &Connection, listener: OwnedFd) -> std::io::Result<()> {
    if !c.recv_queue.0.is_empty() {
        return ended_with_unread(s, t, Some(&c.local), &c.recv_queue.0, true, listener);
    }
    let a = connect_to_stand_in(s, t, Some(&c.local), listener)?;
    let mut linger = 1i32.to_ne_bytes().to_vec();
    linger.extend_from_slice(&0i32.to_ne_bytes());
    setopt_bytes(&a, libc::SOL_SOCKET, libc::SO_LINGER, &linger)?;
    drop(a);
    Ok(())
}

/// A connection whose peer had closed after sending: the stand-in sends the bytes the program
/// had not read, then its FIN, and closes, as the peer had.
fn closed_peer(s: &OwnedFd, t: &TcpRecord, c: &Connection, listener: OwnedFd) -> std::io::Result<()> {
    let a = connect_to_stand_in(s, t, Some(&c.local), listener)?;
    make_room(&a, s, c.recv_queue.0.len())?;
    inet::send_all(&a, &c.recv_queue.0, SEND_TIMEOUT)?;
    shutdown(&a, libc::SHUT_WR);
    if c.fin_sent {
        shutdown(s, libc::SHUT_WR);
    }
    if c.shut_rd {
        shutdown(s, libc::SHUT_RD);
    }
    // Closed with nothing unread: what it still has to send leaves before its FIN.
    drop(a);
    Ok(())
}

/// A connection that ended (the socket is in CLOSE) with bytes the program had not read, or with
/// a reset it has yet to be told of: the stand-in sends the bytes, and then resets the
/// connection (SO_LINGER 0), or ends it both ways (its FIN, the program's socket's FIN, as the
/// connection had ended). It returns once the program's socket has reached CLOSE, the bytes in
/// its queue, and for a reset the error pending: the program reads the bytes, then the error
/// (ECONNRESET, whatever the error was) or the end of the stream, as it would have.
pub(super) fn ended_with_unread(s: &OwnedFd, t: &TcpRecord, local: Option<&Addr>, unread: &[u8], reset: bool, listener: OwnedFd) -> std::io::Result<()> {
    let a = connect_to_stand_in(s, t, local, listener)?;
    make_room(&a, s, unread.len())?;
    inet::send_all(&a, unread, SEND_TIMEOUT)?;
    wait_for(|| Ok(inet::ioctl_int(s, SIOCINQ)? as usize >= unread.len()), "the bytes to arrive")?;
    if reset {
        setopt_bytes(&a, libc::SOL_SOCKET, libc::SO_LINGER, &[1i32.to_ne_bytes(), 0i32.to_ne_bytes()].concat())?;
        drop(a);
    } else {
        shutdown(&a, libc::SHUT_WR);
        wait_for(|| Ok(inet::poll_one(s, libc::POLLRDHUP, 0)? & libc::POLLRDHUP != 0), "the stand-in's FIN")?;
        shutdown(s, libc::SHUT_WR);
        wait_for(|| Ok(inet::poll_one(&a, libc::POLLRDHUP, 0)? & libc::POLLRDHUP != 0), "the program's socket's FIN")?;
        drop(a);
    }
    wait_for(|| Ok(inet::getopt_bytes(s, libc::SOL_TCP, libc::TCP_INFO, 1)?.first() == Some(&TCP_CLOSE)), "the connection to end")
}

/// TCP_CLOSE in TCP_INFO's state.
const TCP_CLOSE: u8 = 7;

/// Waits (at most SEND_TIMEOUT) until `done` says so.
fn wait_for(mut done: impl FnMut() -> std::io::Result<bool>, what: &str) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    while !done()? {
        if start.elapsed() > SEND_TIMEOUT {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("gave up waiting for {what}")));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Restore across nodes

/// How long the ends of connections between nodes wait for each other at a restart (the other
/// node's restart may start later).
const ACROSS_TIMEOUT: Duration = Duration::from_secs(30);
/// What a connecting end sends first, before any byte of the job: which connection it is (its
/// old address), read by the accepting side, never seen by the program.
const TAG_MAGIC: &[u8; 8] = b"CKPTTCP1";
const TAG_LEN: usize = 8 + 16 + 2;

fn tag(old_local: &Addr) -> [u8; TAG_LEN] {
    let mut t = [0u8; TAG_LEN];
    t[..8].copy_from_slice(TAG_MAGIC);
    let ip = match old_local.normalized().ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    t[8..24].copy_from_slice(&ip.octets());
    t[24..26].copy_from_slice(&old_local.port.to_be_bytes());
    t
}

/// One end, on this node, of a connection to another node of the job, to be made again.
struct Across<'a> {
    rec: &'a TcpRecord,
    c: &'a Connection,
    /// The other end's record, from the other node's image.
    peer: &'a Connection,
    serves: bool,
}

/// Without repair mode, makes again, before any process is restored, the connections between
/// this node and the job's other nodes (`others`: every connection of the other nodes' images,
/// by (local, remote) as seen there; `other_listeners`: their listening addresses). Each pair's
/// server end (the one on a listener of its node, else the lower address; both nodes decide
/// alike) listens at its old address, the job's own listener when it has one (made now, given
/// to its process later); the client end connects to the server end's old address, retrying
/// while the other node's restart has not got there, and sends a tag saying which connection it
/// is. Then each side writes its direction's bytes in flight (the receiver's queue from its
/// record, then the sender's unacknowledged bytes from an image taken in repair mode), FINs and
/// shutdowns, options. The sockets wait in [`ReconnectState`] for their processes.
pub fn connect_across_nodes<'a>(
    state: &mut inet::InetRestoreState,
    fds: impl Iterator<Item = &'a FdRecord>,
    others: &HashMap<(Addr, Addr), Connection>,
    other_listeners: &[Addr],
    exchange: &mut dyn FnMut(Vec<Listening>) -> Result<Vec<Listening>>,
) -> Result<()> {
    let repair = state.repair_across_nodes();
    let records: Vec<&TcpRecord> = fds
        .filter_map(|r| match &r.kind {
            descriptor::FdKind::Inet(inet::InetRecord::Tcp(t)) => Some(t),
            _ => None,
        })
        .collect();
    let my_listeners: Vec<(&TcpRecord, Addr, u32)> = records
        .iter()
        .filter_map(|t| match &t.state {
            TcpState::Listening { local, backlog } => Some((*t, *local, *backlog)),
            _ => None,
        })
        .collect();
    let mut ends: Vec<Across> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for t in &records {
        let TcpState::Connected(c) = &t.state else { continue };
        let Some(peer) = others.get(&(c.remote, c.local)) else { continue };
        if c.peer != Peer::Outside || !takes_this_path(c, repair) || !seen.insert(t.ino) {
            continue;
        }
        let on_mine = my_listeners.iter().any(|(_, l, _)| listens_on(l, &c.local));
        let on_theirs = other_listeners.iter().any(|l| listens_on(l, &peer.local));
        let serves = match (on_mine, on_theirs) {
            (true, false) => true,
            (false, true) => false,
            _ => c.local.normalized() < peer.local.normalized(),
        };
        ends.push(Across { rec: t, c, peer, serves });
    }
    let what = |e: &Across| format!("TCP {} -> {} (to another node of the job)", e.c.local, e.c.remote);

    // 1. Every listener this node's server ends need, before anything waits on the other node.
    let mut listeners: HashMap<Addr, OwnedFd> = HashMap::new();
    for e in ends.iter().filter(|e| e.serves) {
        if listeners.keys().any(|l| listens_on(l, &e.c.local)) {
            continue;
        }
        let l = match my_listeners.iter().find(|(_, l, _)| listens_on(l, &e.c.local)) {
            Some((lrec, at, backlog)) => {
                let s = new_tcp_socket(lrec.family)?;
                super::tcp::listen_as_recorded(&s, lrec, at, *backlog, false)
                    .map_err(|err| Error::Other(format!("{}: the job's listener on {at}: {err}", what(e))))?;
                state.reconnect.ready.insert(lrec.ino, s.try_clone()?);
                (*at, s)
            }
            None => {
                let s = new_tcp_socket(e.rec.family)?;
                setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
                bind_here(&s, &e.c.local).map_err(|err| inet::port_error(&format!("{}: listen again on", what(e)), &e.c.local, err))?;
                sys::listen(&s, 64).map_err(|err| inet::port_error("listen on", &e.c.local, err))?;
                (e.c.local, s)
            }
        };
        listeners.insert(l.0, l.1);
    }

    // Where each server end listens now, told to every node through the coordinator (an end
    // that comes back on another host, or on a fresh port, is found there).
    let mut here: Vec<Listening> = Vec::new();
    for e in ends.iter().filter(|e| e.serves) {
        if let Some((l, s)) = listeners.iter().find(|(l, _)| listens_on(l, &e.c.local)) {
            let mut addr = inet::local_addr(s)?.unwrap_or(*l);
            if addr.is_unspecified() && !e.c.local.is_unspecified() && bindable(&e.c.local) {
                addr.ip = e.c.local.ip;
            }
            here.push((e.c.local.normalized(), e.c.remote.normalized(), addr.normalized()));
        }
    }
    let now: HashMap<(SocketAddr, SocketAddr), SocketAddr> =
        exchange(here)?.into_iter().map(|(s, c, a)| ((inet::normalize(s), inet::normalize(c)), a)).collect();

    // 2. Every client end connects and says which connection it is.
    let mut made: HashMap<u64, OwnedFd> = HashMap::new();
    for e in ends.iter().filter(|e| !e.serves) {
        let s = new_tcp_socket(e.rec.family)?;
        e.rec.opts.restore_before_bind(&s, e.rec.family)?;
        setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        if bindable(&e.c.local) {
            bind_or_fresh_port(&s, &e.c.local).map_err(|err| inet::port_error(&format!("{}: bind", what(e)), &e.c.local, err))?;
        }
        let to = match now.get(&(e.c.remote.normalized(), e.c.local.normalized())) {
            Some(a) => Addr::from_std(*a),
            None => e.c.remote,
        };
        connect_retrying(&s, &to).map_err(|err| Error::Other(format!("{}: connect again to the other node at {to}: {err}", what(e))))?;
        inet::send_all(&s, &tag(&e.c.local), SEND_TIMEOUT).map_err(|err| Error::Other(format!("{}: {err}", what(e))))?;
        made.insert(e.rec.ino, s);
    }

    // 3. Every server end accepts its client, told apart by the tag.
    let mut expected: HashMap<[u8; TAG_LEN], u64> = ends.iter().filter(|e| e.serves).map(|e| (tag(&e.c.remote), e.rec.ino)).collect();
    let start = Instant::now();
    while !expected.is_empty() {
        let mut progress = false;
        for l in listeners.values() {
            let Some(a) = accept_nonblocking(l)? else { continue };
            progress = true;
            match read_tag(&a) {
                Ok(t) => match expected.remove(&t) {
                    Some(ino) => {
                        made.insert(ino, a);
                    }
                    None => warn!("a connection to a listener of the job during the restart is not one of the job's: closed"),
                },
                Err(err) => warn!("a connection to a listener of the job during the restart said nothing ckpt knows ({err}): closed"),
            }
        }
        if start.elapsed() > ACROSS_TIMEOUT {
            let missing: Vec<String> = ends.iter().filter(|e| expected.values().any(|i| *i == e.rec.ino)).map(what).collect();
            return Err(Error::Other(format!(
                "{}: the other node did not connect again within {} s (is its restart running, at the same address?)",
                missing.join(", "),
                ACROSS_TIMEOUT.as_secs()
            )));
        }
        if !progress {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // 4. Bytes in flight, each direction from its sender; FINs, shutdowns, options.
    for e in &ends {
        let s = &made[&e.rec.ino];
        let mut data = e.peer.recv_queue.0.clone();
        data.extend_from_slice(&e.c.send_queue.0[unique_sent(e.c, e.peer)?..]);
        if !data.is_empty() {
            let want = (data.len() as i64 + (256 << 10)).min(i32::MAX as i64 / 2) as i32;
            if getopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF)? < want {
                setopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF, want)?;
            }
            inet::send_all(s, &data, SEND_TIMEOUT)
                .map_err(|err| Error::Other(format!("{}: write again the {} bytes in flight: {err}", what(e), data.len())))?;
        }
        if e.c.fin_sent {
            shutdown(s, libc::SHUT_WR);
        }
        if e.c.shut_rd {
            shutdown(s, libc::SHUT_RD);
        }
        e.rec.opts.restore(s).and_then(|_| e.rec.tcp_opts.restore(s)).map_err(|err| Error::Other(format!("{}: set socket options: {err}", what(e))))?;
    }
    for e in &ends {
        debug!(conn = %what(e), serves = e.serves, "made again across nodes");
    }
    state.reconnect.ready.extend(made);
    Ok(())
}

/// Where the bytes of `c`'s send queue that its peer has not received begin. Captured without
/// repair mode, the drain took them all to the peer's receive queue: none is in both. Captured
/// in repair mode (root, and the part restarts elsewhere), the send queue holds what the peer
/// has not acknowledged, some of which it may have received: the sequence numbers tell.
fn unique_sent(c: &Connection, peer: &Connection) -> Result<usize> {
    if !(c.repaired && peer.repaired) {
        return Ok(0);
    }
    let peer_end = peer.recv_seq.wrapping_add(peer.recv_queue.0.len() as u32);
    super::tcp::already_received(c.send_seq, c.send_queue.0.len(), peer_end).ok_or_else(|| {
        Error::Other(format!(
            "TCP {} -> {}: the two ends' records disagree (send queue from sequence number {} for {} bytes, the peer's receive queue ends at {}): the generation's parts are not of one checkpoint",
            c.local,
            c.remote,
            c.send_seq,
            c.send_queue.0.len(),
            peer_end
        ))
    })
}

/// Where a part restored on another host finds itself: whether `a`'s address is one of this
/// host's (its port aside).
pub fn bindable(a: &Addr) -> bool {
    if a.is_unspecified() {
        return true;
    }
    let Ok(s) = new_tcp_socket(if a.ip.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 }) else { return false };
    inet::bind(&s, &Addr { port: 0, ..*a }).is_ok()
}

/// Binds a listener to its old address, else (that address is not on this host: the part came
/// back elsewhere) to the same port on every address, else to a fresh port.
fn bind_here(s: &OwnedFd, a: &Addr) -> std::io::Result<()> {
    match inet::bind(s, a) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
            let any = Addr { ip: if a.ip.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) }, ..*a };
            bind_or_fresh_port(s, &any).map(|_| ())
        }
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => bind_or_fresh_port(s, a).map(|_| ()),
        r => r,
    }
}

/// Connects, retrying while nothing listens there yet (the other node's restart is behind).
fn connect_retrying(s: &OwnedFd, to: &Addr) -> std::io::Result<()> {
    let start = Instant::now();
    loop {
        match inet::connect(s, to) {
            Ok(()) => return Ok(()),
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED) | Some(libc::ETIMEDOUT) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH))
                    && start.elapsed() < ACROSS_TIMEOUT =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
}

/// A connection waiting on the listener, if any.
fn accept_nonblocking(l: &OwnedFd) -> Result<Option<OwnedFd>> {
    if inet::poll_one(l, libc::POLLIN, 0)? & libc::POLLIN == 0 {
        return Ok(None);
    }
    match sys::accept(l) {
        Ok(a) => Ok(Some(a)),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads the tag a connecting end sends first (waiting a little for it).
fn read_tag(s: &OwnedFd) -> std::io::Result<[u8; TAG_LEN]> {
    let mut t = [0u8; TAG_LEN];
    let mut got = 0;
    let start = Instant::now();
    while got < TAG_LEN {
        if inet::poll_one(s, libc::POLLIN, 1000)? & libc::POLLIN == 0 {
            if start.elapsed() > Duration::from_secs(5) {
                return Err(std::io::Error::other("no tag"));
            }
            continue;
        }
        match sys::recv(s, &mut t[got..], libc::MSG_DONTWAIT)? {
            0 => return Err(std::io::Error::other("closed before its tag")),
            n => got += n,
        }
    }
    if &t[..8] != TAG_MAGIC {
        return Err(std::io::Error::other("not a tag"));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(local: &str) -> Connection {
        Connection {
            local: Addr::from_std(local.parse().unwrap()),
            remote: Addr::from_std("127.0.0.1:1".parse().unwrap()),
            peer: Peer::Job(1),
            kstate: 1,
            fin_sent: false,
            fin_received: false,
            shut_rd: false,
            send_seq: 0,
            send_queue: Default::default(),
            unsent: 0,
            recv_seq: 0,
            recv_queue: Default::default(),
            mss: 0,
            wscale: None,
            sack: false,
            timestamp: None,
            window: None,
            repaired: false,
        }
    }

    #[test]
    fn bytes_both_ends_hold_are_written_again_once() {
        // Captured in repair mode on two nodes: the sender's unacknowledged "hello world" from
        // sequence number 4_294_967_290 (it wraps), of which the receiver holds "hello".
        let mut sender = conn("10.0.0.1:5000");
        let mut receiver = conn("10.0.0.2:40000");
        (sender.repaired, receiver.repaired) = (true, true);
        sender.send_seq = u32::MAX - 5;
        sender.send_queue = inet::Bytes(b"hello world".to_vec());
        receiver.recv_seq = u32::MAX - 5;
        receiver.recv_queue = inet::Bytes(b"hello".to_vec());
        assert_eq!(unique_sent(&sender, &receiver).unwrap(), 5);
        // Without repair mode the drain moved everything to the receiver: nothing is cut.
        sender.repaired = false;
        assert_eq!(unique_sent(&sender, &receiver).unwrap(), 0);
        // A receiver ahead of what the sender ever sent: not one checkpoint's parts.
        sender.repaired = true;
        receiver.recv_queue = inet::Bytes(vec![0; 20]);
        assert!(unique_sent(&sender, &receiver).is_err());
    }

    #[test]
    fn the_end_on_a_listener_is_the_server() {
        let server = conn("127.0.0.1:5000");
        let client = conn("127.0.0.1:40000");
        let any = Addr::from_std("0.0.0.0:5000".parse().unwrap());
        assert!(listens_on(&any, &server.local) && !listens_on(&any, &client.local));
        assert!(first_is_server(&server, &client, &[any]));
        assert!(!first_is_server(&client, &server, &[any]));
        // A listener on another address does not count.
        let other = Addr::from_std("10.0.0.1:5000".parse().unwrap());
        assert!(!first_is_server(&client, &server, &[other]));
        // No listener: the lower port.
        let high = conn("127.0.0.1:50000");
        assert!(first_is_server(&client, &high, &[]));
        assert!(!first_is_server(&high, &client, &[]));
    }

    #[test]
    fn drain_keeps_the_bytes_in_flight_and_leaves_them_in_place() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut a, _) = l.accept().unwrap();
        // A small receive buffer and more than it holds in flight: the send queue is stuck.
        setopt_int(&a.as_fd().try_clone_to_owned().unwrap(), libc::SOL_SOCKET, libc::SO_RCVBUF, 48 * 1024).unwrap();
        c.set_nonblocking(true).unwrap();
        let data: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        let t0 = Instant::now();
        while sent < data.len() && t0.elapsed() < Duration::from_secs(2) {
            match c.write(&data[sent..]) {
                Ok(n) => sent += n,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        let (cs, asock) = (c.as_fd().try_clone_to_owned().unwrap(), a.as_fd().try_clone_to_owned().unwrap());
        let ends = [
            End { pid: 1, sock: &cs, ino: 1, peer: Peer::Job(2), fin_sent: false, what: "client".into() },
            End { pid: 1, sock: &asock, ino: 2, peer: Peer::Job(1), fin_sent: false, what: "server".into() },
        ];
        let drained = drain(&ends).unwrap();
        assert_eq!(drained[&2], data[..sent].to_vec(), "every byte sent is drained, in order");
        assert!(drained[&1].is_empty());
        // The connection still carries them, once.
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; sent];
        a.read_exact(&mut got).unwrap();
        assert_eq!(got, data[..sent]);
        a.set_nonblocking(true).unwrap();
        assert!(a.read(&mut [0u8; 1]).is_err(), "nothing twice");
    }

    #[test]
    fn a_reset_connection_says_so_to_the_program() {
        use std::io::Read;
        use std::os::fd::AsFd;
        let s = new_tcp_socket(libc::AF_INET).unwrap();
        let t = TcpRecord {
            ino: 1,
            family: libc::AF_INET,
            state: TcpState::Closed { local: None, shut: false, unread: inet::Bytes::default(), reset: false },
            opts: Default::default(),
            tcp_opts: Default::default(),
        };
        let mut c = conn("127.0.0.1:0");
        c.peer = Peer::Outside;
        reset(&s, &t, &c, new_tcp_socket(libc::AF_INET).unwrap()).unwrap();
        let mut stream = std::net::TcpStream::from(s);
        let e = stream.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET));
        let _ = stream.as_fd();
    }
}
