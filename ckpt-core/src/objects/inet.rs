//! TCP and UDP sockets, IPv4 and IPv6: what the two kinds share (addresses, socket options, the
//! restorer's own duplicate of a job's socket), and the dispatch to [`super::tcp`] and
//! [`super::udp`].
//!
//! Both kinds are captured and restored through duplicates taken into the restorer with
//! pidfd_getfd: the restorer is in the job's network namespace, so it can bind, connect, set
//! options and (as root) use TCP repair mode on them directly; only `socket(2)` itself (or, for
//! connections made again without repair mode, `accept4(2)` and the receiving end of an
//! SCM_RIGHTS message, see [`super::tcp_reconnect`]) is injected into the process that will own
//! the descriptor. Steps that need every socket of the job to exist
//! (connections waiting in a backlog, leaving repair mode, queued datagrams sent again by their
//! sender) are run by [`finish`] once every process has its descriptors.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::descriptor::{self, take_into_self, CaptureCtx, DescriptorKind, FdRecord, Opening, RestoreCtx};
use super::tcp::{self, TcpRecord};
use super::tcp_reconnect;
use super::udp::{self, UdpRecord};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::socket as sys;

/// A TCP or UDP socket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum InetRecord {
    Tcp(TcpRecord),
    Udp(UdpRecord),
}

/// An IPv4 or IPv6 socket address, with the IPv6 flow label and scope.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Addr {
    pub ip: IpAddr,
    pub port: u16,
    pub flowinfo: u32,
    pub scope_id: u32,
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

impl Addr {
    pub fn from_std(a: SocketAddr) -> Addr {
        Addr { ip: a.ip(), port: a.port(), flowinfo: 0, scope_id: 0 }
    }

    /// The address as an IPv4 one when it is an IPv4-mapped IPv6 address, so that both ends of a
    /// connection between an IPv6 and an IPv4 socket compare equal. Pure.
    pub fn normalized(&self) -> SocketAddr {
        normalize(SocketAddr::new(self.ip, self.port))
    }

    /// Whether the address is the wildcard (any address) of its family.
    pub fn is_unspecified(&self) -> bool {
        self.ip.is_unspecified()
    }

    /// The bytes of a sockaddr_in or sockaddr_in6. Pure.
    pub fn to_sockaddr(&self) -> Vec<u8> {
        match self.ip {
            IpAddr::V4(ip) => {
                let mut b = vec![0u8; 16];
                b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                b[2..4].copy_from_slice(&self.port.to_be_bytes());
                b[4..8].copy_from_slice(&ip.octets());
                b
            }
            IpAddr::V6(ip) => {
                let mut b = vec![0u8; 28];
                b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                b[2..4].copy_from_slice(&self.port.to_be_bytes());
                b[4..8].copy_from_slice(&self.flowinfo.to_be_bytes());
                b[8..24].copy_from_slice(&ip.octets());
                b[24..28].copy_from_slice(&self.scope_id.to_ne_bytes());
                b
            }
        }
    }

    /// Parses a sockaddr_in or sockaddr_in6; None for any other family. Pure.
    pub fn from_sockaddr(b: &[u8]) -> Option<Addr> {
        if b.len() < 2 {
            return None;
        }
        let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
        match family {
            libc::AF_INET if b.len() >= 8 => {
                Some(Addr { ip: IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])), port: u16::from_be_bytes([b[2], b[3]]), flowinfo: 0, scope_id: 0 })
            }
            libc::AF_INET6 if b.len() >= 28 => Some(Addr {
                ip: IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[8..24]).ok()?)),
                port: u16::from_be_bytes([b[2], b[3]]),
                flowinfo: u32::from_be_bytes(b[4..8].try_into().ok()?),
                scope_id: u32::from_ne_bytes(b[24..28].try_into().ok()?),
            }),
            _ => None,
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it stands for. Pure.
pub fn normalize(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// Bytes of a queue; shown by their number only (`ckpt inspect` lists records with `{:?}`).
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// The socket options kept across a restart (those of `SOL_SOCKET` and `IPPROTO_IPV6`; TCP's own
/// are in [`tcp::TcpOpts`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SockOpts {
    pub reuseaddr: bool,
    pub reuseport: bool,
    pub keepalive: bool,
    pub broadcast: bool,
    /// The kernel's sizes (twice what setsockopt was given).
    pub rcvbuf: i32,
    pub sndbuf: i32,
    /// SO_BUF_LOCK: 1 the send buffer size was set by the program, 2 the receive buffer's.
    pub buf_lock: i32,
    /// SO_LINGER: (on, seconds).
    pub linger: (i32, i32),
    /// IPV6_V6ONLY, for IPv6 sockets.
    pub v6only: bool,
    /// SO_RCVTIMEO and SO_SNDTIMEO (0 0: none).
    pub timeouts: Timeouts,
    /// The device, the filter and the other options the program set (format 13).
    #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
    pub more: super::inet_opts::MoreOpts,
}

