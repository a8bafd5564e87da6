//! The job's user namespace, for a launcher without privilege.
//!
//! An ordinary user may not create PID, mount and IPC namespaces, nor choose pids with
//! `clone3(set_tid)`, in the machine's own user namespace. In a user namespace of their own they
//! may: the job is started in a new user namespace where the user's uid and gid map to
//! themselves (files the job creates belong to the user; the job sees its own ids), with the PID,
//! mount and IPC namespaces made in the same `clone`, so that they belong to it.
//!
//! Who holds which rights:
//! - The launcher (the tracer) stays outside. As the namespace's owner it has every capability
//!   *inside* it, which is what `ptrace`, `pidfd_getfd` and `/proc/PID/mem` of the job's
//!   processes ask for; it has none in the machine's namespace (no TCP repair, no
//!   `/proc/PID/map_files`).
//! - The job's init (our own code, pid 1 of the job) keeps the namespace's full capabilities
//!   across its `execve` as ambient capabilities: it mounts the job's /proc and creates processes
//!   with exact pids at restart; the empty processes it creates inherit them, so the system calls
//!   the restorer injects there act with them.
//! - The program never holds them: init drops every capability before it executes the program,
//!   and a restored process ends with the capabilities its record says ([`crate::objects::creds`]).
//!
//! Root (with CAP_SYS_ADMIN) needs none of this and runs the job without a user namespace.
//!
//! The functions marked "async-signal-safe" run in the child between `clone` and `execve`:
//! plain system calls on data prepared before the `clone`, no allocation.

use std::io;

use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::sys::caps;
use crate::sys::process::{self, Forked};

const CAP_SYS_ADMIN: u32 = 21;

pub use crate::sys::caps::{capget, capset, CapSets};

/// Makes every permitted capability of the calling thread inheritable and ambient, so that it
/// survives `execve` of a program without file capabilities under a non-zero uid
/// (async-signal-safe).
pub fn keep_caps_across_exec() -> io::Result<()> {
    let mut sets = capget()?;
    sets.inheritable = sets.permitted;
    capset(sets)?;
    for cap in 0..64u64 {
        if sets.permitted & (1 << cap) != 0 {
            caps::raise_ambient(cap)?;
        }
    }
    Ok(())
}

/// Drops every capability of the calling thread, ambient ones with them, so that a program it
/// executes starts with none, as it would outside the job (async-signal-safe).
pub fn drop_all_caps() -> io::Result<()> {
    // Lowering the inheritable set clears the ambient set with it.
    capset(CapSets::default())
}

/// Whether this process may make the job's namespaces in the machine's own user namespace
/// (CAP_SYS_ADMIN in its effective set). Without, the job gets a user namespace of its own.
pub fn privileged() -> bool {
    capget().map(|c| c.effective & (1 << CAP_SYS_ADMIN) != 0).unwrap_or(false)
}

/// Maps the calling process's effective uid and gid to themselves in the user namespace of
/// `pid`, a child just created with CLONE_NEWUSER. `setgroups` is denied first, as the kernel
/// requires of an unprivileged writer of `gid_map`; the job then cannot change its groups.
pub fn map_own_ids(pid: i32) -> Result<()> {
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    let write = |file: &str, text: String| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, text).map_err(|e| Error::Other(format!("write {path}: {e} ({})", unavailable_reason())))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))?;
    Ok(())
}

/// Why this machine refuses a user namespace to an ordinary user, and what an administrator can
/// do: read from the settings that switch them off.
pub fn unavailable_reason() -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return "user namespaces are switched off on this machine (user.max_user_namespaces = 0); \
                an administrator can allow them with `sysctl -w user.max_user_namespaces=15000`"
            .into();
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return "unprivileged user namespaces are switched off on this machine \
                (kernel.unprivileged_userns_clone = 0); an administrator can allow them with \
                `sysctl -w kernel.unprivileged_userns_clone=1`"
            .into();
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return "AppArmor restricts unprivileged user namespaces on this machine \
                (kernel.apparmor_restrict_unprivileged_userns = 1); an administrator can allow \
                them for ckpt with an AppArmor profile that grants `userns,` to its binary, or \
                switch the restriction off with `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
            .into();
    }
    if let Some(n) = read("/proc/sys/user/max_user_namespaces") {
        return format!(
            "the kernel refused a new user namespace although user.max_user_namespaces = {n}: \
             this user may have reached that limit, or a security module (SELinux, AppArmor) \
             forbids it; run ckpt as root, or ask an administrator"
        );
    }
    "this kernel has no user namespaces (CONFIG_USER_NS); run ckpt as root".into()
}

