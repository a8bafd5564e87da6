//! What a process's memory does besides holding bytes: which mappings are locked in RAM (mlock,
//! mlock2 with MLOCK_ONFAULT, mlockall(MCL_CURRENT)), whether the mappings it makes from now on
//! are (mlockall(MCL_FUTURE), with or without MCL_ONFAULT), the madvise flags that change what
//! fork, core dumps and the memory manager do with a mapping, the mmap flags that stay with a
//! mapping (MAP_NORESERVE, MAP_GROWSDOWN), and its membarrier registrations.
//!
//! **Capture.**
//! - Per mapping, the `VmFlags` line of /proc/PID/smaps (mnemonics from the kernel's
//!   Documentation/filesystems/proc.rst): `lo` locked (VM_LOCKED), `lf` locked on fault
//!   (VM_LOCKONFAULT), `dc` not copied on fork (MADV_DONTFORK), `wf` wiped on fork
//!   (MADV_WIPEONFORK), `dd` left out of core dumps (MADV_DONTDUMP), `hg` / `nh` huge pages
//!   asked for / refused (MADV_HUGEPAGE / MADV_NOHUGEPAGE), `sr` / `rr` sequential / random reads
//!   expected (MADV_SEQUENTIAL / MADV_RANDOM), `mg` offered to KSM (MADV_MERGEABLE), `nr` no
//!   swap space reserved (MAP_NORESERVE),
//!   `gd` grows down (MAP_GROWSDOWN). The kernel's own mappings (vdso, vvar, vsyscall)
//!   are left out: the kernel sets their flags. mlockall(MCL_CURRENT) is nothing more than every
//!   mapping of the moment locked, and comes back as that.
//! - MCL_FUTURE is the kernel's `mm->def_flags`, which /proc does not show; it shows in what a
//!   new mapping gets. The capture maps its scratch area into the process anyway (see
//!   [`crate::capture`]), and keeps one page of it untouched: the process asks
//!   `madvise(MADV_DONTNEED)` of that page with its other questions, which the kernel refuses
//!   with EINVAL for a locked mapping only (since Linux 2.6; a locked range cannot be dropped,
//!   MADV_DONTNEED_LOCKED aside) and does nothing to an untouched one. Refused, the process
//!   locks what it maps; and if the page was faulted in at once (the mmap populates a locked
//!   mapping), without MCL_ONFAULT. One call among the questions, where reading `VmLck` before
//!   and after the mapping took a read of the status file (about 0.06 ms a process). (A process
//!   that locks what it maps and has reached its RLIMIT_MEMLOCK cannot be given that area: its
//!   checkpoint fails, saying so.)
//! - membarrier: `MEMBARRIER_CMD_GET_REGISTRATIONS` (Linux 6.3) tells whether the process
//!   registered to receive global expedited barriers. The private registrations are probed
//!   instead, by issuing each private command in the process: it fails with EPERM until the
//!   process registered for it. (GET_REGISTRATIONS reports the private expedited registration
//!   for a process that registered only the sync-core or rseq flavour, for which the kernel
//!   sets part of that state too: restored from it, `membarrier(PRIVATE_EXPEDITED)` would work
//!   where it failed.) The probes' barriers are harmless: every thread is stopped, so no other
//!   CPU runs the process, and an extra barrier never breaks a program.
//!
//! **Restore.**
//! - mmap flags ([`VmaAttrs::mmap_flags`]) in the mmap that makes the mapping
//!   (`memory::map_all`): a huge MAP_NORESERVE reservation (a JVM's or Go's heap, a sanitizer's
//!   shadow memory) is refused without it under the kernel's default overcommit heuristic.
//! - madvise flags ([`advise`]) right after the mappings are made, before their pages are
//!   written, so that a MADV_HUGEPAGE range is filled with huge pages as it was.
//! - membarrier registrations ([`restore_membarrier`]) before the threads are made again
//!   (registering is cheaper while the process has one thread). On a kernel before 6.3 the
//!   capture cannot tell whether the process registered for global expedited barriers; the
//!   restart then registers it: being registered only makes the process receive the barriers
//!   other programs ask for with MEMBARRIER_CMD_GLOBAL_EXPEDITED (an interrupt when it is
//!   running), which no program can observe on such a kernel, while a registration lost would
//!   make a program that relies on it miss barriers silently.
//! - locks ([`restore_locks`]) last but one, once the memory is in place and the resource limits
//!   are the job's (RLIMIT_MEMLOCK), before the credentials are lowered (a root job may lock
//!   beyond its limit with CAP_IPC_LOCK): mlock2 per run of locked mappings, then mlockall
//!   (MCL_FUTURE) after everything the restorer maps. A process that lowered its soft limit
//!   below what it had locked is locked under its hard limit, then given its soft limit back. A
//!   lock the kernel refuses stops the restart with [`Error::MemoryLock`], naming the limit;
//!   memory is never left unlocked silently.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::memory::VmaRecord;
use crate::error::{Context, Error, Result};
use crate::procfs::Pagemap;
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{RemoteTask, Tid};
use crate::PAGE_SIZE;

/// Whether memory is locked in RAM.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum Lock {
    #[default]
    Unlocked,
    /// Every page faulted in and kept in RAM (mlock, mlockall).
    Locked,
    /// Pages kept in RAM once touched (mlock2 MLOCK_ONFAULT, mlockall MCL_ONFAULT).
    OnFault,
}

/// MADV_HUGEPAGE / MADV_NOHUGEPAGE.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum HugePages {
    #[default]
    AsSystem,
    Wanted,
    Refused,
}

