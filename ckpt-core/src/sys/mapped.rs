//! Reading chunk files through a mapping of their page cache, at restart.
//!
//! A restart reading a chunk with `read(2)` copies every byte from the page cache into a buffer
//! before it copies it again into the restored process: for an incompressible image the first
//! copy was the largest single cost of an eager restart (40 % of its CPU time for 1 GiB). Mapped,
//! the checksum reads the page cache where it is and the restore copies straight from it.
//!
//! A mapping has one hazard `read(2)` has not: if the file shrinks while it is mapped (something
//! else truncating the image under a restart), touching a page past the new end raises SIGBUS,
//! whose default action would end the restarter without a word. A process-wide SIGBUS handler
//! (installed once, chained to whatever handler was there before, such as Rust's stack-overflow
//! guard) recognises faults inside a registered chunk mapping, maps a zero page over the lost
//! page so that the faulting access completes, and marks the mapping damaged. The reader then
//! reports the file as truncated instead of using what it read (`MappedFile::intact`). Faults
//! taken by the kernel on our behalf (the `pwrite` into the restored process) never raise a
//! signal: the call fails with EFAULT instead.
//!
//! The handler only looks at a fixed table of atomics and makes one `mmap` call, both safe in a
//! signal handler. With every slot of the table taken (more than [`SLOTS`] chunks mapped at once),
//! callers read the file instead.
//!
//! It lives under `sys`, not `image`, for what it holds: a mapping of a file that may change
//! under it, and a signal handler that replaces memory, the `unsafe` the image code reads through.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// How many chunk files may be mapped at once (a restart maps two per stream it reads: the
/// current chunk and the next).
pub const SLOTS: usize = 64;

/// One registered mapping: its address range and whether a page of it was lost.
struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    lost: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // the initialiser of each array element, by design
const EMPTY_SLOT: Slot = Slot { claimed: AtomicBool::new(false), start: AtomicUsize::new(0), end: AtomicUsize::new(0), lost: AtomicBool::new(false) };

static TABLE: [Slot; SLOTS] = [EMPTY_SLOT; SLOTS];

/// The SIGBUS disposition found when the handler was installed, for faults that are not ours.
static PREVIOUS: OnceLock<Option<SigAction>> = OnceLock::new();

/// A whole file mapped read-only, registered with the SIGBUS guard while it lives.
pub struct MappedFile {
    map: memmap2::Mmap,
    slot: usize,
}

impl MappedFile {
    /// Maps `file`, `len` bytes long, for reading front to back. `None` when the file cannot be
    /// mapped (an empty file, a file system without mmap) or the guard has no free slot: the
    /// caller reads it instead.
    pub fn map(file: &File, len: u64) -> Option<MappedFile> {
        if len == 0 || !guard_installed() {
            return None;
        }
        // SAFETY: the mapping is read-only and private to this reader; the one way its contents
        // can fail under us (the file shrinking) is caught by the SIGBUS guard registered below
        // before any page is touched, and reported through `intact`.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }.ok()?;
        let _ = map.advise(memmap2::Advice::Sequential);
        let _ = map.advise(memmap2::Advice::WillNeed);
        let range = map.as_ptr() as usize..map.as_ptr() as usize + map.len();
        let slot = TABLE.iter().position(|s| s.claimed.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok())?;
        let s = &TABLE[slot];
        s.lost.store(false, Ordering::Relaxed);
        s.end.store(range.end, Ordering::Relaxed);
        s.start.store(range.start, Ordering::Release);
        Some(MappedFile { map, slot })
    }

    /// The file's bytes. Check [`intact`](Self::intact) after using them.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Whether every page read so far held the file's bytes: false once the file shrank under
    /// the mapping and the guard replaced a page with zeros.
    pub fn intact(&self) -> bool {
        !TABLE[self.slot].lost.load(Ordering::Acquire)
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Unregistered before the mapping goes (the field is dropped after this body), so the
        // handler never claims an address that another mapping may reuse.
        let s = &TABLE[self.slot];
        s.start.store(0, Ordering::Release);
        s.end.store(0, Ordering::Release);
        s.claimed.store(false, Ordering::Release);
    }
}

/// Installs the SIGBUS guard once; false if it could not be installed (then nothing is mapped).
fn guard_installed() -> bool {
    PREVIOUS
        .get_or_init(|| {
            let action = SigAction::new(SigHandler::SigAction(on_sigbus), SaFlags::SA_SIGINFO | SaFlags::SA_ONSTACK, SigSet::empty());
            // SAFETY: the handler below only reads atomics and calls mmap/sigaction, which are
            // async-signal-safe; it chains to the previous handler for every other fault.
            unsafe { signal::sigaction(Signal::SIGBUS, &action) }.ok()
        })
        .is_some()
}

extern "C" fn on_sigbus(signo: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo; si_addr is the faulting
    // address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE {
        let start = s.start.load(Ordering::Acquire);
        if start != 0 && start <= addr && addr < s.end.load(Ordering::Acquire) {
            let page = addr & !(crate::PAGE_SIZE as usize - 1);
            // SAFETY: the page lies inside a mapping this module owns (registered, so not yet
            // unmapped); replacing it with an anonymous zero page makes the faulting read
            // complete, and `lost` makes the reader refuse what it read.
            let zero = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    crate::PAGE_SIZE as usize,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if zero != libc::MAP_FAILED {
                s.lost.store(true, Ordering::Release);
                return;
            }
            break;
        }
    }
    // Not ours: whatever handled SIGBUS before us does, or the default action.
    match PREVIOUS.get().copied().flatten().map(|a| a.handler()) {
        Some(SigHandler::SigAction(f)) => f(signo, info, context),
        Some(SigHandler::Handler(f)) => f(signo),
        // Returning then repeats the fault, which ends the process as it would have without us
        // (signal(2) is async-signal-safe).
        _ => super::process::default_action(libc::SIGBUS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn mapped_file_reads_its_bytes() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let m = MappedFile::map(&f, data.len() as u64).expect("mapped");
        assert_eq!(m.bytes(), &data[..]);
        assert!(m.intact());
    }

    #[test]
    fn a_file_shrinking_under_its_mapping_is_caught_not_fatal() {
        let mut f = tempfile::tempfile().unwrap();
        let data = vec![7u8; 4 * 4096];
        f.write_all(&data).unwrap();
        let m = MappedFile::map(&f, data.len() as u64).expect("mapped");
        f.set_len(4096).unwrap();
        // Pages past the new end raise SIGBUS when touched; the guard turns them into zeros.
        let sum: u64 = m.bytes().iter().map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 4096);
        assert!(!m.intact());
        drop(m);
        // The slot is free again, and a new mapping starts intact.
        let m = MappedFile::map(&f, 4096).expect("mapped");
        assert!(m.intact());
    }
}
