//! Restart orchestration: from a generation's records and chunk files, rebuild every process of a
//! node exactly (pids, tids, parents, sessions, memory, descriptors, signal state, threads) and
//! release them together.
//!
//! The restorer is the tracer. Processes whose parent is the job's init start as empty copies of
//! the init, created with the right pid by a [`Spawner`]; every other process is forked, with its
//! pid, by its own parent (a system call injected into the parent), so that parent links and
//! `waitpid` work as before. Each process is then rebuilt from the inside by injected system
//! calls: its old mappings are dropped, the image's are mapped and filled, descriptors reopened,
//! handlers installed, threads cloned with their tids; registers come last. Until the final
//! release every task is stopped with every signal blocked; if anything fails, every task is
//! killed and collected ([`tracees::Tracees`]), so nothing half-restored ever runs.

mod process;
mod tracees;
mod tree;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use ckpt_core::error::Stage;
use ckpt_core::fsid::FsIdentity;
use ckpt_core::image::{ChunkListing, StreamReader};
use ckpt_core::objects::files_state::{self, FilesRecord};
use ckpt_core::objects::protect::{self, Store};
use ckpt_core::objects::sysvipc::SysvIpcRecord;
use ckpt_core::objects::{descriptor, fd, file, identity, memory, process as proc_attrs};
use ckpt_core::ptrace::{sys, Regs, RemoteTask, Tid};
use ckpt_core::snapshot::NodeImage;
use ckpt_core::{Error, Result};
use tracing::info;

pub use ckpt_core::objects::file::GrownFiles;

/// Creates an empty process with an exact pid in the job's PID namespace, as a child of the job's
/// init.
pub trait Spawner {
    /// Returns the new process's pid as the restorer sees it.
    fn spawn(&mut self, ns_pid: Tid) -> Result<Tid>;
    /// The host pid of the job's init, in whose mount namespace the job's own mounts are
    /// replayed.
    fn init_pid(&self) -> Tid;
}

/// The bytes of memory a restore of `image` writes (saturating: a forged count cannot overflow).
pub fn memory_bytes(image: &NodeImage) -> u64 {
    let pages = |v: &ckpt_core::objects::memory::VmaRecord| v.stored_pages().saturating_add(v.earlier_pages());
    image.processes.iter().flat_map(|p| &p.vmas).fold(0u64, |acc, v| acc.saturating_add(pages(v).saturating_mul(ckpt_core::PAGE_SIZE)))
}

/// Checks everything that can be checked before any process exists, and puts the job's files
/// back as they were at the checkpoint, or refuses (docs/USER-GUIDE.md, "Files at restart"):
///
/// 1. the shape of the tree, the executables;
/// 2. the files the job had open or mapped and the directories it writes to, outside protected
///    roots: a difference refuses the restart naming the file (with `GrownFiles::Keep`, from
///    `--keep-files`, it is only logged); output files that only grew are cut back;
/// 3. protected roots (`--protect`, `--save-files`) are put back to their recorded state;
/// 4. every open and mapped file is still the file the job had (identity and size), outside
///    protected roots, which step 3 may have recreated.
///
/// `ignored_now`: files of the restart itself (its stdio) that may sit in a listed directory.
///
/// Protected roots are put back with the file rights of the job's first process (unless
/// `as_root`): the job's own, not the restorer's.
/// Whether the image's process tree can be made again (sessions and groups whose leader is
/// gone included, where a stand-in can make them): for the checkpoint, which refuses a tree the
/// restart would refuse, and for the restart's preflight.
pub fn check_tree(processes: &[ckpt_core::objects::ProcessRecord], zombies: &[ckpt_core::objects::process::ZombieRecord]) -> Result<()> {
    tree::check(processes, zombies)
}