/// MADV_SEQUENTIAL / MADV_RANDOM.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub enum ReadAhead {
    #[default]
    Normal,
    Sequential,
    Random,
}

/// The flags of one mapping that change what the kernel does with it.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmaAttrs {
    pub lock: Lock,
    /// MADV_DONTFORK: a child does not get the mapping.
    pub dont_fork: bool,
    /// MADV_WIPEONFORK: a child gets it zero-filled (private anonymous memory only).
    pub wipe_on_fork: bool,
    /// MADV_DONTDUMP: left out of core dumps.
    pub dont_dump: bool,
    pub huge_pages: HugePages,
    pub read_ahead: ReadAhead,
    /// MAP_NORESERVE (VM_NORESERVE): no swap space reserved for it, so the kernel's overcommit
    /// check does not count it (format 9; false in older images).
    pub no_reserve: bool,
    /// MAP_GROWSDOWN (VM_GROWSDOWN): a fault just below it extends it, as the main stack's
    /// (format 9; false in older images, whose main stack grows down all the same).
    pub grows_down: bool,
    /// MADV_MERGEABLE (`mg`): its pages offered to KSM (kernel same-page merging), as virtual
    /// machine monitors and zdtm's maps02 ask. Format 31 (false in older images).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub mergeable: bool,
    /// VM_MAYWRITE (`mw`) of a shared mapping: its file was opened for writing, so the program
    /// may make a read-only mapping writable (mprotect), as zdtm's maps_file_prot does. Kept
    /// for shared mappings only (every private one may be written). Format 31 (false in older
    /// images, whose read-only shared file mappings came back from files opened read-only).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub may_write: bool,
    /// MAP_DROPPABLE (`dp`): read from smaps for the capture, which records the mapping as
    /// [`super::memory::Backing::Droppable`]; not a flag of the record.
    #[serde(skip)]
    pub droppable: bool,
}

/// [`VmaAttrs`] as images of formats 7 and 8 hold it, without the mmap flags (postcard is
/// positional: the old layout is decoded by its own type, see `snapshot`).
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct VmaAttrsV8 {
    lock: Lock,
    dont_fork: bool,
    wipe_on_fork: bool,
    dont_dump: bool,
    huge_pages: HugePages,
    read_ahead: ReadAhead,
}

impl From<VmaAttrsV8> for VmaAttrs {
    fn from(v: VmaAttrsV8) -> VmaAttrs {
        let VmaAttrsV8 { lock, dont_fork, wipe_on_fork, dont_dump, huge_pages, read_ahead } = v;
        VmaAttrs {
            lock,
            dont_fork,
            wipe_on_fork,
            dont_dump,
            huge_pages,
            read_ahead,
            no_reserve: false,
            grows_down: false,
            mergeable: false,
            may_write: false,
            droppable: false,
        }
    }
}

impl VmaAttrs {
    /// From the mnemonics of a smaps `VmFlags` line. Pure.
    pub fn from_vm_flags<'a>(flags: impl IntoIterator<Item = &'a str>) -> VmaAttrs {
        let mut a = VmaAttrs::default();
        let (mut locked, mut on_fault, mut may_write, mut shared) = (false, false, false, false);
        for f in flags {
            match f {
                "lo" => locked = true,
                "lf" => on_fault = true,
                "dc" => a.dont_fork = true,
                "wf" => a.wipe_on_fork = true,
                "dd" => a.dont_dump = true,
                "hg" => a.huge_pages = HugePages::Wanted,
                "nh" => a.huge_pages = HugePages::Refused,
                "sr" => a.read_ahead = ReadAhead::Sequential,
                "rr" => a.read_ahead = ReadAhead::Random,
                "nr" => a.no_reserve = true,
                "gd" => a.grows_down = true,
                "dp" => a.droppable = true,
                "mg" => a.mergeable = true,
                "mw" => may_write = true,
                "sh" => shared = true,
                _ => {}
            }
        }
        // (Every private mapping may be written.)
        a.may_write = may_write && shared;
        // VM_LOCKONFAULT comes with VM_LOCKED; alone it locks nothing.
        a.lock = match (locked, on_fault) {
            (true, true) => Lock::OnFault,
            (true, false) => Lock::Locked,
            _ => Lock::Unlocked,
        };
        a
    }

    /// The flags the mmap that makes the mapping again needs besides its kind (MAP_PRIVATE,
    /// MAP_SHARED, MAP_ANONYMOUS) and MAP_FIXED. Pure.
    ///
    /// Of the mmap flags, only these two leave a mark on the mapping that changes what the
    /// program sees later: without MAP_NORESERVE a writable private mapping is charged to the
    /// commit limit whole (a 64 GiB reservation fails on a smaller machine), without
    /// MAP_GROWSDOWN a fault below the mapping is a SIGSEGV. The others are left, each for its
    /// reason: MAP_LOCKED is VM_LOCKED (`lo`), locked again by [`restore_locks`]; MAP_POPULATE,
    /// MAP_32BIT, MAP_FIXED(_NOREPLACE) and MAP_UNINITIALIZED act once, at the mmap (the address
    /// is kept anyway); MAP_STACK is nothing more than `nh` since Linux 6.7 (restored by
    /// [`advise`]); MAP_HUGETLB (`ht`) is a kind of memory more than a flag (a private one is
    /// refused at the checkpoint as a deleted /anon_hugepage file, a shared one comes back as
    /// shared memory of ordinary pages); MAP_SYNC (`sf`) exists only for files on DAX, which the
    /// capture does not tell apart; MAP_DROPPABLE (`dp`, Linux 6.11) is a kind of memory too
    /// ([`super::memory::Backing::Droppable`]), mapped with the `nr` it implies from here (its
    /// `wf` and `dd` are advised after).
    pub fn mmap_flags(&self) -> i32 {
        let mut flags = 0;
        if self.no_reserve {
            flags |= libc::MAP_NORESERVE;
        }
        if self.grows_down {
            flags |= libc::MAP_GROWSDOWN;
        }
        flags
    }
}

