//! Incremental generations: between two checkpoints the agent keeps, for each process, a
//! tracker of the pages it writes (`objects::dirty`) and where the last committed generation
//! put each of its pages; the next checkpoint stores only the pages written since and refers to
//! that generation (its base) for the rest (docs/PLAN-INSTANT.md, step 3).
//!
//! The trackers are armed, and scanned, while the job is frozen: a scan lists the pages written
//! since the last freeze and protects them again in the same walk, so what it lists belongs to
//! the generation being taken. If that generation is not committed, what the scan listed would
//! be lost to the next one: the agent then drops every tracker (see [`Tracking`]) and the next
//! generation is full.

use std::collections::HashMap;

use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::objects::dirty::{subtract, DirtyTracker, Scanned};
use crate::objects::memory::{Delta, EarlierRun, OwnPages, PrivateRange};
use crate::pool::StreamWriter;
use crate::procfs::{self, MMPermissions, MMapPath, MemoryMap};
use crate::ptrace::{RemoteTask, Tid};

/// One process's tracker and its base content.
pub(super) struct Tracked {
    /// Its start time (`/proc/PID/stat`), so that a pid reused by another process is not taken
    /// for it.
    pub(super) start_time: u64,
    pub(super) pid_in_job: Tid,
    pub(super) tracker: DirtyTracker,
    /// Where the pages of the generation the tracker counts from are: set once that
    /// generation's records are final. After a copy ahead of the freeze, where that copy put
    /// them.
    pub(super) content: Option<Vec<EarlierRun>>,
    /// The generation being taken copied the process's memory before the freeze (see
    /// `capture::ahead`): the tracker counts writes since that copy.
    pub(super) ahead: Option<CopiedAhead>,
}

/// A process's memory copied before the freeze: its stream (parked), which the capture goes on
/// writing, and the ranges that copy could not read.
pub(super) struct CopiedAhead {
    pub(super) stream: StreamWriter,
    pub(super) not_copied: Vec<(u64, u64)>,
}

/// What a generation does with one process's tracking (see [`Increments::process`]).
#[derive(Default)]
pub struct ProcessIncrement {
    /// The pages to store and where the others are.
    pub delta: Option<Delta>,
    /// The process's stream, where its memory was copied before the freeze: the capture goes
    /// on in it.
    pub stream: Option<StreamWriter>,
    /// Mappings were registered for the write tracking now, which may have merged neighbours:
    /// the process's list of mappings is to be read again.
    pub registered: bool,
}

/// The write tracking of a job's processes between generations, kept by the agent. Dropping
/// it ends every tracker (the processes run on as they were).
#[derive(Default)]
pub struct Tracking {
    /// The committed generation the trackers count writes since.
    pub(super) since: Option<u64>,
    /// By pid as the agent sees it.
    pub(super) procs: HashMap<Tid, Tracked>,
    /// The shared memory objects the copy before the freeze copied (`capture::shared`).
    pub(super) shared: super::shared::SharedAhead,
}

impl Tracking {
    /// Records where the pages of process `pid_in_job` are in the generation just captured
    /// (its final records: see `memory::content_of`).
    pub fn set_content(&mut self, pid_in_job: Tid, content: Vec<EarlierRun>) {
        if let Some(t) = self.procs.values_mut().find(|t| t.pid_in_job == pid_in_job) {
            t.content = Some(content);
        }
    }

    /// The generation these trackers were armed or scanned at is committed: the next one may
    /// refer to it.
    pub fn committed(&mut self, generation: u64) {
        self.since = Some(generation);
    }

    /// Gives the job back the shared mappings the copy before the freeze tracked, which the
    /// freeze has scanned: a program that registers its shared memory with a userfaultfd of
    /// its own finds it free again. Once the job runs: it takes a call per mapping (4,226 for
    /// an Open MPI job of 64 ranks, whose every rank maps every rank's segment: 50 ms), which
    /// the job no longer waits for frozen, and writes to a protected page meanwhile resolve
    /// themselves (asynchronous write-protection).
    pub fn untrack_shared(&mut self) {
        for t in self.procs.values_mut() {
            t.tracker.untrack_shared();
        }
    }
}

