//! fanotify: a notification group and its marks, each with its event mask, its ignore mask and
//! flags.
//!
//! fdinfo gives the group's `fanotify_init` flags and event flags, then a line per mark: an
//! inode mark names its inode by device, inode number and file handle (as inotify's watches,
//! and found the same way: [`super::inotify::Locator`]); a mount mark names its mount by id, a
//! filesystem mark its device: both are recorded by a path the process sees (its mount point),
//! and marked again on that path (root's: CAP_SYS_ADMIN). Since Linux 5.13 an ordinary user may
//! make a group that reports file handles (FAN_REPORT_FID) with inode marks; a restart as that
//! user makes it again the same way.
//!
//! Refused: a group of a permission class (FAN_CLASS_CONTENT, FAN_CLASS_PRE_CONTENT). While the
//! job is frozen, every access to the files it marks waits for its answer, the checkpoint's own
//! included. Events queued but not read at the checkpoint are not kept (reading them would take
//! them from the job), as inotify's.

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use super::inotify::{self, hex_field, Locator};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FanotifyRecord {
    /// fanotify_init's flags (class, FAN_REPORT_*, FAN_UNLIMITED_*, ...) as fdinfo shows them.
    pub flags: u32,
    /// fanotify_init's event_f_flags: the open flags of the descriptors events carry.
    pub event_flags: u32,
    pub marks: Vec<FanotifyMark>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FanotifyMark {
    pub on: Marked,
    /// The path it is marked on again: the inode's, or a mount point of the mount or the
    /// filesystem.
    pub path: String,
    /// FAN_* events.
    pub mask: u32,
    /// Events ignored (FAN_MARK_IGNORED_MASK, or FAN_MARK_IGNORE when `flags` says so).
    pub ignored_mask: u32,
    /// FAN_MARK_IGNORED_SURV_MODIFY, FAN_MARK_EVICTABLE, FAN_MARK_IGNORE, as fdinfo shows them.
    pub flags: u32,
}

/// What a mark is on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Marked {
    /// An inode, (st_dev, st_ino) checked at restore; `held_at` as an inotify watch's: the
    /// descriptor of the process through which a file deleted while open is marked again.
    Inode { dev: u64, ino: u64, held_at: Option<i32> },
    /// The mount at `path` (FAN_MARK_MOUNT).
    Mount,
    /// The filesystem `path` is on (FAN_MARK_FILESYSTEM).
    Filesystem,
}

// include/uapi/linux/fanotify.h, which libc does not all name.
const FAN_CLASS_CONTENT: u32 = 0x4;
const FAN_CLASS_PRE_CONTENT: u32 = 0x8;
const FAN_CLOEXEC: u32 = 0x1;
const FAN_NONBLOCK: u32 = 0x2;
const FAN_MARK_ADD: u32 = 0x1;
const FAN_MARK_DONT_FOLLOW: u32 = 0x4;
const FAN_MARK_MOUNT: u32 = 0x10;
const FAN_MARK_IGNORED_MASK: u32 = 0x20;
const FAN_MARK_IGNORED_SURV_MODIFY: u32 = 0x40;
const FAN_MARK_FILESYSTEM: u32 = 0x100;
const FAN_MARK_EVICTABLE: u32 = 0x200;
const FAN_MARK_IGNORE: u32 = 0x400;
/// The mark flags fdinfo shows and a restore gives back.
const KEPT_MARK_FLAGS: u32 = FAN_MARK_IGNORED_SURV_MODIFY | FAN_MARK_EVICTABLE | FAN_MARK_IGNORE;

/// A mark as fdinfo shows it, before its path is found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FdinfoMark {
    Inode(inotify::FdinfoWatch, u32, u32),
    Mount { mnt_id: u32, mflags: u32, mask: u32, ignored: u32 },
    Filesystem { sdev: u32, mflags: u32, mask: u32, ignored: u32 },
}

