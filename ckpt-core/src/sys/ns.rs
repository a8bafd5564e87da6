//! Namespace files (/proc/PID/ns/*): the namespaces related to one, through the ioctls of
//! ioctl_ns(2), which neither libc nor nix names.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use super::check;

/// _IO(0xb7, 1) of linux/nsfs.h.
const NS_GET_USERNS: libc::c_ulong = 0xb701;
/// _IO(0xb7, 2) of linux/nsfs.h.
const NS_GET_PARENT: libc::c_ulong = 0xb702;

/// The user namespace that owns namespace `ns` (NS_GET_USERNS).
pub fn owner(ns: impl AsFd) -> io::Result<OwnedFd> {
    related(ns, NS_GET_USERNS)
}

/// The parent of user or PID namespace `ns` (NS_GET_PARENT).
pub fn parent(ns: impl AsFd) -> io::Result<OwnedFd> {
    related(ns, NS_GET_PARENT)
}

fn related(ns: impl AsFd, request: libc::c_ulong) -> io::Result<OwnedFd> {
    // SAFETY: the ioctl takes no argument and returns a new descriptor.
    let fd = check(unsafe { libc::ioctl(ns.as_fd().as_raw_fd(), request as _) })?;
    // SAFETY: `fd` was just returned to us and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
