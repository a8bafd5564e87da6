//! Lazy restart (`ckpt restart --lazy`): the restored processes run again before their private
//! memory is back. Their private anonymous mappings are registered for missing pages in a
//! userfaultfd context each process makes (an injected call) and hands over; a page server
//! thread of the restorer places each page from the image when a thread first touches it, and
//! fills the rest in the background, in address order, until every page is in.
//!
//! The context is the full kind (not `USER_MODE_ONLY`): the kernel's own accesses to a page not
//! there yet (a `read(2)` into it, a futex) wait for the server as the program's do. Making one
//! takes CAP_SYS_PTRACE or vm.unprivileged_userfaultfd = 1, so an ordinary user's restart is
//! eager, saying why ([`available`]).
//!
//! The program may change its memory while the fill goes on: the context reports forks (the
//! child gets a context of its own, holding the same pages not placed yet), moves (mremap),
//! dropped pages (MADV_DONTNEED: they must read as zeros, not be filled) and unmaps. The thread
//! that made such a change waits until the server has read the message, and placing fails with
//! EAGAIN meanwhile ([`crate::sys::uffd::Placed::Again`]), so the server always knows a change before
//! it could place a page over it.
//!
//! A chunk found damaged once the job runs ends the job (there is nothing right to give the
//! program): the server reports it through the restart's `on_fatal`, which kills the job.
//!
//! A checkpoint waits for every fill to end ([`wait_until_filled`]): the capture reads memory
//! through /proc/PID/mem and forks copies of the processes, neither of which a half-filled,
//! registered address space serves well.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Condvar, Mutex};
use std::thread::JoinHandle;

use crate::image::StreamReader;
use crate::sys::uffd::{Event, Placed, Uffd};
use crate::PAGE_SIZE;
use nix::poll::PollTimeout;

/// The pages placed for one fault: the faulting page's aligned block, so that a program walking
/// its memory takes one fault per block, not per page.
const FAULT_BLOCK: u64 = 64 << 10;
/// The pages placed per step of the background fill, between looks at the faults waiting.
const FILL_BLOCK: u64 = 1 << 20;
/// How long the server waits for a fault while the background fill's next chunk is being read,
/// before it looks whether the chunk is in.
const READ_WAIT_MS: u8 = 1;

/// The features a lazy context needs: every change of the address space reported.
pub const FEATURES: u64 = crate::sys::uffd::FEATURE_EVENT_FORK
    | crate::sys::uffd::FEATURE_EVENT_REMAP
    | crate::sys::uffd::FEATURE_EVENT_REMOVE
    | crate::sys::uffd::FEATURE_EVENT_UNMAP;

/// Why this restart cannot be lazy, or None when it can: a full userfaultfd context needs
/// CAP_SYS_PTRACE in the machine's first user namespace, or vm.unprivileged_userfaultfd = 1.
pub fn available() -> Option<String> {
    if crate::userns::privileged() {
        return None;
    }
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if sysctl.trim() == "1" {
        return None;
    }
    Some("an ordinary user's processes cannot have the kind of userfaultfd context a lazy restart needs (it takes CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd = 1)".into())
}

/// Where one range of a process's memory comes from: `len` bytes at `addr` (as the image has
/// them) are bytes `stream_offset..` of the stream of `generation` (None: the restored
/// generation itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRun {
    pub addr: u64,
    pub len: u64,
    pub generation: Option<u64>,
    pub stream_offset: u64,
}

/// One process whose memory the server fills: its context, the image's runs for the ranges
/// registered in it (sorted by address, disjoint; what no run covers reads as zeros), and where
/// each generation's chunk files are.
pub struct LazyProcess {
    pub pid: u32,
    pub uffd: Uffd,
    pub runs: Vec<SourceRun>,
    pub chunk_dirs: BTreeMap<Option<u64>, PathBuf>,
}

