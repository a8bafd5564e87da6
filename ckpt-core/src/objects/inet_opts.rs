//! The options of a TCP or UDP socket beyond those [`super::inet::SockOpts`] names one by one:
//! the device it is bound to (SO_BINDTODEVICE), its classic BPF filter (SO_ATTACH_FILTER, and
//! SO_LOCK_FILTER), and a table of options kept as the kernel gives them (IP_TOS, IP_TTL,
//! multicast TTL and loop, IP_RECVERR, IP_PKTINFO, IP_FREEBIND, SO_PRIORITY, SO_MARK,
//! SO_RCVLOWAT, timestamping, their IPv6 and UDP counterparts, ...).
//!
//! The table's options are recorded only where they differ from a new socket's of the same
//! family, type and protocol, read once per kind (most sockets set none, and their records stay
//! as they were); restore sets what was recorded, so a socket comes back with each option the
//! program set, or the restart says which one it could not set (SO_MARK and IP_TRANSPARENT
//! need CAP_NET_ADMIN).
//!
//! Not kept: eBPF filters (SO_ATTACH_BPF: the kernel gives no program back), which are
//! refused. A datagram socket's multicast memberships are [`super::multicast`]'s.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::inet::{getopt_bytes, getopt_int, setopt_bytes, setopt_int};
use crate::sys::socket::{attach_filter, filter as read_filter, filter_len as filter_count};

/// When an option is set at restore: before bind(2) (it changes which addresses and devices
/// the socket may take), or last, once queues are put back (IP_MINTTL would drop the
/// restorer's own datagrams).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    BeforeBind,
    Last,
}

/// An option of the table: (level, name, its name for messages, the most bytes it has, when).
type Known = (i32, i32, &'static str, usize, When);

const INT: usize = 4;
const IP_OPTIONS_MAX: usize = 40;

// Options libc does not name (include/uapi/linux/*.h).
const SO_RCVMARK: i32 = 75;
const IP_RECVERR_RFC4884: i32 = 26;
const IP_RECVFRAGSIZE: i32 = 25;
const IP_BIND_ADDRESS_NO_PORT: i32 = 24;
const IPV6_RECVFRAGSIZE: i32 = 77;
const UDP_SEGMENT: i32 = 103;
const UDP_GRO: i32 = 104;
const UDPLITE_SEND_CSCOV: i32 = 10;
const UDPLITE_RECV_CSCOV: i32 = 11;
const SOL_RAW: i32 = 255;
const ICMP_FILTER: i32 = 1;
const ICMPV6_FILTER: i32 = 1;

/// Options of every socket (SOL_SOCKET). Not here: those `SockOpts` names, and those the kernel
/// changes by itself (SO_INCOMING_CPU).
const SOCKET: &[Known] = &[
    (libc::SOL_SOCKET, libc::SO_PRIORITY, "SO_PRIORITY", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_MARK, "SO_MARK", INT, When::BeforeBind),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT, "SO_RCVLOWAT", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_DONTROUTE, "SO_DONTROUTE", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE, "SO_OOBINLINE", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_NO_CHECK, "SO_NO_CHECK", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_PASSCRED, "SO_PASSCRED", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_TIMESTAMP, "SO_TIMESTAMP", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, "SO_TIMESTAMPNS", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_TIMESTAMPING, "SO_TIMESTAMPING", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_RXQ_OVFL, "SO_RXQ_OVFL", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_SELECT_ERR_QUEUE, "SO_SELECT_ERR_QUEUE", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_BUSY_POLL, "SO_BUSY_POLL", INT, When::Last),
    (libc::SOL_SOCKET, libc::SO_ZEROCOPY, "SO_ZEROCOPY", INT, When::Last),
    (libc::SOL_SOCKET, SO_RCVMARK, "SO_RCVMARK", INT, When::Last),
];

