//! A process: its identity in the tree, and the process-wide attributes that are not an object of
//! their own (working directory, umask, personality, resource limits, interval timers, the mm
//! fields that describe its address space to the kernel). Also the record that gathers every
//! part of one process in the image.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::{descriptor::FdRecord, memory::VmaRecord, signals::SignalsRecord, thread::ThreadRecord};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{RemoteTask, Tid};

/// Everything one process is made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Pid inside the job's PID namespace (recreated exactly); `ppid` 1 means the job's init.
    pub pid: Tid,
    pub ppid: Tid,
    /// Process group and session, as pids in the job's namespace.
    pub pgid: Tid,
    pub sid: Tid,
    pub attrs: ProcessAttrs,
    pub threads: Vec<ThreadRecord>,
    pub vmas: Vec<VmaRecord>,
    pub fds: Vec<FdRecord>,
    pub signals: SignalsRecord,
    /// Bytes of this process's memory stream in the chunk files.
    pub stream_len: u64,
    /// POSIX timers (timer_create), by id.
    pub posix_timers: Vec<super::posix_timer::PosixTimerRecord>,
    /// A session leader's controlling terminal, when it is one of the job's ptys.
    pub ctty: Option<super::pty::ControllingTty>,
    /// mlockall(MCL_FUTURE) and membarrier registrations (see `memattrs`).
    pub mem_attrs: super::memattrs::MemAttrsRecord,
    /// Deleted files and memfds too large for their descriptors' records: their contents are in
    /// this process's stream (see `deleted`).
    pub saved_files: Vec<super::deleted::SavedFileContents>,
    /// A CUDA process: the NVIDIA driver moved its GPU state into its memory before the freeze
    /// (`crate::gpu`), and a restart has it put back. Format 23 (none from an older image, whose
    /// checkpoint refused such processes).
    #[serde(deserialize_with = "crate::image::since::since::<23, _, _>")]
    pub cuda: Option<crate::gpu::CudaRecord>,
    /// Its threads' seccomp sandboxes (see `seccomp`); None when none has one. Format 27 (none
    /// from an older image, whose checkpoint refused a sandboxed process).
    #[serde(deserialize_with = "crate::image::since::since::<27, _, _>")]
    pub seccomp: Option<super::seccomp::SeccompRecord>,
}

/// A child that has exited and that its parent has not reaped yet.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ZombieRecord {
    pub pid: Tid,
    pub ppid: Tid,
    pub pgid: Tid,
    pub sid: Tid,
    /// The status its parent's wait will report (as waitpid encodes it).
    pub wait_status: i32,
}

/// Where a process sits in the tree: pid, parent, group and session, all as seen inside the job.
/// A parent outside the job (the job's init is not in the image) reads as 1 or 0.
pub fn tree_links(host_pid: Tid) -> Result<(Tid, Tid, Tid, Tid)> {
    tree_links_from(host_pid, &procfs::status(host_pid)?, |_| None)
}

