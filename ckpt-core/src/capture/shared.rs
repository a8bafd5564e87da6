//! Which shared memory objects are copied before the freeze, and what the freeze makes of each
//! copy (the objects' side: `objects::shared_memory`).
//!
//! Before the copy ([`prepare`]): the job's processes' shared mappings of objects in memory are
//! listed; an object is copied only where every process that maps it has its writes tracked
//! (`capture::ahead`'s candidates: not under a seccomp filter, not sharing its parent's memory)
//! and none holds a descriptor of it; a tmpfs file is watched for opens and writes, then every
//! mapping is protected, and the maps read again, before its pages are read. The first process
//! to map it (in the tree's order, the capture's too) keeps the copy in its stream
//! ([`copy_kept`]). At the freeze ([`settle`]), an object whose every mapping tracked then is
//! still there, tracked, in the same process, that nobody opened, and whose keeper's stream goes
//! on from the copy, where no process of the job ended meanwhile, gets a [`SharedPlan`]: the
//! pages written through any mapping since, and the whole window of any mapping made since, are
//! copied again; the rest is referred to the copy. Anything else is read while frozen, as
//! before.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;

use tracing::debug;

use super::increments::Tracked;
use crate::objects::deleted::Extent;
use crate::objects::dirty::{normalise, SharedScan};
use crate::objects::memory;
use crate::objects::shared_memory::{copy_nameless, DescriptorWrites, ObjectId, ObjectMapping, SharedPlan, Watch};
use crate::pool::StreamWriter;
use crate::procfs::{self, MMPermissions, MMapPath, MemoryMap};
use crate::ptrace::Tid;
use crate::PAGE_SIZE;

/// What an object is, for its copy and its watch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A memfd, MAP_SHARED|MAP_ANONYMOUS memory, a deleted tmpfs file: read through the
    /// mappings.
    Nameless,
    /// A file on tmpfs, read as a file at `path` (as its keeper's mount namespace names it).
    File { path: String },
}

/// An object whose mappings are tracked, and, once copied, where the copy is.
#[derive(Debug)]
pub(super) struct AheadObject {
    id: ObjectId,
    kind: Kind,
    /// Every mapping of it in the job when it was protected, with its process's start time;
    /// the keeper's first.
    mappers: Vec<(ObjectMapping, u64)>,
    /// A file's descriptor for the copy, opened before its watch.
    file: Option<std::fs::File>,
    /// A file's watch for opens and writes; none for a nameless object, which no descriptor
    /// reaches (none was open; none can be had since without privilege: /proc/PID/map_files).
    watch: Option<Watch>,
    copied: Option<Vec<Extent>>,
}

/// The objects copied before the freeze of the generation being taken.
#[derive(Debug, Default)]
pub struct SharedAhead {
    objects: Vec<AheadObject>,
    /// Every process of the job before the copy, by host pid: what [`seen_in`] read of it.
    seen: HashMap<Tid, (u64, u64)>,
    writes: Option<DescriptorWrites>,
}

/// A process of the frozen job, as [`settle`] looks at it.
pub(super) struct FrozenView<'a> {
    pub pid: Tid,
    /// Its mappings (`None`: they could not be read, and nothing of the job's shared memory is
    /// known).
    pub maps: Option<&'a [MemoryMap]>,
    /// What [`seen_in`] read of it at the freeze.
    pub seen: Option<(u64, u64)>,
}

/// Of a process's stat: its start time, and the page faults of its children that ended and
/// were waited for. A child forked after the copy, which wrote shared memory through its own
/// (untracked) mapping and ended before the freeze, leaves no mapping to see; but its first
/// touch of each shared page faulted (a fork does not copy a shared mapping's page tables),
/// and its faults were added to its parent's when it was waited for.
pub(super) fn seen_in(stat: &::procfs::process::Stat) -> (u64, u64) {
    (stat.starttime, stat.cminflt.saturating_add(stat.cmajflt))
}

/// Objects mapped over more than this are copied ahead only where their keeper has at least one
/// page in [`SPARSE_DENSITY`] in its tables: protecting a mapping puts a marker in every page
/// table entry of it, 8 bytes per 4 KiB in every process that maps it, which a sparse
/// reservation of shared memory (MAP_NORESERVE, tens of GiB) does not repay.
const SPARSE_FROM: u64 = 1 << 30;
const SPARSE_DENSITY: u64 = 64;

