//! Files deleted while open: their contents are saved in the image, and restore recreates them
//! as unlinked files in the same directory (O_TMPFILE where the filesystem has it), so that the
//! job finds the same bytes and no new name appears.
//!
//! Several descriptions of one deleted file (opened separately, in one process or several) must
//! reach one file again: the first recreates it and the others reopen it through
//! /proc/self/fd, from a descriptor taken from the first if it is in another process. The same
//! holds for memfds, which use the helpers here ([`read_contents`], [`fill`], [`reopen`]).
//! A deleted file the job also maps is one file for the descriptors and the mappings: the
//! first restore that needs it makes the copy, the other finds it (see [`open`]).
//!
//! A small file's contents are kept in its record. A larger one's go into the process's stream,
//! as the memory does, by extents (`SEEK_DATA`/`SEEK_HOLE`), so that a sparse file stays sparse
//! and costs only its data: the descriptor's record then has no contents, and the process's
//! [`SavedFileContents`] say where they are.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{self, stream, CaptureCtx, DescriptorKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};

/// The largest file whose contents a checkpoint keeps in the image.
pub const MAX_CONTENTS: u64 = 64 << 30;
/// The largest file whose contents are kept in its descriptor's record; larger ones go into the
/// process's stream ([`SavedFileContents`]).
pub const MAX_INLINE: u64 = 1 << 20;

/// The contents of a deleted file or memfd in the process's stream: its size, and its data
/// extents (the rest are holes), each at a stream offset, page-aligned.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedFileContents {
    /// The file, as the descriptor records name it.
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Sorted, disjoint, within `size`.
    pub extents: Vec<Extent>,
    /// Format 28: the file had space allocated beyond its data (fallocate: SEEK_DATA calls
    /// such space a hole), allocated again at restart so that a write there cannot fail for
    /// want of space where it could not before. False from an older image.
    #[serde(deserialize_with = "crate::image::since::since::<28, _, _>")]
    pub allocated: bool,
}

/// Space a file system may count for a file beyond its data (indirect blocks and the like):
/// more than this beyond the data extents is space the program allocated.
const ALLOCATED_SLACK: u64 = 64 << 10;

/// `len` bytes of a file from `file_offset`, at `stream_offset` in the process's stream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Extent {
    pub file_offset: u64,
    pub len: u64,
    pub stream_offset: u64,
}

/// A file whose contents are to go into the process's stream once its descriptors are
/// captured: see [`save_pending`].
#[derive(Debug, Clone)]
pub struct PendingSave {
    pid: Tid,
    /// Where the restorer opens the file: /proc/PID/fd/FD, or /proc/PID/exe.
    link: String,
    what: String,
    dev: u64,
    ino: u64,
}

#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeletedFileRecord {
    /// The path the file had, without " (deleted)".
    pub path: String,
    /// The file's identity at the checkpoint: descriptions with the same are one file.
    pub dev: u64,
    pub ino: u64,
    /// Permission bits.
    pub mode: u32,
    /// The whole file, carried by its first descriptor captured (the others have `None`).
    pub contents: Option<Vec<u8>>,
    /// Its access and modification times, given to the new copy once it is filled (format 13;
    /// none from an older image, and the copy has the restart's time then).
    #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
    pub times: Option<Times>,
    /// Its owner and group (format 22; none from an older image, and the copy is the
    /// restorer's then).
    #[serde(deserialize_with = "crate::image::since::since::<22, _, _>")]
    pub owner: Option<(u32, u32)>,
}

/// A file's access and modification times, (seconds, nanoseconds) each.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Times {
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
}

impl Times {
    pub fn of(meta: &std::fs::Metadata) -> Times {
        Times { atime: (meta.atime(), meta.atime_nsec()), mtime: (meta.mtime(), meta.mtime_nsec()) }
    }

    /// Gives them to the file open at `fd` in the task, from outside.
    pub fn set(&self, task: &RemoteTask, fd: u64, what: &str) -> Result<()> {
        let at = |(s, ns): (i64, i64)| std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32));
        let (Some(atime), Some(mtime)) = (at(self.atime), at(self.mtime)) else {
            return Err(Error::Damaged { what: format!("{what}: times {self:?} out of range") });
        };
        let link = format!("/proc/{}/fd/{fd}", task.pid);
        let f = super::file::open_quietly(&link, 0).context(|| format!("open {link} to set the times of {what}"))?;
        f.set_times(std::fs::FileTimes::new().set_accessed(atime).set_modified(mtime)).context(|| format!("set the times of {what}"))
    }
}