///
/// `ignore_cpu`: the CPU extensions a restart may do without (`--ignore-cpu`).
/// `place`: where the restart runs against the checkpoint ([`identity::Place::of`] the files
/// record's boot id and identities).
pub fn preflight(
    image: &NodeImage,
    files: &FilesRecord,
    store: &Store,
    grown: GrownFiles,
    ignored_now: &[(u64, u64)],
    as_root: bool,
    (place, ignore_cpu): (&identity::Place, &[String]),
) -> Result<()> {
    tree::check(&image.processes, &image.zombies)?;
    // A CPU without a register set the threads hold, or an extension the checkpoint's CPU had:
    // refused before anything else.
    ckpt_core::objects::cpu::check_registers(&image.processes, ckpt_core::sys::cpu::xcr0())?;
    ckpt_core::objects::cpu::check_extensions(image.cpu.as_ref(), ckpt_core::objects::cpu::CpuRecord::here(), ignore_cpu)?;
    // Only in the job's own user namespace: one the job made gives its first process every
    // capability in it, whatever the bounding set outside.
    let outermost = image.processes.iter().filter(|p| image.users.namespace_of(p.pid) == 0);
    ckpt_core::objects::creds::check_grantable(outermost.flat_map(|p| p.threads.iter().map(|t| (t.tid, &t.creds))))?;
    let protected = |path: &str| files.is_protected(path);
    // In-memory files the image holds (mapped shared by a process, and perhaps mapped or open in
    // others too): written again by the restart (`restore_saved_files`), whether or not they
    // are here now (a restart on another node, or after `checkpoint --kill` removed them).
    let saved: std::collections::HashSet<(usize, &str)> = image
        .processes
        .iter()
        .flat_map(|p| {
            let ns = image.mounts.namespace_of(p.pid);
            p.vmas.iter().filter_map(move |v| memory::saved_file(v).map(|(path, ..)| (ns, path)))
        })
        .collect();
    // Where each process's files are on this host: below the job's own mounts, through a bind
    // to where it came from, or nowhere (a tmpfs the image holds); protected files and those
    // the image holds are put back.
    let on_host = |pid: Tid| {
        let ns = image.mounts.namespace_of(pid);
        let saved = &saved;
        move |path: &str| if protected(path) || saved.contains(&(ns, path)) { None } else { image.mounts.host_path(ns, path) }
    };
    // Another boot judges files by their contents and inodes, not device numbers.
    if place.is_elsewhere() {
        info!(identities = files.identities.len(), "another boot than the checkpoint's: the files the job only reads are judged by their contents");
    }
    let keep = grown == GrownFiles::Keep;
    for p in &image.processes {
        proc_attrs::check_exe(&p.attrs, &on_host(p.pid), place, keep)?;
    }
    let changed = if keep { files_state::Changed::Keep } else { files_state::Changed::Refuse };
    files_state::check(files, changed, ignored_now, place)?;
    let skip: Vec<(u64, u64)> = files.ignored.iter().chain(ignored_now).copied().collect();
    let owner = image.processes.first().and_then(|p| files_identity(p, as_root));
    let n = protect::restore(&files.protected, store, &skip, owner.as_ref())?;
    if n > 0 {
        info!(entries = n, "protected files put back as they were at the checkpoint");
    }
    for p in &image.processes {
        memory::check_files(&p.vmas, &on_host(p.pid), place, keep)?;
    }
    // Check every process's files before changing any.
    for p in &image.processes {
        file::check_and_prepare(&p.fds, GrownFiles::Keep, &on_host(p.pid), place, keep)?;
    }
    if grown == GrownFiles::Truncate {
        for p in &image.processes {
            file::check_and_prepare(&p.fds, grown, &on_host(p.pid), place, keep)?;
        }
    }
    Ok(())
}

/// A thread rebuilt and stopped, waiting for the release.
pub struct ReadyThread {
    pub host_tid: Tid,
    pub regs: Regs,
    pub sigmask: u64,
}

/// Every task of the node, rebuilt and still stopped.
pub struct Restored {
    threads: Vec<ReadyThread>,
    tracees: tracees::Tracees,
    /// The host pid of each process, by pid in the job.
    pub host_pids: Vec<(Tid, Tid)>,
    /// Processes that were stopped at the checkpoint (host pids): they stop again as they are
    /// released.
    stopping: Vec<Tid>,
    pub bytes: u64,
}

