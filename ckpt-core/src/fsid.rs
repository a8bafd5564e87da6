//! Acting on files with a job's own rights.
//!
//! A restart as root rebuilds processes that may run as other users (a service that dropped to
//! its own uid). Every file the restorer creates, truncates, overwrites or removes for such a
//! process, and every file the process reopens while it is rebuilt, goes through its own
//! filesystem identity (fsuid, fsgid, supplementary groups): the kernel then checks each path
//! as it would have checked the program's own call. A user who swapped a directory of their job
//! for a symbolic link to /etc gains nothing: the restorer can only do there what the user could.
//!
//! Linux keeps the filesystem ids and the groups per thread, and a thread whose fsuid leaves 0
//! loses the file capabilities from its effective set (CAP_DAC_OVERRIDE, CAP_FOWNER, ...) until
//! it returns (capabilities(7), "Effect of user ID changes on capabilities"). So the switch
//! affects only the calling thread, never the restorer's IO threads, and undoing it gives root's
//! rights back. glibc's `setgroups` changes every thread of the process (it broadcasts the
//! change), so the groups are set by the raw system call.
//!
//! Where the restorer is not root (an ordinary user's restart, in their user namespace) the
//! identities are already the user's, and nothing changes.

use std::os::unix::fs::MetadataExt;

use crate::error::{Error, Result};
use crate::objects::creds::CredsRecord;
use crate::ptrace::{Injector, RemoteTask, Scratch};
use crate::sys;

/// The ids the kernel checks file access against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl FsIdentity {
    /// A thread's filesystem identity, from its credentials at the checkpoint.
    pub fn of(creds: &CredsRecord) -> FsIdentity {
        FsIdentity { uid: creds.uids[3], gid: creds.gids[3], groups: creds.groups.clone() }
    }

    /// The same identity as a user namespace of the job numbers it (see
    /// [`crate::objects::user_namespaces`]): what a process in it sets and reads back.
    pub fn numbered(&self, numbering: crate::objects::user_namespaces::Numbering) -> FsIdentity {
        FsIdentity { uid: numbering.uid(self.uid), gid: numbering.gid(self.gid), groups: self.groups.iter().map(|&g| numbering.gid(g)).collect() }
    }

    /// The calling thread's identity now.
    fn current() -> Result<FsIdentity> {
        let groups = nix::unistd::getgroups().map_err(|e| Error::Other(format!("getgroups: {e}")))?;
        // setfsuid(-1) changes nothing and returns the current one.
        let uid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw();
        let gid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(u32::MAX)).as_raw();
        Ok(FsIdentity { uid, gid, groups: groups.into_iter().map(|g| g.as_raw()).collect() })
    }
}

/// This thread acting with another filesystem identity, until dropped.
#[must_use = "the identity goes back when this is dropped"]
pub struct ActingAs {
    before: FsIdentity,
}

/// Makes the calling thread check file access as `id`; `None` when it already does (or `id` is
/// `None`: the caller asked for the restorer's own rights). Fails, changing nothing, when the
/// kernel does not grant it.
pub fn act_as(id: Option<&FsIdentity>) -> Result<Option<ActingAs>> {
    let Some(id) = id else { return Ok(None) };
    let before = FsIdentity::current()?;
    if before == *id {
        return Ok(None);
    }
    let guard = ActingAs { before: before.clone() };
    set_thread_identity(id, &before)?;
    Ok(Some(guard))
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        let now = FsIdentity::current();
        if let Err(e) = now.and_then(|now| set_thread_identity(&self.before, &now)) {
            // The thread keeps the job's rights, fewer than its own: what it does next fails
            // with EACCES rather than doing too much.
            tracing::warn!("could not give this thread its own file rights back: {e}");
        }
    }
}

/// Groups first (they need CAP_SETGID, which leaving fsuid 0 would not take, but keeping the
/// order of a real change of user helps reading), then fsgid, then fsuid. Each is checked:
/// setfsuid and setfsgid report no error.
fn set_thread_identity(id: &FsIdentity, now: &FsIdentity) -> Result<()> {
    if id.groups != now.groups {
        sys::creds::set_thread_groups(&id.groups).map_err(|e| Error::Other(format!("take the supplementary groups {:?} for file access: {e}", id.groups)))?;
    }
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(id.gid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(id.uid));
    let got = FsIdentity::current()?;
    if got.uid != id.uid || got.gid != id.gid {
        return Err(Error::Other(format!("take the file access ids uid {} gid {} (this thread has uid {} gid {})", id.uid, id.gid, got.uid, got.gid)));
    }
    Ok(())
}

/// The file rights of a process being rebuilt, while it reopens what it held: its own
/// (`own`, switched to by [`act_as_remote`]), and those of the image's owner (`owner`: the
/// rights the restorer gave it, root's for a root job, never more), taken only where its own
/// do not reach ([`open_with_owner_rights_if_refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRights {
    pub own: FsIdentity,
    pub owner: FsIdentity,
    /// The restart runs in another boot than the checkpoint: a reopened file is the recorded
    /// one by its inode (device numbers are this boot's).
    pub elsewhere: bool,
}

/// The same switch inside a process being rebuilt (its main thread, through injected system
/// calls), for the files it reopens itself. Returns both identities, for
/// [`open_with_owner_rights_if_refused`] and for going back with [`end_remote`]; `None` when
/// nothing changed.
pub fn act_as_remote(id: Option<&FsIdentity>, inj: &mut Injector, scratch: Scratch) -> Result<Option<RemoteRights>> {
    let Some(id) = id else { return Ok(None) };
    let before = remote_current(inj, scratch)?;
    if before == *id {
        return Ok(None);
    }
    set_remote(id, &before, inj, scratch)?;
    Ok(Some(RemoteRights { own: id.clone(), owner: before, elsewhere: false }))
}

