//! Dirty-page tracking: which pages of a process were written since the last look, so that an
//! incremental checkpoint stores those and refers to the earlier generation for the rest
//! (docs/PLAN-INSTANT.md, step 3).
//!
//! The kernel keeps the record. While the process is stopped, it makes a userfaultfd context
//! (an injected call), which the agent takes (pidfd_getfd) and the process closes at once: the
//! agent holds the only reference, so its close, or its death, ends the tracking and leaves the
//! process as it was. The agent registers the ranges for write-protection in WP_ASYNC mode and
//! protects them. From then on a write to a protected page (the program's, or the kernel's on
//! its behalf: a `read(2)` into it, a futex) is let through by the kernel, which clears that
//! page's protection bit; nobody waits, no message is sent. At the next checkpoint PAGEMAP_SCAN
//! lists the pages whose bit is clear and protects them again in the same walk.
//!
//! Why this kind: it works for ordinary users. With vm.unprivileged_userfaultfd = 0 (the
//! default) anyone may make a `UFFD_USER_MODE_ONLY` context, and in WP_ASYNC mode no fault ever
//! reaches a handler, so the kernel's own writes do not fail with EFAULT as they would in a
//! synchronous user-mode-only context. The memory is copied after the release from a forked
//! copy of each process (`capture::later`), so nothing needs synchronous faults.
//!
//! What the kernel does, measured on 6.18 (docs/PLAN-INSTANT.md, step 3): pages first populated
//! after the protection count as written (the kernel enables WP_UNPOPULATED with WP_ASYNC); a
//! page dropped by MADV_DONTNEED or munmap is not reported (it is gone) and if read again it is
//! a zero page reported as written; a fork by the process leaves the tracking of the parent
//! alone (the child has none); a mapping moved by mremap, or mapped anew over a tracked range,
//! has no registration, and the scan of that range fails with EPERM: the whole range is then
//! reported written, never a write missed. Huge pages are protected whole but a write splits
//! them: tracking is per 4 KiB page.
//!
//! Private file mappings are tracked too, for the copies the process makes of the file's pages
//! (`OwnPages::Copies`: a library's data and relocated read-only data). The kernel registers
//! them in WP_ASYNC mode, but only their pages there are protected (by a scan that protects
//! what it reports), never the pages not there yet: protecting a file mapping's page not there
//! leaves a marker that the pagemap shows as a swap entry, as it shows a copy in swap, and the
//! capture must tell the two apart. Such a page written later is a copy made since, unprotected,
//! so written; one only read is the file's. Markers still appear where a protected page is
//! dropped (the program's MADV_DONTNEED, the kernel's reclaim); measured on 6.18 with a
//! throwaway program, a fork keeps them; `memory::split_copies_by_delta` says what the capture
//! does with them.

use std::io;

use tracing::{debug, warn};

use super::descriptor;
use crate::error::{Context, Error, Result};
use crate::objects::memory::{OwnPages, PrivateRange};
use crate::procfs::pagemap_scan::Query;
use crate::procfs::Pagemap;
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::uffd::{self, Features, Uffd};
use crate::PAGE_SIZE;

/// Ranges longer than this are tracked only when they are not sparse (see [`SPARSE_DENSITY`]).
const SPARSE_FROM: u64 = 256 << 20;
/// A long range is tracked when at least one page in this many is there. Protecting a range
/// puts a marker in the page tables for every page not there yet (WP_ASYNC implies
/// WP_UNPOPULATED), which costs the process 8 bytes of page table per 4 KiB of the range, and
/// the fork that copies its memory later copies them all: tracking a 64 GiB reservation with a
/// hundred pages written gave the program 128 MiB of page tables and a 420 ms freeze. Left
/// untracked, its few pages are stored whole at each generation.
const SPARSE_DENSITY: u64 = 64;

