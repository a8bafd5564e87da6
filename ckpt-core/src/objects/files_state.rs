//! The state of the job's files at the checkpoint, so that a restart never brings old memory back
//! over newer files without saying so (docs/USER-GUIDE.md, "Files at restart").
//!
//! Memory comes back as it was at the checkpoint; files are as the job (or anyone) left them
//! after it. A program that keeps data in files (a database, a simulation writing its output in
//! place) would then run with memory and files from two different moments: silent corruption.
//! So every checkpoint records, while the job is frozen:
//!
//! - every regular file some process has open or maps: identity (device, inode), size, mtime and
//!   ctime, and whether the job writes it only at its end (every descriptor open for writing on it
//!   is `O_APPEND` or at the end of the file, and no process maps it shared and writable);
//! - one level of every directory holding a file open for writing (the directories the job writes
//!   to): each entry's name, kind, inode, size, mtime and ctime; but not the files another
//!   program writes there ([`written_by_others`]: the user's other JVMs' counters, an editor's
//!   swap file), which are that program's state.
//!
//! At restart, before any process exists, [`check`] compares that record with the disk. A file
//! written only at its end that only grew is cut back to its checkpoint size (the job writes the
//! rest again: logs and output files). Any other difference in a file the job held (changed in
//! place, shrunk, replaced, gone) refuses the restart with the file named and what changed.
//! Only what the job held decides: entries of a listed directory that the job did not hold,
//! created, removed or replaced after the checkpoint, are the output a restarted job writes
//! again (a file a step) or what others did beside it, and are listed in one warning; only
//! the changes of such entries that a restarted job would read back refuse ([`entry_refuses`]:
//! a file written in place, such as PostgreSQL's pg_control; a companion of a held file, such
//! as a WAL, created since).
//! Nothing refuses for a file under a protected root ([`super::protect`], which puts it back),
//! and `--keep-files` takes the files as they are.
//!
//! Not covered, and why: directories the job writes to without holding a file open for writing at
//! the checkpoint (the kernel keeps no trace of a file opened and closed before; `--protect DIR`
//! covers those), subdirectories of listed directories (one level: listing a whole tree would make
//! the freeze grow with it), contents changed without size, mtime or ctime changing (only
//! possible by resetting the clock), and files under /proc, /sys and /dev (kernel objects).

use crate::objects::mounts::MountsRecord;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::descriptor::FdKind;
use super::memory::Backing;
use super::protect::RootState;
use super::ProcessRecord;
use crate::error::{Context, Error, Result};
use crate::image::{self, FileEntry};

pub const FILES_FILE: &str = "files.bin";
pub const FILES_MAGIC: [u8; 8] = *b"CKPTFILE";
/// Bound on what reading a files record may allocate.
const FILES_MAX: u64 = 256 << 20;

/// What a directory entry is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A socket, FIFO or device node: recorded, never copied.
    Other,
}

/// What `lstat` says of a file, as far as telling a change goes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification and status-change times, (seconds, nanoseconds).
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Stat {
    pub fn of(meta: &std::fs::Metadata) -> Stat {
        let ft = meta.file_type();
        let kind = if ft.is_file() {
            Kind::File
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_symlink() {
            Kind::Symlink
        } else {
            Kind::Other
        };
        Stat {
            kind,
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        }
    }

    /// The same from a raw `stat` (the `*at` calls of [`crate::sys::beneath`]).
    pub fn of_raw(st: &libc::stat) -> Stat {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        };
        Stat {
            kind,
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
        }
    }

    /// `lstat(path)`: the entry itself, never what a symlink points to.
    pub fn lstat(path: &Path) -> std::io::Result<Stat> {
        std::fs::symlink_metadata(path).map(|m| Stat::of(&m))
    }

    /// Whether the contents may differ: another inode, size, mtime or ctime (pure).
    pub fn same_contents(&self, other: &Stat) -> bool {
        (self.kind, self.dev, self.ino, self.size, self.mtime, self.ctime) == (other.kind, other.dev, other.ino, other.size, other.mtime, other.ctime)
    }

    /// What differs, in words, for a refusal (pure).
    pub fn describe_change(&self, now: &Stat) -> String {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            return "was replaced by another file (different inode)".into();
        }
        if self.kind != now.kind {
            return format!("was a {:?} and is now a {:?}", self.kind, now.kind);
        }
        let mut what = Vec::new();
        if self.size != now.size {
            what.push(format!("size {} -> {} bytes", self.size, now.size));
        }
        if self.mtime != now.mtime {
            what.push(format!("modified at {} (after the checkpoint)", unix_time(now.mtime)));
        } else if self.ctime != now.ctime {
            what.push(format!("status changed at {}", unix_time(now.ctime)));
        }
        format!("changed since the checkpoint ({})", what.join(", "))
    }
}

fn unix_time((s, ns): (i64, i64)) -> String {
    format!("{s}.{:03} (Unix time)", ns / 1_000_000)
}

/// A file some process of the job has open or maps.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WatchedFile {
    pub path: String,
    pub stat: Stat,
    /// Open for writing (or mapped shared and writable) by some process.
    pub writable: bool,
    /// Written only at its end: every descriptor open for writing is O_APPEND or at the end of
    /// the file, and no shared writable mapping. A growth of such a file is taken as appended
    /// output, cut back at restart.
    pub append_only: bool,
    /// For a file mapped shared and writable: the crc32c of its contents (up to
    /// [`MAX_SUMMED`] bytes). A write through such a mapping changes the file without
    /// changing its mtime (the kernel updates mtime only when a clean page is first written),
    /// so mtime cannot tell; the contents can.
    pub crc: Option<u32>,
}