/// The group's flags, event flags and marks from its fdinfo text. Pure.
fn parse(text: &str) -> std::result::Result<(u32, u32, Vec<FdinfoMark>), String> {
    let mut group = None;
    let mut marks = Vec::new();
    for line in text.lines().filter_map(|l| l.strip_prefix("fanotify ")) {
        let hex = |name: &str| hex_field(line, name).map(|v| v as u32);
        if line.starts_with("flags:") {
            group = Some((hex("flags")?, hex("event-flags")?));
        } else if line.starts_with("ino:") {
            marks.push(FdinfoMark::Inode(inotify::parse_inode(line)?, hex("mflags")?, hex("ignored_mask")?));
        } else if line.starts_with("mnt_id:") {
            marks.push(FdinfoMark::Mount { mnt_id: hex("mnt_id")?, mflags: hex("mflags")?, mask: hex("mask")?, ignored: hex("ignored_mask")? });
        } else if line.starts_with("sdev:") {
            marks.push(FdinfoMark::Filesystem { sdev: hex("sdev")?, mflags: hex("mflags")?, mask: hex("mask")?, ignored: hex("ignored_mask")? });
        } else {
            return Err(format!("a line fanotify's fdinfo does not have: {line:?}"));
        }
    }
    let (flags, event_flags) = group.ok_or("no group flags")?;
    Ok((flags, event_flags, marks))
}

/// The refusal of a group of a permission class.
fn permission_class(pid: Tid, fd: i32) -> Error {
    Error::Unsupported {
        pid,
        what: format!(
            "fd {fd} (a fanotify group of a permission class: while the job is frozen, every access to the files it marks would wait for its answer)"
        ),
    }
}

/// Refuses a group of a permission class held by any of `pids` (host pids), right after the
/// freeze: before the checkpoint opens a file, which such a group's frozen listener could hold
/// up for good (the descriptors' capture would find it only after the chunk files are opened
/// and other processes' files read). Reads only /proc. Making such a group needs CAP_SYS_ADMIN,
/// and only root checkpoints a job that may hold one: an ordinary user's checkpoint looks
/// no further (it would cost a readlink per descriptor of the job during the freeze).
pub fn refuse_permission_groups(pids: &[Tid]) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    for &pid in pids {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for e in entries.flatten() {
            if !std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:[fanotify]") {
                continue;
            }
            let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let text = procfs::fdinfo_text(pid, fd)?;
            let (flags, ..) = parse(&text).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (a fanotify group): {e}")))?;
            if flags & (FAN_CLASS_CONTENT | FAN_CLASS_PRE_CONTENT) != 0 {
                return Err(permission_class(super::namespaces::ns_pid_or(pid), fd));
            }
        }
    }
    Ok(())
}

