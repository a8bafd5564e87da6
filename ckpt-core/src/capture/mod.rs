//! Freezing a process tree and capturing it: the orchestration of the object modules for
//! checkpoint steps 1 (freeze), 3 (capture) and 4 (resume) of docs/PROTOCOL.md.
//!
//! A [`FrozenTree`] owns every seized thread. Dropping it releases them, so an error anywhere in a
//! checkpoint leaves the job running, never frozen.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::error::{Context, Error, Result};
use crate::objects::net_namespaces::JobNetworks;
use crate::objects::signals::PendingSignal;
use crate::objects::{
    deleted, descriptor, fd, file, memattrs, memory, namespaces, posix_timer, process, seccomp, signals, tcp, tcp_reconnect, thread, timens, ProcessRecord,
};
use crate::pool::Batch;
use crate::procfs;
use crate::ptrace::inject::find_syscall_insn;
use crate::ptrace::regs::{self, Regs};
use crate::ptrace::{batch, sys, Injector, RemoteTask, StopKind, Tid, Tracers};

pub mod ahead;
pub mod increments;
pub mod later;
mod shared;

/// A seized, stopped thread.
struct FrozenThread {
    tid: Tid,
    /// Its blocked-signal mask before the capture blocked everything; `None` until then (a
    /// freeze that fails before lets it go with its mask untouched).
    sigmask: Option<u64>,
    /// A signal that was being delivered when it stopped; handed back when it is released.
    held: Option<(i32, PendingSignal)>,
}

struct FrozenProcess {
    pid: Tid,
    /// The tracer thread that seized its threads, the only one that may drive them
    /// ([`Tracers`]).
    tracer: usize,
    threads: Vec<FrozenThread>,
    /// The signal that stopped it (a group stop: SIGSTOP, or a terminal's SIGTSTP, SIGTTIN,
    /// SIGTTOU), if it was stopped when it was seized: recorded as that signal pending, which a
    /// restart delivers at the release, so that the process stops again, by the same signal.
    /// Told by the signal its threads' event stops report, not by /proc's state letter: a
    /// stopped process that an earlier checkpoint let go runs in the kernel on its way back to
    /// its group stop (state R, none of its own code), for longer than a moment on a loaded
    /// machine, and a checkpoint then must still find it stopped.
    stopped_by: Option<i32>,
    /// Its threads' seccomp sandboxes, read at the freeze and suspended until the release.
    seccomp: Option<seccomp::SeccompRecord>,
    /// Its threads are readied for injection and its sandbox read ([`ready_for_injection`]).
    readied: bool,
    /// Its mappings, read once while it is frozen ([`FrozenProcess::layout`]).
    layout: OnceLock<Vec<procfs::MemoryMap>>,
    /// Its vdso, found once while it is frozen.
    vdso: OnceLock<Vdso>,
    /// Its /proc status, read once while it is frozen ([`FrozenProcess::status`]).
    status: OnceLock<procfs::Status>,
    /// Its start time, and the page faults of its children that ended and were waited for
    /// (`cminflt + cmajflt`), as the freeze's last round read them: a child that ended since
    /// the shared memory was copied may have written it (`capture::shared`).
    seen: Option<(u64, u64)>,
    /// Its shared mappings whose object another process, captured before it, stores from a
    /// copy made before the freeze (and within its own window): what pages the object holds is
    /// not asked here (mincore of a 4 GiB mapping this process never touched took 120 ms).
    probe_skip: Vec<u64>,
}

/// Where a process's vdso is, and the `syscall` instruction in it that injected calls use.
#[derive(Clone, Copy)]
struct Vdso {
    range: (u64, u64),
    syscall_insn: u64,
}

impl FrozenProcess {
    fn new(pid: Tid, tracer: usize) -> FrozenProcess {
        FrozenProcess {
            pid,
            tracer,
            threads: Vec::new(),
            stopped_by: None,
            seccomp: None,
            readied: false,
            layout: OnceLock::new(),
            vdso: OnceLock::new(),
            status: OnceLock::new(),
            seen: None,
            probe_skip: Vec::new(),
        }
    }

    /// Its mappings, as the kernel listed them at the first call. Frozen, a process maps
    /// nothing by itself, and what the checkpoint maps in it (the scratch area, the runner) is
    /// unmapped before the step that mapped it ends, which leaves the list as it was; so the
    /// first call must come while none of those is mapped (each such step asks for the vdso,
    /// and with it the list, before it maps anything). What else changes the list (the write
    /// tracking's registration, which may merge neighbouring mappings) is the caller's to know.
    fn layout(&self) -> Result<&[procfs::MemoryMap]> {
        if let Some(maps) = self.layout.get() {
            return Ok(maps);
        }
        let maps = procfs::maps(self.pid)?;
        Ok(self.layout.get_or_init(|| maps))
    }

    /// Its status as read at the first call, once it was readied: each read renders every
    /// field (about 0.1 ms a process here), and what the capture takes from it (its ids in its
    /// namespaces, parent, group and session, descriptor table size, signals caught and
    /// ignored, credentials, umask, sandbox mode, resident memory) does not change while it
    /// is held, except what the capture itself does to it: the locked memory while the
    /// scratch area is mapped, and the signal mask, which no reader takes from here.
    fn status(&self) -> Result<&procfs::Status> {
        if let Some(status) = self.status.get() {
            return Ok(status);
        }
        let status = procfs::status(self.pid)?;
        Ok(self.status.get_or_init(|| status))
    }

    fn vdso(&self) -> Result<Vdso> {
        if let Some(vdso) = self.vdso.get() {
            return Ok(*vdso);
        }
        let vdso = vdso_of(self.pid, self.layout()?)?;
        Ok(*self.vdso.get_or_init(|| vdso))
    }
}

/// Every thread of every process below a root, seized and stopped; and the zombies among them,
/// which cannot be seized and are recorded as they are.
pub struct FrozenTree {
    procs: Vec<FrozenProcess>,
    zombies: Vec<Tid>,
    released: bool,
    /// TCP send queues read right after the freeze (jobs spread over nodes).
    early_sends: tcp::EarlySends,
    /// Without TCP repair mode: connections between nodes being drained (jobs spread over nodes).
    cross_node: tcp_reconnect::CrossNode,
    /// The job's clocks when the last thread stopped, and again when every process was
    /// captured (see [`FrozenTree::capture`]).
    clocks: timens::ClocksRecord,
    /// The process the tree was frozen from (its children's time namespace is the job's).
    root: Tid,
    /// Processes whose private memory is copied after the release (`capture` with
    /// `copy_later`). Dropped after the tree is released: their copies are reaped by a job
    /// that runs.
    later: later::AfterRelease,
    /// The flags of each process's mappings, read before the freeze (by pid).
    flags_ahead: HashMap<Tid, memattrs::FlagsAhead>,
    /// Those the capture used, to check after the release.
    flags_used: Vec<(Tid, memattrs::FlagsAhead)>,
    /// When the first thread was seized: the job's frozen time counts from here.
    frozen_at: Instant,
    /// The checkpoint's last try: states that pass by themselves and can be lost are taken.
    last_try: bool,
    /// The network namespaces the job's processes are in, found once per freeze
    /// ([`FrozenTree::networks`]).
    networks: Option<Arc<JobNetworks>>,
    /// Processes (host pids) the GPU step left alone although they map an NVIDIA device
    /// ([`FrozenTree::gpu_left_alone`]).
    gpu_left_alone: std::collections::HashSet<Tid>,
    /// The cgroups the job made, read beside the freeze's last readying
    /// ([`FrozenTree::take_cgroups`]).
    cgroups: crate::objects::cgroups::CgroupsRecord,
    /// The job's connections to peers outside it, locked for a `--kill --tcp-established`
    /// ([`FrozenTree::lock_outside_connections`]): unlocked at the release, kept at the kill.
    network_lock: Option<tcp::NetworkLock>,
    /// The threads that trace the job, each its share of the processes
    /// ([`FrozenProcess::tracer`]). Last: dropped once every tracee is let go.
    tracers: Tracers,
}

/// The flags of mappings that the capture took from a read made before the freeze, checked
/// once the job runs again (see [`memattrs::FlagsAhead`]).
#[derive(Default)]
pub struct FlagsCheck(Vec<(Tid, memattrs::FlagsAhead)>);

impl FlagsCheck {
    /// Fails if a process changed the flags of a mapping whose flags the capture took from the
    /// read before the freeze: the checkpoint cannot tell whether the change came before or
    /// after the freeze.
    pub fn confirm(&self) -> Result<()> {
        for (pid, ahead) in &self.0 {
            // None: it ended since (a zombie reads as no mapping, so nothing changed either).
            let Some(changed) = ahead.changed_since(*pid)? else { continue };
            if let Some(addr) = changed.first() {
                return Err(Error::Passing {
                    pid: *pid,
                    what: format!("it changed the flags of its mapping at {addr:#x} (madvise or mlock) as the checkpoint froze it, and the checkpoint cannot tell whether it recorded them before or after"),
                });
            }
        }
        Ok(())
    }
}

const SCRATCH_LEN: u64 = 64 * 1024;

/// The processes below `root` (not `root` itself), parents before children.
pub fn descendants(root: Tid) -> Result<Vec<Tid>> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    while let Some(p) = queue.pop() {
        // A process may end between being listed and being read: it is simply not there.
        let children = match procfs::children(p) {
            Ok(c) => c,
            Err(_) if p != root => continue,
            Err(e) => return Err(e.into()),
        };
        for child in children {
            out.push(child);
            queue.push(child);
        }
    }
    Ok(out)
}

