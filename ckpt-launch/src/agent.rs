//! The node agent inside `ckpt launch` and `ckpt restart`: it owns the node's buffer pool and
//! does its node's part of every generation, split at the coordinator's barrier
//! (docs/PROTOCOL.md): `prepare` (freeze + capture), `release` (resume, or hold for `--kill`),
//! `persist` (wait until durable, write `<node>/procs.bin`), then `commit` or `abort`.
//!
//! Every command of one generation must run on the same thread: the thread that freezes the
//! tree is its ptrace tracer until it releases it. The embedded coordinator calls a
//! [`LocalAgent`] on the thread that runs the checkpoint; a joined agent runs the coordinator's
//! commands on the one thread that reads them ([`follow_coordinator`]).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::remote::send_frame;
use ckpt_coord::testhook::die_at;
use ckpt_coord::wire::{read_frame, AgentCommand, AgentReply, Frame, GpuUse, Persisted, TcpEnd, TcpRefill, LOST_AFTER};
use ckpt_coord::Phase;
use ckpt_coord::{AgentHandle, AgentLost};
use ckpt_core::capture::increments::{Increments, Tracking};
use ckpt_core::capture::{self, later, FrozenTree};
use ckpt_core::gpu;
use ckpt_core::image::{CheckpointDir, NodePart};
use ckpt_core::objects::file::StdioIds;
use ckpt_core::objects::files_state::{self, under, FilesRecord, Kind};
use ckpt_core::objects::mounts;
use ckpt_core::objects::protect::{self, RootState, Store};
use ckpt_core::pool::{Batch, Pool};
use ckpt_core::ptrace::Tid;
use ckpt_core::snapshot::{MainEnd, NodeImage};
use tracing::{info, warn};

use crate::CopyMemory;

/// Free chunks of the pool whose memory stays faulted in between checkpoints (one: 16 MiB by
/// default, enough for a small job's next checkpoint to start without faults).
const IDLE_CHUNKS_KEPT: usize = 1;

pub struct NodeAgent {
    pub dir: CheckpointDir,
    pub node: String,
    /// Host pid of the job's init.
    pub init_pid: Tid,
    /// The job's mount table as its init set it up (`JobInit::mounts_baseline`).
    pub mounts_baseline: Vec<ckpt_core::objects::mounts::MountInfo>,
    /// Pid, inside the job, of the main process.
    pub main_pid: Tid,
    pub pool: Pool,
    pub stdio: StdioIds,
    /// `--tcp-established`: a kill after a checkpoint closes connections to peers outside the job
    /// silently (the restarted job takes them over).
    pub tcp_established: bool,
    /// The job's files kept consistent with memory at restart (docs/USER-GUIDE.md, "Files at
    /// restart"): protected roots, `--save-files`, the last committed state, where copies go.
    pub files: FilesPolicy,
    /// The node-local level (`ckpt coordinator --local-dir`): this node's parts are written
    /// here, on its own storage, and only their records into `dir` as well. `None`: into `dir`.
    pub local: Option<CheckpointDir>,
    /// The data port where this node keeps other nodes' parts, and the job's secret for
    /// handing its own to them (`--redundancy partner`).
    pub data: Option<(crate::transfer::DataServer, String)>,
    /// `--copy-memory`: when private memory is copied: before the freeze
    /// (`ckpt_core::capture::ahead`), after the release from copies of the processes forked at
    /// the freeze (`ckpt_core::capture::later`), or while frozen.
    pub copy_memory: crate::CopyMemory,
    /// The generation this node is taking part in, between `prepare` and `commit`/`abort`.
    current: Option<InFlight>,
    /// The generation whose memory `copy_ahead` copied, until `freeze` or `prepare` freezes it.
    begun: Option<(u64, Begun)>,
    /// The generation frozen by `freeze`, until `prepare` captures it.
    frozen: Option<Frozen>,
    /// Set from a freeze until the job runs again: copies to the global level wait meanwhile.
    checkpointing: Arc<AtomicBool>,
    /// The connection to the coordinator, for what the agent says unasked (`flushed`).
    pub reports: Option<Arc<Mutex<ckpt_coord::secure::ChannelWriter>>>,
    /// The writes of the job's processes tracked since the last committed generation, for
    /// the next to be incremental (`ckpt_core::capture::increments`).
    tracking: Tracking,
    /// Set when the main process has ended and the job goes on with the daemons it left (see
    /// the job's init): recorded in every image from then on.
    pub main_end: Arc<Mutex<Option<MainEnd>>>,
    /// The contents of the files the job only reads, computed once each after a release
    /// (`identity::record`), for a restart on another machine.
    identities: ckpt_core::objects::identity::Cache,
    /// The job's CUDA processes with their GPU state moved into their memory for the
    /// generation (`None` inside: the job has none), from its first step until `prepare` takes
    /// them into its part.
    gpu: Option<(u64, Option<gpu::Suspended>)>,
}

/// A generation's part begun on this node before its freeze: where it goes, and the memory
/// copied into it while the job ran (`--copy-memory ahead`).
struct Begun {
    part: NodePart,
    batch: Batch,
    /// How long the copy froze the job to make tracking contexts, and the bytes it copied.
    frozen_before: Duration,
    copied_ahead: u64,
}

/// A generation frozen by `freeze` (jobs spread over nodes), until `prepare` captures it.
struct Frozen {
    generation: u64,
    begun: Begun,
    tree: FrozenTree,
    t_freeze: Instant,
}

/// This node's part of a generation in progress.
struct InFlight {
    generation: u64,
    part: NodePart,
    /// Until `persist`.
    batch: Option<Batch>,
    /// Until `release` (or `commit`, when held for `--kill`).
    tree: Option<FrozenTree>,
    /// Memory to copy after the release, until `release` starts it (`copying`) or `persist`
    /// does it; then, until `persist`, the copy under way.
    later: Option<later::Pending>,
    copying: Option<later::Copying>,
    /// Until `persist`.
    image: Option<NodeImage>,
    /// Until `persist`: the files record, and the copies of protected files to make durable.
    files: Option<(FilesRecord, Vec<std::path::PathBuf>)>,
    /// From `persist`: the part's files as listed for the manifest.
    persisted: Vec<ckpt_core::image::FileEntry>,
    /// The protected roots' state, the previous state of the next generation once committed.
    protected: Vec<RootState>,
    /// The write tracking for the next generation, kept once this one is committed.
    tracking: Tracking,
    t_freeze: Instant,
    /// The mappings' flags read before the freeze, checked after the release.
    flags_check: capture::FlagsCheck,
    /// Bytes of memory copied before the freeze.
    copied_ahead: u64,
    /// From `persist`: the files in job directories under /dev/shm (`crate::mpi::JobDir`) whose
    /// contents the image holds (path, device, inode), which a restart writes again.
    saved_in_job_dirs: Vec<(String, u64, u64)>,
    /// The CUDA processes, until the release gives them their GPU back (or the commit kills
    /// them, held for `--kill`).
    gpu: Option<gpu::Suspended>,
    /// What was done with them, for the coordinator (none without CUDA processes).
    gpu_use: Option<GpuUse>,
}