/// [`tree_links`] from the process's status `status`; `known_pid` gives a host pid's pid in
/// the job where the caller knows it (its parent's is read from /proc where it does not).
pub fn tree_links_from(host_pid: Tid, status: &procfs::Status, known_pid: impl Fn(Tid) -> Option<Tid>) -> Result<(Tid, Tid, Tid, Tid)> {
    let inner = |v: &Option<Vec<i32>>, what: &str| {
        v.as_ref().and_then(|v| v.last().copied()).ok_or_else(|| Error::Other(format!("/proc/{host_pid}/status has no {what}")))
    };
    let pid = inner(&status.nspid, "NSpid")?;
    let pgid = inner(&status.nspgid, "NSpgid")?;
    let sid = inner(&status.nssid, "NSsid")?;
    let ppid = known_pid(status.ppid).unwrap_or_else(|| procfs::ns_tid(status.ppid).unwrap_or(0));
    Ok((pid, ppid, pgid, sid))
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ItimerRecord {
    pub interval_sec: u64,
    pub interval_usec: u64,
    pub value_sec: u64,
    pub value_usec: u64,
}

/// The fields of PR_SET_MM_MAP, plus the current program break.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MmFields {
    pub start_code: u64,
    pub end_code: u64,
    pub start_data: u64,
    pub end_data: u64,
    pub start_brk: u64,
    pub brk: u64,
    pub start_stack: u64,
    pub arg_start: u64,
    pub arg_end: u64,
    pub env_start: u64,
    pub env_end: u64,
    pub auxv: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExeRecord {
    /// Its path (without " (deleted)" for a deleted one).
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    /// An executable deleted since the process started (rebuilt or upgraded under it), kept as
    /// a deleted file is: a restart gives the process a copy ([`super::deleted::executable_copy`]).
    /// Format 16 (none from an older image, whose checkpoint refused it).
    #[serde(deserialize_with = "crate::image::since::since::<16, _, _>")]
    pub deleted: Option<super::deleted::DeletedFileRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessAttrs {
    pub exe: ExeRecord,
    pub cwd: String,
    pub umask: u32,
    pub personality: u64,
    /// (resource, soft, hard)
    pub rlimits: Vec<(u32, u64, u64)>,
    /// ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF.
    pub itimers: [ItimerRecord; 3],
    pub mm: MmFields,
    /// /proc/PID/oom_score_adj.
    pub oom_score_adj: i32,
    /// prctl(PR_GET_THP_DISABLE).
    pub thp_disabled: bool,
    /// prctl(PR_GET_CHILD_SUBREAPER).
    pub child_subreaper: bool,
    /// Its root directory when it changed it (chroot: a directory of its mount namespace other
    /// than the namespace's root), as the namespace shows it. Given back last of all, after
    /// its files are opened by their paths ([`restore_root`]). Format 16 (none from an older
    /// image, whose checkpoint refused such a process).
    #[serde(deserialize_with = "crate::image::since::since::<16, _, _>")]
    pub root: Option<String>,
    /// prctl(PR_GET_MDWE): memory that is never writable and executable (PR_MDWE_REFUSE_EXEC_GAIN,
    /// 1; with PR_MDWE_NO_INHERIT, 2), as systemd's MemoryDenyWriteExecute sets it. Given back
    /// last of the process's memory ([`restore_mdwe`]): it can never be cleared. Format 26 (0
    /// from an older image).
    #[serde(deserialize_with = "crate::image::since::since::<26, _, _>")]
    pub mdwe: u32,
    /// /proc/PID/loginuid, the audit login id (4294967295 unset), where the kernel has one.
    /// Given back by the process itself ([`restore_loginuid`]) where it differs from the one
    /// it inherits. Format 31 (none from an older image).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub loginuid: Option<u32>,
}

const PR_SET_MDWE: u64 = 65;
const PR_GET_MDWE: u64 = 66;
/// The flags PR_SET_MDWE knows (REFUSE_EXEC_GAIN, NO_INHERIT).
pub const MDWE_FLAGS: u32 = 0b11;

fn itimer_from(b: &[u8]) -> ItimerRecord {
    let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    ItimerRecord { interval_sec: w(0), interval_usec: w(1), value_sec: w(2), value_usec: w(3) }
}

/// An interval timer that had just fired reads as zero time left until its signal is taken (the
/// kernel re-arms ITIMER_REAL then); given to setitimer as it is, that would stop the timer. It
/// restarts with a full interval instead.
fn rearmed(t: &ItimerRecord) -> ItimerRecord {
    let mut t = *t;
    if t.value_sec == 0 && t.value_usec == 0 {
        (t.value_sec, t.value_usec) = (t.interval_sec, t.interval_usec);
    }
    t
}

fn itimer_bytes(t: &ItimerRecord) -> Vec<u8> {
    [t.interval_sec, t.interval_usec, t.value_sec, t.value_usec].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The calls [`read_answers`] reads the answers of.
pub struct AttrsAsked {
    itimers: [Asked; 3],
    brk: Asked,
    thp_disabled: Asked,
    child_subreaper: Asked,
    mdwe: Asked,
}

/// Asks the stopped process what only it can tell: its interval timers, its break, two prctl
/// values.
pub fn ask_attrs(q: &mut Questions) -> Result<AttrsAsked> {
    let itimer = |q: &mut Questions, which: u64| q.ask_into("getitimer", libc::SYS_getitimer, 32, |at| [which, at]);
    Ok(AttrsAsked {
        itimers: [itimer(q, 0)?, itimer(q, 1)?, itimer(q, 2)?],
        brk: q.ask("brk", libc::SYS_brk, &[0]),
        thp_disabled: q.ask("prctl(PR_GET_THP_DISABLE)", libc::SYS_prctl, &[libc::PR_GET_THP_DISABLE as u64, 0, 0, 0, 0]),
        // It writes the value through a pointer.
        child_subreaper: q.ask_into("prctl(PR_GET_CHILD_SUBREAPER)", libc::SYS_prctl, 4, |at| [libc::PR_GET_CHILD_SUBREAPER as u64, at])?,
        mdwe: q.ask("prctl(PR_GET_MDWE)", libc::SYS_prctl, &[PR_GET_MDWE, 0, 0, 0, 0]),
    })
}

/// What a process told about itself ([`ask_attrs`]), read from the answers on the thread that
/// traces it; the rest of its attributes come from outside ([`capture_attrs`]).
pub struct InsideAttrs {
    itimers: [ItimerRecord; 3],
    brk: u64,
    thp_disabled: bool,
    child_subreaper: bool,
    mdwe: u32,
}

/// Reads the answers to [`ask_attrs`].
pub fn read_answers(answers: &Answers, asked: &AttrsAsked) -> Result<InsideAttrs> {
    let mut itimers = [ItimerRecord::default(); 3];
    for (t, &a) in itimers.iter_mut().zip(&asked.itimers) {
        *t = itimer_from(answers.bytes(a)?);
    }
    let mdwe = match answers.value(asked.mdwe) {
        Ok(flags) => flags as u32,
        // Before Linux 6.3: no such thing.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => 0,
        Err(e) => return Err(e.into()),
    };
    Ok(InsideAttrs {
        itimers,
        brk: answers.value(asked.brk)?,
        thp_disabled: answers.value(asked.thp_disabled)? != 0,
        child_subreaper: answers.bytes(asked.child_subreaper)? != [0u8; 4],
        mdwe,
    })
}

/// Captures the process-wide attributes of a frozen process: from /proc (`status` is its
/// status file, read once for the capture) and what it told from inside ([`read_answers`]).
/// Needs no tracer: the capture reads these on its second thread, beside the tracer's work.
pub fn capture_attrs(pid: Tid, status: &procfs::Status, inside: InsideAttrs) -> Result<ProcessAttrs> {
    let InsideAttrs { itimers, brk, thp_disabled, child_subreaper, mdwe } = inside;
    let exe_path = procfs::readlink(&format!("/proc/{pid}/exe"))?;
    let exe_meta = std::fs::metadata(format!("/proc/{pid}/exe")).context(|| format!("stat /proc/{pid}/exe"))?;
    // A deleted executable keeps " (deleted)" here: its contents are read with the
    // descriptors' ([`capture_deleted_exe`]), which takes it off.
    let cwd = procfs::readlink(&format!("/proc/{pid}/cwd"))?;
    // Read from outside, a root shows as its path in its own mount namespace ("/" when it is
    // the namespace's root, pivoted or not).
    let root = Some(procfs::readlink(&format!("/proc/{pid}/root"))?).filter(|r| r != "/");
    if let Some(r) = root.as_deref().filter(|r| removed_dir(r).is_some()) {
        return Err(Error::Unsupported { pid, what: format!("a root directory removed since it entered it ({r})") });
    }
    if let Some(removed) = removed_dir(&cwd) {
        // Made again for a moment at restart (see `restore_attrs`), in its parent, which must
        // still be there.
        let parent = std::path::Path::new(removed).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        if !std::path::Path::new(&procfs::in_namespace_of(pid, &parent)).is_dir() {
            return Err(Error::Unsupported { pid, what: format!("a working directory removed with its parent ({cwd})") });
        }
    }
    let personality = std::fs::read_to_string(format!("/proc/{pid}/personality")).ok().and_then(|s| u64::from_str_radix(s.trim(), 16).ok()).unwrap_or(0);
    let rlimits = procfs::limits(pid)?;
    let oom_path = format!("/proc/{pid}/oom_score_adj");
    let oom_score_adj = std::fs::read_to_string(&oom_path)
        .context(|| format!("read {oom_path}"))?
        .trim()
        .parse()
        .map_err(|_| Error::Other(format!("{oom_path}: not a number")))?;
    let loginuid = read_loginuid(pid);
    let stat = procfs::stat(pid)?;
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).context(|| format!("read /proc/{pid}/auxv"))?;
    let mm = MmFields {
        start_code: stat.startcode,
        end_code: stat.endcode,
        start_data: stat.start_data.unwrap_or(0),
        end_data: stat.end_data.unwrap_or(0),
        start_brk: stat.start_brk.unwrap_or(0),
        brk,
        start_stack: stat.startstack,
        arg_start: stat.arg_start.unwrap_or(0),
        arg_end: stat.arg_end.unwrap_or(0),
        env_start: stat.env_start.unwrap_or(0),
        env_end: stat.env_end.unwrap_or(0),
        auxv,
    };
    Ok(ProcessAttrs {
        exe: ExeRecord { path: exe_path, dev: exe_meta.dev(), ino: exe_meta.ino(), deleted: None },
        cwd,
        umask: status.umask.unwrap_or(0o022),
        personality,
        rlimits,
        itimers,
        mm,
        oom_score_adj,
        thp_disabled,
        child_subreaper,
        root,
        mdwe,
        loginuid,
    })
}

/// A process's audit login id, where the kernel keeps one (CONFIG_AUDIT).
fn read_loginuid(host_pid: Tid) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{host_pid}/loginuid")).ok()?.trim().parse().ok()
}

/// Gives the process its audit login id back where it inherited another (zdtm's loginuid; a
/// daemon started from a login session keeps that session's id). Only the process itself can
/// write it, with CAP_AUDIT_CONTROL (root): elsewhere, or with the ids made immutable
/// (audit=1 with loginuid_immutable), it keeps the one it inherited, with a warning. Called
/// once the process no longer acts with its files' rights (`fsid::act_as_remote`: opening
/// /proc/self/loginuid for writing was refused then).
pub fn restore_loginuid(attrs: &ProcessAttrs, task: &mut RemoteTask, scratch_off: usize) -> Result<()> {
    let Some(want) = attrs.loginuid else { return Ok(()) };
    let now = read_loginuid(task.pid);
    if now == Some(want) || now.is_none() {
        return Ok(());
    }
    let path = task.put_path(scratch_off, "/proc/self/loginuid")?;
    let fd = match task.syscall("openat(/proc/self/loginuid)", libc::SYS_openat, &[libc::AT_FDCWD as u64, path, (libc::O_WRONLY | libc::O_CLOEXEC) as u64]) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(pid = task.pid, want, "loginuid not restored: {e}");
            return Ok(());
        }
    };
    let text = want.to_string();
    let value = task.put(scratch_off + 64, text.as_bytes())?;
    let written = task.syscall("write(loginuid)", libc::SYS_write, &[fd, value, text.len() as u64]);
    task.syscall("close", libc::SYS_close, &[fd])?;
    if let Err(e) = written {
        tracing::warn!(pid = task.pid, want, now, "loginuid not restored: {e} (it needs CAP_AUDIT_CONTROL)");
    }
    Ok(())
}