/// A process below the job's init as a round of the freeze finds it: its stat and its threads
/// (None: it ended as it was read).
struct Listed {
    pid: Tid,
    stat: Option<::procfs::process::Stat>,
    tids: Option<Vec<Tid>>,
}

/// The processes below `root`, parents before their children, each with its stat and threads,
/// for one round of the freeze. The threads of a process whose every thread is held already
/// (`held` gives them; its stat counts as many) are not listed again; the others' are listed
/// once, for both the children their threads forked and the seizing.
fn list_round(root: Tid, held: impl Fn(Tid) -> Vec<Tid>) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    let mut queue = procfs::children(root)?;
    queue.reverse();
    while let Some(pid) = queue.pop() {
        let stat = procfs::stat(pid).ok();
        let known = held(pid);
        let tids = match &stat {
            Some(s) if !known.is_empty() && s.num_threads == known.len() as i64 => Some(known),
            _ => procfs::tasks(pid).ok(),
        };
        // A process may end between being listed and being read: it is simply not there.
        if let Some(tids) = &tids {
            let mut kids = procfs::children_of_threads(pid, tids).unwrap_or_default();
            kids.reverse();
            queue.extend(kids);
        }
        out.push(Listed { pid, stat, tids });
    }
    Ok(out)
}

/// Seizes and stops every thread of every process below `root` (the job's init), repeating until
/// no new thread or process appears.
pub fn freeze(root: Tid) -> Result<FrozenTree> {
    freeze_with(root, true)
}

