//! memfd descriptors: a file in memory with a name and seals. Its contents are saved in the
//! image (as for deleted files, with their helpers in [`super::deleted`]); restore creates a
//! memfd with the same name, fills it, and adds the same seals.
//!
//! A memfd the process also maps shared is recreated by the memory restore, which runs first,
//! for the mapping, and keeps a descriptor of it parked; the descriptor is then opened on that
//! same object, through the parked one, so that the two are still one file. The memory restore makes such a
//! memfd without sealing, so a mapped memfd with seals beyond F_SEAL_SEAL is refused; so is a
//! memfd open in one process and mapped shared only by another, which would come back as two
//! objects. A memfd the process maps only privately is tied the same way when it has no seals
//! (its pages the process did not write read the object, which the descriptor may change); a
//! sealed one comes back as its private mapping's own memory, every page of it, which is the
//! same for an object no one may write.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::deleted;
use super::descriptor::{self, stream, CaptureCtx, DescriptorKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemfdRecord {
    /// The name given to memfd_create.
    pub name: String,
    /// The memfd's identity at the checkpoint: descriptions with the same are one memfd.
    pub dev: u64,
    pub ino: u64,
    /// F_SEAL_* bits.
    pub seals: u32,
    /// A mapping of it in the same process (start, end), whose object the descriptor is opened
    /// on at restore: a shared one, or else a private one when the memfd has no seals.
    pub mapped: Option<(u64, u64)>,
    /// The whole memfd, carried by its first descriptor captured (the others have `None`).
    pub contents: Option<Vec<u8>>,
    /// Its permission bits and owner (fchmod, fchown: zdtm's memfd00), given back after it is
    /// filled. Format 31 (none from an older image, whose memfds come back 0777, the
    /// restorer's).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub mode_owner: Option<(u32, u32, u32)>,
}

impl std::fmt::Debug for MemfdRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemfdRecord")
            .field("name", &self.name)
            .field("ino", &self.ino)
            .field("seals", &format_args!("{:#x}", self.seals))
            .field("mapped", &self.mapped.map(|(start, end)| format!("{start:#x}-{end:#x}")))
            .field("contents", &self.contents.as_ref().map(|c| format!("{} bytes", c.len())))
            .finish()
    }
}

/// How /proc shows a memfd, before its name.
pub const LINK_PREFIX: &str = "/memfd:";

/// The name of a memfd from its link ("/memfd:NAME (deleted)"; pure).
pub fn memfd_name(target: &str) -> Option<&str> {
    target.strip_prefix(LINK_PREFIX)?.strip_suffix(" (deleted)")
}

/// Captures a descriptor on a memfd of a stopped process.
pub fn capture(pid: Tid, fd: i32, name: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<MemfdRecord> {
    let what = format!("memfd:{name}");
    let (shared, private) = mappings(pid, meta.ino())?;
    if shared.is_none() {
        for &other in ctx.pids.iter().filter(|&&p| p != pid) {
            if mappings(other, meta.ino()).is_ok_and(|(shared, _)| shared.is_some()) {
                return Err(Error::Unsupported { pid, what: format!("fd {fd} ({what}, which only pid {other} maps)") });
            }
        }
    }
    let link = format!("/proc/{pid}/fd/{fd}");
    let file = super::file::open_quietly(&link, 0).context(|| format!("open {link} ({what})"))?;
    let seals = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GET_SEALS).map_err(std::io::Error::from).context(|| format!("seals of {what}"))?;
    let sealed = seals as u32 & !(libc::F_SEAL_SEAL as u32) != 0;
    if shared.is_some() && sealed {
        return Err(Error::Unsupported { pid, what: format!("fd {fd} ({what}, mapped shared and sealed with {seals:#x})") });
    }
    let mapped = shared.or(if sealed { None } else { private });
    let contents = deleted::read_contents(pid, fd, &what, meta, ctx)?;
    let mode_owner = Some((meta.mode() & 0o7777, meta.uid(), meta.gid()));
    Ok(MemfdRecord { name: name.to_string(), dev: meta.dev(), ino: meta.ino(), seals: seals as u32, mapped, contents, mode_owner })
}

/// An address range, (start, end).
type Range = (u64, u64);

/// Where process `pid` maps the memfd with inode `ino`, shared and privately: (start, end) of
/// the first mapping of each kind, from one read of its maps.
fn mappings(pid: Tid, ino: u64) -> Result<(Option<Range>, Option<Range>)> {
    let is_memfd = |path: &procfs::MMapPath| matches!(path, procfs::MMapPath::Path(p) if p.to_string_lossy().starts_with("/memfd:"));
    let (mut shared, mut private) = (None, None);
    for m in procfs::maps(pid)?.into_iter().filter(|m| m.inode == ino && is_memfd(&m.pathname)) {
        let slot = if m.perms.contains(procfs::MMPermissions::SHARED) { &mut shared } else { &mut private };
        slot.get_or_insert(m.address);
    }
    Ok((shared, private))
}

