//! The coordinator: the generation counter, the agents of the job, and one generation's state
//! machine (docs/PROTOCOL.md):
//!
//! ```text
//! prepare (freeze + capture) on every agent ─ barrier: all captured ─ release on every agent
//!   ─ persist on every agent ─ commit: gen-N/MANIFEST lists every node's files ─ commit to agents
//! ```
//!
//! Any failure or lost agent before the manifest is written aborts the generation on every agent
//! still there: the jobs run on, and the generation never appears. The coordinator does not care
//! whether an agent is in this process (the embedded case, one node) or at the other end of a TCP
//! connection: both are an [`AgentHandle`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ckpt_core::image::{CheckpointDir, Manifest};
use tracing::{info, warn};

use crate::messages::{CheckpointReply, CheckpointRequest, Response, StatusReply};
use crate::testhook;
use crate::wire::{AgentCommand, AgentReply, Persisted, TcpEnd, TcpRefill};
use crate::Phase;

/// An agent as the coordinator drives it: a command is sent, then its one reply awaited, so that
/// the coordinator can send a phase's command to every agent before waiting for any.
pub trait AgentHandle: Send {
    fn node(&self) -> &str;
    /// Whether the agent is still there (a remote agent whose connection dropped is not).
    fn alive(&self) -> bool {
        true
    }
    fn send(&mut self, cmd: AgentCommand) -> Result<(), AgentLost>;
    /// Where the agent takes other nodes' parts (`IP:port`), if it has a data port.
    fn data_addr(&self) -> Option<String> {
        None
    }
    /// The reply to the last command sent. A remote agent that goes silent is lost within
    /// [`crate::wire::LOST_AFTER`].
    fn reply(&mut self) -> Result<AgentReply, AgentLost>;
    /// The relay the agent takes its commands through, if it is attached to one: a phase's
    /// command goes to the relay once for all of its agents ([`crate::relay`]).
    fn relay(&self) -> Option<Arc<crate::relay::RelayLink>> {
        None
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("the agent of node {node} was lost: {why}")]
pub struct AgentLost {
    pub node: String,
    pub why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("no agent has joined the coordinator yet (start one with `ckpt launch --coord ADDR -- PROG`)")]
    NoAgent,
    #[error("the job is being restarted: node(s) {} of the restored generation have not joined within {}s (`ckpt restart --coord ADDR --node NAME` on each, then ask again)", missing.join(", "), waited.as_secs())]
    NotRejoined { missing: Vec<String>, waited: Duration },
    #[error("checkpoint of generation {generation} failed; the job goes on: {why}")]
    Aborted { generation: u64, why: String },
    #[error("checkpoint of generation {generation}: {error}")]
    Image { generation: u64, error: ckpt_core::image::ImageError },
}

/// Agents that have joined and are not yet part of a generation, and the names of every live
/// node. Shared with the threads that accept agents, which do not take the coordinator (a
/// checkpoint may hold it for long).
#[derive(Default)]
pub struct Registry {
    waiting: Mutex<Vec<Box<dyn AgentHandle>>>,
    nodes: Mutex<Vec<String>>,
    changed: Condvar,
    /// Nodes whose agent was lost (gone without `bye`) and not dealt with yet (`--recover`).
    lost: Mutex<Vec<String>>,
    /// Agents whose job ended and that wait for the verdict (`--recover`): node, the job's exit
    /// status, and since when.
    ended: Mutex<Vec<(String, i32, Instant)>>,
    /// When each node's agent last joined.
    joins: Mutex<std::collections::HashMap<String, Instant>>,
    /// Background copies to the global level reported: (generation, node, ok, why not).
    flushes: Mutex<Vec<(u64, String, bool, String)>>,
    /// Each agent's connection over TCP, for the messages that are no command (the verdicts).
    links: Mutex<std::collections::HashMap<String, Arc<Mutex<crate::secure::ChannelWriter>>>>,
    /// The heartbeats to every agent joined over TCP.
    pub pulse: crate::remote::Pulse,
    /// Each agent joined over TCP, as a relay reaches it.
    sides: Mutex<HashMap<String, crate::relay::AgentSide>>,
    /// Which agents serve as relays, and which use which ([`crate::relay::RelayPlan`]).
    relays: Mutex<crate::relay::RelayPlan>,
}

