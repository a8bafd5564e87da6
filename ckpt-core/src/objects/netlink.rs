//! Netlink sockets (netlink(7)): a program's line to the kernel, to ask for the routing tables
//! and devices (NETLINK_ROUTE), listen for device events (NETLINK_KOBJECT_UEVENT), talk to
//! generic netlink families, ...
//!
//! What the socket is, not what it carries: its protocol and type, the port id it is bound to
//! (programs match replies by it), the multicast groups it joined (NETLINK_LIST_MEMBERSHIPS,
//! all of them, not only the first 32 getsockname shows), where it is connected (connect(2): the
//! port id and group its sends without an address go to), its flag options and buffer sizes. A
//! restart makes the socket again with those, bound to the same port id.
//!
//! Messages the kernel queued and the program has not read (a dump's reply, an event) cannot be
//! put back: only the kernel sends them. A socket holding some is a passing state
//! ([`Error::Passing`]): the job is let go and the checkpoint tried again a few times, as a
//! program reads what it asked for at once. At the last try, a queue whose first message is an
//! event (sent to a multicast group, as a monitor that reads rarely holds) is let go, with a
//! warning: a restarted program misses its messages as one whose socket overflowed would (a
//! reply queued behind the events goes with them: only the first message can be looked at
//! without taking it). A queue whose first message is a reply (sent to the socket alone) stays
//! refused, naming the socket, as the program would wait for it for ever; the job goes on.

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use super::inet::{self, getopt_bytes, getopt_int, setopt_int};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use tracing::warn;

const SOL_NETLINK: i32 = 270;
const NETLINK_ADD_MEMBERSHIP: i32 = 1;
const NETLINK_LIST_MEMBERSHIPS: i32 = 9;

/// The flag options a netlink socket may have set (netlink(7)), each read and set as an int.
const FLAG_OPTIONS: &[(i32, &str)] = &[
    (3, "NETLINK_PKTINFO"),
    (4, "NETLINK_BROADCAST_ERROR"),
    (5, "NETLINK_NO_ENOBUFS"),
    (8, "NETLINK_LISTEN_ALL_NSID"),
    (10, "NETLINK_CAP_ACK"),
    (11, "NETLINK_EXT_ACK"),
    (12, "NETLINK_GET_STRICT_CHK"),
];

/// Most groups a record may list (the kernel's groups are numbered below 2^16 at most).
pub const MAX_GROUPS: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NetlinkRecord {
    /// NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT, ...
    pub protocol: i32,
    /// SOCK_RAW or SOCK_DGRAM.
    pub ty: i32,
    /// The port id it is bound to (0: not bound).
    pub portid: u32,
    /// The multicast groups it joined, by number (1-based).
    pub groups: Vec<u32>,
    /// The options of [`FLAG_OPTIONS`] it has set, by option number.
    pub flags: Vec<i32>,
    pub rcvbuf: i32,
    pub sndbuf: i32,
    /// Where connect(2) sent it (getpeername): the port id and the group mask (one group, 1 to
    /// 32) its sends without an address go to; None when not connected (format 31).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub connected: Option<(u32, u32)>,
}

/// Captures a netlink socket, `s` a duplicate of process `pid`'s descriptor `fd`; `last_try`:
/// the checkpoint's last try, when queued events are let go (see the module).
pub fn capture(pid: Tid, fd: i32, ino: u64, s: &OwnedFd, last_try: bool) -> Result<NetlinkRecord> {
    let what = |e: std::io::Error| Error::from(e).of_object(pid, format!("fd {fd} (socket:[{ino}], netlink)"));
    let protocol = getopt_int(s, libc::SOL_SOCKET, libc::SO_PROTOCOL).map_err(what)?;
    let ty = getopt_int(s, libc::SOL_SOCKET, libc::SO_TYPE).map_err(what)?;
    let portid = sys::local_address(s).map_err(what)?;
    let groups = membership_list(&getopt_bytes(s, SOL_NETLINK, NETLINK_LIST_MEMBERSHIPS, 512).map_err(what)?);
    let mut flags = Vec::new();
    for &(opt, _) in FLAG_OPTIONS {
        // An option this kernel lacks (ENOPROTOOPT) is off.
        if getopt_int(s, SOL_NETLINK, opt).unwrap_or(0) != 0 {
            flags.push(opt);
        }
    }
    let queued = sys::first_queued(s).map_err(what)?;
    if let Some(first) = queued.filter(|q| !(last_try && q.to_group)) {
        // Most often a dump's last part, which the kernel makes as the program reads the one
        // before: the program reads it as soon as it runs, and the checkpoint is tried again.
        let what = format!(
            "fd {fd} (socket:[{ino}], a netlink socket of protocol {protocol}) holds {} from the kernel not read yet ({} bytes first), which cannot be put back",
            if first.to_group { "events" } else { "a reply" },
            first.len
        );
        return Err(Error::Passing { pid, what });
    }
    if queued.is_some() {
        warn!(pid, fd, socket = ino, protocol, "netlink events queued at the checkpoint's last try are not kept in the image: a restart misses them");
    }
    let rcvbuf = getopt_int(s, libc::SOL_SOCKET, libc::SO_RCVBUF).map_err(what)?;
    let sndbuf = getopt_int(s, libc::SOL_SOCKET, libc::SO_SNDBUF).map_err(what)?;
    let connected = Some(sys::peer_address(s).map_err(what)?).filter(|&peer| peer != (0, 0));
    Ok(NetlinkRecord { protocol, ty, portid, groups, flags, rcvbuf, sndbuf, connected })
}

