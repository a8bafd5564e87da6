//! Creating the process tree: every process with its pid, under its own parent, in its session
//! and process group, before any of them is rebuilt. Processes are created as empty copies of the
//! job's init; children are forked from their (still empty) parents, so they start as empty
//! copies too, inheriting the restorer's scratch page.
//!
//! A process adopted into a session not its parent's (a daemon that forked, called setsid and
//! forked again, the middle process gone), and a process group whose leader exited (a shell
//! pipeline whose first command ended), are made again by stand-ins and helpers: processes the
//! image does not hold, with the pids the session or group is named after, which end once every
//! process is in its group ([`plan`] decides who makes what). A stand-in forked from a process
//! of the job has no exit signal and is reaped by an injected wait4, so the program gets no
//! SIGCHLD and finds no child it did not have. What cannot be made again is refused at the
//! checkpoint already ([`check`] is called there too).

use std::collections::{BTreeMap, HashMap, HashSet};

use ckpt_core::error::Stage;
use ckpt_core::objects::memory;
use ckpt_core::objects::mounts::MountsRecord;
use ckpt_core::objects::process::ZombieRecord;
use ckpt_core::objects::thread;
use ckpt_core::objects::user_namespaces::{self, Numbering, UsersRecord};
use ckpt_core::objects::ProcessRecord;
use ckpt_core::procfs::{self, MMapPath};
use ckpt_core::ptrace::inject::find_syscall_insn;
use ckpt_core::ptrace::remote_mem::ProcMem;
use ckpt_core::ptrace::{sys, Injector, RemoteTask, StopKind, Tid};
use ckpt_core::snapshot::NodeImage;
use ckpt_core::{Error, Result};

use crate::tracees::Tracees;
use crate::Spawner;

mod pid_setter;
mod plan;

pub use pid_setter::PidSetter;
use plan::{Links, Maker, Plan};

/// The restorer's area in every task: a page with a `syscall` instruction, then room for the
/// injected calls' arguments (the task's scratch area, as `RemoteTask` sees it).
pub const SCRATCH_LEN: u64 = 64 * 1024;
const INSN_PAGE: u64 = 4096;
/// Where the search for free room starts (above the usual program layout).
pub const SEARCH_FROM: u64 = 0x1000_0000;

/// The options every task of the restored tree is traced with.
pub(crate) const SEIZE_OPTIONS: libc::c_long = sys::PTRACE_O_TRACESYSGOOD | sys::PTRACE_O_TRACECLONE | sys::PTRACE_O_TRACEFORK | sys::PTRACE_O_EXITKILL;

fn links(processes: &[ProcessRecord], zombies: &[ZombieRecord]) -> Vec<Links> {
    let live = processes.iter().map(|p| Links { pid: p.pid, ppid: p.ppid, pgid: p.pgid, sid: p.sid, subreaper: p.attrs.child_subreaper, alive: true });
    let dead = zombies.iter().map(|z| Links { pid: z.pid, ppid: z.ppid, pgid: z.pgid, sid: z.sid, subreaper: false, alive: false });
    live.chain(dead).collect()
}

/// Checks that the tree can be made again (see [`plan`]). Pure: decides from the records alone.
pub fn check(processes: &[ProcessRecord], zombies: &[ZombieRecord]) -> Result<()> {
    plan::plan(&links(processes, zombies)).map(drop)
}

/// The processes the restart makes that the image does not hold (see [`plan`]): stand-ins and
/// helpers, each with its pid in the job and the maker that reaps it.
struct Intermediaries {
    sessions: BTreeMap<Tid, RemoteTask>,
    helpers: BTreeMap<Tid, (Tid, RemoteTask)>,
    groups: Vec<(Tid, Maker, RemoteTask)>,
    /// Pids in use or planned, from which helpers' pids are kept apart.
    taken: HashSet<Tid>,
}

/// Everything needed to make a process from a maker.
struct Making<'a> {
    spawner: &'a mut dyn Spawner,
    tracees: &'a mut Tracees,
    scratch: Option<u64>,
    image_ranges: Vec<(u64, u64)>,
}

impl Making<'_> {
    /// Makes process `ns_pid`: spawned by the init (`from` None) or forked from `from`, with
    /// `exit_signal` (0: its maker gets no signal when it ends, and reaps it by an injected call).
    fn make(&mut self, from: Option<&mut RemoteTask>, ns_pid: Tid, exit_signal: u64) -> Result<RemoteTask> {
        match from {
            None => {
                let host = self.spawner.spawn(ns_pid)?;
                sys::seize(host, SEIZE_OPTIONS)?;
                sys::interrupt(host)?;
                self.tracees.add(host, host);
                wait_event_stop(host)?;
                prepare_root(host, &mut self.scratch, &self.image_ranges)
            }
            Some(parent) => {
                let host = fork_child(parent, ns_pid, exit_signal, self.tracees)?;
                prepare_child(host, self.scratch.ok_or_else(|| Error::Forged { what: format!("pid {ns_pid} is made before any process of the init") })?)
            }
        }
    }
}

