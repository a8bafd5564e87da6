//! Cgroups the job made: directories below its init's cgroups, their settings, and which
//! process is in which.
//!
//! A job starts in its init's cgroups, wherever `ckpt launch` ran (a Slurm job's cgroup, a
//! user's session scope); a restarted job starts in the restart's. A program may make cgroups
//! below its own and move its processes there (`systemd-run --user --scope`, a container
//! runtime, a test harness limiting its children): those come back at the same places below
//! the restarted init's cgroups, with their settings, and each process in its cgroups again,
//! before its memory is filled (so that its memory is charged where its limit is). This works
//! in cgroup v2 and in every v1 hierarchy, controller or named (this machine's kind: v1
//! controllers beside a cgroup2 mount), as root or as an ordinary user with a delegated
//! subtree.
//!
//! What is kept of a cgroup: the settings of [`KNOBS`] that a fresh cgroup does not already
//! have (a restart reads each file of the cgroup it made and writes only what differs, so that
//! a cgroup left behind by the crashed job is taken as it is found). Statistics, pressure and
//! events are the kernel's, not the job's. Who may use it is kept too: its directory's owner and
//! mode, and its files' where they were changed (a cgroup delegated to another user, as a
//! container runtime or systemd gives one). The cgroups below those, empty ones included (made
//! for later, or emptied since), are the job's as well; empty cgroups directly below the init's
//! are not seen: the checkpoint looks where the job's processes are (the init's cgroup may be a
//! whole machine's root, whose other cgroups are not the job's). Refused at checkpoint, naming the
//! process: a process in a cgroup outside its init's (it would come back inside), a thread in
//! other cgroups than its process's (v1 lets threads apart), a frozen cgroup, and a hierarchy
//! not mounted where the checkpoint can read its settings.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ptrace::Tid;
use crate::{procfs, Error, Result};

/// The cgroups the job made and where its processes are in them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CgroupsRecord {
    /// Each cgroup the job's processes are in below their init's, and those between, parents
    /// before their children.
    pub made: Vec<MadeCgroup>,
    /// The processes in cgroups of `made`.
    pub placed: Vec<Placed>,
}

/// One cgroup the job made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MadeCgroup {
    /// Its hierarchy as /proc/PID/cgroup names it: its controllers (`cpu,cpuacct`), a named
    /// hierarchy (`name=systemd`), or empty for cgroup v2.
    pub hierarchy: String,
    /// Its path below the init's cgroup in that hierarchy, components joined by `/`, no `/` at
    /// either end (`ranks/0`).
    pub path: String,
    /// Its settings, (file, contents without the last newline), in the order they are written
    /// back.
    pub settings: Vec<(String, String)>,
    /// Who may use it.
    pub access: CgroupAccess,
}

/// Who may use a cgroup: its directory's owner and mode, and its files' where they were changed
/// since the kernel made them (delegation gives another user the directory and its
/// `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads`; zdtm's cgroup03 gives some files
/// mode 0777).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CgroupAccess {
    /// The directory's uid, gid and permission bits.
    pub dir: (u32, u32, u32),
    /// The uid and gid of most of its files: whoever made it (the kernel gives a new cgroup's
    /// files the maker's ids), given to every file not in `changed`.
    pub files: (u32, u32),
    /// Its files whose owner is not `files`, or whose mode is none the kernel gives (a mode it
    /// gives is not told from one set to the same bits): name, uid, gid, permission bits.
    pub changed: Vec<(String, u32, u32, u32)>,
}

/// A process in cgroups the job made: by its pid in the job, and the index in
/// [`CgroupsRecord::made`] of its cgroup in each hierarchy where it is not in its init's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Placed {
    pub pid: Tid,
    pub cgroups: Vec<u32>,
}

/// How a setting's contents are written back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// As read.
    Whole,
    /// One write per line (`net_prio.ifpriomap`, `io.max`: each line sets one device).
    EachLine,
    /// cgroup v2's `cgroup.subtree_control`: `+NAME` for each controller listed.
    Controllers,
    /// cgroup v2's `cgroup.type`: only `threaded` is asked for (the others follow from it).
    Threaded,
    /// v1's `devices.list`, the allowed devices: everything denied, then each line allowed
    /// (through `devices.deny` and `devices.allow`; the list itself cannot be written).
    Devices,
}

