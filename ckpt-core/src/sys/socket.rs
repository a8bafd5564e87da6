//! Socket calls on a socket ckpt holds (the restorer's own, or its duplicate of a job's):
//! options as raw ints and bytes (the options ckpt keeps are many, and several are newer than
//! nix's typed ones), addresses as the kernel's sockaddr bytes, which `objects::inet` reads.

use std::os::fd::{AsRawFd, OwnedFd};

use super::check;

/// A new socket of the restorer's own (close-on-exec).
pub fn plain_socket(family: i32, ty: i32, proto: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) with plain integer arguments; the descriptor is owned at once.
    let fd = check(unsafe { libc::socket(family, ty | libc::SOCK_CLOEXEC, proto) })?;
    // SAFETY: `fd` was just created and is not owned elsewhere.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

pub fn getopt_int(s: &OwnedFd, level: i32, name: i32) -> std::io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid out-pointers of the sizes given.
    check(unsafe { libc::getsockopt(s.as_raw_fd(), level, name, &mut v as *mut _ as *mut _, &mut len) })?;
    Ok(v)
}

pub fn setopt_int(s: &OwnedFd, level: i32, name: i32, v: i32) -> std::io::Result<()> {
    setopt_bytes(s, level, name, &v.to_ne_bytes())
}

/// getsockopt into a buffer of `len` bytes; returns what the kernel wrote.
pub fn getopt_bytes(s: &OwnedFd, level: i32, name: i32, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut l = len as libc::socklen_t;
    // SAFETY: `buf` is valid for `l` bytes of writes; `l` is a valid in/out pointer.
    check(unsafe { libc::getsockopt(s.as_raw_fd(), level, name, buf.as_mut_ptr() as *mut _, &mut l) })?;
    buf.truncate(l as usize);
    Ok(buf)
}

/// getsockopt(2) of an option that is asked with an argument: `buf` goes in as the question and
/// comes back as the answer, cut to what the kernel wrote.
pub fn getopt_in_out(s: &OwnedFd, level: i32, name: i32, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut l = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is valid for `l` bytes of reads and writes; `l` is a valid in/out pointer.
    check(unsafe { libc::getsockopt(s.as_raw_fd(), level, name, buf.as_mut_ptr() as *mut _, &mut l) })?;
    buf.truncate(l as usize);
    Ok(())
}

pub fn setopt_bytes(s: &OwnedFd, level: i32, name: i32, v: &[u8]) -> std::io::Result<()> {
    // SAFETY: `v` is valid for reads of its length.
    check(unsafe { libc::setsockopt(s.as_raw_fd(), level, name, v.as_ptr() as *const _, v.len() as libc::socklen_t) }).map(drop)
}

/// An ioctl that reads one int (SIOCINQ, SIOCOUTQ, ...).
pub use super::ioctl_int_out as ioctl_int;

/// Polls one descriptor for `events`, waiting at most `ms` milliseconds; returns revents.
pub fn poll_one(s: &OwnedFd, events: i16, ms: i32) -> std::io::Result<i16> {
    let mut p = libc::pollfd { fd: s.as_raw_fd(), events, revents: 0 };
    // SAFETY: one valid pollfd.
    check(unsafe { libc::poll(&mut p, 1, ms) })?;
    Ok(p.revents)
}

pub fn get_fl(s: &OwnedFd) -> std::io::Result<i32> {
    // SAFETY: F_GETFL takes no pointer.
    check(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFL) })
}

pub fn set_fl(s: &OwnedFd, flags: i32) -> std::io::Result<()> {
    // SAFETY: F_SETFL takes an int.
    check(unsafe { libc::fcntl(s.as_raw_fd(), libc::F_SETFL, flags) }).map(drop)
}

/// Sends all of `data` on a connected socket, waiting (up to `timeout`) while its buffer is full.
pub fn send_all(s: &OwnedFd, data: &[u8], timeout: std::time::Duration) -> std::io::Result<()> {
    let start = std::time::Instant::now();
    let mut off = 0;
    while off < data.len() {
        // SAFETY: the slice is valid for reads of its length.
        let sent = check(unsafe { libc::send(s.as_raw_fd(), data[off..].as_ptr() as *const _, data.len() - off, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) });
        let e = match sent {
            Ok(n) => {
                off += n as usize;
                continue;
            }
            Err(e) => e,
        };
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) if start.elapsed() < timeout => {
                poll_one(s, libc::POLLOUT, 100)?;
            }
            _ => return Err(e),
        }
    }
    Ok(())
}

