//! What /proc tells about a task. Parsing is done by the `procfs` crate where it covers the file;
//! the small files it does not (pagemap bits, fdinfo) are read here.

use std::fs;
use std::io;
use std::os::unix::fs::FileExt;

use crate::ptrace::Tid;

pub mod pagemap_scan;

pub use procfs::process::{MMPermissions, MMapPath, MemoryMap, Status};

fn proc_err(what: String) -> impl FnOnce(procfs::ProcError) -> io::Error {
    move |e| io::Error::other(format!("{what}: {e}"))
}

/// An error of reading `path`, naming it, of the same kind (a process that ended reads as
/// NotFound, which callers tell from a failure).
fn named(what: &str, path: &str) -> impl FnOnce(io::Error) -> io::Error {
    let text = format!("{what} {path}");
    move |e| io::Error::new(e.kind(), format!("{text}: {e}"))
}

/// `work` on parts of `items`, one part per CPU (on this thread where there is one), and what
/// every part gave, in no particular order. For the frozen window's reads of /proc, each a
/// system call the kernel serves on the CPU that asks.
pub(crate) fn side_by_side<T: Sync, R: Send>(items: &[T], work: impl Fn(&[T]) -> Vec<R> + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len()).max(1);
    if threads == 1 {
        return work(items);
    }
    let work = &work;
    std::thread::scope(|s| {
        let parts: Vec<_> = items.chunks(items.len().div_ceil(threads)).map(|part| s.spawn(move || work(part))).collect();
        parts.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    })
}

fn process(pid: Tid) -> io::Result<procfs::process::Process> {
    procfs::process::Process::new(pid).map_err(proc_err(format!("/proc/{pid}")))
}

/// A process's resource limits as (RLIMIT_* number, soft, hard), from /proc/PID/limits, which
/// anyone may read: prlimit(2) on another process needs its uids or CAP_SYS_RESOURCE, which a
/// root restart in a container often lacks (Docker's default capabilities), so a job that
/// dropped to another user could not have its limits read that way.
pub fn limits(pid: Tid) -> io::Result<Vec<(u32, u64, u64)>> {
    let path = format!("/proc/{pid}/limits");
    let text = fs::read_to_string(&path).map_err(named("read", &path))?;
    parse_limits(&text).map_err(named("parse", &path))
}

/// The limits of the text of a /proc/PID/limits file, in RLIMIT_* order. Pure.
pub fn parse_limits(text: &str) -> io::Result<Vec<(u32, u64, u64)>> {
    use procfs::process::LimitValue;
    use procfs::FromBufRead;
    let l = procfs::process::Limits::from_buf_read(text.as_bytes()).map_err(proc_err("limits".into()))?;
    // RLIMIT_CPU .. RLIMIT_RTTIME, in the kernel's numbering.
    let by_number = [
        l.max_cpu_time,
        l.max_file_size,
        l.max_data_size,
        l.max_stack_size,
        l.max_core_file_size,
        l.max_resident_set,
        l.max_processes,
        l.max_open_files,
        l.max_locked_memory,
        l.max_address_space,
        l.max_file_locks,
        l.max_pending_signals,
        l.max_msgqueue_size,
        l.max_nice_priority,
        l.max_realtime_priority,
        l.max_realtime_timeout,
    ];
    let value = |v: LimitValue| match v {
        LimitValue::Unlimited => libc::RLIM_INFINITY,
        LimitValue::Value(n) => n,
    };
    Ok(by_number.iter().zip(0u32..).map(|(lim, res)| (res, value(lim.soft_limit), value(lim.hard_limit))).collect())
}

/// The mappings the text of a /proc/PID/maps file lists, in its order.
pub fn parse_maps(text: &str) -> io::Result<Vec<MemoryMap>> {
    use procfs::FromBufRead;
    let maps = procfs::process::MemoryMaps::from_buf_read(text.as_bytes()).map_err(proc_err("maps".into()))?;
    Ok(maps.into_iter().collect())
}