/// Largest file mapped shared and writable whose contents are summed at a checkpoint; a larger
/// one is compared by size, mtime and ctime only (docs/USER-GUIDE.md says so).
pub const MAX_SUMMED: u64 = 64 << 20;

/// crc32c of a whole file, or None when it is larger than [`MAX_SUMMED`] or unreadable.
pub fn sum(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut f = super::file::open_regular(path.to_str()?, false, None).ok()?;
    if f.metadata().ok()?.len() > MAX_SUMMED {
        return None;
    }
    let mut b = Vec::new();
    f.read_to_end(&mut b).ok()?;
    Some(crc32c::crc32c(&b))
}

/// One level of a directory the job writes to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DirListing {
    pub dir: String,
    pub entries: Vec<(String, Stat)>,
    /// In a directory shared by everyone (sticky and world-writable, as /tmp), only the entries
    /// of these owners (those of the job's files open for writing there) count: what other
    /// users create there is not the job's state.
    pub owners: Option<Vec<u32>>,
}

impl DirListing {
    /// Whether an entry counts for this listing (pure).
    pub fn counts(&self, st: &Stat) -> bool {
        self.owners.as_ref().is_none_or(|o| o.contains(&st.uid))
    }
}

/// `<node>/files.bin`: the node's files at the checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FilesRecord {
    pub watched: Vec<WatchedFile>,
    pub listings: Vec<DirListing>,
    /// `(dev, ino)` of files whose changes are expected and not the job's state: the image
    /// directory and the launcher's stdio. Left out of listings, at capture and at restart.
    pub ignored: Vec<(u64, u64)>,
    /// Protected roots (`--protect`, `--save-files`) and their state.
    pub protected: Vec<RootState>,
    /// The boot of the checkpoint (/proc/sys/kernel/random/boot_id): a restart in another one
    /// judges the files the job only reads by their contents ([`super::identity::Place`]).
    /// Since format 21 ("" before: taken as the restart's own boot).
    #[serde(deserialize_with = "crate::image::since::since::<21, _, _>")]
    pub boot_id: String,
    /// The contents of the files the job only reads, by (device, inode) at the checkpoint.
    /// Since format 21 (none before).
    #[serde(deserialize_with = "crate::image::since::since::<21, _, _>")]
    pub identities: Vec<super::identity::FileIdentity>,
}

impl FilesRecord {
    pub fn write(&self, node_dir: &Path) -> std::result::Result<FileEntry, image::ImageError> {
        image::write_record_file(&node_dir.join(FILES_FILE), FILES_MAGIC, self)
    }

    /// Reads and validates (`validate::files_record`) a node's files record.
    pub fn read(node_dir: &Path) -> std::result::Result<FilesRecord, image::ImageError> {
        let path = node_dir.join(FILES_FILE);
        let rec: FilesRecord = image::read_record_file(&path, FILES_MAGIC, FILES_MAX)?;
        crate::validate::files_record(&rec).map_err(|e| e.in_file(&path))?;
        Ok(rec)
    }

    /// A files record's whole contents, checked, decoded and validated as [`FilesRecord::read`]
    /// does with the file (`path` is for messages only): for the fuzz target and tests.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> std::result::Result<FilesRecord, image::ImageError> {
        let rec: FilesRecord = image::record::decode_record(bytes, path, FILES_MAGIC, FILES_MAX)?;
        crate::validate::files_record(&rec).map_err(|e| e.in_file(path))?;
        Ok(rec)
    }

    /// Whether `path` lies under a protected root (which the restart puts back itself).
    pub fn is_protected(&self, path: &str) -> bool {
        self.protected.iter().any(|r| under(path, &r.root))
    }
}

/// Whether `path` is `root` or below it (pure).
pub fn under(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    path == root || (path.starts_with(root) && path.as_bytes().get(root.len()) == Some(&b'/')) || root.is_empty()
}

/// Kernel file systems: their files are kernel objects, not data.
fn is_kernel_path(path: &str) -> bool {
    ["/proc", "/sys", "/dev"].iter().any(|r| under(path, r)) && !under(path, "/dev/shm")
}

/// A file the job uses, merged over every descriptor and mapping: (path, dev, ino) -> (writable,
/// append_only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub writable: bool,
    pub append_only: bool,
    /// Mapped shared and writable by some process: written without its mtime changing.
    pub mapped_writable: bool,
}

/// The in-memory files whose contents the image holds (tmpfs files mapped shared, which memory
/// restore writes back), by device and inode (pure).
pub fn saved_in_image(processes: &[ProcessRecord]) -> HashSet<(u64, u64)> {
    processes.iter().flat_map(|p| &p.vmas).filter_map(super::memory::saved_file).map(|(_, dev, ino)| (dev, ino)).collect()
}