/// The settings kept: (controller, file, how it is written back), in the order written back
/// (a v1 cpuset takes no process before its CPUs and memory nodes; a quota's period before the
/// quota; in v2 the type and the controllers given to the children before the limits). The
/// controller is the v1 hierarchy's that has the file; `""` for cgroup v2's files (read where
/// they exist: a controller's files exist only where the parent gives it).
const KNOBS: &[(&str, &str, Write)] = &[
    // cgroup v1
    ("cpuset", "cpuset.cpus", Write::Whole),
    ("cpuset", "cpuset.mems", Write::Whole),
    ("cpu", "cpu.shares", Write::Whole),
    ("cpu", "cpu.cfs_period_us", Write::Whole),
    ("cpu", "cpu.cfs_quota_us", Write::Whole),
    ("cpu", "cpu.idle", Write::Whole),
    ("memory", "memory.limit_in_bytes", Write::Whole),
    ("memory", "memory.memsw.limit_in_bytes", Write::Whole),
    ("memory", "memory.soft_limit_in_bytes", Write::Whole),
    ("memory", "memory.swappiness", Write::Whole),
    ("pids", "pids.max", Write::Whole),
    ("blkio", "blkio.weight", Write::Whole),
    ("net_cls", "net_cls.classid", Write::Whole),
    ("net_prio", "net_prio.ifpriomap", Write::EachLine),
    ("devices", "devices.list", Write::Devices),
    // cgroup v2
    ("", "cgroup.type", Write::Threaded),
    ("", "cgroup.subtree_control", Write::Controllers),
    ("", "cgroup.max.descendants", Write::Whole),
    ("", "cgroup.max.depth", Write::Whole),
    ("", "cpuset.cpus", Write::Whole),
    ("", "cpuset.mems", Write::Whole),
    ("", "cpu.weight", Write::Whole),
    ("", "cpu.max", Write::Whole),
    ("", "cpu.max.burst", Write::Whole),
    ("", "cpu.idle", Write::Whole),
    ("", "memory.min", Write::Whole),
    ("", "memory.low", Write::Whole),
    ("", "memory.high", Write::Whole),
    ("", "memory.max", Write::Whole),
    ("", "memory.swap.high", Write::Whole),
    ("", "memory.swap.max", Write::Whole),
    ("", "memory.oom.group", Write::Whole),
    ("", "pids.max", Write::Whole),
    ("", "io.weight", Write::Whole),
    ("", "io.max", Write::EachLine),
];

/// Most cgroups one image may make, settings per cgroup, and bytes of one setting.
pub const MAX_CGROUPS: usize = 4096;
const MAX_SETTING_LEN: usize = 64 * 1024;
/// Longest hierarchy name and path kept (a path is a directory's below a mount: PATH_MAX).
const MAX_HIERARCHY_LEN: usize = 256;
const MAX_PATH_LEN: usize = 4096;
/// Most files of one cgroup whose access is kept apart (a cgroup has a few hundred at most).
const MAX_CHANGED_FILES: usize = 1024;
/// The modes the kernel gives a cgroup's files (`cgroup_file_mode`: readable by all, writable by
/// the owner or by all).
const KERNEL_FILE_MODES: [u32; 5] = [0o444, 0o644, 0o200, 0o666, 0o222];

/// The files kept for a cgroup of `hierarchy`: v2's for `""`, else those of its controllers.
fn knobs_of(hierarchy: &str) -> impl Iterator<Item = &'static (&'static str, &'static str, Write)> + '_ {
    KNOBS.iter().filter(move |(controller, _, _)| match hierarchy {
        "" => controller.is_empty(),
        _ => !controller.is_empty() && hierarchy.split(',').any(|c| c == *controller),
    })
}

/// One line of /proc/PID/cgroup: (hierarchy, path).
fn parse_cgroup_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_id, hierarchy, path) = (fields.next()?, fields.next()?, fields.next()?);
            Some((hierarchy.to_string(), path.to_string()))
        })
        .collect()
}

fn cgroups_of(path: &str) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io(io::Error::new(e.kind(), format!("read {path}: {e}"))))?;
    Ok(parse_cgroup_file(&text))
}

/// `path` below `base` (both as /proc/PID/cgroup shows them), without the `/` between: `Some("")`
/// for `base` itself, None when it is not below.
fn below<'a>(path: &'a str, base: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(base.trim_end_matches('/'))?;
    match rest {
        "" => Some(""),
        _ => rest.strip_prefix('/'),
    }
}

/// Where the cgroups of `hierarchy` are, as `mountinfo` (the job's init's) shows them: (mount
/// point, the cgroup path at its root).
fn mount_of(mountinfo: &[super::mounts::MountInfo], hierarchy: &str) -> Option<(String, String)> {
    mountinfo
        .iter()
        .find(|m| match hierarchy {
            "" => m.fstype == "cgroup2",
            _ => {
                m.fstype == "cgroup" && {
                    let options: Vec<&str> = m.super_options.split(',').collect();
                    hierarchy.split(',').all(|c| options.contains(&c))
                }
            }
        })
        .map(|m| (m.at.clone(), m.root.clone()))
}