enum Control {
    Add(Box<LazyProcess>),
    /// The job runs: fill in the background too, and end when everything is in.
    Release,
}

/// The count of fills going on in this process, for [`wait_until_filled`].
static FILLING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// Counts one fill fewer, waking who waits for none.
fn fill_ended() {
    let (count, ended) = &FILLING;
    let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
    *n = n.saturating_sub(1);
    ended.notify_all();
}

/// Blocks until no lazy restart's fill is going on (at once when there is none).
pub fn wait_until_filled() {
    let (count, ended) = &FILLING;
    let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
    while *n > 0 {
        n = ended.wait(n).unwrap_or_else(|p| p.into_inner());
    }
}

/// The page server of one restart, seen from the restorer.
pub struct PageServer {
    control: Mutex<Option<crossbeam_channel::Sender<Control>>>,
    /// A byte written here wakes the server's poll to read `control`.
    wake: UnixStream,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PageServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageServer")
    }
}

impl PageServer {
    /// Starts the server thread. `on_fatal` is called (from that thread) with what went wrong
    /// when a page cannot be had: it must end the job.
    pub fn start(on_fatal: Box<dyn Fn(&str) + Send>) -> std::io::Result<PageServer> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (wake, wakes) = UnixStream::pair()?;
        wakes.set_nonblocking(true)?;
        *FILLING.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        let thread = std::thread::Builder::new().name("ckpt-lazy-fill".into()).spawn(move || {
            let started = std::time::Instant::now();
            let mut server = Server { spaces: Vec::new(), released: false, placed: 0, seen: Seen::default() };
            if let Err(e) = server.run(&rx, wakes) {
                on_fatal(&e);
                // The contexts stay open (until the restorer exits): closed, they would let a
                // waiting thread of the job run on with a zero page before the kill takes it.
                std::mem::forget(std::mem::take(&mut server.spaces));
            }
            let Seen { faults, forks, moves, drops, unmaps } = server.seen;
            let ms = started.elapsed().as_millis() as u64;
            tracing::info!(bytes = server.placed, ms, faults, forks, moves, drops, unmaps, "lazy restart: the fill ended");
            fill_ended();
        });
        let thread = thread.inspect_err(|_| fill_ended())?;
        Ok(PageServer { control: Mutex::new(Some(tx)), wake, thread: Mutex::new(Some(thread)) })
    }

    /// Serves `process`'s faults from now on.
    pub fn add(&self, process: LazyProcess) {
        self.send(Control::Add(Box::new(process)));
    }

    /// The job runs again: the server fills the rest in the background and ends by itself
    /// when every page is in.
    pub fn release(&self) {
        self.send(Control::Release);
        tracing::info!("lazy restart: the job runs, its memory filled behind it");
        // Detached: the thread ends by itself.
        self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn send(&self, c: Control) {
        if let Some(tx) = self.control.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            // The server only ends after Release, or by an error it has reported.
            let _ = tx.send(c);
        }
        let _ = (&self.wake).write(&[1]);
    }
}

impl Drop for PageServer {
    /// Without a release (the restart failed and the job's processes are killed): the server
    /// stops once its channel closes, closing every context.
    fn drop(&mut self) {
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.control.lock().unwrap_or_else(|p| p.into_inner()).take();
            let _ = (&self.wake).write(&[1]);
            let _ = t.join();
        }
    }
}

/// The streams of one process of the image, shared by the address spaces its forks make.
struct Source {
    pid: u32,
    runs: Vec<SourceRun>,
    chunk_dirs: BTreeMap<Option<u64>, PathBuf>,
    readers: RefCell<BTreeMap<Option<u64>, StreamReader>>,
}