/// The task of a maker, or None for the init; Err(pid) when it is not made yet (`pid` is
/// what it waits for).
fn maker_task<'t>(
    maker: Maker,
    tasks: &'t mut BTreeMap<Tid, RemoteTask>,
    made: &'t mut Intermediaries,
) -> std::result::Result<Option<&'t mut RemoteTask>, Tid> {
    match maker {
        Maker::Init => Ok(None),
        Maker::Process(pid) => tasks.get_mut(&pid).map(Some).ok_or(pid),
        Maker::SessionStandIn(sid) => made.sessions.get_mut(&sid).map(Some).ok_or(sid),
        Maker::HelperOf(sid) => made.helpers.get_mut(&sid).map(|(_, t)| Some(t)).ok_or(sid),
    }
}

/// The process of each namespace of a kind that made it (pid in the job, host pid), once made:
/// the init for the job's own (index 0).
type NsMakers = Vec<Option<(Tid, Tid)>>;

/// Every process of the image, made and stopped.
pub struct Created {
    /// By pid in the job, each ready to be rebuilt.
    pub tasks: BTreeMap<Tid, RemoteTask>,
    /// What gives threads their ids in user namespaces the job made, if some process there has
    /// several; to be ended once every process is rebuilt.
    pub pid_setter: Option<PidSetter>,
}

