//! Memory mappings: every VMA of a process and the pages worth storing.
//!
//! Capture walks /proc/<pid>/maps and pagemap and copies the pages that carry information
//! (present or swapped anonymous pages, private copies of file pages) straight into the node
//! buffer pool, leaving out pages that are all zero. Restore maps every VMA back at its address
//! with its protection from inside the task, then writes the stored pages through /proc/<pid>/mem.
//! What the kernel does with a mapping besides (locked in RAM, madvise flags) is `memattrs`'.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor;
use crate::error::{Context, Error, Result};
use crate::image::StreamReader;
use crate::pool::StreamWriter;
use crate::procfs::{self, MMPermissions, MMapPath, PageFlags, Pagemap};
use crate::ptrace::remote_mem::{self, ProcMem};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys;
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
    /// shared has its contents `saved` in the stream (its data, holes left out), once per
    /// checkpoint, because it is the job's memory and may change after the checkpoint (or
    /// vanish at a reboot).
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
    /// A private mapping of a file deleted since it was mapped (a library upgraded or rebuilt
    /// under a running program: `path` ends with " (deleted)"). No file is left to map it from
    /// at restart, so every page is stored (the file's too, read through the mapping) and it
    /// comes back as private anonymous memory with the same contents. (The last variant: older
    /// images decode unchanged.)
    Unlinked { path: String },
    /// The completion ring of an AIO context (io_setup), holding `nr` events: made again as a
    /// context, not as memory (see [`super::aio`]). No pages are stored.
    Aio { nr: u32 },
    /// A private mapping of a shared memory object (a memfd, MAP_SHARED|MAP_ANONYMOUS memory, a
    /// deleted file: `path` as [`is_shared_object`] names one), by the object's inode. Its pages
    /// are of two kinds since the copy-on-write split: those the process wrote, its own copies
    /// (the record's `runs`), and the others, which read the object and must go on reading it,
    /// changed since or after the restart (through a shared mapping, write()). Where the image
    /// restores the object (a shared mapping of it: [`MemRestoreCtx::restores_object`]), the
    /// mapping comes back MAP_PRIVATE of it with the copies written in; where not, no one can
    /// change the object, and it comes back as private anonymous memory filled with `object`
    /// too: the object's pages as the mapping read them, every checkpoint. (After `Aio`: older
    /// images decode unchanged.)
    PrivateShmem { ino: u64, memfd_name: Option<String>, path: String, object: Vec<PageRun> },
    /// Private anonymous memory made with MAP_DROPPABLE (Linux 6.11; smaps shows `dp`), whose
    /// contents the kernel may drop at any moment, reading as zeros then: glibc keeps the state
    /// of its vDSO getrandom() there so that the state is never copied (a fork wipes it too).
    /// No page is stored, and it comes back droppable and zero-filled, as if dropped: the
    /// program makes its state again (getrandom reseeds from the kernel), so two restarts of
    /// one image never give out the same random bytes. (After `PrivateShmem`: older images
    /// decode unchanged.)
    Droppable,
    /// A mapping of an NVIDIA device (`path`) in a process that is no CUDA process: one fork
    /// copied from a CUDA parent (PyTorch's DataLoader workers; seen on an H200), which the
    /// process cannot use (CUDA does not work in a forked child). No page is stored: it comes
    /// back as address space no access is allowed to (PROT_NONE, nothing behind it), so that
    /// nothing else is mapped there and a touch faults rather than reading another GPU's
    /// memory. (After `Droppable`: older images decode unchanged.)
    GpuInherited { path: String },
}

/// An in-memory file's contents in the process's stream: `len` bytes (its size), of which the
/// data `extents` are stored, the rest holes. Before format 28 (`extents` None) the whole file,
/// holes as zeros, lay from `stream_offset`; since, `stream_offset` is where its first extent
/// would go and each extent says where it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedFile {
    pub stream_offset: u64,
    pub len: u64,
    #[serde(deserialize_with = "crate::image::since::since::<28, _, _>")]
    pub extents: Option<Vec<super::deleted::Extent>>,
    /// Space allocated beyond the data, allocated again at restart (as
    /// `deleted::SavedFileContents::allocated`; a /dev/shm segment that PostgreSQL
    /// fallocated so that its writes never meet a full /dev/shm). Format 28.
    #[serde(deserialize_with = "crate::image::since::since::<28, _, _>")]
    pub allocated: bool,
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
    /// Locked in RAM, madvise flags (see `memattrs`).
    pub attrs: super::memattrs::VmaAttrs,
    /// In an incremental generation, the pages not written since an earlier generation stored
    /// them: they are read from that generation's stream of the same process. Disjoint from
    /// `runs`; empty in a full generation.
    pub earlier: Vec<EarlierRun>,
    /// Guard pages (madvise MADV_GUARD_INSTALL, Linux 6.13: glibc 2.42 puts one at the end of
    /// every thread stack) as `(address, pages)` runs, sorted, disjoint, inside the mapping: no
    /// access passes them; the restart makes them guards again once the pages are filled.
    /// Format 32 (none in older images).
    #[serde(deserialize_with = "crate::image::since::since::<32, _, _>")]
    pub guards: Vec<(u64, u64)>,
}

/// Pages of a mapping that an earlier generation stored and the process has not written
/// since: `run.stream_offset` is in `generation`'s stream of the same process. Always the
/// generation that holds the bytes, never one that refers on to another, so that a restart
/// reads each page from the one place it is in.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct EarlierRun {
    pub generation: u64,
    pub run: PageRun,
}

impl VmaRecord {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> u64 {
        // Validation makes start < end; saturating all the same, so a record that skipped it
        // gives an empty length, not a wrap-around.
        self.end.saturating_sub(self.start)
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
            Backing::Unlinked { path } => path.clone(),
            Backing::Aio { nr } => format!("AIO ring of {nr} events"),
            Backing::PrivateShmem { path, .. } => format!("{path}, private"),
            Backing::Droppable => "droppable".into(),
            Backing::GpuInherited { path } => format!("{path}, inherited, comes back inaccessible"),
        }
    }

    pub fn stored_pages(&self) -> u64 {
        self.runs.iter().fold(0u64, |acc, r| acc.saturating_add(r.pages))
    }

    /// The pages restored from earlier generations (an incremental generation's references).
    pub fn earlier_pages(&self) -> u64 {
        self.earlier.iter().fold(0u64, |acc, e| acc.saturating_add(e.run.pages))
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
        Backing::Vdso { .. }
        | Backing::VdsoData { .. }
        | Backing::Vsyscall
        | Backing::SysvShm { .. }
        | Backing::Aio { .. }
        | Backing::Droppable
        | Backing::GpuInherited { .. } => false,
        // A shared file mapping's data lives in the file itself.
        Backing::File { .. } if shared => false,
        // A private file mapping: only pages the process changed (now private copies) differ
        // from the file.
        Backing::File { .. } | Backing::PrivateShmem { .. } => is_private_copy(flags),
        Backing::Anon | Backing::Stack | Backing::Shmem { .. } => flags.present() || flags.swapped(),
        // Nothing to read it from at restart: every page (see `readable_run`).
        Backing::Unlinked { .. } => true,
    }
}

/// Whether a page of a private mapping of a file or an object is the process's copy of it: the
/// pagemap shows a page mapped from the object as "file or shared", a private copy as
/// anonymous; a page in swap is a private copy. Pure.
fn is_private_copy(flags: PageFlags) -> bool {
    flags.swapped() || (flags.present() && !flags.file_or_shared())
}

/// Whether [`page_needs_storing`] asks no more of a private mapping's page than whether it is
/// there, in memory or in swap. Pure.
fn only_presence_counts(backing: &Backing) -> bool {
    matches!(backing, Backing::Anon | Backing::Stack)
}

/// A shared mapping whose object no one can open by a name any more, so that its pages are
/// the job's memory, stored once per object: a memfd, MAP_SHARED|MAP_ANONYMOUS (shown as
/// "/dev/zero (deleted)"), or a deleted file mapped shared (POSIX semaphores: sem_open unlinks at
/// once; Python's multiprocessing heap; the PMIx data store of Open MPI, on disk). Such an
/// object comes back as shared memory with the same contents. Pure.
pub fn is_shared_object(path: &str, shared: bool) -> bool {
    shared && (path == "/dev/zero (deleted)" || path.starts_with("/memfd:") || path.ends_with(" (deleted)"))
}

/// Files the processes map, identified once per checkpoint for all the processes that see the
/// same paths (the same mount namespace and root, [`procfs::NamespaceRoot::identity`]): a library is mapped four or five times
/// (text, data, read-only data...) by each process, and each identification walks its path
/// through /proc/PID/root (an Open MPI rank maps some 400 pieces of about 80 files, the same
/// as every other rank). By (namespace, root, path, device, inode).
type Identified = HashMap<((u64, String), String, u64, u64), std::fs::Metadata>;

/// `gpu_left_alone`: the process is no CUDA process (the driver said so before the freeze),
/// and its mappings of an NVIDIA device are inherited ones ([`Backing::GpuInherited`]).
/// `identified`: the files identified so far in this process.
fn backing_of(
    pid: Tid,
    root: &procfs::NamespaceRoot,
    map: &MemoryMap,
    mem: &ProcMem,
    probe: &MemoryProbe,
    gpu_left_alone: bool,
    identified: (&mut Identified, &(u64, String)),
) -> Result<Backing> {
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
            if path == super::aio::RING_PATH {
                Backing::Aio { nr: super::aio::capture(pid, mem, map.address.0, map.address.1 - map.address.0)? }
            } else if is_shared_object(&path, shared) {
                let memfd_name = path.strip_prefix("/memfd:").map(|n| n.trim_end_matches(" (deleted)").to_string());
                Backing::Shmem { ino: map.inode, memfd_name }
            } else if path.starts_with("/SYSV") {
                return Err(Error::Unsupported { pid, what: format!("System V shared memory ({path} at {:#x})", map.address.0) });
            } else if gpu_left_alone && crate::gpu::is_gpu_device(&path) {
                Backing::GpuInherited { path }
            } else if is_shared_object(&path, true) {
                // Private, of an object that a shared mapping or a descriptor may change.
                let memfd_name = path.strip_prefix("/memfd:").map(|n| n.trim_end_matches(" (deleted)").to_string());
                Backing::PrivateShmem { ino: map.inode, memfd_name, path, object: Vec::new() }
            } else {
                // The file is found by its path, and must be the very file mapped (same device
                // and inode as the maps line): the path may now name another file, and nothing
                // else that names the mapped file (/proc/<pid>/map_files) may be followed
                // without CAP_CHECKPOINT_RESTORE in the initial user namespace.
                let (identified, space) = identified;
                let key = (space.clone(), path.clone(), procfs::map_dev(map), map.inode);
                let meta = match identified.get(&key) {
                    Some(meta) => meta.clone(),
                    None => {
                        let meta = identify_file(pid, root, &path, key.2, key.3).map_err(|problem| Error::MappedFileMoved {
                            pid,
                            addr: map.address.0,
                            path: path.clone(),
                            problem,
                        })?;
                        identified.entry(key).or_insert(meta).clone()
                    }
                };
                {
                    use std::os::unix::fs::FileTypeExt;
                    // A device's memory (a GPU's registers or memory) is not a file's contents:
                    // mapped again at restart it would be whatever the device holds then.
                    if meta.file_type().is_char_device() || meta.file_type().is_block_device() {
                        return Err(Error::Unsupported { pid, what: format!("a mapping of the device {path} at {:#x}", map.address.0) });
                    }
                }
                Backing::File { path, dev: meta.dev(), ino: meta.ino(), size: meta.size(), saved: None }
            }
        }
        MMapPath::Vsys(_) => {
            // System V shared memory; the inode number of its mapping is the segment's id.
            let shmid = map.inode as i32;
            let size = *probe
                .sysv_sizes
                .get(&shmid)
                .ok_or_else(|| Error::Other(format!("pid {pid}: System V segment {shmid} at {:#x} appeared after the memory probe", map.address.0)))?;
            Backing::SysvShm { shmid, size }
        }
        other => return Err(Error::Unsupported { pid, what: format!("a mapping {other:?} at {:#x}", map.address.0) }),
    })
}

