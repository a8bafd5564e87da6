//! kcmp(2): whether two processes' kernel objects are the same one, which no library wraps.

/// `KCMP_EPOLL_TFD` of linux/kcmp.h.
const KCMP_EPOLL_TFD: libc::c_long = 7;

/// Whether the file open at `candidate` in process `pid` is the `toff`-th file that process's
/// epoll instance at `epfd` watches under number `tfd`.
pub fn epoll_target(pid: i32, candidate: i32, epfd: i32, tfd: i32, toff: u32) -> bool {
    // struct kcmp_epoll_slot { __u32 efd, tfd, toff; }
    let slot: [u32; 3] = [epfd as u32, tfd as u32, toff];
    // SAFETY: kcmp only reads the slot, a valid 12-byte structure that lives across the call.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_EPOLL_TFD, candidate as libc::c_long, slot.as_ptr()) };
    r == 0
}
