//! Automatic recovery (`ckpt coordinator --recover`): when an agent is lost, the job comes back
//! from the newest generation every part of which can still be had, the lost nodes' parts on
//! spare hosts, without anyone giving a command (seed 002: detection, choosing, moving to the
//! spare, restart; docs/PLAN-NODE-LOSS.md, step 4).
//!
//! The coordinator's loop calls [`Recovery::tick`] a few times a second. A lost node starts an
//! attempt:
//!
//! 1. detection: the agent's connection closed without `bye`, or it was silent for
//!    [`crate::wire::LOST_AFTER`];
//! 2. choosing: the newest committed generation whose every part is on a node still there, in
//!    the shared directory, or copied to a node still there (`--redundancy partner`); a spare
//!    host for every part whose node is gone, or with none left a surviving node's host (two
//!    parts then run side by side there, each in its own namespaces);
//! 3. every agent still there is told `recover`: it ends its job (if the loss has not already
//!    ended it: mpirun aborts when a daemon dies) and restarts its part in the same process,
//!    joined again; each lost node's part is restarted on its spare through `--rsh`;
//! 4. the usual restart follows (parts fetched from their copies, connections between nodes
//!    made again, the barrier); the attempt ends when every node of the generation has joined.
//!
//! Meanwhile, an agent whose job ended waits for a verdict: `finish` (exit with the job's status)
//! once [`VERDICT_GRACE`] has passed without a loss, `recover` if one is found.

use std::time::{Duration, Instant};

use ckpt_core::image::{CheckpointDir, Manifest};
use tracing::{error, info, warn};

use crate::coordinator::REJOIN_WAIT;
use crate::server::{start_restart, Restoring, SharedCoordinator, TcpConfig};
use crate::wire::{Frame, LOST_AFTER};

/// How long an agent whose job ended waits for its verdict at least: long enough for the loss
/// of another node (which often ends the job first: mpirun aborts) to be detected.
pub const VERDICT_GRACE: Duration = Duration::from_millis(LOST_AFTER.as_millis() as u64 + 2000);

/// What `--recover` was given.
#[derive(Debug, Clone)]
pub struct RecoveryConfig {
    /// Hosts to restart lost nodes' parts on, in this order (`--spares`).
    pub spares: Vec<String>,
    /// Recoveries before giving up (`--max-recoveries`).
    pub max_attempts: u32,
}

/// One recovery under way.
struct Attempt {
    generation: u64,
    detected: Instant,
    /// Every node of the generation: the attempt ends when each has joined again.
    nodes: Vec<String>,
}

pub struct Recovery {
    config: RecoveryConfig,
    /// Spares already given a part.
    used: Vec<String>,
    attempts: u32,
    current: Option<Attempt>,
    /// Recovery was given up: agents are only told to finish.
    given_up: bool,
}

impl Recovery {
    pub fn new(config: RecoveryConfig) -> Recovery {
        Recovery { config, used: Vec::new(), attempts: 0, current: None, given_up: false }
    }

    /// Whether a recovery is under way (the coordinator must not end meanwhile, even with no
    /// agent left).
    pub fn busy(&self) -> bool {
        self.current.is_some()
    }

    /// One look at the job: starts a recovery when a node was lost, ends one when every node
    /// has joined again, and gives the verdicts.
    pub fn tick(&mut self, coord: &SharedCoordinator, tcp: &TcpConfig) {
        let (registry, info) = {
            let c = coord.lock().unwrap_or_else(|p| p.into_inner());
            (c.registry(), c.info.clone())
        };
        let tell = |what: Option<String>| *info.recovery.lock().unwrap_or_else(|p| p.into_inner()) = what;
        let lost = registry.take_lost();
        if !lost.is_empty() && !self.given_up {
            match self.start(&lost, coord, tcp) {
                Ok(()) => return,
                Err(why) => {
                    error!("recovery from the loss of {} given up: {why}", lost.join(", "));
                    eprintln!("ckpt coordinator: recovery from the loss of {} given up: {why}", lost.join(", "));
                    tell(Some(format!("given up after the loss of {}: {why}", lost.join(", "))));
                    self.given_up = true;
                    self.current = None;
                }
            }
        }
        if let Some(a) = &self.current {
            if a.nodes.iter().all(|n| registry.joined_since(n, a.detected)) {
                let secs = a.detected.elapsed().as_secs_f64();
                info!(generation = a.generation, seconds = secs, "recovered: every node of the generation has joined again");
                eprintln!(
                    "ckpt coordinator: recovered from generation {} in {secs:.1} s (from the loss's detection to every node running again)",
                    a.generation
                );
                tell(None);
                self.current = None;
            } else if a.detected.elapsed() > REJOIN_WAIT {
                let missing: Vec<&String> = a.nodes.iter().filter(|n| !registry.joined_since(n, a.detected)).collect();
                error!(?missing, "recovery: nodes did not join again within {} s; given up", REJOIN_WAIT.as_secs());
                eprintln!("ckpt coordinator: recovery given up: node(s) {missing:?} did not join again within {} s", REJOIN_WAIT.as_secs());
                tell(Some(format!("given up: node(s) {missing:?} did not join again within {} s", REJOIN_WAIT.as_secs())));
                self.given_up = true;
                self.current = None;
            }
            return;
        }
        for (node, status) in registry.take_ended_before(VERDICT_GRACE) {
            info!(node, status, "no node was lost: the agent finishes");
            registry.tell(&node, &Frame::Finish);
        }
    }