/// Whether this kernel can track a process's writes: PAGEMAP_SCAN and userfaultfd's WP_ASYNC
/// came together, in Linux 6.7, so an empty scan of ckpt's own pagemap answers for both. Probed
/// once per ckpt process. Where it cannot, the first to ask says so, once, as a warning: the
/// user guide promises the fallbacks are said, and without this probe every checkpoint would
/// freeze the job a second time only to learn it again.
pub fn kernel_can_track_writes() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        let can = Pagemap::open(std::process::id() as i32).and_then(|p| p.can_scan());
        match can {
            Ok(true) => true,
            Ok(false) => {
                warn!(
                    "this kernel has no PAGEMAP_SCAN (Linux 6.7 and later have it): memory is copied while the job is frozen, not before, and every generation stores the whole memory"
                );
                false
            }
            // Not the kernel's lack (a /proc that cannot be read): each tracker says why.
            Err(e) => {
                debug!("PAGEMAP_SCAN probe: {e}");
                true
            }
        }
    })
}

/// A range that could not be tracked, and why; all its pages count as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untracked {
    pub start: u64,
    pub end: u64,
    pub why: String,
}

/// What a scan of the tracked ranges found ([`DirtyTracker::scan`]), as sorted disjoint
/// `(start, end)` ranges.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scanned {
    /// Pages written since the last scan (or the arming), there now (in memory or in swap).
    pub written: Vec<(u64, u64)>,
    /// Pages not there now, neither in memory nor in swap: those of `known` that read as zero.
    pub absent: Vec<(u64, u64)>,
    /// Where the scan tells which pages are there: every tracked range but those found
    /// remapped (which are `written` whole).
    pub known: Vec<(u64, u64)>,
}

/// The write-protect context of one process, held by the agent, and the ranges it tracks.
pub struct DirtyTracker {
    pid: Tid,
    uffd: Uffd,
    features: Features,
    /// Anonymous memory tracked: every page there is the process's own. Sorted and disjoint.
    tracked: Vec<(u64, u64)>,
    /// Private file mappings tracked for the copies the process makes of the file's pages (see
    /// [`OwnPages::Copies`]). Sorted and disjoint.
    copies: Vec<(u64, u64)>,
    untracked: Vec<Untracked>,
    /// Tracked ranges found remapped by the last scan: registered again by [`follow`](Self::follow).
    remapped: Vec<(u64, u64)>,
    /// Shared mappings of memory objects tracked for the copy of the objects before the freeze
    /// (`capture::shared`), each protected whole at that copy: see [`track_shared`](Self::track_shared).
    shared: Vec<(u64, u64)>,
    /// Shared mappings of such objects that nothing can ever be written through (the kernel
    /// refused to register them: see [`track_shared`](Self::track_shared)).
    read_only: Vec<(u64, u64)>,
}

/// What [`DirtyTracker::scan_shared`] found of one shared range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedScan {
    /// The pages that may differ from what they were when the range was protected: written
    /// through this process's page tables, or with no entry there at all (a page written, then
    /// dropped from these tables: `MADV_DONTNEED`). Sorted and disjoint.
    Changed(Vec<(u64, u64)>),
    /// The range is not tracked (never was, or a mapping was made there anew): what this process
    /// wrote there is not known.
    Unknown,
}

impl DirtyTracker {
    /// Starts tracking the writes of the stopped process of `task` to `ranges` (page-aligned
    /// `(start, end)`, each within mapped memory). The context is made in the task, taken and
    /// closed there; ranges the kernel refuses (EBUSY: the program's own userfaultfd has them;
    /// EINVAL: not mapped whole, or a kind of memory that cannot be) are reported by
    /// [`untracked`](Self::untracked), not as errors.
    ///
    /// [`Error::NoDirtyTracking`] when the kernel cannot track (no userfaultfd, no WP_ASYNC, no
    /// PAGEMAP_SCAN: before Linux 6.7): the caller stores the process's memory whole.
    pub fn arm(task: &mut RemoteTask, ranges: &[PrivateRange]) -> Result<DirtyTracker> {
        let mut tracker = DirtyTracker::create(task)?;
        tracker.add(ranges);
        debug!(pid = tracker.pid, tracked = tracker.tracked.len() + tracker.copies.len(), untracked = tracker.untracked.len(), "dirty-page tracking armed");
        Ok(tracker)
    }

