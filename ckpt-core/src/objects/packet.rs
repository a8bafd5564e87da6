//! Packet sockets (packet(7)): a program's line to a network device below IP, as capture
//! tools, DHCP clients and link-layer agents hold. Only root makes them (CAP_NET_RAW).
//!
//! What the socket is, not what it carries: its type (SOCK_RAW, the link-level header
//! included, or SOCK_DGRAM), the protocol it receives, the interface it is bound to (by name: a
//! restart on another node binds to the interface of that name there, and says so when there
//! is none), its memberships (promiscuous and all-multicast mode, multicast and unicast
//! addresses, each as often as it was added), a classic filter, its buffer sizes and its
//! options (PACKET_VERSION, PACKET_RESERVE, PACKET_COPY_THRESH, PACKET_TIMESTAMP,
//! PACKET_AUXDATA, PACKET_ORIGDEV, PACKET_VNET_HDR, PACKET_LOSS). sock_diag shows all of them
//! ([`crate::sockdiag::packet_sockets`]); the filter comes from SO_GET_FILTER.
//!
//! Refused at the checkpoint, naming the socket: a ring set up for memory-mapped frames
//! (PACKET_RX_RING, PACKET_TX_RING: the frames and the ring's position live between the
//! process's memory and the kernel, which shows neither), a fanout group, an eBPF filter (no
//! program comes back from the kernel). Packets queued and not read cannot be put back (they
//! came from the wire): a passing state, as a capture reads packets as they come; at the
//! checkpoint's last try they are let go, with a warning, as packets a busy capture drops.

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use super::inet::{self, getopt_int, setopt_bytes, setopt_int};
use super::net_namespaces::JobNetworks;
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sockdiag::{self, PacketDiag};
use crate::sys::socket as sys;

const SOL_PACKET: i32 = 263;
/// The PDI_* flags of sock_diag's packet information, each the option it stands for.
const FLAG_OPTIONS: &[(u32, i32, &str)] = &[
    (0x2, libc::PACKET_AUXDATA, "PACKET_AUXDATA"),
    (0x4, libc::PACKET_ORIGDEV, "PACKET_ORIGDEV"),
    (0x8, libc::PACKET_VNET_HDR, "PACKET_VNET_HDR"),
    (0x10, libc::PACKET_LOSS, "PACKET_LOSS"),
];
/// The socket type of the obsolete interface (libc deprecates the name, telling programs to use
/// SOCK_RAW or SOCK_DGRAM; the kernel still makes such sockets, and a job may hold one).
const SOCK_PACKET: i32 = 10;
/// The options kept with their value.
const VALUE_OPTIONS: &[i32] = &[libc::PACKET_VERSION, libc::PACKET_RESERVE, libc::PACKET_COPY_THRESH, libc::PACKET_TIMESTAMP];
/// Most memberships a record may list, and the longest address one may hold (MAX_ADDR_LEN).
pub const MAX_MEMBERSHIPS: usize = 256;
const MAX_ADDR_LEN: usize = 32;
/// Longest classic filter (BPF_MAXINSNS).
const MAX_FILTER: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PacketRecord {
    /// SOCK_RAW, SOCK_DGRAM, or SOCK_PACKET (the obsolete interface of Linux 2.0, still in
    /// the kernel: bound by interface name, no options or memberships).
    pub ty: i32,
    /// The protocol it receives, in network byte order (0: none until bound).
    pub protocol: u16,
    /// The interface it is bound to (None: every interface).
    pub interface: Option<String>,
    pub memberships: Vec<Membership>,
    /// Options of [`FLAG_OPTIONS`] and [`VALUE_OPTIONS`] that are not 0: (option, value).
    pub options: Vec<(i32, i32)>,
    /// The classic filter attached, 8 bytes an instruction (none: empty).
    pub filter: Vec<[u8; 8]>,
    pub rcvbuf: i32,
    pub sndbuf: i32,
}

/// One membership (PACKET_ADD_MEMBERSHIP).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Membership {
    pub interface: String,
    /// PACKET_MR_MULTICAST, PACKET_MR_PROMISC, PACKET_MR_ALLMULTI, PACKET_MR_UNICAST.
    pub kind: u16,
    /// How many times it was added (each drop takes one).
    pub count: u32,
    pub address: Vec<u8>,
}

