//! Files reached other than by a path name, and their blocks: a file handle (open_by_handle_at,
//! whose `struct file_handle` nix does not wrap), and a reflink (FICLONE).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use super::check;

/// Opens the file whose handle (type `handle_type`, bytes `handle`) the kernel gave, on the file
/// system mounted at `mount`, with `flags`.
pub fn open_by_handle(mount: impl AsFd, handle_type: i32, handle: &[u8], flags: i32) -> io::Result<OwnedFd> {
    // struct file_handle { u32 handle_bytes; i32 handle_type; u8 f_handle[]; }
    let mut raw = Vec::with_capacity(8 + handle.len());
    raw.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
    raw.extend_from_slice(&handle_type.to_ne_bytes());
    raw.extend_from_slice(handle);
    // SAFETY: `raw` is a complete struct file_handle that lives across the call.
    let fd = check(unsafe { libc::syscall(libc::SYS_open_by_handle_at, mount.as_fd().as_raw_fd(), raw.as_ptr(), flags) })?;
    // SAFETY: the descriptor just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `ioctl(dst, FICLONE, src)`: makes `dst` share `src`'s blocks (copy on write). Fails with
/// EOPNOTSUPP, EXDEV or EINVAL where the file system has no reflinks (ext4).
pub fn ficlone(dst: impl AsFd, src: impl AsFd) -> io::Result<()> {
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: FICLONE takes two open descriptors and touches no memory of ours.
    check(unsafe { libc::ioctl(dst.as_fd().as_raw_fd(), FICLONE, src.as_fd().as_raw_fd()) }).map(drop)
}

// fcntl's owner commands and owner types (<linux/fcntl.h>, <asm-generic/fcntl.h>), which the
// libc crate does not define for Linux.
pub const F_SETSIG: i32 = 10;
pub const F_GETSIG: i32 = 11;
pub const F_SETOWN_EX: i32 = 15;
pub const F_GETOWN_EX: i32 = 16;
pub const F_OWNER_TID: i32 = 0;
pub const F_OWNER_PID: i32 = 1;
pub const F_OWNER_PGRP: i32 = 2;

/// An open file description's owner, as `fcntl(F_GETOWN_EX)` reports it (`F_OWNER_TID`,
/// `F_OWNER_PID` or `F_OWNER_PGRP`, and the number as the caller's PID namespace shows it; 0 for
/// none), and the signal `F_GETSIG` reports (0: SIGIO). libc wraps neither struct f_owner_ex
/// nor its call in a safe form.
pub fn file_owner(fd: impl AsFd) -> io::Result<(i32, i32, i32)> {
    let mut owner = [0i32; 2]; // struct f_owner_ex { int type; pid_t pid; }
                               // SAFETY: F_GETOWN_EX writes one struct f_owner_ex into `owner`, which outlives the call.
    check(unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), F_GETOWN_EX, owner.as_mut_ptr()) })?;
    // SAFETY: F_GETSIG takes no argument.
    let signal = check(unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), F_GETSIG) })?;
    Ok((owner[0], owner[1], signal))
}

/// Sets an open file description's owner (`fcntl(F_SETOWN_EX)`: `kind` as [`file_owner`]
/// reports it, `pid` in the caller's PID namespace) and its I/O signal (`F_SETSIG`).
pub fn set_file_owner(fd: impl AsFd, kind: i32, pid: i32, signal: i32) -> io::Result<()> {
    let owner = [kind, pid];
    // SAFETY: F_SETOWN_EX reads one struct f_owner_ex from `owner`, which outlives the call.
    check(unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), F_SETOWN_EX, owner.as_ptr()) })?;
    // SAFETY: F_SETSIG takes an int.
    check(unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), F_SETSIG, signal) }).map(drop)
}