/// The root directory of process `pid` (host pid), for [`create_in_root`].
fn open_root_of(pid: Tid) -> Result<std::os::fd::OwnedFd> {
    use nix::fcntl::OFlag;
    let at = format!("/proc/{pid}/root");
    nix::fcntl::open(at.as_str(), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map_err(|e| Error::Other(format!("open {at}: {e}")))
}

/// Creates (or opens and empties) the file at `path` as the process whose root is `root` sees
/// it, and the directories leading to it: absolute links and `..` stay inside that root
/// (RESOLVE_IN_ROOT), and the last component is never a link.
fn create_in_root(root: &std::os::fd::OwnedFd, path: &str) -> std::io::Result<std::fs::File> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    use nix::sys::stat::Mode;
    let in_root = |p: &str, flags: OFlag, mode: Mode| {
        let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).mode(mode).resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        openat2(root, p, how).map_err(std::io::Error::from)
    };
    let rel = path.trim_start_matches('/');
    if let Some((parent, _)) = rel.rsplit_once('/') {
        let mut dir = String::from(".");
        for part in parent.split('/').filter(|c| !c.is_empty()) {
            let at = in_root(&dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
            match nix::sys::stat::mkdirat(&at, part, Mode::from_bits_truncate(0o777)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            dir = format!("{dir}/{part}");
        }
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    Ok(std::fs::File::from(in_root(rel, flags, Mode::from_bits_truncate(0o600))?))
}

/// The metadata of the file at `path` (as process `pid` sees it) if it is the file with device
/// `dev` and inode `ino`; otherwise what is wrong, for a message.
pub(crate) fn identify_file(pid: Tid, root: &procfs::NamespaceRoot, path: &str, dev: u64, ino: u64) -> std::result::Result<std::fs::Metadata, String> {
    let at = root.path(path);
    let meta = std::fs::metadata(&at).map_err(|e| format!("its path names no file now ({e})"))?;
    if same_file(&at, &meta, pid, dev, ino) {
        Ok(meta)
    } else {
        Err(format!("its path now names another file (device {:#x}, inode {} instead of device {dev:#x}, inode {ino})", meta.dev(), meta.ino()))
    }
}

/// Whether `meta` (of the file at `at`) is the file /proc/<pid>/maps shows as `dev`, `ino`. Maps
/// shows the file system's own device; stat may show another on file systems with several
/// trees in one (btrfs subvolumes): then the device of the mount the path is on must match. On
/// an overlay, some kernels (6.1) show in maps the device of the layer the file comes from,
/// which the overlay's own mount does not name and a container cannot even see: there the
/// inode, which the overlay passes through from the layer, decides.
fn same_file(at: &str, meta: &std::fs::Metadata, pid: Tid, dev: u64, ino: u64) -> bool {
    if meta.ino() != ino {
        return false;
    }
    if meta.dev() == dev {
        return true;
    }
    let mount = sys::mount::mount_id(at).ok().flatten().and_then(|id| procfs::mounts(pid).ok()?.into_iter().find(|m| m.id == id));
    mount.is_some_and(|m| m.dev == dev || m.fs_type == "overlay")
}

pub use procfs::MemoryMap;

/// What capture learns of a process's mappings from inside it, while the restorer's scratch
/// area is mapped there ([`probe`]): which pages of each shared memory object exist, and the
/// sizes of the System V segments it attached.
#[derive(Debug, Default)]
pub struct MemoryProbe {
    /// mincore's answer for a mapping of a shared memory object, by the mapping's start: a byte
    /// per page, bit 0 set where the object holds the page. Mappings without an entry are read
    /// whole (see [`probe`]).
    resident: HashMap<u64, Vec<u8>>,
    /// System V segment sizes, by id.
    sysv_sizes: HashMap<i32, u64>,
}

/// The device of the kernel's internal shared memory file system, which holds every memfd,
/// MAP_SHARED|MAP_ANONYMOUS object and System V segment: learned once from a memfd of our own.
pub(crate) fn shmem_dev() -> Result<u64> {
    static DEV: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if let Some(dev) = DEV.get() {
        return Ok(*dev);
    }
    let own = nix::sys::memfd::memfd_create(c"ckpt-probe", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| Error::Other(format!("memfd_create, to learn the shared memory file system's device: {e}")))?;
    let dev = std::fs::File::from(own).metadata()?.dev();
    Ok(*DEV.get_or_init(|| dev))
}

/// Asks a stopped process, from inside (system calls injected into `task`, whose scratch area
/// is free), what its memory capture needs besides /proc:
///
/// - which pages of each shared memory object it maps exist. The object, not this process's
///   page tables, holds them: a page another process wrote may not be mapped here. mincore on a
///   shared mapping of a shmem (tmpfs) object reports the object's pages in memory, whoever
///   touched them (checked on 6.18). It reports a page in swap only while the page is still in
///   the swap cache, so a mapping whose object has pages in swap (smaps' Swap, which counts
///   them whether cached or not) is read whole, as is an object on another file system (a deleted
///   file on disk, whose pages may be on the disk only) or a hugetlbfs one (whose mincore sees
///   only this process's page tables). Reading a page the object lacks makes one (zeros, not
///   stored): the reason not to read every object whole.
/// - the size of each System V segment it attached (shmctl IPC_STAT in the job's IPC
///   namespace, where the process is).
///
/// `skip`: the mappings (by start) whose object another process stores, and need not be asked.
pub fn probe(task: &mut RemoteTask, maps: &[MemoryMap], skip: &[u64]) -> Result<MemoryProbe> {
    let pid = task.pid;
    let mut out = MemoryProbe::default();
    let objects: Vec<&MemoryMap> = maps
        .iter()
        .filter(|m| matches!(&m.pathname, MMapPath::Path(p) if is_shared_object(&p.to_string_lossy(), m.perms.contains(MMPermissions::SHARED))))
        .collect();
    let swapped = if !objects.is_empty() && procfs::swap_configured() { procfs::mappings_with_swap(pid)? } else { Default::default() };
    let mut mounts = None;
    for map in objects {
        let (start, end) = map.address;
        if swapped.contains(&start) || skip.contains(&start) {
            continue;
        }
        let dev = procfs::map_dev(map);
        let on_shmem = dev == shmem_dev()? || {
            let mounts = match &mut mounts {
                Some(m) => m,
                None => mounts.insert(procfs::mounts(pid)?),
            };
            mounts.iter().any(|m: &procfs::Mount| m.dev == dev && m.fs_type == "tmpfs")
        };
        if on_shmem {
            out.resident.insert(start, resident_pages(task, start, end)?);
        }
    }
    for map in maps {
        let MMapPath::Vsys(key) = map.pathname else { continue };
        let shmid = map.inode as i32;
        if let std::collections::hash_map::Entry::Vacant(e) = out.sysv_sizes.entry(shmid) {
            let at = map.address.0;
            e.insert(sysv_size(task, shmid, key).map_err(|e| match e {
                SysvLookup::Io(io) => Error::from(io).of_object(pid, format!("the size of System V segment {shmid} at {at:#x}")),
                SysvLookup::Foreign => Error::Unsupported {
                    pid,
                    what: format!(
                        "System V segment {shmid} (key {key:#x}) at {at:#x}, of another IPC namespace than its own (attached before unshare --ipc?): \
                         a restart would attach the segment of that id in its own"
                    ),
                },
            })?);
        }
    }
    Ok(out)
}

/// Why the segment a mapping names cannot be looked at.
enum SysvLookup {
    Io(std::io::Error),
    /// The process's IPC namespace has no segment of that id, or one of another key: the
    /// mapping is of a segment of another namespace.
    Foreign,
}

/// mincore of `[start, end)` in the task, through its scratch area.
fn resident_pages(task: &mut RemoteTask, start: u64, end: u64) -> Result<Vec<u8>> {
    let (scratch, len) = task.scratch();
    let mut out = Vec::with_capacity(((end - start) / PAGE_SIZE) as usize);
    let mut at = start;
    while at < end {
        let pages = ((end - at) / PAGE_SIZE).min(len as u64);
        task.syscall("mincore", libc::SYS_mincore, &[at, pages * PAGE_SIZE, scratch])
            .context(|| format!("pid {}: mincore of {at:#x}+{} pages", task.pid, pages))?;
        out.extend(task.get(scratch, pages as usize)?);
        at += pages * PAGE_SIZE;
    }
    Ok(out)
}

/// shmctl(IPC_STAT) of a segment in the task's IPC namespace: its size, if it is the segment
/// of key `key` that the task maps. (A segment removed while attached has lost its key: it is
/// IPC_PRIVATE then, marked SHM_DEST. The ids of two namespaces may name segments of one key:
/// a mapping of the other's is not told apart then.)
fn sysv_size(task: &mut RemoteTask, shmid: i32, key: i32) -> std::result::Result<u64, SysvLookup> {
    let buf = task.scratch_at(0);
    match task.main.raw(libc::SYS_shmctl, &[shmid as u64, libc::IPC_STAT as u64, buf]).map_err(SysvLookup::Io)? {
        0.. => {}
        r if matches!(-r as i32, libc::EINVAL | libc::EIDRM) => return Err(SysvLookup::Foreign),
        r => return Err(SysvLookup::Io(std::io::Error::from_raw_os_error(-r as i32))),
    }
    let field = |task: &mut RemoteTask, off: usize, len: usize| task.get(buf + off as u64, len).map_err(SysvLookup::Io);
    let size = u64::from_ne_bytes(field(task, std::mem::offset_of!(libc::shmid_ds, shm_segsz), 8)?.try_into().expect("8 bytes"));
    let perm = std::mem::offset_of!(libc::shmid_ds, shm_perm);
    let own_key = i32::from_ne_bytes(field(task, perm + std::mem::offset_of!(libc::ipc_perm, __key), 4)?.try_into().expect("4 bytes"));
    let mode = u16::from_ne_bytes(field(task, perm + std::mem::offset_of!(libc::ipc_perm, mode), 2)?.try_into().expect("2 bytes"));
    let removed = own_key == libc::IPC_PRIVATE && u32::from(mode) & super::sysvipc::SHM_DEST != 0;
    if own_key != key && !removed {
        return Err(SysvLookup::Foreign);
    }
    Ok(size)
}

/// What memory capture remembers across the processes of one checkpoint: objects shared
/// between processes are stored once.
#[derive(Default)]
pub struct MemCaptureCtx {
    /// The parts of each shared memory object (by inode) whose pages are stored: object offsets
    /// [from, to), sorted and disjoint.
    shmem_stored: HashMap<u64, Vec<(u64, u64)>>,
    files_saved: std::collections::HashSet<(u64, u64)>,
    identified: Identified,
    /// The processes (host pids) the GPU step found to be no CUDA processes although they map
    /// an NVIDIA device (`gpu::Suspended::left_alone`).
    pub gpu_left_alone: std::collections::HashSet<Tid>,
    /// The shared memory objects copied before the freeze, and what of each to copy now
    /// ([`super::shared_memory`]): used by the process that keeps the copy, where it is the first
    /// to store the object (and maps it as it did then); taken by the first that stores it.
    pub shared_plans: HashMap<super::shared_memory::ObjectId, super::shared_memory::SharedPlan>,
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
/// Largest in-memory file whose contents a checkpoint saves.
pub(crate) const MAX_SAVED_FILE: u64 = 4 << 30;

pub(crate) fn on_tmpfs(path: &str) -> bool {
    nix::sys::statfs::statfs(path).map(|s| s.filesystem_type().0 == TMPFS_MAGIC).unwrap_or(false)
}

/// A private mapping whose pages are copied after the job runs again, from a copy of the
/// process made at the freeze (see `capture::later`): its record, without runs, is at `index`.
#[derive(Debug, Clone)]
pub struct DeferredVma {
    pub index: usize,
    pub start: u64,
    pub end: u64,
    pub backing: Backing,
    /// In an incremental generation: what to copy and what to refer to.
    pub delta: Option<MappingDelta>,
    /// Its guard pages (`VmaRecord::guards`), which are not read.
    pub guards: Vec<(u64, u64)>,
}

/// Whether a mapping's pages can be read later from a child forked at the freeze instead of
/// now: private memory, which the fork shares copy-on-write, frozen as it was. Not shared
/// memory (the job goes on writing it), not the kernel's own mappings, and not what a child
/// does not get as it was: MADV_DONTFORK (absent) and MADV_WIPEONFORK (zeros). Pure.
pub fn can_copy_later(record: &VmaRecord) -> bool {
    !record.shared
        && !record.is_kernel_special()
        && !record.attrs.dont_fork
        && !record.attrs.wipe_on_fork
        && !matches!(record.backing, Backing::Unlinked { .. } | Backing::PrivateShmem { .. } | Backing::Droppable)
}

/// Captures every mapping of a stopped process, copying the pages worth storing into `stream`.
/// `probe` is what [`probe`] found in it. With `later` (a copy of the process was forked at the
/// freeze), the mappings [`can_copy_later`] are only planned, and returned as deferred: their
/// pages are copied by [`copy_deferred`] once the job runs again. With `delta` (an incremental
/// generation), a private mapping's pages not written since the base are referred to there
/// instead of copied (see [`split_by_delta`]). `flags_ahead`: the mappings' flags read before
/// the freeze, used if the mappings are still laid out as then, and left `None` if not (they
/// are read now). `tables`: its page tables as [`PageTables::read`] found them, for `maps`
/// and `delta`.
#[allow(clippy::too_many_arguments)]
pub fn capture(
    pid: Tid,
    mem: &ProcMem,
    stream: &mut StreamWriter,
    ctx: &mut MemCaptureCtx,
    maps: &[procfs::MemoryMap],
    probe: &MemoryProbe,
    later: bool,
    delta: Option<&Delta>,
    flags_ahead: &mut Option<super::memattrs::FlagsAhead>,
    tables: PageTables,
) -> Result<(Vec<VmaRecord>, Vec<DeferredVma>)> {
    let PageTables { pagemap, there } = tables;
    let mut records = Vec::new();
    let mut deferred = Vec::new();
    flags_ahead.take_if(|a| a.if_same_layout(maps).is_none());
    let mut attrs = match flags_ahead {
        Some(ahead) => ahead.attrs().clone(),
        None => super::memattrs::capture_vmas(pid)?,
    };
    // Its file mappings' paths are its mount namespace's.
    let root = procfs::NamespaceRoot::of(pid);
    let space = root.identity(pid);
    for map in maps {
        let mut backing = backing_of(pid, &root, map, mem, probe, ctx.gpu_left_alone.contains(&pid), (&mut ctx.identified, &space))?;
        let shared = map.perms.contains(MMPermissions::SHARED);
        let (start, end) = map.address;
        // The parts of a shared memory object that no mapping captured before maps (a process
        // may map only part of an object, and another part elsewhere): the object's offsets.
        let mut object_parts = vec![(map.offset, map.offset + (end - start))];
        match &mut backing {
            Backing::Shmem { ino, .. } => object_parts = add_range(ctx.shmem_stored.entry(*ino).or_default(), object_parts[0]),
            // (Saved once per checkpoint: the file system is asked only of a file not saved yet.)
            Backing::File { path, dev, ino, size, saved } if shared && !ctx.files_saved.contains(&(*dev, *ino)) && on_tmpfs(&root.path(path)) => {
                ctx.files_saved.insert((*dev, *ino));
                let plan = ctx.shared_plans.remove(&(*dev, *ino)).filter(|p| p.keeper == pid);
                *saved = Some(save_file((pid, &root), start, path, (*dev, *ino), *size, plan.as_ref(), stream)?);
            }
            _ => {}
        }
        let mut record = VmaRecord {
            start,
            end,
            prot: prot_of(map.perms),
            shared,
            file_offset: map.offset,
            backing,
            runs: Vec::new(),
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        // The kernel sets its own mappings' flags (vvar is "do not dump").
        if !record.is_kernel_special() {
            record.attrs = attrs.remove(&start).ok_or_else(|| Error::Other(format!("pid {pid}: mapping {start:#x}-{end:#x} is not in /proc/{pid}/smaps")))?;
            if record.attrs.droppable && matches!(record.backing, Backing::Anon) {
                record.backing = Backing::Droppable;
            }
        }
        record.guards = guards_in(&pagemap, &record).context(|| format!("list the guard pages of pid {pid} at {start:#x}"))?;
        let prot = record.prot;
        // Private memory only: shared memory is written by others than the process tracked.
        let delta = delta.filter(|_| !shared && !record.is_kernel_special() && !matches!(record.backing, Backing::Droppable)).map(|d| d.of_mapping(start, end));
        if matches!(record.backing, Backing::GpuInherited { .. }) {
            // Nothing of it is stored.
        } else if later && can_copy_later(&record) {
            deferred.push(DeferredVma { index: records.len(), start, end, backing: record.backing.clone(), delta, guards: record.guards.clone() });
        } else if !record.is_kernel_special() && (!shared || !matches!(record.backing, Backing::File { .. })) {
            if matches!(record.backing, Backing::Shmem { .. }) {
                // Shared memory: the pages the object holds (see [`probe`]), read through this
                // mapping (which maps any of them on the way).
                let addr_of = |offset: u64| start + (offset - map.offset);
                // Copied before the freeze by this process: only what changed since is copied.
                let window = (map.offset, map.offset + (end - start));
                let plan = ctx
                    .shared_plans
                    .remove(&(procfs::map_dev(map), map.inode))
                    .filter(|p| p.keeper == pid && p.keeper_mapping == (start, end) && object_parts == [window]);
                match probe.resident.get(&start) {
                    Some(resident) if let Some(plan) = plan => {
                        let (refer, now) = plan.split(&super::shared_memory::resident_offsets(resident, map.offset));
                        record.runs.extend(refer.iter().map(|e| PageRun {
                            addr: addr_of(e.file_offset),
                            pages: e.len / PAGE_SIZE,
                            stream_offset: e.stream_offset,
                        }));
                        let mut through_mapping = |at: u64, buf: &mut [u8]| read_mapped(pid, mem, prot, at, buf);
                        for (from, to) in now {
                            copy_run(addr_of(from), (to - from) / PAGE_SIZE, stream, &mut record.runs, &mut through_mapping)?;
                        }
                        record.runs.sort_unstable_by_key(|r| r.addr);
                    }
                    Some(resident) => {
                        let mut through_mapping = |at: u64, buf: &mut [u8]| read_mapped(pid, mem, prot, at, buf);
                        for (from, to) in object_parts {
                            let (first, last) = (((addr_of(from) - start) / PAGE_SIZE) as usize, ((addr_of(to) - start) / PAGE_SIZE) as usize);
                            for (run_start, run_pages) in page_runs(addr_of(from), resident[first..last].iter().map(|b| b & 1 != 0)) {
                                copy_run(run_start, run_pages, stream, &mut record.runs, &mut through_mapping)?;
                            }
                        }
                    }
                    None => {
                        for (from, to) in object_parts {
                            let mut reader = ObjectReader { pid, mem, prot, end: None };
                            let mut to_end = |at: u64, buf: &mut [u8]| reader.read(at, buf);
                            copy_run(addr_of(from), (to - from) / PAGE_SIZE, stream, &mut record.runs, &mut to_end)?;
                        }
                    }
                }
            } else if matches!(record.backing, Backing::PrivateShmem { .. }) {
                // The process's own copies, which only its writes change (so that an incremental
                // generation's tracking tells which to copy again), then the rest as the object
                // shows through the mapping, stored whole each time: others change it.
                let copies = OwnCopies::of(&pagemap, there.as_ref(), start, end).context(|| format!("read pagemap of pid {pid} at {start:#x}"))?;
                let copied: Vec<(u64, u64)> = copies.all().iter().map(|&(s, n)| (s, s + n * PAGE_SIZE)).collect();
                let runs;
                (runs, record.earlier) = copies.split(delta.as_ref());
                let mut from_tables = |at: u64, buf: &mut [u8]| read_mapped(pid, mem, prot, at, buf);
                for (run_start, run_pages) in without_guards(runs, &record.guards) {
                    copy_run_as(run_start, run_pages, stream, &mut record.runs, &mut from_tables, true)?;
                }
                let readable: Vec<(u64, u64)> = readable_run(mem, start, end).map(|(s, n)| (s, s + n * PAGE_SIZE)).into_iter().collect();
                let mut object = Vec::new();
                for (from, to) in super::dirty::subtract(&readable, &copied) {
                    copy_run(from, (to - from) / PAGE_SIZE, stream, &mut object, &mut from_tables)?;
                }
                if let Backing::PrivateShmem { object: o, .. } = &mut record.backing {
                    *o = object;
                }
            } else {
                // What the scan knows is there is every page there: the process's own pages
                // only in anonymous memory.
                let known = delta.as_ref().and_then(|d| d.present.as_ref()).filter(|_| only_presence_counts(&record.backing));
                let private_file = !shared && matches!(record.backing, Backing::File { .. });
                let runs;
                (runs, record.earlier) = match (known, &there) {
                    _ if private_file => OwnCopies::of(&pagemap, there.as_ref(), start, end)
                        .context(|| format!("read pagemap of pid {pid} at {start:#x}"))?
                        .split(delta.as_ref()),
                    (Some(present), _) => split(present.iter().map(|&(s, e)| (s, (e - s) / PAGE_SIZE)).collect(), delta.as_ref()),
                    (None, _) if matches!(record.backing, Backing::Unlinked { .. }) => (readable_run(mem, start, end).into_iter().collect(), Vec::new()),
                    (None, Some(there)) if only_presence_counts(&record.backing) => split(there.runs(start, end, Which::Every), delta.as_ref()),
                    (None, _) => split(
                        wanted_runs_in(&pagemap, start, end, only_presence_counts(&record.backing), |f| page_needs_storing(&record.backing, shared, f))
                            .context(|| format!("read pagemap of pid {pid} at {start:#x}"))?,
                        delta.as_ref(),
                    ),
                };
                let mut from_tables = |at: u64, buf: &mut [u8]| read_mapped(pid, mem, prot, at, buf);
                for (run_start, run_pages) in without_guards(runs, &record.guards) {
                    copy_run_as(run_start, run_pages, stream, &mut record.runs, &mut from_tables, private_file)?;
                }
            }
        }
        record.earlier = earlier_without_guards(std::mem::take(&mut record.earlier), &record.guards);
        records.push(record);
    }
    Ok((records, deferred))
}

/// The pages of one deferred mapping, once copied: its runs, and in an incremental generation
/// its pages referred to earlier generations.
#[derive(Debug)]
pub struct CopiedVma {
    pub index: usize,
    pub runs: Vec<PageRun>,
    pub earlier: Vec<EarlierRun>,
}

/// Copies the pages worth storing of the `deferred` mappings into `stream`, reading them from
/// process `source` (the child forked at the freeze, whose private memory is the frozen
/// process's). Returns each mapping's runs, by record index. `cancelled` is looked at between
/// runs: a checkpoint given up on stops copying.
pub fn copy_deferred(source: Tid, deferred: &[DeferredVma], stream: &mut StreamWriter, cancelled: &dyn Fn() -> bool) -> Result<Vec<CopiedVma>> {
    let pagemap = Pagemap::open(source)?;
    let mem = ProcMem::open(source)?;
    let mut out = Vec::with_capacity(deferred.len());
    for d in deferred {
        let listed = match &d.backing {
            // (The fork keeps the write tracking's markers: see `split_copies_by_delta`.)
            Backing::File { .. } => OwnCopies::of(&pagemap, None, d.start, d.end).map(|copies| copies.split(d.delta.as_ref())),
            _ => wanted_runs_in(&pagemap, d.start, d.end, only_presence_counts(&d.backing), |f| page_needs_storing(&d.backing, false, f))
                .map(|wanted| split(wanted, d.delta.as_ref())),
        };
        let (wanted, earlier) = listed.context(|| format!("read pagemap of pid {source} at {:#x}", d.start))?;
        let mut runs = Vec::new();
        let mut from_copy = |at: u64, buf: &mut [u8]| read_snapshot(&mem, at, buf);
        for (run_start, run_pages) in without_guards(wanted, &d.guards) {
            if cancelled() {
                return Err(Error::Other("the copy of memory after the release was cancelled".into()));
            }
            copy_run_as(run_start, run_pages, stream, &mut runs, &mut from_copy, matches!(d.backing, Backing::File { .. }))?;
        }
        out.push(CopiedVma { index: d.index, runs, earlier: earlier_without_guards(earlier, &d.guards) });
    }
    Ok(out)
}

/// What [`copy_while_running`] copied of a process: where its pages are, and what it could not
/// copy.
#[derive(Debug, Default)]
pub struct CopiedAhead {
    /// The pages there when they were copied: runs stored by this generation's stream (as
    /// `generation`'s) and references to earlier generations, sorted by address. A page of the
    /// ranges copied that is in neither was zero, or not there.
    pub content: Vec<EarlierRun>,
    /// Ranges whose pages could not all be read (unmapped as they were copied): what `content`
    /// says of them is not to be trusted, and they are copied again, frozen.
    pub not_copied: Vec<(u64, u64)>,
}

/// Which pages of a private mapping are the process's own, to be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnPages {
    /// Every page there, in memory or in swap: anonymous memory.
    Every,
    /// The copies the process made of a file's pages by writing them (a private file mapping):
    /// the other pages are the file's, mapped from it again at restart.
    Copies,
}

/// A private mapping's addresses, and which of its pages are the process's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateRange {
    pub start: u64,
    pub end: u64,
    pub own: OwnPages,
}

/// Copies the process's own pages (see [`OwnPages`]) in `ranges` of process `pid`, which runs,
/// into `stream` (`generation`'s stream of the process). With `delta`, only the pages it says
/// must be stored; the others are referred to where its base has them. The caller tracks the
/// writes to `ranges` from before the copy on: a page the process writes meanwhile, and so may
/// be read half-written here (or made a copy of the file's page here), is copied again while
/// the job is frozen.
///
/// The process may exec, unmap, or end meanwhile: what could not be read is reported in
/// `not_copied`, never as an error. Errors are the stream's.
pub fn copy_while_running(pid: Tid, ranges: &[PrivateRange], delta: Option<&Delta>, stream: &mut StreamWriter, generation: u64) -> Result<CopiedAhead> {
    let mut out = CopiedAhead::default();
    let (pagemap, mem) = match (Pagemap::open(pid), ProcMem::open(pid)) {
        (Ok(pagemap), Ok(mem)) => (pagemap, mem),
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!(pid, "copied while frozen: {e}");
            out.not_copied = ranges.iter().map(|r| (r.start, r.end)).collect();
            return Ok(out);
        }
    };
    for &PrivateRange { start, end, own } in ranges {
        let mapping_delta = delta.map(|d| d.of_mapping(start, end));
        let listed = match own {
            OwnPages::Every => wanted_runs_in(&pagemap, start, end, true, |f| f.present() || f.swapped()).map(|present| split(present, mapping_delta.as_ref())),
            OwnPages::Copies => OwnCopies::of(&pagemap, None, start, end).map(|copies| copies.split(mapping_delta.as_ref())),
        };
        let guards = match guard_runs(&pagemap, start, end) {
            Ok(guards) => guards,
            Err(e) => {
                tracing::debug!(pid, start, end, "copied again while frozen: {e}");
                out.not_copied.push((start, end));
                continue;
            }
        };
        let (present, refer) = match listed {
            Ok((present, refer)) => (without_guards(present, &guards), earlier_without_guards(refer, &guards)),
            Err(e) => {
                tracing::debug!(pid, start, end, "copied again while frozen: {e}");
                out.not_copied.push((start, end));
                continue;
            }
        };
        let mut stored = Vec::new();
        let mut unreadable = false;
        // PROT_READ: a range the program made PROT_NONE since is read as a debugger would.
        let mut live = |at: u64, buf: &mut [u8]| {
            let read = read_mapped(pid, &mem, libc::PROT_READ as u32, at, buf);
            unreadable |= read.is_err();
            read
        };
        // A copy of zeros is kept: left out, it would read as the file's bytes.
        let keep_zeros = own == OwnPages::Copies;
        match present.iter().try_for_each(|&(run_start, run_pages)| copy_run_as(run_start, run_pages, stream, &mut stored, &mut live, keep_zeros)) {
            Ok(()) => {
                out.content.extend(stored.into_iter().map(|run| EarlierRun { generation, run }));
                out.content.extend(refer);
            }
            // The bytes already in the stream stay there, unused.
            Err(e) if unreadable => {
                tracing::debug!(pid, start, end, "copied again while frozen: {e}");
                out.not_copied.push((start, end));
            }
            Err(e) => return Err(e),
        }
    }
    out.content.sort_unstable_by_key(|e| e.run.addr);
    Ok(out)
}

/// An incremental generation's references to its own stream (pages copied before the freeze
/// and not written since, see [`copy_while_running`]) made runs of that stream: they are its
/// own pages, and a reader must not look for a generation that needs itself.
pub fn own_references_to_runs(vmas: &mut [VmaRecord], generation: u64) {
    for v in vmas {
        if !v.earlier.iter().any(|e| e.generation == generation) {
            continue;
        }
        let (own, earlier): (Vec<EarlierRun>, Vec<EarlierRun>) = v.earlier.drain(..).partition(|e| e.generation == generation);
        v.earlier = earlier;
        v.runs.extend(own.into_iter().map(|e| e.run));
        v.runs.sort_unstable_by_key(|r| r.addr);
    }
}

/// What an incremental generation knows of a process, to store only what changed since its
/// base (an earlier committed generation of the same process): the ranges whose writes were
/// tracked since the base's freeze, the pages written there since, and where the base's pages
/// are (its own runs, as runs of the base's generation, and those it referred to in turn).
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub tracked: Vec<(u64, u64)>,
    pub written: Vec<(u64, u64)>,
    /// Sorted by address, disjoint.
    pub base: Vec<EarlierRun>,
    /// Where the scan that listed `written` also told which pages are not there (`absent`):
    /// there, the pages there are known without another walk (see [`MappingDelta::present`]).
    /// Both sorted and disjoint; empty when not known.
    pub known: Vec<(u64, u64)>,
    pub absent: Vec<(u64, u64)>,
}

