//! Which shared memory objects are copied before the freeze, and what the freeze makes of each
//! copy (the objects' side: `objects::shared_memory`).
//!
//! Before the copy ([`prepare`]): the job's processes' shared mappings of objects in memory are
//! listed; an object is copied only where every process that maps it has its writes tracked
//! (`capture::ahead`'s candidates: not under a seccomp filter, not sharing its parent's memory),
//! and then every one of those mappings is protected, and the object watched for writes through
//! a descriptor, before its pages are read. The first process to map it (in the tree's order, the capture's too) keeps the
//! copy in its stream ([`copy_kept`]). At the freeze ([`settle`]), an object whose every mapping
//! tracked then is still there, tracked, in the same process, that no descriptor wrote, and
//! whose keeper's stream goes on from the copy, gets a [`SharedPlan`]: the pages written through
//! any mapping since, and the whole window of any mapping made since, are copied again; the rest
//! is referred to the copy. Anything else is read while frozen, as before.

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
    /// mappings. `descriptor_path`: the path a descriptor of it shows (a memfd's or a deleted
    /// file's; none for MAP_SHARED|MAP_ANONYMOUS memory, which no descriptor reaches). `pseudo`:
    /// it is on the kernel's internal mount (a memfd), whose writes through a descriptor inotify
    /// does not tell (the kernel marks such files not to notify: seen on 6.18).
    Nameless { descriptor_path: Option<String>, pseudo: bool },
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
    /// Its watch for writes through a descriptor; none for a nameless object no process held a
    /// descriptor of (none can be had since without privilege: /proc/PID/map_files).
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

/// Lists the shared memory objects of the processes `all` (host pids, the tree's order; with
/// whether each has its writes tracked in `trackers`), protects every mapping of those that can
/// be copied before the freeze, and watches them for writes through descriptors. The copies are
/// made by [`copy_kept`].
pub(super) fn prepare(all: &[(Tid, bool)], trackers: &mut HashMap<Tid, Tracked>) -> SharedAhead {
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
    // Before anything is protected or copied: a child that ends from now on is seen at the
    // freeze. (Nothing to see where nothing is copied.)
    if !found.is_empty() {
        out.seen = all.iter().filter_map(|&(pid, _)| Some((pid, seen_in(&procfs::stat(pid).ok()?)))).collect();
    }
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
    found.retain(|id, (_, mappers, _)| {
        let all = mappers.iter().all(|(m, _)| protected.contains(&(m.pid, m.start)));
        if !all {
            debug!(keeper = mappers[0].0.pid, "shared object {id:?} copied at the freeze: a mapping of it could not be protected");
        }
        all
    });
    // Watched after the protection, before the copy: a write through a descriptor from now on
    // is told; one before is in the copy.
    let writes = match DescriptorWrites::new() {
        Ok(w) => w,
        Err(e) => {
            debug!("shared memory copied at the freeze: inotify: {e}");
            return out;
        }
    };
    let descriptors = if found.values().any(|(k, ..)| matches!(k, Kind::Nameless { descriptor_path: Some(_), .. })) {
        descriptors_of(all.iter().map(|(pid, _)| *pid))
    } else {
        HashMap::new()
    };
    for (id, (kind, mappers, _)) in found {
        let keeper = mappers[0].0.pid;
        let watch = match &kind {
            Kind::File { path } => writes
                .watch(&procfs::in_namespace_of(keeper, path))
                .map_err(|e| format!("watch {path}: {e}"))
                .and_then(|w| file_of(keeper, path, id).map(|_| Some(w))),
            Kind::Nameless { descriptor_path: Some(path), pseudo } => match descriptor_of(&descriptors, path, id) {
                Some(at) if *pseudo => Err(format!("a descriptor of it is open ({at}), and a write through it would not be told")),
                Some(at) => writes.watch(&at).map(Some).map_err(|e| format!("watch {at}: {e}")),
                None => Ok(None),
            },
            Kind::Nameless { descriptor_path: None, .. } => Ok(None),
        };
        match watch {
            Ok(watch) => out.objects.push(AheadObject { id, kind, mappers, watch, copied: None }),
            Err(why) => debug!(keeper, "shared object {id:?} copied at the freeze: {why}"),
        }
    }
    out.writes = Some(writes);
    out
}