/// The socket's own address (`peer`: its peer's) as sockaddr bytes; None when it has no peer.
pub fn sockname(s: &OwnedFd, peer: bool) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 128];
    let mut len = buf.len() as libc::socklen_t;
    let p = buf.as_mut_ptr() as *mut libc::sockaddr;
    // SAFETY: `buf` is valid for `len` bytes of writes; `len` is a valid in/out pointer.
    let r = check(unsafe {
        if peer {
            libc::getpeername(s.as_raw_fd(), p, &mut len)
        } else {
            libc::getsockname(s.as_raw_fd(), p, &mut len)
        }
    });
    match r {
        Ok(_) => Ok(Some(buf[..(len as usize).min(buf.len())].to_vec())),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// bind(2) to a sockaddr given as its bytes.
pub fn bind(s: &OwnedFd, sockaddr: &[u8]) -> std::io::Result<()> {
    // SAFETY: `sockaddr` is valid for reads of its length, which is passed.
    check(unsafe { libc::bind(s.as_raw_fd(), sockaddr.as_ptr() as *const libc::sockaddr, sockaddr.len() as libc::socklen_t) }).map(drop)
}

/// connect(2) to a sockaddr given as its bytes.
pub fn connect(s: &OwnedFd, sockaddr: &[u8]) -> std::io::Result<()> {
    // SAFETY: `sockaddr` is valid for reads of its length, which is passed.
    check(unsafe { libc::connect(s.as_raw_fd(), sockaddr.as_ptr() as *const libc::sockaddr, sockaddr.len() as libc::socklen_t) }).map(drop)
}

/// listen(2).
pub fn listen(s: &OwnedFd, backlog: i32) -> std::io::Result<()> {
    // SAFETY: listen on a socket we hold; no pointer is passed.
    check(unsafe { libc::listen(s.as_raw_fd(), backlog) }).map(drop)
}

/// shutdown(2)'s `how` that shuts what the kernel's `sk_shutdown` bits (1 receiving, 2
/// sending, as sock_diag reports them) say; None for neither. Pure.
pub fn how_to_shut(sk_shutdown: u8) -> Option<i32> {
    match sk_shutdown & 3 {
        1 => Some(libc::SHUT_RD),
        2 => Some(libc::SHUT_WR),
        3 => Some(libc::SHUT_RDWR),
        _ => None,
    }
}

/// shutdown(2), `how` SHUT_RD, SHUT_WR or SHUT_RDWR.
pub fn shutdown(s: &OwnedFd, how: i32) -> std::io::Result<()> {
    // SAFETY: shutdown on a socket we hold; no pointer is passed.
    check(unsafe { libc::shutdown(s.as_raw_fd(), how) }).map(drop)
}

/// accept4(2) of the next connection, close-on-exec, without its peer's address.
pub fn accept(l: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: null address pointers ask for no address.
    let a = check(unsafe { libc::accept4(l.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) })?;
    // SAFETY: the descriptor just returned, owned by nothing else.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(a) })
}

/// recv(2) into `buf` with `flags` (MSG_PEEK, MSG_DONTWAIT, ...): the bytes received.
pub fn recv(s: &OwnedFd, buf: &mut [u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length, which is passed.
    let n = check(unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), flags) })?;
    Ok(n as usize)
}

/// send(2) of `data` with `flags`: the bytes sent.
pub fn send(s: &OwnedFd, data: &[u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: `data` is valid for reads of its length, which is passed.
    let n = check(unsafe { libc::send(s.as_raw_fd(), data.as_ptr() as *const libc::c_void, data.len(), flags) })?;
    Ok(n as usize)
}

/// The addresses of this machine's interfaces, as sockaddr bytes (IPv4 and IPv6 only).
pub fn interface_addresses() -> std::io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut ifs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list that is walked read-only and freed once below.
    check(unsafe { libc::getifaddrs(&mut ifs) })?;
    let mut p = ifs;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs made, alive until freeifaddrs.
        let a = unsafe { (*p).ifa_addr };
        if !a.is_null() {
            // SAFETY: a non-null address of the list starts with its family.
            let len = match unsafe { (*a).sa_family } as i32 {
                libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
                libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
                _ => 0,
            };
            if len > 0 {
                // SAFETY: an address of that family is that long.
                out.push(unsafe { std::slice::from_raw_parts(a as *const u8, len) }.to_vec());
            }
        }
        // SAFETY: as above.
        p = unsafe { (*p).ifa_next };
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(ifs) };
    Ok(out)
}

/// recvmsg(2) into `buf` with `flags`, with the sender's address as sockaddr bytes: the bytes
/// received and the address.
pub fn recv_from(s: &OwnedFd, buf: &mut [u8], flags: i32) -> std::io::Result<(usize, Vec<u8>)> {
    let mut name = [0u8; 128];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: msghdr is plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = name.as_mut_ptr() as *mut libc::c_void;
    msg.msg_namelen = name.len() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at `name` and `buf`, live for the call, of the sizes given.
    let n = check(unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, flags) })?;
    Ok((n as usize, name[..(msg.msg_namelen as usize).min(name.len())].to_vec()))
}

/// sendto(2) of `data` to a sockaddr given as its bytes, with `flags`.
pub fn send_to(s: &OwnedFd, data: &[u8], sockaddr: &[u8], flags: i32) -> std::io::Result<usize> {
    // SAFETY: `data` and `sockaddr` are valid for reads of their lengths, which are passed.
    let n = check(unsafe {
        libc::sendto(
            s.as_raw_fd(),
            data.as_ptr() as *const libc::c_void,
            data.len(),
            flags,
            sockaddr.as_ptr() as *const libc::sockaddr,
            sockaddr.len() as libc::socklen_t,
        )
    })?;
    Ok(n as usize)
}

