//! Copying memory before the freeze, so that neither the first checkpoint of a job nor a later
//! one freezes it for a time that grows with its memory (docs/PLAN-INSTANT.md, "copy ahead").
//!
//! While the job runs, each process's writes are tracked (`objects::dirty`: a context made in
//! the process during a freeze of a moment, if it has none yet; the protection of its memory,
//! some 10 ms per GiB, while it runs), then its private memory is copied into its
//! stream of the generation being taken, as an incremental generation would copy it: the pages
//! written since the base, or all of them; of its private file mappings, the copies it made of
//! the file's pages. The freeze that follows scans what was written since
//! the copy, and stores only that, referring to what the copy put in the stream for the rest
//! (`capture::increments`): few pages for most programs, copied while frozen, or from a fork when
//! many (`capture::fork_pays`). A page the program writes as it is being copied may be read
//! half-written; it is written after the tracking began, so the freeze copies it again.
//!
//! What it costs: the checkpoint takes the time of the copy longer before its freeze, and the
//! pages written between the copy and the freeze are stored twice (the first copy stays in the
//! stream, unused). Not copied ahead, and captured at the freeze as before: processes under a
//! seccomp filter (the context is made by an injected call, which a filter might answer by
//! killing), processes sharing their parent's memory until an exec (vfork), processes that
//! start after the copy, programs' text, and jobs on kernels that cannot track writes (before
//! Linux 6.7). Shared memory objects are copied by the first process that maps them, where every
//! process that maps them is tracked (`capture::shared`).

use std::time::{Duration, Instant};

use tracing::{debug, info};

use super::increments::{trackable_ranges, CopiedAhead, Tracked, Tracking};
use super::{descendants, freeze_with, in_vfork, vdso_syscall_insn};
use crate::error::{Error, Result};
use crate::objects::dirty::DirtyTracker;
use crate::objects::memory::{self, Delta};
use crate::pool::Batch;
use crate::procfs;
use crate::ptrace::{Injector, RemoteTask, Tid};

/// What a copy ahead did.
#[derive(Debug, Default)]
pub struct AheadReport {
    /// Processes whose memory was copied.
    pub processes: usize,
    /// Bytes copied into the streams.
    pub bytes: u64,
    /// How long the job was frozen to make tracking contexts (none if every process had one).
    pub frozen: Duration,
    pub elapsed: Duration,
}

/// A process of the job whose memory can be copied ahead.
struct Candidate {
    pid: Tid,
    start_time: u64,
    pid_in_job: Tid,
}

/// Copies the private anonymous memory of the processes below `root` (the job's init) into
/// their streams of `generation` in `batch`, while the job runs, and leaves each in
/// `tracking`, its writes tracked from before the copy, for the capture at the freeze. With
/// `base` (an incremental generation, which `tracking` counts writes since), only the pages
/// written since are copied; the rest are referred to there.
pub fn copy_ahead(root: Tid, batch: &Batch, tracking: &mut Tracking, generation: u64, base: Option<u64>) -> Result<AheadReport> {
    let t0 = Instant::now();
    // A lazy restart's pages all in first: the copy would wait for each, and its mappings
    // cannot be tracked meanwhile (the page server's context has them).
    crate::lazy::wait_until_filled();
    let mut report = AheadReport::default();
    if !crate::objects::dirty::kernel_can_track_writes() {
        return Ok(report);
    }
    let (candidates, others) = candidates(root)?;
    // A tracker of a process gone, or of another one with its pid, counts nothing of use.
    tracking.procs.retain(|pid, t| candidates.iter().any(|c| c.pid == *pid && c.start_time == t.start_time && c.pid_in_job == t.pid_in_job));
    let incremental = base.is_some() && tracking.since == base;
    let fresh: Vec<&Candidate> = candidates.iter().filter(|c| !tracking.procs.contains_key(&c.pid)).collect();
    if !fresh.is_empty() {
        let t = Instant::now();
        for (c, tracker) in make_trackers(root, &fresh)? {
            tracking.procs.insert(c.pid, Tracked { start_time: c.start_time, pid_in_job: c.pid_in_job, tracker, content: None, ahead: None });
        }
        report.frozen = t.elapsed();
    }
    // Every mapping of the shared memory objects that can be copied protected, before any is
    // copied (each by its keeper, below).
    let all: Vec<(Tid, bool)> = candidates.iter().map(|c| (c.pid, true)).chain(others.iter().map(|&pid| (pid, false))).collect();
    let mut shared = super::shared::prepare(root, &all, &mut tracking.procs);
    for c in &candidates {
        let Some(t) = tracking.procs.get_mut(&c.pid) else { continue };
        // The pages written since the base, listed (and protected again) before the copy: the
        // copy stores those, and refers to the base for the rest.
        let previous = t.content.take();
        let delta = match t.tracker.written(c.pid) {
            Ok(written) => previous.filter(|_| incremental).map(|base| Delta { tracked: t.tracker.tracked(), written, base, ..Default::default() }),
            Err(e) => {
                debug!(pid = c.pid, "not copied ahead: {e}");
                tracking.procs.remove(&c.pid);
                continue;
            }
        };
        let Ok(ranges) = trackable_ranges(c.pid) else {
            tracking.procs.remove(&c.pid);
            continue; // it ended
        };
        // Mappings made since the base tracked from now on, before they are copied. (A range
        // the kernel would not track is copied all the same: the freeze, which finds it not
        // tracked, copies it again.)
        t.tracker.follow(&ranges);
        let mut stream = batch.stream(c.pid_in_job as u32);
        let from = stream.offset();
        // A process that ends or execs as it is copied is copied at the freeze, if it is
        // still there.
        let copied = memory::copy_while_running(c.pid, &ranges, delta.as_ref(), &mut stream, generation)?;
        // The shared memory objects it keeps, after its own memory.
        super::shared::copy_kept(&mut shared, c.pid, &mut stream);
        report.bytes += stream.offset() - from;
        report.processes += 1;
        stream.park()?;
        // What the freeze will copy into it, written into memory already there.
        stream.warm(WARM_FOR_THE_FREEZE, WARM_RESERVE);
        t.content = Some(copied.content);
        t.ahead = Some(CopiedAhead { stream, not_copied: copied.not_copied });
    }
    super::shared::keep_copied(&mut shared);
    tracking.shared = shared;
    report.elapsed = t0.elapsed();
    debug!(
        processes = report.processes,
        bytes = report.bytes,
        frozen_ms = report.frozen.as_secs_f64() * 1e3,
        ms = report.elapsed.as_secs_f64() * 1e3,
        "memory copied ahead of the freeze"
    );
    Ok(report)
}

