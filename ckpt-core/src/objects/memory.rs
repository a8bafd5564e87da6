//! Memory mappings: every VMA of a process and the pages worth storing.
//!
//! Capture walks /proc/<pid>/maps and pagemap and copies the pages that carry information
//! (present or swapped anonymous pages, private copies of file pages) straight into the node
//! buffer pool, leaving out pages that are all zero. Restore maps every VMA back at its address
//! with its protection from inside the task, then writes the stored pages through /proc/<pid>/mem.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::image::StreamReader;
use crate::pool::StreamWriter;
use crate::procfs::{self, MMPermissions, MMapPath, PageFlags, Pagemap};
use crate::ptrace::remote_mem::{self, ProcMem};
use crate::ptrace::{RemoteTask, Tid};
use crate::PAGE_SIZE;

/// What backs a mapping.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory (including [heap] and thread stacks).
    Anon,
    /// The main thread's stack; grows down.
    Stack,
    /// A file, identified by path and by device and inode so that restart can tell if it changed.
    /// A file in memory (tmpfs, such as POSIX shared memory under /dev/shm) that the job maps
    /// shared has its whole contents `saved` in the stream, once per checkpoint, because it is
    /// the job's memory and may change after the checkpoint (or vanish at a reboot).
    File { path: String, dev: u64, ino: u64, size: u64, saved: Option<SavedFile> },
    /// Memory shared between processes without a file of its own: MAP_SHARED|MAP_ANONYMOUS
    /// (inherited across fork) or a memfd. One object, identified by its inode; its pages are
    /// stored once, by the first process that maps it.
    Shmem { ino: u64, memfd_name: Option<String> },
    /// The kernel's vdso code, whose bytes are kept to compare with the restarting kernel's.
    Vdso { code: Vec<u8> },
    /// The kernel's data pages beside the vdso ([vvar], [vvar_vclock], ...), by name.
    VdsoData { name: String },
    /// The legacy [vsyscall] page, fixed by the kernel.
    Vsyscall,
    /// A System V shared memory segment (shmat), by id and size; its contents are in the node's
    /// System V IPC record (see `sysvipc`), not in the process's stream.
    SysvShm { shmid: i32, size: u64 },
}

/// A file's whole contents in the process's stream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedFile {
    pub stream_offset: u64,
    pub len: u64,
}

/// A run of stored pages: `pages` pages from `addr`, at `stream_offset` in the process's stream.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PageRun {
    pub addr: u64,
    pub pages: u64,
    pub stream_offset: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmaRecord {
    pub start: u64,
    pub end: u64,
    /// PROT_* bits.
    pub prot: u32,
    pub shared: bool,
    /// Offset into the file, for file mappings.
    pub file_offset: u64,
    pub backing: Backing,
    /// The pages stored in the image; the rest read as zero or as the file's contents.
    pub runs: Vec<PageRun>,
}

impl VmaRecord {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_kernel_special(&self) -> bool {
        matches!(self.backing, Backing::Vdso { .. } | Backing::VdsoData { .. } | Backing::Vsyscall)
    }

    /// A short name for messages: the file's path or the kind of memory.
    pub fn backing_name(&self) -> String {
        match &self.backing {
            Backing::File { path, .. } => path.clone(),
            Backing::Anon => "anonymous".into(),
            Backing::Shmem { memfd_name: Some(n), .. } => format!("memfd:{n}"),
            Backing::Shmem { .. } => "shared anonymous".into(),
            Backing::Stack => "stack".into(),
            Backing::Vdso { .. } => "vdso".into(),
            Backing::VdsoData { name } => name.clone(),
            Backing::Vsyscall => "vsyscall".into(),
            Backing::SysvShm { shmid, .. } => format!("System V segment {shmid}"),
        }
    }

    pub fn stored_pages(&self) -> u64 {
        self.runs.iter().map(|r| r.pages).sum()
    }
}