impl std::fmt::Debug for DeletedFileRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeletedFileRecord")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .field("mode", &format_args!("{:o}", self.mode))
            .field("owner", &self.owner)
            .field("contents", &self.contents.as_ref().map(|c| format!("{} bytes", c.len())))
            .finish()
    }
}

/// The path a deleted file's link names, if the link is one ("/dir/name (deleted)"; pure).
pub fn deleted_path(target: &str) -> Option<&str> {
    target.strip_suffix(" (deleted)").filter(|p| p.starts_with('/'))
}

/// Most entries of a directory looked through for another name of a file unlinked from it.
const MAX_SIBLINGS: usize = 1 << 16;

/// Another name, in the same directory, of the file whose link in /proc shows `path` deleted
/// while it has links left (`meta`): a link made before the unlink (zdtm's unlink_fstat03; a
/// rename over a hard link). The directory is read through `root` (the process's); the name
/// found is checked to lead to the same file. None when no entry of that directory is it (the
/// other link is elsewhere: not looked for across the file system).
pub fn another_name(pid: Tid, path: &str, meta: &std::fs::Metadata, root: &crate::procfs::NamespaceRoot) -> Option<String> {
    use std::os::unix::fs::DirEntryExt;
    let dir = std::path::Path::new(path).parent()?.to_str()?;
    let entries = std::fs::read_dir(root.path(dir)).ok()?;
    let name = entries.take(MAX_SIBLINGS).filter_map(|e| e.ok()).find(|e| e.ino() == meta.ino())?.file_name().into_string().ok()?;
    let other = std::path::Path::new(dir).join(name).to_str()?.to_string();
    super::memory::identify_file(pid, root, &other, meta.dev(), meta.ino()).ok().map(|_| other)
}

