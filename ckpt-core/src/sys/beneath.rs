//! A directory tree reached from one descriptor with no symbolic link followed on the way, for
//! `objects::protect`, which reads and rewrites trees that other users may write in while root
//! acts on them. Every path is resolved below the tree's parent directory, itself opened without
//! following a link (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS); the last component is acted
//! on with `*at` calls that do not follow it either (AT_SYMLINK_NOFOLLOW, O_NOFOLLOW, O_EXCL).
//! Whatever links a user plants, before or during, a call acts inside the tree or fails (ELOOP,
//! or EXDEV for a `..` that would leave it).
//!
//! Modes, owners and contents are set through a descriptor of the entry itself, never through a
//! name a second time. An O_PATH descriptor is reopened or changed through /proc/self/fd, which
//! reaches its inode, not a name (chmod has no descriptor-only form for O_PATH before Linux 6.6's
//! fchmodat2, and reopening an O_PATH descriptor for writing has none at all).

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, FileStat, Mode};
use nix::unistd::{Gid, Uid, UnlinkatFlags};

/// A tree: its top entry (a directory, or a single file) and the directory above it.
pub struct Beneath {
    base: OwnedFd,
    top: String,
}

/// How every path below the base is resolved.
fn resolve() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

impl Beneath {
    /// The tree whose top is `root` (an absolute path without links: a link on the way now is
    /// refused with ELOOP). Fails with ENOENT when the directory above it is gone.
    pub fn open(root: &Path) -> io::Result<Beneath> {
        let invalid = || io::Error::new(io::ErrorKind::InvalidInput, format!("{} has no parent directory or no name", root.display()));
        let parent = root.parent().ok_or_else(invalid)?;
        let top = root.file_name().and_then(|n| n.to_str()).ok_or_else(invalid)?.to_string();
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let base = openat2(nix::fcntl::AT_FDCWD, parent, how)?;
        Ok(Beneath { base, top })
    }

    /// `rel` (`/`-separated, "" for the top) as a path from the base.
    fn path(&self, rel: &str) -> String {
        if rel.is_empty() {
            self.top.clone()
        } else {
            format!("{}/{rel}", self.top)
        }
    }

    /// Opens the entry `rel` itself (O_NOFOLLOW: with O_PATH, a link is opened as a link).
    pub fn open_entry(&self, rel: &str, flags: OFlag) -> io::Result<OwnedFd> {
        let how = OpenHow::new().flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).resolve(resolve());
        Ok(openat2(&self.base, self.path(rel).as_str(), how)?)
    }

    /// The directory that holds `rel`, and `rel`'s name in it.
    fn parent(&self, rel: &str) -> io::Result<(OwnedFd, String)> {
        let path = self.path(rel);
        let (dir, name) = path.rsplit_once('/').unwrap_or((".", path.as_str()));
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC).resolve(resolve());
        Ok((openat2(&self.base, dir, how)?, name.to_string()))
    }

    /// `lstat` of the entry.
    pub fn lstat(&self, rel: &str) -> io::Result<FileStat> {
        let (dir, name) = self.parent(rel)?;
        Ok(fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?)
    }

    /// The entries of the directory `rel` with their `lstat`; an entry removed meanwhile is left
    /// out.
    pub fn list(&self, rel: &str) -> io::Result<Vec<(String, FileStat)>> {
        Ok(list_dir(self.open_entry(rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?)?.1)
    }

    /// The target of the link `rel`.
    pub fn read_link(&self, rel: &str) -> io::Result<OsString> {
        let (dir, name) = self.parent(rel)?;
        Ok(nix::fcntl::readlinkat(&dir, name.as_str())?)
    }

    pub fn make_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        Ok(nix::sys::stat::mkdirat(&dir, name.as_str(), Mode::from_bits_truncate(mode))?)
    }

    pub fn make_link(&self, rel: &str, target: &str) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        Ok(nix::unistd::symlinkat(target, &dir, name.as_str())?)
    }

    /// A new regular file `rel`, open for writing; fails if anything is there (a link included).
    pub fn create_new(&self, rel: &str, mode: u32) -> io::Result<File> {
        let (dir, name) = self.parent(rel)?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        Ok(File::from(nix::fcntl::openat(&dir, name.as_str(), flags, Mode::from_bits_truncate(mode))?))
    }

    /// Removes the entry `rel`, and everything below it when it is a directory.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        remove_at(&dir, &name)
    }
}

/// The entries of an open directory with their `lstat`, and the directory (for `*at` calls).
fn list_dir(fd: OwnedFd) -> io::Result<(nix::dir::Dir, Vec<(String, FileStat)>)> {
    let mut dir = nix::dir::Dir::from_fd(fd)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => out.push((name, st)),
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok((dir, out))
}

/// Removes `name` in `dir`, and what is below it: each directory is opened from its parent's
/// descriptor without following a link.
fn remove_at(dir: &impl AsFd, name: &str) -> io::Result<()> {
    let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let (below, children) = list_dir(nix::fcntl::openat(dir, name, flags, Mode::empty())?)?;
        for (child, _) in children {
            remove_at(&below, &child)?;
        }
        nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir)?;
    } else {
        nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(())
}

/// The /proc/self/fd name of a descriptor: its inode, whatever names it has now.
fn proc_path(fd: &impl AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens the inode of an O_PATH descriptor again, with `flags` (checked against its mode).
pub fn reopen(fd: &OwnedFd, flags: OFlag) -> io::Result<File> {
    Ok(File::from(nix::fcntl::open(proc_path(fd).as_str(), flags | OFlag::O_CLOEXEC, Mode::empty())?))
}

/// chmod of the descriptor's inode (not a link's: Linux has no mode on links).
pub fn set_mode(fd: &OwnedFd, mode: u32) -> io::Result<()> {
    Ok(nix::sys::stat::fchmodat(nix::fcntl::AT_FDCWD, proc_path(fd).as_str(), Mode::from_bits_truncate(mode), nix::sys::stat::FchmodatFlags::FollowSymlink)?)
}

/// chown of the descriptor's inode (a link's own when the descriptor is a link's).
pub fn set_owner(fd: &OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    Ok(nix::unistd::fchownat(fd.as_fd(), "", Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_EMPTY_PATH)?)
}

/// `fstat` of a descriptor (O_PATH ones included).
pub fn stat(fd: &OwnedFd) -> io::Result<FileStat> {
    Ok(nix::sys::stat::fstat(fd)?)
}