/// The process-wide part.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemAttrsRecord {
    /// mlockall(MCL_FUTURE): how the mappings it makes from now on are locked.
    pub future_lock: Lock,
    pub membarrier: MembarrierRecord,
}

/// The membarrier commands the process registered for.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MembarrierRecord {
    pub private_expedited: bool,
    pub private_expedited_sync_core: bool,
    pub private_expedited_rseq: bool,
    /// None: the kernel could not tell (before Linux 6.3); the restart registers it then.
    pub global_expedited: Option<bool>,
}

// include/uapi/linux/membarrier.h (GET_REGISTRATIONS is newer than the headers of this machine).
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: u64 = 1 << 2;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: u64 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: u64 = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: u64 = 1 << 6;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: u64 = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: u64 = 1 << 8;
const MEMBARRIER_CMD_GET_REGISTRATIONS: u64 = 1 << 9;

// include/uapi/asm-generic/mman-common.h
const MLOCK_ONFAULT: u64 = 1;
const MCL_FUTURE: u64 = 2;
const MCL_ONFAULT: u64 = 4;

const RLIMIT_MEMLOCK: u32 = 8;

// ---------------------------------------------------------------------------------------------
// Capture
// ---------------------------------------------------------------------------------------------

/// The flags of every mapping of a stopped process, by start address, from /proc/PID/smaps.
pub fn capture_vmas(pid: Tid) -> Result<HashMap<u64, VmaAttrs>> {
    let (path, text) = read_smaps(pid)?;
    parse_smaps(&text).ok_or_else(|| no_flags(&path))
}

/// The text of /proc/PID/smaps, and its path for messages.
fn read_smaps(pid: Tid) -> Result<(String, String)> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&path).context(|| format!("read {path}"))?;
    Ok((path, text))
}

fn no_flags(path: &str) -> Error {
    Error::Other(format!("{path}: a mapping without a VmFlags line"))
}

/// The flags of a running process's mappings, read just before the job is frozen: smaps walks
/// every page of every mapping (some 6 ms per GiB resident here), which the job need not wait
/// for. They serve the capture if the mappings are still laid out as they were (the frozen
/// process's /proc/PID/maps says, cheaply); otherwise smaps is read again, frozen. A flag
/// changed without a change of layout (madvise or mlock of a whole mapping) in the moment
/// between the read and the freeze is caught after the release by [`FlagsAhead::changed_since`],
/// which makes the checkpoint fail rather than record flags the process no longer had.
#[derive(Debug, Clone)]
pub struct FlagsAhead {
    /// The mappings, as /proc/PID/maps shows them (smaps starts each mapping with the same line).
    layout: Vec<crate::procfs::MemoryMap>,
    attrs: HashMap<u64, VmaAttrs>,
}

impl FlagsAhead {
    /// Reads the flags of process `pid`'s mappings now.
    pub fn read(pid: Tid) -> Result<FlagsAhead> {
        let (path, text) = read_smaps(pid)?;
        FlagsAhead::parse(&text).ok_or_else(|| no_flags(&path))
    }

    /// Pure.
    fn parse(smaps: &str) -> Option<FlagsAhead> {
        let attrs = parse_smaps(smaps)?;
        let lines: String = smaps.lines().filter(|l| is_mapping_line(l)).flat_map(|l| [l, "\n"]).collect();
        let layout = crate::procfs::parse_maps(&lines).ok()?;
        Some(FlagsAhead { layout, attrs })
    }

    /// The flags by mapping start, if `maps` (the mappings of the process, now frozen) are laid
    /// out as when they were read. (A name the kernel's text escapes, a newline, which
    /// PROCMAP_QUERY gives raw, reads as another layout: the flags are read again, slower, not
    /// wrong.)
    pub fn if_same_layout(&self, maps: &[crate::procfs::MemoryMap]) -> Option<&HashMap<u64, VmaAttrs>> {
        (maps == self.layout).then_some(&self.attrs)
    }

    pub fn attrs(&self) -> &HashMap<u64, VmaAttrs> {
        &self.attrs
    }

    /// After the release: the mappings of process `pid` laid out as when the flags were read
    /// whose flags differ now (their start addresses). Not empty: a flag changed, before or
    /// after the freeze, and which of the two the capture recorded cannot be told.
    /// None: the process ended meanwhile (its smaps is gone, or it lost its memory on the way
    /// out: ESRCH), and nothing of it runs on with other flags.
    pub fn changed_since(&self, pid: Tid) -> Result<Option<Vec<u64>>> {
        let path = format!("/proc/{pid}/smaps");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
            Err(e) => return Err(e).context(|| format!("read {path}")),
        };
        let now = FlagsAhead::parse(&text).ok_or_else(|| no_flags(&path))?;
        Ok(Some(self.changed_in(&now)))
    }

    /// Pure.
    fn changed_in(&self, now: &FlagsAhead) -> Vec<u64> {
        let before: HashMap<u64, &crate::procfs::MemoryMap> = self.layout.iter().map(|m| (m.address.0, m)).collect();
        let mut changed: Vec<u64> = now
            .layout
            .iter()
            .filter(|m| before.get(&m.address.0) == Some(m))
            .map(|m| m.address.0)
            .filter(|start| self.attrs.get(start) != now.attrs.get(start))
            .collect();
        changed.sort_unstable();
        changed
    }
}

