//! Files: regular files and directories (path, flags, offset, identity and size), character
//! devices such as /dev/null, and the launcher's stdio (bound at restart to the restart's own).

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::ptrace::RemoteTask;

/// Device and inode of the launcher's stdin, stdout and stderr, to recognise the job's stdio.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdioIds(pub [Option<(u64, u64)>; 3]);

impl StdioIds {
    /// The identities of this process's own fds 0, 1 and 2.
    pub fn of_self() -> StdioIds {
        let id = |fd: i32| std::fs::metadata(format!("/proc/self/fd/{fd}")).ok().map(|m| (m.dev(), m.ino()));
        StdioIds([id(0), id(1), id(2)])
    }

    pub fn which(&self, dev: u64, ino: u64) -> Option<u8> {
        self.0.iter().position(|s| *s == Some((dev, ino))).map(|i| i as u8)
    }
}

/// A regular file or directory, reopened by its path at its offset. `dev`, `ino` and `size` are
/// its identity and size at the checkpoint, which the restart checks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRecord {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

impl DescriptorKind for FileRecord {
    fn describe(&self) -> String {
        self.path.clone()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open_held(at.task, at.rec, &self.path, at.scratch_off, (at.ctx.files_rights.as_ref(), (self.dev, self.ino)))
    }

    fn made_alone(&self) -> bool {
        true
    }
}

/// A character device reopened by its path (/dev/null, /dev/zero, /dev/urandom, ...).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceRecord {
    pub path: String,
    /// For a device told by its number rather than its path (a node of one of the
    /// [`is_reopenable_device_number`] devices anywhere, or removed): its node as it was.
    /// `None` for the paths of [`REOPENABLE_DEVICES`] and from a file older than format 33.
    #[serde(deserialize_with = "crate::image::since::since::<33, _, _>")]
    pub node: Option<DeviceNode>,
}

/// A device node: the device (`rdev`), the node's type and permission bits, its owner, and
/// whether its name was removed (the restart then makes the node for a moment at `path`, opens
/// it and removes it again).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeviceNode {
    pub rdev: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub removed: bool,
}

impl DescriptorKind for DeviceRecord {
    fn describe(&self) -> String {
        match &self.node {
            Some(n) if n.removed => format!("{} (removed), device {}:{}", self.path, libc::major(n.rdev), libc::minor(n.rdev)),
            Some(n) => format!("{}, device {}:{}", self.path, libc::major(n.rdev), libc::minor(n.rdev)),
            None => self.path.clone(),
        }
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        let Some(node) = &self.node else { return open(at.task, at.rec, &self.path, at.scratch_off) };
        let task = &mut *at.task;
        let fd = if node.removed {
            // With the process's own rights (making a device node needs CAP_MKNOD, which a
            // user's process does not have): root's job only, in practice.
            let mknod = |t: &mut RemoteTask, addr| {
                t.syscall("mknodat", libc::SYS_mknodat, &[libc::AT_FDCWD as u64, addr, (libc::S_IFCHR | (node.mode & 0o7777)) as u64, node.rdev])
            };
            let (made, _) = make_for_a_moment(task, &self.path, ".ckpt-removed-device", "removed device node", at.scratch_off, mknod)?;
            let opened = open(task, at.rec, &made, at.scratch_off);
            let addr = task.put_path(at.scratch_off, &made)?;
            task.syscall("unlink", libc::SYS_unlink, &[addr]).context(|| format!("remove the device node {made} again"))?;
            opened?
        } else {
            open(task, at.rec, &self.path, at.scratch_off)?
        };
        // What was opened must be that device still (a node at a path can be replaced).
        let meta = std::fs::metadata(format!("/proc/{}/fd/{fd}", task.pid)).context(|| format!("stat {}", self.path))?;
        if meta.mode() & libc::S_IFMT != libc::S_IFCHR || meta.rdev() != node.rdev {
            task.syscall("close", libc::SYS_close, &[fd])?;
            return Err(Error::Other(format!(
                "{} is not the device {}:{} any more, it is {:o} {}:{}: put it back",
                self.path,
                libc::major(node.rdev),
                libc::minor(node.rdev),
                meta.mode() & libc::S_IFMT,
                libc::major(meta.rdev()),
                libc::minor(meta.rdev())
            )));
        }
        if node.removed {
            // Made again, as it was: the permission bits (the process's umask took some), the owner.
            if meta.mode() & 0o7777 != node.mode & 0o7777 {
                task.syscall("fchmod", libc::SYS_fchmod, &[fd, (node.mode & 0o7777) as u64])
                    .context(|| format!("give the device node {} its mode", self.path))?;
            }
            if (meta.uid(), meta.gid()) != (node.uid, node.gid) {
                task.syscall("fchown", libc::SYS_fchown, &[fd, node.uid as u64, node.gid as u64])
                    .context(|| format!("give the device node {} its owner", self.path))?;
            }
        }
        Ok(fd)
    }

    fn made_alone(&self) -> bool {
        true
    }
}