/// [`freeze`]; `read_flags`: read the mappings' flags first, for a capture.
fn freeze_with(root: Tid, read_flags: bool) -> Result<FrozenTree> {
    // A lazy restart's memory is all in first: a half-filled process cannot be copied.
    crate::lazy::wait_until_filled();
    // While the job runs: the flags of its mappings, which take a walk of every page to read
    // (a process that ends meanwhile, or cannot be read, has its flags read frozen).
    let flags_ahead = match read_flags {
        true => descendants(root)?.into_iter().filter_map(|pid| Some((pid, memattrs::FlagsAhead::read(pid).ok()?))).collect(),
        false => HashMap::new(),
    };
    // (Not sized by the job: that would list its processes once more before the freeze.)
    let tracers = Tracers::for_job()?;
    let mut tree = FrozenTree {
        tracers,
        procs: Vec::new(),
        zombies: Vec::new(),
        released: false,
        early_sends: Default::default(),
        cross_node: Default::default(),
        clocks: timens::ClocksRecord { monotonic_ns: 0, boottime_ns: 0 },
        root,
        later: Default::default(),
        flags_ahead,
        flags_used: Vec::new(),
        frozen_at: Instant::now(),
        last_try: false,
        networks: None,
        gpu_left_alone: Default::default(),
        cgroups: Default::default(),
        network_lock: None,
    };
    let mut by_pid: BTreeMap<Tid, usize> = BTreeMap::new();
    // Children of vfork seen so far, and when first: see `in_vfork`.
    let mut vfork_children: BTreeMap<Tid, Instant> = BTreeMap::new();
    // Processes whose main thread has exited while another thread ran on, and since when.
    let mut leaderless: BTreeMap<Tid, Instant> = BTreeMap::new();
    // Rounds of seizing until no thread is new; then every thread is readied for injection. A
    // process that dies meanwhile (a thread not yet stopped called exit_group, whose SIGKILL
    // wakes the threads already held) is collected, and the rounds go on to record it as the
    // zombie it becomes.
    let mut after_a_death = false;
    let mut next_tracer = 0;
    'freeze: loop {
        loop {
            let mut seized_now = Vec::new();
            let mut to_seize: Vec<(usize, Tid)> = Vec::new();
            // A task that ended as it was being seized: one more round, to find it as a zombie.
            let mut ended = false;
            let mut waiting_for_exec = false;
            let held = |pid: Tid| by_pid.get(&pid).map_or_else(Vec::new, |&idx| tree.procs[idx].threads.iter().map(|t| t.tid).collect());
            for Listed { pid, stat, tids } in list_round(root, held)? {
                if tree.zombies.contains(&pid) {
                    continue;
                }
                // /proc/PID/stat shows the main thread: 'Z' is a zombie process, or one whose main
                // thread exited before the others, either for good (pthread_exit in main) or as the
                // whole process goes (its other threads have not reached their exit yet).
                if stat.as_ref().is_some_and(|s| s.state == 'Z') {
                    if other_thread_runs(pid) {
                        let since = *leaderless.entry(pid).or_insert_with(Instant::now);
                        if since.elapsed() > LEADERLESS_PATIENCE {
                            return Err(main_thread_gone(pid));
                        }
                        waiting_for_exec = true;
                        continue;
                    }
                    // Threads of it held since an earlier round died with it (a thread seized later
                    // called exit_group): collected, so that its parent is told of its end.
                    if let Some(&idx) = by_pid.get(&pid) {
                        // (By its tracer: a stop reported before the end is resumed.)
                        let p = &mut tree.procs[idx];
                        tree.tracers.on(p.tracer, || collect_dead(pid, &mut p.threads));
                    }
                    tree.zombies.push(pid);
                    continue;
                }
                if !by_pid.contains_key(&pid) && stat.as_ref().is_some_and(|s| in_vfork(pid, s.ppid)) {
                    let since = *vfork_children.entry(pid).or_insert_with(Instant::now);
                    if since.elapsed() > VFORK_PATIENCE {
                        return Err(Error::Unsupported {
                            pid,
                            what: format!(
                                "a process sharing its parent's memory that has not called exec for {} s (clone with CLONE_VM and not CLONE_THREAD)",
                                VFORK_PATIENCE.as_secs()
                            ),
                        });
                    }
                    waiting_for_exec = true;
                    continue;
                }
                let idx = *by_pid.entry(pid).or_insert_with(|| {
                    // The processes dealt to the tracers in turn.
                    tree.procs.push(FrozenProcess::new(pid, next_tracer % tree.tracers.count()));
                    next_tracer += 1;
                    tree.procs.len() - 1
                });
                tree.procs[idx].seen = stat.as_ref().map(shared::seen_in);
                let Some(tids) = tids else {
                    continue; // exited meanwhile
                };
                to_seize.extend(tids.into_iter().filter(|&tid| !tree.procs[idx].threads.iter().any(|t| t.tid == tid)).map(|tid| (idx, tid)));
            }
            // Each thread seized and interrupted by its process's tracer, the tracers side by
            // side; every thread seized is recorded (the tree lets it go) before a failure is told.
            let seized = tree.tracers.map(
                &mut to_seize,
                |&(idx, _)| tree.procs[idx].tracer,
                |&mut (_, tid)| sys::seize(tid, sys::PTRACE_O_TRACESYSGOOD).map(|()| sys::interrupt(tid)),
            );
            let mut failed = None;
            for ((idx, tid), outcome) in to_seize.into_iter().zip(seized) {
                let pid = tree.procs[idx].pid;
                match outcome {
                    Ok(interrupted) => {
                        tree.procs[idx].threads.push(FrozenThread { tid, sigmask: None, held: None });
                        seized_now.push((idx, tid));
                        if let Err(e) = interrupted {
                            failed.get_or_insert(e.into());
                        }
                    }
                    // A task whose exit has gone that far cannot be traced (EPERM): it is not
                    // part of the checkpoint, but its process may now be a zombie to record.
                    Err(e) if task_alive(pid, tid) => {
                        failed.get_or_insert(Error::Other(format!(
                            "cannot trace pid {pid} thread {tid}: {e} (is it traced by a debugger, or owned by another user?)"
                        )));
                    }
                    Err(_) => ended = true,
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
            if seized_now.is_empty() && !ended {
                if !waiting_for_exec {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            // The main thread of a process that exits is reported only once its other threads
            // are collected (a traced thread's end waits for its tracer): theirs first, or the wait
            // for the main thread of a process exiting as it was seized would never end.
            seized_now.sort_by_key(|&(idx, tid)| tid == tree.procs[idx].pid);
            // (Each on its tracer: what a thread's stop held, its registers and signal, is read
            // by ptrace.)
            let stops = tree.tracers.map(&mut seized_now, |&(idx, _)| tree.procs[idx].tracer, |&mut (_, tid)| wait_for_stop(tid));
            for ((idx, tid), stop) in seized_now.into_iter().zip(stops) {
                match stop? {
                    Stopped::Held { held, group_stop } => {
                        let p = &mut tree.procs[idx];
                        p.stopped_by = p.stopped_by.or(group_stop);
                        let t = p.threads.iter_mut().find(|t| t.tid == tid).expect("seized thread is listed");
                        t.held = held;
                    }
                    // It was exiting: nothing of it to capture.
                    Stopped::Gone => tree.procs[idx].threads.retain(|t| t.tid != tid),
                }
            }
        }
        tree.procs.retain(|p| !p.threads.is_empty());
        by_pid = tree.procs.iter().enumerate().map(|(idx, p)| (p.pid, idx)).collect();
        // What the job may not hold is looked for beside the readying, on a CPU of its own:
        // both only read /proc, and each reads every process (about 14 ms at 256 processes).
        // The cgroups the job made are read there too.
        let pids = tree.pids();
        let tasks: Vec<(Tid, Vec<Tid>)> = tree.procs.iter().map(|p| (p.pid, p.threads.iter().map(|t| t.tid).collect())).collect();
        let check = || {
            namespaces::check(root, &pids)?;
            crate::objects::fanotify::refuse_permission_groups(&pids)?;
            crate::objects::cgroups::capture(root, &tasks)
        };
        let checked = std::thread::scope(|scope| {
            let checking = std::thread::Builder::new().name("freeze-checks".into()).spawn_scoped(scope, check);
            let readied = ready_all(&mut tree, after_a_death);
            let checked = match checking {
                Ok(thread) => thread.join().unwrap_or_else(|_| Err(Error::Bug("the freeze's checks panicked".into()))),
                Err(_) => check(),
            };
            readied.map(|died| (died, checked))
        });
        let (died, checked) = checked?;
        if !died {
            tree.cgroups = checked?;
            break 'freeze;
        }
        after_a_death = true;
    }
    // Now that every thread is stopped: no clock the job read before its stop is ahead of these.
    tree.clocks = timens::capture(root)?;
    debug!(processes = tree.procs.len(), ms = tree.frozen_at.elapsed().as_secs_f64() * 1e3, "tree frozen");
    Ok(tree)
}

/// Readies each process of the tree held after the rounds, on its tracer; true if one died
/// meanwhile (the rounds go on, to record it).
fn ready_all(tree: &mut FrozenTree, after_a_death: bool) -> Result<bool> {
    // Each process readied by its tracer. Ok(true): it died.
    let readied = tree.tracers.map(
        &mut tree.procs,
        |p| p.tracer,
        |p| {
            // After a death, a process readied before may be dying too (killed with its
            // parent by PR_SET_PDEATHSIG, or with its process group).
            if p.readied && after_a_death && process_dying(p.pid) {
                debug!(pid = p.pid, "a process readied for the capture died since; another round");
                collect_dead(p.pid, &mut p.threads);
                return Ok(true);
            }
            // Its status read here, side by side, not by the first step that asks for it
            // (the descriptors' listing, on one thread).
            match ready_for_injection(p).and_then(|()| p.status().map(drop)) {
                Ok(()) => Ok(false),
                Err(e) if !process_dying(p.pid) => Err(e),
                Err(e) => {
                    debug!(pid = p.pid, error = %e, "a process died as it was readied for the capture; another round");
                    collect_dead(p.pid, &mut p.threads);
                    Ok(true)
                }
            }
        },
    );
    let mut died = false;
    for outcome in readied {
        died |= outcome?;
    }
    Ok(died)
}

/// How long a process may show its main thread exited and another thread running before the
/// checkpoint refuses it: long enough for a process that is exiting to get all its threads there.
const LEADERLESS_PATIENCE: Duration = Duration::from_secs(2);

fn main_thread_gone(pid: Tid) -> Error {
    Error::Unsupported {
        pid,
        what: "a process whose main thread has exited while its other threads run on (pthread_exit in main; a restart cannot make such a process again)".into(),
    }
}

/// A task on its way out (`flags` of /proc/PID/stat).
const PF_EXITING: u32 = 0x4;

/// Whether a thread of process `pid` other than its main thread still runs: neither a zombie
/// nor dead, nor on its way out (PF_EXITING).
fn other_thread_runs(pid: Tid) -> bool {
    let runs = |tid: Tid| procfs::stat(tid).is_ok_and(|s| !matches!(s.state, 'Z' | 'X' | 'x') && s.flags & PF_EXITING == 0);
    procfs::tasks(pid).is_ok_and(|tids| tids.into_iter().any(|tid| tid != pid && runs(tid)))
}

/// Collects the held threads of process `pid`, which has died: each traced thread's end is
/// reported to its tracer first, and until it is collected the process's parent is not told
/// of it. Other threads first: the main thread's end is reported after theirs.
fn collect_dead(pid: Tid, threads: &mut Vec<FrozenThread>) {
    for t in main_thread_last(pid, threads) {
        collect_end(t.tid);
    }
    threads.clear();
}

/// The threads of process `pid`, its main thread last: the order in which a tracer collects
/// the ends of a process's threads (a main thread's end is reported after the others').
fn main_thread_last(pid: Tid, threads: &[FrozenThread]) -> impl Iterator<Item = &FrozenThread> {
    threads.iter().filter(move |t| t.tid != pid).chain(threads.iter().filter(move |t| t.tid == pid))
}

/// Waits a while for the end of a traced thread that has died, and takes it: until then the
/// thread stays a zombie of its tracer's, and its process's parent cannot collect the process.
/// A process's main thread's end is reported after its other threads' (collect them first).
pub fn collect_end(tid: Tid) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match sys::try_wait(tid) {
            Ok(Some(StopKind::Exited(_) | StopKind::Killed(_))) | Err(_) => return,
            // Stops reported before its end (a signal, an interrupt): let it go on to it.
            Ok(Some(_)) => drop(sys::resume(tid, 0)),
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    warn!(tid, "a thread of the job that died while held was not seen to end");
}

/// Readies every thread of a process held after the rounds for injected calls, and reads and
/// suspends its sandbox. Done once per process: a second pass (after another process died)
/// leaves a readied one as it is, whose saved mask would otherwise be the blocked one.
fn ready_for_injection(p: &mut FrozenProcess) -> Result<()> {
    if p.readied {
        return Ok(());
    }
    for t in p.threads.iter_mut().filter(|t| t.sigmask.is_none()) {
        hold_for_injection(t)?;
    }
    // Before anything is injected: a sandbox would answer the checkpoint's calls.
    let tids: Vec<Tid> = p.threads.iter().map(|t| t.tid).collect();
    p.seccomp = seccomp::suspend_and_capture(p.pid, &tids, sys::PTRACE_O_TRACESYSGOOD)?;
    p.readied = true;
    Ok(())
}

/// Whether process `pid` is on its way out: gone, a thread of it a zombie, dead or exiting
/// (PF_EXITING), or SIGKILL pending for a thread of it (exit_group puts it in each thread's
/// own pending set, SigPnd, before the thread runs to do_exit and sets PF_EXITING; a kill from
/// outside in the shared one, ShdPnd). Any thread id of it serves as `pid`.
pub fn process_dying(pid: Tid) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    // Gone is what /proc says by ENOENT (or ESRCH, as a task is being reaped); any other
    // failure to read is no evidence of an end.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH);
    // (A task gone is told by its status file below.)
    let exiting = |tid: Tid| procfs::stat(tid).is_ok_and(|s| matches!(s.state, 'Z' | 'X' | 'x') || s.flags & PF_EXITING != 0);
    let killed = |tid: Tid| match std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
        Ok(status) => {
            let pending = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
            (pending("SigPnd:").unwrap_or(0) | pending("ShdPnd:").unwrap_or(0)) & SIGKILL_BIT != 0
        }
        Err(e) => gone(&e),
    };
    match procfs::tasks(pid) {
        Ok(tids) => tids.into_iter().any(|tid| exiting(tid) || killed(tid)),
        Err(e) => gone(&e),
    }
}

/// Readies a thread in its interrupt stop for injected calls: a call the stop itself ended with
/// EINTR is made again when the thread resumes (here or in a restarted process; with a signal
/// caught on its way, the EINTR is that signal's and stays); its signal mask is kept in `t` and
/// every signal blocked, so that none is delivered while system calls are injected (what
/// arrives stays pending, and is captured as pending).
fn hold_for_injection(t: &mut FrozenThread) -> Result<()> {
    if t.held.is_none() {
        let mut regs = Regs::read(t.tid)?;
        if regs.cut_short_by_the_stop() {
            debug!(tid = t.tid, call = regs.orig_rax, "a call the freeze cut short with EINTR is made again");
            regs.restart_after_the_stop();
            regs.write(t.tid)?;
        } else if regs.resuming_a_call() {
            // A sleep or timed wait an earlier stop (a checkpoint before this one) cut short: the
            // call is named, so that a restart makes it again instead of failing it with EINTR.
            let mut site = [0u8; regs::CALL_SITE_LEN];
            let read = crate::ptrace::remote_mem::ProcMem::open(t.tid).and_then(|m| m.read_exact(regs.rip.wrapping_sub(site.len() as u64), &mut site));
            match read.ok().and_then(|()| regs::restartable_call_at(&site)) {
                Some(nr) => {
                    debug!(tid = t.tid, call = nr, "a call resumed from its restart block is named");
                    regs.resuming(nr);
                    regs.write(t.tid)?;
                }
                None => debug!(tid = t.tid, "a call resumed from its restart block is not known: a restart ends it with EINTR"),
            }
        }
    }
    t.sigmask = Some(sys::get_sigmask(t.tid)?);
    sys::set_sigmask(t.tid, !0)?;
    Ok(())
}

/// Lets a held thread go: its signal mask back, and the signal it was stopped with, if any.
fn let_go(t: &FrozenThread) -> std::io::Result<()> {
    // A mask it did not take (the freeze failed before) is left as it is.
    t.sigmask.map_or(Ok(()), |mask| sys::set_sigmask(t.tid, mask)).and_then(|_| sys::detach(t.tid, t.held.as_ref().map_or(0, |h| h.0)))
}

/// How long a child of vfork may take to exec or exit before the checkpoint gives up on it.
const VFORK_PATIENCE: Duration = Duration::from_secs(10);

/// Whether `pid` is a child of vfork that has not yet exec'd: it shares its parent's memory, and
/// its parent waits in the kernel, where no ptrace interrupt reaches it, until the child execs or
/// exits. Held stopped, such a child would keep its parent from ever stopping, and the freeze from
/// ever ending; so it is left to run to its exec (a moment: posix_spawn, a shell's or make's
/// vfork) and seized in a later round, as the new program.
fn in_vfork(pid: Tid, ppid: Tid) -> bool {
    sys::hold_together(pid, ppid, sys::Together::Memory)
}

/// Refuses a process that holds its descriptor table, or its working directory, root and umask,
/// together with its parent (a clone with CLONE_FILES or CLONE_FS and without CLONE_THREAD): a
/// restart would give each its own, and what one opened or closed, or where it went, the other
/// would no longer see. `ppid`: the parent's host pid, when the parent is the job's.
fn refuse_held_together(pid: Tid, ppid: Option<Tid>) -> Result<()> {
    let Some(ppid) = ppid else { return Ok(()) };
    for (what, held) in [
        (sys::Together::DescriptorTable, "its descriptor table (clone with CLONE_FILES)"),
        (sys::Together::FsInfo, "its working directory, root and umask (clone with CLONE_FS)"),
    ] {
        if sys::hold_together(pid, ppid, what) {
            return Err(Error::Unsupported { pid, what: format!("{held} held together with its parent") });
        }
    }
    Ok(())
}

/// Whether thread `tid` of process `pid` exists and has not exited (a zombie or dead task has).
fn task_alive(pid: Tid, tid: Tid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()))
        .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x'))
}