/// Every regular file or directory the job has open or maps, once each (pure). Files whose
/// contents the image holds (tmpfs files mapped shared, which memory restore writes back) and
/// kernel files are left out.
pub fn uses(processes: &[ProcessRecord], mounts: &MountsRecord) -> Vec<Use> {
    let saved = saved_in_image(processes);
    let mut out: Vec<Use> = Vec::new();
    let mut add = |ns: usize, path: &str, dev: u64, ino: u64, writable: bool, append_only: bool, mapped_writable: bool| {
        if is_kernel_path(path) || saved.contains(&(dev, ino)) {
            return;
        }
        // Where it is on the host; a file of the job's own mounts (a tmpfs the image holds)
        // is the image's, nothing to watch.
        let Some(path) = mounts.host_path(ns, path) else { return };
        let path = path.as_str();
        match out.iter_mut().find(|u| (u.dev, u.ino) == (dev, ino)) {
            Some(u) => {
                u.writable |= writable;
                u.append_only &= append_only;
                u.mapped_writable |= mapped_writable;
            }
            None => out.push(Use { path: path.to_string(), dev, ino, writable, append_only, mapped_writable }),
        }
    };
    for p in processes {
        let ns = mounts.namespace_of(p.pid);
        for rec in &p.fds {
            if let FdKind::File(super::file::FileRecord { path, dev, ino, size }) = &rec.kind {
                let w = rec.writable();
                let at_end = rec.flags & libc::O_APPEND as u32 != 0 || rec.pos >= *size;
                add(ns, path, *dev, *ino, w, !w || at_end, false);
            }
        }
        for v in &p.vmas {
            if let Backing::File { path, dev, ino, saved: None, .. } = &v.backing {
                let w = v.shared && v.prot & libc::PROT_WRITE as u32 != 0;
                add(ns, path, *dev, *ino, w, !w, w);
            }
        }
    }
    out
}

