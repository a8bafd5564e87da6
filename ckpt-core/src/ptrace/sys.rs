//! Thin wrappers over ptrace(2) and waitpid(2). Each `unsafe` block passes pointers to buffers that
//! live for the duration of the call and are sized as the kernel expects.

use std::io;

use libc::{c_int, c_long, c_void, pid_t};

/// A task id as the tracer (outside the job's PID namespace) sees it.
pub type Tid = pid_t;

// The requests' numbers are libc's (its types differ by request: `c_uint` here).
const PTRACE_SEIZE: c_int = libc::PTRACE_SEIZE as c_int;
const PTRACE_INTERRUPT: c_int = libc::PTRACE_INTERRUPT as c_int;
const PTRACE_PEEKSIGINFO: c_int = libc::PTRACE_PEEKSIGINFO as c_int;
const PTRACE_GETSIGMASK: c_int = libc::PTRACE_GETSIGMASK as c_int;
const PTRACE_SETSIGMASK: c_int = libc::PTRACE_SETSIGMASK as c_int;
const PTRACE_GET_RSEQ_CONFIGURATION: c_int = libc::PTRACE_GET_RSEQ_CONFIGURATION as c_int;
const PTRACE_PEEKSIGINFO_SHARED: u32 = libc::PTRACE_PEEKSIGINFO_SHARED;
/// elf.h's note of the XSAVE area, which libc does not define.
pub const NT_X86_XSTATE: usize = 0x202;
const NT_PRSTATUS: usize = libc::NT_PRSTATUS as usize;

pub const PTRACE_O_TRACESYSGOOD: c_long = libc::PTRACE_O_TRACESYSGOOD as c_long;
pub const PTRACE_O_TRACEFORK: c_long = libc::PTRACE_O_TRACEFORK as c_long;
pub const PTRACE_O_TRACEVFORK: c_long = libc::PTRACE_O_TRACEVFORK as c_long;
pub const PTRACE_O_TRACECLONE: c_long = libc::PTRACE_O_TRACECLONE as c_long;
pub const PTRACE_O_EXITKILL: c_long = libc::PTRACE_O_EXITKILL as c_long;

const PTRACE_EVENT_FORK: c_int = libc::PTRACE_EVENT_FORK;
const PTRACE_EVENT_VFORK: c_int = libc::PTRACE_EVENT_VFORK;
const PTRACE_EVENT_CLONE: c_int = libc::PTRACE_EVENT_CLONE;
const PTRACE_EVENT_STOP: c_int = libc::PTRACE_EVENT_STOP;

fn check(ret: c_long, what: &str, tid: Tid) -> io::Result<c_long> {
    if ret == -1 {
        let e = io::Error::last_os_error();
        let wrong_thread = match e.raw_os_error() == Some(libc::ESRCH) {
            true => traced_by_another_thread_of_ours(tid),
            false => None,
        };
        match wrong_thread {
            // A mistake of ours, not a task gone: say so, or it reads as the job ending.
            Some(tracer) => Err(io::Error::new(
                e.kind(),
                format!(
                    "{what} on task {tid}: {e}: asked by thread {} of the agent, but thread {tracer} traces it (a bug: every request must come from the task's tracer)",
                    nix::unistd::gettid()
                ),
            )),
            None => Err(io::Error::new(e.kind(), format!("{what} on task {tid}: {e}"))),
        }
    } else {
        Ok(ret)
    }
}

/// The thread of this process other than the calling one that traces task `tid`, if one does
/// (read after an ESRCH only: ptrace answers it alike for a task gone, not stopped, or traced by
/// a sibling thread, and only the last is a mistake of ours).
fn traced_by_another_thread_of_ours(tid: Tid) -> Option<Tid> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let tracer: Tid = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse().ok()?;
    let ours = std::path::Path::new(&format!("/proc/self/task/{tracer}")).exists();
    (tracer != 0 && tracer != nix::unistd::gettid().as_raw() && ours).then_some(tracer)
}