/// What the agent does with the job's files at every checkpoint.
#[derive(Debug, Clone)]
pub struct FilesPolicy {
    /// `--protect DIR`: absolute paths.
    pub protect: Vec<String>,
    /// `--save-files`: every regular file open for writing is a protected root of its own.
    pub save_files: bool,
    /// The protected roots' state at the last committed generation (or the copy made at launch):
    /// a file whose state is the same there is not copied again.
    pub previous: Vec<RootState>,
    pub store: Store,
    /// Files whose changes are not the job's state: the image directory and the store.
    pub ignored: Vec<(u64, u64)>,
}

impl FilesPolicy {
    pub fn new(dir: &std::path::Path, node: &str, protect: Vec<String>, save_files: bool) -> FilesPolicy {
        use std::os::unix::fs::MetadataExt;
        let store = Store::of(dir, node);
        let ignored = [dir, store.dir.as_path()].iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| (m.dev(), m.ino())).collect();
        FilesPolicy { protect, save_files, previous: Vec::new(), store, ignored }
    }

    /// The protected roots of this checkpoint: the --protect directories, the job's directories
    /// under /dev/shm that it holds files in (`crate::mpi::JobDir`), and with --save-files the
    /// files open for writing that are not under one (pure but for the record).
    ///
    /// A job directory is in memory: on a spare node, or after a reboot, it is gone, and the
    /// files in it the image does not hold (Open MPI's session: mpirun's hwloc topology, its
    /// contact file) would refuse the restart there. As a protected root it comes back whole;
    /// the shared memory in it the image holds is left to the memory restore (see `capture`).
    fn roots(&self, files: &FilesRecord) -> Vec<String> {
        let mut roots = self.protect.clone();
        let held = files.watched.iter().map(|w| w.path.as_str()).chain(files.listings.iter().map(|l| l.dir.as_str()));
        for dir in held.filter_map(crate::mpi::job_dir_of) {
            if !roots.iter().any(|r| under(dir, r)) {
                roots.push(dir.to_string());
            }
        }
        if self.save_files {
            for w in files.watched.iter().filter(|w| w.writable && w.stat.kind == Kind::File) {
                if !roots.iter().any(|r| under(&w.path, r)) {
                    roots.push(w.path.clone());
                }
            }
        }
        roots
    }

    /// Records the job's files while it is frozen (and copies what changed in protected roots).
    fn capture(
        &self,
        processes: &[ckpt_core::objects::ProcessRecord],
        job: &[i32],
        mounts: &mounts::MountsRecord,
        stdio: &StdioIds,
        tag: &str,
    ) -> ckpt_core::Result<(FilesRecord, protect::Captured)> {
        let t = Instant::now();
        let mut ignored = self.ignored.clone();
        ignored.extend(stdio.0.iter().flatten().copied());
        // The in-memory files the image holds (written back by the memory restore) are not
        // copied again as protected files.
        ignored.extend(files_state::saved_in_image(processes));
        let mut files = files_state::capture(processes, job, mounts, ignored.clone())?;
        let mapped = files_state::uses(processes, mounts).into_iter().filter(|u| u.mapped_writable).map(|u| (u.dev, u.ino)).collect();
        let cap = protect::capture(&self.roots(&files), &self.previous, &self.store, tag, &ignored, &mapped)?;
        files.protected = cap.states.clone();
        tracing::info!(
            watched = files.watched.len(),
            listed = files.listings.len(),
            protected_entries = cap.entries,
            copied = cap.new_copies.len(),
            bytes_copied = cap.bytes_copied,
            ms = t.elapsed().as_secs_f64() * 1e3,
            "files recorded"
        );
        Ok((files, cap))
    }

    /// The first copy of protected directories that have none yet (at launch, before the job
    /// starts; at a restart given new --protect directories), so that a freeze copies only what
    /// changed since. Safe while the job runs: each entry is stat'ed before it is copied, so a
    /// file changed during the copy shows a newer stat at the freeze and is copied again there.
    pub fn copy_new_roots(&mut self) -> Result<()> {
        let new: Vec<String> = self.protect.iter().filter(|r| !self.previous.iter().any(|p| &p.root == *r)).cloned().collect();
        if new.is_empty() {
            return Ok(());
        }
        let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        let t = Instant::now();
        let cap = protect::capture(&new, &[], &self.store, &format!("first{ms}"), &self.ignored, &Default::default())?;
        protect::sync(&self.store, &cap.new_copies)?;
        tracing::info!(entries = cap.entries, bytes = cap.bytes_copied, ms = t.elapsed().as_secs_f64() * 1e3, "protected directories copied");
        self.previous.extend(cap.states);
        Ok(())
    }
}

impl NodeAgent {
    pub fn new(dir: CheckpointDir, node: String, init_pid: Tid, main_pid: Tid, pool: Pool) -> NodeAgent {
        let files = FilesPolicy::new(dir.root(), &node, Vec::new(), false);
        NodeAgent {
            dir,
            node,
            init_pid,
            mounts_baseline: Vec::new(),
            main_pid,
            pool,
            stdio: StdioIds::of_self(),
            tcp_established: false,
            files,
            local: None,
            copy_memory: Default::default(),
            data: None,
            current: None,
            begun: None,
            frozen: None,
            checkpointing: Default::default(),
            reports: None,
            tracking: Tracking::default(),
            main_end: Default::default(),
            identities: Default::default(),
            gpu: None,
        }
    }

    /// Runs one command of the coordinator. A failure releases the job and drops the node's part
    /// at once (the coordinator's `abort` then finds nothing to do).
    pub fn execute(&mut self, cmd: AgentCommand) -> AgentReply {
        let generation = cmd.generation();
        let result = match cmd {
            AgentCommand::CopyAhead { base, .. } => self.copy_ahead(generation, base),
            AgentCommand::Freeze { .. } => self.freeze(generation),
            AgentCommand::Prepare { hold, base, track, last_try, .. } => self.prepare(generation, hold, base, track, last_try),
            AgentCommand::Release { hold, .. } => self.release(generation, hold),
            AgentCommand::Persist { .. } => self.persist(generation),
            AgentCommand::Commit { flush, .. } => self.commit(generation, flush),
            AgentCommand::Abort { .. } => {
                self.abort();
                Ok(AgentReply::Done { generation })
            }
            AgentCommand::Drain { ends, last, .. } => self.drain(generation, &ends, last),
            AgentCommand::Refill { refills, .. } => self.refill(generation, &refills),
            AgentCommand::Replicate { copies, .. } => self.replicate(generation, &copies),
            AgentCommand::Parity { groups, .. } => self.parity(generation, &groups),
        };
        result.unwrap_or_else(|e| {
            self.abort();
            let passing = e.chain().any(|c| c.downcast_ref::<ckpt_core::Error>().is_some_and(ckpt_core::Error::is_passing));
            AgentReply::Failed { generation, message: format!("{e:#}"), passing }
        })
    }