/// The directory of cgroup `path` (as /proc/PID/cgroup shows it) in `hierarchy`, through its
/// mount.
fn directory(mountinfo: &[super::mounts::MountInfo], hierarchy: &str, path: &str) -> std::result::Result<PathBuf, String> {
    let what = || if hierarchy.is_empty() { "the cgroup v2 hierarchy".to_string() } else { format!("the cgroup hierarchy {hierarchy}") };
    let (at, root) = mount_of(mountinfo, hierarchy).ok_or_else(|| format!("{} is not mounted where the job sees", what()))?;
    let inside = below(path, &root).ok_or_else(|| format!("{} is mounted here from {root}, which does not hold {path}", what()))?;
    Ok(Path::new(&at).join(inside))
}

/// The mounts the job's init (host pid `init`) sees: a job may mount a hierarchy of its own in
/// its mount namespace (zdtm's cgroup tests mount a named one), which the checkpoint and the
/// restart reach through the init's root ([`through_init`]).
fn read_mountinfo(init: Tid) -> Result<Vec<super::mounts::MountInfo>> {
    let path = format!("/proc/{init}/mountinfo");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Io(io::Error::new(e.kind(), format!("read {path}: {e}"))))?;
    super::mounts::parse_mountinfo(&text).map_err(|e| Error::Bug(format!("{path}: {e}")))
}

/// `path` as the job's init (host pid `init`) sees it, from outside its mount namespace.
fn through_init(init: Tid, path: &Path) -> PathBuf {
    Path::new(&format!("/proc/{init}/root")).join(path.strip_prefix("/").unwrap_or(path))
}

/// Reads where each process of `tasks` (host pid, its threads' host tids as the freeze holds
/// them) is below the cgroups of `init` (the job's init, host pid), and the settings of those
/// cgroups. Refuses what a restart could not bring back (see the module). Nothing is read
/// beyond each task's cgroup file when every process is in its init's cgroups.
pub fn capture(init: Tid, tasks: &[(Tid, Vec<Tid>)]) -> Result<CgroupsRecord> {
    let of_init: BTreeMap<String, String> = cgroups_of(&format!("/proc/{init}/cgroup"))?.into_iter().collect();
    // (hierarchy, path below the init's) of each cgroup a process is in, and who is where.
    let mut made: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut placed_host: Vec<(Tid, Vec<(String, String)>)> = Vec::new();
    for (pid, tids) in tasks {
        let pid = *pid;
        let own = match cgroups_of(&format!("/proc/{pid}/cgroup")) {
            Ok(own) => own,
            // It ended as the tree was frozen: the freeze records it as the zombie it is.
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(e) => return Err(e),
        };
        let mut elsewhere = Vec::new();
        for (hierarchy, path) in &own {
            let Some(base) = of_init.get(hierarchy) else { continue };
            if path == base {
                continue;
            }
            let rel = below(path, base).filter(|r| !r.is_empty()).ok_or_else(|| Error::Unsupported {
                pid: super::namespaces::ns_pid_or(pid),
                what: format!(
                    "a cgroup outside its init's ({}:{path}, where the job's init is in {base}: a restart would bring it back below the init's)",
                    shown(hierarchy)
                ),
            })?;
            elsewhere.push((hierarchy.clone(), rel.to_string()));
        }
        // v1 lets a thread be in other cgroups than its process: not kept (each thread would
        // be moved by its own id), so refused rather than brought back together.
        if tids.len() > 1 {
            for &tid in tids.iter().filter(|&&t| t != pid) {
                let Ok(theirs) = cgroups_of(&format!("/proc/{pid}/task/{tid}/cgroup")) else { continue };
                if theirs != own {
                    return Err(Error::Unsupported {
                        pid: super::namespaces::ns_pid_or(pid),
                        what: format!("its thread {} in other cgroups than its process's", procfs::ns_tid(tid).unwrap_or(tid)),
                    });
                }
            }
        }
        if !elsewhere.is_empty() {
            placed_host.push((pid, elsewhere));
        }
    }
    if placed_host.is_empty() {
        return Ok(CgroupsRecord::default());
    }
    for (_, cgroups) in &placed_host {
        for (hierarchy, rel) in cgroups {
            // The cgroups between the init's and the process's are the job's too.
            let mut at = String::new();
            for component in rel.split('/') {
                if !at.is_empty() {
                    at.push('/');
                }
                at.push_str(component);
                made.entry((hierarchy.clone(), at.clone())).or_insert(0);
            }
        }
    }
    let mountinfo = read_mountinfo(init)?;
    let job_pid = super::namespaces::ns_pid_or(placed_host[0].0);
    let dir_of = |hierarchy: &String, rel: &String| -> Result<PathBuf> {
        let full = format!("{}/{rel}", of_init[hierarchy].trim_end_matches('/'));
        let dir = directory(&mountinfo, hierarchy, &full).map_err(|why| Error::Unsupported {
            pid: job_pid,
            what: format!("the cgroup {}:{full} of the job's ({why}, to read its settings)", shown(hierarchy)),
        })?;
        Ok(through_init(init, &dir))
    };
    // And every cgroup below those, empty or not.
    let mut below_made = Vec::new();
    for (hierarchy, rel) in made.keys() {
        below_made.extend(descendants(&dir_of(hierarchy, rel)?, rel, job_pid)?.into_iter().map(|d| (hierarchy.clone(), d)));
    }
    made.extend(below_made.into_iter().map(|key| (key, 0)));
    if made.len() > MAX_CGROUPS {
        return Err(Error::Unsupported { pid: job_pid, what: format!("a job in {} cgroups of its own, more than {MAX_CGROUPS}", made.len()) });
    }
    // Parents before children: a path sorts after its prefix.
    let mut record = CgroupsRecord::default();
    for (index, ((hierarchy, rel), slot)) in made.iter_mut().enumerate() {
        *slot = index as u32;
        let dir = dir_of(hierarchy, rel)?;
        let settings = read_settings(&dir, hierarchy, job_pid)?;
        let access = read_access(&dir)?;
        record.made.push(MadeCgroup { hierarchy: hierarchy.clone(), path: rel.clone(), settings, access });
    }
    for (host_pid, cgroups) in placed_host {
        let pid = procfs::ns_tid(host_pid).map_err(|e| Error::Io(io::Error::new(e.kind(), format!("the pid in the job of {host_pid}: {e}"))))?;
        record.placed.push(Placed { pid, cgroups: cgroups.iter().map(|key| made[key]).collect() });
    }
    Ok(record)
}