/// How a freshly seized thread ended up.
enum Stopped {
    /// In its interrupt stop, with a signal caught on its way to it, if any (handed back at
    /// release); `group_stop`: the signal that stopped its process, if it is stopped (see
    /// [`FrozenProcess::stopped_by`]).
    Held { held: Option<(i32, PendingSignal)>, group_stop: Option<i32> },
    /// It exited before it could stop.
    Gone,
}

/// Waits for the interrupt stop of a freshly seized thread.
fn wait_for_stop(tid: Tid) -> Result<Stopped> {
    let mut held = None;
    loop {
        match wait_telling_why(tid)? {
            stop @ StopKind::EventStop(_) => return Ok(Stopped::Held { held, group_stop: stop.group_stop_signal() }),
            StopKind::Signal(sig) => {
                let info = sys::get_siginfo(tid)?;
                held = Some((sig, PendingSignal(info.to_vec())));
                sys::resume(tid, 0)?;
            }
            StopKind::Exited(_) | StopKind::Killed(_) => return Ok(Stopped::Gone),
            other => {
                debug!(tid, ?other, "unexpected stop while freezing; resuming");
                sys::resume(tid, 0)?;
            }
        }
    }
}

/// Waits for the next state change of a seized thread. A thread waiting in the kernel where a
/// ptrace interrupt does not reach it (an uninterruptible wait on a file system, on a device) may
/// take long: after a few seconds the log says which thread and where, so that a checkpoint that
/// seems to hang explains itself. It is not given up on: a thread seized and not yet stopped
/// cannot be released, and would stop later with nobody to let it go.
fn wait_telling_why(tid: Tid) -> Result<StopKind> {
    const TELL_AFTER: Duration = Duration::from_secs(5);
    let start = Instant::now();
    let mut nap = Duration::from_micros(10);
    let mut told = false;
    loop {
        if let Some(stop) = sys::try_wait(tid)? {
            return Ok(stop);
        }
        // A main thread that exited while its process's other threads run on is reported
        // only when they end (pthread_exit in main, at the moment it was seized).
        if start.elapsed() > LEADERLESS_PATIENCE && procfs::stat(tid).is_ok_and(|s| s.state == 'Z') && other_thread_runs(tid) {
            return Err(main_thread_gone(tid));
        }
        if !told && start.elapsed() > TELL_AFTER {
            told = true;
            let state = procfs::stat(tid).map(|s| s.state).unwrap_or('?');
            let wchan = std::fs::read_to_string(format!("/proc/{tid}/wchan")).unwrap_or_default();
            warn!(tid, %state, wchan = wchan.trim(), "a thread of the job has not stopped for the checkpoint after {} s; still waiting", TELL_AFTER.as_secs());
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(2));
    }
}

impl FrozenTree {
    pub fn pids(&self) -> Vec<Tid> {
        self.procs.iter().map(|p| p.pid).collect()
    }

    /// Each process's host pid with its pid in the job, from the statuses read at the freeze.
    pub fn ns_pids(&self) -> HashMap<Tid, Tid> {
        self.procs.iter().filter_map(|p| Some((p.pid, ns_tid_in(p.status().ok()?, p.pid).ok()?))).collect()
    }

    /// Reads every process's mappings ([`FrozenProcess::layout`]) on as many threads as there
    /// are CPUs, where they are all needed at once (an Open MPI rank has some 400 mappings:
    /// 43 ms for 64 ranks on one thread). A process that cannot be read is read again, and
    /// fails, where its mappings are used.
    fn read_layouts_side_by_side(&self) {
        procfs::side_by_side(&self.procs, |part| {
            part.iter().for_each(|p| drop(p.layout()));
            Vec::<()>::new()
        });
    }

    /// The job's monotonic and boot-time clocks once it was captured, as the job saw them.
    pub fn clocks(&self) -> timens::ClocksRecord {
        self.clocks
    }

    /// Reads the send queues of the tree's TCP connections now, for the capture to use (see
    /// [`tcp::snapshot_send_queues`]): a job spread over nodes does this on every node first.
    pub fn snapshot_send_queues(&mut self) -> Result<()> {
        let networks = self.networks()?;
        self.early_sends = tcp::snapshot_send_queues(&self.pids(), &networks)?;
        Ok(())
    }

    /// Without TCP repair mode, the tree's TCP connections whose other end is not on this node,
    /// for the coordinator to pair with the other nodes' (see [`tcp_reconnect::CrossNode`]).
    pub fn tcp_ends_off_node(&self) -> Result<Vec<tcp_reconnect::EndInfo>> {
        tcp_reconnect::CrossNode::outside_ends(&self.pids())
    }

    /// One round of draining the connections between nodes (see [`tcp_reconnect::CrossNode::round`]).
    pub fn drain_across_nodes(&mut self, ends: &[tcp_reconnect::EndInfo], last: bool) -> Result<(u64, Vec<tcp_reconnect::RefillInfo>)> {
        let pids = self.pids();
        self.cross_node.round(&pids, ends, last)
    }

    /// Before the capture of a job to be killed with its connections to peers outside it kept
    /// (`--kill --tcp-established`): their packets are held off by the firewall from now until
    /// the restart, or until the release if the checkpoint fails (see `objects::tcp::lock`).
    pub fn lock_outside_connections(&mut self) {
        if self.network_lock.is_none() {
            self.network_lock = tcp::lock_outside(&self.pids());
        }
    }

    /// Before a `--kill`: the connections to other nodes drained at this checkpoint close with a
    /// reset (no TIME_WAIT left for the restart).
    pub fn before_kill(&self) {
        self.cross_node.close_with_reset();
    }

    /// Writes back what other nodes drained from this node's connections.
    pub fn refill_across_nodes(&self, refills: &[tcp_reconnect::RefillInfo]) -> Result<()> {
        self.cross_node.refill(refills)
    }