/// Reads the whole contents of the file open at `fd` in process `pid`, once per file (the first
/// time the file is seen in this checkpoint); refuses files above [`MAX_CONTENTS`]. A file
/// above [`MAX_INLINE`] is not read here: it is left in `ctx` for [`save_pending`], and the
/// record gets no contents.
pub fn read_contents(pid: Tid, fd: i32, what: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<Option<Vec<u8>>> {
    read_contents_at(pid, &format!("/proc/{pid}/fd/{fd}"), &format!("fd {fd}"), what, meta, ctx)
}

/// [`read_contents`] of the file the restorer opens at `link` (`held` says how the process holds
/// it, for messages).
fn read_contents_at(pid: Tid, link: &str, held: &str, what: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<Option<Vec<u8>>> {
    if meta.size() > MAX_CONTENTS {
        return Err(Error::Unsupported {
            pid,
            what: format!("{held} ({what} of {} GiB: above the {} GiB a checkpoint keeps)", meta.size() >> 30, MAX_CONTENTS >> 30),
        });
    }
    if !ctx.objects_seen.insert((meta.dev(), meta.ino())) {
        return Ok(None);
    }
    let pending = || PendingSave { pid, link: link.to_string(), what: what.to_string(), dev: meta.dev(), ino: meta.ino() };
    if meta.size() > MAX_INLINE {
        ctx.pending_saves.push(pending());
        return Ok(None);
    }
    // A new description of the same file, for reading whatever the job's access mode is.
    let file = super::file::open_quietly(link, 0).context(|| format!("open {link} ({what}) to save it"))?;
    let mut contents = Vec::with_capacity(meta.size() as usize);
    file.take(MAX_INLINE + 1).read_to_end(&mut contents).context(|| format!("read {what}"))?;
    if contents.len() as u64 > MAX_INLINE {
        // It grew since the stat (the job is frozen, but another may write it): into the stream.
        ctx.pending_saves.push(pending());
        return Ok(None);
    }
    Ok(Some(contents))
}

/// Writes the contents of the files [`read_contents`] left for process `pid` into its
/// `stream`, data extents only; returns where they are.
pub fn save_pending(pid: Tid, ctx: &mut CaptureCtx, stream: &mut crate::pool::StreamWriter) -> Result<Vec<SavedFileContents>> {
    let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut ctx.pending_saves).into_iter().partition(|p| p.pid == pid);
    ctx.pending_saves = others;
    mine.into_iter().map(|p| save_into_stream(&p, stream)).collect()
}

fn save_into_stream(p: &PendingSave, stream: &mut crate::pool::StreamWriter) -> Result<SavedFileContents> {
    let link = &p.link;
    let file = super::file::open_quietly(link, 0).context(|| format!("open {link} ({}) to save it", p.what))?;
    let size = file.metadata().context(|| format!("stat {}", p.what))?.size();
    if size > MAX_CONTENTS {
        return Err(Error::Unsupported { pid: p.pid, what: format!("{} (which grew above {} GiB while saved)", p.what, MAX_CONTENTS >> 30) });
    }
    let (extents, allocated) = save_extents(&file, size, &p.what, stream)?;
    Ok(SavedFileContents { dev: p.dev, ino: p.ino, size, extents, allocated })
}

/// Appends the data of `file` below `size` to `stream`, holes left out (an in-memory file of
/// 4 MiB that its program wrote 72 KiB of, as MPI's shared-memory segments are, stores 72
/// KiB); returns where each extent went, and whether the file has space allocated beyond
/// them (see [`SavedFileContents::allocated`]). `what` names the file for messages.
pub(crate) fn save_extents(file: &std::fs::File, size: u64, what: &str, stream: &mut crate::pool::StreamWriter) -> Result<(Vec<Extent>, bool)> {
    let mut extents = Vec::new();
    for (from, to) in data_extents(file, size).context(|| format!("find the data of {what}"))? {
        extents.push(save_range(file, (from, to), what, stream)?);
    }
    let allocated = allocated_beyond(file, &extents, what)?;
    Ok((extents, allocated))
}

/// Copies bytes `[from, to)` of `file` into `stream`, in whole pages (the last one padded with
/// zeros: the stream is made of pages); returns where they went.
pub(crate) fn save_range(file: &std::fs::File, (from, to): (u64, u64), what: &str, stream: &mut crate::pool::StreamWriter) -> Result<Extent> {
    let page = crate::PAGE_SIZE as usize;
    let stream_offset = stream.offset();
    let mut at = from;
    while at < to {
        let space = stream.space(page)?;
        let room = space.len() / page * page;
        let n = ((to - at) as usize).min(room);
        let padded = n.div_ceil(page) * page;
        let buf = &mut space[..padded];
        // A file that shrank since its size was read ends early: zeros (as a hole reads).
        let got = read_at_most(file, &mut buf[..n], at).context(|| format!("read {what} at {at}"))?;
        buf[got..].fill(0);
        stream.advance(padded);
        at += n as u64;
    }
    Ok(Extent { file_offset: from, len: to - from, stream_offset })
}

/// Whether `file` has space allocated beyond its data `extents` (see
/// [`SavedFileContents::allocated`]).
pub(crate) fn allocated_beyond(file: &std::fs::File, extents: &[Extent], what: &str) -> Result<bool> {
    let page = crate::PAGE_SIZE;
    let data: u64 = extents.iter().map(|e| e.len.div_ceil(page) * page).sum();
    Ok(file.metadata().context(|| format!("stat {what}"))?.blocks().saturating_mul(512) > data.saturating_add(ALLOCATED_SLACK))
}

/// Reads into `buf` from `offset` until it is full or the file ends; returns how much came.
fn read_at_most(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The data ranges of `file` below `size` (`SEEK_DATA`, `SEEK_HOLE`): holes are not stored,
/// and a restored file gets them back. A file system without them reports one range of data.
pub(crate) fn data_extents(file: &std::fs::File, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use nix::errno::Errno;
    use nix::unistd::{lseek, Whence};
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < size {
        let data = match lseek(file, at as i64, Whence::SeekData) {
            Ok(data) => data,
            // No data from here to the end.
            Err(Errno::ENXIO) => return Ok(out),
            Err(e) => return Err(e.into()),
        };
        let hole = lseek(file, data, Whence::SeekHole)?;
        let (from, to) = (data as u64, (hole as u64).min(size));
        if from >= to {
            break;
        }
        out.push((from, to));
        at = to;
    }
    Ok(out)
}

/// Where a recreated file's contents come from: its record, or the process's stream.
pub enum Source<'a> {
    Inline(&'a [u8]),
    Stream(SavedFileContents),
}

impl<'a> Source<'a> {
    /// The contents of file `key` for its first description restored: those its record carries,
    /// or those the process saved in its stream (`ctx.saved_files`).
    pub fn of(inline: Option<&'a Vec<u8>>, key: (u64, u64), ctx: &RestoreCtx) -> Option<Source<'a>> {
        match inline {
            Some(c) => Some(Source::Inline(c)),
            None => ctx.saved_files.get(&key).cloned().map(Source::Stream),
        }
    }

    /// Writes the contents into the file open at `fd` in the task.
    pub fn fill(&self, task: &RemoteTask, fd: u64, reader: &mut crate::image::StreamReader, what: &str) -> Result<()> {
        match self {
            Source::Inline(c) => fill(task, fd, c, what),
            Source::Stream(saved) => fill_from_stream(task, fd, saved, reader, what),
        }
    }
}

/// Writes contents saved in the process's stream (see [`save_pending`]) into the file open at
/// `fd` in the task, from outside, leaving holes where the file had them.
pub fn fill_from_stream(task: &RemoteTask, fd: u64, saved: &SavedFileContents, reader: &mut crate::image::StreamReader, what: &str) -> Result<()> {
    let link = format!("/proc/{}/fd/{fd}", task.pid);
    let f = OpenOptions::new().write(true).open(&link).context(|| format!("open {link} to fill {what}"))?;
    write_extents(&f, saved.size, &saved.extents, saved.allocated, reader, what)
}

/// Gives `f` the size `size` (its space allocated with `allocated`) and writes each extent's
/// data from the stream at its place; the rest of the file is left as it is (holes, in a file
/// just made or truncated).
pub(crate) fn write_extents(
    f: &std::fs::File,
    size: u64,
    extents: &[Extent],
    allocated: bool,
    reader: &mut crate::image::StreamReader,
    what: &str,
) -> Result<()> {
    f.set_len(size).context(|| format!("set the size of {what}"))?;
    if allocated && size > 0 {
        use nix::fcntl::{fallocate, FallocateFlags};
        match fallocate(f, FallocateFlags::empty(), 0, size as i64) {
            // A file system that cannot allocate ahead had none allocated either.
            Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => {}
            Err(e) => return Err(std::io::Error::from(e)).context(|| format!("allocate the {size} bytes {what} had allocated")),
        }
    }
    let mut buf = Vec::new();
    for e in extents {
        let mut done = 0u64;
        while done < e.len {
            let n = (e.len - done).min(16 << 20);
            buf.resize(n as usize, 0);
            reader.read_exact_at(e.stream_offset + done, &mut buf)?;
            std::os::unix::fs::FileExt::write_all_at(f, &buf, e.file_offset + done).context(|| format!("write into {what}"))?;
            done += n;
        }
    }
    Ok(())
}

/// Captures a descriptor on a deleted file; `path` is its old path.
pub fn capture(pid: Tid, fd: i32, path: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<DeletedFileRecord> {
    if meta.nlink() > 0 {
        // Its name is gone but the file lives on under another one (outside its directory, or
        // `another_name` would have found it): a copy would not be it.
        return Err(Error::Unsupported { pid, what: format!("fd {fd} ({path}, deleted but still linked elsewhere, under a name outside its directory)") });
    }
    let contents = read_contents(pid, fd, &format!("the deleted file {path}"), meta, ctx)?;
    let times = Some(Times::of(meta));
    Ok(DeletedFileRecord {
        path: path.to_string(),
        dev: meta.dev(),
        ino: meta.ino(),
        mode: meta.mode() & 0o7777,
        contents,
        times,
        owner: Some((meta.uid(), meta.gid())),
    })
}

/// Captures the executable of process `pid`, deleted since it started (a program rebuilt or
/// upgraded while it runs): `path` is its old path, `meta` what /proc/PID/exe stats as. Its
/// contents are kept as a deleted file's are (once for every process that runs it); a restart
/// gives the processes a copy as their /proc/PID/exe ([`executable_copy`]). Its mappings are
/// kept as private memory, as every mapping of a deleted file is.
pub fn capture_executable(pid: Tid, path: &str, meta: &std::fs::Metadata, ctx: &mut CaptureCtx) -> Result<DeletedFileRecord> {
    let what = format!("the deleted executable {path}");
    let contents = read_contents_at(pid, &format!("/proc/{pid}/exe"), "its executable", &what, meta, ctx)?;
    Ok(DeletedFileRecord {
        path: path.to_string(),
        dev: meta.dev(),
        ino: meta.ino(),
        mode: meta.mode() & 0o7777,
        contents,
        times: Some(Times::of(meta)),
        owner: Some((meta.uid(), meta.gid())),
    })
}

/// A read-only descriptor in the task on the copy of the deleted executable `d`, for
/// PR_SET_MM_MAP (which refuses a file open for writing): the copy an earlier process (or a
/// descriptor on the same file) made, or a new one, filled, of which a descriptor is parked at
/// or above `park_at` for the processes after this one.
pub fn executable_copy(
    task: &mut RemoteTask,
    ns_pid: Tid,
    d: &DeletedFileRecord,
    ctx: &mut RestoreCtx,
    (scratch_off, park_at): (usize, u64),
    reader: &mut crate::image::StreamReader,
) -> Result<u64> {
    let key = (d.dev, d.ino);
    if let Some(&(owner, owner_fd)) = ctx.objects.get(&key) {
        let src = if owner == ns_pid { owner_fd } else { descriptor::take_from(task, owner, owner_fd)? };
        let read_only = reopen_read_only(task, src, scratch_off);
        if owner != ns_pid {
            task.syscall("close", libc::SYS_close, &[src])?;
        }
        return read_only;
    }
    let copy = filled_copy(task, d, ctx, (scratch_off, true), reader)?;
    let read_only = reopen_read_only(task, copy, scratch_off);
    // Closed before the copy is used: an executable has no writer.
    task.syscall("close", libc::SYS_close, &[copy])?;
    let read_only = read_only?;
    let kept = task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[read_only, libc::F_DUPFD_CLOEXEC as u64, park_at])?;
    ctx.park(ns_pid, kept);
    ctx.objects.insert(key, (ns_pid, kept));
    Ok(read_only)
}

/// A new description, read-only, of the file open at `fd` in the task.
fn reopen_read_only(task: &mut RemoteTask, fd: u64, scratch_off: usize) -> Result<u64> {
    let addr = task.put_path(scratch_off, &format!("/proc/self/fd/{fd}"))?;
    Ok(task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0])?)
}

/// Writes the contents into the file open at `fd` in the task (just made, empty), from outside
/// (a new description through /proc, so the task's own offset does not move). Blocks of zeros
/// are not written: a small file kept whole in the record had its holes there (a sparse file
/// stays sparse, as one saved by extents does; zdtm's ghost_holes), and a block of zeros
/// written by the program reads the same as a hole.
pub fn fill(task: &RemoteTask, fd: u64, contents: &[u8], what: &str) -> Result<()> {
    let link = format!("/proc/{}/fd/{fd}", task.pid);
    let f = OpenOptions::new().write(true).open(&link).context(|| format!("open {link} to fill {what}"))?;
    f.set_len(contents.len() as u64).context(|| format!("set the size of {what}"))?;
    for (at, data) in blocks_with_data(contents) {
        std::os::unix::fs::FileExt::write_all_at(&f, data, at).context(|| format!("write {} bytes into {what} at {at}", data.len()))?;
    }
    Ok(())
}

/// The runs of `contents` that are not whole 4 KiB blocks of zeros, with their offsets, each run
/// as long as the blocks with data next to each other. Pure.
fn blocks_with_data(contents: &[u8]) -> Vec<(u64, &[u8])> {
    const BLOCK: usize = 4096;
    let mut runs: Vec<(u64, &[u8])> = Vec::new();
    let mut run_start = None;
    for (i, block) in contents.chunks(BLOCK).enumerate() {
        let has_data = block.iter().any(|&b| b != 0);
        match (has_data, run_start) {
            (true, None) => run_start = Some(i * BLOCK),
            (false, Some(start)) => {
                runs.push((start as u64, &contents[start..i * BLOCK]));
                run_start = None;
            }
            _ => {}
        }
    }
    if let Some(start) = run_start {
        runs.push((start as u64, &contents[start..]));
    }
    runs
}

/// Opens a new description of the file open at `src` in the task, with the record's flags and
/// offset; returns its descriptor.
pub fn reopen(task: &mut RemoteTask, src: u64, rec: &FdRecord, scratch_off: usize) -> Result<u64> {
    let addr = task.put_path(scratch_off, &format!("/proc/self/fd/{src}"))?;
    // O_TMPFILE would make a new file in a directory, which the link is not; O_NOFOLLOW (which
    // Python's tempfile uses) would refuse the /proc link itself.
    let drop = libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_TMPFILE | libc::O_NOFOLLOW;
    let flags = rec.flags & !(drop as u32) | libc::O_NOCTTY as u32;
    let fd = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0])?;
    task.syscall("lseek", libc::SYS_lseek, &[fd, rec.pos, libc::SEEK_SET as u64])?;
    Ok(fd)
}