/// A hierarchy for messages.
fn shown(hierarchy: &str) -> &str {
    if hierarchy.is_empty() {
        "cgroup2"
    } else {
        hierarchy
    }
}

/// The cgroups below the one at `dir` (`rel` below the init's), as paths below the init's,
/// parents first; at most [`MAX_CGROUPS`] are looked for.
fn descendants(dir: &Path, rel: &str, pid: Tid) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut to_read = vec![(dir.to_path_buf(), rel.to_string())];
    while let Some((at, at_rel)) = to_read.pop() {
        let entries = std::fs::read_dir(&at).map_err(|e| Error::Io(io::Error::new(e.kind(), format!("list the cgroups in {}: {e}", at.display()))))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::Io(io::Error::new(e.kind(), format!("list the cgroups in {}: {e}", at.display()))))?;
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry
                .file_name()
                .into_string()
                .map_err(|name| Error::Unsupported { pid, what: format!("a cgroup whose name is not UTF-8 ({name:?} in {})", at.display()) })?;
            let child_rel = format!("{at_rel}/{name}");
            to_read.push((entry.path(), child_rel.clone()));
            found.push(child_rel);
            if found.len() > MAX_CGROUPS {
                return Err(Error::Unsupported { pid, what: format!("a job with more than {MAX_CGROUPS} cgroups of its own below {}", dir.display()) });
            }
        }
    }
    Ok(found)
}

/// Who may use the cgroup at `dir` (see [`CgroupAccess`]).
fn read_access(dir: &Path) -> Result<CgroupAccess> {
    use std::os::unix::fs::MetadataExt;
    let failed = |what: &Path, e: io::Error| Error::Io(io::Error::new(e.kind(), format!("read the owner of {}: {e}", what.display())));
    let meta = std::fs::metadata(dir).map_err(|e| failed(dir, e))?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| failed(dir, e))? {
        let entry = entry.map_err(|e| failed(dir, e))?;
        let m = entry.metadata().map_err(|e| failed(&entry.path(), e))?;
        if m.is_file() {
            files.push((entry.file_name().to_string_lossy().into_owned(), m.uid(), m.gid(), m.mode() & 0o7777));
        }
    }
    let mut owners: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for (_, uid, gid, _) in &files {
        *owners.entry((*uid, *gid)).or_default() += 1;
    }
    let most = owners.iter().max_by_key(|(_, &n)| n).map_or((meta.uid(), meta.gid()), |(&owner, _)| owner);
    let mut changed: Vec<_> = files.into_iter().filter(|&(_, uid, gid, mode)| (uid, gid) != most || !KERNEL_FILE_MODES.contains(&mode)).collect();
    changed.truncate(MAX_CHANGED_FILES);
    Ok(CgroupAccess { dir: (meta.uid(), meta.gid(), meta.mode() & 0o7777), files: most, changed })
}

