//! Whose rights a command acts with on its directory, decided once, before anything in it is
//! read or written (docs/TRUST.md, "Root and users' directories").
//!
//! An ordinary user acts with their own rights; the directory itself must be theirs
//! (`CheckpointDir::create` checks it). Root must never act with root's rights through a path
//! another user controls: a user who swaps their directory, or a directory on the way to it, for
//! a link at the right moment would otherwise have root read their image, or write `job.json`,
//! as root. So root opens the directory once (not following a link in its last component), and:
//!
//! - if another user owns it, becomes that user at once (their uid, gid and login groups, no
//!   capabilities), then checks that the path still leads to the directory it opened. Whatever
//!   is swapped afterwards is resolved with that user's rights, which the user has anyway;
//! - if root owns it, checks that every directory on the way is root's and writable by no one
//!   else (a sticky directory such as /tmp is fine when the entry in it is root's), and goes on
//!   with that path, resolved: no other user can change where it leads.
//!
//! A directory that does not exist yet (a launch) is judged by its nearest existing ancestor.
//! `ckpt restart --as-root` is the administrator's explicit choice to keep root's rights.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Settles whose rights this command acts with on `dir` (see the module's comment) and returns
/// the path to use from now on.
pub fn settle(dir: &Path, as_root: bool) -> Result<PathBuf> {
    if !nix::unistd::geteuid().is_root() || as_root {
        return Ok(dir.to_path_buf());
    }
    let absolute = std::path::absolute(dir).with_context(|| format!("the absolute path of {}", dir.display()))?;
    let (existing, opened) = open_nearest(&absolute)?;
    let meta = opened.metadata().with_context(|| format!("stat {}", existing.display()))?;
    if meta.uid() != 0 {
        tracing::info!(uid = meta.uid(), gid = meta.gid(), "{} belongs to another user: acting as that user", existing.display());
        ckpt_core::userns::become_user(meta.uid(), meta.gid()).with_context(|| format!("act on {} as its owner, uid {}", existing.display(), meta.uid()))?;
        let again = std::fs::metadata(&existing).with_context(|| format!("{} as its owner", existing.display()))?;
        if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) {
            bail!("{} changed while ckpt opened it (it leads to another directory now): nothing was done; run the command again", existing.display());
        }
        return Ok(dir.to_path_buf());
    }
    let resolved = std::fs::canonicalize(&existing).with_context(|| format!("resolve {}", existing.display()))?;
    let now = std::fs::metadata(&resolved).with_context(|| format!("stat {}", resolved.display()))?;
    if (now.dev(), now.ino()) != (meta.dev(), meta.ino()) {
        bail!("{} changed while ckpt opened it (it leads to another directory now): nothing was done; run the command again", existing.display());
    }
    if let Some(problem) = not_roots_own_way(&resolved, existing == absolute) {
        bail!(
            "{}: {problem}: root acts only on directories that no other user can change or swap on the way; use a directory reached through root's own directories (or run the command as the user who owns the image)",
            dir.display()
        );
    }
    match absolute.strip_prefix(&existing) {
        Ok(rest) if !rest.as_os_str().is_empty() => Ok(resolved.join(rest)),
        _ => Ok(resolved),
    }
}

/// [`settle`] for a command that only reads or asks (inspect, verify, status, checkpoint): a
/// directory that does not exist is left to the command to report.
pub fn settle_existing(dir: &Path) -> Result<PathBuf> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(dir.to_path_buf());
    }
    settle(dir, false)
}

/// The directory `absolute`, or the nearest of its ancestors that exists, opened without
/// following a link in its last component.
fn open_nearest(absolute: &Path) -> Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    for candidate in absolute.ancestors() {
        match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC).open(candidate) {
            Ok(f) => return Ok((candidate.to_path_buf(), f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                bail!(
                    "{}: a symbolic link or not a directory: root does not follow a link to the directory it acts on; give the directory itself",
                    candidate.display()
                )
            }
            Err(e) => return Err(e).with_context(|| format!("open {}", candidate.display())),
        }
    }
    bail!("no part of {} exists", absolute.display())
}

/// Why another user could change where the resolved path `dir` (root's own) leads, if they
/// could: a directory on the way (or `dir` itself, when it is the one acted on rather than the
/// parent of one root is to make) that is not root's, or that others may write without the
/// sticky bit protecting root's entry in it.
fn not_roots_own_way(dir: &Path, acted_on: bool) -> Option<String> {
    // The entry root makes in `dir` when it is only the nearest existing ancestor is root's.
    let mut child_uid = 0;
    for d in dir.ancestors() {
        let meta = match std::fs::symlink_metadata(d) {
            Ok(m) => m,
            Err(e) => return Some(format!("{} cannot be looked at ({e})", d.display())),
        };
        if let Some(problem) = roots_way_problem(meta.uid(), meta.mode(), child_uid, acted_on && d == dir) {
            return Some(format!("{} {problem}", d.display()));
        }
        child_uid = meta.uid();
    }
    None
}

/// Whether a directory on root's way is safe (pure): `uid` and `mode` are its own, `child_uid`
/// the owner of the next entry on the way, `last` whether it is the directory acted on.
fn roots_way_problem(uid: u32, mode: u32, child_uid: u32, last: bool) -> Option<String> {
    if uid != 0 {
        return Some(format!("belongs to uid {uid}"));
    }
    let others_write = mode & 0o022 != 0;
    let sticky = mode & libc::S_ISVTX != 0;
    match (others_write, last) {
        (false, _) => None,
        (true, true) => Some(format!("may be written by others (mode {:04o})", mode & 0o7777)),
        (true, false) if sticky && child_uid == 0 => None,
        (true, false) => Some(format!("may be written by others (mode {:04o}), who could put another directory in its place", mode & 0o7777)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_way_is_roots_alone() {
        // /, /var: root's, 0755.
        assert_eq!(roots_way_problem(0, 0o40755, 0, false), None);
        // /tmp, sticky, with root's entry in it; not with a user's.
        assert_eq!(roots_way_problem(0, 0o41777, 0, false), None);
        assert!(roots_way_problem(0, 0o41777, 1000, false).is_some());
        // A user's home on the way, or a world-writable directory without the sticky bit.
        assert!(roots_way_problem(1000, 0o40700, 0, false).unwrap().contains("uid 1000"));
        assert!(roots_way_problem(0, 0o40777, 0, false).is_some());
        // The directory acted on itself: nobody else may write it, sticky or not.
        assert!(roots_way_problem(0, 0o41777, 0, true).is_some());
        assert_eq!(roots_way_problem(0, 0o40700, 0, true), None);
    }
}
