//! The thin layer between ckpt's object logic and the kernel: system calls and kernel structures
//! that neither nix nor rustix wraps, each as a safe function that returns `std::io::Error` with
//! the call's errno and leaves the decisions (what to capture, what to refuse, what a message
//! says) to the modules under `objects`. `unsafe` lives here, in `ptrace` (memory and
//! registers of another process) and in the pool's memory regions.
//!
//! Moving the object modules' own raw calls here is under way (docs/PLAN-HOUSE.md lists what is
//! left): a module whose calls are all here has no `unsafe` of its own.

pub mod beneath;
pub mod caps;
pub mod cpu;
pub mod creds;
pub mod cuda;
pub mod fs;
pub mod ipc;
pub mod kcmp;
pub mod mapped;
#[cfg(test)]
#[cfg(test)]
pub mod memory;
pub mod mount;
pub mod mqueue;
pub mod netdev;
pub mod ns;
pub mod pagemap;
pub mod pidfd;
pub mod process;
pub mod procmap;
pub mod sched;
pub mod socket;
pub mod timerfd;
pub mod tty;
pub mod uffd;

/// An ioctl `request` that writes one int (FIONREAD, SIOCINQ, TIOCGPTN, ...): the int.
pub fn ioctl_int_out(fd: impl std::os::fd::AsFd, request: libc::c_ulong) -> std::io::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    // SAFETY: the requests this is used with write one int, which `v` is.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), request, &mut v) })?;
    Ok(v)
}

/// The calling thread's errno as an io::Error, when a call returned -1.
fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `r` as a result: the error of errno when it is negative.
fn check<T: Copy + Default + PartialOrd>(r: T) -> std::io::Result<T> {
    if r < T::default() {
        Err(last_error())
    } else {
        Ok(r)
    }
}
