//! UDP sockets, IPv4 and IPv6: the bound and connected addresses, options, and the datagrams
//! queued and not read yet. The other IP datagram sockets too ([`DatagramKind`]): UDP-Lite, as
//! UDP; ping sockets (ICMP echo without privilege) and raw sockets, whose addresses and options
//! are kept, and which must have nothing queued (what they receive cannot be sent to them
//! again: a reply to an echo, a packet with its IP header).
//!
//! Capture reads the receive queue without taking anything out (MSG_PEEK with SO_PEEK_OFF, one
//! datagram at a time, each with its sender's address). At restart a datagram must come again
//! from the same address, or the program would see another sender: the rule is that it is sent
//! again by the socket of the job bound to that address, once every socket exists; if no socket
//! of the job has it (the sender is outside the job, or closed its socket), by a socket of the
//! restorer bound to that address if it is free; otherwise the datagram is dropped (with a
//! warning), as the network may drop any datagram.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::descriptor::FdRecord;
use super::inet::{self, getopt_int, setopt_int, Addr, Bytes, InetRestoreState, SockOpts};
use super::inet_opts;
use super::multicast;
use crate::error::{Error, Result};
use crate::objects::net_namespaces::JobNetworks;
use crate::ptrace::{RemoteTask, Tid};
use crate::sockdiag;
use crate::sys::socket as sys;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UdpRecord {
    pub ino: u64,
    /// AF_INET or AF_INET6.
    pub family: i32,
    pub local: Option<Addr>,
    pub remote: Option<Addr>,
    /// Datagrams received and not read, in order.
    pub queue: Vec<Datagram>,
    pub opts: SockOpts,
    /// Which kind of datagram socket (format 13; UDP from an older image).
    #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
    pub kind: DatagramKind,
    /// The multicast groups it joined, with their source filters (format 15; none from an
    /// older image, whose restart lost them).
    #[serde(deserialize_with = "crate::image::since::since::<15, _, _>")]
    pub memberships: Vec<multicast::Membership>,
    /// What shutdown(2) shut, as the kernel's sk_shutdown: 1 receiving, 2 sending (UDP and
    /// UDP-Lite; sock_diag tells no other kind's). Format 31 (none from an older image, which
    /// lost it: a socket shut for sending sent again after a restart).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub shutdown: u8,
}

/// The IP datagram sockets this module keeps.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum DatagramKind {
    #[default]
    Udp,
    UdpLite,
    /// SOCK_DGRAM with IPPROTO_ICMP or IPPROTO_ICMPV6 (net.ipv4.ping_group_range).
    Ping,
    /// SOCK_RAW, of this protocol (CAP_NET_RAW).
    Raw {
        protocol: i32,
    },
}

impl DatagramKind {
    /// What it is called in messages.
    pub fn name(&self) -> String {
        match self {
            DatagramKind::Udp => "UDP".into(),
            DatagramKind::UdpLite => "UDP-Lite".into(),
            DatagramKind::Ping => "ping".into(),
            DatagramKind::Raw { protocol } => format!("raw IP (protocol {protocol})"),
        }
    }