fn prot_of(perms: MMPermissions) -> u32 {
    let mut prot = 0;
    if perms.contains(MMPermissions::READ) {
        prot |= libc::PROT_READ as u32;
    }
    if perms.contains(MMPermissions::WRITE) {
        prot |= libc::PROT_WRITE as u32;
    }
    if perms.contains(MMPermissions::EXECUTE) {
        prot |= libc::PROT_EXEC as u32;
    }
    prot
}

/// Decides, from a page's flags, whether its contents must be stored (pure; unit-tested).
pub fn page_needs_storing(backing: &Backing, shared: bool, flags: PageFlags) -> bool {
    match backing {
        Backing::Vdso { .. } | Backing::VdsoData { .. } | Backing::Vsyscall | Backing::SysvShm { .. } => false,
        // A shared file mapping's data lives in the file itself.
        Backing::File { .. } if shared => false,
        // A private file mapping: only pages the process changed (now private copies) differ
        // from the file.
        Backing::File { .. } => flags.swapped() || (flags.present() && !flags.file_or_shared()),
        Backing::Anon | Backing::Stack | Backing::Shmem { .. } => flags.present() || flags.swapped(),
    }
}

fn backing_of(pid: Tid, map: &MemoryMap, mem: &ProcMem) -> Result<Backing> {
    Ok(match &map.pathname {
        MMapPath::Stack => Backing::Stack,
        MMapPath::Heap | MMapPath::Anonymous | MMapPath::TStack(_) => Backing::Anon,
        MMapPath::Vdso => {
            let mut code = vec![0u8; (map.address.1 - map.address.0) as usize];
            mem.read_exact(map.address.0, &mut code)?;
            Backing::Vdso { code }
        }
        MMapPath::Vsyscall => Backing::Vsyscall,
        p if super::vdso::vdso_data_name(p).is_some() => Backing::VdsoData { name: super::vdso::vdso_data_name(p).unwrap() },
        MMapPath::Path(path) => {
            let path = path.to_string_lossy().into_owned();
            let shared = map.perms.contains(MMPermissions::SHARED);
            let is_memfd = path.starts_with("/memfd:");
            // A deleted file mapped shared (POSIX semaphores: sem_open unlinks at once; Python's
            // multiprocessing heap; the PMIx data store of Open MPI, on disk) is shared memory
            // no one can open any more: it comes back as a memfd with the same contents.
            let deleted = path.ends_with(" (deleted)");
            if shared && (path == "/dev/zero (deleted)" || is_memfd || deleted) {
                let memfd_name = is_memfd.then(|| path.trim_start_matches("/memfd:").trim_end_matches(" (deleted)").to_string());
                Backing::Shmem { ino: map.inode, memfd_name }
            } else if path.starts_with("/SYSV") {
                return Err(Error::Unsupported { pid, what: format!("System V shared memory ({path} at {:#x})", map.address.0) });
            } else if path.ends_with(" (deleted)") {
                return Err(Error::Unsupported { pid, what: format!("a mapping of deleted file {path}") });
            } else {
                // Identify the file through the mapping itself, which stays valid even if the
                // path now names another file.
                let link = format!("/proc/{pid}/map_files/{:x}-{:x}", map.address.0, map.address.1);
                let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({path})"))?;
                Backing::File { path, dev: meta.dev(), ino: meta.ino(), size: meta.size(), saved: None }
            }
        }
        MMapPath::Vsys(_) => {
            // System V shared memory; the inode number of its mapping is the segment's id.
            let link = format!("/proc/{pid}/map_files/{:x}-{:x}", map.address.0, map.address.1);
            let meta = std::fs::metadata(&link).context(|| format!("stat {link} (a System V segment)"))?;
            Backing::SysvShm { shmid: map.inode as i32, size: meta.size() }
        }
        other => return Err(Error::Unsupported { pid, what: format!("a mapping {other:?} at {:#x}", map.address.0) }),
    })
}

pub use procfs::MemoryMap;

