//! inotify: an instance and its watches, each with its watch descriptor (wd) and event mask.
//!
//! fdinfo names each watched inode by device, inode number and a file handle; capture opens the
//! handle (open_by_handle_at, which needs CAP_DAC_READ_SEARCH in the machine's user namespace) to
//! learn the inode's path. Without that capability (an ordinary user), the inode is looked for
//! by (device, inode) near where the process works ([`search_near`]): its working directory,
//! the directories of the files it has open, its home; a watch found nowhere there is refused
//! with a message saying so. A watched file deleted while the process holds it open has no path:
//! its watch is recorded with the descriptor (`held_at`) and added again through
//! /proc/self/fd on the file's copy (see `deleted`). Restore
//! adds the watches again by path in wd order. A new instance hands out wds counting up from 1,
//! so where the job had removed watches, a watch is added and removed at once to skip each
//! missing number, and the IN_IGNORED events that leaves are read out before the job runs.
//!
//! Events queued but not read cannot be kept (reading them would take them from the job): a
//! checkpoint that finds some is tried again ([`events_queued`]), and loses them only on its
//! last try. Nor is the counter beyond the highest wd kept, so a wd the job gets after a
//! restart can differ from the one it would have had.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};
use crate::sys;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InotifyRecord {
    /// In wd order.
    pub watches: Vec<InotifyWatch>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InotifyWatch {
    pub wd: i32,
    /// The watched inode's path, and its identity (st_dev, st_ino) to check at restore.
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// IN_* events and flags, as inotify_add_watch takes them.
    pub mask: u32,
    /// A descriptor of the process that holds the watched file, when it has no path any more
    /// (deleted while open and watched: a log `tail -f` follows, rotated away); the watch is
    /// added through it at restore, on the file's copy (format 13).
    #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
    pub held_at: Option<i32>,
}

impl InotifyWatch {
    /// Where restore adds the watch, and whether on that very name (IN_DONT_FOLLOW: a
    /// symbolic link watched is the link) or what it leads to (a descriptor's file).
    fn target(&self) -> (String, bool) {
        match self.held_at {
            Some(fd) => (format!("/proc/self/fd/{fd}"), false),
            None => (self.path.clone(), true),
        }
    }
}

/// The files process `pid` holds open that have no name (deleted while open), by (device,
/// inode): the descriptor of each, and the path it had.
fn held_deleted(pid: Tid) -> std::collections::HashMap<(u64, u64), (i32, String)> {
    let fds = procfs::fds(pid).unwrap_or_default();
    fds.into_iter()
        .filter_map(|fd| {
            let link = format!("/proc/{pid}/fd/{fd}");
            let m = std::fs::metadata(&link).ok().filter(|m| m.nlink() == 0)?;
            let target = std::fs::read_link(&link).ok()?.to_string_lossy().into_owned();
            let path = super::deleted::deleted_path(&target).unwrap_or(&target).to_string();
            Some(((m.dev(), m.ino()), (fd, path)))
        })
        .collect()
}

/// A watch as fdinfo shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdinfoWatch {
    pub wd: i32,
    pub ino: u64,
    /// The device as the kernel encodes it (major << 20 | minor).
    pub sdev: u32,
    pub mask: u32,
    /// The file handle, if the filesystem gives one: (type, bytes).
    pub handle: Option<(i32, Vec<u8>)>,
}

impl FdinfoWatch {
    /// The device as stat reports it.
    pub fn st_dev(&self) -> u64 {
        libc::makedev(self.sdev >> 20, self.sdev & 0xf_ffff)
    }
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// A field `name:VALUE` of an fdinfo line, if there.
pub(super) fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix(':'))
}

/// A field of an fdinfo line, in hex.
pub(super) fn hex_field(line: &str, name: &str) -> std::result::Result<u64, String> {
    let v = field(line, name).ok_or_else(|| format!("no {name} in {line:?}"))?;
    u64::from_str_radix(v, 16).map_err(|_| format!("{name} {v:?} in {line:?}"))
}

/// The inode an fdinfo line of inotify or fanotify names: "ino:2e1 sdev:fe00000 ...
/// fhandle-bytes:8 fhandle-type:1 f_handle:e102000000000000" (wd 0 where it has none).
pub(super) fn parse_inode(line: &str) -> std::result::Result<FdinfoWatch, String> {
    let hex = |name: &str| hex_field(line, name);
    let handle = match field(line, "f_handle") {
        Some(bytes) => {
            let bytes = hex_bytes(bytes).ok_or_else(|| format!("f_handle in {line:?}"))?;
            if bytes.len() as u64 != hex("fhandle-bytes")? {
                return Err(format!("f_handle length in {line:?}"));
            }
            Some((hex("fhandle-type")? as i32, bytes))
        }
        None => None,
    };
    let wd = if field(line, "wd").is_some() { hex("wd")? as i32 } else { 0 };
    Ok(FdinfoWatch { wd, ino: hex("ino")?, sdev: hex("sdev")? as u32, mask: hex("mask")? as u32, handle })
}