/// Lists the shared memory objects of the processes `all` below `root` (host pids, the tree's
/// order; with whether each has its writes tracked in `trackers`), protects every mapping of those that can
/// be copied before the freeze, and watches them for writes through descriptors. The copies are
/// made by [`copy_kept`].
pub(super) fn prepare(root: Tid, all: &[(Tid, bool)], trackers: &mut HashMap<Tid, Tracked>) -> SharedAhead {
    let mut out = SharedAhead::default();
    // A written page of a shared object that is swapped out leaves no entry in the writer's
    // tables, and so no mark (a private page's swap entry keeps it).
    if procfs::swap_configured() {
        debug!("shared memory copied at the freeze: this node has swap");
        return out;
    }
    // Each object, its mappings (with their processes' start times), and whether every one of
    // them is tracked.
    type Found = (Kind, Vec<(ObjectMapping, u64)>, bool);
    let mut found: BTreeMap<ObjectId, Found> = BTreeMap::new();
    for &(pid, tracked) in all {
        let Ok(maps) = procfs::maps(pid) else { continue };
        let start_time = trackers.get(&pid).filter(|_| tracked).map(|t| t.start_time);
        let root = procfs::NamespaceRoot::of(pid);
        let mut mounts = None;
        for m in maps.iter().filter(|m| m.perms.contains(MMPermissions::SHARED)) {
            let Some(kind) = kind_of(pid, m, &root, &mut mounts) else { continue };
            let (start, end) = m.address;
            let entry = found.entry((procfs::map_dev(m), m.inode)).or_insert_with(|| (kind, Vec::new(), true));
            entry.1.push((ObjectMapping { pid, start, end, offset: m.offset }, start_time.unwrap_or(0)));
            entry.2 &= start_time.is_some();
        }
    }
    found.retain(|id, (_, mappers, eligible)| {
        let why = if !*eligible {
            "a process that maps it has no write tracking"
        } else if sparse(&mappers[0].0) {
            "mapped sparsely"
        } else {
            return true;
        };
        debug!(keeper = mappers[0].0.pid, "shared object {id:?} copied at the freeze: {why}");
        false
    });
    if found.is_empty() {
        return out;
    }
    // Before anything is protected or copied: a child that ends from now on is seen at the
    // freeze, as is the job's init, which reaps the orphans.
    out.seen = all.iter().map(|&(pid, _)| pid).chain([root]).filter_map(|pid| Some((pid, seen_in(&procfs::stat(pid).ok()?)))).collect();
    // Each file watched before anything else: from now on, whoever opens it (to write it, or to
    // map it anew) is told. Opened first, for the copy: that open is not among the events.
    let Ok(writes) = DescriptorWrites::new().map_err(|e| debug!("shared memory copied at the freeze: inotify: {e}")) else { return out };
    let mut files: HashMap<ObjectId, (std::fs::File, Watch)> = HashMap::new();
    found.retain(|&id, (kind, mappers, _)| {
        let Kind::File { path } = kind else { return true };
        let keeper = mappers[0].0.pid;
        match open_and_watch(&writes, keeper, path, id) {
            Ok(opened) => {
                files.insert(id, opened);
                true
            }
            Err(why) => {
                debug!(keeper, "shared object {id:?} copied at the freeze: {why}");
                false
            }
        }
    });
    // A descriptor held by the job could write the object, or map it again and unmap it before
    // the freeze, unseen (a memfd's writes do not even reach inotify).
    let held = descriptors_of(all.iter().map(|(pid, _)| *pid));
    found.retain(|id, (_, mappers, _)| match held.get(id) {
        Some(at) => {
            debug!(keeper = mappers[0].0.pid, "shared object {id:?} copied at the freeze: a descriptor of it is open ({at})");
            false
        }
        None => true,
    });
    // Every mapping of them protected, each tracker's at once (and those of trackers that map
    // none any more forgotten).
    let mut ranges: HashMap<Tid, Vec<(u64, u64)>> = HashMap::new();
    for (m, _) in found.values().flat_map(|(_, mappers, _)| mappers) {
        ranges.entry(m.pid).or_default().push((m.start, m.end));
    }
    let mut protected: HashSet<(Tid, u64)> = HashSet::new();
    for (pid, t) in trackers.iter_mut() {
        let mine = ranges.remove(pid).unwrap_or_default();
        protected.extend(t.tracker.track_shared(&mine).into_iter().map(|(start, _)| (*pid, start)));
    }
    // And no mapping of them made meanwhile, which would not be tracked: the maps read again.
    let mut now: HashMap<ObjectId, Vec<ObjectMapping>> = HashMap::new();
    for &(pid, _) in all {
        let Ok(maps) = procfs::maps(pid) else { continue };
        for m in maps.iter().filter(|m| m.perms.contains(MMPermissions::SHARED)) {
            let id = (procfs::map_dev(m), m.inode);
            if found.contains_key(&id) {
                now.entry(id).or_default().push(ObjectMapping { pid, start: m.address.0, end: m.address.1, offset: m.offset });
            }
        }
    }
    found.retain(|id, (_, mappers, _)| {
        let why = if !mappers.iter().all(|(m, _)| protected.contains(&(m.pid, m.start))) {
            "a mapping of it could not be protected"
        } else if now.get(id).is_some_and(|maps| maps.iter().any(|m| !mappers.iter().any(|(was, _)| was == m))) {
            "it was mapped anew as it was being protected"
        } else {
            return true;
        };
        debug!(keeper = mappers[0].0.pid, "shared object {id:?} copied at the freeze: {why}");
        false
    });
    for (id, (kind, mappers, _)) in found {
        let (file, watch) = files.remove(&id).map_or((None, None), |(f, w)| (Some(f), Some(w)));
        out.objects.push(AheadObject { id, kind, mappers, file, watch, copied: None });
    }
    out.writes = Some(writes);
    out
}

