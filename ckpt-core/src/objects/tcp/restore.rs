//! Restore of TCP sockets: `open` makes each one (unconnected, listening: bound past the old
//! job's lingering connections, connected: rebuilt in repair mode, or reset, with a stand-in for a
//! peer that had closed), and `finish`, once every process has its descriptors, makes again the
//! connections that waited in a backlog, ends the repair and sends what was to be sent.

use std::os::fd::OwnedFd;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::repair::{connect_repaired, fit_receive_buffer, io_err, restore_repaired, set_queue_seq, set_repair_options};
use super::{
    Connection, Peer, TcpOpts, TcpRecord, TcpState, NO_QUEUE, RECV_QUEUE, REPAIR_OFF, REPAIR_OFF_NO_WP, REPAIR_ON, SEND_QUEUE, TCP_REPAIR, TCP_REPAIR_QUEUE,
    TCP_REPAIR_WINDOW,
};
use crate::error::{Error, Result};
use crate::objects::descriptor::FdRecord;
use crate::objects::inet::{self, getopt_int, setopt_bytes, setopt_int, Addr, InetRestoreState, SockOpts};
use crate::objects::tcp_reconnect;
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::socket as sys;

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
    /// The addresses where a listener of the job has SO_REUSEPORT: a listener there without it
    /// turned it off once it listened in that group (zdtm's socket-tcp-reuseport), and must
    /// join the group again the same way.
    reuseport_groups: std::collections::HashSet<Addr>,
    /// Listeners that joined their group with SO_REUSEPORT for the restore, to turn it off
    /// again once every listener of the group is back (in [`finish`]), with "pid N: fd M".
    reuseport_off: Vec<(OwnedFd, String)>,
    /// Connections being established, bound, to connect (without waiting) once the backlogs
    /// are whole again (in [`finish`]): (socket, remote, "pid N: fd M").
    connecting: Vec<(OwnedFd, Addr, String)>,
}

impl TcpRestoreState {
    /// Notes the image's listeners with SO_REUSEPORT, before any is restored.
    pub fn collect<'a>(&mut self, fds: impl Iterator<Item = &'a FdRecord>) {
        for rec in fds {
            if let crate::objects::descriptor::FdKind::Inet(inet::InetRecord::Tcp(t)) = &rec.kind {
                if let (TcpState::Listening { local, .. }, true) = (&t.state, t.opts.reuseport) {
                    self.reuseport_groups.insert(*local);
                }
            }
        }
    }
}

/// The (local, remote) addresses of every TCP connection held by the processes of an image.
pub fn connections<'a>(fds: impl Iterator<Item = &'a FdRecord>) -> Vec<(Addr, Addr)> {
    fds.filter_map(|rec| match &rec.kind {
        crate::objects::descriptor::FdKind::Inet(inet::InetRecord::Tcp(TcpRecord { state: TcpState::Connected(c), .. })) => Some((c.local, c.remote)),
        _ => None,
    })
    .collect()
}