/// The length of the classic BPF filter attached to a socket, in instructions (0: none).
/// SO_GET_FILTER counts in instructions, and with no room returns the count alone.
pub fn filter_len(s: &OwnedFd) -> std::io::Result<u32> {
    let mut count: libc::socklen_t = 0;
    // SAFETY: a null buffer of count 0: the kernel writes only `count`.
    check(unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_GET_FILTER, std::ptr::null_mut(), &mut count) })?;
    Ok(count)
}

/// The classic BPF filter attached to a socket, its instructions as 8 bytes each.
pub fn filter(s: &OwnedFd) -> std::io::Result<Vec<[u8; 8]>> {
    let count = filter_len(s)?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut prog = vec![[0u8; 8]; count as usize];
    let mut got = count;
    // SAFETY: `prog` holds `count` instructions of 8 bytes, as the kernel writes them.
    check(unsafe { libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_GET_FILTER, prog.as_mut_ptr() as *mut libc::c_void, &mut got) })?;
    prog.truncate(got as usize);
    Ok(prog)
}

/// Attaches a classic BPF filter (SO_ATTACH_FILTER, struct sock_fprog).
pub fn attach_filter(s: &OwnedFd, prog: &[[u8; 8]]) -> std::io::Result<()> {
    let len = u16::try_from(prog.len()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog { len, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points at `prog`, valid for its length, for the duration of the call;
    // the kernel copies it and does not write through it.
    check(unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// What [`recv_with_rights`] received.
pub struct Received {
    /// The bytes received into the buffer.
    pub len: usize,
    /// The message's flags (MSG_TRUNC, MSG_CTRUNC, ...).
    pub flags: i32,
    /// The sender's address as sockaddr bytes (empty or the family alone: no name).
    pub from: Vec<u8>,
    /// The descriptors it carried (SCM_RIGHTS), installed in this process, in order.
    pub fds: Vec<OwnedFd>,
}

/// recvmsg(2) into `buf` with `flags` (MSG_CMSG_CLOEXEC is a good idea), with the sender's
/// address and the descriptors the message carries; room for SCM_MAX_FD (253) descriptors and
/// credentials (more sets MSG_CTRUNC in the flags).
pub fn recv_with_rights(s: &OwnedFd, buf: &mut [u8], flags: i32) -> std::io::Result<Received> {
    let mut control = [0u64; 160];
    // SAFETY: sockaddr_un is plain data; zero is a valid value.
    let mut from: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: msghdr is plain data; zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    msg.msg_name = &mut from as *mut libc::sockaddr_un as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of_val(&from) as libc::socklen_t;
    // SAFETY: `msg` points at `buf`, `control` and `from`, live for the call, of the sizes given.
    let n = check(unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, flags) })?;
    let mut fds = Vec::new();
    // SAFETY: CMSG_* walk the control buffer the kernel filled, within msg_controllen; each
    // SCM_RIGHTS entry is a descriptor just installed in this process, owned by nobody else.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<i32>();
                let data = libc::CMSG_DATA(c) as *const i32;
                for i in 0..count {
                    fds.push(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let name_len = (msg.msg_namelen as usize).min(std::mem::size_of_val(&from));
    // SAFETY: `from` is plain data of at least `name_len` bytes.
    let from = unsafe { std::slice::from_raw_parts(&from as *const libc::sockaddr_un as *const u8, name_len) }.to_vec();
    Ok(Received { len: n as usize, flags: msg.msg_flags, from, fds })
}

/// The sizes of a control message carrying `data_len` bytes: its header's cmsg_len and the room
/// it takes (CMSG_LEN, CMSG_SPACE).
pub fn control_sizes(data_len: u32) -> (usize, usize) {
    // SAFETY: CMSG_LEN and CMSG_SPACE compute sizes; they read no memory.
    unsafe { (libc::CMSG_LEN(data_len) as usize, libc::CMSG_SPACE(data_len) as usize) }
}

/// sendmsg(2) of `data` with `fds` (SCM_RIGHTS, when there are any) and `flags`: the bytes sent.
pub fn send_with_rights(s: &OwnedFd, data: &[u8], fds: &[OwnedFd], flags: i32) -> std::io::Result<usize> {
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let (cmsg_len, space) = control_sizes(std::mem::size_of_val(raw.as_slice()) as u32);
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: msghdr is plain data; zero is a valid value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !raw.is_empty() {
        hdr.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        hdr.msg_controllen = space;
        // SAFETY: the control buffer holds CMSG_SPACE bytes: one header and the descriptors,
        // written within it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = cmsg_len;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c) as *mut i32, raw.len());
        }
    }
    // SAFETY: `hdr` points at `data` and `control`, live for the call; the kernel only reads.
    let n = check(unsafe { libc::sendmsg(s.as_raw_fd(), &hdr, flags) })?;
    Ok(n as usize)
}