/// The directories the job writes to: those of files open for writing (pure).
pub fn written_dirs(uses: &[Use]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    for u in uses.iter().filter(|u| u.writable) {
        if let Some(parent) = Path::new(&u.path).parent() {
            let d = parent.to_string_lossy().into_owned();
            if !d.is_empty() && !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// One level of `dir`, without the ignored files and without sockets (a bound socket's file is
/// made again by the restart). Entries sorted by name.
pub fn list(dir: &str, ignored: &[(u64, u64)]) -> Result<Vec<(String, Stat)>> {
    let mut entries = Vec::new();
    for e in std::fs::read_dir(dir).context(|| format!("list {dir}"))? {
        let e = e.context(|| format!("list {dir}"))?;
        let Ok(meta) = e.metadata() else { continue }; // removed meanwhile
        if meta.file_type().is_socket() || ignored.contains(&(meta.dev(), meta.ino())) {
            continue;
        }
        entries.push((e.file_name().to_string_lossy().into_owned(), Stat::of(&meta)));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(entries)
}

/// Of `candidates` (entries of directories the job writes to that the job does not hold), the
/// files some other process holds open for writing or maps shared and writable: another
/// program's files beside the job's (the counters of the user's other JVMs in
/// /tmp/hsperfdata_USER, an editor's swap file beside the output it edits). Their changes are
/// that program's, not the job's, so a restart does not refuse them. Only processes owned by the
/// candidates' owners are looked at, and only those this user may look into; nothing is read
/// when there are no candidates (the usual case: the job's directories hold its own files).
/// At a checkpoint no process of the job holds a candidate, and at a restart the job has none:
/// whoever holds one is another program. `job`: the job's processes (host pids), which are not
/// looked into (frozen, they hold no candidate; an MPI rank maps some 400 pieces of files, and
/// the 33 processes of a 32-rank job made this 26 ms of its freeze).
pub fn written_by_others(candidates: &[Stat], job: &HashSet<i32>) -> HashSet<(u64, u64)> {
    let mut found = HashSet::new();
    let wanted: HashSet<(u64, u64)> = candidates.iter().filter(|s| s.kind == Kind::File).map(|s| (s.dev, s.ino)).collect();
    if wanted.is_empty() {
        return found;
    }
    let owners: HashSet<u32> = candidates.iter().map(|s| s.uid).collect();
    let t = std::time::Instant::now();
    let Ok(processes) = procfs::process::all_processes() else { return found };
    let mut looked = 0;
    for p in processes.flatten() {
        if job.contains(&p.pid) || !p.uid().is_ok_and(|uid| owners.contains(&uid)) {
            continue;
        }
        looked += 1;
        let fd_dir = format!("/proc/{}/fd", p.pid);
        for e in std::fs::read_dir(&fd_dir).into_iter().flatten().flatten() {
            // The link's own mode is the open file's access mode (l-wx, lrwx: open for writing).
            let writing = e.metadata().is_ok_and(|m| m.mode() & 0o200 != 0);
            if let (true, Ok(target)) = (writing, std::fs::metadata(e.path())) {
                if wanted.contains(&(target.dev(), target.ino())) {
                    found.insert((target.dev(), target.ino()));
                }
            }
        }
        for m in p.maps().into_iter().flatten() {
            if !m.perms.contains(procfs::process::MMPermissions::SHARED | procfs::process::MMPermissions::WRITE) {
                continue;
            }
            let key = (libc::makedev(m.dev.0 as u32, m.dev.1 as u32), m.inode);
            // The device a mapping shows can differ from what stat says of its file (a btrfs
            // subvolume, an overlay's upper file): then its path decides.
            let key = match (&m.pathname, wanted.contains(&key)) {
                (_, true) => Some(key),
                (procfs::process::MMapPath::Path(path), false) => std::fs::metadata(path).ok().map(|s| (s.dev(), s.ino())).filter(|k| wanted.contains(k)),
                _ => None,
            };
            found.extend(key);
        }
    }
    tracing::debug!(
        candidates = wanted.len(),
        processes = looked,
        found = found.len(),
        ms = t.elapsed().as_secs_f64() * 1e3,
        "other programs' files beside the job's"
    );
    found
}

/// Records the files of a frozen job, whose processes are `job` (host pids). `ignored`: the
/// image directory, the launcher's stdio.
pub fn capture(processes: &[ProcessRecord], job: &[i32], mounts: &MountsRecord, ignored: Vec<(u64, u64)>) -> Result<FilesRecord> {
    let uses = uses(processes, mounts);
    let mut watched = Vec::new();
    for u in &uses {
        let Ok(stat) = Stat::lstat(Path::new(&u.path)) else { continue }; // gone: the fd's own check names it
        if (stat.dev, stat.ino) != (u.dev, u.ino) || stat.kind == Kind::Dir {
            continue; // the path names another file now (the fd's own check); a directory changes with its entries
        }
        let crc = if u.mapped_writable { sum(Path::new(&u.path)) } else { None };
        watched.push(WatchedFile { path: u.path.clone(), stat, writable: u.writable, append_only: u.append_only, crc });
    }
    let mut ignored = ignored;
    let mut listings = Vec::new();
    for dir in written_dirs(&uses) {
        let shared = Stat::lstat(Path::new(&dir)).is_ok_and(|s| s.mode & 0o1002 == 0o1002);
        let owners = shared.then(|| {
            let mut o: Vec<u32> = watched.iter().filter(|w| w.writable && Path::new(&w.path).parent() == Some(Path::new(&dir))).map(|w| w.stat.uid).collect();
            o.sort_unstable();
            o.dedup();
            o
        });
        match list(&dir, &ignored) {
            Ok(entries) => {
                let mut l = DirListing { entries, dir, owners };
                let kept: Vec<(String, Stat)> = l.entries.iter().filter(|(_, s)| l.counts(s)).cloned().collect();
                l.entries = kept;
                listings.push(l)
            }
            // A directory the agent may not read (write and search permission only): its files
            // open for writing are still watched one by one.
            Err(e) => tracing::warn!(dir, "cannot list a directory the job writes to; its other files are not checked at restart: {e}"),
        }
    }
    let job_files: HashSet<(u64, u64)> = uses.iter().map(|u| (u.dev, u.ino)).collect();
    let candidates: Vec<Stat> = listings.iter().flat_map(|l| &l.entries).map(|(_, s)| *s).filter(|s| !job_files.contains(&(s.dev, s.ino))).collect();
    let others = written_by_others(&candidates, &job.iter().copied().collect());
    if !others.is_empty() {
        for l in &mut listings {
            l.entries.retain(|(_, s)| !others.contains(&(s.dev, s.ino)));
        }
        ignored.extend(others);
    }
    Ok(FilesRecord { watched, listings, ignored, protected: Vec::new(), boot_id: super::identity::boot_id(), identities: Vec::new() })
}

/// What the restart must do to a watched file, or why it refuses (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Same,
    /// Grew and is written only at its end: cut back to this size.
    CutBack(u64),
    Changed(String),
}

/// Compares a watched file with what is on disk now (pure): `crc_now` is the sum of its
/// contents now, for a file that has a sum in the record.
pub fn judge(w: &WatchedFile, now: Option<&Stat>, crc_now: Option<u32>) -> Verdict {
    let Some(now) = now else { return Verdict::Changed("is gone".into()) };
    if w.crc.is_some() && w.stat.size == now.size && (w.stat.dev, w.stat.ino) == (now.dev, now.ino) {
        return if crc_now == w.crc {
            Verdict::Same
        } else {
            Verdict::Changed("changed since the checkpoint (its contents differ: it is mapped shared and writable)".into())
        };
    }
    if w.stat.same_contents(now) {
        return Verdict::Same;
    }
    if (w.stat.dev, w.stat.ino) == (now.dev, now.ino) && w.writable && w.append_only && now.size > w.stat.size {
        return Verdict::CutBack(w.stat.size);
    }
    Verdict::Changed(w.stat.describe_change(now))
}

/// How an entry of a listed directory that no process of the job held differs from the
/// checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryChange {
    /// A name that was not there: a file the job (or anyone) made after the checkpoint.
    Created,
    /// A name that is gone.
    Removed,
    /// The name now names another file (a new inode: written elsewhere and renamed there, or
    /// removed and made again).
    Replaced,
    /// The same file, written in place: what changed, in words.
    Written(String),
}

impl EntryChange {
    /// What happened, in one word, for the warning of [`left_as_they_are`].
    fn word(&self) -> &'static str {
        match self {
            EntryChange::Created => "created",
            EntryChange::Removed => "removed",
            EntryChange::Replaced => "replaced",
            EntryChange::Written(_) => "written",
        }
    }
}

/// The differences between a listing at the checkpoint and now (pure). Entries in `skip` (files
/// watched on their own, which the job held) are left out; a subdirectory counts by its identity
/// only (its own entries are not listed).
pub fn diff_listing(old: &[(String, Stat)], now: &[(String, Stat)], skip: &HashSet<(u64, u64)>) -> Vec<(String, EntryChange)> {
    let before: HashMap<&str, &Stat> = old.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let after: HashMap<&str, &Stat> = now.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let mut out = Vec::new();
    for (name, s) in old {
        if skip.contains(&(s.dev, s.ino)) {
            continue;
        }
        match after.get(name.as_str()) {
            None => out.push((name.clone(), EntryChange::Removed)),
            Some(n) if (s.dev, s.ino) != (n.dev, n.ino) || s.kind != n.kind => out.push((name.clone(), EntryChange::Replaced)),
            // A subdirectory changes with its own entries (not listed); a FIFO's times change
            // with every write through it (its bytes are the FIFO module's): identity only.
            Some(_) if matches!(s.kind, Kind::Dir | Kind::Other) => {}
            Some(n) if !s.same_contents(n) => out.push((name.clone(), EntryChange::Written(s.describe_change(n)))),
            Some(_) => {}
        }
    }
    for (name, s) in now {
        if !before.contains_key(name.as_str()) && !skip.contains(&(s.dev, s.ino)) {
            out.push((name.clone(), EntryChange::Created));
        }
    }
    out
}

/// Whether an entry the job did not hold must still stop the restart (pure): `held` are the
/// names of the files of the same directory that the job held.
///
/// Only what the job held decides, with two exceptions, each a change that a restarted job
/// would read back rather than make again, and run silently wrong:
/// - a file written in place after the checkpoint: a program keeps state in files it opens and
///   closes (PostgreSQL's `global/pg_control`, rewritten in place and not held open: a restart
///   over it comes back mixed and hangs), or appends to a file it opens and closes each step
///   (the restarted job appends the same lines twice);
/// - a file created after the checkpoint whose name is that of a file the job held followed by
///   `-` or `.` (`data.db-wal`, `data.db-journal`, `state.lock`): the companion of a file the
///   job uses (a write-ahead log, a journal), which the job's library reads when it next opens
///   it: SQLite would replay the commits the job then makes again.
///
/// A file created, removed or replaced otherwise is output the restarted job writes again (one
/// file a step, an atomic rename of a new version) or what others did beside it: listed in a
/// warning, not refused.
pub fn entry_refuses(name: &str, change: &EntryChange, held: &[&str]) -> Option<String> {
    match change {
        EntryChange::Written(what) => Some(format!(
            "{what}, though no process of the job had it open at the checkpoint: a file the job keeps state in (read back at restart) or appends to (written twice)"
        )),
        EntryChange::Created => held
            .iter()
            .find(|h| name.strip_prefix(**h).is_some_and(|rest| rest.starts_with(['-', '.'])))
            .map(|h| format!("was created after the checkpoint beside {h}, which the job had open: a companion of it (a journal, a write-ahead log, a lock) that the restarted job would read back")),
        EntryChange::Removed | EntryChange::Replaced => None,
    }
}

/// At most this many names in the warning about entries left as they are.
const NAMED_IN_WARNING: usize = 8;

/// One line for the entries the restart leaves as they are (pure): what happened to each, the
/// first few named.
pub fn left_as_they_are(left: &[(String, EntryChange)]) -> String {
    let mut by_kind: Vec<(&str, Vec<&str>)> = Vec::new();
    for (path, change) in left {
        match by_kind.iter_mut().find(|(k, _)| *k == change.word()) {
            Some((_, paths)) => paths.push(path),
            None => by_kind.push((change.word(), vec![path])),
        }
    }
    let parts: Vec<String> = by_kind
        .iter()
        .map(|(kind, paths)| {
            let mut named = paths.iter().take(NAMED_IN_WARNING).copied().collect::<Vec<_>>().join(", ");
            if paths.len() > NAMED_IN_WARNING {
                named.push_str(&format!(" and {} more", paths.len() - NAMED_IN_WARNING));
            }
            format!("{} {kind} ({named})", paths.len())
        })
        .collect();
    let (entries, are) = if left.len() == 1 { ("entry", "is") } else { ("entries", "are") };
    format!(
        "{} {entries} of the directories the job writes to, which no process of the job had open at the checkpoint, changed after it and {are} left as they are (the job makes its output again as it runs on): {}",
        left.len(),
        parts.join("; ")
    )
}

/// Whether restart takes changed files as they are (`--keep-files`) or refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    Refuse,
    Keep,
}

