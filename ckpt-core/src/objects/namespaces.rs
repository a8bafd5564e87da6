//! The namespaces a job's processes live in.
//!
//! A job runs in namespaces the launcher made for it (PID, mount, IPC, and for an ordinary user a
//! user namespace) or shares the machine's (network, UTS, cgroup, and for root, user). A restart
//! makes the same set again, and every restored process is created in it. A process that made
//! a namespace of its own of another kind than mount, user, UTS, IPC and network (`unshare
//! --pid`, `unshare --cgroup`) would come back in the job's, with the wrong pids or cgroups, and
//! nothing would say so: such a process is refused at the checkpoint ([`check`]), naming it and
//! what it made, and the job goes on. Cgroups the job made below its init's are kept
//! ([`super::cgroups`]).
//!
//! Time namespaces are compared here too; their clocks are [`super::timens`]'s. Mount
//! namespaces the job made are kept ([`super::mounts`]), and so are user namespaces
//! ([`super::user_namespaces`]), UTS namespaces ([`super::uts`]), IPC namespaces
//! ([`super::sysvipc`]) and network namespaces that hold only their loopback
//! ([`super::net_namespaces`]): each kind is grouped here ([`group`]), each namespace with its
//! processes and the namespace it was made from. UTS, IPC and network namespaces, which hold
//! state of their own but no tree, are kept as [`MadeNamespaces`].

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::Context;
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
    Kind { link: "cgroup", of_init: "cgroup", what: "a cgroup namespace of its own (unshare --cgroup)" },
    // The init is the first process of the job's PID namespace: its own link names it.
    Kind { link: "pid", of_init: "pid", what: "a PID namespace of its own (unshare --pid --fork)" },
    Kind { link: "pid_for_children", of_init: "pid", what: "a PID namespace for its children (unshare --pid)" },
    // The job is in the namespace the init's children are in, not the init's own.
    Kind { link: "time", of_init: "time_for_children", what: "a time namespace of its own (unshare --time)" },
    Kind { link: "time_for_children", of_init: "time_for_children", what: "a time namespace for its children (unshare --time)" },
];

/// Refuses a job with a process (of `pids`, host pids) in a namespace of a kind not kept other
/// than the job's (see the module). `init` is the job's init.
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
    for &pid in pids {
        for (kind, ns) in &of_job {
            if procfs::readlink(&format!("/proc/{pid}/ns/{}", kind.link))? != *ns {
                return Err(Error::Unsupported { pid: ns_pid_or(pid), what: kind.what.to_string() });
            }
        }
    }
    Ok(())
}

/// The pid `host_pid` knows itself by, for messages (the host pid when that cannot be read).
pub(super) fn ns_pid_or(host_pid: Tid) -> Tid {
    procfs::ns_tid(host_pid).unwrap_or(host_pid)
}

/// What grouping needs of one of the job's processes.
pub struct Member {
    pub host_pid: Tid,
    pub pid: Tid,
    pub ppid: Tid,
    /// Its namespaces of the kinds [`group`] is asked for ([`GROUPED`], in that order), as
    /// /proc names them; `None` where the link could not be read ([`group`] reads it again,
    /// and tells why).
    links: [Option<String>; GROUPED.len()],
}

/// The kinds of namespace a job may make that the capture groups its processes by.
const GROUPED: [&str; 5] = ["mnt", "user", "uts", "ipc", "net"];

/// The job's processes for [`group`], in the order of `records` (the image's: parents first),
/// from their pids in the job and on the host (`host_pids`: each host pid with its pid in the
/// job, as the capture read them). Their namespace links are read here, side by side on the
/// CPUs (some 1,300 path walks in /proc at 256 processes, while the job is frozen).
pub fn members(host_pids: &HashMap<Tid, Tid>, records: &[super::ProcessRecord]) -> Vec<Member> {
    let host_of: HashMap<Tid, Tid> = host_pids.iter().map(|(&host, &in_job)| (in_job, host)).collect();
    let mut members: Vec<Member> =
        records.iter().filter_map(|r| host_of.get(&r.pid).map(|&host_pid| Member { host_pid, pid: r.pid, ppid: r.ppid, links: Default::default() })).collect();
    let read = procfs::side_by_side(&members, |part| part.iter().map(|m| (m.host_pid, GROUPED.map(|link| namespace_link(m.host_pid, link).ok()))).collect());
    let mut links: HashMap<Tid, _> = read.into_iter().collect();
    for m in &mut members {
        m.links = links.remove(&m.host_pid).unwrap_or_default();
    }
    members
}

/// The namespace of kind `link` process `host` is in, as /proc names it.
fn namespace_link(host: Tid, link: &str) -> std::io::Result<String> {
    procfs::readlink(&format!("/proc/{host}/ns/{link}"))
}

