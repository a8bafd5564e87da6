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
use crate::pool::StreamWriter;
use crate::objects::memory::{Delta, EarlierRun};
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

    /// For the stopped process `pid` (its pid in the job `pid_in_job`), whose injected calls
    /// `task` drives: the delta to the base if its writes were tracked since then (the pages
    /// written since are listed, and protected again); and its tracker for the next generation,
    /// armed now if it had none. Whatever goes wrong here makes the process's pages stored
    /// whole, never the checkpoint fail.
    /// `maps`: its mappings.
    pub fn process(&mut self, task: &mut RemoteTask, pid_in_job: Tid, maps: &[MemoryMap]) -> Result<ProcessIncrement> {
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
            return self.go_on(task, pid_in_job, start_time, maps, None, ProcessIncrement { delta: None, stream, registered: false });
        }
        let mut out = ProcessIncrement::default();
        let mut tracker = None;
        if let Some(mut t) = previous {
            // Scanned even when this generation is full: the scan protects the written pages
            // again, and the tracker goes on counting from this generation, for less than
            // arming it anew would cost.
            let tracked = t.tracker.tracked().to_vec();
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
        self.go_on(task, pid_in_job, start_time, maps, tracker, out)
    }

    /// The tracking of the process for the next generation: `tracker` followed, or armed anew.
    fn go_on(&mut self, task: &mut RemoteTask, pid_in_job: Tid, start_time: u64, maps: &[MemoryMap], tracker: Option<DirtyTracker>, mut out: ProcessIncrement) -> Result<ProcessIncrement> {
        let pid = task.pid;
        if !self.arm || !crate::objects::dirty::kernel_can_track_writes() {
            return Ok(out);
        }
        // Arming injects userfaultfd(2), which a seccomp filter may answer by killing the
        // process (as `later` will not fork one under a filter).
        if procfs::status(pid)?.seccomp.unwrap_or(0) != 0 {
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

/// The mappings of process `pid` whose writes are tracked: private, writable, anonymous
/// memory (the heap, stacks, anonymous mmaps), where a program's data is. What is not tracked
/// is stored whole at every generation.
pub(super) fn trackable_ranges(pid: Tid) -> Result<Vec<(u64, u64)>> {
    Ok(trackable_in(&procfs::maps(pid)?))
}

/// [`trackable_ranges`] among the mappings `maps`.
fn trackable_in(maps: &[MemoryMap]) -> Vec<(u64, u64)> {
    maps.iter()
        .filter(|m| m.perms.contains(MMPermissions::WRITE) && !m.perms.contains(MMPermissions::SHARED))
        .filter(|m| matches!(m.pathname, MMapPath::Heap | MMapPath::Stack | MMapPath::TStack(_) | MMapPath::Anonymous))
        .map(|m| m.address)
        .collect()
}