/// The memory mappings of a process, in address order, as /proc/PID/maps lists them. Asked of
/// the kernel one by one with PROCMAP_QUERY where it has it (Linux 6.11: [`maps_queried`]),
/// which spares it the formatting of the whole list: a process of some 400 mappings (an MPI
/// rank) is listed in about half the time; read from the text of /proc/PID/maps elsewhere.
/// A frozen process's capture asks once and every part of the capture takes it from there.
pub fn maps(pid: Tid) -> io::Result<Vec<MemoryMap>> {
    static QUERY_WORKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    use std::sync::atomic::Ordering::Relaxed;
    if QUERY_WORKS.load(Relaxed) {
        match maps_queried(pid)? {
            Some(list) => return Ok(list),
            None => QUERY_WORKS.store(false, Relaxed),
        }
    }
    maps_listed(pid)
}

/// The memory mappings of a process, from the text of /proc/PID/maps.
pub fn maps_listed(pid: Tid) -> io::Result<Vec<MemoryMap>> {
    let path = format!("/proc/{pid}/maps");
    let text = fs::read_to_string(&path).map_err(named("read", &path))?;
    parse_maps(&text).map_err(named("parse", &path))
}

/// The memory mappings of a process, in address order, as /proc/PID/maps lists them, asked of
/// the kernel one by one with PROCMAP_QUERY (Linux 6.11), which spares it the formatting of the
/// list (`sys::procmap`). None where the kernel has no PROCMAP_QUERY. As the maps list but for a
/// name holding a newline, which comes raw (maps escapes it as `\012`: the raw one is the
/// file's true name).
pub fn maps_queried(pid: Tid) -> io::Result<Option<Vec<MemoryMap>>> {
    use crate::sys::procmap::{self, VMA_EXECUTABLE, VMA_READABLE, VMA_SHARED, VMA_WRITABLE};
    let path = format!("/proc/{pid}/maps");
    let file = fs::File::open(&path).map_err(named("open", &path))?;
    let mut out = Vec::new();
    let mut at = 0u64;
    loop {
        let m = match procmap::query(&file, at, true) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => return Ok(None),
            // Its memory is gone (a zombie, or a process on its way out), where the maps list
            // reads empty.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) && out.is_empty() => return Ok(Some(out)),
            // A name longer than a path may be (a deep directory): the text has it.
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => return maps_listed(pid).map(Some),
            Err(e) => return Err(named("PROCMAP_QUERY", &path)(e)),
        };
        let mut perms = MMPermissions::empty();
        for (bit, perm) in [(VMA_READABLE, MMPermissions::READ), (VMA_WRITABLE, MMPermissions::WRITE), (VMA_EXECUTABLE, MMPermissions::EXECUTE)] {
            if m.flags & bit != 0 {
                perms |= perm;
            }
        }
        perms |= if m.flags & VMA_SHARED != 0 { MMPermissions::SHARED } else { MMPermissions::PRIVATE };
        let pathname = pathname_of(m.name.as_deref().unwrap_or_default()).map_err(proc_err(path.clone()))?;
        out.push(MemoryMap {
            address: (m.start, m.end),
            perms,
            offset: m.offset,
            dev: (m.dev.0 as i32, m.dev.1 as i32),
            inode: m.inode,
            pathname,
            extension: Default::default(),
        });
        at = m.end;
    }
    // The vsyscall page is the kernel's, in no process's list of mappings, but maps shows it.
    if let Some(vsyscall) = vsyscall_page() {
        out.push(vsyscall);
    }
    Ok(Some(out))
}

/// A mapping's name, as PROCMAP_QUERY gives it, as the procfs crate names it in a maps line. A
/// file's path is taken as its bytes (the maps text must be UTF-8 to be read at all, and the
/// crate's parse of a name starting "/SYSV" assumes eight hex digits follow).
fn pathname_of(name: &[u8]) -> procfs::ProcResult<MMapPath> {
    use std::os::unix::ffi::OsStrExt;
    let is_sysv = name.len() >= 13 && name.starts_with(b"/SYSV") && name[5..13].iter().all(u8::is_ascii_hexdigit);
    if name.starts_with(b"/") && !is_sysv {
        return Ok(MMapPath::Path(std::ffi::OsStr::from_bytes(name).into()));
    }
    MMapPath::from(&String::from_utf8_lossy(name))
}