impl Restored {
    /// Releases every task at once (the restart's barrier): registers, masks, detach.
    pub fn release(mut self) -> Result<()> {
        for t in &self.threads {
            t.regs.write(t.host_tid)?;
            sys::set_sigmask(t.host_tid, t.sigmask)?;
        }
        // Sent while every task is still held: a released process takes the SIGSTOP on its way
        // back to its own code, and runs none of it.
        for &pid in &self.stopping {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP)
                .map_err(|e| Error::Other(format!("stop pid {pid} again as it was at the checkpoint: {e}")))?;
        }
        let mut ended = Vec::new();
        for t in &self.threads {
            match sys::detach(t.host_tid, 0) {
                Ok(()) => {}
                // Once the first task runs, the job's own code may end a process (exit_group
                // kills its threads still held, which are then no longer in a stop to detach
                // from): its business, not the restart's.
                Err(_) if ckpt_core::capture::process_dying(t.host_tid) => {
                    tracing::debug!(tid = t.host_tid, "a task ended by its own process as the job was released");
                    ended.push(t.host_tid);
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Such a task stays a zombie of ours until collected, and its process with it: its
        // parent would wait for it for ever (exiters.c's parent did, in about one run in six
        // under load). Main threads last: their ends are reported after their threads'.
        ended.sort_by_key(|&tid| self.host_pids.iter().any(|&(_, host)| host == tid));
        for tid in ended {
            ckpt_core::capture::collect_end(tid);
        }
        self.tracees.disarm();
        Ok(())
    }
}

/// Choices of `ckpt restart` that change how the job is rebuilt.
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// `--tcp-established`: connections to peers outside the job are restored with TCP repair
    /// mode (the peer does not notice) instead of reset.
    pub tcp_established: bool,
    /// Counts the bytes of memory written so far (out of [`memory_bytes`]), for a progress display.
    pub progress: std::sync::Arc<AtomicU64>,
    /// TCP connections of the job's other nodes, (local, remote) as seen there (see
    /// [`other_nodes_connections`]): their ends here are rebuilt by repair mode.
    pub other_nodes: std::collections::HashSet<(ckpt_core::objects::inet::Addr, ckpt_core::objects::inet::Addr)>,
    /// The same connections with their records, and the other nodes' listening addresses (see
    /// [`other_nodes_tcp`]): without TCP repair mode, they are made again by connecting.
    pub other_nodes_tcp: OtherNodesTcp,
    /// Some node of the job restarts on another host than its part ran on (see
    /// [`moved_from`]): connections between nodes are rebuilt by repair mode with the moved
    /// nodes' addresses replaced (`readdressed`), or else made again by connecting.
    pub nodes_moved: bool,
    /// Every moved node's old addresses, each with the one that stands for it now.
    pub readdressed: Vec<(std::net::IpAddr, std::net::IpAddr)>,
    /// `--as-root`: the restorer keeps root's file rights for every process instead of taking
    /// each process's own (see [`files_identity`]).
    pub as_root: bool,
    /// An incremental generation: this node's chunk directory in each earlier generation it
    /// refers to (checked with `NodeImage::check_earlier_streams`).
    pub earlier_chunks: std::collections::BTreeMap<u64, std::path::PathBuf>,
    /// `--lazy`: private anonymous memory is filled by this page server once the job runs,
    /// page by page as the job touches it and in the background (see [`ckpt_core::lazy`]).
    pub lazy: Option<std::sync::Arc<ckpt_core::lazy::PageServer>>,
    /// The restart runs in another boot than the checkpoint (`identity::Place`): a file is the
    /// one the job had by its inode, device numbers being this boot's.
    pub elsewhere: bool,
}

/// The file rights the restorer takes for a process it rebuilds: those its main thread had at
/// the checkpoint (ckpt_core::fsid), unless `as_root`.
pub fn files_identity(rec: &ckpt_core::objects::ProcessRecord, as_root: bool) -> Option<FsIdentity> {
    if as_root {
        return None;
    }
    rec.threads.iter().find(|t| t.tid == rec.pid).map(|t| FsIdentity::of(&t.creds))
}

/// Where a server end of a connection between nodes listens at a restart: (server's old
/// address, client's old address, address now).
pub type Listening = ckpt_core::objects::tcp_reconnect::Listening;

/// The TCP connections of a generation's other nodes, by (local, remote) as seen there, and
/// their listening addresses.
#[derive(Debug, Clone, Default)]
pub struct OtherNodesTcp {
    pub connections: std::collections::HashMap<(ckpt_core::objects::inet::Addr, ckpt_core::objects::inet::Addr), ckpt_core::objects::tcp::Connection>,
    pub listeners: Vec<ckpt_core::objects::inet::Addr>,
}

/// The TCP connections and listeners of the other nodes of a generation, for
/// [`RestoreOptions::other_nodes_tcp`].
pub fn other_nodes_tcp<'a>(others: impl Iterator<Item = &'a NodeImage>) -> OtherNodesTcp {
    use ckpt_core::objects::{descriptor::FdKind, inet::InetRecord, tcp::TcpState};
    let mut out = OtherNodesTcp::default();
    for f in others.flat_map(|img| img.processes.iter().flat_map(|p| p.fds.iter())) {
        if let FdKind::Inet(InetRecord::Tcp(t)) = &f.kind {
            match &t.state {
                TcpState::Connected(c) => {
                    out.connections.insert((c.local, c.remote), (**c).clone());
                }
                TcpState::Listening { local, .. } => out.listeners.push(*local),
                TcpState::Closed { .. } | TcpState::Connecting { .. } => {}
            }
        }
    }
    out
}