/// Checks the node's files against the record (outside protected roots), before any process
/// exists: refuses the first difference (naming the file and what changed), or with
/// [`Changed::Keep`] logs it; then cuts back grown output files. `ignored_now`: files of the
/// restart itself (its stdio) that may have appeared in a listed directory.
///
/// `place`: on another boot ([`super::identity::Place`]) the record's devices are first given
/// their numbers of this boot ([`renumbered`]), and a file the job only reads whose contents are
/// recorded is left to the checks where it is held, which judge them.
pub fn check(rec: &FilesRecord, changed: Changed, ignored_now: &[(u64, u64)], place: &super::identity::Place) -> Result<()> {
    let renumbered_rec;
    let rec = if place.is_elsewhere() {
        renumbered_rec = renumbered(rec);
        &renumbered_rec
    } else {
        rec
    };
    // `held`: a file the job held (its refusal says so), else an entry beside them.
    let refuse_or_keep = |path: String, problem: String, held: bool| -> Result<()> {
        match changed {
            Changed::Refuse if held => Err(Error::FileChanged { path, problem }),
            Changed::Refuse => Err(Error::EntryChanged { path, problem }),
            Changed::Keep => {
                tracing::warn!(path, "{problem}; kept as it is (--keep-files)");
                Ok(())
            }
        }
    };
    let refuse = |path, problem| refuse_or_keep(path, problem, true);
    let refuse_entry = |path, problem| refuse_or_keep(path, problem, false);
    let mut cut = Vec::new();
    for w in rec.watched.iter().filter(|w| !rec.is_protected(&w.path)) {
        let now = Stat::lstat(Path::new(&w.path)).ok();
        if place.is_elsewhere() && !w.writable && place.knows((w.stat.dev, w.stat.ino)) {
            continue;
        }
        let crc_now = w.crc.and_then(|_| sum(Path::new(&w.path)));
        match judge(w, now.as_ref(), crc_now) {
            Verdict::Same => {}
            Verdict::CutBack(size) => cut.push((w.path.clone(), (w.stat.dev, w.stat.ino), size)),
            Verdict::Changed(problem) => refuse(w.path.clone(), problem)?,
        }
    }
    let mut skip: HashSet<(u64, u64)> = rec.watched.iter().map(|w| (w.stat.dev, w.stat.ino)).collect();
    skip.extend(rec.ignored.iter().chain(ignored_now).copied());
    let mut left = Vec::new();
    for l in rec.listings.iter().filter(|l| !rec.is_protected(&l.dir)) {
        let gone = std::fs::symlink_metadata(&l.dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        let now = match list(&l.dir, &[]) {
            Ok(now) => now.into_iter().filter(|(_, s)| l.counts(s)).collect::<Vec<_>>(),
            // The directory itself is gone: its entries are as any the job did not hold (the
            // files in it the job held were judged on their own above).
            Err(_) if gone => Vec::new(),
            Err(e) => {
                refuse_entry(l.dir.clone(), format!("a directory the job was writing to cannot be listed ({e})"))?;
                continue;
            }
        };
        let dir = l.dir.trim_end_matches('/');
        let held: Vec<&str> = rec.watched.iter().filter_map(|w| w.path.strip_prefix(dir)?.strip_prefix('/')).filter(|n| !n.contains('/')).collect();
        for (name, change) in diff_listing(&l.entries, &now, &skip) {
            let path = format!("{dir}/{name}");
            match entry_refuses(&name, &change, &held) {
                Some(problem) => refuse_entry(path, problem)?,
                None => left.push((path, change)),
            }
        }
    }
    if !left.is_empty() {
        tracing::warn!("{}", left_as_they_are(&left));
    }
    if changed == Changed::Refuse {
        for (path, identity, size) in cut {
            super::file::cut_back(&path, identity, size)?;
        }
    }
    Ok(())
}

/// The record with each device number it holds replaced by the number the same file system has
/// in this boot: learned from the files and entries whose path holds the same inode (of the same
/// kind) now. Devices are numbered at each boot (a network file system, an overlay, a btrfs
/// subvolume get an anonymous one), so a file system both machines share keeps its inodes under
/// another device number. A device no path tells of stays as it was.
pub fn renumbered(rec: &FilesRecord) -> FilesRecord {
    let mut map: HashMap<u64, u64> = HashMap::new();
    let mut learn = |st: &Stat, path: &Path| {
        if map.contains_key(&st.dev) {
            return;
        }
        if let Ok(now) = Stat::lstat(path) {
            if (now.ino, now.kind) == (st.ino, st.kind) {
                map.insert(st.dev, now.dev);
            }
        }
    };
    for w in &rec.watched {
        learn(&w.stat, Path::new(&w.path));
    }
    for l in &rec.listings {
        for (name, st) in &l.entries {
            learn(st, &Path::new(&l.dir).join(name));
        }
    }
    let dev = |d: u64| map.get(&d).copied().unwrap_or(d);
    let mut out = rec.clone();
    for w in &mut out.watched {
        w.stat.dev = dev(w.stat.dev);
    }
    for l in &mut out.listings {
        for (_, st) in &mut l.entries {
            st.dev = dev(st.dev);
        }
    }
    for (d, _) in &mut out.ignored {
        *d = dev(*d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(ino: u64, size: u64, mtime: i64) -> Stat {
        Stat { kind: Kind::File, dev: 1, ino, size, mtime: (mtime, 0), ctime: (mtime, 0), mode: 0o644, uid: 0, gid: 0 }
    }

    /// Files this process writes (a descriptor open for writing, a shared writable mapping whose
    /// descriptor is closed) are found; one it only reads, or that nobody holds, is not.
    #[test]
    fn files_other_programs_write_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, [0u8; 4096]).unwrap();
            p
        };
        let (written, mapped, read, idle) = (make("written"), make("mapped"), make("read"), make("idle"));
        let _w = std::fs::OpenOptions::new().append(true).open(&written).unwrap();
        let _r = std::fs::File::open(&read).unwrap();
        let map = {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(&mapped).unwrap();
            crate::sys::memory::map_own_file(&f).unwrap()
        };
        let stat = |p: &std::path::Path| Stat::lstat(p).unwrap();
        let candidates: Vec<Stat> = [&written, &mapped, &read, &idle].iter().map(|p| stat(p)).collect();
        let found = written_by_others(&candidates, &HashSet::new());
        let key = |p: &std::path::Path| (stat(p).dev, stat(p).ino);
        assert_eq!(found, [key(&written), key(&mapped)].into_iter().collect());
        drop(map);
        assert!(written_by_others(&[], &HashSet::new()).is_empty());
    }

    #[test]
    fn an_appended_file_is_cut_back_a_file_changed_in_place_is_refused() {
        let w = WatchedFile { path: "/d/log".into(), stat: st(5, 100, 1), writable: true, append_only: true, crc: None };
        assert_eq!(judge(&w, Some(&st(5, 100, 1)), None), Verdict::Same);
        assert_eq!(judge(&w, Some(&st(5, 150, 2)), None), Verdict::CutBack(100));
        assert!(matches!(judge(&w, Some(&st(5, 90, 2)), None), Verdict::Changed(m) if m.contains("size 100 -> 90")));
        assert!(matches!(judge(&w, Some(&st(6, 150, 2)), None), Verdict::Changed(m) if m.contains("different inode")));
        assert!(matches!(judge(&w, None, None), Verdict::Changed(m) if m.contains("gone")));
        let data = WatchedFile { append_only: false, ..w.clone() };
        assert!(matches!(judge(&data, Some(&st(5, 150, 2)), None), Verdict::Changed(_)));
        assert!(matches!(judge(&data, Some(&st(5, 100, 2)), None), Verdict::Changed(m) if m.contains("modified at")));
        let read_only = WatchedFile { writable: false, ..w.clone() };
        assert!(matches!(judge(&read_only, Some(&st(5, 150, 2)), None), Verdict::Changed(_)));
        // Mapped shared and writable: the contents decide, whatever mtime says.
        let mapped = WatchedFile { crc: Some(7), append_only: false, ..w };
        assert_eq!(judge(&mapped, Some(&st(5, 100, 1)), Some(7)), Verdict::Same);
        assert!(matches!(judge(&mapped, Some(&st(5, 100, 1)), Some(8)), Verdict::Changed(m) if m.contains("contents differ")));
    }

    #[test]
    fn listing_differences_name_created_removed_replaced_and_written_entries() {
        let old = vec![
            ("a".to_string(), st(1, 10, 1)),
            ("b".to_string(), st(2, 10, 1)),
            ("log".to_string(), st(3, 10, 1)),
            ("r".to_string(), st(5, 10, 1)),
            ("w".to_string(), st(6, 10, 1)),
        ];
        let now = vec![
            ("a".to_string(), st(1, 10, 1)),
            ("c".to_string(), st(4, 1, 2)),
            ("log".to_string(), st(3, 99, 2)),
            ("r".to_string(), st(8, 10, 1)),
            ("w".to_string(), st(6, 12, 2)),
        ];
        let skip: HashSet<(u64, u64)> = [(1, 3)].into_iter().collect();
        let d = diff_listing(&old, &now, &skip);
        assert_eq!(d.len(), 4, "{d:?}");
        assert!(d.contains(&("b".into(), EntryChange::Removed)));
        assert!(d.contains(&("c".into(), EntryChange::Created)));
        assert!(d.contains(&("r".into(), EntryChange::Replaced)));
        assert!(d.iter().any(|(n, c)| n == "w" && matches!(c, EntryChange::Written(w) if w.contains("size 10 -> 12"))));
        let mut sub = st(7, 4096, 1);
        sub.kind = Kind::Dir;
        let mut sub_now = sub;
        sub_now.mtime = (9, 0);
        assert!(diff_listing(&[("s".into(), sub)], &[("s".into(), sub_now)], &HashSet::new()).is_empty());
    }

    #[test]
    fn only_a_write_in_place_or_a_companion_of_a_held_file_refuses() {
        let held = ["data.db", "sim.log"];
        // One output file a step, a directory of a lost node, an atomic rename: left as they are.
        assert_eq!(entry_refuses("out_0016.dat", &EntryChange::Created, &held), None);
        assert_eq!(entry_refuses("local-10.79.0.2", &EntryChange::Removed, &held), None);
        assert_eq!(entry_refuses("latest.json", &EntryChange::Replaced, &held), None);
        assert_eq!(entry_refuses("data.dbx", &EntryChange::Created, &held), None);
        // What the restarted job would read back.
        let wal = entry_refuses("data.db-wal", &EntryChange::Created, &held).expect("a WAL beside a held database refuses");
        assert!(wal.contains("beside data.db") && !wal.contains("had it open at"), "{wal}");
        assert!(entry_refuses("sim.log.lock", &EntryChange::Created, &held).is_some());
        let control = entry_refuses("pg_control", &EntryChange::Written("modified".into()), &held).expect("a file written in place refuses");
        assert!(control.contains("no process of the job had it open"), "{control}");
    }

    #[test]
    fn the_warning_names_what_is_left_in_one_line() {
        let mut left: Vec<(String, EntryChange)> = (1..=10).map(|i| (format!("/w/out_{i:04}.dat"), EntryChange::Created)).collect();
        left.push(("/w/local-b".into(), EntryChange::Removed));
        let line = left_as_they_are(&left);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("11 entries"), "{line}");
        assert!(line.contains("10 created (/w/out_0001.dat,") && line.contains("and 2 more") && line.contains("1 removed (/w/local-b)"), "{line}");
        assert!(left_as_they_are(&left[..1]).starts_with("1 entry of"));
    }

    #[test]
    fn in_a_shared_directory_only_the_jobs_owners_count() {
        let mut other = st(9, 1, 1);
        other.uid = 1234;
        let l = DirListing { dir: "/tmp".into(), entries: vec![], owners: Some(vec![0]) };
        assert!(l.counts(&st(1, 1, 1)));
        assert!(!l.counts(&other));
        let private = DirListing { owners: None, ..l };
        assert!(private.counts(&other));
    }

    #[test]
    fn paths_under_a_root() {
        assert!(under("/a/b", "/a"));
        assert!(under("/a", "/a/"));
        assert!(!under("/ab", "/a"));
        assert!(is_kernel_path("/proc/self/status"));
        assert!(!is_kernel_path("/dev/shm/x"));
        assert!(!is_kernel_path("/devices"));
    }
}