/// sock_diag's packet sockets, dumped once per network namespace per checkpoint (a dump lists
/// every packet socket of the namespace: once per socket would repeat it while the job is
/// frozen).
#[derive(Default)]
pub struct PacketCaptureState {
    dumped: HashMap<usize, HashMap<u32, PacketDiag>>,
}

/// Captures a packet socket, `s` a duplicate of process `pid`'s descriptor `fd`; `last_try`:
/// the checkpoint's last try, when queued packets are let go (see the module).
/// `networks`: the job's network namespaces, whose dumps `state` keeps.
pub fn capture(pid: Tid, fd: i32, ino: u64, s: &OwnedFd, (networks, state): (&JobNetworks, &mut PacketCaptureState), last_try: bool) -> Result<PacketRecord> {
    let what = |e: std::io::Error| Error::from(e).of_object(pid, format!("fd {fd} (socket:[{ino}], a packet socket)"));
    let refuse = |why: &str| Error::Unsupported { pid, what: format!("fd {fd} (socket:[{ino}], a packet socket {why})") };
    let netns = networks.index_of(pid);
    let dump = match state.dumped.entry(netns) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => e.insert(sockdiag::packet_sockets(networks.diag_of(pid)).map_err(what)?),
    };
    let d: PacketDiag =
        dump.get(&(ino as u32)).cloned().ok_or_else(|| what(std::io::Error::other("sock_diag does not list it (a socket of another network namespace?)")))?;
    if d.ring {
        return Err(refuse("with a ring of memory-mapped frames (PACKET_RX_RING or PACKET_TX_RING), whose position the kernel does not show"));
    }
    if d.fanout {
        return Err(refuse("in a fanout group (PACKET_FANOUT)"));
    }
    if super::inet_opts::has_ebpf_filter(s).map_err(what)? {
        return Err(refuse("with an eBPF filter attached: no program comes back from the kernel"));
    }
    let queued = inet::ioctl_int(s, libc::FIONREAD).map_err(what)?;
    if queued > 0 && !last_try {
        return Err(Error::Passing {
            pid,
            what: format!("fd {fd} (socket:[{ino}], a packet socket) holds packets not read yet ({queued} bytes first), which cannot be put back"),
        });
    }
    if queued > 0 {
        warn!(
            pid,
            fd,
            socket = ino,
            "packets queued on a packet socket at the checkpoint's last try are not kept in the image: a restart misses them, as a busy capture drops packets"
        );
    }
    let name_of = |index: i32| nix::net::if_::if_indextoname(index as u32).map(|n| n.to_string_lossy().into_owned()).map_err(|e| what(e.into()));
    let interface = if d.ifindex != 0 { Some(name_of(d.ifindex)?) } else { None };
    let memberships = d
        .memberships
        .iter()
        .map(|m| Ok(Membership { interface: name_of(m.ifindex)?, kind: m.kind, count: m.count, address: m.address.clone() }))
        .collect::<Result<Vec<_>>>()?;
    let mut options: Vec<(i32, i32)> = FLAG_OPTIONS.iter().filter(|(flag, _, _)| d.flags & flag != 0).map(|&(_, opt, _)| (opt, 1)).collect();
    for (opt, value) in VALUE_OPTIONS.iter().zip([d.version, d.reserve, d.copy_thresh, d.tstamp]) {
        if value != 0 {
            options.push((*opt, value as i32));
        }
    }
    Ok(PacketRecord {
        ty: d.sock_type as i32,
        protocol: d.protocol,
        interface,
        memberships,
        options,
        filter: sys::filter(s).map_err(what)?,
        rcvbuf: getopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF).map_err(what)?,
        sndbuf: getopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF).map_err(what)?,
    })
}