    /// The context of [`arm`](Self::arm), made in the stopped process of `task`, tracking
    /// nothing yet: [`add`](Self::add) registers and protects, and needs the process stopped no
    /// more (the protection of a large memory takes some 10 ms per GiB, which the job need not
    /// be frozen for).
    pub fn create(task: &mut RemoteTask) -> Result<DirtyTracker> {
        let pid = task.pid;
        let none = |why: String| Error::NoDirtyTracking { pid, why };
        let pagemap = Pagemap::open(pid)?;
        if !pagemap.can_scan().context(|| format!("pid {pid}: PAGEMAP_SCAN"))? {
            return Err(none("the kernel has no PAGEMAP_SCAN (Linux 6.7 and later have it)".into()));
        }
        let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64 | uffd::USER_MODE_ONLY;
        let made = task.main.raw(libc::SYS_userfaultfd, &[flags])?;
        if made < 0 {
            let e = io::Error::from_raw_os_error(-made as i32);
            return Err(none(format!("the process cannot make a userfaultfd context: {e}")));
        }
        let ours = descriptor::take_into_self(pid, made as i32);
        task.syscall("close", libc::SYS_close, &[made as u64])?;
        let (uffd, features) = match Uffd::with_features(ours?, uffd::FEATURE_WP_ASYNC, 0) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return Err(none(format!("{e} (WP_ASYNC: Linux 6.7)"))),
            Err(e) => return Err(Error::from(e).of_object(pid, "userfaultfd API handshake")),
        };
        Ok(DirtyTracker {
            pid,
            uffd,
            features,
            tracked: Vec::new(),
            copies: Vec::new(),
            untracked: Vec::new(),
            remapped: Vec::new(),
            shared: Vec::new(),
            read_only: Vec::new(),
        })
    }

    /// Tracks `ranges` too, from now on (the process need not be stopped: registration goes
    /// through the agent's descriptor). For mappings made since [`arm`](Self::arm).
    pub fn add(&mut self, ranges: &[PrivateRange]) {
        let pagemap = Pagemap::open(self.pid).ok();
        for &PrivateRange { start, end, own } in ranges {
            match self.track(pagemap.as_ref(), start, end, own) {
                Ok(()) if own == OwnPages::Every => self.tracked.push((start, end)),
                Ok(()) => self.copies.push((start, end)),
                Err(why) => {
                    debug!(pid = self.pid, start, end, why, "range not tracked");
                    self.untracked.push(Untracked { start, end, why });
                }
            }
        }
        self.tracked = normalise(&self.tracked);
        self.copies = normalise(&self.copies);
    }

    fn track(&self, pagemap: Option<&Pagemap>, start: u64, end: u64, own: OwnPages) -> std::result::Result<(), String> {
        if start >= end || !start.is_multiple_of(PAGE_SIZE) || !end.is_multiple_of(PAGE_SIZE) {
            return Err("not a page-aligned range".into());
        }
        if let Some(pagemap) = pagemap.filter(|_| end - start > SPARSE_FROM) {
            let enough = (end - start) / PAGE_SIZE / SPARSE_DENSITY;
            if !pagemap.has_populated(start, end, enough).map_err(|e| format!("PAGEMAP_SCAN: {e}"))? {
                return Err(format!("sparse: fewer than 1 page in {SPARSE_DENSITY} there (its present pages are stored whole, and it is looked at again at the next checkpoint)"));
            }
        }
        self.uffd.register_wp(start, end - start).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => format!("{e} (the program's own userfaultfd has it)"),
            _ => format!("register for write-protection: {e}"),
        })?;
        match own {
            OwnPages::Every => self.uffd.write_protect(start, end - start, true).map_err(|e| format!("write-protect: {e}")),
            // Only the pages there: protecting a file mapping's pages not there yet leaves a
            // marker in each, which the pagemap cannot tell from a copy in swap (both are swap
            // entries). Such a page written is a copy made since, unprotected, so written.
            OwnPages::Copies => {
                let pagemap = pagemap.ok_or("its pagemap cannot be opened")?;
                pagemap.scan(start, end, Query::WRITTEN_REPROTECT).map(drop).map_err(|e| format!("write-protect the pages there: {e}"))
            }
        }
    }

    /// The pages of the tracked ranges written since [`arm`](Self::arm) or the last call, still
    /// there (in memory or in swap), as sorted disjoint `(start, end)` ranges; the scan protects
    /// them again, atomically with the listing. A page gone since (unmapped, MADV_DONTNEED) is
    /// not listed: store only what is there now. A tracked range whose mapping changed (moved by
    /// mremap, mapped anew) is listed whole.
    ///
    /// Call it with the process stopped: a write between the scan of a page and the snapshot of
    /// the memory would be missed by both this generation and the next.
    pub fn written(&mut self, pid: Tid) -> Result<Vec<(u64, u64)>> {
        Ok(self.scan(pid)?.written)
    }

    /// [`written`](Self::written), and in the same walk the pages not there: a capture that
    /// knows which pages are unchanged needs to know which are gone (MADV_DONTNEED) too, and a
    /// walk that reports only these costs a third of one that lists every page there.
    pub fn scan(&mut self, pid: Tid) -> Result<Scanned> {
        use crate::procfs::pagemap_scan::{PAGE_IS_PRESENT, PAGE_IS_SWAPPED, PAGE_IS_WRITTEN};
        let pagemap = Pagemap::open(pid)?;
        let mut found = Scanned::default();
        // A file mapping's pages: only those written matter (the copies made since); its pages
        // not there are not protected (see `track`).
        let copies = self.copies.iter().map(|&r| (r, OwnPages::Copies));
        for ((start, end), own) in self.tracked.iter().map(|&r| (r, OwnPages::Every)).chain(copies) {
            let query = match own {
                OwnPages::Every => Query::WRITTEN_OR_ABSENT_REPROTECT,
                OwnPages::Copies => Query::WRITTEN_REPROTECT,
            };
            match pagemap.scan(start, end, query) {
                Ok(regions) if own == OwnPages::Copies => found.written.extend(regions.iter().map(|r| (r.start, r.end))),
                Ok(regions) => {
                    for r in regions {
                        // (The inversion is the query's: what is reported is as it is.)
                        let there = r.categories & (PAGE_IS_SWAPPED | PAGE_IS_PRESENT) != 0;
                        if !there {
                            // (The kernel calls such a page written too: it was dropped.)
                            found.absent.push((r.start, r.end));
                        } else if r.categories & PAGE_IS_WRITTEN != 0 {
                            found.written.push((r.start, r.end));
                        }
                        // Else a swapped page not written, or the marker of a page not there
                        // since before the last scan: as unchanged as the pages not reported.
                    }
                    found.known.push((start, end));
                }
                // A mapping there without our registration: which pages were written is not
                // known. (The walk protected again what came before it, unreported.)
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    warn!(pid, start, end, "a tracked range was remapped: all of it counts as written");
                    found.written.push((start, end));
                    self.remapped.push((start, end));
                }
                Err(e) => return Err(Error::from(e).of_object(pid, format!("PAGEMAP_SCAN of {start:#x}-{end:#x}"))),
            }
        }
        found.written = normalise(&found.written);
        found.absent = normalise(&found.absent);
        found.known = normalise(&found.known);
        Ok(found)
    }

    /// Tracks exactly `ranges` from now on (the process's trackable mappings at this
    /// checkpoint): what is no longer among them is dropped, what is new among them, or was
    /// found remapped by the last scan, is registered and protected. The pages of ranges
    /// tracked before keep their state: written since the last scan or not.
    /// Returns whether it registered any range (which may merge mappings with neighbours).
    pub fn follow(&mut self, ranges: &[PrivateRange]) -> bool {
        let of = |own: OwnPages| normalise(&ranges.iter().filter(|r| r.own == own).map(|r| (r.start, r.end)).collect::<Vec<_>>());
        let (anonymous, files) = (of(OwnPages::Every), of(OwnPages::Copies));
        let keep = subtract(&intersect(&self.tracked, &anonymous), &self.remapped);
        let keep_copies = subtract(&intersect(&self.copies, &files), &self.remapped);
        let mut new: Vec<PrivateRange> =
            subtract(&anonymous, &keep).into_iter().map(|(start, end)| PrivateRange { start, end, own: OwnPages::Every }).collect();
        new.extend(subtract(&files, &keep_copies).into_iter().map(|(start, end)| PrivateRange { start, end, own: OwnPages::Copies }));
        self.tracked = keep;
        self.copies = keep_copies;
        self.remapped.clear();
        self.untracked.clear();
        if new.is_empty() {
            return false;
        }
        self.add(&new);
        true
    }

    /// Tracks the writes this process makes to the shared mappings `ranges` (whole mappings of
    /// shared memory objects) from now on, in place of those tracked before: each is registered
    /// (again) and every page of it protected, those not in its page tables too (WP_ASYNC's
    /// markers, which a shared memory object's mapping keeps where a protected page is dropped).
    /// Returns the ranges now tracked; the others (refused by the kernel) are not. Others than
    /// this process write the same pages through their own tables: the caller tracks every
    /// mapping of an object, and takes the union.
    ///
    /// A mapping the kernel refuses with EPERM has no VM_MAYWRITE: its object was opened
    /// read-only (or is sealed against writes), so neither this mapping nor an mprotect of it
    /// can ever write the object. It counts as tracked, with nothing written, as long as it
    /// stays so ([`scan_shared`](Self::scan_shared) asks the kernel again). Open MPI's ranks map
    /// the PMIx data store of their launcher so (two 4 MiB and two 4 KiB segments, which were
    /// copied whole at every freeze for it).
    pub fn track_shared(&mut self, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
        self.shared.clear();
        self.read_only.clear();
        for &(start, end) in ranges {
            if !(start < end && start.is_multiple_of(PAGE_SIZE) && end.is_multiple_of(PAGE_SIZE)) {
                continue;
            }
            match self.uffd.register_wp(start, end - start).and_then(|()| self.uffd.write_protect(start, end - start, true)) {
                Ok(()) => self.shared.push((start, end)),
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => self.read_only.push((start, end)),
                Err(e) => debug!(pid = self.pid, start, end, "shared range not tracked: {e}"),
            }
        }
        [self.shared.as_slice(), self.read_only.as_slice()].concat()
    }

    /// Whether the shared mapping `start..end`, found unwritable by
    /// [`track_shared`](Self::track_shared), still is: the kernel refuses it again. A mapping made
    /// there since may be writable; the kernel registers it then, and it is let go at once.
    fn still_read_only(&self, start: u64, end: u64) -> bool {
        if !self.read_only.contains(&(start, end)) {
            return false;
        }
        match self.uffd.register_wp(start, end - start) {
            Err(e) => e.raw_os_error() == Some(libc::EPERM),
            Ok(()) => {
                if let Err(e) = self.uffd.unregister(start, end - start) {
                    debug!(pid = self.pid, start, end, "shared range left registered: {e}");
                }
                false
            }
        }
    }

    /// Ends the tracking of the shared ranges (once the freeze has scanned them): a program
    /// that registers its shared memory with a userfaultfd of its own finds it free again.
    pub fn untrack_shared(&mut self) {
        self.read_only.clear();
        for (start, end) in std::mem::take(&mut self.shared) {
            // (A range mapped anew since is not ours to end: the kernel says so, and nothing
            // depends on it.)
            if let Err(e) = self.uffd.unregister(start, end - start) {
                debug!(pid = self.pid, start, end, "shared range left registered: {e}");
            }
        }
    }

    /// For each of `ranges` (as given to [`track_shared`](Self::track_shared)), the pages that
    /// may have changed through this process since it was protected. The process must be
    /// stopped.
    pub fn scan_shared(&self, pid: Tid, ranges: &[(u64, u64)]) -> Result<Vec<SharedScan>> {
        use crate::procfs::pagemap_scan::PAGE_IS_WRITTEN;
        let pagemap = Pagemap::open(pid)?;
        let mut out = Vec::with_capacity(ranges.len());
        for &(start, end) in ranges {
            if self.still_read_only(start, end) {
                out.push(SharedScan::Changed(Vec::new()));
                continue;
            }
            if !self.shared.iter().any(|&(s, e)| s <= start && end <= e) {
                out.push(SharedScan::Unknown);
                continue;
            }
            // Written: a page whose protection a write cleared, and a page neither in the
            // tables nor marked there, which lost its mark (written, then dropped from the
            // tables: a protected page dropped keeps a marker), and whose bytes are the
            // object's, maybe the written ones; the kernel reports both WRITTEN (measured on
            // 6.18). Markers of protected pages not in the tables are not reported: the query
            // that also asked for absent pages reported every one of them (a million in a 4 GiB
            // mapping a process never touched) and protected them again, some 70 ms of the
            // freeze. Not protected again: the ranges are unregistered after the freeze.
            // Only WRITTEN asked and reported: the kernel then walks each page table entry in
            // a loop of its own that looks at the protection bit alone (a written page and an
            // entry with no mark at all both count), instead of working out every category of
            // every entry. An Open MPI rank of 64 maps every rank's 4 MiB segment: 4,096
            // mappings and 4 million entries scanned at every freeze.
            let written = Query { inverted: 0, all: PAGE_IS_WRITTEN, any: 0, report: PAGE_IS_WRITTEN, reprotect: false };
            match pagemap.scan(start, end, written) {
                Ok(regions) => {
                    let changed = regions.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>();
                    out.push(SharedScan::Changed(normalise(&changed)));
                }
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => out.push(SharedScan::Unknown),
                Err(e) => return Err(Error::from(e).of_object(pid, format!("PAGEMAP_SCAN of the shared mapping {start:#x}-{end:#x}"))),
            }
        }
        Ok(out)
    }

    /// The ranges tracked, of either kind, sorted and disjoint.
    pub fn tracked(&self) -> Vec<(u64, u64)> {
        normalise(&[self.tracked.as_slice(), self.copies.as_slice()].concat())
    }

    /// The ranges the kernel refused to track, and why.
    pub fn untracked(&self) -> &[Untracked] {
        &self.untracked
    }

    /// The userfaultfd features the context has.
    pub fn features(&self) -> Features {
        self.features
    }
}

