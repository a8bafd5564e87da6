//! What starts a checkpoint besides `ckpt checkpoint`: an interval (fixed, or chosen from the
//! measured checkpoint cost and the mean time between failures), a signal sent to the launcher
//! (a checkpoint; or, as a batch system's warning before a time limit, a checkpoint that ends
//! the job and, under Slurm, requeues it), and SIGTERM (checkpoint, then end the job: for
//! preemption with a grace period).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use ckpt_coord::server::SharedCoordinator;
use ckpt_coord::{CheckpointReply, CheckpointRequest, Request, Response};
use ckpt_core::ptrace::Tid;
use clap::Args;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use tracing::{info, warn};

use crate::slurm::{SlurmError, SlurmJob};

#[derive(Args, Clone, Debug, Default)]
pub struct TriggerArgs {
    /// Checkpoint every DURATION (e.g. 30m, 10s), or `auto` to choose the interval from the
    /// measured checkpoint cost and --mtbf (Young/Daly).
    #[arg(long)]
    pub interval: Option<String>,
    /// Mean time between failures, for --interval auto (e.g. 6h).
    #[arg(long)]
    pub mtbf: Option<String>,
    /// A signal to the launcher that takes a checkpoint (name or number); --on-signal says
    /// what else it does.
    #[arg(long, default_value = "USR1")]
    pub signal: String,
    /// What the checkpoint signal (--signal) does: `checkpoint` (the job goes on), `end`
    /// (checkpoint, then end the job: a batch system's warning before a time limit) or
    /// `requeue` (as `end`, then `scontrol requeue $SLURM_JOB_ID`, so that the job runs again
    /// and `ckpt run` continues it). Default: `requeue` in a Slurm job (SLURM_JOB_ID set),
    /// `checkpoint` elsewhere.
    #[arg(long, value_enum, value_name = "ACTION")]
    pub on_signal: Option<OnSignal>,
    /// What SIGTERM to the launcher does: `forward` it to the job, or `checkpoint` the job and
    /// then end it.
    #[arg(long, value_enum, value_name = "ACTION", default_value_t = OnTerm::Forward)]
    pub on_term: OnTerm,
}

/// See [`TriggerArgs::on_signal`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSignal {
    Checkpoint,
    End,
    Requeue,
}

/// See [`TriggerArgs::on_term`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnTerm {
    #[default]
    Forward,
    Checkpoint,
}

/// What the checkpoint signal does, checked: a requeue knows its Slurm job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalAction {
    /// Checkpoint; the job goes on.
    Checkpoint,
    /// Checkpoint, then end the job.
    End,
    /// Checkpoint, end the job, requeue this Slurm job.
    Requeue(SlurmJob),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Interval {
    Every(Duration),
    /// Chosen from the cost of the last checkpoint and the mean time between failures.
    Auto {
        mtbf: Duration,
    },
}

/// The triggers of a job, checked.
#[derive(Debug, Clone)]
pub struct Triggers {
    pub interval: Option<Interval>,
    pub signal: Signal,
    pub on_signal: SignalAction,
    pub on_term: OnTerm,
}

pub fn parse_duration(s: &str) -> Result<Duration> {
    humantime::parse_duration(s).map_err(|e| anyhow!("not a duration: {s:?} ({e}; write e.g. 500ms, 10s, 30m, 6h)"))
}

fn parse_signal(s: &str) -> Result<Signal> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| anyhow!("no signal number {n}"));
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") { name } else { format!("SIG{name}") };
    name.parse::<Signal>().map_err(|_| anyhow!("unknown signal {s:?}"))
}

impl TriggerArgs {
    /// The triggers, checked; the Slurm job this process runs in (SLURM_JOB_ID) is the one a
    /// requeue requeues.
    pub fn parse(&self) -> Result<Triggers> {
        self.parse_in(SlurmJob::from_env()?)
    }