/// Creates every process of the image, stopped, each ready to be rebuilt (scratch page mapped,
/// inherited rseq and robust list dropped, signals blocked). Zombies are created and made to
/// exit with their status.
pub fn create(image: &NodeImage, spawner: &mut dyn Spawner, tracees: &mut Tracees) -> Result<Created> {
    let tree_links = links(&image.processes, &image.zombies);
    let plan = plan::plan(&tree_links)?;
    let mut tasks: BTreeMap<Tid, RemoteTask> = BTreeMap::new();
    let image_ranges = image.processes.iter().flat_map(|p| p.vmas.iter().map(|v| (v.start, v.end))).collect();
    let mut making = Making { spawner, tracees, scratch: None, image_ranges };
    let taken = tree_links.iter().flat_map(|l| [l.pid, l.pgid, l.sid]).collect();
    let mut made = Intermediaries { sessions: BTreeMap::new(), helpers: BTreeMap::new(), groups: Vec::new(), taken };
    // The job's own mounts first: every process is created in the init's namespace, and a
    // namespace the job made is a copy of it.
    let (mounts, users) = (&image.mounts, &image.users);
    let init_host = making.spawner.init_pid();
    if let Some(own) = mounts.namespaces.first() {
        ckpt_core::objects::mounts::apply(init_host, &own.changes, Numbering::Machine)?;
    }
    let made_by_init = |count: usize| -> NsMakers {
        let mut makers = vec![None; count.max(1)];
        makers[0] = Some((1, init_host));
        makers
    };
    let (mut user_makers, mut mount_makers) = (made_by_init(users.namespaces.len()), made_by_init(mounts.namespaces.len()));
    let (mut uts_makers, mut ipc_makers) = (made_by_init(image.uts.namespaces.len()), made_by_init(image.ipc.namespaces.len()));
    let mut net_makers = made_by_init(image.net.namespaces.len());

    // The image puts parents first, but a process's maker may be another (a session's leader,
    // or the subreaper that makes its stand-in) that comes after it: passes go on while any
    // process can be made.
    let mut waiting: Vec<&ProcessRecord> = image.processes.iter().collect();
    while !waiting.is_empty() {
        let before = waiting.len();
        let mut later = Vec::new();
        for rec in waiting {
            let maker = plan.makers.get(&rec.pid).copied().ok_or_else(|| out_of_order(rec.pid, rec.ppid))?;
            if !make_intermediary(maker, &plan, &mut tasks, &mut made, &mut making)? {
                later.push(rec);
                continue;
            }
            let Ok(from) = maker_task(maker, &mut tasks, &mut made) else {
                later.push(rec);
                continue;
            };
            let task = making.make(from, rec.pid, libc::SIGCHLD as u64)?;
            if tasks.insert(rec.pid, task).is_some() {
                return Err(Error::Forged { what: format!("pid {} appears twice in the image", rec.pid) });
            }
            let task = tasks.get_mut(&rec.pid).ok_or_else(|| out_of_order(rec.pid, rec.ppid))?;
            if rec.sid == rec.pid {
                task.syscall("setsid", libc::SYS_setsid, &[])?;
            }
            // Before its stand-ins and helpers end, which give it the processes it adopted.
            if rec.attrs.child_subreaper {
                task.syscall("prctl(PR_SET_CHILD_SUBREAPER)", libc::SYS_prctl, &[libc::PR_SET_CHILD_SUBREAPER as u64, 1])?;
            }
        }
        if later.len() == before {
            // Validation (ckpt_core::validate) puts parents first; an image that got here
            // otherwise is refused, not trusted.
            return Err(out_of_order(later[0].pid, later[0].ppid));
        }
        waiting = later;
    }

    // Stand-ins of the groups whose leader exited, each the leader of its group, in its session.
    for (&pgid, &maker) in &plan.group_stand_ins {
        if !make_intermediary(maker, &plan, &mut tasks, &mut made, &mut making)? {
            return Err(out_of_order(pgid, pgid));
        }
        let from = maker_task(maker, &mut tasks, &mut made).map_err(|pid| out_of_order(pgid, pid))?;
        let signal = if from.is_some() { 0 } else { libc::SIGCHLD as u64 };
        let mut task = making.make(from, pgid, signal)?;
        task.syscall("setpgid", libc::SYS_setpgid, &[0, 0]).map_err(|e| Error::Other(format!("make process group {pgid} again (its leader exited): {e}")))?;
        made.groups.push((pgid, maker, task));
    }

    let mut zombies: Vec<(ZombieRecord, RemoteTask)> = Vec::new();
    for z in &image.zombies {
        let parent = tasks.get_mut(&z.ppid).ok_or_else(|| Error::Other(format!("zombie {} has no live parent", z.pid)))?;
        let mut task = making.make(Some(parent), z.pid, libc::SIGCHLD as u64)?;
        if z.sid == z.pid {
            task.syscall("setsid", libc::SYS_setsid, &[])?;
        }
        zombies.push((*z, task));
    }

    // Groups: leaders first, then members (a group must exist before anyone joins it).
    let links_of: HashMap<Tid, Links> = tree_links.iter().map(|l| (l.pid, *l)).collect();
    let mut all: Vec<(Links, &mut RemoteTask)> = Vec::new();
    let link = |pid: &Tid| links_of.get(pid).copied().ok_or_else(|| Error::Other(format!("pid {pid} has no place in the tree")));
    for (pid, task) in tasks.iter_mut() {
        all.push((link(pid)?, task));
    }
    for (z, task) in zombies.iter_mut() {
        all.push((link(&z.pid)?, task));
    }
    all.sort_by_key(|(l, _)| l.pgid != l.pid);
    for (l, task) in all.iter_mut() {
        if l.pgid == l.sid && l.sid == l.pid {
            continue; // setsid made it the leader of its group already
        }
        let target = if l.pgid == l.pid { 0 } else { l.pgid as u64 };
        let current = procfs::status(task.pid)?.nspgid.and_then(|v| v.last().copied());
        if current != Some(l.pgid) {
            task.syscall("setpgid", libc::SYS_setpgid, &[0, target]).map_err(|e| Error::from(e).of_object(l.pid, format!("join process group {}", l.pgid)))?;
        }
    }
    drop(all);

    for (z, task) in zombies {
        end_as(z, task, making.tracees)?;
    }
    // Every process is in its group: what the image does not hold goes, reaped by its maker
    // (the init reaps its own), groups' stand-ins first (some are sessions' stand-ins'
    // children), and the processes it made are given to the subreaper above it or the init,
    // as they were.
    for (pgid, maker, task) in std::mem::take(&mut made.groups) {
        end_and_reap(pgid, task, maker, &mut tasks, &mut made, making.tracees)?;
    }
    for (sid, (pid, task)) in std::mem::take(&mut made.helpers) {
        end_and_reap(pid, task, Maker::Process(sid), &mut tasks, &mut made, making.tracees)?;
    }
    for (sid, task) in std::mem::take(&mut made.sessions) {
        let maker = plan.session_stand_ins.get(&sid).copied().unwrap_or(Maker::Init);
        end_and_reap(sid, task, maker, &mut tasks, &mut made, making.tracees)?;
    }
    // While every process is in the init's namespaces, with its rights over the job's PID
    // namespace: the helper that gives threads their ids in user namespaces the job made.
    let threads_in_nested = image.processes.iter().any(|p| p.threads.len() > 1 && !matches!(users.numbering_of(p.pid), Numbering::Machine));
    let pid_setter = match (threads_in_nested, image.processes.first()) {
        (true, Some(first)) => {
            made.taken.extend(image.processes.iter().flat_map(|p| p.threads.iter().map(|t| t.tid)));
            let scratch = making.scratch.ok_or_else(|| Error::Bug("no process made to fork a helper from".into()))?;
            let parent = tasks.get_mut(&first.pid).ok_or_else(|| out_of_order(first.pid, first.ppid))?;
            Some(PidSetter::fork(parent, first.pid, &mut made.taken, scratch, making.tracees)?)
        }
        _ => None,
    };
    // Every process is made, in the init's namespaces: now each goes to its own, parents
    // first (a namespace is made from its maker's parent's). Not before: a process in a user
    // namespace the job made has no capability over the job's PID namespace, and so could
    // not give a child its pid. Its user namespace first: a mount namespace belongs to the
    // user namespace it is made in.
    for rec in &image.processes {
        let task = tasks.get_mut(&rec.pid).ok_or_else(|| out_of_order(rec.pid, rec.ppid))?;
        let (uts, ipc, net) = (image.uts.namespace_of(rec.pid), image.ipc.namespace_of(rec.pid), image.net.namespace_of(rec.pid));
        let set_names = |task: &mut RemoteTask| ckpt_core::objects::uts::set_names(task, &image.uts.namespaces[uts].state, 0);
        // Its System V objects are created in it once every process is in its namespaces.
        let nothing = |_: &mut RemoteTask| Ok(());
        // Its loopback is up before any of its sockets binds an address there.
        let set_loopback = |task: &mut RemoteTask| ckpt_core::objects::net_namespaces::set_loopback(task, &image.net.namespaces[net].state, 0);
        // Its maker makes it where it belongs (`owner`, if above its own user namespace); any
        // other process whose own user namespace is not the one it belongs to joins it before
        // its way down, while it has the capability over it.
        let own = users.namespace_of(rec.pid);
        let owner = |pids: &[Tid], owner: Option<u32>| -> Option<usize> {
            let belongs_to = owner.map_or_else(|| pids.first().map_or(own, |&maker| users.namespace_of(maker)), |o| o as usize);
            match pids.first() {
                Some(&maker) if maker == rec.pid => owner.map(|o| o as usize),
                _ => Some(belongs_to).filter(|&b| b != own),
            }
        };
        let of = |ns: Option<(&[Tid], Option<u32>)>| ns.and_then(|(pids, o)| owner(pids, o));
        let mut flat = [
            Flat {
                flag: libc::CLONE_NEWUTS,
                kind: "UTS",
                want: uts,
                owner: of(image.uts.namespaces.get(uts).map(|n| (&n.pids[..], n.owner))),
                makers: &mut uts_makers,
                set_up: &set_names,
                maker: image.uts.namespaces.get(uts).is_some_and(|n| n.pids.first() == Some(&rec.pid)),
            },
            Flat {
                flag: libc::CLONE_NEWIPC,
                kind: "IPC",
                want: ipc,
                owner: of(image.ipc.namespaces.get(ipc).map(|n| (&n.pids[..], n.owner))),
                makers: &mut ipc_makers,
                set_up: &nothing,
                maker: image.ipc.namespaces.get(ipc).is_some_and(|n| n.pids.first() == Some(&rec.pid)),
            },
            Flat {
                flag: libc::CLONE_NEWNET,
                kind: "network",
                want: net,
                owner: of(image.net.namespaces.get(net).map(|n| (&n.pids[..], n.owner))),
                makers: &mut net_makers,
                set_up: &set_loopback,
                maker: image.net.namespaces.get(net).is_some_and(|n| n.pids.first() == Some(&rec.pid)),
            },
        ];
        enter_user_and_mount_namespaces(task, rec.pid, (mounts, users), (&mut user_makers, &mut mount_makers), &mut flat)?;
        // Those of its own user namespace: joined or made now that it is there.
        for f in flat.iter_mut().filter(|f| f.owner.is_none()) {
            enter_namespace(task, rec.pid, (f.flag, f.kind), f.want, |_| 0, f.makers, |task, _| (f.set_up)(task))
                .map_err(|e| Error::Restore { stage: Stage::Namespace { pid: rec.pid, kind: f.kind }, inner: Box::new(e) })?;
        }
    }
    check_parents(image, &plan, &tasks, making.spawner.init_pid())?;
    Ok(Created { tasks, pid_setter })
}