/// The launcher's stdin (0), stdout (1) or stderr (2): the restart binds its own at that number,
/// and opens nothing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StdioRecord {
    pub which: u8,
}

impl DescriptorKind for StdioRecord {
    fn describe(&self) -> String {
        format!("stdio {}", self.which)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        Err(Error::Other(format!("fd {}: the restart's stdio is bound, not opened (bug)", at.rec.fd)))
    }
}

const REOPENABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

/// Character devices that are reopened by path (they hold no state of the job's).
pub fn is_reopenable_device(path: &str) -> bool {
    REOPENABLE_DEVICES.contains(&path)
}

/// Character devices reopened by their node wherever it is (and made again for a moment where
/// its name was removed), told by their number: the memory devices without state (null 1:3,
/// zero 1:5, full 1:7, random 1:8, urandom 1:9), the system console (5:1) and the virtual
/// consoles (4:0 to 4:63). A terminal's settings are the device's, as a file's contents are the
/// file's: none of them holds state of the job's. Memory and disks (/dev/mem 1:1, block
/// devices) are never among them: a forged image could otherwise have root make one. Pure.
pub fn is_reopenable_device_number(rdev: u64) -> bool {
    matches!((libc::major(rdev), libc::minor(rdev)), (1, 3 | 5 | 7 | 8 | 9)) || is_console(rdev)
}

/// The system console (5:1) and the virtual consoles (4:0 to 4:63): the terminals among
/// [`is_reopenable_device_number`]. Pure.
pub fn is_console(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    (major, minor) == (5, 1) || (major == 4 && minor < 64)
}

/// What restart does with a file the job had open for writing that has grown since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrownFiles {
    /// Cut it back to its size at the checkpoint: the job will write the rest again.
    Truncate,
    /// Leave it as it is.
    Keep,
}

/// Checks that each file is the one the job had, and puts files open for writing back to their
/// size at the checkpoint. Runs before any process is created, so a refusal leaves nothing behind.
/// Files under a protected root (`protected`) are skipped: the restart has put them back itself,
/// possibly as new files (new inodes) where the job had removed them.
///
/// `place`: on another boot a file the job only reads is judged by its contents, one it writes
/// by its inode ([`super::identity::Place`]). `keep` (`--keep-files`): a file replaced by
/// another is logged and taken as it is.
pub fn check_and_prepare(
    fds: &[FdRecord],
    grown: GrownFiles,
    on_host: &dyn Fn(&str) -> Option<String>,
    place: &super::identity::Place,
    keep: bool,
) -> Result<()> {
    for rec in fds {
        let FdKind::File(FileRecord { path, dev, ino, size }) = &rec.kind else { continue };
        if in_jobs_proc(path) {
            continue;
        }
        let Some(host) = on_host(path) else { continue };
        let changed = |problem: String| Error::FileChanged { path: host.clone(), problem };
        // An O_PATH descriptor names the file itself, a symbolic link too, and reads nothing:
        // only its identity counts.
        let only_names = rec.flags & libc::O_PATH as u32 != 0;
        let meta = if only_names { std::fs::symlink_metadata(&host) } else { std::fs::metadata(&host) };
        let meta = meta.map_err(|e| changed(format!("file is gone ({e})")))?;
        let read_only_file = meta.is_file() && !only_names && !rec.writable();
        let replaced = if read_only_file {
            place.judge_path("file", (*dev, *ino), &host).err()
        } else {
            (!place.same_file((*dev, *ino), (meta.dev(), meta.ino()))).then(|| "file was replaced by another file (different inode)".to_string())
        };
        if let Some(problem) = replaced {
            if !keep {
                return Err(changed(problem));
            }
            tracing::warn!(path = host, "{problem}; taken as it is (--keep-files)");
            continue;
        }
        if meta.is_dir() || only_names {
            continue;
        }
        if meta.size() < *size {
            return Err(changed(format!("file shrank from {size} to {} bytes since the checkpoint", meta.size())));
        }
        if meta.size() > *size {
            if !rec.writable() {
                return Err(changed(format!("file grew from {size} to {} bytes since the checkpoint", meta.size())));
            }
            if grown == GrownFiles::Truncate {
                // The inode is the job's (above); its device is this boot's.
                cut_back(&host, (meta.dev(), meta.ino()), *size)?;
            }
        }
    }
    Ok(())
}

/// Whether `path` is under /proc: the job's own proc file system (its init mounts one for the
/// job's PID namespace), where `/proc/2/status` names the job's pid 2. The restorer sees
/// another /proc, so such a file is not checked from outside: the restored process, whose pids
/// are the ones it had, reopens it by path in its own.
pub fn in_jobs_proc(path: &str) -> bool {
    path == "/proc" || path.starts_with("/proc/")
}

