//! Every task the restorer traces, so that a failed restore kills and collects them all: a traced
//! task that dies is reported to its tracer first, and until it is collected neither its parent
//! nor the job's init can see it gone.

use ckpt_core::ptrace::{sys, StopKind, Tid};

#[derive(Default)]
pub struct Tracees {
    /// (process, thread) pairs, as the restorer sees them.
    tasks: Vec<(Tid, Tid)>,
    disarmed: bool,
}

impl Tracees {
    pub fn add(&mut self, pid: Tid, tid: Tid) {
        self.tasks.push((pid, tid));
    }

    /// Forgets a task that has ended and been collected.
    pub fn remove(&mut self, tid: Tid) {
        self.tasks.retain(|&(_, t)| t != tid);
    }

    /// The restore succeeded: the tasks are released, not killed.
    pub fn disarm(&mut self) {
        self.disarmed = true;
    }
}

impl Drop for Tracees {
    fn drop(&mut self) {
        if self.disarmed {
            return;
        }
        for &(pid, _) in &self.tasks {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        // A leader's end is reported only after its other threads are collected.
        let (leaders, others): (Vec<_>, Vec<_>) = self.tasks.iter().partition(|(p, t)| p == t);
        for &(_, tid) in others.iter().chain(leaders.iter()) {
            while let Ok(stop) = sys::wait(tid) {
                if matches!(stop, StopKind::Exited(_) | StopKind::Killed(_)) {
                    break;
                }
            }
        }
    }
}