    /// socket(2)'s type and protocol for it, in `family`.
    pub fn socket_args(&self, family: i32) -> (i32, i32) {
        match *self {
            DatagramKind::Udp => (libc::SOCK_DGRAM, libc::IPPROTO_UDP),
            DatagramKind::UdpLite => (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE),
            DatagramKind::Ping if family == libc::AF_INET6 => (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6),
            DatagramKind::Ping => (libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
            DatagramKind::Raw { protocol } => (libc::SOCK_RAW, protocol),
        }
    }

    /// Of a socket's type and protocol, if this module keeps it.
    pub fn of(ty: i32, proto: i32) -> Option<DatagramKind> {
        match (ty, proto) {
            (libc::SOCK_DGRAM, libc::IPPROTO_UDP) => Some(DatagramKind::Udp),
            (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE) => Some(DatagramKind::UdpLite),
            (libc::SOCK_DGRAM, libc::IPPROTO_ICMP | libc::IPPROTO_ICMPV6) => Some(DatagramKind::Ping),
            (libc::SOCK_RAW, protocol) => Some(DatagramKind::Raw { protocol }),
            _ => None,
        }
    }

    /// Whether the restart can put what it queued back (by sending it again).
    fn queue_kept(&self) -> bool {
        matches!(self, DatagramKind::Udp | DatagramKind::UdpLite)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Datagram {
    pub from: Addr,
    pub data: Bytes,
}

impl UdpRecord {
    pub fn describe(&self) -> String {
        let at = self.local.map_or_else(|| "unbound".to_string(), |a| a.to_string());
        let kind = self.kind.name();
        match self.remote {
            Some(r) => format!("{kind} {at} -> {r}"),
            None => format!("{kind} {at}"),
        }
    }
}

/// The largest datagram (IPv4 or IPv6, without jumbograms).
const MAX_DATAGRAM: usize = 65536;
/// Bound on the datagrams read from one queue (the queue is bounded by its buffer anyway).
const MAX_QUEUED: usize = 1 << 16;

/// Captures a datagram socket of a stopped process through the restorer's duplicate `s`.
/// Per-checkpoint state: the shutdown state of the UDP and UDP-Lite sockets of each network
/// namespace, family and protocol, listed by sock_diag once (by inode).
#[derive(Default)]
pub struct UdpCaptureState {
    shut: HashMap<(usize, u8, u8), HashMap<u64, u8>>,
}

/// `networks`: the job's network namespaces, the process's among them.
pub fn capture(pid: Tid, fd: i32, ino: u64, s: &OwnedFd, kind: DatagramKind, networks: &JobNetworks, state: &mut UdpCaptureState) -> Result<UdpRecord> {
    let family = getopt_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let reuse = getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
    let queue = if kind.queue_kept() {
        peek_queue(s).map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}: read the {} receive queue", kind.name())))?
    } else {
        // (A ping socket answers no FIONREAD.)
        let readable = inet::poll_one(s, libc::POLLIN, 0).map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}: poll the {} socket", kind.name())))?;
        if readable & libc::POLLIN != 0 {
            return Err(Error::Unsupported {
                pid,
                what: format!("fd {fd} (socket:[{ino}], a {} socket holding a packet not read yet, which the restart could not send it again)", kind.name()),
            });
        }
        Vec::new()
    };
    let (ty, proto) = kind.socket_args(family);
    let remote = match kind {
        DatagramKind::Udp | DatagramKind::UdpLite => inet::peer_addr(s)?,
        DatagramKind::Ping | DatagramKind::Raw { .. } => connected_peer(pid, kind, family, ino)?,
    };
    Ok(UdpRecord {
        ino,
        family,
        local: inet::local_addr(s)?,
        remote,
        queue,
        opts: SockOpts::capture(s, family, ty, proto, reuse)?,
        kind,
        memberships: multicast::capture(pid, fd, s, family)?,
        shutdown: shut(kind, family, ino, pid, networks, state)
            .map_err(|e| Error::from(e).of_object(pid, format!("fd {fd}: ask sock_diag whether it was shut down")))?,
    })
}

/// What shutdown(2) shut on a UDP or UDP-Lite socket (no socket option tells it, and poll(2)
/// shows only a shut receiving side): sock_diag's INET_DIAG_SHUTDOWN. 0 for other kinds.
fn shut(kind: DatagramKind, family: i32, ino: u64, pid: Tid, networks: &JobNetworks, state: &mut UdpCaptureState) -> std::io::Result<u8> {
    let protocol = match kind {
        DatagramKind::Udp => libc::IPPROTO_UDP as u8,
        DatagramKind::UdpLite => libc::IPPROTO_UDPLITE as u8,
        DatagramKind::Ping | DatagramKind::Raw { .. } => return Ok(0),
    };
    let key = (networks.index_of(pid), family as u8, protocol);
    let listed = match state.shut.entry(key) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let all = sockdiag::inet_sockets(networks.diag_of(pid), family as u8, protocol)?;
            e.insert(all.iter().map(|d| (d.ino as u64, d.shutdown & 3)).collect())
        }
    };
    Ok(listed.get(&ino).copied().unwrap_or(0))
}