/// IPv4 options (IPPROTO_IP), of AF_INET sockets.
const IP: &[Known] = &[
    (libc::IPPROTO_IP, libc::IP_TOS, "IP_TOS", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_TTL, "IP_TTL", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_OPTIONS, "IP_OPTIONS", IP_OPTIONS_MAX, When::Last),
    (libc::IPPROTO_IP, libc::IP_RECVOPTS, "IP_RECVOPTS", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_RETOPTS, "IP_RETOPTS", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_PKTINFO, "IP_PKTINFO", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, "IP_MTU_DISCOVER", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_RECVERR, "IP_RECVERR", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_RECVTTL, "IP_RECVTTL", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_RECVTOS, "IP_RECVTOS", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_FREEBIND, "IP_FREEBIND", INT, When::BeforeBind),
    (libc::IPPROTO_IP, libc::IP_TRANSPARENT, "IP_TRANSPARENT", INT, When::BeforeBind),
    (libc::IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, "IP_BIND_ADDRESS_NO_PORT", INT, When::BeforeBind),
    (libc::IPPROTO_IP, libc::IP_RECVORIGDSTADDR, "IP_RECVORIGDSTADDR", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_MINTTL, "IP_MINTTL", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_NODEFRAG, "IP_NODEFRAG", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_CHECKSUM, "IP_CHECKSUM", INT, When::Last),
    (libc::IPPROTO_IP, IP_RECVFRAGSIZE, "IP_RECVFRAGSIZE", INT, When::Last),
    (libc::IPPROTO_IP, IP_RECVERR_RFC4884, "IP_RECVERR_RFC4884", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_HDRINCL, "IP_HDRINCL", INT, When::Last),
];

/// IPv6 options (IPPROTO_IPV6), of AF_INET6 sockets (IPV6_V6ONLY is `SockOpts`'s).
const IPV6: &[Known] = &[
    (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, "IPV6_UNICAST_HOPS", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, "IPV6_MTU_DISCOVER", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVERR, "IPV6_RECVERR", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, "IPV6_RECVPKTINFO", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, "IPV6_RECVHOPLIMIT", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, "IPV6_RECVTCLASS", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, "IPV6_TCLASS", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, "IPV6_DONTFRAG", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVPATHMTU, "IPV6_RECVPATHMTU", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_AUTOFLOWLABEL, "IPV6_AUTOFLOWLABEL", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVORIGDSTADDR, "IPV6_RECVORIGDSTADDR", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_FREEBIND, "IPV6_FREEBIND", INT, When::BeforeBind),
    (libc::IPPROTO_IPV6, libc::IPV6_TRANSPARENT, "IPV6_TRANSPARENT", INT, When::BeforeBind),
    (libc::IPPROTO_IPV6, IPV6_RECVFRAGSIZE, "IPV6_RECVFRAGSIZE", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_CHECKSUM, "IPV6_CHECKSUM", INT, When::Last),
];

/// Multicast options, of datagram sockets (a TCP socket refuses them, though an accepted one
/// reports the TTL of the SYN that made it as its multicast TTL).
const IP_MULTICAST: &[Known] = &[
    (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, "IP_MULTICAST_TTL", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, "IP_MULTICAST_LOOP", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_IF, "IP_MULTICAST_IF", INT, When::Last),
    (libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, "IP_MULTICAST_ALL", INT, When::Last),
];
const IPV6_MULTICAST: &[Known] = &[
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, "IPV6_MULTICAST_IF", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, "IPV6_MULTICAST_HOPS", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP, "IPV6_MULTICAST_LOOP", INT, When::Last),
    (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_ALL, "IPV6_MULTICAST_ALL", INT, When::Last),
];

/// UDP-Lite's checksum coverage (IPPROTO_UDPLITE), of UDP-Lite sockets.
const UDPLITE: &[Known] = &[
    (libc::IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV, "UDPLITE_SEND_CSCOV", INT, When::Last),
    (libc::IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV, "UDPLITE_RECV_CSCOV", INT, When::Last),
];

/// The ICMP types a raw ICMP socket lets through (ICMP_FILTER, SOL_RAW; ICMPV6_FILTER, a
/// 256-bit mask, for ICMPv6).
const RAW_ICMP: &[Known] = &[(SOL_RAW, ICMP_FILTER, "ICMP_FILTER", INT, When::Last)];
const RAW_ICMPV6: &[Known] = &[(libc::IPPROTO_ICMPV6, ICMPV6_FILTER, "ICMPV6_FILTER", 32, When::Last)];

/// UDP options (IPPROTO_UDP), of UDP and UDP-Lite sockets.
const UDP: &[Known] = &[
    (libc::IPPROTO_UDP, libc::UDP_CORK, "UDP_CORK", INT, When::Last),
    (libc::IPPROTO_UDP, UDP_SEGMENT, "UDP_SEGMENT", INT, When::Last),
    (libc::IPPROTO_UDP, UDP_GRO, "UDP_GRO", INT, When::Last),
];

/// Every table, for lookups by level and name.
const ALL: &[&[Known]] = &[SOCKET, IP, IP_MULTICAST, IPV6, IPV6_MULTICAST, UDP, UDPLITE, RAW_ICMP, RAW_ICMPV6];

