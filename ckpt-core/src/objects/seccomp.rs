//! A thread's seccomp sandbox: strict mode, or the chain of BPF filters it runs under, with the
//! flags the kernel keeps of each. What OpenSSH's privilege-separated child, browsers, systemd
//! services and container runtimes put their processes in.
//!
//! **Capture** ([`suspend_and_capture`]) happens before anything is injected into the process:
//! its threads are traced with PTRACE_O_SUSPEND_SECCOMP, so that the checkpoint's own calls are
//! not answered by the sandbox (a filter, or strict mode, kills for most of them), and each
//! filter is read back from outside (PTRACE_SECCOMP_GET_FILTER). Both need CAP_SYS_ADMIN in the
//! machine's user namespace: an ordinary user's checkpoint refuses such a process, naming it,
//! before touching it, rather than bring it back without the sandbox it chose.
//!
//! **Restore** ([`suspend`], then [`restore_shared`] and [`restore_thread`]) comes just before
//! the credentials, while the restorer still has what installing a filter needs (no_new_privs
//! or CAP_SYS_ADMIN), with the threads traced with PTRACE_O_SUSPEND_SECCOMP so that the
//! restorer's last calls pass; the sandbox applies from the release (the detach ends the
//! suspension). Threads that ran under one chain (installed before they were created, or with
//! SECCOMP_FILTER_FLAG_TSYNC) get it installed once, from the main thread, with TSYNC: they
//! share it again, as a program's later TSYNC requires. Others get their own, each in its thread.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::procfs;
use crate::ptrace::{sys, Injector, Scratch, Tid};

/// One filter: its BPF program (`struct sock_filter`s, 8 bytes each) and the flags it was
/// installed with that the kernel keeps.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SeccompFilter {
    pub insns: Vec<u64>,
    pub flags: u64,
}

/// How one thread is sandboxed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum SeccompMode {
    /// SECCOMP_MODE_STRICT: read, write, _exit and sigreturn only.
    Strict,
    /// SECCOMP_MODE_FILTER: the filters, oldest first (the order they were installed in).
    Filters(Vec<SeccompFilter>),
}

/// The sandboxed threads of a process, by tid inside the job (the others have none).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SeccompRecord {
    pub threads: Vec<(Tid, SeccompMode)>,
}

/// SECCOMP_FILTER_FLAG_LOG and SECCOMP_FILTER_FLAG_SPEC_ALLOW: the flags the kernel keeps of a
/// filter (PTRACE_SECCOMP_GET_METADATA reports no other).
const KEPT_FLAGS: u64 = (1 << 1) | (1 << 2);
const SECCOMP_FILTER_FLAG_TSYNC: u64 = 1;
const SECCOMP_SET_MODE_STRICT: u64 = 0;
const SECCOMP_SET_MODE_FILTER: u64 = 1;
/// BPF_MAXINSNS: the longest filter the kernel takes.
const MAX_INSNS: usize = 4096;
/// The kernel's limit on the instructions of a thread's whole chain (MAX_INSNS_PER_PATH, with
/// its 4 instructions of overhead per filter).
const MAX_CHAIN_INSNS: usize = 32768;

/// The seccomp mode of each of the threads `tids` of `pid` (host tids) that has one: 1 strict,
/// 2 filter. Read for every thread of every process at each freeze: the one line, not the whole
/// status parsed.
fn sandboxed_threads(pid: Tid, tids: &[Tid]) -> Result<Vec<(Tid, u32)>> {
    let mut out = Vec::new();
    for &tid in tids {
        let path = format!("/proc/{pid}/task/{tid}/status");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // A thread that ended meanwhile has no sandbox left to keep.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::Other(format!("read {path}: {e}"))),
        };
        let mode = text.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        if mode != 0 {
            out.push((tid, mode));
        }
    }
    Ok(out)
}

/// For a stopped process whose threads are `tids` (every one in a ptrace stop, traced with
/// `options`): if a thread is sandboxed, suspends the sandbox of every thread while traced and
/// reads it back (see the module). None when no thread is.
pub fn suspend_and_capture(pid: Tid, tids: &[Tid], options: libc::c_long) -> Result<Option<SeccompRecord>> {
    let sandboxed = sandboxed_threads(pid, tids)?;
    let Some(&(first, first_mode)) = sandboxed.first() else { return Ok(None) };
    let refused = |why: String| Error::Unsupported { pid, what: format!("thread {first}'s seccomp sandbox (mode {first_mode}): {why}") };
    for &tid in tids {
        sys::set_options(tid, options | sys::PTRACE_O_SUSPEND_SECCOMP).map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => refused(
                "only root can read a sandbox back to restore it (PTRACE_O_SUSPEND_SECCOMP and PTRACE_SECCOMP_GET_FILTER need CAP_SYS_ADMIN); brought back without it the program would run unprotected".into(),
            ),
            _ => refused(format!("its checkpoint could not be made safe from it: {e}")),
        })?;
    }
    let mut threads = Vec::new();
    for (tid, mode) in sandboxed {
        let ns_tid = procfs::ns_tid(tid)?;
        let mode = match mode {
            1 => SeccompMode::Strict,
            2 => SeccompMode::Filters(filters_of(tid)?),
            other => return Err(refused(format!("mode {other} is not known"))),
        };
        if let SeccompMode::Filters(chain) = &mode {
            if chain.iter().any(|f| f.insns.iter().any(|&i| returns_user_notif(i))) {
                return Err(refused(format!(
                    "thread {tid} has a filter that hands system calls to a supervisor (SECCOMP_RET_USER_NOTIF), whose listener a restart cannot give back"
                )));
            }
        }
        threads.push((ns_tid, mode));
    }
    Ok(Some(SeccompRecord { threads }))
}