/// The peer a ping or raw socket is connected to. getpeername reports none for them (they have
/// no port), so it is read from the kernel's table of such sockets in the process's network
/// namespace (/proc/PID/net/icmp, icmp6, raw, raw6; the procfs crate reads none of these).
/// None for a ping socket never bound, which that table does not list.
fn connected_peer(pid: Tid, kind: DatagramKind, family: i32, ino: u64) -> Result<Option<Addr>> {
    let table = match (kind, family == libc::AF_INET6) {
        (DatagramKind::Ping, false) => "icmp",
        (DatagramKind::Ping, true) => "icmp6",
        (_, false) => "raw",
        (_, true) => "raw6",
    };
    let path = format!("/proc/{pid}/net/{table}");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Other(format!("read {path}: {e}")))?;
    match peer_in_table(&text, ino) {
        Some(peer) => Ok(peer),
        // A ping socket is listed once bound (a connect or a first send binds it): one that is
        // not has neither address yet.
        None if kind == DatagramKind::Ping => Ok(None),
        None => Err(Error::Other(format!("socket:[{ino}] is not in {path}"))),
    }
}

/// In the text of such a table, the row of inode `ino`: its remote address if its state is
/// connected (01), else None. None for no such row. Pure.
fn peer_in_table(text: &str, ino: u64) -> Option<Option<Addr>> {
    let row = text.lines().skip(1).map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|w| w.get(9).and_then(|i| i.parse::<u64>().ok()) == Some(ino))?;
    if row.get(3) != Some(&"01") {
        return Some(None);
    }
    let (ip, port) = row.get(2)?.split_once(':')?;
    // Each 32-bit word as the kernel holds it (network order), printed as a number.
    let words: Option<Vec<[u8; 4]>> = (0..ip.len() / 8).map(|i| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok().map(u32::to_ne_bytes)).collect();
    let bytes: Vec<u8> = words?.concat();
    let ip = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => std::net::IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(Some(Addr { ip, port: u16::from_str_radix(port, 16).ok()?, flowinfo: 0, scope_id: 0 }))
}

/// Every datagram of the receive queue, with its sender, without taking any out.
fn peek_queue(s: &OwnedFd) -> std::io::Result<Vec<Datagram>> {
    let old_off = getopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF)?;
    setopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0)?;
    let result = (|| {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while out.len() < MAX_QUEUED {
            let (n, name) = match sys::recv_from(s, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
                Ok(got) => got,
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(out),
                Err(e) => return Err(e),
            };
            let from = Addr::from_sockaddr(&name).ok_or_else(|| std::io::Error::other("a queued datagram without a sender's address"))?;
            out.push(Datagram { from, data: Bytes(buf[..n].to_vec()) });
        }
        Ok(out)
    })();
    setopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old_off)?;
    result
}

/// Per-node state of UDP sockets being restored.
#[derive(Default)]
pub struct UdpRestoreState {
    /// Every restored socket with an address, to send datagrams again from, with its kind
    /// (a UDP-Lite datagram comes from a UDP-Lite socket).
    bound: Vec<(DatagramKind, SocketAddr, OwnedFd)>,
    /// Sockets with datagrams to put back: their kind, where each receives, its datagrams,
    /// "pid N: fd M".
    queued: Vec<(DatagramKind, Addr, Vec<Datagram>, String)>,
    /// What is set on a socket once those datagrams are in.
    late: Vec<Late>,
}

/// What is set on a socket once the datagrams queued in the job are back: the options that
/// could stop them (see [`super::inet_opts::MoreOpts::split_for_refill`]), and its multicast
/// memberships (a datagram to a group could come in ahead of them).
struct Late {
    socket: OwnedFd,
    opts: inet_opts::MoreOpts,
    memberships: Vec<multicast::Membership>,
    /// "pid N: fd M".
    what: String,
}

