//! UDP sockets, IPv4 and IPv6: the bound and connected addresses, options, and the datagrams
//! queued and not read yet.
//!
//! Capture reads the receive queue without taking anything out (MSG_PEEK with SO_PEEK_OFF, one
//! datagram at a time, each with its sender's address). At restart a datagram must come again
//! from the same address, or the program would see another sender: the rule is that it is sent
//! again by the socket of the job bound to that address, once every socket exists; if no socket
//! of the job has it (the sender is outside the job, or closed its socket), by a socket of the
//! restorer bound to that address if it is free; otherwise the datagram is dropped (with a
//! warning), as the network may drop any datagram.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::fd::FdRecord;
use super::inet::{self, getopt_int, setopt_int, Addr, Bytes, InetRestoreState, SockOpts};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};

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
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Datagram {
    pub from: Addr,
    pub data: Bytes,
}

impl UdpRecord {
    pub fn describe(&self) -> String {
        let at = self.local.map_or_else(|| "unbound".to_string(), |a| a.to_string());
        match self.remote {
            Some(r) => format!("UDP {at} -> {r}"),
            None => format!("UDP {at}"),
        }
    }
}

/// The largest datagram (IPv4 or IPv6, without jumbograms).
const MAX_DATAGRAM: usize = 65536;
/// Bound on the datagrams read from one queue (the queue is bounded by its buffer anyway).
const MAX_QUEUED: usize = 1 << 16;

/// Captures a UDP socket of a stopped process through the restorer's duplicate `s`.
pub fn capture(pid: Tid, fd: i32, ino: u64, s: &OwnedFd) -> Result<UdpRecord> {
    let family = getopt_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let reuse = getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR)? != 0;
    let queue = peek_queue(s).map_err(|e| Error::Other(format!("pid {pid}: fd {fd}: read the UDP receive queue: {e}")))?;
    Ok(UdpRecord {
        ino,
        family,
        local: inet::local_addr(s)?,
        remote: inet::peer_addr(s)?,
        queue,
        opts: SockOpts::capture(s, family, libc::SOCK_DGRAM, reuse)?,
    })
}

/// Every datagram of the receive queue, with its sender, without taking any out.
fn peek_queue(s: &OwnedFd) -> std::io::Result<Vec<Datagram>> {
    let old_off = getopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF)?;
    setopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0)?;
    let result = (|| {
        let mut out = Vec::new();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while out.len() < MAX_QUEUED {
            let mut name = [0u8; 128];
            let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buf.len() };
            // SAFETY: msghdr points at live buffers of the sizes given.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = name.as_mut_ptr() as *mut _;
            msg.msg_namelen = name.len() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            // SAFETY: as above.
            let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    return Ok(out);
                }
                return Err(e);
            }
            let from = Addr::from_sockaddr(&name[..(msg.msg_namelen as usize).min(name.len())])
                .ok_or_else(|| std::io::Error::other("a queued datagram without a sender's address"))?;
            out.push(Datagram { from, data: Bytes(buf[..n as usize].to_vec()) });
        }
        Ok(out)
    })();
    setopt_int(s, libc::SOL_SOCKET, libc::SO_PEEK_OFF, old_off)?;
    result
}

/// Per-node state of UDP sockets being restored.
#[derive(Default)]
pub struct UdpRestoreState {
    /// Every restored socket with an address, to send datagrams again from.
    bound: Vec<(SocketAddr, OwnedFd)>,
    /// Sockets with datagrams to put back: where each receives, its datagrams, "pid N: fd M".
    queued: Vec<(Addr, Vec<Datagram>, String)>,
    /// Every socket's options that could stop those datagrams, set once they are in (see
    /// [`super::inet_opts::MoreOpts::split_for_refill`]), with "pid N: fd M".
    late: Vec<(OwnedFd, super::inet_opts::MoreOpts, String)>,
}

/// Opens a UDP socket in the task.
pub fn open(
    task: &mut RemoteTask,
    ns_pid: Tid,
    rec: &FdRecord,
    u: &UdpRecord,
    state: &mut InetRestoreState,
    work_base: u64,
) -> Result<u64> {
    let (fd, s) = inet::new_socket(task, u.family, libc::SOCK_DGRAM, libc::IPPROTO_UDP, work_base)?;
    let what = format!("pid {ns_pid}: fd {}", rec.fd);
    let opts_err = |e| Error::Other(format!("{what}: set socket options: {e}"));
    let (now, late) = u.opts.more.split_for_refill();
    let opts = inet::SockOpts { more: now, ..u.opts.clone() };
    opts.restore_before_bind(&s, u.family).map_err(opts_err)?;
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_REUSEADDR, u.opts.reuseaddr as i32).map_err(opts_err)?;
    if let Some(a) = &u.local {
        inet::bind(&s, a).map_err(|e| inet::port_error("bind a UDP socket to", a, e))?;
    }
    if let Some(r) = &u.remote {
        inet::connect(&s, r).map_err(|e| Error::Other(format!("{what}: connect a UDP socket to {r}: {e}")))?;
    }
    opts.restore(&s).map_err(opts_err)?;
    state.udp.late.push((s.try_clone()?, late, what.clone()));
    inet::set_status_flags(&s, rec)?;
    // The address it has now (an unbound socket got one from connect).
    if let Some(a) = inet::local_addr(&s)? {
        state.udp.bound.push((a.normalized(), s.try_clone()?));
    }
    if !u.queue.is_empty() {
        let at = inet::local_addr(&s)?.ok_or_else(|| Error::Other(format!("{what}: a UDP socket with datagrams queued but no address")))?;
        state.udp.queued.push((at, u.queue.clone(), what));
    }
    Ok(fd)
}

/// The socket of the job that sends from `from`, if any. Pure.
fn sender_for(bound: &[(SocketAddr, OwnedFd)], from: SocketAddr) -> Option<&OwnedFd> {
    let exact = bound.iter().find(|(a, _)| *a == from);
    let wildcard = || bound.iter().find(|(a, _)| a.port() == from.port() && a.ip().is_unspecified() && a.is_ipv4() == from.is_ipv4());
    exact.or_else(wildcard).map(|(_, s)| s)
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
    let sa = to.to_sockaddr();
    // SAFETY: `data` and `sa` are valid for their lengths.
    let n = unsafe {
        libc::sendto(
            s.as_raw_fd(),
            data.as_ptr() as *const _,
            data.len(),
            libc::MSG_DONTWAIT,
            sa.as_ptr() as *const libc::sockaddr,
            sa.len() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A socket of the restorer bound to `from`, when that address is free.
fn stand_in(from: &Addr) -> std::io::Result<OwnedFd> {
    let family = if from.ip.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let s = inet::plain_socket(family, libc::SOCK_DGRAM, 0)?;
    if family == libc::AF_INET6 {
        setopt_int(&s, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    }
    inet::bind(&s, from)?;
    Ok(s)
}

/// Sends every queued datagram again from its sender's address, in order.
pub fn finish(state: &mut UdpRestoreState) -> Result<()> {
    for (at, queue, what) in state.queued.drain(..) {
        let to = destination(&at);
        let mut dropped = 0;
        for d in &queue {
            let sent = match sender_for(&state.bound, d.from.normalized()) {
                Some(s) => send_to(s, &d.data.0, &to),
                None => stand_in(&d.from).and_then(|s| send_to(&s, &d.data.0, &to)),
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
    for (s, late, what) in state.late.drain(..) {
        late.restore_before_bind(&s).and_then(|_| late.restore(&s)).map_err(|e| Error::Other(format!("{what}: set socket options: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
