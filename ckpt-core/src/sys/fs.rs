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