    /// [`TriggerArgs::parse`] in the Slurm job `slurm`, or outside Slurm.
    fn parse_in(&self, slurm: Option<SlurmJob>) -> Result<Triggers> {
        let interval = match (self.interval.as_deref(), self.mtbf.as_deref()) {
            (None, None) => None,
            (None, Some(_)) => bail!("--mtbf goes with --interval auto"),
            (Some("auto"), Some(m)) => Some(Interval::Auto { mtbf: parse_duration(m)? }),
            (Some("auto"), None) => bail!("--interval auto needs --mtbf (the mean time between failures, e.g. 6h)"),
            (Some(d), _) => {
                let d = parse_duration(d)?;
                if d < Duration::from_millis(100) {
                    bail!("--interval {d:?} is too short (at least 100ms)");
                }
                Some(Interval::Every(d))
            }
        };
        let signal = parse_signal(&self.signal)?;
        if matches!(signal, Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGTERM | Signal::SIGINT) {
            bail!("--signal {signal} cannot be the checkpoint signal (use USR1, USR2, ...)");
        }
        let on_signal = match (self.on_signal, slurm) {
            (None, Some(job)) | (Some(OnSignal::Requeue), Some(job)) => SignalAction::Requeue(job),
            (None, None) | (Some(OnSignal::Checkpoint), _) => SignalAction::Checkpoint,
            (Some(OnSignal::End), _) => SignalAction::End,
            (Some(OnSignal::Requeue), None) => {
                bail!("--on-signal requeue requeues the Slurm job ckpt runs in, and this is none (SLURM_JOB_ID is not set): use --on-signal end")
            }
        };
        Ok(Triggers { interval, signal, on_signal, on_term: self.on_term })
    }
}

/// The checkpoint interval that wastes least, by Young's and Daly's formulas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub young: Duration,
    pub daly: Duration,
    /// Share of the run spent checkpointing at the Daly interval.
    pub overhead: f64,
    /// Expected work lost per failure at the Daly interval (half an interval, plus the cost).
    pub expected_loss: Duration,
}

/// Pure arithmetic: `cost` is one checkpoint's cost to the application, `mtbf` the mean time
/// between failures.
pub fn plan(cost: Duration, mtbf: Duration) -> Plan {
    let c = cost.as_secs_f64().max(1e-6);
    let m = mtbf.as_secs_f64().max(1e-6);
    let young = (2.0 * c * m).sqrt();
    // Daly (2006), first-order correction; beyond 2M the best is to checkpoint every M.
    let daly = if c < 2.0 * m {
        let r = c / (2.0 * m);
        (2.0 * c * m).sqrt() * (1.0 + r.sqrt() / 3.0 + r / 9.0) - c
    } else {
        m
    };
    let daly = daly.max(c);
    Plan {
        young: Duration::from_secs_f64(young),
        daly: Duration::from_secs_f64(daly),
        overhead: c / (daly + c),
        expected_loss: Duration::from_secs_f64(daly / 2.0 + c),
    }
}

/// `ckpt plan`: prints the arithmetic.
pub fn print_plan(cost: &str, mtbf: &str) -> Result<i32> {
    let (c, m) = (parse_duration(cost)?, parse_duration(mtbf)?);
    let p = plan(c, m);
    let fmt = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs().max(1))).to_string();
    println!("checkpoint cost C = {}, mean time between failures M = {}", fmt(c), fmt(m));
    println!("Young: T = sqrt(2·C·M)                              = {}", fmt(p.young));
    println!("Daly:  T = sqrt(2·C·M)·(1 + √(C/2M)/3 + (C/2M)/9) − C = {}", fmt(p.daly));
    println!("at the Daly interval: {:.2}% of the run is spent checkpointing; a failure loses about {} of work", p.overhead * 100.0, fmt(p.expected_loss));
    Ok(0)
}

/// Where the checkpoints a trigger starts are asked.
#[derive(Clone)]
pub enum Target {
    /// The coordinator embedded in this process (or this process is `ckpt coordinator`).
    Local(SharedCoordinator),
    /// The standalone coordinator this agent has joined: the checkpoint covers every node.
    Remote { addr: String, secret: String },
}

impl Target {
    fn checkpoint(&self, req: &CheckpointRequest) -> Result<CheckpointReply> {
        match self {
            Target::Local(c) => Ok(c.lock().unwrap_or_else(|p| p.into_inner()).checkpoint(req)?),
            Target::Remote { addr, secret } => match ckpt_coord::remote::request(addr, secret, &Request::Checkpoint(req.clone()))? {
                Response::Committed(r) => Ok(r),
                Response::Error { message } => bail!("{message}"),
                other => bail!("unexpected answer from the coordinator: {other:?}"),
            },
        }
    }

    fn last_cost(&self) -> Option<Duration> {
        match self {
            Target::Local(c) => c.lock().unwrap_or_else(|p| p.into_inner()).last_cost(),
            Target::Remote { .. } => None,
        }
    }
}

