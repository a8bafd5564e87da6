//! Creating the process tree: every process with its pid, under its own parent, in its session
//! and process group, before any of them is rebuilt. Processes are created as empty copies of the
//! job's init; children are forked from their (still empty) parents, so they start as empty
//! copies too, inheriting the restorer's scratch page.
//!
//! A session whose leader has exited (a daemon that forked, called setsid and forked again, the
//! middle process gone: the daemon's session and group are named after a pid no process has)
//! is made again by a stand-in: an empty process with the leader's pid, made a session leader,
//! from which the session's members whose parent is the job's init are forked; once every
//! process is in its group, the stand-in exits, and its children are the init's again, as they
//! were.
//!
//! A process group whose leader has exited (a shell pipeline whose first command ended: the
//! group is named after it) is made again the same way: a stand-in with the leader's pid makes
//! the group, its members join it, and the stand-in exits. The stand-in must be in the group's
//! session, so this is done where the job's init or a session's stand-in can make it: in the
//! init's session (1) and in sessions whose leader exited. Elsewhere such a group is refused,
//! at the checkpoint already ([`check`] is called there too).

use std::collections::{BTreeMap, HashMap};

use ckpt_core::objects::memory;
use ckpt_core::objects::mounts::MountsRecord;
use ckpt_core::objects::process::ZombieRecord;
use ckpt_core::objects::ProcessRecord;
use ckpt_core::objects::thread;
use ckpt_core::procfs::{self, MMapPath};
use ckpt_core::ptrace::inject::find_syscall_insn;
use ckpt_core::ptrace::remote_mem::ProcMem;
use ckpt_core::ptrace::{sys, Injector, RemoteTask, StopKind, Tid};
use ckpt_core::snapshot::NodeImage;
use ckpt_core::{Error, Result};

use crate::tracees::Tracees;
use crate::Spawner;

/// The restorer's area in every task: a page with a `syscall` instruction, then room for the
/// injected calls' arguments (the task's scratch area, as `RemoteTask` sees it).
pub const SCRATCH_LEN: u64 = 64 * 1024;
const INSN_PAGE: u64 = 4096;
/// Where the search for free room starts (above the usual program layout).
pub const SEARCH_FROM: u64 = 0x1000_0000;

const SEIZE_OPTIONS: libc::c_long =
    sys::PTRACE_O_TRACESYSGOOD | sys::PTRACE_O_TRACECLONE | sys::PTRACE_O_TRACEFORK | sys::PTRACE_O_EXITKILL;

/// A process's place in the tree, whether it is alive or a zombie.
#[derive(Debug, Clone, Copy)]
struct Links {
    pid: Tid,
    ppid: Tid,
    pgid: Tid,
    sid: Tid,
}

fn links(processes: &[ProcessRecord], zombies: &[ZombieRecord]) -> Vec<Links> {
    let live = processes.iter().map(|p| Links { pid: p.pid, ppid: p.ppid, pgid: p.pgid, sid: p.sid });
    let dead = zombies.iter().map(|z| Links { pid: z.pid, ppid: z.ppid, pgid: z.pgid, sid: z.sid });
    live.chain(dead).collect()
}

/// Whether a parent is the job's init (not in the image): pid 1, or 0 when it was not visible.
fn parent_is_init(ppid: Tid) -> bool {
    ppid <= 1
}

/// The sessions whose leader is not in the image (it exited), by their id: each is made again
/// by a stand-in (see the module). Pure.
fn orphan_sessions(all: &[Links]) -> std::collections::BTreeSet<Tid> {
    let pids: std::collections::HashSet<Tid> = all.iter().map(|l| l.pid).collect();
    all.iter().map(|l| l.sid).filter(|&s| s > 1 && !pids.contains(&s)).collect()
}

/// The process groups whose leader is not in the image, that a stand-in can make again (see the
/// module): pgid → its session. Pure.
fn orphan_groups(all: &[Links]) -> BTreeMap<Tid, Tid> {
    let pids: std::collections::HashSet<Tid> = all.iter().map(|l| l.pid).collect();
    let sessions = orphan_sessions(all);
    all.iter()
        .filter(|l| l.pgid > 1 && l.pgid != l.sid && !pids.contains(&l.pgid))
        .filter(|l| l.sid == 1 || sessions.contains(&l.sid))
        .map(|l| (l.pgid, l.sid))
        .collect()
}