/// What memory capture remembers across the processes of one checkpoint: objects shared
/// between processes are stored once.
#[derive(Default)]
pub struct MemCaptureCtx {
    shmem_seen: std::collections::HashSet<u64>,
    files_saved: std::collections::HashSet<(u64, u64)>,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
/// Largest in-memory file whose contents a checkpoint saves.
const MAX_SAVED_FILE: u64 = 4 << 30;

fn on_tmpfs(path: &str) -> bool {
    nix::sys::statfs::statfs(path).map(|s| s.filesystem_type().0 as i64 == TMPFS_MAGIC).unwrap_or(false)
}

/// Captures every mapping of a stopped process, copying the pages worth storing into `stream`.
pub fn capture(pid: Tid, mem: &ProcMem, stream: &mut StreamWriter, ctx: &mut MemCaptureCtx) -> Result<Vec<VmaRecord>> {
    let pagemap = Pagemap::open(pid)?;
    let mut records = Vec::new();
    for map in procfs::maps(pid)? {
        let mut backing = backing_of(pid, &map, mem)?;
        let shared = map.perms.contains(MMPermissions::SHARED);
        let link = format!("/proc/{pid}/map_files/{:x}-{:x}", map.address.0, map.address.1);
        let mut pages_wanted = true;
        match &mut backing {
            Backing::Shmem { ino, .. } => pages_wanted = ctx.shmem_seen.insert(*ino),
            Backing::File { dev, ino, size, saved, .. } if shared && on_tmpfs(&link) => {
                if ctx.files_saved.insert((*dev, *ino)) {
                    *saved = Some(save_file(&link, *size, stream)?);
                }
            }
            _ => {}
        }
        let (start, end) = map.address;
        let mut record = VmaRecord {
            start,
            end,
            prot: prot_of(map.perms),
            shared,
            file_offset: map.offset,
            backing,
            runs: Vec::new(),
        };
        if pages_wanted && !record.is_kernel_special() && !(shared && matches!(record.backing, Backing::File { .. })) {
            if matches!(record.backing, Backing::Shmem { .. }) {
                // Shared memory is read through the object itself, not this process's page
                // tables: a page another process wrote may not be mapped here (reading a hole
                // gives zeros, which are not stored, and allocates nothing).
                let object = std::fs::File::open(&link).context(|| format!("open {link} to read shared memory"))?;
                let base = record.file_offset;
                let mut from_object = |at: u64, buf: &mut [u8]| read_object(&object, base + (at - start), buf, &link);
                copy_run(start, (end - start) / PAGE_SIZE, stream, &mut record.runs, &mut from_object)?;
            } else {
                let flags = pagemap.range(start, end).context(|| format!("read pagemap of pid {pid} at {start:#x}"))?;
                let prot = record.prot;
                let mut from_tables = |at: u64, buf: &mut [u8]| read_mapped(pid, mem, prot, at, buf);
                for (run_start, run_pages) in wanted_runs(start, &flags, |f| page_needs_storing(&record.backing, shared, f)) {
                    copy_run(run_start, run_pages, stream, &mut record.runs, &mut from_tables)?;
                }
            }
        }
        records.push(record);
    }
    Ok(records)
}

/// Appends a whole file to the stream (page-padded, as the stream holds pages).
fn save_file(link: &str, size: u64, stream: &mut StreamWriter) -> Result<SavedFile> {
    use std::io::Read;
    if size > MAX_SAVED_FILE {
        return Err(Error::Other(format!("{link}: an in-memory file of {size} bytes is too large to save")));
    }
    let mut f = std::fs::File::open(link).context(|| format!("open {link} to save it"))?;
    let stream_offset = stream.offset();
    let padded = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    let mut left = padded;
    while left > 0 {
        let space = stream.space(PAGE_SIZE as usize)?;
        let n = (space.len() as u64).min(left) as usize;
        let buf = &mut space[..n];
        let mut got = 0;
        while got < n {
            match f.read(&mut buf[got..]).context(|| format!("read {link}"))? {
                0 => break,
                k => got += k,
            }
        }
        buf[got..].fill(0);
        stream.advance(n);
        left -= n as u64;
    }
    Ok(SavedFile { stream_offset, len: size })
}

/// Groups consecutive pages that pass `wanted` into (address, page count) runs.
pub fn wanted_runs(start: u64, flags: &[PageFlags], wanted: impl Fn(PageFlags) -> bool) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, f) in flags.iter().enumerate() {
        if !wanted(*f) {
            continue;
        }
        let addr = start + i as u64 * PAGE_SIZE;
        match runs.last_mut() {
            Some((s, n)) if *s + *n * PAGE_SIZE == addr => *n += 1,
            _ => runs.push((addr, 1)),
        }
    }
    runs
}