impl Source {
    /// Reads `buf.len()` bytes of `run`'s stream from `offset` in it: for a fault, only the
    /// blocks that hold them; for the background fill, whole chunks, read ahead.
    fn read(&self, run: &SourceRun, offset: u64, buf: &mut [u8], fault: bool) -> Result<(), String> {
        let mut reader = self.reader(run.generation)?;
        let at = run.stream_offset + offset;
        match fault {
            true => reader.read_blocks_at(at, buf),
            false => reader.read_exact_at(at, buf),
        }
        .map_err(|e| e.to_string())
    }

    /// Whether the background fill's read at image address `addr` (in a run) would not wait
    /// for the disk; if it would, the read is started ([`StreamReader::ready`]).
    fn ready(&self, addr: u64) -> Result<bool, String> {
        let Some(run) = self.at(addr) else { return Ok(true) };
        Ok(self.reader(run.generation)?.ready(run.stream_offset + (addr - run.addr)))
    }

    /// The reader of `generation`'s stream, opened the first time.
    fn reader(&self, generation: Option<u64>) -> Result<std::cell::RefMut<'_, StreamReader>, String> {
        if !self.readers.borrow().contains_key(&generation) {
            let dir = self.chunk_dirs.get(&generation).ok_or_else(|| format!("pid {}: no chunk directory for generation {generation:?} (bug)", self.pid))?;
            let reader = StreamReader::open(dir, self.pid).map_err(|e| e.to_string())?;
            self.readers.borrow_mut().insert(generation, reader);
        }
        Ok(std::cell::RefMut::map(self.readers.borrow_mut(), |r| r.get_mut(&generation).expect("opened above")))
    }

    /// The run holding image address `addr`.
    fn at(&self, addr: u64) -> Option<&SourceRun> {
        let i = self.runs.partition_point(|r| r.addr + r.len <= addr);
        self.runs.get(i).filter(|r| r.addr <= addr)
    }
}

/// One address space being filled: a restored process, or a child one forked meanwhile.
struct Space {
    uffd: Uffd,
    pending: Pending,
    source: Rc<Source>,
}

/// Ranges not placed yet: start → (end, the image address of start).
type Pending = BTreeMap<u64, (u64, u64)>;

/// A piece of a pending range: (start, end, the image address of start).
type Piece = (u64, u64, u64);

impl Space {
    fn take(&mut self, a: u64, b: u64) -> Vec<Piece> {
        take(&mut self.pending, a, b)
    }

    fn pending_at(&self, addr: u64) -> Option<Piece> {
        let (&s, &(e, img)) = self.pending.range(..=addr).next_back()?;
        (addr < e).then_some((s, e, img))
    }
}

/// Removes `a..b` from `pending`; returns the pieces that were pending there, as (start, end,
/// image address of start). Pure.
fn take(pending: &mut Pending, a: u64, b: u64) -> Vec<Piece> {
    let mut taken = Vec::new();
    let first = pending.range(..a).next_back().filter(|(_, &(e, _))| e > a).map(|(&s, _)| s);
    let keys: Vec<u64> = first.into_iter().chain(pending.range(a..b).map(|(&s, _)| s)).collect();
    for s in keys {
        let Some((e, img)) = pending.remove(&s) else { continue };
        if s < a {
            pending.insert(s, (a, img));
        }
        if e > b {
            pending.insert(b, (e, img + (b - s)));
        }
        let (from, to) = (s.max(a), e.min(b));
        if from < to {
            taken.push((from, to, img + (from - s)));
        }
    }
    taken
}

struct Server {
    spaces: Vec<Space>,
    released: bool,
    placed: u64,
    /// What the job did meanwhile, for the log: faults served, forks, moves, drops, unmaps.
    seen: Seen,
}

#[derive(Debug, Default)]
struct Seen {
    faults: u64,
    forks: u64,
    moves: u64,
    drops: u64,
    unmaps: u64,
}