impl Delta {
    /// At most how many bytes of the mappings `ranges` (page-aligned `(start, end)`) this delta
    /// has stored: the pages written since the base and every untracked range whole.
    pub fn bytes_to_store(&self, ranges: &[(u64, u64)]) -> u64 {
        ranges
            .iter()
            .flat_map(|&(start, end)| super::dirty::must_store(&within(&self.tracked, start, end), &within(&self.written, start, end), (start, end)))
            .map(|(s, e)| e - s)
            .fold(0, u64::saturating_add)
    }

    /// The part of the delta that concerns mapping `[start, end)`, each list cut to the mapping
    /// ([`within`]).
    fn of_mapping(&self, start: u64, end: u64) -> MappingDelta {
        let within = |list: &[(u64, u64)]| within(list, start, end);
        let must = super::dirty::must_store(&within(&self.tracked), &within(&self.written), (start, end));
        let first = self.base.partition_point(|e| e.run.addr.saturating_add(e.run.pages * PAGE_SIZE) <= start);
        let base = self.base[first..].iter().take_while(|e| e.run.addr < end).copied().collect();
        let vma = [(start, end)];
        let present = super::dirty::subtract(&vma, &within(&self.known)).is_empty().then(|| super::dirty::subtract(&vma, &within(&self.absent)));
        MappingDelta { must, base, present }
    }
}

/// The ranges of `list` (sorted and disjoint) that overlap `[start, end)`, found by a binary
/// search: a process of some 400 mappings asks this of each, while it is frozen.
fn within(list: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    debug_assert!(list.windows(2).all(|w| w[0].1 <= w[1].0), "a delta's ranges are sorted and disjoint");
    let first = list.partition_point(|&(_, e)| e <= start);
    list[first..].iter().take_while(|&&(s, _)| s < end).copied().collect()
}

/// One mapping's part of a [`Delta`]: the ranges whose present pages must be stored, and the
/// base's pages that overlap the mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingDelta {
    pub must: Vec<(u64, u64)>,
    pub base: Vec<EarlierRun>,
    /// The mapping's pages there (in memory or swap, or a tracking marker of a page not there,
    /// which reads as zero), as `(start, end)` ranges, if the scan told: then the pagemap need
    /// not be walked for them.
    pub present: Option<Vec<(u64, u64)>>,
}

/// The base's content of a process, as an incremental generation refers to it: each mapping's
/// own runs (stored by `generation`) and its runs from earlier generations, sorted by address.
pub fn content_of(vmas: &[VmaRecord], generation: u64) -> Vec<EarlierRun> {
    let mut out: Vec<EarlierRun> =
        vmas.iter().flat_map(|v| v.runs.iter().map(move |&run| EarlierRun { generation, run }).chain(v.earlier.iter().copied())).collect();
    out.sort_unstable_by_key(|e| e.run.addr);
    out
}

/// Splits the present pages of a mapping (`present`, runs of (address, pages)) by what an
/// incremental generation does with them: the pages in `d.must` are copied (the first list);
/// the others were not written since the base, and are referred to where the base has them
/// (the second list); where it has not, they were zero then and still are: stored nowhere.
/// Pure.
pub fn split_by_delta(present: &[(u64, u64)], d: &MappingDelta) -> (Vec<(u64, u64)>, Vec<EarlierRun>) {
    let mut copy = Vec::new();
    let mut unchanged = Vec::new();
    for &(addr, pages) in present {
        let end = addr + pages * PAGE_SIZE;
        let mut at = addr;
        for &(s, e) in &d.must {
            let (s, e) = (s.max(addr), e.min(end));
            if s >= e {
                continue;
            }
            if s > at {
                unchanged.push((at, s));
            }
            copy.push((s, (e - s) / PAGE_SIZE));
            at = e;
        }
        if at < end {
            unchanged.push((at, end));
        }
    }
    let mut refer = Vec::new();
    for (s, e) in unchanged {
        let first = d.base.partition_point(|b| b.run.addr.saturating_add(b.run.pages * PAGE_SIZE) <= s);
        for b in d.base[first..].iter().take_while(|b| b.run.addr < e) {
            let (bs, be) = (b.run.addr, b.run.addr + b.run.pages * PAGE_SIZE);
            let (from, to) = (s.max(bs), e.min(be));
            if from < to {
                let run = PageRun { addr: from, pages: (to - from) / PAGE_SIZE, stream_offset: b.run.stream_offset + (from - bs) };
                refer.push(EarlierRun { generation: b.generation, run });
            }
        }
    }
    (copy, refer)
}

/// [`split_by_delta`] where there is a delta; else every page is copied.
fn split(present: Vec<(u64, u64)>, delta: Option<&MappingDelta>) -> (Vec<(u64, u64)>, Vec<EarlierRun>) {
    match delta {
        Some(d) => split_by_delta(&present, d),
        None => (present, Vec::new()),
    }
}

/// Splits the copies a process made of the pages of its private mapping of a file or an object
/// by what an incremental generation does with them, as [`split_by_delta`] does, but for the
/// copies that are swap entries (`in_swap`) not written since the base: where the base has
/// them they are copied again rather than referred to, and where it has not they are left out.
///
/// Why: the write tracking leaves a marker where it drops a page it had protected, and the
/// pagemap shows that marker as a swap entry, as it shows a copy in swap. A copy in swap not
/// written since the base is in the base; so is a copy the program dropped since
/// (MADV_DONTNEED), whose page now reads as the file's: the page is read again, which tells
/// (reading a marker gives the file's bytes). A marker where the base has no copy is a page of
/// the file dropped (the program's, or reclaimed): not the program's. (Only protected pages
/// leave markers: the tracking protects only a file mapping's pages there, see
/// `dirty::DirtyTracker`.) Runs `(address, pages)`, sorted and disjoint. Pure.
pub fn split_copies_by_delta(in_memory: &[(u64, u64)], in_swap: &[(u64, u64)], d: &MappingDelta) -> (Vec<(u64, u64)>, Vec<EarlierRun>) {
    let (mut copy, refer) = split_by_delta(in_memory, d);
    let (swapped, in_base) = split_by_delta(in_swap, d);
    copy.extend(swapped);
    copy.extend(in_base.iter().map(|e| (e.run.addr, e.run.pages)));
    (merge_runs(copy), refer)
}

/// Runs `(address, pages)` sorted, adjacent ones merged. Pure.
fn merge_runs(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    runs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
    for (s, n) in runs {
        match out.last_mut() {
            Some((ls, ln)) if *ls + *ln * PAGE_SIZE == s => *ln += n,
            _ => out.push((s, n)),
        }
    }
    out
}

/// The copies a process made of the pages of its private mapping of a file or an object, as
/// runs `(address, pages)`: those in memory, and those that are swap entries (see
/// [`split_copies_by_delta`]).
struct OwnCopies {
    in_memory: Vec<(u64, u64)>,
    in_swap: Vec<(u64, u64)>,
}

impl OwnCopies {
    /// The copies of `[start, end)`, from `there` where the kernel could scan, else from the
    /// pagemap.
    fn of(pagemap: &Pagemap, there: Option<&PagesThere>, start: u64, end: u64) -> std::io::Result<OwnCopies> {
        Ok(match there {
            Some(there) => OwnCopies { in_memory: there.runs(start, end, Which::CopiesInMemory), in_swap: there.runs(start, end, Which::CopiesInSwap) },
            None => OwnCopies {
                in_memory: wanted_runs_in(pagemap, start, end, false, |f| f.present() && !f.file_or_shared())?,
                in_swap: wanted_runs_in(pagemap, start, end, false, |f| f.swapped())?,
            },
        })
    }

    fn all(&self) -> Vec<(u64, u64)> {
        merge_runs([self.in_memory.as_slice(), self.in_swap.as_slice()].concat())
    }

    /// The copies to copy, and those referred to the base (see [`split_copies_by_delta`]).
    fn split(&self, delta: Option<&MappingDelta>) -> (Vec<(u64, u64)>, Vec<EarlierRun>) {
        match delta {
            Some(d) => split_copies_by_delta(&self.in_memory, &self.in_swap, d),
            None => (self.all(), Vec::new()),
        }
    }
}