/// The table's options that apply to a socket of `family`, `ty` and `proto`, in the order
/// restore sets them: IP's before the socket's own, since setting IP_TOS sets SO_PRIORITY too.
fn known(family: i32, ty: i32, proto: i32) -> impl Iterator<Item = &'static Known> {
    let v6 = family == libc::AF_INET6;
    let ip: &[Known] = if v6 { IPV6 } else { IP };
    let multicast: &[Known] = match (ty, v6) {
        (libc::SOCK_STREAM, _) => &[],
        (_, true) => IPV6_MULTICAST,
        (_, false) => IP_MULTICAST,
    };
    let own: &[&[Known]] = match (ty, proto) {
        (libc::SOCK_DGRAM, libc::IPPROTO_UDP) => &[UDP],
        (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE) => &[UDP, UDPLITE],
        (libc::SOCK_RAW, libc::IPPROTO_ICMP) => &[RAW_ICMP],
        (libc::SOCK_RAW, libc::IPPROTO_ICMPV6) => &[RAW_ICMPV6],
        _ => &[],
    };
    ip.iter().chain(multicast).chain(SOCKET).chain(own.iter().flat_map(|t| t.iter()))
}

/// A table option by level and name.
fn find(level: i32, name: i32) -> Option<&'static Known> {
    ALL.iter().flat_map(|t| t.iter()).find(|k| k.0 == level && k.1 == name)
}

/// One option as the kernel gave it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RawOpt {
    pub level: i32,
    pub name: i32,
    pub value: Vec<u8>,
}

impl RawOpt {
    /// When it is set at restore (an option not in the table, from a newer ckpt: last).
    fn when(&self) -> When {
        find(self.level, self.name).map_or(When::Last, |k| k.4)
    }
}

/// What this module keeps of a socket (format 13; nothing from older images).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MoreOpts {
    /// SO_BINDTODEVICE: the interface's name.
    pub device: Option<String>,
    /// The classic BPF filter attached, 8 bytes an instruction (struct sock_filter).
    pub filter: Vec<[u8; 8]>,
    /// SO_LOCK_FILTER: the filter cannot be changed or removed.
    pub filter_locked: bool,
    /// The table's options that differ from a new socket's.
    pub others: Vec<RawOpt>,
}

/// The table's options of one socket, in the table's order (None: the kernel does not know it).
type Values = Vec<Option<Vec<u8>>>;

/// The table's options of new sockets, by (family, type, protocol): read once per kind.
type Defaults = HashMap<(i32, i32, i32), Values>;
static DEFAULTS: Mutex<Option<Defaults>> = Mutex::new(None);

/// Reads the table's options of `s`.
fn read_known(s: &OwnedFd, family: i32, ty: i32, proto: i32) -> Values {
    known(family, ty, proto).map(|&(level, name, _, len, _)| getopt_bytes(s, level, name, len).ok()).collect()
}

/// The table's options whose values (`now`, in the table's order) differ from a new socket's
/// of the same kind, read once per kind and kept.
fn differing(now: Values, family: i32, ty: i32, proto: i32) -> std::io::Result<Vec<RawOpt>> {
    let mut cache = DEFAULTS.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = match cache.get_or_insert_with(HashMap::new).entry((family, ty, proto)) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            // A raw socket needs CAP_NET_RAW, which the job may have had (a program with the
            // file capability) and the capture not: then a UDP socket's, which share every
            // option but the raw ones (recorded whatever they are then, and set again as they
            // were).
            let fresh = super::inet::plain_socket(family, ty, proto).or_else(|e| match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => super::inet::plain_socket(family, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
                _ => Err(e),
            })?;
            v.insert(read_known(&fresh, family, ty, proto))
        }
    };
    Ok(known(family, ty, proto)
        .zip(now)
        .zip(fresh.iter())
        .filter_map(|((&(level, name, ..), now), fresh)| match now {
            Some(value) if Some(&value) != fresh.as_ref() => Some(RawOpt { level, name, value }),
            _ => None,
        })
        .collect())
}

impl MoreOpts {
    /// Reads them from a socket the restorer holds, of `family`, `ty` and `proto`.
    /// An eBPF filter fails the read ([`has_ebpf_filter`] says so first).
    pub fn capture(s: &OwnedFd, family: i32, ty: i32, proto: i32) -> std::io::Result<MoreOpts> {
        let device = getopt_bytes(s, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, libc::IFNAMSIZ)?;
        let device = String::from_utf8_lossy(&device).trim_end_matches('\0').to_string();
        let filter = read_filter(s)?;
        let filter_locked = !filter.is_empty() && getopt_int(s, libc::SOL_SOCKET, libc::SO_LOCK_FILTER)? != 0;
        let others = differing(read_known(s, family, ty, proto), family, ty, proto)?;
        Ok(MoreOpts { device: (!device.is_empty()).then_some(device), filter, filter_locked, others })
    }