/// One generation's use of the tracking: the trackers left by the last generation (used when
/// they count since `base`), and those for the next.
pub struct Increments {
    base: Option<u64>,
    previous: Tracking,
    next: Tracking,
    /// Whether to track writes for a later generation (not when the job ends after this one).
    arm: bool,
    /// Said once: why a process's writes cannot be tracked.
    told: bool,
}

impl Increments {
    /// `base`: the generation to refer to, if the coordinator asked for an incremental one;
    /// honoured where `previous` tracks since exactly that generation.
    pub fn new(previous: Tracking, base: Option<u64>, arm: bool) -> Increments {
        let base = base.filter(|b| previous.since == Some(*b));
        Increments { base, previous, next: Tracking::default(), arm, told: false }
    }

    /// A generation that refers to nothing and tracks nothing.
    pub fn none() -> Increments {
        Increments::new(Tracking::default(), None, false)
    }

    /// The trackers for the next generation (their content to be set, then committed). The
    /// streams of processes copied before the freeze and gone at the capture are discarded:
    /// their records are not in the image, and a restart refuses chunk files of a process the
    /// records do not hold.
    pub fn into_next(self) -> Tracking {
        for t in self.previous.procs.into_values() {
            if let Some(ahead) = t.ahead {
                ahead.stream.discard();
            }
        }
        self.next
    }

    /// Whether shared memory objects were copied before the freeze
    /// ([`settle_shared`](Self::settle_shared) has something to do).
    pub(super) fn copied_shared(&self) -> bool {
        !self.previous.shared.is_empty()
    }