#[cfg(test)]
mod validation_tests {
    use super::*;
    use crate::objects::protect::{Entry, RootState};

    fn root_with(rel: &str, content: Option<&str>) -> FilesRecord {
        let st = Stat { kind: Kind::File, dev: 1, ino: 2, size: 3, mtime: (0, 0), ctime: (0, 0), mode: 0o600, uid: 0, gid: 0 };
        let dir = Stat { kind: Kind::Dir, ..st };
        let entries = vec![
            Entry { rel: String::new(), stat: dir, content: None, mapped: false },
            Entry { rel: rel.into(), stat: st, content: content.map(String::from), mapped: false },
        ];
        FilesRecord { protected: vec![RootState { root: "/data".into(), entries }], ..Default::default() }
    }

    #[test]
    fn forged_paths_in_a_files_record_are_refused() {
        use crate::validate::files_record;
        assert!(files_record(&root_with("a/b", Some("g1-000001"))).is_ok());
        assert!(files_record(&root_with("../etc/passwd", Some("g1-000001"))).is_err());
        assert!(files_record(&root_with("a", Some("../../x"))).is_err());
        assert!(files_record(&root_with("a", None)).is_err());
        assert!(files_record(&root_with("/abs", Some("g1-000001"))).is_err());
        let mut rec = root_with("a", Some("g1"));
        rec.watched.push(WatchedFile { path: "relative".into(), stat: rec.protected[0].entries[1].stat, writable: false, append_only: true, crc: None });
        assert!(files_record(&rec).is_err());
    }