/// The parts of mapping `vma` whose present pages must be stored in an incremental generation:
/// those written since the base (`written`, from [`DirtyTracker::written`]) and those not tracked
/// (outside `tracked`). Elsewhere in `vma`, a page present now is unchanged since the base and
/// can be referred to there, if the base stored it; if it did not (the page was not there, or
/// was zero), it must be stored too. A page not present now is stored nowhere. Pure; the lists
/// need not be sorted or disjoint; the answer is sorted and disjoint.
pub fn must_store(tracked: &[(u64, u64)], written: &[(u64, u64)], vma: (u64, u64)) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = vma.0;
    for (s, e) in normalise(tracked) {
        if s > at {
            out.push((at, s.min(vma.1)));
        }
        at = at.max(e);
        if at >= vma.1 {
            break;
        }
    }
    if at < vma.1 {
        out.push((at, vma.1));
    }
    out.extend(normalise(written).into_iter().map(|(s, e)| (s.max(vma.0), e.min(vma.1))));
    normalise(&out)
}

/// The parts of `a` in `b`; both sorted and disjoint, as the answer. Pure.
pub fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// The parts of `a` not in `b`; both sorted and disjoint, as the answer. Pure.
pub fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(s, e) in a {
        let mut at = s;
        for &(bs, be) in b.iter().filter(|&&(bs, be)| be > s && bs < e) {
            if bs > at {
                out.push((at, bs));
            }
            at = at.max(be);
        }
        if at < e {
            out.push((at, e));
        }
    }
    out
}

