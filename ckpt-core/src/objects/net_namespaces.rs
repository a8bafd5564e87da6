//! Network namespaces the job made that hold only their loopback: `unshare -n` (as an ordinary
//! user inside `unshare -Urn`), `bwrap --unshare-net`, `podman --network none` (untried), a test harness
//! that gives each server a network of its own. Their processes talk over `lo` alone, with
//! ports, abstract Unix socket names and TCP connections of their own.
//!
//! **Capture.** The job's processes are grouped by network namespace
//! ([`super::namespaces::group`]). sock_diag lists the sockets of the namespace its own socket
//! was made in, so for each namespace a process of the job is in besides the checkpoint's own,
//! a NETLINK_SOCK_DIAG socket is made inside one of its frozen processes (an injected
//! socket(2), taken out with pidfd_getfd): [`JobNetworks`] holds them, and the Unix, TCP and
//! packet captures list each namespace through its own. Each namespace the job made keeps
//! its loopback ([`Loopback`]: up or down, its MTU, 127.0.0.1 once it was up), read through that
//! socket's namespace (SIOCGIFFLAGS, SIOCGIFMTU, SIOCGIFCONF) and /proc/PID/net. Refused, naming
//! the process: a namespace with any interface besides `lo` (a veth pair, a tunnel: its link to
//! the outside cannot be made again), addresses of its own on `lo`, and one that belongs to a
//! user namespace off its maker's way down ([`MadeNamespaces::capture`]).
//!
//! **Restore.** Once every process is in its user namespace (or on its way down there, for
//! a namespace that belongs above it, as UTS namespaces are), the first process of each
//! network namespace (its maker) makes it by an injected `unshare(CLONE_NEWNET)` and sets its
//! loopback as it was ([`set_loopback`], injected ioctls, with the process's own rights), before
//! any of its descriptors is restored: its sockets are made inside it and bind its addresses.
//! The others join it. The job's own namespace is the node's.
//!
//! Not kept: the namespace's sysctls (`net.*`), routes and rules beyond the loopback's own,
//! netfilter tables. A namespace entered from the job that it did not make (`ip netns exec` of
//! one with only `lo`) comes back as a copy of its own, not that one.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::namespaces::{MadeNamespace, MadeNamespaces, Member, StatefulKind, UserNamespaces};
use crate::error::{Context, Error, Result};
use crate::nshelper::{namespace_id, NamespaceId};
use crate::ptrace::{RemoteTask, Tid};
use crate::sockdiag::DiagSocket;
use crate::sys::netdev;

/// The loopback of a network namespace the job made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loopback {
    /// IFF_UP.
    pub up: bool,
    pub mtu: u32,
    /// Its IPv4 addresses: 127.0.0.1 once it was brought up (down again, it keeps it).
    pub ipv4: Vec<Ipv4Addr>,
}

/// The network namespaces the job made, each with its loopback.
pub type NetRecord = MadeNamespaces<Loopback>;
/// One network namespace of the job.
pub type NetNsRecord = MadeNamespace<Loopback>;

/// What network namespaces are to [`MadeNamespaces`].
pub const KIND: StatefulKind = StatefulKind { link: "net", name: "network" };

/// The loopback's name.
const LO: &str = "lo";
/// A bound on the MTU a record may give, well above any device's (a loopback has 64 KiB).
const MAX_MTU: u32 = 1 << 20;

/// Captures the network namespaces the job's processes are in: `init` is the job's init (host
/// pid), `members` the job's processes in the image's order, `users` its user namespaces,
/// `networks` the namespaces with their sock_diag sockets.
pub fn capture(init: Tid, members: &[Member], users: &UserNamespaces, networks: &JobNetworks) -> Result<NetRecord> {
    MadeNamespaces::capture(KIND, init, members, users, |pid| networks.loopback_of(pid))
}

/// One line per namespace the job made, for `ckpt inspect`.
pub fn describe(rec: &NetRecord) -> Vec<String> {
    rec.describe(KIND, |lo| format!("loopback {}, MTU {}", if lo.up { "up" } else { "down" }, lo.mtu))
}