/// Gives the cgroup at `dir` the access recorded, where it differs; on failure, the path changed
/// and the error.
fn write_access(dir: &Path, access: &CgroupAccess) -> std::result::Result<(), (String, io::Error)> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let shown = |p: &Path| p.display().to_string();
    let set = |path: &Path, (uid, gid): (u32, u32), mode: Option<u32>| -> std::result::Result<(), (String, io::Error)> {
        let now = std::fs::metadata(path).map_err(|e| (shown(path), e))?;
        if (now.uid(), now.gid()) != (uid, gid) {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| (shown(path), e))?;
        }
        if let Some(mode) = mode.filter(|&m| m != now.mode() & 0o7777) {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| (shown(path), e))?;
        }
        Ok(())
    };
    for entry in std::fs::read_dir(dir).map_err(|e| (shown(dir), e))? {
        let entry = entry.map_err(|e| (shown(dir), e))?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let name = entry.file_name();
        match access.changed.iter().find(|c| std::ffi::OsStr::new(&c.0) == name) {
            Some(&(_, uid, gid, mode)) => set(&entry.path(), (uid, gid), Some(mode))?,
            None => set(&entry.path(), access.files, None)?,
        }
    }
    // The directory last: its new owner or mode may shut the restart out of it.
    set(dir, (access.dir.0, access.dir.1), Some(access.dir.2))
}

/// The settings of the cgroup at `dir` of `hierarchy` (see [`KNOBS`]); a frozen cgroup is
/// refused (its processes could not be captured, nor would they run if brought back so), as
/// a state of process `pid` (in the job), one of the job's.
fn read_settings(dir: &Path, hierarchy: &str, pid: Tid) -> Result<Vec<(String, String)>> {
    let read = |file: &str| -> Result<Option<String>> {
        match std::fs::read_to_string(dir.join(file)) {
            Ok(text) => Ok(Some(text.trim_end_matches('\n').to_string())),
            // Files of a controller the parent does not give, of a kernel without it, or
            // unreadable to the user: nothing to keep of them.
            Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied) || e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
            Err(e) => Err(Error::Io(io::Error::new(e.kind(), format!("read {}: {e}", dir.join(file).display())))),
        }
    };
    for frozen in ["freezer.state", "cgroup.freeze"] {
        if let Some(state) = read(frozen)?.filter(|s| s != "THAWED" && s != "0") {
            return Err(Error::Unsupported { pid, what: format!("a job in a frozen cgroup ({}, {frozen} {state}: thaw it)", dir.display()) });
        }
    }
    let mut settings = Vec::new();
    for (_, file, _) in knobs_of(hierarchy) {
        if let Some(value) = read(file)? {
            settings.push((file.to_string(), value));
        }
    }
    Ok(settings)
}

/// Brings the cgroups of `record` back below the cgroups of `init` (the restarted job's init,
/// host pid) and moves each placed process there; `host_pid_of` gives a pid in the job's host
/// pid. Run once the processes exist, before their memory is filled. A cgroup already there
/// (left by the job before) is taken, its settings made as recorded.
pub fn restore(record: &CgroupsRecord, init: Tid, host_pid_of: impl Fn(Tid) -> Option<Tid>) -> Result<()> {
    if record.made.is_empty() {
        return Ok(());
    }
    let of_init: BTreeMap<String, String> = cgroups_of(&format!("/proc/{init}/cgroup"))?.into_iter().collect();
    let mountinfo = read_mountinfo(init)?;
    let mut dirs = Vec::with_capacity(record.made.len());
    for made in &record.made {
        let unknown =
            |why: String| Error::Cgroup { path: format!("{}:{}", shown(&made.hierarchy), made.path), step: "find it".into(), error: io::Error::other(why) };
        let base = of_init.get(&made.hierarchy).ok_or_else(|| unknown("this machine has no such cgroup hierarchy".into()))?;
        let full = format!("{}/{}", base.trim_end_matches('/'), made.path);
        let dir = through_init(init, &directory(&mountinfo, &made.hierarchy, &full).map_err(unknown)?);
        let step = |step: String| {
            let path = format!("{}:{full}", shown(&made.hierarchy));
            move |error: io::Error| Error::Cgroup { path, step, error }
        };
        let existed = match std::fs::create_dir(&dir) {
            Ok(()) => false,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => true,
            Err(e) => return Err(step(format!("make {}", dir.display()))(e)),
        };
        // A cgroup already there is the job's own left behind, or one of others' that an
        // image names (forged, or restarted by root): its settings are changed only while
        // no process is in it or below it, so that they hold nothing but the job.
        let differs = |(file, value): &(String, String)| std::fs::read_to_string(dir.join(file)).map_or(true, |now| now.trim_end_matches('\n') != value);
        let in_use = existed && populated(&dir).map_err(step(format!("read {}", dir.display())))?;
        if in_use && made.settings.iter().any(differs) {
            return Err(step("change its settings".into())(io::Error::other("it holds processes that are not the job's")));
        }
        for (file, value) in &made.settings {
            let how = knobs_of(&made.hierarchy)
                .find(|(_, f, _)| f == file)
                .map(|k| k.2)
                .ok_or_else(|| Error::Forged { what: format!("the job's cgroup {}: a setting {file:?} ckpt does not keep", made.path) })?;
            write_setting(&dir, file, value, how).map_err(|(at, e)| step(format!("write {value:?} to {at}"))(e))?;
        }
        // Its owners and modes likewise: left as they are where others use it.
        if !in_use {
            write_access(&dir, &made.access).map_err(|(at, e)| step(format!("give {at} its owner and mode"))(e))?;
        }
        dirs.push(dir);
    }
    for placed in &record.placed {
        let host = host_pid_of(placed.pid).ok_or_else(|| Error::not_created(placed.pid))?;
        for &index in &placed.cgroups {
            let made = record
                .made
                .get(index as usize)
                .ok_or_else(|| Error::Forged { what: format!("pid {}: cgroup {index} of {}", placed.pid, record.made.len()) })?;
            let procs = dirs[index as usize].join("cgroup.procs");
            std::fs::write(&procs, host.to_string()).map_err(|error| Error::Cgroup {
                path: format!("{}:{}", shown(&made.hierarchy), made.path),
                step: format!("move pid {} into it ({})", placed.pid, procs.display()),
                error,
            })?;
        }
    }
    Ok(())
}