/// Reads the watches from an inotify instance's fdinfo text (pure). Every number is in hex.
pub fn parse(text: &str) -> std::result::Result<Vec<FdinfoWatch>, String> {
    // "inotify wd:2 ino:2e1 sdev:fe00000 mask:2 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:e102000000000000"
    let mut out = text.lines().filter_map(|l| l.strip_prefix("inotify ")).map(parse_inode).collect::<std::result::Result<Vec<_>, _>>()?;
    out.sort_by_key(|w| w.wd);
    Ok(out)
}

/// The mount point of a device in this process's mount table (`maj:min` in mountinfo; pure).
pub(super) fn mount_point(mountinfo: &str, major: u32, minor: u32) -> Option<String> {
    let id = format!("{major}:{minor}");
    let line = mountinfo.lines().find(|l| l.split_whitespace().nth(2) == Some(id.as_str()))?;
    let raw = line.split_whitespace().nth(4)?;
    // Spaces, tabs, newlines and backslashes are written as octal escapes (\040).
    let mut out = Vec::new();
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match (b[i], raw.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The path of the inode a watch is on, found through its file handle.
fn resolve(w: &FdinfoWatch) -> std::result::Result<String, String> {
    let (htype, bytes) = w.handle.as_ref().ok_or("its filesystem gives no file handle")?;
    let (major, minor) = (w.sdev >> 20, w.sdev & 0xf_ffff);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    let mnt = mount_point(&mountinfo, major, minor).ok_or_else(|| format!("device {major}:{minor} is not mounted here"))?;
    let mount = File::open(&mnt).map_err(|e| format!("open {mnt}: {e}"))?;
    let file = File::from(
        sys::fs::open_by_handle(&mount, *htype, bytes, libc::O_PATH | libc::O_CLOEXEC)
            .map_err(|e| format!("open_by_handle_at on {mnt}: {e} (the file is gone, or not root?)"))?,
    );
    let path = procfs::readlink(&format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| format!("stat {path}: {e}"))?;
    if meta.ino() != w.ino || !path.starts_with('/') || path.ends_with(" (deleted)") {
        return Err(format!("its inode {} has no path ({path})", w.ino));
    }
    Ok(path)
}

/// Most directory entries [`search_near`] looks at for one watch: it runs while the job is
/// frozen.
const SEARCH_BUDGET: usize = 20_000;
/// How deep below each starting directory it looks.
const SEARCH_DEPTH: usize = 4;

/// Looks for the inode `(dev, ino)` where process `pid` works: its working directory, the
/// directories of its open files, its home directory (and below each, breadth first, on the same
/// filesystem, within [`SEARCH_BUDGET`] entries). For the unprivileged capture, which cannot
/// open a file handle.
fn search_near(pid: Tid, dev: u64, ino: u64) -> Option<String> {
    use std::collections::{HashSet, VecDeque};
    use std::path::PathBuf;
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) {
        starts.push(cwd);
    }
    if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in entries.flatten() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                if target.is_absolute() {
                    starts.extend(target.parent().map(PathBuf::from));
                }
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        starts.push(PathBuf::from(home));
    }
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut queue: VecDeque<(PathBuf, usize)> = starts.into_iter().map(|p| (p, 0)).collect();
    let mut budget = SEARCH_BUDGET;
    while let Some((dir, depth)) = queue.pop_front() {
        let Ok(meta) = std::fs::symlink_metadata(&dir) else { continue };
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        if (meta.dev(), meta.ino()) == (dev, ino) {
            return Some(dir.to_string_lossy().into_owned());
        }
        if !meta.is_dir() || meta.dev() != dev || depth >= SEARCH_DEPTH {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            if budget == 0 {
                return None;
            }
            budget -= 1;
            let Ok(m) = e.metadata() else { continue };
            if (m.dev(), m.ino()) == (dev, ino) {
                return Some(e.path().to_string_lossy().into_owned());
            }
            if m.is_dir() {
                queue.push_back((e.path(), depth + 1));
            }
        }
    }
    None
}

/// Finds where the inodes that process `pid` watches are (inotify's watches, fanotify's inode
/// marks): by file handle, else (a file deleted while the process holds it open) through that
/// descriptor, else near where the process works.
pub(super) struct Locator {
    pid: Tid,
    /// Read once, and only for a watch whose handle gives no path.
    deleted: Option<std::collections::HashMap<(u64, u64), (i32, String)>>,
}

