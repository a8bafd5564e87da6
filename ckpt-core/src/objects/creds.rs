//! A thread's credentials: user and group ids (real, effective, saved, filesystem),
//! supplementary groups, capability sets (effective, permitted, inheritable, bounding, ambient),
//! securebits, no_new_privs, and the dumpable flag that the kernel ties to them. Linux keeps all
//! of these per thread (glibc makes the ids agree across a process's threads; a raw system call
//! need not), so they are captured and restored per thread.
//!
//! **Capture** reads ids, groups, capability sets and no_new_privs from
//! `/proc/PID/task/TID/status`, and asks the thread for its securebits and dumpable flag.
//!
//! **Restore** is the last step of a process's rebuild ([`restore_last`]), in every thread: the
//! restorer's injected system calls run with the credentials the empty process inherited from the
//! job's init (root's, or for an ordinary user their own ids with the full capability set of the
//! job's user namespace, see [`crate::userns`]), and nothing may keep what the program did not
//! have. In order, each step needing what the one before still holds:
//! 1. supplementary groups (CAP_SETGID);
//! 2. group ids, then the filesystem group id (CAP_SETGID);
//! 3. securebits, with KEEP_CAPS added so that the capabilities outlive the change of user ids
//!    (CAP_SETPCAP);
//! 4. user ids (CAP_SETUID);
//! 5. the bounding set lowered (CAP_SETPCAP), the three sets set, the ambient ones raised;
//! 6. the filesystem user id (setresuid set it to the effective one);
//! 7. KEEP_CAPS as recorded, no_new_privs, dumpable (changing ids makes a process non-dumpable).
//!
//! Every step can only take away: an image that claims more than the restorer has is refused by
//! the kernel (EPERM), never granted; the restorer itself never runs an image of another user as
//! root (see docs/TRUST.md).

use serde::{Deserialize, Serialize};

use super::user_namespaces::Numbering;
use crate::error::{Error, Result};
use crate::procfs;
use crate::ptrace::batch::{Answers, Asked, Questions};
use crate::ptrace::{Injector, RemoteTask, Scratch, Tid};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CapsRecord {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub bounding: u64,
    pub ambient: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CredsRecord {
    /// Real, effective, saved, filesystem user id.
    pub uids: [u32; 4],
    /// Real, effective, saved, filesystem group id.
    pub gids: [u32; 4],
    /// Supplementary groups, as the machine's user namespace numbers them.
    pub groups: Vec<u32>,
    pub caps: CapsRecord,
    pub securebits: u32,
    pub no_new_privs: bool,
    /// prctl(PR_GET_DUMPABLE): 0, 1 or 2 (a process's, but set by every change of credentials).
    pub dumpable: u32,
}

/// What `/proc/PID/task/TID/status` tells of a thread's credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct StatusCreds {
    uids: [u32; 4],
    gids: [u32; 4],
    groups: Vec<u32>,
    caps: CapsRecord,
    no_new_privs: bool,
    seccomp: u32,
}

fn status_creds(host_pid: Tid, host_tid: Tid) -> Result<StatusCreds> {
    let path = format!("/proc/{host_pid}/task/{host_tid}/status");
    let text = std::fs::read_to_string(&path)?;
    parse_status(&text).ok_or_else(|| Error::Other(format!("{path}: no credentials in it")))
}

impl StatusCreds {
    /// From the thread's status already read and parsed (the capture reads it once a thread).
    fn of(status: &procfs::Status) -> StatusCreds {
        StatusCreds {
            uids: [status.ruid, status.euid, status.suid, status.fuid],
            gids: [status.rgid, status.egid, status.sgid, status.fgid],
            groups: status.groups.clone(),
            caps: CapsRecord {
                inheritable: status.capinh,
                permitted: status.capprm,
                effective: status.capeff,
                // Kernels before 2.6.26 have no bounding set, before 4.3 no ambient set.
                bounding: status.capbnd.unwrap_or(0),
                ambient: status.capamb.unwrap_or(0),
            },
            no_new_privs: status.nonewprivs == Some(1),
            seccomp: status.seccomp.unwrap_or(0),
        }
    }
}