/// Checks, before anything is created, that this machine lets this user make a user namespace
/// in which they hold the capabilities a job's namespaces need: a throwaway child makes one,
/// gets its ids mapped and makes a mount and a PID namespace in it. Fails with what an
/// administrator can do.
pub fn probe() -> Result<()> {
    let (wait_read, go_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: the child only makes async-signal-safe calls (close, read, unshare, _exit).
    let pid = match unsafe { process::clone_fork(flags) } {
        Err(e) => return Err(Error::Other(format!("cannot create a user namespace for the job ({e}): {}", unavailable_reason()))),
        Ok(Forked::Child) => {
            // Our copy of the write end, closed so that the parent giving up reads as EOF.
            drop(go_write);
            let mut byte = [0u8];
            if nix::unistd::read(&wait_read, &mut byte) != Ok(1) {
                process::exit_now(2);
            }
            let made = unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWIPC).is_ok();
            process::exit_now(if made { 0 } else { 1 });
        }
        Ok(Forked::Parent(pid)) => pid,
    };
    drop(wait_read);
    let mapped = map_own_ids(pid);
    if mapped.is_ok() {
        let _ = nix::unistd::write(&go_write, &[1]);
    }
    drop(go_write);
    let succeeded = match waitpid(Pid::from_raw(pid), None) {
        Ok(WaitStatus::Exited(_, code)) => code == 0,
        Ok(_) => false,
        // As the raw call's untouched status read: a child the wait did not find is no refusal.
        Err(_) => true,
    };
    mapped?;
    if !succeeded {
        return Err(Error::Other(format!(
            "this machine gives no capabilities in a user namespace (a mount or PID namespace could not be made in one): {}",
            unavailable_reason()
        )));
    }
    Ok(())
}

/// Makes this process the user `uid` (with group `gid` and that user's supplementary groups, as
/// a login would): real, effective and saved ids, and no capabilities left. For root restarting
/// another user's image, so that the job can never come back with more rights than its owner
/// has; from then on the restart is an ordinary user's. Call it before any thread starts.
pub fn become_user(uid: u32, gid: u32) -> Result<()> {
    use nix::unistd::{Gid, Uid, User};
    let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
    let groups = match &user {
        Some(u) => {
            let name = std::ffi::CString::new(u.name.as_bytes()).map_err(|_| Error::Other(format!("user {uid} has a name with a NUL")))?;
            nix::unistd::getgrouplist(&name, Gid::from_raw(gid)).map_err(|e| Error::Other(format!("the groups of user {}: {e}", u.name)))?
        }
        // A uid without a passwd entry: its own group only.
        None => vec![Gid::from_raw(gid)],
    };
    let who = || user.as_ref().map_or_else(|| format!("uid {uid}"), |u| format!("{} (uid {uid})", u.name));
    nix::unistd::setgroups(&groups).map_err(|e| Error::Other(format!("take the groups of {}: {e}", who())))?;
    nix::unistd::setresgid(Gid::from_raw(gid), Gid::from_raw(gid), Gid::from_raw(gid))
        .map_err(|e| Error::Other(format!("take the group id {gid} of {}: {e}", who())))?;
    nix::unistd::setresuid(Uid::from_raw(uid), Uid::from_raw(uid), Uid::from_raw(uid)).map_err(|e| Error::Other(format!("become {}: {e}", who())))?;
    if capget().map(|c| c.permitted).unwrap_or(0) != 0 {
        return Err(Error::Other(format!("capabilities left after becoming {}", who())));
    }
    // Changing ids made this process non-dumpable: its /proc files would stay root's, and the
    // user could not write the uid map of the job's user namespace nor trace the job.
    nix::sys::prctl::set_dumpable(true).map_err(|e| Error::Other(format!("make the restart of {} traceable again: {}", who(), io::Error::from(e))))?;
    Ok(())
}