impl Locator {
    pub(super) fn new(pid: Tid) -> Locator {
        Locator { pid, deleted: None }
    }

    /// The inode's path, and the descriptor it is watched through if it has none; Err says why
    /// it was found nowhere.
    pub(super) fn locate(&mut self, w: &FdinfoWatch) -> std::result::Result<(String, Option<i32>), String> {
        let e = match resolve(w) {
            Ok(path) => return Ok((path, None)),
            Err(e) => e,
        };
        let pid = self.pid;
        if let Some((at, path)) = self.deleted.get_or_insert_with(|| held_deleted(pid)).get(&(w.st_dev(), w.ino)) {
            return Ok((path.clone(), Some(*at)));
        }
        search_near(pid, w.st_dev(), w.ino).map(|path| (path, None)).ok_or_else(|| {
            format!(
                "inode {} whose path cannot be found: {e}; nor was it found near the process's working directory, open files or home, nor open in the process",
                w.ino
            )
        })
    }
}

/// Captures the inotify instance at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32, last_try: bool) -> Result<InotifyRecord> {
    let text = procfs::fdinfo_text(pid, fd)?;
    let found = parse(&text).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (an inotify instance): {e}")))?;
    let mut watches = Vec::new();
    let mut locator = Locator::new(pid);
    for w in found {
        let (path, held_at) = locator.locate(&w).map_err(|e| Error::Unsupported { pid, what: format!("fd {fd} (an inotify watch, wd {}, on {e})", w.wd) })?;
        watches.push(InotifyWatch { wd: w.wd, path, dev: w.st_dev(), ino: w.ino, mask: w.mask, held_at });
    }
    events_queued(pid, fd, "inotify", last_try)?;
    Ok(InotifyRecord { watches })
}

/// Events queued on a notification instance (`kind`: inotify, fanotify) cannot be kept
/// (reading them would take them from the job, and nothing puts them back): a passing state,
/// as a program reads its events as they come, so the checkpoint is tried again; on its last
/// try they are lost, with a warning.
pub(super) fn events_queued(pid: Tid, fd: i32, kind: &str, last_try: bool) -> Result<()> {
    let Ok(own) = super::descriptor::take_into_self(pid, fd) else { return Ok(()) };
    let queued = match sys::ioctl_int_out(&own, libc::FIONREAD) {
        Ok(n) if n > 0 => n,
        _ => return Ok(()),
    };
    if !last_try {
        return Err(Error::Passing {
            pid,
            what: format!("fd {fd} (an {kind} instance) holds {queued} bytes of events not read yet, which cannot be put back"),
        });
    }
    warn!(pid, fd, bytes = queued, "{kind} events queued at the checkpoint's last try are not kept in the image");
    Ok(())
}

/// Checks that a watched path is still the inode the job watched (a file watched through a
/// descriptor is its copy, made by this restart).
fn check(w: &InotifyWatch, elsewhere: bool) -> Result<()> {
    check_watched(&w.path, (w.dev, w.ino), w.held_at, elsewhere)
}

/// Checks that `path` is still the inode `(dev, ino)` a watch or mark was on (unless it is
/// watched through a descriptor). `elsewhere`: in another boot, the inode alone (devices are
/// numbered anew).
pub(super) fn check_watched(path: &str, (dev, ino): (u64, u64), held_at: Option<i32>, elsewhere: bool) -> Result<()> {
    if held_at.is_some() {
        return Ok(());
    }
    let changed = |problem: String| Error::FileChanged { path: path.to_string(), problem };
    let meta = std::fs::symlink_metadata(path).map_err(|e| changed(format!("watched file is gone ({e})")))?;
    if meta.ino() != ino || (!elsewhere && meta.dev() != dev) {
        return Err(changed("watched file was replaced by another file (different inode)".into()));
    }
    Ok(())
}

/// Whether an instance watches a file through another descriptor, which must be open first.
pub fn watches_through_descriptors(rec: &FdRecord) -> bool {
    matches!(&rec.kind, super::descriptor::FdKind::Inotify(n) if n.watches.iter().any(|w| w.held_at.is_some()))
}

impl DescriptorKind for InotifyRecord {
    fn describe(&self) -> String {
        "inotify".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off, at.ctx.elsewhere)
    }
}