/// Whether a line of smaps starts a mapping ("start-end perms offset dev inode path"), rather
/// than being one of its "Name: value" lines. Pure.
fn is_mapping_line(line: &str) -> bool {
    line.split_whitespace().next().is_some_and(|first| !first.ends_with(':'))
}

/// Each mapping's start and flags, from the text of a smaps file; None if a mapping has no
/// VmFlags line (kernels before 3.8). Pure.
fn parse_smaps(text: &str) -> Option<HashMap<u64, VmaAttrs>> {
    let mut out = HashMap::new();
    let mut current: Option<u64> = None;
    for line in text.lines() {
        let Some(first) = line.split_whitespace().next() else { continue };
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            out.insert(current.take()?, VmaAttrs::from_vm_flags(flags.split_whitespace()));
        } else if is_mapping_line(line) {
            // A mapping's first line: "start-end perms offset dev inode path".
            if current.is_some() {
                return None;
            }
            current = Some(u64::from_str_radix(first.split('-').next()?, 16).ok()?);
        }
    }
    current.is_none().then_some(out)
}

/// How the process locks the mappings it makes, told by a page of one it has just made, which
/// nothing has touched since: whether the page could be dropped (`MADV_DONTNEED` refused means
/// locked) and whether it was there (a locked mapping is faulted in at once without
/// MCL_ONFAULT). Pure.
fn future_lock(dropped: bool, present: bool) -> Lock {
    match (dropped, present) {
        (true, _) => Lock::Unlocked,
        (false, true) => Lock::Locked,
        (false, false) => Lock::OnFault,
    }
}

/// The calls [`capture`] reads the answers of: the lock probe and the membarrier probes.
pub struct MemAttrsAsked {
    /// `madvise(MADV_DONTNEED)` of the untouched page.
    fresh_dropped: Asked,
    fresh: u64,
    private_expedited: Asked,
    private_expedited_sync_core: Asked,
    private_expedited_rseq: Asked,
    registrations: Asked,
}

/// Asks the stopped process whether it locks what it maps, by `fresh`, a page the capture has
/// just mapped in it and that nothing touches, and its membarrier registrations (see the
/// module's comment).
pub fn ask(q: &mut Questions, fresh: u64) -> MemAttrsAsked {
    let probe = |q: &mut Questions, name, cmd| q.ask(name, libc::SYS_membarrier, &[cmd, 0, 0]);
    MemAttrsAsked {
        fresh_dropped: q.ask("madvise(MADV_DONTNEED) of a fresh page", libc::SYS_madvise, &[fresh, PAGE_SIZE, libc::MADV_DONTNEED as u64]),
        fresh,
        private_expedited: probe(q, "membarrier(PRIVATE_EXPEDITED)", MEMBARRIER_CMD_PRIVATE_EXPEDITED),
        private_expedited_sync_core: probe(q, "membarrier(PRIVATE_EXPEDITED_SYNC_CORE)", MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE),
        private_expedited_rseq: probe(q, "membarrier(PRIVATE_EXPEDITED_RSEQ)", MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ),
        registrations: probe(q, "membarrier(GET_REGISTRATIONS)", MEMBARRIER_CMD_GET_REGISTRATIONS),
    }
}

/// The process-wide record, from the answers to [`ask`]. Only where the fresh page could not
/// be dropped (a process that locks what it maps: rare) is its presence read, from the pagemap.
pub fn capture(pid: Tid, answers: &Answers, asked: &MemAttrsAsked) -> Result<MemAttrsRecord> {
    let dropped = match answers.value(asked.fresh_dropped) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => false,
        Err(e) => return Err(Error::from(e).of_object(pid, "tell whether it locks what it maps")),
    };
    let present = !dropped && {
        let fresh = asked.fresh;
        Pagemap::open(pid)?.range(fresh, fresh + PAGE_SIZE).context(|| format!("read pagemap of pid {pid} at {fresh:#x}"))?.first().is_some_and(|f| f.present())
    };
    Ok(MemAttrsRecord { future_lock: future_lock(dropped, present), membarrier: capture_membarrier(pid, answers, asked)? })
}

fn capture_membarrier(pid: Tid, answers: &Answers, asked: &MemAttrsAsked) -> Result<MembarrierRecord> {
    use std::io::ErrorKind;
    let probed = |a: Asked| -> Result<bool> {
        match answers.value(a) {
            Ok(_) => Ok(true),
            // EPERM: not registered; EINVAL, ENOSYS: not in this kernel, so not registered.
            Err(e) if matches!(e.kind(), ErrorKind::PermissionDenied | ErrorKind::InvalidInput | ErrorKind::Unsupported) => Ok(false),
            Err(e) => Err(Error::from(e).of_object(pid, "probe its membarrier registrations")),
        }
    };
    let private_expedited = probed(asked.private_expedited)?;
    let private_expedited_sync_core = probed(asked.private_expedited_sync_core)?;
    let private_expedited_rseq = probed(asked.private_expedited_rseq)?;
    let global_expedited = match answers.value(asked.registrations) {
        Ok(mask) => Some(mask & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED != 0),
        // No membarrier at all: nothing registered.
        Err(e) if e.kind() == ErrorKind::Unsupported => Some(false),
        // Before Linux 6.3.
        Err(e) if e.kind() == ErrorKind::InvalidInput => None,
        Err(e) => return Err(Error::from(e).of_object(pid, "ask its membarrier registrations")),
    };
    Ok(MembarrierRecord { private_expedited, private_expedited_sync_core, private_expedited_rseq, global_expedited })
}