    /// Opens this node's part of `generation`.
    fn begin(&self, generation: u64) -> Result<Begun> {
        let part = match &self.local {
            Some(local) => local.local_node_part(generation, &self.node)?,
            None => self.dir.node_part(generation, &self.node)?,
        };
        let batch = self.pool.batch(&part.chunks_dir()?);
        Ok(Begun { part, batch, frozen_before: Duration::ZERO, copied_ahead: 0 })
    }

    /// Freezes the job for `generation`, into the part `copy_ahead` began for it (or a new
    /// one); returns the part, the tree, and when the job was frozen, counting the moment the
    /// copy froze it to make tracking contexts (frozen time is what the job feels).
    fn freeze_begun(&mut self, generation: u64) -> Result<(Begun, FrozenTree, Instant)> {
        let begun = match self.begun.take() {
            Some((g, begun)) if g == generation => begun,
            _ => self.begin(generation)?,
        };
        if let Err(e) = self.suspend_gpu(generation) {
            // The streams copied into go with the tracking.
            self.tracking = Tracking::default();
            begun.abandon(generation);
            return Err(e);
        }
        match capture::freeze(self.init_pid) {
            Ok(tree) => {
                let t = tree.frozen_at();
                let t_freeze = t.checked_sub(begun.frozen_before).unwrap_or(t);
                Ok((begun, tree, t_freeze))
            }
            Err(e) => {
                // The streams copied into go with the tracking.
                self.tracking = Tracking::default();
                begun.abandon(generation);
                self.resume_gpu();
                Err(e.into())
            }
        }
    }

    /// Before `generation`'s freeze: the job's CUDA processes have the NVIDIA driver lock
    /// their CUDA calls and move their GPU state into their memory (`ckpt_core::gpu`), once per
    /// generation. Nothing happens for a job without one.
    fn suspend_gpu(&mut self, generation: u64) -> Result<()> {
        if self.gpu.as_ref().is_some_and(|(g, _)| *g == generation) {
            return Ok(());
        }
        self.resume_gpu();
        let holders = gpu::holders(&capture::descendants(self.init_pid)?);
        if holders.is_empty() {
            self.gpu = Some((generation, None));
            return Ok(());
        }
        let node = &self.node;
        let driver = gpu::driver_for(holders.iter().map(|h| h.pid), &format!("their GPU state cannot be checkpointed on node {node}"))?;
        let suspended = gpu::Suspended::suspend(driver, &holders, gpu::lock_timeout()).with_context(|| format!("before the freeze on node {node}"))?;
        self.gpu = Some((generation, Some(suspended)));
        Ok(())
    }

    /// Gives a suspension not taken into a generation's part its GPU back (the job runs).
    fn resume_gpu(&mut self) {
        if let Some((generation, Some(suspended))) = self.gpu.take() {
            if let Err(e) = suspended.resume() {
                warn!(generation, "giving the job's CUDA processes their GPU back: {e}");
            }
        }
    }

    /// With `--copy-memory ahead`, copies the job's memory into this node's part of
    /// `generation` while it runs, its writes tracked from before (see
    /// `ckpt_core::capture::ahead`); the freeze then stores what was written since.
    fn copy_ahead(&mut self, generation: u64, base: Option<u64>) -> Result<AgentReply> {
        // A generation the coordinator never finished (it died) is dropped first.
        self.abort();
        self.checkpointing.store(true, Relaxed);
        let mut begun = self.begin(generation)?;
        // First, so that the copy takes the host copy of the GPU's memory while the job runs.
        if let Err(e) = self.suspend_gpu(generation) {
            begun.abandon(generation);
            return Err(e);
        }
        // A job whose CUDA processes the driver holds is waiting for its GPU: their CUDA calls
        // are locked until the release. A copy now would make that wait longer by the copy of
        // the GPU's memory (at the pool's or the disk's pace); at the freeze, a fork of each
        // process takes its memory in the time of copying its page tables, and the copy is
        // made from the fork after the release (`capture::later`), the GPU given back meanwhile.
        let gpu_held = self.gpu.as_ref().is_some_and(|(_, s)| s.as_ref().is_some_and(gpu::Suspended::holds_processes));
        if self.copy_memory == CopyMemory::Ahead && !gpu_held {
            match capture::ahead::copy_ahead(self.init_pid, &begun.batch, &mut self.tracking, generation, base) {
                Ok(report) => (begun.frozen_before, begun.copied_ahead) = (report.frozen, report.bytes),
                Err(e) => {
                    // The streams copied into, not finished, go with the tracking (which listed
                    // the pages written since the base: the next generation is whole).
                    self.tracking = Tracking::default();
                    begun.abandon(generation);
                    return Err(e).context(format!("copying memory before the freeze on node {}", self.node));
                }
            }
        }
        self.begun = Some((generation, begun));
        Ok(AgentReply::Done { generation })
    }

    /// The first step when the job spans nodes: freeze, and read the TCP send queues while
    /// no node has read a receive queue yet.
    fn freeze(&mut self, generation: u64) -> Result<AgentReply> {
        // Taken before `abort`, which would end them.
        let begun = self.begun.take_if(|b| b.0 == generation);
        let gpu = self.gpu.take_if(|g| g.0 == generation);
        // A generation the coordinator never finished (it died) is dropped first.
        self.abort();
        (self.begun, self.gpu) = (begun, gpu);
        self.checkpointing.store(true, Relaxed);
        let (begun, tree, t_freeze) = self.freeze_begun(generation)?;
        // From here on `abort` ends what was begun.
        let frozen = self.frozen.insert(Frozen { generation, begun, tree, t_freeze });
        let tree = &mut frozen.tree;
        tree.snapshot_send_queues().with_context(|| format!("reading the TCP send queues on node {}", self.node))?;
        let tcp_ends = tree
            .tcp_ends_off_node()
            .with_context(|| format!("listing the TCP connections to other nodes on node {}", self.node))?
            .into_iter()
            .map(|(local, remote, fin_sent)| TcpEnd { local, remote, fin_sent })
            .collect();
        Ok(AgentReply::Frozen { generation, tcp_ends })
    }