/// The vsyscall page as /proc/PID/maps shows it in every process, where the kernel has one
/// (read once, from this process's list).
fn vsyscall_page() -> Option<MemoryMap> {
    static PAGE: std::sync::OnceLock<Option<MemoryMap>> = std::sync::OnceLock::new();
    PAGE.get_or_init(|| maps_listed(std::process::id() as Tid).ok()?.into_iter().find(|m| matches!(m.pathname, procfs::process::MMapPath::Vsyscall))).clone()
}

pub fn stat(pid: Tid) -> io::Result<procfs::process::Stat> {
    process(pid)?.stat().map_err(proc_err(format!("/proc/{pid}/stat")))
}

pub fn status(pid: Tid) -> io::Result<Status> {
    process(pid)?.status().map_err(proc_err(format!("/proc/{pid}/status")))
}

/// The thread ids of a process.
pub fn tasks(pid: Tid) -> io::Result<Vec<Tid>> {
    let mut tids = Vec::new();
    let dir = format!("/proc/{pid}/task");
    for entry in fs::read_dir(&dir).map_err(named("list", &dir))? {
        if let Ok(tid) = entry?.file_name().to_string_lossy().parse() {
            tids.push(tid);
        }
    }
    tids.sort_unstable();
    Ok(tids)
}

/// Direct children of a process (over all its threads).
pub fn children(pid: Tid) -> io::Result<Vec<Tid>> {
    children_of_threads(pid, &tasks(pid)?)
}

/// Direct children of process `pid` that its threads `tids` forked (a thread gone meanwhile
/// has none).
pub fn children_of_threads(pid: Tid, tids: &[Tid]) -> io::Result<Vec<Tid>> {
    let mut kids = Vec::new();
    for &tid in tids {
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
    let path = format!("/proc/{host_tid}/status");
    let text = fs::read_to_string(&path).map_err(named("read", &path))?;
    text.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other(format!("/proc/{host_tid}/status has no NSpid line")))
}

/// The device number (dev_t) of a mapping's file, from the major:minor of its maps line.
pub fn map_dev(map: &MemoryMap) -> u64 {
    device_number(map.dev.0, map.dev.1)
}

/// major, minor → dev_t, as stat reports it. Pure.
pub fn device_number(major: i32, minor: i32) -> u64 {
    libc::makedev(major as u32, minor as u32)
}

/// A mount as a process sees it, from /proc/<pid>/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub id: i32,
    /// The device number of its file system (the superblock's, which /proc/<pid>/maps shows).
    pub dev: u64,
    pub fs_type: String,
}

/// The mounts of process `pid`'s mount namespace.
pub fn mounts(pid: Tid) -> io::Result<Vec<Mount>> {
    let infos = process(pid)?.mountinfo().map_err(proc_err(format!("/proc/{pid}/mountinfo")))?;
    Ok(infos
        .into_iter()
        .filter_map(|m| {
            let dev = parse_majmin(&m.majmin)?;
            Some(Mount { id: m.mnt_id, dev, fs_type: m.fs_type })
        })
        .collect())
}

/// "major:minor" (decimal, as in mountinfo) → dev_t. Pure.
pub fn parse_majmin(text: &str) -> Option<u64> {
    let (major, minor) = text.split_once(':')?;
    Some(device_number(major.parse().ok()?, minor.parse().ok()?))
}

/// Whether the machine has any swap space: without, no page of shared memory can be swapped out.
pub fn swap_configured() -> bool {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find_map(|l| l.strip_prefix("SwapTotal:")).map(|v| v.trim().trim_end_matches("kB").trim() != "0"))
        .unwrap_or(true)
}

/// The start addresses of the mappings of process `pid` that have pages in swap (smaps' Swap,
/// which for shared memory counts the object's swapped pages in the mapping's range).
pub fn mappings_with_swap(pid: Tid) -> io::Result<std::collections::HashSet<u64>> {
    let maps = process(pid)?.smaps().map_err(proc_err(format!("/proc/{pid}/smaps")))?;
    Ok(maps.into_iter().filter(|m| m.extension.map.get("Swap").is_some_and(|&v| v > 0)).map(|m| m.address.0).collect())
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
        fs::File::open(format!("/proc/{pid}/pagemap")).map(Pagemap).map_err(named("open", &format!("/proc/{pid}/pagemap")))
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
    fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).map_err(named("read", &format!("/proc/{pid}/fdinfo/{fd}")))
}