/// Captures the fanotify group at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32, last_try: bool) -> Result<FanotifyRecord> {
    let text = procfs::fdinfo_text(pid, fd)?;
    let (flags, event_flags, found) = parse(&text).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (a fanotify group): {e}")))?;
    if flags & (FAN_CLASS_CONTENT | FAN_CLASS_PRE_CONTENT) != 0 {
        return Err(permission_class(pid, fd));
    }
    let mut locator = Locator::new(pid);
    let mut table = None;
    let mut mount_at = |want: &dyn Fn(&super::mounts::MountInfo) -> bool, what: String| -> Result<String> {
        let t = match &mut table {
            Some(t) => t,
            None => table.insert(super::mounts::read_table(pid)?),
        };
        t.iter()
            .find(|m| want(m))
            .map(|m| m.at.clone())
            .ok_or_else(|| Error::Unsupported { pid, what: format!("fd {fd} (a fanotify mark on {what}, which the process's mount table does not have)") })
    };
    let mut marks = Vec::new();
    // A mark whose masks are both empty does nothing (an ignore-only mark whose ignore mask a
    // change to its file cleared: the kernel keeps the mark), and fanotify_mark refuses to add
    // one: it is not kept.
    let empty = |m: &FdinfoMark| match m {
        FdinfoMark::Inode(w, _, ignored) => w.mask == 0 && *ignored == 0,
        FdinfoMark::Mount { mask, ignored, .. } | FdinfoMark::Filesystem { mask, ignored, .. } => *mask == 0 && *ignored == 0,
    };
    for m in found.into_iter().filter(|m| !empty(m)) {
        let mark = match m {
            FdinfoMark::Inode(w, mflags, ignored) => {
                let (path, held_at) = locator.locate(&w).map_err(|e| Error::Unsupported { pid, what: format!("fd {fd} (a fanotify mark on {e})") })?;
                FanotifyMark {
                    on: Marked::Inode { dev: w.st_dev(), ino: w.ino, held_at },
                    path,
                    mask: w.mask,
                    ignored_mask: ignored,
                    flags: mflags & KEPT_MARK_FLAGS,
                }
            }
            FdinfoMark::Mount { mnt_id, mflags, mask, ignored } => {
                let path = mount_at(&|t| t.id == mnt_id, format!("mount {mnt_id}"))?;
                FanotifyMark { on: Marked::Mount, path, mask, ignored_mask: ignored, flags: mflags & KEPT_MARK_FLAGS }
            }
            FdinfoMark::Filesystem { sdev, mflags, mask, ignored } => {
                let dev = (sdev >> 20, sdev & 0xf_ffff);
                let path = mount_at(&|t| t.dev == dev, format!("the filesystem of device {}:{}", dev.0, dev.1))?;
                FanotifyMark { on: Marked::Filesystem, path, mask, ignored_mask: ignored, flags: mflags & KEPT_MARK_FLAGS }
            }
        };
        marks.push(mark);
    }
    inotify::events_queued(pid, fd, "fanotify", last_try)?;
    Ok(FanotifyRecord { flags, event_flags, marks })
}

/// Whether a group marks a file through another descriptor, which must be open first.
pub fn marks_through_descriptors(rec: &FdRecord) -> bool {
    matches!(&rec.kind, super::descriptor::FdKind::Fanotify(f) if f.marks.iter().any(|m| matches!(m.on, Marked::Inode { held_at: Some(_), .. })))
}

impl DescriptorKind for FanotifyRecord {
    fn describe(&self) -> String {
        "fanotify".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off, (at.ctx.had_admin, at.ctx.elsewhere))
    }
}