    /// Without TCP repair mode: one round of draining the connections between nodes (see
    /// `ckpt_core::objects::tcp_reconnect::CrossNode`).
    fn drain(&mut self, generation: u64, ends: &[TcpEnd], last: bool) -> Result<AgentReply> {
        let node = self.node.clone();
        let tree = &mut self
            .frozen
            .as_mut()
            .filter(|f| f.generation == generation)
            .ok_or_else(|| anyhow!("node {node}: drain of generation {generation}, which it has not frozen"))?
            .tree;
        let ends: Vec<_> = ends.iter().map(|e| (e.local, e.remote, e.fin_sent)).collect();
        let (outq, refills) = tree.drain_across_nodes(&ends, last).with_context(|| format!("draining the TCP connections to other nodes on node {node}"))?;
        let refills = refills.into_iter().map(|(local, remote, data)| TcpRefill { local, remote, data }).collect();
        Ok(AgentReply::Drained { generation, outq, refills })
    }

    /// Writes back what other nodes drained from this node's connections.
    fn refill(&mut self, generation: u64, refills: &[TcpRefill]) -> Result<AgentReply> {
        let node = self.node.clone();
        let tree = &self
            .frozen
            .as_ref()
            .filter(|f| f.generation == generation)
            .ok_or_else(|| anyhow!("node {node}: refill of generation {generation}, which it has not frozen"))?
            .tree;
        let refills: Vec<_> = refills.iter().map(|r| (r.local, r.remote, r.data.clone())).collect();
        tree.refill_across_nodes(&refills).with_context(|| format!("writing back drained TCP bytes on node {node}"))?;
        Ok(AgentReply::Done { generation })
    }

    fn prepare(&mut self, generation: u64, hold: bool, base: Option<u64>, track: bool, last_try: bool) -> Result<AgentReply> {
        die_at(Phase::Prepare, generation);
        // Taken before `abort`, which would end them.
        let frozen = self.frozen.take_if(|f| f.generation == generation);
        let begun = self.begun.take_if(|b| b.0 == generation);
        let gpu = self.gpu.take_if(|g| g.0 == generation);
        // A generation the coordinator never finished (it died) is dropped first.
        self.abort();
        (self.begun, self.gpu) = (begun, gpu);
        self.checkpointing.store(true, Relaxed);
        // Held for `--kill`, the job never runs again: nothing to gain by copying before the
        // freeze or after the release, or by tracking writes for a next generation.
        let copy_later = self.copy_memory != CopyMemory::Frozen && !hold;
        // Frozen time is what the application feels: from the freeze to the release, and the
        // moment a copy ahead froze it to make its tracking contexts.
        let (begun, mut tree, t_freeze) = match frozen {
            Some(Frozen { begun, tree, t_freeze, .. }) => (begun, tree, t_freeze),
            None => self.freeze_begun(generation)?,
        };
        let Begun { part, batch, copied_ahead, .. } = begun;
        let tracking = std::mem::take(&mut self.tracking);
        if hold {
            tree.forget_flags_ahead();
            if self.tcp_established {
                tree.lock_outside_connections();
            }
        }
        if last_try {
            tree.last_try();
        }
        if let Some((_, Some(suspended))) = self.gpu.as_ref().filter(|g| g.0 == generation) {
            tree.gpu_left_alone(&suspended.left_alone);
        }
        let init_pid = self.init_pid;
        let baseline = &self.mounts_baseline;
        let (files_policy, stdio) = (&self.files, &self.stdio);
        let mut increments = Increments::new(tracking, base, track && !hold);
        let captured = tree.capture(&batch, &self.stdio, copy_later, &mut increments).and_then(|p| {
            if p.is_empty() {
                return Err(ckpt_core::Error::NothingToCheckpoint);
            }
            let members = ckpt_core::objects::namespaces::members(&tree.ns_pids(), &p);
            let mut mounts = mounts::capture(init_pid, baseline, &members)?;
            let (users, user_ids) = ckpt_core::objects::user_namespaces::capture(init_pid, &members, &mut mounts)?;
            let owners = ckpt_core::objects::namespaces::UserNamespaces { record: &users, ids: &user_ids };
            let uts = ckpt_core::objects::uts::capture(init_pid, &members, &owners, |pid| tree.uts_names(pid))?;
            // While the job is frozen: the files as they are at the same moment as its memory.
            let files = files_policy.capture(&p, &tree.pids(), &mounts, stdio, &format!("g{generation}"))?;
            let zombies = tree.zombies()?;
            // A tree the restart could not make again is refused now, while the job can go on.
            restart_tool::check_tree(&p, &zombies)?;
            let ipc = ckpt_core::objects::sysvipc::capture(init_pid, &members, &owners, &p)?;
            let net = ckpt_core::objects::net_namespaces::capture(init_pid, &members, &owners, &*tree.networks()?)?;
            ckpt_core::objects::net_namespaces::check_addresses_apart(&p, &net)?;
            tracing::debug!(ms = tree.frozen_at().elapsed().as_secs_f64() * 1e3, "the job's other objects captured");
            Ok((p, zombies, ipc, files, (mounts, users, uts, net)))
        });
        let (mut processes, zombies, (sysvipc, ipc), (files, copies), (mounts, users, uts, net)) = match captured {
            Ok(p) => p,
            Err(e) => {
                drop(tree);
                // Its streams copied before the freeze, not finished, fail the batch.
                drop(increments);
                let _ = batch.wait_durable();
                let _ = part.abandon();
                return Err(e).context(format!("capture on node {}", self.node));
            }
        };
        let gpu = self.gpu.take().filter(|(g, _)| *g == generation).and_then(|(_, s)| s);
        if let Some(suspended) = &gpu {
            for (pid_in_job, record) in suspended.records() {
                if let Some(p) = processes.iter_mut().find(|p| p.pid == pid_in_job) {
                    p.cuda = Some(record);
                }
            }
        }
        let gpu_use = gpu.as_ref().map(|s| GpuUse { ms: s.suspend_ms, bytes: s.bytes, failed: None });
        let threads = processes.iter().map(|p| p.threads.len()).sum();
        let main_end = *self.main_end.lock().unwrap_or_else(|p| p.into_inner());
        let mut cgroups = tree.take_cgroups();
        cgroups.keep_only(&processes.iter().map(|p| p.pid).collect::<Vec<_>>());
        let image = NodeImage {
            node: self.node.clone(),
            main_pid: self.main_pid,
            processes,
            zombies,
            sysvipc,
            clocks: Some(tree.clocks()),
            main_end,
            mounts,
            users,
            uts,
            ipc,
            net,
            cpu: Some(ckpt_core::objects::cpu::CpuRecord::here().clone()),
            cgroups,
        };
        let count = image.processes.len();
        let protected = copies.states;
        let files = Some((files, copies.new_copies));
        let later = Some(tree.take_later()).filter(|l| !l.is_empty());
        let flags_check = tree.take_flags_check();
        self.current = Some(InFlight {
            generation,
            part,
            batch: Some(batch),
            tree: Some(tree),
            later,
            copying: None,
            image: Some(image),
            files,
            persisted: Vec::new(),
            protected,
            tracking: increments.into_next(),
            t_freeze,
            flags_check,
            copied_ahead,
            gpu,
            gpu_use,
            saved_in_job_dirs: Vec::new(),
        });
        die_at(Phase::Captured, generation);
        Ok(AgentReply::Captured { generation, processes: count, threads })
    }

