//! The one validation step after decoding: every field of a node's record checked against the
//! rest of the image before anything acts on it.
//!
//! Checksums catch damage, not forgery: a record file whose crc holds can still say anything a
//! forger wants. So `NodeImage::read` (restart, inspect, verify) calls [`node_image`] on every
//! record it decodes, and `Manifest::load` calls [`node_name`] on every node it lists. After
//! them, the restore code may rely on what is checked here: pids and tids unique and in range,
//! parents before children, mappings page-aligned, ordered, disjoint and in user space, stored
//! pages inside their mapping and inside the process's stream, paths that the kernel can take,
//! System V objects that fit their kernel limits, and every list bounded. The stream lengths
//! themselves are checked against the chunk files by [`stream_lengths`] (the records alone
//! cannot tell).
//!
//! What a restore cannot do for reasons other than forgery (a session whose leader left, a
//! group without its leader) is the restart tool's to refuse, with its own message
//! (`restart_tool::tree::check`): such images are real, and `ckpt inspect` must still show them.
//!
//! Every function here is pure, allocates no more than the record already holds, never panics
//! and combines image values only with checked arithmetic.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::image::ImageError;
use crate::objects::aio;
use crate::objects::descriptor::{FdKind, FdRecord};
use crate::objects::file::{DeviceRecord, FileRecord, StdioRecord};
use crate::objects::memory::{Backing, PageRun, SavedFile, VmaRecord, USER_SPACE_END};
use crate::objects::mqueue::{MqueueRecord, Notify, HARD_MSGMAX as MQ_HARD_MSGMAX, HARD_MSGSIZEMAX as MQ_HARD_MSGSIZEMAX, PRIO_MAX as MQ_PRIO_MAX};
use crate::objects::sysvipc::SysvIpcRecord;
use crate::objects::unix::{Carried, UnixRecord};
use crate::objects::ProcessRecord;
use crate::snapshot::NodeImage;
use crate::PAGE_SIZE;

/// Largest pid or tid the kernel hands out (PID_MAX_LIMIT on 64-bit).
pub const PID_MAX: i32 = 4 * 1024 * 1024;
/// Longest path the kernel takes (PATH_MAX counts the terminating NUL).
pub const PATH_MAX: usize = 4095;
/// Longest file name (NAME_MAX), and so the longest node name.
pub const NAME_MAX: usize = 255;
/// Highest descriptor number accepted: the kernel's ceiling for fs.nr_open.
pub const FD_MAX: i32 = 1 << 30;
/// Bounds on the lists of one node's record. Generous for any real job; they stop an image from
/// making the restorer loop or allocate per element without limit.
pub const MAX_PROCESSES: usize = 1 << 16;
pub const MAX_THREADS: usize = 1 << 16;
pub const MAX_VMAS: usize = 1 << 20;
pub const MAX_RUNS: usize = 1 << 24;
pub const MAX_FDS: usize = 1 << 20;
/// Supplementary groups (NGROUPS_MAX).
pub const MAX_GROUPS: usize = 65536;
/// The kernel's saved auxiliary vector is a few hundred bytes; PR_SET_MM_MAP refuses more, and
/// the restorer copies it into its scratch area.
pub const MAX_AUXV: usize = 4096;
/// A task's name: TASK_COMM_LEN is 16 bytes, but the capture reads it as (lossy) UTF-8, in
/// which a byte may become a 3-byte replacement character.
pub const MAX_COMM: usize = 64;
/// The extended register state of any x86 CPU so far is well under this (the capture's buffer).
pub const MAX_XSTATE: usize = 64 * 1024;
/// A siginfo_t.
pub const SIGINFO_LEN: usize = 128;
/// Highest signal number (SIGRTMAX).
pub const SIGNAL_MAX: i32 = 64;
/// Resource limits (RLIM_NLIMITS).
pub const RLIMITS: u32 = 16;
/// A memfd's name (the kernel's limit, 249 bytes).
pub const MEMFD_NAME_MAX: usize = 249;
/// sun_path.
pub const UNIX_PATH_MAX: usize = 108;
/// System V limits: semaphores per set (SEMMSL's ceiling), a semaphore's value (SEMVMX), and a
/// message queue's byte limit (an int in the kernel).
pub const SEM_NSEMS_MAX: usize = 32000;
pub const SEM_VALUE_MAX: u16 = 32767;
pub const MSG_QBYTES_MAX: u64 = i32::MAX as u64;
/// The legacy vsyscall page, the one mapping above user space.
pub const VSYSCALL_START: u64 = 0xffff_ffff_ff60_0000;

/// What is wrong and where, before the file is known; [`Invalid::in_file`] adds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub place: String,
    pub problem: String,
}

impl Invalid {
    pub fn in_file(self, path: &Path) -> ImageError {
        ImageError::Invalid { path: path.to_path_buf(), place: self.place, problem: self.problem }
    }
}

type Check = std::result::Result<(), Invalid>;

fn bad(place: impl Into<String>, problem: impl Into<String>) -> Invalid {
    Invalid { place: place.into(), problem: problem.into() }
}

fn at_most(place: &str, what: &str, n: usize, max: usize) -> Check {
    if n > max {
        return Err(bad(place, format!("{n} {what}, more than the {max} any real image holds")));
    }
    Ok(())
}

/// A pid or tid as the job's PID namespace can have it. The job's init (1) is not in the image.
fn check_pid(place: &str, what: &str, pid: i32) -> Check {
    if !(2..=PID_MAX).contains(&pid) {
        return Err(bad(place, format!("{what} {pid} is not a pid a process of the job can have (2..={PID_MAX})")));
    }
    Ok(())
}

/// A path the restorer hands to the kernel: absolute, no NUL, at most PATH_MAX.
pub fn check_path(place: &str, what: &str, path: &str) -> Check {
    if path.len() > PATH_MAX {
        return Err(bad(place, format!("{what} is {} bytes long, more than PATH_MAX ({PATH_MAX})", path.len())));
    }
    if path.contains('\0') {
        return Err(bad(place, format!("{what} {path:?} holds a NUL byte")));
    }
    if !path.starts_with('/') {
        return Err(bad(place, format!("{what} {path:?} is not an absolute path")));
    }
    Ok(())
}

/// A name that is one component of a path: not empty, not `.` or `..`, without `/` or NUL, at
/// most NAME_MAX bytes. Node names are joined to the generation directory with it.
pub fn check_plain_name(place: &str, what: &str, name: &str) -> Check {
    let ok = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']) && name.len() <= NAME_MAX;
    if !ok {
        return Err(bad(place, format!("{what} {name:?} is not a plain file name (no '/', not '.' or '..', 1..={NAME_MAX} bytes)")));
    }
    Ok(())
}

/// A node name from the manifest (or a record), before it is joined to a path.
pub fn node_name(name: &str) -> Check {
    check_plain_name(&format!("node {name:?}"), "the node name", name)?;
    if name == crate::image::MANIFEST_NAME {
        return Err(bad(format!("node {name:?}"), "a node cannot be named like the manifest"));
    }
    Ok(())
}

/// Checks every field of a node's record against the rest of it. Pure.
pub fn node_image(img: &NodeImage) -> Check {
    node_name(&img.node)?;
    at_most("the node", "processes", img.processes.len(), MAX_PROCESSES)?;
    at_most("the node", "zombies", img.zombies.len(), MAX_PROCESSES)?;
    if img.processes.is_empty() {
        return Err(bad("the node", "no process"));
    }
    tree(img)?;
    for p in &img.processes {
        process(p)?;
    }
    sysvipc(&img.sysvipc)?;
    shm_mappings(img)?;
    if let Some(cpu) = &img.cpu {
        at_most("the CPU record", "CPUID leaves", cpu.leaves.len(), 64)?;
        if cpu.vendor.len() > 12 {
            return Err(bad("the CPU record", "a vendor name longer than 12 bytes"));
        }
    }
    if let Some(c) = &img.clocks {
        clocks(c)?;
    }
    let pids: Vec<_> = img.processes.iter().map(|p| p.pid).collect();
    crate::objects::mounts::validate(&img.mounts, &pids).map_err(|e| bad("the job's mounts", e))?;
    crate::objects::user_namespaces::validate(&img.users, &pids).map_err(|e| bad("the job's user namespaces", e))?;
    crate::objects::uts::validate(&img.uts, &pids).map_err(|e| bad("the job's UTS namespaces", e))?;
    crate::objects::net_namespaces::validate(&img.net, &pids).map_err(|e| bad("the job's network namespaces", e))?;
    crate::objects::cgroups::validate(&img.cgroups, &pids).map_err(|e| bad("the job's cgroups", e))?;
    // A namespace made on its maker's way down belongs to a user namespace on that way.
    let on_the_way = |owners: Vec<(Option<u32>, Option<i32>)>, what: &str| -> std::result::Result<(), Invalid> {
        for (owner, maker) in owners {
            let (Some(owner), Some(maker)) = (owner, maker) else { continue };
            let own = img.users.namespace_of(maker);
            if owner != 0 && !img.users.chain(own).contains(&(owner as usize)) {
                return Err(bad(what, format!("pid {maker}'s namespace belongs to user namespace {owner}, not on its way down")));
            }
        }
        Ok(())
    };
    on_the_way(img.uts.namespaces.iter().map(|n| (n.owner, n.pids.first().copied())).collect(), "the job's UTS namespaces")?;
    on_the_way(img.ipc.namespaces.iter().map(|n| (n.owner, n.pids.first().copied())).collect(), "the job's IPC namespaces")?;
    on_the_way(img.net.namespaces.iter().map(|n| (n.owner, n.pids.first().copied())).collect(), "the job's network namespaces")?;
    img.ipc
        .validate("IPC", &pids, |objects| sysvipc(objects).map_err(|e| format!("{}: {}", e.place, e.problem)))
        .map_err(|e| bad("the job's IPC namespaces", e))?;
    mount_owners(img).map_err(|e| bad("the job's mount namespaces", e))?;
    Ok(())
}

/// The job's clocks: what a time namespace can show (the restart makes one that shows them).
fn clocks(c: &crate::objects::timens::ClocksRecord) -> Check {
    use crate::objects::timens::MAX_CLOCK_NS;
    for (name, ns) in [("CLOCK_MONOTONIC", c.monotonic_ns), ("CLOCK_BOOTTIME", c.boottime_ns)] {
        if !(0..=MAX_CLOCK_NS).contains(&ns) {
            return Err(bad("the job's clocks", format!("{name} at {ns} ns, outside 0..={MAX_CLOCK_NS}")));
        }
    }
    Ok(())
}

/// Most entries a files record holds (watched files, listed entries, protected entries).
pub const MAX_FILES_ENTRIES: usize = 4 << 20;