/// Opens a TCP socket in the task.
pub fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, t: &TcpRecord, state: &mut InetRestoreState, work_base: u64) -> Result<u64> {
    let (fd, s) = inet::new_socket(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP, work_base)?;
    let what = format!("pid {ns_pid}: fd {}", rec.fd);
    let opts_err = |e| Error::from(e).of_object(ns_pid, format!("fd {}: set socket options", rec.fd));
    match &t.state {
        TcpState::Closed { local, unread, reset, .. } if *reset || !unread.0.is_empty() => {
            let listener = inet::socket_beside(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
            tcp_reconnect::ended_with_unread(&s, t, local.as_ref(), &unread.0, *reset, listener).map_err(|e| {
                Error::from(e).of_object(ns_pid, format!("fd {}: make again a TCP connection that ended, {} bytes unread", rec.fd, unread.0.len()))
            })?;
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
        TcpState::Connecting { local, remote } => {
            t.opts.restore_before_bind(&s, t.family).map_err(opts_err)?;
            bind_forced(&s, &state.readdress(local))?;
            t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(opts_err)?;
            state.tcp.connecting.push((s.try_clone()?, state.readdress(remote), what.clone()));
        }
        TcpState::Listening { local, backlog } => {
            // In a group of listeners sharing the port, with SO_REUSEPORT turned off since.
            let rejoins = !t.opts.reuseport && state.tcp.reuseport_groups.contains(local);
            let in_context = |e: Error| if e.takes_place() { e.of_object(ns_pid, format!("fd {}", rec.fd)) } else { e };
            listen_as_recorded(&s, t, &state.readdress(local), *backlog, rejoins).map_err(in_context)?;
            if rejoins {
                state.tcp.reuseport_off.push((s.try_clone()?, what.clone()));
            }
        }
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
            let waiting = |sock| Waiting { sock, conn: c.clone(), opts: t.opts.clone(), tcp_opts: t.tcp_opts.clone(), what: what.clone(), twin: None };
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
                    let stand_in = match c.recv_queue.0.is_empty() {
                        true => None,
                        false => Some(inet::socket_beside(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?),
                    };
                    restore_reset(&s, t, c, stand_in, &what)?;
                    t.opts.restore(&s).and_then(|_| t.tcp_opts.restore(&s)).map_err(opts_err)?;
                }
                _ => {
                    let in_context = |e: Error| e.of_object(ns_pid, format!("fd {}: TCP {} -> {}", rec.fd, c.local, c.remote));
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
                        let twin = inet::socket_beside(task, t.family, libc::SOCK_STREAM, libc::IPPROTO_TCP)?;
                        w.twin = Some(stand_in(twin, c).map_err(in_context)?);
                    }
                    state.tcp.repaired.push(w);
                }
            }
        }
    }
    inet::set_status_flags(&s, rec)?;
    Ok(fd)
}

/// A listening socket bound and listening where the record says, with its options (and
/// SO_REUSEPORT on where it `rejoins` a group: see [`TcpRestoreState::reuseport_off`]).
pub(in crate::objects) fn listen_as_recorded(s: &OwnedFd, t: &TcpRecord, local: &Addr, backlog: u32, rejoins: bool) -> Result<()> {
    let opts_err = |e| Error::Other(format!("set socket options: {e}"));
    t.opts.restore_before_bind(s, t.family).map_err(opts_err)?;
    if rejoins {
        setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1).map_err(opts_err)?;
    }
    // Connections the old job accepted on this port may linger in TIME_WAIT.
    setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).map_err(opts_err)?;
    bind_listener(s, local)?;
    sys::listen(s, backlog as i32).map_err(|e| inet::port_error("listen on", local, e))?;
    t.opts.restore(s).and_then(|_| t.tcp_opts.restore(s)).map_err(opts_err)
}