    fn in_flight(&mut self, generation: u64) -> Result<&mut InFlight> {
        let node = &self.node;
        self.current
            .as_mut()
            .filter(|c| c.generation == generation)
            .ok_or_else(|| anyhow!("node {node} is not taking part in generation {generation} (protocol error)"))
    }

    /// With `hold` (`--kill`) the job stays frozen until the generation is safe, then dies: it
    /// never runs past the checkpoint. Otherwise it goes on now.
    fn release(&mut self, generation: u64, hold: bool) -> Result<AgentReply> {
        die_at(Phase::Release, generation);
        let checkpointing = self.checkpointing.clone();
        let cur = self.in_flight(generation)?;
        if !hold {
            if let Some(tree) = cur.tree.take() {
                tree.resume()?;
            }
            checkpointing.store(false, Relaxed);
        }
        let frozen_ms = cur.t_freeze.elapsed().as_secs_f64() * 1e3;
        if !hold {
            // Once the job runs (the driver's restore is done by a thread of the process).
            if let Some(suspended) = cur.gpu.take() {
                let report = cur.gpu_use.get_or_insert_with(GpuUse::default);
                match suspended.resume() {
                    Ok(ms) => report.ms = ms,
                    Err(e) => {
                        tracing::error!(generation, "{e}");
                        report.failed = Some(e.to_string());
                    }
                }
            }
        }
        // The job runs: its memory is copied from the copies forked at the freeze meanwhile.
        cur.copying = cur.later.take().map(later::Pending::start);
        if !hold {
            cur.tracking.untrack_shared();
        }
        Ok(AgentReply::Released { generation, frozen_ms })
    }

    fn persist(&mut self, generation: u64) -> Result<AgentReply> {
        die_at(Phase::Persist, generation);
        let node = self.node.clone();
        let mut identities = std::mem::take(&mut self.identities);
        let cur = self.in_flight(generation)?;
        std::mem::take(&mut cur.flags_check).confirm().with_context(|| format!("generation {generation} on node {node}"))?;
        let (mut image, batch) = cur.image.take().zip(cur.batch.take()).ok_or_else(|| anyhow!("generation {generation} persisted twice (protocol error)"))?;
        if let Some(copying) = cur.copying.take().or_else(|| cur.later.take().map(later::Pending::start)) {
            let copied = copying.wait().with_context(|| format!("generation {generation}"))?;
            later::fill_in(&mut image.processes, copied)?;
        }
        // Pages copied before the freeze and not written since are this generation's own.
        for p in &mut image.processes {
            ckpt_core::objects::memory::own_references_to_runs(&mut p.vmas, generation);
        }
        // The records are final: where each page is, for the next generation to refer to.
        let mut needs = std::collections::BTreeSet::new();
        for p in &image.processes {
            cur.tracking.set_content(p.pid, ckpt_core::objects::memory::content_of(&p.vmas, generation));
            needs.extend(p.vmas.iter().flat_map(|v| v.earlier.iter().map(|e| e.generation)));
        }
        cur.saved_in_job_dirs = crate::mpi::saved_files_in_job_dirs(&image.processes);
        let procs_entry = image.write(cur.part.node_dir());
        let (mut files_rec, copies) = cur.files.take().unwrap_or_default();
        // After the release: the job runs while its read-only files are identified (each once
        // for the life of this agent).
        let uses = ckpt_core::objects::files_state::uses(&image.processes, &image.mounts);
        let t_identify = Instant::now();
        files_rec.identities = ckpt_core::objects::identity::record(&uses, &mut identities);
        tracing::debug!(files = files_rec.identities.len(), ms = t_identify.elapsed().as_secs_f64() * 1e3, "identities of the files the job only reads");
        let files_entry = files_rec.write(cur.part.node_dir());
        let part_dir = cur.part.node_dir().to_path_buf();
        self.identities = identities;
        let synced = protect::sync(&self.files.store, &copies);
        let report = batch.wait_durable();
        let (procs_entry, files_entry, report) = match (procs_entry, files_entry, report) {
            (Ok(p), Ok(f), Ok(r)) => (p, f, r),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(e).context(format!("writing generation {generation} on node {}", self.node)),
        };
        synced.with_context(|| format!("writing the copies of protected files of generation {generation} on node {}", self.node))?;
        // The manifest lists the node's records and this index; the index, the rest of the
        // part (ckpt_core::image::index: the coordinator handles three files a node, not all).
        let index = ckpt_core::image::PartIndex { generation, node: self.node.clone(), files: report.files };
        let index_entry = index.write(&part_dir).with_context(|| format!("writing node {}'s index of generation {generation}", self.node))?;
        if self.local.is_some() {
            // Every host reads every node's records at a restart (TCP pairing): they go to the
            // shared directory too; the chunks stay here.
            let shared = self.dir.gen_dir(generation).join(&self.node);
            share_records(&part_dir, &shared)
                .with_context(|| format!("copying node {}'s records of generation {generation} to {}", self.node, shared.display()))?;
        }
        let listed = vec![procs_entry, files_entry, index_entry];
        let part_bytes = index.files.iter().map(|f| f.size).sum();
        let (mut copied_ahead, mut gpu) = (0, None);
        if let Ok(cur) = self.in_flight(generation) {
            // The whole part, in the index's order (the order of its XOR stream), then its
            // records: what partner copies, parity and the flush send.
            cur.persisted = index.files.into_iter().chain(listed.iter().cloned()).collect();
            copied_ahead = cur.copied_ahead;
            gpu = cur.gpu_use.clone().map(Box::new);
        }
        Ok(AgentReply::Persisted(Persisted {
            generation,
            files: listed,
            part_bytes,
            bytes_raw: report.bytes_raw,
            bytes_stored: report.bytes_stored,
            pool_wait_ms: report.wait_for_free_chunk.as_secs_f64() * 1e3,
            needs: needs.into_iter().collect(),
            copied_ahead,
            gpu,
        }))
    }

