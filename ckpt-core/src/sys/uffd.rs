//! userfaultfd(2): the kernel structures and ioctls ckpt uses, behind a safe type.
//!
//! Written here rather than taken from the `userfaultfd` crate: that crate makes the context in
//! the calling process (ours is made inside the restored process, by an injected call, and then
//! taken over with pidfd_getfd), and its -sys crate generates its bindings with bindgen at build
//! time, which would make every build machine need libclang. The few structures below are the
//! kernel's stable ABI (linux/userfaultfd.h).
//!
//! A context acts on the memory of the process that created it, whichever process holds the
//! descriptor: the restorer registers ranges and copies pages into the restored process; the
//! agent registers and write-protects the job's memory to learn what it writes
//! (`objects::dirty`).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// userfaultfd(2) flag: the context handles faults taken in user mode only. Anyone may create
/// such a context (even with vm.unprivileged_userfaultfd = 0); faults the kernel takes on the
/// process's behalf fail with EFAULT instead of waiting for us. Enough while nothing of the
/// process runs.
pub const USER_MODE_ONLY: u64 = 1;

/// UFFDIO_API features (non-cooperative events, each needing CAP_SYS_PTRACE of the caller for
/// FORK): the process forked (the child's registered memory gets a context of its own, whose
/// descriptor the message carries), moved a registered range (mremap), dropped pages of one
/// (MADV_DONTNEED/REMOVE), or unmapped one. The thread that did it waits until the message is
/// read, and page copies fail with EAGAIN meanwhile, so a filler always sees the change before
/// it could write over it.
pub const FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;

/// The API version of UFFDIO_API.
const UFFD_API: u64 = 0xAA;
/// UFFDIO_REGISTER mode: report (and let us fill) pages that are not there yet.
const REGISTER_MODE_MISSING: u64 = 1;
/// UFFDIO_REGISTER mode: write-protection; a write to a protected page faults.
const REGISTER_MODE_WP: u64 = 1 << 1;
/// UFFDIO_WRITEPROTECT mode: set the protection (without it: clear it and wake the writers).
const WRITEPROTECT_MODE_WP: u64 = 1;

/// UFFDIO_API feature (Linux 6.4): write-protection also covers pages not populated yet (an
/// empty page-table entry gets a marker), so a first write there is seen as a write.
pub const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// UFFDIO_API feature (Linux 6.7): write faults on protected pages are resolved by the kernel
/// itself, which clears the page's protection bit and lets the write go on; no message, nobody
/// waits. Only the bits tell, read by PAGEMAP_SCAN (`procfs::pagemap_scan`). Because no
/// handler is called, it works in a `USER_MODE_ONLY` context: the kernel's own writes into the
/// process's memory (a `read(2)` into it, a futex) succeed instead of failing with EFAULT.
/// The kernel turns on [`FEATURE_WP_UNPOPULATED`] with it.
pub const FEATURE_WP_ASYNC: u64 = 1 << 15;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    /// Bytes copied, or a negative errno.
    copy: i64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    /// Bytes mapped, or a negative errno.
    zeropage: i64,
}

/// One message read from a context (struct uffd_msg, 32 bytes, packed): the event in the first
/// byte, its arguments as three words from byte 8.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawMsg {
    event: u8,
    reserved: [u8; 7],
    arg: [u64; 3],
}

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

/// What a context reports (see [`Uffd::read_event`]).
#[derive(Debug)]
pub enum Event {
    /// A thread touched `address` (not page-aligned) in a registered range with no page.
    PageFault { address: u64 },
    /// The process forked: the child's registered memory is served through this new context.
    Fork(Uffd),
    /// `len` bytes at `from` moved to `to` (mremap).
    Remap { from: u64, to: u64, len: u64 },
    /// The pages of `start..end` were dropped (MADV_DONTNEED or MADV_REMOVE): they read as
    /// zeros from now on.
    Remove { start: u64, end: u64 },
    /// `start..end` was unmapped.
    Unmap { start: u64, end: u64 },
}

/// How a [`Uffd::try_copy`] or [`Uffd::try_zero`] ended, with the bytes done before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placed {
    /// Everything was placed.
    All,
    /// The address space is changing (an event waits to be read): read it, then try again.
    Again(usize),
    /// A page is there already, after this many bytes.
    Exists(usize),
    /// The range is no longer registered or mapped (unmapped, or the process is gone).
    Gone(usize),
}

