//! Making and ending processes where std's and nix's calls do not fit: `clone` with namespace
//! flags, `clone3` with a chosen pid, and the steps of a child between fork and `execve`, which
//! must not allocate nor run exit handlers.

use std::ffi::{c_char, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use super::check;

/// Which side of a fork the caller is on.
pub enum Forked {
    Child,
    /// The parent, with the child's pid.
    Parent(i32),
}

/// clone(2) without CLONE_VM, with `flags` (new namespaces, the exit signal): a fork whose child
/// starts in the new namespaces.
///
/// # Safety
///
/// As for fork(2) in a process that may have threads: until it execs or exits (see
/// [`exit_now`] and [`exec_with_fd`]), the child may only make async-signal-safe calls, on data
/// prepared before the call.
pub unsafe fn clone_fork(flags: libc::c_ulong) -> io::Result<Forked> {
    // SAFETY: without CLONE_VM and without a stack, clone is a fork; the caller answers for
    // what the child does.
    let pid = check(unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) })?;
    Ok(if pid == 0 { Forked::Child } else { Forked::Parent(pid as i32) })
}

/// Ends the calling process with `code` at once: no exit handlers, no buffers flushed (a child of
/// a fork shares those with its parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit takes an integer and does not return.
    unsafe { libc::_exit(code) }
}

/// Restores the default action of signal `sig` (ignored ones stay ignored across exec).
pub fn default_action(sig: libc::c_int) {
    // SAFETY: SIG_DFL installs no handler of ours.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
}

/// A program and its arguments, prepared before a fork so that the child can exec it without
/// allocating.
pub struct Exec {
    path: CString,
    /// Owns what `pointers` point at.
    _argv: Vec<CString>,
    /// `argv` as execve takes it, ending with a null pointer.
    pointers: Vec<*const c_char>,
}

impl Exec {
    /// The program at `path`, run with `argv` (its name first).
    pub fn new(path: CString, argv: Vec<CString>) -> Exec {
        let mut pointers: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        pointers.push(std::ptr::null());
        Exec { path, _argv: argv, pointers }
    }
}

/// Replaces the calling process by `program`, with this process's environment, stdio and `fd`
/// (as number `at`, inherited) as its only descriptors; exits with 127 if `execve` fails.
/// Async-signal-safe.
pub fn exec_with_fd(program: &Exec, fd: BorrowedFd<'_>, at: RawFd) -> ! {
    extern "C" {
        static environ: *const *const c_char;
    }
    let raw = fd.as_raw_fd();
    // SAFETY: plain system calls on live data; the descriptors closed here may be owned by
    // objects of this process, but none of its code runs after: it becomes `program` or exits.
    unsafe {
        if raw == at {
            libc::fcntl(raw, libc::F_SETFD, 0);
        } else {
            libc::dup2(raw, at);
        }
        libc::syscall(libc::SYS_close_range, at as u32 + 1, u32::MAX, 0u32);
        libc::execve(program.path.as_ptr(), program.pointers.as_ptr(), environ);
        libc::_exit(127)
    }
}

/// `struct clone_args` of clone3(2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Forks a child with pid `pid` (clone3 with set_tid) that keeps only stdio and pauses until it
/// is killed or taken over.
pub fn spawn_idle_at(pid: i32) -> io::Result<()> {
    let set_tid = [pid as libc::pid_t];
    let mut args = CloneArgs { exit_signal: libc::SIGCHLD as u64, ..Default::default() };
    args.set_tid = set_tid.as_ptr() as u64;
    args.set_tid_size = 1;
    // SAFETY: clone3 without CLONE_VM is a fork; `args` and `set_tid` outlive the call. The
    // child runs none of the caller's code, only the async-signal-safe calls below.
    let r = check(unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) })?;
    if r == 0 {
        // SAFETY: plain system calls; the descriptors closed are never used again here.
        unsafe {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            loop {
                libc::pause();
            }
        }
    }
    Ok(())
}

/// Whether the kernel has clone3 with `set_tid` (Linux 5.5), asked without making a process:
/// the argument (88 bytes: `set_tid` came with 5.5, `cgroup` after it with 5.7; a kernel takes
/// a longer argument whose unknown bytes are zero) says `set_tid_size` 1 with no array. A
/// kernel that knows `set_tid` refuses that pair with EINVAL; one with clone3 but not `set_tid`
/// (5.3, 5.4) refuses the unknown non-zero bytes with E2BIG; one without clone3, ENOSYS. (A
/// zero-sized argument, the older probe, told only clone3 itself apart.)
pub fn has_clone3_with_set_tid() -> bool {
    clone3_probe_says_set_tid(clone3_probe())
}

/// The probe's errno.
fn clone3_probe() -> Option<i32> {
    let args = CloneArgs { set_tid_size: 1, ..Default::default() };
    // SAFETY: the kernel reads `args` and refuses it before making anything.
    let r = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    (r == -1).then(|| super::last_error().raw_os_error().unwrap_or(0))
}

/// What the probe's answer says (pure): EINVAL only where `set_tid` is known.
fn clone3_probe_says_set_tid(errno: Option<i32>) -> bool {
    errno == Some(libc::EINVAL)
}

/// The size of `struct prctl_mm_map` this kernel takes (PR_SET_MM_MAP_SIZE).
pub fn mm_map_size() -> io::Result<u32> {
    const PR_SET_MM: libc::c_int = 35;
    const PR_SET_MM_MAP_SIZE: libc::c_ulong = 15;
    let mut size: u32 = 0;
    // SAFETY: PR_SET_MM_MAP_SIZE only writes the structure size into `size`.
    check(unsafe { libc::prctl(PR_SET_MM, PR_SET_MM_MAP_SIZE, &mut size as *mut u32, 0, 0) })?;
    Ok(size)
}

/// The robust futex list of task `tid`: its head and length (get_robust_list(2)).
pub fn robust_list(tid: i32) -> io::Result<(u64, u64)> {
    let (mut head, mut len) = (0u64, 0u64);
    // SAFETY: both out-pointers are valid for the call.
    check(unsafe { libc::syscall(libc::SYS_get_robust_list, tid, &mut head as *mut u64, &mut len as *mut u64) })?;
    Ok((head, len))
}

/// This process's nice value (getpriority(2)); -1 is a valid answer, so errno tells a failure.
pub fn nice_value() -> io::Result<i32> {
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes integers only.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if n == -1 && nix::errno::Errno::last_raw() != 0 {
        return Err(super::last_error());
    }
    Ok(n)
}

#[cfg(test)]
mod clone3_tests {
    use super::*;

    #[test]
    fn the_clone3_probe_tells_set_tid_apart() {
        assert!(clone3_probe_says_set_tid(Some(libc::EINVAL)));
        assert!(!clone3_probe_says_set_tid(Some(libc::E2BIG)), "Linux 5.3 and 5.4: clone3 without set_tid");
        assert!(!clone3_probe_says_set_tid(Some(libc::ENOSYS)), "before 5.3");
        // This kernel (the tests run on 5.14 and later) has it, and the probe made no process.
        assert_eq!(clone3_probe(), Some(libc::EINVAL));
        assert!(has_clone3_with_set_tid());
    }
}