impl Server {
    fn run(&mut self, control: &crossbeam_channel::Receiver<Control>, mut wakes: UnixStream) -> Result<(), String> {
        loop {
            while !self.released {
                match control.try_recv() {
                    Ok(Control::Add(p)) => self.add(*p),
                    Ok(Control::Release) => self.released = true,
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                    // The restart failed before the release: its processes are being killed.
                    Err(crossbeam_channel::TryRecvError::Disconnected) => return Ok(()),
                }
            }
            let mut drained = [0u8; 64];
            while matches!(wakes.read(&mut drained), Ok(n) if n > 0) {}
            for i in 0..self.spaces.len() {
                self.serve_events(i)?;
            }
            self.spaces.retain(|s| !s.pending.is_empty());
            if self.released && self.spaces.is_empty() {
                return Ok(());
            }
            // One space at a time, each front to back; while its next chunk is being read, the
            // server waits for faults (a little), not for the disk.
            let filled = self.released && self.fill_step(0)?;
            let wait = match (self.released, filled) {
                (false, _) => PollTimeout::NONE,
                (true, true) => PollTimeout::ZERO,
                (true, false) => PollTimeout::from(READ_WAIT_MS),
            };
            self.wait(&wakes, wait)?;
        }
    }

    fn add(&mut self, p: LazyProcess) {
        // Only the pages the image holds are placed: the rest of a registered mapping is
        // served on demand, with the zero page, until the context is closed, and then as any
        // untouched memory is (a 256 GiB MAP_NORESERVE reservation with a few pages written
        // must not be filled with 256 GiB of zero pages).
        let mut pending: Pending = BTreeMap::new();
        for r in &p.runs {
            pending.insert(r.addr, (r.addr + r.len, r.addr));
        }
        let source = Rc::new(Source { pid: p.pid, runs: p.runs, chunk_dirs: p.chunk_dirs, readers: RefCell::new(BTreeMap::new()) });
        self.spaces.push(Space { uffd: p.uffd, pending, source });
    }