/// The credential lines of a status file. Pure.
fn parse_status(text: &str) -> Option<StatusCreds> {
    let value = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim);
    let hex = |name: &str| value(name).and_then(|v| u64::from_str_radix(v, 16).ok());
    let ids = |name: &str| -> Option<[u32; 4]> {
        let v: Vec<u32> = value(name)?.split_whitespace().map(|w| w.parse().ok()).collect::<Option<_>>()?;
        v.try_into().ok()
    };
    Some(StatusCreds {
        uids: ids("Uid")?,
        gids: ids("Gid")?,
        groups: value("Groups")?.split_whitespace().map(|w| w.parse().ok()).collect::<Option<_>>()?,
        caps: CapsRecord {
            inheritable: hex("CapInh")?,
            permitted: hex("CapPrm")?,
            effective: hex("CapEff")?,
            bounding: hex("CapBnd")?,
            // Kernels before 4.3 have no ambient set.
            ambient: hex("CapAmb").unwrap_or(0),
        },
        no_new_privs: value("NoNewPrivs") == Some("1"),
        seccomp: value("Seccomp").and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

/// The calls [`capture`] reads the answers of, made in the thread.
pub struct CredsAsked {
    securebits: Asked,
    dumpable: Asked,
}

/// Asks a stopped thread what /proc does not show of its credentials.
pub fn ask(q: &mut Questions) -> CredsAsked {
    CredsAsked {
        securebits: q.ask("prctl(PR_GET_SECUREBITS)", libc::SYS_prctl, &[libc::PR_GET_SECUREBITS as u64]),
        dumpable: q.ask("prctl(PR_GET_DUMPABLE)", libc::SYS_prctl, &[libc::PR_GET_DUMPABLE as u64]),
    }
}

/// Captures a stopped thread's credentials: from its status file, and the answers to [`ask`].
pub fn capture(status: &procfs::Status, answers: &Answers, asked: &CredsAsked) -> Result<CredsRecord> {
    // A seccomp sandbox is `super::seccomp`'s.
    let s = StatusCreds::of(status);
    let securebits = answers.value(asked.securebits)? as u32;
    let dumpable = answers.value(asked.dumpable)? as u32;
    Ok(CredsRecord { uids: s.uids, gids: s.gids, groups: s.groups, caps: s.caps, securebits, no_new_privs: s.no_new_privs, dumpable })
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

const SECBIT_KEEP_CAPS: u32 = 1 << 4;

/// Puts the thread's credentials to the record's, from inside the thread (see the module's
/// comment for the order), then checks that they are. The record and the check number ids as
/// the machine does (both read from outside); the thread sets them as its user namespace
/// numbers them (`numbering`: a namespace the job made, see [`super::user_namespaces`]).
pub fn restore_last(rec: &CredsRecord, host_pid: Tid, host_tid: Tid, inj: &mut Injector, scratch: Scratch, numbering: Numbering) -> Result<()> {
    let now = status_creds(host_pid, host_tid)?;
    let (uid, gid) = (|id: u32| numbering.uid(id) as u64, |id: u32| numbering.gid(id) as u64);
    let prctl = |inj: &mut Injector, name: &str, args: &[u64]| -> Result<u64> { Ok(inj.call(name, libc::SYS_prctl, args)?) };
    let mut groups = rec.groups.clone();
    if now.groups != rec.groups {
        let bytes: Vec<u8> = rec.groups.iter().flat_map(|&g| (gid(g) as u32).to_le_bytes()).collect();
        let list = scratch.put(0, &bytes)?;
        match inj.call("setgroups", libc::SYS_setgroups, &[rec.groups.len() as u64, list]) {
            Ok(_) => {}
            // In an ordinary user's job (a user namespace where setgroups is denied), the
            // groups are the ones the user has now: never more than the kernel gives them.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !crate::userns::privileged() => {
                tracing::warn!(thread = host_tid, was = ?rec.groups, now = ?now.groups, "supplementary groups differ from the checkpoint's; an ordinary user's job keeps the ones the user has now");
                groups = now.groups.clone();
            }
            Err(e) => return Err(Error::Other(format!("thread {host_tid}: set supplementary groups {:?}: {e}", rec.groups))),
        }
    }
    let [rgid, egid, sgid, fsgid] = rec.gids.map(gid);
    if now.gids != rec.gids {
        inj.call("setresgid", libc::SYS_setresgid, &[rgid, egid, sgid])?;
    }
    // setresgid set the filesystem group id to the effective one; a program may have set it
    // apart, with a capability it gives up with its user ids (zdtm's pid00: setfsgid, then
    // setresuid to another user). So now, while the restorer's rights are the thread's: after
    // setresuid it could no longer. (No error is reported: the check below does.)
    inj.call("setfsgid", libc::SYS_setfsgid, &[fsgid])?;
    let securebits = prctl(inj, "prctl(PR_GET_SECUREBITS)", &[libc::PR_GET_SECUREBITS as u64])? as u32;
    // KEEP_CAPS while the user ids change, so that the permitted set outlives it.
    let wanted_bits = rec.securebits | SECBIT_KEEP_CAPS;
    if securebits != wanted_bits {
        prctl(inj, "prctl(PR_SET_SECUREBITS)", &[libc::PR_SET_SECUREBITS as u64, wanted_bits as u64])?;
    }
    let [ruid, euid, suid, fsuid] = rec.uids.map(uid);
    if now.uids != rec.uids {
        inj.call("setresuid", libc::SYS_setresuid, &[ruid, euid, suid])?;
    }
    let caps_now = status_creds(host_pid, host_tid)?.caps;
    if caps_now != rec.caps {
        restore_caps(&rec.caps, &caps_now, inj, scratch)?;
    }
    // setresuid set the filesystem user id to the effective one: set apart again (the thread's
    // capabilities are back, if it had what that takes).
    inj.call("setfsuid", libc::SYS_setfsuid, &[fsuid])?;
    if rec.securebits & SECBIT_KEEP_CAPS == 0 {
        prctl(inj, "prctl(PR_SET_KEEPCAPS)", &[libc::PR_SET_KEEPCAPS as u64, 0])?;
    }
    if rec.no_new_privs && !now.no_new_privs {
        prctl(inj, "prctl(PR_SET_NO_NEW_PRIVS)", &[libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0])?;
    }
    let dumpable = prctl(inj, "prctl(PR_GET_DUMPABLE)", &[libc::PR_GET_DUMPABLE as u64])? as u32;
    // 2 (suid_dumpable's "readable by root only") cannot be set by prctl; only the kernel sets it.
    if dumpable != rec.dumpable && rec.dumpable <= 1 {
        prctl(inj, "prctl(PR_SET_DUMPABLE)", &[libc::PR_SET_DUMPABLE as u64, rec.dumpable as u64])?;
    }
    let done = status_creds(host_pid, host_tid)?;
    let wanted = StatusCreds { uids: rec.uids, gids: rec.gids, groups, caps: rec.caps, no_new_privs: rec.no_new_privs, seccomp: done.seccomp };
    if done != wanted {
        return Err(Error::Other(format!("thread {host_tid}: its credentials could not be restored: {done:?}, the image says {wanted:?}")));
    }
    Ok(())
}

/// capset(2)'s arguments for `caps`' effective, permitted and inheritable sets: struct
/// __user_cap_header_struct, then two struct __user_cap_data_struct. Pure.
fn capset_bytes(caps: &CapsRecord) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&LINUX_CAPABILITY_VERSION_3.to_le_bytes());
    bytes.extend_from_slice(&0i32.to_le_bytes());
    for half in [0, 32] {
        for set in [caps.effective, caps.permitted, caps.inheritable] {
            bytes.extend_from_slice(&((set >> half) as u32).to_le_bytes());
        }
    }
    bytes
}