/// Adds `[from, to)` to the sorted, disjoint `ranges` (merging), and returns the parts of it
/// that were not in them yet, in order. Pure.
pub fn add_range(ranges: &mut Vec<(u64, u64)>, (from, to): (u64, u64)) -> Vec<(u64, u64)> {
    let mut new = Vec::new();
    let mut at = from;
    for &(s, e) in ranges.iter() {
        if e <= at {
            continue;
        }
        if s >= to {
            break;
        }
        if s > at {
            new.push((at, s));
        }
        at = at.max(e);
    }
    if at < to {
        new.push((at, to));
    }
    ranges.push((from, to));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(s, e) in ranges.iter() {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *ranges = merged;
    new
}

/// Appends an in-memory file's data to the stream, its holes left out: the file at `path` as
/// process `pid` sees it, which must still be the file mapped at `addr` (`id`: device and
/// inode).
/// Saves the contents of the in-memory file `path` (device and inode `id`, `size` bytes), mapped
/// at `addr` by process `pid`, into `stream`. With `plan` (the file was copied into this stream
/// before the freeze), only what changed since is read; the rest refers to that copy, so the
/// extents lie in the stream in another order than in the file.
#[allow(clippy::too_many_arguments)]
fn save_file(
    (pid, root): (Tid, &procfs::NamespaceRoot),
    addr: u64,
    path: &str,
    id: (u64, u64),
    size: u64,
    plan: Option<&super::shared_memory::SharedPlan>,
    stream: &mut StreamWriter,
) -> Result<SavedFile> {
    if size > MAX_SAVED_FILE {
        return Err(Error::Other(format!("{path}: an in-memory file of {size} bytes is too large to save")));
    }
    let at = root.path(path);
    let f = super::file::open_quietly(&at, 0).context(|| format!("open {path} (pid {pid}) to save it"))?;
    let meta = f.metadata().context(|| format!("stat {path}"))?;
    if (meta.dev(), meta.ino()) != id {
        let problem = "its path names another file now than a moment ago".to_string();
        return Err(Error::MappedFileMoved { pid, addr, path: path.to_string(), problem });
    }
    let stream_offset = stream.offset();
    let Some(plan) = plan else {
        let (extents, allocated) = super::deleted::save_extents(&f, size, path, stream)?;
        return Ok(SavedFile { stream_offset, len: size, extents: Some(extents), allocated });
    };
    let data = super::deleted::data_extents(&f, size).context(|| format!("find the data of {path}"))?;
    let present: Vec<(u64, u64)> = data.iter().map(|&(from, to)| (from / PAGE_SIZE * PAGE_SIZE, to.next_multiple_of(PAGE_SIZE))).collect();
    let (refer, now) = plan.split(&present);
    // (The last page of the file is whole in the copy: its extent ends with the file.)
    let mut extents: Vec<super::deleted::Extent> =
        refer.into_iter().filter(|e| e.file_offset < size).map(|e| super::deleted::Extent { len: e.len.min(size - e.file_offset), ..e }).collect();
    for (from, to) in now.into_iter().filter(|&(from, _)| from < size) {
        extents.push(super::deleted::save_range(&f, (from, to.min(size)), path, stream)?);
    }
    extents.sort_unstable_by_key(|e| e.file_offset);
    let allocated = super::deleted::allocated_beyond(&f, &extents, path)?;
    Ok(SavedFile { stream_offset, len: size, extents: Some(extents), allocated })
}

/// What [`capture`] needs of a stopped process's page tables before it decides anything about
/// its mappings: its pagemap open, and where its pages are ([`PagesThere`]). The walk is the
/// costly part of a process with many mappings (an Open MPI rank's 400 mappings of libraries
/// and its peers' segments: some 0.4 ms), and needs neither a tracer nor what other processes
/// hold, so it is read on the tracer's thread once the process's questions are answered,
/// while the capture's reading thread, which takes the processes in order, is busy with the
/// one before.
pub struct PageTables {
    pagemap: Pagemap,
    there: Option<PagesThere>,
}

impl PageTables {
    /// Of stopped process `pid`, whose mappings are `maps`; `delta`: its pages written since the
    /// last generation, where it is incremental.
    pub fn read(pid: Tid, maps: &[MemoryMap], delta: Option<&Delta>) -> Result<PageTables> {
        let pagemap = Pagemap::open(pid)?;
        // Not where the write tracking's scan told already which pages are there: the private
        // anonymous mappings it knows whole, whose pages [`capture`] takes from the delta
        // (`MappingDelta::present`), usually most of a process's memory. Nor shared mappings,
        // whose pages the object holds, not these tables (see [`probe`]): walking a 4 GiB one of
        // 4 KiB pages took some 70 ms.
        let known_already = |m: &MemoryMap| {
            let anonymous = matches!(m.pathname, MMapPath::Stack | MMapPath::Heap | MMapPath::Anonymous | MMapPath::TStack(_));
            let (start, end) = m.address;
            m.perms.contains(MMPermissions::SHARED)
                || anonymous && delta.is_some_and(|d| super::dirty::subtract(&[(start, end)], &within(&d.known, start, end)).is_empty())
        };
        let there = PagesThere::scan(&pagemap, maps, known_already);
        Ok(PageTables { pagemap, there })
    }
}

/// Which of the pages there [`PagesThere::runs`] gives.
#[derive(Clone, Copy)]
enum Which {
    Every,
    /// The anonymous pages in memory: in a private mapping of a file or an object, the
    /// process's own copies there.
    CopiesInMemory,
    /// The swap entries that are not a file's page being moved: in such a mapping, the
    /// process's copies in swap, or markers the write tracking left where it dropped a page
    /// (see [`split_copies_by_delta`]). With [`Which::CopiesInMemory`], what
    /// [`page_needs_storing`] selects.
    CopiesInSwap,
}

/// Address space whose pagemap is read at once: 2 MiB of flags.
const PAGEMAP_WINDOW: u64 = 1 << 30;

/// The pages of a process that are there (in memory or in swap), from one PAGEMAP_SCAN over its
/// whole address space, each region marked by whether its pages are a file's or an object's
/// (PAGE_IS_FILE) rather than anonymous (the process's own pages, among them its private copies
/// of a file's pages). A process of some 400 mappings (an MPI rank: libraries' text, data and
/// read-only data) would otherwise be walked mapping by mapping, and the pagemap of each
/// private file mapping read page by page to find its copies, while it is frozen. `None` where
/// the kernel cannot scan (before 6.7): each mapping's pagemap is read then.
struct PagesThere(Vec<crate::procfs::pagemap_scan::PageRegion>);

impl PagesThere {
    /// Of `maps`, except those `left_out` names (whose runs must not be asked): the mappings
    /// between two left out are walked in one scan (gaps cost a walk little, a mapping walked
    /// for nothing as much as any).
    fn scan(pagemap: &Pagemap, maps: &[MemoryMap], left_out: impl Fn(&MemoryMap) -> bool) -> Option<PagesThere> {
        use crate::procfs::pagemap_scan::{Query, PAGE_IS_FILE, PAGE_IS_PRESENT, PAGE_IS_SWAPPED};
        // (The vsyscall page lies outside the user address space the scan may be asked of.)
        let mut user: Vec<&MemoryMap> = maps.iter().filter(|m| !matches!(m.pathname, MMapPath::Vsyscall)).collect();
        user.sort_unstable_by_key(|m| m.address);
        let there = Query { inverted: 0, all: 0, any: PAGE_IS_PRESENT | PAGE_IS_SWAPPED, report: PAGE_IS_FILE | PAGE_IS_SWAPPED, reprotect: false };
        let mut regions = Vec::new();
        let mut walked = false;
        for block in user.split(|m| left_out(m)).filter(|b| !b.is_empty()) {
            let ranges: Vec<(u64, u64)> = block.iter().map(|m| m.address).collect();
            regions.extend(pagemap.scan_mapped(&ranges, there).ok()?);
            walked = true;
        }
        walked.then_some(PagesThere(regions))
    }

    /// The runs (start, pages) in `[start, end)` of the pages there of kind `which`.
    fn runs(&self, start: u64, end: u64, which: Which) -> Vec<(u64, u64)> {
        use crate::procfs::pagemap_scan::{PAGE_IS_FILE, PAGE_IS_SWAPPED};
        let wanted = |categories: u64| match which {
            Which::Every => true,
            Which::CopiesInMemory => categories & (PAGE_IS_FILE | PAGE_IS_SWAPPED) == 0,
            Which::CopiesInSwap => categories & PAGE_IS_FILE == 0 && categories & PAGE_IS_SWAPPED != 0,
        };
        let first = self.0.partition_point(|r| r.end <= start);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for r in self.0[first..].iter().take_while(|r| r.start < end).filter(|r| wanted(r.categories)) {
            let (s, e) = (r.start.max(start), r.end.min(end));
            match runs.last_mut() {
                Some((rs, rn)) if *rs + *rn * PAGE_SIZE == s => *rn += (e - s) / PAGE_SIZE,
                _ => runs.push((s, (e - s) / PAGE_SIZE)),
            }
        }
        runs
    }
}

/// The runs of pages in `[start, end)` whose pagemap flags pass `wanted`, reading the flags a
/// window at a time: a sparse mapping of terabytes (a MAP_NORESERVE reservation, a sanitizer's
/// shadow) would otherwise need gigabytes of flags at once.
///
/// `populated_suffices`: `wanted` asks no more than whether a page is there (in memory or in
/// swap), which the scan that finds where pages are answers by itself; the pagemap is then not
/// read at all. It costs 8 bytes and some 10 ns per page, 40 ms for a 4 GiB heap, while the
/// job is frozen; the scan, a quarter of that.
fn wanted_runs_in(pagemap: &Pagemap, start: u64, end: u64, populated_suffices: bool, wanted: impl Fn(PageFlags) -> bool) -> std::io::Result<Vec<(u64, u64)>> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    // Only where pages are, when the kernel can say (PAGEMAP_SCAN, Linux 6.7): the pagemap
    // costs 8 bytes per page of address space, 128 MiB read for a 64 GiB reservation with a
    // few pages written.
    let populated = match pagemap.scan(start, end, crate::procfs::pagemap_scan::Query::POPULATED) {
        Ok(regions) if populated_suffices => return Ok(regions.iter().map(|r| (r.start, r.pages())).collect()),
        Ok(regions) => regions.into_iter().map(|r| (r.start, r.end)).collect(),
        Err(_) => vec![(start, end)],
    };
    for (from, until) in populated {
        let mut at = from;
        while at < until {
            let to = until.min(at.saturating_add(PAGEMAP_WINDOW));
            for (s, n) in wanted_runs(at, &pagemap.range(at, to)?, &wanted) {
                match runs.last_mut() {
                    Some((rs, rn)) if *rs + *rn * PAGE_SIZE == s => *rn += n,
                    _ => runs.push((s, n)),
                }
            }
            at = to;
        }
    }
    Ok(runs)
}

/// The pages of a mapping of a deleted file that can be read, as one run from `start`: all of
/// them, but for pages past the end of the file (a program touching them gets SIGBUS; they come
/// back as zeros), which can only be at the mapping's end. Found by reading one byte of the
/// last page, then by bisection.
fn readable_run(mem: &ProcMem, start: u64, end: u64) -> Option<(u64, u64)> {
    let readable = |page: u64| mem.read_exact(start + page * PAGE_SIZE, &mut [0u8; 1]).is_ok();
    let pages = (end - start) / PAGE_SIZE;
    if pages == 0 || !readable(0) {
        return None;
    }
    let (mut good, mut bad) = (0, pages);
    if readable(pages - 1) {
        return Some((start, pages));
    }
    bad -= 1;
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if readable(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some((start, good + 1))
}

/// Groups consecutive pages that pass `wanted` into (address, page count) runs.
pub fn wanted_runs(start: u64, flags: &[PageFlags], wanted: impl Fn(PageFlags) -> bool) -> Vec<(u64, u64)> {
    page_runs(start, flags.iter().map(|f| wanted(*f)))
}

/// Groups consecutive pages marked true (the first at `start`) into (address, page count) runs.
/// Pure.
pub fn page_runs(start: u64, wanted: impl Iterator<Item = bool>) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, w) in wanted.enumerate() {
        if !w {
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
/// `ckpt-bench`). Returns how many bytes from the start were read (short at an unreadable page).
fn read_in_parallel(pid: Tid, at: u64, buf: &mut [u8]) -> Result<usize> {
    in_two_halves(at, buf, &|at, buf| Ok(remote_mem::read(pid, at, buf)?))
}

/// Runs `read` (which returns how many bytes from the start it read) on the two halves of `buf`
/// on two threads, for buffers large enough to be worth it; returns how many bytes from the
/// start were read.
fn in_two_halves(at: u64, buf: &mut [u8], read: &(dyn Fn(u64, &mut [u8]) -> Result<usize> + Sync)) -> Result<usize> {
    if buf.len() < PARALLEL_COPY_MIN {
        return read(at, buf);
    }
    let mid = buf.len() / 2 / PAGE_SIZE as usize * PAGE_SIZE as usize;
    let (head, tail) = buf.split_at_mut(mid);
    let (head_got, tail_got) = std::thread::scope(|s| {
        let tail_reader = s.spawn(|| read(at + mid as u64, tail));
        let head_got = read(at, head);
        (head_got, tail_reader.join())
    });
    let head_got = head_got?;
    if head_got < mid {
        return Ok(head_got);
    }
    let tail_got = tail_got.map_err(|_| Error::Other("a memory copy thread panicked".into()))??;
    Ok(mid + tail_got)
}

/// Fills `buf` with the memory at `at` of a copy of a process forked at the freeze, through
/// /proc/PID/mem on two threads. Not process_vm_readv: it pins each page, and the kernel must
/// then give the copy a page of its own for every page it still shares copy-on-write with the
/// running process — all of its memory copied once more, and allocated (measured, 1 GiB on two
/// threads: 275 ms against 178 ms through /proc/PID/mem, which reads without pinning).
fn read_snapshot(mem: &ProcMem, at: u64, buf: &mut [u8]) -> Result<()> {
    in_two_halves(at, buf, &|at, buf| match mem.read_exact_or_guard(at, buf)? {
        None => Ok(buf.len()),
        Some(guard) => Err(in_a_guard_region(mem.pid(), guard)),
    })
    .map(drop)
}

/// Whether this kernel names guard pages to a scan (PAGEMAP_SCAN's PAGE_IS_GUARD, Linux
/// 6.16), asked once: where it does not, a guard page shows only as a read that fails (and the
/// checkpoint is refused, [`in_a_guard_region`]), and no mapping is scanned for them.
fn guards_scannable(pagemap: &Pagemap) -> bool {
    static SCANNABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SCANNABLE.get_or_init(|| matches!(pagemap.guards(0, PAGE_SIZE), Ok(Some(_))))
}

/// The guard pages of the mapping of `record` (see `VmaRecord::guards`). Only in the
/// mappings a program puts them in (private anonymous memory: stacks, heaps; and writable
/// private file mappings): a scan of every library's text, at every freeze, would cost an
/// Open MPI rank some 400 calls for nothing. A guard elsewhere still fails the read that
/// meets it.
fn guards_in(pagemap: &Pagemap, record: &VmaRecord) -> std::io::Result<Vec<(u64, u64)>> {
    let anonymous = matches!(record.backing, Backing::Anon | Backing::Stack);
    let writable_file = matches!(record.backing, Backing::File { .. }) && record.prot & libc::PROT_WRITE as u32 != 0;
    if record.shared || !(anonymous || writable_file) {
        return Ok(Vec::new());
    }
    guard_runs(pagemap, record.start, record.end)
}

/// The guard pages of `[start, end)`, none asked of a kernel that cannot name them.
fn guard_runs(pagemap: &Pagemap, start: u64, end: u64) -> std::io::Result<Vec<(u64, u64)>> {
    if !guards_scannable(pagemap) {
        return Ok(Vec::new());
    }
    Ok(pagemap.guards(start, end)?.unwrap_or_default())
}

/// `runs` (`(address, pages)`) without the pages of `guards` (the same form). Pure.
fn without_guards(runs: Vec<(u64, u64)>, guards: &[(u64, u64)]) -> Vec<(u64, u64)> {
    if guards.is_empty() {
        return runs;
    }
    let as_ranges = |runs: &[(u64, u64)]| runs.iter().map(|&(s, n)| (s, s + n * PAGE_SIZE)).collect::<Vec<_>>();
    super::dirty::subtract(&as_ranges(&runs), &as_ranges(guards)).into_iter().map(|(s, e)| (s, (e - s) / PAGE_SIZE)).collect()
}

/// `earlier` without the pages of `guards` (`(address, pages)` runs): a page made a guard since
/// the base generation is not referred to there (the restart would fill it, then drop it). Pure.
fn earlier_without_guards(earlier: Vec<EarlierRun>, guards: &[(u64, u64)]) -> Vec<EarlierRun> {
    if guards.is_empty() {
        return earlier;
    }
    let guard_ranges: Vec<(u64, u64)> = guards.iter().map(|&(s, n)| (s, s + n * PAGE_SIZE)).collect();
    let mut out = Vec::with_capacity(earlier.len());
    for e in earlier {
        let start = e.run.addr;
        for (s, end) in super::dirty::subtract(&[(start, start + e.run.pages * PAGE_SIZE)], &guard_ranges) {
            let run = PageRun { addr: s, pages: (end - s) / PAGE_SIZE, stream_offset: e.run.stream_offset + (s - start) };
            out.push(EarlierRun { generation: e.generation, run });
        }
    }
    out
}

/// The refusal of memory in a guard region (madvise MADV_GUARD_INSTALL): a restart would give
/// ordinary pages there, which the program could then write (not kept yet:
/// docs/PLAN-BREADTH.md).
fn in_a_guard_region(pid: Tid, at: u64) -> Error {
    Error::Unsupported { pid, what: format!("memory at {at:#x} in a guard region (madvise MADV_GUARD_INSTALL), which a restart would not make a guard again") }
}

/// Fills `buf` with the memory at `at` of a process, through its page tables.
pub(crate) fn read_mapped(pid: Tid, mem: &ProcMem, prot: u32, at: u64, buf: &mut [u8]) -> Result<()> {
    let readable = prot & libc::PROT_READ as u32 != 0;
    let got = if readable { read_in_parallel(pid, at, buf)? } else { 0 };
    if got < buf.len() {
        // process_vm_readv stops at pages it may not read (PROT_NONE, guard regions);
        // /proc/<pid>/mem reads them as a debugger would, but for guards.
        if let Some(guard) = mem.read_exact_or_guard(at + got as u64, &mut buf[got..])? {
            return Err(in_a_guard_region(pid, guard));
        }
    }
    Ok(())
}

/// Reads a shared mapping whole, in order, through the process's page tables: the object
/// (a file) may end before the mapping does, and reading there faults. From the first page that
/// cannot be read on, it reads zeros (which are not stored).
struct ObjectReader<'a> {
    pid: Tid,
    mem: &'a ProcMem,
    prot: u32,
    /// The first address found unreadable.
    end: Option<u64>,
}

impl ObjectReader<'_> {
    fn read(&mut self, at: u64, buf: &mut [u8]) -> Result<()> {
        let mut got = 0;
        if self.end.is_none_or(|end| at < end) {
            if self.prot & libc::PROT_READ as u32 != 0 {
                got = read_in_parallel(self.pid, at, buf)?;
            }
            // PROT_NONE pages, or the end of the object: /proc/<pid>/mem says which.
            while got < buf.len() {
                match self.mem.read_some(at + got as u64, &mut buf[got..])? {
                    0 => break,
                    n => got += n,
                }
            }
            if got < buf.len() {
                self.end = Some(at + got as u64);
            }
        }
        buf[got..].fill(0);
        Ok(())
    }
}