/// Whether a process is in the cgroup at `dir` or below it: v2's `cgroup.events` says; in v1
/// each cgroup's `cgroup.procs` is read (at most [`MAX_CGROUPS`] of them; more count as
/// populated).
fn populated(dir: &Path) -> io::Result<bool> {
    match std::fs::read_to_string(dir.join("cgroup.events")) {
        Ok(events) => return Ok(events.lines().any(|l| l == "populated 1")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut to_read = vec![dir.to_path_buf()];
    let mut read = 0;
    while let Some(at) = to_read.pop() {
        read += 1;
        if read > MAX_CGROUPS || !std::fs::read_to_string(at.join("cgroup.procs"))?.trim().is_empty() {
            return Ok(true);
        }
        for entry in std::fs::read_dir(&at)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                to_read.push(entry.path());
            }
        }
    }
    Ok(false)
}

/// Writes `value` of setting `file` into the cgroup at `dir` where it differs from what the
/// cgroup holds; on failure, the file written and the error.
fn write_setting(dir: &Path, file: &str, value: &str, how: Write) -> std::result::Result<(), (String, io::Error)> {
    let path = dir.join(file);
    let shown = |p: &Path| p.display().to_string();
    let now = std::fs::read_to_string(&path).map_err(|e| (shown(&path), e))?;
    let now = now.trim_end_matches('\n');
    if now == value {
        return Ok(());
    }
    let put = |path: &Path, text: &str| std::fs::write(path, text).map_err(|e| (shown(path), e));
    match how {
        Write::Whole => put(&path, value),
        Write::EachLine => value.lines().filter(|l| !l.trim().is_empty()).try_for_each(|line| put(&path, line)),
        Write::Controllers => {
            let asked: String = value.split_whitespace().map(|c| format!("+{c} ")).collect();
            put(&path, asked.trim_end())
        }
        Write::Threaded => match value {
            "threaded" => put(&path, "threaded"),
            _ => Ok(()),
        },
        Write::Devices => {
            put(&dir.join("devices.deny"), "a")?;
            value.lines().filter(|l| !l.trim().is_empty()).try_for_each(|line| put(&dir.join("devices.allow"), line))
        }
    }
}

impl CgroupsRecord {
    /// Keeps only the processes of `pids` (pids in the job): those the capture recorded.
    pub fn keep_only(&mut self, pids: &[Tid]) {
        self.placed.retain(|p| pids.contains(&p.pid));
    }
}