    /// Steps 2 and 3 of a recovery from the loss of `lost`.
    fn start(&mut self, lost: &[String], coord: &SharedCoordinator, tcp: &TcpConfig) -> Result<(), String> {
        let detected = Instant::now();
        self.attempts += 1;
        if self.attempts > self.config.max_attempts {
            return Err(format!("{} recoveries already (--max-recoveries)", self.config.max_attempts));
        }
        warn!(?lost, attempt = self.attempts, "node(s) lost: recovering");
        eprintln!("ckpt coordinator: lost node(s) {}: recovering (attempt {} of {})", lost.join(", "), self.attempts, self.config.max_attempts);
        let registry = coord.lock().unwrap_or_else(|p| p.into_inner()).registry();
        let live = registry.nodes();
        let dir = CheckpointDir::open(&tcp.dir).map_err(|e| e.to_string())?;
        let (generation, manifest, passed_over) = restorable(&dir, &live)?;
        if !passed_over.is_empty() {
            // Two lost members of one XOR group, say: an older (or global) generation it is.
            warn!(generation, ?passed_over, "recovery: newer generations cannot be had without the lost nodes");
            eprintln!("ckpt coordinator: {}; recovering from generation {generation}, older", passed_over.join("; "));
        }
        let gone: Vec<String> = manifest.nodes.iter().filter(|n| !live.contains(n)).cloned().collect();
        let mut hosts: Vec<(String, String)> = Vec::new();
        for node in &gone {
            let host = match self.config.spares.iter().find(|h| !self.used.contains(h)) {
                Some(spare) => {
                    self.used.push(spare.clone());
                    spare.clone()
                }
                None => {
                    let (survivor, host) = survivor_for(node, &manifest, &live, &hosts, tcp)?;
                    warn!(node, survivor, host, "no spare host left: the lost part goes on a surviving node's host");
                    eprintln!("ckpt coordinator: no spare host left: node {node}'s part goes on {host}, beside node {survivor}'s");
                    host
                }
            };
            hosts.push((node.clone(), host));
        }
        info!(generation, ?hosts, ms = detected.elapsed().as_secs_f64() * 1e3, "recovery: generation and spares chosen");
        *tcp.restoring.lock().unwrap_or_else(|p| p.into_inner()) = Restoring::of(generation, manifest.nodes.clone());
        coord.lock().unwrap_or_else(|p| p.into_inner()).await_nodes(manifest.nodes.clone());
        for node in &live {
            if !registry.tell(node, &Frame::Recover { generation }) {
                warn!(node, "recovery: could not tell the node to restart");
            }
        }
        for (node, host) in &hosts {
            eprintln!("ckpt coordinator: restarting node {node}'s part of generation {generation} on {host}");
            start_restart(tcp, host, node)?;
        }
        let moves: Vec<String> = hosts.iter().map(|(n, h)| format!("{n} on {h}")).collect();
        *coord.lock().unwrap_or_else(|p| p.into_inner()).info.recovery.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!(
            "lost {}: restarting generation {generation}, {} (attempt {} of {})",
            lost.join(", "),
            moves.join(", "),
            self.attempts,
            self.config.max_attempts
        ));
        self.current = Some(Attempt { generation, detected, nodes: manifest.nodes });
        Ok(())
    }
}

/// The surviving node whose host takes lost `node`'s part when no spare is left, and that
/// host: the one holding the part's copy (it is fetched from the same host, not over the
/// network), else the one with
/// the fewest parts already placed on it in this recovery (the first such in the manifest's order).
fn survivor_for(node: &str, manifest: &Manifest, live: &[String], placed: &[(String, String)], tcp: &TcpConfig) -> Result<(String, String), String> {
    let candidates: Vec<(&String, String)> = manifest.nodes.iter().filter(|n| live.contains(n)).filter_map(|n| tcp.host_of(n).map(|h| (n, h))).collect();
    let load = |host: &str| placed.iter().filter(|(_, h)| h == host).count();
    let holder = manifest.copies.get(node).and_then(|holders| candidates.iter().find(|(n, _)| holders.contains(n)));
    holder
        .or_else(|| candidates.iter().min_by_key(|(_, h)| load(h)))
        .map(|(n, h)| (n.to_string(), h.clone()))
        .ok_or_else(|| format!("no spare host left for node {node}'s part, and no surviving node's host is known"))
}

