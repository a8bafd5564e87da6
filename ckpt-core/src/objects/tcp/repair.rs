//! TCP repair mode (TCP_REPAIR; root only): `RepairGuard`, which puts the job's connections in it
//! at capture and takes them out as they were; reading a connection's queues, sequence numbers,
//! window and options in it (`read_send`, `read_recv`, `read_params`) and writing them back at
//! restore (`connect_repaired`, `restore_repaired`, `set_repair_options`); and what is done to the
//! job's connections before it is killed (`lock_outside`, `silence`, `reset_at_recovery_kill`).

use std::collections::HashSet;
use std::os::fd::OwnedFd;

use tracing::{info, warn};

use super::capture::{all_tcp, classify_peer, held_sockets, outside_connections, Held};
use super::lock::NetworkLock;
use super::{
    is_connected, Connection, Peer, TcpRecord, Window, NO_QUEUE, RECV_QUEUE, REPAIR_OFF_NO_WP, REPAIR_ON, SEND_QUEUE, SIOCINQ, SIOCOUTQ, SIOCOUTQNSD,
    TCPI_OPT_TIMESTAMPS, TCPOPT_MAXSEG, TCPOPT_SACK_PERM, TCPOPT_TIMESTAMP, TCPOPT_WINDOW, TCP_QUEUE_SEQ, TCP_REPAIR, TCP_REPAIR_OPTIONS, TCP_REPAIR_QUEUE,
    TCP_REPAIR_WINDOW, TCP_TIMESTAMP,
};
use crate::error::{Error, Result};
use crate::objects::descriptor::{take_into_self, Listing};
use crate::objects::inet::{self, getopt_bytes, getopt_int, setopt_bytes, setopt_int, Addr};
use crate::objects::net_namespaces::JobNetworks;
use crate::objects::tcp_reconnect;
use crate::ptrace::Tid;
use crate::sys::socket as sys;

pub(super) fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::EPERM) {
        return Error::Other(format!("{what}: {e} (TCP repair mode needs root: CAP_NET_ADMIN in the job's network namespace)"));
    }
    Error::Other(format!("{what}: {e}"))
}

/// Connections of the job in repair mode, with what repair mode changes on them; put back as they
/// were by [`RepairGuard::leave`], or on drop if capture fails half-way.
#[derive(Default)]
pub(super) struct RepairGuard {
    /// Duplicate, SO_REUSEADDR, SO_PEEK_OFF before.
    socks: Vec<(OwnedFd, i32, i32)>,
}