/// Runs a checkpoint from a trigger and returns what was committed; failures are logged, the
/// job goes on.
fn trigger_checkpoint(target: &Target, why: &str, kill: bool) -> Option<CheckpointReply> {
    match target.checkpoint(&CheckpointRequest { kill, detach: false, no_wait_durable: false }) {
        Ok(r) => {
            info!(generation = r.generation, frozen_ms = r.frozen_ms, "{why}: checkpoint committed");
            say!("ckpt: {why}: generation {} committed (frozen {:.1} ms, durable {:.1} ms)", r.generation, r.frozen_ms, r.durable_ms);
            // (A job that had ended before the freeze, as under Slurm's SIGTERM to every process,
            // fails the checkpoint in the agent: `Error::NothingToCheckpoint`.)
            Some(r)
        }
        Err(e) if matches!(e.downcast_ref(), Some(ckpt_coord::CheckpointError::NoAgent)) => {
            // A standalone coordinator's interval before any agent joined: nothing to do yet.
            tracing::debug!("{why}: no agent yet");
            None
        }
        Err(e) => {
            warn!("{why}: checkpoint failed: {e:#}");
            say!("ckpt: {why}: checkpoint failed: {e:#}");
            None
        }
    }
}

/// Held while the signal thread acts on a signal. The launcher takes it before it exits
/// ([`settle`]): a checkpoint that ends the job wakes the launcher's main thread at once, and
/// the requeue that follows must not be cut short by the process's exit (Slurm would then see
/// the batch script end, and the job would finish instead of going back to the queue).
static ACTING: Mutex<()> = Mutex::new(());

/// Waits until an action on a signal that is under way (a checkpoint, a requeue) has finished.
pub fn settle() {
    drop(ACTING.lock().unwrap_or_else(|p| p.into_inner()));
}

/// What the checkpoint signal does ([`SignalAction`]). A failed checkpoint leaves the job
/// running and is never followed by a requeue: a requeued job restarts from its newest
/// committed generation, which would then be older than the user was told.
fn on_checkpoint_signal(target: &Target, why: &str, action: &SignalAction) {
    let not_ended = "the job was not ended and runs on (a later `ckpt run` restarts it from its newest committed generation, if it has one: see `ckpt status`)";
    match action {
        SignalAction::Checkpoint => {
            trigger_checkpoint(target, why, false);
        }
        SignalAction::End => {
            if trigger_checkpoint(target, why, true).is_none() {
                say!("ckpt: {why}: {not_ended}");
            }
        }
        SignalAction::Requeue(job) => {
            // Asked before the checkpoint, so that the answer is in the log even if Slurm
            // kills everything soon after; the job ends after the checkpoint either way.
            let requeueable = job.check_requeueable();
            let Some(CheckpointReply { generation, .. }) = trigger_checkpoint(target, why, true) else {
                say!("ckpt: {why}: Slurm job {job} is not requeued; {not_ended}");
                return;
            };
            match requeueable.and_then(|()| job.requeue()) {
                Ok(()) => {
                    info!(job = %job, generation, "{why}: Slurm job requeued");
                    say!("ckpt: {why}: Slurm job {job} requeued: when it starts again, `ckpt run` continues it from generation {generation}");
                }
                Err(e) => {
                    let e = RequeueError { generation, cause: e };
                    warn!("{why}: {e}");
                    say!("ckpt: {why}: {e}");
                }
            }
        }
    }
}

/// A job that ended after a committed checkpoint, but was not requeued.
#[derive(Debug, thiserror::Error)]
#[error("the job ended after generation {generation}, without a requeue: {cause}; submit the job script again and `ckpt run` continues from generation {generation}")]
struct RequeueError {
    generation: u64,
    cause: SlurmError,
}

/// Starts the interval trigger, if any. It stops when `ended` is set.
pub fn start_interval(target: Target, interval: Option<Interval>, ended: Arc<AtomicBool>) -> Result<()> {
    let Some(interval) = interval else { return Ok(()) };
    std::thread::Builder::new().name("ckpt-interval".into()).spawn(move || {
        let step = Duration::from_millis(50);
        loop {
            let wait = match interval {
                Interval::Every(d) => d,
                Interval::Auto { mtbf } => {
                    // Until a checkpoint has been measured, a first one early gives the cost.
                    let cost = target.last_cost();
                    match cost {
                        Some(c) => plan(c, mtbf).daly,
                        None => (mtbf / 100).clamp(Duration::from_secs(1), Duration::from_secs(60)),
                    }
                }
            };
            let mut waited = Duration::ZERO;
            while waited < wait {
                if ended.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(step);
                waited += step;
            }
            if ended.load(Ordering::Relaxed) {
                return;
            }
            trigger_checkpoint(&target, "interval", false);
        }
    })?;
    Ok(())
}

/// Signals sent to the launcher that are passed on to the job's main process.
const FORWARDED: [Signal; 4] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT];

fn handled(t: &Triggers) -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(t.signal);
    set
}

/// Blocks the signals the launcher handles in this thread and every thread started after; a
/// thread of their own takes them with sigwait.
pub fn block_handled(t: &Triggers) -> Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&handled(t)), None)?;
    Ok(())
}