/// The group numbers a NETLINK_LIST_MEMBERSHIPS bitmap holds (bit n-1 of the array of u32:
/// group n). Pure.
fn membership_list(bitmap: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    for (word_at, word) in bitmap.chunks_exact(4).enumerate() {
        let w = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
        for bit in 0..32 {
            if w & (1 << bit) != 0 {
                out.push(word_at as u32 * 32 + bit + 1);
            }
        }
    }
    out
}

/// Checks what [`open`] would act on. Pure.
pub fn validate(r: &NetlinkRecord) -> std::result::Result<(), String> {
    if !(0..32).contains(&r.protocol) || !matches!(r.ty, libc::SOCK_RAW | libc::SOCK_DGRAM) {
        return Err(format!("protocol {} type {}", r.protocol, r.ty));
    }
    if r.groups.len() > MAX_GROUPS || r.groups.iter().any(|&g| g == 0 || g > 1 << 16) {
        return Err(format!("{} multicast groups", r.groups.len()));
    }
    if r.flags.iter().any(|f| !FLAG_OPTIONS.iter().any(|(o, _)| o == f)) {
        return Err(format!("options {:?}", r.flags));
    }
    if r.connected.is_some_and(|(_, mask)| mask.count_ones() > 1) {
        return Err(format!("connected to the groups {:#x}: a socket sends to one", r.connected.unwrap_or_default().1));
    }
    Ok(())
}

impl DescriptorKind for NetlinkRecord {
    fn describe(&self) -> String {
        format!("netlink socket (protocol {}, port id {})", self.protocol, self.portid)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.work_base)
    }
}

/// Opens the netlink socket in the task: the same protocol and type, options, bound to the
/// same port id, in the same groups.
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, r: &NetlinkRecord, work_base: u64) -> Result<u64> {
    let (fd, s) = inet::new_socket(task, libc::AF_NETLINK, r.ty, r.protocol, work_base)?;
    let what = format!("pid {ns_pid}: fd {} ({})", rec.fd, r.describe());
    let err = |step: &str, e: std::io::Error| Error::Other(format!("{what}: {step}: {e}"));
    for &opt in &r.flags {
        setopt_int(&s, SOL_NETLINK, opt, 1).map_err(|e| err("set its options", e))?;
    }
    // The buffer sizes read back are twice what was asked (socket(7)): ask for half.
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, r.rcvbuf / 2).map_err(|e| err("set its receive buffer", e))?;
    setopt_int(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, r.sndbuf / 2).map_err(|e| err("set its send buffer", e))?;
    if r.portid != 0 {
        sys::bind(&s, r.portid).map_err(|e| {
            let why = if e.raw_os_error() == Some(libc::EADDRINUSE) { " (another socket of this network namespace has it now)" } else { "" };
            err(&format!("bind to port id {}{why}", r.portid), e)
        })?;
    }
    for &g in &r.groups {
        setopt_int(&s, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, g as i32).map_err(|e| err(&format!("join multicast group {g}"), e))?;
    }
    // Once bound: a connect binds a socket not bound yet to a port id of the kernel's choice.
    if let Some((portid, mask)) = r.connected {
        sys::connect(&s, portid, mask).map_err(|e| err(&format!("connect to port id {portid} group mask {mask:#x}"), e))?;
    }
    inet::set_status_flags(&s, rec).map_err(|e| err("set its status flags", e))?;
    Ok(fd)
}

/// The socket calls, through nix's netlink addresses.
mod sys {
    use std::io::IoSliceMut;
    use std::os::fd::{AsRawFd, OwnedFd};

