//! UTS namespaces the job made: `unshare --uts`, `apptainer --hostname`, a build in a sandbox
//! that names its machine. Such a namespace holds a host name and a NIS domain name of its own,
//! which its processes see through uname(2) and gethostname(2).
//!
//! **Capture** groups the job's processes by UTS namespace ([`super::namespaces::group`]) and
//! asks one process of each namespace the job made for its names: uname(2) run inside it
//! (nothing outside a namespace shows them). A UTS namespace keeps the user namespace it
//! belongs to when that is above its maker's own ([`MadeNamespaces::capture`]: `unshare
//! --uts`, then `--user`; an ordinary user's bubblewrap), so that a restart makes it there,
//! where setting the names is allowed as it was and no more; one off the maker's way down is
//! refused.
//!
//! **Restore**: the first process of each UTS namespace (its maker) makes it by an injected
//! `unshare(CLONE_NEWUTS)` and sets both names ([`set_names`]), once it is in its user
//! namespace, or on its way down there when the namespace belongs above; the others join it
//! (`setns`), before their way down when it belongs to another user namespace than their own. The job's own namespace is the machine's,
//! whose names a restart on another node does not change.

use serde::{Deserialize, Serialize};

use super::namespaces::{MadeNamespace, MadeNamespaces, Member, StatefulKind, UserNamespaces};
use crate::error::{Error, Result};
use crate::ptrace::{RemoteTask, Tid};

/// The longest host or domain name the kernel keeps (`__NEW_UTS_LEN`).
pub const MAX_NAME: usize = 64;

/// A UTS namespace's names, as uname(2) gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtsNames {
    pub hostname: String,
    pub domainname: String,
}

impl UtsNames {
    /// The names in a `struct utsname` as uname(2) fills it. Pure.
    pub fn from_utsname(raw: &[u8]) -> Result<UtsNames> {
        // Six fields of 65 bytes: sysname, nodename, release, version, machine, domainname.
        const FIELD: usize = MAX_NAME + 1;
        let field = |i: usize| -> Result<String> {
            let bytes = raw.get(i * FIELD..(i + 1) * FIELD).ok_or_else(|| Error::Other(format!("uname gave {} bytes, not {}", raw.len(), 6 * FIELD)))?;
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            String::from_utf8(bytes[..end].to_vec()).map_err(|_| Error::Other("a host or domain name that is not UTF-8".into()))
        };
        Ok(UtsNames { hostname: field(1)?, domainname: field(5)? })
    }
}

/// The UTS namespaces the job made, each with its names.
pub type UtsRecord = MadeNamespaces<UtsNames>;
/// One UTS namespace of the job.
pub type UtsNsRecord = MadeNamespace<UtsNames>;

/// What UTS namespaces are to [`MadeNamespaces`].
pub const KIND: StatefulKind = StatefulKind { link: "uts", name: "UTS" };

impl UtsRecord {
    /// One line per namespace the job made, for `ckpt inspect`.
    pub fn describe_names(&self) -> Vec<String> {
        self.describe(KIND, |names| format!("host name {:?}, domain name {:?}", names.hostname, names.domainname))
    }
}

/// Captures the UTS namespaces the job's processes are in: `init` is the job's init (host pid),
/// `members` the job's processes in the image's order, `users` its user namespaces;
/// `names_in(host_pid)` reads the names a frozen process sees.
pub fn capture(init: Tid, members: &[Member], users: &UserNamespaces, names_in: impl FnMut(Tid) -> Result<UtsNames>) -> Result<UtsRecord> {
    MadeNamespaces::capture(KIND, init, members, users, names_in)
}

/// Checks what a restart would act on. Pure.
pub fn validate(rec: &UtsRecord, pids: &[Tid]) -> std::result::Result<(), String> {
    rec.validate(KIND.name, pids, |names| {
        for (what, name) in [("host", &names.hostname), ("domain", &names.domainname)] {
            if name.len() > MAX_NAME || name.contains('\0') {
                return Err(format!("its {what} name is {} bytes long or holds a NUL", name.len()));
            }
        }
        Ok(())
    })
}

/// Sets the names of the UTS namespace `task` has just made (`scratch_off`: where in its
/// scratch area the names may go).
pub fn set_names(task: &mut RemoteTask, names: &UtsNames, scratch_off: usize) -> Result<()> {
    for (call, nr, name) in [("sethostname", libc::SYS_sethostname, &names.hostname), ("setdomainname", libc::SYS_setdomainname, &names.domainname)] {
        let addr = task.put(scratch_off, name.as_bytes())?;
        task.syscall(call, nr, &[addr, name.len() as u64]).map_err(|e| Error::Other(format!("{call}({name:?}): {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_from_a_utsname() {
        let mut raw = vec![0u8; 6 * 65];
        raw[65..65 + 4].copy_from_slice(b"node");
        raw[5 * 65..5 * 65 + 3].copy_from_slice(b"nis");
        assert_eq!(UtsNames::from_utsname(&raw).unwrap(), UtsNames { hostname: "node".into(), domainname: "nis".into() });
        assert!(UtsNames::from_utsname(&raw[..100]).is_err());
    }

    #[test]
    fn records_out_of_bounds_are_refused() {
        let names = UtsNames { hostname: "box".into(), domainname: "(none)".into() };
        let good = UtsRecord { namespaces: vec![UtsNsRecord::default(), UtsNsRecord { pids: vec![5, 6], state: names.clone(), owner: None }] };
        assert_eq!(validate(&good, &[1, 5, 6]), Ok(()));
        assert_eq!(good.namespace_of(6), 1);
        assert_eq!(good.namespace_of(1), 0);
        let with = |f: &dyn Fn(&mut UtsRecord)| {
            let mut r = good.clone();
            f(&mut r);
            r
        };
        for bad in [
            with(&|r| r.namespaces[0].pids.push(1)),
            with(&|r| r.namespaces[1].pids.clear()),
            with(&|r| r.namespaces[1].pids.push(9)),
            with(&|r| r.namespaces.push(UtsNsRecord { pids: vec![5], state: names.clone(), owner: None })),
            with(&|r| r.namespaces[1].state.hostname = "x".repeat(65)),
            with(&|r| r.namespaces[1].state.domainname = "a\0b".into()),
        ] {
            assert!(validate(&bad, &[1, 5, 6]).is_err(), "{bad:?}");
        }
    }
}