/// ptrace(2) with `addr` and `data` as the request takes them.
///
/// # Safety
/// `addr` and `data` are plain integers, or the addresses of buffers of ours that are valid for
/// the request's documented size (and writable where the kernel writes) for the whole call.
unsafe fn raw(req: c_int, tid: Tid, addr: usize, data: usize) -> c_long {
    // SAFETY: the caller's promise.
    unsafe { libc::ptrace(req as _, tid, addr as *mut c_void, data as *mut c_void) }
}

/// Attaches without stopping the task (PTRACE_SEIZE), with the given PTRACE_O_* options.
pub fn seize(tid: Tid, options: c_long) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(PTRACE_SEIZE, tid, 0, options as usize) }, "PTRACE_SEIZE", tid).map(drop)
}

/// Replaces a traced task's PTRACE_O_* options (the task must be in a ptrace stop).
pub fn set_options(tid: Tid, options: c_long) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(libc::PTRACE_SETOPTIONS as c_int, tid, 0, options as usize) }, "PTRACE_SETOPTIONS", tid).map(drop)
}

/// PTRACE_O_SUSPEND_SECCOMP: the task's seccomp filters and strict mode do not apply while it is
/// traced with this option (the calls the checkpoint or the restart injects, which a filter might
/// answer by killing). Needs CAP_SYS_ADMIN in the machine's user namespace.
pub const PTRACE_O_SUSPEND_SECCOMP: c_long = 1 << 21;

/// The seccomp filter `index` of a stopped task (0: the newest), as BPF instructions (8 bytes
/// each, as `struct sock_filter` lays them out: code, jt, jf, k), or None past the oldest.
/// Needs CAP_SYS_ADMIN in the machine's user namespace.
pub fn seccomp_filter(tid: Tid, index: usize) -> io::Result<Option<Vec<u64>>> {
    const PTRACE_SECCOMP_GET_FILTER: c_int = 0x420c;
    // SAFETY: a null buffer asks for the length only.
    let len = match check(unsafe { raw(PTRACE_SECCOMP_GET_FILTER, tid, index, 0) }, "PTRACE_SECCOMP_GET_FILTER", tid) {
        Ok(len) => len as usize,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut insns = vec![0u64; len];
    // SAFETY: `insns` holds `len` instructions of 8 bytes, what the kernel writes.
    let got = check(unsafe { raw(PTRACE_SECCOMP_GET_FILTER, tid, index, insns.as_mut_ptr() as usize) }, "PTRACE_SECCOMP_GET_FILTER", tid)? as usize;
    insns.truncate(got);
    Ok(Some(insns))
}

/// The flags a seccomp filter of a stopped task was installed with that the kernel keeps
/// (SECCOMP_FILTER_FLAG_LOG, SECCOMP_FILTER_FLAG_SPEC_ALLOW), by index as [`seccomp_filter`].
pub fn seccomp_filter_flags(tid: Tid, index: usize) -> io::Result<u64> {
    const PTRACE_SECCOMP_GET_METADATA: c_int = 0x420d;
    // struct seccomp_metadata: the filter's index in, its flags out.
    let mut metadata: [u64; 2] = [index as u64, 0];
    // SAFETY: `addr` is the struct's size, `data` points to it.
    check(
        unsafe { raw(PTRACE_SECCOMP_GET_METADATA, tid, std::mem::size_of_val(&metadata), metadata.as_mut_ptr() as usize) },
        "PTRACE_SECCOMP_GET_METADATA",
        tid,
    )?;
    Ok(metadata[1])
}

/// Asks a seized task to stop (it reports a PTRACE_EVENT_STOP).
pub fn interrupt(tid: Tid) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(PTRACE_INTERRUPT, tid, 0, 0) }, "PTRACE_INTERRUPT", tid).map(drop)
}

/// Releases a task, delivering `sig` (0 for none).
pub fn detach(tid: Tid, sig: c_int) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(libc::PTRACE_DETACH as c_int, tid, 0, sig as usize) }, "PTRACE_DETACH", tid).map(drop)
}

/// Resumes a task until the next system call entry or exit.
pub fn resume_syscall(tid: Tid, sig: c_int) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(libc::PTRACE_SYSCALL as c_int, tid, 0, sig as usize) }, "PTRACE_SYSCALL", tid).map(drop)
}

