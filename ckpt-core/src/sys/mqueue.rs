//! POSIX message queues (mq_overview(7)) on descriptors ckpt holds as `OwnedFd`: nix's calls,
//! given a view of the descriptor as the queue handle nix takes (on Linux a queue handle is the
//! descriptor itself), and a queue made by name returned as an `OwnedFd` that closes it.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use nix::mqueue::{self, MQ_OFlag, MqAttr, MqdT};
use nix::sys::stat::Mode;

/// A queue's attributes (mq_getattr).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attributes {
    pub flags: i64,
    pub maxmsg: i64,
    pub msgsize: i64,
    pub curmsgs: i64,
}

/// Runs `f` on `q` seen as nix's queue handle, which is not closed after.
fn with_handle<T>(q: &OwnedFd, f: impl FnOnce(&MqdT) -> nix::Result<T>) -> io::Result<T> {
    // SAFETY: on Linux a queue handle is the open descriptor; the handle is never dropped
    // into mq_close (ManuallyDrop), so `q` keeps owning it.
    let handle = ManuallyDrop::new(unsafe { MqdT::from_raw_fd(q.as_raw_fd()) });
    f(&handle).map_err(io::Error::from)
}

/// mq_open with O_CREAT: makes queue `name` (`/NAME`) with `flags` (besides O_CREAT), `mode`
/// and room for `maxmsg` messages of `msgsize` bytes.
pub fn create(name: &str, flags: i32, mode: u32, maxmsg: i64, msgsize: i64) -> io::Result<OwnedFd> {
    let attr = MqAttr::new(0, maxmsg, msgsize, 0);
    let oflag = MQ_OFlag::from_bits_retain(flags) | MQ_OFlag::O_CREAT;
    let q = mqueue::mq_open(name, oflag, Mode::from_bits_truncate(mode), Some(&attr)).map_err(io::Error::from)?;
    // SAFETY: the descriptor mq_open just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(q.into_raw_fd()) })
}

/// mq_unlink: removes queue `name` (`/NAME`) from its namespace.
pub fn unlink(name: &str) -> io::Result<()> {
    mqueue::mq_unlink(name).map_err(io::Error::from)
}

/// mq_getattr.
pub fn attributes(q: &OwnedFd) -> io::Result<Attributes> {
    with_handle(q, mqueue::mq_getattr).map(|a| Attributes { flags: a.flags(), maxmsg: a.maxmsg(), msgsize: a.msgsize(), curmsgs: a.curmsgs() })
}

/// mq_receive: the next message into `buf` (which must hold the queue's message size): its
/// length and priority.
pub fn receive(q: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, u32)> {
    let mut priority = 0;
    let n = with_handle(q, |h| mqueue::mq_receive(h, buf, &mut priority))?;
    Ok((n, priority))
}

/// mq_send.
pub fn send(q: &OwnedFd, message: &[u8], priority: u32) -> io::Result<()> {
    with_handle(q, |h| mqueue::mq_send(h, message, priority))
}