/// Reopens a file already recreated for an earlier description (by this process or another).
/// Returns `None` when the file is not recreated yet.
pub fn reopen_existing(task: &mut RemoteTask, ns_pid: Tid, key: (u64, u64), rec: &FdRecord, ctx: &RestoreCtx, scratch_off: usize) -> Result<Option<u64>> {
    let Some(&(owner, owner_fd)) = ctx.objects.get(&key) else { return Ok(None) };
    if owner == ns_pid {
        return reopen(task, owner_fd, rec, scratch_off).map(Some);
    }
    let src = descriptor::take_from(task, owner, owner_fd)?;
    let r = reopen(task, src, rec, scratch_off);
    task.syscall("close", libc::SYS_close, &[src])?;
    r.map(Some)
}

impl DescriptorKind for DeletedFileRecord {
    fn describe(&self) -> String {
        format!("{} (deleted)", self.path)
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, (at.scratch_off, at.work_base), stream(&mut at.reader, at.rec)?)
    }
}

/// Recreates the file (for the first of its descriptions) or reopens it (for the others).
/// `reader`: the process's stream, where a large file's contents are.
///
/// A file that the job also maps (`RestoreCtx::mapped_files`) must come back as one file for
/// both: the memory restore, which runs first in a process, makes the copy for the mapping
/// (see `memory::MemRestoreCtx::with_descriptors`) and the descriptor fills that copy; where
/// the descriptor comes first (its process is restored before the one mapping the file), it
/// parks its copy, above `work_base`, for that mapping.
fn open(
    task: &mut RemoteTask,
    ns_pid: Tid,
    rec: &FdRecord,
    d: &DeletedFileRecord,
    ctx: &mut RestoreCtx,
    (scratch_off, work_base): (usize, u64),
    reader: &mut crate::image::StreamReader,
) -> Result<u64> {
    let key = (d.dev, d.ino);
    if let Some(fd) = reopen_existing(task, ns_pid, key, rec, ctx, scratch_off)? {
        return Ok(fd);
    }
    let mapped = ctx.mapped_files.contains(&key);
    let tmp = match ctx.shared_memory.get(&d.ino).copied().filter(|_| mapped) {
        // Made by the memory restore for a mapping of it (of this process or an earlier one):
        // that copy is the file, filled now.
        Some((owner, kept)) => {
            let copy = if owner == ns_pid {
                task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[kept, libc::F_DUPFD_CLOEXEC as u64, 0])?
            } else {
                descriptor::take_from(task, owner, kept)?
            };
            if let Err(e) = fill_copy(task, copy, d, ctx, reader) {
                task.syscall("close", libc::SYS_close, &[copy])?;
                return Err(e);
            }
            copy
        }
        None => filled_copy(task, d, ctx, (scratch_off, false), reader)?,
    };
    let fd = reopen(task, tmp, rec, scratch_off);
    if mapped && !ctx.shared_memory.contains_key(&d.ino) {
        // A process restored later maps it: its memory restore finds the copy here.
        let kept = descriptor::move_above(task, tmp, work_base)?;
        ctx.park(ns_pid, kept);
        ctx.shared_memory.insert(d.ino, (ns_pid, kept));
    } else {
        task.syscall("close", libc::SYS_close, &[tmp])?;
    }
    // The record's descriptor is at its number once this returns: later ones reopen it there.
    ctx.objects.insert(key, (ns_pid, rec.fd as u64));
    fd
}