    /// Hands this node's part to the nodes that keep a copy of it (`copies` naming this node as
    /// `of`), each durable there before this returns.
    fn replicate(&mut self, generation: u64, copies: &[ckpt_coord::wire::PartCopy]) -> Result<AgentReply> {
        let node = self.node.clone();
        let secret =
            self.data.as_ref().map(|(_, s)| s.clone()).ok_or_else(|| anyhow!("node {node} has no data port (partner copies need a coordinator's agent)"))?;
        if self.local.is_none() {
            bail!("node {node}: partner copies need node-local parts (ckpt coordinator --local-dir)");
        }
        let cur = self.in_flight(generation)?;
        let (part_dir, files) = (cur.part.node_dir().to_path_buf(), cur.persisted.clone());
        for c in copies.iter().filter(|c| c.of == node) {
            let t = Instant::now();
            crate::transfer::send_part(&c.addr, &secret, generation, &node, &part_dir, &files)
                .with_context(|| format!("node {node}: copying its part of generation {generation} to node {}", c.to))?;
            tracing::info!(
                generation,
                to = c.to,
                ms = t.elapsed().as_millis() as u64,
                bytes = files.iter().map(|f| f.size).sum::<u64>(),
                "part copied to its partner"
            );
        }
        Ok(AgentReply::Done { generation })
    }

    /// With XOR redundancy: sends each segment of this node's part to the member of its group
    /// that keeps the parity it goes into (ckpt_core::image::xor).
    fn parity(&mut self, generation: u64, groups: &[ckpt_coord::wire::XorGroup]) -> Result<AgentReply> {
        use ckpt_core::image::xor;
        let node = self.node.clone();
        let secret =
            self.data.as_ref().map(|(_, s)| s.clone()).ok_or_else(|| anyhow!("node {node} has no data port (XOR parity needs a coordinator's agent)"))?;
        let group = groups.iter().find(|g| g.members.contains(&node)).ok_or_else(|| anyhow!("node {node} is in no XOR group of generation {generation}"))?;
        let (k, me) = (group.members.len(), group.members.iter().position(|m| *m == node).expect("found above"));
        let cur = self.in_flight(generation)?;
        let part_dir = cur.part.node_dir().to_path_buf();
        let files: Vec<_> =
            cur.persisted.iter().filter(|f| !ckpt_core::image::manifest::SHARED_RECORDS.iter().any(|r| f.path == format!("{node}/{r}"))).cloned().collect();
        let t = Instant::now();
        let mut stream = xor::PartStream::open(&part_dir, &node, &files)?;
        for j in 0..k - 1 {
            let h = xor::holder_of(me, j, k);
            let segment = std::io::Read::take(std::io::Read::by_ref(&mut stream), group.seg);
            crate::transfer::send_parity_piece(&group.addrs[h], &secret, generation, &node, group.seg, segment)
                .with_context(|| format!("node {node}: its part's segment {j} of generation {generation} to node {}", group.members[h]))?;
        }
        info!(generation, ms = t.elapsed().as_millis() as u64, seg = group.seg, members = k, "part's segments sent to the group's parity pieces");
        Ok(AgentReply::Done { generation })
    }

    fn commit(&mut self, generation: u64, flush: Option<u64>) -> Result<AgentReply> {
        self.in_flight(generation)?;
        let cur = self.current.take().expect("checked just above");
        if let Some(rate) = flush {
            self.flush(generation, cur.part.node_dir(), &cur.persisted, rate);
        }
        cur.part.keep();
        self.files.previous = cur.protected;
        self.tracking = cur.tracking;
        self.tracking.committed(generation);
        self.collect_garbage(generation);
        self.prune_local(generation);
        // Until the next checkpoint the pool's free chunks cost no memory (one stays, for a
        // start without faults).
        let given = self.pool.give_back_idle(IDLE_CHUNKS_KEPT);
        tracing::debug!(generation, bytes = given, "pool memory given back until the next checkpoint");
        if let Some(tree) = cur.tree {
            // Killed, its TCP connections would send FINs and resets, and linger in TIME_WAIT.
            ckpt_core::objects::inet::before_kill(&tree.pids(), self.tcp_established);
            tree.before_kill();
            tree.kill();
            // What the job's shared memory held is in the image, and its restart writes it
            // again: the node's memory is not kept for it meanwhile (Open MPI's segments, 4 MiB
            // a rank). The rest of the directory stays for the restart.
            crate::mpi::remove_saved_files(&cur.saved_in_job_dirs);
            // Its CUDA processes end checkpointed: the driver lets their state go with them.
            if let Some(suspended) = cur.gpu {
                suspended.forget();
            }
        } else if let Some(why) = cur.gpu_use.as_ref().and_then(|g| g.failed.as_ref()) {
            // A CUDA process without its GPU cannot go on right: the job ends, and restarts
            // from this generation, which holds it as it was.
            say!("ckpt: {why}; generation {generation} is committed and the job is ended: `ckpt restart` brings it back from there");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.init_pid), nix::sys::signal::Signal::SIGKILL);
        }
        self.checkpointing.store(false, Relaxed);
        Ok(AgentReply::Done { generation })
    }

    /// Copies this node's part of `generation` (the files `persisted`, in `part_dir` on its own
    /// storage) into the shared directory, in the background, at most `rate` bytes/s and never
    /// while a checkpoint of the node is under way; says `flushed` to the coordinator when the
    /// copy is durable or has failed.
    fn flush(&self, generation: u64, part_dir: &std::path::Path, persisted: &[ckpt_core::image::FileEntry], rate: u64) {
        let node = self.node.clone();
        // The records are in the shared directory already.
        let files: Vec<_> =
            persisted.iter().filter(|f| !ckpt_core::image::manifest::SHARED_RECORDS.iter().any(|r| f.path == format!("{node}/{r}"))).cloned().collect();
        let (part_dir, dest) = (part_dir.to_path_buf(), self.dir.gen_dir(generation).join(&node));
        let (paused, reports) = (self.checkpointing.clone(), self.reports.clone());
        let spawned = std::thread::Builder::new().name("ckpt-flush".into()).spawn(move || {
            let t = Instant::now();
            let copied = crate::transfer::flush_part(&part_dir, &dest, &node, &files, rate, &paused);
            let bytes: u64 = files.iter().map(|f| f.size).sum();
            let (ok, message) = match &copied {
                Ok(()) => {
                    info!(generation, bytes, ms = t.elapsed().as_millis() as u64, "part copied to the global level");
                    (true, String::new())
                }
                Err(e) => {
                    warn!(generation, "copying the part to the global level: {e:#}");
                    (false, format!("{e:#}"))
                }
            };
            if let Some(w) = reports {
                let _ = ckpt_coord::remote::send_frame(&w, &Frame::Flushed { generation, ok, message });
            }
        });
        if let Err(e) = spawned {
            warn!(generation, "no thread to copy the part to the global level: {e}");
        }
    }

    /// Removes from the node-local level the generations the shared directory no longer has
    /// (pruned there by the coordinator's `--keep`) or never committed (a checkpoint that
    /// failed).
    fn prune_local(&self, generation: u64) {
        let Some(local) = &self.local else { return };
        match local.prune_local(&|n| self.dir.has_committed(n), generation) {
            Ok(gone) if !gone.is_empty() => tracing::debug!(?gone, "node-local generations removed"),
            Ok(_) => {}
            Err(e) => warn!(generation, "pruning the node-local level: {e}"),
        }
    }

    /// Removes the copies of protected files that no committed generation of this node uses.
    fn collect_garbage(&self, generation: u64) {
        if self.files.previous.is_empty() && !self.files.store.dir.exists() {
            return;
        }
        let mut keep = self.files.previous.clone();
        for g in self.dir.committed().unwrap_or_default().into_iter().filter(|g| *g != generation) {
            match FilesRecord::read(&self.dir.gen_dir(g).join(&self.node)) {
                Ok(f) => keep.extend(f.protected),
                // Unreadable: keep every copy rather than remove one it may use.
                Err(_) => return,
            }
        }
        if let Err(e) = protect::collect_garbage(&self.files.store, keep.iter()) {
            warn!(generation, "removing unused copies of protected files: {e}");
        }
    }

    /// Releases a tree still frozen and drops the node's part of the generation in progress.
    pub fn abort(&mut self) {
        self.checkpointing.store(false, Relaxed);
        if let Some(Frozen { generation, begun, tree, .. }) = self.frozen.take() {
            if let Err(e) = tree.resume() {
                warn!(generation, "releasing the job: {e}");
            }
            // Its copy ahead listed the pages written since the last generation.
            self.tracking = Tracking::default();
            begun.abandon(generation);
        }
        if let Some((generation, begun)) = self.begun.take() {
            self.tracking = Tracking::default();
            begun.abandon(generation);
        }
        // The job runs again (above, or it was never frozen): its CUDA processes get their GPU.
        self.resume_gpu();
        let Some(cur) = self.current.take() else { return };
        // Its capture listed the pages written since the last generation and protected them
        // again: the next generation cannot tell them apart and must be whole.
        self.tracking = Tracking::default();
        if let Some(tree) = cur.tree {
            if let Err(e) = tree.resume() {
                warn!(generation = cur.generation, "releasing the job: {e}");
            }
        }
        if let Some(suspended) = cur.gpu {
            if let Err(e) = suspended.resume() {
                warn!(generation = cur.generation, "giving the job's CUDA processes their GPU back: {e}");
            }
        }
        // Stops a copy under way and ends the processes' copies, before the part goes.
        drop(cur.copying);
        drop(cur.later);
        // The IO threads may still be writing into the part's directory.
        if let Some(batch) = cur.batch {
            let _ = batch.wait_durable();
        }
        if let Err(e) = cur.part.abandon() {
            warn!(generation = cur.generation, "removing this node's part: {e}");
        }
    }
}