/// Opens the regular file at `path` for the restorer, without following a symbolic link in its
/// last component and without blocking or taking a terminal (someone may have put a FIFO or a
/// device there since). With `identity`, the file must still be that (device, inode): the
/// restorer acts only on the very file the job had.
pub fn open_regular(path: &str, write: bool, identity: Option<(u64, u64)>) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let f = if write { std::fs::OpenOptions::new().write(true).custom_flags(flags).open(path)? } else { open_quietly(path, flags)? };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file any more"));
    }
    if identity.is_some_and(|id| id != (meta.dev(), meta.ino())) {
        return Err(std::io::Error::other("replaced by another file meanwhile"));
    }
    Ok(f)
}

/// Opens `path` for reading without changing the file's access time: with O_NOATIME, which the
/// kernel allows the file's owner and CAP_FOWNER, else without (the time then moves as any
/// reader's would). A checkpoint and a restart read what the job holds, and leave its times as
/// the job left them. `flags`: more open flags.
pub fn open_quietly(path: impl AsRef<std::path::Path>, flags: i32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |noatime: i32| std::fs::OpenOptions::new().read(true).custom_flags(flags | noatime).open(path.as_ref());
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        r => r,
    }
}

/// Cuts a file the job wrote back to its size at the checkpoint, if it is still the file the job
/// had (`identity`: device and inode).
pub fn cut_back(path: &str, identity: (u64, u64), size: u64) -> Result<()> {
    let f = open_regular(path, true, Some(identity)).context(|| format!("open {path} to cut it back"))?;
    f.set_len(size).context(|| format!("truncate {path} to its checkpoint size {size}"))
}

/// Reopens a file or device inside the task, at the record's offset; returns the descriptor.
pub fn open(task: &mut RemoteTask, rec: &FdRecord, path: &str, scratch_off: usize) -> Result<u64> {
    let addr = task.put_path(scratch_off, path)?;
    let fd = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, reopen_flags(rec), 0]).context(|| format!("reopen {path}"))?;
    seek_as_recorded(task, rec, path, fd)
}

/// [`open`] for a file the process held, recorded as (device, inode): with the process's own
/// rights, else the image owner's `rights` (see [`crate::fsid::open_with_owner_rights_if_refused`]).
pub fn open_held(
    task: &mut RemoteTask,
    rec: &FdRecord,
    path: &str,
    scratch_off: usize,
    (rights, recorded): (Option<&crate::fsid::RemoteRights>, (u64, u64)),
) -> Result<u64> {
    let flags = reopen_flags(rec);
    let fd = crate::fsid::open_with_owner_rights_if_refused(task, rights, &format!("reopen {path}"), Some(recorded), |task| {
        let addr = task.put_path(scratch_off, path)?;
        task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags, 0])
    })?;
    seek_as_recorded(task, rec, path, fd)
}

/// The flags a descriptor is opened again with: its own, never creating or truncating, never
/// taking a terminal.
fn reopen_flags(rec: &FdRecord) -> u64 {
    (rec.flags & !((libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL) as u32) | libc::O_NOCTTY as u32) as u64
}

fn seek_as_recorded(task: &mut RemoteTask, rec: &FdRecord, path: &str, fd: u64) -> Result<u64> {
    // An O_PATH descriptor has no position (lseek fails with EBADF).
    if matches!(rec.kind, FdKind::File(_)) && rec.flags & libc::O_PATH as u32 == 0 {
        task.syscall("lseek", libc::SYS_lseek, &[fd, rec.pos, libc::SEEK_SET as u64]).context(|| format!("seek {path} to {}", rec.pos))?;
    }
    Ok(fd)
}

/// Makes something again for a moment inside the task, at `path` or, if something took that
/// name since, at `path` + `beside`: `make` is the injected call (mkdir, mknodat) given the
/// path's address. For what the job holds nameless (a removed working directory, an unlinked
/// FIFO), which the caller opens or enters and removes again. Returns where, and its address
/// in the scratch area.
pub fn make_for_a_moment(
    task: &mut RemoteTask,
    path: &str,
    beside: &str,
    what: &str,
    scratch_off: usize,
    make: impl Fn(&mut RemoteTask, u64) -> std::io::Result<u64>,
) -> Result<(String, u64)> {
    let other = format!("{path}{beside}");
    for at in [path, other.as_str()] {
        let addr = task.put_path(scratch_off, at)?;
        match make(task, addr) {
            Ok(_) => return Ok((at.to_string(), addr)),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(Error::Other(format!("make the {what} {path} again for a moment: {e}"))),
        }
    }
    Err(Error::Other(format!("make the {what} {path} again for a moment: its name and {other} are taken")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_reopened_by_number_hold_no_state() {
        for (major, minor) in [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 1), (4, 0), (4, 1), (4, 63)] {
            assert!(is_reopenable_device_number(libc::makedev(major, minor)), "{major}:{minor}");
        }
        // /dev/mem, /dev/kmem, /dev/port, a serial line, /dev/tty (by path only), a disk, /dev/fuse.
        for (major, minor) in [(1, 1), (1, 2), (1, 4), (4, 64), (5, 0), (8, 0), (10, 229)] {
            assert!(!is_reopenable_device_number(libc::makedev(major, minor)), "{major}:{minor}");
        }
    }
}