/// Whether BPF instruction `insn` (as [`SeccompFilter::insns`] holds it) is `ret
/// SECCOMP_RET_USER_NOTIF`. Pure.
fn returns_user_notif(insn: u64) -> bool {
    const BPF_RET_K: u64 = 0x06;
    const SECCOMP_RET_USER_NOTIF: u64 = 0x7fc0_0000;
    const SECCOMP_RET_ACTION_FULL: u64 = 0xffff_0000;
    let (code, k) = (insn & 0xffff, insn >> 32);
    code == BPF_RET_K && k & SECCOMP_RET_ACTION_FULL == SECCOMP_RET_USER_NOTIF
}

/// The filters of a stopped thread, oldest first.
fn filters_of(tid: Tid) -> Result<Vec<SeccompFilter>> {
    let mut newest_first = Vec::new();
    while let Some(insns) = sys::seccomp_filter(tid, newest_first.len())? {
        let flags = sys::seccomp_filter_flags(tid, newest_first.len())?;
        newest_first.push(SeccompFilter { insns, flags });
    }
    newest_first.reverse();
    Ok(newest_first)
}

/// Traces every thread of the restored process `pid` with `options` and
/// PTRACE_O_SUSPEND_SECCOMP, before its sandbox is installed: the restorer's calls after it pass.
pub fn suspend(pid: Tid, options: libc::c_long) -> Result<()> {
    for tid in procfs::tasks(pid)? {
        sys::set_options(tid, options | sys::PTRACE_O_SUSPEND_SECCOMP)
            .map_err(|e| Error::Other(format!("pid {pid}: restoring its seccomp sandbox needs root (PTRACE_O_SUSPEND_SECCOMP, CAP_SYS_ADMIN): {e}")))?;
    }
    Ok(())
}

/// The one chain every thread of the process (`all_tids`, inside the job) ran under, if they
/// did and there are several: installed once with TSYNC by [`restore_shared`].
pub fn shared_chain<'a>(rec: &'a SeccompRecord, all_tids: &[Tid]) -> Option<&'a [SeccompFilter]> {
    if all_tids.len() < 2 || rec.threads.len() != all_tids.len() {
        return None;
    }
    let SeccompMode::Filters(first) = &rec.threads[0].1 else { return None };
    let same = rec.threads.iter().all(|(tid, mode)| all_tids.contains(tid) && matches!(mode, SeccompMode::Filters(f) if f == first));
    same.then_some(first.as_slice())
}

/// Installs `chain` from the process's main thread for all its threads (TSYNC).
pub fn restore_shared(chain: &[SeccompFilter], inj: &mut Injector, scratch: Scratch) -> Result<()> {
    for filter in chain {
        install(filter, SECCOMP_FILTER_FLAG_TSYNC, inj, scratch)?;
    }
    Ok(())
}

/// Installs one thread's own sandbox, in the thread.
pub fn restore_thread(mode: &SeccompMode, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    match mode {
        SeccompMode::Strict => {
            inj.call("seccomp(SECCOMP_SET_MODE_STRICT)", libc::SYS_seccomp, &[SECCOMP_SET_MODE_STRICT, 0, 0])?;
        }
        SeccompMode::Filters(chain) => {
            for filter in chain {
                install(filter, 0, inj, scratch)?;
            }
        }
    }
    Ok(())
}

/// seccomp(SECCOMP_SET_MODE_FILTER) of one filter: its instructions in the scratch area after a
/// `struct sock_fprog` pointing to them.
fn install(filter: &SeccompFilter, extra_flags: u64, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    const FPROG_LEN: usize = 16;
    let insns: Vec<u8> = filter.insns.iter().flat_map(|i| i.to_le_bytes()).collect();
    let at = scratch.put(FPROG_LEN, &insns)?;
    let mut fprog = Vec::with_capacity(FPROG_LEN);
    fprog.extend_from_slice(&(filter.insns.len() as u16).to_le_bytes());
    fprog.extend_from_slice(&[0u8; 6]);
    fprog.extend_from_slice(&at.to_le_bytes());
    let fprog = scratch.put(0, &fprog)?;
    inj.call("seccomp(SECCOMP_SET_MODE_FILTER)", libc::SYS_seccomp, &[SECCOMP_SET_MODE_FILTER, filter.flags | extra_flags, fprog])?;
    Ok(())
}