/// Gives the task back its root directory if it changed it (chroot), once every file it holds
/// is open (they were opened by paths its namespace shows) and before its credentials drop
/// CAP_SYS_CHROOT.
///
/// The path is walked without following any symbolic link (openat2 RESOLVE_NO_SYMLINKS): the
/// restorer may be root, and a link put in its place since would give the process a root it
/// could not reach. The task enters it through that descriptor and goes back to its working
/// directory.
pub fn restore_root(attrs: &ProcessAttrs, task: &mut RemoteTask, scratch_off: usize) -> Result<()> {
    let Some(root) = &attrs.root else { return Ok(()) };
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    let how: Vec<u8> = [(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64, 0, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let how_at = task.put(scratch_off, &how)?;
    let path_at = task.put_path(scratch_off + how.len(), root)?;
    let dir = task
        .syscall("openat2", libc::SYS_openat2, &[libc::AT_FDCWD as u64, path_at, how_at, how.len() as u64])
        .context(|| format!("open {root}, the root directory to enter again, without following links"))?;
    let dot = task.put_path(scratch_off, ".")?;
    let cwd = task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, dot, (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64, 0]);
    let entered = cwd.and_then(|cwd| {
        let r = task
            .syscall("fchdir", libc::SYS_fchdir, &[dir])
            .and_then(|_| task.syscall("chroot", libc::SYS_chroot, &[dot]))
            .and_then(|_| task.syscall("fchdir", libc::SYS_fchdir, &[cwd]));
        task.syscall("close", libc::SYS_close, &[cwd])?;
        r
    });
    task.syscall("close", libc::SYS_close, &[dir])?;
    entered.context(|| format!("chroot to {root} again"))?;
    Ok(())
}

/// Puts the process back under memory-deny-write-execute if it was ([`ProcessAttrs::mdwe`]):
/// after everything the restorer maps in it, since it can never be cleared.
pub fn restore_mdwe(attrs: &ProcessAttrs, task: &mut RemoteTask) -> Result<()> {
    if attrs.mdwe != 0 {
        task.syscall("prctl(PR_SET_MDWE)", libc::SYS_prctl, &[PR_SET_MDWE, attrs.mdwe as u64, 0, 0, 0])
            .context(|| format!("deny memory both writable and executable again (PR_SET_MDWE {:#x})", attrs.mdwe))?;
    }
    Ok(())
}

/// Keeps the executable of process `pid` if it was deleted since the process started (see
/// [`ExeRecord::deleted`]; [`capture_attrs`] left its path as /proc shows it) and takes
/// " (deleted)" off its path; `attrs` are its attributes just captured.
pub fn capture_deleted_exe(pid: Tid, attrs: &mut ProcessAttrs, ctx: &mut super::descriptor::CaptureCtx) -> Result<()> {
    let Some(path) = super::deleted::deleted_path(&attrs.exe.path).map(str::to_string) else { return Ok(()) };
    let link = format!("/proc/{pid}/exe");
    let meta = std::fs::metadata(&link).context(|| format!("stat {link}"))?;
    attrs.exe.deleted = Some(super::deleted::capture_executable(pid, &path, &meta, ctx)?);
    attrs.exe.path = path;
    Ok(())
}

/// Checks the executable is still the one the process ran (a deleted one comes from the image).
pub fn check_exe(attrs: &ProcessAttrs, on_host: &dyn Fn(&str) -> Option<String>, place: &super::identity::Place, keep: bool) -> Result<()> {
    let exe = &attrs.exe;
    if exe.deleted.is_some() {
        return Ok(());
    }
    // None: on the job's own mounts (a tmpfs put back from the image).
    let Some(path) = on_host(&exe.path) else { return Ok(()) };
    match place.judge_path("executable", (exe.dev, exe.ino), &path) {
        Ok(()) => Ok(()),
        Err(problem) if keep && std::path::Path::new(&path).is_file() => {
            tracing::warn!(path, "{problem}; taken as it is (--keep-files)");
            Ok(())
        }
        Err(problem) => Err(Error::FileChanged { path, problem }),
    }
}

/// The path of a removed directory, as /proc shows a working directory that was removed.
fn removed_dir(link: &str) -> Option<&str> {
    link.strip_suffix(" (deleted)").filter(|p| p.starts_with('/'))
}

/// Gives the task a working directory that was removed, as it had: makes a directory at its
/// path (with the task's own rights; under another name beside it if something took the name
/// since), enters it, and removes it again. Where no directory can be made there (a /proc/PID
/// of a process gone, zdtm's unhashed_proc; a parent the process may no longer write in), one
/// is made in /tmp instead: a removed directory is one wherever it was made (nothing can be
/// found or made in it, getcwd fails with ENOENT); only /proc's link to it names another path.
fn enter_removed_dir(task: &mut RemoteTask, path: &str, scratch_off: usize) -> Result<()> {
    let mkdir = |t: &mut RemoteTask, addr| t.syscall("mkdir", libc::SYS_mkdir, &[addr, 0o700]);
    let what = "removed working directory";
    let (dir, at) = match super::file::make_for_a_moment(task, path, ".ckpt-removed-cwd", what, scratch_off, mkdir) {
        Ok(made) => made,
        Err(e) => {
            let elsewhere = format!("/tmp/.ckpt-removed-cwd-{}", task.pid);
            let made = super::file::make_for_a_moment(task, &elsewhere, ".again", what, scratch_off, mkdir).map_err(|_| e)?;
            tracing::info!(pid = task.pid, path, made = made.0, "the removed working directory is made again elsewhere: none can be made where it was");
            made
        }
    };
    task.syscall("chdir", libc::SYS_chdir, &[at]).context(|| format!("chdir to {dir}"))?;
    task.syscall("rmdir", libc::SYS_rmdir, &[at]).context(|| format!("remove {dir} again"))?;
    Ok(())
}

/// Once the process's descriptors are back: a removed working directory that one of its
/// descriptors also held (by the same old path: /proc tells no more of a removed directory)
/// becomes that descriptor's directory, so that the two are one again, as they were (zdtm's
/// cwd02); [`restore_attrs`] had made it a removed directory of its own, which goes.
pub fn share_removed_cwd(attrs: &ProcessAttrs, fds: &[FdRecord], task: &mut RemoteTask) -> Result<()> {
    let Some(path) = removed_dir(&attrs.cwd) else { return Ok(()) };
    let same = fds.iter().find(|f| matches!(&f.kind, super::descriptor::FdKind::RemovedDir(d) if d.path == path));
    if let Some(f) = same {
        task.syscall("fchdir", libc::SYS_fchdir, &[f.fd as u64]).context(|| format!("enter the removed directory {path} held by fd {}", f.fd))?;
    }
    Ok(())
}

const PR_SET_MM: u64 = 35;
const PR_SET_MM_MAP: u64 = 14;

/// Restores the attributes set from inside the task, and the mm fields. Resource limits are set
/// last by [`restore_rlimits`], from outside, once the restore no longer needs extra descriptors.
/// `ns_pid`, `ctx`, `park_at` and `reader` serve a deleted executable's copy (see
/// [`super::deleted::executable_copy`]).
pub fn restore_attrs(
    attrs: &ProcessAttrs,
    task: &mut RemoteTask,
    (ns_pid, scratch_off, park_at): (Tid, usize, u64),
    ctx: &mut super::descriptor::RestoreCtx,
    reader: &mut crate::image::StreamReader,
) -> Result<()> {
    match removed_dir(&attrs.cwd) {
        // A directory entered gives no access by itself: no identity to check.
        None => {
            crate::fsid::open_with_owner_rights_if_refused(task, ctx.files_rights.as_ref(), &format!("chdir to {}", attrs.cwd), None, |task| {
                let cwd = task.put_path(scratch_off, &attrs.cwd)?;
                task.syscall("chdir", libc::SYS_chdir, &[cwd])
            })?;
        }
        Some(path) => enter_removed_dir(task, path, scratch_off)?,
    }
    task.syscall("umask", libc::SYS_umask, &[attrs.umask as u64])?;
    task.syscall("personality", libc::SYS_personality, &[attrs.personality])?;
    if attrs.thp_disabled {
        task.syscall("prctl(PR_SET_THP_DISABLE)", libc::SYS_prctl, &[libc::PR_SET_THP_DISABLE as u64, 1, 0, 0, 0])?;
    }
    if attrs.child_subreaper {
        task.syscall("prctl(PR_SET_CHILD_SUBREAPER)", libc::SYS_prctl, &[libc::PR_SET_CHILD_SUBREAPER as u64, 1])?;
    }
    for (which, t) in attrs.itimers.iter().enumerate() {
        if *t != ItimerRecord::default() {
            let addr = task.put(scratch_off, &itimer_bytes(&rearmed(t)))?;
            task.syscall("setitimer", libc::SYS_setitimer, &[which as u64, addr, 0])?;
        }
    }

    // The executable is passed as a descriptor opened inside the task.
    let exe_fd = match &attrs.exe.deleted {
        Some(d) => super::deleted::executable_copy(task, ns_pid, d, ctx, (scratch_off, park_at), reader)?,
        None => crate::fsid::open_with_owner_rights_if_refused(
            task,
            ctx.files_rights.as_ref(),
            &format!("open executable {}", attrs.exe.path),
            Some((attrs.exe.dev, attrs.exe.ino)),
            |task| {
                let exe = task.put_path(scratch_off, &attrs.exe.path)?;
                task.syscall("openat", libc::SYS_openat, &[libc::AT_FDCWD as u64, exe, (libc::O_RDONLY | libc::O_CLOEXEC) as u64])
            },
        )?,
    };
    let mm = &attrs.mm;
    let auxv_off = scratch_off + 4096;
    let auxv = task.put(auxv_off, &mm.auxv)?;
    let mut map: Vec<u8> = [
        mm.start_code,
        mm.end_code,
        mm.start_data,
        mm.end_data,
        mm.start_brk,
        mm.brk,
        mm.start_stack,
        mm.arg_start,
        mm.arg_end,
        mm.env_start,
        mm.env_end,
        auxv,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect();
    map.extend_from_slice(&(mm.auxv.len() as u32).to_le_bytes());
    map.extend_from_slice(&(exe_fd as u32).to_le_bytes());
    let map_addr = task.put(scratch_off, &map)?;
    let r = task.syscall("prctl(PR_SET_MM_MAP)", libc::SYS_prctl, &[PR_SET_MM, PR_SET_MM_MAP, map_addr, map.len() as u64, 0]);
    task.syscall("close", libc::SYS_close, &[exe_fd])?;
    r.context(|| "restore the mm fields (code, data, brk, stack, args, env, auxv, exe)".to_string())?;
    Ok(())
}

/// Puts oom_score_adj back, from outside. Lowering it needs CAP_SYS_RESOURCE, which the
/// restorer may lack (root here does): then the value stays higher, with a warning.
pub fn restore_oom_score_adj(attrs: &ProcessAttrs, host_pid: Tid) -> Result<()> {
    let path = format!("/proc/{host_pid}/oom_score_adj");
    let now: i32 = std::fs::read_to_string(&path).context(|| format!("read {path}"))?.trim().parse().unwrap_or(0);
    if now != attrs.oom_score_adj {
        if let Err(e) = std::fs::write(&path, attrs.oom_score_adj.to_string()) {
            tracing::warn!(pid = host_pid, was = attrs.oom_score_adj, now, "oom_score_adj not restored: {e} (lowering it needs CAP_SYS_RESOURCE)");
        }
    }
    Ok(())
}

/// Puts the resource limits back. A hard limit above the one the restart runs under can only be
/// raised with CAP_SYS_RESOURCE (root; not an ordinary user, whose user namespace does not
/// count here): it is then kept at the restart's, with a warning. Lower limits only restrict the
/// job, so this never gives it more than it had; a job that needs more than it gets fails
/// later where it needs it (descriptors beyond RLIMIT_NOFILE, say), with that error.
///
/// `which` chooses the limits: RLIMIT_NOFILE is set apart ([`LimitsNow::DescriptorsOnly`]),
/// once the restorer has opened its last descriptor in the process: a program may have set it
/// below what it holds, even to 0 (OpenSSH's sandboxed child does), and every later open of the
/// restore (its root directory entered again) would fail with EMFILE.
pub fn restore_rlimits(attrs: &ProcessAttrs, host_pid: Tid, which: LimitsNow) -> Result<()> {
    use crate::ptrace::sys::{rlimit, set_rlimit};
    let nofile = libc::RLIMIT_NOFILE;
    let chosen = attrs.rlimits.iter().filter(|(res, ..)| match which {
        LimitsNow::AllButDescriptors => *res != nofile,
        LimitsNow::DescriptorsOnly => *res == nofile,
    });
    for &(res, cur, max) in chosen {
        let name = rlimit_name(res);
        let set = set_rlimit(host_pid, res, cur, max);
        let Err(e) = set else { continue };
        let failed = |e: std::io::Error| Error::from(e).of_object(host_pid, format!("restore resource limit {name} ({cur}/{max})"));
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(failed(e));
        }
        let (_, allowed) = rlimit(host_pid, res).map_err(failed)?;
        if allowed >= max {
            return Err(failed(e));
        }
        set_rlimit(host_pid, res, cur.min(allowed), allowed).map_err(failed)?;
        tracing::warn!(
            pid = host_pid,
            "resource limit {name} kept at {} (soft {}) where the job had {} (soft {}): the restart runs under a lower hard limit, and raising it needs CAP_SYS_RESOURCE (raise it where the restart starts, e.g. `ulimit -H`, to give the job back its own)",
            show_limit(allowed),
            show_limit(cur.min(allowed)),
            show_limit(max),
            show_limit(cur)
        );
    }
    Ok(())
}

/// Which resource limits [`restore_rlimits`] sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsNow {
    AllButDescriptors,
    DescriptorsOnly,
}

/// RLIMIT_* by number, for messages.
fn rlimit_name(res: u32) -> String {
    const NAMES: [&str; 16] = [
        "RLIMIT_CPU",
        "RLIMIT_FSIZE",
        "RLIMIT_DATA",
        "RLIMIT_STACK",
        "RLIMIT_CORE",
        "RLIMIT_RSS",
        "RLIMIT_NPROC",
        "RLIMIT_NOFILE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_AS",
        "RLIMIT_LOCKS",
        "RLIMIT_SIGPENDING",
        "RLIMIT_MSGQUEUE",
        "RLIMIT_NICE",
        "RLIMIT_RTPRIO",
        "RLIMIT_RTTIME",
    ];
    NAMES.get(res as usize).map_or_else(|| format!("resource {res}"), |n| n.to_string())
}

fn show_limit(v: u64) -> String {
    if v == libc::RLIM64_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}