impl Registry {
    /// Adds an agent; refuses a node name a live agent already has.
    pub fn join(&self, agent: Box<dyn AgentHandle>) -> Result<(), String> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let node = agent.node().to_string();
        if nodes.contains(&node) {
            return Err(format!("a node named {node:?} has already joined this job (give each agent its own --node)"));
        }
        self.joins.lock().unwrap_or_else(|p| p.into_inner()).insert(node.clone(), Instant::now());
        nodes.push(node);
        self.waiting.lock().unwrap_or_else(|p| p.into_inner()).push(agent);
        self.changed.notify_all();
        Ok(())
    }

    /// Whether any agent has ever joined (a job whose agents all came and went between two looks
    /// has still been seen).
    pub fn anyone_joined(&self) -> bool {
        !self.joins.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Whether `node` may join (no live agent has the name).
    pub fn is_free(&self, node: &str) -> bool {
        !self.nodes.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|n| n == node)
    }

    /// Agents per relay once the job has more than that (0: no relays; `ckpt coordinator
    /// --relay-every`).
    pub fn set_relay_every(&self, every: usize) {
        self.relays.lock().unwrap_or_else(|p| p.into_inner()).every = every;
    }

    /// `node` joined over TCP: whether it serves a relay, uses one, or waits for its group's.
    pub fn plan_relay(&self, node: &str) {
        let told = self.relays.lock().unwrap_or_else(|p| p.into_inner()).joined(node);
        for (to, frame) in told {
            self.tell(&to, &frame);
        }
    }

    /// The relay `node` serves listens at `addr`: its group is told to use it.
    pub fn relay_ready(&self, node: &str, addr: String) {
        let told = self.relays.lock().unwrap_or_else(|p| p.into_inner()).ready(node, addr);
        for (to, frame) in told {
            self.tell(&to, &frame);
        }
    }

    /// The agent of `node` is gone: it said `bye` first, or it was `lost`.
    pub fn left(&self, node: &str, lost: bool) {
        self.relays.lock().unwrap_or_else(|p| p.into_inner()).left(node);
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).retain(|n| n != node);
        self.links.lock().unwrap_or_else(|p| p.into_inner()).remove(node);
        self.sides.lock().unwrap_or_else(|p| p.into_inner()).remove(node);
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).retain(|(n, _, _)| n != node);
        if lost {
            self.lost.lock().unwrap_or_else(|p| p.into_inner()).push(node.to_string());
        }
        self.changed.notify_all();
    }

    /// Whether an agent of `node` is there that joined after `since`.
    pub fn joined_since(&self, node: &str, since: Instant) -> bool {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|n| n == node)
            && self.joins.lock().unwrap_or_else(|p| p.into_inner()).get(node).is_some_and(|t| *t > since)
    }

    /// `node`'s agent is at the other end of `link`.
    pub fn set_link(&self, node: &str, link: Arc<Mutex<crate::secure::ChannelWriter>>) {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), link);
    }

    /// How a relay reaches `node`'s agent, joined over TCP.
    pub fn set_side(&self, node: &str, side: crate::relay::AgentSide) {
        self.sides.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), side);
    }

    pub fn side(&self, node: &str) -> Option<crate::relay::AgentSide> {
        self.sides.lock().unwrap_or_else(|p| p.into_inner()).get(node).cloned()
    }

    /// Sends `frame` to `node`'s agent; false if it is not there.
    pub fn tell(&self, node: &str, frame: &crate::wire::Frame) -> bool {
        let link = self.links.lock().unwrap_or_else(|p| p.into_inner()).get(node).cloned();
        link.is_some_and(|l| crate::remote::send_frame(&l, frame).is_ok())
    }

    /// `node` copied its part of `generation` to the global level (`ok`), or failed to.
    pub fn flush_reported(&self, node: &str, generation: u64, ok: bool, message: String) {
        self.flushes.lock().unwrap_or_else(|p| p.into_inner()).push((generation, node.to_string(), ok, message));
    }

    /// The reports on `generation`'s copy to the global level: (node, ok, why not).
    pub fn flushed(&self, generation: u64) -> Vec<(String, bool, String)> {
        self.flushes.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|f| f.0 == generation).map(|f| (f.1.clone(), f.2, f.3.clone())).collect()
    }

    pub fn forget_flushes(&self, generation: u64) {
        self.flushes.lock().unwrap_or_else(|p| p.into_inner()).retain(|f| f.0 != generation);
    }

    /// The job of `node`'s agent ended with `status`; the agent waits for the verdict.
    pub fn ended(&self, node: &str, status: i32) {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).push((node.to_string(), status, Instant::now()));
    }

    /// The agents waiting for a verdict whose job ended at least `grace` ago (taken off the list).
    pub fn take_ended_before(&self, grace: Duration) -> Vec<(String, i32)> {
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let (old, young): (Vec<_>, Vec<_>) = ended.drain(..).partition(|(_, _, at)| at.elapsed() >= grace);
        *ended = young;
        old.into_iter().map(|(n, s, _)| (n, s)).collect()
    }

    /// The nodes lost since the last call.
    pub fn take_lost(&self) -> Vec<String> {
        std::mem::take(&mut *self.lost.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Waits until no live agent is named `node`; false after `timeout`.
    pub fn wait_free(&self, node: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if !nodes.iter().any(|n| n == node) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            nodes = self.changed.wait_timeout(nodes, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    pub fn nodes(&self) -> Vec<String> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until `node` has joined; false after `timeout`.
    pub fn wait_for(&self, node: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if nodes.iter().any(|n| n == node) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            nodes = self.changed.wait_timeout(nodes, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn take(&self) -> Vec<Box<dyn AgentHandle>> {
        std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// What `status` tells without waiting for a checkpoint to finish.
pub struct CoordInfo {
    root: std::path::PathBuf,
    pub command: Mutex<Vec<String>>,
    running: AtomicBool,
    /// The generation being written after its job was released (0: none).
    persisting: AtomicU64,
    next_generation: AtomicU64,
    pub registry: Arc<Registry>,
    /// What a recovery from a lost node is doing (`--recover`; see [`crate::recovery`]).
    pub recovery: Mutex<Option<String>>,
}

impl CoordInfo {
    pub fn status(&self) -> Response {
        let persisting = self.persisting.load(Relaxed);
        Response::Status(StatusReply {
            launcher_pid: std::process::id(),
            command: self.command.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            generations: CheckpointDir::open(&self.root).and_then(|d| d.committed()).unwrap_or_default(),
            checkpoint_running: self.running.load(Relaxed),
            persisting: (persisting != 0).then_some(persisting),
            nodes: self.registry.nodes(),
            recovery: self.recovery.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        })
    }

    /// The generation the next checkpoint will commit.
    pub fn next_generation(&self) -> u64 {
        self.next_generation.load(Relaxed)
    }
}

pub struct Coordinator {
    dir: CheckpointDir,
    /// Committed generations to keep.
    keep: usize,
    agents: Vec<Box<dyn AgentHandle>>,
    pub info: Arc<CoordInfo>,
    /// What the last committed checkpoint cost the application (its frozen time).
    last_cost: Option<Duration>,
    /// The nodes of a restored generation not seen yet: until every one has rejoined, a
    /// generation would miss their part.
    awaited: Vec<String>,
    /// How long a checkpoint waits for `awaited` ([`REJOIN_WAIT`]).
    rejoin_wait: Duration,
    /// `--local-dir`: every node keeps its parts there, on its own host; recorded in each
    /// manifest.
    local_dir: Option<String>,
    /// `--redundancy partner`: each node's part is also kept by the next node (in the order
    /// the nodes joined, a ring).
    partner_copies: bool,
    /// `--redundancy xor:K`: the nodes keep XOR parity in groups of K.
    xor: Option<usize>,
    /// `--flush-every N` and `--flush-rate`: every Nth committed generation is copied by the
    /// nodes into the shared directory (the global level), at most this many bytes/s each.
    flush: Option<(u64, u64)>,
    /// Generations committed by this coordinator.
    commits: u64,
    /// Generations being flushed, with their nodes.
    flushing: Vec<(u64, Vec<String>)>,
    /// `--full-every N`: at most N-1 incremental generations follow a full one (1: every
    /// generation is full).
    full_every: u64,
    /// The last generation this coordinator committed, and how many incremental generations
    /// have followed the last full one up to it: the next generation's base.
    last_commit: Option<(u64, u64)>,
    /// The thread deleting retired generations, if any.
    removing: Option<std::thread::JoinHandle<()>>,
}

/// Default of `--full-every`: a full generation, then up to 7 that store only what changed.
pub const DEFAULT_FULL_EVERY: u64 = 8;

impl Drop for Coordinator {
    /// A coordinator that ends leaves no old generation half-deleted when it can help it.
    fn drop(&mut self) {
        self.wait_pruned();
    }
}

/// Clears the status flags however a checkpoint ends.
struct Running<'a>(&'a CoordInfo);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.store(false, Relaxed);
        self.0.persisting.store(0, Relaxed);
    }
}

impl Coordinator {
    /// A coordinator of the checkpoint directory `dir`. Generations are numbered above every
    /// generation directory present, so a restarted job never reuses a number.
    pub fn new(dir: CheckpointDir, keep: usize, command: Vec<String>) -> Result<Coordinator, ckpt_core::image::ImageError> {
        let next = dir.next_generation()?;
        let info = Arc::new(CoordInfo {
            root: dir.root().to_path_buf(),
            command: Mutex::new(command),
            running: AtomicBool::new(false),
            persisting: AtomicU64::new(0),
            next_generation: AtomicU64::new(next),
            registry: Arc::new(Registry::default()),
            recovery: Mutex::new(None),
        });
        Ok(Coordinator {
            dir,
            keep,
            agents: Vec::new(),
            info,
            last_cost: None,
            awaited: Vec::new(),
            rejoin_wait: REJOIN_WAIT,
            local_dir: None,
            partner_copies: false,
            xor: None,
            flush: None,
            commits: 0,
            flushing: Vec::new(),
            full_every: DEFAULT_FULL_EVERY,
            last_commit: None,
            removing: None,
        })
    }

    /// `--full-every N`: a full generation at least every N (1: every one).
    pub fn set_full_every(&mut self, n: u64) {
        self.full_every = n.max(1);
    }

    /// Whether this coordinator makes incremental generations at all: not with `--full-every
    /// 1`. (With redundancy, partner copies and XOR parity are per generation and kept as long
    /// as the generation is; a lost node's part is fetched or rebuilt for every generation the
    /// restored one reads pages from.)
    fn incremental(&self) -> bool {
        self.full_every > 1
    }

    /// The generation the next one may refer to: the last one this coordinator committed (the
    /// agents tracked the writes since its freeze), unless a whole one is due: every
    /// `--full-every`th, and every one copied to the global level (`--flush-every`), so that a
    /// generation read from the shared directory never needs one that is only on the nodes.
    fn base_for_next(&self) -> Option<u64> {
        let (last, increments) = self.last_commit?;
        let flushed_next = self.local_dir.is_some() && self.flush.is_some_and(|(every, _)| (self.commits + 1).is_multiple_of(every));
        (self.incremental() && !flushed_next && increments + 1 < self.full_every).then_some(last)
    }

    /// Parts go to each node's own storage (`--local-dir`, `{node}` replaced by each node).
    pub fn set_local_dir(&mut self, template: Option<String>) {
        self.local_dir = template;
    }

    /// Every node's part is also kept by the next node (`--redundancy partner`; with a
    /// node-local level).
    pub fn set_partner_copies(&mut self, on: bool) {
        self.partner_copies = on;
    }

    /// The nodes keep XOR parity of their parts in groups of `k` (`--redundancy xor:K`, with a
    /// node-local level).
    pub fn set_xor(&mut self, k: Option<usize>) {
        self.xor = k;
    }

    /// Every `every`th committed generation is copied to the shared directory (with a
    /// node-local level), at most `rate` bytes/s per node.
    pub fn set_flush(&mut self, every: u64, rate: u64) {
        self.flush = (every > 0).then_some((every, rate));
    }

    /// Whether `generation`, just committed, goes to the global level: the rate to copy at.
    fn flush_due(&mut self, generation: u64, nodes: &[String]) -> Option<u64> {
        self.commits += 1;
        let (every, rate) = self.flush?;
        if self.local_dir.is_none() || !self.commits.is_multiple_of(every) {
            return None;
        }
        self.flushing.push((generation, nodes.to_vec()));
        Some(rate)
    }

    /// Marks the generations whose every node's part is durable in the shared directory as
    /// global (their manifest written again, atomically); drops those a node failed to copy.
    pub fn finish_flushes(&mut self) {
        let registry = self.info.registry.clone();
        let mut still = Vec::new();
        for (generation, nodes) in std::mem::take(&mut self.flushing) {
            let reports = registry.flushed(generation);
            if let Some((node, message)) = reports.iter().find_map(|(n, ok, m)| (!ok).then_some((n, m))) {
                warn!(generation, node, "generation not copied to the global level: {message}");
                registry.forget_flushes(generation);
                continue;
            }
            if !nodes.iter().all(|n| reports.iter().any(|(r, ok, _)| r == n && *ok)) {
                // A node lost meanwhile never says: the generation stays local.
                if nodes.iter().all(|n| registry.nodes().contains(n) || reports.iter().any(|(r, _, _)| r == n)) {
                    still.push((generation, nodes));
                } else {
                    warn!(generation, "a node left before copying its part to the global level; the generation stays node-local");
                    registry.forget_flushes(generation);
                }
                continue;
            }
            registry.forget_flushes(generation);
            let gen_dir = self.dir.gen_dir(generation);
            let marked = Manifest::load(&gen_dir).and_then(|mut m| {
                m.global = true;
                m.commit(&gen_dir)
            });
            match marked {
                Ok(()) => {
                    info!(generation, "generation copied to the global level (the shared directory)");
                    self.prune();
                }
                // Pruned meanwhile (a newer generation came): nothing to mark.
                Err(e) => warn!(generation, "marking the generation global: {e}"),
            }
        }
        self.flushing = still;
    }

    /// Uncommits the generations beyond `--keep` at once and deletes their files on a thread of
    /// its own: deleting a generation of 4,096 nodes' parts took 30 s (docs/bench-coord-scale.md),
    /// during which the client waited for its answer and the coordinator for the next checkpoint.
    fn prune(&mut self) {
        let doomed = match self.dir.retire(self.keep) {
            Ok(d) if d.is_empty() => return,
            Ok(d) => d,
            Err(e) => return warn!("removing old generations: {e}"),
        };
        let dir = self.dir.clone();
        let before = self.removing.take();
        let spawned = std::thread::Builder::new().name("ckpt-prune".into()).spawn(move || {
            // One deletion after the other: together they would only compete for the disk.
            if let Some(b) = before {
                let _ = b.join();
            }
            for n in doomed {
                if let Err(e) = dir.remove_retired(n) {
                    warn!(generation = n, "removing an old generation: {e}");
                }
            }
        });
        match spawned {
            Ok(h) => self.removing = Some(h),
            Err(e) => warn!("removing old generations: no thread to do it: {e}"),
        }
    }

    /// Waits until the old generations being deleted are.
    pub fn wait_pruned(&mut self) {
        if let Some(h) = self.removing.take() {
            let _ = h.join();
        }
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.info.registry.clone()
    }

    /// Holds checkpoints until agents of every one of `nodes` (a restored generation's) have
    /// joined: a checkpoint asked while the job is being restarted waits for the restart.
    pub fn await_nodes(&mut self, nodes: Vec<String>) {
        self.awaited = nodes;
    }

    /// Gathers the agents, waiting up to [`REJOIN_WAIT`] for the restored generation's nodes
    /// that have not joined yet; `awaited` keeps those still missing after it.
    fn wait_rejoined(&mut self) {
        let deadline = Instant::now() + self.rejoin_wait;
        let registry = self.info.registry.clone();
        let mut told = false;
        loop {
            self.gather();
            let agents = &self.agents;
            self.awaited.retain(|n| !agents.iter().any(|a| a.node() == n));
            let Some(missing) = self.awaited.first().cloned() else { return };
            if !told {
                info!(missing = ?self.awaited, "a checkpoint waits for the restart: node(s) of the restored generation have not joined yet");
                told = true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !registry.wait_for(&missing, left) {
                return;
            }
        }
    }

    pub fn last_cost(&self) -> Option<Duration> {
        self.last_cost
    }

    pub fn dir(&self) -> &CheckpointDir {
        &self.dir
    }

    /// Takes the agents that joined since the last generation, and drops the ones that left
    /// (a handle whose agent is lost has taken its name off the registry itself).
    fn gather(&mut self) {
        self.agents.retain(|a| a.alive());
        self.agents.extend(self.info.registry.take());
    }

    pub fn checkpoint(&mut self, req: &CheckpointRequest) -> Result<CheckpointReply, CheckpointError> {
        self.checkpoint_with(req, &mut |_, _| {})
    }

    /// One generation. `on_resumed(generation, frozen_ms)` is called as soon as every agent's
    /// job runs again (not with `kill`), before the generation is durable.
    ///
    /// A generation given up on a passing state (a node's job was caught in the middle of
    /// something it ends by itself, [`ckpt_core::Error::Passing`]) is tried again after a pause,
    /// with the next number, up to [`PASSING_PAUSES`] times; the error says how often.
    pub fn checkpoint_with(&mut self, req: &CheckpointRequest, on_resumed: &mut dyn FnMut(u64, f64)) -> Result<CheckpointReply, CheckpointError> {
        self.wait_rejoined();
        if !self.awaited.is_empty() {
            return Err(CheckpointError::NotRejoined { missing: self.awaited.clone(), waited: self.rejoin_wait });
        }
        if self.agents.is_empty() {
            return Err(CheckpointError::NoAgent);
        }
        let info = self.info.clone();
        info.running.store(true, Relaxed);
        let _running = Running(&info);
        let t0 = Instant::now();
        let mut pauses = PASSING_PAUSES.iter();
        loop {
            let last_try = pauses.len() == 0;
            match self.try_generation(req, t0, last_try, on_resumed) {
                Err(Attempt::Passing { generation, why }) => match pauses.next() {
                    Some(&pause) => {
                        info!(generation, "trying again in {} ms: {why}", pause.as_millis());
                        std::thread::sleep(pause);
                        // An agent lost meanwhile is dropped; one that joined takes part.
                        self.gather();
                    }
                    None => {
                        let why = format!("{why}, and stayed so: tried {} times over {:.1} s", PASSING_PAUSES.len() + 1, t0.elapsed().as_secs_f64());
                        return Err(CheckpointError::Aborted { generation, why });
                    }
                },
                Err(Attempt::Failed(e)) => return Err(e),
                Ok(reply) => return Ok(reply),
            }
        }
    }

    /// One try at a generation, with a number of its own.
    fn try_generation(
        &mut self,
        req: &CheckpointRequest,
        t0: Instant,
        last_try: bool,
        on_resumed: &mut dyn FnMut(u64, f64),
    ) -> Result<CheckpointReply, Attempt> {
        if self.agents.is_empty() {
            return Err(Attempt::Failed(CheckpointError::NoAgent));
        }
        let info = self.info.clone();
        let generation = info.next_generation.load(Relaxed);
        let image_err = |error| Attempt::Failed(CheckpointError::Image { generation, error });
        let pending = self.dir.begin(generation).map_err(image_err)?;
        // The number is used up whatever happens: an abandoned generation's agents may still
        // hold files of it, and a number is never given twice.
        info.next_generation.store(generation + 1, Relaxed);

        let result = self.run_phases(generation, req, (t0, last_try), on_resumed);
        let (reply, manifest) = match result {
            Ok(r) => r,
            Err(Failure { why, passing }) => {
                warn!(generation, "aborting the generation: {why}");
                self.abort(generation);
                let _ = pending.abandon();
                return Err(match passing {
                    true => Attempt::Passing { generation, why },
                    false => Attempt::Failed(CheckpointError::Aborted { generation, why }),
                });
            }
        };
        testhook::die_at(Phase::Commit, generation);
        if let Err(e) = pending.commit(&manifest) {
            self.abort(generation);
            return Err(Attempt::Failed(CheckpointError::Aborted { generation, why: format!("writing the manifest: {e}") }));
        }
        // Committed: what the agents answer now changes nothing; a lost one is only logged.
        let flush = self.flush_due(generation, &manifest.nodes);
        for (node, r) in self.broadcast(AgentCommand::Commit { generation, flush }) {
            if let Err(e) = r {
                warn!(generation, node, "after the commit: {e}");
            }
        }
        self.last_cost = Some(Duration::from_secs_f64(reply.frozen_ms / 1e3));
        let increments = match self.last_commit {
            Some((_, n)) if !manifest.needs.is_empty() => n + 1,
            _ => 0,
        };
        self.last_commit = Some((generation, increments));
        self.prune();
        info!(generation, frozen_ms = reply.frozen_ms, durable_ms = reply.durable_ms, nodes = manifest.nodes.len(), "generation committed");
        Ok(reply)
    }

    /// prepare → barrier → release → persist; the manifest to commit, or why not.
    fn run_phases(
        &mut self,
        generation: u64,
        req: &CheckpointRequest,
        (t0, last_try): (Instant, bool),
        on_resumed: &mut dyn FnMut(u64, f64),
    ) -> Result<(CheckpointReply, Manifest), Failure> {
        let (mut processes, mut threads) = (0, 0);
        let hold = req.kill;
        let (base, track) = (self.base_for_next(), self.incremental());
        if !hold {
            for (node, r) in self.phase(AgentCommand::CopyAhead { generation, base })? {
                if !matches!(r, AgentReply::Done { .. }) {
                    return Err(unexpected(&node, "done", &r).into());
                }
            }
        }
        if self.agents.len() > 1 {
            let mut by_node = Vec::new();
            for (node, r) in self.phase(AgentCommand::Freeze { generation })? {
                match r {
                    AgentReply::Frozen { tcp_ends, .. } => by_node.push((node, tcp_ends)),
                    other => return Err(unexpected(&node, "frozen", &other).into()),
                }
            }
            self.drain_across_nodes(generation, &pair_across_nodes(&by_node))?;
        }
        for (node, r) in self.phase(AgentCommand::Prepare { generation, hold, base, track, last_try })? {
            match r {
                AgentReply::Captured { processes: p, threads: t, .. } => {
                    processes += p;
                    threads += t;
                }
                other => return Err(unexpected(&node, "captured", &other).into()),
            }
        }
        // The barrier: every node is frozen and captured.
        testhook::die_at(Phase::Captured, generation);
        let mut frozen_ms: f64 = 0.0;
        for (node, r) in self.phase(AgentCommand::Release { generation, hold })? {
            match r {
                AgentReply::Released { frozen_ms: f, .. } => frozen_ms = frozen_ms.max(f),
                other => return Err(unexpected(&node, "released", &other).into()),
            }
        }
        testhook::die_at(Phase::Release, generation);
        if !hold {
            self.info.persisting.store(generation, Relaxed);
            on_resumed(generation, frozen_ms);
        }
        let mut manifest = Manifest::new(generation, self.agents.iter().map(|a| a.node().to_string()).collect());
        manifest.local_dir = self.local_dir.clone();
        let (mut bytes_raw, mut bytes_stored, mut pool_wait_ms, mut copied_ahead_bytes) = (0, 0, 0f64, 0);
        let (mut gpu_ms, mut gpu_bytes, mut gpu_failed) = (0f64, 0, Vec::new());
        let mut stream_bytes = HashMap::new();
        for (node, r) in self.phase(AgentCommand::Persist { generation })? {
            match r {
                AgentReply::Persisted(Persisted {
                    files, part_bytes, bytes_raw: raw, bytes_stored: stored, pool_wait_ms: w, needs, copied_ahead, gpu, ..
                }) => {
                    // A node refers only to the base it was given and what that base refers to.
                    if let Some(g) = needs.iter().find(|&&g| g >= generation) {
                        return Err(format!("node {node} refers to generation {g}, not older than {generation}").into());
                    }
                    manifest.needs.extend(needs);
                    // A node lists only its own directory: one node cannot replace another's files.
                    let prefix = format!("{node}/");
                    if let Some(f) = files.iter().find(|f| !f.path.starts_with(&prefix)) {
                        return Err(format!("node {node} listed {} outside its directory", f.path).into());
                    }
                    // Its XOR stream: what its index lists and, from an agent before the
                    // index, the files it listed itself but its records.
                    let listed: u64 = ckpt_core::image::xor::stream_files(&files, &node).iter().map(|f| f.size).sum();
                    stream_bytes.insert(node.clone(), listed + part_bytes);
                    manifest.files.extend(files);
                    bytes_raw += raw;
                    bytes_stored += stored;
                    copied_ahead_bytes += copied_ahead;
                    if let Some(g) = gpu {
                        gpu_ms = gpu_ms.max(g.ms);
                        gpu_bytes += g.bytes;
                        gpu_failed.extend(g.failed.map(|f| format!("node {node}: {f}")));
                    }
                    pool_wait_ms = pool_wait_ms.max(w);
                }
                other => return Err(unexpected(&node, "persisted", &other).into()),
            }
        }
        manifest.needs.sort_unstable();
        manifest.needs.dedup();
        testhook::die_at(Phase::Persist, generation);
        if self.partner_copies && self.agents.len() > 1 {
            let copies = self.partner_ring()?;
            for (node, r) in self.phase(AgentCommand::Replicate { generation, copies: copies.clone() })? {
                if !matches!(r, AgentReply::Done { .. }) {
                    return Err(unexpected(&node, "done", &r).into());
                }
            }
            for c in copies {
                manifest.copies.entry(c.of).or_default().push(c.to);
            }
        }
        if let (Some(k), true) = (self.xor, self.agents.len() > 1) {
            let groups = self.xor_groups(&stream_bytes, k)?;
            for (node, r) in self.phase(AgentCommand::Parity { generation, groups: groups.clone() })? {
                if !matches!(r, AgentReply::Done { .. }) {
                    return Err(unexpected(&node, "done", &r).into());
                }
            }
            manifest.xor = groups.into_iter().map(|g| g.members).collect();
        }
        let reply = CheckpointReply {
            generation,
            frozen_ms,
            durable_ms: t0.elapsed().as_secs_f64() * 1e3,
            bytes_raw,
            bytes_stored,
            processes,
            threads,
            pool_wait_ms,
            copied_ahead_bytes,
            gpu_ms,
            gpu_bytes,
            gpu_failed: (!gpu_failed.is_empty()).then(|| gpu_failed.join("; ")),
        };
        manifest.stats = serde_json::to_value(&reply).map_err(|e| e.to_string())?;
        Ok((reply, manifest))
    }

    /// Without TCP repair mode: the connections between nodes of the job drained in rounds until
    /// no sender has anything left, then the bytes taken out of receivers written back by their
    /// senders (docs/PLAN-UNPRIVILEGED-TCP.md). Nothing to do when there are none.
    fn drain_across_nodes(&mut self, generation: u64, ends: &[TcpEnd]) -> Result<(), String> {
        if ends.is_empty() {
            return Ok(());
        }
        let mut last_round_sent = false;
        let drained = self.drain_rounds(generation, ends, &mut last_round_sent);
        // A failure before the last round leaves bytes taken out of receivers on the agents:
        // the last round collects them and the senders write them back. (From the last round on,
        // drain_rounds gives them back itself.)
        if drained.is_err() && !last_round_sent {
            let refills = self.last_round(generation, ends).0;
            self.refill(generation, refills);
        }
        drained
    }

    /// The last drain round: the bytes every agent still there took out of its receivers, and
    /// the first failure.
    fn last_round(&mut self, generation: u64, ends: &[TcpEnd]) -> (Vec<TcpRefill>, Option<String>) {
        let mut refills = Vec::new();
        let mut failed = None;
        for (node, r) in self.broadcast(AgentCommand::Drain { generation, ends: ends.to_vec(), last: true }) {
            match r {
                Ok(AgentReply::Drained { refills: f, .. }) => refills.extend(f),
                Ok(other) => {
                    failed.get_or_insert(unexpected(&node, "drained", &other));
                }
                Err(e) => {
                    failed.get_or_insert(e.to_string());
                }
            }
        }
        (refills, failed)
    }

    /// Has the senders write back what receivers gave up; the first failure.
    fn refill(&mut self, generation: u64, refills: Vec<TcpRefill>) -> Option<String> {
        if refills.is_empty() {
            return None;
        }
        let mut failed = None;
        for (node, r) in self.broadcast(AgentCommand::Refill { generation, refills }) {
            match r {
                Ok(AgentReply::Done { .. }) => {}
                Ok(other) => {
                    failed.get_or_insert(unexpected(&node, "done", &other));
                }
                Err(e) => {
                    failed.get_or_insert(e.to_string());
                }
            }
        }
        failed
    }

    fn drain_rounds(&mut self, generation: u64, ends: &[TcpEnd], last_round_sent: &mut bool) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let mut outq = 0;
            for (node, r) in self.phase(AgentCommand::Drain { generation, ends: ends.to_vec(), last: false }).map_err(|f| f.why)? {
                match r {
                    AgentReply::Drained { outq: q, .. } => outq += q,
                    other => return Err(unexpected(&node, "drained", &other)),
                }
            }
            if outq == 0 {
                break;
            }
            if start.elapsed() > DRAIN_TIMEOUT {
                return Err(format!(
                    "TCP connections between the job's nodes: {outq} bytes sent were still not delivered after {} s (a half-closed connection whose bytes wait behind a full receive buffer cannot be drained without TCP repair mode); checkpoint again",
                    DRAIN_TIMEOUT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        *last_round_sent = true;
        // Even when a node fails the last round, what the others took out is written back.
        let (refills, failed) = self.last_round(generation, ends);
        let refill_failed = self.refill(generation, refills);
        match failed.or(refill_failed) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends `cmd` to every agent, then collects every reply: all of them, or the first failure
    /// (after every reply is in, so that no agent is left with an unread one).
    /// The failure is passing when every node's was.
    fn phase(&mut self, cmd: AgentCommand) -> Result<Vec<(String, AgentReply)>, Failure> {
        let mut out = Vec::new();
        let mut first_err = None;
        let mut all_passing = true;
        let generation = cmd.generation();
        for (node, r) in self.broadcast(cmd) {
            let why = match r {
                Ok(AgentReply::Failed { message, passing, .. }) => {
                    all_passing &= passing;
                    format!("node {node}: {message}")
                }
                Ok(reply) if reply_generation(&reply) != generation => {
                    all_passing = false;
                    format!("node {node} answered for another generation: {reply:?}")
                }
                Ok(reply) => {
                    out.push((node, reply));
                    continue;
                }
                Err(e) => {
                    all_passing = false;
                    e.to_string()
                }
            };
            first_err.get_or_insert(why);
        }
        match first_err {
            Some(why) => Err(Failure { why, passing: all_passing }),
            None => Ok(out),
        }
    }

    fn broadcast(&mut self, cmd: AgentCommand) -> Vec<(String, Result<AgentReply, AgentLost>)> {
        // Agents attached to a relay get the command through it, once for all of them.
        let mut relays: Vec<(Arc<crate::relay::RelayLink>, Vec<usize>)> = Vec::new();
        let mut sent: Vec<Result<(), AgentLost>> = Vec::with_capacity(self.agents.len());
        for (i, a) in self.agents.iter_mut().enumerate() {
            if !a.alive() {
                sent.push(Err(AgentLost { node: a.node().into(), why: "its connection is closed".into() }));
            } else if let Some(link) = a.relay() {
                match relays.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &link)) {
                    Some((_, members)) => members.push(i),
                    None => relays.push((link, vec![i])),
                }
                sent.push(Ok(()));
            } else {
                sent.push(a.send(cmd.clone()));
            }
        }
        for (link, members) in relays {
            let nodes = members.iter().map(|&i| self.agents[i].node().to_string()).collect();
            if let Err(e) = link.fanout(nodes, cmd.clone()) {
                for i in members {
                    sent[i] = Err(AgentLost { node: self.agents[i].node().into(), why: format!("its relay (node {}): {e}", link.node()) });
                }
            }
        }
        if let AgentCommand::Prepare { generation, .. } = cmd {
            // Every agent is freezing its job now.
            testhook::die_at(Phase::Prepare, generation);
        }
        self.agents.iter_mut().zip(sent).map(|(a, s)| (a.node().to_string(), s.and_then(|_| a.reply()))).collect()
    }

    /// Each node's part goes to the next node's data port, in the order the agents joined.
    fn partner_ring(&self) -> Result<Vec<crate::wire::PartCopy>, String> {
        let n = self.agents.len();
        let host = |addr: &str| addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
        (0..n)
            .map(|i| {
                let (of, to) = (&self.agents[i], &self.agents[(i + 1) % n]);
                let addr = to.data_addr().ok_or_else(|| format!("node {} has no data port to keep node {}'s part (an older ckpt?)", to.node(), of.node()))?;
                // Two nodes on one host share a --local-dir without {node}: the copy would be
                // written over the part itself.
                let same_host = of.data_addr().and_then(|a| host(&a)).is_some_and(|ip| host(&addr) == Some(ip));
                if same_host && self.local_dir.as_deref().is_some_and(|t| !t.contains("{node}")) {
                    return Err(format!(
                        "nodes {} and {} run on one host and --local-dir has no {{node}} in it: give each node its own directory (--local-dir PATH/{{node}})",
                        of.node(),
                        to.node()
                    ));
                }
                Ok(crate::wire::PartCopy { of: of.node().to_string(), to: to.node().to_string(), addr })
            })
            .collect()
    }

    /// The XOR groups of `k` nodes (in the order the agents joined), with their data ports and
    /// segment sizes from the lengths of the parts' streams (`stream_bytes`, by node).
    fn xor_groups(&self, stream_bytes: &HashMap<String, u64>, k: usize) -> Result<Vec<crate::wire::XorGroup>, String> {
        let nodes: Vec<String> = self.agents.iter().map(|a| a.node().to_string()).collect();
        let addr_of = |n: &str| {
            self.agents
                .iter()
                .find(|a| a.node() == n)
                .and_then(|a| a.data_addr())
                .ok_or_else(|| format!("node {n} has no data port for XOR parity (an older ckpt?)"))
        };
        ckpt_core::image::xor::groups(&nodes, k)
            .into_iter()
            .map(|members| {
                let lens: Vec<u64> = members.iter().map(|m| stream_bytes.get(m).copied().unwrap_or(0)).collect();
                let addrs = members.iter().map(|m| addr_of(m)).collect::<Result<Vec<_>, _>>()?;
                Ok(crate::wire::XorGroup { seg: ckpt_core::image::xor::segment_len(&lens), members, addrs })
            })
            .collect()
    }

    /// Every agent still there releases its job and drops its part of the generation.
    fn abort(&mut self, generation: u64) {
        for (node, r) in self.broadcast(AgentCommand::Abort { generation }) {
            if let Err(e) = r {
                warn!(generation, node, "abort: {e}");
            }
        }
    }
}

/// Why a generation was given up; `passing`: only on states the job leaves by itself.
struct Failure {
    why: String,
    passing: bool,
}

impl From<String> for Failure {
    fn from(why: String) -> Failure {
        Failure { why, passing: false }
    }
}

/// How one try at a generation ended, when it did not commit.
enum Attempt {
    /// Given up on a passing state: worth trying again.
    Passing {
        generation: u64,
        why: String,
    },
    Failed(CheckpointError),
}

/// The pauses before each new try of a generation given up on a passing state: a program reads
/// the rest of a netlink dump within milliseconds of running, and the last pause leaves it a
/// second for what takes longer.
const PASSING_PAUSES: [Duration; 4] = [Duration::from_millis(10), Duration::from_millis(50), Duration::from_millis(200), Duration::from_millis(1000)];

/// How long the TCP connections between nodes may take to drain at a checkpoint.
/// How long the nodes of a restored generation have to join: a checkpoint asked meanwhile waits
/// for them that long, and a recovery gives up after it. A restart as an ordinary user may first
/// wait up to 125 s (with the default net.ipv4.tcp_fin_timeout) for the old job's lingering
/// ends to leave a port it listens on (`objects::tcp::restore`), then rebuilds its processes
/// and, with partner copies, fetches its part: 180 s was seen too short for two such nodes on a
/// loaded 2-core machine (the multi-node tests as an ordinary user, session 14).
pub const REJOIN_WAIT: Duration = Duration::from_secs(300);

const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The ends, of every node, of TCP connections whose other end is on another node of the job
/// (a's (local, remote) is b's (remote, local)). Pure.
fn pair_across_nodes(by_node: &[(String, Vec<TcpEnd>)]) -> Vec<TcpEnd> {
    use ckpt_core::objects::inet::normalize;
    let mut out = Vec::new();
    for (node, ends) in by_node {
        for e in ends {
            let paired = by_node
                .iter()
                .filter(|(n, _)| n != node)
                .flat_map(|(_, es)| es)
                .any(|o| normalize(o.local) == normalize(e.remote) && normalize(o.remote) == normalize(e.local));
            if paired {
                out.push(e.clone());
            }
        }
    }
    out
}

fn reply_generation(r: &AgentReply) -> u64 {
    match r {
        AgentReply::Frozen { generation, .. }
        | AgentReply::Drained { generation, .. }
        | AgentReply::Captured { generation, .. }
        | AgentReply::Released { generation, .. }
        | AgentReply::Done { generation }
        | AgentReply::Failed { generation, .. } => *generation,
        AgentReply::Persisted(p) => p.generation,
    }
}

fn unexpected(node: &str, want: &str, got: &AgentReply) -> String {
    format!("node {node} answered {got:?} where `{want}` was due (protocol error)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckpt_core::image::write_record_file;
    use std::collections::VecDeque;

    /// An agent that writes a one-file part and can be told to fail or vanish at a command.
    struct Fake {
        node: String,
        root: std::path::PathBuf,
        fail_at: Option<&'static str>,
        /// Fails at this command on a passing state, so many times.
        passing_at: Option<(&'static str, usize)>,
        lost_at: Option<&'static str>,
        replies: VecDeque<AgentReply>,
        log: Arc<Mutex<Vec<String>>>,
        gone: bool,
        registry: Option<Arc<Registry>>,
    }

    fn name(cmd: &AgentCommand) -> &'static str {
        match cmd {
            AgentCommand::Freeze { .. } => "freeze",
            AgentCommand::CopyAhead { .. } => "copy_ahead",
            AgentCommand::Prepare { .. } => "prepare",
            AgentCommand::Release { .. } => "release",
            AgentCommand::Persist { .. } => "persist",
            AgentCommand::Commit { .. } => "commit",
            AgentCommand::Abort { .. } => "abort",
            AgentCommand::Drain { .. } => "drain",
            AgentCommand::Refill { .. } => "refill",
            AgentCommand::Replicate { .. } => "replicate",
            AgentCommand::Parity { .. } => "parity",
        }
    }

    impl AgentHandle for Fake {
        fn node(&self) -> &str {
            &self.node
        }
        fn alive(&self) -> bool {
            !self.gone
        }
        fn send(&mut self, cmd: AgentCommand) -> Result<(), AgentLost> {
            let what = name(&cmd);
            self.log.lock().unwrap().push(format!("{} {what}", self.node));
            if self.lost_at == Some(what) {
                self.gone = true;
                if let Some(r) = &self.registry {
                    r.left(&self.node, true);
                }
            }
            if self.gone {
                return Err(AgentLost { node: self.node.clone(), why: "test".into() });
            }
            let generation = cmd.generation();
            let reply = if self.fail_at == Some(what) {
                AgentReply::Failed { generation, message: "told to fail".into(), passing: false }
            } else if let Some((_, left @ 1..)) = self.passing_at.as_mut().filter(|p| p.0 == what) {
                *left -= 1;
                AgentReply::Failed { generation, message: "caught in the middle".into(), passing: true }
            } else {
                match cmd {
                    AgentCommand::Freeze { .. } => AgentReply::Frozen { generation, tcp_ends: Vec::new() },
                    AgentCommand::CopyAhead { .. } => AgentReply::Done { generation },
                    AgentCommand::Prepare { .. } => AgentReply::Captured { generation, processes: 1, threads: 2 },
                    AgentCommand::Release { .. } => AgentReply::Released { generation, frozen_ms: 5.0 },
                    AgentCommand::Persist { .. } => {
                        let dir = CheckpointDir::open(&self.root).unwrap();
                        let part = dir.node_part(generation, &self.node).unwrap();
                        let e = write_record_file(&part.node_dir().join("procs.bin"), *b"CKPTTEST", &generation).unwrap();
                        part.keep();
                        AgentReply::Persisted(Persisted {
                            generation,
                            files: vec![e],
                            part_bytes: 0,
                            bytes_raw: 10,
                            bytes_stored: 10,
                            pool_wait_ms: 0.0,
                            needs: Vec::new(),
                            copied_ahead: 0,
                            gpu: None,
                        })
                    }
                    _ => AgentReply::Done { generation },
                }
            };
            self.replies.push_back(reply);
            Ok(())
        }
        fn reply(&mut self) -> Result<AgentReply, AgentLost> {
            self.replies.pop_front().ok_or_else(|| AgentLost { node: self.node.clone(), why: "no reply".into() })
        }
    }

    #[test]
    fn connections_between_nodes_are_paired_by_their_addresses() {
        let end = |l: &str, r: &str| TcpEnd { local: l.parse().unwrap(), remote: r.parse().unwrap(), fin_sent: false };
        let a = vec![end("10.0.0.1:5000", "10.0.0.2:40000"), end("10.0.0.1:6000", "192.168.1.9:80")];
        let b = vec![end("[::ffff:10.0.0.2]:40000", "[::ffff:10.0.0.1]:5000")];
        let paired = pair_across_nodes(&[("a".into(), a.clone()), ("b".into(), b.clone())]);
        assert_eq!(paired, vec![a[0].clone(), b[0].clone()], "the connection to the outside is not one of them");
        // Two ends on one node are that node's business.
        let same = vec![end("10.0.0.1:5000", "10.0.0.1:40000"), end("10.0.0.1:40000", "10.0.0.1:5000")];
        assert!(pair_across_nodes(&[("a".into(), same)]).is_empty());
    }

    fn setup(fail: &[(&str, &'static str)], lost: &[(&str, &'static str)]) -> (tempfile::TempDir, Coordinator, Arc<Mutex<Vec<String>>>) {
        setup_with(fail, lost, &[])
    }

    /// [`setup`] with nodes that fail at a command on a passing state, so many times.
    fn setup_passing(fail: &[(&str, &'static str)], passing: &[(&str, &'static str, usize)]) -> (tempfile::TempDir, Coordinator, Arc<Mutex<Vec<String>>>) {
        setup_with(fail, &[], passing)
    }

    fn setup_with(
        fail: &[(&str, &'static str)],
        lost: &[(&str, &'static str)],
        passing: &[(&str, &'static str, usize)],
    ) -> (tempfile::TempDir, Coordinator, Arc<Mutex<Vec<String>>>) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::create(tmp.path().join("d")).unwrap();
        let coord = Coordinator::new(dir.clone(), 2, vec![]).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for node in ["a", "b"] {
            let fake = Fake {
                node: node.into(),
                root: dir.root().to_path_buf(),
                fail_at: fail.iter().find(|f| f.0 == node).map(|f| f.1),
                passing_at: passing.iter().find(|p| p.0 == node).map(|p| (p.1, p.2)),
                lost_at: lost.iter().find(|f| f.0 == node).map(|f| f.1),
                replies: VecDeque::new(),
                log: log.clone(),
                gone: false,
                registry: Some(coord.registry()),
            };
            coord.registry().join(Box::new(fake)).unwrap();
        }
        (tmp, coord, log)
    }

    #[test]
    fn a_generation_lists_every_node() {
        let (_tmp, mut coord, log) = setup(&[], &[]);
        let mut resumed = None;
        let r = coord.checkpoint_with(&CheckpointRequest::default(), &mut |g, f| resumed = Some((g, f))).unwrap();
        assert_eq!((r.generation, r.processes, r.threads), (1, 2, 4));
        assert_eq!(resumed, Some((1, 5.0)));
        let m = Manifest::load(&coord.dir().gen_dir(1)).unwrap();
        assert_eq!(m.nodes, vec!["a", "b"]);
        assert_eq!(m.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), vec!["a/procs.bin", "b/procs.bin"]);
        // Every phase reaches every agent before the next phase starts.
        let log = log.lock().unwrap().clone();
        let order: Vec<&str> = log.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            order,
            [
                "a copy_ahead",
                "b copy_ahead",
                "a freeze",
                "b freeze",
                "a prepare",
                "b prepare",
                "a release",
                "b release",
                "a persist",
                "b persist",
                "a commit",
                "b commit"
            ]
        );
        assert_eq!(coord.checkpoint(&CheckpointRequest::default()).unwrap().generation, 2);
        assert_eq!(coord.dir().committed().unwrap(), vec![1, 2]);
    }

    /// Generations beyond --keep stop being committed before the answer, and their files go
    /// after it (a thread deletes them).
    #[test]
    fn old_generations_are_uncommitted_at_once_and_deleted_after() {
        let (_tmp, mut coord, _log) = setup(&[], &[]);
        for g in 1..=4 {
            assert_eq!(coord.checkpoint(&CheckpointRequest::default()).unwrap().generation, g);
            assert_eq!(coord.dir().committed().unwrap(), (g.saturating_sub(1).max(1)..=g).collect::<Vec<_>>());
        }
        coord.wait_pruned();
        for g in 1..=2 {
            assert!(!coord.dir().gen_dir(g).exists(), "generation {g} is still there");
        }
        assert!(coord.dir().gen_dir(3).join("a/procs.bin").is_file());
    }

    #[test]
    fn with_kill_the_job_is_not_resumed_early() {
        let (_tmp, mut coord, log) = setup(&[], &[]);
        let mut resumed = false;
        coord.checkpoint_with(&CheckpointRequest { kill: true, ..Default::default() }, &mut |_, _| resumed = true).unwrap();
        assert!(!resumed);
        // Nor is its memory copied ahead: it never runs again.
        assert!(!log.lock().unwrap().iter().any(|s| s.ends_with("copy_ahead")));
    }

    #[test]
    fn a_failed_capture_aborts_everywhere() {
        let (_tmp, mut coord, log) = setup(&[("b", "prepare")], &[]);
        let e = coord.checkpoint(&CheckpointRequest::default()).unwrap_err();
        assert!(matches!(e, CheckpointError::Aborted { generation: 1, .. }), "{e}");
        assert!(e.to_string().contains("node b: told to fail"), "{e}");
        let log = log.lock().unwrap().clone();
        assert_eq!(log, ["a copy_ahead", "b copy_ahead", "a freeze", "b freeze", "a prepare", "b prepare", "a abort", "b abort"]);
        assert!(coord.dir().committed().unwrap().is_empty());
        assert!(!coord.dir().gen_dir(1).exists());
        // The next generation gets a new number.
        assert_eq!(coord.info.next_generation(), 2);
    }

    #[test]
    fn a_generation_given_up_on_a_passing_state_is_tried_again() {
        let (_tmp, mut coord, log) = setup_passing(&[], &[("b", "prepare", 2)]);
        let r = coord.checkpoint(&CheckpointRequest::default()).unwrap();
        // Two tries given up, each with its own number, the third committed.
        assert_eq!(r.generation, 3);
        assert_eq!(coord.dir().committed().unwrap(), vec![3]);
        assert!(!coord.dir().gen_dir(1).exists() && !coord.dir().gen_dir(2).exists());
        let log = log.lock().unwrap().clone();
        assert_eq!(log.iter().filter(|s| *s == "b abort").count(), 2, "{log:?}");
        assert_eq!(log.iter().filter(|s| *s == "a prepare").count(), 3, "{log:?}");
    }

    #[test]
    fn a_passing_state_that_stays_is_given_up_saying_so() {
        let (_tmp, mut coord, log) = setup_passing(&[], &[("a", "prepare", usize::MAX)]);
        let e = coord.checkpoint(&CheckpointRequest::default()).unwrap_err();
        assert!(e.to_string().contains("caught in the middle") && e.to_string().contains("tried 5 times"), "{e}");
        assert!(coord.dir().committed().unwrap().is_empty());
        assert_eq!(log.lock().unwrap().iter().filter(|s| *s == "a abort").count(), 5);
        // A passing failure on one node and another failure elsewhere: not tried again.
        let (_tmp, mut coord, log) = setup_passing(&[("b", "prepare")], &[("a", "prepare", 1)]);
        coord.checkpoint(&CheckpointRequest::default()).unwrap_err();
        assert_eq!(log.lock().unwrap().iter().filter(|s| *s == "a prepare").count(), 1);
    }

    #[test]
    fn an_agent_lost_before_commit_aborts_the_others() {
        for step in ["prepare", "release", "persist"] {
            let (_tmp, mut coord, log) = setup(&[], &[("a", step)]);
            let e = coord.checkpoint(&CheckpointRequest::default()).unwrap_err();
            assert!(e.to_string().contains("node a was lost"), "{step}: {e}");
            assert!(log.lock().unwrap().contains(&"b abort".to_string()), "{step}");
            assert!(coord.dir().committed().unwrap().is_empty(), "{step}");
            assert!(!coord.dir().gen_dir(1).exists(), "{step}: the node parts are gone");
            // The lost agent is dropped: the next generation has b alone.
            let r = coord.checkpoint(&CheckpointRequest::default()).unwrap();
            assert_eq!(Manifest::load(&coord.dir().gen_dir(r.generation)).unwrap().nodes, vec!["b"], "{step}");
            assert_eq!(coord.registry().nodes(), vec!["b"]);
        }
    }

    #[test]
    fn an_agent_lost_after_commit_changes_nothing() {
        let (_tmp, mut coord, _log) = setup(&[], &[("b", "commit")]);
        assert_eq!(coord.checkpoint(&CheckpointRequest::default()).unwrap().generation, 1);
        assert_eq!(coord.dir().committed().unwrap(), vec![1]);
    }

    #[test]
    fn no_agent_no_generation() {
        let tmp = tempfile::tempdir().unwrap();
        let mut coord = Coordinator::new(CheckpointDir::create(tmp.path()).unwrap(), 2, vec![]).unwrap();
        assert!(matches!(coord.checkpoint(&CheckpointRequest::default()), Err(CheckpointError::NoAgent)));
    }

    #[test]
    fn a_restarted_job_waits_for_every_node() {
        let (_tmp, mut coord, log) = setup(&[], &[]);
        coord.rejoin_wait = Duration::from_millis(300);
        coord.await_nodes(vec!["a".into(), "c".into()]);
        let e = coord.checkpoint(&CheckpointRequest::default()).unwrap_err();
        assert!(matches!(&e, CheckpointError::NotRejoined { missing, .. } if missing == &["c"]), "{e}");
        assert!(coord.dir().gen_dir(1).read_dir().is_err(), "nothing begun");

        // Asked while the restart is still going on, it waits until the last node has joined.
        coord.rejoin_wait = Duration::from_secs(30);
        let (registry, root) = (coord.registry(), coord.dir().root().to_path_buf());
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let c = Fake {
                node: "c".into(),
                root,
                fail_at: None,
                passing_at: None,
                lost_at: None,
                replies: VecDeque::new(),
                log,
                gone: false,
                registry: Some(registry.clone()),
            };
            registry.join(Box::new(c)).unwrap();
        });
        let r = coord.checkpoint(&CheckpointRequest::default()).unwrap();
        late.join().unwrap();
        assert_eq!(Manifest::load(&coord.dir().gen_dir(r.generation)).unwrap().nodes, vec!["a", "b", "c"]);
    }

    #[test]
    fn duplicate_node_names_are_refused() {
        let (_tmp, coord, log) = setup(&[], &[]);
        let dup = Fake {
            node: "a".into(),
            root: "/".into(),
            fail_at: None,
            passing_at: None,
            lost_at: None,
            replies: VecDeque::new(),
            log,
            gone: false,
            registry: None,
        };
        assert!(coord.registry().join(Box::new(dup)).unwrap_err().contains("already joined"));
        assert!(!coord.registry().is_free("b") && coord.registry().is_free("c"));
    }
}
