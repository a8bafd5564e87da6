//! Process descriptors: pidfd_open and pidfd_getfd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::check;

/// pidfd_open(2): a descriptor of process `pid`.
pub fn open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new descriptor, owned at once.
    let fd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: `fd` was just opened and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// pidfd_getfd(2): a duplicate of descriptor `fd` of the process of `pidfd` (the same open file
/// description).
pub fn get_fd(pidfd: &OwnedFd, fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes integers and returns a new descriptor, owned at once.
    let dup = check(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    // SAFETY: `dup` was just made and is owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as i32) })
}