/// Makes the group again inside the task, with its marks. `had_admin`: whether the process held
/// CAP_SYS_ADMIN at the checkpoint. Without it, the group is made without it too (on a restart
/// by root): an unprivileged group reports no other process's pid, and counts against its
/// user's limits. Unless that fails: a group made before the process gave up the capability
/// comes back as it was made.
fn open(task: &mut RemoteTask, rec: &FdRecord, f: &FanotifyRecord, scratch_off: usize, (had_admin, elsewhere): (bool, bool)) -> Result<u64> {
    let mut flags = f.flags & !(FAN_CLOEXEC | FAN_NONBLOCK);
    if rec.flags & libc::O_NONBLOCK as u32 != 0 {
        flags |= FAN_NONBLOCK;
    }
    if rec.flags & libc::O_CLOEXEC as u32 != 0 {
        flags |= FAN_CLOEXEC;
    }
    let init = |task: &mut RemoteTask| task.main.raw(libc::SYS_fanotify_init, &[flags as u64, f.event_flags as u64]).map_err(Error::from);
    let mut r = if had_admin { init(task)? } else { super::creds::without_admin(task, scratch_off, init)? };
    if r == -(libc::EPERM as i64) && !had_admin {
        r = init(task)?;
    }
    if r < 0 {
        let e = std::io::Error::from_raw_os_error(-r as i32);
        return Err(Error::Other(format!("make a fanotify group again (flags {flags:#x}; FAN_UNLIMITED_* and mount marks need CAP_SYS_ADMIN): {e}")));
    }
    let fd = r as u64;
    for m in &f.marks {
        let (target, kind) = match m.on {
            Marked::Inode { dev, ino, held_at } => {
                inotify::check_watched(&m.path, (dev, ino), held_at, elsewhere)?;
                match held_at {
                    Some(at) => (format!("/proc/self/fd/{at}"), 0),
                    None => (m.path.clone(), FAN_MARK_DONT_FOLLOW),
                }
            }
            Marked::Mount => (m.path.clone(), FAN_MARK_MOUNT),
            Marked::Filesystem => (m.path.clone(), FAN_MARK_FILESYSTEM),
        };
        let addr = task.put_path(scratch_off, &target)?;
        let mut mark = |how: u32, mask: u32| {
            task.syscall("fanotify_mark", libc::SYS_fanotify_mark, &[fd, (FAN_MARK_ADD | kind | how) as u64, mask as u64, libc::AT_FDCWD as u64, addr])
                .context(|| format!("mark {} again (events {mask:#x}, flags {how:#x})", m.path))
                .map(drop)
        };
        let evictable = m.flags & FAN_MARK_EVICTABLE;
        if m.mask != 0 {
            mark(evictable, m.mask)?;
        }
        if m.ignored_mask != 0 {
            let ignore = if m.flags & FAN_MARK_IGNORE != 0 { FAN_MARK_IGNORE } else { FAN_MARK_IGNORED_MASK };
            mark(ignore | evictable | (m.flags & FAN_MARK_IGNORED_SURV_MODIFY), m.ignored_mask)?;
        }
    }
    Ok(fd)
}

/// A record's marks are within bounds.
pub fn validate(f: &FanotifyRecord) -> std::result::Result<(), String> {
    if f.flags & (FAN_CLASS_CONTENT | FAN_CLASS_PRE_CONTENT) != 0 {
        return Err("a fanotify group of a permission class".into());
    }
    if f.marks.len() > super::super::validate::MAX_FDS {
        return Err(format!("{} fanotify marks", f.marks.len()));
    }
    if let Some(m) = f.marks.iter().find(|m| m.flags & !KEPT_MARK_FLAGS != 0 || (m.mask == 0 && m.ignored_mask == 0)) {
        return Err(format!("a fanotify mark on {} with flags {:#x} and masks {:#x}, {:#x}", m.path, m.flags, m.mask, m.ignored_mask));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_groups_flags_and_each_kind_of_mark() {
        let text = "pos:\t0\nflags:\t04002\nmnt_id:\t17\nino:\t1038\n\
            fanotify flags:202 event-flags:8000\n\
            fanotify sdev:fe00000 mflags:0 mask:100 ignored_mask:0\n\
            fanotify mnt_id:1b mflags:0 mask:20 ignored_mask:0\n\
            fanotify ino:9b2064 sdev:fe00000 mflags:40 mask:a ignored_mask:20 fhandle-bytes:8 fhandle-type:1 f_handle:64209b00199197fd\n";
        let (flags, event_flags, marks) = parse(text).unwrap();
        assert_eq!((flags, event_flags), (0x202, 0x8000));
        assert_eq!(marks[0], FdinfoMark::Filesystem { sdev: 0xfe00000, mflags: 0, mask: 0x100, ignored: 0 });
        assert_eq!(marks[1], FdinfoMark::Mount { mnt_id: 0x1b, mflags: 0, mask: 0x20, ignored: 0 });
        let FdinfoMark::Inode(w, mflags, ignored) = &marks[2] else { panic!("{marks:?}") };
        assert_eq!((w.ino, w.mask, *mflags, *ignored), (0x9b2064, 0xa, 0x40, 0x20));
        assert_eq!(w.handle.as_ref().unwrap().1.len(), 8);
        assert!(parse("fanotify something:1\n").is_err());
        assert!(parse("pos:\t0\n").is_err());
    }
}