/// CAP_SYS_ADMIN's bit in a capability set.
pub const CAP_SYS_ADMIN: u64 = 1 << 21;

/// Runs `call` with CAP_SYS_ADMIN out of the effective set of the task's main thread, if it is
/// in, and puts it back after: for what the kernel grants by that capability alone (a fanotify
/// group made without it is an unprivileged one), decided as for a process that lacked it at
/// the checkpoint, on a restart by root.
pub fn without_admin<T>(task: &mut RemoteTask, scratch_off: usize, call: impl FnOnce(&mut RemoteTask) -> Result<T>) -> Result<T> {
    let now = status_creds(task.pid, task.pid)?.caps;
    if now.effective & CAP_SYS_ADMIN == 0 {
        return call(task);
    }
    let set = |task: &mut RemoteTask, caps: &CapsRecord| -> Result<()> {
        let header = task.put(scratch_off, &capset_bytes(caps))?;
        task.syscall("capset", libc::SYS_capset, &[header, header + 8]).map(drop).map_err(Error::from)
    };
    set(task, &CapsRecord { effective: now.effective & !CAP_SYS_ADMIN, ..now })?;
    let result = call(task);
    set(task, &now)?;
    result
}

/// The bounding set lowered, then the three sets, then the ambient ones raised.
fn restore_caps(rec: &CapsRecord, now: &CapsRecord, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    for cap in bits(now.bounding & !rec.bounding) {
        inj.call("prctl(PR_CAPBSET_DROP)", libc::SYS_prctl, &[libc::PR_CAPBSET_DROP as u64, cap])?;
    }
    let header = scratch.put(0, &capset_bytes(rec))?;
    inj.call("capset", libc::SYS_capset, &[header, header + 8])?;
    for cap in bits(rec.ambient) {
        inj.call("prctl(PR_CAP_AMBIENT_RAISE)", libc::SYS_prctl, &[libc::PR_CAP_AMBIENT as u64, libc::PR_CAP_AMBIENT_RAISE as u64, cap])?;
    }
    Ok(())
}

