//! Terminal ioctls and settings (tty_ioctl(4), termios(3)) on pseudo-terminal ends, for
//! `objects::pty`. Hand-written: the calls take and give the kernel's own `termios` and
//! `winsize`, which the pty record copies field by field, and the pty requests (TIOCGPTN,
//! TIOCGPTLCK, TIOCGPKT, TIOCGPTPEER) that nix has no wrapper for.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::check;

/// An ioctl `request` that writes one int: the int.
pub use super::ioctl_int_out as int_out;

/// An ioctl `request` that reads one int.
pub fn int_in(fd: &OwnedFd, request: libc::c_ulong, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the requests this is used with read one int, which `value` is.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), request, &value) }).map(drop)
}

/// A termios with every field zero, to fill in.
pub fn blank_termios() -> libc::termios {
    // SAFETY: termios is plain data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// tcgetattr.
pub fn termios(fd: &OwnedFd) -> io::Result<libc::termios> {
    let mut t = blank_termios();
    // SAFETY: tcgetattr fills the struct it is given.
    check(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) })?;
    Ok(t)
}

/// tcsetattr(TCSANOW).
pub fn set_termios(fd: &OwnedFd, t: &libc::termios) -> io::Result<()> {
    // SAFETY: tcsetattr reads the struct it is given.
    check(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, t) }).map(drop)
}

/// TIOCGWINSZ: rows, columns, x and y pixels.
pub fn winsize(fd: &OwnedFd) -> io::Result<[u16; 4]> {
    let mut w = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one winsize.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut w) })?;
    Ok([w.ws_row, w.ws_col, w.ws_xpixel, w.ws_ypixel])
}

/// TIOCSWINSZ.
pub fn set_winsize(fd: &OwnedFd, w: [u16; 4]) -> io::Result<()> {
    let w = libc::winsize { ws_row: w[0], ws_col: w[1], ws_xpixel: w[2], ws_ypixel: w[3] };
    // SAFETY: TIOCSWINSZ reads one winsize.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &w) }).map(drop)
}

/// TIOCGPTPEER: the slave of `master`, opened with `flags`.
pub fn open_peer(master: &OwnedFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: TIOCGPTPEER takes open flags and returns a new descriptor.
    let fd = check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) })?;
    // SAFETY: the descriptor just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