// ---------------------------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------------------------

/// One madvise call: `[start, end)` and the advice, with its name for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advice {
    pub start: u64,
    pub end: u64,
    pub advice: i32,
    pub name: &'static str,
}

/// The madvise calls that give the mappings their flags back, one per run of adjacent mappings
/// with the same flag (kernel mappings left out). Pure.
pub fn advice_runs(vmas: &[VmaRecord]) -> Vec<Advice> {
    type Wants = fn(&VmaAttrs) -> bool;
    let table: [(Wants, i32, &'static str); 8] = [
        (|a| a.dont_fork, libc::MADV_DONTFORK, "MADV_DONTFORK"),
        (|a| a.wipe_on_fork, libc::MADV_WIPEONFORK, "MADV_WIPEONFORK"),
        (|a| a.dont_dump, libc::MADV_DONTDUMP, "MADV_DONTDUMP"),
        (|a| a.huge_pages == HugePages::Wanted, libc::MADV_HUGEPAGE, "MADV_HUGEPAGE"),
        (|a| a.huge_pages == HugePages::Refused, libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE"),
        (|a| a.read_ahead == ReadAhead::Sequential, libc::MADV_SEQUENTIAL, "MADV_SEQUENTIAL"),
        (|a| a.read_ahead == ReadAhead::Random, libc::MADV_RANDOM, "MADV_RANDOM"),
        (|a| a.mergeable, libc::MADV_MERGEABLE, "MADV_MERGEABLE"),
    ];
    let mut out = Vec::new();
    for (wants, advice, name) in table {
        for (start, end) in runs(vmas, |v| wants(&v.attrs)) {
            out.push(Advice { start, end, advice, name });
        }
    }
    out
}

/// `[start, end)` of each run of adjacent mappings (kernel ones left out) that pass `wanted`.
fn runs(vmas: &[VmaRecord], wanted: impl Fn(&VmaRecord) -> bool) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in vmas.iter().filter(|v| !v.is_kernel_special() && wanted(v)) {
        match out.last_mut() {
            Some(last) if last.1 == v.start => last.1 = v.end,
            _ => out.push((v.start, v.end)),
        }
    }
    out
}

/// Gives the mappings of a process (pid `ns_pid` in the job) their madvise flags back, from
/// inside it.
pub fn advise(task: &mut RemoteTask, ns_pid: Tid, vmas: &[VmaRecord]) -> Result<()> {
    for a in advice_runs(vmas) {
        let len = a.end - a.start;
        match task.syscall(a.name, libc::SYS_madvise, &[a.start, len, a.advice as u64]) {
            Ok(_) => {}
            // A kernel without transparent huge pages refuses these hints; nothing else changes.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && matches!(a.advice, libc::MADV_HUGEPAGE | libc::MADV_NOHUGEPAGE) => {
                warn!(pid = ns_pid, start = a.start, end = a.end, "{} not restored: this kernel has no transparent huge pages ({e})", a.name);
            }
            // Nor without KSM (a restart on another kernel); the pages are only not merged.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && a.advice == libc::MADV_MERGEABLE => {
                warn!(pid = ns_pid, start = a.start, end = a.end, "{} not restored: this kernel has no KSM ({e})", a.name);
            }
            Err(e) => return Err(Error::Other(format!("madvise {:#x}-{:#x} {}: {e}", a.start, a.end, a.name))),
        }
    }
    Ok(())
}

/// Registers the process for the membarrier commands it had registered for.
pub fn restore_membarrier(task: &mut RemoteTask, ns_pid: Tid, rec: &MembarrierRecord) -> Result<()> {
    let private = [
        (rec.private_expedited, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, "membarrier(REGISTER_PRIVATE_EXPEDITED)"),
        (rec.private_expedited_sync_core, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, "membarrier(REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)"),
        (rec.private_expedited_rseq, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, "membarrier(REGISTER_PRIVATE_EXPEDITED_RSEQ)"),
    ];
    for (_, cmd, name) in private.into_iter().filter(|p| p.0) {
        task.syscall(name, libc::SYS_membarrier, &[cmd, 0, 0]).map_err(|e| Error::Other(format!("{name}, which the program had made: {e}")))?;
    }
    if rec.global_expedited == Some(false) {
        return Ok(());
    }
    let global = "membarrier(REGISTER_GLOBAL_EXPEDITED)";
    match task.syscall(global, libc::SYS_membarrier, &[MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0]) {
        Ok(_) => Ok(()),
        // Unknown whether the program had it (see the module's comment): best effort.
        Err(e) if rec.global_expedited.is_none() => {
            debug!(pid = ns_pid, "{global}: {e}");
            Ok(())
        }
        Err(e) => Err(Error::Other(format!("{global}, which the program had made: {e}"))),
    }
}

/// One mlock2 call: `[start, end)` and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockRun {
    pub start: u64,
    pub end: u64,
    pub on_fault: bool,
}

/// The mlock2 calls that lock the mappings again, one per run of adjacent mappings locked the
/// same way (kernel mappings left out). Pure.
pub fn lock_runs(vmas: &[VmaRecord]) -> Vec<LockRun> {
    let mut out = Vec::new();
    for (lock, on_fault) in [(Lock::Locked, false), (Lock::OnFault, true)] {
        out.extend(runs(vmas, |v| v.attrs.lock == lock).into_iter().map(|(start, end)| LockRun { start, end, on_fault }));
    }
    out.sort_by_key(|r| r.start);
    out
}