/// Makes the stand-in or helper that `maker` names, if it is one and not made yet. Ok(false)
/// when what makes it is not made yet itself.
fn make_intermediary(maker: Maker, plan: &Plan, tasks: &mut BTreeMap<Tid, RemoteTask>, made: &mut Intermediaries, making: &mut Making) -> Result<bool> {
    match maker {
        Maker::SessionStandIn(sid) if !made.sessions.contains_key(&sid) => {
            let by = plan.session_stand_ins.get(&sid).copied().unwrap_or(Maker::Init);
            let Ok(from) = maker_task(by, tasks, made) else { return Ok(false) };
            let signal = if from.is_some() { 0 } else { libc::SIGCHLD as u64 };
            let mut task = making.make(from, sid, signal)?;
            task.syscall("setsid", libc::SYS_setsid, &[]).map_err(|e| Error::Other(format!("make session {sid} again (its leader exited): {e}")))?;
            made.sessions.insert(sid, task);
        }
        Maker::HelperOf(sid) if !made.helpers.contains_key(&sid) => {
            let Some(leader) = tasks.get_mut(&sid) else { return Ok(false) };
            let scratch = making.scratch.ok_or_else(|| out_of_order(sid, 1))?;
            let helper = fork_helper(leader, &mut made.taken, scratch, making.tracees)?;
            made.helpers.insert(sid, helper);
        }
        _ => {}
    }
    Ok(true)
}