/// The TCP connections of the other nodes of a generation, for [`RestoreOptions::other_nodes`].
pub fn other_nodes_connections<'a>(
    others: impl Iterator<Item = &'a NodeImage>,
) -> std::collections::HashSet<(ckpt_core::objects::inet::Addr, ckpt_core::objects::inet::Addr)> {
    others.flat_map(|img| ckpt_core::objects::tcp::connections(img.processes.iter().flat_map(|p| p.fds.iter()))).collect()
}

/// Whether this node's part restarts on another host than it ran on: the addresses its
/// connections to the job's other nodes (`other_nodes`, as seen from there) had here that are
/// not this host's (empty: it restarts where it ran).
pub fn moved_from(
    image: &NodeImage,
    other_nodes: &std::collections::HashSet<(ckpt_core::objects::inet::Addr, ckpt_core::objects::inet::Addr)>,
) -> Vec<std::net::IpAddr> {
    let mine = ckpt_core::objects::tcp::connections(image.processes.iter().flat_map(|p| p.fds.iter()));
    let mut old: Vec<std::net::IpAddr> = mine
        .into_iter()
        .filter(|(local, remote)| other_nodes.contains(&(*remote, *local)))
        .map(|(local, _)| local)
        .filter(|local| !ckpt_core::objects::tcp_reconnect::bindable(local))
        .map(|local| local.ip)
        .collect();
    old.sort();
    old.dedup();
    old
}

/// The System V objects of each IPC namespace of the job with a process in it to act through
/// (host pid): the job's own with its init, then each namespace the job made with its maker.
fn ipc_namespace_holders<'a>(image: &'a NodeImage, init: Tid, tasks: &BTreeMap<Tid, RemoteTask>) -> Result<Vec<(&'a SysvIpcRecord, Tid)>> {
    let mut holders = vec![(&image.sysvipc, init)];
    for (_, ns) in image.ipc.made() {
        let maker = ns.pids[0];
        holders.push((&ns.state, tasks.get(&maker).ok_or_else(|| Error::not_created(maker))?.pid));
    }
    Ok(holders)
}

