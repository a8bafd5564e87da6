//! Process descriptors (pidfd_open, pidfd_getfd) and kcmp's comparison of two descriptors.

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

/// kcmp(KCMP_FILE): whether descriptor `fd1` of `pid1` and `fd2` of `pid2` are one open file
/// description (false too when kcmp cannot tell: no rights over either process).
pub fn same_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp compares kernel objects; it is passed integers, no memory.
    unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1 as libc::c_long, fd2 as libc::c_long) == 0 }
}