/// Copies `pages` pages at `addr` into the stream, as `fill` reads them, dropping all-zero
/// pages, and records the runs stored.
fn copy_run(addr: u64, pages: u64, stream: &mut StreamWriter, runs: &mut Vec<PageRun>, fill: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>) -> Result<()> {
    copy_run_as(addr, pages, stream, runs, fill, false)
}

/// [`copy_run`], keeping all-zero pages with `keep_zeros`: the private copies of a file's or
/// an object's pages, which a page left out would not read as zeros at restart but as the
/// file's bytes.
pub(crate) fn copy_run_as(
    addr: u64,
    pages: u64,
    stream: &mut StreamWriter,
    runs: &mut Vec<PageRun>,
    fill: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    keep_zeros: bool,
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
            if !keep_zeros && is_zero_page(&buf[i * page..(i + 1) * page]) {
                continue;
            }
            if i != kept {
                buf.copy_within(i * page..(i + 1) * page, kept * page);
            }
            let page_addr = at + (i * page) as u64;
            let offset = base_offset + (kept * page) as u64;
            match runs.last_mut() {
                Some(r) if r.addr + r.pages * PAGE_SIZE == page_addr && r.stream_offset + r.pages * PAGE_SIZE == offset => r.pages += 1,
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
///
/// `place`: on another boot a mapping the job only reads (private, or read-only) is judged by
/// its file's contents, a shared writable one by its inode ([`super::identity::Place`]).
/// `keep` (`--keep-files`): a difference is logged, the file taken as it is.
pub fn check_files(vmas: &[VmaRecord], on_host: &dyn Fn(&str) -> Option<String>, place: &super::identity::Place, keep: bool) -> Result<()> {
    let mut judged = std::collections::HashSet::new();
    for vma in vmas {
        if let Backing::File { path, dev, ino, size, saved: None } = &vma.backing {
            // None: put back by the restart (see `objects::protect`, `objects::mounts`), perhaps
            // as a new inode.
            let Some(host) = on_host(path) else { continue };
            let meta =
                std::fs::metadata(&host).map_err(|e| Error::FileChanged { path: host.clone(), problem: format!("mapped file cannot be opened ({e})") })?;
            let written = vma.shared && vma.prot & libc::PROT_WRITE as u32 != 0;
            let problem = if written {
                (!place.same_file((*dev, *ino), (meta.dev(), meta.ino()))).then(|| "mapped file was replaced by another file (different inode)".to_string())
            } else if judged.insert((*dev, *ino)) {
                place.judge_path("mapped file", (*dev, *ino), &host).err()
            } else {
                None
            };
            let problem = problem.or_else(|| {
                (!vma.shared && meta.size() != *size).then(|| format!("mapped file changed size ({size} bytes at the checkpoint, {} now)", meta.size()))
            });
            match problem {
                Some(problem) if keep => tracing::warn!(path = host, "{problem}; taken as it is (--keep-files)"),
                Some(problem) => return Err(Error::FileChanged { path: host, problem }),
                None => {}
            }
        }
    }
    Ok(())
}

/// What memory restore knows of the shared memory objects of one node's image, from every
/// process's mappings at once: each object's mappings and the size that holds them all.
#[derive(Default)]
pub struct MemRestoreCtx {
    objects: HashMap<u64, ObjectUse>,
    /// Deleted files that a descriptor of the image holds and a mapping maps, by the inode the
    /// mappings name: their copy is made as the descriptor's would be ([`super::deleted`]), in
    /// the file's directory, so that the descriptor and the mappings are one file again.
    deleted_files: HashMap<u64, super::deleted::DeletedFileRecord>,
}

/// How the image uses one shared memory object (by its inode at the checkpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ObjectUse {
    mappings: usize,
    /// Its private mappings ([`Backing::PrivateShmem`]), which map it too where it comes back.
    private: usize,
    /// The end of the furthest shared mapping into the object: the least size it can have.
    size: u64,
    /// The end of the furthest private mapping into it.
    private_end: u64,
    /// A descriptor of the image holds it too and is opened on the object the memory restore
    /// makes (a memfd's `mapped`), which then gives it its contents and size.
    held_by_descriptor: bool,
    /// Its mappings name it a memfd.
    memfd: bool,
}

impl MemRestoreCtx {
    /// A context for restoring the given mappings (of every process of the node).
    pub fn new<'a>(vmas: impl Iterator<Item = &'a VmaRecord>) -> MemRestoreCtx {
        let mut objects: HashMap<u64, ObjectUse> = HashMap::new();
        for v in vmas {
            match v.backing {
                Backing::Shmem { ino, ref memfd_name } => {
                    let u = objects.entry(ino).or_default();
                    u.memfd |= memfd_name.is_some();
                    u.mappings += 1;
                    u.size = u.size.max(v.file_offset.saturating_add(v.len()));
                }
                // Not its size: a private mapping may reach past the object's end (those pages
                // fault), which a larger object would fill with zeros.
                Backing::PrivateShmem { ino, ref memfd_name, .. } => {
                    let u = objects.entry(ino).or_default();
                    u.memfd |= memfd_name.is_some();
                    u.private += 1;
                    u.private_end = u.private_end.max(v.file_offset.saturating_add(v.len()));
                }
                _ => {}
            }
        }
        MemRestoreCtx { objects, deleted_files: HashMap::new() }
    }

    /// The objects that descriptors among `fds` (of every process of the node) hold and open
    /// on what the memory restore makes: memfds mapped by their process (`MemfdRecord::mapped`),
    /// and deleted files that some process maps (shared or privately: zdtm's `unlink_mmap02`,
    /// a file written through its descriptor after the restart must show in the pages of a
    /// private mapping the process did not write).
    ///
    /// Objects are known here by inode alone, as the mappings record them: a deleted file is
    /// taken for a mapped object when the inode is the same and no mapping names it a memfd.
    ///
    /// A deleted executable of the job (`executables`: the processes' `ExeRecord::deleted`, a
    /// file or a memfd) is not tied, even when a descriptor holds it (a program reading
    /// /proc/self/exe): no one may write a running executable (ETXTBSY), so its mappings come
    /// back as their own memory, every page stored, and its descriptors on the copy the restart
    /// makes for /proc/PID/exe.
    pub fn with_descriptors<'a>(
        mut self,
        fds: impl Iterator<Item = &'a descriptor::FdRecord>,
        executables: impl Iterator<Item = &'a super::deleted::DeletedFileRecord>,
    ) -> MemRestoreCtx {
        let executables: std::collections::HashSet<(u64, u64)> = executables.map(|d| (d.dev, d.ino)).collect();
        for f in fds {
            match &f.kind {
                descriptor::FdKind::Memfd(m) if m.mapped.is_some() && !executables.contains(&(m.dev, m.ino)) => {
                    self.objects.entry(m.ino).or_default().held_by_descriptor = true;
                }
                // A deleted memfd's record (a program run from one) is not a file to tie.
                descriptor::FdKind::Deleted(d) if !d.path.starts_with(super::memfd::LINK_PREFIX) && !executables.contains(&(d.dev, d.ino)) => {
                    if let Some(used) = self.objects.get_mut(&d.ino).filter(|u| !u.memfd) {
                        used.held_by_descriptor = true;
                        self.deleted_files.entry(d.ino).or_insert_with(|| super::deleted::DeletedFileRecord { contents: None, ..d.clone() });
                    }
                }
                _ => {}
            }
        }
        self
    }

    /// The deleted files (device, inode) that the image both holds by a descriptor and maps,
    /// for the descriptors' restore ([`descriptor::RestoreCtx::mapped_files`]).
    pub fn mapped_files(&self) -> std::collections::HashSet<(u64, u64)> {
        self.deleted_files.values().map(|d| (d.dev, d.ino)).collect()
    }

    /// Whether the shared memory object `ino` comes back as an object: some mapping of it is
    /// shared, in any process, or a descriptor holds it. Otherwise its private mappings are all
    /// that held it, and no one could change it: they come back as anonymous memory.
    pub fn restores_object(&self, ino: u64) -> bool {
        self.objects.get(&ino).is_some_and(|u| u.mappings > 0 || u.held_by_descriptor)
    }

    /// The deleted file a descriptor holds that the mappings of object `ino` map.
    fn deleted_file(&self, ino: u64) -> Option<&super::deleted::DeletedFileRecord> {
        self.deleted_files.get(&ino)
    }

    /// Object `ino` (a memfd's `memfd_name`), as [`object_fd`] makes it.
    fn object_id<'a>(&'a self, ino: u64, memfd_name: Option<&'a str>) -> ObjectId<'a> {
        ObjectId { ino, memfd_name, deleted: self.deleted_file(ino) }
    }
}

/// The in-memory file `vma` maps whose contents its process's stream holds
/// ([`restore_saved_files`]): its path, device and inode.
pub fn saved_file(vma: &VmaRecord) -> Option<(&str, u64, u64)> {
    match &vma.backing {
        Backing::File { path, dev, ino, saved: Some(_), .. } => Some((path, *dev, *ino)),
        _ => None,
    }
}

/// Puts the contents of in-memory files the job mapped shared back, from the stream (before any
/// process of the job maps or opens them). Files that vanished (a reboot) are created again. The paths are those
/// process `host_pid` sees: they are resolved under its root directory, in its mount namespace
/// (a tmpfs the job mounted, see [`super::mounts`]). Each file is created or opened with
/// `owner`'s file rights (the process's, see [`crate::fsid`]); the image is read with the
/// restorer's own.
pub fn restore_saved_files(host_pid: Tid, vmas: &[VmaRecord], reader: &mut StreamReader, owner: Option<&crate::fsid::FsIdentity>) -> Result<()> {
    use std::io::Write;
    let mut root = None;
    for vma in vmas {
        let Backing::File { path, saved: Some(saved), .. } = &vma.backing else { continue };
        // Checked against the stream before anything is created or allocated (validation did
        // too: this is the second lock), and copied in bounded pieces.
        let in_stream = |offset: u64, len: u64| offset.checked_add(len).is_some_and(|e| e <= reader.len());
        let fits = match &saved.extents {
            Some(extents) => extents.iter().all(|e| in_stream(e.stream_offset, e.len) && e.file_offset.checked_add(e.len).is_some_and(|end| end <= saved.len)),
            None => in_stream(saved.stream_offset, saved.len),
        };
        if !fits {
            return Err(Error::Forged {
                what: format!(
                    "the saved contents of {path} ({} bytes at stream offset {}) lie beyond the process's stream of {} bytes",
                    saved.len,
                    saved.stream_offset,
                    reader.len()
                ),
            });
        }
        // Opened with the restorer's rights: the process is still the restorer's empty copy.
        let root = match &root {
            Some(r) => r,
            None => root.insert(open_root_of(host_pid)?),
        };
        let _as = crate::fsid::act_as(owner)?;
        let mut f = create_in_root(root, path).context(|| format!("restore the contents of {path}"))?;
        drop(_as);
        if let Some(extents) = &saved.extents {
            // Made empty above: what no extent covers comes back a hole.
            super::deleted::write_extents(&f, saved.len, extents, saved.allocated, reader, path)?;
            continue;
        }
        let mut buf = Vec::new();
        let mut done = 0u64;
        while done < saved.len {
            let n = (saved.len - done).min(FILL_PIECE);
            buf.resize(n as usize, 0);
            reader.read_exact_at(saved.stream_offset + done, &mut buf)?;
            f.write_all(&buf).context(|| format!("restore the contents of {path}"))?;
            done += n;
        }
    }
    Ok(())
}

/// Maps every (non-kernel) VMA of the image at its address, from inside the task (whose pid in
/// the job is `ns_pid`). The task's old mappings in those ranges must already be gone.
///
/// A shared memory object that more than one mapping (or a memfd descriptor) needs is made with
/// a descriptor, which the task that made it keeps, parked in `fds` at or above `keep_base`
/// (see [`descriptor::keeping_base`]) until every process is restored: the others take it from there
/// (pidfd_getfd, which needs only the ptrace rights a process has over another of the same
/// user), as nothing else reaches an object by a mapping of it without privilege
/// (/proc/<pid>/map_files needs CAP_CHECKPOINT_RESTORE in the initial user namespace).
/// `path_scratch` is a scratch offset for paths. `runner`: the batch runner in the task
/// (`ptrace::batch`), which makes the mmaps of anonymous memory and of files already open in
/// one stop; without it each is a call of its own.
#[allow(clippy::too_many_arguments)]
pub fn map_all(
    task: &mut RemoteTask,
    ns_pid: Tid,
    vmas: &[VmaRecord],
    ctx: &MemRestoreCtx,
    fds: &mut descriptor::RestoreCtx,
    keep_base: u64,
    path_scratch: usize,
    runner: Option<&crate::ptrace::batch::Runner>,
) -> Result<()> {
    // Each file is opened once for all its mappings (a library maps four or five pieces of
    // itself: an open and a close less each, two injected calls), and closed after the last.
    let mut opened: Vec<OpenForMapping> = Vec::new();
    let mut pending = PendingMaps { calls: Vec::new(), runner, table_offset: path_scratch + PENDING_TABLE_AFTER_PATH };
    let mapped = map_each(task, ns_pid, vmas, ctx, fds, keep_base, path_scratch, &mut opened, &mut pending).and_then(|()| pending.flush(task));
    // Closed whatever happened; an error of the mapping is the one to tell.
    let closed = close_opened(task, &opened, runner, pending.table_offset);
    mapped.and(closed)
}

/// A file opened in the task for its mappings ([`map_all`]): by path, open flags and identity.
struct OpenForMapping<'v> {
    path: &'v str,
    flags: i32,
    id: (u64, u64),
    fd: u64,
}

/// Closes the files [`map_all`] opened in the task, in one stop where it has the runner.
fn close_opened(task: &mut RemoteTask, opened: &[OpenForMapping], runner: Option<&crate::ptrace::batch::Runner>, table_offset: usize) -> Result<()> {
    match runner {
        Some(runner) if !opened.is_empty() => {
            let closes: Vec<crate::ptrace::batch::Call> = opened.iter().map(|o| crate::ptrace::batch::Call::new(libc::SYS_close, &[o.fd])).collect();
            let table = task.scratch_at(table_offset);
            for (raw, o) in runner.run(task, table, &closes)?.into_iter().zip(opened) {
                crate::ptrace::inject::call_result(task.pid, "close", raw).context(|| format!("close {} after mapping it", o.path))?;
            }
        }
        _ => {
            for o in opened {
                task.syscall("close", libc::SYS_close, &[o.fd])?;
            }
        }
    }
    Ok(())
}

/// Where the table of batched calls starts in the scratch area, past a path at `path_scratch`.
const PENDING_TABLE_AFTER_PATH: usize = 4096 + 64;

/// mmaps waiting to be made together by the batch runner, each with its mapping (to name it in
/// an error); made one by one where the task has no runner.
struct PendingMaps<'v, 'r> {
    calls: Vec<(crate::ptrace::batch::Call, &'v VmaRecord)>,
    runner: Option<&'r crate::ptrace::batch::Runner>,
    table_offset: usize,
}

impl PendingMaps<'_, '_> {
    /// The most calls the scratch area holds at once.
    fn capacity(task: &RemoteTask, table_offset: usize) -> usize {
        task.scratch().1.saturating_sub(table_offset) / crate::ptrace::batch::ENTRY_LEN
    }

