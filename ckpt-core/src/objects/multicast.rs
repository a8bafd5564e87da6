//! The multicast groups an IP datagram socket joined (UDP, UDP-Lite, raw), each with its source
//! filter: from any source, from some sources only (INCLUDE), or from all but some (EXCLUDE).
//!
//! The kernel has no call that lists a socket's groups, but it answers for one group it is
//! asked about: MCAST_MSFILTER read with a group and a device gives the socket's filter on it, or
//! EADDRNOTAVAIL when the socket is not a member. A socket can only be a member of a group the
//! device has joined, and the devices' groups are listed per network namespace (/proc/PID/net/
//! igmp and igmp6), so capture asks about each of those: a handful of questions per socket.
//!
//! At restart each group is joined again on the device of the same name (its index may differ on
//! another host), from its first source for an INCLUDE filter (so that nothing from another
//! source slips in meanwhile), and the whole filter is set when it has more than that.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::inet::{getopt_in_out, setopt_bytes, Addr};
use crate::error::{Error, Result};
use crate::ptrace::Tid;

/// One group a socket joined on one device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Membership {
    /// The device, by name.
    pub device: String,
    pub group: IpAddr,
    pub filter: Filter,
    pub sources: Vec<IpAddr>,
}

/// What the sources of a membership mean.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Filter {
    /// Datagrams from these sources only (a source-specific join).
    Include,
    /// Datagrams from every source but these (a plain join: none).
    Exclude,
}

/// The most sources a filter has that a restart sets again (the kernel's own bound is
/// net.ipv4.igmp_max_msf and net.ipv6.mld_max_msf, 10 and 64 by default).
pub const MAX_SOURCES: usize = 1024;
/// The most memberships of one socket a restart joins again (net.ipv4.igmp_max_memberships is
/// 20 by default; the devices' groups bound what capture can find).
pub const MAX_MEMBERSHIPS: usize = 4096;

// struct group_filter (netinet/in.h, include/uapi/linux/in.h), which libc does not define: the
// device's index, padding, the group (a sockaddr_storage, 8-byte aligned), the filter mode, the
// number of sources, then the sources, a sockaddr_storage each. struct group_req and
// group_source_req share its first two fields; the checks below hold our offsets to libc's.
const STORAGE: usize = std::mem::size_of::<libc::sockaddr_storage>();
const GROUP_AT: usize = 8;
const MODE_AT: usize = GROUP_AT + STORAGE;
const NUMSRC_AT: usize = MODE_AT + 4;
const SOURCES_AT: usize = NUMSRC_AT + 4;
const _: () = assert!(std::mem::offset_of!(libc::group_req, gr_group) == GROUP_AT);
const _: () = assert!(std::mem::offset_of!(libc::group_source_req, gsr_source) == GROUP_AT + STORAGE);
const _: () = assert!(STORAGE == 128);

/// The group or source address as a sockaddr_storage's bytes.
fn storage(ip: IpAddr) -> [u8; STORAGE] {
    let mut b = [0u8; STORAGE];
    let sa = Addr { ip, port: 0, flowinfo: 0, scope_id: 0 }.to_sockaddr();
    b[..sa.len()].copy_from_slice(&sa);
    b
}

/// A struct group_filter of `sources.len()` sources (`mode` as the kernel numbers it). Pure.
fn group_filter(ifindex: u32, group: IpAddr, mode: i32, sources: &[IpAddr]) -> Vec<u8> {
    let mut b = vec![0u8; SOURCES_AT + STORAGE * sources.len()];
    b[..4].copy_from_slice(&ifindex.to_ne_bytes());
    b[GROUP_AT..MODE_AT].copy_from_slice(&storage(group));
    b[MODE_AT..NUMSRC_AT].copy_from_slice(&mode.to_ne_bytes());
    b[NUMSRC_AT..SOURCES_AT].copy_from_slice(&(sources.len() as u32).to_ne_bytes());
    for (i, s) in sources.iter().enumerate() {
        b[SOURCES_AT + i * STORAGE..][..STORAGE].copy_from_slice(&storage(*s));
    }
    b
}