nix::ioctl_readwrite!(uffdio_api, 0xAA, 0x3F, UffdioApi);
nix::ioctl_readwrite!(uffdio_zeropage, 0xAA, 0x04, UffdioZeropage);
nix::ioctl_read!(uffdio_wake, 0xAA, 0x02, UffdioRange);
nix::ioctl_readwrite!(uffdio_register, 0xAA, 0x00, UffdioRegister);
nix::ioctl_read!(uffdio_unregister, 0xAA, 0x01, UffdioRange);
nix::ioctl_readwrite!(uffdio_copy, 0xAA, 0x03, UffdioCopy);
nix::ioctl_readwrite!(uffdio_writeprotect, 0xAA, 0x06, UffdioWriteprotect);

/// A userfaultfd context whose API handshake is done.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

/// The features a context was given at its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features(pub u64);

impl Features {
    pub fn has(self, feature: u64) -> bool {
        self.0 & feature == feature
    }
}

/// userfaultfd(2) in the calling process, with `flags` (O_CLOEXEC, O_NONBLOCK,
/// [`USER_MODE_ONLY`]): a context for this process's own memory, before its handshake
/// ([`Uffd::new`]). ckpt's contexts are made inside the process whose memory they serve (an
/// injected call); this one is for the tests, which fill memory of their own.
#[cfg(test)]
pub fn create_own(flags: u64) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes flags and passes no pointer.
    let fd = super::check(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    // SAFETY: the descriptor just made, owned by nothing else.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

impl Uffd {
    /// Takes the descriptor of a fresh context (from userfaultfd(2), made by whichever process
    /// owns the memory) and makes the API handshake, with no optional feature.
    pub fn new(fd: OwnedFd) -> io::Result<Uffd> {
        let mut api = UffdioApi { api: UFFD_API, features: 0, ioctls: 0 };
        // SAFETY: `api` is a properly laid out uffdio_api the kernel reads and writes back.
        unsafe { uffdio_api(fd.as_raw_fd(), &mut api) }.map_err(io::Error::from)?;
        Ok(Uffd { fd })
    }

    /// Makes the API handshake asking for `required | optional` features, and for `required`
    /// alone when the kernel lacks some of `optional`. Returns the context and the features it
    /// has. A kernel without one of `required` is an error (EINVAL) saying which it has.
    ///
    /// The features are fixed by the one handshake that succeeds (a refused one leaves the
    /// context as new, so it can be asked again). The kernel answers with every feature it
    /// knows, not with those it enabled: what the context has is what was asked, plus
    /// WP_UNPOPULATED, which the kernel enables with WP_ASYNC.
    pub fn with_features(fd: OwnedFd, required: u64, optional: u64) -> io::Result<(Uffd, Features)> {
        let mut known = 0;
        for ask in [required | optional, required] {
            let mut api = UffdioApi { api: UFFD_API, features: ask, ioctls: 0 };
            // SAFETY: `api` is a properly laid out uffdio_api the kernel reads and writes back.
            match unsafe { uffdio_api(fd.as_raw_fd(), &mut api) } {
                Ok(_) => {
                    let mut got = ask;
                    if got & FEATURE_WP_ASYNC != 0 {
                        got |= FEATURE_WP_UNPOPULATED;
                    }
                    return Ok((Uffd { fd }, Features(got)));
                }
                Err(nix::errno::Errno::EINVAL) => known |= api.features,
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the kernel's userfaultfd lacks features {:#x} (asked {required:#x}; known {known:#x})", required & !known),
        ))
    }

    /// Registers `start..start + len` (page-aligned) for write-protection: from now until the
    /// context is closed, [`write_protect`](Self::write_protect) can protect pages there. EBUSY
    /// when a mapping there belongs to another context (the program's own userfaultfd); EINVAL
    /// when a mapping cannot be (or the range is not wholly mapped).
    pub fn register_wp(&self, start: u64, len: u64) -> io::Result<()> {
        let mut reg = UffdioRegister { range: UffdioRange { start, len }, mode: REGISTER_MODE_WP, ioctls: 0 };
        // SAFETY: `reg` is a properly laid out uffdio_register; the range is the owner
        // process's, checked by the kernel.
        unsafe { uffdio_register(self.fd.as_raw_fd(), &mut reg) }.map_err(io::Error::from)?;
        Ok(())
    }

    /// Ends this context's registration of the mappings in `start..start + len` (page-aligned):
    /// their protection and markers go, and the program may register them itself.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        // SAFETY: `range` is a properly laid out uffdio_range; the range is the owner
        // process's, checked by the kernel.
        unsafe { uffdio_unregister(self.fd.as_raw_fd(), &mut range) }.map_err(io::Error::from)?;
        Ok(())
    }

    /// Sets (`protect`) or clears the write-protection of `start..start + len` (page-aligned,
    /// registered with [`register_wp`](Self::register_wp)); clearing wakes writers waiting on
    /// it. With [`FEATURE_WP_UNPOPULATED`] the pages not populated yet are protected too.
    pub fn write_protect(&self, start: u64, len: u64, protect: bool) -> io::Result<()> {
        let mode = if protect { WRITEPROTECT_MODE_WP } else { 0 };
        let mut wp = UffdioWriteprotect { range: UffdioRange { start, len }, mode };
        loop {
            // SAFETY: `wp` is a properly laid out uffdio_writeprotect; the range is the owner
            // process's, checked by the kernel.
            match unsafe { uffdio_writeprotect(self.fd.as_raw_fd(), &mut wp) } {
                Ok(_) => return Ok(()),
                // The owner's address space was changing (or a signal came): the call is
                // idempotent, ask again.
                Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::from(e)),
            }
        }
    }

    /// Registers `start..start + len` (page-aligned) for missing-page handling: from now until
    /// the context is closed, pages there can be filled with [`copy`](Self::copy).
    pub fn register_missing(&self, start: u64, len: u64) -> io::Result<()> {
        let mut reg = UffdioRegister { range: UffdioRange { start, len }, mode: REGISTER_MODE_MISSING, ioctls: 0 };
        // SAFETY: `reg` is a properly laid out uffdio_register; the range is the owner
        // process's, checked by the kernel.
        unsafe { uffdio_register(self.fd.as_raw_fd(), &mut reg) }.map_err(io::Error::from)?;
        Ok(())
    }

    /// A context the kernel made (the child's, reported by a fork event): its handshake is its
    /// parent's.
    pub fn adopt(fd: OwnedFd) -> Uffd {
        Uffd { fd }
    }

    /// Reads the next message of a context created with O_NONBLOCK; None when there is none.
    pub fn read_event(&self) -> io::Result<Option<Event>> {
        let mut msg = RawMsg::default();
        let size = std::mem::size_of::<RawMsg>();
        // SAFETY: `msg` is a plain 32-byte buffer the kernel fills.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut msg as *mut RawMsg).cast(), size) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(e),
            };
        }
        if n as usize != size {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("userfaultfd message of {n} bytes")));
        }
        let [a, b, c] = msg.arg;
        Ok(Some(match msg.event {
            // arg: flags, address, thread id.
            EVENT_PAGEFAULT => Event::PageFault { address: b },
            EVENT_FORK => {
                // SAFETY: the kernel installed this descriptor in our table for us to own.
                let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(a as u32 as i32) };
                Event::Fork(Uffd { fd })
            }
            EVENT_REMAP => Event::Remap { from: a, to: b, len: c },
            EVENT_REMOVE => Event::Remove { start: a, end: b },
            EVENT_UNMAP => Event::Unmap { start: a, end: b },
            other => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown userfaultfd event {other:#x}"))),
        }))
    }

    /// Places `src` at `dst` as [`copy`](Self::copy) does, but returns instead of waiting when
    /// the address space is changing or a page is there, saying how far it got.
    pub fn try_copy(&self, dst: u64, src: &[u8]) -> io::Result<Placed> {
        let mut done = 0usize;
        while done < src.len() {
            let mut c = UffdioCopy { dst: dst + done as u64, src: src[done..].as_ptr() as u64, len: (src.len() - done) as u64, mode: 0, copy: 0 };
            // SAFETY: the source range is `src`, ours and readable for the call; the destination
            // is in the owner's address space, checked by the kernel.
            let r = unsafe { uffdio_copy(self.fd.as_raw_fd(), &mut c) };
            if c.copy > 0 {
                done += c.copy as usize;
            }
            if let Some(end) = placed(r, done)? {
                return Ok(end);
            }
        }
        Ok(Placed::All)
    }

    /// Maps the zero page over `start..start + len` (pages the image does not hold: they read
    /// as zeros), as [`try_copy`](Self::try_copy) does.
    pub fn try_zero(&self, start: u64, len: u64) -> io::Result<Placed> {
        let mut done = 0u64;
        while done < len {
            let mut z = UffdioZeropage { range: UffdioRange { start: start + done, len: len - done }, mode: 0, zeropage: 0 };
            // SAFETY: `z` is a properly laid out uffdio_zeropage; the range is the owner's,
            // checked by the kernel.
            let r = unsafe { uffdio_zeropage(self.fd.as_raw_fd(), &mut z) };
            if z.zeropage > 0 {
                done += z.zeropage as u64;
            }
            if let Some(end) = placed(r, done as usize)? {
                return Ok(end);
            }
        }
        Ok(Placed::All)
    }

    /// Wakes the threads waiting on `start..start + len` (their page came another way).
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let mut range = UffdioRange { start, len };
        // SAFETY: `range` is a properly laid out uffdio_range.
        unsafe { uffdio_wake(self.fd.as_raw_fd(), &mut range) }.map_err(io::Error::from)?;
        Ok(())
    }

    /// Places `src` at `dst` (page-aligned, `src.len()` a multiple of the page size) in the
    /// owner's memory, as new pages: no page is zeroed first. Returns the bytes placed before a
    /// page that was already there (EEXIST), so the caller can write that page another way;
    /// `src.len()` when all went in.
    pub fn copy(&self, dst: u64, src: &[u8]) -> io::Result<usize> {
        let mut done = 0usize;
        loop {
            match self.try_copy(dst + done as u64, &src[done..])? {
                Placed::All => return Ok(src.len()),
                // The owner's address space was changing: go on from where the kernel stopped.
                Placed::Again(n) => done += n,
                Placed::Exists(n) => return Ok(done + n),
                Placed::Gone(n) => {
                    let at = dst + (done + n) as u64;
                    return Err(io::Error::new(io::ErrorKind::NotFound, format!("no registered mapping at {at:#x} (unmapped, or the process is gone)")));
                }
            }
        }
    }
}