impl Begun {
    /// Drops the part: its streams are already ended (with the tracking that held them).
    fn abandon(self, generation: u64) {
        // The IO threads may still be writing into the part's directory.
        let _ = self.batch.wait_durable();
        if let Err(e) = self.part.abandon() {
            warn!(generation, "removing this node's part: {e}");
        }
    }
}

/// Copies a node-local part's records (`procs.bin`, `files.bin`, `index.bin`) into `shared` (the node's
/// directory in the shared generation directory), each durable before this returns.
fn share_records(part: &std::path::Path, shared: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(shared)?;
    for name in ckpt_core::image::manifest::SHARED_RECORDS {
        let bytes = std::fs::read(part.join(name))?;
        ckpt_core::image::write_file_durable(&shared.join(name), &bytes)?;
    }
    Ok(())
}

/// Connects to the relay at `addr` as this node's agent, waits until it has attached the node
/// (`joined`), and starts reading it (frames into `tx`, [`Incoming::RelayEnded`] when it ends)
/// and beating on it.
fn attach_to_relay(addr: &str, relays: &RelayAccess, tx: &std::sync::mpsc::Sender<Incoming>) -> Result<()> {
    let role = ckpt_coord::wire::Role::Agent { node: relays.node.clone(), pid: std::process::id(), restart: false, data_port: None };
    let channel = ckpt_coord::remote::connect(addr, &relays.secret, role)?;
    let (reader, writer) = channel.split();
    reader.set_read_timeout(Some(Duration::from_secs(10)))?;
    // The relay's heartbeats may come before its `joined`.
    loop {
        match read_frame(&reader)? {
            Frame::Joined => break,
            Frame::Heartbeat => {}
            Frame::Error { message } => bail!("the relay refused: {message}"),
            other => bail!("the relay answered {other:?}"),
        }
    }
    reader.set_read_timeout(Some(LOST_AFTER))?;
    let writer = Arc::new(Mutex::new(writer));
    let beating = Arc::new(AtomicBool::new(true));
    ckpt_coord::remote::start_heartbeat(writer.clone(), beating.clone(), None)?;
    let tx = tx.clone();
    std::thread::Builder::new().name("ckpt-relay-read".into()).spawn(move || {
        let why = loop {
            match read_frame(&reader) {
                Ok(frame) => {
                    if tx.send(Incoming::Frame(frame, Via::Relay(writer.clone()))).is_err() {
                        break "the agent ended".to_string();
                    }
                }
                Err(e) => break e.to_string(),
            }
        };
        beating.store(false, Relaxed);
        let _ = reader.shutdown(std::net::Shutdown::Both);
        let _ = tx.send(Incoming::RelayEnded(why));
    })?;
    Ok(())
}

/// The agent of the embedded coordinator: a command is run when it is sent, on the thread that
/// sends it, and its reply kept for `reply`. No network hop, no thread switch.
pub struct LocalAgent {
    agent: NodeAgent,
    reply: Option<AgentReply>,
}

impl LocalAgent {
    pub fn new(agent: NodeAgent) -> LocalAgent {
        LocalAgent { agent, reply: None }
    }
}

impl AgentHandle for LocalAgent {
    fn node(&self) -> &str {
        &self.agent.node
    }

    fn send(&mut self, cmd: AgentCommand) -> Result<(), AgentLost> {
        self.reply = Some(self.agent.execute(cmd));
        Ok(())
    }

    fn reply(&mut self) -> Result<AgentReply, AgentLost> {
        self.reply.take().ok_or_else(|| AgentLost { node: self.agent.node.clone(), why: "no command was sent (coordinator bug)".into() })
    }
}

/// What the coordinator decided for a node whose job ended (`ckpt coordinator --recover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// No node was lost: exit with the job's status.
    Finish,
    /// A node was lost: restart this node's part, joined again.
    Recover,
}