/// Ends a stand-in or helper, and has its maker reap it (the init reaps its own).
fn end_and_reap(
    pid: Tid,
    task: RemoteTask,
    maker: Maker,
    tasks: &mut BTreeMap<Tid, RemoteTask>,
    made: &mut Intermediaries,
    tracees: &mut Tracees,
) -> Result<()> {
    end_as(ZombieRecord { pid, ppid: 0, pgid: 0, sid: 0, wait_status: 0 }, task, tracees)?;
    match maker_task(maker, tasks, made) {
        Ok(None) => Ok(()),
        Ok(Some(reaper)) => reaper
            .syscall("wait4", libc::SYS_wait4, &[pid as u64, 0, libc::__WALL as u64, 0])
            .map(drop)
            .map_err(|e| Error::Other(format!("reap stand-in {pid} from its maker: {e}"))),
        Err(gone) => Err(Error::Other(format!("stand-in {pid}: its maker {gone} ended first"))),
    }
}

/// Checks that every process a stand-in or helper made has the parent it had, those gone: the
/// kernel gave it to the subreaper above them, or the init, as the plan says it did. (The
/// others were forked by their parent.)
fn check_parents(image: &NodeImage, plan: &Plan, tasks: &BTreeMap<Tid, RemoteTask>, init_host: Tid) -> Result<()> {
    let adopted = |rec: &&ProcessRecord| matches!(plan.makers.get(&rec.pid), Some(Maker::SessionStandIn(_) | Maker::HelperOf(_)));
    for rec in image.processes.iter().filter(adopted) {
        let task = tasks.get(&rec.pid).ok_or_else(|| out_of_order(rec.pid, rec.ppid))?;
        let want = if plan::parent_is_init(rec.ppid) { Some(init_host) } else { tasks.get(&rec.ppid).map(|t| t.pid) };
        let got = procfs::status(task.pid)?.ppid;
        if want != Some(got) {
            return Err(Error::Other(format!("pid {}: made again under host pid {got}, not under its parent {} (host {want:?})", rec.pid, rec.ppid)));
        }
    }
    Ok(())
}

/// Forks, from a process of the image, a helper: one that makes the members of the session
/// that process leads which the init or a subreaper adopted (see [`plan`]), or the
/// [`PidSetter`]. It has a pid no process of the image has (`taken` grows by it) and no exit
/// signal, so the process, which reaps it, gets no SIGCHLD the program did not have. Returns
/// its pid in the job and its task.
fn fork_helper(leader: &mut RemoteTask, taken: &mut HashSet<Tid>, scratch: u64, tracees: &mut Tracees) -> Result<(Tid, RemoteTask)> {
    let mut candidate: Tid = 2;
    loop {
        while taken.contains(&candidate) {
            candidate += 1;
        }
        taken.insert(candidate);
        match clone_with_pid(leader, candidate, 0) {
            Ok(()) => return Ok((candidate, prepare_child(new_child(leader, candidate, tracees)?, scratch)?)),
            // Taken by a process outside the image (one of the restorer's own): the next.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::Other(format!("make a helper from host pid {}: {e}", leader.pid))),
        }
    }
}

/// Puts process `pid` (its task made in the init's namespaces) in namespace `want` of the kind
/// `flag` names: it joins it if one of its processes made it already, or else makes it: joins
/// the one it was made from (unless that is the init's), unshares, and `set_up` does the rest,
/// given the host pid of a process in the namespace it was made from. `made_from` says which
/// that is for each namespace.
fn enter_namespace(
    task: &mut RemoteTask,
    pid: Tid,
    (flag, kind): (libc::c_int, &str),
    want: usize,
    made_from: impl Fn(usize) -> usize,
    makers: &mut NsMakers,
    set_up: impl FnOnce(&mut RemoteTask, Tid) -> Result<()>,
) -> Result<()> {
    if want == 0 {
        return Ok(());
    }
    if let Some((maker, _)) = makers[want] {
        return join_namespace_of(task, maker, (flag, kind));
    }
    let from = made_from(want);
    let (of, of_host) = makers[from].ok_or_else(|| Error::Forged { what: format!("{kind} namespace {from} is not made yet") })?;
    if from != 0 {
        join_namespace_of(task, of, (flag, kind))?;
    }
    task.syscall("unshare", libc::SYS_unshare, &[flag as u64])?;
    set_up(task, of_host)?;
    makers[want] = Some((pid, task.pid));
    Ok(())
}