/// Checks a record read from an image against the process's threads (`tids`, inside the job):
/// every thread named is one of them, once; filters within the kernel's limits; only the flags
/// the kernel keeps. Pure.
pub fn validate(rec: &SeccompRecord, tids: &[Tid]) -> std::result::Result<(), String> {
    let mut seen = Vec::new();
    for (tid, mode) in &rec.threads {
        if !tids.contains(tid) || seen.contains(tid) {
            return Err(format!("a seccomp sandbox for thread {tid}, which is not one of the process's, or named twice"));
        }
        seen.push(*tid);
        if let SeccompMode::Filters(chain) = mode {
            if chain.is_empty() {
                return Err(format!("thread {tid}: a filter sandbox without a filter"));
            }
            let mut total = 0usize;
            for f in chain {
                if f.insns.is_empty() || f.insns.len() > MAX_INSNS {
                    return Err(format!("thread {tid}: a seccomp filter of {} instructions (1 to {MAX_INSNS})", f.insns.len()));
                }
                if f.flags & !KEPT_FLAGS != 0 {
                    return Err(format!("thread {tid}: seccomp filter flags {:#x}", f.flags));
                }
                total = total.saturating_add(f.insns.len() + 4);
            }
            if total > MAX_CHAIN_INSNS {
                return Err(format!("thread {tid}: seccomp filters of {total} instructions in all (at most {MAX_CHAIN_INSNS})"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(n: u64) -> SeccompFilter {
        SeccompFilter { insns: vec![0x7fff_0000_0000_0006 + n], flags: 0 }
    }

    #[test]
    fn threads_under_one_chain_share_it_others_do_not() {
        let chain = SeccompMode::Filters(vec![filter(1), filter(2)]);
        let rec = SeccompRecord { threads: vec![(10, chain.clone()), (11, chain.clone())] };
        assert_eq!(shared_chain(&rec, &[10, 11]), Some(&[filter(1), filter(2)][..]));
        // One thread alone: installed in it, no TSYNC needed.
        assert_eq!(shared_chain(&SeccompRecord { threads: vec![(10, chain.clone())] }, &[10]), None);
        // A thread without a sandbox, or with another chain, or strict.
        assert_eq!(shared_chain(&rec, &[10, 11, 12]), None);
        let other = SeccompRecord { threads: vec![(10, chain.clone()), (11, SeccompMode::Filters(vec![filter(1)]))] };
        assert_eq!(shared_chain(&other, &[10, 11]), None);
        let strict = SeccompRecord { threads: vec![(10, SeccompMode::Strict), (11, SeccompMode::Strict)] };
        assert_eq!(shared_chain(&strict, &[10, 11]), None);
    }

    #[test]
    fn a_return_to_a_supervisor_is_told_from_other_returns() {
        // struct sock_filter { u16 code; u8 jt, jf; u32 k; }, little-endian in one word.
        let ret = |k: u64| 0x06 | k << 32;
        assert!(returns_user_notif(ret(0x7fc0_0000)));
        assert!(!returns_user_notif(ret(0x7fff_0000))); // allow
        assert!(!returns_user_notif(ret(0x0005_0001))); // errno
        assert!(!returns_user_notif(0x15 | 0x7fc0_0000 << 32)); // a jump comparing with it
    }

    #[test]
    fn forged_sandboxes_are_refused() {
        let ok = SeccompRecord { threads: vec![(10, SeccompMode::Filters(vec![filter(1)])), (11, SeccompMode::Strict)] };
        assert_eq!(validate(&ok, &[10, 11]), Ok(()));
        assert!(validate(&ok, &[10]).unwrap_err().contains("thread 11"));
        let twice = SeccompRecord { threads: vec![(10, SeccompMode::Strict), (10, SeccompMode::Strict)] };
        assert!(validate(&twice, &[10]).is_err());
        let empty = SeccompRecord { threads: vec![(10, SeccompMode::Filters(vec![]))] };
        assert!(validate(&empty, &[10]).unwrap_err().contains("without a filter"));
        let long = SeccompRecord { threads: vec![(10, SeccompMode::Filters(vec![SeccompFilter { insns: vec![6; MAX_INSNS + 1], flags: 0 }]))] };
        assert!(validate(&long, &[10]).unwrap_err().contains("instructions"));
        let many = SeccompRecord { threads: vec![(10, SeccompMode::Filters(vec![SeccompFilter { insns: vec![6; MAX_INSNS], flags: 0 }; 9]))] };
        assert!(validate(&many, &[10]).unwrap_err().contains("in all"));
        let listener = SeccompRecord { threads: vec![(10, SeccompMode::Filters(vec![SeccompFilter { insns: vec![6], flags: 1 << 3 }]))] };
        assert!(validate(&listener, &[10]).unwrap_err().contains("flags"));
    }
}