/// Takes the launcher's signals: the checkpoint signal does its [`SignalAction`], SIGTERM
/// checkpoints and ends the job when asked to, every other one is passed on to the job's main
/// process.
pub fn start_signals(target: Target, t: Triggers, init_host_pid: Tid, main_ns_pid: Tid) -> Result<()> {
    // One thread takes the signals for the process's life; a job restarted in this process
    // (a recovery, `ckpt coordinator --recover`) only points it at the new job.
    static JOB: Mutex<Option<(Target, Triggers, Tid, Tid)>> = Mutex::new(None);
    let started = JOB.lock().unwrap_or_else(|p| p.into_inner()).replace((target, t.clone(), init_host_pid, main_ns_pid)).is_some();
    if started {
        return Ok(());
    }
    let set = handled(&t);
    std::thread::Builder::new().name("ckpt-signals".into()).spawn(move || loop {
        let Ok(sig) = set.wait() else { continue };
        let Some((target, t, init_host_pid, main_ns_pid)) = JOB.lock().unwrap_or_else(|p| p.into_inner()).clone() else { continue };
        if sig == t.signal {
            let _acting = ACTING.lock().unwrap_or_else(|p| p.into_inner());
            on_checkpoint_signal(&target, &format!("{sig}"), &t.on_signal);
            continue;
        }
        if sig == Signal::SIGTERM && t.on_term == OnTerm::Checkpoint {
            let _acting = ACTING.lock().unwrap_or_else(|p| p.into_inner());
            if trigger_checkpoint(&target, "SIGTERM", true).is_some() {
                continue;
            }
        }
        match crate::spawn::host_pid_in_job(init_host_pid, main_ns_pid) {
            Some(pid) => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            }
            // The launched program has ended and the job goes on (daemons, `--until all`): the
            // signal goes to every process left, or it would reach nobody.
            None => {
                for pid in ckpt_core::capture::descendants(init_host_pid).unwrap_or_default() {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
                }
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn young_and_daly() {
        let p = plan(Duration::from_secs(40), Duration::from_secs(6 * 3600));
        // sqrt(2 * 40 * 21600) = 1314.5 s
        assert!((p.young.as_secs_f64() - 1314.5).abs() < 1.0, "{p:?}");
        assert!(p.daly < p.young + Duration::from_secs(30) && p.daly > p.young - Duration::from_secs(60), "{p:?}");
        assert!(p.overhead > 0.02 && p.overhead < 0.04, "{p:?}");
        // A checkpoint costlier than twice the MTBF: checkpoint every MTBF.
        let q = plan(Duration::from_secs(100), Duration::from_secs(40));
        assert_eq!(q.daly, Duration::from_secs(100));
    }

    #[test]
    fn trigger_arguments() {
        let t = TriggerArgs { interval: Some("1s".into()), signal: "usr2".into(), on_term: OnTerm::Checkpoint, ..Default::default() };
        let t = t.parse_in(None).unwrap();
        assert_eq!(t.interval, Some(Interval::Every(Duration::from_secs(1))));
        assert_eq!(t.signal, Signal::SIGUSR2);
        assert_eq!(t.on_term, OnTerm::Checkpoint);
        let bad = TriggerArgs { interval: Some("auto".into()), signal: "USR1".into(), ..Default::default() };
        assert!(bad.parse_in(None).is_err());
        let bad = TriggerArgs { signal: "KILL".into(), ..Default::default() };
        assert!(bad.parse_in(None).is_err());
    }

    #[test]
    fn the_checkpoint_signal_requeues_by_default_only_under_slurm() {
        let job = SlurmJob::new("42").unwrap();
        let action = |on_signal: Option<OnSignal>, slurm: Option<&SlurmJob>| {
            TriggerArgs { signal: "USR1".into(), on_signal, ..Default::default() }.parse_in(slurm.cloned()).map(|t| t.on_signal)
        };
        assert_eq!(action(None, None).unwrap(), SignalAction::Checkpoint);
        assert_eq!(action(None, Some(&job)).unwrap(), SignalAction::Requeue(job.clone()));
        assert_eq!(action(Some(OnSignal::Checkpoint), Some(&job)).unwrap(), SignalAction::Checkpoint);
        assert_eq!(action(Some(OnSignal::End), None).unwrap(), SignalAction::End);
        assert_eq!(action(Some(OnSignal::End), Some(&job)).unwrap(), SignalAction::End);
        assert_eq!(action(Some(OnSignal::Requeue), Some(&job)).unwrap(), SignalAction::Requeue(job));
        let outside = action(Some(OnSignal::Requeue), None).unwrap_err().to_string();
        assert!(outside.contains("SLURM_JOB_ID"), "{outside}");
    }
}
