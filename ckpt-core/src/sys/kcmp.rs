//! kcmp(2): whether two processes' kernel objects are the same one, which no library wraps.

/// `KCMP_FILE` and `KCMP_EPOLL_TFD` of linux/kcmp.h.
const KCMP_FILE: libc::c_long = 0;
const KCMP_EPOLL_TFD: libc::c_long = 7;

/// Whether descriptor `fd1` of `pid1` and `fd2` of `pid2` are one open file description (false
/// too when kcmp cannot tell: no rights over either process).
pub fn same_file(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> bool {
    order_files(pid1, fd1, pid2, fd2) == Some(std::cmp::Ordering::Equal)
}

/// How the open file description of descriptor `fd1` of `pid1` compares with that of `fd2` of
/// `pid2` in the kernel's order (an obfuscated order of their addresses, the same for every
/// call while both exist): equal when they are one description. `None` when kcmp cannot tell
/// (no rights over either process, a descriptor closed).
pub fn order_files(pid1: i32, fd1: i32, pid2: i32, fd2: i32) -> Option<std::cmp::Ordering> {
    // SAFETY: kcmp compares kernel objects; it is passed integers, no memory.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, KCMP_FILE, fd1 as libc::c_long, fd2 as libc::c_long) };
    match r {
        0 => Some(std::cmp::Ordering::Equal),
        1 => Some(std::cmp::Ordering::Less),
        2 => Some(std::cmp::Ordering::Greater),
        _ => None,
    }
}

/// Whether the file open at `candidate` in process `pid` is the `toff`-th file that process's
/// epoll instance at `epfd` watches under number `tfd`.
pub fn epoll_target(pid: i32, candidate: i32, epfd: i32, tfd: i32, toff: u32) -> bool {
    // struct kcmp_epoll_slot { __u32 efd, tfd, toff; }
    let slot: [u32; 3] = [epfd as u32, tfd as u32, toff];
    // SAFETY: kcmp only reads the slot, a valid 12-byte structure that lives across the call.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_EPOLL_TFD, candidate as libc::c_long, slot.as_ptr()) };
    r == 0
}