/// What stopped a lock, for [`Error::MemoryLock`]: the limit when it is what refused (the
/// process may lock `limit` bytes, RLIMIT_MEMLOCK, and needs `needed`). Pure.
fn lock_problem(e: &std::io::Error, limit: Option<u64>, needed: u64) -> String {
    use std::io::ErrorKind;
    let by_limit = matches!(e.kind(), ErrorKind::OutOfMemory | ErrorKind::PermissionDenied | ErrorKind::WouldBlock);
    match limit {
        Some(limit) if by_limit && limit != libc::RLIM_INFINITY && limit < needed => format!(
            "the job had {} KiB locked and its RLIMIT_MEMLOCK allows {} KiB ({e}); raise the limit of the user who restarts \
             (`ulimit -l`, memlock in /etc/security/limits.conf) to at least {} KiB, or restart as root",
            needed.div_ceil(1024),
            limit / 1024,
            needed.div_ceil(1024)
        ),
        _ => e.to_string(),
    }
}

/// Locks the mappings that were locked, and the process's future mappings if they were, from
/// inside it, whose resource limits are already the job's: `memlock` is its RLIMIT_MEMLOCK
/// (soft, hard). A process may hold more locked memory than its soft limit allows now (it
/// lowered the limit after locking): the locks are taken under the hard limit, and the soft one
/// put back after.
pub fn restore_locks(task: &mut RemoteTask, ns_pid: Tid, vmas: &[VmaRecord], rec: &MemAttrsRecord, memlock: Option<(u64, u64)>) -> Result<()> {
    let runs = lock_runs(vmas);
    if runs.is_empty() && rec.future_lock == Lock::Unlocked {
        return Ok(());
    }
    let raise = memlock.filter(|(soft, hard)| soft < hard);
    if let Some((_, hard)) = raise {
        set_memlock(task, hard, hard)?;
    }
    let locked = lock(task, ns_pid, &runs, rec.future_lock, memlock.map(|(soft, hard)| if raise.is_some() { hard } else { soft }));
    if let Some((soft, hard)) = raise {
        set_memlock(task, soft, hard)?;
    }
    locked
}

/// prlimit64(RLIMIT_MEMLOCK) of the process, from inside.
fn set_memlock(task: &mut RemoteTask, soft: u64, hard: u64) -> Result<()> {
    let limit: Vec<u8> = [soft, hard].iter().flat_map(|v| v.to_le_bytes()).collect();
    let addr = task.put(0, &limit)?;
    task.syscall("prlimit64(RLIMIT_MEMLOCK)", libc::SYS_prlimit64, &[0, RLIMIT_MEMLOCK as u64, addr, 0])
        .map_err(|e| Error::Other(format!("set RLIMIT_MEMLOCK to {soft}/{hard} for its locked memory: {e}")))?;
    Ok(())
}

/// mlock2 per run, then mlockall(MCL_FUTURE) if `future`; `limit`: the RLIMIT_MEMLOCK in force.
fn lock(task: &mut RemoteTask, ns_pid: Tid, runs: &[LockRun], future: Lock, limit: Option<u64>) -> Result<()> {
    let needed = runs.iter().fold(0u64, |acc, r| acc.saturating_add(r.end - r.start));
    for r in runs {
        let flags = if r.on_fault { MLOCK_ONFAULT } else { 0 };
        let name = if r.on_fault { "mlock2(MLOCK_ONFAULT)" } else { "mlock2" };
        task.syscall(name, libc::SYS_mlock2, &[r.start, r.end - r.start, flags]).map_err(|e| Error::MemoryLock {
            pid: ns_pid,
            what: format!("{:#x}-{:#x} ({} KiB, {name})", r.start, r.end, (r.end - r.start) / 1024),
            problem: lock_problem(&e, limit, needed),
        })?;
    }
    let flags = match future {
        Lock::Unlocked => return Ok(()),
        Lock::Locked => MCL_FUTURE,
        Lock::OnFault => MCL_FUTURE | MCL_ONFAULT,
    };
    task.syscall("mlockall", libc::SYS_mlockall, &[flags]).map_err(|e| Error::MemoryLock {
        pid: ns_pid,
        what: "every future mapping (mlockall MCL_FUTURE)".into(),
        problem: lock_problem(&e, limit, needed.max(1)),
    })?;
    Ok(())
}

/// What a process's record says of its memory attributes, for `ckpt inspect`: locked bytes and
/// how, bytes under each madvise flag and under MAP_NORESERVE, membarrier registrations; empty
/// when nothing is set. Pure.
pub fn describe(vmas: &[VmaRecord], rec: &MemAttrsRecord) -> Vec<String> {
    let bytes = |r: &[(u64, u64)]| r.iter().fold(0u64, |acc, (s, e)| acc.saturating_add(e.saturating_sub(*s)));
    let mut out = Vec::new();
    let locked: Vec<(u64, u64)> = lock_runs(vmas).iter().map(|r| (r.start, r.end)).collect();
    if !locked.is_empty() {
        out.push(format!("locked {} KiB", bytes(&locked) / 1024));
    }
    match rec.future_lock {
        Lock::Unlocked => {}
        Lock::Locked => out.push("mlockall(MCL_FUTURE)".into()),
        Lock::OnFault => out.push("mlockall(MCL_FUTURE|MCL_ONFAULT)".into()),
    }
    let mut advised: Vec<(&str, u64)> = Vec::new();
    for a in advice_runs(vmas) {
        match advised.iter_mut().find(|(n, _)| *n == a.name) {
            Some((_, b)) => *b = b.saturating_add(a.end - a.start),
            None => advised.push((a.name, a.end - a.start)),
        }
    }
    out.extend(advised.iter().map(|(n, b)| format!("{n} {} KiB", b / 1024)));
    let unreserved = runs(vmas, |v| v.attrs.no_reserve);
    if !unreserved.is_empty() {
        out.push(format!("MAP_NORESERVE {} KiB", bytes(&unreserved) / 1024));
    }
    let m = &rec.membarrier;
    for (on, name) in [
        (m.private_expedited, "membarrier private expedited"),
        (m.private_expedited_sync_core, "membarrier sync-core"),
        (m.private_expedited_rseq, "membarrier rseq"),
        (m.global_expedited == Some(true), "membarrier global expedited"),
    ] {
        if on {
            out.push(name.into());
        }
    }
    out
}

