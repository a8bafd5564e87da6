//! CUDA processes: their GPU state moved into their own memory by the NVIDIA driver before the
//! freeze, and back onto the GPU once they run again (docs/PLAN-GPU.md).
//!
//! The driver's checkpoint API does the GPU's part: `lock` stops the process's CUDA calls,
//! `checkpoint` copies its device memory into its host memory and lets the GPU go, `restore`
//! and `unlock` undo both. Between `checkpoint` and `restore` the process holds no
//! `/dev/nvidia*` descriptor or mapping, and the ordinary capture of its memory holds its GPU
//! state. This module decides the order: every process locked before any is checkpointed (a
//! rank's CUDA call may wait for another's), each step done for all processes at once, and
//! nothing left locked when a step fails ([`Suspended`] undoes what it did when dropped).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::procfs;
use crate::ptrace::Tid;
use crate::sys::cuda::{CudaError, CudaLibrary};

/// A process's CUDA state as the driver reports it (`CUprocessState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuState {
    Running,
    /// CUDA calls block.
    Locked,
    /// Device memory is in host memory; the GPU is released.
    Checkpointed,
    /// A checkpoint or restore of it failed: the driver cannot use it again.
    Failed,
    /// A state of a newer driver (a checkpoint or restore under way).
    Other(i32),
}

impl GpuState {
    fn of_code(code: i32) -> GpuState {
        match code {
            0 => GpuState::Running,
            1 => GpuState::Locked,
            2 => GpuState::Checkpointed,
            3 => GpuState::Failed,
            n => GpuState::Other(n),
        }
    }
}

/// What the image keeps of a CUDA process (`ProcessRecord::cuda`, format 23): the state the
/// driver had it in before the checkpoint, which the restart brings it back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaRecord {
    pub before: GpuState,
    /// `cuDriverGetVersion` of the checkpoint's driver (12080 = 12.8).
    pub driver_version: i32,
}

/// The driver's checkpoint calls, by host pid: [`LibCuda`] in ckpt, a stand-in in the tests.
pub trait Driver: Send + Sync {
    fn version(&self) -> i32;
    fn state(&self, pid: Tid) -> std::result::Result<GpuState, CudaError>;
    fn lock(&self, pid: Tid, timeout: Duration) -> std::result::Result<(), CudaError>;
    fn checkpoint(&self, pid: Tid) -> std::result::Result<(), CudaError>;
    fn restore(&self, pid: Tid) -> std::result::Result<(), CudaError>;
    fn unlock(&self, pid: Tid) -> std::result::Result<(), CudaError>;
}

/// The driver of this machine, through `libcuda.so.1`.
struct LibCuda {
    lib: CudaLibrary,
    version: i32,
    initialized: OnceLock<()>,
}

impl LibCuda {
    /// `cuInit`, once, before the first call that acts on a process (the driver's restore needs
    /// it in the caller, or persistence mode), not at loading: a restart loads the driver
    /// before it starts the job's init, which would inherit what cuInit opens. A failure (no
    /// GPU visible) is the driver's to report at the call that needs it.
    fn lib(&self) -> &CudaLibrary {
        self.initialized.get_or_init(|| {
            if let Err(e) = self.lib.init() {
                warn!("cuInit: {e}");
            }
        });
        &self.lib
    }
}

impl Driver for LibCuda {
    fn version(&self) -> i32 {
        self.version
    }
    fn state(&self, pid: Tid) -> std::result::Result<GpuState, CudaError> {
        self.lib().process_state(pid).map(GpuState::of_code)
    }
    fn lock(&self, pid: Tid, timeout: Duration) -> std::result::Result<(), CudaError> {
        self.lib().lock(pid, timeout.as_millis().clamp(1, u32::MAX as u128) as u32)
    }
    fn checkpoint(&self, pid: Tid) -> std::result::Result<(), CudaError> {
        self.lib().checkpoint(pid)
    }
    fn restore(&self, pid: Tid) -> std::result::Result<(), CudaError> {
        self.lib().restore(pid)
    }
    fn unlock(&self, pid: Tid) -> std::result::Result<(), CudaError> {
        self.lib().unlock(pid)
    }
}