/// Checks that the tree can be recreated: every parent is in the image (or is the job's init),
/// every process's session is its own or its parent's, or one whose leader exited, entered
/// from the job's init (see the module), every process group has its leader, is such a
/// session's own, or is one a stand-in can make again in its session. Pure: decides from the
/// records alone.
pub fn check(processes: &[ProcessRecord], zombies: &[ZombieRecord]) -> Result<()> {
    let all = links(processes, zombies);
    let by_pid: HashMap<Tid, Links> = all.iter().map(|l| (l.pid, *l)).collect();
    let live: std::collections::HashSet<Tid> = processes.iter().map(|p| p.pid).collect();
    let orphans = orphan_sessions(&all);
    let groups = orphan_groups(&all);
    let unsupported = |pid: Tid, what: String| Error::Unsupported { pid, what };
    for l in &all {
        let parent_sid = if parent_is_init(l.ppid) && orphans.contains(&l.sid) {
            // Forked from the stand-in of its session, whose leader exited.
            l.sid
        } else if parent_is_init(l.ppid) {
            1
        } else if let Some(parent) = by_pid.get(&l.ppid).filter(|_| live.contains(&l.ppid)) {
            parent.sid
        } else {
            return Err(unsupported(l.pid, format!("a process whose parent {} is not in the image", l.ppid)));
        };
        if l.sid != l.pid && l.sid != parent_sid {
            return Err(unsupported(l.pid, format!("session {} (its parent's session changed after the fork)", l.sid)));
        }
        let leader_ok = (l.pgid == 1 && l.sid == 1)
            || by_pid.get(&l.pgid).is_some_and(|g| g.sid == l.sid)
            || (l.pgid == l.sid && orphans.contains(&l.sid))
            || groups.get(&l.pgid) == Some(&l.sid);
        if !leader_ok {
            return Err(unsupported(
                l.pid,
                format!("process group {} whose leader is gone, in session {} whose leader is alive (only groups of the job's first session, or of a session whose leader is gone too, are made again)", l.pgid, l.sid),
            ));
        }
    }
    Ok(())
}