/// A socket's SO_RCVTIMEO and SO_SNDTIMEO, each as (seconds, microseconds): how long a blocking
/// receive or send waits (0 0: for ever).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Timeouts {
    pub rcv: (i64, i64),
    pub snd: (i64, i64),
}

impl Timeouts {
    /// Size of a `struct timeval` on x86_64, as SO_RCVTIMEO/SO_SNDTIMEO take it.
    pub const TIMEVAL_LEN: usize = 16;

    /// Reads them from a socket the restorer holds.
    pub fn capture(s: &OwnedFd) -> std::io::Result<Timeouts> {
        let get = |name| getopt_bytes(s, libc::SOL_SOCKET, name, Self::TIMEVAL_LEN).map(|b| Self::from_timeval(&b));
        Ok(Timeouts { rcv: get(libc::SO_RCVTIMEO)?, snd: get(libc::SO_SNDTIMEO)? })
    }

    /// Sets them on a socket the restorer holds.
    pub fn restore(&self, s: &OwnedFd) -> std::io::Result<()> {
        setopt_bytes(s, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &Self::timeval(self.rcv))?;
        setopt_bytes(s, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &Self::timeval(self.snd))
    }

    /// A `struct timeval`'s bytes. Pure.
    pub fn timeval((sec, usec): (i64, i64)) -> Vec<u8> {
        [sec.to_ne_bytes(), usec.to_ne_bytes()].concat()
    }

    /// (seconds, microseconds) of a `struct timeval`'s bytes (zero where short). Pure.
    pub fn from_timeval(b: &[u8]) -> (i64, i64) {
        let at = |i: usize| b.get(i..i + 8).map_or(0, |x| i64::from_ne_bytes(x.try_into().unwrap()));
        (at(0), at(8))
    }
}

// ---------------------------------------------------------------------------------------------
// The socket calls (crate::sys::socket), and addresses as this module reads them.

pub use crate::sys::socket::{get_fl, getopt_bytes, getopt_in_out, getopt_int, ioctl_int, plain_socket, poll_one, send_all, set_fl, setopt_bytes, setopt_int};

pub const SO_BUF_LOCK: i32 = 72;

fn sockname(s: &OwnedFd, peer: bool) -> std::io::Result<Option<Addr>> {
    Ok(sys::sockname(s, peer)?.and_then(|raw| Addr::from_sockaddr(&raw)))
}

/// The bound address, or None if the socket has none (port 0 on the wildcard address).
pub fn local_addr(s: &OwnedFd) -> std::io::Result<Option<Addr>> {
    Ok(sockname(s, false)?.filter(|a| a.port != 0 || !a.is_unspecified()))
}

/// The connected peer's address, or None.
pub fn peer_addr(s: &OwnedFd) -> std::io::Result<Option<Addr>> {
    sockname(s, true)
}

pub fn bind(s: &OwnedFd, a: &Addr) -> std::io::Result<()> {
    sys::bind(s, &a.to_sockaddr())
}

/// Binds a socket the job had bound to `a`, where `a` may not be an address of this machine now
/// (a program that bound with IP_FREEBIND and turned it off since, as HAProxy or systemd's
/// FreeBind= do for an address that comes later; or a floating address that moved): bound
/// freely then, with a warning, and IP_FREEBIND put back off. The socket receives nothing
/// until the address is there again, as it would have where it ran.
pub fn bind_as_recorded(s: &OwnedFd, a: &Addr) -> std::io::Result<()> {
    match bind(s, a) {
        Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
            let (level, name) = if a.ip.is_ipv6() { (libc::IPPROTO_IPV6, libc::IPV6_FREEBIND) } else { (libc::IPPROTO_IP, libc::IP_FREEBIND) };
            setopt_int(s, level, name, 1)?;
            let r = bind(s, a);
            setopt_int(s, level, name, 0)?;
            if r.is_ok() {
                tracing::warn!("{a} is not an address of this machine now ({e}): the socket is bound to it all the same, and receives nothing until it is");
            }
            r
        }
        r => r,
    }
}