/// One namespace of a kind, as [`group`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouped {
    /// The namespace it was made from (an index before its own); 0 for the job's own.
    pub made_from: u32,
    /// Its processes (pids in the job) in the image's order, the first its maker; empty for the
    /// job's own, which holds every process not in another.
    pub pids: Vec<Tid>,
    /// A process in it to read it through (host pid): the job's init for the job's own.
    pub reader: Tid,
}

/// The namespaces of kind `link` (its name under /proc/PID/ns) the job's processes are in: the
/// job's own (the init's) first, then each namespace a process made, in the image's order. A
/// namespace's first process (parents come first) is taken as its maker, and the namespace as a
/// copy of, or a child of, its maker's parent's: a process cannot enter a namespace the job
/// did not make or its parents had, so one first seen in a process was made there (or by a
/// process gone since, whose namespace it inherited: the same for a restart).
pub fn group(link: &str, init: Tid, members: &[Member]) -> Result<Vec<Grouped>> {
    let ns_of = |host: Tid| namespace_link(host, link).context(|| format!("the {link} namespace of pid {host}"));
    let read = GROUPED.iter().position(|&kind| kind == link);
    let mut ids: Vec<String> = vec![ns_of(init)?];
    let mut out = vec![Grouped { made_from: 0, pids: Vec::new(), reader: init }];
    let mut index_of_pid: HashMap<Tid, usize> = HashMap::new();
    for m in members {
        let ns = match read.and_then(|at| m.links[at].clone()) {
            Some(ns) => ns,
            None => ns_of(m.host_pid)?,
        };
        let i = match ids.iter().position(|n| *n == ns) {
            Some(i) => i,
            None => {
                let made_from = index_of_pid.get(&m.ppid).copied().unwrap_or(0);
                ids.push(ns);
                out.push(Grouped { made_from: made_from as u32, pids: Vec::new(), reader: m.host_pid });
                ids.len() - 1
            }
        };
        index_of_pid.insert(m.pid, i);
        if i > 0 {
            out[i].pids.push(m.pid);
        }
    }
    Ok(out)
}

/// The namespaces of one kind the job made, for a kind whose namespaces hold state of their own
/// (`T`: a UTS namespace's names, an IPC namespace's System V objects, a network namespace's
/// loopback) but no tree: each is a
/// copy of the job's, made by its first process and joined by the others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MadeNamespaces<T> {
    /// The job's own first (index 0: no process listed, no state: the job's own is kept
    /// elsewhere or is the machine's), then each namespace a process of the job made, in the
    /// image's order.
    pub namespaces: Vec<MadeNamespace<T>>,
}

/// One namespace of the job's, of a kind [`MadeNamespaces`] keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MadeNamespace<T> {
    /// Its processes (pids in the job), in the image's order; the first is its maker.
    pub pids: Vec<Tid>,
    pub state: T,
    /// The user namespace it belongs to (an index of `UsersRecord::namespaces`) when that is
    /// not its maker's own but one on the way down to it, where the restart makes it (an
    /// ordinary user's bubblewrap makes its namespaces in one user namespace, then runs the
    /// sandbox in a second one below). Since format 20.
    #[serde(deserialize_with = "crate::image::since::since::<20, _, _>")]
    pub owner: Option<u32>,
}

/// A kind of namespace [`MadeNamespaces`] keeps: its link under /proc/PID/ns and its name in
/// messages.
#[derive(Debug, Clone, Copy)]
pub struct StatefulKind {
    pub link: &'static str,
    pub name: &'static str,
}

impl<T: Default + PartialEq> MadeNamespaces<T> {
    /// Captures the namespaces of `kind` the job's processes are in: `init` is the job's init
    /// (host pid), `members` the job's processes in the image's order, `users` the job's user
    /// namespaces; `read(host_pid)` reads the state of the namespace a frozen process is in.
    /// Each namespace keeps the user namespace it belongs to where that is not its maker's own
    /// ([`MadeNamespace::owner`]); one that belongs to a user namespace off its maker's way
    /// down is refused: a restart makes the namespace on that way, and from anywhere else it
    /// could do what it could not before.
    pub fn capture(
        kind: StatefulKind,
        init: Tid,
        members: &[Member],
        users: &UserNamespaces,
        mut read: impl FnMut(Tid) -> Result<T>,
    ) -> Result<MadeNamespaces<T>> {
        let groups = group(kind.link, init, members)?;
        let mut made = MadeNamespaces { namespaces: vec![MadeNamespace::default()] };
        if groups.len() == 1 {
            return Ok(made);
        }
        let of_machine = crate::nshelper::namespace_id(&format!("/proc/self/ns/{}", kind.link))?;
        for g in groups.into_iter().skip(1) {
            // A process root moved into the machine's namespace (nsenter) would take the
            // machine's objects into the image, and come back with copies of them.
            if crate::nshelper::namespace_id(&format!("/proc/{}/ns/{}", g.reader, kind.link))? == of_machine {
                return Err(Error::Unsupported { pid: g.pids[0], what: format!("the machine's {} namespace, entered from the job (nsenter?)", kind.name) });
            }
            let owner = owner_of(kind, &g, users)?;
            let state = read(g.reader).map_err(|e| match e {
                Error::Unsupported { .. } => e,
                e => e.of_object(g.pids[0], format!("its {} namespace", kind.name)),
            })?;
            made.namespaces.push(MadeNamespace { pids: g.pids, state, owner });
        }
        Ok(made)
    }