/// Checks what a restart would act on. Pure.
pub fn validate(rec: &NetRecord, pids: &[Tid]) -> std::result::Result<(), String> {
    rec.validate(KIND.name, pids, |lo| {
        if !(68..=MAX_MTU).contains(&lo.mtu) {
            return Err(format!("its loopback's MTU {} is out of bounds", lo.mtu));
        }
        if let Some(a) = lo.ipv4.iter().find(|a| **a != Ipv4Addr::LOCALHOST) {
            return Err(format!("its loopback holds {a}, which a restart does not set"));
        }
        Ok(())
    })
}

/// Sets the loopback of the network namespace `task` has just made as `lo` says: its MTU, and
/// up (which gives it 127.0.0.1 and ::1) when it was up or had been; down again when it was
/// down. The calls are injected: made with the process's own rights. `scratch_off`: where in
/// its scratch area the request may go.
pub fn set_loopback(task: &mut RemoteTask, lo: &Loopback, scratch_off: usize) -> Result<()> {
    let sock = task.syscall("socket", libc::SYS_socket, &[libc::AF_INET as u64, (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64, 0])?;
    let set = (|| -> Result<()> {
        let mut ioctl = |name: &str, request: libc::c_ulong, value: i32| -> Result<i32> {
            let at = task.put(scratch_off, &netdev::ifreq(LO, value))?;
            task.syscall(name, libc::SYS_ioctl, &[sock, request, at]).map_err(|e| Error::Other(format!("{name} of the loopback: {e}")))?;
            let answer = task.get(at + libc::IFNAMSIZ as u64, 4)?;
            Ok(i32::from_ne_bytes(answer.try_into().expect("four bytes")))
        };
        ioctl("SIOCSIFMTU", libc::SIOCSIFMTU, lo.mtu as i32)?;
        if lo.up || !lo.ipv4.is_empty() {
            let flags = ioctl("SIOCGIFFLAGS", libc::SIOCGIFFLAGS, 0)? & 0xffff;
            ioctl("SIOCSIFFLAGS", libc::SIOCSIFFLAGS, flags | libc::IFF_UP)?;
            if !lo.up {
                ioctl("SIOCSIFFLAGS", libc::SIOCSIFFLAGS, flags & !libc::IFF_UP)?;
            }
        }
        Ok(())
    })();
    task.syscall("close", libc::SYS_close, &[sock])?;
    set
}

/// Refuses what a restart would tell apart by address alone while the job's processes are in
/// several network namespaces: the same TCP or UDP address bound in two of them (a restart
/// pairs connections, listeners and senders by address), a datagram queued from an abstract
/// Unix name two of them have (a restart sends it again from a holder of the name), and a
/// datagram queued inside a namespace the job made from a sender no socket there is bound to
/// (a restart sends it from a stand-in of its own namespace). The same abstract name in two
/// namespaces is fine otherwise: each socket binds and connects from inside its own. `records`:
/// the job's processes, `net` their network namespaces. Pure.
pub fn check_addresses_apart(records: &[super::ProcessRecord], net: &NetRecord) -> Result<()> {
    use super::descriptor::FdKind;
    use super::inet::InetRecord;
    use super::tcp::TcpState;
    if net.namespaces.len() < 2 {
        return Ok(());
    }
    // (kind, address or name) → (namespace, pid, fd) of its first holder.
    let mut first: HashMap<(&str, String), (usize, Tid, i32)> = HashMap::new();
    let mut udp_bound: Vec<(usize, super::udp::DatagramKind, std::net::SocketAddr)> = Vec::new();
    let mut queued: Vec<(usize, Tid, i32, &super::udp::UdpRecord)> = Vec::new();
    let mut abstract_names: HashMap<&[u8], Vec<usize>> = HashMap::new();
    let mut named_senders: Vec<(Tid, i32, &[u8])> = Vec::new();
    for p in records {
        let netns = net.namespace_of(p.pid);
        for rec in &p.fds {
            let named: Option<(&str, String)> = match &rec.kind {
                FdKind::Inet(InetRecord::Tcp(t)) => match &t.state {
                    TcpState::Listening { local, .. } => Some(("TCP", local.normalized().to_string())),
                    TcpState::Connected(c) => Some(("TCP", format!("{} -> {}", c.local.normalized(), c.remote.normalized()))),
                    TcpState::Closed { .. } | TcpState::Connecting { .. } => None,
                },
                FdKind::Inet(InetRecord::Udp(u)) => {
                    if !u.queue.is_empty() && netns != 0 {
                        queued.push((netns, p.pid, rec.fd, u));
                    }
                    u.local.map(|l| {
                        udp_bound.push((netns, u.kind, l.normalized()));
                        ("UDP", format!("{:?} {}", u.kind, l.normalized()))
                    })
                }
                FdKind::Unix(u) | FdKind::UnixQueue(super::unix::UnixQueueRecord { socket: u, .. }) => {
                    if let FdKind::UnixQueue(q) = &rec.kind {
                        named_senders.extend(q.senders.iter().flatten().filter(|n| n.first() == Some(&0)).map(|n| (p.pid, rec.fd, n.as_slice())));
                    }
                    if let Some(name) = u.name.as_ref().filter(|n| n.first() == Some(&0)) {
                        abstract_names.entry(name).or_default().push(netns);
                    }
                    None
                }
                _ => None,
            };
            let Some(key) = named else { continue };
            match first.get(&key) {
                Some(&(other, opid, ofd)) if other != netns => {
                    return Err(Error::Unsupported {
                        pid: p.pid,
                        what: format!(
                            "fd {} (the {} address {}), which pid {opid}'s fd {ofd} has too in another of the job's network namespaces: a restart tells them apart by address alone",
                            rec.fd, key.0, key.1
                        ),
                    });
                }
                Some(_) => {}
                None => {
                    first.insert(key, (netns, p.pid, rec.fd));
                }
            }
        }
    }
    for (pid, fd, name) in named_senders {
        if abstract_names.get(name).is_some_and(|spaces| spaces.iter().any(|&n| n != spaces[0])) {
            return Err(Error::Unsupported {
                pid,
                what: format!(
                    "fd {fd} (a Unix socket), holding a datagram from the abstract name {:?}, which sockets in two of the job's network namespaces are bound to: a restart tells them apart by name alone",
                    String::from_utf8_lossy(&name[1..])
                ),
            });
        }
    }
    for (netns, pid, fd, u) in queued {
        let bound_here = |from: std::net::SocketAddr| {
            udp_bound.iter().any(|&(n, k, a)| n == netns && k == u.kind && a.port() == from.port() && (a == from || a.ip().is_unspecified()))
        };
        if let Some(d) = u.queue.iter().find(|d| !bound_here(d.from.normalized())) {
            return Err(Error::Unsupported {
                pid,
                what: format!(
                    "fd {fd} (a {} socket inside a network namespace the job made), holding a datagram from {}, which no socket there is bound to any more: a restart sends it from a stand-in of its own namespace",
                    u.kind.name(),
                    d.from
                ),
            });
        }
    }
    Ok(())
}

/// The network namespaces the job's processes are in at a checkpoint, each with a sock_diag
/// socket made inside it: the checkpoint's own first (index 0), then each other one, in the
/// order of the processes given.
pub struct JobNetworks {
    spaces: Vec<(NamespaceId, DiagSocket, Option<u64>)>,
    /// Host pid → index of its namespace, for processes outside the checkpoint's own.
    of_pid: HashMap<Tid, usize>,
}

impl JobNetworks {
    /// The checkpoint's own namespace alone: for what looks only there (connections to other
    /// nodes, which a namespace holding only its loopback cannot have).
    pub fn here() -> Result<JobNetworks> {
        let own = namespace_id("/proc/self/ns/net")?;
        let diag = DiagSocket::here().context(|| "open a sock_diag socket".to_string())?;
        let cookie = diag.with_fd(netns_cookie);
        Ok(JobNetworks { spaces: vec![(own, diag, cookie)], of_pid: HashMap::new() })
    }

    /// The namespaces of the frozen processes `pids` (host pids); `socket_in(pid)` makes a
    /// NETLINK_SOCK_DIAG socket inside process `pid` and hands it over.
    pub fn find(pids: &[Tid], mut socket_in: impl FnMut(Tid) -> Result<OwnedFd>) -> Result<JobNetworks> {
        let mut networks = JobNetworks::here()?;
        for &pid in pids {
            let ns = namespace_id(&format!("/proc/{pid}/ns/net"))?;
            let index = match networks.spaces.iter().position(|(id, ..)| *id == ns) {
                Some(i) => i,
                None => {
                    let fd = socket_in(pid).map_err(|e| e.of_object(pid, "a sock_diag socket inside its network namespace"))?;
                    let diag = DiagSocket::made_elsewhere(fd).context(|| format!("pid {pid}: the socket made inside its network namespace"))?;
                    let cookie = diag.with_fd(netns_cookie);
                    networks.spaces.push((ns, diag, cookie));
                    networks.spaces.len() - 1
                }
            };
            if index != 0 {
                networks.of_pid.insert(pid, index);
            }
        }
        Ok(networks)
    }

    /// Each namespace's index and sock_diag socket.
    pub fn diag_sockets(&self) -> impl Iterator<Item = (usize, &DiagSocket)> {
        self.spaces.iter().map(|(_, d, _)| d).enumerate()
    }

    /// The index of the namespace of host pid `pid` (0, the checkpoint's own, for one not found).
    pub fn index_of(&self, pid: Tid) -> usize {
        self.of_pid.get(&pid).copied().unwrap_or(0)
    }

    /// The sock_diag socket of the namespace of host pid `pid`.
    pub fn diag_of(&self, pid: Tid) -> &DiagSocket {
        &self.spaces[self.index_of(pid)].1
    }

    /// Refuses socket `s` (process `pid`'s descriptor `fd`, inode `ino`) when it is of another
    /// network namespace than its process's: one made before the process entered a namespace
    /// of its own (`unshare -n`), or passed to it from another. A restart makes a socket in its
    /// process's namespace, where its addresses would be another namespace's. (A kernel
    /// without SO_NETNS_COOKIE, before 5.14, does not tell: nothing is checked.)
    pub fn check_socket(&self, pid: Tid, fd: i32, ino: u64, s: &OwnedFd) -> Result<()> {
        let (Some(own), Some(its)) = (self.spaces[self.index_of(pid)].2, netns_cookie(s)) else { return Ok(()) };
        if own == its {
            return Ok(());
        }
        Err(Error::Unsupported {
            pid: super::namespaces::ns_pid_or(pid),
            what: format!(
                "fd {fd} (socket:[{ino}]), a socket of another network namespace than its process's (made before the process entered one of its own, or passed to it from another): a restart would make it in the process's own"
            ),
        })
    }

    /// The loopback of the namespace frozen process `pid` (host pid) is in; refuses a
    /// namespace with more than its loopback (see the module).
    fn loopback_of(&self, pid: Tid) -> Result<Loopback> {
        let refuse = |what: String| Error::Unsupported { pid: super::namespaces::ns_pid_or(pid), what };
        let dev = format!("/proc/{pid}/net/dev");
        let listing = std::fs::read_to_string(&dev).context(|| format!("read {dev}"))?;
        let diag = self.diag_of(pid);
        // The tunnels' fallback devices a kernel with their modules loaded puts in every new
        // namespace (it does so again at restart), down, are the namespace's as made.
        let made_by_kernel =
            |name: &str| FALLBACK_DEVICES.contains(&name) && diag.with_fd(|s| netdev::interface_flags(s, name)).is_ok_and(|f| f & libc::IFF_UP as u16 == 0);
        let others: Vec<&str> = interfaces(&listing).into_iter().filter(|n| *n != LO && !made_by_kernel(n)).collect();
        if !others.is_empty() {
            return Err(refuse(format!(
                "a network namespace of its own with interfaces besides lo ({}): their links outside the namespace cannot be made again",
                others.join(", ")
            )));
        }
        let (flags, mtu, ipv4) = diag
            .with_fd(|s| -> std::io::Result<_> { Ok((netdev::interface_flags(s, LO)?, netdev::interface_mtu(s, LO)?, netdev::ipv4_addresses(s)?)) })
            .context(|| format!("pid {pid}: the loopback of its network namespace"))?;
        let ipv4: Vec<Ipv4Addr> = ipv4.into_iter().map(|(_, a)| a).collect();
        let inet6 = format!("/proc/{pid}/net/if_inet6");
        // No file: IPv6 is off.
        let ipv6 = std::fs::read_to_string(&inet6).unwrap_or_default();
        let own_ipv6: Vec<String> = ipv6.lines().filter_map(|l| l.split_whitespace().next()).filter(|a| *a != IPV6_LOOPBACK).map(str::to_string).collect();
        if let Some(a) = ipv4.iter().find(|a| **a != Ipv4Addr::LOCALHOST).map(|a| a.to_string()).or(own_ipv6.into_iter().next()) {
            return Err(refuse(format!("a network namespace of its own whose loopback holds an address of its own ({a}), which a restart does not set")));
        }
        Ok(Loopback { up: flags & libc::IFF_UP as u16 != 0, mtu, ipv4 })
    }
}

/// The cookie of the network namespace socket `s` is of (SO_NETNS_COOKIE, Linux 5.14), if the
/// kernel tells.
fn netns_cookie(s: &OwnedFd) -> Option<u64> {
    let raw = crate::sys::socket::getopt_bytes(s, libc::SOL_SOCKET, libc::SO_NETNS_COOKIE, 8).ok()?;
    Some(u64::from_ne_bytes(raw.get(..8)?.try_into().ok()?))
}

/// The devices tunnel modules (sit, ipip, ip_gre, ip6_tunnel, ip6_gre, ip_vti, ip6_vti) make in
/// every new network namespace, unless net.core.fb_tunnels_only_for_init_net says not to.
const FALLBACK_DEVICES: &[&str] = &["sit0", "tunl0", "gre0", "gretap0", "erspan0", "ip6tnl0", "ip6gre0", "ip6erspan0", "ip_vti0", "ip6_vti0"];

/// ::1 as /proc/net/if_inet6 writes it.
const IPV6_LOOPBACK: &str = "00000000000000000000000000000001";

/// The interfaces /proc/PID/net/dev lists. Pure.
fn interfaces(listing: &str) -> Vec<&str> {
    // Two header lines, then "  NAME: counters...".
    listing.lines().skip(2).filter_map(|l| l.split_once(':').map(|(name, _)| name.trim())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_are_read_from_proc_net_dev() {
        let listing = "Inter-|   Receive  |  Transmit\n face |bytes    packets|bytes\n    lo: 0 0 0\n  eth0: 1 2 3\n";
        assert_eq!(interfaces(listing), vec!["lo", "eth0"]);
    }

    #[test]
    fn records_out_of_bounds_are_refused() {
        let lo = Loopback { up: true, mtu: 65536, ipv4: vec![Ipv4Addr::LOCALHOST] };
        let good = NetRecord { namespaces: vec![NetNsRecord::default(), NetNsRecord { pids: vec![5], state: lo.clone(), owner: None }] };
        assert_eq!(validate(&good, &[1, 5]), Ok(()));
        let with = |f: &dyn Fn(&mut Loopback)| {
            let mut r = good.clone();
            f(&mut r.namespaces[1].state);
            r
        };
        for bad in [with(&|l| l.mtu = 0), with(&|l| l.mtu = u32::MAX), with(&|l| l.ipv4.push(Ipv4Addr::new(10, 0, 0, 1)))] {
            assert!(validate(&bad, &[1, 5]).is_err(), "{bad:?}");
        }
    }
}