/// Opens the in-memory file `path` (as process `pid` names it) for its copy, if it is still
/// object `id`, and watches it for opens and writes.
fn open_and_watch(writes: &DescriptorWrites, pid: Tid, path: &str, id: ObjectId) -> Result<(std::fs::File, Watch), String> {
    // The path is the job's to change: no link followed at its end, no wait on a FIFO put
    // there; what is opened is checked to be the object before anything is read.
    let f =
        crate::objects::file::open_quietly(procfs::in_namespace_of(pid, path), libc::O_NONBLOCK | libc::O_NOFOLLOW).map_err(|e| format!("open {path}: {e}"))?;
    the_object(f.metadata().map_err(|e| format!("stat {path}: {e}"))?, path, id)?;
    // (Through our descriptor: the path is resolved, nothing opened.)
    let watch = writes.watch(&format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f))).map_err(|e| format!("watch {path}: {e}"))?;
    Ok((f, watch))
}

/// Copies the objects process `pid` keeps into its `stream` (while the job runs); an object that
/// cannot be copied is read at the freeze.
pub(super) fn copy_kept(shared: &mut SharedAhead, pid: Tid, stream: &mut StreamWriter) {
    for o in shared.objects.iter_mut().filter(|o| o.mappers[0].0.pid == pid) {
        let keeper = o.mappers[0].0;
        let copied = match &o.kind {
            Kind::File { path } => match &o.file {
                Some(f) => crate::objects::deleted::save_extents(f, f.metadata().map_or(0, |m| m.len()), path, stream)
                    .map(|(extents, _)| extents)
                    .map_err(|e| e.to_string()),
                None => Err("not opened".into()),
            },
            Kind::Nameless => {
                let mappers: Vec<ObjectMapping> = o.mappers.iter().map(|(m, _)| *m).collect();
                copy_nameless(&keeper, &mappers, stream).map_err(|e| e.to_string())
            }
        };
        match copied {
            Ok(extents) => o.copied = Some(extents),
            Err(why) => debug!(pid, "shared object {:?} copied at the freeze, not before: {why}", o.id),
        }
    }
}

/// Forgets the objects whose copy was not made.
pub(super) fn keep_copied(shared: &mut SharedAhead) {
    shared.objects.retain(|o| o.copied.is_some());
}