    fn flush(&mut self, task: &mut RemoteTask) -> Result<()> {
        let calls = std::mem::take(&mut self.calls);
        let what = |vma: &VmaRecord| format!("map {:#x}-{:#x} ({})", vma.start, vma.end, vma.backing_name());
        let Some(runner) = self.runner else {
            for (call, vma) in calls {
                task.syscall("mmap", call.nr, &call.args).context(|| what(vma))?;
            }
            return Ok(());
        };
        for part in calls.chunks(Self::capacity(task, self.table_offset).max(1)) {
            let table = task.scratch_at(self.table_offset);
            let list: Vec<crate::ptrace::batch::Call> = part.iter().map(|(c, _)| *c).collect();
            for (raw, (_, vma)) in runner.run(task, table, &list)?.into_iter().zip(part) {
                crate::ptrace::inject::call_result(task.pid, "mmap", raw).context(|| what(vma))?;
            }
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn map_each<'v>(
    task: &mut RemoteTask,
    ns_pid: Tid,
    vmas: &'v [VmaRecord],
    ctx: &MemRestoreCtx,
    fds: &mut descriptor::RestoreCtx,
    keep_base: u64,
    path_scratch: usize,
    opened: &mut Vec<OpenForMapping<'v>>,
    pending: &mut PendingMaps<'v, '_>,
) -> Result<()> {
    for vma in vmas.iter().filter(|v| !v.is_kernel_special()) {
        let writable_for_fill = vma.shared && !vma.runs.is_empty();
        let prot = vma.prot as u64 | if writable_for_fill { libc::PROT_WRITE as u64 } else { 0 };
        // Its kind, and the mmap flags that stay with a mapping (MAP_NORESERVE, MAP_GROWSDOWN: see
        // `memattrs`).
        let share = (if vma.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } | vma.attrs.mmap_flags()) as u64;
        let what = || format!("map {:#x}-{:#x} ({})", vma.start, vma.end, vma.backing_name());
        // Anonymous memory, and files once open, are mapped together in one stop, in their
        // order; any other kind is mapped once the mappings pending before it are made.
        let anonymous = matches!(vma.backing, Backing::Anon | Backing::Stack | Backing::Unlinked { .. });
        if !anonymous && !matches!(vma.backing, Backing::File { .. }) {
            pending.flush(task)?;
        }
        let mmap_fd = |task: &mut RemoteTask, fd: u64, offset: u64| {
            task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, share | libc::MAP_FIXED as u64, fd, offset]).context(what).map(drop)
        };
        match &vma.backing {
            Backing::File { path, dev, ino, .. } => {
                // Opened for writing where the mapping is shared and writable, or may be made so
                // (its file was opened for writing: VM_MAYWRITE); for the latter alone, read-only
                // where writing is refused now, with a warning (a later mprotect fails then).
                let writable = vma.shared && vma.prot & libc::PROT_WRITE as u32 != 0;
                let mut open_flags = if writable || vma.attrs.may_write { libc::O_RDWR } else { libc::O_RDONLY };
                // O_NOATIME where the process may (the file's owner, or CAP_FOWNER): mapping it
                // again would move its access time, which the job's own mapping moved already.
                let open = |task: &mut RemoteTask, open_flags: i32| {
                    let path_addr = task.put_path(path_scratch, path)?;
                    let mut open = |noatime: i32| {
                        task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, path_addr, (open_flags | libc::O_CLOEXEC | noatime) as u64])
                    };
                    match open(libc::O_NOATIME) {
                        // EPERM (the injector keeps the kind, not the number; EACCES fails again).
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => open(0),
                        r => r,
                    }
                };
                let known = opened.iter().find(|o| o.path == path.as_str() && o.flags == open_flags && o.id == (*dev, *ino)).map(|o| o.fd);
                let fd = match known {
                    Some(fd) => fd,
                    None => {
                        let what = format!("open {path} for mapping");
                        let rights = fds.files_rights.as_ref();
                        let fd = match crate::fsid::open_with_owner_rights_if_refused(task, rights, &what, Some((*dev, *ino)), |task| open(task, open_flags)) {
                            Err(e) if open_flags == libc::O_RDWR && !writable => {
                                tracing::warn!(
                                    pid = task.pid,
                                    start = vma.start,
                                    "{path} mapped read-only where it may no longer be written ({e}): making the mapping writable will fail"
                                );
                                open_flags = libc::O_RDONLY;
                                crate::fsid::open_with_owner_rights_if_refused(task, rights, &what, Some((*dev, *ino)), |task| open(task, open_flags))?
                            }
                            r => r?,
                        };
                        opened.push(OpenForMapping { path: path.as_str(), flags: open_flags, id: (*dev, *ino), fd });
                        fd
                    }
                };
                pending.calls.push((
                    crate::ptrace::batch::Call::new(libc::SYS_mmap, &[vma.start, vma.len(), prot, share | libc::MAP_FIXED as u64, fd, vma.file_offset]),
                    vma,
                ));
            }
            Backing::Shmem { ino, memfd_name } => {
                let used = ctx.objects.get(ino).copied().unwrap_or_default();
                let alone = memfd_name.is_none() && used.mappings <= 1 && used.private == 0 && !used.held_by_descriptor;
                if !fds.shared_memory.contains_key(ino) && alone {
                    create_anonymous(task, vma, prot).context(what)?;
                } else {
                    let object = ctx.object_id(*ino, memfd_name.as_deref());
                    let fd = object_fd(task, ns_pid, vma, object, used, fds, keep_base, path_scratch)?;
                    mmap_fd(task, fd.fd, vma.file_offset)?;
                    fd.close(task)?;
                }
            }
            // The object back, mapped privately: the copies are written in by `fill`, the
            // other pages read the object, as they did.
            Backing::PrivateShmem { ino, memfd_name, .. } if ctx.restores_object(*ino) => {
                let used = ctx.objects.get(ino).copied().unwrap_or_default();
                let object = ctx.object_id(*ino, memfd_name.as_deref());
                let fd = object_fd(task, ns_pid, vma, object, used, fds, keep_base, path_scratch)?;
                mmap_fd(task, fd.fd, vma.file_offset)?;
                fd.close(task)?;
            }
            // No object to map: every page is stored (see `Backing::PrivateShmem`).
            Backing::PrivateShmem { .. } => {
                task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, share | (libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64, u64::MAX, 0])
                    .context(what)?;
            }
            // A mapping of a deleted file comes back as private anonymous memory, every page of
            // it stored.
            Backing::Anon | Backing::Stack | Backing::Unlinked { .. } => {
                let grows = if matches!(vma.backing, Backing::Stack) { libc::MAP_GROWSDOWN as u64 } else { 0 };
                let args = [vma.start, vma.len(), prot, share | (libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64 | grows, u64::MAX, 0];
                pending.calls.push((crate::ptrace::batch::Call::new(libc::SYS_mmap, &args), vma));
            }
            Backing::Droppable => map_droppable(task, vma, prot).context(what)?,
            Backing::GpuInherited { .. } => {
                let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED) as u64;
                task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), libc::PROT_NONE as u64, flags, u64::MAX, 0]).context(what)?;
            }
            Backing::SysvShm { shmid, size } => super::sysvipc::attach(task, vma, *shmid, *size)?,
            Backing::Aio { nr } => super::aio::restore(task, vma.start, vma.len(), *nr, path_scratch)?,
            _ => unreachable!("kernel mappings are filtered out"),
        }
    }
    Ok(())
}

/// A descriptor of a shared memory object in the task, to map it: the one parked by an earlier
/// mapping of it (in this process, or taken from another), or a memfd made now and parked.
struct ObjectFd {
    fd: u64,
    /// Taken from another process: closed once mapped.
    taken: bool,
}

impl ObjectFd {
    fn close(self, task: &mut RemoteTask) -> Result<()> {
        if self.taken {
            task.syscall("close", libc::SYS_close, &[self.fd])?;
        }
        Ok(())
    }
}

/// A shared memory object a mapping maps, as [`object_fd`] makes it.
struct ObjectId<'a> {
    /// Its inode at the checkpoint.
    ino: u64,
    memfd_name: Option<&'a str>,
    /// The deleted file it is, which a descriptor holds too: made again as that file's copy.
    deleted: Option<&'a super::deleted::DeletedFileRecord>,
}

/// The descriptor of `object` that `vma` maps, made if no mapping (or descriptor) made it
/// before: MAP_SHARED|MAP_ANONYMOUS has no descriptor to share, so an object more than one
/// mapping needs is made as a memfd named after what the kernel calls its own
/// ("/memfd:dev/zero (deleted)" in maps then), of the size its shared mappings need; a deleted
/// file a descriptor holds is made as that descriptor's restore makes it, which then fills it.
#[allow(clippy::too_many_arguments)]
fn object_fd(
    task: &mut RemoteTask,
    ns_pid: Tid,
    vma: &VmaRecord,
    object: ObjectId<'_>,
    used: ObjectUse,
    fds: &mut descriptor::RestoreCtx,
    keep_base: u64,
    path_scratch: usize,
) -> Result<ObjectFd> {
    let what = || format!("map {:#x}-{:#x} ({})", vma.start, vma.end, vma.backing_name());
    let ino = object.ino;
    match fds.shared_memory.get(&ino).copied() {
        Some((owner, kept)) if owner == ns_pid => Ok(ObjectFd { fd: kept, taken: false }),
        Some((owner, kept)) => {
            let fd = descriptor::take_from(task, owner, kept).map_err(|e| Error::Other(format!("{}: {e}", what())))?;
            Ok(ObjectFd { fd, taken: true })
        }
        None => {
            let mut size = if vma.shared { used.size.max(vma.file_offset.saturating_add(vma.len())) } else { used.size };
            if used.held_by_descriptor {
                // Large enough for the private copies written in before the descriptor's restore
                // gives the object its contents and its own size.
                size = size.max(used.private_end);
            }
            let fd = match object.deleted {
                Some(d) => deleted_copy(task, d, size, path_scratch)?,
                None => create_memfd(task, object.memfd_name.unwrap_or("dev/zero"), size, path_scratch).context(what)?,
            };
            let kept = descriptor::move_above(task, fd, keep_base)?;
            fds.park(ns_pid, kept);
            fds.shared_memory.insert(ino, (ns_pid, kept));
            Ok(ObjectFd { fd: kept, taken: false })
        }
    }
}

/// The copy of deleted file `d` in the task, empty and `size` bytes long, for its mappings; the
/// descriptor's restore gives it its contents, size, owner and mode.
fn deleted_copy(task: &mut RemoteTask, d: &super::deleted::DeletedFileRecord, size: u64, path_scratch: usize) -> Result<u64> {
    let fd = super::deleted::create_copy(task, d, path_scratch, false)?;
    if let Err(e) = task.syscall("ftruncate", libc::SYS_ftruncate, &[fd, size]) {
        task.syscall("close", libc::SYS_close, &[fd])?;
        return Err(e).context(|| format!("size the new copy of {} for its mappings", d.path));
    }
    Ok(fd)
}

/// memfd_create in the task, of `size` bytes; returns its descriptor.
fn create_memfd(task: &mut RemoteTask, name: &str, size: u64, path_scratch: usize) -> std::io::Result<u64> {
    let name_addr = task.put_path(path_scratch, name)?;
    let fd = task.syscall("memfd_create", libc::SYS_memfd_create, &[name_addr, libc::MFD_CLOEXEC as u64])?;
    if let Err(e) = task.syscall("ftruncate", libc::SYS_ftruncate, &[fd, size]) {
        task.syscall("close", libc::SYS_close, &[fd])?;
        return Err(e);
    }
    Ok(fd)
}

/// Makes MAP_DROPPABLE memory at the VMA (zero-filled: see [`Backing::Droppable`]). A kernel
/// without it (before 6.11: the checkpoint was taken on another) gives ordinary private memory,
/// zero-filled too, wiped on fork by the flags restored after; only the kernel's freedom to drop
/// it is lost.
fn map_droppable(task: &mut RemoteTask, vma: &VmaRecord, prot: u64) -> std::io::Result<()> {
    /// The MAP_DROPPABLE mapping type (libc does not name it yet).
    const MAP_DROPPABLE: i32 = 0x08;
    let flags = |kind: i32| (kind | libc::MAP_ANONYMOUS | libc::MAP_FIXED | vma.attrs.mmap_flags()) as u64;
    match task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, flags(MAP_DROPPABLE), u64::MAX, 0]) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::info!(start = vma.start, "this kernel has no MAP_DROPPABLE: the mapping comes back as private memory");
            task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, flags(libc::MAP_PRIVATE), u64::MAX, 0]).map(drop)
        }
        r => r.map(drop),
    }
}

/// Creates MAP_SHARED|MAP_ANONYMOUS memory at the VMA, at the VMA's offset in it, as the
/// program made it (a mapping only one process has).
fn create_anonymous(task: &mut RemoteTask, vma: &VmaRecord, prot: u64) -> std::io::Result<()> {
    let shared_anon = (libc::MAP_SHARED | libc::MAP_ANONYMOUS | vma.attrs.mmap_flags()) as u64;
    if vma.file_offset == 0 {
        task.syscall("mmap", libc::SYS_mmap, &[vma.start, vma.len(), prot, shared_anon | libc::MAP_FIXED as u64, u64::MAX, 0])?;
        return Ok(());
    }
    // The object must be larger than the mapping, which sits at an offset in it: map it all
    // anywhere, move the part to its place, drop the head.
    let whole = vma.file_offset + vma.len();
    let at = task.syscall("mmap", libc::SYS_mmap, &[0, whole, prot, shared_anon, u64::MAX, 0])?;
    task.syscall("mremap", libc::SYS_mremap, &[at + vma.file_offset, vma.len(), vma.len(), (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64, vma.start])?;
    task.syscall("munmap", libc::SYS_munmap, &[at, vma.file_offset])?;
    Ok(())
}

/// Most bytes the restore of memory reads from a stream at once.
const FILL_PIECE: u64 = 16 << 20;

/// Writes every stored page back, reading the process's stream in order.
///
/// Pages of private anonymous mappings (heap, stacks, anonymous mmaps) are placed with
/// UFFDIO_COPY ([`PagePlacer`]): the kernel allocates each page and copies into it, without
/// zeroing it first or looking it up page by page as a write to /proc/PID/mem does (measured:
/// 1 GiB in 0.25 s against 0.64 s). The rest (private copies of file pages, shared memory, huge
/// page ranges, or everything where userfaultfd is refused) goes through /proc/PID/mem.
///
/// With a page server (`lazy`, `ckpt restart --lazy`), those private anonymous mappings are
/// handed to it instead, registered for missing pages in a context that serves the kernel's
/// accesses too, and filled once the job runs ([`crate::lazy`]); a process whose context cannot
/// be made is filled now.
pub fn fill(
    task: &mut RemoteTask,
    vmas: &[VmaRecord],
    objects: &MemRestoreCtx,
    reader: &mut StreamReader,
    earlier: &mut BTreeMap<u64, StreamReader>,
    progress: &std::sync::atomic::AtomicU64,
    lazy: Option<&crate::lazy::PageServer>,
) -> Result<u64> {
    let anonymous: Vec<(u64, u64)> = vmas.iter().filter(|v| placeable(v)).map(|v| (v.start, v.end)).collect();
    let lazily = match lazy {
        Some(server) if !anonymous.is_empty() => hand_to_page_server(task, vmas, &anonymous, reader, earlier, server),
        _ => false,
    };
    let mut placer = if lazily { None } else { PagePlacer::arm(task, anonymous) };
    // Runs in the mappings the page server fills are left to it.
    let now = |v: &VmaRecord| !lazily || !placeable(v);
    let runs = runs_in_stream_order(vmas, |v| if now(v) { stored_runs(v, objects) } else { Vec::new() });
    if lazily {
        // A few scattered pages before the release: the blocks that hold them read all at once,
        // and nothing after them, which would keep the disk from the job's first faults.
        ask_for(reader, &runs);
    }
    let mut bytes = fill_runs(task, &mut placer, runs, reader, progress)?;
    // An incremental generation's pages that earlier generations hold, from each in turn.
    for (&generation, reader) in earlier.iter_mut() {
        let of_generation = |v: &VmaRecord| if now(v) { v.earlier.iter().filter(|e| e.generation == generation).map(|e| e.run).collect() } else { Vec::new() };
        let runs = runs_in_stream_order(vmas, of_generation);
        if lazily {
            ask_for(reader, &runs);
        }
        let filled = fill_runs(task, &mut placer, runs, reader, progress).map_err(|e| Error::Other(format!("pages of generation {generation}: {e}")))?;
        bytes = bytes.saturating_add(filled);
    }
    // Closing our descriptor, the only one, ends the registration: the mappings are ordinary
    // memory again before anything else of the process is restored.
    drop(placer);
    // Shared mappings were made writable for the fill; put their protection back.
    for vma in vmas.iter().filter(|v| v.shared && !v.runs.is_empty() && v.prot & libc::PROT_WRITE as u32 == 0) {
        task.syscall("mprotect", libc::SYS_mprotect, &[vma.start, vma.len(), vma.prot as u64])?;
    }
    Ok(bytes)
}

/// madvise(MADV_GUARD_INSTALL), Linux 6.13 (not in the libc crate yet).
const MADV_GUARD_INSTALL: u64 = 102;

/// Makes the guard pages of `vmas` guards again (`VmaRecord::guards`): after [`fill`] (a guard
/// installed over a page there drops it) and before the locks (the kernel refuses a guard in a
/// locked mapping). A kernel without guard regions (before 6.13) refuses: the restart fails,
/// saying so, rather than give the program pages it could not touch before.
pub fn restore_guards(task: &mut RemoteTask, pid: Tid, vmas: &[VmaRecord]) -> Result<()> {
    for &(addr, pages) in vmas.iter().flat_map(|v| v.guards.iter()) {
        task.syscall("madvise(MADV_GUARD_INSTALL)", libc::SYS_madvise, &[addr, pages * PAGE_SIZE, MADV_GUARD_INSTALL]).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::InvalidInput { " (guard regions need Linux 6.13: restart on a newer kernel)" } else { "" };
            Error::Other(format!("pid {pid}: make the {pages} guard pages at {addr:#x} again{hint}: {e}"))
        })?;
    }
    Ok(())
}

/// The runs of this generation's stream that restore `v`: its own, and where a private mapping
/// of an object comes back without the object, the object's pages as it showed them.
fn stored_runs(v: &VmaRecord, objects: &MemRestoreCtx) -> Vec<PageRun> {
    match &v.backing {
        Backing::PrivateShmem { ino, object, .. } if !objects.restores_object(*ino) => v.runs.iter().chain(object).copied().collect(),
        _ => v.runs.clone(),
    }
}

/// Makes `reader` a scattered one (no read-ahead, chunks read in part) and has the kernel start
/// reading what `runs` need, all at once: for reads that skip most of the stream.
fn ask_for(reader: &mut StreamReader, runs: &[PageRun]) {
    reader.set_scattered(true);
    for r in runs {
        reader.will_read(r.stream_offset, r.pages * PAGE_SIZE);
    }
}

/// Writes `runs` of `reader`'s stream into the process: every run is checked against the
/// stream before it is used, and copied in pieces of at most FILL_PIECE bytes (the progress
/// display moves by them), straight from the chunks' bytes (mapped from the page cache when
/// stored raw) into the process.
fn fill_runs(
    task: &mut RemoteTask,
    placer: &mut Option<PagePlacer>,
    runs: Vec<PageRun>,
    reader: &mut StreamReader,
    progress: &std::sync::atomic::AtomicU64,
) -> Result<u64> {
    let mut bytes = 0u64;
    for r in runs {
        let len = r.pages.checked_mul(PAGE_SIZE);
        let fits = len.and_then(|l| r.stream_offset.checked_add(l)).is_some_and(|e| e <= reader.len());
        let (Some(len), true) = (len, fits) else {
            return Err(Error::Forged {
                what: format!(
                    "{} pages at {:#x} from stream offset {} lie beyond the process's stream of {} bytes",
                    r.pages,
                    r.addr,
                    r.stream_offset,
                    reader.len()
                ),
            });
        };
        let mut placing = placer.as_mut().filter(|p| p.covers(r.addr, len));
        let mem = &task.mem;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(FILL_PIECE);
            let at = r.addr.saturating_add(done);
            reader.for_each_piece(r.stream_offset + done, n, |before, piece| match placing.as_deref_mut() {
                Some(p) => p.put(mem, at.saturating_add(before), piece),
                None => mem.write_all(at.saturating_add(before), piece).map_err(Error::from),
            })?;
            done += n;
            progress.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(p) = placing {
            p.end_run(r.addr)?;
        }
        bytes = bytes.saturating_add(len);
    }
    Ok(bytes)
}