pub fn connect(s: &OwnedFd, a: &Addr) -> std::io::Result<()> {
    sys::connect(s, &a.to_sockaddr())
}

/// The flags of the open file description: O_NONBLOCK (and the access mode, which a socket
/// ignores) as the job had it.
pub fn set_status_flags(s: &OwnedFd, rec: &FdRecord) -> std::io::Result<()> {
    set_fl(s, (rec.flags & libc::O_NONBLOCK as u32) as i32)
}

/// Sets a socket buffer's size to `size` bytes as SO_RCVBUF or SO_SNDBUF reads it. The kernel
/// doubles what it is given; FORCE passes over net.core.[rw]mem_max as the program (if root) or
/// the kernel's autotuning may have. An ordinary user may not (EPERM): the plain option then,
/// capped at the maximum.
pub fn set_buffer(s: &OwnedFd, force: i32, plain: i32, size: i32) -> std::io::Result<()> {
    let (sol, half) = (libc::SOL_SOCKET, size / 2 + size % 2);
    match setopt_int(s, sol, force, half) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => setopt_int(s, sol, plain, half),
        r => r,
    }
}

impl SockOpts {
    /// Reads the options of a socket. `reuseaddr` is read by the caller before anything (TCP
    /// repair mode) can change it.
    pub fn capture(s: &OwnedFd, family: i32, ty: i32, proto: i32, reuseaddr: bool) -> std::io::Result<SockOpts> {
        let sol = libc::SOL_SOCKET;
        let linger = getopt_bytes(s, sol, libc::SO_LINGER, 8)?;
        let int_at = |b: &[u8], at: usize| b.get(at..at + 4).map_or(0, |x| i32::from_ne_bytes(x.try_into().unwrap()));
        Ok(SockOpts {
            reuseaddr,
            reuseport: getopt_int(s, sol, libc::SO_REUSEPORT)? != 0,
            keepalive: getopt_int(s, sol, libc::SO_KEEPALIVE)? != 0,
            broadcast: getopt_int(s, sol, libc::SO_BROADCAST)? != 0,
            rcvbuf: getopt_int(s, sol, libc::SO_RCVBUF)?,
            sndbuf: getopt_int(s, sol, libc::SO_SNDBUF)?,
            // Older kernels (before 5.14) do not tell; then nothing is locked at restore.
            buf_lock: getopt_int(s, sol, SO_BUF_LOCK).unwrap_or(0),
            linger: (int_at(&linger, 0), int_at(&linger, 4)),
            v6only: family == libc::AF_INET6 && getopt_int(s, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)? != 0,
            timeouts: Timeouts::capture(s)?,
            more: super::inet_opts::MoreOpts::capture(s, family, ty, proto)?,
        })
    }

    /// What must be set before bind(2).
    pub fn restore_before_bind(&self, s: &OwnedFd, family: i32) -> std::io::Result<()> {
        self.more.restore_before_bind(s)?;
        // Only where it differs: a raw socket refuses the option whatever its value (EINVAL:
        // the kernel sees it as bound already, to its protocol).
        if family == libc::AF_INET6 && (getopt_int(s, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY)? != 0) != self.v6only {
            setopt_int(s, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, self.v6only as i32)?;
        }
        setopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEPORT, self.reuseport as i32)
    }

    /// Buffer sizes large enough for `rcv` and `snd` bytes of queued data (temporarily, while
    /// queues are put back); [`SockOpts::restore`] sets the recorded ones.
    pub fn make_room(&self, s: &OwnedFd, rcv: usize, snd: usize) -> std::io::Result<()> {
        let room = |have: i32, need: usize| (have as i64).max(need as i64 * 2 + (256 << 10)).min(i32::MAX as i64 / 2) as i32;
        setopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, room(self.rcvbuf, rcv) / 2)?;
        setopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, room(self.sndbuf, snd) / 2)
    }

    /// Everything else, last (TCP repair mode, while on, overrides SO_REUSEADDR).
    pub fn restore(&self, s: &OwnedFd) -> std::io::Result<()> {
        let sol = libc::SOL_SOCKET;
        setopt_int(s, sol, libc::SO_REUSEADDR, self.reuseaddr as i32)?;
        setopt_int(s, sol, libc::SO_KEEPALIVE, self.keepalive as i32)?;
        setopt_int(s, sol, libc::SO_BROADCAST, self.broadcast as i32)?;
        set_buffer(s, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, self.rcvbuf)?;
        set_buffer(s, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, self.sndbuf)?;
        // Setting the sizes locked them; unlock what the program had left to the kernel.
        match setopt_int(s, sol, SO_BUF_LOCK, self.buf_lock) {
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {}
            r => r?,
        }
        self.timeouts.restore(s)?;
        self.more.restore(s)?;
        let mut linger = self.linger.0.to_ne_bytes().to_vec();
        linger.extend_from_slice(&self.linger.1.to_ne_bytes());
        setopt_bytes(s, sol, libc::SO_LINGER, &linger)
    }
}