fn is_zero_page(page: &[u8]) -> bool {
    // 16 bytes at a time keeps the scan near memory speed.
    page.chunks_exact(16).all(|c| u128::from_ne_bytes(c.try_into().unwrap()) == 0)
}

/// Below this, one thread copies: a second one is not worth starting.
const PARALLEL_COPY_MIN: usize = 2 << 20;

/// Reads `buf.len()` bytes at `at` of process `pid` with process_vm_readv, the two halves on two
/// threads: one thread copies at about half the memory bandwidth this machine has (measured by
/// `ckpt bench`). Returns how many bytes from the start were read (short at an unreadable page).
fn read_in_parallel(pid: Tid, at: u64, buf: &mut [u8]) -> Result<usize> {
    if buf.len() < PARALLEL_COPY_MIN {
        return Ok(remote_mem::read(pid, at, buf)?);
    }
    let mid = buf.len() / 2 / PAGE_SIZE as usize * PAGE_SIZE as usize;
    let (head, tail) = buf.split_at_mut(mid);
    let (head_got, tail_got) = std::thread::scope(|s| {
        let tail_reader = s.spawn(|| remote_mem::read(pid, at + mid as u64, tail));
        let head_got = remote_mem::read(pid, at, head);
        (head_got, tail_reader.join())
    });
    let head_got = head_got?;
    if head_got < mid {
        return Ok(head_got);
    }
    let tail_got = tail_got.map_err(|_| Error::Other("a memory copy thread panicked".into()))??;
    Ok(mid + tail_got)
}

/// Fills `buf` with the memory at `at` of a process, through its page tables.
fn read_mapped(pid: Tid, mem: &ProcMem, prot: u32, at: u64, buf: &mut [u8]) -> Result<()> {
    let readable = prot & libc::PROT_READ as u32 != 0;
    let got = if readable { read_in_parallel(pid, at, buf)? } else { 0 };
    if got < buf.len() {
        // process_vm_readv stops at pages it may not read (PROT_NONE); /proc/<pid>/mem reads
        // them as a debugger would.
        mem.read_exact(at + got as u64, &mut buf[got..])?;
    }
    Ok(())
}

/// Fills `buf` from a shared memory object at `offset`; past its end reads as zeros.
fn read_object(object: &std::fs::File, offset: u64, buf: &mut [u8], link: &str) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match object.read_at(&mut buf[got..], offset + got as u64).context(|| format!("read {link}"))? {
            0 => break,
            n => got += n,
        }
    }
    buf[got..].fill(0);
    Ok(())
}