/// The copy of deleted file `d` in the task ([`create_copy`], `by_name` as there), open
/// read-write, holding its contents (its record's, or its process's stream), then its owner,
/// mode and times (filled first: a read-only mode would stop an unprivileged restorer's fill;
/// the owner before the mode, as chown clears set-user-ID bits). Closed again if it cannot be
/// filled.
fn filled_copy(
    task: &mut RemoteTask,
    d: &DeletedFileRecord,
    ctx: &RestoreCtx,
    (scratch_off, by_name): (usize, bool),
    reader: &mut crate::image::StreamReader,
) -> Result<u64> {
    // Checked before anything is made.
    Source::of(d.contents.as_ref(), (d.dev, d.ino), ctx).ok_or_else(|| lacks_contents(d))?;
    let copy = create_copy(task, d, scratch_off, by_name)?;
    if let Err(e) = fill_copy(task, copy, d, ctx, reader) {
        task.syscall("close", libc::SYS_close, &[copy])?;
        return Err(e);
    }
    Ok(copy)
}

/// Gives the copy of `d` open (read-write) at `copy` in the task its contents, owner, mode and
/// times, in that order (see [`filled_copy`]).
fn fill_copy(task: &mut RemoteTask, copy: u64, d: &DeletedFileRecord, ctx: &RestoreCtx, reader: &mut crate::image::StreamReader) -> Result<()> {
    let contents = Source::of(d.contents.as_ref(), (d.dev, d.ino), ctx).ok_or_else(|| lacks_contents(d))?;
    let what = format!("the new copy of {}", d.path);
    contents.fill(task, copy, reader, &what)?;
    give_owner(task, copy, d.owner, &what)?;
    task.syscall("fchmod", libc::SYS_fchmod, &[copy, d.mode as u64])?;
    d.times.map_or(Ok(()), |times| times.set(task, copy, &what))
}