/// The driver, loaded once per ckpt process, the first time a job (or an image) has a CUDA
/// process.
pub fn driver() -> std::result::Result<Arc<dyn Driver>, String> {
    static DRIVER: OnceLock<std::result::Result<Arc<dyn Driver>, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let lib = CudaLibrary::load().map_err(|e| e.to_string())?;
            let version = lib.driver_version().unwrap_or(0);
            info!(version, "NVIDIA driver loaded for the job's CUDA processes");
            Ok(Arc::new(LibCuda { lib, version, initialized: OnceLock::new() }) as Arc<dyn Driver>)
        })
        .clone()
}

/// The driver, for the CUDA processes `pids` (host pids, or pids in the job at a restart), or an
/// error that names them and says what cannot be done (`purpose`) without it.
pub fn driver_for(pids: impl Iterator<Item = Tid>, purpose: &str) -> Result<Arc<dyn Driver>> {
    driver().map_err(|problem| {
        let pids: Vec<String> = pids.map(|p| p.to_string()).collect();
        Error::NoGpuDriver { pids: pids.join(", "), problem: format!("{problem}: {purpose}") }
    })
}

/// Where a process's GPU descriptors and mappings point. A test's stand-in driver names its
/// own device file (`CKPT_TEST_GPU_DEVICE`).
fn device_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| crate::testhooks::var("CKPT_TEST_GPU_DEVICE").unwrap_or_else(|| "/dev/nvidia".into()))
}

/// Whether `path` (a descriptor's or a mapping's) is an NVIDIA device.
pub fn is_gpu_device(path: &str) -> bool {
    path.starts_with(device_prefix())
}

/// A process of the job that holds an NVIDIA device: a CUDA process, or one that inherited the
/// descriptors of one (a child forked after CUDA started, as PyTorch's DataLoader workers are,
/// or a launcher that asked NVML about the GPU), with the mappings of the device fork copied
/// (some of the driver's are: seen on an H200 with driver 580), which it never uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub pid: Tid,
    pub pid_in_job: Tid,
    pub maps_device: bool,
}

/// How process `pid` holds an NVIDIA device: (by descriptor, by mapping). A process that
/// ended meanwhile holds none.
fn holds_gpu(pid: Tid) -> (bool, bool) {
    let by_fd = procfs::fds(pid).unwrap_or_default().into_iter().any(|fd| procfs::readlink(&format!("/proc/{pid}/fd/{fd}")).is_ok_and(|t| is_gpu_device(&t)));
    let by_map = std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.lines().any(|l| l.split_whitespace().nth(5).is_some_and(is_gpu_device)));
    (by_fd, by_map)
}

/// The job's processes (host pids) that hold an NVIDIA device.
pub fn holders(pids: &[Tid]) -> Vec<Holder> {
    pids.iter()
        .filter_map(|&pid| {
            let (by_fd, maps_device) = holds_gpu(pid);
            (by_fd || maps_device).then_some(())?;
            Some(Holder { pid, pid_in_job: procfs::ns_tid(pid).ok()?, maps_device })
        })
        .collect()
}

