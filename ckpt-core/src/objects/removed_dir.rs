//! Descriptors on a directory removed while open (zdtm's `rmdir_open`: a build directory
//! deleted under a program that holds it, a watched directory removed). A removed directory is
//! empty and has no name, so nothing of it but its permission bits and owner is kept. Restore
//! makes a fresh directory, opens it with the descriptor's flags and removes it at once: the
//! process holds a removed, empty directory again (fstat shows `st_nlink` 0). It is made under
//! its old name when that name's directory still exists and the name is free, so /proc shows
//! the old path " (deleted)" (a watcher of that directory sees the name come and go); else
//! under a name of the restart's own in the nearest directory of the old path that exists.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, Opening};
use crate::error::{Context, Error, Result};
use crate::ptrace::Tid;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemovedDirRecord {
    /// The path it had, without " (deleted)".
    pub path: String,
    /// Permission bits.
    pub mode: u32,
    /// Its owner and group.
    pub owner: (u32, u32),
}

/// Captures a descriptor on a removed directory; `path` is its old path.
pub fn capture(pid: Tid, fd: i32, path: &str, meta: &std::fs::Metadata) -> Result<RemovedDirRecord> {
    if meta.nlink() > 0 {
        return Err(Error::Unsupported { pid, what: format!("fd {fd} ({path}, a directory shown deleted but still linked)") });
    }
    Ok(RemovedDirRecord { path: path.to_string(), mode: meta.mode() & 0o7777, owner: (meta.uid(), meta.gid()) })
}

/// Whether a removed object's old path is one a restart may make something at for a moment:
/// absolute, without NUL or `..`. Pure.
pub(super) fn valid_old_path(path: &str) -> std::result::Result<(), String> {
    if !path.starts_with('/') || path.contains('\0') || path.split('/').any(|c| c == "..") {
        return Err(format!("path {path:?}"));
    }
    Ok(())
}

/// Checks what [`open`] would act on. Pure.
pub fn validate(r: &RemovedDirRecord) -> std::result::Result<(), String> {
    valid_old_path(&r.path)?;
    if r.mode & !0o7777 != 0 {
        return Err(format!("mode {:o}", r.mode));
    }
    Ok(())
}

impl DescriptorKind for RemovedDirRecord {
    fn describe(&self) -> String {
        format!("{} (a removed directory)", self.path)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        let task = &mut *at.task;
        let what = format!("pid {}: fd {} ({})", at.ns_pid, at.rec.fd, self.describe());
        let dir = match self.path.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((dir, _)) => dir,
        };
        let parent = super::deleted::nearest_existing(dir, |p| std::path::Path::new(p).is_dir());
        // Its old name if free, else one of its own for the moment it exists: the restorer's
        // process id and the descriptor's number.
        let own = format!("{}/.ckpt-removed-{}-{}", parent.trim_end_matches('/'), std::process::id(), at.rec.fd);
        let mut made = None;
        for name in [(parent == dir).then(|| self.path.clone()), Some(own)].into_iter().flatten() {
            let addr = task.put_path(at.scratch_off, &name)?;
            match task.syscall("mkdirat", libc::SYS_mkdirat, &[libc::AT_FDCWD as u64, addr, 0o700]) {
                Ok(_) => {
                    made = Some((name, addr));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).context(|| format!("{what}: make {name}")),
            }
        }
        let Some((name, addr)) = made else {
            return Err(Error::Other(format!("{what}: every name to make it under in {parent} is taken")));
        };
        let flags = (at.rec.flags & !((libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL) as u32)) | (libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NOCTTY) as u32;
        let opened = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0]);
        let removed = task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, addr, libc::AT_REMOVEDIR as u64]);
        let fd = opened.context(|| format!("{what}: open {name}"))?;
        removed.context(|| format!("{what}: remove {name} once open"))?;
        let (uid, gid) = self.owner;
        if let Err(e) = task.syscall("fchown", libc::SYS_fchown, &[fd, uid as u64, gid as u64]) {
            tracing::warn!(uid, gid, "{what}: the removed directory comes back the restorer's, not {uid}:{gid}: {e}");
        }
        task.syscall("fchmod", libc::SYS_fchmod, &[fd, self.mode as u64]).context(|| format!("{what}: give it mode {:o}", self.mode))?;
        Ok(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_out_of_bounds_are_refused() {
        let good = RemovedDirRecord { path: "/w/d/sub".into(), mode: 0o700, owner: (0, 0) };
        assert_eq!(validate(&good), Ok(()));
        for bad in [
            RemovedDirRecord { path: "w/d".into(), ..good.clone() },
            RemovedDirRecord { path: "/w/../etc".into(), ..good.clone() },
            RemovedDirRecord { path: "/w/\0".into(), ..good.clone() },
            RemovedDirRecord { mode: 0o40700, ..good.clone() },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }
}