    fn set_others(&self, s: &OwnedFd, when: When) -> std::io::Result<()> {
        for o in &self.others {
            if o.when() == when {
                setopt_bytes(s, o.level, o.name, &o.value).map_err(|e| {
                    let hint = if e.raw_os_error() == Some(libc::EPERM) { " (the job set it with a capability the restart does not have)" } else { "" };
                    std::io::Error::new(e.kind(), format!("set {}: {e}{hint}", find(o.level, o.name).map_or("an option", |k| k.2)))
                })?;
            }
        }
        Ok(())
    }

    /// Split in two for a UDP socket: what it needs before the restart puts datagrams back in
    /// the job's queues (its own and its senders'), and what could stop them, set once they are
    /// in: the device (a datagram over loopback neither leaves nor comes in on another), the
    /// filter, and IP_MINTTL (the restart's datagrams have the sender's TTL, the receiver's
    /// floor may be above it). The rest stays before, so a datagram put back from a sender of
    /// the job has that sender's TTL and TOS as it had. Pure.
    pub fn split_for_refill(&self) -> (MoreOpts, MoreOpts) {
        let blocks = |o: &RawOpt| (o.level, o.name) == (libc::IPPROTO_IP, libc::IP_MINTTL);
        let now = MoreOpts { others: self.others.iter().filter(|o| !blocks(o)).cloned().collect(), ..MoreOpts::default() };
        let after = MoreOpts {
            device: self.device.clone(),
            filter: self.filter.clone(),
            filter_locked: self.filter_locked,
            others: self.others.iter().filter(|o| blocks(o)).cloned().collect(),
        };
        (now, after)
    }

    /// What must be set before bind(2): the device and the options that allow other addresses.
    pub fn restore_before_bind(&self, s: &OwnedFd) -> std::io::Result<()> {
        if let Some(device) = &self.device {
            setopt_bytes(s, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, device.as_bytes())
                .map_err(|e| std::io::Error::new(e.kind(), format!("bind the socket to the device {device} (SO_BINDTODEVICE): {e}")))?;
        }
        self.set_others(s, When::BeforeBind)
    }

    /// The rest, last: the filter (and its lock) and the table's other options.
    pub fn restore(&self, s: &OwnedFd) -> std::io::Result<()> {
        if !self.filter.is_empty() {
            attach_filter(s, &self.filter)?;
            if self.filter_locked {
                setopt_int(s, libc::SOL_SOCKET, libc::SO_LOCK_FILTER, 1)?;
            }
        }
        self.set_others(s, When::Last)
    }
}

/// Whether the filter attached to a socket is an eBPF program (SO_ATTACH_BPF), which the kernel
/// gives no program back of: SO_GET_FILTER refuses it with EACCES.
pub fn has_ebpf_filter(s: &OwnedFd) -> std::io::Result<bool> {
    match filter_count(s) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(true),
        r => r.map(|_| false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp() -> OwnedFd {
        super::super::inet::plain_socket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP).unwrap()
    }

    #[test]
    fn a_new_socket_records_nothing() {
        assert_eq!(MoreOpts::capture(&udp(), libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP).unwrap(), MoreOpts::default());
    }

    #[test]
    fn what_a_program_sets_comes_back() {
        let s = udp();
        setopt_int(&s, libc::IPPROTO_IP, libc::IP_TOS, 0x10).unwrap();
        setopt_int(&s, libc::IPPROTO_IP, libc::IP_TTL, 7).unwrap();
        setopt_int(&s, libc::SOL_SOCKET, libc::SO_PRIORITY, 3).unwrap();
        setopt_int(&s, libc::IPPROTO_IP, libc::IP_RECVERR, 1).unwrap();
        // A filter that accepts every packet whole: ret #-1.
        let accept: [u8; 8] = [0x06, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
        attach_filter(&s, &[accept]).unwrap();
        let more = MoreOpts::capture(&s, libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP).unwrap();
        assert_eq!(more.others.len(), 4, "{more:?}");
        assert_eq!(more.filter, vec![accept]);

        let back = udp();
        more.restore_before_bind(&back).unwrap();
        more.restore(&back).unwrap();
        assert_eq!(MoreOpts::capture(&back, libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_UDP).unwrap(), more);
        assert_eq!(getopt_int(&back, libc::IPPROTO_IP, libc::IP_TTL).unwrap(), 7);
    }
}