/// The outcome of one UFFDIO_COPY or UFFDIO_ZEROPAGE call: None to go on (done, or
/// interrupted by a signal), or how the placing ended.
fn placed(r: nix::Result<i32>, done: usize) -> io::Result<Option<Placed>> {
    match r {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(None),
        Err(nix::errno::Errno::EAGAIN) => Ok(Some(Placed::Again(done))),
        Err(nix::errno::Errno::EEXIST) => Ok(Some(Placed::Exists(done))),
        Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ESRCH) | Err(nix::errno::Errno::EINVAL) => Ok(Some(Placed::Gone(done))),
        Err(e) => Err(io::Error::from(e)),
    }
}

impl std::os::fd::AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<UffdioApi>(), 24);
        assert_eq!(std::mem::size_of::<UffdioRegister>(), 32);
        assert_eq!(std::mem::size_of::<UffdioCopy>(), 40);
        assert_eq!(std::mem::size_of::<UffdioWriteprotect>(), 24);
        assert_eq!(std::mem::size_of::<UffdioZeropage>(), 32);
        assert_eq!(std::mem::size_of::<RawMsg>(), 32);
        // _IOWR(0xAA, 0x04, struct uffdio_zeropage) and _IOR(0xAA, 0x02, struct uffdio_range).
        assert_eq!(nix::request_code_readwrite!(0xAA, 0x04, 32), 0xc020_aa04);
        assert_eq!(nix::request_code_read!(0xAA, 0x02, 16), 0x8010_aa02);
        // _IOWR(0xAA, 0x06, struct uffdio_writeprotect), as linux/userfaultfd.h defines it.
        assert_eq!(nix::request_code_readwrite!(0xAA, 0x06, 24), 0xc018_aa06);
        // _IOWR(0xAA, 0x03, struct uffdio_copy), as linux/userfaultfd.h defines UFFDIO_COPY.
        assert_eq!(nix::request_code_readwrite!(0xAA, 0x03, 40), 0xc028_aa03);
        assert_eq!(nix::request_code_readwrite!(0xAA, 0x3F, 24), 0xc018_aa3f);
        assert_eq!(nix::request_code_readwrite!(0xAA, 0x00, 32), 0xc020_aa00);
    }
}