/// Puts process `pid` in its user namespace and its mount namespace. The user namespaces from
/// the job's down to its own are entered in turn: the deepest one made already is joined, the
/// ones below it made (their maps written, see [`ckpt_core::objects::user_namespaces`]). Its
/// mount namespace belongs to one of them (`owner`, else its maker's own), and the task can act
/// on it only from there or above: what needs the job's rights comes first (joining a mount
/// namespace that belongs above its own, or the one a new mount namespace is copied from), a
/// new one is made when the way down reaches the user namespace it belongs to, and one that
/// belongs to the process's own user namespace is joined at the end.
/// Namespaces of the other kinds in `flat` that belong to a user namespace above the process's
/// own are joined first if made already, else made where the way down reaches that one.
fn enter_user_and_mount_namespaces(
    task: &mut RemoteTask,
    pid: Tid,
    (mounts, users): (&MountsRecord, &UsersRecord),
    (user_makers, mount_makers): (&mut NsMakers, &mut NsMakers),
    flat: &mut [Flat],
) -> Result<()> {
    let in_context = |kind: &'static str| move |e: Error| Error::Restore { stage: Stage::Namespace { pid, kind }, inner: Box::new(e) };
    let own = users.namespace_of(pid);
    let chain = users.chain(own);
    let want_mount = mounts.namespace_of(pid);
    let made_mount = mount_makers.get(want_mount).copied().flatten();
    // The user namespace the mount namespace belongs to (none for the job's own).
    let owner = mounts.namespaces.get(want_mount).filter(|_| want_mount != 0).map(|m| match m.owner {
        Some(o) => o as usize,
        None => m.pids.first().map_or(own, |&maker| users.namespace_of(maker)),
    });
    match (owner, made_mount) {
        (Some(o), Some((maker, _))) if o != own => join_namespace_of(task, maker, (libc::CLONE_NEWNS, "mount")).map_err(in_context("mount"))?,
        (Some(_), None) => {
            let from = mounts.namespaces[want_mount].made_from as usize;
            if from != 0 {
                let (of, _) = mount_makers
                    .get(from)
                    .copied()
                    .flatten()
                    .ok_or_else(|| in_context("mount")(Error::Forged { what: format!("mount namespace {from} is not made yet") }))?;
                join_namespace_of(task, of, (libc::CLONE_NEWNS, "mount")).map_err(in_context("mount"))?;
            }
        }
        _ => {}
    }
    // Those of other kinds that belong to another user namespace than its own, made already:
    // joined from here, above them.
    for f in flat.iter_mut().filter(|f| f.owner.is_some() && f.want != 0) {
        if let Some((maker, _)) = f.makers.get(f.want).copied().flatten() {
            join_namespace_of(task, maker, (f.flag, f.kind)).map_err(in_context(f.kind))?;
            f.owner = None;
            f.want = 0;
        } else if !f.maker {
            return Err(in_context(f.kind)(Error::Forged { what: "it is not made yet by the first of its processes".into() }));
        }
    }
    let mut at: Option<usize> = None;
    // The mount namespace is made where the way down reaches the user namespace it belongs to,
    // and so are the others that belong above.
    let make_here = |task: &mut RemoteTask, level: usize, mount_makers: &mut NsMakers, flat: &mut [Flat]| -> Result<()> {
        if owner == Some(level) && mount_makers.get(want_mount).copied().flatten().is_none() {
            make_mount_namespace(task, pid, want_mount, mounts, users.numbering(level), mount_makers).map_err(in_context("mount"))?;
        }
        for f in flat.iter_mut().filter(|f| f.owner == Some(level) && f.want != 0) {
            task.syscall("unshare", libc::SYS_unshare, &[f.flag as u64]).map_err(|e| in_context(f.kind)(e.into()))?;
            (f.set_up)(task).map_err(in_context(f.kind))?;
            f.makers[f.want] = Some((pid, task.pid));
            f.owner = None;
            f.want = 0;
        }
        Ok(())
    };
    make_here(task, 0, mount_makers, flat)?;
    let mut targets: Vec<usize> = match owner.and_then(|o| chain.iter().position(|&ns| ns == o)) {
        Some(j) if made_mount.is_none() => vec![j],
        _ => Vec::new(),
    };
    targets.extend(flat.iter().filter(|f| f.want != 0).filter_map(|f| f.owner.and_then(|o| chain.iter().position(|&ns| ns == o))));
    targets.extend(chain.len().checked_sub(1));
    targets.sort_unstable();
    targets.dedup();
    for target in targets {
        // The deepest made already down to the target is joined; the ones below it are made.
        if let Some(k) = chain[..=target].iter().rposition(|&ns| user_makers.get(ns).copied().flatten().is_some()).filter(|&k| at.is_none_or(|a| k > a)) {
            let (maker, _) = user_makers[chain[k]].expect("made");
            join_namespace_of(task, maker, (libc::CLONE_NEWUSER, "user")).map_err(in_context("user"))?;
            at = Some(k);
            make_here(task, chain[k], mount_makers, flat)?;
        }
        for &ns in &chain[at.map_or(0, |a| a + 1)..=target] {
            let parent = users.namespaces[ns].made_from as usize;
            let (_, in_parent) = user_makers
                .get(parent)
                .copied()
                .flatten()
                .ok_or_else(|| in_context("user")(Error::Forged { what: format!("user namespace {parent} is not made yet") }))?;
            task.syscall("unshare", libc::SYS_unshare, &[libc::CLONE_NEWUSER as u64]).map_err(|e| in_context("user")(e.into()))?;
            user_namespaces::write_maps(task.pid, &users.namespaces[ns], in_parent, users.numbering(parent)).map_err(in_context("user"))?;
            user_makers[ns] = Some((pid, task.pid));
            at = chain.iter().position(|&c| c == ns);
            make_here(task, ns, mount_makers, flat)?;
        }
    }
    // A mount namespace of its own user namespace, made by an earlier process: joined from there.
    if let (Some(o), Some((maker, _))) = (owner, made_mount) {
        if o == own {
            join_namespace_of(task, maker, (libc::CLONE_NEWNS, "mount")).map_err(in_context("mount"))?;
        }
    }
    if let Some(f) = flat.iter().find(|f| f.owner.is_some() && f.want != 0) {
        return Err(in_context(f.kind)(Error::Forged {
            what: format!("it belongs to user namespace {}, not on the way to the process's own", f.owner.unwrap_or(0)),
        }));
    }
    Ok(())
}