/// How long a lock may wait for the process's CUDA calls under way.
pub fn lock_timeout() -> Duration {
    let ms = std::env::var("CKPT_GPU_LOCK_TIMEOUT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    Duration::from_millis(ms)
}

/// One process whose GPU state ckpt changed, and what it changed.
#[derive(Debug)]
struct Held {
    pid: Tid,
    pid_in_job: Tid,
    before: GpuState,
    /// Locked by ckpt (to unlock after).
    locked: bool,
    /// Checkpointed by ckpt (to restore after).
    checkpointed: bool,
}

/// The job's CUDA processes with their GPU state in their memory, from before the freeze until
/// [`Suspended::resume`] (the job goes on) or [`Suspended::forget`] (it is killed). Dropped
/// otherwise, it resumes them: no failure leaves a process locked.
pub struct Suspended {
    driver: Arc<dyn Driver>,
    held: Vec<Held>,
    locked_at: Instant,
    /// Time from the first lock until every process was checkpointed.
    pub suspend_ms: f64,
    /// Host memory the driver's checkpoint added to the processes (resident after, less
    /// before): the device memory they held, about.
    pub bytes: u64,
    /// The processes (host pids) that map a device and that the driver says are no CUDA
    /// processes: the capture records those mappings as untouchable address space
    /// (`memory::Backing::GpuInherited`), and refuses any other mapping of a device.
    pub left_alone: Vec<Tid>,
    finished: bool,
}

/// `CUDA_ERROR_NOT_INITIALIZED`: the driver's answer for the state of a process that never
/// started CUDA (seen on an H200, driver 580), a forked worker of a CUDA process too.
const NOT_A_CUDA_PROCESS: i32 = 3;

/// Runs `step` for each item at once, one thread per item (the driver's calls for one process
/// wait on that process alone); the results in the items' order.
fn each_at_once<T: Sync, R: Send>(items: &[T], step: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&step).collect();
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|i| s.spawn(|| step(i))).collect();
        handles.into_iter().map(|h| h.join().expect("a driver call panicked")).collect()
    })
}

fn resident_bytes(pid: Tid) -> u64 {
    procfs::status(pid).ok().and_then(|s| s.vmrss).unwrap_or(0) * 1024
}