/// Checks what [`open`] would act on. Pure.
pub fn validate(r: &PacketRecord) -> std::result::Result<(), String> {
    if !matches!(r.ty, libc::SOCK_RAW | libc::SOCK_DGRAM | SOCK_PACKET) {
        return Err(format!("type {}", r.ty));
    }
    if r.ty == SOCK_PACKET && !(r.options.is_empty() && r.memberships.is_empty()) {
        return Err("SOCK_PACKET with packet options or memberships, which it has none of".into());
    }
    let known = |opt: i32| FLAG_OPTIONS.iter().any(|&(_, o, _)| o == opt) || VALUE_OPTIONS.contains(&opt);
    if let Some((opt, _)) = r.options.iter().find(|(opt, _)| !known(*opt)) {
        return Err(format!("option {opt}"));
    }
    if r.memberships.len() > MAX_MEMBERSHIPS || r.memberships.iter().any(|m| m.address.len() > MAX_ADDR_LEN || m.count > 1 << 16) {
        return Err(format!("{} memberships", r.memberships.len()));
    }
    if r.filter.len() > MAX_FILTER {
        return Err(format!("a filter of {} instructions", r.filter.len()));
    }
    let names = r.interface.iter().chain(r.memberships.iter().map(|m| &m.interface));
    if let Some(n) = names.into_iter().find(|n| n.is_empty() || n.len() >= libc::IFNAMSIZ || n.contains(['\0', '/'])) {
        return Err(format!("interface name {n:?}"));
    }
    Ok(())
}

impl DescriptorKind for PacketRecord {
    fn describe(&self) -> String {
        format!("packet socket (protocol {:#06x}, {})", u16::from_be(self.protocol), self.interface.as_deref().unwrap_or("every interface"))
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.work_base)
    }
}

/// Opens the packet socket in the task: the same type and protocol, options, filter, bound to
/// the interface of the same name, with its memberships.
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, r: &PacketRecord, work_base: u64) -> Result<u64> {
    // Made with no protocol, it receives nothing until it is bound with its own, after its
    // filter and options: made with it, it would take packets from every interface at once,
    // the filter not yet attached (a packet the filter drops reached the restarted program
    // once, in CI). The obsolete SOCK_PACKET keeps the protocol it is made with (its bind
    // names an interface only).
    let receives_at_bind = r.ty != SOCK_PACKET && r.protocol != 0;
    let made_with = if receives_at_bind { 0 } else { r.protocol as i32 };
    let (fd, s) = inet::new_socket(task, libc::AF_PACKET, r.ty, made_with, work_base)?;
    let what = format!("pid {ns_pid}: fd {} ({})", rec.fd, r.describe());
    let err = |step: &str, e: std::io::Error| Error::Other(format!("{what}: {step}: {e}"));
    let index_of = |name: &str| {
        nix::net::if_::if_nametoindex(name)
            .map(|i| i as i32)
            .map_err(|e| err(&format!("find the interface {name} (the restart's machine has none of that name?)"), e.into()))
    };
    for &(opt, value) in &r.options {
        setopt_int(&s, SOL_PACKET, opt, value).map_err(|e| err(&format!("set option {opt} to {value}"), e))?;
    }
    // The buffer sizes read back are twice what was asked (socket(7)): ask for half.
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, r.rcvbuf / 2).map_err(|e| err("set its receive buffer", e))?;
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, r.sndbuf / 2).map_err(|e| err("set its send buffer", e))?;
    if !r.filter.is_empty() {
        sys::attach_filter(&s, &r.filter).map_err(|e| err("attach its filter", e))?;
    }
    if let Some(name) = &r.interface {
        let address = if r.ty == SOCK_PACKET {
            // Bound by the interface's name (its protocol stays the socket's).
            index_of(name)?;
            named_address(name)
        } else {
            link_address(r.protocol, index_of(name)?)
        };
        sys::bind(&s, &address).map_err(|e| err(&format!("bind to {name}"), e))?;
    } else if receives_at_bind {
        // Every interface (index 0), as a socket made with its protocol and never bound.
        sys::bind(&s, &link_address(r.protocol, 0)).map_err(|e| err("give it its protocol (bind to every interface)", e))?;
    }
    for m in &r.memberships {
        let request = membership_request(index_of(&m.interface)?, m);
        for _ in 0..m.count {
            setopt_bytes(&s, SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &request)
                .map_err(|e| err(&format!("add its membership of kind {} on {}", m.kind, m.interface), e))?;
        }
    }
    inet::set_status_flags(&s, rec).map_err(|e| err("set its status flags", e))?;
    Ok(fd)
}