    /// The index of the namespace process `pid` is in (0: the job's own).
    pub fn namespace_of(&self, pid: Tid) -> usize {
        self.namespaces.iter().position(|ns| ns.pids.contains(&pid)).unwrap_or(0)
    }

    /// The namespaces the job made, with their index.
    pub fn made(&self) -> impl Iterator<Item = (usize, &MadeNamespace<T>)> {
        self.namespaces.iter().enumerate().skip(1)
    }

    /// One line per namespace the job made, for `ckpt inspect`: its maker, its processes, and
    /// what `state` says of what it holds.
    pub fn describe(&self, kind: StatefulKind, state: impl Fn(&T) -> String) -> Vec<String> {
        self.made()
            .map(|(_, ns)| {
                let pids = ns.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                let owner = ns.owner.map(|o| format!(", belonging to user namespace {o} above its maker's")).unwrap_or_default();
                format!("the {} namespace pid {} made (pids {pids}{owner}): {}", kind.name, ns.pids[0], state(&ns.state))
            })
            .collect()
    }

    /// Checks what a restart would act on: every namespace made has processes of the image, no
    /// process is in two, the job's own lists none; `state` checks each one's state. Pure.
    pub fn validate(&self, kind: &str, pids: &[Tid], state: impl Fn(&T) -> std::result::Result<(), String>) -> std::result::Result<(), String> {
        for (i, ns) in self.namespaces.iter().enumerate() {
            if i == 0 {
                if !ns.pids.is_empty() || ns.state != T::default() || ns.owner.is_some() {
                    return Err(format!("the job's own {kind} namespace lists processes, state or an owner"));
                }
                continue;
            }
            if ns.pids.is_empty() {
                return Err(format!("{kind} namespace {i} has no process"));
            }
            if let Some(p) = ns.pids.iter().find(|p| !pids.contains(p)) {
                return Err(format!("{kind} namespace {i} holds pid {p}, which is not in the image"));
            }
            if let Some(p) = ns.pids.iter().find(|p| self.namespaces[..i].iter().any(|earlier| earlier.pids.contains(p))) {
                return Err(format!("{kind} namespace {i} holds pid {p}, which an earlier one holds too"));
            }
            state(&ns.state).map_err(|e| format!("{kind} namespace {i}: {e}"))?;
        }
        Ok(())
    }
}

/// The job's user namespaces as the checkpoint found them: the record, and each one's identity
/// in the record's order (for the namespaces of other kinds to name the one they belong to).
pub struct UserNamespaces<'a> {
    pub record: &'a super::user_namespaces::UsersRecord,
    pub ids: &'a [crate::nshelper::NamespaceId],
}

/// The user namespace namespace `g` of `kind` belongs to, when it is not its maker's own but
/// one on the maker's way down (see [`MadeNamespace::owner`]); refuses one elsewhere.
fn owner_of(kind: StatefulKind, g: &Grouped, users: &UserNamespaces) -> Result<Option<u32>> {
    use crate::nshelper::{related_namespace, Relation};
    let maker = g.pids[0];
    let owner = related_namespace(&format!("/proc/{}/ns/{}", g.reader, kind.link), Relation::Owner)?;
    let Some(owner) = users.ids.iter().position(|id| *id == owner) else {
        return Err(Error::Unsupported { pid: maker, what: format!("its {} namespace belongs to a user namespace outside the job", kind.name) });
    };
    let own = users.record.namespace_of(maker);
    if owner == own {
        return Ok(None);
    }
    if owner == 0 || users.record.chain(own).contains(&owner) {
        return Ok(Some(owner as u32));
    }
    Err(Error::Unsupported {
        pid: maker,
        what: format!(
            "its {} namespace belongs to a user namespace its own was not made in (unshare --{}, then --user elsewhere): the restart makes it on the way to its own",
            kind.name, kind.link
        ),
    })
}
