//! O_PATH descriptors on a symbolic link itself (O_NOFOLLOW) whose name was removed while open
//! (zdtm's `symlink01`: a program holds a link to read where it led, with readlinkat(fd, "")).
//! A link is its target string and owner: both are kept. Restore makes the link again for a
//! moment under its old name (or beside it, where something took the name), opens it with the
//! descriptor's flags, gives it its owner and removes it: the process holds a removed link
//! that still leads where it did.

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, Opening};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemovedSymlinkRecord {
    /// The path it had, without " (deleted)".
    pub path: String,
    /// Where it leads (its contents, as readlink gives them).
    pub target: String,
    /// Its owner and group.
    pub owner: (u32, u32),
}

/// The longest target a link may have (the kernel's PATH_MAX, with its NUL).
const TARGET_MAX: usize = 4095;

/// Captures an O_PATH descriptor on a removed link; `path` is its old path, `link` the
/// descriptor taken into this process.
pub fn capture(pid: Tid, fd: i32, path: &str, meta: &std::fs::Metadata, link: &OwnedFd) -> Result<RemovedSymlinkRecord> {
    // An empty path reads the link the descriptor holds (Linux 2.6.39).
    let target = nix::fcntl::readlinkat(link, "").map_err(|e| Error::Other(format!("pid {pid}: fd {fd} ({path}): read the removed link: {e}")))?;
    let target = target.into_string().map_err(|t| Error::Unsupported { pid, what: format!("fd {fd} ({path}, a removed link to {t:?}, not UTF-8)") })?;
    Ok(RemovedSymlinkRecord { path: path.to_string(), target, owner: (meta.uid(), meta.gid()) })
}

/// Checks what [`DescriptorKind::open`] would act on. Pure.
pub fn validate(r: &RemovedSymlinkRecord) -> std::result::Result<(), String> {
    super::removed_dir::valid_old_path(&r.path)?;
    if r.target.is_empty() || r.target.len() > TARGET_MAX || r.target.contains('\0') {
        return Err(format!("a link to {:?}", r.target));
    }
    Ok(())
}

impl DescriptorKind for RemovedSymlinkRecord {
    fn describe(&self) -> String {
        format!("{} (a removed link to {})", self.path, self.target)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        let task: &mut RemoteTask = at.task;
        let what = format!("pid {}: fd {} ({})", at.ns_pid, at.rec.fd, self.describe());
        // The target goes after the path in the scratch area: a page each is room enough.
        let target_off = at.scratch_off + 4096;
        let symlink = |t: &mut RemoteTask, path_addr: u64| {
            let target_addr = t.put_path(target_off, &self.target).map_err(std::io::Error::other)?;
            t.syscall("symlinkat", libc::SYS_symlinkat, &[target_addr, libc::AT_FDCWD as u64, path_addr])
        };
        let (made, _) = super::file::make_for_a_moment(task, &self.path, ".ckpt-removed-link", "removed link", at.scratch_off, symlink)?;
        let flags = (at.rec.flags & !((libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL) as u32)) | (libc::O_PATH | libc::O_NOFOLLOW) as u32;
        let addr = task.put_path(at.scratch_off, &made)?;
        let opened = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0]);
        let removed = task.syscall("unlink", libc::SYS_unlink, &[addr]);
        let fd = opened.context(|| format!("{what}: open {made}"))?;
        removed.context(|| format!("{what}: remove {made} once open"))?;
        let (uid, gid) = self.owner;
        let empty = task.put_path(at.scratch_off, "")?;
        if let Err(e) = task.syscall("fchownat", libc::SYS_fchownat, &[fd, empty, uid as u64, gid as u64, libc::AT_EMPTY_PATH as u64]) {
            tracing::warn!(uid, gid, "{what}: the removed link comes back the restorer's, not {uid}:{gid}: {e}");
        }
        Ok(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_out_of_bounds_are_refused() {
        let good = RemovedSymlinkRecord { path: "/w/link".into(), target: "/w/file".into(), owner: (0, 0) };
        assert_eq!(validate(&good), Ok(()));
        for bad in [
            RemovedSymlinkRecord { path: "w/link".into(), ..good.clone() },
            RemovedSymlinkRecord { path: "/w/../etc/x".into(), ..good.clone() },
            RemovedSymlinkRecord { target: String::new(), ..good.clone() },
            RemovedSymlinkRecord { target: "a\0b".into(), ..good.clone() },
            RemovedSymlinkRecord { target: "x".repeat(TARGET_MAX + 1), ..good.clone() },
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_target_of_a_removed_link_is_read_through_its_descriptor() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("ckpt-removed-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("l");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("../somewhere/else", &link).unwrap();
        let held: OwnedFd = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_NOFOLLOW).open(&link).unwrap().into();
        let meta = std::fs::symlink_metadata(&link).unwrap();
        std::fs::remove_file(&link).unwrap();
        let rec = capture(1, 3, &link.to_string_lossy(), &meta, &held).unwrap();
        assert_eq!(rec.target, "../somewhere/else");
        assert_eq!(validate(&rec), Ok(()));
        std::fs::remove_dir(&dir).unwrap();
    }
}