    /// Waits for a message of any context or a control message, at most `timeout`.
    fn wait(&self, wakes: &UnixStream, timeout: PollTimeout) -> Result<(), String> {
        use nix::poll::{poll, PollFd, PollFlags};
        let mut fds = vec![PollFd::new(wakes.as_fd(), PollFlags::POLLIN)];
        fds.extend(self.spaces.iter().map(|s| PollFd::new(s.uffd.as_fd(), PollFlags::POLLIN)));
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(format!("lazy restart: poll: {e}")),
        }
    }

    /// Reads and handles every message space `i`'s context has.
    fn serve_events(&mut self, i: usize) -> Result<(), String> {
        let mut faults = Vec::new();
        self.read_events(i, &mut faults)?;
        for address in faults {
            self.serve_fault(i, address)?;
        }
        Ok(())
    }

    /// Applies the changes space `i`'s context reports; page faults are added to `faults`.
    fn read_events(&mut self, i: usize, faults: &mut Vec<u64>) -> Result<(), String> {
        loop {
            let event = self.spaces[i].uffd.read_event().map_err(|e| format!("lazy restart: read from userfaultfd: {e}"))?;
            let space = &mut self.spaces[i];
            let seen = &mut self.seen;
            match event {
                None => return Ok(()),
                Some(Event::PageFault { address }) => {
                    seen.faults += 1;
                    faults.push(address & !(PAGE_SIZE - 1))
                }
                Some(Event::Fork(uffd)) => {
                    seen.forks += 1;
                    // The child has every page the parent had not been given yet, missing too.
                    let child = Space { uffd, pending: space.pending.clone(), source: space.source.clone() };
                    self.spaces.push(child);
                }
                Some(Event::Remap { from, to, len }) => {
                    seen.moves += 1;
                    for (s, e, img) in space.take(from, from.saturating_add(len)) {
                        space.pending.insert(to + (s - from), (to + (e - from), img));
                    }
                }
                Some(Event::Remove { start, end }) => {
                    seen.drops += 1;
                    space.take(start, end);
                }
                Some(Event::Unmap { start, end }) => {
                    seen.unmaps += 1;
                    space.take(start, end);
                }
            }
        }
    }

    /// Places the block around `page` that a thread of space `i` is waiting for.
    fn serve_fault(&mut self, i: usize, page: u64) -> Result<(), String> {
        let block = page & !(FAULT_BLOCK - 1);
        let Some((s, e, _)) = self.spaces[i].pending_at(page) else {
            // Not pending: memory the program mapped or grew since, or a page placed after the
            // fault was reported (whose placing woke the thread). A new page reads as zeros.
            return self.place_zero_page(i, page);
        };
        let (from, to) = (s.max(block), e.min(block + FAULT_BLOCK));
        self.place(i, from, to, true)
    }

    /// Places the first background block of space `i` if its bytes are read already; false
    /// when they are still being read.
    fn fill_step(&mut self, i: usize) -> Result<bool, String> {
        let Some((&s, &(e, img))) = self.spaces.get(i).and_then(|sp| sp.pending.iter().next()) else { return Ok(true) };
        if !self.spaces[i].source.ready(img)? {
            return Ok(false);
        }
        self.place(i, s, e.min(s + FILL_BLOCK), false)?;
        Ok(true)
    }

    /// Places `a..b` (pending, page-aligned) of space `i` from the image, reading the context's
    /// messages and trying again whenever the address space was changing. A `fault` is read in
    /// blocks, the background fill in whole chunks.
    fn place(&mut self, i: usize, a: u64, b: u64, fault: bool) -> Result<(), String> {
        let mut faults = Vec::new();
        let mut buf = Vec::new();
        let mut at = a;
        while at < b {
            // The range may have changed meanwhile: place what is still pending, piece by piece.
            let Some((s, e, img)) = self.spaces[i].pending_at(at) else {
                // Placed or dropped: go on with the next pending range inside a..b.
                match self.spaces[i].pending.range(at..b).next() {
                    Some((&next, _)) => {
                        at = next;
                        continue;
                    }
                    None => break,
                }
            };
            debug_assert!(s <= at);
            let end = e.min(b);
            let image_at = img + (at - s);
            let source = self.spaces[i].source.clone();
            // One piece: the part of one run that lies here (pending ranges are made of runs,
            // and keep their image addresses through moves and forks).
            let run = source.at(image_at).ok_or_else(|| format!("lazy restart: pid {}: no stored page at image address {image_at:#x} (bug)", source.pid))?;
            let len = (run.addr + run.len - image_at).min(end - at);
            buf.resize(len as usize, 0);
            source.read(run, image_at - run.addr, &mut buf, fault).map_err(|e| format!("lazy restart: pid {}: {e}", source.pid))?;
            let outcome =
                self.spaces[i].uffd.try_copy(at, &buf).map_err(|e| format!("lazy restart: place {len} bytes at {at:#x} in pid {}: {e}", source.pid))?;
            match outcome {
                Placed::All => {
                    self.spaces[i].take(at, at + len);
                    self.placed += len;
                    at += len;
                }
                Placed::Again(n) => {
                    self.spaces[i].take(at, at + n as u64);
                    self.placed += n as u64;
                    at += n as u64;
                    self.read_events(i, &mut faults)?;
                }
                Placed::Exists(n) => {
                    // A page of its own is there: it is not ours to place.
                    let skip = at + n as u64 + PAGE_SIZE;
                    self.spaces[i].take(at, skip.min(at + len));
                    let _ = self.spaces[i].uffd.wake(at + n as u64, PAGE_SIZE);
                    at = skip;
                }
                Placed::Gone(n) => {
                    // Unmapped without our hearing (or the process is gone): nothing to place.
                    self.spaces[i].take(at, at + len);
                    self.placed += n as u64;
                    at += len;
                }
            }
        }
        for page in faults {
            self.serve_fault(i, page)?;
        }
        Ok(())
    }

    /// Maps the zero page at `page` of space `i` and wakes who waits for it.
    fn place_zero_page(&mut self, i: usize, page: u64) -> Result<(), String> {
        loop {
            let outcome = self.spaces[i].uffd.try_zero(page, PAGE_SIZE).map_err(|e| format!("lazy restart: zero page at {page:#x}: {e}"))?;
            match outcome {
                Placed::Again(_) => {
                    let mut faults = Vec::new();
                    self.read_events(i, &mut faults)?;
                    // Faults reported meanwhile are served in the next round: they wait.
                    for f in faults {
                        if f != page {
                            self.serve_fault(i, f)?;
                        }
                    }
                }
                Placed::Exists(_) => {
                    let _ = self.spaces[i].uffd.wake(page, PAGE_SIZE);
                    return Ok(());
                }
                Placed::All | Placed::Gone(_) => return Ok(()),
            }
        }
    }
}