/// Copies `pages` pages at `addr` into the stream, as `fill` reads them, dropping all-zero
/// pages, and records the runs stored.
fn copy_run(
    addr: u64,
    pages: u64,
    stream: &mut StreamWriter,
    runs: &mut Vec<PageRun>,
    fill: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let page = PAGE_SIZE as usize;
    let mut done = 0u64;
    while done < pages {
        let base_offset = stream.offset();
        let space = stream.space(page)?;
        let n = ((space.len() / page) as u64).min(pages - done);
        let buf = &mut space[..n as usize * page];
        let at = addr + done * PAGE_SIZE;
        fill(at, buf)?;
        let mut kept = 0usize;
        for i in 0..n as usize {
            if is_zero_page(&buf[i * page..(i + 1) * page]) {
                continue;
            }
            if i != kept {
                buf.copy_within(i * page..(i + 1) * page, kept * page);
            }
            let page_addr = at + (i * page) as u64;
            let offset = base_offset + (kept * page) as u64;
            match runs.last_mut() {
                Some(r) if r.addr + r.pages * PAGE_SIZE == page_addr && r.stream_offset + r.pages * PAGE_SIZE == offset => {
                    r.pages += 1
                }
                _ => runs.push(PageRun { addr: page_addr, pages: 1, stream_offset: offset }),
            }
            kept += 1;
        }
        stream.advance(kept * page);
        done += n;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------------------------

/// Checks that every file the mappings refer to is still the file that was mapped.
pub fn check_files(vmas: &[VmaRecord]) -> Result<()> {
    for vma in vmas {
        if let Backing::File { path, dev, ino, size, saved: None } = &vma.backing {
            let meta = std::fs::metadata(path).map_err(|e| Error::FileChanged {
                path: path.clone(),
                problem: format!("mapped file cannot be opened ({e})"),
            })?;
            let problem = if (meta.dev(), meta.ino()) != (*dev, *ino) {
                Some("mapped file was replaced by another file (different inode)".to_string())
            } else if !vma.shared && meta.size() != *size {
                Some(format!("mapped file changed size ({size} bytes at the checkpoint, {} now)", meta.size()))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(Error::FileChanged { path: path.clone(), problem });
            }
        }
    }
    Ok(())
}

/// What memory restore remembers across the processes of one node: where each shared memory
/// object was created, so that other processes map that same object.
#[derive(Default)]
pub struct MemRestoreCtx {
    /// Shared object inode → (pid in the job, start, end) of a mapping of it.
    shmem: std::collections::HashMap<u64, (Tid, u64, u64)>,
}

/// Puts the contents of in-memory files the job mapped shared back, from the stream (before the
/// process maps them). Files that vanished (a reboot) are created again.
pub fn restore_saved_files(vmas: &[VmaRecord], reader: &mut StreamReader) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for vma in vmas {
        let Backing::File { path, saved: Some(saved), .. } = &vma.backing else { continue };
        let mut data = vec![0u8; saved.len as usize];
        reader.read_exact_at(saved.stream_offset, &mut data)?;
        if let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir).context(|| format!("create {} for {path}", dir.display()))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .context(|| format!("restore the contents of {path}"))?;
        f.write_all(&data).context(|| format!("restore the contents of {path}"))?;
    }
    Ok(())
}