    /// Captures every process; memory goes to `batch`. With `copy_later`, private memory is
    /// copied after the release from copies of the processes forked now (see [`later`]): the
    /// records' runs of those mappings are filled in by [`take_later`](Self::take_later)'s copies.
    /// `increments`: the write tracking that makes the generation incremental where it can,
    /// and tracks writes for the next one.
    pub fn capture(&mut self, batch: &Batch, stdio: &file::StdioIds, copy_later: bool, increments: &mut increments::Increments) -> Result<Vec<ProcessRecord>> {
        let mut out = Vec::new();
        // Before the descriptors are listed: finding them injects a socket for a moment.
        let networks = self.networks()?;
        let t0 = std::time::Instant::now();
        let (listing, tables) = self.list_descriptors(&networks)?;
        debug!(ms = t0.elapsed().as_secs_f64() * 1e3, "descriptors listed");
        // Each process's pid in the job, for its children's records.
        let ns_pids = self.ns_pids();
        let mut fds = descriptor::CaptureCtx::new(*stdio, &self.pids(), listing, tables, networks);
        fds.inet.tcp.early_sends = std::mem::take(&mut self.early_sends);
        fds.inet.tcp.cross_node = self.cross_node.received();
        fds.last_try = self.last_try;
        let mut mem = memory::MemCaptureCtx::default();
        mem.gpu_left_alone = std::mem::take(&mut self.gpu_left_alone);
        // The shared memory copied before the freeze: what changed since, through any process.
        if increments.copied_shared() {
            let t_shared = Instant::now();
            self.read_layouts_side_by_side();
            let frozen: Vec<shared::FrozenView<'_>> =
                self.procs.iter().map(|p| shared::FrozenView { pid: p.pid, maps: p.layout().ok(), seen: p.seen }).collect();
            mem.shared_plans = increments.settle_shared(self.root, &frozen, !self.zombies.is_empty());
            drop(frozen);
            for (at, skip) in shared::probes_not_needed(&self.procs.iter().map(|p| (p.pid, p.layout().ok())).collect::<Vec<_>>(), &mem.shared_plans) {
                self.procs[at].probe_skip = skip;
            }
            debug!(objects = mem.shared_plans.len(), ms = t_shared.elapsed().as_secs_f64() * 1e3, "shared memory copied ahead settled");
        }
        let in_capture = |pid: Tid| {
            move |e: Error| match e {
                e if e.takes_place() => Error::Capture { pid, inner: Box::new(e) },
                other => other,
            }
        };
        // Two steps per process, one after the other on two threads (a pipeline): what is asked
        // inside it (injected calls, the write tracking, the fork) on this thread, which traces
        // it, and what is read from outside (its memory, its descriptors) on another, which
        // needs no tracer; so the next process is asked while this one is read.
        let later::AfterRelease { copies, to_end } = &mut self.later;
        // A fork is the tree's from the moment it is made ([`later::AfterRelease::to_end`]),
        // until the reading step hands it to the copies after the release.
        let forks = std::sync::Mutex::new(std::mem::take(to_end));
        let (procs, forks_ref, ns_pids, tracers) = (&self.procs, &forks, &ns_pids, &self.tracers);
        let flags_ahead: Vec<std::sync::Mutex<Option<memattrs::FlagsAhead>>> =
            procs.iter().map(|p| std::sync::Mutex::new(self.flags_ahead.remove(&p.pid))).collect();
        let increments = std::sync::Mutex::new(increments);
        // Set by the first tracer whose process fails: the others stop.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let (read, asked) = std::thread::scope(|s| {
            // Each process's first step, by its position in the tree.
            let (tx, rx) = crossbeam_channel::bounded::<(usize, Asked<'_>)>(2 * tracers.count());
            let reader = std::thread::Builder::new().name("ckpt-capture".into()).spawn_scoped(s, move || -> Result<_> {
                let mut out = Vec::new();
                // The second steps go in the tree's order, as the tracers' first steps come
                // (in turns, not quite in order): the records, and which process a description
                // shared by several is recorded with, are the same whatever the timing.
                let mut early = BTreeMap::new();
                for (at, asked) in rx {
                    early.insert(at, asked);
                    while let Some(asked) = early.remove(&out.len()) {
                        let pid = asked.pid;
                        let (rec, used) = capture_outside(asked, batch, &mut fds, &mut mem, copies, forks_ref, ns_pids).map_err(in_capture(pid))?;
                        out.push((rec, used.map(|a| (pid, a))));
                    }
                }
                Ok(out)
            });
            let reader = match reader {
                Ok(r) => r,
                Err(e) => return (Err(Error::Other(format!("start a capture thread: {e}"))), Ok(())),
            };
            // The first steps, each process on its tracer, the tracers side by side.
            let failures = tracers.each(|tracer| {
                let mine = procs.iter().enumerate().filter(|(_, p)| p.tracer == tracer);
                for (at, p) in mine {
                    if failed.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let flags = flags_ahead[at].lock().unwrap_or_else(|p| p.into_inner()).take();
                    match capture_inside(p, copy_later, &increments, forks_ref, flags) {
                        // The reader stopped (its error is the one to tell).
                        Ok(a) => {
                            if tx.send((at, a)).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                            return Some((at, in_capture(p.pid)(e)));
                        }
                    }
                }
                None
            });
            drop(tx);
            // The failure of the process first in the tree, as one tracer would have met it.
            let asked = failures.into_iter().flatten().min_by_key(|(at, _)| *at).map_or(Ok(()), |(_, e)| Err(e));
            let read = reader.join().unwrap_or_else(|_| Err(Error::Bug("the capture thread panicked".into())));
            (read, asked)
        });
        *to_end = forks.into_inner().unwrap_or_else(|p| p.into_inner());
        // Where both steps failed, the reading step's error is of an earlier process.
        let read = read?;
        asked?;
        for (rec, used) in read {
            self.flags_used.extend(used);
            out.push(rec);
        }
        // The capture runs some of the job's code: a thread stopped inside the vdso is stepped
        // out of it, finishing the clock read it was in, after the clocks were read at the
        // freeze. The clocks a restart continues from are read again now, so that no reading
        // the job made is ahead of them (core.rs's vdsoloop saw its clock go back 1.6 ms after a
        // restart, on a loaded machine).
        self.clocks = timens::capture(self.root)?;
        // (What the frozen time holds besides the freeze and each process's capture: the job's
        // other objects, the coordinator's answer, the release.)
        debug!(ms = self.frozen_at.elapsed().as_secs_f64() * 1e3, "every process captured");
        Ok(out)
    }

    /// The host and domain names process `pid` (host pid, one of the tree's) sees: uname(2) run
    /// inside it, into a page mapped for the moment (nothing outside its UTS namespace shows
    /// them).
    pub fn uts_names(&self, pid: Tid) -> Result<crate::objects::uts::UtsNames> {
        let raw = self.inject(pid, |task| {
            let len = std::mem::size_of::<libc::utsname>();
            let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
            let private = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
            let at = task.syscall("mmap", libc::SYS_mmap, &[0, len as u64, rw, private, u64::MAX, 0])?;
            let raw = task.syscall("uname", libc::SYS_uname, &[at]).and_then(|_| task.get(at, len));
            let unmapped = task.syscall("munmap", libc::SYS_munmap, &[at, len as u64]);
            Ok(raw.and_then(|raw| unmapped.map(|_| raw))?)
        })?;
        crate::objects::uts::UtsNames::from_utsname(&raw)
    }

    /// The network namespaces the job's processes are in, each with a sock_diag socket made
    /// inside one of its processes (see [`JobNetworks`]): found once per freeze.
    pub fn networks(&mut self) -> Result<Arc<JobNetworks>> {
        if let Some(n) = &self.networks {
            return Ok(n.clone());
        }
        let diag = (libc::AF_NETLINK, libc::SOCK_RAW, crate::sockdiag::NETLINK_SOCK_DIAG);
        let found = Arc::new(JobNetworks::find(&self.pids(), |pid| self.socket_in(pid, diag))?);
        self.networks = Some(found.clone());
        Ok(found)
    }

    /// A socket of `(domain, type, protocol)` made inside frozen process `pid` (host pid), in
    /// its namespaces, and taken out of it: the process is left as it was.
    fn socket_in(&self, pid: Tid, (domain, ty, protocol): (i32, i32, i32)) -> Result<std::os::fd::OwnedFd> {
        self.inject(pid, |task| {
            let fd = task.syscall("socket", libc::SYS_socket, &[domain as u64, (ty | libc::SOCK_CLOEXEC) as u64, protocol as u64])?;
            let taken = descriptor::take_into_self(pid, fd as i32);
            task.syscall("close", libc::SYS_close, &[fd])?;
            taken
        })
    }

    /// Runs `calls` in frozen process `pid` (host pid, one of the tree's), which injects system
    /// calls into its main thread; the thread is left as it was.
    fn inject<R: Send>(&self, pid: Tid, calls: impl FnOnce(&mut RemoteTask) -> Result<R> + Send) -> Result<R> {
        let Some(p) = self.procs.iter().find(|p| p.pid == pid) else {
            return Err(Error::Bug(format!("pid {pid} is not a frozen process of the job")));
        };
        self.tracers.on(p.tracer, || {
            let mut task = RemoteTask::new(pid, Injector::new(pid, p.vdso()?.syscall_insn)?)?;
            let result = calls(&mut task);
            let finished = task.main.finish();
            let result = result?;
            finished?;
            Ok(result)
        })
    }

    /// Runs `f` on every process, each on its tracer, the tracers side by side; the results in
    /// the tree's order.
    fn map_processes<R: Send>(&mut self, f: impl Fn(&mut FrozenProcess) -> R + Sync) -> Vec<R> {
        self.tracers.map(&mut self.procs, |p| p.tracer, f)
    }

    /// Makes this the checkpoint's last try (see [`crate::Error::Passing`]): events queued on a
    /// notification instance are lost, with a warning, instead of the try being given up.
    pub fn last_try(&mut self) {
        self.last_try = true;
    }

    /// The processes (host pids) the NVIDIA driver said are no CUDA processes although they
    /// map a device (`gpu::Suspended::left_alone`): their mappings of it are recorded as
    /// inaccessible address space (`memory::Backing::GpuInherited`). Any other process's mapping
    /// of a device is refused.
    pub fn gpu_left_alone(&mut self, pids: &[Tid]) {
        self.gpu_left_alone = pids.iter().copied().collect();
    }

    /// When the job was frozen (its first thread seized).
    pub fn frozen_at(&self) -> Instant {
        self.frozen_at
    }

    /// Makes the capture read every mapping's flags while frozen: for a job that will not run
    /// again (`--kill`), after which nothing could be checked.
    pub fn forget_flags_ahead(&mut self) {
        self.flags_ahead.clear();
    }

    /// The flags the capture took from the read before the freeze, to check after the release.
    pub fn take_flags_check(&mut self) -> FlagsCheck {
        FlagsCheck(std::mem::take(&mut self.flags_used))
    }

    /// Every process's descriptors, listed once for the whole capture. A process with many is
    /// probed from inside ([`fd::probe`]) rather than read descriptor by descriptor from /proc,
    /// and the tables its sockets will need are read meanwhile ([`descriptor::SocketTables`]).
    fn list_descriptors(&mut self, networks: &Arc<JobNetworks>) -> Result<(descriptor::Listing, Option<descriptor::SocketTables>)> {
        // Started by the first process whose descriptors are probed, read while the rest are.
        let tables = std::sync::Mutex::new(None);
        // Each process on its tracer, the tracers side by side (256 processes listed on one
        // thread took 10 ms of the frozen time, the other CPU idle).
        let found = self.tracers.map(
            &mut self.procs,
            |p| p.tracer,
            |p| -> Result<Vec<(i32, Option<_>)>> {
                let pid = p.pid;
                let scope = fd::probe_scope(procfs::fd_count(pid)?, p.status()?.fdsize as usize);
                let probed = match scope {
                    Some(scope) if batch::trap_is_free_by(p.status()?) => {
                        tables.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| descriptor::SocketTables::start(networks.clone()));
                        let candidates = match scope {
                            fd::ProbeScope::Table(n) => (0..n as i32).collect(),
                            fd::ProbeScope::Listed => procfs::fds(pid)?,
                        };
                        Some(probe_descriptors(p, &candidates)?)
                    }
                    Some(_) => {
                        debug!(pid, "SIGTRAP pending or ignored: descriptors read from /proc");
                        None
                    }
                    None => None,
                };
                match probed {
                    Some(fds) => Ok(fds),
                    None => Ok(procfs::fds(pid).context(|| format!("list the descriptors of pid {pid}"))?.into_iter().map(|fd| (fd, None)).collect()),
                }
            },
        );
        // In the tree's order, as one thread would have met them (the first failure told).
        let mut listing = descriptor::Listing::default();
        for (p, fds) in self.procs.iter().zip(found) {
            listing.add(p.pid, fds?)?;
        }
        Ok((listing, tables.into_inner().unwrap_or_else(|e| e.into_inner())))
    }

    /// The zombies of the tree, as records. A zombie reaped since the freeze listed it is left
    /// out: its parent, seized but not stopped yet, reaped it in that moment (or it was the job's
    /// init's), and the parent's memory says so.
    pub fn zombies(&self) -> Result<Vec<process::ZombieRecord>> {
        let mut out = Vec::new();
        for &z in &self.zombies {
            let record = process::tree_links(z).and_then(|(pid, ppid, pgid, sid)| {
                let wait_status = procfs::stat(z)?.exit_code.unwrap_or(0);
                Ok(process::ZombieRecord { pid, ppid, pgid, sid, wait_status })
            });
            match record {
                Ok(r) => out.push(r),
                Err(_) if !std::path::Path::new(&format!("/proc/{z}")).exists() => debug!(pid = z, "zombie reaped during the freeze"),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The cgroups the job made (see [`crate::objects::cgroups`]), read as the job was frozen.
    pub fn take_cgroups(&mut self) -> crate::objects::cgroups::CgroupsRecord {
        std::mem::take(&mut self.cgroups)
    }

    /// The copies of memory to make after the release (empty without `copy_later`).
    pub fn take_later(&mut self) -> later::Pending {
        later::Pending::new(std::mem::take(&mut self.later.copies))
    }

    /// Releases every thread, giving back held signals and masks.
    pub fn resume(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        debug!(ms = self.frozen_at.elapsed().as_secs_f64() * 1e3, "tree being released");
        // The job goes on: its connections take packets again.
        drop(self.network_lock.take());
        self.cross_node.warn_lost();
        // Each thread let go by its tracer, the tracers side by side.
        let failures = self.map_processes(|p| {
            let mut first_err = None;
            for t in main_thread_last(p.pid, &p.threads) {
                if let Err(e) = let_go(t) {
                    if !task_alive(p.pid, t.tid) || process_dying(p.pid) {
                        // It died while held (killed from outside, or a thread not yet stopped
                        // ended the process): taken, so that its parent is told of its end.
                        collect_end(t.tid);
                        continue;
                    }
                    warn!(tid = t.tid, "release: {e}");
                    first_err.get_or_insert(e);
                }
            }
            first_err
        });
        let first_err = failures.into_iter().flatten().next();
        debug!(ms = self.frozen_at.elapsed().as_secs_f64() * 1e3, "tree released");
        match first_err {
            None => Ok(()),
            Some(e) => Err(e.into()),
        }
    }

    /// Kills every process of the tree (for `--kill`), after the capture.
    pub fn kill(mut self) {
        // Its connections stay locked until the restart takes them over.
        if let Some(lock) = self.network_lock.take() {
            lock.keep();
        }
        for p in &self.procs {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), nix::sys::signal::Signal::SIGKILL);
        }
        // A killed tracee is reported to its tracer first; until we collect it, its parent (the
        // job's init) cannot reap it and the job would never be seen to end.
        // The leader's exit is reported only once its other threads are collected: them first.
        for p in &self.procs {
            for t in main_thread_last(p.pid, &p.threads) {
                while let Ok(stop) = sys::wait(t.tid) {
                    if matches!(stop, StopKind::Exited(_) | StopKind::Killed(_)) {
                        break;
                    }
                }
            }
        }
        self.released = true;
    }
}