impl SharedAhead {
    /// Whether any object was copied (the freeze has something to settle).
    pub(super) fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// At the freeze: the plan for each object copied before it that can use its copy (see the
/// module's comment). `frozen`: every process of the job (host pid) and its mappings as read at
/// the freeze; `trackers`: the write tracking of the processes, as the copy left it.
pub(super) fn settle(
    shared: SharedAhead,
    root: Tid,
    frozen: &[FrozenView<'_>],
    zombies: bool,
    trackers: &HashMap<Tid, Tracked>,
) -> HashMap<ObjectId, SharedPlan> {
    // (The ranges scanned are given back to the job once it runs again: see
    // `Tracking::untrack_shared`.)
    plans_for(shared, root, frozen, zombies, trackers)
}

fn plans_for(shared: SharedAhead, root: Tid, frozen: &[FrozenView<'_>], zombies: bool, trackers: &HashMap<Tid, Tracked>) -> HashMap<ObjectId, SharedPlan> {
    let mut plans = HashMap::new();
    if shared.objects.is_empty() {
        return plans;
    }
    // A process that ended since the copy, or whose mappings cannot be read, may have written
    // any object unseen.
    let ended_unseen = frozen.iter().find_map(|p| {
        let why = match (p.maps, p.seen, shared.seen.get(&p.pid)) {
            (None, ..) | (_, None, _) => "a process could not be read",
            (_, Some((started, faults)), Some(&(was_started, was_faults))) if started == was_started && faults != was_faults => {
                "a child of a process ended since"
            }
            (_, Some((started, faults)), was) if was.is_none_or(|&(was_started, _)| was_started != started) && faults != 0 => {
                "a child of a process started since ended"
            }
            _ => return None,
        };
        Some(why)
    });
    // The job's init reaps the orphans (it is ckpt's, not captured, so not frozen: read now).
    let init_reaped = procfs::stat(root).ok().map(|s| seen_in(&s)) != shared.seen.get(&root).copied();
    let ended_unseen = ended_unseen.or(init_reaped.then_some("the job's init reaped a process since"));
    if let Some(why) = ended_unseen.or(zombies.then_some("the job holds a process that ended")) {
        debug!(objects = shared.objects.len(), "shared memory copied before the freeze read again whole: {why}");
        return plans;
    }
    let ids: HashSet<ObjectId> = shared.objects.iter().map(|o| o.id).collect();
    let mut now: HashMap<ObjectId, Vec<ObjectMapping>> = HashMap::new();
    let started: HashMap<Tid, u64> = frozen.iter().filter_map(|p| Some((p.pid, p.seen?.0))).collect();
    for p in frozen {
        let pid = p.pid;
        for m in p.maps.unwrap_or_default().iter().filter(|m| m.perms.contains(MMPermissions::SHARED)) {
            let id = (procfs::map_dev(m), m.inode);
            if ids.contains(&id) {
                let (start, end) = m.address;
                now.entry(id).or_default().push(ObjectMapping { pid, start, end, offset: m.offset });
            }
        }
    }
    let written = match shared.writes.as_ref().map(DescriptorWrites::written) {
        Some(Ok(Some(written))) => written,
        Some(Ok(None)) => {
            debug!("shared memory copied before the freeze read again whole: inotify lost count");
            return plans;
        }
        Some(Err(e)) => {
            debug!("shared memory copied before the freeze read again whole: inotify: {e}");
            return plans;
        }
        None => return plans,
    };
    // Every tracked mapping of every object scanned, side by side (each page table entry is
    // walked: a 4 GiB mapping of 4 KiB pages took some 70 ms).
    let mut jobs: Vec<(ObjectMapping, &crate::objects::dirty::DirtyTracker)> = Vec::new();
    for (m, start_time) in shared.objects.iter().flat_map(|o| o.mappers.iter()) {
        let same = started.get(&m.pid) == Some(start_time);
        if let Some(t) = trackers.get(&m.pid).filter(|t| t.start_time == *start_time && same) {
            jobs.push((*m, &t.tracker));
        }
    }
    let scanned: HashMap<ObjectMapping, Vec<(u64, u64)>> = scan_side_by_side(&jobs);
    for o in shared.objects {
        let Some(copied) = o.copied else { continue };
        let mappings = now.remove(&o.id).unwrap_or_default();
        let keeper = o.mappers[0].0;
        let usable = (|| -> Result<Vec<(u64, u64)>, String> {
            if trackers.get(&keeper.pid).is_none_or(|t| t.ahead.is_none()) {
                return Err("its keeper's stream was not kept".into());
            }
            let mut changed = Vec::new();
            for &(m, start_time) in &o.mappers {
                if !mappings.contains(&m) {
                    return Err(format!("pid {} unmapped or moved it", m.pid));
                }
                if started.get(&m.pid) != Some(&start_time) {
                    return Err("a process that mapped it is gone".into());
                }
                let written = scanned.get(&m).ok_or_else(|| format!("its mapping in pid {} is no longer tracked", m.pid))?;
                changed.extend(written.iter().map(|&r| m.offsets_of(r)));
            }
            // A mapping made since: what was written through it is not known.
            changed.extend(mappings.iter().filter(|m| !o.mappers.iter().any(|(was, _)| was == *m)).map(|m| m.window()));
            if o.watch.is_some_and(|w| written.contains(&w)) {
                return Err("opened, or written through a descriptor".into());
            }
            if let Kind::File { path } = &o.kind {
                file_of(keeper.pid, path, o.id)?;
            }
            Ok(changed)
        })();
        match usable {
            Ok(changed) => {
                plans.insert(
                    o.id,
                    SharedPlan {
                        keeper: keeper.pid,
                        keeper_mapping: (keeper.start, keeper.end),
                        keeper_window: keeper.window(),
                        copied,
                        changed: normalise(&changed),
                    },
                );
            }
            Err(why) => debug!(keeper = keeper.pid, "shared object {:?} read whole at the freeze: {why}", o.id),
        }
    }
    plans
}

/// For the processes `procs` (the capture's order, with their mappings), the shared mappings
/// whose object the keeper of its plan stores before them, and wholly (their window within the
/// keeper's): the capture needs nothing of theirs. By position in `procs`.
pub(super) fn probes_not_needed(procs: &[(Tid, Option<&[MemoryMap]>)], plans: &HashMap<ObjectId, SharedPlan>) -> Vec<(usize, Vec<u64>)> {
    let mut out = Vec::new();
    if plans.is_empty() {
        return out;
    }
    let mut keeper_seen: HashSet<ObjectId> = HashSet::new();
    for (at, (pid, maps)) in procs.iter().enumerate() {
        let mut skip = Vec::new();
        for m in maps.unwrap_or_default().iter().filter(|m| m.perms.contains(MMPermissions::SHARED)) {
            let id = (procfs::map_dev(m), m.inode);
            let Some(plan) = plans.get(&id) else { continue };
            if plan.keeper == *pid {
                keeper_seen.insert(id);
            } else if keeper_seen.contains(&id) {
                let window = (m.offset, m.offset + (m.address.1 - m.address.0));
                if plan.keeper_window.0 <= window.0 && window.1 <= plan.keeper_window.1 {
                    skip.push(m.address.0);
                }
            }
        }
        if !skip.is_empty() {
            out.push((at, skip));
        }
    }
    out
}

/// The pages each mapping of `jobs` may have changed through since it was protected, its
/// tracker scanning it; a mapping not tracked any more, or whose scan failed, is left out. A
/// process's mappings are scanned together (one open of its pagemap: an Open MPI rank of 64 maps
/// every rank's segment, 4,226 mappings in all, which took 30 ms one by one); the processes on as
/// many threads as there are CPUs.
fn scan_side_by_side(jobs: &[(ObjectMapping, &crate::objects::dirty::DirtyTracker)]) -> HashMap<ObjectMapping, Vec<(u64, u64)>> {
    let mut by_process: HashMap<Tid, (&crate::objects::dirty::DirtyTracker, Vec<ObjectMapping>)> = HashMap::new();
    for &(m, tracker) in jobs {
        by_process.entry(m.pid).or_insert_with(|| (tracker, Vec::new())).1.push(m);
    }
    let by_process: Vec<_> = by_process.into_iter().collect();
    type Process<'a> = (Tid, (&'a crate::objects::dirty::DirtyTracker, Vec<ObjectMapping>));
    crate::procfs::side_by_side(&by_process, |part: &[Process<'_>]| {
        let mut out = Vec::new();
        for (pid, (tracker, mappings)) in part {
            let ranges: Vec<(u64, u64)> = mappings.iter().map(|m| (m.start, m.end)).collect();
            match tracker.scan_shared(*pid, &ranges) {
                Ok(scans) => out.extend(mappings.iter().zip(scans).filter_map(|(m, scan)| match scan {
                    SharedScan::Changed(written) => Some((*m, written)),
                    _ => None,
                })),
                Err(e) => debug!(pid, "shared mappings not scanned: {e}"),
            }
        }
        out
    })
    .into_iter()
    .collect()
}

/// What a shared mapping of process `pid` maps, if an object in memory that can be copied ahead.
fn kind_of(pid: Tid, m: &MemoryMap, root: &procfs::NamespaceRoot, mounts: &mut Option<Vec<procfs::Mount>>) -> Option<Kind> {
    let MMapPath::Path(p) = &m.pathname else { return None };
    let path = p.to_string_lossy();
    let dev = procfs::map_dev(m);
    if memory::is_shared_object(&path, true) {
        let on_shmem = dev == memory::shmem_dev().ok()? || {
            let mounts = match mounts {
                Some(m) => m,
                None => mounts.insert(procfs::mounts(pid).ok()?),
            };
            mounts.iter().any(|m| m.dev == dev && m.fs_type == "tmpfs")
        };
        return on_shmem.then_some(Kind::Nameless);
    }
    // (Devices are on a tmpfs too: the file is checked to be a plain one when watched.)
    memory::on_tmpfs(&root.path(&path)).then(|| Kind::File { path: path.into_owned() })
}

/// Whether the object `keeper` maps is mapped sparsely (see [`SPARSE_FROM`]).
fn sparse(keeper: &ObjectMapping) -> bool {
    use crate::procfs::pagemap_scan::{Query, PAGE_IS_PRESENT};
    let len = keeper.end - keeper.start;
    if len <= SPARSE_FROM {
        return false;
    }
    let present_only = Query { inverted: 0, all: PAGE_IS_PRESENT, any: 0, report: 0, reprotect: false };
    let there: u64 = procfs::Pagemap::open(keeper.pid)
        .and_then(|p| p.scan(keeper.start, keeper.end, present_only))
        .map_or(0, |regions| regions.iter().map(|r| r.end - r.start).sum());
    there / PAGE_SIZE < len / PAGE_SIZE / SPARSE_DENSITY
}

/// The in-memory file `path` (as process `pid` names it) if it is still object `id`, a plain
/// file small enough to save.
fn file_of(pid: Tid, path: &str, id: ObjectId) -> Result<std::fs::Metadata, String> {
    the_object(std::fs::metadata(procfs::in_namespace_of(pid, path)).map_err(|e| format!("stat {path}: {e}"))?, path, id)
}

/// `meta`, if it is object `id`, a plain file small enough to save.
fn the_object(meta: std::fs::Metadata, path: &str, id: ObjectId) -> Result<std::fs::Metadata, String> {
    if (meta.dev(), meta.ino()) != id || !meta.is_file() {
        return Err(format!("{path} names another file now, or no plain file"));
    }
    if meta.len() > memory::MAX_SAVED_FILE {
        return Err(format!("{path} is too large to save"));
    }
    Ok(meta)
}

/// The job's open descriptors of files (not sockets, pipes or the kernel's anonymous ones), by
/// the file's device and inode: where /proc shows one.
fn descriptors_of(pids: impl Iterator<Item = Tid>) -> HashMap<ObjectId, String> {
    let mut out = HashMap::new();
    for pid in pids {
        for fd in procfs::fds(pid).unwrap_or_default() {
            let at = format!("/proc/{pid}/fd/{fd}");
            // (Only a path names a file: "socket:[...]", "pipe:[...]", "anon_inode:..." do not.)
            if procfs::readlink(&at).is_ok_and(|target| target.starts_with('/')) {
                if let Ok(meta) = std::fs::metadata(&at) {
                    out.entry((meta.dev(), meta.ino())).or_insert(at);
                }
            }
        }
    }
    out
}