/// Maps every (non-kernel) VMA of the image at its address, from inside the task (whose pid in
/// the job is `ns_pid`). The task's old mappings in those ranges must already be gone.
/// `path_scratch` is a scratch offset for paths.
pub fn map_all(task: &mut RemoteTask, ns_pid: Tid, vmas: &[VmaRecord], ctx: &mut MemRestoreCtx, path_scratch: usize) -> Result<()> {
    for vma in vmas.iter().filter(|v| !v.is_kernel_special()) {
        let writable_for_fill = vma.shared && !vma.runs.is_empty();
        let prot = vma.prot as u64 | if writable_for_fill { libc::PROT_WRITE as u64 } else { 0 };
        let share = if vma.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } as u64;
        let what = || format!("map {:#x}-{:#x} ({})", vma.start, vma.end, vma.backing_name());
        let map_fd = |task: &mut RemoteTask, fd: u64, offset: u64| {
            let r = task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, share | libc::MAP_FIXED as u64, fd, offset]);
            task.syscall("close", libc::SYS_close, &[fd])?;
            r.context(what).map(drop)
        };
        match &vma.backing {
            Backing::File { path, .. } => {
                let path_addr = task.put_path(path_scratch, path)?;
                let open_flags = if vma.shared && vma.prot & libc::PROT_WRITE as u32 != 0 { libc::O_RDWR } else { libc::O_RDONLY };
                let fd = task
                    .syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, path_addr, (open_flags | libc::O_CLOEXEC) as u64])
                    .context(|| format!("open {path} for mapping"))?;
                map_fd(task, fd, vma.file_offset)?;
            }
            Backing::Shmem { ino, memfd_name } => {
                if let Some(&(owner, start, end)) = ctx.shmem.get(ino) {
                    // The same object as another mapping: open it through that mapping.
                    let link = format!("/proc/{owner}/map_files/{start:x}-{end:x}");
                    let addr = task.put_path(path_scratch, &link)?;
                    let fd = task
                        .syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, addr, (libc::O_RDWR | libc::O_CLOEXEC) as u64])
                        .context(|| format!("open {link} to share its memory"))?;
                    map_fd(task, fd, vma.file_offset)?;
                } else {
                    create_shmem(task, vma, prot, memfd_name.as_deref(), path_scratch).context(what)?;
                    ctx.shmem.insert(*ino, (ns_pid, vma.start, vma.end));
                }
            }
            Backing::Anon | Backing::Stack => {
                let grows = if matches!(vma.backing, Backing::Stack) { libc::MAP_GROWSDOWN as u64 } else { 0 };
                task.syscall(
                    "mmap",
                    libc::SYS_mmap,
                    &[vma.start, vma.len(), prot, share | (libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64 | grows, u64::MAX, 0],
                )
                .context(what)?;
            }
            Backing::SysvShm { shmid, size } => super::sysvipc::attach(task, vma, *shmid, *size)?,
            _ => unreachable!("kernel mappings are filtered out"),
        }
    }
    Ok(())
}

/// Creates a new shared memory object mapped at the VMA, at the VMA's offset in it.
fn create_shmem(task: &mut RemoteTask, vma: &VmaRecord, prot: u64, memfd_name: Option<&str>, path_scratch: usize) -> std::io::Result<()> {
    let fixed_shared = (libc::MAP_SHARED | libc::MAP_FIXED) as u64;
    if let Some(name) = memfd_name {
        let name_addr = task.put_path(path_scratch, name)?;
        let fd = task.syscall("memfd_create", libc::SYS_memfd_create, &[name_addr, libc::MFD_CLOEXEC as u64])?;
        task.syscall("ftruncate", libc::SYS_ftruncate, &[fd, vma.file_offset + vma.len()])?;
        let r = task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, fixed_shared, fd, vma.file_offset]);
        task.syscall("close", libc::SYS_close, &[fd])?;
        return r.map(drop);
    }
    if vma.file_offset == 0 {
        task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, fixed_shared | libc::MAP_ANONYMOUS as u64, u64::MAX, 0])?;
        return Ok(());
    }
    // The object must be larger than the mapping, which sits at an offset in it: map it all
    // anywhere, move the part to its place, drop the head.
    let whole = vma.file_offset + vma.len();
    let at = task.syscall(
        "mmap",
        libc::SYS_mmap,
        &[0, whole, prot, (libc::MAP_SHARED | libc::MAP_ANONYMOUS) as u64, u64::MAX, 0],
    )?;
    task.syscall(
        "mremap",
        libc::SYS_mremap,
        &[at + vma.file_offset, vma.len(), vma.len(), (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64, vma.start],
    )?;
    task.syscall("munmap", libc::SYS_munmap, &[at, vma.file_offset])?;
    Ok(())
}