    /// `from_bytes` (the fuzz target's way in) decodes and validates as `read` does.
    #[test]
    fn from_bytes_decodes_and_validates() {
        let path = Path::new("gen-000001/n0/files.bin");
        let bytes = |rec: &FilesRecord| image::record::encode_record(FILES_MAGIC, &postcard::to_stdvec(rec).unwrap());
        let good = root_with("a/b", Some("g1-000001"));
        assert_eq!(FilesRecord::from_bytes(&bytes(&good), path).unwrap().protected[0].entries.len(), 2);
        let e = FilesRecord::from_bytes(&bytes(&root_with("../etc/passwd", Some("g1"))), path).unwrap_err();
        assert!(matches!(e, image::ImageError::Invalid { .. }) && e.to_string().contains("files.bin"), "{e}");
        let mut damaged = bytes(&good);
        *damaged.last_mut().unwrap() ^= 1;
        assert!(FilesRecord::from_bytes(&damaged, path).is_err());
        assert!(FilesRecord::from_bytes(&damaged[..10], path).is_err());
    }

    /// Another boot numbers devices anew: a record whose files are the same inodes under another
    /// device number is renumbered from the paths, and then judged the same; a device no path
    /// tells of stays.
    #[test]
    fn another_boots_device_numbers_are_learned_from_the_paths() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.log");
        std::fs::write(&out, b"line\n").unwrap();
        let real = Stat::lstat(&out).unwrap();
        let old_dev = real.dev + 1000;
        let rec = FilesRecord {
            watched: vec![WatchedFile {
                path: out.to_string_lossy().into_owned(),
                stat: Stat { dev: old_dev, ..real },
                writable: true,
                append_only: true,
                crc: None,
            }],
            listings: vec![DirListing {
                dir: dir.path().to_string_lossy().into_owned(),
                entries: vec![("out.log".into(), Stat { dev: old_dev, ..real })],
                owners: None,
            }],
            ignored: vec![(old_dev, 1), (7, 2)],
            ..Default::default()
        };
        let re = renumbered(&rec);
        assert_eq!(re.watched[0].stat, real);
        assert_eq!(re.listings[0].entries[0].1, real);
        assert_eq!(re.ignored, vec![(real.dev, 1), (7, 2)]);
        assert_eq!(judge(&re.watched[0], Some(&real), None), Verdict::Same);
        let place = crate::objects::identity::Place::another_boot(&[]);
        check(&rec, Changed::Refuse, &[], &place).expect("the same files under another device number");
        assert!(check(&rec, Changed::Refuse, &[], &crate::objects::identity::Place::same_boot()).is_err(), "on the same boot the device must agree");
    }
}