fn lacks_contents(d: &DeletedFileRecord) -> Error {
    Error::Damaged { what: format!("the image lacks the contents of the deleted file {}", d.path) }
}

/// Gives the copy open at `fd` in the task the owner and group (`owner`) the file had, by a
/// call in the task: with the restored process's rights, which may give a file only what its
/// process could at the checkpoint (root, or an ordinary user's own groups). A copy the
/// process cannot give them stays the process's own, said as a warning: the file's contents
/// and mode are what matter to most programs, and an fstat that shows another owner is the
/// one difference. (A deleted file's copy, and a memfd.)
pub(super) fn give_owner(task: &mut RemoteTask, fd: u64, owner: Option<(u32, u32)>, what: &str) -> Result<()> {
    let Some((uid, gid)) = owner else { return Ok(()) };
    let link = format!("/proc/{}/fd/{fd}", task.pid);
    let now = std::fs::metadata(&link).context(|| format!("stat {link} ({what})"))?;
    if (now.uid(), now.gid()) == (uid, gid) {
        return Ok(());
    }
    if let Err(e) = task.syscall("fchown", libc::SYS_fchown, &[fd, uid as u64, gid as u64]) {
        tracing::warn!(uid, gid, "{what} is owned by {}:{} where it was {uid}:{gid}: {e}", now.uid(), now.gid());
    }
    Ok(())
}