// ---------------------------------------------------------------------------------------------
// Capture and restore dispatch

/// Per-checkpoint state of TCP and UDP capture.
#[derive(Default)]
pub struct InetCaptureState {
    pub tcp: tcp::TcpCaptureState,
    pub udp: udp::UdpCaptureState,
}

/// Captures a TCP or UDP socket of a stopped process; `s` is the restorer's duplicate of it.
pub fn capture(pid: Tid, fd: i32, ino: u64, s: OwnedFd, ctx: &mut CaptureCtx) -> Result<InetRecord> {
    let ty = getopt_int(&s, libc::SOL_SOCKET, libc::SO_TYPE)?;
    let proto = getopt_int(&s, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    // What the records do not hold yet would be lost without a word: refused instead.
    let refuse = |what: String| Error::Unsupported { pid, what: format!("fd {fd} (socket:[{ino}]) {what}") };
    if super::inet_opts::has_ebpf_filter(&s)? {
        return Err(refuse("with an eBPF socket filter attached (SO_ATTACH_BPF), which the kernel gives no program back of".into()));
    }
    match (ty, proto) {
        (libc::SOCK_STREAM, libc::IPPROTO_TCP) => Ok(InetRecord::Tcp(tcp::capture(pid, fd, ino, s, ctx)?)),
        _ => match udp::DatagramKind::of(ty, proto) {
            Some(kind) => Ok(InetRecord::Udp(udp::capture(pid, fd, ino, &s, kind, &ctx.networks, &mut ctx.inet.udp)?)),
            None => Err(Error::Unsupported { pid, what: format!("fd {fd} (socket:[{ino}], an IP socket of type {ty}, protocol {proto})") }),
        },
    }
}

/// Per-node state of TCP and UDP sockets being restored.
#[derive(Default)]
pub struct InetRestoreState {
    /// `--tcp-established`: connections to peers outside the job are restored with TCP repair
    /// mode (the peer does not notice); otherwise they come back reset.
    pub tcp_established: bool,
    /// Connections held by the job's processes on its other nodes, as (local, remote) seen
    /// from there: their ends here are the job's own and come back by repair mode, whatever
    /// `tcp_established` says (the other end is rebuilt the same way at the same time).
    pub other_nodes: std::collections::HashSet<(Addr, Addr)>,
    pub tcp: tcp::TcpRestoreState,
    /// Connections rebuilt without repair mode (see [`tcp_reconnect`]).
    pub reconnect: tcp_reconnect::ReconnectState,
    /// Whether TCP repair mode is used ([`tcp_reconnect::repair_available`]), asked once.
    repair: Option<bool>,
    /// A node of the job restarts on another host than its part ran on: the connections between
    /// nodes are rebuilt by repair mode with `readdressed` applied at both ends, or made again by
    /// connecting where repair mode is not used.
    pub nodes_moved: bool,
    /// The moved nodes' old addresses, each with the one that stands for it now (IPv4).
    pub readdressed: std::collections::HashMap<IpAddr, IpAddr>,
    pub udp: udp::UdpRestoreState,
}

impl InetRestoreState {
    /// Whether the other end of this connection is a process of the job on another node.
    pub fn on_other_nodes(&self, c: &tcp::Connection) -> bool {
        self.other_nodes.contains(&(c.remote, c.local))
    }

    /// Whether the connections to the job's other nodes are rebuilt by repair mode: when it is
    /// available, and every node restarts where its part ran or the moved nodes' new addresses
    /// are known.
    pub fn repair_across_nodes(&mut self) -> bool {
        (!self.nodes_moved || !self.readdressed.is_empty()) && self.repair()
    }

    /// `a` with a moved node's old address replaced by its new one (an IPv4 address written
    /// as IPv6, `::ffff:a.b.c.d`, keeps that form); any other address as it is.
    pub fn readdress(&self, a: &Addr) -> Addr {
        let new_ip = match a.ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().and_then(|v4| self.readdressed.get(&IpAddr::V4(v4))).map(|n| match n {
                IpAddr::V4(n) => IpAddr::V6(n.to_ipv6_mapped()),
                v6 => *v6,
            }),
            ip => self.readdressed.get(&ip).copied(),
        };
        Addr { ip: new_ip.unwrap_or(a.ip), ..*a }
    }

    /// Whether TCP repair mode can be used by this restore (probed once).
    pub fn repair(&mut self) -> bool {
        *self.repair.get_or_insert_with(|| {
            let r = tcp_reconnect::repair_available();
            if !r {
                tracing::debug!("TCP repair mode is not available (or {} is set): connections are made again", tcp_reconnect::FORCE_ENV);
            }
            r
        })
    }
}