impl Drop for FrozenTree {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            warn!("releasing the job after a failed checkpoint: {e}");
        }
    }
}

pub(crate) fn vdso_syscall_insn(pid: Tid) -> Result<u64> {
    vdso_of(pid, &procfs::maps(pid)?).map(|vdso| vdso.syscall_insn)
}

/// The range of a process's [vdso] code, in its mappings `maps`, and the address of a syscall
/// instruction in it (the injector's).
fn vdso_of(pid: Tid, maps: &[procfs::MemoryMap]) -> Result<Vdso> {
    let vdso = maps
        .iter()
        .find(|m| matches!(m.pathname, procfs::MMapPath::Vdso))
        .ok_or_else(|| Error::Unsupported { pid, what: "a process without a vdso".into() })?;
    let (start, end) = vdso.address;
    // Every process of this kernel maps the same vdso: where its instruction was last found is
    // checked first, two bytes read instead of the whole vdso through /proc/PID/mem (about
    // 0.05 ms of frozen time a process). Any two bytes 0f 05 that execute are a `syscall`.
    let known = VDSO_SYSCALL_OFFSET.load(std::sync::atomic::Ordering::Relaxed);
    if known < end - start {
        let mut two = [0u8; 2];
        if crate::ptrace::remote_mem::read(pid, start + known, &mut two).ok() == Some(2) && two == [0x0f, 0x05] {
            return Ok(Vdso { range: vdso.address, syscall_insn: start + known });
        }
    }
    let mut code = vec![0u8; (end - start) as usize];
    crate::ptrace::remote_mem::ProcMem::open(pid)?.read_exact(start, &mut code)?;
    let syscall_insn = find_syscall_insn(&code, start).ok_or_else(|| Error::Other(format!("pid {pid}: no syscall instruction in the vdso")))?;
    VDSO_SYSCALL_OFFSET.store(syscall_insn - start, std::sync::atomic::Ordering::Relaxed);
    Ok(Vdso { range: vdso.address, syscall_insn })
}

/// Where [`vdso_of`] last found the `syscall` instruction, from the vdso's start (none yet:
/// `u64::MAX`).
static VDSO_SYSCALL_OFFSET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// The most instructions a thread is stepped through to leave the vdso: its functions are short
/// and loop only while the kernel updates the clock's data (a few retries).
const VDSO_STEPS: u32 = 100_000;

/// Steps every thread of `p` that is stopped inside the vdso's code `vdso`, outside a system
/// call, one instruction at a time until it has left it: the image then holds no address inside
/// the vdso but return addresses, and a restart on another kernel, where the old vdso's place
/// holds only jumps to the new one's functions (see `objects::vdso`), resumes nothing inside
/// the old code. A thread in a system call there returns into the old code, which stays. A
/// stopped process (SIGSTOP) is left as it is: stepping would run it.
fn step_out_of_vdso(p: &FrozenProcess, vdso: (u64, u64)) -> Result<()> {
    if p.stopped_by.is_some() {
        return Ok(());
    }
    let inside = |r: &Regs| (vdso.0..vdso.1).contains(&r.rip) && (r.orig_rax as i64) < 0;
    for t in &p.threads {
        let mut regs = Regs::read(t.tid)?;
        let mut steps = 0;
        while inside(&regs) {
            if steps == VDSO_STEPS {
                return Err(Error::Other(format!(
                    "pid {} thread {}: still inside the vdso after {VDSO_STEPS} instructions (at {:#x}): checkpoint again",
                    p.pid, t.tid, regs.rip
                )));
            }
            sys::single_step(t.tid)?;
            match sys::wait(t.tid)? {
                StopKind::Signal(libc::SIGTRAP) => {}
                other => return Err(Error::Other(format!("pid {} thread {}: stepping out of the vdso, it stopped as {other:?}", p.pid, t.tid))),
            }
            regs = Regs::read(t.tid)?;
            steps += 1;
        }
        if steps > 0 {
            debug!(pid = p.pid, tid = t.tid, steps, "a thread stopped inside the vdso was stepped out of it");
        }
    }
    Ok(())
}