/// Makes an empty, unlinked copy of deleted file `d` in the task, open read-write, 0600, in
/// the directory it was in.
///
/// With `by_name`, the copy is made under the file's old name when that is free, and unlinked
/// at once, so that /proc/PID/exe shows the same name as before (programs find their files
/// beside their executable by it); a watcher of the directory sees the name come and go. A
/// data file's copy is made without a name (O_TMPFILE: no event for a program that watches the
/// directory, as `tail -F` does, but /proc/PID/fd shows DIR/#INODE).
///
/// A memfd's copy (a program run from one: fexecve, execveat) is a memfd of the same name.
pub(super) fn create_copy(task: &mut RemoteTask, d: &DeletedFileRecord, scratch_off: usize, by_name: bool) -> Result<u64> {
    let base = d.path.rsplit('/').next().unwrap_or(&d.path);
    if let Some(name) = d.path.strip_prefix(super::memfd::LINK_PREFIX) {
        return memfd_copy(task, name, d.mode, scratch_off);
    }
    if by_name {
        if let Some(fd) = create_named(task, &d.path, scratch_off)? {
            return Ok(fd);
        }
        tracing::info!(file = %d.path, "the name of a deleted executable is taken (by its new version?): its copy is made without one");
    }
    let dir = match d.path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((dir, _)) => dir,
    };
    // A directory removed after the file was deleted from it: the copy is made in the nearest
    // directory above it that still exists (on the same file system as a rule). Only the name
    // the process's /proc/PID/fd link shows differs.
    let dir = nearest_existing(dir, |p| std::path::Path::new(p).is_dir());
    if d.path.rsplit_once('/').map(|(p, _)| p) != Some(dir) {
        tracing::info!(file = %d.path, dir, "the directory of a deleted file is gone too: its copy is made in the nearest one that exists");
    }
    match create_unlinked(task, dir, d, scratch_off)? {
        Some(fd) => Ok(fd),
        // A directory the process may not write (a program the system upgraded under
        // /usr/bin, run by a user): the copy is a memfd of the file's name instead.
        None => {
            tracing::info!(file = %d.path, dir, "the process may not write where a deleted file was: its copy is a memfd");
            memfd_copy(task, base, d.mode, scratch_off)
        }
    }
}

/// A memfd named `name` in the task, executable when `mode` is (MFD_EXEC where the kernel
/// would otherwise seal it against execution, vm.memfd_noexec).
fn memfd_copy(task: &mut RemoteTask, name: &str, mode: u32, scratch_off: usize) -> Result<u64> {
    const MFD_EXEC: u64 = 0x10;
    let addr = task.put_path(scratch_off, name)?;
    let flags = libc::MFD_CLOEXEC as u64 | if mode & 0o111 != 0 { MFD_EXEC } else { 0 };
    match task.syscall("memfd_create", libc::SYS_memfd_create, &[addr, flags]) {
        // A kernel before 6.3 knows no MFD_EXEC, and executes any memfd.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => task.syscall("memfd_create", libc::SYS_memfd_create, &[addr, libc::MFD_CLOEXEC as u64]),
        r => r,
    }
    .context(|| format!("make the memfd {name} again"))
}