/// Sorted, merged, empty ranges dropped. Pure.
pub fn normalise(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.iter().copied().filter(|&(s, e)| s < e).collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn ranges_are_normalised() {
        assert_eq!(normalise(&[(5, 7), (1, 3), (2, 4), (7, 8), (9, 9)]), vec![(1, 4), (5, 8)]);
        assert_eq!(normalise(&[]), vec![]);
    }

    #[test]
    fn ranges_intersect_and_subtract() {
        let a = [(0, 10), (20, 30)];
        let b = [(5, 25), (28, 40)];
        assert_eq!(intersect(&a, &b), vec![(5, 10), (20, 25), (28, 30)]);
        assert_eq!(subtract(&a, &b), vec![(0, 5), (25, 28)]);
        assert_eq!(subtract(&a, &[]), a.to_vec());
        assert_eq!(intersect(&a, &[]), vec![]);
    }

    #[test]
    fn what_must_be_stored() {
        let vma = (10 * P, 20 * P);
        // Tracked whole, nothing written: nothing (all referred to the base).
        assert_eq!(must_store(&[(0, 100 * P)], &[], vma), vec![]);
        // Not tracked at all: everything.
        assert_eq!(must_store(&[], &[], vma), vec![vma]);
        assert_eq!(must_store(&[(30 * P, 40 * P)], &[], vma), vec![vma]);
        // Written pages, clipped to the mapping, merged with the untracked parts.
        let tracked = [(12 * P, 15 * P), (8 * P, 11 * P), (16 * P, 19 * P)];
        let written = [(9 * P, 10 * P + P), (13 * P, 14 * P), (18 * P, 25 * P), (14 * P, 14 * P + P)];
        assert_eq!(must_store(&tracked, &written, vma), vec![(10 * P, 12 * P), (13 * P, 16 * P), (18 * P, 20 * P)]);
        // Tracked ranges reaching past both ends.
        assert_eq!(must_store(&[(0, 15 * P), (15 * P, 30 * P)], &[(17 * P, 18 * P)], vma), vec![(17 * P, 18 * P)]);
        assert_eq!(must_store(&[(0, 15 * P)], &[], vma), vec![(15 * P, 20 * P)]);
    }

    /// Set in the environment of the child [`written_pages_are_listed_once`] runs.
    const CHILD: &str = "CKPT_TEST_DIRTY_CHILD";
    const CHILD_PAGES: usize = 32;

    /// A child (this test binary, running this test with [`CHILD`] set: see
    /// [`written_pages_child`]), stopped under ptrace as a checkpoint stops a process, is
    /// armed; then it writes a known set of pages, some populated before, some not, two of them
    /// by the kernel (`read(2)` from a pipe): `written` lists exactly those, then nothing, then
    /// the next write. Runs as any user (the context is user-mode-only); ignored on a kernel that
    /// cannot track (ckpt-core/build.rs).
    #[test]
    #[cfg_attr(ckpt_no_pagemap_scan, ignore = "this kernel cannot track writes (PAGEMAP_SCAN, userfaultfd WP_ASYNC: Linux 6.7)")]
    fn written_pages_are_listed_once() {
        use crate::ptrace::{sys, Injector};
        use std::io::{Read, Write};
        use std::process::{Command, Stdio};

        if std::env::var_os(CHILD).is_some() {
            return written_pages_child();
        }
        let pages = CHILD_PAGES as u64;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["objects::dirty::tests::written_pages_are_listed_once", "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as Tid;
        let mut go = child.stdin.take().unwrap();
        let mut done = child.stderr.take().unwrap();
        let answer = |want: u8, done: &mut std::process::ChildStderr| {
            let mut b = [0u8];
            done.read_exact(&mut b).expect("the child died");
            assert_eq!(b[0], want, "the child's answer");
        };
        // Its pages 0..16 populated; where they are.
        let mut at = [0u8; 8];
        done.read_exact(&mut at).expect("the child died");
        let base = u64::from_le_bytes(at);
        answer(b'r', &mut done);
        let mut run = |what: &[u8]| {
            go.write_all(what).unwrap();
            answer(b'k', &mut done);
        };

        // Stop it as a checkpoint does (it waits in read(2)), arm, let it go.
        sys::seize(pid, sys::PTRACE_O_TRACESYSGOOD).unwrap();
        sys::interrupt(pid).unwrap();
        assert!(matches!(sys::wait(pid).unwrap(), sys::StopKind::EventStop(_)));
        let insn = crate::capture::vdso_syscall_insn(pid).unwrap();
        let mut task = RemoteTask::new(pid, Injector::new(pid, insn).unwrap()).unwrap();
        let armed = DirtyTracker::arm(&mut task, &[PrivateRange { start: base, end: base + pages * P, own: OwnPages::Every }]);
        task.main.finish().unwrap();
        sys::detach(pid, 0).unwrap();
        let mut tracker = armed.unwrap_or_else(|e| panic!("arm: {e}"));
        assert_eq!(tracker.tracked(), vec![(base, base + pages * P)]);
        assert!(tracker.untracked().is_empty());
        // The process kept no reference to the context.
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
        for f in fds {
            let target = std::fs::read_link(f.unwrap().path()).unwrap_or_default();
            assert!(!target.to_string_lossy().contains("userfaultfd"), "the child holds a userfaultfd");
        }

        assert_eq!(tracker.written(pid).unwrap(), vec![], "nothing written yet");
        // The command, and the 16 bytes the kernel writes into its pages.
        run(b"w0123456789abcdef");
        let at = |i: u64| (base + i * P, base + (i + 1) * P);
        assert_eq!(tracker.written(pid).unwrap(), vec![at(1), at(3), at(5), at(20), at(25)]);
        assert_eq!(tracker.written(pid).unwrap(), vec![], "listed once");
        run(b"x");
        assert_eq!(tracker.written(pid).unwrap(), vec![at(9)]);
        // What a checkpoint would store of the mapping: the written pages.
        let w = vec![at(9)];
        assert_eq!(must_store(&tracker.tracked(), &w, (base, base + pages * P)), w);
        // Pages dropped are told apart from those there, in the same walk: not the pages never
        // there, which carry the tracking's marker (and read as zero all the same).
        run(b"d");
        let found = tracker.scan(pid).unwrap();
        assert_eq!(found, Scanned { written: vec![], absent: vec![at(2), at(20)], known: vec![(base, base + pages * P)] });

        drop(tracker);
        // Closed by its only holder: the process's memory is no longer registered.
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
        assert!(!smaps.lines().any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uw")), "still registered");
        go.write_all(b"q").unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "child {status}");
    }

    /// The child of [`written_pages_are_listed_once`]: it maps its pages, writes the first 16
    /// and says where they are (8 bytes and "r" on stderr, which the test harness leaves
    /// alone), then does what each byte on stdin says and answers "k": "w", "x" and "d" write
    /// and drop pages as the test expects, "q" (or the end of stdin) ends it.
    fn written_pages_child() {
        use nix::unistd::{read, write};

        let p = P as usize;
        // Ended with the test's thread, should the test fail before it says "q".
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).unwrap();
        let mut mem = memmap2::MmapMut::map_anon(CHILD_PAGES * p).unwrap();
        for i in 0..16 {
            mem[i * p] = 1;
        }
        let (input, answer) = (std::io::stdin(), std::io::stderr());
        write(&answer, &(mem.as_ptr() as u64).to_le_bytes()).unwrap();
        write(&answer, b"r").unwrap();
        loop {
            let mut b = [0u8];
            if read(&input, &mut b) != Ok(1) {
                return;
            }
            match b[0] {
                // Writes by the program: populated pages 1 and 3, unpopulated page 20.
                b'w' => {
                    mem[p] = 2;
                    mem[3 * p] = 2;
                    mem[20 * p] = 2;
                    // Writes by the kernel: into populated page 5, unpopulated page 25.
                    read(&input, &mut mem[5 * p + 100..5 * p + 108]).unwrap();
                    read(&input, &mut mem[25 * p..25 * p + 8]).unwrap();
                    // Reads do not count.
                    std::hint::black_box(mem[7 * p]);
                    std::hint::black_box(mem[28 * p]);
                }
                b'x' => mem[9 * p] = 3,
                // Dropped: a page written before the arming, one written since.
                b'd' => {
                    crate::sys::memory::drop_pages(&mut mem[2 * p..3 * p]).unwrap();
                    crate::sys::memory::drop_pages(&mut mem[20 * p..21 * p]).unwrap();
                }
                _ => return,
            }
            write(&answer, b"k").unwrap();
        }
    }
}
