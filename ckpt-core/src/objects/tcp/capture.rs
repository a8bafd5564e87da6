//! Capture of the job's TCP sockets (the module comment of `tcp` tells how): listing them through
//! inet_diag in each of the job's network namespaces, telling where the other end of each
//! connection is (`classify_peer`), reading every connection together in repair mode or draining
//! it without (`capture_all`), the send queues read before any receive queue of a job spread over
//! nodes (`snapshot_send_queues`), the connections to outside the node (`outside_connections`)
//! and sockets that hold no connection (`capture_closed`).

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::time::Duration;

use tracing::{debug, warn};

use super::repair::{io_err, open_to_peer, read_params, read_recv, read_send, right_edge, RepairGuard, Snapshot};
use super::{
    fin_received, fin_sent, is_connected, Connection, Peer, TcpOpts, TcpRecord, TcpState, CLOSE_WAIT, ESTABLISHED, LISTEN, SYN_RECV, SYN_SENT, TCPI_OPT_SACK,
    TCPI_OPT_WSCALE,
};
use crate::error::{Error, Result};
use crate::objects::descriptor::take_into_self;
use crate::objects::descriptor::{CaptureCtx, Listing};
use crate::objects::inet::{self, getopt_bytes, getopt_int, Addr, Bytes, SockOpts};
use crate::objects::net_namespaces::JobNetworks;
use crate::objects::tcp_reconnect;
use crate::ptrace::Tid;
use crate::sockdiag::{self, InetDiag};
use crate::sys::socket as sys;

fn unsupported(pid: Tid, fd: i32, what: String) -> Error {
    Error::Unsupported { pid, what: format!("fd {fd} ({what})") }
}

/// A connection caught in a state the job leaves by itself in a moment (being established,
/// waiting in its listener's backlog): the coordinator lets the job go and tries again.
fn passing(pid: Tid, fd: i32, what: String) -> Error {
    Error::Passing { pid, what: format!("fd {fd} ({what})") }
}

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
            read_send(&h.sock, fin_sent(state), &mut snap).map_err(|e| io_err(format!("pid {}: fd {}: read the send queue", h.pid, h.fd), e))?;
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
    capture_closed(pid, fd, ino, &s)
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
    let unread = Bytes(tcp_reconnect::peek_all(s).map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}: read what a closed TCP connection holds")))?);
    let state = TcpState::Closed { local: inet::local_addr(s)?, shut: revents & libc::POLLRDHUP != 0, unread, reset: revents & libc::POLLERR != 0 };
    record(s, ino, family, state, reuse_addr(s)?)
}

/// The record of socket `s` in `state`, with its options as they are now; `reuse` is its
/// SO_REUSEADDR as the job set it (repair mode sets it while on: see [`reuse_addr`]).
fn record(s: &OwnedFd, ino: u64, family: i32, state: TcpState, reuse: bool) -> Result<TcpRecord> {
    Ok(TcpRecord { ino, family, state, opts: SockOpts::capture(s, family, libc::SOCK_STREAM, libc::IPPROTO_TCP, reuse)?, tcp_opts: TcpOpts::capture(s)? })
}

/// SO_REUSEADDR of a socket not in repair mode (a socket that was is read where it enters it).
fn reuse_addr(s: &OwnedFd) -> Result<bool> {
    Ok(getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0)
}

/// A socket of the job as capture sees it.
pub(in crate::objects) struct Held {
    pub(in crate::objects) pid: Tid,
    pub(in crate::objects) fd: i32,
    pub(in crate::objects) ino: u64,
    pub(in crate::objects) diag: InetDiag,
    pub(in crate::objects) sock: OwnedFd,
}

/// The connections of the frozen processes `pids` whose other end no process of this node
/// holds (on another node of the job, or outside it). Only the node's own network namespace
/// has them: one the job made holds only its loopback.
pub(in crate::objects) fn outside_connections(pids: &[Tid]) -> Result<Vec<Held>> {
    let listing = Listing::of(pids)?;
    let job_sockets = listing.socket_inodes();
    let diag = all_tcp(&JobNetworks::here()?)?;
    let mut held = held_sockets(&listing, &diag)?;
    held.retain(|h| is_connected(h.diag.state) && classify_peer(&h.diag, &diag, &job_sockets).0 == Peer::Outside);
    Ok(held)
}