    use nix::sys::socket::{self, ControlMessageOwned, MsgFlags, NetlinkAddr};

    use super::{getopt_int, setopt_int, SOL_NETLINK};

    /// The option whose control message names the group a message was sent to.
    const NETLINK_PKTINFO: i32 = 3;

    /// The port id the socket is bound to.
    pub fn local_address(s: &OwnedFd) -> std::io::Result<u32> {
        Ok(socket::getsockname::<NetlinkAddr>(s.as_raw_fd())?.pid())
    }

    pub fn bind(s: &OwnedFd, portid: u32) -> std::io::Result<()> {
        Ok(socket::bind(s.as_raw_fd(), &NetlinkAddr::new(portid, 0))?)
    }

    /// Where the socket is connected: (port id, group mask); (0, 0) when it is not.
    pub fn peer_address(s: &OwnedFd) -> std::io::Result<(u32, u32)> {
        let a = socket::getpeername::<NetlinkAddr>(s.as_raw_fd())?;
        Ok((a.pid(), a.groups()))
    }

    pub fn connect(s: &OwnedFd, portid: u32, groups: u32) -> std::io::Result<()> {
        Ok(socket::connect(s.as_raw_fd(), &NetlinkAddr::new(portid, groups))?)
    }

    /// The first message queued, without taking it (None: nothing queued). The sender's
    /// address names the group it was sent to when that is 1 to 32; for a higher one, the
    /// message is peeked again with NETLINK_PKTINFO's control message, asked for during that
    /// peek alone (an empty queue, the usual case, costs one call).
    pub fn first_queued(s: &OwnedFd) -> std::io::Result<Option<Queued>> {
        match peek_first(s)? {
            Some(q) if !q.to_group => {
                let had_pktinfo = getopt_int(s, SOL_NETLINK, NETLINK_PKTINFO).unwrap_or(0) != 0;
                if had_pktinfo {
                    return Ok(Some(q));
                }
                setopt_int(s, SOL_NETLINK, NETLINK_PKTINFO, 1)?;
                let peeked = peek_first(s);
                setopt_int(s, SOL_NETLINK, NETLINK_PKTINFO, 0)?;
                peeked
            }
            other => Ok(other),
        }
    }

    fn peek_first(s: &OwnedFd) -> std::io::Result<Option<Queued>> {
        let mut byte = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut byte)];
        let mut control = nix::cmsg_space!(u32);
        // MSG_TRUNC: the message's whole length, though one byte is read.
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_TRUNC;
        let m = match socket::recvmsg::<NetlinkAddr>(s.as_raw_fd(), &mut iov, Some(&mut control), flags) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let group = m.cmsgs()?.find_map(|c| match c {
            ControlMessageOwned::Unknown(u) if u.cmsg_header.cmsg_level == SOL_NETLINK && u.cmsg_header.cmsg_type == NETLINK_PKTINFO => {
                u.data_bytes.get(..4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
            }
            _ => None,
        });
        let to_group = group.unwrap_or(0) != 0 || m.address.is_some_and(|a| a.groups() != 0);
        Ok(Some(Queued { len: m.bytes, to_group }))
    }

    /// A message queued on a netlink socket.
    #[derive(Debug, Clone, Copy)]
    pub struct Queued {
        pub len: usize,
        /// Sent to a multicast group (an event), not to the socket alone (a reply).
        pub to_group: bool,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memberships_are_read_from_the_bitmap() {
        let mut bitmap = Vec::new();
        bitmap.extend_from_slice(&(1u32 | 1 << 4).to_ne_bytes());
        bitmap.extend_from_slice(&(1u32 << 2).to_ne_bytes());
        assert_eq!(membership_list(&bitmap), vec![1, 5, 35]);
        assert!(membership_list(&[]).is_empty());
    }

    #[test]
    fn records_out_of_bounds_are_refused() {
        let good = NetlinkRecord {
            protocol: libc::NETLINK_ROUTE,
            ty: libc::SOCK_RAW,
            portid: 7,
            groups: vec![1, 8],
            flags: vec![5],
            rcvbuf: 4096,
            sndbuf: 4096,
            connected: Some((9, 1 << 4)),
        };
        assert_eq!(validate(&good), Ok(()));
        for bad in [
            NetlinkRecord { protocol: 99, ..good.clone() },
            NetlinkRecord { ty: libc::SOCK_STREAM, ..good.clone() },
            NetlinkRecord { groups: vec![0], ..good.clone() },
            NetlinkRecord { flags: vec![1], ..good.clone() },
            NetlinkRecord { connected: Some((0, 3)), ..good.clone() },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