impl Suspended {
    /// Locks every CUDA process of `holders`, then checkpoints each. A process the driver has
    /// locked or checkpointed already (by someone else) is left as it is and brought back to
    /// that state; one whose state is failed is refused. A holder the driver does not know
    /// that maps no device inherited its descriptors and is left alone (they are opened again
    /// at restart). On failure, what was done is undone and the first error names its process.
    pub fn suspend(driver: Arc<dyn Driver>, holders: &[Holder], timeout: Duration) -> Result<Suspended> {
        let locked_at = Instant::now();
        let mut s = Suspended { driver, held: Vec::new(), locked_at, suspend_ms: 0.0, bytes: 0, left_alone: Vec::new(), finished: false };
        let driver = &*s.driver;
        let states = each_at_once(holders, |h| driver.state(h.pid));
        let mut first_error = None;
        for (&Holder { pid, pid_in_job, maps_device }, state) in holders.iter().zip(states) {
            match state {
                // No CUDA process: its descriptors are opened again at restart, and what it maps
                // of the device (inherited) comes back as address space that cannot be touched.
                Err(e) if !maps_device || e.code == NOT_A_CUDA_PROCESS => {
                    tracing::debug!(pid, maps_device, "holds an NVIDIA device and no CUDA state ({e}): left as it is");
                    if maps_device {
                        s.left_alone.push(pid);
                    }
                }
                Ok(before @ (GpuState::Running | GpuState::Locked)) => s.held.push(Held { pid, pid_in_job, before, locked: false, checkpointed: false }),
                // Checkpointed by its owner: its memory holds its GPU state already, and stays so.
                Ok(GpuState::Checkpointed) => s.held.push(Held { pid, pid_in_job, before: GpuState::Checkpointed, locked: false, checkpointed: false }),
                Ok(GpuState::Failed) => {
                    first_error.get_or_insert(Error::Gpu {
                        pid,
                        step: "checkpoint its GPU state",
                        problem: "its CUDA state is failed (an earlier checkpoint or restore of it failed); the program cannot use the GPU any more".into(),
                    });
                }
                Ok(GpuState::Other(n)) => {
                    first_error.get_or_insert(Error::Gpu {
                        pid,
                        step: "checkpoint its GPU state",
                        problem: format!("it is in CUDA process state {n} (a checkpoint or restore under way?)"),
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(Error::Gpu { pid, step: "tell its CUDA state", problem: e.to_string() });
                }
            }
        }
        if let Some(e) = first_error {
            s.finished = true;
            return Err(e);
        }
        let resident_before: Vec<u64> = s.held.iter().map(|h| resident_bytes(h.pid)).collect();
        let to_lock: Vec<usize> = (0..s.held.len()).filter(|&i| s.held[i].before == GpuState::Running).collect();
        let locks = each_at_once(&to_lock, |&i| driver.lock(s.held[i].pid, timeout));
        let mut failure = None;
        for (&i, r) in to_lock.iter().zip(locks) {
            match r {
                Ok(()) => s.held[i].locked = true,
                Err(e) => {
                    failure.get_or_insert(Error::Gpu {
                        pid: s.held[i].pid,
                        step: "lock its CUDA calls",
                        problem: format!("{e} (waited at most {} ms for its CUDA calls under way; CKPT_GPU_LOCK_TIMEOUT_MS sets that)", timeout.as_millis()),
                    });
                }
            }
        }
        if failure.is_none() {
            let to_checkpoint: Vec<usize> = (0..s.held.len()).filter(|&i| s.held[i].before != GpuState::Checkpointed).collect();
            let done = each_at_once(&to_checkpoint, |&i| driver.checkpoint(s.held[i].pid));
            for (&i, r) in to_checkpoint.iter().zip(done) {
                match r {
                    Ok(()) => s.held[i].checkpointed = true,
                    Err(e) => {
                        failure.get_or_insert(Error::Gpu { pid: s.held[i].pid, step: "checkpoint its GPU state", problem: e.to_string() });
                    }
                }
            }
        }
        if let Some(e) = failure {
            // Dropped, `s` restores and unlocks what it did.
            return Err(e);
        }
        s.suspend_ms = locked_at.elapsed().as_secs_f64() * 1e3;
        s.bytes = s.held.iter().zip(resident_before).map(|(h, before)| resident_bytes(h.pid).saturating_sub(before)).sum();
        info!(processes = s.held.len(), ms = s.suspend_ms, bytes = s.bytes, "CUDA processes locked and checkpointed by the driver");
        Ok(s)
    }

    /// Whether the driver holds any process's GPU state for ckpt (some process was locked or
    /// checkpointed by it, or by its owner).
    pub fn holds_processes(&self) -> bool {
        !self.held.is_empty()
    }

    /// The record of each process, by its pid in the job.
    pub fn records(&self) -> impl Iterator<Item = (Tid, CudaRecord)> + '_ {
        let driver_version = self.driver.version();
        self.held.iter().map(move |h| (h.pid_in_job, CudaRecord { before: h.before, driver_version }))
    }

    /// Restores and unlocks every process ckpt checkpointed and locked, once the job runs
    /// again; returns the time from the first lock until now (what the job's CUDA calls
    /// waited). A process the driver could not restore is named with the driver's error.
    pub fn resume(mut self) -> Result<f64> {
        self.finished = true;
        self.undo()?;
        Ok(self.locked_at.elapsed().as_secs_f64() * 1e3)
    }

    /// The job is killed as it is: nothing to give back.
    pub fn forget(mut self) {
        self.finished = true;
    }

    fn undo(&self) -> Result<()> {
        let driver = &*self.driver;
        let restored = each_at_once(&self.held, |h| if h.checkpointed { driver.restore(h.pid) } else { Ok(()) });
        let mut first_error = None;
        let mut unlock = Vec::new();
        for (h, r) in self.held.iter().zip(restored) {
            match r {
                Ok(()) if h.locked => unlock.push(h),
                Ok(()) => {}
                Err(e) => {
                    let state = match driver.state(h.pid) {
                        Ok(GpuState::Failed) => "; its CUDA state is now failed: the program cannot use the GPU any more".to_string(),
                        Ok(s) => format!("; its CUDA state is {s:?}"),
                        Err(_) => String::new(),
                    };
                    first_error.get_or_insert(Error::Gpu { pid: h.pid, step: "restore its GPU state", problem: format!("{e}{state}") });
                }
            }
        }
        for (h, r) in unlock.iter().zip(each_at_once(&unlock, |h| driver.unlock(h.pid))) {
            if let Err(e) = r {
                first_error.get_or_insert(Error::Gpu { pid: h.pid, step: "unlock its CUDA calls", problem: e.to_string() });
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Suspended {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Err(e) = self.undo() {
            warn!("giving the job's CUDA processes their GPU back: {e}");
        }
    }
}

/// At a restart, once the job runs: brings each CUDA process ((host pid, record)) back to the
/// state it had before its checkpoint (restored, and unlocked if it was running), all at once.
pub fn resume_restarted(driver: &dyn Driver, processes: &[(Tid, CudaRecord)]) -> Result<()> {
    let steps = each_at_once(processes, |&(pid, rec)| -> Result<()> {
        if rec.before == GpuState::Checkpointed {
            return Ok(());
        }
        driver.restore(pid).map_err(|e| Error::Gpu { pid, step: "restore its GPU state", problem: e.to_string() })?;
        if rec.before == GpuState::Running {
            driver.unlock(pid).map_err(|e| Error::Gpu { pid, step: "unlock its CUDA calls", problem: e.to_string() })?;
        }
        Ok(())
    });
    steps.into_iter().collect::<Result<Vec<()>>>().map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// A driver that keeps each process's state, logs every call, and fails the calls it is
    /// told to.
    #[derive(Default)]
    struct StandIn {
        states: Mutex<HashMap<Tid, GpuState>>,
        calls: Mutex<Vec<String>>,
        failing: Mutex<Vec<(&'static str, Tid)>>,
    }

    impl StandIn {
        fn with(states: &[(Tid, GpuState)]) -> Arc<StandIn> {
            let s = StandIn::default();
            s.states.lock().unwrap().extend(states.iter().copied());
            Arc::new(s)
        }
        fn fail(&self, call: &'static str, pid: Tid) {
            self.failing.lock().unwrap().push((call, pid));
        }
        fn step(&self, call: &'static str, pid: Tid, from: &[GpuState], to: GpuState) -> std::result::Result<(), CudaError> {
            self.calls.lock().unwrap().push(format!("{call} {pid}"));
            let err = |code, name: &str| Err(CudaError { code, name: name.into(), text: String::new() });
            if self.failing.lock().unwrap().contains(&(call, pid)) {
                if call == "restore" {
                    self.states.lock().unwrap().insert(pid, GpuState::Failed);
                }
                return err(999, "CUDA_ERROR_UNKNOWN");
            }
            let mut states = self.states.lock().unwrap();
            let state = states.get_mut(&pid).ok_or(CudaError { code: 3, name: "CUDA_ERROR_NOT_INITIALIZED".into(), text: String::new() })?;
            if !from.contains(state) {
                return err(401, "CUDA_ERROR_ILLEGAL_STATE");
            }
            *state = to;
            Ok(())
        }
        fn state_of(&self, pid: Tid) -> GpuState {
            self.states.lock().unwrap()[&pid]
        }
        fn calls(&self) -> Vec<String> {
            let mut c = self.calls.lock().unwrap().clone();
            // Calls of one step run at once: their order within it is not the test's.
            c.sort_by_key(|s| (["state", "lock", "checkpoint", "restore", "unlock"].iter().position(|p| s.starts_with(p)), s.clone()));
            c
        }
    }

    impl Driver for StandIn {
        fn version(&self) -> i32 {
            13000
        }
        fn state(&self, pid: Tid) -> std::result::Result<GpuState, CudaError> {
            self.calls.lock().unwrap().push(format!("state {pid}"));
            if self.failing.lock().unwrap().contains(&("state", pid)) {
                return Err(CudaError { code: 999, name: "CUDA_ERROR_UNKNOWN".into(), text: String::new() });
            }
            // The real driver's answer for a process that never started CUDA.
            self.states.lock().unwrap().get(&pid).copied().ok_or(CudaError { code: 3, name: "CUDA_ERROR_NOT_INITIALIZED".into(), text: String::new() })
        }
        fn lock(&self, pid: Tid, _: Duration) -> std::result::Result<(), CudaError> {
            self.step("lock", pid, &[GpuState::Running], GpuState::Locked)
        }
        fn checkpoint(&self, pid: Tid) -> std::result::Result<(), CudaError> {
            self.step("checkpoint", pid, &[GpuState::Locked], GpuState::Checkpointed)
        }
        fn restore(&self, pid: Tid) -> std::result::Result<(), CudaError> {
            self.step("restore", pid, &[GpuState::Checkpointed], GpuState::Locked)
        }
        fn unlock(&self, pid: Tid) -> std::result::Result<(), CudaError> {
            self.step("unlock", pid, &[GpuState::Locked], GpuState::Running)
        }
    }

    const T: Duration = Duration::from_secs(1);

    fn holders_of(pids: &[(Tid, Tid)]) -> Vec<Holder> {
        pids.iter().map(|&(pid, pid_in_job)| Holder { pid, pid_in_job, maps_device: true }).collect()
    }

    #[test]
    fn a_process_that_only_inherited_the_device_is_left_alone() {
        let d = StandIn::with(&[(10, GpuState::Running)]);
        let worker = Holder { pid: 12, pid_in_job: 4, maps_device: false };
        let mapping_worker = Holder { pid: 13, pid_in_job: 5, maps_device: true };
        let s = Suspended::suspend(d.clone(), &[holders_of(&[(10, 2)])[0], worker, mapping_worker], T).unwrap();
        assert_eq!(s.records().map(|(pid_in_job, _)| pid_in_job).collect::<Vec<_>>(), [2]);
        // Only the one whose mappings the capture must know of.
        assert_eq!(s.left_alone, [13]);
        s.resume().unwrap();
        // One that maps the device and whose state the driver cannot tell for another reason
        // may be a CUDA process: refused.
        d.fail("state", 13);
        let e = Suspended::suspend(d.clone(), &[mapping_worker], T).err().unwrap().to_string();
        assert!(e.starts_with("pid 13: the NVIDIA driver could not tell its CUDA state"), "{e}");
        let e = Suspended::suspend(d.clone(), &[worker, Holder { pid: 13, ..worker }], T);
        assert!(e.is_ok(), "one that maps nothing holds no GPU state: {:?}", e.err());
    }

    #[test]
    fn every_process_is_locked_before_any_is_checkpointed_and_all_run_again_after() {
        let d = StandIn::with(&[(10, GpuState::Running), (11, GpuState::Running)]);
        let s = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).unwrap();
        assert_eq!(d.state_of(10), GpuState::Checkpointed);
        let log = d.calls.lock().unwrap().clone();
        let last_lock = log.iter().rposition(|c| c.starts_with("lock")).unwrap();
        let first_checkpoint = log.iter().position(|c| c.starts_with("checkpoint")).unwrap();
        assert!(last_lock < first_checkpoint, "{log:?}");
        let records: Vec<_> = s.records().collect();
        assert_eq!(
            records,
            vec![(2, CudaRecord { before: GpuState::Running, driver_version: 13000 }), (3, CudaRecord { before: GpuState::Running, driver_version: 13000 })]
        );
        s.resume().unwrap();
        assert_eq!((d.state_of(10), d.state_of(11)), (GpuState::Running, GpuState::Running));
    }

    #[test]
    fn a_lock_that_fails_unlocks_the_others_and_names_its_process() {
        let d = StandIn::with(&[(10, GpuState::Running), (11, GpuState::Running)]);
        d.fail("lock", 11);
        let e = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).err().unwrap().to_string();
        assert!(e.starts_with("pid 11: the NVIDIA driver could not lock"), "{e}");
        assert!(e.contains("CKPT_GPU_LOCK_TIMEOUT_MS"), "{e}");
        assert_eq!((d.state_of(10), d.state_of(11)), (GpuState::Running, GpuState::Running));
        assert!(!d.calls().iter().any(|c| c.starts_with("checkpoint")), "{:?}", d.calls());
    }

    #[test]
    fn a_checkpoint_that_fails_restores_and_unlocks_the_others() {
        let d = StandIn::with(&[(10, GpuState::Running), (11, GpuState::Running)]);
        d.fail("checkpoint", 10);
        let e = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).err().unwrap().to_string();
        assert!(e.starts_with("pid 10: the NVIDIA driver could not checkpoint"), "{e}");
        assert_eq!((d.state_of(10), d.state_of(11)), (GpuState::Running, GpuState::Running));
        assert_eq!(d.calls(), ["state 10", "state 11", "lock 10", "lock 11", "checkpoint 10", "checkpoint 11", "restore 11", "unlock 10", "unlock 11"]);
    }

    #[test]
    fn a_suspension_dropped_on_a_failed_checkpoint_gives_the_gpu_back() {
        let d = StandIn::with(&[(10, GpuState::Running)]);
        let s = Suspended::suspend(d.clone(), &holders_of(&[(10, 2)]), T).unwrap();
        drop(s);
        assert_eq!(d.state_of(10), GpuState::Running);
    }

    #[test]
    fn a_job_killed_after_its_checkpoint_is_left_checkpointed() {
        let d = StandIn::with(&[(10, GpuState::Running)]);
        Suspended::suspend(d.clone(), &holders_of(&[(10, 2)]), T).unwrap().forget();
        assert_eq!(d.state_of(10), GpuState::Checkpointed);
        assert!(!d.calls().iter().any(|c| c.starts_with("restore")));
    }

    #[test]
    fn processes_locked_or_checkpointed_by_their_owner_are_brought_back_to_that() {
        let d = StandIn::with(&[(10, GpuState::Locked), (11, GpuState::Checkpointed)]);
        let s = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).unwrap();
        assert_eq!((d.state_of(10), d.state_of(11)), (GpuState::Checkpointed, GpuState::Checkpointed));
        let records: Vec<_> = s.records().map(|(_, r)| r.before).collect();
        assert_eq!(records, [GpuState::Locked, GpuState::Checkpointed]);
        s.resume().unwrap();
        assert_eq!((d.state_of(10), d.state_of(11)), (GpuState::Locked, GpuState::Checkpointed));
    }

    #[test]
    fn a_process_whose_cuda_state_failed_is_refused_before_anything_is_locked() {
        let d = StandIn::with(&[(10, GpuState::Running), (11, GpuState::Failed)]);
        let e = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).err().unwrap().to_string();
        assert!(e.starts_with("pid 11: ") && e.contains("failed"), "{e}");
        assert_eq!(d.calls(), ["state 10", "state 11"]);
    }