/// Checks a node's files record (`files.bin`) before restart acts on it: every path absolute
/// and plain, every name in a listing one component, every path inside a protected root
/// relative and without `..` (the restart removes and creates files there), every copy's name
/// one component (it is joined to the copies' directory), modes within the permission bits.
/// Pure.
pub fn files_record(rec: &crate::objects::files_state::FilesRecord) -> Check {
    use crate::objects::files_state::Kind;
    let n = rec.watched.len() + rec.listings.iter().map(|l| l.entries.len()).sum::<usize>() + rec.protected.iter().map(|r| r.entries.len()).sum::<usize>();
    at_most("the files record", "entries", n, MAX_FILES_ENTRIES)?;
    for w in &rec.watched {
        check_path("a watched file", "its path", &w.path)?;
    }
    at_most("the files record", "file identities", rec.identities.len(), MAX_FILES_ENTRIES)?;
    if rec.boot_id.len() > 64 {
        return Err(bad("the files record", "its boot id is longer than 64 bytes"));
    }
    for id in &rec.identities {
        if let crate::objects::identity::Content::BuildId(b) = &id.content {
            if b.is_empty() || b.len() > crate::objects::identity::MAX_BUILD_ID {
                return Err(bad("the files record", format!("a build-id of {} bytes (1 ..= {})", b.len(), crate::objects::identity::MAX_BUILD_ID)));
            }
        }
    }
    for l in &rec.listings {
        check_path("a listed directory", "its path", &l.dir)?;
        for (name, _) in &l.entries {
            check_plain_name(&format!("the listing of {}", l.dir), "an entry", name)?;
        }
    }
    for r in &rec.protected {
        check_path("a protected root", "its path", &r.root)?;
        if r.root.split('/').any(|c| c == "..") {
            return Err(bad(format!("protected root {}", r.root), "the path goes up with '..'"));
        }
        let place = format!("protected root {}", r.root);
        match r.entries.first() {
            Some(e) if e.rel.is_empty() => {}
            _ => return Err(bad(place, "the first entry is not the root itself")),
        }
        for e in &r.entries {
            if !e.rel.is_empty() {
                for c in e.rel.split('/') {
                    check_plain_name(&place, "a component of an entry's path", c)?;
                }
            }
            if e.stat.mode & !0o7777 != 0 {
                return Err(bad(&place, format!("entry {:?} has mode {:o}, beyond the permission bits", e.rel, e.stat.mode)));
            }
            match (e.stat.kind, &e.content) {
                (Kind::File, Some(name)) => check_plain_name(&place, "the name of a saved copy", name)?,
                (Kind::File, None) => return Err(bad(&place, format!("file {:?} has no saved copy", e.rel))),
                (Kind::Symlink, Some(t)) if t.len() <= PATH_MAX && !t.contains('\0') => {}
                (Kind::Symlink, _) => return Err(bad(&place, format!("symlink {:?} has no valid target", e.rel))),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Pids and tids unique across the node; every parent in the image (or the job's init) and
/// listed before its children, so that creating processes in order always finds the parent.
fn tree(img: &NodeImage) -> Check {
    let mut seen: HashSet<i32> = HashSet::new();
    let mut tids: HashSet<i32> = HashSet::new();
    for p in &img.processes {
        let place = format!("pid {}", p.pid);
        check_pid(&place, "the pid", p.pid)?;
        // The parent first: a process cannot be its own parent, nor come before it.
        if p.ppid < 0 || (p.ppid > 1 && !seen.contains(&p.ppid)) {
            return Err(bad(place, format!("its parent {} is not the job's init nor a process listed before it", p.ppid)));
        }
        if !seen.insert(p.pid) {
            return Err(bad(place, "the pid appears twice in the image"));
        }
        // 0: a group or session outside the job's namespace.
        for (what, id) in [("process group", p.pgid), ("session", p.sid)] {
            if !(0..=PID_MAX).contains(&id) {
                return Err(bad(&place, format!("{what} {id} is not a pid")));
            }
        }
        at_most(&place, "threads", p.threads.len(), MAX_THREADS)?;
        if p.threads.iter().filter(|t| t.tid == p.pid).count() != 1 {
            return Err(bad(&place, "its main thread (tid = pid) is not listed exactly once"));
        }
        for t in &p.threads {
            check_pid(&place, "a thread id", t.tid)?;
            if !tids.insert(t.tid) {
                return Err(bad(&place, format!("thread {} appears twice in the image", t.tid)));
            }
        }
    }
    let live: HashSet<i32> = seen.clone();
    for z in &img.zombies {
        let place = format!("zombie {}", z.pid);
        check_pid(&place, "the pid", z.pid)?;
        if !seen.insert(z.pid) || tids.contains(&z.pid) {
            return Err(bad(place, "the pid appears twice in the image"));
        }
        if !live.contains(&z.ppid) {
            return Err(bad(place, format!("its parent {} is not a live process of the image", z.ppid)));
        }
        for (what, id) in [("process group", z.pgid), ("session", z.sid)] {
            if !(0..=PID_MAX).contains(&id) {
                return Err(bad(&place, format!("{what} {id} is not a pid")));
            }
        }
    }
    // A thread's tid must not be another process's pid.
    for p in &img.processes {
        for t in p.threads.iter().filter(|t| t.tid != p.pid) {
            if seen.contains(&t.tid) {
                return Err(bad(format!("pid {}", p.pid), format!("thread {} has the pid of a process", t.tid)));
            }
        }
    }
    if img.main_end.is_none() && !seen.contains(&img.main_pid) {
        return Err(bad("the node", format!("main pid {} is not a process of the image", img.main_pid)));
    }
    Ok(())
}

/// A mount namespace said to belong to a user namespace above its maker's must name one on the
/// maker's way down from the job's (the restart makes it there).
fn mount_owners(img: &NodeImage) -> std::result::Result<(), String> {
    for (i, m) in img.mounts.namespaces.iter().enumerate() {
        let Some(owner) = m.owner else { continue };
        let on_the_way = |maker: &crate::ptrace::Tid| owner == 0 || img.users.chain(img.users.namespace_of(*maker)).contains(&(owner as usize));
        if i == 0 || !m.pids.first().is_some_and(on_the_way) {
            return Err(format!("mount namespace {i} belongs to user namespace {owner}, not on its maker's way"));
        }
    }
    Ok(())
}

fn process(p: &ProcessRecord) -> Check {
    let place = format!("pid {}", p.pid);
    let a = &p.attrs;
    check_path(&place, "the executable", &a.exe.path)?;
    if let Some(root) = &a.root {
        check_path(&place, "the root directory", root)?;
    }
    if let Some(d) = &a.exe.deleted {
        check_path(&place, "the deleted executable", &d.path)?;
        if d.mode > 0o7777 {
            return Err(bad(&place, format!("the deleted executable's mode {:o} has bits beyond 07777", d.mode)));
        }
    }
    check_path(&place, "the working directory", &a.cwd)?;
    if a.umask > 0o777 {
        return Err(bad(&place, format!("umask {:o} has bits beyond 0777", a.umask)));
    }
    if a.mdwe & !crate::objects::process::MDWE_FLAGS != 0 {
        return Err(bad(&place, format!("memory-deny-write-execute flags {:#x} the kernel does not know", a.mdwe)));
    }
    at_most(&place, "resource limits", a.rlimits.len(), RLIMITS as usize)?;
    if let Some((res, ..)) = a.rlimits.iter().find(|(res, ..)| *res >= RLIMITS) {
        return Err(bad(&place, format!("resource limit {res} does not exist")));
    }
    at_most(&place, "bytes of auxiliary vector", a.mm.auxv.len(), MAX_AUXV)?;
    for t in &p.threads {
        thread(&place, p, t)?;
    }
    signals(&place, &p.signals)?;
    vmas(p)?;
    fds(p)?;
    for t in &p.posix_timers {
        let where_ = format!("{place}, POSIX timer {}", t.id);
        if !(0..=SIGNAL_MAX).contains(&t.signo) {
            return Err(bad(where_, format!("signal {} does not exist", t.signo)));
        }
        if t.notify == libc::SIGEV_THREAD_ID && !p.threads.iter().any(|th| th.tid == t.tid) {
            return Err(bad(where_, format!("it signals thread {}, which is not a thread of the process", t.tid)));
        }
    }
    at_most(&place, "POSIX timers", p.posix_timers.len(), MAX_FDS)?;
    if let Some(sandbox) = &p.seccomp {
        let tids: Vec<i32> = p.threads.iter().map(|t| t.tid).collect();
        crate::objects::seccomp::validate(sandbox, &tids).map_err(|e| bad(&place, e))?;
    }
    saved_files(p)
}

/// The contents of large deleted files and memfds in the stream: each file once, its extents
/// sorted and disjoint within its size, each in the stream.
fn saved_files(p: &ProcessRecord) -> Check {
    at_most(&format!("pid {}", p.pid), "saved files", p.saved_files.len(), MAX_FDS)?;
    let mut seen = HashSet::new();
    let mut extents = 0usize;
    for s in &p.saved_files {
        let place = format!("pid {}, saved file {}:{}", p.pid, s.dev, s.ino);
        if s.size > crate::objects::deleted::MAX_CONTENTS {
            return Err(bad(place, format!("{} bytes, more than a checkpoint keeps", s.size)));
        }
        if !seen.insert((s.dev, s.ino)) {
            return Err(bad(place, "saved twice"));
        }
        extents = extents.saturating_add(s.extents.len());
        at_most(&place, "extents", extents, MAX_RUNS)?;
        file_extents(&place, "the file's data", &s.extents, s.size, p.stream_len)?;
    }
    Ok(())
}

/// A saved file's data extents (`what`, for messages): sorted, disjoint, none empty, within the
/// file's `size`, each in the process's stream, and no two sharing bytes there (extents sharing
/// their bytes in the stream would have the restart write gigabytes from a few pages). Since
/// format 30 they may lie in the stream in another order than in the file: a file copied before
/// the freeze has the pages written since stored after that copy.
fn file_extents(place: &str, what: &str, extents: &[crate::objects::deleted::Extent], size: u64, stream_len: u64) -> Check {
    let mut at = 0u64;
    for e in extents {
        let end = e.file_offset.checked_add(e.len);
        if e.len == 0 || e.file_offset < at || end.is_none_or(|end| end > size) {
            return Err(bad(place, format!("{what}: extent at {} ({} bytes) is empty, out of order or beyond the file's {size} bytes", e.file_offset, e.len)));
        }
        in_stream(place, what, e.stream_offset, e.len, stream_len)?;
        at = end.unwrap_or(u64::MAX);
    }
    let mut in_the_stream: Vec<(u64, u64)> = extents.iter().map(|e| (e.stream_offset, e.stream_offset.saturating_add(e.len))).collect();
    in_the_stream.sort_unstable();
    if let Some(w) = in_the_stream.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(bad(place, format!("{what}: two extents share the stream's bytes at {}", w[1].0)));
    }
    Ok(())
}

fn thread(place: &str, p: &ProcessRecord, t: &crate::objects::thread::ThreadRecord) -> Check {
    let place = if t.tid == p.pid { place.to_string() } else { format!("{place}, thread {}", t.tid) };
    at_most(&place, "bytes of extended register state", t.xstate.0.len(), MAX_XSTATE)?;
    at_most(&place, "bytes of name", t.comm.len(), MAX_COMM)?;
    at_most(&place, "pending signals", t.pending.len(), MAX_THREADS)?;
    for s in &t.pending {
        pending(&place, s)?;
    }
    at_most(&place, "supplementary groups", t.creds.groups.len(), MAX_GROUPS)?;
    at_most(&place, "bytes of CPU affinity mask", t.sched.affinity.len(), MAX_XSTATE)?;
    if t.creds.dumpable > 2 {
        return Err(bad(&place, format!("dumpable {} is not 0, 1 or 2", t.creds.dumpable)));
    }
    Ok(())
}

fn pending(place: &str, s: &crate::objects::signals::PendingSignal) -> Check {
    if s.0.len() != SIGINFO_LEN {
        return Err(bad(place, format!("a pending signal's siginfo is {} bytes, not {SIGINFO_LEN}", s.0.len())));
    }
    if !(1..=SIGNAL_MAX).contains(&s.signo()) {
        return Err(bad(place, format!("pending signal {} does not exist", s.signo())));
    }
    Ok(())
}

fn signals(place: &str, s: &crate::objects::signals::SignalsRecord) -> Check {
    at_most(place, "signal handlers", s.actions.len(), SIGNAL_MAX as usize)?;
    let mut seen = HashSet::new();
    for a in &s.actions {
        if !(1..=SIGNAL_MAX).contains(&a.signo) || !seen.insert(a.signo) {
            return Err(bad(place, format!("a handler for signal {}, which does not exist or has two", a.signo)));
        }
    }
    at_most(place, "pending signals", s.shared_pending.len(), MAX_THREADS)?;
    for s in &s.shared_pending {
        pending(place, s)?;
    }
    Ok(())
}

fn vma_place(pid: i32, v: &VmaRecord) -> String {
    format!("pid {pid}, mapping {:#x}-{:#x}", v.start, v.end)
}

/// Mappings page-aligned, start < end, in ascending order without overlap, below the end of user
/// space (the vsyscall page excepted, at its one address); stored pages inside their mapping and
/// inside the process's stream; a file saved whole inside the stream.
fn vmas(p: &ProcessRecord) -> Check {
    at_most(&format!("pid {}", p.pid), "mappings", p.vmas.len(), MAX_VMAS)?;
    let mut prev_end = 0u64;
    let mut runs_total = 0usize;
    // In-memory files saved for their mappings: each once (the writer saves a file for its
    // first mapping only), their extents counted together.
    let mut saved_files = HashSet::new();
    let mut extents_total = 0usize;
    for v in &p.vmas {
        let place = vma_place(p.pid, v);
        if v.start % PAGE_SIZE != 0 || v.end % PAGE_SIZE != 0 || v.start >= v.end {
            return Err(bad(place, "not a page-aligned range with start below end"));
        }
        if v.start < prev_end {
            return Err(bad(place, format!("overlaps or precedes the mapping before it (which ends at {prev_end:#x})")));
        }
        prev_end = v.end;
        let vsyscall = matches!(v.backing, Backing::Vsyscall);
        if vsyscall != (v.start == VSYSCALL_START && v.end == VSYSCALL_START + PAGE_SIZE) || (!vsyscall && v.end > USER_SPACE_END) {
            return Err(bad(place, format!("outside user space (which ends at {USER_SPACE_END:#x})")));
        }
        let known = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u32;
        if v.prot & !known != 0 {
            return Err(bad(place, format!("protection {:#x} has unknown bits", v.prot)));
        }
        let len = v.end - v.start;
        let object_end = v.file_offset.checked_add(len).filter(|e| *e <= i64::MAX as u64);
        if v.file_offset % PAGE_SIZE != 0 || object_end.is_none() {
            return Err(bad(place, format!("offset {:#x} in its object is not page-aligned or too large", v.file_offset)));
        }
        match &v.backing {
            Backing::File { path, saved, dev, ino, .. } => {
                check_path(&place, "the mapped file", path)?;
                let what = "the file's saved contents";
                if saved.is_some() && !saved_files.insert((*dev, *ino)) {
                    return Err(bad(place, format!("{what}: the file (device {dev:#x}, inode {ino}) is saved twice")));
                }
                match saved {
                    Some(s) if s.len > crate::objects::memory::MAX_SAVED_FILE => {
                        return Err(bad(place, format!("{what}: {} bytes, more than a checkpoint keeps", s.len)));
                    }
                    Some(s @ SavedFile { extents: Some(extents), .. }) => {
                        extents_total = extents_total.saturating_add(extents.len());
                        at_most(&place, "extents of saved files", extents_total, MAX_RUNS)?;
                        file_extents(&place, what, extents, s.len, p.stream_len)?;
                    }
                    Some(s) => in_stream(&place, what, s.stream_offset, s.len, p.stream_len)?,
                    None => {}
                }
            }
            Backing::Shmem { memfd_name: Some(n), .. } => {
                if n.len() > MEMFD_NAME_MAX || n.contains('\0') {
                    return Err(bad(place, format!("memfd name of {} bytes, or with a NUL", n.len())));
                }
            }
            Backing::Vdso { code } => {
                if code.len() as u64 != len {
                    return Err(bad(place, format!("{} bytes of vdso code for a mapping of {len}", code.len())));
                }
            }
            Backing::VdsoData { name } => at_most(&place, "bytes of name", name.len(), NAME_MAX)?,
            Backing::SysvShm { size, .. } => {
                let rounded = size.checked_next_multiple_of(PAGE_SIZE);
                if object_end.zip(rounded).is_none_or(|(e, r)| e > r) {
                    return Err(bad(place, format!("goes beyond its System V segment of {size} bytes")));
                }
            }
            Backing::Aio { nr } => aio::validate(*nr, len).map_err(|e| bad(place.as_str(), e))?,
            Backing::Unlinked { path } => {
                if v.shared {
                    return Err(bad(place, "a shared mapping of a deleted file recorded as private memory"));
                }
                check_path(&place, "the deleted file", path)?;
            }
            Backing::PrivateShmem { path, memfd_name, .. } => {
                if v.shared {
                    return Err(bad(place, "a shared mapping recorded as a private mapping of an object"));
                }
                check_path(&place, "the mapped object", path)?;
                if let Some(n) = memfd_name.as_ref().filter(|n| n.len() > MEMFD_NAME_MAX || n.contains('\0')) {
                    return Err(bad(place, format!("memfd name of {} bytes, or with a NUL", n.len())));
                }
            }
            Backing::Droppable => {
                if v.shared || !v.runs.is_empty() || !v.earlier.is_empty() {
                    return Err(bad(place, "droppable memory recorded shared or with stored pages"));
                }
            }
            Backing::GpuInherited { path } => {
                if !v.runs.is_empty() || !v.earlier.is_empty() {
                    return Err(bad(place, "a GPU device's mapping recorded with stored pages"));
                }
                check_path(&place, "the GPU device", path)?;
            }
            Backing::Anon | Backing::Stack | Backing::Shmem { .. } | Backing::Vsyscall => {}
        }
        if v.is_kernel_special() && v.attrs != Default::default() {
            return Err(bad(place, "locked or advised, which the kernel's own mappings are not by the program"));
        }
        if v.attrs.wipe_on_fork && (v.shared || !matches!(v.backing, Backing::Anon | Backing::Stack | Backing::Droppable)) {
            return Err(bad(place, "wiped on fork, which only private anonymous memory can be"));
        }
        runs_total = runs_total.saturating_add(v.runs.len());
        at_most(&format!("pid {}", p.pid), "runs of stored pages", runs_total, MAX_RUNS)?;
        if !v.runs.is_empty() && (v.is_kernel_special() || matches!(v.backing, Backing::SysvShm { .. })) {
            return Err(bad(place, "stored pages for a mapping whose contents are not in the stream"));
        }
        runs_total = runs_total.saturating_add(v.earlier.len());
        at_most(&format!("pid {}", p.pid), "runs of stored pages", runs_total, MAX_RUNS)?;
        if !v.earlier.is_empty() && (v.shared || v.is_kernel_special()) {
            return Err(bad(place, "pages of an earlier generation for a mapping that is not private memory"));
        }
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(v.runs.len() + v.earlier.len());
        // The stream of an earlier generation is checked against its chunk files at restart
        // (`earlier_streams`); here only that the pages lie in the mapping, each stored once.
        // A private mapping's object pages are stored beside its own copies, never over them.
        let object: &[PageRun] = match &v.backing {
            Backing::PrivateShmem { object, .. } => object,
            _ => &[],
        };
        runs_total = runs_total.saturating_add(object.len());
        at_most(&format!("pid {}", p.pid), "runs of stored pages", runs_total, MAX_RUNS)?;
        let own = v.runs.iter().chain(object).map(|r| (r, None));
        for (r, earlier) in own.chain(v.earlier.iter().map(|e| (&e.run, Some(e.generation)))) {
            let bytes = r.pages.checked_mul(PAGE_SIZE);
            let end = bytes.and_then(|b| r.addr.checked_add(b));
            let inside = r.pages > 0 && r.addr % PAGE_SIZE == 0 && r.addr >= v.start && end.is_some_and(|e| e <= v.end);
            if !inside {
                return Err(bad(place, format!("stored pages at {:#x} ({} pages) are not inside the mapping", r.addr, r.pages)));
            }
            match earlier {
                None => in_stream(&place, "stored pages", r.stream_offset, bytes.unwrap_or(u64::MAX), p.stream_len)?,
                Some(_) if r.stream_offset.checked_add(bytes.unwrap_or(u64::MAX)).is_none() => {
                    return Err(bad(place, format!("pages of an earlier generation at stream offset {} overflow", r.stream_offset)));
                }
                Some(_) => {}
            }
            runs.push((r.addr, end.unwrap_or(u64::MAX)));
        }
        runs.sort_unstable();
        if let Some(w) = runs.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(bad(place, format!("pages at {:#x} are stored twice", w[1].0)));
        }
        // Guard pages: private memory only, inside the mapping, in order, none stored (the
        // restart installs them after the fill, which would make a stored page lost silently).
        runs_total = runs_total.saturating_add(v.guards.len());
        at_most(&format!("pid {}", p.pid), "runs of stored pages", runs_total, MAX_RUNS)?;
        if !v.guards.is_empty() && (v.shared || v.is_kernel_special()) {
            return Err(bad(place, "guard pages in a mapping that is not private memory"));
        }
        let mut after = v.start;
        for &(addr, pages) in &v.guards {
            let end = pages.checked_mul(PAGE_SIZE).and_then(|b| addr.checked_add(b));
            if pages == 0 || addr % PAGE_SIZE != 0 || addr < after || end.is_none_or(|e| e > v.end) {
                return Err(bad(place, format!("guard pages at {addr:#x} ({pages} pages) are not inside the mapping, in order")));
            }
            let end = end.unwrap_or(u64::MAX);
            if runs.iter().any(|&(s, e)| s < end && addr < e) {
                return Err(bad(place, format!("guard pages at {addr:#x} are stored as pages too")));
            }
            after = end;
        }
    }
    Ok(())
}

/// `[offset, offset + len)` inside a stream of `stream_len` bytes.
fn in_stream(place: &str, what: &str, offset: u64, len: u64, stream_len: u64) -> Check {
    if offset.checked_add(len).is_none_or(|end| end > stream_len) {
        return Err(bad(place, format!("{what} at stream offset {offset} ({len} bytes) lie beyond the process's stream of {stream_len} bytes")));
    }
    Ok(())
}

fn fds(p: &ProcessRecord) -> Check {
    let place = format!("pid {}", p.pid);
    at_most(&place, "descriptors", p.fds.len(), MAX_FDS)?;
    let mut seen = HashSet::new();
    for f in &p.fds {
        let place = format!("pid {}, fd {}", p.pid, f.fd);
        if !(0..=FD_MAX).contains(&f.fd) || !seen.insert(f.fd) {
            return Err(bad(place, format!("descriptor number out of 0..={FD_MAX} or listed twice")));
        }
        fd(&place, f)?;
        if let Some(o) = &f.owner {
            if o.pid < 0 || !(0..=libc::SIGRTMAX()).contains(&o.signal) {
                return Err(bad(&place, format!("an owner {} or an I/O signal {} out of range", o.pid, o.signal)));
            }
        }
        at_most(&place, "locks", f.locks.len(), MAX_FDS)?;
        for l in &f.locks {
            if l.end.is_some_and(|e| e < l.start) {
                return Err(bad(&place, format!("a lock ends before it starts ({})", l.start)));
            }
        }
    }
    Ok(())
}

fn fd(place: &str, f: &FdRecord) -> Check {
    let data_in = |what: &str, data: Option<&Vec<u8>>, capacity: u32| -> Check {
        match data {
            Some(d) if d.len() as u64 > u64::from(capacity) => Err(bad(place, format!("{} bytes of {what} data in a buffer of {capacity}", d.len()))),
            _ => Ok(()),
        }
    };
    match &f.kind {
        FdKind::File(FileRecord { path, .. }) => check_path(place, "the file", path)?,
        FdKind::CharDevice(DeviceRecord { path, node }) => {
            check_path(place, "the device", path)?;
            if let Some(n) = node {
                if n.mode & libc::S_IFMT != libc::S_IFCHR || !crate::objects::file::is_reopenable_device_number(n.rdev) {
                    return Err(bad(
                        place,
                        format!("a device node {:o} {}:{} that is not one reopened by number", n.mode, libc::major(n.rdev), libc::minor(n.rdev)),
                    ));
                }
            }
        }
        FdKind::Stdio(StdioRecord { which }) if *which > 2 => return Err(bad(place, format!("standard stream {which} does not exist"))),
        FdKind::Stdio(_) => {}
        FdKind::Pipe(r) => data_in("pipe", r.data.as_ref(), r.capacity)?,
        FdKind::Fifo(r) => {
            check_path(place, "the named pipe", &r.path)?;
            data_in("named pipe", r.data.as_ref(), r.capacity)?;
        }
        FdKind::Unix(u) => unix_socket(place, u)?,
        FdKind::UnixQueue(r) => {
            unix_socket(place, &r.socket)?;
            if r.carried.len() != r.socket.queue.len() {
                return Err(bad(place, format!("descriptors in flight for {} messages, {} queued", r.carried.len(), r.socket.queue.len())));
            }
            if !r.senders.is_empty() {
                if r.senders.len() != r.socket.queue.len() {
                    return Err(bad(place, format!("senders for {} messages, {} queued", r.senders.len(), r.socket.queue.len())));
                }
                if r.socket.peer.is_some() || r.socket.sock_type != libc::SOCK_DGRAM || r.socket.name.is_none() {
                    return Err(bad(place, "senders of messages queued on a socket that is connected, not a datagram socket, or without a name".to_string()));
                }
                for n in r.senders.iter().flatten() {
                    if n.is_empty() {
                        return Err(bad(place, "a sender's address of 0 bytes".to_string()));
                    }
                    at_most(place, "bytes of a sender's address", n.len(), UNIX_PATH_MAX)?;
                }
            }
            for fds in &r.carried {
                at_most(place, "descriptors carried by one message", fds.len(), SCM_MAX_FD)?;
                for c in fds {
                    if let Carried::Alone(rec) = c {
                        if !rec.kind.object().made_alone() {
                            return Err(bad(place, "a descriptor in flight of a kind not restored so".to_string()));
                        }
                        fd(place, rec)?;
                    }
                }
            }
        }
        FdKind::Epoll(e) => {
            at_most(place, "watched descriptors", e.targets.len(), MAX_FDS)?;
            if let Some(t) = e.targets.iter().find(|t| !(0..=FD_MAX).contains(&t.fd) || !(0..=FD_MAX).contains(&t.open_at())) {
                return Err(bad(place, format!("watches descriptor {} (held at {}), out of range", t.fd, t.open_at())));
            }
        }
        FdKind::Deleted(d) => check_path(place, "the deleted file", &d.path)?,
        FdKind::Memfd(m) => {
            if m.name.len() > MEMFD_NAME_MAX || m.name.contains('\0') {
                return Err(bad(place, format!("memfd name of {} bytes, or with a NUL", m.name.len())));
            }
            if m.mode_owner.is_some_and(|(mode, _, _)| mode > 0o7777) {
                return Err(bad(place, "a memfd mode with more than permission bits"));
            }
        }
        FdKind::Inotify(i) => {
            at_most(place, "inotify watches", i.watches.len(), MAX_FDS)?;
            for w in &i.watches {
                check_path(place, "an inotify watch", &w.path)?;
            }
        }
        FdKind::Fanotify(f) => {
            crate::objects::fanotify::validate(f).map_err(|e| bad(place, e))?;
            for m in &f.marks {
                check_path(place, "a fanotify mark", &m.path)?;
            }
        }
        FdKind::Pidfd(p) if p.reaped.is_none() => check_pid(place, "the pidfd's process", p.pid)?,
        FdKind::Pidfd(_) => {}
        FdKind::Pty(p) => {
            if let Some(s) = &p.state {
                at_most(place, "terminal control characters", s.termios.cc.len(), 64)?;
            }
        }
        FdKind::Mqueue(m) => mqueue(place, m)?,
        FdKind::Netlink(n) => crate::objects::netlink::validate(n).map_err(|e| bad(place, format!("netlink socket: {e}")))?,
        FdKind::Packet(p) => crate::objects::packet::validate(p).map_err(|e| bad(place, format!("packet socket: {e}")))?,
        FdKind::RemovedDir(d) => crate::objects::removed_dir::validate(d).map_err(|e| bad(place, format!("removed directory: {e}")))?,
        FdKind::RemovedSymlink(l) => crate::objects::removed_symlink::validate(l).map_err(|e| bad(place, format!("removed link: {e}")))?,
        FdKind::NsFile(n) => {
            crate::objects::ns_file::validate(n).map_err(|e| bad(place, format!("namespace: {e}")))?;
            check_pid(place, "the namespace's process", n.pid)?;
        }
        FdKind::Inet(crate::objects::inet::InetRecord::Udp(u)) => {
            crate::objects::multicast::validate(&u.memberships).map_err(|e| bad(place, format!("datagram socket: {e}")))?;
            if u.shutdown > 3 {
                return Err(bad(place, format!("datagram socket: shutdown state {} (0 to 3)", u.shutdown)));
            }
        }
        FdKind::Eventfd(_) | FdKind::Timerfd(_) | FdKind::Signalfd(_) | FdKind::Inet(_) => {}
    }
    Ok(())
}

/// The most descriptors one SCM_RIGHTS message carries (the kernel's SCM_MAX_FD).
const SCM_MAX_FD: usize = 253;

fn unix_socket(place: &str, u: &UnixRecord) -> Check {
    for name in [&u.name, &u.pending_on].into_iter().flatten() {
        at_most(place, "bytes of socket address", name.len(), UNIX_PATH_MAX)?;
    }
    at_most(place, "queued messages", u.queue.len(), MAX_FDS)
}

/// A POSIX message queue: a name mq_open takes (`/` and 1..=NAME_MAX bytes without `/` or
/// NUL), attributes within the kernel's hard ceilings, and messages that fit them, so that the
/// restorer never allocates or sends more than a queue can hold.
fn mqueue(place: &str, m: &MqueueRecord) -> Check {
    let bare = m.name.strip_prefix('/').unwrap_or("");
    if bare.is_empty() || bare.len() > NAME_MAX || bare.contains(['/', '\0']) {
        return Err(bad(place, format!("queue name {:?} is not '/' and 1..={NAME_MAX} bytes without '/' or NUL", m.name)));
    }
    let Some(q) = &m.queue else { return Ok(()) };
    if !(1..=MQ_HARD_MSGMAX).contains(&q.maxmsg) || !(1..=MQ_HARD_MSGSIZEMAX).contains(&q.msgsize) {
        return Err(bad(
            place,
            format!("queue {} of {} messages of {} bytes, beyond the kernel's {MQ_HARD_MSGMAX} of {MQ_HARD_MSGSIZEMAX}", m.name, q.maxmsg, q.msgsize),
        ));
    }
    if q.messages.len() as u64 > q.maxmsg {
        return Err(bad(place, format!("{} messages in queue {}, which holds {}", q.messages.len(), m.name, q.maxmsg)));
    }
    if let Some(msg) = q.messages.iter().find(|msg| msg.data.len() as u64 > q.msgsize || msg.priority >= MQ_PRIO_MAX) {
        return Err(bad(
            place,
            format!(
                "a message of {} bytes at priority {} in queue {} (messages of at most {} bytes, priorities below {MQ_PRIO_MAX})",
                msg.data.len(),
                msg.priority,
                m.name,
                q.msgsize
            ),
        ));
    }
    if let Some(n) = q.notify {
        check_pid(place, "the process that registered the queue's notification", n.pid)?;
        if let Notify::Signal(s) = n.how {
            if !(0..=SIGNAL_MAX).contains(&s) {
                return Err(bad(place, format!("queue {} notifies with signal {s}", m.name)));
            }
        }
    }
    Ok(())
}

/// System V objects: ids unique per kind, contents no larger than their segment, semaphore sets
/// and message queues within the kernel's limits.
fn sysvipc(r: &SysvIpcRecord) -> Check {
    let unique = |kind: &str, ids: &mut dyn Iterator<Item = i32>| -> Check {
        let mut seen = HashSet::new();
        for id in ids {
            if id < 0 || !seen.insert(id) {
                return Err(bad(format!("System V {kind} {id}"), "negative id, or listed twice"));
            }
        }
        Ok(())
    };
    unique("shared memory segment", &mut r.shm.iter().map(|s| s.perm.id))?;
    unique("semaphore set", &mut r.sem.iter().map(|s| s.perm.id))?;
    unique("message queue", &mut r.msg.iter().map(|m| m.perm.id))?;
    for s in &r.shm {
        let place = format!("System V shared memory segment {}", s.perm.id);
        if s.size == 0 || s.size > USER_SPACE_END {
            return Err(bad(place, format!("size {} is not one a segment can have", s.size)));
        }
        if s.data.len() as u64 > s.size {
            return Err(bad(place, format!("{} bytes of contents for a segment of {} bytes", s.data.len(), s.size)));
        }
    }
    for s in &r.sem {
        let place = format!("System V semaphore set {}", s.perm.id);
        if s.values.is_empty() || s.values.len() > SEM_NSEMS_MAX {
            return Err(bad(place, format!("{} semaphores (a set has 1..={SEM_NSEMS_MAX})", s.values.len())));
        }
        if let Some(v) = s.values.iter().find(|v| **v > SEM_VALUE_MAX) {
            return Err(bad(place, format!("a semaphore's value {v} is above SEMVMX ({SEM_VALUE_MAX})")));
        }
    }
    for m in &r.msg {
        let place = format!("System V message queue {}", m.perm.id);
        if m.qbytes > MSG_QBYTES_MAX {
            return Err(bad(place, format!("byte limit {} is above the kernel's ({MSG_QBYTES_MAX})", m.qbytes)));
        }
        let mut total = 0u64;
        for (mtype, text) in &m.messages {
            if *mtype <= 0 {
                return Err(bad(&place, format!("a message of type {mtype} (types are positive)")));
            }
            total = total.saturating_add(text.len() as u64);
        }
        if total > m.qbytes {
            return Err(bad(place, format!("{total} bytes of messages in a queue limited to {} bytes", m.qbytes)));
        }
    }
    Ok(())
}

/// Every System V segment a process maps is one the record of its IPC namespace creates.
fn shm_mappings(img: &NodeImage) -> Check {
    let ids_of = |objects: &SysvIpcRecord| -> HashSet<i32> { objects.shm.iter().map(|s| s.perm.id).collect() };
    let of_namespace: Vec<HashSet<i32>> = std::iter::once(ids_of(&img.sysvipc)).chain(img.ipc.made().map(|(_, ns)| ids_of(&ns.state))).collect();
    for p in &img.processes {
        let ids = &of_namespace[img.ipc.namespace_of(p.pid).min(of_namespace.len() - 1)];
        for v in &p.vmas {
            if let Backing::SysvShm { shmid, size } = v.backing {
                if !ids.contains(&shmid) {
                    return Err(bad(vma_place(p.pid, v), format!("maps System V segment {shmid} of {size} bytes, which the image does not hold")));
                }
            }
        }
    }
    Ok(())
}

/// Each process's stream length (its record's `stream_len`) against what the chunk files hold
/// (`lens`: bytes by pid, from the chunks directory); chunk files of a pid that is not a process
/// of the image are refused too. Pure.
pub fn stream_lengths(img: &NodeImage, lens: &BTreeMap<u32, u64>) -> Check {
    let pids: HashSet<u32> = img.processes.iter().map(|p| p.pid as u32).collect();
    if let Some(pid) = lens.keys().find(|pid| !pids.contains(pid)) {
        return Err(bad(format!("pid {pid}"), "chunk files of a process that the record does not hold"));
    }
    for p in &img.processes {
        let held = lens.get(&(p.pid as u32)).copied().unwrap_or(0);
        if held != p.stream_len {
            return Err(bad(
                format!("pid {}", p.pid),
                format!("the chunk files hold {held} bytes of its stream, the record says {} (a chunk file missing?)", p.stream_len),
            ));
        }
    }
    Ok(())
}

/// The pages `img` refers to in earlier generations: each of those generations is one the
/// generation `needs` (its manifest's list), and each run lies within that generation's stream
/// of the same process (`lens`: the stream lengths of each needed generation, from its chunk
/// files, see [`chunk_stream_lengths`]).
pub fn earlier_streams(img: &NodeImage, needs: &[u64], lens: &BTreeMap<u64, BTreeMap<u32, u64>>) -> Check {
    for p in &img.processes {
        for v in &p.vmas {
            for e in &v.earlier {
                let place = format!("pid {} mapping {:#x}", p.pid, v.start);
                if !needs.contains(&e.generation) {
                    return Err(bad(place, format!("refers to generation {}, which the manifest does not list as needed", e.generation)));
                }
                let len = lens.get(&e.generation).and_then(|l| l.get(&(p.pid as u32))).copied().unwrap_or(0);
                in_stream(&place, &format!("pages of generation {}", e.generation), e.run.stream_offset, e.run.pages.saturating_mul(PAGE_SIZE), len)?;
            }
        }
    }
    Ok(())
}

/// The length of every process's stream in `chunks_dir`, from the chunk files' headers (each
/// checked, and the streams checked for gaps and overlaps).
pub fn chunk_stream_lengths(chunks_dir: &Path) -> crate::image::Result<BTreeMap<u32, u64>> {
    let listing = match crate::image::ChunkListing::read(chunks_dir, None) {
        Ok(listing) => listing,
        // A node whose processes all have empty streams has no chunk file, maybe no directory.
        Err(ImageError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut lens = BTreeMap::new();
    for pid in listing.pids() {
        lens.insert(pid, listing.open(pid)?.len());
    }
    Ok(lens)
}

/// Forged images for tests and fuzzing: a plausible node record, and a mutator that turns a
/// script of bytes into changes of a record's payload. Not in ckpt itself: only in the unit
/// tests and in a build with the `test-hooks` feature (the fuzzer's).
#[cfg(any(test, feature = "test-hooks"))]
#[doc(hidden)]
pub mod forge {
    use crate::objects::deleted::Extent;
    use crate::objects::descriptor::{FdKind, FdRecord};
    use crate::objects::file::{DeviceRecord, StdioRecord};
    use crate::objects::memory::{Backing, PageRun, SavedFile, VmaRecord};
    use crate::objects::pipe::PipeRecord;
    use crate::objects::process::{ExeRecord, ItimerRecord, MmFields, ProcessAttrs, ZombieRecord};
    use crate::objects::signals::{PendingSignal, SigactionRecord, SignalsRecord};
    use crate::objects::sysvipc::{IpcPerm, MsgRecord, SemRecord, ShmRecord, SysvIpcRecord};
    use crate::objects::thread::{AltStack, ThreadRecord};
    use crate::objects::timens::ClocksRecord;
    use crate::objects::ProcessRecord;
    use crate::ptrace::{Regs, XState};
    use crate::snapshot::NodeImage;
    use crate::PAGE_SIZE;

    fn regs() -> Regs {
        // Every field a zero varint.
        postcard::take_from_bytes::<Regs>(&[0u8; 256]).map(|(r, _)| r).unwrap_or_else(|_| unreachable!("zeros decode as registers"))
    }

    fn thread(tid: i32) -> ThreadRecord {
        let mut siginfo = vec![0u8; super::SIGINFO_LEN];
        siginfo[0] = 10; // SIGUSR1
        ThreadRecord {
            tid,
            regs: regs(),
            xstate: XState(vec![0; 832]),
            sigmask: 0,
            pending: vec![PendingSignal(siginfo)],
            altstack: AltStack::default(),
            rseq: None,
            clear_child_tid: 0x7f00_0000_1000,
            robust_list: (0x7f00_0000_2000, 24),
            comm: "worker".into(),
            creds: Default::default(),
            sched: Default::default(),
        }
    }

    fn process(pid: i32, ppid: i32, threads: &[i32]) -> ProcessRecord {
        let page = PAGE_SIZE;
        let vma = |start: u64, pages: u64, backing: Backing, runs: Vec<PageRun>| VmaRecord {
            start,
            end: start + pages * page,
            prot: (libc::PROT_READ | libc::PROT_WRITE) as u32,
            shared: false,
            file_offset: 0,
            backing,
            runs,
            attrs: Default::default(),
            earlier: Vec::new(),
            guards: Vec::new(),
        };
        let file = Backing::File { path: "/usr/bin/prog".into(), dev: 8, ino: 42, size: 3 * page, saved: None };
        let saved = Backing::File {
            path: "/dev/shm/data".into(),
            dev: 9,
            ino: 7,
            size: 100,
            saved: Some(SavedFile {
                stream_offset: 3 * page,
                len: 100,
                extents: Some(vec![Extent { file_offset: 0, len: 100, stream_offset: 3 * page }]),
                allocated: false,
            }),
        };
        ProcessRecord {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            attrs: ProcessAttrs {
                exe: ExeRecord { path: "/usr/bin/prog".into(), dev: 8, ino: 42, deleted: None },
                cwd: "/tmp".into(),
                umask: 0o022,
                personality: 0,
                rlimits: vec![(7, 1024, 4096)],
                itimers: [ItimerRecord::default(); 3],
                mm: MmFields { auxv: vec![0; 64], ..Default::default() },
                oom_score_adj: 0,
                thp_disabled: false,
                child_subreaper: false,
                root: None,
                mdwe: 0,
                loginuid: Some(1000),
            },
            threads: threads.iter().map(|&t| thread(t)).collect(),
            vmas: vec![
                vma(0x40_0000, 3, file, vec![PageRun { addr: 0x40_1000, pages: 1, stream_offset: 0 }]),
                vma(0x60_0000, 4, Backing::Anon, vec![PageRun { addr: 0x60_0000, pages: 2, stream_offset: page }]),
                vma(0x70_0000, 1, saved, vec![]),
                VmaRecord { shared: true, ..vma(0x80_0000, 1, Backing::SysvShm { shmid: 5, size: 100 }, vec![]) },
                vma(0x7ffd_0000_0000, 8, Backing::Stack, vec![]),
                VmaRecord { prot: libc::PROT_EXEC as u32, ..vma(super::VSYSCALL_START, 1, Backing::Vsyscall, vec![]) },
            ],
            fds: vec![
                FdRecord {
                    fd: 0,
                    flags: 0,
                    pos: 0,
                    description: 1,
                    kind: FdKind::CharDevice(DeviceRecord { path: "/dev/null".into(), node: None }),
                    locks: vec![],
                    owner: None,
                },
                FdRecord { fd: 1, flags: 1, pos: 0, description: 2, kind: FdKind::Stdio(StdioRecord { which: 1 }), locks: vec![], owner: None },
                FdRecord {
                    fd: 3,
                    flags: 0,
                    pos: 0,
                    description: 3,
                    kind: FdKind::Pipe(PipeRecord { ino: 11, capacity: 65536, data: Some(b"queued".to_vec()) }),
                    locks: vec![],
                    owner: None,
                },
            ],
            signals: SignalsRecord { actions: vec![SigactionRecord { signo: 10, handler: 0x40_1234, flags: 0, restorer: 0, mask: 0 }], shared_pending: vec![] },
            stream_len: 4 * page,
            posix_timers: vec![],
            ctty: None,
            mem_attrs: Default::default(),
            saved_files: Vec::new(),
            cuda: None,
            seccomp: None,
        }
    }

    /// A node record that passes validation: a parent with two threads, a child, a zombie,
    /// mappings of every common kind with stored pages, a file saved in the stream, descriptors,
    /// and one System V object of each kind.
    pub fn sample_image() -> NodeImage {
        let perm = |id| IpcPerm { id, key: 0x1234 + id, uid: 1000, gid: 1000, mode: 0o600 };
        NodeImage {
            node: "n0".into(),
            main_pid: 2,
            main_end: None,
            processes: vec![process(2, 1, &[2, 4]), process(3, 2, &[3])],
            zombies: vec![ZombieRecord { pid: 9, ppid: 3, pgid: 3, sid: 3, wait_status: 0 }],
            sysvipc: SysvIpcRecord {
                shm: vec![ShmRecord { perm: perm(5), size: 100, data: vec![1; 50] }],
                sem: vec![SemRecord { perm: perm(6), values: vec![1, 2, 3] }],
                msg: vec![MsgRecord { perm: perm(7), qbytes: 16384, messages: vec![(1, b"hello".to_vec())] }],
            },
            clocks: Some(ClocksRecord { monotonic_ns: 86_400_000_000_123, boottime_ns: 86_460_000_000_456 }),
            mounts: Default::default(),
            users: Default::default(),
            uts: Default::default(),
            ipc: Default::default(),
            net: Default::default(),
            cpu: Some(crate::objects::cpu::CpuRecord::here().clone()),
            cgroups: crate::objects::cgroups::CgroupsRecord {
                made: vec![crate::objects::cgroups::MadeCgroup {
                    hierarchy: "pids".into(),
                    path: "job".into(),
                    settings: vec![("pids.max".into(), "64".into())],
                    access: crate::objects::cgroups::CgroupAccess {
                        dir: (1000, 1000, 0o755),
                        files: (1000, 1000),
                        changed: vec![("cgroup.procs".into(), 1001, 1001, 0o664)],
                    },
                }],
                placed: vec![crate::objects::cgroups::Placed { pid: 3, cgroups: vec![0] }],
            },
        }
    }

    /// A small deterministic generator (xorshift64*), so that a failing case can be replayed
    /// from its seed.
    pub struct Rng(pub u64);

    impl Rng {
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        pub fn below(&mut self, n: usize) -> usize {
            if n == 0 {
                0
            } else {
                (self.next_u64() % n as u64) as usize
            }
        }
    }

    /// A value for a forged field: an edge (0, 1, the largest, the smallest) or anything.
    fn any_u64(rng: &mut Rng) -> u64 {
        match rng.below(6) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::MAX - rng.below(8192) as u64,
            4 => rng.next_u64() % (1 << 48),
            _ => rng.next_u64(),
        }
    }

    fn any_i32(rng: &mut Rng) -> i32 {
        match rng.below(5) {
            0 => 0,
            1 => -1,
            2 => i32::MAX,
            3 => i32::MIN,
            _ => rng.next_u64() as i32 % 8,
        }
    }

    /// Changes one to four fields of `img` the way a forger would: numbers to edge values,
    /// paths made relative, long or with a NUL, elements duplicated, swapped or dropped. Reaches
    /// the validation step every time (byte mutations mostly stop at decoding).
    pub fn tweak(img: &mut NodeImage, rng: &mut Rng) {
        for _ in 0..1 + rng.below(4) {
            let np = img.processes.len();
            let pi = rng.below(np);
            let Some(p) = img.processes.get_mut(pi) else { return };
            let vi = rng.below(p.vmas.len());
            match rng.below(24) {
                0 => p.pid = any_i32(rng),
                1 => p.ppid = any_i32(rng),
                2 => p.pgid = any_i32(rng),
                3 => {
                    let ti = rng.below(p.threads.len());
                    if let Some(t) = p.threads.get_mut(ti) {
                        t.tid = any_i32(rng);
                    }
                }
                4 => p.stream_len = any_u64(rng),
                5 => {
                    if let Some(v) = p.vmas.get_mut(vi) {
                        v.start = any_u64(rng);
                    }
                }
                6 => {
                    if let Some(v) = p.vmas.get_mut(vi) {
                        v.end = any_u64(rng);
                    }
                }
                7 => {
                    if let Some(r) = p.vmas.get_mut(vi).and_then(|v| v.runs.first_mut()) {
                        match rng.below(3) {
                            0 => r.addr = any_u64(rng),
                            1 => r.pages = any_u64(rng),
                            _ => r.stream_offset = any_u64(rng),
                        }
                    }
                }
                8 => {
                    if let Some(v) = p.vmas.get_mut(vi) {
                        v.file_offset = any_u64(rng);
                    }
                }
                9 => {
                    if let Some(Backing::File { saved: Some(s), .. }) = p.vmas.get_mut(vi).map(|v| &mut v.backing) {
                        (s.stream_offset, s.len) = (any_u64(rng), any_u64(rng));
                        if let Some(e) = s.extents.as_mut().and_then(|e| e.first_mut()) {
                            (e.file_offset, e.len, e.stream_offset) = (any_u64(rng), any_u64(rng), any_u64(rng));
                        }
                    }
                }
                10 => {
                    if let Some(Backing::SysvShm { shmid, size }) = p.vmas.get_mut(vi).map(|v| &mut v.backing) {
                        (*shmid, *size) = (any_i32(rng), any_u64(rng));
                    }
                }
                11 => {
                    let fi = rng.below(p.fds.len());
                    if let Some(f) = p.fds.get_mut(fi) {
                        f.fd = any_i32(rng);
                    }
                }
                12 => {
                    let path = [String::new(), "relative".into(), "/a\0b".into(), format!("/{}", "x".repeat(5000))][rng.below(4)].clone();
                    match rng.below(3) {
                        0 => p.attrs.cwd = path,
                        1 => p.attrs.exe.path = path,
                        _ => {
                            if let Some(Backing::File { path: f, .. }) = p.vmas.get_mut(vi).map(|v| &mut v.backing) {
                                *f = path;
                            }
                        }
                    }
                }
                13 => {
                    let copy = p.clone();
                    img.processes.insert(rng.below(np + 1), copy);
                }
                14 => {
                    let other = rng.below(np);
                    img.processes.swap(pi, other);
                }
                15 => {
                    img.processes.remove(pi);
                }
                16 => {
                    if let Some(v) = p.vmas.get(vi).cloned() {
                        p.vmas.insert(rng.below(p.vmas.len() + 1), v);
                    }
                }
                17 => {
                    if let Some(s) = img.sysvipc.shm.first_mut() {
                        s.size = any_u64(rng);
                    }
                }
                18 => {
                    if let Some(s) = img.sysvipc.sem.first_mut() {
                        s.values = vec![rng.next_u64() as u16; rng.below(40_000)];
                    }
                }
                19 => {
                    if let Some(m) = img.sysvipc.msg.first_mut() {
                        m.qbytes = any_u64(rng);
                        if let Some(msg) = m.messages.first_mut() {
                            msg.0 = any_u64(rng) as i64;
                        }
                    }
                }
                20 => img.main_pid = any_i32(rng),
                23 => img.clocks = Some(ClocksRecord { monotonic_ns: any_u64(rng) as i64, boottime_ns: any_u64(rng) as i64 }),
                21 => {
                    if let Some(v) = p.vmas.get_mut(vi) {
                        v.attrs.wipe_on_fork = rng.below(2) == 0;
                        v.attrs.lock = [Default::default(), crate::objects::memattrs::Lock::OnFault][rng.below(2)];
                    }
                }
                _ => {
                    if let Some(z) = img.zombies.first_mut() {
                        (z.pid, z.ppid) = (any_i32(rng), any_i32(rng));
                    }
                }
            }
        }
    }

    /// Applies one to four changes, chosen by `rng`, to `bytes`: flip a bit, set a byte to an
    /// edge value, overwrite a run with a big varint, insert or delete bytes, truncate, or copy a
    /// run elsewhere. Postcard is positional, so such changes reach every field of a record.
    pub fn mutate(bytes: &mut Vec<u8>, rng: &mut Rng) {
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len().max(1));
            match rng.below(8) {
                0 | 1 => {
                    if let Some(b) = bytes.get_mut(at) {
                        *b ^= 1 << rng.below(8);
                    }
                }
                2 => {
                    if let Some(b) = bytes.get_mut(at) {
                        *b = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
                    }
                }
                3 => {
                    // A large varint: the most a length or a count can say.
                    let big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
                    let n = 1 + rng.below(big.len());
                    for (i, b) in big[big.len() - n..].iter().enumerate() {
                        if let Some(x) = bytes.get_mut(at + i) {
                            *x = *b;
                        }
                    }
                }
                4 => {
                    let n = 1 + rng.below(8);
                    for _ in 0..n {
                        bytes.insert(at.min(bytes.len()), rng.next_u64() as u8);
                    }
                }
                5 => {
                    let end = (at + 1 + rng.below(16)).min(bytes.len());
                    bytes.drain(at.min(end)..end);
                }
                6 => bytes.truncate(at),
                _ => {
                    let from = rng.below(bytes.len().max(1));
                    let n = (1 + rng.below(32)).min(bytes.len().saturating_sub(from.max(at)));
                    let run: Vec<u8> = bytes[from..from + n].to_vec();
                    bytes[at..at + n].copy_from_slice(&run);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::forge::{mutate, sample_image, Rng};
    use super::*;
    use crate::objects::memory::PageRun;
    use crate::objects::process::ZombieRecord;
    use crate::snapshot::{NodeImage, PROCS_MAGIC};

    /// The check refuses `img`, and its message says where and what.
    fn refused(img: &NodeImage, place: &str, problem: &str) {
        match node_image(img) {
            Ok(()) => panic!("accepted an image that should be refused at {place:?} ({problem:?})"),
            Err(e) => {
                assert!(e.place.contains(place), "refused at {:?}, expected {place:?}: {}", e.place, e.problem);
                assert!(e.problem.contains(problem), "problem {:?} does not say {problem:?}", e.problem);
                let msg = e.in_file(Path::new("gen-000001/n0/procs.bin")).to_string();
                assert!(msg.starts_with("gen-000001/n0/procs.bin: "), "{msg}");
                assert!(msg.contains("damaged or forged"), "{msg}");
            }
        }
    }

    #[test]
    fn a_plausible_image_passes() {
        assert_eq!(node_image(&sample_image()), Ok(()));
    }

    #[test]
    fn pids_unique_and_parents_first() {
        let mut img = sample_image();
        img.processes.swap(0, 1);
        refused(&img, "pid 3", "parent 2");

        let mut img = sample_image();
        img.processes[1].pid = 2;
        img.processes[1].threads[0].tid = 2;
        refused(&img, "pid 2", "twice");

        let mut img = sample_image();
        img.processes[1].ppid = 3; // its own parent
        refused(&img, "pid 3", "parent 3");

        let mut img = sample_image();
        img.processes[1].threads[0].tid = 4; // the parent's second thread
        refused(&img, "pid 3", "main thread");

        let mut img = sample_image();
        img.processes[0].threads[1].tid = 3; // a thread with a process's pid
        refused(&img, "pid", "");

        let mut img = sample_image();
        img.processes[0].pid = 1;
        refused(&img, "pid 1", "not a pid");

        let mut img = sample_image();
        img.zombies.push(ZombieRecord { pid: 10, ppid: 77, pgid: 3, sid: 3, wait_status: 0 });
        refused(&img, "zombie 10", "parent 77");

        let mut img = sample_image();
        img.main_pid = 55;
        refused(&img, "node", "main pid 55");
    }

    #[test]
    fn mappings_aligned_ordered_and_in_user_space() {
        let mut img = sample_image();
        img.processes[0].vmas[1].start += 1;
        refused(&img, "pid 2, mapping 0x600001", "page-aligned");

        let mut img = sample_image();
        img.processes[0].vmas[1].start = 0x40_2000; // inside the first
        refused(&img, "pid 2, mapping 0x402000", "overlaps");

        let mut img = sample_image();
        let v = &mut img.processes[0].vmas[4];
        (v.start, v.end) = (USER_SPACE_END, USER_SPACE_END + 0x1000);
        refused(&img, "pid 2", "outside user space");

        let mut img = sample_image();
        img.processes[0].vmas[1].prot |= 0x100;
        refused(&img, "pid 2", "unknown bits");
    }

    #[test]
    fn guard_pages_inside_private_mappings_in_order_and_never_stored() {
        // vmas[1]: 0x600000, 4 anonymous pages, the first two stored; vmas[3] shared.
        let mut img = sample_image();
        img.processes[0].vmas[1].guards = vec![(0x60_2000, 1), (0x60_3000, 1)];
        assert_eq!(node_image(&img), Ok(()));

        let mut img = sample_image();
        img.processes[0].vmas[1].guards = vec![(0x60_1000, 1)]; // a stored page
        refused(&img, "pid 2, mapping 0x600000", "stored as pages too");

        let mut img = sample_image();
        img.processes[0].vmas[1].guards = vec![(0x60_3000, 2)]; // past the end
        refused(&img, "pid 2, mapping 0x600000", "not inside the mapping");

        let mut img = sample_image();
        img.processes[0].vmas[1].guards = vec![(0x60_3000, 1), (0x60_2000, 1)]; // out of order
        refused(&img, "pid 2, mapping 0x600000", "in order");

        let mut img = sample_image();
        img.processes[0].vmas[1].guards = vec![(0x60_2000, 0)];
        refused(&img, "pid 2, mapping 0x600000", "not inside the mapping");

        let mut img = sample_image();
        img.processes[0].vmas[3].guards = vec![(0x80_0000, 1)];
        refused(&img, "pid 2", "not private memory");
    }

    #[test]
    fn memory_flags_where_the_kernel_allows_them() {
        use crate::objects::memattrs::{Lock, VmaAttrs};
        let mut img = sample_image();
        img.processes[0].vmas[1].attrs = VmaAttrs { lock: Lock::Locked, wipe_on_fork: true, dont_fork: true, ..Default::default() };
        img.processes[0].vmas[0].attrs = VmaAttrs { lock: Lock::OnFault, dont_dump: true, ..Default::default() };
        assert_eq!(node_image(&img), Ok(()));

        img.processes[0].vmas[0].attrs.wipe_on_fork = true; // a file mapping
        refused(&img, "pid 2, mapping 0x400000", "wiped on fork");

        let mut img = sample_image();
        img.processes[0].vmas[5].attrs.lock = Lock::Locked; // vsyscall
        refused(&img, "pid 2", "kernel's own mappings");
    }

    /// Droppable memory is private and stores no page: an image that says otherwise is forged.
    #[test]
    fn droppable_memory_holds_no_pages() {
        use crate::objects::memory::Backing;
        let mut img = sample_image();
        let v = &mut img.processes[0].vmas[1];
        v.backing = Backing::Droppable;
        v.runs.clear();
        v.attrs.wipe_on_fork = true;
        assert_eq!(node_image(&img), Ok(()));
        img.processes[0].vmas[1].runs.push(PageRun { addr: 0x60_0000, pages: 1, stream_offset: 0 });
        refused(&img, "pid 2, mapping 0x600000", "droppable memory");
    }

    /// A GPU device's inherited mapping stores no page and names an absolute path.
    #[test]
    fn an_inherited_gpu_mapping_holds_no_pages() {
        use crate::objects::memory::Backing;
        let mut img = sample_image();
        let v = &mut img.processes[0].vmas[1];
        v.backing = Backing::GpuInherited { path: "/dev/nvidiactl".into() };
        v.runs.clear();
        assert_eq!(node_image(&img), Ok(()));
        img.processes[0].vmas[1].runs.push(PageRun { addr: 0x60_0000, pages: 1, stream_offset: 0 });
        refused(&img, "pid 2, mapping 0x600000", "GPU device's mapping");
        let mut img = sample_image();
        img.processes[0].vmas[1].runs.clear();
        img.processes[0].vmas[1].backing = Backing::GpuInherited { path: "nvidiactl".into() };
        refused(&img, "pid 2, mapping 0x600000", "not an absolute path");
    }

    #[test]
    fn stored_pages_inside_their_mapping_and_the_stream() {
        let mut img = sample_image();
        img.processes[0].vmas[1].runs[0].pages = 5; // the mapping has 4
        refused(&img, "pid 2, mapping 0x600000", "not inside the mapping");

        let mut img = sample_image();
        img.processes[0].vmas[1].runs[0].pages = u64::MAX / 2; // overflows pages * PAGE_SIZE
        refused(&img, "pid 2, mapping 0x600000", "not inside");

        let mut img = sample_image();
        img.processes[0].vmas[1].runs[0].stream_offset = u64::MAX - 10;
        refused(&img, "pid 2, mapping 0x600000", "beyond the process's stream");

        let mut img = sample_image();
        img.processes[0].stream_len = PAGE_SIZE;
        refused(&img, "pid 2", "beyond the process's stream");

        let mut img = sample_image();
        img.processes[0].vmas[1].runs.push(PageRun { addr: 0x60_1000, pages: 1, stream_offset: 0 });
        refused(&img, "pid 2, mapping 0x600000", "stored twice");

        let mut img = sample_image();
        if let Backing::File { saved: Some(s), .. } = &mut img.processes[0].vmas[2].backing {
            s.len = u64::MAX;
        }
        refused(&img, "pid 2, mapping 0x700000", "saved contents");

        // A saved in-memory file's extents (format 28).
        use crate::objects::deleted::Extent;
        let with_extents = |extents: Vec<Extent>| {
            let mut img = sample_image();
            if let Backing::File { saved: Some(s), .. } = &mut img.processes[0].vmas[2].backing {
                s.extents = Some(extents);
            }
            img
        };
        let page = PAGE_SIZE;
        let e = |file_offset, len, stream_offset| Extent { file_offset, len, stream_offset };
        refused(&with_extents(vec![e(0, 100, u64::MAX - 10)]), "pid 2, mapping 0x700000", "beyond the process's stream");
        refused(&with_extents(vec![e(0, 200, 3 * page)]), "pid 2, mapping 0x700000", "beyond the file's 100 bytes");
        refused(&with_extents(vec![e(0, 0, 3 * page)]), "pid 2, mapping 0x700000", "is empty");
        refused(&with_extents(vec![e(50, 50, 3 * page), e(0, 10, 3 * page + 50)]), "pid 2, mapping 0x700000", "out of order");
        refused(&with_extents(vec![e(0, 50, 3 * page), e(60, 40, 3 * page)]), "pid 2, mapping 0x700000", "share the stream");
        // The same file saved by a second mapping (the stack's place taken by a copy of it).
        let mut img = sample_image();
        img.processes[0].vmas[4].backing = img.processes[0].vmas[2].backing.clone();
        refused(&img, "pid 2, mapping 0x7ffd00000000", "saved twice");

        let mut img = sample_image();
        img.processes[0].vmas[5].runs.push(PageRun { addr: VSYSCALL_START, pages: 1, stream_offset: 0 });
        refused(&img, "pid 2", "not in the stream");
    }

    #[test]
    fn paths_the_kernel_can_take() {
        let mut img = sample_image();
        img.processes[0].attrs.cwd = "/tmp/\0x".into();
        refused(&img, "pid 2", "NUL");

        let mut img = sample_image();
        img.processes[0].attrs.exe.path = format!("/{}", "a".repeat(PATH_MAX));
        refused(&img, "pid 2", "PATH_MAX");

        let mut img = sample_image();
        img.processes[1].fds[0].kind = FdKind::CharDevice(DeviceRecord { path: "dev/null".into(), node: None });
        refused(&img, "pid 3, fd 0", "absolute");
    }

    #[test]
    fn only_devices_without_state_are_made_again() {
        use crate::objects::file::DeviceNode;
        let with_node = |mode: u32, rdev: u64| {
            let mut img = sample_image();
            let node = DeviceNode { rdev, mode, uid: 0, gid: 0, removed: true };
            img.processes[1].fds[0].kind = FdKind::CharDevice(DeviceRecord { path: "/tmp/null".into(), node: Some(node) });
            img
        };
        assert!(node_image(&with_node(libc::S_IFCHR | 0o600, libc::makedev(1, 3))).is_ok());
        // /dev/mem, a block device, a node that is no device: a root restart must never make them.
        refused(&with_node(libc::S_IFCHR | 0o600, libc::makedev(1, 1)), "pid 3, fd 0", "not one reopened by number");
        refused(&with_node(libc::S_IFBLK | 0o600, libc::makedev(1, 3)), "pid 3, fd 0", "not one reopened by number");
        refused(&with_node(libc::S_IFREG | 0o600, libc::makedev(1, 3)), "pid 3, fd 0", "not one reopened by number");
    }

    #[test]
    fn message_queues_fit_their_attributes() {
        use crate::objects::mqueue::{Message, MqueueRecord, Notification, QueueState};
        let with_queue = |edit: &dyn Fn(&mut MqueueRecord)| {
            let mut img = sample_image();
            let queue = QueueState {
                maxmsg: 2,
                msgsize: 8,
                mode: 0o640,
                uid: 0,
                gid: 0,
                messages: vec![Message { priority: 9, data: b"12345678".to_vec() }],
                notify: None,
            };
            let mut m = MqueueRecord { name: "/q".into(), dev: 1, ino: 2, unlinked: false, queue: Some(queue) };
            edit(&mut m);
            img.processes[0].fds[2].kind = FdKind::Mqueue(m);
            img
        };
        node_image(&with_queue(&|_| {})).unwrap();
        refused(&with_queue(&|m| m.name = "q".into()), "pid 2, fd 3", "queue name");
        refused(&with_queue(&|m| m.name = "/a/b".into()), "pid 2, fd 3", "queue name");
        refused(&with_queue(&|m| m.name = format!("/{}", "q".repeat(NAME_MAX + 1))), "pid 2, fd 3", "queue name");
        fn q(m: &mut MqueueRecord) -> &mut QueueState {
            m.queue.as_mut().unwrap()
        }
        refused(&with_queue(&|m| q(m).maxmsg = u64::MAX), "pid 2, fd 3", "beyond the kernel's");
        refused(&with_queue(&|m| q(m).msgsize = 0), "pid 2, fd 3", "beyond the kernel's");
        refused(&with_queue(&|m| q(m).messages = vec![Message { priority: 0, data: vec![] }; 3]), "pid 2, fd 3", "3 messages");
        refused(&with_queue(&|m| q(m).messages[0].data.push(0)), "pid 2, fd 3", "9 bytes");
        refused(&with_queue(&|m| q(m).messages[0].priority = 32768), "pid 2, fd 3", "priority 32768");
        let notify = |pid, how| Some(Notification { pid, how });
        refused(&with_queue(&|m| q(m).notify = notify(0, Notify::Nothing)), "pid 2, fd 3", "registered");
        refused(&with_queue(&|m| q(m).notify = notify(2, Notify::Signal(65))), "pid 2, fd 3", "signal 65");
    }

    #[test]
    fn descriptors_in_flight_match_their_queue() {
        let with_rights = |carried: Vec<Vec<Carried>>| {
            let mut img = sample_image();
            let queue = vec![b"with".to_vec(), b"without".to_vec()];
            let socket = UnixRecord { ino: 7, sock_type: libc::SOCK_DGRAM, peer: Some(8), queue, ..UnixRecord::default() };
            img.processes[0].fds[2].kind = FdKind::UnixQueue(crate::objects::unix::UnixQueueRecord { socket, carried, senders: Vec::new() });
            img
        };
        let alone = |kind: FdKind| Carried::Alone(Box::new(FdRecord { fd: -1, flags: 0, pos: 0, description: 9, kind, locks: vec![], owner: None }));
        let file = || alone(FdKind::File(FileRecord { path: "/tmp/f".into(), dev: 1, ino: 2, size: 3 }));
        node_image(&with_rights(vec![vec![Carried::Shared { description: 1 }, file()], vec![]])).unwrap();
        refused(&with_rights(vec![vec![file()]]), "pid 2, fd 3", "for 1 messages, 2 queued");
        refused(&with_rights(vec![vec![Carried::Shared { description: 1 }; SCM_MAX_FD + 1], vec![]]), "pid 2, fd 3", "descriptors carried by one message");
        refused(&with_rights(vec![vec![alone(FdKind::Stdio(StdioRecord { which: 1 }))], vec![]]), "pid 2, fd 3", "not restored so");
        refused(&with_rights(vec![vec![alone(FdKind::File(FileRecord { path: "tmp/f".into(), dev: 1, ino: 2, size: 3 }))], vec![]]), "pid 2, fd 3", "absolute");
    }

    #[test]
    fn senders_of_datagrams_match_their_queue() {
        let with_senders = |peer: Option<u32>, senders: Vec<Option<Vec<u8>>>| {
            let mut img = sample_image();
            let (name, queue) = (Some(b"\0recv".to_vec()), vec![b"one".to_vec(), b"two".to_vec()]);
            let socket = UnixRecord { ino: 7, sock_type: libc::SOCK_DGRAM, name, peer, queue, ..UnixRecord::default() };
            let carried = vec![vec![]; 2];
            img.processes[0].fds[2].kind = FdKind::UnixQueue(crate::objects::unix::UnixQueueRecord { socket, carried, senders });
            img
        };
        node_image(&with_senders(None, vec![Some(b"\0a".to_vec()), None])).unwrap();
        node_image(&with_senders(None, vec![Some(b"/tmp/s".to_vec()), Some(b"\0a".to_vec())])).unwrap();
        refused(&with_senders(None, vec![None]), "pid 2, fd 3", "senders for 1 messages, 2 queued");
        refused(&with_senders(Some(8), vec![None, None]), "pid 2, fd 3", "connected");
        refused(&with_senders(None, vec![Some(vec![]), None]), "pid 2, fd 3", "0 bytes");
        refused(&with_senders(None, vec![Some(vec![b'p'; 200]), None]), "pid 2, fd 3", "sender's address");
    }

    #[test]
    fn descriptors_signals_and_threads_bounded() {
        let mut img = sample_image();
        img.processes[0].fds[2].fd = -1;
        refused(&img, "pid 2, fd -1", "out of");

        let mut img = sample_image();
        img.processes[0].fds[2].fd = 1;
        refused(&img, "pid 2, fd 1", "twice");

        let mut img = sample_image();
        if let FdKind::Pipe(p) = &mut img.processes[0].fds[2].kind {
            p.capacity = 2;
        }
        refused(&img, "pid 2, fd 3", "in a buffer of 2");

        let mut img = sample_image();
        img.processes[0].threads[0].pending[0].0.truncate(3);
        refused(&img, "pid 2", "siginfo");

        let mut img = sample_image();
        img.processes[0].signals.actions[0].signo = 65;
        refused(&img, "pid 2", "signal 65");

        let mut img = sample_image();
        img.processes[0].attrs.mm.auxv = vec![0; MAX_AUXV + 1];
        refused(&img, "pid 2", "auxiliary vector");

        let mut img = sample_image();
        img.processes[0].attrs.rlimits.push((99, 0, 0));
        refused(&img, "pid 2", "resource limit 99");
    }

    #[test]
    fn clocks_a_time_namespace_can_show() {
        use crate::objects::timens::ClocksRecord;
        let mut img = sample_image();
        img.clocks = Some(ClocksRecord { monotonic_ns: -1, boottime_ns: 0 });
        refused(&img, "the job's clocks", "CLOCK_MONOTONIC at -1 ns");
        img.clocks = Some(ClocksRecord { monotonic_ns: 0, boottime_ns: i64::MAX });
        refused(&img, "the job's clocks", "CLOCK_BOOTTIME");
        // An image of format 7 has none.
        img.clocks = None;
        assert!(node_image(&img).is_ok());
    }

    #[test]
    fn system_v_objects_within_kernel_limits() {
        let mut img = sample_image();
        img.sysvipc.shm[0].data = vec![1; 101]; // the segment has 100 bytes
        refused(&img, "System V shared memory segment 5", "101 bytes of contents");

        let mut img = sample_image();
        img.sysvipc.sem[0].values = vec![];
        refused(&img, "System V semaphore set 6", "0 semaphores");

        let mut img = sample_image();
        img.sysvipc.sem[0].values[0] = 40000;
        refused(&img, "System V semaphore set 6", "SEMVMX");

        let mut img = sample_image();
        img.sysvipc.msg[0].qbytes = 2;
        refused(&img, "System V message queue 7", "limited to 2");

        let mut img = sample_image();
        img.sysvipc.msg[0].messages[0].0 = 0;
        refused(&img, "System V message queue 7", "type 0");

        let mut img = sample_image();
        img.sysvipc.shm[0].perm.id = 8; // the mapping names segment 5
        refused(&img, "pid 2, mapping 0x800000", "segment 5");
    }

    /// A UTS (IPC, network) namespace that belongs to a user namespace above its maker's own
    /// is made on the maker's way down: an owner off that way, or given to the job's own
    /// namespace, is refused.
    #[test]
    fn a_namespace_belongs_to_a_user_namespace_on_its_makers_way_down() {
        use crate::objects::namespaces::MadeNamespace;
        use crate::objects::user_namespaces::{IdRange, UserNsRecord};
        let user = |made_from: u32, pids: Vec<i32>| UserNsRecord {
            made_from,
            pids,
            uid_map: vec![IdRange { inside: 0, outside: 1000, count: 1 }],
            gid_map: vec![IdRange { inside: 0, outside: 1000, count: 1 }],
            setgroups_allowed: false,
        };
        let mut img = sample_image();
        // Pid 3 in user namespace 2, made in 1, which no process is in (bubblewrap's shape);
        // user namespace 3, a sibling of 1, holds pid 2.
        img.users.namespaces = vec![Default::default(), user(0, vec![]), user(1, vec![3]), user(0, vec![2])];
        let names = crate::objects::uts::UtsNames { hostname: "box".into(), domainname: "(none)".into() };
        let uts = |owner| vec![MadeNamespace::default(), MadeNamespace { pids: vec![3], state: names.clone(), owner }];
        for fine in [None, Some(1), Some(0)] {
            img.uts.namespaces = uts(fine);
            assert_eq!(node_image(&img), Ok(()), "owner {fine:?}");
        }
        img.uts.namespaces = uts(Some(3));
        refused(&img, "the job's UTS namespaces", "not on its way down");
        img.uts.namespaces = uts(None);
        img.uts.namespaces[0].owner = Some(1);
        refused(&img, "the job's UTS namespaces", "an owner");
    }

    #[test]
    fn segments_are_looked_up_in_the_ipc_namespace_of_their_process() {
        use crate::objects::namespaces::MadeNamespace;
        // Pids 2 and 3 map segment 5: in a namespace the job made, the segment must be that
        // one's.
        let mut img = sample_image();
        let objects = std::mem::take(&mut img.sysvipc);
        img.ipc.namespaces = vec![MadeNamespace::default(), MadeNamespace { pids: vec![2, 3], state: objects.clone(), owner: None }];
        assert_eq!(node_image(&img), Ok(()));
        img.ipc.namespaces[1].pids = vec![3];
        refused(&img, "pid 2, mapping 0x800000", "segment 5");
        // The objects of the namespace are checked as the job's are.
        img.ipc.namespaces[1].pids = vec![2, 3];
        img.ipc.namespaces[1].state.sem[0].values = vec![];
        refused(&img, "the job's IPC namespaces", "0 semaphores");
        // A namespace without a process, or the job's own with processes, is refused.
        let mut img = sample_image();
        img.ipc.namespaces = vec![MadeNamespace::default(), MadeNamespace { pids: vec![], state: objects.clone(), owner: None }];
        refused(&img, "the job's IPC namespaces", "no process");
        img.ipc.namespaces = vec![MadeNamespace { pids: vec![2], state: Default::default(), owner: None }];
        refused(&img, "the job's IPC namespaces", "lists processes");
    }

    #[test]
    fn node_names_are_plain() {
        for name in ["", ".", "..", "../x", "/etc", "a/b", "MANIFEST", "a\0b"] {
            assert!(node_name(name).is_err(), "{name:?} accepted");
        }
        assert!(node_name(&"n".repeat(NAME_MAX + 1)).is_err());
        for name in ["n0", "node-17.cluster", "..."] {
            assert_eq!(node_name(name), Ok(()), "{name:?}");
        }
        let mut img = sample_image();
        img.node = "../../etc".into();
        refused(&img, "node", "plain file name");
    }

    #[test]
    fn stream_lengths_agree_with_the_chunk_files() {
        let img = sample_image();
        let full: BTreeMap<u32, u64> = [(2, 4 * PAGE_SIZE), (3, 4 * PAGE_SIZE)].into();
        assert_eq!(stream_lengths(&img, &full), Ok(()));
        let mut short = full.clone();
        short.insert(3, PAGE_SIZE);
        let e = stream_lengths(&img, &short).unwrap_err();
        assert!(e.place == "pid 3" && e.problem.contains("a chunk file missing"), "{e:?}");
        let mut stray = full.clone();
        stray.insert(77, 1);
        assert_eq!(stream_lengths(&img, &stray).unwrap_err().place, "pid 77");
        let mut gone = full;
        gone.remove(&2);
        assert!(stream_lengths(&img, &gone).is_err());
    }

    /// Forged procs files, with valid checksums (they pass the checksum layer): decoding and
    /// validation return an error or an image, never panic, never overflow (run this in a debug
    /// build too: `cargo test -p ckpt-core validate`), and never allocate without bound.
    #[test]
    fn forged_procs_files_never_panic() {
        let payload = postcard::to_stdvec(&sample_image()).unwrap();
        let path = Path::new("gen-000001/n0/procs.bin");
        let (mut accepted, mut refused, mut invalid) = (0, 0, 0);
        for seed in 1..=20_000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut forged = payload.clone();
            mutate(&mut forged, &mut rng);
            let file = crate::image::record::encode_record(PROCS_MAGIC, &forged);
            match std::panic::catch_unwind(|| NodeImage::from_bytes(&file, path)) {
                Ok(Ok(img)) => {
                    // What passes must be safe to use: the sums the restorer makes hold.
                    for p in &img.processes {
                        for v in &p.vmas {
                            let _ = v.stored_pages().checked_mul(PAGE_SIZE).expect("bounded by the stream");
                        }
                    }
                    accepted += 1
                }
                Ok(Err(e)) => {
                    assert!(e.to_string().contains("procs.bin"), "error does not name the file: {e}");
                    invalid += usize::from(matches!(e, ImageError::Invalid { .. }));
                    refused += 1
                }
                Err(_) => panic!("decoding or validating the forged procs file of seed {seed} panicked"),
            }
        }
        // Most forgeries are refused; some (a changed address inside its page, a flipped flag)
        // are as good as the original.
        // Some forgeries decode (postcard takes many byte strings) and reach validation;
        // `forged_fields_never_panic` reaches it every time.
        assert!(refused > 10_000 && accepted > 0 && invalid > 100, "accepted {accepted}, refused {refused} ({invalid} by validation)");
    }

    /// Forged fields (edge values, bad paths, duplicated, swapped and dropped elements):
    /// validation refuses or accepts, never panics or overflows; what it accepts keeps the
    /// promises the restore code relies on.
    #[test]
    fn forged_fields_never_panic() {
        let mut refused = 0;
        for seed in 1..=20_000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut img = sample_image();
            super::forge::tweak(&mut img, &mut rng);
            match std::panic::catch_unwind(|| node_image(&img)) {
                Err(_) => panic!("validating the forged image of seed {seed} panicked"),
                Ok(Err(_)) => refused += 1,
                Ok(Ok(())) => {
                    for p in &img.processes {
                        let mut prev = 0;
                        for v in &p.vmas {
                            assert!(v.start >= prev && v.start < v.end, "seed {seed}: mappings accepted out of order");
                            prev = v.end;
                            for r in &v.runs {
                                let end = r.stream_offset.checked_add(r.pages * PAGE_SIZE);
                                assert!(end.is_some_and(|e| e <= p.stream_len), "seed {seed}: pages beyond the stream accepted");
                            }
                        }
                    }
                }
            }
        }
        assert!(refused > 10_000, "only {refused} of 20,000 forged images refused");
    }

    /// Forged record headers, manifests and chunk headers: an error, never a panic.
    #[test]
    fn forged_headers_and_manifests_never_panic() {
        let path = Path::new("gen-000001/MANIFEST");
        let mut m = crate::image::Manifest::new(1, vec!["n0".into()]);
        m.files.push(crate::image::FileEntry { path: "n0/procs.bin".into(), size: 10, crc32c: 1 });
        let body = m.to_bytes(path).unwrap();
        let body = &body[body.iter().position(|&b| b == b'\n').unwrap() + 1..];
        let header = crate::image::ChunkHeader {
            version: crate::image::FORMAT_VERSION,
            codec: crate::image::CodecId::None,
            pid: 2,
            offset: 0,
            raw_len: 4096,
            stored_len: 4096,
            data_crc32c: 0,
            block_shift: crate::image::chunk::BLOCK_SHIFT,
        }
        .to_bytes();
        let record = crate::image::record::encode_record(PROCS_MAGIC, &postcard::to_stdvec(&sample_image()).unwrap());
        for seed in 1..=5_000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            // The manifest, its first line rewritten to match the forged body.
            let mut forged = body.to_vec();
            mutate(&mut forged, &mut rng);
            let mut file = format!("CKPT-MANIFEST {} crc32c={:08x}\n", crate::image::FORMAT_VERSION, crc32c::crc32c(&forged)).into_bytes();
            file.extend_from_slice(&forged);
            let _ = crate::image::Manifest::from_bytes(&file, path);
            // A chunk header, its own checksum made right.
            let mut h = header.to_vec();
            mutate(&mut h, &mut rng);
            h.resize(crate::image::CHUNK_HEADER_LEN, 0);
            let crc = crc32c::crc32c(&h[..52]);
            h[52..56].copy_from_slice(&crc.to_le_bytes());
            let _ = crate::image::ChunkHeader::parse(h.as_slice().try_into().unwrap(), Path::new("p2-0000000000000000"));
            // A record file's header and payload as they are (checksums mostly wrong).
            let mut r = record.clone();
            mutate(&mut r, &mut rng);
            let _ = NodeImage::from_bytes(&r, Path::new("procs.bin"));
        }
    }
}