/// Probes the descriptor numbers `fds` of a stopped process from inside it; returns the open ones.
fn probe_descriptors(p: &FrozenProcess, fds: &[i32]) -> Result<Vec<(i32, Option<descriptor::ProbedSocket>)>> {
    let (pid, t0) = (p.pid, std::time::Instant::now());
    let mut task = RemoteTask::new(pid, Injector::new(pid, p.vdso()?.syscall_insn)?)?;
    let result = batch::with_runner(&mut task, fd::PROBE_AREA as u64, |task, runner, area| fd::probe(task, runner, area, fds));
    task.main.finish()?;
    let probed = result.map_err(|e| match e {
        e if e.takes_place() => Error::Other(format!("probe the descriptors of pid {pid}: {e}")),
        other => other,
    })?;
    debug!(pid, numbers = fds.len(), open = probed.len(), ms = t0.elapsed().as_secs_f64() * 1e3, "descriptors probed");
    Ok(probed)
}

/// What is asked of a frozen process from inside it, on the thread that traces it: the first
/// step of its capture ([`capture_inside`]); [`capture_outside`] reads the rest.
struct Asked<'a> {
    pid: Tid,
    ns_pid: Tid,
    /// Its status, read once frozen ([`FrozenProcess::status`]).
    status: &'a procfs::Status,
    /// The first step's whole time.
    inside_ms: f64,
    inject_ms: f64,
    delta_ms: f64,
    fork_ms: f64,
    /// Of the first step's time, the walk of its page tables ([`memory::PageTables`]).
    tables_ms: f64,
    stops: u32,
    captured: Captured,
    mem: crate::ptrace::remote_mem::ProcMem,
    tables: memory::PageTables,
    /// Its mappings, as read at the freeze ([`FrozenProcess::layout`]), and as read again
    /// where the write tracking registered some (which may merge neighbours).
    layout: &'a [procfs::MemoryMap],
    reread: Option<Vec<procfs::MemoryMap>>,
    delta: Option<memory::Delta>,
    copied_ahead: Option<crate::pool::StreamWriter>,
    forked: bool,
    flags_ahead: Option<memattrs::FlagsAhead>,
    seccomp: Option<seccomp::SeccompRecord>,
}

/// The first step of a process's capture, on the thread that traces it: the questions asked
/// inside it, the pages written since the last generation, and the fork for the copy after
/// the release (kept in `forks` from the moment it is made).
fn capture_inside<'a>(
    p: &'a FrozenProcess,
    copy_later: bool,
    increments: &std::sync::Mutex<&mut increments::Increments>,
    forks: &std::sync::Mutex<Vec<later::Snapshot>>,
    flags_ahead: Option<memattrs::FlagsAhead>,
) -> Result<Asked<'a>> {
    let pid = p.pid;
    // Where the frozen time goes, per process (the debug line "process captured").
    let started = Instant::now();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let Vdso { range: vdso, syscall_insn } = p.vdso()?;
    // Before any injector reads the registers it will put back.
    step_out_of_vdso(p, vdso)?;
    let layout = p.layout()?;
    // Whether SIGTRAP is free for single-stepped calls.
    let status_before = p.status()?;
    let mut main = Injector::new(pid, syscall_insn)?;
    main.step_calls(batch::trap_is_free_by(status_before));
    let mut task = RemoteTask::new(pid, main)?;

    // A private scratch area inside the task for the injected calls' in and out structures, and
    // a page after it for the runner that answers them in one stop (`batch`), mapped together
    // in one injected call where SIGTRAP is free for the runner. It also tells whether the
    // process locks what it maps (see `memattrs`).
    let with_runner = match batch::trap_is_free_by(status_before) {
        true => batch::Runner::map_with_area(&mut task.main, &task.mem, SCRATCH_LEN).map_err(|e| {
            // A security module that refuses executable anonymous memory, or the limit below.
            debug!(pid, "the runner could not be placed ({e}): one injected call at a time");
        }),
        false => {
            debug!(pid, "SIGTRAP pending or ignored: one injected call at a time");
            Err(())
        }
    };
    let mapped = match with_runner {
        Ok((area, runner)) => Ok((area, Some(runner))),
        Err(()) => {
            let (prot, flags) = ((libc::PROT_READ | libc::PROT_WRITE) as u64, (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64);
            task.syscall("mmap", libc::SYS_mmap, &[0, SCRATCH_LEN + batch::PAGE, prot, flags, u64::MAX, 0]).map(|area| (area, None))
        }
    };
    let (scratch, runner) = mapped.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::WouldBlock {
            format!(
                " (it locks all the memory it maps, mlockall(MCL_FUTURE), and has reached its RLIMIT_MEMLOCK: the checkpoint needs {} KiB below it)",
                (SCRATCH_LEN + batch::PAGE) / 1024
            )
        } else {
            String::new()
        };
        Error::Other(format!("pid {pid}: map a scratch page: {e}{hint}"))
    })?;
    task.set_scratch(scratch, SCRATCH_LEN as usize);

    let result = capture_with_scratch(p, &mut task, syscall_insn, runner);
    let unmap = task.syscall("munmap", libc::SYS_munmap, &[scratch, SCRATCH_LEN + batch::PAGE]);
    // The vdso, the scratch area in and out, and what is asked inside.
    let inject_ms = ms(started.elapsed());
    // Streams are named by the pid inside the job, which restart recreates.
    let ns_pid = ns_tid_in(status_before, pid);
    // Once the scratch page is gone, before the fork: the pages written since the last
    // generation, and the tracking for the next.
    let t_delta = Instant::now();
    let increment = match (&result, &unmap, &ns_pid) {
        (Ok(_), Ok(_), Ok(ns_pid)) => increments.lock().unwrap_or_else(|p| p.into_inner()).process(&mut task, *ns_pid, status_before, layout),
        _ => Ok(Default::default()),
    };
    let (delta, copied_ahead, registered) = match increment {
        Ok(i) => (Ok(i.delta), i.stream, i.registered),
        Err(e) => (Err(e), None, false),
    };
    let t_fork = Instant::now();
    let delta_ms = ms(t_fork - t_delta);
    // Last: the copy's memory is the program's alone.
    let snapshot = match (&result, &unmap, &delta) {
        (Ok(_), Ok(_), Ok(delta)) if copy_later && fork_pays(pid, status_before, layout, delta.as_ref()) => {
            later::Snapshot::take(pid, &mut task.main, syscall_insn)
        }
        _ => Ok(None),
    };
    let fork_ms = ms(t_fork.elapsed());
    let stops = task.main.stops() + result.as_ref().map_or(0, |c| c.thread_stops);
    let finished = task.main.finish();
    // From here on a fork made is the tree's, whatever fails: it is ended (and reaped by its
    // parent) once the tree is released, which only the tree's drop order guarantees; dropped
    // here, with its parent still held, it would stay a zombie of the job.
    let snapshot = snapshot?;
    let forked = snapshot.is_some();
    forks.lock().unwrap_or_else(|p| p.into_inner()).extend(snapshot);
    finished?;
    let captured = result?;
    unmap?;
    let (ns_pid, delta) = (ns_pid?, delta?);
    let reread = if registered { Some(procfs::maps(pid)?) } else { None };
    let RemoteTask { mem, .. } = task;
    let t_tables = Instant::now();
    let tables = memory::PageTables::read(pid, reread.as_deref().unwrap_or(layout), delta.as_ref())?;
    let tables_ms = ms(t_tables.elapsed());
    let inside_ms = ms(started.elapsed());
    Ok(Asked {
        pid,
        ns_pid,
        status: status_before,
        inside_ms,
        inject_ms,
        delta_ms,
        fork_ms,
        tables_ms,
        stops,
        captured,
        mem,
        tables,
        layout,
        reread,
        delta,
        copied_ahead,
        forked,
        flags_ahead,
        seccomp: p.seccomp.clone(),
    })
}