/// Gives the rebuilt process back the identity [`act_as_remote`] found.
pub fn end_remote(rights: Option<RemoteRights>, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    let Some(rights) = rights else { return Ok(()) };
    let now = remote_current(inj, scratch)?;
    set_remote(&rights.owner, &now, inj, scratch)
}

/// Opens, inside the task, a file the process held: `open` is the injected call (it puts its own
/// path in the scratch area each time: switching rights uses the scratch area too) and returns
/// the descriptor.
///
/// First with the process's own rights, as the program's own call would be checked. A program
/// that opened its files before changing to another user (a daemon started by root: nginx,
/// sshd, PostgreSQL's postmaster) may not reach them with its rights now: where the kernel
/// refuses (EACCES, EPERM), the open is tried again with the image owner's rights (`rights.owner`:
/// root's for a root job, the user's own for a user's, never more; docs/TRUST.md), and what it
/// opened must be the very file the job had (`recorded`: device and inode), else it is closed
/// and refused: a link put in the path since, to a file only the owner may open, gains nothing.
/// `recorded: None` is for what gives no access by itself (a directory entered).
pub fn open_with_owner_rights_if_refused(
    task: &mut RemoteTask,
    rights: Option<&RemoteRights>,
    what: &str,
    recorded: Option<(u64, u64)>,
    mut open: impl FnMut(&mut RemoteTask) -> std::io::Result<u64>,
) -> Result<u64> {
    let refused = match open(task) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => e,
        r => return r.map_err(|e| Error::Other(format!("{what}: {e}"))),
    };
    let Some(rights) = rights else { return Err(Error::Other(format!("{what}: {refused}"))) };
    {
        let (inj, scratch) = task.split();
        set_remote(&rights.owner, &rights.own, inj, scratch)?;
    }
    let opened = open(task);
    {
        let (inj, scratch) = task.split();
        set_remote(&rights.own, &rights.owner, inj, scratch)?;
    }
    let fd = opened.map_err(|e| Error::Other(format!("{what}: {e} (with the process's own rights: {refused})")))?;
    if let Some(recorded) = recorded {
        let now = std::fs::metadata(format!("/proc/{}/fd/{fd}", task.pid)).map(|m| (m.dev(), m.ino()));
        let same = now.as_ref().is_ok_and(|&(dev, ino)| ino == recorded.1 && (rights.elsewhere || dev == recorded.0));
        if !same {
            task.syscall("close", libc::SYS_close, &[fd])?;
            return Err(Error::Other(format!(
                "{what}: the process's own rights are refused ({refused}) and, with the rights of the image's owner, the path leads to another file than the job had (device and inode {now:?}, recorded {recorded:?}): put the file back"
            )));
        }
    }
    tracing::info!(
        pid = task.pid,
        "{what}: reopened with the rights of the image's owner (uid {}): the process's own (uid {}) are refused, as for a file it opened before changing its user",
        rights.owner.uid,
        rights.own.uid
    );
    Ok(fd)
}

fn remote_current(inj: &mut Injector, scratch: Scratch) -> Result<FsIdentity> {
    const MAX_GROUPS: usize = 512;
    let uid = inj.call("setfsuid(-1)", libc::SYS_setfsuid, &[u32::MAX as u64])? as u32;
    let gid = inj.call("setfsgid(-1)", libc::SYS_setfsgid, &[u32::MAX as u64])? as u32;
    let room = scratch.len.min(MAX_GROUPS * 4) / 4;
    let list = scratch.addr;
    let n = inj.call("getgroups", libc::SYS_getgroups, &[room as u64, list])? as usize;
    let bytes = scratch.get(0, n * 4)?;
    let groups = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok(FsIdentity { uid, gid, groups })
}

fn set_remote(id: &FsIdentity, now: &FsIdentity, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    if id.groups != now.groups {
        let bytes: Vec<u8> = id.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
        let list = scratch.put(0, &bytes)?;
        inj.call("setgroups", libc::SYS_setgroups, &[id.groups.len() as u64, list])
            .map_err(|e| Error::Other(format!("take the supplementary groups {:?} for file access: {e}", id.groups)))?;
    }
    inj.call("setfsgid", libc::SYS_setfsgid, &[id.gid as u64])?;
    inj.call("setfsuid", libc::SYS_setfsuid, &[id.uid as u64])?;
    let got = remote_current(inj, scratch)?;
    if got.uid != id.uid || got.gid != id.gid {
        return Err(Error::Other(format!("take the file access ids uid {} gid {} in the process (it has uid {} gid {})", id.uid, id.gid, got.uid, got.gid)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root acting as an ordinary user cannot write a file only root may write, and has its
    /// rights back afterwards. Runs in a thread of its own: the switch is per thread.
    #[test]
    #[cfg_attr(ckpt_not_root, ignore = "needs root: built by another user, nothing to take away")]
    fn acting_as_a_user_takes_roots_file_rights_away_and_gives_them_back() {
        assert!(nix::unistd::geteuid().is_root(), "built as root, run as another user: nothing to take away");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("roots");
        std::fs::write(&file, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f2 = file.clone();
        std::thread::spawn(move || {
            let user = FsIdentity { uid: 65534, gid: 65534, groups: vec![65534] };
            {
                let _as = act_as(Some(&user)).unwrap().expect("root is not nobody");
                let e = std::fs::OpenOptions::new().write(true).open(&f2).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
                assert_eq!(FsIdentity::current().unwrap(), user);
            }
            std::fs::OpenOptions::new().write(true).open(&f2).unwrap();
            assert_eq!(FsIdentity::current().unwrap().uid, 0);
        })
        .join()
        .unwrap();
        // Other threads never lost their rights.
        std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    }
}