/// Rebuilds every process of `image` from the chunk files in `chunks_dir`.
///
/// `rebuilt` is called once every process is rebuilt, before any TCP connection leaves repair
/// mode (which sends a window probe to its peer): a job spread over nodes waits there until every
/// node has rebuilt its ends of their connections.
pub fn restore(
    image: &NodeImage,
    chunks_dir: &Path,
    spawner: &mut dyn Spawner,
    options: &RestoreOptions,
    rebuilt: &mut dyn FnMut() -> Result<()>,
    exchange: &mut dyn FnMut(Vec<Listening>) -> Result<Vec<Listening>>,
) -> Result<Restored> {
    let mut tracees = tracees::Tracees::default();
    let tree::Created { mut tasks, mut pid_setter } = tree::create(image, spawner, &mut tracees)?;
    // System V IPC objects, at their ids in the job's new IPC namespace (the init's) and in
    // each one the job made (its maker's), before any process attaches a segment.
    let ipc_holders = ipc_namespace_holders(image, spawner.init_pid(), &tasks)?;
    for (objects, holder) in &ipc_holders {
        ckpt_core::objects::sysvipc::restore(objects, *holder)?;
    }
    // Each process in the cgroups the job made, before its memory is filled (charged there).
    ckpt_core::objects::cgroups::restore(&image.cgroups, spawner.init_pid(), |pid| tasks.get(&pid).map(|t| t.pid)).map_err(|e| e.in_stage(Stage::Job))?;
    let mut fds = descriptor::RestoreCtx::new(image.processes.iter().map(|p| p.fds.as_slice()));
    fds.elsewhere = options.elsewhere;
    fds.cpu = image.cpu.clone();
    fds.inet.tcp_established = options.tcp_established;
    fds.inet.other_nodes = options.other_nodes.clone();
    fds.inet.nodes_moved = options.nodes_moved;
    fds.inet.readdressed = options.readdressed.iter().copied().collect();
    // Without TCP repair mode, connections to the other nodes are made again first, by the
    // restorer: no process waits on another node while it is half rebuilt.
    ckpt_core::objects::tcp_reconnect::connect_across_nodes(
        &mut fds.inet,
        image.processes.iter().flat_map(|p| p.fds.iter()),
        &options.other_nodes_tcp.connections,
        &options.other_nodes_tcp.listeners,
        exchange,
    )
    .map_err(|e| e.in_stage(Stage::Job))?;
    let mem = memory::MemRestoreCtx::new(image.processes.iter().flat_map(|p| p.vmas.iter()))
        .with_descriptors(image.processes.iter().flat_map(|p| p.fds.iter()), image.processes.iter().filter_map(|p| p.attrs.exe.deleted.as_ref()));
    fds.mapped_files = mem.mapped_files();
    let mut restored = Restored { threads: Vec::new(), tracees, host_pids: Vec::new(), stopping: Vec::new(), bytes: 0 };
    let in_context = |pid: Tid| {
        move |e: Error| match e {
            Error::Io(_) => Error::Restore { stage: Stage::Process(pid), inner: Box::new(e) },
            other => other.in_stage(Stage::Process(pid)),
        }
    };
    let listing = ChunkListing::read(chunks_dir, None)?;
    // The in-memory files the image holds, written before any process maps or opens one: the
    // process that saved a file is not always rebuilt before the others that use it.
    for rec in image.processes.iter().filter(|p| p.vmas.iter().any(|v| memory::saved_file(v).is_some())) {
        let task = tasks.get(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
        let mut reader = listing.open(rec.pid as u32)?;
        memory::restore_saved_files(task.pid, &rec.vmas, &mut reader, files_identity(rec, options.as_root).as_ref()).map_err(in_context(rec.pid))?;
    }
    let mut earlier_listings: BTreeMap<u64, ChunkListing> = Default::default();
    // The next process's stream, being read and checked while this one is rebuilt (not for a
    // lazy restart, whose fill reads pages in the order the job touches them).
    let mut next: Option<StreamReader> = None;
    for (k, rec) in image.processes.iter().enumerate() {
        let task = tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
        let mut reader = match next.take() {
            Some(reader) => reader,
            None => listing.open(rec.pid as u32)?,
        };
        if let Some(after) = image.processes.get(k + 1).filter(|_| options.lazy.is_none()) {
            let mut ahead = listing.open(after.pid as u32)?;
            ahead.read_ahead();
            next = Some(ahead);
        }
        if reader.len() != rec.stream_len {
            return Err(Error::Damaged { what: format!("pid {}: the chunk files hold {} bytes, the record says {}", rec.pid, reader.len(), rec.stream_len) });
        }
        let mut earlier = std::collections::BTreeMap::new();
        for g in rec.vmas.iter().flat_map(|v| v.earlier.iter().map(|e| e.generation)) {
            if let std::collections::btree_map::Entry::Vacant(slot) = earlier.entry(g) {
                let dir = options
                    .earlier_chunks
                    .get(&g)
                    .ok_or_else(|| Error::Bug(format!("pid {}: pages of generation {g}, which the restart was not given", rec.pid)))?;
                let listed = match earlier_listings.entry(g) {
                    std::collections::btree_map::Entry::Occupied(listed) => listed.into_mut(),
                    std::collections::btree_map::Entry::Vacant(new) => new.insert(ChunkListing::read(dir, None)?),
                };
                slot.insert(listed.open(rec.pid as u32)?);
            }
        }
        let (threads, bytes) = process::rebuild(
            rec,
            task,
            (&mut reader, &mut earlier),
            &mut fds,
            &mem,
            &mut restored.tracees,
            &options.progress,
            (files_identity(rec, options.as_root).as_ref(), image.users.numbering_of(rec.pid)),
            options.lazy.as_deref(),
            pid_setter.as_mut(),
        )
        .map_err(in_context(rec.pid))?;
        info!(pid = rec.pid, host_pid = task.pid, bytes, stops = task.main.stops(), "process rebuilt");
        restored.threads.extend(threads);
        restored.host_pids.push((rec.pid, task.pid));
        if rec.signals.stops() {
            restored.stopping.push(task.pid);
        }
        restored.bytes += bytes;
    }
    if let Some(setter) = pid_setter {
        setter.end(&mut tasks, &mut restored.tracees)?;
    }
    // Files of the job's /proc that name a thread, now that every thread exists.
    for rec in &image.processes {
        let task = tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
        fd::restore_thread_proc_files(task, rec.pid, &mut fds, 0).map_err(in_context(rec.pid))?;
    }
    // Connections that were waiting in a listener's backlog, now that every listener exists.
    for (pid, fd, listener) in fds.unix.take_connects() {
        let task = tasks.get_mut(&pid).ok_or_else(|| Error::not_created(pid))?;
        ckpt_core::objects::unix::connect_pending(task, fd, &listener).map_err(in_context(pid))?;
    }
    // Messages carrying descriptors back in their queues, now that every descriptor exists.
    let tables: Vec<(Tid, &[descriptor::FdRecord])> = image.processes.iter().map(|p| (p.pid, p.fds.as_slice())).collect();
    ckpt_core::objects::unix::send_carried(&mut fds, &tables, &mut tasks).map_err(|e| e.in_stage(Stage::Job))?;
    // Socket files made for names the checkpoint found without one, no longer needed.
    ckpt_core::objects::unix::remove_names_gone(&mut fds, &mut tasks).map_err(|e| e.in_stage(Stage::Job))?;
    // Controlling terminals, now that every process holds its descriptors and every group exists.
    for rec in &image.processes {
        if let Some(ctty) = &rec.ctty {
            let task = tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
            ckpt_core::objects::pty::restore_ctty(task, rec.pid, &tables, ctty, 0).map_err(in_context(rec.pid))?;
        }
    }
    // Descriptors of /dev/tty, now that the sessions have their terminals.
    for rec in &image.processes {
        let task = tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
        fd::restore_tty_files(task, rec.pid, &mut fds, 0).map_err(in_context(rec.pid))?;
    }
    rebuilt()?;
    // TCP connections out of repair mode (or made again), queued datagrams sent again.
    ckpt_core::objects::inet::finish(&mut fds.inet).map_err(|e| e.in_stage(Stage::Job))?;
    // Descriptors kept for other processes to take are not the job's: close them.
    for (pid, fd) in fds.take_parked() {
        tasks.get_mut(&pid).ok_or_else(|| Error::not_created(pid))?.syscall("close", libc::SYS_close, &[fd])?;
    }
    // POSIX message queues: notifications registered again (any close of a queue's descriptor
    // by the process that registered drops its registration, so after every move and close)
    // and unlinked queues unlinked again, now that every holder has them open.
    for rec in &image.processes {
        let task = tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?;
        ckpt_core::objects::mqueue::finish(task, rec.pid, &rec.fds, &mut fds.mqueues, 0).map_err(in_context(rec.pid))?;
    }
    for (objects, holder) in &ipc_holders {
        ckpt_core::objects::sysvipc::remove_destroyed(objects, *holder)?;
    }
    // Descriptors' owners, set once per open file description by its first holder.
    let mut owners_done = std::collections::HashSet::new();
    for rec in &image.processes {
        process::finish(rec, tasks.get_mut(&rec.pid).ok_or_else(|| Error::not_created(rec.pid))?, image.users.numbering_of(rec.pid), &mut owners_done)
            .map_err(in_context(rec.pid))?;
    }
    Ok(restored)
}