pub(in crate::objects) fn shutdown(s: &OwnedFd, how: i32) {
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
    match inet::bind_as_recorded(s, local) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {}
        r => return r.map_err(taken),
    }
    match crate::sockdiag::destroy_lingering(at, None) {
        Ok(0) => {}
        Ok(n) => {
            info!("ended {n} lingering connection(s) of the old job on {local} to listen there again");
            match inet::bind_as_recorded(s, local) {
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
        let e = match inet::bind_as_recorded(s, local) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => e,
            r => return r.map_err(|e| inet::port_error("bind a listening TCP socket to", local, e)),
        };
        let h = crate::sockdiag::PortHolders::of(at)
            .map_err(|d| inet::port_error("bind a listening TCP socket to", local, std::io::Error::other(format!("{e}; what holds it is unknown: {d}"))))?;
        // Sockets a process holds may share the port without taking it (SO_REUSEADDR on both,
        // an IPv6-only socket): only when nothing lingers any more is what remains the cause.
        if h.lingering.is_empty() || start.elapsed() > limit {
            return Err(taken_by(&h, e));
        }
        if !said {
            warn!(
                "port {} is held by {} end(s) of the old job's closed connections ({}: {}), which no process holds and only root can end: waiting for them to go (at most {} s)",
                local.port,
                h.lingering.len(),
                h.lingering_summary(),
                h.lingering_list(),
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

/// The other end of a connection whose peer had closed, made by the restorer in repair mode on
/// `s`, a fresh socket in the connection's network namespace ([`inet::socket_beside`]): bound
/// to the peer's address, connected, expecting what `c` had not had acknowledged, and about to
/// send its FIN right after what `c` had received.
fn stand_in(s: OwnedFd, c: &Connection) -> Result<OwnedFd> {
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
///
/// What the program had received and not read is still its own to read, before the reset (as
/// after a reset it had seen itself): where the record holds such bytes, the socket, once
/// disconnected, is connected to a stand-in on `stand_in` (a socket made beside the task's)
/// that sends them and resets (zdtm's socket-tcp-reseted read ECONNRESET in place of its
/// bytes).
fn restore_reset(s: &OwnedFd, t: &TcpRecord, c: &Connection, stand_in: Option<OwnedFd>, what: &str) -> Result<()> {
    match connect_repaired(s, t, c) {
        Ok(()) => {
            // The reset must reach the peer: a lock taken at a `--kill --tcp-established`
            // checkpoint would drop it.
            unlock_outside(std::iter::once(c));
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
    match stand_in {
        Some(listener) => tcp_reconnect::ended_with_unread(s, t, None, &c.recv_queue.0, true, listener).map_err(|e| {
            Error::Other(format!(
                "{what}: connection {} -> {}: give back the {} bytes it had not read before its reset: {e}",
                c.local,
                c.remote,
                c.recv_queue.0.len()
            ))
        }),
        None => {
            shutdown(s, libc::SHUT_RDWR);
            Ok(())
        }
    }
}

/// Lets through again the packets of those connections to peers outside the job that a
/// network lock holds (see [`super::lock`]); where that fails, the peer sees nothing more of
/// the connection, and a warning says so.
fn unlock_outside<'a>(conns: impl Iterator<Item = &'a Connection>) {
    let outside: Vec<_> = conns.filter(|c| c.peer == Peer::Outside && c.repaired).map(|c| (c.local.normalized(), c.remote.normalized())).collect();
    if outside.is_empty() {
        return;
    }
    if let Err(e) = super::lock::unlock(&outside) {
        warn!("{e}");
    }
}

/// How long finishing one connection may wait for the kernel (a connect, a full send buffer).
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes again the connections that were waiting in a backlog, then takes every repaired
/// connection out of repair mode and sends what it had to send.
pub fn finish(state: &mut TcpRestoreState) -> Result<()> {
    // Every listener of each group is back: those that had turned SO_REUSEPORT off do again.
    for (s, what) in state.reuseport_off.drain(..) {
        setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEPORT, 0).map_err(|e| Error::Other(format!("{what}: turn SO_REUSEPORT off again: {e}")))?;
    }
    for w in state.backlog.drain(..) {
        connect_again(&w)
            .map_err(|e| Error::Other(format!("{}: connect again to {} (the connection was waiting in its backlog): {e}", w.what, w.conn.remote)))?;
        after_repair(&w)?;
    }
    // After the backlogs: a listener whose queue was full drops a SYN (the usual reason one
    // waits), and the connections it held are back in it first, as they were.
    for (s, remote, what) in state.connecting.drain(..) {
        start_connect(&s, &remote).map_err(|e| Error::Other(format!("{what}: connect again to {remote} (the connection was being established): {e}")))?;
    }
    let mut repaired: Vec<Waiting> = state.repaired.drain(..).collect();
    // Packets from peers outside the job were held off since the checkpoint (see `lock`): they
    // come through again now that each connection is whole.
    unlock_outside(repaired.iter().map(|w| &*w.conn));
    // Every end's receive buffer as the program had it (see `fit_receive_buffer`), then every
    // end leaves repair mode before any byte is sent: a peer in the job is ready for it.
    for w in &mut repaired {
        w.opts.rcvbuf = fit_receive_buffer(&w.sock, w.opts.rcvbuf).map_err(|e| Error::Other(format!("{}: set the receive buffer: {e}", w.what)))?;
    }
    for w in &repaired {
        setopt_int(&w.sock, libc::SOL_TCP, TCP_REPAIR, REPAIR_OFF).map_err(|e| Error::Other(format!("{}: leave TCP repair mode: {e}", w.what)))?;
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

/// Sends a connection's SYN from `s` to `remote` without waiting for the answer, the socket's
/// status flags left as they were: the program's own connect(2), made again or polled for,
/// waits for the end of it.
fn start_connect(s: &OwnedFd, remote: &Addr) -> std::io::Result<()> {
    let flags = inet::get_fl(s)?;
    inet::set_fl(s, flags | libc::O_NONBLOCK)?;
    let r = match inet::connect(s, remote) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
        r => r,
    };
    inet::set_fl(s, flags)?;
    r
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
    w.opts.restore(&w.sock).and_then(|_| w.tcp_opts.restore(&w.sock)).map_err(|e| Error::Other(format!("{}: set socket options: {e}", w.what)))
}
