//! The namespaces a job's processes live in, and their root directory.
//!
//! A job runs in namespaces the launcher made for it (PID, mount, IPC, and for an ordinary user a
//! user namespace) or shares the machine's (network, UTS, cgroup, and for root, user). A restart
//! makes the same set again, and every restored process is created in it. A process that made
//! a namespace of its own (`unshare --net`, `unshare --uts`, a container runtime inside the
//! job) or changed its root directory (`chroot`, `pivot_root`) would come back in the job's,
//! with the wrong network, host name, files or ids, and nothing would say so: such a process is
//! refused at the checkpoint ([`check`]), naming it and what it made, and the job goes on. So is
//! a process the job moved to cgroups other than its init's (it would come back in the init's).
//!
//! Time namespaces are compared here too; their clocks are [`super::timens`]'s. Mount
//! namespaces the job made are kept ([`super::mounts`]).

use crate::ptrace::Tid;
use crate::{procfs, Error, Result};

/// A kind of namespace: its link under /proc/PID/ns, the link of the job's init it must equal,
/// and how a process comes to have one of its own (for the message).
struct Kind {
    link: &'static str,
    of_init: &'static str,
    what: &'static str,
}

const KINDS: &[Kind] = &[
    Kind { link: "net", of_init: "net", what: "a network namespace of its own (unshare --net, ip netns exec)" },
    Kind { link: "uts", of_init: "uts", what: "a UTS namespace of its own, with its own host name (unshare --uts)" },
    Kind { link: "ipc", of_init: "ipc", what: "an IPC namespace of its own (unshare --ipc)" },
    Kind { link: "user", of_init: "user", what: "a user namespace of its own (unshare --user, a rootless container)" },
    Kind { link: "cgroup", of_init: "cgroup", what: "a cgroup namespace of its own (unshare --cgroup)" },
    // The init is the first process of the job's PID namespace: its own link names it.
    Kind { link: "pid", of_init: "pid", what: "a PID namespace of its own (unshare --pid --fork)" },
    Kind { link: "pid_for_children", of_init: "pid", what: "a PID namespace for its children (unshare --pid)" },
    // The job is in the namespace the init's children are in, not the init's own.
    Kind { link: "time", of_init: "time_for_children", what: "a time namespace of its own (unshare --time)" },
    Kind { link: "time_for_children", of_init: "time_for_children", what: "a time namespace for its children (unshare --time)" },
];

/// Refuses a job with a process (of `pids`, host pids) in a namespace other than the job's, or
/// under a root directory other than the init's (see the module). `init` is the job's init.
/// Namespace kinds this kernel lacks are skipped.
pub fn check(init: Tid, pids: &[Tid]) -> Result<()> {
    let mut of_job = Vec::new();
    for kind in KINDS {
        match procfs::readlink(&format!("/proc/{init}/ns/{}", kind.of_init)) {
            Ok(ns) => of_job.push((kind, ns)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    let root_of_job = procfs::readlink(&format!("/proc/{init}/root"))?;
    let cgroups_of_job = cgroups_of(init)?;
    for &pid in pids {
        for (kind, ns) in &of_job {
            if procfs::readlink(&format!("/proc/{pid}/ns/{}", kind.link))? != *ns {
                return Err(Error::Unsupported { pid: ns_pid_or(pid), what: kind.what.to_string() });
            }
        }
        // Read from outside, a process's root shows as the path of its root directory in ours.
        let root = procfs::readlink(&format!("/proc/{pid}/root"))?;
        if root != root_of_job {
            return Err(Error::Unsupported { pid: ns_pid_or(pid), what: format!("a root directory of its own ({root}: chroot or pivot_root)") });
        }
        // A restarted process is in its init's cgroups: one the job moved elsewhere would come
        // back without its limits or its place, and nothing would say so.
        let cgroups = cgroups_of(pid)?;
        if cgroups != cgroups_of_job {
            let hierarchy = |line: &str| line.split(':').next().unwrap_or("").to_string();
            let moved: Vec<&String> = cgroups.iter().filter(|c| !cgroups_of_job.contains(c)).collect();
            let theirs: Vec<&String> = cgroups_of_job.iter().filter(|c| moved.iter().any(|m| hierarchy(m) == hierarchy(c))).collect();
            let list = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
            return Err(Error::Unsupported {
                pid: ns_pid_or(pid),
                what: format!("cgroups of its own ({}, where the job's init is in {}: it would come back in the init's)", list(&moved), list(&theirs)),
            });
        }
    }
    Ok(())
}

/// The cgroups of process `pid` (host pid), one `hierarchy:controllers:path` per line of
/// /proc/PID/cgroup.
fn cgroups_of(pid: Tid) -> Result<Vec<String>> {
    let path = format!("/proc/{pid}/cgroup");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Other(format!("read {path}: {e}")))?;
    Ok(text.lines().map(str::to_string).collect())
}

/// The pid `host_pid` knows itself by, for messages (the host pid when that cannot be read).
fn ns_pid_or(host_pid: Tid) -> Tid {
    procfs::ns_tid(host_pid).unwrap_or(host_pid)
}