/// Whether a connection in kernel state `state` has sent its FIN.
pub(in crate::objects) fn has_sent_fin(state: u8) -> bool {
    fin_sent(state)
}

/// Every TCP socket of the network namespaces `networks`, IPv4 and IPv6, each tagged with its
/// namespace's index.
pub(super) fn all_tcp(networks: &JobNetworks) -> Result<Vec<InetDiag>> {
    let mut all = Vec::new();
    for (netns, via) in networks.diag_sockets() {
        for family in [libc::AF_INET, libc::AF_INET6] {
            all.extend(sockdiag::inet_sockets(via, family as u8, libc::IPPROTO_TCP as u8)?.into_iter().map(|d| InetDiag { netns, ..d }));
        }
    }
    Ok(all)
}

/// The job's TCP sockets that inet_diag lists, each once, with a duplicate of one descriptor.
pub(super) fn held_sockets(listing: &Listing, diag: &[InetDiag]) -> Result<Vec<Held>> {
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
pub(super) fn classify_peer(conn: &InetDiag, all: &[InetDiag], job_sockets: &HashSet<u64>) -> (Peer, Option<InetDiag>) {
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
    let mut out: HashSet<std::net::IpAddr> =
        sys::interface_addresses().unwrap_or_default().iter().filter_map(|raw| Addr::from_sockaddr(raw)).map(|a| a.ip).collect();
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

fn capture_all_once(
    listing: &Listing,
    job_sockets: &HashSet<u64>,
    networks: &JobNetworks,
    early: &EarlySends,
    repair_mode: bool,
) -> Result<Option<HashMap<u64, TcpRecord>>> {
    let diag = all_tcp(networks)?;
    let held = held_sockets(listing, &diag)?;
    if !repair_mode {
        let_ports_be_bound_beside_their_ends(&held);
    }
    let mut out = HashMap::new();
    let mut conns: Vec<(&Held, Peer)> = Vec::new();
    for h in &held {
        let what = || format!("socket:[{}], TCP {} -> {}", h.ino, h.diag.local, h.diag.remote);
        match h.diag.state {
            LISTEN => {
                out.insert(h.ino, capture_listener(h)?);
            }
            SYN_SENT => {
                let family = getopt_int(&h.sock, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
                let state = TcpState::Connecting { local: Addr::from_std(h.diag.local), remote: Addr::from_std(h.diag.remote) };
                out.insert(h.ino, record(&h.sock, h.ino, family, state, reuse_addr(&h.sock)?)?);
            }
            SYN_RECV => {
                return Err(passing(h.pid, h.fd, format!("{}, a connection being established", what())));
            }
            s if is_connected(s) => {
                let (peer, other) = classify_peer(&h.diag, &diag, job_sockets);
                if peer == Peer::Backlog {
                    let waiting = other.expect("a backlog peer is listed");
                    if waiting.rqueue > 0 {
                        return Err(passing(
                            h.pid,
                            h.fd,
                            format!("{}, a connection not accepted yet by the job's listener, which already holds {} bytes sent on it", what(), waiting.rqueue),
                        ));
                    }
                    if h.diag.rqueue > 0 || fin_received(s) {
                        return Err(unsupported(h.pid, h.fd, format!("{}, a connection not accepted yet that received data", what())));
                    }
                }
                conns.push((h, peer));
            }
            _ => {
                out.insert(h.ino, capture_closed(h.pid, h.fd, h.ino, &h.sock)?);
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
        read_send(&h.sock, fin_sent(snap.state), snap).map_err(|e| io_err(format!("pid {}: fd {}: read the send queue", h.pid, h.fd), e))?;
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
        read_recv(&h.sock, fin_received(snap.state), snap).map_err(|e| io_err(format!("pid {}: fd {}: read the receive queue", h.pid, h.fd), e))?;
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
    let recv_end: HashMap<u64, u32> = conns.iter().zip(&snaps).map(|((h, _), s)| (h.ino, s.recv_seq.wrapping_add(s.recv.len() as u32))).collect();
    for ((h, peer), snap) in conns.iter().zip(snaps.iter_mut()) {
        if let Peer::Job(other) = peer {
            let Some(&end) = recv_end.get(other) else { continue };
            let Some(have) = already_received(snap.send_seq, snap.send.len(), end) else {
                debug!(ino = h.ino, "the two ends of a connection of the job disagree; again");
                return Ok(None);
            };
            snap.drop_received(have);
        }
    }
    // Each end's send window from its peer's receive window (see `send_window_to`).
    let right_edges: HashMap<u64, u32> = conns.iter().zip(&snaps).filter_map(|((h, _), s)| Some((h.ino, right_edge(s.window.as_ref()?)))).collect();
    for ((_, peer), snap) in conns.iter().zip(snaps.iter_mut()) {
        let Peer::Job(other) = peer else { continue };
        let (Some(&edge), send_seq) = (right_edges.get(other), snap.send_seq) else { continue };
        if let Some(w) = &mut snap.window {
            open_to_peer(w, edge, send_seq);
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
        out.insert(h.ino, record(&h.sock, h.ino, family, TcpState::Connected(Box::new(conn)), reuseaddr)?);
    }
    Ok(Some(out))
}

/// Without repair mode: SO_REUSEADDR on every TCP socket of the job, before its record is taken
/// (so the record keeps it, and the restarted job's sockets have it too): a crash after this
/// checkpoint leaves nothing an ordinary user's restart must wait for (see [`super::reuse`]).
fn let_ports_be_bound_beside_their_ends(held: &[Held]) {
    for h in held {
        super::reuse::let_bind_beside(&h.sock, h.pid, h.fd);
    }
}

/// A peer on this machine that no process holds any more, whose FIN arrived: closed. In a
/// network namespace the job made (one of its own, `unshare --net`), a peer on its loopback
/// or its own address.
fn mark_closed_peers(conns: &mut [(&Held, Peer)], states: &[u8], diag: &[InetDiag]) {
    let local_ips = local_addresses();
    for ((h, peer), &state) in conns.iter_mut().zip(states) {
        let remote = inet::normalize(h.diag.remote).ip();
        let on_this_machine = match h.diag.netns {
            0 => local_ips.contains(&remote),
            _ => remote.is_loopback() || remote == inet::normalize(h.diag.local).ip(),
        };
        if *peer == Peer::Outside && fin_received(state) && peer_gone(&h.diag, diag) && on_this_machine {
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
            pid: h.pid,
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
        let reuse = reuse_addr(&h.sock)?;
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
        out.insert(h.ino, record(&h.sock, h.ino, family, TcpState::Connected(Box::new(conn)), reuse)?);
    }
    Ok(Some(out))
}

/// How many bytes at the head of a send queue (`len` bytes from sequence number `send_seq`) the
/// peer, whose receive queue ends at `peer_end`, already has; None if the two cannot be the two
/// ends of one connection (a gap, or bytes never sent). Pure.
pub(in crate::objects) fn already_received(send_seq: u32, len: usize, peer_end: u32) -> Option<usize> {
    let have = peer_end.wrapping_sub(send_seq) as i32;
    (have >= 0 && have as usize <= len).then_some(have as usize)
}

fn capture_listener(h: &Held) -> Result<TcpRecord> {
    let state = TcpState::Listening { local: inet::local_addr(&h.sock)?.unwrap_or(Addr::from_std(h.diag.local)), backlog: h.diag.wqueue };
    record(&h.sock, h.ino, h.diag.family as i32, state, reuse_addr(&h.sock)?)
}

/// (state, options, window scales) from TCP_INFO.
fn tcp_info(s: &OwnedFd) -> Result<(u8, u8, u8)> {
    let b = getopt_bytes(s, libc::SOL_TCP, libc::TCP_INFO, 8)?;
    if b.len() < 7 {
        return Err(Error::Other("TCP_INFO: short answer".into()));
    }
    Ok((b[0], b[5], b[6]))
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
}