/// Copies the objects process `pid` keeps into its `stream` (while the job runs); an object that
/// cannot be copied is read at the freeze.
pub(super) fn copy_kept(shared: &mut SharedAhead, pid: Tid, stream: &mut StreamWriter) {
    for o in shared.objects.iter_mut().filter(|o| o.mappers[0].0.pid == pid) {
        let keeper = o.mappers[0].0;
        let copied = match &o.kind {
            Kind::File { path } => copy_file(pid, path, o.id, stream),
            Kind::Nameless { .. } => {
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
pub(super) fn settle(shared: SharedAhead, frozen: &[FrozenView<'_>], zombies: bool, trackers: &HashMap<Tid, Tracked>) -> HashMap<ObjectId, SharedPlan> {
    let mut plans = HashMap::new();
    if shared.objects.is_empty() {
        return plans;
    }
    // A process that ended since the copy, or whose mappings cannot be read, may have written
    // any object unseen.
    let ended_unseen = frozen.iter().find_map(|p| {
        let why = match (p.maps, p.seen, shared.seen.get(&p.pid)) {
            (None, ..) | (_, None, _) => "a process could not be read",
            (_, Some((started, faults)), Some(&(was_started, was_faults))) if started == was_started && faults != was_faults => "a child of a process ended since",
            (_, Some((started, faults)), was) if was.is_none_or(|&(was_started, _)| was_started != started) && faults != 0 => "a child of a process started since ended",
            _ => return None,
        };
        Some(why)
    });
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
                let same = started.get(&m.pid) == Some(&start_time);
                let tracker = trackers.get(&m.pid).filter(|t| t.start_time == start_time && same).ok_or("a process that mapped it is gone")?;
                match tracker.tracker.scan_shared(m.pid, &[(m.start, m.end)]).map_err(|e| e.to_string())?.pop() {
                    Some(SharedScan::Changed(written)) => changed.extend(written.into_iter().map(|r| m.offsets_of(r))),
                    _ => return Err(format!("its mapping in pid {} is no longer tracked", m.pid)),
                }
            }
            // A mapping made since: what was written through it is not known.
            changed.extend(mappings.iter().filter(|m| !o.mappers.iter().any(|(was, _)| was == *m)).map(|m| m.window()));
            if o.watch.is_some_and(|w| written.contains(&w)) {
                return Err("written through a descriptor".into());
            }
            if let Kind::File { path } = &o.kind {
                file_of(keeper.pid, path, o.id)?;
            }
            Ok(changed)
        })();
        match usable {
            Ok(changed) => {
                plans.insert(o.id, SharedPlan { keeper: keeper.pid, keeper_mapping: (keeper.start, keeper.end), copied, changed: normalise(&changed) });
            }
            Err(why) => debug!(keeper = keeper.pid, "shared object {:?} read whole at the freeze: {why}", o.id),
        }
    }
    plans
}

/// What a shared mapping of process `pid` maps, if an object in memory that can be copied ahead.
fn kind_of(pid: Tid, m: &MemoryMap, root: &procfs::NamespaceRoot, mounts: &mut Option<Vec<procfs::Mount>>) -> Option<Kind> {
    let MMapPath::Path(p) = &m.pathname else { return None };
    let path = p.to_string_lossy();
    let dev = procfs::map_dev(m);
    if memory::is_shared_object(&path, true) {
        let pseudo = dev == memory::shmem_dev().ok()?;
        let on_shmem = pseudo || {
            let mounts = match mounts {
                Some(m) => m,
                None => mounts.insert(procfs::mounts(pid).ok()?),
            };
            mounts.iter().any(|m| m.dev == dev && m.fs_type == "tmpfs")
        };
        let descriptor_path = (path != "/dev/zero (deleted)").then(|| path.to_string());
        return on_shmem.then_some(Kind::Nameless { descriptor_path, pseudo });
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
    let meta = std::fs::metadata(procfs::in_namespace_of(pid, path)).map_err(|e| format!("stat {path}: {e}"))?;
    if (meta.dev(), meta.ino()) != id || !meta.is_file() {
        return Err(format!("{path} names another file now, or no plain file"));
    }
    if meta.len() > memory::MAX_SAVED_FILE {
        return Err(format!("{path} is too large to save"));
    }
    Ok(meta)
}

/// The job's descriptors of objects that have no name, by the path they show (a memfd's, a
/// deleted file's): where each is, as /proc shows it.
fn descriptors_of(pids: impl Iterator<Item = Tid>) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for pid in pids {
        for fd in procfs::fds(pid).unwrap_or_default() {
            let at = format!("/proc/{pid}/fd/{fd}");
            if let Ok(target) = procfs::readlink(&at) {
                if memory::is_shared_object(&target, true) {
                    out.entry(target).or_default().push(at);
                }
            }
        }
    }
    out
}

/// A descriptor of object `id` among `descriptors`: where /proc shows it.
fn descriptor_of(descriptors: &HashMap<String, Vec<String>>, path: &str, id: ObjectId) -> Option<String> {
    descriptors.get(path)?.iter().find(|at| std::fs::metadata(at).is_ok_and(|m| (m.dev(), m.ino()) == id)).cloned()
}

/// Copies the in-memory file `path` (as process `pid` names it) into `stream`, if it is still
/// object `id`.
fn copy_file(pid: Tid, path: &str, id: ObjectId, stream: &mut StreamWriter) -> Result<Vec<Extent>, String> {
    let f = crate::objects::file::open_quietly(procfs::in_namespace_of(pid, path), 0).map_err(|e| format!("open {path}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("stat {path}: {e}"))?;
    if (meta.dev(), meta.ino()) != id {
        return Err(format!("{path} names another file now"));
    }
    crate::objects::deleted::save_extents(&f, meta.len(), path, stream).map(|(extents, _)| extents).map_err(|e| e.to_string())
}
