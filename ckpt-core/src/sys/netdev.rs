//! Network interfaces through the classic ioctls on a socket (`struct ifreq`, `struct ifconf`):
//! what they answer is of the socket's network namespace, whoever asks. nix and rustix wrap
//! none of them.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::check;

/// The size of `struct ifreq` on 64-bit Linux: the name, then a 24-byte union.
pub const IFREQ_LEN: usize = 40;

/// A `struct ifreq` naming interface `name`, with `value` (a short or int of the union) after
/// it. Pure; for calls made here and for those injected into a process.
pub fn ifreq(name: &str, value: i32) -> [u8; IFREQ_LEN] {
    let mut req = [0u8; IFREQ_LEN];
    let n = name.len().min(libc::IFNAMSIZ - 1);
    req[..n].copy_from_slice(&name.as_bytes()[..n]);
    req[libc::IFNAMSIZ..libc::IFNAMSIZ + 4].copy_from_slice(&value.to_ne_bytes());
    req
}

fn ifreq_ioctl(sock: &OwnedFd, request: libc::c_ulong, name: &str) -> std::io::Result<[u8; IFREQ_LEN]> {
    let mut req = ifreq(name, 0);
    // SAFETY: `req` is a struct ifreq the call reads the name of and writes its answer into.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), request, req.as_mut_ptr()) })?;
    Ok(req)
}

/// The flags of interface `name` (IFF_UP, IFF_LOOPBACK, ...): SIOCGIFFLAGS.
pub fn interface_flags(sock: &OwnedFd, name: &str) -> std::io::Result<u16> {
    let req = ifreq_ioctl(sock, libc::SIOCGIFFLAGS, name)?;
    Ok(u16::from_ne_bytes([req[libc::IFNAMSIZ], req[libc::IFNAMSIZ + 1]]))
}

/// The MTU of interface `name`: SIOCGIFMTU.
pub fn interface_mtu(sock: &OwnedFd, name: &str) -> std::io::Result<u32> {
    let req = ifreq_ioctl(sock, libc::SIOCGIFMTU, name)?;
    Ok(u32::from_ne_bytes(req[libc::IFNAMSIZ..libc::IFNAMSIZ + 4].try_into().expect("four bytes")))
}

/// Every IPv4 address of the namespace's interfaces, with the name (label) it is under:
/// SIOCGIFCONF.
pub fn ipv4_addresses(sock: &OwnedFd) -> std::io::Result<Vec<(String, Ipv4Addr)>> {
    // Room for many more addresses than a namespace of the job has; the kernel fills what fits.
    let mut buf = vec![0u8; 256 * IFREQ_LEN];
    // struct ifconf: the buffer's length (an int, padded to 8), then a pointer to it.
    let mut conf = [0u8; 16];
    conf[..4].copy_from_slice(&(buf.len() as i32).to_ne_bytes());
    conf[8..].copy_from_slice(&(buf.as_mut_ptr() as usize).to_ne_bytes());
    // SAFETY: `conf` is a struct ifconf whose pointer is `buf`, valid for its length, which the
    // kernel fills with struct ifreq; `buf` outlives the call.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFCONF, conf.as_mut_ptr()) })?;
    let filled = (i32::from_ne_bytes(conf[..4].try_into().expect("four bytes")).max(0) as usize).min(buf.len());
    Ok(buf[..filled].chunks_exact(IFREQ_LEN).filter_map(parse_ifconf_entry).collect())
}

/// One struct ifreq of SIOCGIFCONF's answer: its name, and its address (a sockaddr_in). Pure.
fn parse_ifconf_entry(req: &[u8]) -> Option<(String, Ipv4Addr)> {
    let name_end = req[..libc::IFNAMSIZ].iter().position(|&b| b == 0).unwrap_or(libc::IFNAMSIZ);
    let name = String::from_utf8(req[..name_end].to_vec()).ok()?;
    let addr = &req[libc::IFNAMSIZ..];
    if u16::from_ne_bytes([addr[0], addr[1]]) != libc::AF_INET as u16 {
        return None;
    }
    Some((name, Ipv4Addr::new(addr[4], addr[5], addr[6], addr[7])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_of_this_namespace_is_read() {
        let sock = std::os::fd::OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        let flags = interface_flags(&sock, "lo").unwrap();
        assert_ne!(flags & libc::IFF_LOOPBACK as u16, 0);
        assert_ne!(flags & libc::IFF_UP as u16, 0);
        assert!(interface_mtu(&sock, "lo").unwrap() > 0);
        assert!(ipv4_addresses(&sock).unwrap().contains(&("lo".to_string(), Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn an_ifreq_carries_its_name_and_value() {
        let req = ifreq("lo", 65536);
        assert_eq!(&req[..3], b"lo\0");
        assert_eq!(i32::from_ne_bytes(req[16..20].try_into().unwrap()), 65536);
        let mut entry = [0u8; IFREQ_LEN];
        entry[..2].copy_from_slice(b"lo");
        entry[16..18].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        entry[20..24].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(parse_ifconf_entry(&entry), Some(("lo".to_string(), Ipv4Addr::LOCALHOST)));
    }
}