    #[test]
    fn a_restore_that_fails_is_reported_with_the_failed_state_and_the_others_run_again() {
        let d = StandIn::with(&[(10, GpuState::Running), (11, GpuState::Running)]);
        let s = Suspended::suspend(d.clone(), &holders_of(&[(10, 2), (11, 3)]), T).unwrap();
        d.fail("restore", 10);
        let e = s.resume().unwrap_err().to_string();
        assert!(e.starts_with("pid 10: the NVIDIA driver could not restore") && e.contains("failed"), "{e}");
        assert_eq!(d.state_of(11), GpuState::Running);
    }

    #[test]
    fn a_restarted_process_comes_back_to_the_state_it_had() {
        let d = StandIn::with(&[(20, GpuState::Checkpointed), (21, GpuState::Checkpointed), (22, GpuState::Checkpointed)]);
        let rec = |before| CudaRecord { before, driver_version: 13000 };
        resume_restarted(&*d, &[(20, rec(GpuState::Running)), (21, rec(GpuState::Locked)), (22, rec(GpuState::Checkpointed))]).unwrap();
        assert_eq!([d.state_of(20), d.state_of(21), d.state_of(22)], [GpuState::Running, GpuState::Locked, GpuState::Checkpointed]);
        d.fail("restore", 20);
        d.states.lock().unwrap().insert(20, GpuState::Checkpointed);
        let e = resume_restarted(&*d, &[(20, rec(GpuState::Running))]).unwrap_err().to_string();
        assert!(e.starts_with("pid 20: the NVIDIA driver could not restore"), "{e}");
    }
}