/// What an agent needs to serve a relay or attach to one (docs/PLAN-SCALE.md, "relays").
pub struct RelayAccess {
    /// The coordinator's address and the job's secret.
    pub coord: String,
    pub secret: String,
    pub node: String,
    /// Where a relay this agent serves listens (the address it reaches the coordinator from).
    pub bind: std::net::IpAddr,
    /// Whether it is attached: the heartbeats on the agent's own connection stop, and silence
    /// there is expected.
    pub quiet: Arc<ckpt_coord::relay::Quiet>,
}

/// Where a frame came from, and so where its answer goes.
enum Via {
    Own,
    Relay(Arc<Mutex<ckpt_coord::secure::ChannelWriter>>),
}

enum Incoming {
    Frame(Frame, Via),
    /// The agent's own connection failed or went silent.
    OwnLost(String),
    /// The relay's connection ended: back to the agent's own.
    RelayEnded(String),
}

/// Runs the coordinator's commands, on a thread of its own that is the job's tracer during each
/// generation, until the connection drops or goes silent: then a tree still frozen is released
/// and the pending generation's part dropped; the job runs on, without checkpoints. Commands
/// come on the agent's own connection, or through a relay once it is attached to one (each
/// answered where it came from); a thread reads each connection.
pub fn follow_coordinator(
    mut agent: NodeAgent,
    stream: ckpt_coord::secure::ChannelReader,
    writer: Arc<Mutex<ckpt_coord::secure::ChannelWriter>>,
    alive: Arc<AtomicBool>,
    relays: RelayAccess,
    verdicts: std::sync::mpsc::Sender<Verdict>,
) -> Result<()> {
    stream.set_read_timeout(Some(LOST_AFTER))?;
    agent.reports = Some(writer.clone());
    let stream = Arc::new(stream);
    // The own connection keeps its timeout: an agent's wakeups cost nothing that matters, and
    // the coordinator's silent end is then noticed within the timeout, attached or not.
    let attached = relays.quiet.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (stream, attached, tx) = (stream.clone(), attached.clone(), tx.clone());
        std::thread::Builder::new().name("ckpt-coord-read".into()).spawn(move || loop {
            match read_frame(&*stream) {
                Ok(frame) => {
                    if tx.send(Incoming::Frame(frame, Via::Own)).is_err() {
                        return;
                    }
                }
                // Attached, the coordinator's heartbeats come through the relay: a read begun
                // before the attach may still time out.
                Err(ckpt_coord::wire::WireError::Silent(_)) if attached.excuses_silence() => {}
                Err(e) => {
                    let _ = tx.send(Incoming::OwnLost(e.to_string()));
                    return;
                }
            }
        })?;
    }
    std::thread::Builder::new().name("ckpt-coord-link".into()).spawn(move || {
        let mut aborted_through = 0;
        // The relay this agent serves, if asked: it ends when this thread does.
        let mut served: Option<ckpt_coord::relay::RelayServer> = None;
        let why = loop {
            let Ok(incoming) = rx.recv() else { break "the reading thread ended".to_string() };
            let (frame, via) = match incoming {
                Incoming::Frame(frame, via) => (frame, via),
                Incoming::OwnLost(why) => break why,
                Incoming::RelayEnded(why) => {
                    warn!("the relay's connection ended ({why}): commands come on this agent's own connection again");
                    attached.set_attached(false);
                    continue;
                }
            };
            // A command the relay held while the coordinator gave it up may come after the
            // coordinator aborted its generation here directly: it is not run.
            if let (Frame::Command(cmd), Via::Relay(_)) = (&frame, &via) {
                if !matches!(cmd, AgentCommand::Abort { .. }) && cmd.generation() <= aborted_through {
                    warn!(generation = cmd.generation(), "a command of an aborted generation came through the relay late: not run");
                    continue;
                }
            }
            if let Frame::Command(AgentCommand::Abort { generation }) = &frame {
                aborted_through = aborted_through.max(*generation);
            }
            match frame {
                Frame::Heartbeat => {}
                Frame::Finish => {
                    // The job has ended: the launcher exits now.
                    let _ = verdicts.send(Verdict::Finish);
                    return;
                }
                Frame::Recover { generation } => {
                    // The job ends here if the loss has not ended it already; the launcher
                    // restarts this node's part once it has.
                    info!(generation, "another node was lost: ending the job to restart it from generation {generation}");
                    agent.abort();
                    // Its connections reset as it dies: none lingers on the ports the restart
                    // in place binds again (one to the lost node would, for minutes).
                    match ckpt_core::capture::descendants(agent.init_pid) {
                        Ok(pids) => ckpt_core::objects::inet::before_recovery_kill(&pids),
                        Err(e) => warn!("listing the job's processes before ending it: {e}"),
                    }
                    // Our own child, the job's init: the whole job ends.
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.init_pid), nix::sys::signal::Signal::SIGKILL);
                    let _ = verdicts.send(Verdict::Recover);
                    return;
                }
                Frame::Command(cmd) => {
                    let reply = agent.execute(cmd);
                    if let AgentReply::Failed { generation, message, .. } = &reply {
                        warn!(generation, "{message}");
                    }
                    match via {
                        Via::Own => {
                            if let Err(e) = send_frame(&writer, &Frame::Reply(reply)) {
                                break format!("cannot answer it: {e}");
                            }
                        }
                        // A relay that cannot take the answer is ending: the coordinator fails
                        // the phase for this node when it sees the relay go.
                        Via::Relay(w) => {
                            if let Err(e) = send_frame(&w, &Frame::Reply(reply)) {
                                warn!("cannot answer through the relay: {e}");
                            }
                        }
                    }
                }
                Frame::RelayServe => match ckpt_coord::relay::RelayServer::start(&relays.coord, &relays.secret, &relays.node, relays.bind) {
                    Ok(relay) => {
                        let port = relay.port;
                        // Asked again (its relay's connection ended): the older one ends.
                        drop(served.replace(relay));
                        if let Err(e) = send_frame(&writer, &Frame::RelayAt { port }) {
                            break format!("cannot say where its relay is: {e}");
                        }
                    }
                    Err(e) => warn!("cannot serve as a relay: {e}"),
                },
                Frame::UseRelay { addr } if !attached.attached() => match attach_to_relay(&addr, &relays, &tx) {
                    Ok(()) => {
                        attached.set_attached(true);
                        info!(relay = addr, "attached to a relay: commands and heartbeats go through it");
                    }
                    Err(e) => warn!(relay = addr, "cannot attach to the relay, staying on this agent's own connection: {e}"),
                },
                Frame::UseRelay { .. } => {}
                other => match via {
                    Via::Own => break format!("unexpected message {other:?}"),
                    Via::Relay(_) => warn!("the relay sent {other:?}"),
                },
            }
        };
        alive.store(false, Relaxed);
        agent.abort();
        warn!("lost the coordinator ({why}); the job runs on, without checkpoints");
        say!("ckpt: lost the coordinator ({why}); the job runs on, without checkpoints");
    })?;
    Ok(())
}