/// Every mapping's runs, sorted by stream offset so that the stream is read front to back;
/// neighbours contiguous both in memory and in the stream, within one mapping, are joined (a run
/// never spans two mappings, which may be filled in different ways).
fn runs_in_stream_order(vmas: &[VmaRecord], runs_of: impl Fn(&VmaRecord) -> Vec<PageRun>) -> Vec<PageRun> {
    let mut runs: BTreeMap<u64, (PageRun, usize)> = BTreeMap::new();
    for (i, vma) in vmas.iter().enumerate() {
        for r in runs_of(vma) {
            runs.insert(r.stream_offset, (r, i));
        }
    }
    let mut merged: Vec<(PageRun, usize)> = Vec::new();
    for (r, i) in runs.into_values() {
        match merged.last_mut() {
            Some((m, j))
                if *j == i
                    && m.pages < 4096
                    && m.pages.checked_mul(PAGE_SIZE).and_then(|l| m.addr.checked_add(l)) == Some(r.addr)
                    && m.pages.checked_mul(PAGE_SIZE).and_then(|l| m.stream_offset.checked_add(l)) == Some(r.stream_offset) =>
            {
                m.pages = m.pages.saturating_add(r.pages)
            }
            _ => merged.push((r, i)),
        }
    }
    merged.into_iter().map(|(r, _)| r).collect()
}

/// Whether `v` is a private anonymous mapping with pages to fill that a userfaultfd context
/// can place pages in (not one where the program wanted huge pages, left to /proc/PID/mem,
/// which faults huge pages in).
fn placeable(v: &VmaRecord) -> bool {
    !v.shared
        && matches!(v.backing, Backing::Anon | Backing::Stack)
        && !(v.runs.is_empty() && v.earlier.is_empty())
        && v.attrs.huge_pages != super::memattrs::HugePages::Wanted
}

/// A userfaultfd context the process makes (an injected `userfaultfd(flags)`) and hands over at
/// once, its handshake done with `features`, and `ranges` registered for missing pages in it:
/// the process never holds it.
fn missing_pages_context(task: &mut RemoteTask, flags: u64, features: u64, ranges: &[(u64, u64)]) -> Result<sys::uffd::Uffd> {
    let fd = task.syscall("userfaultfd", libc::SYS_userfaultfd, &[flags]).context(|| "create a userfaultfd context".to_string())?;
    let ours = descriptor::take_into_self(task.pid, fd as i32);
    task.syscall("close", libc::SYS_close, &[fd])?;
    let (uffd, _) = sys::uffd::Uffd::with_features(ours?, features, 0).context(|| "userfaultfd API handshake".to_string())?;
    for &(start, end) in ranges {
        uffd.register_missing(start, end - start).context(|| format!("register {start:#x}-{end:#x} with userfaultfd"))?;
    }
    Ok(uffd)
}

/// Registers `ranges` of the process for missing pages in a full userfaultfd context the process
/// makes (an injected call) and hands over, and gives them to the page server. False (logged)
/// when the kernel refuses: the caller fills them now.
fn hand_to_page_server(
    task: &mut RemoteTask,
    vmas: &[VmaRecord],
    ranges: &[(u64, u64)],
    reader: &StreamReader,
    earlier: &BTreeMap<u64, StreamReader>,
    server: &crate::lazy::PageServer,
) -> bool {
    // Non-blocking: the server polls every context and reads until none has a message.
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    match missing_pages_context(task, flags, crate::lazy::FEATURES, ranges) {
        Ok(uffd) => {
            let mut chunk_dirs: BTreeMap<Option<u64>, std::path::PathBuf> = earlier.iter().map(|(&g, r)| (Some(g), r.dir().to_path_buf())).collect();
            chunk_dirs.insert(None, reader.dir().to_path_buf());
            let runs = crate::lazy::source_runs(vmas, ranges);
            server.add(crate::lazy::LazyProcess { pid: reader.pid(), uffd, runs, chunk_dirs });
            true
        }
        Err(e) => {
            tracing::warn!(pid = task.pid, "memory is filled before the release, not lazily: {e}");
            false
        }
    }
}

/// Places the pages of a process's private anonymous mappings with UFFDIO_COPY, through a
/// userfaultfd context the process makes (an injected call) and hands over at once: the process
/// never holds it, so dropping the placer ends the registration whatever happens.
///
/// The context handles user-mode faults only, which anyone may make: nothing of the process
/// runs while it exists. A kernel access to a registered page not yet placed would fail (EFAULT)
/// instead of waiting for us, so such mappings are written only through the placer.
struct PagePlacer {
    uffd: sys::uffd::Uffd,
    /// The registered mappings, (start, end).
    ranges: Vec<(u64, u64)>,
    /// The start of a page whose first bytes ended the last piece (pieces are cut where the
    /// stream's chunks end, not always at page boundaries), and those bytes.
    partial_at: u64,
    partial: Vec<u8>,
}

