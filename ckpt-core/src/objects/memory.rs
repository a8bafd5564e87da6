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
    File { path: String, dev: u64, ino: u64, size: u64 },
    /// The kernel's vdso code, whose bytes are kept to compare with the restarting kernel's.
    Vdso { code: Vec<u8> },
    /// The kernel's data pages beside the vdso ([vvar], [vvar_vclock], ...), by name.
    VdsoData { name: String },
    /// The legacy [vsyscall] page, fixed by the kernel.
    Vsyscall,
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
            Backing::Stack => "stack".into(),
            Backing::Vdso { .. } => "vdso".into(),
            Backing::VdsoData { name } => name.clone(),
            Backing::Vsyscall => "vsyscall".into(),
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
        Backing::Vdso { .. } | Backing::VdsoData { .. } | Backing::Vsyscall => false,
        // A shared file mapping's data lives in the file itself.
        Backing::File { .. } if shared => false,
        // A private file mapping: only pages the process changed (now private copies) differ
        // from the file.
        Backing::File { .. } => flags.swapped() || (flags.present() && !flags.file_or_shared()),
        Backing::Anon | Backing::Stack => flags.present() || flags.swapped(),
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
            if path == "/dev/zero (deleted)" || path.starts_with("/SYSV") || path.starts_with("/memfd:") {
                if path != "/dev/zero (deleted)" {
                    return Err(Error::Unsupported { pid, what: format!("the mapping of {path} at {:#x}", map.address.0) });
                }
                Backing::Anon
            } else if path.ends_with(" (deleted)") {
                return Err(Error::Unsupported { pid, what: format!("a mapping of deleted file {path}") });
            } else {
                // Identify the file through the mapping itself, which stays valid even if the
                // path now names another file.
                let link = format!("/proc/{pid}/map_files/{:x}-{:x}", map.address.0, map.address.1);
                let meta = std::fs::metadata(&link).context(|| format!("stat {link} ({path})"))?;
                Backing::File { path, dev: meta.dev(), ino: meta.ino(), size: meta.size() }
            }
        }
        other => return Err(Error::Unsupported { pid, what: format!("a mapping {other:?} at {:#x}", map.address.0) }),
    })
}

pub use procfs::MemoryMap;

/// Captures every mapping of a stopped process, copying the pages worth storing into `stream`.
pub fn capture(pid: Tid, mem: &ProcMem, stream: &mut StreamWriter) -> Result<Vec<VmaRecord>> {
    let pagemap = Pagemap::open(pid)?;
    let mut records = Vec::new();
    for map in procfs::maps(pid)? {
        let backing = backing_of(pid, &map, mem)?;
        let shared = map.perms.contains(MMPermissions::SHARED);
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
        if !record.is_kernel_special() && !(shared && matches!(record.backing, Backing::File { .. })) {
            let flags = pagemap.range(start, end).context(|| format!("read pagemap of pid {pid} at {start:#x}"))?;
            for (run_start, run_pages) in wanted_runs(start, &flags, |f| page_needs_storing(&record.backing, shared, f)) {
                copy_run(pid, mem, run_start, run_pages, record.prot, stream, &mut record.runs)?;
            }
        }
        records.push(record);
    }
    Ok(records)
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

/// Copies `pages` pages at `addr` into the stream, dropping all-zero pages, and records runs.
fn copy_run(
    pid: Tid,
    mem: &ProcMem,
    addr: u64,
    pages: u64,
    prot: u32,
    stream: &mut StreamWriter,
    runs: &mut Vec<PageRun>,
) -> Result<()> {
    let page = PAGE_SIZE as usize;
    let mut done = 0u64;
    while done < pages {
        let base_offset = stream.offset();
        let space = stream.space(page)?;
        let n = ((space.len() / page) as u64).min(pages - done);
        let buf = &mut space[..n as usize * page];
        let at = addr + done * PAGE_SIZE;
        let readable = prot & libc::PROT_READ as u32 != 0;
        let got = if readable { remote_mem::read(pid, at, buf)? } else { 0 };
        if got < buf.len() {
            // process_vm_readv stops at pages it may not read (PROT_NONE); /proc/<pid>/mem reads
            // them as a debugger would.
            mem.read_exact(at + got as u64, &mut buf[got..])?;
        }
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
        if let Backing::File { path, dev, ino, size } = &vma.backing {
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

/// Maps every (non-kernel) VMA of the image at its address, from inside the task. The task's old
/// mappings in those ranges must already be gone. `path_scratch` is a scratch offset for paths.
pub fn map_all(task: &mut RemoteTask, vmas: &[VmaRecord], path_scratch: usize) -> Result<()> {
    for vma in vmas.iter().filter(|v| !v.is_kernel_special()) {
        let writable_for_fill = vma.shared && !vma.runs.is_empty();
        let prot = vma.prot as u64 | if writable_for_fill { libc::PROT_WRITE as u64 } else { 0 };
        let share = if vma.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } as u64;
        let what = || format!("map {:#x}-{:#x} ({})", vma.start, vma.end, vma.backing_name());
        match &vma.backing {
            Backing::File { path, .. } => {
                let path_addr = task.put_path(path_scratch, path)?;
                let open_flags = if vma.shared && vma.prot & libc::PROT_WRITE as u32 != 0 { libc::O_RDWR } else { libc::O_RDONLY };
                let fd = task
                    .syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, path_addr, (open_flags | libc::O_CLOEXEC) as u64])
                    .context(|| format!("open {path} for mapping"))?;
                let r = task.syscall(
                    "mmap",
                    libc::SYS_mmap,
                    &[vma.start, vma.len(), prot, share | libc::MAP_FIXED as u64, fd, vma.file_offset],
                );
                task.syscall("close", libc::SYS_close, &[fd])?;
                r.context(what)?;
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
            _ => unreachable!("kernel mappings are filtered out"),
        }
    }
    Ok(())
}

/// Writes every stored page back, reading the process's stream in order.
pub fn fill(task: &mut RemoteTask, vmas: &[VmaRecord], reader: &mut StreamReader) -> Result<u64> {
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
        let file = Backing::File { path: "/x".into(), dev: 1, ino: 2, size: 3 };
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