/// The struct sockaddr a SOCK_PACKET socket is bound with: the interface's name in `sa_data`
/// (14 bytes, NUL-padded; validation keeps names below IFNAMSIZ). Pure.
fn named_address(name: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(16);
    a.extend_from_slice(&(libc::AF_PACKET as u16).to_ne_bytes());
    a.extend_from_slice(&name.as_bytes()[..name.len().min(13)]);
    a.resize(16, 0);
    a
}

/// A struct sockaddr_ll naming a protocol (network byte order) on an interface. Pure.
fn link_address(protocol: u16, ifindex: i32) -> Vec<u8> {
    // family, protocol, ifindex, hatype, pkttype, halen, addr[8]
    let mut a = Vec::with_capacity(20);
    a.extend_from_slice(&(libc::AF_PACKET as u16).to_ne_bytes());
    a.extend_from_slice(&protocol.to_ne_bytes());
    a.extend_from_slice(&ifindex.to_ne_bytes());
    a.resize(20, 0);
    a
}

/// A struct packet_mreq for a membership (with a longer address: the kernel's packet_mreq_max,
/// 32 bytes of it). Pure.
fn membership_request(ifindex: i32, m: &Membership) -> Vec<u8> {
    let mut r = Vec::with_capacity(40);
    r.extend_from_slice(&ifindex.to_ne_bytes());
    r.extend_from_slice(&m.kind.to_ne_bytes());
    r.extend_from_slice(&(m.address.len() as u16).to_ne_bytes());
    r.extend_from_slice(&m.address);
    r.resize(if m.address.len() <= 8 { 16 } else { 8 + MAX_ADDR_LEN }, 0);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_requests_have_the_kernels_layout() {
        let a = link_address(0x0008u16.to_be(), 7);
        assert_eq!(a.len(), 20);
        assert_eq!(&a[2..4], &0x0008u16.to_be().to_ne_bytes());
        assert_eq!(i32::from_ne_bytes(a[4..8].try_into().unwrap()), 7);
        let m = Membership { interface: "lo".into(), kind: 1, count: 1, address: vec![] };
        assert_eq!(membership_request(1, &m).len(), 16);
        let long = Membership { address: vec![1; 20], ..m };
        assert_eq!(membership_request(1, &long).len(), 40);
        let named = named_address("lo");
        assert_eq!(named.len(), 16);
        assert_eq!(&named[2..5], b"lo\0");
    }

    #[test]
    fn records_out_of_bounds_are_refused() {
        let good = PacketRecord {
            ty: libc::SOCK_DGRAM,
            protocol: 0x0800u16.to_be(),
            interface: Some("lo".into()),
            memberships: vec![Membership { interface: "lo".into(), kind: 1, count: 2, address: vec![] }],
            options: vec![(libc::PACKET_AUXDATA, 1)],
            filter: vec![[0; 8]],
            rcvbuf: 4096,
            sndbuf: 4096,
        };
        assert_eq!(validate(&good), Ok(()));
        let spkt = PacketRecord { ty: SOCK_PACKET, memberships: vec![], options: vec![], ..good.clone() };
        assert_eq!(validate(&spkt), Ok(()), "a SOCK_PACKET socket, bound by name");
        for bad in [
            PacketRecord { ty: SOCK_PACKET, ..good.clone() },
            PacketRecord { ty: libc::SOCK_STREAM, ..good.clone() },
            PacketRecord { options: vec![(99, 1)], ..good.clone() },
            PacketRecord { interface: Some("a/b".into()), ..good.clone() },
            PacketRecord { interface: Some("x".repeat(16)), ..good.clone() },
            PacketRecord { filter: vec![[0; 8]; MAX_FILTER + 1], ..good.clone() },
            PacketRecord { memberships: vec![Membership { interface: "lo".into(), kind: 1, count: 1, address: vec![0; 33] }], ..good.clone() },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