/// Resumes a task for one instruction; it stops again with SIGTRAP.
pub fn single_step(tid: Tid) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(libc::PTRACE_SINGLESTEP as c_int, tid, 0, 0) }, "PTRACE_SINGLESTEP", tid).map(drop)
}

/// Resumes a task.
pub fn resume(tid: Tid, sig: c_int) -> io::Result<()> {
    // SAFETY: integers only.
    check(unsafe { raw(libc::PTRACE_CONT as c_int, tid, 0, sig as usize) }, "PTRACE_CONT", tid).map(drop)
}

pub fn get_regs(tid: Tid) -> io::Result<libc::user_regs_struct> {
    // SAFETY: all-zero is a valid user_regs_struct (plain integers).
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: &mut regs as *mut _ as *mut c_void, iov_len: std::mem::size_of::<libc::user_regs_struct>() };
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_GETREGSET as c_int, tid, NT_PRSTATUS, &mut iov as *mut _ as usize) }, "PTRACE_GETREGSET(PRSTATUS)", tid)?;
    Ok(regs)
}

pub fn set_regs(tid: Tid, regs: &libc::user_regs_struct) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: regs as *const _ as *mut c_void, iov_len: std::mem::size_of::<libc::user_regs_struct>() };
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_SETREGSET as c_int, tid, NT_PRSTATUS, &mut iov as *mut _ as usize) }, "PTRACE_SETREGSET(PRSTATUS)", tid).map(drop)
}

/// Reads a register set into `buf`; returns how many bytes the kernel filled.
pub fn get_regset(tid: Tid, note: usize, buf: &mut [u8]) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: buf.len() };
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_GETREGSET as c_int, tid, note, &mut iov as *mut _ as usize) }, "PTRACE_GETREGSET", tid)?;
    Ok(iov.iov_len)
}

pub fn set_regset(tid: Tid, note: usize, buf: &[u8]) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: buf.as_ptr() as *mut c_void, iov_len: buf.len() };
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_SETREGSET as c_int, tid, note, &mut iov as *mut _ as usize) }, "PTRACE_SETREGSET", tid).map(drop)
}

pub fn get_sigmask(tid: Tid) -> io::Result<u64> {
    let mut mask: u64 = 0;
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(PTRACE_GETSIGMASK, tid, 8, &mut mask as *mut u64 as usize) }, "PTRACE_GETSIGMASK", tid)?;
    Ok(mask)
}

pub fn set_sigmask(tid: Tid, mask: u64) -> io::Result<()> {
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(PTRACE_SETSIGMASK, tid, 8, &mask as *const u64 as usize) }, "PTRACE_SETSIGMASK", tid).map(drop)
}

pub fn get_siginfo(tid: Tid) -> io::Result<[u8; 128]> {
    let mut info = [0u8; 128];
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_GETSIGINFO as c_int, tid, 0, info.as_mut_ptr() as usize) }, "PTRACE_GETSIGINFO", tid)?;
    Ok(info)
}

/// Pending signals of a task (its own queue, or the process-wide one when `shared`), as raw
/// 128-byte siginfo records, without dequeuing them.
pub fn peek_pending(tid: Tid, shared: bool) -> io::Result<Vec<[u8; 128]>> {
    #[repr(C)]
    struct PeekArgs {
        off: u64,
        flags: u32,
        nr: i32,
    }
    let mut out = Vec::new();
    let mut buf = [[0u8; 128]; 32];
    loop {
        let args = PeekArgs { off: out.len() as u64, flags: if shared { PTRACE_PEEKSIGINFO_SHARED } else { 0 }, nr: buf.len() as i32 };
        // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
        let n = check(unsafe { raw(PTRACE_PEEKSIGINFO, tid, &args as *const _ as usize, buf.as_mut_ptr() as usize) }, "PTRACE_PEEKSIGINFO", tid)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
}

/// The rseq area a thread registered, as PTRACE_GET_RSEQ_CONFIGURATION reports it.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RseqConfig {
    pub abi_pointer: u64,
    pub abi_size: u32,
    pub signature: u32,
    pub flags: u32,
    pub pad: u32,
}

