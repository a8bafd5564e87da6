//! Credentials of the calling thread alone, where the C library's wrappers change every thread
//! of the process (see `fsid`'s module comment for why that matters).

use std::io;

use super::check;

/// setgroups(2) for the calling thread only: the raw system call, not glibc's broadcast.
pub fn set_thread_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the system call reads `groups.len()` gid_t values from a live slice.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }).map(drop)
}