/// The memfd_create flags, and the seals to add after filling (pure). A memfd made without
/// MFD_ALLOW_SEALING shows the one seal F_SEAL_SEAL, and is made again the same way.
fn create_flags(seals: u32) -> (u32, u32) {
    if seals == libc::F_SEAL_SEAL as u32 {
        (libc::MFD_CLOEXEC, 0)
    } else {
        (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING, seals)
    }
}

impl DescriptorKind for MemfdRecord {
    fn describe(&self) -> String {
        format!("memfd:{}", self.name)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.scratch_off, stream(&mut at.reader, at.rec)?)
    }
}

/// Recreates the memfd (for the first of its descriptions) or reopens it (for the others).
/// `reader`: the process's stream, where a large memfd's contents are.
fn open(
    task: &mut RemoteTask,
    ns_pid: Tid,
    rec: &FdRecord,
    m: &MemfdRecord,
    ctx: &mut RestoreCtx,
    scratch_off: usize,
    reader: &mut crate::image::StreamReader,
) -> Result<u64> {
    let key = (m.dev, m.ino);
    if let Some(fd) = deleted::reopen_existing(task, ns_pid, key, rec, ctx, scratch_off)? {
        return Ok(fd);
    }
    let contents = deleted::Source::of(m.contents.as_ref(), key, ctx)
        .ok_or_else(|| Error::Damaged { what: format!("the image lacks the contents of memfd:{}", m.name) })?;
    let (flags, seals) = create_flags(m.seals);
    let mfd = match m.mapped {
        // Already made, for the mapping: the same object, through the descriptor the memory
        // restore parked (a copy, as the code below closes what it opened).
        Some((start, end)) => {
            let (owner, kept) = ctx
                .shared_memory
                .get(&m.ino)
                .copied()
                .ok_or_else(|| Error::Damaged { what: format!("memfd:{}: its mapping at {start:#x}-{end:#x} was not restored first", m.name) })?;
            if owner == ns_pid {
                task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[kept, libc::F_DUPFD_CLOEXEC as u64, 0])?
            } else {
                descriptor::take_from(task, owner, kept)?
            }
        }
        None => {
            let addr = task.put_path(scratch_off, &m.name)?;
            task.syscall("memfd_create", libc::SYS_memfd_create, &[addr, flags as u64])?
        }
    };
    let seals = if m.mapped.is_some() { 0 } else { seals };
    contents.fill(task, mfd, reader, &format!("memfd:{}", m.name))?;
    if let Some((mode, uid, gid)) = m.mode_owner {
        // The owner first: chown clears the set-user-ID bits a mode may hold.
        deleted::give_owner(task, mfd, Some((uid, gid)), &format!("memfd:{}", m.name))?;
        task.syscall("fchmod", libc::SYS_fchmod, &[mfd, mode as u64]).context(|| format!("give memfd:{} its mode {mode:o}", m.name))?;
    }
    if seals != 0 {
        task.syscall("fcntl(F_ADD_SEALS)", libc::SYS_fcntl, &[mfd, libc::F_ADD_SEALS as u64, seals as u64])
            .context(|| format!("seal memfd:{} with {seals:#x}", m.name))?;
    }
    // The description memfd_create made is kept where the record's is read-write as that one
    // is: a reopen (through /proc) counts as a writer of the file, which an exec of it refuses
    // (ETXTBSY: what runc and fileless launchers do with a memfd), where memfd_create's own
    // description does not.
    let fd = if m.mapped.is_none() && rec.flags & libc::O_ACCMODE as u32 == libc::O_RDWR as u32 {
        let settable = (libc::O_APPEND | libc::O_DIRECT | libc::O_NOATIME | libc::O_NONBLOCK) as u32;
        task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[mfd, libc::F_SETFL as u64, (rec.flags & settable) as u64])?;
        task.syscall("lseek", libc::SYS_lseek, &[mfd, rec.pos, libc::SEEK_SET as u64])?;
        Ok(mfd)
    } else {
        let fd = deleted::reopen(task, mfd, rec, scratch_off);
        task.syscall("close", libc::SYS_close, &[mfd])?;
        fd
    };
    // The record's descriptor is at its number once this returns: later ones reopen it there.
    ctx.objects.insert(key, (ns_pid, rec.fd as u64));
    fd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_links() {
        assert_eq!(memfd_name("/memfd:hello (deleted)"), Some("hello"));
        assert_eq!(memfd_name("/memfd:with space (deleted)"), Some("with space"));
        assert_eq!(memfd_name("/memfd:x"), None);
        assert_eq!(memfd_name("/tmp/memfd:x (deleted)"), None);
    }

    #[test]
    fn sealing_is_allowed_unless_it_was_not() {
        let seal = libc::F_SEAL_SEAL as u32;
        let shrink_grow = (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) as u32;
        assert_eq!(create_flags(seal), (libc::MFD_CLOEXEC, 0));
        assert_eq!(create_flags(0), (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING, 0));
        assert_eq!(create_flags(shrink_grow | seal), (libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING, shrink_grow | seal));
    }
}