/// The second step of a process's capture, from outside it (no tracer needed): its memory, its
/// descriptors, its place in the tree. Returns its record, and the flags of its mappings read
/// before the freeze if the capture used them (to check after the release).
fn capture_outside(
    asked: Asked<'_>,
    batch: &Batch,
    fds: &mut descriptor::CaptureCtx,
    mem: &mut memory::MemCaptureCtx,
    copies: &mut Vec<later::LaterCopy>,
    forks: &std::sync::Mutex<Vec<later::Snapshot>>,
    ns_pids: &HashMap<Tid, Tid>,
) -> Result<(ProcessRecord, Option<memattrs::FlagsAhead>)> {
    let started = Instant::now();
    let Asked {
        pid,
        ns_pid,
        status,
        inside_ms,
        inject_ms,
        delta_ms,
        fork_ms,
        tables_ms,
        stops,
        captured,
        mem: proc_mem,
        tables,
        layout,
        reread,
        delta,
        copied_ahead,
        forked,
        mut flags_ahead,
        seccomp,
    } = asked;
    let maps = reread.as_deref().unwrap_or(layout);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let Captured { attrs, mem_attrs, signals, threads, posix_timers, mem_probe, thread_stops: _ } = captured;
    let mut attrs = process::capture_attrs(pid, status, attrs)?;
    // Where memory was copied before the freeze, what is copied now follows in the same stream;
    // where not, shared memory copied into its stream then is not there to refer to.
    if copied_ahead.is_none() {
        mem.shared_plans.retain(|_, plan| plan.keeper != pid);
    }
    let mut stream = copied_ahead.unwrap_or_else(|| batch.stream(ns_pid as u32));
    let t_memory = Instant::now();
    let (vmas, deferred) = memory::capture(pid, &proc_mem, &mut stream, mem, maps, &mem_probe, forked, delta.as_ref(), &mut flags_ahead, tables)?;
    let memory_ms = ms(t_memory.elapsed());
    let t_fds = Instant::now();
    // Descriptors while the stream is open: large deleted files and memfds go into it (before
    // the memory copied after the release, if any), and so does a deleted executable.
    process::capture_deleted_exe(pid, &mut attrs, fds)?;
    refuse_held_together(pid, Some(status.ppid).filter(|ppid| ns_pids.contains_key(ppid)))?;
    let fd_records = fd::capture(pid, fds)?;
    if let Some(root) = &attrs.root {
        // Socket names are walked from the process's root, which the restart gives back only
        // once its descriptors are made (their paths are its namespace's).
        let named =
            fd_records.iter().find(|r| matches!(&r.kind, descriptor::FdKind::Unix(u) if u.name.as_ref().is_some_and(|n| n.first().is_some_and(|&b| b != 0))));
        if let Some(r) = named {
            return Err(Error::Unsupported { pid, what: format!("fd {} (a Unix socket bound to a path, in a root directory of its own, {root})", r.fd) });
        }
    }
    let saved_files = deleted::save_pending(pid, fds, &mut stream)?;
    let fds_ms = ms(t_fds.elapsed());
    let stream_len = stream.offset();
    if forked {
        let snapshot = {
            let mut forks = forks.lock().unwrap_or_else(|p| p.into_inner());
            let at = forks.iter().position(|s| s.parent() == pid).ok_or_else(|| Error::Bug(format!("the fork of pid {pid} is not among the tree's")))?;
            forks.remove(at)
        };
        copies.push(later::LaterCopy { pid_in_job: ns_pid, stream, deferred, snapshot });
        copies.last_mut().expect("just pushed").stream.park()?;
    } else {
        stream.finish()?;
    }
    debug!(
        pid,
        inject_ms,
        delta_ms,
        fork_ms,
        tables_ms,
        memory_ms,
        fds_ms,
        inside_ms,
        outside_ms = ms(started.elapsed()),
        stops,
        bytes = stream_len,
        "process captured"
    );
    let (_, ppid, pgid, sid) = process::tree_links_from(pid, status, |host_ppid| ns_pids.get(&host_ppid).copied())?;
    let ctty = if sid == ns_pid { crate::objects::pty::capture_ctty(pid)? } else { None };
    let record = ProcessRecord {
        pid: ns_pid,
        ppid,
        pgid,
        sid,
        attrs,
        threads,
        vmas,
        fds: fd_records,
        signals,
        stream_len,
        posix_timers,
        ctty,
        mem_attrs,
        saved_files,
        cuda: None,
        seccomp,
    };
    Ok((record, flags_ahead))
}

/// A fork copies the page tables of all the process's memory (about 10 ms per GiB resident
/// here), a copy while frozen only the pages stored (about 3 GB/s into the pool): copying a byte
/// while frozen costs the freeze about what forking costs per 32 resident bytes.
const FROZEN_COPY_VS_FORK: u64 = 32;

/// A fork also costs per mapping (its tables, its reverse map, the copy's parking: about 3 us
/// a mapping here, 1.1 ms for an Open MPI rank's 400), counted as the resident bytes a fork
/// copies the tables of in that time.
const FORK_PER_MAPPING: u64 = 320 << 10;

/// Whether forking a copy of `pid` to read its memory from after the release freezes it for
/// less than copying what it stores now: false for an incremental generation whose pages
/// written since its base are few next to what the fork would copy the tables of. `status`:
/// the process's, read at its freeze (its resident memory has not changed since).
fn fork_pays(pid: Tid, status: &procfs::Status, maps: &[procfs::MemoryMap], delta: Option<&memory::Delta>) -> bool {
    let Some(delta) = delta else { return true };
    let resident = status.vmrss.unwrap_or(u64::MAX / 1024).saturating_mul(1024);
    let fork_weight = resident.saturating_add(FORK_PER_MAPPING * maps.len() as u64);
    let private: Vec<(u64, u64)> =
        maps.iter().filter(|m| m.perms.contains(procfs::MMPermissions::WRITE) && !m.perms.contains(procfs::MMPermissions::SHARED)).map(|m| m.address).collect();
    let stored = delta.bytes_to_store(&private);
    let pays = stored.saturating_mul(FROZEN_COPY_VS_FORK) > fork_weight;
    debug!(pid, stored, resident, mappings = maps.len(), pays, "fork for the copy after the release, or copy the delta now");
    pays
}

/// What [`capture_with_scratch`] read from inside a process.
struct Captured {
    /// What it told of its attributes; the rest is read from outside ([`capture_outside`]).
    attrs: process::InsideAttrs,
    mem_attrs: memattrs::MemAttrsRecord,
    signals: signals::SignalsRecord,
    threads: Vec<thread::ThreadRecord>,
    posix_timers: Vec<posix_timer::PosixTimerRecord>,
    mem_probe: memory::MemoryProbe,
    /// The ptrace stops of the threads other than the main one ([`Injector::stops`]).
    thread_stops: u32,
}

/// What the capture reads from inside a stopped process, with the scratch area mapped (the
/// runner's page after it). Every module's questions to the main thread are asked together and
/// answered in one stop, then each other thread's in one stop of its own (`batch::Questions`).
fn capture_with_scratch(p: &FrozenProcess, task: &mut RemoteTask, syscall_insn: u64, runner: Option<batch::Runner>) -> Result<Captured> {
    let pid = p.pid;
    let area = task.scratch();
    let status = p.status()?;

    // The questions leave the scratch area's last page untouched: `memattrs` asks by it.
    let questions_area = (area.0, area.1 - batch::PAGE as usize);
    let fresh = area.0 + questions_area.1 as u64;
    let mut q = batch::Questions::new(questions_area.0, questions_area.1);
    let mem_asked = memattrs::ask(&mut q, fresh);
    let attrs_asked = process::ask_attrs(&mut q)?;
    let actions = signals::ask(status, &mut q)?;
    let main_asked = thread::ask(&mut q)?;
    let (answers, posix_timers) = {
        let mut asker = batch::Asker::new(&mut task.main, &task.mem, questions_area, runner.as_ref());
        let answers = asker.answer(q)?;
        (answers, posix_timer::capture(pid, &mut asker)?)
    };
    // The calls after these write into the scratch area one at a time too.
    if let Some(runner) = &runner {
        runner.unlock_area(&mut task.main)?;
    }
    let mem_attrs = memattrs::capture(pid, &answers, &mem_asked)?;
    let attrs = process::read_answers(&answers, &attrs_asked)?;
    let mut signals = signals::capture(pid, &answers, &actions)?;
    // Unless that signal, or a SIGSTOP, is pending already (a second would be one too many).
    if let Some(signo) = p.stopped_by.filter(|&signo| !signals.shared_pending.iter().any(|s| s.signo() == signo || s.signo() == libc::SIGSTOP)) {
        signals.shared_pending.push(signals::PendingSignal::stop(signo));
    }
    let mut threads = Vec::new();
    let mut thread_stops = 0;
    let ns_pid = ns_tid_in(status, pid)?;
    for t in &p.threads {
        let sigmask = t.sigmask.ok_or_else(|| Error::Bug(format!("thread {} captured before it was readied", t.tid)))?;
        let held = t.held.as_ref().map(|h| h.1.clone());
        let rec = if t.tid == pid {
            thread::capture(pid, t.tid, ns_pid, status, *task.main.base(), sigmask, held, &answers, &main_asked)?
        } else {
            // (One read of its status for both.)
            let status = procfs::status(t.tid)?;
            let ns_tid = ns_tid_in(&status, t.tid)?;
            let mut inj = Injector::new(t.tid, syscall_insn)?;
            let runner = runner.as_ref().filter(|_| batch::trap_is_free_by(&status));
            let mut asker = batch::Asker::new(&mut inj, &task.mem, questions_area, runner);
            let mut q = asker.questions();
            let r = thread::ask(&mut q)
                .and_then(|asked| Ok((asker.answer(q)?, asked)))
                .and_then(|(answers, asked)| thread::capture(pid, t.tid, ns_tid, &status, *inj.base(), sigmask, held, &answers, &asked));
            thread_stops += inj.stops();
            inj.finish()?;
            r?
        };
        threads.push(rec);
    }
    // The main thread first: restore creates the others from it.
    threads.sort_by_key(|t| (t.tid != ns_pid, t.tid));
    let queued = signals.shared_pending.iter().chain(threads.iter().flat_map(|t| &t.pending)).filter_map(signals::PendingSignal::timer);
    let posix_timers = posix_timers.settle(queued);
    // Last: it uses the whole scratch area.
    let mem_probe = memory::probe(task, p.layout()?, &p.probe_skip)?;
    Ok(Captured { attrs, mem_attrs, signals, threads, posix_timers, mem_probe, thread_stops })
}

/// The thread id of `tid` in its own pid namespace, from its status `status`.
fn ns_tid_in(status: &procfs::Status, tid: Tid) -> Result<Tid> {
    status.nspid.as_ref().and_then(|ids| ids.last().copied()).ok_or_else(|| Error::Other(format!("/proc/{tid}/status has no NSpid line")))
}