/// Opens a UDP socket in the task.
pub fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, u: &UdpRecord, state: &mut InetRestoreState, work_base: u64) -> Result<u64> {
    let (ty, proto) = u.kind.socket_args(u.family);
    let (fd, s) = inet::new_socket(task, u.family, ty, proto, work_base)?;
    let what = format!("pid {ns_pid}: fd {}", rec.fd);
    let opts_err = |e| Error::from(e).of_object(ns_pid, format!("fd {}: set socket options", rec.fd));
    let (now, late) = u.opts.more.split_for_refill();
    let opts = inet::SockOpts { more: now, ..u.opts.clone() };
    opts.restore_before_bind(&s, u.family).map_err(opts_err)?;
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, u.opts.reuseaddr as i32).map_err(opts_err)?;
    if let Some(a) = &u.local {
        inet::bind_as_recorded(&s, a).map_err(|e| inet::port_error(&format!("bind a {} socket to", u.kind.name()), a, e))?;
    }
    if let Some(r) = &u.remote {
        inet::connect(&s, r).map_err(|e| Error::from(e).of_object(ns_pid, format!("fd {}: connect a {} socket to {r}", rec.fd, u.kind.name())))?;
    }
    opts.restore(&s).map_err(opts_err)?;
    if let Some(how) = sys::how_to_shut(u.shutdown) {
        // Marks an unconnected socket too (it says ENOTCONN); datagrams still queue to a socket
        // shut for receiving, so its queue is refilled as usual.
        let _ = sys::shutdown(&s, how);
    }
    if late != inet_opts::MoreOpts::default() || !u.memberships.is_empty() {
        state.udp.late.push(Late { socket: s.try_clone()?, opts: late, memberships: u.memberships.clone(), what: what.clone() });
    }
    inet::set_status_flags(&s, rec)?;
    // The address it has now (an unbound socket got one from connect).
    if let Some(a) = inet::local_addr(&s)?.filter(|_| u.kind.queue_kept()) {
        state.udp.bound.push((u.kind, a.normalized(), s.try_clone()?));
    }
    if !u.queue.is_empty() {
        if !u.kind.queue_kept() {
            return Err(Error::Forged { what: format!("{what}: a {} socket with datagrams queued", u.kind.name()) });
        }
        let at = inet::local_addr(&s)?.ok_or_else(|| Error::Other(format!("{what}: a {} socket with datagrams queued but no address", u.kind.name())))?;
        state.udp.queued.push((u.kind, at, u.queue.clone(), what));
    }
    Ok(fd)
}

/// The socket of the job of `kind` that sends from `from`, if any. Pure.
fn sender_for(bound: &[(DatagramKind, SocketAddr, OwnedFd)], kind: DatagramKind, from: SocketAddr) -> Option<&OwnedFd> {
    let of_kind = || bound.iter().filter(|(k, ..)| *k == kind);
    let exact = of_kind().find(|(_, a, _)| *a == from);
    let wildcard = || of_kind().find(|(_, a, _)| a.port() == from.port() && a.ip().is_unspecified() && a.is_ipv4() == from.is_ipv4());
    exact.or_else(wildcard).map(|(.., s)| s)
}

/// Where a datagram must be sent to land in a socket that receives at `at`.
fn destination(at: &Addr) -> Addr {
    if !at.is_unspecified() {
        return *at;
    }
    let ip = match at.ip {
        std::net::IpAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
    };
    Addr { ip, ..*at }
}

fn send_to(s: &OwnedFd, data: &[u8], to: &Addr) -> std::io::Result<()> {
    sys::send_to(s, data, &to.to_sockaddr(), libc::MSG_DONTWAIT).map(drop)
}