/// A socket of the restorer's in the task's network namespace, for a stand-in peer of one of
/// its connections: a socket stays in the namespace it was made in, so where the task is in a
/// namespace the job made, the task makes it (and closes its own descriptor once it is taken).
pub fn socket_beside(task: &mut RemoteTask, family: i32, ty: i32, proto: i32) -> Result<OwnedFd> {
    let netns = |pid: &str| crate::nshelper::namespace_id(&format!("/proc/{pid}/ns/net"));
    if netns("self")? == netns(&task.pid.to_string())? {
        return Ok(plain_socket(family, ty, proto)?);
    }
    let s = task.syscall("socket", libc::SYS_socket, &[family as u64, (ty | libc::SOCK_CLOEXEC) as u64, proto as u64])?;
    let taken = take_into_self(task.pid, s as i32);
    task.syscall("close", libc::SYS_close, &[s])?;
    taken
}

/// Creates a socket of the given family and type inside the task, above `work_base`, and takes a
/// duplicate of it into the restorer.
pub fn new_socket(task: &mut RemoteTask, family: i32, ty: i32, proto: i32, work_base: u64) -> Result<(u64, OwnedFd)> {
    let s = task.syscall("socket", libc::SYS_socket, &[family as u64, (ty | libc::SOCK_CLOEXEC) as u64, proto as u64])?;
    let s = descriptor::move_above(task, s, work_base)?;
    let dup = take_into_self(task.pid, s as i32)?;
    Ok((s, dup))
}

impl DescriptorKind for InetRecord {
    fn describe(&self) -> String {
        match self {
            InetRecord::Tcp(t) => t.describe(),
            InetRecord::Udp(u) => u.describe(),
        }
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.work_base)
    }
}

/// Opens a TCP or UDP socket in the task.
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, r: &InetRecord, ctx: &mut RestoreCtx, work_base: u64) -> Result<u64> {
    match r {
        InetRecord::Tcp(t) => {
            if let Some(fd) = tcp_reconnect::take_waiting(task, ns_pid, rec, t, ctx, work_base)? {
                return Ok(fd);
            }
            if let tcp::TcpState::Connected(c) = &t.state {
                let repair = if ctx.inet.on_other_nodes(c) { ctx.inet.repair_across_nodes() } else { ctx.inet.repair() };
                if c.peer != tcp::Peer::Backlog && tcp_reconnect::takes_this_path(c, repair) {
                    return tcp_reconnect::open(task, ns_pid, rec, t, c, ctx, work_base);
                }
            }
            let fd = tcp::open(task, ns_pid, rec, t, &mut ctx.inet, work_base)?;
            if let tcp::TcpState::Listening { local, .. } = &t.state {
                ctx.inet.reconnect.listener_restored(*local, ns_pid, rec.fd);
            }
            Ok(fd)
        }
        InetRecord::Udp(u) => udp::open(task, ns_pid, rec, u, &mut ctx.inet, work_base),
    }
}

/// The steps that need every socket of the node: connections that were waiting in a backlog
/// are made again, repaired connections leave repair mode and send what they had not sent,
/// half-closed ones are shut down again, queued datagrams are sent again by their senders.
pub fn finish(state: &mut InetRestoreState) -> Result<()> {
    tcp::finish(&mut state.tcp)?;
    udp::finish(&mut state.udp)
}