/// Makes the file at `path` in the task (empty, open read-write, 0600) and removes its name at
/// once, so that /proc shows the copy by that name; None when the name is taken or the
/// directory is not the process's to write. The name is removed only if it is still the
/// copy's (a program's new version renamed over it meanwhile keeps it).
fn create_named(task: &mut RemoteTask, path: &str, scratch_off: usize) -> Result<Option<u64>> {
    let addr = task.put_path(scratch_off, path)?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC;
    let Ok(fd) = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0o600]) else { return Ok(None) };
    // struct stat: st_dev and st_ino are its first two 8-byte fields on x86_64.
    let (ours, there) = (scratch_off + 8192, scratch_off + 8192 + 256);
    let ours_at = task.put(ours, &[0u8; 16])?;
    let there_at = task.put(there, &[0u8; 16])?;
    task.syscall("fstat", libc::SYS_fstat, &[fd, ours_at])?;
    let same = task.syscall("newfstatat", libc::SYS_newfstatat, &[libc::AT_FDCWD as u64, addr, there_at, libc::AT_SYMLINK_NOFOLLOW as u64]).is_ok()
        && task.get(ours_at, 16)? == task.get(there_at, 16)?;
    if same {
        task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, addr, 0]).context(|| format!("remove {path} again"))?;
    }
    Ok(Some(fd))
}

/// `dir` itself if `exists(dir)`, else its nearest ancestor that exists ("/" at the last; pure).
pub(super) fn nearest_existing(dir: &str, exists: impl Fn(&str) -> bool) -> &str {
    let mut at = dir;
    while !exists(at) {
        at = match at.rsplit_once('/') {
            Some(("", _)) | None => return "/",
            Some((parent, _)) => parent,
        };
    }
    at
}

/// Creates an unlinked file in `dir` inside the task, open read-write, 0600 (its mode is given
/// once it is filled: the restorer fills it through /proc, and a read-only mode would stop an
/// unprivileged one); None when the process may not write there.
fn create_unlinked(task: &mut RemoteTask, dir: &str, d: &DeletedFileRecord, scratch_off: usize) -> Result<Option<u64>> {
    let denied = |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem);
    let addr = task.put_path(scratch_off, dir)?;
    let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC;
    let r = task.main.raw(libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0o600])?;
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::from_raw_os_error(-r as i32);
    if denied(&e) {
        return Ok(None);
    }
    if r != -(libc::EOPNOTSUPP as i64) && r != -(libc::EISDIR as i64) {
        return Err(Error::Other(format!("create an unlinked file in {dir} to hold {}: {e}", d.path)));
    }
    // No O_TMPFILE on this filesystem: a fresh name, unlinked at once.
    let name = format!("{}/.ckpt-restore-{}-{}", dir.trim_end_matches('/'), d.ino, task.pid);
    let addr = task.put_path(scratch_off, &name)?;
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC;
    let fd = match task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, flags as u64, 0o600]) {
        Err(e) if denied(&e) => return Ok(None),
        r => r.context(|| format!("create {name} to hold {}", d.path))?,
    };
    task.syscall("unlinkat", libc::SYS_unlinkat, &[libc::AT_FDCWD as u64, addr, 0])?;
    Ok(Some(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the blocks holding data are written: whole blocks of zeros are left as holes, runs
    /// of data blocks are written at once, and a short last block with data is kept.
    #[test]
    fn zero_blocks_are_left_as_holes() {
        let mut c = vec![0u8; 4096 * 5 + 100];
        c[4096 + 7] = 1; // block 1
        c[4096 * 2] = 2; // block 2, next to it
        c[4096 * 5 + 99] = 3; // the short last block
        let runs: Vec<(u64, usize)> = blocks_with_data(&c).iter().map(|(at, d)| (*at, d.len())).collect();
        assert_eq!(runs, [(4096, 8192), (4096 * 5, 100)]);
        assert!(blocks_with_data(&[0u8; 9000]).is_empty());
        assert_eq!(blocks_with_data(b"abc").len(), 1);
    }

    #[test]
    fn a_removed_directory_gives_way_to_its_nearest_existing_ancestor() {
        let exists = |p: &str| ["/", "/tmp", "/tmp/a"].contains(&p);
        assert_eq!(nearest_existing("/tmp/a", exists), "/tmp/a");
        assert_eq!(nearest_existing("/tmp/a/b/c", exists), "/tmp/a");
        assert_eq!(nearest_existing("/srv/x", exists), "/");
        assert_eq!(nearest_existing("/", |_| false), "/");
    }

    #[test]
    fn recognises_deleted_links() {
        assert_eq!(deleted_path("/tmp/x/data.bin (deleted)"), Some("/tmp/x/data.bin"));
        assert_eq!(deleted_path("/tmp/x/#1234 (deleted)"), Some("/tmp/x/#1234"));
        assert_eq!(deleted_path("/tmp/x/data.bin"), None);
        assert_eq!(deleted_path("anon_inode:[eventfd] (deleted)"), None);
    }
}