/// RLIMIT_MEMLOCK (soft, hard) among recorded resource limits.
pub fn memlock_limit(rlimits: &[(u32, u64, u64)]) -> Option<(u64, u64)> {
    rlimits.iter().find(|r| r.0 == RLIMIT_MEMLOCK).map(|r| (r.1, r.2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::memory::Backing;

    const SMAPS: &str = "\
55d0c0000000-55d0c0001000 r--p 00000000 08:01 1234                       /usr/bin/prog
Size:                  4 kB
Locked:                0 kB
VmFlags: rd mr mw me dw sd
7f0000000000-7f0000010000 rw-p 00000000 00:00 0 
Size:                 64 kB
Locked:               64 kB
VmFlags: rd wr mr mw me lo ac sd dc dd
7f0000010000-7f0000020000 rw-p 00000000 00:00 0 
Locked:                0 kB
VmFlags: rd wr mr mw me lo lf ac sd wf hg sr
7f0000020000-7f0000030000 rw-s 00000000 00:01 77                         /dev/zero (deleted)
VmFlags: rd wr sh mr mw me ms sd nh rr
7f1000000000-7f5000000000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me nr sd
7f5000000000-7f5000004000 rw-p 00000000 00:00 0 
VmFlags: rd wr mr mw me gd ac sd
";

    #[test]
    fn smaps_flags_by_mapping() {
        let m = parse_smaps(SMAPS).unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[&0x55d0_c000_0000], VmaAttrs::default());
        let a = m[&0x7f00_0000_0000];
        assert_eq!((a.lock, a.dont_fork, a.dont_dump, a.wipe_on_fork), (Lock::Locked, true, true, false));
        let b = m[&0x7f00_0001_0000];
        assert_eq!((b.lock, b.wipe_on_fork, b.huge_pages, b.read_ahead), (Lock::OnFault, true, HugePages::Wanted, ReadAhead::Sequential));
        let c = m[&0x7f00_0002_0000];
        assert_eq!((c.lock, c.huge_pages, c.read_ahead), (Lock::Unlocked, HugePages::Refused, ReadAhead::Random));
        assert!(!a.no_reserve && !a.grows_down && !c.no_reserve);
        let reserved = m[&0x7f10_0000_0000];
        assert_eq!(reserved, VmaAttrs { no_reserve: true, ..Default::default() });
        assert_eq!(reserved.mmap_flags(), libc::MAP_NORESERVE);
        let grows = m[&0x7f50_0000_0000];
        assert_eq!(grows, VmaAttrs { grows_down: true, ..Default::default() });
        assert_eq!(grows.mmap_flags(), libc::MAP_GROWSDOWN);
        assert_eq!(VmaAttrs::default().mmap_flags(), 0);
    }

    #[test]
    fn flags_read_ahead_serve_an_unchanged_layout_and_tell_what_changed() {
        let ahead = FlagsAhead::parse(SMAPS).unwrap();
        let maps: String =
            SMAPS.lines().filter(|l| !l.contains(':') || l.contains('-')).filter(|l| !l.starts_with("VmFlags")).map(|l| format!("{l}\n")).collect();
        assert_eq!(maps.lines().count(), 6);
        let parsed = |text: &str| crate::procfs::parse_maps(text).unwrap();
        assert_eq!(ahead.if_same_layout(&parsed(&maps)).map(|a| a.len()), Some(6));
        // The heap grew: another layout, the flags are read again.
        let grown = maps.replace("7f5000004000", "7f5000008000");
        assert!(ahead.if_same_layout(&parsed(&grown)).is_none());
        // Flags changed on a mapping of the same line; another one's line changed (not compared).
        let now = SMAPS.replace("lo lf ac sd wf hg sr", "lo lf ac sd hg sr").replace("gd ac sd", "gd ac sd dd").replace("7f5000004000", "7f5000008000");
        assert_eq!(ahead.changed_in(&FlagsAhead::parse(&now).unwrap()), vec![0x7f00_0001_0000]);
        assert!(ahead.changed_in(&ahead).is_empty());
    }

    #[test]
    fn smaps_without_flags_is_refused() {
        assert!(parse_smaps("7f0000000000-7f0000010000 rw-p 00000000 00:00 0\nSize: 64 kB\n").is_none());
        let two_headers = "7f0000000000-7f0000010000 rw-p 00000000 00:00 0\n7f0000010000-7f0000020000 rw-p 00000000 00:00 0\nVmFlags: rd\n";
        assert!(parse_smaps(two_headers).is_none());
        assert_eq!(parse_smaps("").unwrap().len(), 0);
    }

    #[test]
    fn lock_on_fault_alone_is_no_lock() {
        assert_eq!(VmaAttrs::from_vm_flags(["lf"]).lock, Lock::Unlocked);
        assert!(VmaAttrs::from_vm_flags(["nr", "wf", "dd", "dp"]).droppable);
        assert_eq!(VmaAttrs::from_vm_flags(["lo"]).lock, Lock::Locked);
        assert!(VmaAttrs::from_vm_flags(["rd", "mg"]).mergeable);
        assert!(VmaAttrs::from_vm_flags(["rd", "sh", "mr", "mw"]).may_write);
        assert!(!VmaAttrs::from_vm_flags(["rd", "wr", "mr", "mw"]).may_write, "a private mapping");
    }

    #[test]
    fn a_locked_page_cannot_be_dropped_and_an_unlocked_one_can() {
        // What the capture's probe relies on, on the running kernel.
        let mut page = memmap2::MmapMut::map_anon(PAGE_SIZE as usize).unwrap();
        crate::sys::memory::drop_pages(&mut page).expect("an unlocked page is dropped");
        page.lock().unwrap();
        let refused = crate::sys::memory::drop_pages(&mut page).expect_err("a locked page is not dropped");
        assert_eq!(refused.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn future_lock_from_a_fresh_mapping() {
        assert_eq!(future_lock(true, false), Lock::Unlocked);
        assert_eq!(future_lock(false, true), Lock::Locked);
        assert_eq!(future_lock(false, false), Lock::OnFault);
    }

    fn vma(start: u64, pages: u64, attrs: VmaAttrs) -> VmaRecord {
        VmaRecord {
            start,
            end: start + pages * PAGE_SIZE,
            prot: 3,
            shared: false,
            file_offset: 0,
            backing: Backing::Anon,
            runs: Vec::new(),
            attrs,
            earlier: Vec::new(),
            guards: Vec::new(),
        }
    }

    #[test]
    fn adjacent_mappings_share_a_call() {
        let locked = VmaAttrs { lock: Lock::Locked, dont_fork: true, ..Default::default() };
        let on_fault = VmaAttrs { lock: Lock::OnFault, ..Default::default() };
        let mut vdso = vma(0x9000, 1, locked);
        vdso.backing = Backing::Vdso { code: vec![0; 4096] };
        let vmas = [
            vma(0x1000, 2, locked),
            vma(0x3000, 1, locked),
            vma(0x4000, 1, on_fault),
            vma(0x6000, 1, locked), // a gap before it
            vdso,
        ];
        assert_eq!(
            lock_runs(&vmas),
            vec![
                LockRun { start: 0x1000, end: 0x4000, on_fault: false },
                LockRun { start: 0x4000, end: 0x5000, on_fault: true },
                LockRun { start: 0x6000, end: 0x7000, on_fault: false },
            ]
        );
        let advice = advice_runs(&vmas);
        assert_eq!(
            advice.iter().map(|a| (a.start, a.end, a.advice)).collect::<Vec<_>>(),
            vec![(0x1000, 0x4000, libc::MADV_DONTFORK), (0x6000, 0x7000, libc::MADV_DONTFORK),]
        );
        assert!(advice_runs(&[vma(0x1000, 1, VmaAttrs::default())]).is_empty());
        let merged = advice_runs(&[vma(0x1000, 2, VmaAttrs { mergeable: true, ..Default::default() })]);
        assert_eq!(merged.iter().map(|a| (a.start, a.end, a.advice)).collect::<Vec<_>>(), vec![(0x1000, 0x3000, libc::MADV_MERGEABLE)]);
    }

    #[test]
    fn inspect_says_what_is_set() {
        assert!(describe(&[vma(0x1000, 1, VmaAttrs::default())], &MemAttrsRecord::default()).is_empty());
        let vmas = [
            vma(0x1000, 4, VmaAttrs { lock: Lock::Locked, dont_dump: true, ..Default::default() }),
            vma(0x5000, 4, VmaAttrs { lock: Lock::OnFault, dont_dump: true, ..Default::default() }),
            vma(0x10_0000, 256, VmaAttrs { no_reserve: true, ..Default::default() }),
        ];
        let rec = MemAttrsRecord {
            future_lock: Lock::OnFault,
            membarrier: MembarrierRecord { private_expedited: true, global_expedited: Some(true), ..Default::default() },
        };
        assert_eq!(
            describe(&vmas, &rec),
            vec![
                "locked 32 KiB",
                "mlockall(MCL_FUTURE|MCL_ONFAULT)",
                "MADV_DONTDUMP 32 KiB",
                "MAP_NORESERVE 1024 KiB",
                "membarrier private expedited",
                "membarrier global expedited"
            ]
        );
    }

    #[test]
    fn a_lock_refused_by_the_limit_says_so() {
        let e = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let m = lock_problem(&e, Some(8 << 20), 9 << 20);
        assert!(m.contains("9216 KiB locked") && m.contains("allows 8192 KiB") && m.contains("ulimit -l"), "{m}");
        // Within the limit, or without one: the kernel's reason alone.
        assert!(!lock_problem(&e, Some(8 << 20), 1 << 20).contains("RLIMIT"));
        assert!(!lock_problem(&e, Some(libc::RLIM_INFINITY), 9 << 20).contains("RLIMIT"));
        let other = std::io::Error::from_raw_os_error(libc::EINVAL);
        assert!(!lock_problem(&other, Some(0), 4096).contains("RLIMIT"));
        assert_eq!(memlock_limit(&[(7, 1, 2), (8, 4096, 65536)]), Some((4096, 65536)));
    }
}