/// Writes every stored page back, reading the process's stream in order.
/// Adds the bytes written to `progress`, for a progress display.
pub fn fill(task: &mut RemoteTask, vmas: &[VmaRecord], reader: &mut StreamReader, progress: &std::sync::atomic::AtomicU64) -> Result<u64> {
    // Runs sorted by stream offset, so the stream is read front to back; neighbours that are
    // contiguous both in memory and in the stream are written with one call.
    let mut runs: BTreeMap<u64, PageRun> = BTreeMap::new();
    for vma in vmas {
        for r in &vma.runs {
            runs.insert(r.stream_offset, *r);
        }
    }
    let mut merged: Vec<PageRun> = Vec::new();
    for r in runs.into_values() {
        match merged.last_mut() {
            Some(m) if m.addr + m.pages * PAGE_SIZE == r.addr && m.stream_offset + m.pages * PAGE_SIZE == r.stream_offset && m.pages < 4096 => {
                m.pages += r.pages
            }
            _ => merged.push(r),
        }
    }
    let mut buf = Vec::new();
    let mut bytes = 0;
    for r in merged {
        let len = (r.pages * PAGE_SIZE) as usize;
        buf.resize(len, 0);
        reader.read_exact_at(r.stream_offset, &mut buf)?;
        task.mem.write_all(r.addr, &buf)?;
        bytes += len as u64;
        progress.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
    }
    // Shared mappings were made writable for the fill; put their protection back.
    for vma in vmas.iter().filter(|v| v.shared && !v.runs.is_empty() && v.prot & libc::PROT_WRITE as u32 == 0) {
        task.syscall("mprotect", libc::SYS_mprotect, &[vma.start, vma.len(), vma.prot as u64])?;
    }
    Ok(bytes)
}

/// The lowest address at or above `from` where `len` bytes fit between the `occupied` ranges
/// (start, end), which need not be sorted or disjoint. Pure, for choosing where a restore may put
/// its scratch page or move things through.
pub fn find_gap(occupied: &[(u64, u64)], len: u64, from: u64) -> Option<u64> {
    let mut ranges = occupied.to_vec();
    ranges.sort_unstable();
    let mut candidate = from;
    for (start, end) in ranges {
        if end <= candidate {
            continue;
        }
        if start >= candidate + len {
            break;
        }
        candidate = end;
    }
    (candidate.checked_add(len)? <= USER_SPACE_END).then_some(candidate)
}

/// End of the x86_64 user address space (47-bit).
pub const USER_SPACE_END: u64 = 0x7fff_ffff_f000;

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENT: u64 = 1 << 63;
    const FILE: u64 = 1 << 61;

    #[test]
    fn file_pages_matching_the_file_are_not_stored() {
        let file = Backing::File { path: "/x".into(), dev: 1, ino: 2, size: 3, saved: None };
        assert!(!page_needs_storing(&file, false, PageFlags(PRESENT | FILE)));
        assert!(page_needs_storing(&file, false, PageFlags(PRESENT)));
        assert!(!page_needs_storing(&file, true, PageFlags(PRESENT)));
        assert!(!page_needs_storing(&Backing::Anon, false, PageFlags(0)));
        assert!(page_needs_storing(&Backing::Anon, true, PageFlags(PRESENT | FILE)));
    }

    #[test]
    fn runs_group_consecutive_pages() {
        let f = |b: bool| PageFlags(if b { PRESENT } else { 0 });
        let flags = [f(true), f(true), f(false), f(true)];
        let runs = wanted_runs(0x1000, &flags, |p| p.present());
        assert_eq!(runs, vec![(0x1000, 2), (0x4000, 1)]);
    }

    #[test]
    fn gaps_skip_occupied_ranges() {
        let occupied = [(0x3000, 0x5000), (0x1000, 0x2000), (0x5000, 0x6000)];
        assert_eq!(find_gap(&occupied, 0x1000, 0x1000), Some(0x2000));
        assert_eq!(find_gap(&occupied, 0x2000, 0x1000), Some(0x6000));
        assert_eq!(find_gap(&occupied, 0x1000, 0x7000), Some(0x7000));
        assert_eq!(find_gap(&[], 0x1000, USER_SPACE_END), None);
    }

    #[test]
    fn zero_pages_are_recognised() {
        let mut page = vec![0u8; 4096];
        assert!(is_zero_page(&page));
        page[4095] = 1;
        assert!(!is_zero_page(&page));
    }
}