impl PagePlacer {
    /// A placer for the private anonymous mappings `ranges` (see [`placeable`]), or None
    /// (logged) when there are none or the kernel refuses.
    fn arm(task: &mut RemoteTask, ranges: Vec<(u64, u64)>) -> Option<PagePlacer> {
        if ranges.is_empty() {
            return None;
        }
        match Self::try_arm(task, ranges) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::info!(pid = task.pid, "memory is written through /proc/PID/mem: {e}");
                None
            }
        }
    }

    fn try_arm(task: &mut RemoteTask, ranges: Vec<(u64, u64)>) -> Result<PagePlacer> {
        let uffd = missing_pages_context(task, libc::O_CLOEXEC as u64 | sys::uffd::USER_MODE_ONLY, 0, &ranges)?;
        Ok(PagePlacer { uffd, ranges, partial_at: 0, partial: Vec::with_capacity(PAGE_SIZE as usize) })
    }

    /// Whether `addr..addr + len` lies in one registered mapping.
    fn covers(&self, addr: u64, len: u64) -> bool {
        self.ranges.iter().any(|&(s, e)| s <= addr && addr.checked_add(len).is_some_and(|end| end <= e))
    }

    /// Places `bytes` at `dst`; pieces of one run come in order, each starting where the last
    /// ended.
    fn put(&mut self, mem: &ProcMem, mut dst: u64, mut bytes: &[u8]) -> Result<()> {
        let page = PAGE_SIZE as usize;
        if !self.partial.is_empty() {
            let k = (page - self.partial.len()).min(bytes.len());
            self.partial.extend_from_slice(&bytes[..k]);
            (dst, bytes) = (dst + k as u64, &bytes[k..]);
            if self.partial.len() < page {
                return Ok(());
            }
            let at = self.partial_at;
            let whole = std::mem::take(&mut self.partial);
            let r = self.place(mem, at, &whole);
            self.partial = whole;
            self.partial.clear();
            r?;
        }
        let whole = bytes.len() / page * page;
        self.place(mem, dst, &bytes[..whole])?;
        if whole < bytes.len() {
            self.partial_at = dst + whole as u64;
            self.partial.extend_from_slice(&bytes[whole..]);
        }
        Ok(())
    }

    /// Copies whole pages in; a page already there (the kernel says EEXIST) is written through
    /// /proc/PID/mem, which needs no fault for a present page.
    fn place(&self, mem: &ProcMem, dst: u64, pages: &[u8]) -> Result<()> {
        let mut done = 0usize;
        while done < pages.len() {
            done += self.uffd.copy(dst + done as u64, &pages[done..]).context(|| format!("place {} bytes at {:#x}", pages.len() - done, dst + done as u64))?;
            if done < pages.len() {
                let end = done + PAGE_SIZE as usize;
                mem.write_all(dst + done as u64, &pages[done..end])?;
                done = end;
            }
        }
        Ok(())
    }

    /// A run is whole pages: nothing may be left over at its end.
    fn end_run(&self, run_addr: u64) -> Result<()> {
        if self.partial.is_empty() {
            Ok(())
        } else {
            Err(Error::Forged { what: format!("the run at {run_addr:#x} ended inside a page") })
        }
    }
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

    /// The placer puts pieces cut anywhere (as chunk ends cut them) into whole pages, and writes
    /// a page that is already there another way; here into this test's own memory.
    #[test]
    fn page_placer_assembles_pieces_and_passes_present_pages() {
        let pages = 16usize;
        let len = pages * PAGE_SIZE as usize;
        let mut mem = memmap2::MmapMut::map_anon(len).unwrap();
        let start = mem.as_ptr() as u64;
        // Page 3 is present before the fill.
        mem[3 * PAGE_SIZE as usize] = 1;
        let fd = sys::uffd::create_own(libc::O_CLOEXEC as u64 | sys::uffd::USER_MODE_ONLY).unwrap_or_else(|e| panic!("userfaultfd: {e}"));
        let uffd = sys::uffd::Uffd::new(fd).unwrap();
        uffd.register_missing(start, len as u64).unwrap();
        let mut placer = PagePlacer { uffd, ranges: vec![(start, start + len as u64)], partial_at: 0, partial: Vec::new() };
        assert!(placer.covers(start, len as u64) && !placer.covers(start, len as u64 + 1));
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        let proc_mem = ProcMem::open(std::process::id() as Tid).unwrap();
        let mut pos = 0;
        for cut in [5000, 5001, 4 * 4096 + 3, len] {
            placer.put(&proc_mem, start + pos as u64, &data[pos..cut]).unwrap();
            pos = cut;
        }
        placer.end_run(start).unwrap();
        drop(placer);
        assert!(mem[..] == data[..], "memory differs from what was placed");
    }

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
    fn runs_from_mincore_bytes() {
        // mincore sets bit 0 of a byte per page; the other bits are reserved.
        let resident = [1u8, 1, 0, 0, 1, 0x81, 0];
        let runs = page_runs(0x10000, resident.iter().map(|b| b & 1 != 0));
        assert_eq!(runs, vec![(0x10000, 2), (0x14000, 2)]);
        assert_eq!(page_runs(0x10000, [false, false].into_iter()), vec![]);
    }

    #[test]
    fn shared_objects_are_recognised_by_their_maps_path() {
        assert!(is_shared_object("/dev/zero (deleted)", true));
        assert!(is_shared_object("/memfd:mp (deleted)", true));
        assert!(is_shared_object("/dev/shm/pym-12-x (deleted)", true));
        assert!(is_shared_object("/tmp/pmix/dstore (deleted)", true));
        // Private mappings are copies; files with a name are files.
        assert!(!is_shared_object("/memfd:mp (deleted)", false));
        assert!(!is_shared_object("/dev/shm/region", true));
        assert!(!is_shared_object("/usr/lib/libc.so.6", false));
    }

    #[test]
    fn shared_objects_are_sized_to_hold_every_mapping() {
        let vma = |ino: u64, start: u64, pages: u64, file_offset: u64| VmaRecord {
            start,
            end: start + pages * PAGE_SIZE,
            prot: 3,
            shared: true,
            file_offset,
            backing: Backing::Shmem { ino, memfd_name: None },
            runs: Vec::new(),
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        let mut anon = vma(0, 0x1000, 1, 0);
        anon.backing = Backing::Anon;
        let vmas = [vma(7, 0x10000, 4, 0), vma(7, 0x40000, 2, 8 * PAGE_SIZE), vma(9, 0x80000, 1, 0), anon];
        let ctx = MemRestoreCtx::new(vmas.iter());
        assert_eq!(ctx.objects[&7], ObjectUse { mappings: 2, size: 10 * PAGE_SIZE, ..Default::default() });
        assert_eq!(ctx.objects[&9], ObjectUse { mappings: 1, size: PAGE_SIZE, ..Default::default() });
        assert_eq!(ctx.objects.len(), 2);
    }

    /// A private mapping of an object maps the object where a shared mapping brings it back,
    /// without sizing it (it may reach past its end); alone, it comes back without one.
    #[test]
    fn private_mappings_of_objects_map_them_where_they_come_back() {
        let vma = |ino: u64, start: u64, pages: u64, shared: bool| VmaRecord {
            start,
            end: start + pages * PAGE_SIZE,
            prot: 3,
            shared,
            file_offset: 0,
            backing: if shared {
                Backing::Shmem { ino, memfd_name: Some("m".into()) }
            } else {
                Backing::PrivateShmem { ino, memfd_name: Some("m".into()), path: "/memfd:m (deleted)".into(), object: Vec::new() }
            },
            runs: Vec::new(),
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        let vmas = [vma(7, 0x10000, 2, true), vma(7, 0x40000, 6, false), vma(9, 0x80000, 1, false)];
        let ctx = MemRestoreCtx::new(vmas.iter());
        assert_eq!(
            ctx.objects[&7],
            ObjectUse { mappings: 1, private: 1, size: 2 * PAGE_SIZE, private_end: 6 * PAGE_SIZE, held_by_descriptor: false, memfd: true }
        );
        assert!(ctx.restores_object(7));
        assert!(!ctx.restores_object(9));
        let run = |addr: u64| PageRun { addr, pages: 1, stream_offset: addr };
        let mut alone = vmas[2].clone();
        alone.runs = vec![run(0x80000)];
        if let Backing::PrivateShmem { object, .. } = &mut alone.backing {
            *object = vec![run(0x81000)];
        }
        assert_eq!(stored_runs(&alone, &ctx), vec![run(0x80000), run(0x81000)]);
        let mut mapped = alone.clone();
        if let Backing::PrivateShmem { ino, .. } = &mut mapped.backing {
            *ino = 7;
        }
        assert_eq!(stored_runs(&mapped, &ctx), vec![run(0x80000)]);

        // A memfd mapped only privately, whose descriptor is opened on the object the memory
        // restore makes: the object comes back, and only the copies are written in.
        let memfd = |ino: u64, mapped: Option<(u64, u64)>| descriptor::FdRecord {
            fd: 3,
            flags: libc::O_RDWR as u32,
            pos: 0,
            description: 1,
            kind: descriptor::FdKind::Memfd(super::super::memfd::MemfdRecord {
                name: "m".into(),
                dev: 1,
                ino,
                seals: 0,
                mapped,
                mode_owner: None,
                contents: None,
            }),
            locks: Vec::new(),
            owner: None,
        };
        let fds = [memfd(9, Some((0x80000, 0x81000))), memfd(11, None)];
        let held = MemRestoreCtx::new(vmas.iter()).with_descriptors(fds.iter(), std::iter::empty());
        assert!(held.restores_object(9));
        assert!(held.objects[&9].held_by_descriptor);
        assert_eq!(held.objects[&9].private_end, PAGE_SIZE);
        assert!(!held.restores_object(11));
        assert_eq!(stored_runs(&alone, &held), vec![run(0x80000)]);
    }

    /// A deleted file that a descriptor holds and a mapping maps is one object for both: the
    /// memory restore makes it as the file's copy, and the descriptors' restore knows it. One
    /// no mapping maps, a mapping of a memfd with the same inode, or a process's deleted
    /// executable is not tied.
    #[test]
    fn deleted_files_held_and_mapped_are_one_object() {
        let private = |ino: u64, memfd_name: Option<&str>| VmaRecord {
            start: 0x10000,
            end: 0x12000,
            prot: 3,
            shared: false,
            file_offset: 0,
            backing: Backing::PrivateShmem { ino, memfd_name: memfd_name.map(Into::into), path: "/w/f (deleted)".into(), object: Vec::new() },
            runs: Vec::new(),
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        let deleted = |ino: u64| descriptor::FdRecord {
            fd: 3,
            flags: libc::O_RDWR as u32,
            pos: 0,
            description: 1,
            kind: descriptor::FdKind::Deleted(super::super::deleted::DeletedFileRecord {
                path: "/w/f".into(),
                dev: 5,
                ino,
                mode: 0o600,
                contents: Some(vec![1; 10]),
                times: None,
                owner: None,
            }),
            locks: Vec::new(),
            owner: None,
        };
        let vmas = [private(7, None), private(8, Some("m")), private(10, None)];
        let fds = [deleted(7), deleted(8), deleted(9), deleted(10)];
        let executable = match &fds[3].kind {
            descriptor::FdKind::Deleted(d) => d.clone(),
            _ => unreachable!(),
        };
        let ctx = MemRestoreCtx::new(vmas.iter()).with_descriptors(fds.iter(), std::iter::once(&executable));
        assert!(ctx.restores_object(7));
        assert_eq!(ctx.mapped_files(), [(5, 7)].into_iter().collect());
        let tied = ctx.deleted_file(7).expect("the file mapped by inode 7");
        assert_eq!((tied.path.as_str(), tied.contents.as_ref()), ("/w/f", None), "kept without its contents");
        assert!(ctx.deleted_file(8).is_none(), "a memfd's mapping is not the file");
        assert!(!ctx.restores_object(9), "no mapping of inode 9: nothing to tie");
        assert!(!ctx.restores_object(10) && ctx.deleted_file(10).is_none(), "a running executable is not tied");
    }

    /// Of a private mapping of an object, only the process's own copies are its pages: a page
    /// mapped from the object (the pagemap's "file or shared") is the object's.
    #[test]
    fn only_copies_of_a_private_mapping_of_an_object_are_its_own() {
        let backing = Backing::PrivateShmem { ino: 1, memfd_name: None, path: "/dev/zero (deleted)".into(), object: Vec::new() };
        let present = 1u64 << 63;
        let swapped = 1u64 << 62;
        let file_or_shared = 1u64 << 61;
        assert!(page_needs_storing(&backing, false, PageFlags(present)));
        assert!(page_needs_storing(&backing, false, PageFlags(swapped)));
        assert!(!page_needs_storing(&backing, false, PageFlags(present | file_or_shared)));
        assert!(!page_needs_storing(&backing, false, PageFlags(0)));
    }

    #[test]
    fn parts_of_shared_objects_are_stored_once() {
        let mut stored = Vec::new();
        // A view of the second half first, then the whole object, then the whole again.
        assert_eq!(add_range(&mut stored, (8, 16)), vec![(8, 16)]);
        assert_eq!(add_range(&mut stored, (0, 16)), vec![(0, 8)]);
        assert_eq!(stored, vec![(0, 16)]);
        assert_eq!(add_range(&mut stored, (0, 16)), vec![]);
        // Parts on both sides of what is stored, and one beyond.
        let mut stored = vec![(4, 6), (10, 12)];
        assert_eq!(add_range(&mut stored, (2, 14)), vec![(2, 4), (6, 10), (12, 14)]);
        assert_eq!(stored, vec![(2, 14)]);
        assert_eq!(add_range(&mut stored, (20, 24)), vec![(20, 24)]);
        assert_eq!(stored, vec![(2, 14), (20, 24)]);
    }

    #[test]
    fn a_moved_mapped_file_is_named_with_its_process_and_address() {
        let e = Error::MappedFileMoved {
            pid: 42,
            addr: 0x7f00_0000_0000,
            path: "/data/model.bin".into(),
            problem: "its path names no file now (No such file or directory)".into(),
        };
        let m = e.to_string();
        assert!(m.starts_with("pid 42: the file mapped at 0x7f0000000000, /data/model.bin: its path names no file now"), "{m}");
        assert!(m.contains("checkpoint again"), "{m}");
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

    #[test]
    fn runs_are_whole_across_pagemap_windows_from_the_pagemap_or_the_scan() {
        // A 3 GiB reservation: pages touched across the first window's end make one run.
        let len = 3 * PAGEMAP_WINDOW as usize;
        let mut mem = memmap2::MmapOptions::new().len(len).no_reserve_swap().map_anon().unwrap();
        let start = mem.as_ptr() as u64;
        // (And across the middle of the reservation, where a scan splits its walk in two.)
        let mid = len as u64 / 2;
        let touched = [
            PAGEMAP_WINDOW - 2 * PAGE_SIZE,
            PAGEMAP_WINDOW - PAGE_SIZE,
            PAGEMAP_WINDOW,
            PAGEMAP_WINDOW + PAGE_SIZE,
            mid - PAGE_SIZE,
            mid,
            2 * PAGEMAP_WINDOW + 100 * PAGE_SIZE,
        ];
        for off in touched {
            mem[off as usize] = 1;
        }
        let pagemap = Pagemap::open(std::process::id() as Tid).unwrap();
        let runs = wanted_runs_in(&pagemap, start, start + len as u64, false, |f| f.present()).unwrap();
        // The same runs from the scan alone (or from the pagemap, on a kernel without the scan).
        let scanned = wanted_runs_in(&pagemap, start, start + len as u64, true, |f| f.present()).unwrap();
        drop(mem);
        assert_eq!(runs, vec![(start + PAGEMAP_WINDOW - 2 * PAGE_SIZE, 4), (start + mid - PAGE_SIZE, 2), (start + 2 * PAGEMAP_WINDOW + 100 * PAGE_SIZE, 1)]);
        assert_eq!(scanned, runs);
    }

    #[test]
    fn pages_there_leave_out_the_mappings_named() {
        // Twelve pages, every one written, seen as three mappings of four.
        const P: u64 = PAGE_SIZE;
        let mut mem = memmap2::MmapOptions::new().len(12 * P as usize).map_anon().unwrap();
        for page in 0..12 {
            mem[(page * P) as usize] = 1;
        }
        let start = mem.as_ptr() as u64;
        let map = |first: u64| MemoryMap {
            address: (start + first * P, start + (first + 4) * P),
            perms: MMPermissions::READ | MMPermissions::WRITE | MMPermissions::PRIVATE,
            offset: 0,
            dev: (0, 0),
            inode: 0,
            pathname: MMapPath::Anonymous,
            extension: Default::default(),
        };
        let maps = [map(0), map(4), map(8)];
        let pagemap = Pagemap::open(std::process::id() as Tid).unwrap();
        // (Linux 6.7 and later scan; this project's test machine runs 6.18.)
        let every = PagesThere::scan(&pagemap, &maps, |_| false).expect("PAGEMAP_SCAN (Linux 6.7)");
        assert_eq!(every.runs(start, start + 12 * P, Which::Every), vec![(start, 12)]);
        let middle_left_out = PagesThere::scan(&pagemap, &maps, |m| m.address.0 == start + 4 * P).unwrap();
        assert_eq!(middle_left_out.runs(start, start + 12 * P, Which::Every), vec![(start, 4), (start + 8 * P, 4)]);
        assert!(PagesThere::scan(&pagemap, &maps, |_| true).is_none(), "nothing walked, nothing known");
        drop(mem);
    }

    #[test]
    fn an_increment_copies_what_was_written_and_refers_to_the_rest() {
        const P: u64 = PAGE_SIZE;
        let run = |generation: u64, addr: u64, pages: u64, stream_offset: u64| EarlierRun { generation, run: PageRun { addr, pages, stream_offset } };
        // The base stored pages 0-3 in generation 1 (stream offset 0) and referred pages 6-7 to
        // generation 0 (offset 40 pages in); pages 4-5 were zero.
        let base = vec![run(1, 10 * P, 4, 0), run(0, 16 * P, 2, 40 * P)];
        // Pages 1 and 7 written since; everything tracked.
        let delta = Delta { tracked: vec![(0, 100 * P)], written: vec![(11 * P, 12 * P), (17 * P, 18 * P)], base, ..Default::default() };
        let d = delta.of_mapping(10 * P, 18 * P);
        assert_eq!(d.must, vec![(11 * P, 12 * P), (17 * P, 18 * P)]);
        // Present now: pages 0-1, 3-7 (page 2 dropped by MADV_DONTNEED: stored nowhere).
        let (copy, refer) = split_by_delta(&[(10 * P, 2), (13 * P, 5)], &d);
        assert_eq!(copy, vec![(11 * P, 1), (17 * P, 1)]);
        assert_eq!(
            refer,
            vec![
                run(1, 10 * P, 1, 0),
                run(1, 13 * P, 1, 3 * P),
                // Pages 4 and 5: present, not written, zero in the base: nothing.
                run(0, 16 * P, 1, 40 * P),
            ]
        );
        // Nothing tracked: all present pages copied, nothing referred to.
        let d = Delta { tracked: vec![], written: vec![], base: delta.base.clone(), ..Default::default() }.of_mapping(10 * P, 18 * P);
        assert_eq!(split_by_delta(&[(10 * P, 8)], &d), (vec![(10 * P, 8)], vec![]));
        // The base's content of a mapping is what overlaps it.
        assert_eq!(delta.of_mapping(15 * P, 17 * P).base, vec![run(0, 16 * P, 2, 40 * P)]);
        assert_eq!(delta.of_mapping(14 * P, 16 * P).base, vec![]);
    }

    #[test]
    fn a_delta_cut_to_a_mapping_is_the_delta_of_that_mapping() {
        const P: u64 = PAGE_SIZE;
        // Tracked, written, known and absent ranges spread over 64 pages, sorted and disjoint
        // as the scans give them; every mapping of 1 to 4 pages that could be asked about.
        let delta = Delta {
            tracked: vec![(0, 10 * P), (12 * P, 30 * P), (40 * P, 64 * P)],
            written: vec![(2 * P, 3 * P), (9 * P, 13 * P), (29 * P, 31 * P), (50 * P, 52 * P), (63 * P, 64 * P)],
            known: vec![(0, 30 * P), (41 * P, 64 * P)],
            absent: vec![(5 * P, 6 * P), (20 * P, 25 * P), (60 * P, 62 * P)],
            ..Default::default()
        };
        for start in 0..64 {
            for len in 1..=4 {
                let (s, e) = (start * P, ((start + len) * P).min(64 * P));
                let cut = delta.of_mapping(s, e);
                // What the whole lists give, which the cut must not change.
                let must = crate::objects::dirty::must_store(&delta.tracked, &delta.written, (s, e));
                let vma = [(s, e)];
                let present = crate::objects::dirty::subtract(&vma, &delta.known).is_empty().then(|| crate::objects::dirty::subtract(&vma, &delta.absent));
                assert_eq!((cut.must, cut.present), (must, present), "mapping {s:#x}-{e:#x}");
            }
        }
    }

    #[test]
    fn pages_there_are_cut_to_each_mapping_and_copies_told_from_the_files_pages() {
        use crate::procfs::pagemap_scan::{PageRegion, PAGE_IS_FILE, PAGE_IS_SWAPPED};
        const P: u64 = PAGE_SIZE;
        let region = |start: u64, end: u64, categories: u64| PageRegion { start: start * P, end: end * P, categories };
        // A library's data mapping (pages 10-20): its pages 10-12 the file's, 12-14 copies,
        // 14-15 the file's, 15-16 a copy, 16-17 a copy in swap (or a marker), 17-18 a file's page
        // being moved; a heap after it (20-30) with pages 20-26 there.
        let there = PagesThere(vec![
            region(10, 12, PAGE_IS_FILE),
            region(12, 14, 0),
            region(14, 15, PAGE_IS_FILE),
            region(15, 16, 0),
            region(16, 17, PAGE_IS_SWAPPED),
            region(17, 18, PAGE_IS_SWAPPED | PAGE_IS_FILE),
            region(20, 26, 0),
        ]);
        assert_eq!(there.runs(10 * P, 20 * P, Which::CopiesInMemory), vec![(12 * P, 2), (15 * P, 1)]);
        assert_eq!(there.runs(10 * P, 20 * P, Which::CopiesInSwap), vec![(16 * P, 1)]);
        assert_eq!(there.runs(10 * P, 20 * P, Which::Every), vec![(10 * P, 8)]);
        assert_eq!(there.runs(20 * P, 30 * P, Which::Every), vec![(20 * P, 6)]);
        // A mapping that cuts a region takes its part only; one with nothing there, nothing.
        assert_eq!(there.runs(13 * P, 22 * P, Which::CopiesInMemory), vec![(13 * P, 1), (15 * P, 1), (20 * P, 2)]);
        assert_eq!(there.runs(30 * P, 40 * P, Which::Every), vec![]);
    }

    /// A private file mapping's copies in an incremental generation: those written since the
    /// base are copied, those in memory and not written are referred to the base; swap entries
    /// not written are copied again where the base has a copy (a copy in swap, or one the
    /// program dropped, which reads as the file's now), and left out where it has none (a page
    /// of the file dropped while protected).
    #[test]
    fn copies_in_swap_are_never_referred_to_the_base() {
        const P: u64 = PAGE_SIZE;
        let base = |addr: u64, pages: u64| EarlierRun { generation: 1, run: PageRun { addr: addr * P, pages, stream_offset: addr * P } };
        let delta =
            Delta { tracked: vec![(0, 16 * P)], written: vec![(2 * P, 3 * P), (9 * P, 10 * P)], base: vec![base(0, 4), base(8, 1)], ..Default::default() };
        let d = delta.of_mapping(0, 16 * P);
        // In memory: 0-3 (2 written); in swap: 8-10 (9 written), 12 (no copy in the base).
        let (copy, refer) = split_copies_by_delta(&[(0, 3)], &[(8 * P, 2), (12 * P, 1)], &d);
        assert_eq!(copy, vec![(2 * P, 1), (8 * P, 2)]);
        assert_eq!(refer, vec![base(0, 2)]);
        // Without a delta everything is copied, in address order.
        let copies = OwnCopies { in_memory: vec![(0, 3), (20 * P, 1)], in_swap: vec![(3 * P, 1)] };
        assert_eq!(copies.split(None), (vec![(0, 4), (20 * P, 1)], vec![]));
    }

    #[test]
    fn the_content_of_a_base_holds_its_runs_and_its_references() {
        let vma = VmaRecord {
            start: 0x1000,
            end: 0x9000,
            prot: 3,
            shared: false,
            file_offset: 0,
            backing: Backing::Anon,
            runs: vec![PageRun { addr: 0x5000, pages: 1, stream_offset: 0 }],
            attrs: Default::default(),
            earlier: vec![EarlierRun { generation: 2, run: PageRun { addr: 0x1000, pages: 2, stream_offset: 0x3000 } }],
            guards: Vec::new(),
        };
        let c = content_of(&[vma], 4);
        assert_eq!(c.iter().map(|e| (e.generation, e.run.addr)).collect::<Vec<_>>(), vec![(2, 0x1000), (4, 0x5000)]);
    }

    /// Pages copied before the freeze of generation 4 and not written since are referred to
    /// generation 4 by the capture: they become runs of its stream, in address order; the
    /// references to generation 2 stay; the pages of the delta are found once either way.
    #[test]
    fn guard_pages_are_neither_copied_nor_referred_to() {
        const P: u64 = PAGE_SIZE;
        let guards = [(3 * P, 1), (10 * P, 2)];
        assert_eq!(without_guards(vec![(0, 16)], &guards), vec![(0, 3), (4 * P, 6), (12 * P, 4)]);
        assert_eq!(without_guards(vec![(3 * P, 1), (11 * P, 3)], &guards), vec![(12 * P, 2)]);
        assert_eq!(without_guards(vec![(0, 2)], &[]), vec![(0, 2)]);
        // A reference cut around a guard keeps each piece's place in the earlier stream.
        let earlier = vec![EarlierRun { generation: 4, run: PageRun { addr: 2 * P, pages: 4, stream_offset: 100 * P } }];
        assert_eq!(
            earlier_without_guards(earlier, &guards),
            vec![
                EarlierRun { generation: 4, run: PageRun { addr: 2 * P, pages: 1, stream_offset: 100 * P } },
                EarlierRun { generation: 4, run: PageRun { addr: 4 * P, pages: 2, stream_offset: 102 * P } },
            ]
        );
    }

    #[test]
    fn references_to_the_generations_own_stream_become_runs() {
        const P: u64 = PAGE_SIZE;
        let delta = Delta {
            tracked: vec![(0, 16 * P)],
            written: vec![(3 * P, 4 * P)],
            base: vec![
                EarlierRun { generation: 2, run: PageRun { addr: 0, pages: 2, stream_offset: 0 } },
                EarlierRun { generation: 4, run: PageRun { addr: 2 * P, pages: 6, stream_offset: 10 * P } },
            ],
            ..Default::default()
        };
        let (copy, refer) = split_by_delta(&[(0, 8)], &delta.of_mapping(0, 16 * P));
        assert_eq!(copy, vec![(3 * P, 1)]);
        let mut vma = VmaRecord {
            start: 0,
            end: 16 * P,
            prot: 3,
            shared: false,
            file_offset: 0,
            backing: Backing::Anon,
            runs: vec![PageRun { addr: 3 * P, pages: 1, stream_offset: 20 * P }],
            attrs: Default::default(),
            earlier: refer,
            guards: Vec::new(),
        };
        own_references_to_runs(std::slice::from_mut(&mut vma), 4);
        assert_eq!(vma.earlier, vec![EarlierRun { generation: 2, run: PageRun { addr: 0, pages: 2, stream_offset: 0 } }]);
        assert_eq!(
            vma.runs,
            vec![
                PageRun { addr: 2 * P, pages: 1, stream_offset: 10 * P },
                PageRun { addr: 3 * P, pages: 1, stream_offset: 20 * P },
                PageRun { addr: 4 * P, pages: 4, stream_offset: 12 * P },
            ]
        );
    }

    #[test]
    fn only_private_memory_a_fork_keeps_is_copied_later() {
        let vma = |backing: Backing, shared: bool| VmaRecord {
            start: 0x10_0000,
            end: 0x20_0000,
            prot: (libc::PROT_READ | libc::PROT_WRITE) as u32,
            shared,
            file_offset: 0,
            backing,
            runs: Vec::new(),
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        let file = Backing::File { path: "/lib/x.so".into(), dev: 1, ino: 2, size: 4096, saved: None };
        assert!(can_copy_later(&vma(Backing::Anon, false)));
        assert!(can_copy_later(&vma(Backing::Stack, false)));
        assert!(can_copy_later(&vma(file.clone(), false)), "a private file mapping's own pages");
        assert!(!can_copy_later(&vma(file, true)));
        assert!(!can_copy_later(&vma(Backing::Shmem { ino: 7, memfd_name: None }, true)), "shared memory goes on changing");
        assert!(!can_copy_later(&vma(Backing::Vsyscall, false)));
        let mut dont_fork = vma(Backing::Anon, false);
        dont_fork.attrs.dont_fork = true;
        assert!(!can_copy_later(&dont_fork), "MADV_DONTFORK: the fork does not have it");
        let mut wipe = vma(Backing::Anon, false);
        wipe.attrs.wipe_on_fork = true;
        assert!(!can_copy_later(&wipe), "MADV_WIPEONFORK: the fork has zeros");
    }
}