impl RepairGuard {
    pub(super) fn enter(&mut self, h: &Held) -> std::io::Result<()> {
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
    pub(super) fn leave(&mut self) -> Result<Vec<bool>> {
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

/// What repair mode reads from one connection.
#[derive(Default, Clone)]
pub(super) struct Snapshot {
    pub(super) send_seq: u32,
    pub(super) send: Vec<u8>,
    pub(super) unsent: u32,
    pub(super) recv_seq: u32,
    pub(super) recv: Vec<u8>,
    pub(super) state: u8,
    pub(super) options: u8,
    pub(super) wscale: u8,
    pub(super) mss: u32,
    pub(super) timestamp: Option<u32>,
    pub(super) window: Option<Window>,
}

impl Snapshot {
    /// Cuts the first `have` bytes of the send queue, which the peer (an end of the job, read
    /// in the same freeze) has received: its acknowledgement had not come back.
    pub(super) fn drop_received(&mut self, have: usize) {
        self.send.drain(..have);
        self.send_seq = self.send_seq.wrapping_add(have as u32);
        self.unsent = self.unsent.min(self.send.len() as u32);
    }
}

/// Where a receive window ends: the last sequence number the peer may send, plus one. The
/// kernel never moves it back (it does not shrink an offered window).
pub(super) fn right_edge(w: &Window) -> u32 {
    w.rcv_wup.wrapping_add(w.rcv_wnd)
}

/// The send window of an end whose peer is in the job, from the peer's own receive window:
/// from the end's first byte not acknowledged (`send_seq`, after the cut of what the peer has)
/// to the peer's right edge, none where that edge is behind it. Both ends are read one after
/// the other while the kernel goes on acknowledging between them (the job is frozen, not its
/// connections), so the end's own view can be newer than the peer's record; taken so, a
/// restored sender could send beyond the window its peer came back with, and the peer would
/// drop those bytes and every acknowledgement after them where its buffer is full (read from
/// the kernel's checks, not seen alone: the stalls of zdtm's socket-tcpbuf went on with this
/// change until the segment size's, `connect_mss`). Pure.
pub(super) fn send_window_to(peer_right_edge: u32, send_seq: u32) -> u32 {
    (peer_right_edge.wrapping_sub(send_seq) as i32).max(0) as u32
}

/// Sets the send window of `w` (an end whose first unacknowledged byte is `send_seq`) from its
/// peer's right edge ([`send_window_to`]), and the largest window it saw to at least that (the
/// kernel refuses a window larger than the largest one seen: EINVAL; it is larger where the
/// peer offered more than this end had heard of, as when its peer closed: zdtm's
/// socket-tcp-close-wait and the other half-closed states). Pure.
pub(super) fn open_to_peer(w: &mut Window, peer_right_edge: u32, send_seq: u32) {
    w.snd_wnd = send_window_to(peer_right_edge, send_seq);
    w.max_window = w.max_window.max(w.snd_wnd);
}

/// The receive window to restore for a connection whose receive queue ends at `rcv_end`: as
/// read, but starting no later than that end. Read after the queue, the window may have moved
/// on with bytes that arrived between the two reads (and are in the peer's send queue, sent
/// again); the kernel refuses a window starting after the queue's end (EINVAL). Its right edge
/// stays where it was offered. Pure.
fn receive_window(rcv_wup: u32, rcv_wnd: u32, rcv_end: u32) -> (u32, u32) {
    if (rcv_wup.wrapping_sub(rcv_end) as i32) > 0 {
        (rcv_end, rcv_wup.wrapping_add(rcv_wnd).wrapping_sub(rcv_end))
    } else {
        (rcv_wup, rcv_wnd)
    }
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
pub(super) fn read_send(s: &OwnedFd, fin_sent: bool, snap: &mut Snapshot) -> std::io::Result<()> {
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
pub(super) fn read_recv(s: &OwnedFd, fin_received: bool, snap: &mut Snapshot) -> std::io::Result<()> {
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

pub(super) fn read_params(s: &OwnedFd, snap: &mut Snapshot) -> std::io::Result<()> {
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

pub(super) fn set_queue_seq(s: &OwnedFd, queue: i32, seq: u32) -> std::io::Result<()> {
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, queue)?;
    setopt_int(s, libc::SOL_TCP, TCP_QUEUE_SEQ, seq as i32)
}

/// Bound, connected and in ESTABLISHED state, in repair mode, with the sequence numbers of the
/// record's queues. A FIN received is not part of it (it is sent again by the peer's owner).
pub(super) fn connect_repaired(s: &OwnedFd, t: &TcpRecord, c: &Connection) -> Result<()> {
    t.opts.restore_before_bind(s, t.family)?;
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR, REPAIR_ON).map_err(|e| io_err("TCP repair mode", e))?;
    t.opts.make_room(s, c.recv_queue.0.len(), c.send_queue.0.len())?;
    set_queue_seq(s, RECV_QUEUE, c.recv_seq)?;
    set_queue_seq(s, SEND_QUEUE, c.send_seq)?;
    setopt_int(s, libc::SOL_TCP, TCP_REPAIR_QUEUE, NO_QUEUE)?;
    inet::bind(s, &c.local).map_err(|e| inet::port_error("bind to", &c.local, e))?;
    // The segment size is fixed at the connect, from the MSS clamp then (the default, 536: TCP_REPAIR_OPTIONS
    // sets the connection's own only after it), and nothing later computes it again but a
    // change of the path's MTU: the restored connection sent 524-byte segments for good (on
    // loopback, where they were 64 KiB, a hundred times the segments, and the receive buffers'
    // accounting overhead with them). A user MSS set before the connect is the clamp then;
    // it is cleared after, as the program had none (the kernel takes at most 32,767).
    let user_mss = connect_mss(c.mss);
    if user_mss != 0 {
        setopt_int(s, libc::SOL_TCP, libc::TCP_MAXSEG, user_mss).map_err(|e| io_err("TCP_MAXSEG", e))?;
    }
    connect_over_lingering(s, &c.local, &c.remote)?;
    if user_mss != 0 {
        setopt_int(s, libc::SOL_TCP, libc::TCP_MAXSEG, 0).map_err(|e| io_err("TCP_MAXSEG", e))?;
    }
    Ok(())
}

/// The user MSS to connect with for a connection whose MSS clamp was `mss`: the clamp, within
/// what TCP_MAXSEG takes (88 to 32,767); 0 (none) for a clamp below that. Pure.
fn connect_mss(mss: u32) -> i32 {
    const TCP_MIN_MSS: u32 = 88;
    const MAX_TCP_WINDOW: u32 = 32767;
    if mss < TCP_MIN_MSS {
        0
    } else {
        mss.min(MAX_TCP_WINDOW) as i32
    }
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

/// A connection rebuilt in repair mode, its receive queue in place; [`finish`](super::finish) ends the repair.
pub(super) fn restore_repaired(s: &OwnedFd, t: &TcpRecord, c: &Connection) -> Result<()> {
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
        let rcv_end = c.recv_seq.wrapping_add(data.len() as u32);
        let (rcv_wup, rcv_wnd) = receive_window(rcv_wup, rcv_wnd, rcv_end);
        let snd_wl1 = window_update_seq(w.snd_wl1, rcv_end);
        let mut b = Vec::new();
        for v in [snd_wl1, w.snd_wnd, w.max_window, rcv_wnd, rcv_wup] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        setopt_bytes(s, libc::SOL_TCP, TCP_REPAIR_WINDOW, &b).map_err(|e| {
            io_err(format!("TCP_REPAIR_WINDOW (snd_wl1 {snd_wl1}, rcv_wup {rcv_wup}, rcv_wnd {rcv_wnd}, receive queue ending at {rcv_end})"), e)
        })?;
        tracing::debug!(local = %c.local, remote = %c.remote, send_seq = c.send_seq, send_len = c.send_queue.0.len(), rcv_end, rcv_wup, rcv_wnd, snd_wl1, snd_wnd = w.snd_wnd, "TCP connection repaired");
    }
    Ok(())
}

/// Gives a repaired connection, its receive queue back in place, the receive buffer the program
/// had, or as much as the restored queue takes where that is more (the kernel counts each
/// restored segment's overhead anew), before any byte is sent to it; returns the size set.
/// The queues were put back in a larger buffer (`SockOpts::make_room`); left so while the peers
/// send again, the connection took in more than the program's buffer holds, and when the
/// program's size came back, its memory was over the buffer. Since Linux 6.17 ("tcp: stronger
/// sk_rcvbuf checks") the kernel then takes back part of the window it offered, and drops the
/// peer's segments and acknowledgements beyond it; the peer, which sent up to the old edge,
/// keeps retransmitting what the other end already has, answered by acknowledgements that are
/// dropped: a connection stalled for good (seen once in zdtm's socket-tcpbuf, 10.7 MB queued in
/// an 8 MiB buffer, both ends with full buffers). Kernels that accept acknowledgements within the largest window
/// offered (RFC 7323's rule, in net-next since March 2026) do not stall so; the buffer is the
/// program's all the same.
pub(super) fn fit_receive_buffer(s: &OwnedFd, program_rcvbuf: i32) -> std::io::Result<i32> {
    let meminfo = getopt_bytes(s, libc::SOL_SOCKET, libc::SO_MEMINFO, 4 * 9)?;
    // SK_MEMINFO_RMEM_ALLOC is the first of the u32 counters.
    let rmem = meminfo.get(..4).map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap()));
    let size = receive_buffer_for(program_rcvbuf, rmem);
    inet::set_buffer(s, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, size)?;
    Ok(size)
}

/// The receive buffer for a restored queue taking `rmem` bytes of memory: the program's, or the
/// queue's where more. Pure.
fn receive_buffer_for(program_rcvbuf: i32, rmem: u32) -> i32 {
    program_rcvbuf.max(rmem.min(i32::MAX as u32 / 2) as i32)
}

/// The sequence number of the peer's segment that last updated our view of its window
/// (`snd_wl1`) for a connection whose receive queue ends at `rcv_end`: as captured, but never
/// beyond that end. A segment whose window was taken and whose bytes were dropped (the receive
/// buffer full, as a program that does not read keeps it) leaves `snd_wl1` ahead of the bytes
/// received (seen in an image of zdtm's socket-tcpbuf: 392,898 bytes ahead); the peer sends
/// those bytes again from `rcv_end`, and the kernel takes a window update only from a segment
/// at or after `snd_wl1`, and refuses (EINVAL) a `snd_wl1` beyond `rcv_end` plus the receive
/// window. Pure.
fn window_update_seq(snd_wl1: u32, rcv_end: u32) -> u32 {
    if (snd_wl1.wrapping_sub(rcv_end) as i32) > 0 {
        rcv_end
    } else {
        snd_wl1
    }
}

/// The options a connection negotiated (SACK, window scales as (send, receive), timestamps,
/// MSS), set on a socket in repair mode.
pub(super) fn set_repair_options(s: &OwnedFd, c: &Connection, wscale: Option<(u8, u8)>) -> Result<()> {
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

/// For a job to be killed after its checkpoint with `--tcp-established`, before its receive
/// queues are read: locks its connections to peers outside the node (see [`super::lock`]).
/// Without repair mode they are not kept, and nothing is locked; where the lock cannot be taken
/// (no `nft`), a peer's packet arriving while the job is down is answered with a reset.
pub fn lock_outside(pids: &[Tid]) -> Option<NetworkLock> {
    if !tcp_reconnect::repair_available() {
        return None;
    }
    let locked = outside_connections(pids).and_then(|held| NetworkLock::lock(held.iter().map(|h| (h.diag.local, h.diag.remote)).collect()));
    match locked {
        Ok(lock) => Some(lock),
        Err(e) => {
            warn!("a peer outside the job sending while it is down will see its connection reset: {e}");
            None
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_queue_is_cut_to_what_the_peer_lacks() {
        let mut snap = Snapshot { send_seq: u32::MAX - 99, send: (0..=255).collect(), unsent: 200, ..Default::default() };
        snap.drop_received(150);
        assert_eq!(snap.send_seq, 50, "the first byte the peer lacks (sequence numbers wrap)");
        assert_eq!(snap.send, (150..=255).collect::<Vec<u8>>());
        assert_eq!(snap.unsent, 106, "never more than the queue");
    }

    #[test]
    fn a_sender_may_send_up_to_its_peers_right_edge_and_no_further() {
        let peer = Window { snd_wl1: 0, snd_wnd: 0, max_window: 0, rcv_wnd: 5000, rcv_wup: 1000 };
        assert_eq!(right_edge(&peer), 6000);
        assert_eq!(send_window_to(6000, 1000), 5000);
        assert_eq!(send_window_to(6000, 5900), 100);
        // The peer's buffer full: its window is closed.
        assert_eq!(send_window_to(6000, 6000), 0);
        // The sender's first unacknowledged byte beyond the edge (the edge as read before the
        // peer acknowledged more): nothing may be sent until the peer says more.
        assert_eq!(send_window_to(6000, 6100), 0);
        // Sequence numbers wrap.
        assert_eq!(send_window_to(10, u32::MAX - 9), 20);
        // The largest window seen is never below the window (the kernel would refuse it).
        let mut w = Window { snd_wl1: 1, snd_wnd: 0, max_window: 1000, rcv_wnd: 0, rcv_wup: 0 };
        open_to_peer(&mut w, 6000, 1000);
        assert_eq!((w.snd_wnd, w.max_window), (5000, 5000));
        open_to_peer(&mut w, 6000, 5500);
        assert_eq!((w.snd_wnd, w.max_window), (500, 5000));
    }

    #[test]
    fn a_connection_is_made_with_its_own_segment_size() {
        assert_eq!(connect_mss(1460), 1460);
        assert_eq!(connect_mss(65483), 32767, "loopback's clamp, beyond what TCP_MAXSEG takes");
        assert_eq!(connect_mss(88), 88);
        assert_eq!(connect_mss(0), 0);
    }

    #[test]
    fn a_restored_queue_never_exceeds_its_receive_buffer() {
        assert_eq!(receive_buffer_for(8 << 20, 7 << 20), 8 << 20, "the program's size where the queue fits");
        assert_eq!(receive_buffer_for(8 << 20, 9 << 20), 9 << 20, "the queue's memory where it does not");
        assert_eq!(receive_buffer_for(4608, u32::MAX), i32::MAX / 2);
    }

    #[test]
    fn a_receive_window_starts_no_later_than_the_bytes_received() {
        assert_eq!(receive_window(1000, 500, 1000), (1000, 500));
        assert_eq!(receive_window(900, 500, 1000), (900, 500), "an older start is the kernel's own");
        // Bytes acknowledged after the queue was read: same right edge, from the queue's end.
        assert_eq!(receive_window(1200, 500, 1000), (1000, 700));
        assert_eq!(receive_window(5, 100, u32::MAX - 4), (u32::MAX - 4, 110));
    }

    #[test]
    fn the_last_window_update_is_never_beyond_the_bytes_received() {
        // Taken ahead of the receive queue's end (a segment's bytes dropped): pulled back to it.
        assert_eq!(window_update_seq(12_392_326, 11_999_428), 11_999_428);
        // At or before it: as captured.
        assert_eq!(window_update_seq(11_999_428, 11_999_428), 11_999_428);
        assert_eq!(window_update_seq(164_009_037, 164_009_040), 164_009_037);
        // Across the wrap of the sequence space.
        assert_eq!(window_update_seq(10, u32::MAX - 5), u32::MAX - 5);
        assert_eq!(window_update_seq(u32::MAX - 5, 10), u32::MAX - 5);
    }

    /// A crash can leave the old end of a connection orphaned in FIN_WAIT1 (its unsent data
    /// waiting on a full window): the kernel refuses the rebuilt socket its address pair until
    /// that end is gone. Needs root (repair mode and SOCK_DESTROY).
    #[test]
    #[cfg_attr(ckpt_not_root, ignore = "needs root: TCP repair mode and SOCK_DESTROY need CAP_NET_ADMIN")]
    fn repaired_connect_ends_the_lingering_end_of_the_same_connection() {
        assert!(nix::unistd::geteuid().is_root(), "built as root, run as another user: TCP repair mode and SOCK_DESTROY need CAP_NET_ADMIN");
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
}