/// The newest committed generation whose every part can be had with the nodes `live` still
/// there: in the shared directory (no node-local level, or the generation reached the global
/// level), on a node still there, copied to one, or rebuildable from its XOR group; with why
/// each newer one could not be had.
fn restorable(dir: &CheckpointDir, live: &[String]) -> Result<(u64, Manifest, Vec<String>), String> {
    let committed = dir.committed().map_err(|e| e.to_string())?;
    let mut why = Vec::new();
    for &g in committed.iter().rev() {
        let manifest = Manifest::load(&dir.gen_dir(g)).map_err(|e| e.to_string())?;
        let mut missing = missing_parts(&manifest, live);
        // An incremental generation needs the parts of every generation it reads pages from.
        for &n in &manifest.needs {
            match Manifest::load(&dir.gen_dir(n)) {
                Ok(m) => missing.extend(missing_parts(&m, live).into_iter().map(|p| format!("{p} (of generation {n}, which it needs)"))),
                Err(e) => missing.push(format!("generation {n}, which it needs ({e})")),
            }
        }
        if missing.is_empty() {
            return Ok((g, manifest, why));
        }
        why.push(format!("generation {g}: no copy or parity of {} on nodes still there", missing.join(", ")));
    }
    if committed.is_empty() {
        return Err("no generation was committed before the loss".into());
    }
    Err(why.join("; "))
}

/// The nodes of a generation whose parts cannot be had from the nodes still there (`live`):
/// node-local, not global, and neither copied to a live node nor rebuildable from an XOR group
/// whose other members all live.
fn missing_parts(manifest: &Manifest, live: &[String]) -> Vec<String> {
    manifest
        .nodes
        .iter()
        .filter(|n| {
            manifest.local_dir.is_some()
                && !manifest.global
                && !live.contains(n)
                && !manifest.copies.get(*n).is_some_and(|h| h.iter().any(|h| live.contains(h)))
        })
        // XOR: the one lost member of a group whose others are all there.
        .filter(|n| !manifest.xor_group_of(n).is_some_and(|(g, _)| g.iter().all(|m| m == *n || live.contains(m))))
        .map(|n| format!("node {n:?}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits generation `g` of `nodes` with node-local parts.
    fn commit(dir: &CheckpointDir, g: u64, nodes: &[&str], shape: impl Fn(&mut Manifest)) {
        let mut m = Manifest::new(g, nodes.iter().map(|n| n.to_string()).collect());
        m.local_dir = Some("/local/{node}".into());
        shape(&mut m);
        dir.begin(g).unwrap().commit(&m).unwrap();
    }

    #[test]
    fn two_lost_members_of_a_group_fall_back_to_an_older_global_generation() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::create(tmp.path()).unwrap();
        let nodes = ["a", "b", "c"];
        commit(&dir, 1, &nodes, |m| m.global = true);
        commit(&dir, 2, &nodes, |m| m.xor = vec![nodes.iter().map(|n| n.to_string()).collect()]);

        // One member lost: its group rebuilds it from the newest generation.
        let (g, _, passed_over) = restorable(&dir, &["a".into(), "b".into()]).unwrap();
        assert_eq!((g, passed_over.len()), (2, 0));
        // Two lost: the newest cannot be had; the global one can, and the reason is given.
        let (g, _, passed_over) = restorable(&dir, &["a".into()]).unwrap();
        assert_eq!(g, 1);
        assert!(passed_over.len() == 1 && passed_over[0].starts_with("generation 2: no copy or parity"), "{passed_over:?}");
    }

    /// An incremental generation is restorable only if every generation it reads pages from
    /// is too.
    #[test]
    fn an_incremental_generation_needs_the_parts_of_those_it_reads_from() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::create(tmp.path()).unwrap();
        let copied = |m: &mut Manifest| {
            m.copies.insert("b".into(), vec!["a".into()]);
        };
        commit(&dir, 1, &["a", "b"], |m| m.global = true);
        commit(&dir, 2, &["a", "b"], copied);
        commit(&dir, 3, &["a", "b"], |m| {
            copied(m);
            m.needs = vec![2];
        });
        assert_eq!(restorable(&dir, &["a".into()]).unwrap().0, 3, "b's parts of 2 and 3 are copied to a");
        // Generation 2 without a copy of b: neither 2 nor 3 can be had; the global 1 can.
        commit(&dir, 4, &["a", "b"], |_| {});
        commit(&dir, 5, &["a", "b"], |m| {
            copied(m);
            m.needs = vec![4];
        });
        let (g, _, passed_over) = restorable(&dir, &["a".into()]).unwrap();
        assert_eq!(g, 3);
        assert!(passed_over.len() == 2 && passed_over[0].contains("of generation 4, which it needs"), "{passed_over:?}");
    }

    #[test]
    fn nothing_to_recover_from_says_why() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::create(tmp.path()).unwrap();
        assert!(restorable(&dir, &["a".into()]).unwrap_err().contains("no generation was committed"));
        commit(&dir, 1, &["a", "b"], |m| {
            m.copies.insert("b".into(), vec!["a".into()]);
        });
        assert_eq!(restorable(&dir, &["a".into()]).unwrap().0, 1, "b's copy is on a");
        let e = restorable(&dir, &["c".into()]).unwrap_err();
        assert!(e.contains("generation 1") && e.contains("\"a\""), "{e}");
    }
}