pub fn get_rseq(tid: Tid) -> io::Result<RseqConfig> {
    let mut conf = RseqConfig::default();
    check(
        // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
        unsafe { raw(PTRACE_GET_RSEQ_CONFIGURATION, tid, std::mem::size_of::<RseqConfig>(), &mut conf as *mut _ as usize) },
        "PTRACE_GET_RSEQ_CONFIGURATION",
        tid,
    )?;
    Ok(conf)
}

/// Why a traced task is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// PTRACE_INTERRUPT or group stop (PTRACE_EVENT_STOP), with the signal it reports: for a
    /// seized task, SIGTRAP unless its process is in a group stop, then the signal that stopped
    /// it (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU). See [`StopKind::in_group_stop`].
    EventStop(c_int),
    /// Entry or exit of a system call (PTRACE_O_TRACESYSGOOD).
    Syscall,
    /// A new thread or process was created (fork, vfork or clone); its tid is available through
    /// PTRACE_GETEVENTMSG.
    NewTaskEvent,
    /// Another ptrace event (exec, exit, ...), by number.
    OtherEvent(c_int),
    /// A signal is about to be delivered.
    Signal(c_int),
    /// The task exited with this status.
    Exited(c_int),
    /// The task was killed by this signal.
    Killed(c_int),
}

impl StopKind {
    /// Whether this is the event stop of a seized task whose process is in a group stop (or
    /// entering one). The kernel decides that from the process's own stop state, so it holds
    /// while the task is on its way back to that stop after an earlier tracer let it go, when
    /// /proc shows it running (state R).
    pub fn in_group_stop(self) -> bool {
        self.group_stop_signal().is_some()
    }

    /// The signal that stopped the process, for the event stop of a seized task whose process is
    /// in a group stop (see [`StopKind::in_group_stop`]).
    pub fn group_stop_signal(self) -> Option<c_int> {
        match self {
            StopKind::EventStop(sig) if sig != libc::SIGTRAP => Some(sig),
            _ => None,
        }
    }
}

/// Like [`wait`], but returns `None` at once when the task has not changed state yet.
pub fn try_wait(tid: Tid) -> io::Result<Option<StopKind>> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        match r {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io::Error::new(e.kind(), format!("waitpid on task {tid}: {e}")));
            }
            0 => return Ok(None),
            _ => return Ok(Some(decode_status(status))),
        }
    }
}

/// What two processes may hold together after a clone without CLONE_THREAD, by kcmp's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Together {
    /// The address space (CLONE_VM: a child of vfork until it execs or exits).
    Memory = 1,
    /// The descriptor table (CLONE_FILES).
    DescriptorTable = 2,
    /// The working directory, root and umask (CLONE_FS).
    FsInfo = 3,
}

/// Whether two processes hold `what` together. Unknown (kcmp missing or refused) counts as not.
pub fn hold_together(pid1: pid_t, pid2: pid_t, what: Together) -> bool {
    // SAFETY: kcmp compares two processes' kernel objects of one type; no memory is passed.
    unsafe { libc::syscall(libc::SYS_kcmp, pid1, pid2, what as c_long, 0 as c_long, 0 as c_long) == 0 }
}