/// A group_filter the kernel filled: its mode, its number of sources, and those of them it had
/// room to give. Pure.
fn parse_group_filter(b: &[u8]) -> Option<(i32, usize, Vec<IpAddr>)> {
    let word = |at: usize| Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let mode = word(MODE_AT)? as i32;
    let count = word(NUMSRC_AT)? as usize;
    let given = b.len().saturating_sub(SOURCES_AT) / STORAGE;
    let sources = (0..count.min(given)).map(|i| Addr::from_sockaddr(&b[SOURCES_AT + i * STORAGE..][..STORAGE]).map(|a| a.ip)).collect::<Option<_>>()?;
    Some((mode, count, sources))
}

/// The option level of a group's family.
fn level(group: IpAddr) -> i32 {
    if group.is_ipv4() {
        libc::IPPROTO_IP
    } else {
        libc::IPPROTO_IPV6
    }
}

/// The socket's filter on `group` at device `ifindex`, or None if it is not a member.
fn filter_on(s: &OwnedFd, ifindex: u32, group: IpAddr) -> std::io::Result<Option<(Filter, Vec<IpAddr>)>> {
    let mut room = 16;
    loop {
        let mut buf = group_filter(ifindex, group, 0, &vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED); room]);
        match getopt_in_out(s, level(group), libc::MCAST_MSFILTER, &mut buf) {
            Ok(()) => {}
            // Not a member; or a socket that has no memberships of this family (an IPv6 raw
            // socket asked about IPv4).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::ENOPROTOOPT | libc::EINVAL | libc::EOPNOTSUPP)) => return Ok(None),
            Err(e) => return Err(e),
        }
        let (mode, count, sources) = parse_group_filter(&buf).ok_or_else(|| std::io::Error::other("a source filter the kernel gave short"))?;
        if count > MAX_SOURCES {
            // Cut, an EXCLUDE filter would let blocked sources in, an INCLUDE one drop some.
            return Err(std::io::Error::other(format!("a source filter of {count} sources, more than the {MAX_SOURCES} a checkpoint keeps")));
        }
        if count > room {
            room = count;
            continue;
        }
        let filter = if mode == libc::MCAST_INCLUDE { Filter::Include } else { Filter::Exclude };
        return Ok(Some((filter, sources)));
    }
}

/// A group some device has joined: (the device's index, its name, the group).
type DeviceGroup = (u32, String, IpAddr);

/// The groups of /proc/net/igmp's text: a line per device ("1\tlo        :     1      V3"),
/// then a line per group it joined, the address as the kernel holds it printed as a number. Pure.
fn parse_igmp(text: &str) -> Vec<DeviceGroup> {
    let mut out = Vec::new();
    let mut device: Option<(u32, String)> = None;
    for line in text.lines().skip(1) {
        if !line.starts_with('\t') {
            let mut words = line.split_whitespace();
            device = match (words.next().and_then(|i| i.parse().ok()), words.next()) {
                (Some(index), Some(name)) => Some((index, name.trim_end_matches(':').to_string())),
                _ => None,
            };
        } else if let (Some((index, name)), Some(hex)) = (&device, line.split_whitespace().next()) {
            if let Ok(word) = u32::from_str_radix(hex, 16) {
                // The address as the kernel holds it (network order), printed as a number.
                out.push((*index, name.clone(), IpAddr::V4(Ipv4Addr::from(word.to_ne_bytes()))));
            }
        }
    }
    out
}

/// The groups of /proc/net/igmp6's text: "index name address(32 hex digits) users flags timer". Pure.
fn parse_igmp6(text: &str) -> Vec<DeviceGroup> {
    text.lines()
        .filter_map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            let hex = w.get(2).filter(|h| h.len() == 32)?;
            let bytes: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).ok()).collect::<Option<_>>()?;
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            Some((w.first()?.parse().ok()?, w.get(1)?.to_string(), IpAddr::V6(ip)))
        })
        .collect()
}