/// The value of the first `name:` line of an fdinfo text, trimmed (`name` without the colon).
pub fn fdinfo_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// How many descriptors a process has open, from the size the kernel gives its /proc/<pid>/fd
/// (Linux 6.2 and later; 0 before).
pub fn fd_count(pid: Tid) -> io::Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(fs::metadata(&dir).map_err(named("stat", &dir))?.len() as usize)
}

/// The size of a process's descriptor table (FDSize): every open descriptor is below it.
pub fn fd_table_size(pid: Tid) -> io::Result<usize> {
    Ok(status(pid)?.fdsize as usize)
}

/// Descriptor numbers open in a process.
pub fn fds(pid: Tid) -> io::Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/fd");
    let mut fds: Vec<i32> = fs::read_dir(&dir).map_err(named("list", &dir))?.filter_map(|e| e.ok()?.file_name().to_string_lossy().parse().ok()).collect();
    fds.sort_unstable();
    Ok(fds)
}

pub fn readlink(path: &str) -> io::Result<String> {
    fs::read_link(path).map(|p| p.to_string_lossy().into_owned()).map_err(named("readlink", path))
}

/// Where paths as process `pid`'s mount namespace shows them (the paths /proc gives for its
/// maps, descriptors and working directory) are reached from outside: through /proc/PID/root.
/// A process that changed its root (chroot) has /proc/PID/root at that directory: as many `..`
/// climb back to its namespace's root (a path walk from outside is not held by its root).
/// Read once per process ([`NamespaceRoot::of`]), used for each of its paths.
pub struct NamespaceRoot {
    /// The way in from outside.
    via: String,
    /// The process's root directory, as its namespace shows it.
    root: String,
}

impl NamespaceRoot {
    pub fn of(pid: i32) -> NamespaceRoot {
        // Unreadable: the process is gone, and whatever is read through it fails.
        let root = readlink(&format!("/proc/{pid}/root")).unwrap_or_else(|_| "/".into());
        let up = root.split('/').filter(|c| !c.is_empty()).count();
        NamespaceRoot { via: format!("/proc/{pid}/root{}", "/..".repeat(up)), root }
    }

    /// `path` (absolute, as the namespace shows it) reached from outside.
    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.via)
    }

    /// What names the same paths for every process it is the same for at one moment: the mount
    /// namespace (its inode) and the root directory in it. Where the namespace cannot be read
    /// (the process is gone), the way in, which is the process's own.
    pub fn identity(&self, pid: i32) -> (u64, String) {
        use std::os::unix::fs::MetadataExt;
        match fs::metadata(format!("/proc/{pid}/ns/mnt")) {
            Ok(ns) => (ns.ino(), self.root.clone()),
            // (No namespace has inode 0.)
            Err(_) => (0, self.via.clone()),
        }
    }
}