/// Refuses, before any process exists, a restart that cannot give a thread the capabilities it
/// held: those outside this process's bounding set (a container, or a machine whose root is
/// given fewer), which no capset can raise. Named, rather than failing half-way with EPERM.
pub fn check_grantable<'a>(threads: impl IntoIterator<Item = (Tid, &'a CredsRecord)>) -> Result<()> {
    let own = std::process::id() as Tid;
    let bounding = status_creds(own, own)?.caps.bounding;
    for (tid, creds) in threads {
        let held = creds.caps.permitted | creds.caps.effective | creds.caps.ambient;
        let missing = held & !bounding;
        if missing != 0 {
            let names: Vec<String> = bits(missing).map(cap_name).collect();
            return Err(Error::Other(format!(
                "thread {tid} held {}, which this restart cannot give (not in its capability bounding set, {bounding:#x}: a container, or a machine whose root is given fewer): restart where they are granted",
                names.join(", ")
            )));
        }
    }
    Ok(())
}

/// A capability's name, as capabilities(7) writes it.
fn cap_name(cap: u64) -> String {
    const NAMES: [&str; 41] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    NAMES.get(cap as usize).map_or_else(|| format!("capability {cap}"), |n| format!("CAP_{n}"))
}

/// The numbers of the capabilities set in a mask.
fn bits(mask: u64) -> impl Iterator<Item = u64> {
    (0..64).filter(move |b| mask & (1 << b) != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn capabilities_are_named() {
        assert_eq!(super::cap_name(24), "CAP_SYS_RESOURCE");
        assert_eq!(super::cap_name(40), "CAP_CHECKPOINT_RESTORE");
        assert_eq!(super::cap_name(63), "capability 63");
    }

    use super::*;

    #[test]
    fn status_lines_give_the_credentials() {
        let text = "Name:\tx\nUid:\t0\t1000\t1000\t1000\nGid:\t5\t6\t7\t8\nGroups:\t4 24 27 \n\
                    CapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n\
                    CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000400\nNoNewPrivs:\t1\n";
        let c = parse_status(text).unwrap();
        assert_eq!(c.uids, [0, 1000, 1000, 1000]);
        assert_eq!(c.gids, [5, 6, 7, 8]);
        assert_eq!(c.groups, vec![4, 24, 27]);
        assert_eq!(c.caps.inheritable, 0);
        assert_eq!(c.caps.permitted, 0x1ff_ffff_ffff);
        assert_eq!(c.caps.effective, 0x1ff_feff_ffff);
        assert_eq!(c.caps.ambient, 1 << 10);
        assert!(c.no_new_privs);
        assert_eq!(bits(c.caps.ambient).collect::<Vec<_>>(), vec![10]);
    }

    #[test]
    fn the_parsed_status_gives_the_credentials_its_text_gives() {
        let own = std::process::id() as Tid;
        let text = std::fs::read_to_string(format!("/proc/{own}/status")).unwrap();
        assert_eq!(StatusCreds::of(&procfs::status(own).unwrap()), parse_status(&text).unwrap());
    }

    #[test]
    fn a_status_without_credentials_is_refused() {
        assert!(parse_status("Name:\tx\n").is_none());
        assert!(parse_status("Uid:\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\nCapBnd:\t0\n").is_none());
        let empty_groups = "Uid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\nGroups:\t\nCapInh:\t0\nCapPrm:\t0\nCapEff:\t0\nCapBnd:\t0\n";
        assert_eq!(parse_status(empty_groups).unwrap().groups, Vec::<u32>::new());
    }
}