/// The groups the devices of process `pid`'s network namespace have joined, IPv4 and, for an
/// IPv6 socket, IPv6 (a machine without IPv6 has no igmp6).
fn device_groups(pid: Tid, family: i32) -> Result<Vec<DeviceGroup>> {
    let read = |table: &str| match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(Error::Other(format!("read /proc/{pid}/net/{table}: {e}"))),
    };
    let mut groups = parse_igmp(&read("igmp")?);
    if family == libc::AF_INET6 {
        groups.extend(parse_igmp6(&read("igmp6")?));
    }
    Ok(groups)
}

/// The memberships of the socket at `fd` of process `pid` (of `family`), through the
/// restorer's duplicate `s`.
pub fn capture(pid: Tid, fd: i32, s: &OwnedFd, family: i32) -> Result<Vec<Membership>> {
    let mut out = Vec::new();
    for (ifindex, device, group) in device_groups(pid, family)? {
        let found = filter_on(s, ifindex, group).map_err(|e| Error::Unsupported {
            pid,
            what: format!("fd {fd} (a socket whose filter on the multicast group {group} at {device} cannot be kept: {e})"),
        })?;
        if let Some((filter, sources)) = found {
            out.push(Membership { device, group, filter, sources });
        }
    }
    Ok(out)
}

/// Joins every group again, each with its filter.
pub fn join_again(s: &OwnedFd, memberships: &[Membership]) -> std::io::Result<()> {
    for m in memberships {
        let fail = |what: &str, e: std::io::Error| std::io::Error::new(e.kind(), format!("{what} the multicast group {} on {}: {e}", m.group, m.device));
        let ifindex = nix::net::if_::if_nametoindex(m.device.as_str()).map_err(|e| fail("join", std::io::Error::from(e)))?;
        let mut req = vec![0u8; GROUP_AT + STORAGE];
        req[..4].copy_from_slice(&ifindex.to_ne_bytes());
        req[GROUP_AT..].copy_from_slice(&storage(m.group));
        match (m.filter, m.sources.first()) {
            (Filter::Include, Some(&first)) => {
                req.extend_from_slice(&storage(first));
                setopt_bytes(s, level(m.group), libc::MCAST_JOIN_SOURCE_GROUP, &req).map_err(|e| fail("join", e))?;
            }
            (Filter::Include, None) => return Err(fail("join", std::io::Error::other("an INCLUDE filter without sources"))),
            (Filter::Exclude, _) => setopt_bytes(s, level(m.group), libc::MCAST_JOIN_GROUP, &req).map_err(|e| fail("join", e))?,
        }
        let joined_alone = match m.filter {
            Filter::Include => m.sources.len() == 1,
            Filter::Exclude => m.sources.is_empty(),
        };
        if !joined_alone {
            let mode = if m.filter == Filter::Include { libc::MCAST_INCLUDE } else { libc::MCAST_EXCLUDE };
            setopt_bytes(s, level(m.group), libc::MCAST_MSFILTER, &group_filter(ifindex, m.group, mode, &m.sources))
                .map_err(|e| fail("set the source filter of", e))?;
        }
    }
    Ok(())
}