/// Creates every process of the image, stopped, and returns them by pid in the job, each ready
/// to be rebuilt (scratch page mapped, inherited rseq and robust list dropped, signals blocked).
/// Zombies are created and made to exit with their status.
pub fn create(image: &NodeImage, spawner: &mut dyn Spawner, tracees: &mut Tracees) -> Result<BTreeMap<Tid, RemoteTask>> {
    let mut tasks: BTreeMap<Tid, RemoteTask> = BTreeMap::new();
    let mut scratch: Option<u64> = None;
    let image_ranges: Vec<(u64, u64)> = image.processes.iter().flat_map(|p| p.vmas.iter().map(|v| (v.start, v.end))).collect();
    // The job's own mounts first: every process is created in the init's namespace, and a
    // namespace the job made is a copy of it.
    let mounts = &image.mounts;
    if let Some(own) = mounts.namespaces.first() {
        ckpt_core::objects::mounts::apply(spawner.init_pid(), &own.changes)?;
    }
    // Each mount namespace's first process once it is made (the job's own: the init, pid 1).
    let mut makers: Vec<Option<Tid>> = vec![None; mounts.namespaces.len().max(1)];
    makers[0] = Some(1);

    // Stand-ins for the sessions whose leader exited, each the leader of its session and group.
    let mut stand_ins: BTreeMap<Tid, RemoteTask> = BTreeMap::new();
    let tree_links = links(&image.processes, &image.zombies);
    for sid in orphan_sessions(&tree_links) {
        let host = spawner.spawn(sid)?;
        sys::seize(host, SEIZE_OPTIONS)?;
        sys::interrupt(host)?;
        tracees.add(host, host);
        wait_event_stop(host)?;
        let mut task = prepare_root(host, &mut scratch, &image_ranges)?;
        task.syscall("setsid", libc::SYS_setsid, &[]).map_err(|e| Error::Other(format!("make session {sid} again (its leader exited): {e}")))?;
        stand_ins.insert(sid, task);
    }
    // Stand-ins for the groups whose leader exited, each the leader of its group, in its
    // session: forked from the session's stand-in, or a child of the job's init in its session.
    let mut group_stand_ins: Vec<(Tid, Tid, RemoteTask)> = Vec::new();
    for (pgid, sid) in orphan_groups(&tree_links) {
        let mut task = match stand_ins.get_mut(&sid) {
            Some(session) => {
                let host = fork_child(session, pgid, tracees)?;
                prepare_child(host, scratch.ok_or_else(|| out_of_order(pgid, sid))?)?
            }
            None => {
                let host = spawner.spawn(pgid)?;
                sys::seize(host, SEIZE_OPTIONS)?;
                sys::interrupt(host)?;
                tracees.add(host, host);
                wait_event_stop(host)?;
                prepare_root(host, &mut scratch, &image_ranges)?
            }
        };
        task.syscall("setpgid", libc::SYS_setpgid, &[0, 0]).map_err(|e| Error::Other(format!("make process group {pgid} again (its leader exited): {e}")))?;
        group_stand_ins.push((pgid, sid, task));
    }

    for rec in &image.processes {
        // Created by the init or a stand-in, in the job's namespace; forked, in its parent's.
        let born_in = if parent_is_init(rec.ppid) { 0 } else { mounts.namespace_of(rec.ppid) };
        let task = if let (true, Some(stand_in)) = (parent_is_init(rec.ppid), stand_ins.get_mut(&rec.sid)) {
            // In a session whose leader exited: forked from its stand-in, whose end gives it
            // back to the job's init.
            let host = fork_child(stand_in, rec.pid, tracees)?;
            prepare_child(host, scratch.ok_or_else(|| out_of_order(rec.pid, rec.ppid))?)?
        } else if parent_is_init(rec.ppid) {
            let host = spawner.spawn(rec.pid)?;
            sys::seize(host, SEIZE_OPTIONS)?;
            sys::interrupt(host)?;
            tracees.add(host, host);
            wait_event_stop(host)?;
            prepare_root(host, &mut scratch, &image_ranges)?
        } else {
            // Validation (ckpt_core::validate) puts parents first; an image that got here
            // otherwise is refused, not trusted.
            let parent = tasks.get_mut(&rec.ppid).ok_or_else(|| out_of_order(rec.pid, rec.ppid))?;
            let host = fork_child(parent, rec.pid, tracees)?;
            prepare_child(host, scratch.ok_or_else(|| out_of_order(rec.pid, rec.ppid))?)?
        };
        let task = match tasks.entry(rec.pid) {
            std::collections::btree_map::Entry::Vacant(v) => v.insert(task),
            std::collections::btree_map::Entry::Occupied(_) => {
                return Err(Error::Other(format!("pid {} appears twice in the image (image damaged or forged?)", rec.pid)))
            }
        };
        if rec.sid == rec.pid {
            task.syscall("setsid", libc::SYS_setsid, &[])?;
        }
        // Before it forks any child: they are born in its namespace.
        enter_mount_namespace(task, rec.pid, born_in, mounts, &mut makers)
            .map_err(|e| Error::Other(format!("pid {}: its mount namespace: {e}", rec.pid)))?;
    }

    let mut zombies: Vec<(ZombieRecord, RemoteTask)> = Vec::new();
    for z in &image.zombies {
        let parent = tasks.get_mut(&z.ppid).ok_or_else(|| Error::Other(format!("zombie {} has no live parent", z.pid)))?;
        let host = fork_child(parent, z.pid, tracees)?;
        let mut task = prepare_child(host, scratch.ok_or_else(|| out_of_order(z.pid, z.ppid))?)?;
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
            task.syscall("setpgid", libc::SYS_setpgid, &[0, target])
                .map_err(|e| Error::Other(format!("pid {}: join process group {}: {e}", l.pid, l.pgid)))?;
        }
    }
    drop(all);

    for (z, task) in zombies {
        end_as(z, task, tracees)?;
    }
    // Every process is in its group: the stand-ins go (the job's init reaps them, or, for a
    // group's, its session's stand-in first), and their children are the init's.
    for (pgid, sid, task) in group_stand_ins {
        end_as(ZombieRecord { pid: pgid, ppid: if stand_ins.contains_key(&sid) { sid } else { 1 }, pgid, sid, wait_status: 0 }, task, tracees)?;
    }
    for (sid, task) in stand_ins {
        end_as(ZombieRecord { pid: sid, ppid: 1, pgid: sid, sid, wait_status: 0 }, task, tracees)?;
    }
    Ok(tasks)
}

