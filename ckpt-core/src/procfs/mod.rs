//! What /proc tells about a task. Parsing is done by the `procfs` crate where it covers the file;
//! the small files it does not (pagemap bits, fdinfo) are read here.

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;

use crate::ptrace::Tid;

pub use procfs::process::{MMPermissions, MMapPath, MemoryMap};

fn proc_err(what: String) -> impl FnOnce(procfs::ProcError) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

fn process(pid: Tid) -> io::Result<procfs::process::Process> {
    procfs::process::Process::new(pid).map_err(proc_err(format!("/proc/{pid}")))
}

/// The memory mappings of a process, in address order.
pub fn maps(pid: Tid) -> io::Result<Vec<MemoryMap>> {
    let maps = process(pid)?.maps().map_err(proc_err(format!("/proc/{pid}/maps")))?;
    Ok(maps.into_iter().collect())
}

pub fn stat(pid: Tid) -> io::Result<procfs::process::Stat> {
    process(pid)?.stat().map_err(proc_err(format!("/proc/{pid}/stat")))
}

pub fn status(pid: Tid) -> io::Result<procfs::process::Status> {
    process(pid)?.status().map_err(proc_err(format!("/proc/{pid}/status")))
}

/// The thread ids of a process.
pub fn tasks(pid: Tid) -> io::Result<Vec<Tid>> {
    let mut tids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        if let Ok(tid) = entry?.file_name().to_string_lossy().parse() {
            tids.push(tid);
        }
    }
    tids.sort_unstable();
    Ok(tids)
}

/// Direct children of a process (over all its threads).
pub fn children(pid: Tid) -> io::Result<Vec<Tid>> {
    let mut kids = Vec::new();
    for tid in tasks(pid)? {
        let text = match fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        kids.extend(text.split_whitespace().filter_map(|s| s.parse::<Tid>().ok()));
    }
    kids.sort_unstable();
    kids.dedup();
    Ok(kids)
}

/// A task's id inside its innermost PID namespace (the last NSpid field).
pub fn ns_tid(host_tid: Tid) -> io::Result<Tid> {
    let text = fs::read_to_string(format!("/proc/{host_tid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other(format!("/proc/{host_tid}/status has no NSpid line")))
}

/// Per-page flags from /proc/<pid>/pagemap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageFlags(pub u64);

impl PageFlags {
    pub fn present(self) -> bool {
        self.0 & (1 << 63) != 0
    }
    pub fn swapped(self) -> bool {
        self.0 & (1 << 62) != 0
    }
    /// A page of the page cache or of shared anonymous memory (not a private anonymous copy).
    pub fn file_or_shared(self) -> bool {
        self.0 & (1 << 61) != 0
    }
}

/// Open /proc/<pid>/pagemap, to be read one range at a time.
pub struct Pagemap(fs::File);

impl Pagemap {
    pub fn open(pid: Tid) -> io::Result<Pagemap> {
        fs::File::open(format!("/proc/{pid}/pagemap"))
            .map(Pagemap)
            .map_err(|e| io::Error::new(e.kind(), format!("open /proc/{pid}/pagemap: {e}")))
    }

    /// Flags of every page in `[start, end)` (page-aligned).
    pub fn range(&self, start: u64, end: u64) -> io::Result<Vec<PageFlags>> {
        let pages = ((end - start) / crate::PAGE_SIZE) as usize;
        let mut raw = vec![0u8; pages * 8];
        self.0.read_exact_at(&mut raw, start / crate::PAGE_SIZE * 8)?;
        Ok(raw.chunks_exact(8).map(|b| PageFlags(u64::from_le_bytes(b.try_into().unwrap()))).collect())
    }
}

/// Position and open flags of a descriptor, from /proc/<pid>/fdinfo/<fd>.
#[derive(Debug, Clone, Copy)]
pub struct FdInfo {
    pub pos: u64,
    pub flags: u32,
}

impl FdInfo {
    /// Reads the position and flags from an fdinfo text. Pure.
    pub fn parse(text: &str) -> FdInfo {
        let pos = fdinfo_field(text, "pos").and_then(|v| v.parse().ok()).unwrap_or(0);
        let flags = fdinfo_field(text, "flags").and_then(|v| u32::from_str_radix(v, 8).ok()).unwrap_or(0);
        FdInfo { pos, flags }
    }
}

/// The whole of /proc/<pid>/fdinfo/<fd>, for the object modules that parse the lines their kind
/// adds (eventfd-count, timerfd state, epoll targets, inotify watches, ...).
pub fn fdinfo_text(pid: Tid, fd: i32) -> io::Result<String> {
    fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .map_err(|e| io::Error::new(e.kind(), format!("read /proc/{pid}/fdinfo/{fd}: {e}")))
}

/// The value of the first `name:` line of an fdinfo text, trimmed (`name` without the colon).
pub fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// How many descriptors a process has open, from the size the kernel gives its /proc/<pid>/fd
/// (Linux 6.2 and later; 0 before).
pub fn fd_count(pid: Tid) -> io::Result<usize> {
    Ok(fs::metadata(format!("/proc/{pid}/fd"))?.len() as usize)
}

/// The size of a process's descriptor table (FDSize): every open descriptor is below it.
pub fn fd_table_size(pid: Tid) -> io::Result<usize> {
    Ok(status(pid)?.fdsize as usize)
}

/// Descriptor numbers open in a process.
pub fn fds(pid: Tid) -> io::Result<Vec<i32>> {
    let mut fds: Vec<i32> = fs::read_dir(format!("/proc/{pid}/fd"))?
        .filter_map(|e| e.ok()?.file_name().to_string_lossy().parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

pub fn readlink(path: &str) -> io::Result<String> {
    fs::read_link(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| io::Error::new(e.kind(), format!("readlink {path}: {e}")))
}