/// The bytes of each stream's next chunk faulted in before the freeze ([`crate::pool::StreamWriter::warm`]):
/// one huge page, which the pool's memory is made of where the kernel gives them.
const WARM_FOR_THE_FREEZE: usize = 2 << 20;

/// Free chunks left unwarmed for the capture's other streams.
const WARM_RESERVE: usize = 4;

/// The processes below `root` whose memory can be copied ahead (see the module's comment), and
/// the others (whose shared mappings keep the objects they map from being copied ahead).
fn candidates(root: Tid) -> Result<(Vec<Candidate>, Vec<Tid>)> {
    let mut out = Vec::new();
    let mut others = Vec::new();
    for pid in descendants(root)? {
        // A process that ends meanwhile is simply not a candidate.
        let Ok(stat) = procfs::stat(pid) else { continue };
        if stat.state == 'Z' || in_vfork(pid, stat.ppid) || procfs::status(pid).map_or(true, |s| s.seccomp.unwrap_or(0) != 0) {
            others.push(pid);
            continue;
        }
        let Ok(pid_in_job) = procfs::ns_tid(pid) else { continue };
        out.push(Candidate { pid, start_time: stat.starttime, pid_in_job });
    }
    Ok((out, others))
}

/// Makes a tracking context in each of `processes`, in one freeze of the job (a moment: a
/// call injected in each, the protection comes after the release). A process that cannot be
/// tracked is left out, its memory copied at the freeze as without a copy ahead (said once
/// when it is the kernel's lack).
fn make_trackers<'a>(root: Tid, processes: &[&'a Candidate]) -> Result<Vec<(&'a Candidate, DirtyTracker)>> {
    let mut tree = match freeze_with(root, false) {
        Ok(tree) => tree,
        Err(e) => {
            debug!("memory copied at the freeze, not before: {e}");
            return Ok(Vec::new());
        }
    };
    // Each process on its tracer, the tracers side by side.
    let made = tree.map_processes(|p| -> Result<Option<_>> {
        let Some(c) = processes.iter().find(|c| c.pid == p.pid) else { return Ok(None) };
        let task = vdso_syscall_insn(p.pid).and_then(|insn| Ok(RemoteTask::new(p.pid, Injector::new(p.pid, insn)?)?));
        let mut task = match task {
            Ok(task) => task,
            Err(e) => {
                debug!(pid = p.pid, "memory copied at the freeze, not before: {e}");
                return Ok(None);
            }
        };
        let made = DirtyTracker::create(&mut task);
        // Its registers as they were, or the process is in no state to go on: that fails,
        // unless it is dying (a thread the freeze had not stopped ended it meanwhile).
        match task.main.finish() {
            Err(e) if super::process_dying(p.pid) => {
                debug!(pid = p.pid, "a process ended as its writes were to be tracked: {e}");
                return Ok(None);
            }
            finished => finished?,
        }
        Ok(Some((*c, p.pid, made)))
    });
    let mut out = Vec::new();
    let mut told = false;
    for made in made {
        let Some((c, pid, made)) = made? else { continue };
        match made {
            Ok(t) => out.push((c, t)),
            Err(Error::NoDirtyTracking { why, .. }) if !std::mem::replace(&mut told, true) => {
                info!(pid, "memory copied at the freeze, not before: {why}")
            }
            Err(e) => debug!(pid, "memory copied at the freeze, not before: {e}"),
        }
    }
    tree.resume()?;
    Ok(out)
}