/// Creates the inotify instance inside the task with its watches at their wds.
fn open(task: &mut RemoteTask, rec: &FdRecord, n: &InotifyRecord, scratch_off: usize, elsewhere: bool) -> Result<u64> {
    let flags = rec.flags & (libc::O_NONBLOCK | libc::O_CLOEXEC) as u32;
    let fd = task.syscall("inotify_init1", libc::SYS_inotify_init1, &[flags as u64])?;
    let mut next = 1;
    let mut skipped = false;
    for w in &n.watches {
        check(w, elsewhere)?;
        let (target, on_the_name) = w.target();
        let dont_follow = if on_the_name { libc::IN_DONT_FOLLOW as u64 } else { 0 };
        let addr = task.put_path(scratch_off, &target)?;
        while next < w.wd {
            let d = task.syscall("inotify_add_watch", libc::SYS_inotify_add_watch, &[fd, addr, libc::IN_ACCESS as u64 | dont_follow])?;
            task.syscall("inotify_rm_watch", libc::SYS_inotify_rm_watch, &[fd, d])?;
            next = d as i32 + 1;
            skipped = true;
        }
        let got = task
            .syscall("inotify_add_watch", libc::SYS_inotify_add_watch, &[fd, addr, w.mask as u64 | dont_follow])
            .context(|| format!("watch {} again", w.path))?;
        if got as i32 != w.wd {
            return Err(Error::Other(format!("the watch on {} came back as wd {got}, not {}", w.path, w.wd)));
        }
        next = w.wd + 1;
    }
    if skipped {
        drain(task, fd, flags, scratch_off)?;
    }
    Ok(fd)
}

/// Reads out every event queued on the instance (the IN_IGNORED of the skipping watches).
fn drain(task: &mut RemoteTask, fd: u64, flags: u32, scratch_off: usize) -> Result<()> {
    const BUF: u64 = 4096;
    task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, libc::O_NONBLOCK as u64])?;
    let buf = task.scratch_at(scratch_off);
    loop {
        let r = task.main.raw(libc::SYS_read, &[fd, buf, BUF])?;
        if r == -(libc::EAGAIN as i64) {
            break;
        }
        if r <= 0 {
            return Err(Error::Other(format!("read the events of a new inotify instance: {}", std::io::Error::from_raw_os_error(-r as i32))));
        }
    }
    let status = flags & libc::O_NONBLOCK as u32;
    task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, status as u64])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In another boot a watched file is the same by its inode, whatever its device's number;
    /// in the checkpoint's boot both count.
    #[test]
    fn a_watched_file_under_another_device_number_is_the_same_in_another_boot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watched");
        std::fs::write(&path, b"x").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let p = path.to_str().unwrap();
        let renumbered = (meta.dev() + 1000, meta.ino());
        assert!(check_watched(p, renumbered, None, true).is_ok());
        assert!(check_watched(p, renumbered, None, false).is_err());
        assert!(check_watched(p, (meta.dev(), meta.ino() + 1), None, true).is_err(), "another inode is another file");
    }

    const TEXT: &str = "pos:\t0\nflags:\t04000\nmnt_id:\t17\nino:\t1038\n\
        inotify wd:b ino:2e1 sdev:fe00000 mask:2 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:e102000000000000\n\
        inotify wd:1 ino:3c4a7 sdev:fe00001 mask:300 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:a7c4030000000000\n";

    #[test]
    fn parses_watches_in_wd_order() {
        let w = parse(TEXT).unwrap();
        assert_eq!(w.len(), 2);
        assert_eq!(w[0], FdinfoWatch { wd: 1, ino: 0x3c4a7, sdev: 0xfe00001, mask: 0x300, handle: Some((1, vec![0xa7, 0xc4, 3, 0, 0, 0, 0, 0])) });
        assert_eq!((w[1].wd, w[1].ino, w[1].mask), (11, 0x2e1, 2));
        assert_eq!(w[0].st_dev(), libc::makedev(254, 1));
    }

    #[test]
    fn a_watch_without_a_handle_is_kept_without_one() {
        let w = parse("inotify wd:3 ino:10 sdev:5 mask:fff ignored_mask:0\n").unwrap();
        assert_eq!(w[0].handle, None);
        assert!(parse("inotify wd:3 ino:zz sdev:5 mask:1\n").is_err());
        assert!(parse("inotify wd:3 ino:1 sdev:5 mask:1 fhandle-bytes:4 fhandle-type:1 f_handle:0102\n").is_err());
    }

    #[test]
    fn finds_mount_points() {
        let mi = "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                  30 22 0:25 / /mnt/with\\040space rw - tmpfs tmpfs rw\n";
        assert_eq!(mount_point(mi, 254, 0).as_deref(), Some("/"));
        assert_eq!(mount_point(mi, 0, 25).as_deref(), Some("/mnt/with space"));
        assert_eq!(mount_point(mi, 8, 1), None);
    }
}