/// A socket of the restorer of `kind` bound to `from`, when that address is free.
fn stand_in(kind: DatagramKind, from: &Addr) -> std::io::Result<OwnedFd> {
    let family = if from.ip.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let (ty, proto) = kind.socket_args(family);
    let s = inet::plain_socket(family, ty, proto)?;
    if family == libc::AF_INET6 {
        setopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    }
    inet::bind(&s, from)?;
    Ok(s)
}

/// Sends every queued datagram again from its sender's address, in order.
pub fn finish(state: &mut UdpRestoreState) -> Result<()> {
    for (kind, at, queue, what) in state.queued.drain(..) {
        let to = destination(&at);
        let mut dropped = 0;
        for d in &queue {
            let sent = match sender_for(&state.bound, kind, d.from.normalized()) {
                Some(s) => send_to(s, &d.data.0, &to),
                None => stand_in(kind, &d.from).and_then(|s| send_to(&s, &d.data.0, &to)),
            };
            if let Err(e) = sent {
                warn!("{what}: a datagram of {} bytes from {} is dropped: {e}", d.data.0.len(), d.from);
                dropped += 1;
            }
        }
        if dropped > 0 {
            warn!("{what}: {dropped} of {} queued datagrams could not be put back", queue.len());
        }
    }
    state.bound.clear();
    for late in state.late.drain(..) {
        let s = &late.socket;
        late.opts.restore_before_bind(s).and_then(|_| late.opts.restore(s)).map_err(|e| Error::Other(format!("{}: set socket options: {e}", late.what)))?;
        multicast::join_again(s, &late.memberships).map_err(|e| Error::Other(format!("{}: {e}", late.what)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_or_raw_sockets_peer_is_read_from_the_kernels_table() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n   \
                  52: 0100007F:D25B 0200007F:0000 01 00000000:00000000 00:00000000 00000000     0        0 4546353 2 00000000d1506911 0\n   \
                  53: 0100007F:D25C 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4546355 2 00000000d1506911 0\n";
        assert_eq!(peer_in_table(v4, 4546353).unwrap().unwrap().to_string(), "127.0.0.2:0");
        assert_eq!(peer_in_table(v4, 4546355), Some(None));
        assert_eq!(peer_in_table(v4, 1), None);
        let v6 = "  sl  local_address remote_address st ...\n   \
                  53: 00000000000000000000000001000000:D25C 00000000000000000000000001000000:0000 01 00000000:00000000 00:00000000 00000000     0        0 4546354 2 00000000a33a7e16 0\n";
        assert_eq!(peer_in_table(v6, 4546354).unwrap().unwrap().ip, "::1".parse::<std::net::IpAddr>().unwrap());
    }

    #[test]
    fn datagrams_to_a_wildcard_socket_go_to_loopback() {
        let any = Addr::from_std("0.0.0.0:9000".parse().unwrap());
        assert_eq!(destination(&any).to_string(), "127.0.0.1:9000");
        let any6 = Addr::from_std("[::]:9000".parse().unwrap());
        assert_eq!(destination(&any6).to_string(), "[::1]:9000");
        let one = Addr::from_std("127.0.0.2:9000".parse().unwrap());
        assert_eq!(destination(&one), one);
    }

    #[test]
    fn a_datagram_is_queued_and_peeked_with_its_sender() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        b.send_to(b"one", a.local_addr().unwrap()).unwrap();
        b.send_to(b"", a.local_addr().unwrap()).unwrap();
        b.send_to(b"three", a.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let s: OwnedFd = a.try_clone().unwrap().into();
        let q = peek_queue(&s).unwrap();
        let got: Vec<&[u8]> = q.iter().map(|d| d.data.0.as_slice()).collect();
        assert_eq!(got, vec![&b"one"[..], b"", b"three"]);
        assert!(q.iter().all(|d| d.from.normalized() == b.local_addr().unwrap()));
        // Nothing was taken out, and the peek offset is back to "none".
        let mut buf = [0u8; 16];
        assert_eq!(a.recv(&mut buf).unwrap(), 3);
        assert_eq!(getopt_int(&s, libc::SOL_SOCKET, libc::SO_PEEK_OFF).unwrap(), -1);
    }
}