/// A record's memberships are within bounds and make sense: multicast groups, sources of the
/// same family, device names the kernel takes.
pub fn validate(memberships: &[Membership]) -> std::result::Result<(), String> {
    if memberships.len() > MAX_MEMBERSHIPS {
        return Err(format!("{} multicast memberships, more than {MAX_MEMBERSHIPS}", memberships.len()));
    }
    for m in memberships {
        if !m.group.is_multicast() {
            return Err(format!("a multicast membership of {}, not a multicast group", m.group));
        }
        if m.device.is_empty() || m.device.len() >= libc::IFNAMSIZ || m.device.contains(['\0', '/']) {
            return Err(format!("a multicast membership on a device named {:?}", m.device));
        }
        if m.sources.len() > MAX_SOURCES || m.sources.iter().any(|s| s.is_ipv4() != m.group.is_ipv4()) {
            return Err(format!("the multicast group {}: {} sources, or of another family", m.group, m.sources.len()));
        }
        if m.filter == Filter::Include && m.sources.is_empty() {
            return Err(format!("the multicast group {}: INCLUDE with no source", m.group));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_devices_groups_are_read_from_the_kernels_tables() {
        let v4 = "Idx\tDevice    : Count Querier\tGroup    Users Timer\tReporter\n\
                  1\tlo        :     2      V3\n\
                  \t\t\t\t010007EF     1 0:00000000\t\t0\n\
                  \t\t\t\t010000E0     1 0:00000000\t\t0\n\
                  2\teth0      :     1      V3\n\
                  \t\t\t\t010000E0     1 0:00000000\t\t0\n";
        let got = parse_igmp(v4);
        assert_eq!(got[0], (1, "lo".into(), "239.7.0.1".parse().unwrap()));
        assert_eq!(got[1], (1, "lo".into(), "224.0.0.1".parse().unwrap()));
        assert_eq!(got[2], (2, "eth0".into(), "224.0.0.1".parse().unwrap()));
        let v6 = "1    lo              ff150000000000000000000000000007     1 00000004 0\n\
                  2    eth0            ff020000000000000000000000000001     1 0000000C 0\n";
        let got = parse_igmp6(v6);
        assert_eq!(got, vec![(1, "lo".into(), "ff15::7".parse().unwrap()), (2, "eth0".into(), "ff02::1".parse().unwrap())]);
    }

    #[test]
    fn a_group_filter_reads_back_as_written() {
        let sources: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let b = group_filter(3, "232.1.2.3".parse().unwrap(), libc::MCAST_INCLUDE, &sources);
        assert_eq!(b.len(), 144 + 2 * 128);
        assert_eq!(parse_group_filter(&b), Some((libc::MCAST_INCLUDE, 2, sources)));
    }

    /// On a socket of this process: each kind of membership is found, and comes back the same
    /// when joined again on a new socket.
    #[test]
    fn memberships_are_found_and_joined_again() {
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        let socket = || -> OwnedFd { std::net::UdpSocket::bind("0.0.0.0:0").unwrap().into() };
        let any: IpAddr = "239.7.77.1".parse().unwrap();
        let only: IpAddr = "232.7.77.2".parse().unwrap();
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        let wanted = vec![
            Membership { device: "lo".into(), group: any, filter: Filter::Exclude, sources: vec![other] },
            Membership { device: "lo".into(), group: only, filter: Filter::Include, sources: vec![local, other] },
        ];
        let first = socket();
        join_again(&first, &wanted).unwrap();
        let pid = std::process::id() as Tid;
        let found = capture(pid, 3, &first, libc::AF_INET).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        for w in &wanted {
            let mut f = found.iter().find(|m| m.group == w.group).unwrap().clone();
            f.sources.sort();
            assert_eq!(&f, w);
        }
        let second = socket();
        assert!(capture(pid, 3, &second, libc::AF_INET).unwrap().is_empty());
        join_again(&second, &found).unwrap();
        assert_eq!(filter_on(&second, lo, any).unwrap(), Some((Filter::Exclude, vec![other])));
        assert!(validate(&found).is_ok());
    }

    #[test]
    fn validation_refuses_what_no_socket_joins() {
        let m = |group: &str, filter, sources: Vec<&str>| Membership {
            device: "lo".into(),
            group: group.parse().unwrap(),
            filter,
            sources: sources.into_iter().map(|s| s.parse().unwrap()).collect(),
        };
        assert!(validate(&[m("239.1.1.1", Filter::Exclude, vec![])]).is_ok());
        assert!(validate(&[m("10.1.1.1", Filter::Exclude, vec![])]).is_err());
        assert!(validate(&[m("232.1.1.1", Filter::Include, vec![])]).is_err());
        assert!(validate(&[m("ff15::1", Filter::Exclude, vec!["10.0.0.1"])]).is_err());
        assert!(validate(&[Membership { device: "a/b".into(), ..m("239.1.1.1", Filter::Exclude, vec![]) }]).is_err());
    }
}