/// Checks the record against the image's processes `pids` (pids in the job): each cgroup a
/// plain relative path of its hierarchy with its parent before it, each setting one ckpt keeps,
/// each placed process a process of the image in cgroups of the record, one per hierarchy.
/// Pure.
pub fn validate(record: &CgroupsRecord, pids: &[Tid]) -> std::result::Result<(), String> {
    if record.made.len() > MAX_CGROUPS {
        return Err(format!("{} cgroups, more than {MAX_CGROUPS}", record.made.len()));
    }
    for (index, made) in record.made.iter().enumerate() {
        let place = format!("cgroup {index} ({:?})", made.path);
        if made.hierarchy.len() > MAX_HIERARCHY_LEN || made.hierarchy.contains(['/', ':', '\n', '\0']) {
            return Err(format!("{place}: hierarchy {:?} is not a hierarchy's name", made.hierarchy));
        }
        if made.path.len() > MAX_PATH_LEN || made.path.split('/').any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0') || c.len() > 255) {
            return Err(format!("{place}: not a plain relative path"));
        }
        if let Some((parent, _)) = made.path.rsplit_once('/') {
            if !record.made[..index].iter().any(|m| m.hierarchy == made.hierarchy && m.path == parent) {
                return Err(format!("{place}: its parent {parent:?} is not made before it"));
            }
        }
        if record.made[..index].iter().any(|m| m.hierarchy == made.hierarchy && m.path == made.path) {
            return Err(format!("{place}: twice"));
        }
        if made.access.changed.len() > MAX_CHANGED_FILES
            || made.access.dir.2 > 0o7777
            || made
                .access
                .changed
                .iter()
                .any(|(name, _, _, mode)| *mode > 0o7777 || name.is_empty() || name.len() > 255 || name.contains(['/', '\0']) || name == "." || name == "..")
        {
            return Err(format!("{place}: owners and modes that are not a cgroup's"));
        }
        if made.settings.len() > KNOBS.len() {
            return Err(format!("{place}: {} settings", made.settings.len()));
        }
        for (file, value) in &made.settings {
            if !knobs_of(&made.hierarchy).any(|(_, f, _)| f == file) {
                return Err(format!("{place}: a setting {file:?} ckpt does not keep for its hierarchy"));
            }
            if value.len() > MAX_SETTING_LEN || value.contains('\0') {
                return Err(format!("{place}: setting {file} of {} bytes", value.len()));
            }
        }
    }
    let mut seen = Vec::new();
    for placed in &record.placed {
        if !pids.contains(&placed.pid) || seen.contains(&placed.pid) {
            return Err(format!("pid {} placed, not a process of the image or placed twice", placed.pid));
        }
        seen.push(placed.pid);
        let mut hierarchies = Vec::new();
        for &index in &placed.cgroups {
            let made = record.made.get(index as usize).ok_or_else(|| format!("pid {} in cgroup {index} of {}", placed.pid, record.made.len()))?;
            if hierarchies.contains(&&made.hierarchy) {
                return Err(format!("pid {} in two cgroups of one hierarchy", placed.pid));
            }
            hierarchies.push(&made.hierarchy);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mountinfo() -> Vec<super::super::mounts::MountInfo> {
        super::super::mounts::parse_mountinfo(
            "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
             33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpuacct,cpu\n\
             40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n\
             41 31 0:38 /slurm /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
        )
        .unwrap()
    }

    #[test]
    fn a_hierarchy_is_found_by_its_controllers_or_name_and_paths_through_its_mount_root() {
        let m = mountinfo();
        assert_eq!(directory(&m, "cpu", "/a/b").unwrap(), Path::new("/sys/fs/cgroup/cpu/a/b"));
        assert_eq!(directory(&m, "cpu,cpuacct", "/").unwrap(), Path::new("/sys/fs/cgroup/cpu,cpuacct/"));
        assert_eq!(directory(&m, "name=systemd", "/x").unwrap(), Path::new("/sys/fs/cgroup/systemd/x"));
        assert_eq!(directory(&m, "", "/slurm/job_1/step").unwrap(), Path::new("/sys/fs/cgroup/unified/job_1/step"));
        assert!(directory(&m, "", "/other").unwrap_err().contains("does not hold /other"));
        assert!(directory(&m, "memory", "/").unwrap_err().contains("not mounted where the job sees"));
    }

    #[test]
    fn a_path_is_below_its_base_only_at_a_component_boundary() {
        assert_eq!(below("/a/b", "/a"), Some("b"));
        assert_eq!(below("/a/b/c", "/"), Some("a/b/c"));
        assert_eq!(below("/a", "/a"), Some(""));
        assert_eq!(below("/ab", "/a"), None);
        assert_eq!(below("/b", "/a"), None);
        assert_eq!(parse_cgroup_file("4:memory:/x\n0::/y:z\n"), vec![("memory".into(), "/x".into()), ("".into(), "/y:z".into())]);
    }

    #[test]
    fn the_settings_kept_are_the_hierarchys_own() {
        let v2: Vec<_> = knobs_of("").map(|k| k.1).collect();
        assert!(v2.contains(&"memory.max") && !v2.contains(&"memory.limit_in_bytes"));
        let v1: Vec<_> = knobs_of("cpu,cpuacct").map(|k| k.1).collect();
        assert_eq!(v1, ["cpu.shares", "cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.idle"]);
        assert_eq!(knobs_of("name=systemd").count(), 0);
    }

    fn record() -> CgroupsRecord {
        CgroupsRecord {
            made: vec![
                MadeCgroup { hierarchy: "pids".into(), path: "a".into(), settings: vec![("pids.max".into(), "10".into())], access: CgroupAccess::default() },
                MadeCgroup { hierarchy: "pids".into(), path: "a/b".into(), settings: vec![], access: CgroupAccess::default() },
                MadeCgroup { hierarchy: "".into(), path: "a".into(), settings: vec![("memory.max".into(), "max".into())], access: CgroupAccess::default() },
            ],
            placed: vec![Placed { pid: 2, cgroups: vec![1, 2] }],
        }
    }

    #[test]
    fn a_record_is_checked_against_forged_paths_settings_and_pids() {
        assert_eq!(validate(&record(), &[1, 2]), Ok(()));
        let forged = |change: &dyn Fn(&mut CgroupsRecord)| {
            let mut r = record();
            change(&mut r);
            validate(&r, &[1, 2]).unwrap_err()
        };
        assert!(forged(&|r| r.made[1].path = "a/../../etc".into()).contains("not a plain relative path"));
        assert!(forged(&|r| r.made[1].path = "/a/b".into()).contains("not a plain relative path"));
        assert!(forged(&|r| r.made[1].path = "c/b".into()).contains("is not made before it"));
        assert!(forged(&|r| r.made[0].settings.push(("release_agent".into(), "/tmp/x".into()))).contains("does not keep"));
        assert!(forged(&|r| r.made[0].settings.push(("memory.max".into(), "1".into()))).contains("does not keep"));
        assert!(forged(&|r| r.made[0].hierarchy = "../pids".into()).contains("not a hierarchy's name"));
        assert!(forged(&|r| r.placed[0].pid = 7).contains("not a process of the image"));
        assert!(forged(&|r| r.made[0].access.changed.push(("../../etc/passwd".into(), 0, 0, 0o644))).contains("not a cgroup's"));
        assert!(forged(&|r| r.made[0].access.dir.2 = 0o100755).contains("not a cgroup's"));
        assert!(forged(&|r| r.placed[0].cgroups = vec![3]).contains("cgroup 3 of 3"));
        assert!(forged(&|r| r.placed[0].cgroups = vec![0, 1]).contains("two cgroups of one hierarchy"));
    }

    /// Settings are written only where the cgroup holds another value, each in its own way.
    #[test]
    fn a_setting_is_written_where_it_differs_in_its_own_way() {
        let dir = std::env::temp_dir().join(format!("ckpt-cgroups-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        file("pids.max", "max\n");
        write_setting(&dir, "pids.max", "max", Write::Whole).unwrap();
        assert_eq!(read("pids.max"), "max\n", "the same value is not written");
        write_setting(&dir, "pids.max", "12", Write::Whole).unwrap();
        assert_eq!(read("pids.max"), "12");
        file("cgroup.subtree_control", "");
        write_setting(&dir, "cgroup.subtree_control", "cpu memory", Write::Controllers).unwrap();
        assert_eq!(read("cgroup.subtree_control"), "+cpu +memory");
        file("cgroup.type", "domain\n");
        write_setting(&dir, "cgroup.type", "domain threaded", Write::Threaded).unwrap();
        assert_eq!(read("cgroup.type"), "domain\n", "only threaded is asked for");
        file("devices.list", "a *:* rwm\n");
        write_setting(&dir, "devices.list", "c 1:3 rwm\nc 1:5 r", Write::Devices).unwrap();
        // A plain file keeps the last write: the last line allowed after everything denied.
        assert_eq!((read("devices.deny"), read("devices.allow")), ("a".to_string(), "c 1:5 r".to_string()));
        let missing = write_setting(&dir, "cpu.max", "1000 100000", Write::Whole).unwrap_err();
        assert!(missing.0.ends_with("cpu.max") && missing.1.kind() == io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A cgroup taken as it is found is populated when a process is in it or below it.
    #[test]
    fn a_cgroup_is_populated_by_a_process_in_it_or_below() {
        let dir = std::env::temp_dir().join(format!("ckpt-cgroups-populated-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        for at in ["", "sub", "sub/deeper"] {
            std::fs::write(dir.join(at).join("cgroup.procs"), "").unwrap();
        }
        assert!(!populated(&dir).unwrap());
        std::fs::write(dir.join("sub/deeper/cgroup.procs"), "4242\n").unwrap();
        assert!(populated(&dir).unwrap());
        // v2 says it of the whole subtree.
        std::fs::write(dir.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert!(!populated(&dir).unwrap());
        std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(populated(&dir).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
