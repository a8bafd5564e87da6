//! Timer descriptors the restorer holds (its duplicates of a job's), beyond nix's `TimerFd`,
//! which would take ownership of them.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use super::check;

/// timerfd_gettime(2) on timer `fd`, for what it does: an interval timer that expired unread is
/// moved on; the answer is dropped.
pub fn touch(fd: impl AsFd) -> io::Result<()> {
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let mut cur = libc::itimerspec { it_interval: zero, it_value: zero };
    // SAFETY: `cur` is a valid out-pointer of the right type.
    check(unsafe { libc::timerfd_gettime(fd.as_fd().as_raw_fd(), &mut cur) }).map(drop)
}