/// `path` as process `pid`'s mount namespace shows it, reached from outside (see
/// [`NamespaceRoot`]; for one path of a process: several read the root once).
pub fn in_namespace_of(pid: i32, path: &str) -> String {
    NamespaceRoot::of(pid).path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every limit of /proc/PID/limits, by its RLIMIT_* number, "unlimited" as RLIM_INFINITY;
    /// and this process's own are those prlimit(2) gives.
    #[test]
    fn limits_are_read_by_number_from_proc() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max file size             unlimited            unlimited            bytes     \n\
Max data size             unlimited            unlimited            bytes     \n\
Max stack size            8388607              unlimited            bytes     \n\
Max core file size        0                    unlimited            bytes     \n\
Max resident set          unlimited            unlimited            bytes     \n\
Max processes             96362                96363                processes \n\
Max open files            19999                20000                files     \n\
Max locked memory         8388607              8388608              bytes     \n\
Max address space         unlimited            unlimited            bytes     \n\
Max file locks            unlimited            unlimited            locks     \n\
Max pending signals       96362                96363                signals   \n\
Max msgqueue size         819199               819200               bytes     \n\
Max nice priority         0                    0                    \n\
Max realtime priority     0                    0                    \n\
Max realtime timeout      unlimited            unlimited            us        \n";
        let l = parse_limits(text).unwrap();
        assert_eq!(l.len(), 16);
        assert_eq!(l[libc::RLIMIT_STACK as usize], (libc::RLIMIT_STACK, 8388607, libc::RLIM_INFINITY));
        assert_eq!(l[libc::RLIMIT_NOFILE as usize], (libc::RLIMIT_NOFILE, 19999, 20000));
        assert_eq!(l[libc::RLIMIT_MSGQUEUE as usize], (libc::RLIMIT_MSGQUEUE, 819199, 819200));
        assert_eq!(l[libc::RLIMIT_RTTIME as usize], (libc::RLIMIT_RTTIME, libc::RLIM_INFINITY, libc::RLIM_INFINITY));
        let me = std::process::id() as Tid;
        for (res, soft, hard) in limits(me).unwrap() {
            assert_eq!((soft, hard), crate::ptrace::sys::rlimit(me, res).unwrap(), "RLIMIT {res}");
        }
        assert!(parse_limits("Limit Soft Hard Units\nMax cpu time unlimited\n").is_err());
    }

    /// The mappings asked one by one of the kernel are those /proc/PID/maps lists, field by
    /// field (this process's: its heap, stacks, libraries, vdso; a file mapped, deleted since,
    /// and an anonymous mapping given a name). Skipped, saying so, before Linux 6.11.
    #[test]
    #[cfg_attr(ckpt_no_procmap_query, ignore = "this kernel has no PROCMAP_QUERY (Linux 6.11)")]
    fn mappings_queried_are_those_maps_lists() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mapped");
        std::fs::File::create(&path).unwrap().write_all(&[7u8; 8192]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is this test's own, read through the mapping by nobody.
        let mapped = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        std::fs::remove_file(&path).unwrap();
        let pid = std::process::id() as Tid;
        let queried = maps_queried(pid).unwrap().expect("a kernel of 6.11 or later (as built) without PROCMAP_QUERY");
        let listed = maps_listed(pid).unwrap();
        // (A thread of the test harness may map or unmap between the two reads: compare the
        // mappings both have, and ask that most are.)
        let same = listed.iter().filter(|m| queried.contains(m)).count();
        assert!(same * 10 >= listed.len() * 9, "{same} of {} mappings alike:\nlisted {listed:#?}\nqueried {queried:#?}", listed.len());
        let deleted = listed.iter().find(|m| m.address.0 == mapped.as_ptr() as u64).expect("the mapping of the deleted file");
        assert!(queried.contains(deleted), "the deleted file's mapping {deleted:?}");
        assert!(queried.iter().any(|m| matches!(m.pathname, procfs::process::MMapPath::Vdso)));
        assert!(queried.windows(2).all(|w| w[0].address.1 <= w[1].address.0), "in address order");
    }

    #[test]
    fn device_numbers_as_stat_gives_them() {
        // /dev/vda (253:0), a partition (8:1), an anonymous device (0:35), and a large minor,
        // which glibc's encoding splits across the word.
        assert_eq!(device_number(0xfd, 0), 0xfd00);
        assert_eq!(device_number(8, 1), 0x801);
        assert_eq!(device_number(0, 35), 35);
        assert_eq!(device_number(0x103, 0x12345), 0x1231_0345);
        assert_eq!(device_number(0x12345, 1), 0x0001_2000_0003_4501);
        assert_eq!(parse_majmin("8:1"), Some(0x801));
        assert_eq!(parse_majmin("0:35"), Some(35));
        assert_eq!(parse_majmin("0x"), None);
    }

    #[test]
    fn maps_lines_give_device_numbers() {
        use procfs::FromBufRead;
        let text = "7f00000000-7f00001000 rw-s 00000000 fd:01 123456 /data/file\n";
        let maps = procfs::process::MemoryMaps::from_buf_read(text.as_bytes()).unwrap();
        let map = maps.into_iter().next().unwrap();
        assert_eq!(map_dev(&map), 0xfd01);
        assert_eq!(map.inode, 123456);
    }
}