    /// At the freeze, before any process is captured: what to do with each shared memory object
    /// copied before it (see `capture::shared::settle`). `root`: the job's init; `frozen`: every
    /// process of the job and its mappings; `zombies`: the job holds processes that ended.
    pub(super) fn settle_shared(
        &mut self,
        root: Tid,
        frozen: &[super::shared::FrozenView<'_>],
        zombies: bool,
    ) -> HashMap<crate::objects::shared_memory::ObjectId, crate::objects::shared_memory::SharedPlan> {
        super::shared::settle(std::mem::take(&mut self.previous.shared), root, frozen, zombies, &self.previous.procs)
    }

    /// For the stopped process `pid` (its pid in the job `pid_in_job`), whose injected calls
    /// `task` drives: the delta to the base if its writes were tracked since then (the pages
    /// written since are listed, and protected again); and its tracker for the next generation,
    /// armed now if it had none. Whatever goes wrong here makes the process's pages stored
    /// whole, never the checkpoint fail.
    /// `maps`: its mappings.
    pub fn process(&mut self, task: &mut RemoteTask, pid_in_job: Tid, status: &procfs::Status, maps: &[MemoryMap]) -> Result<ProcessIncrement> {
        let pid = task.pid;
        let start_time = procfs::stat(pid)?.starttime;
        let mut previous = self.previous.procs.remove(&pid);
        if let Some(t) = previous.take_if(|t| t.start_time != start_time || t.pid_in_job != pid_in_job) {
            // Another process with that pid: what was copied before the freeze is the other
            // one's. Its stream goes on if it has the same name (a second one of that name
            // would fail the batch); the process is stored whole after the other's bytes.
            let stream = match t.ahead {
                Some(a) if t.pid_in_job == pid_in_job => Some(a.stream),
                Some(a) => {
                    a.stream.discard();
                    None
                }
                None => None,
            };
            return self.go_on(task, pid_in_job, start_time, status, maps, None, ProcessIncrement { delta: None, stream, registered: false });
        }
        let mut out = ProcessIncrement::default();
        let mut tracker = None;
        if let Some(mut t) = previous {
            // Scanned even when this generation is full: the scan protects the written pages
            // again, and the tracker goes on counting from this generation, for less than
            // arming it anew would cost.
            let tracked = t.tracker.tracked();
            let ahead = t.ahead.take();
            match t.tracker.scan(pid) {
                Ok(Scanned { written, absent, known }) => {
                    if let Some(ahead) = &ahead {
                        // What the copy before the freeze did not read is stored now.
                        let tracked = subtract(&tracked, &ahead.not_copied);
                        out.delta = Some(Delta { tracked, written, base: t.content.take().unwrap_or_default(), known, absent });
                    } else if let (Some(_), Some(base)) = (self.base, t.content.take()) {
                        out.delta = Some(Delta { tracked, written, base, known, absent });
                    }
                    tracker = Some(t.tracker);
                }
                Err(e) => warn!(pid, "the pages written since the last checkpoint cannot be listed ({e}): the process is stored whole"),
            }
            out.stream = ahead.map(|a| a.stream);
        }
        self.go_on(task, pid_in_job, start_time, status, maps, tracker, out)
    }

    /// The tracking of the process for the next generation: `tracker` followed, or armed anew.
    /// `status`: the process's, read at the freeze.
    #[allow(clippy::too_many_arguments)]
    fn go_on(
        &mut self,
        task: &mut RemoteTask,
        pid_in_job: Tid,
        start_time: u64,
        status: &procfs::Status,
        maps: &[MemoryMap],
        tracker: Option<DirtyTracker>,
        mut out: ProcessIncrement,
    ) -> Result<ProcessIncrement> {
        let pid = task.pid;
        if !self.arm || !crate::objects::dirty::kernel_can_track_writes() {
            return Ok(out);
        }
        // Arming injects userfaultfd(2), which a seccomp filter may answer by killing the
        // process (as `later` will not fork one under a filter).
        if status.seccomp.unwrap_or(0) != 0 {
            tracing::debug!(pid, "writes not tracked: the process runs under a seccomp filter");
            return Ok(out);
        }
        let ranges = trackable_in(maps);
        let tracker = match tracker {
            Some(mut t) => {
                out.registered = t.follow(&ranges);
                t
            }
            None => match DirtyTracker::arm(task, &ranges) {
                Ok(t) => {
                    out.registered = !t.tracked().is_empty();
                    t
                }
                Err(Error::NoDirtyTracking { why, .. }) => {
                    if !std::mem::replace(&mut self.told, true) {
                        info!(pid, "every generation stores the whole memory: {why}");
                    }
                    return Ok(out);
                }
                Err(e) => return Err(e),
            },
        };
        self.next.procs.insert(pid, Tracked { start_time, pid_in_job, tracker, content: None, ahead: None });
        Ok(out)
    }
}

/// The mappings of process `pid` whose writes are tracked, and which of their pages are its
/// own (see [`trackable_in`]).
pub(super) fn trackable_ranges(pid: Tid) -> Result<Vec<PrivateRange>> {
    Ok(trackable_in(&procfs::maps(pid)?))
}

/// The mappings among `maps` whose writes are tracked: private memory, where a program's data
/// is. Anonymous memory (the heap, stacks, anonymous mmaps) if writable; and of the private
/// mappings of files, those whose own pages are the copies the process made of the file's by
/// writing: the writable ones (a library's data, a file mapped copy-on-write) and a library's
/// relocated read-only data (RELRO: read-only mapping just before a writable one of the same
/// file, written by the dynamic loader then protected): in an Open MPI rank, 48 ranges of 668
/// KiB in all (measured on a 2-rank job). What is not tracked is stored whole at every
/// generation. Not tracked: shared memory (others write it), programs' text and read-only data
/// (rarely written: a debugger's breakpoints; some 37 MB of that rank's address space, which
/// every scan would walk), deleted files and shared memory objects mapped privately (others may
/// change the pages that are not copies), and devices.
fn trackable_in(maps: &[MemoryMap]) -> Vec<PrivateRange> {
    let relocated = |i: usize| {
        let (m, next) = (&maps[i], maps.get(i + 1));
        next.is_some_and(|n| {
            n.address.0 == m.address.1 && n.inode == m.inode && n.dev == m.dev && n.perms.contains(MMPermissions::WRITE) && n.pathname == m.pathname
        })
    };
    (0..maps.len())
        .filter_map(|i| {
            let m = &maps[i];
            if m.perms.contains(MMPermissions::SHARED) {
                return None;
            }
            let (start, end) = m.address;
            let writable = m.perms.contains(MMPermissions::WRITE);
            let own = match &m.pathname {
                MMapPath::Heap | MMapPath::Stack | MMapPath::TStack(_) | MMapPath::Anonymous if writable => OwnPages::Every,
                MMapPath::Path(path)
                    if m.perms.contains(MMPermissions::READ)
                        && !m.perms.contains(MMPermissions::EXECUTE)
                        && (writable || relocated(i))
                        && is_plain_file(path) =>
                {
                    OwnPages::Copies
                }
                _ => return None,
            };
            Some(PrivateRange { start, end, own })
        })
        .collect()
}

/// Whether a mapped path (as /proc/PID/maps shows it) names a file whose pages only it changes
/// as far as a private mapping is concerned: not a deleted file or a shared memory object (the
/// kernel marks both " (deleted)"; a descriptor or a shared mapping may write them), not a
/// device, not the kernel's own objects (an AIO ring, System V segments).
fn is_plain_file(path: &std::path::Path) -> bool {
    let text = path.to_string_lossy();
    // (The AIO ring is "/[aio] (deleted)".)
    path.is_absolute() && !crate::objects::memory::is_shared_object(&text, true) && !text.starts_with("/dev/") && !text.starts_with("/SYSV")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn map(start: u64, perms: &str, path: MMapPath) -> MemoryMap {
        let p: MMPermissions = perms.parse().unwrap();
        let inode = match &path {
            MMapPath::Path(p) => p.to_string_lossy().len() as u64,
            _ => 0,
        };
        MemoryMap { address: (start, start + 0x1000), perms: p, offset: 0, dev: (0, 0), inode, pathname: path, extension: Default::default() }
    }

    #[test]
    fn anonymous_memory_and_private_copies_of_plain_files_are_tracked() {
        let file = |p: &str| MMapPath::Path(PathBuf::from(p));
        let maps = [
            map(0x1000, "rw-p", MMapPath::Heap),
            map(0x2000, "r--p", MMapPath::Anonymous),        // read-only anonymous: nothing written
            map(0x3000, "r--p", file("/usr/lib/libc.so.6")), // read-only data
            map(0x4000, "r-xp", file("/usr/lib/libc.so.6")), // text
            map(0x5000, "r--p", file("/usr/lib/libc.so.6")), // relocated read-only data
            map(0x6000, "rw-p", file("/usr/lib/libc.so.6")), // data
            map(0x7000, "rw-s", file("/data/shared")),
            map(0x8000, "rw-p", file("/tmp/gone (deleted)")),
            map(0x9000, "rw-p", file("/memfd:pool (deleted)")),
            map(0xa000, "rw-p", file("/dev/nvidia0")),
            map(0xb000, "rw-p", MMapPath::Stack),
            map(0xc000, "---p", file("/usr/lib/libc.so.6")), // a gap between parts
            map(0xd000, "rw-p", MMapPath::Vdso),
            map(0xe000, "r--p", file("/data/table")), // a file mapped read-only, then one
            map(0xf000, "rw-p", file("/data/other")), // of another file: not relocated data
        ];
        let got: Vec<(u64, OwnPages)> = trackable_in(&maps).iter().map(|r| (r.start, r.own)).collect();
        assert_eq!(
            got,
            vec![(0x1000, OwnPages::Every), (0x5000, OwnPages::Copies), (0x6000, OwnPages::Copies), (0xb000, OwnPages::Every), (0xf000, OwnPages::Copies)]
        );
    }
}