/// Makes mount namespace `index` from process `pid`, in the user namespace it belongs to: a copy
/// of the one the task is in (the namespace it was made from, joined before), with its changes
/// replayed.
fn make_mount_namespace(task: &mut RemoteTask, pid: Tid, index: usize, mounts: &MountsRecord, numbering: Numbering, makers: &mut NsMakers) -> Result<()> {
    task.syscall("unshare", libc::SYS_unshare, &[libc::CLONE_NEWNS as u64])?;
    ckpt_core::objects::mounts::apply(task.pid, &mounts.namespaces[index].changes, numbering)?;
    makers[index] = Some((pid, task.pid));
    Ok(())
}

/// A namespace of a kind that holds state but no tree (UTS, IPC, network: a copy of the job's,
/// made by its first process) that a process is in, with what its maker does once it made it
/// (`set_up`: a UTS namespace's names, a network namespace's loopback). One that belongs to a
/// user namespace above its maker's own (`owner`) is made on the maker's way down, and joined
/// by the others before theirs ([`enter_user_and_mount_namespaces`]); the others once each
/// process is in its own user namespace ([`enter_namespace`]).
struct Flat<'a> {
    flag: libc::c_int,
    kind: &'static str,
    want: usize,
    owner: Option<usize>,
    makers: &'a mut NsMakers,
    set_up: &'a dyn Fn(&mut RemoteTask) -> Result<()>,
    /// The process is its maker (the first of its processes).
    maker: bool,
}

/// Moves `task` into the namespace (of the kind `flag` names) of process `pid` of the job
/// (setns through a pidfd, Linux 5.8).
fn join_namespace_of(task: &mut RemoteTask, pid: Tid, (flag, kind): (libc::c_int, &str)) -> Result<()> {
    let pidfd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[pid as u64, 0])?;
    let joined = task.syscall("setns", libc::SYS_setns, &[pidfd, flag as u64]);
    task.syscall("close", libc::SYS_close, &[pidfd])?;
    joined.map(drop).map_err(|e| Error::Other(format!("join the {kind} namespace of pid {pid}: {e}")))
}

/// A process whose parent was not created before it: the image's order is wrong.
fn out_of_order(pid: Tid, ppid: Tid) -> Error {
    Error::Forged { what: format!("pid {pid}: its parent {ppid} comes after it in the image") }
}

fn wait_event_stop(tid: Tid) -> Result<()> {
    loop {
        match sys::wait(tid)? {
            StopKind::EventStop(_) => return Ok(()),
            StopKind::Exited(_) | StopKind::Killed(_) => return Err(Error::Other(format!("task {tid} died before it could be restored"))),
            _ => sys::resume(tid, 0)?,
        }
    }
}