/// The runs of `vmas` inside `ranges`, from the restored generation's stream and from the
/// earlier generations an incremental one refers to, sorted by address (pure).
pub fn source_runs(vmas: &[crate::objects::memory::VmaRecord], ranges: &[(u64, u64)]) -> Vec<SourceRun> {
    let inside = |addr: u64| ranges.iter().any(|&(s, e)| s <= addr && addr < e);
    let mut runs: Vec<SourceRun> = Vec::new();
    for v in vmas.iter().filter(|v| inside(v.start)) {
        for r in &v.runs {
            runs.push(SourceRun { addr: r.addr, len: r.pages.saturating_mul(PAGE_SIZE), generation: None, stream_offset: r.stream_offset });
        }
        for e in &v.earlier {
            let r = e.run;
            runs.push(SourceRun { addr: r.addr, len: r.pages.saturating_mul(PAGE_SIZE), generation: Some(e.generation), stream_offset: r.stream_offset });
        }
    }
    runs.sort_by_key(|r| r.addr);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take_from(pending: &[Piece], a: u64, b: u64) -> (Vec<Piece>, Vec<Piece>) {
        let mut p: Pending = pending.iter().map(|&(s, e, img)| (s, (e, img))).collect();
        let taken = take(&mut p, a, b);
        (taken, p.into_iter().map(|(s, (e, img))| (s, e, img)).collect())
    }

    #[test]
    fn taking_splits_pending_ranges_and_keeps_image_addresses() {
        let (taken, left) = take_from(&[(0x1000, 0x5000, 0x1000), (0x8000, 0x9000, 0x20000)], 0x2000, 0x8800);
        assert_eq!(taken, vec![(0x2000, 0x5000, 0x2000), (0x8000, 0x8800, 0x20000)]);
        assert_eq!(left, vec![(0x1000, 0x2000, 0x1000), (0x8800, 0x9000, 0x20800)]);
        let (taken, left) = take_from(&[(0x1000, 0x2000, 0x1000)], 0x3000, 0x4000);
        assert!(taken.is_empty());
        assert_eq!(left, vec![(0x1000, 0x2000, 0x1000)]);
    }

    #[test]
    fn runs_are_found_by_image_address() {
        let run = |addr, len| SourceRun { addr, len, generation: None, stream_offset: 0 };
        let source =
            Source { pid: 1, runs: vec![run(0x1000, 0x2000), run(0x5000, 0x1000)], chunk_dirs: BTreeMap::new(), readers: RefCell::new(BTreeMap::new()) };
        assert_eq!(source.at(0x1800).map(|r| r.addr), Some(0x1000));
        assert_eq!(source.at(0x5fff).map(|r| r.addr), Some(0x5000));
        assert_eq!(source.at(0x3000).map(|r| r.addr), None);
        assert_eq!(source.at(0x0).map(|r| r.addr), None);
        assert_eq!(source.at(0x6000).map(|r| r.addr), None);
    }
}