/// Puts process `pid` (its task just created, in namespace `born_in`) in its mount namespace:
/// it joins the namespace if one of its processes made it already, or else makes it (a copy of
/// the one it was made from, which it joins first if it was born elsewhere) and the job's
/// changes are replayed in it (see [`ckpt_core::objects::mounts`]).
fn enter_mount_namespace(task: &mut RemoteTask, pid: Tid, born_in: usize, mounts: &MountsRecord, makers: &mut [Option<Tid>]) -> Result<()> {
    let want = mounts.namespace_of(pid);
    if want == born_in {
        return Ok(());
    }
    if let Some(maker) = makers[want] {
        return join_mount_namespace_of(task, maker);
    }
    let ns = &mounts.namespaces[want];
    let from = ns.made_from as usize;
    if from != born_in {
        let of = makers[from].ok_or_else(|| Error::Other(format!("mount namespace {from} is not made yet (image damaged or forged?)")))?;
        join_mount_namespace_of(task, of)?;
    }
    task.syscall("unshare(CLONE_NEWNS)", libc::SYS_unshare, &[libc::CLONE_NEWNS as u64])?;
    ckpt_core::objects::mounts::apply(task.pid, &ns.changes)?;
    makers[want] = Some(pid);
    Ok(())
}

/// Moves `task` into the mount namespace of process `pid` of the job (setns through a pidfd,
/// Linux 5.8).
fn join_mount_namespace_of(task: &mut RemoteTask, pid: Tid) -> Result<()> {
    let pidfd = task.syscall("pidfd_open", libc::SYS_pidfd_open, &[pid as u64, 0])?;
    let joined = task.syscall("setns(CLONE_NEWNS)", libc::SYS_setns, &[pidfd, libc::CLONE_NEWNS as u64]);
    task.syscall("close", libc::SYS_close, &[pidfd])?;
    joined.map(drop).map_err(|e| Error::Other(format!("join the mount namespace of pid {pid}: {e}")))
}

/// A process whose parent was not created before it: the image's order is wrong.
fn out_of_order(pid: Tid, ppid: Tid) -> Error {
    Error::Other(format!("pid {pid}: its parent {ppid} comes after it in the image (image damaged or forged?)"))
}

fn wait_event_stop(tid: Tid) -> Result<()> {
    loop {
        match sys::wait(tid)? {
            StopKind::EventStop => return Ok(()),
            StopKind::Exited(_) | StopKind::Killed(_) => {
                return Err(Error::Other(format!("task {tid} died before it could be restored")))
            }
            _ => sys::resume(tid, 0)?,
        }
    }
}

/// An empty process made by the job's init: find a `syscall` instruction in its vdso, map the
/// scratch page (at the same address in every process), drop its inherited registrations.
fn prepare_root(host: Tid, scratch: &mut Option<u64>, image_ranges: &[(u64, u64)]) -> Result<RemoteTask> {
    sys::set_sigmask(host, !0)?;
    let maps = procfs::maps(host)?;
    let vdso = maps
        .iter()
        .find(|m| matches!(m.pathname, MMapPath::Vdso))
        .ok_or_else(|| Error::Other("the empty process has no vdso".into()))?;
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
fn fork_child(parent: &mut RemoteTask, ns_pid: Tid, tracees: &mut Tracees) -> Result<Tid> {
    let set_tid_at = 256;
    let args = clone_args(0, libc::SIGCHLD as u64, parent.scratch_at(set_tid_at));
    parent.put(set_tid_at, &ns_pid.to_le_bytes())?;
    let args_addr = parent.put(0, &args)?;
    parent
        .syscall("clone3", libc::SYS_clone3, &[args_addr, args.len() as u64])
        .map_err(|e| Error::Other(format!("create pid {ns_pid}: {e} (is the pid taken?)")))?;
    let new = parent.main.take_new_tasks();
    let &[host] = new.as_slice() else {
        return Err(Error::Other(format!("creating pid {ns_pid} reported {} new tasks", new.len())));
    };
    tracees.add(host, host);
    Ok(host)
}

/// struct clone_args, with one pid in set_tid.
pub fn clone_args(flags: u64, exit_signal: u64, set_tid_addr: u64) -> Vec<u8> {
    // flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
    // set_tid_size, cgroup
    [flags, 0, 0, 0, exit_signal, 0, 0, 0, set_tid_addr, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect()
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
        let dfl = [0u8; 32];
        let act = task.put(0, &dfl)?;
        task.syscall("rt_sigaction", libc::SYS_rt_sigaction, &[sig as u64, act, 0, 8])?;
        sys::set_sigmask(host, 0)?;
        task.syscall("tgkill", libc::SYS_tgkill, &[z.pid as u64, z.pid as u64, sig as u64])?;
        sys::resume(host, 0)?;
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