/// A resource limit of a process (prlimit(2)): (soft, hard).
pub fn rlimit(pid: pid_t, resource: u32) -> io::Result<(u64, u64)> {
    let mut old = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `old` is a valid out-pointer; no new limit is passed.
    if unsafe { libc::prlimit64(pid, resource as _, std::ptr::null(), &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((old.rlim_cur, old.rlim_max))
}

/// Sets a resource limit of a process (prlimit(2)). Raising the hard limit needs
/// CAP_SYS_RESOURCE (EPERM without it).
pub fn set_rlimit(pid: pid_t, resource: u32, soft: u64, hard: u64) -> io::Result<()> {
    let new = libc::rlimit64 { rlim_cur: soft, rlim_max: hard };
    // SAFETY: `new` is a valid in-pointer; the old value is not asked for.
    if unsafe { libc::prlimit64(pid, resource as _, &new, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends signal `sig` to thread `tid` alone (tkill; a traced thread, whose id cannot be reused
/// while it is held).
pub fn tkill(tid: Tid, sig: c_int) -> io::Result<()> {
    // SAFETY: no pointers; an id and a signal number.
    if unsafe { libc::syscall(libc::SYS_tkill, tid, sig) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits for one traced task (thread) to change state.
pub fn wait(tid: Tid) -> io::Result<StopKind> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io::Error::new(e.kind(), format!("waitpid on task {tid}: {e}")));
        }
        break;
    }
    Ok(decode_status(status))
}

/// Decodes a waitpid status of a traced task.
pub fn decode_status(status: c_int) -> StopKind {
    if libc::WIFEXITED(status) {
        return StopKind::Exited(libc::WEXITSTATUS(status));
    }
    if libc::WIFSIGNALED(status) {
        return StopKind::Killed(libc::WTERMSIG(status));
    }
    let sig = libc::WSTOPSIG(status);
    let event = status >> 16;
    if sig == (libc::SIGTRAP | 0x80) {
        return StopKind::Syscall;
    }
    match event {
        0 => StopKind::Signal(sig),
        PTRACE_EVENT_STOP => StopKind::EventStop(sig),
        PTRACE_EVENT_FORK | PTRACE_EVENT_VFORK | PTRACE_EVENT_CLONE => StopKind::NewTaskEvent,
        e => StopKind::OtherEvent(e),
    }
}

pub fn event_msg(tid: Tid) -> io::Result<u64> {
    let mut msg: u64 = 0;
    // SAFETY: the pointers passed are to buffers alive across the call, of the size the request reads or writes (an iovec gives its own).
    check(unsafe { raw(libc::PTRACE_GETEVENTMSG as c_int, tid, 0, &mut msg as *mut u64 as usize) }, "PTRACE_GETEVENTMSG", tid)?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The freeze tells a stopped process by its event stop's signal (see
    /// [`StopKind::in_group_stop`]): a process in a group stop reports it at every seizure, also
    /// when it is seized again right after being let go, still on its way back to its stop; a
    /// running one reports SIGTRAP. (A CI run once recorded a stopped child as running from its
    /// state letter, and the restart let it run.)
    #[test]
    fn a_group_stop_is_reported_at_every_seizure() {
        /// Killed however the test ends, so that no stopped shell outlives it.
        struct Spinning(std::process::Child);
        impl Drop for Spinning {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Spinning(Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
        let pid = child.0.id() as Tid;
        let seized = |want_stopped: bool| {
            seize(pid, PTRACE_O_TRACESYSGOOD).unwrap();
            interrupt(pid).unwrap();
            let stop = loop {
                match wait(pid).unwrap() {
                    // A SIGSTOP still on its way: delivered, it starts the group stop.
                    StopKind::Signal(sig) => resume(pid, sig).unwrap(),
                    other => break other,
                }
            };
            assert!(matches!(stop, StopKind::EventStop(_)), "{stop:?}");
            assert_eq!(stop.in_group_stop(), want_stopped, "{stop:?}");
            detach(pid, 0).unwrap();
        };
        seized(false);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP).unwrap();
        // Stopped (a SIGSTOP still queued is not a group stop yet: the freeze finds that one
        // among the pending signals).
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), Some(nix::sys::wait::WaitPidFlag::WUNTRACED)).unwrap();
        assert!(matches!(status, nix::sys::wait::WaitStatus::Stopped(_, nix::sys::signal::Signal::SIGSTOP)), "{status:?}");
        for _ in 0..200 {
            seized(true);
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT).unwrap();
        let mut running = false;
        for _ in 0..200 {
            // SIGCONT ends the group stop at once, but a seizure may come before the shell gets it.
            seize(pid, PTRACE_O_TRACESYSGOOD).unwrap();
            interrupt(pid).unwrap();
            let stop = wait(pid).unwrap();
            detach(pid, 0).unwrap();
            if !stop.in_group_stop() {
                running = true;
                break;
            }
        }
        drop(child);
        assert!(running, "still reported stopped after SIGCONT");
    }
}