/// An empty process made by the job's init: find a `syscall` instruction in its vdso, map the
/// scratch page (at the same address in every process), drop its inherited registrations.
fn prepare_root(host: Tid, scratch: &mut Option<u64>, image_ranges: &[(u64, u64)]) -> Result<RemoteTask> {
    sys::set_sigmask(host, !0)?;
    let maps = procfs::maps(host)?;
    let vdso = maps.iter().find(|m| matches!(m.pathname, MMapPath::Vdso)).ok_or_else(|| Error::Other("the empty process has no vdso".into()))?;
    let mut code = vec![0u8; (vdso.address.1 - vdso.address.0) as usize];
    ProcMem::open(host)?.read_exact(vdso.address.0, &mut code)?;
    let insn = find_syscall_insn(&code, vdso.address.0).ok_or_else(|| Error::Other("no syscall instruction in the vdso".into()))?;
    let mut task = RemoteTask::new(host, Injector::new(host, insn)?)?;
    thread::forget_inherited(host, &mut task.main)?;

    let addr = match *scratch {
        Some(a) => a,
        None => {
            let mut occupied: Vec<(u64, u64)> = maps.iter().map(|m| m.address).collect();
            occupied.extend_from_slice(image_ranges);
            let a = memory::find_gap(&occupied, SCRATCH_LEN, SEARCH_FROM)
                .ok_or_else(|| Error::Other("no free room in the address space for the restorer".into()))?;
            *scratch = Some(a);
            a
        }
    };
    task.syscall(
        "mmap",
        libc::SYS_mmap,
        &[
            addr,
            SCRATCH_LEN,
            (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
            u64::MAX,
            0,
        ],
    )?;
    task.mem.write_all(addr, &[0x0f, 0x05])?;
    task.main.set_syscall_insn(addr);
    task.set_scratch(addr + INSN_PAGE, (SCRATCH_LEN - INSN_PAGE) as usize);
    Ok(task)
}

/// A process forked from an empty parent: it has the parent's scratch page already.
fn prepare_child(host: Tid, scratch: u64) -> Result<RemoteTask> {
    wait_event_stop(host)?;
    sys::set_sigmask(host, !0)?;
    let mut task = RemoteTask::new(host, Injector::new(host, scratch)?)?;
    thread::forget_inherited(host, &mut task.main)?;
    task.set_scratch(scratch + INSN_PAGE, (SCRATCH_LEN - INSN_PAGE) as usize);
    Ok(task)
}

/// The whole restorer's area of a task: (start, length), to unmap at the end.
pub fn restorer_area(task: &RemoteTask) -> (u64, u64) {
    (task.scratch().0 - INSN_PAGE, SCRATCH_LEN)
}

/// Forks a child with exactly `ns_pid` from inside `parent`; returns its host pid.
/// `exit_signal` is what its parent gets when it ends (SIGCHLD, or 0 for none).
fn fork_child(parent: &mut RemoteTask, ns_pid: Tid, exit_signal: u64, tracees: &mut Tracees) -> Result<Tid> {
    clone_with_pid(parent, ns_pid, exit_signal).map_err(|e| Error::Other(format!("create pid {ns_pid}: {e} (is the pid taken?)")))?;
    new_child(parent, ns_pid, tracees)
}

/// The clone3 of [`fork_child`], its error as the kernel gave it (EEXIST: the pid is taken).
fn clone_with_pid(parent: &mut RemoteTask, ns_pid: Tid, exit_signal: u64) -> std::io::Result<()> {
    let set_tid_at = 256;
    let args = clone_args(0, exit_signal, Some(parent.scratch_at(set_tid_at)));
    parent.put(set_tid_at, &ns_pid.to_le_bytes())?;
    let args_addr = parent.put(0, &args)?;
    parent.syscall("clone3", libc::SYS_clone3, &[args_addr, args.len() as u64]).map(drop)
}

/// The child a clone in `parent` just made, now traced too; returns its host pid.
fn new_child(parent: &mut RemoteTask, ns_pid: Tid, tracees: &mut Tracees) -> Result<Tid> {
    let new = parent.main.take_new_tasks();
    let &[host] = new.as_slice() else {
        return Err(Error::Other(format!("creating pid {ns_pid} reported {} new tasks", new.len())));
    };
    tracees.add(host, host);
    Ok(host)
}

/// struct clone_args, with one pid in set_tid at `set_tid_addr`, or none (the kernel's next).
pub fn clone_args(flags: u64, exit_signal: u64, set_tid_addr: Option<u64>) -> Vec<u8> {
    let (set_tid, set_tid_size) = set_tid_addr.map_or((0, 0), |a| (a, 1));
    // flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
    // set_tid_size, cgroup
    [flags, 0, 0, 0, exit_signal, 0, 0, 0, set_tid, set_tid_size, 0].iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Makes a created process end the way the zombie did, so its parent finds the same status.
fn end_as(z: ZombieRecord, mut task: RemoteTask, tracees: &mut Tracees) -> Result<()> {
    let host = task.pid;
    let status = z.wait_status;
    let (exited, code_or_sig) = (libc::WIFEXITED(status), if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { libc::WTERMSIG(status) });
    if exited {
        // exit_group never returns: the injection ends with the task's exit, collected by it.
        let _ = task.syscall("exit_group", libc::SYS_exit_group, &[code_or_sig as u64]);
    } else {
        let sig = code_or_sig;
        if sig == libc::SIGKILL {
            // Sent from here: its action cannot be set (EINVAL), and it ends the process at
            // once, inside no call of its own.
            sys::tkill(host, libc::SIGKILL)?;
        } else {
            // Its default action, which ends the process.
            let dfl = [0u8; 32];
            let act = task.put(0, &dfl)?;
            task.syscall("rt_sigaction", libc::SYS_rt_sigaction, &[sig as u64, act, 0, 8])?;
            sys::set_sigmask(host, 0)?;
            task.syscall("tgkill", libc::SYS_tgkill, &[z.pid as u64, z.pid as u64, sig as u64])?;
            sys::resume(host, 0)?;
        }
        loop {
            match sys::wait(host)? {
                StopKind::Signal(s) => sys::resume(host, s)?,
                StopKind::Exited(_) | StopKind::Killed(_) => break,
                _ => sys::resume(host, 0)?,
            }
        }
    }
    tracees.remove(host);
    Ok(())
}