/// Before a job checkpointed with `--kill` is killed: its TCP connections are put in repair mode,
/// so that closing them sends nothing (no FIN, no reset) and leaves no TIME_WAIT behind. Those
/// to peers outside the job only with `--tcp-established` (the peer must not notice, since the
/// restarted job takes the connection over); without it the peer sees the connection close.
pub fn before_kill(pids: &[Tid], tcp_established: bool) {
    tcp::silence(pids, tcp_established);
}

/// Before a job is killed to be recovered from a lost node: its TCP connections are made to
/// close with a reset, leaving nothing on the ports a restart in place binds again (see
/// [`tcp::reset_at_recovery_kill`]).
pub fn before_recovery_kill(pids: &[Tid]) {
    tcp::reset_at_recovery_kill(pids);
}

/// For `ckpt inspect`: a TCP connection to a peer outside the job, which a restart brings back
/// reset unless it is given `--tcp-established`.
pub fn outside_connection(kind: &descriptor::FdKind) -> Option<String> {
    match kind {
        descriptor::FdKind::Inet(InetRecord::Tcp(t)) => t.outside().map(|c| format!("TCP connection {} -> {} to a peer outside the job", c.local, c.remote)),
        _ => None,
    }
}

/// "port N of ADDR is taken" for bind and connect errors; other errors as they are.
pub fn port_error(what: &str, a: &Addr, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EADDRINUSE) | Some(libc::EADDRNOTAVAIL) => Error::Other(format!(
            "{what} {a}: port {} is taken ({e}); free it (stop whatever uses it, or wait for its TIME_WAIT to end) and restart again",
            a.port
        )),
        _ => Error::Other(format!("{what} {a}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_timeouts_round_trip() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let s = OwnedFd::from(a);
        assert_eq!(Timeouts::capture(&s).unwrap(), Timeouts::default(), "none at first");
        let t = Timeouts { rcv: (2, 500_000), snd: (0, 30_000) };
        t.restore(&s).unwrap();
        // The kernel keeps them in jiffies: what comes back is rounded up to a tick.
        let back = Timeouts::capture(&s).unwrap();
        let us = |(sec, usec): (i64, i64)| sec * 1_000_000 + usec;
        assert!(us(back.rcv) >= us(t.rcv) && us(back.rcv) < us(t.rcv) + 20_000, "{back:?}");
        assert!(us(back.snd) >= us(t.snd) && us(back.snd) < us(t.snd) + 20_000, "{back:?}");
    }

    #[test]
    fn a_moved_nodes_address_is_replaced_in_either_form() {
        let mut state = InetRestoreState::default();
        state.readdressed.insert("10.0.0.2".parse().unwrap(), "10.0.0.9".parse().unwrap());
        let moved = |a: &str| state.readdress(&Addr::from_std(a.parse().unwrap())).normalized().to_string();
        assert_eq!(moved("10.0.0.2:1024"), "10.0.0.9:1024");
        assert_eq!(moved("[::ffff:10.0.0.2]:1024"), "10.0.0.9:1024");
        assert!(state.readdress(&Addr::from_std("[::ffff:10.0.0.2]:7".parse().unwrap())).ip.is_ipv6(), "the IPv6 form is kept");
        assert_eq!(moved("10.0.0.3:1024"), "10.0.0.3:1024");
        assert_eq!(moved("0.0.0.0:80"), "0.0.0.0:80");
    }

    #[test]
    fn sockaddrs_round_trip() {
        let v4 = Addr::from_std("127.0.0.1:5000".parse().unwrap());
        assert_eq!(Addr::from_sockaddr(&v4.to_sockaddr()), Some(v4));
        let v6 = Addr { ip: "fe80::1".parse().unwrap(), port: 80, flowinfo: 7, scope_id: 2 };
        assert_eq!(Addr::from_sockaddr(&v6.to_sockaddr()), Some(v6));
        assert_eq!(v6.to_string(), "[fe80::1]:80");
    }

    #[test]
    fn mapped_addresses_compare_as_ipv4() {
        let mapped = Addr::from_std("[::ffff:127.0.0.1]:80".parse().unwrap());
        assert_eq!(mapped.normalized(), "127.0.0.1:80".parse().unwrap());
        let v6 = Addr::from_std("[::1]:80".parse().unwrap());
        assert_eq!(v6.normalized(), "[::1]:80".parse().unwrap());
    }

    #[test]
    fn queues_show_their_length_only() {
        assert_eq!(format!("{:?}", Bytes(vec![1, 2, 3])), "<3 bytes>");
    }
}
