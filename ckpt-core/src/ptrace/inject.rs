//! Running system calls inside a stopped thread.
//!
//! The thread's registers are pointed at a `syscall` instruction somewhere in its address space,
//! loaded with the call's number and arguments, and the thread is stepped from system-call entry
//! to exit (PTRACE_SYSCALL): two stops a call. Where the thread's SIGTRAP is free
//! ([`Injector::step_calls`], the capture's processes) it is single-stepped over the instruction
//! instead, which the kernel reports once, at the call's exit: one stop. Either way the thread
//! never executes the instruction after the `syscall`: at the exit stop the tracer reads the
//! result and either injects the next call or puts the thread's own registers back. This is
//! what lets the restore unmap the very page holding the instruction.
//!
//! The thread's signals are blocked while calls are injected, but SIGSTOP cannot be: one
//! pending in a stopped process (sent again while it was stopped, which the SIGCONT that
//! continues it would discard) is taken on the way to the injected call. It is held back (the
//! tracer resumes without it) and sent again to the thread when the injector is done with it, so
//! that the process is as it was. An injector dropped without [`Injector::finish`] (an error on
//! the way) puts the thread's registers back too: a failed checkpoint leaves the job running as
//! it was, not at an injected call.

use std::io;

use super::regs::Regs;
use super::sys::{self, StopKind, Tid};

/// A thread in a ptrace stop, driven one system call at a time.
pub struct Injector {
    tid: Tid,
    syscall_insn: u64,
    base: Regs,
    injected: bool,
    new_tasks: Vec<Tid>,
    /// SIGSTOPs taken during injected calls, sent again when done.
    held_stops: usize,
    /// The registers were put back ([`Injector::finish`]) or left to the caller
    /// ([`Injector::abandon`]).
    settled: bool,
    /// ptrace stops waited for: what injected work costs, counted (see [`Injector::stops`]).
    stops: u32,
    /// Calls are made by single-stepping over the `syscall` instruction: one stop each, not
    /// two (see [`Injector::step_calls`]).
    stepping: bool,
}

impl Injector {
    /// Takes over a stopped thread; `syscall_insn` is the address of a `syscall` instruction
    /// (bytes 0f 05) mapped executable in its address space.
    pub fn new(tid: Tid, syscall_insn: u64) -> io::Result<Injector> {
        let base = Regs::read(tid)?;
        Ok(Injector { tid, syscall_insn, base, injected: false, new_tasks: Vec::new(), held_stops: 0, settled: false, stops: 0, stepping: false })
    }

    pub fn tid(&self) -> Tid {
        self.tid
    }

    /// The registers the thread had when it was taken over.
    pub fn base(&self) -> &Regs {
        &self.base
    }

    /// The ptrace stops the thread made for the calls and code injected so far: two per call,
    /// one per run of injected code, and any event on the way. What the capture's freeze costs
    /// per process is mostly these round trips; a count, unlike a time, is the same on a busy
    /// machine.
    pub fn stops(&self) -> u32 {
        self.stops
    }

    /// Uses another `syscall` instruction from now on (the old one is about to be unmapped).
    pub fn set_syscall_insn(&mut self, addr: u64) {
        self.syscall_insn = addr;
    }

    /// Threads the injected calls created (clone with CLONE_THREAD), in creation order.
    pub fn take_new_tasks(&mut self) -> Vec<Tid> {
        std::mem::take(&mut self.new_tasks)
    }

    /// Makes the calls from now on in one stop each: the thread is single-stepped over the
    /// `syscall` instruction, and the kernel reports the step once, at the call's exit. That
    /// report is a SIGTRAP forced on the thread, which would reset a blocked or ignored SIGTRAP
    /// to its default action and merge with one pending: so SIGTRAP is let through the mask
    /// for each call, and `trap_free` (the thread's SIGTRAP neither ignored nor pending, see
    /// [`super::batch::trap_is_free`]) must hold, or calls keep the two stops of system-call
    /// tracing.
    pub fn step_calls(&mut self, trap_free: bool) {
        self.stepping = trap_free;
    }

    /// Runs one system call and returns the kernel's raw result (negative errno on failure).
    pub fn raw(&mut self, nr: libc::c_long, args: &[u64]) -> io::Result<i64> {
        if self.stepping {
            return self.raw_stepped(nr, args);
        }
        self.set_call(nr, args)?;

        // Entry stop, then exit stop; a clone in between reports the new thread first.
        let mut syscall_stops = 0;
        while syscall_stops < 2 {
            sys::resume_syscall(self.tid, 0)?;
            self.stops += 1;
            match sys::wait(self.tid)? {
                StopKind::Syscall => syscall_stops += 1,
                other => self.on_the_way(other, nr)?,
            }
        }
        Ok(Regs::read(self.tid)?.rax as i64)
    }

    /// A stop on the way through injected call `nr` that does not end it, in either way of
    /// making it: a clone reports its new thread, a SIGSTOP is held back, any other signal or
    /// the thread's end is an error.
    fn on_the_way(&mut self, stop: StopKind, nr: libc::c_long) -> io::Result<()> {
        match stop {
            StopKind::NewTaskEvent => self.new_tasks.push(sys::event_msg(self.tid)? as Tid),
            StopKind::EventStop(_) | StopKind::Syscall => {}
            StopKind::Signal(libc::SIGSTOP) => self.held_stops += 1,
            StopKind::Signal(sig) => {
                return Err(io::Error::other(format!(
                    "task {}: signal {sig} arrived during an injected system call {nr} (signals should be blocked)",
                    self.tid
                )))
            }
            StopKind::Exited(_) | StopKind::Killed(_) | StopKind::OtherEvent(_) => {
                return Err(io::Error::other(format!("task {} ended during injected system call {nr}", self.tid)))
            }
        }
        Ok(())
    }

    /// Points the thread at the `syscall` instruction with the call's number and arguments.
    fn set_call(&mut self, nr: libc::c_long, args: &[u64]) -> io::Result<()> {
        let mut regs = self.base;
        regs.rip = self.syscall_insn;
        regs.rax = nr as u64;
        // Not in a system call: nothing for the kernel to restart.
        regs.orig_rax = u64::MAX;
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        (regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
        regs.write(self.tid)?;
        self.injected = true;
        Ok(())
    }

    /// [`Injector::raw`] in one stop: single-stepped over the `syscall` instruction.
    fn raw_stepped(&mut self, nr: libc::c_long, args: &[u64]) -> io::Result<i64> {
        self.set_call(nr, args)?;
        let mask = sys::get_sigmask(self.tid)?;
        sys::set_sigmask(self.tid, mask & !SIGTRAP_BIT)?;
        let stepped = self.step_over_call(nr);
        sys::set_sigmask(self.tid, mask)?;
        stepped?;
        let after = Regs::read(self.tid)?;
        if after.rip != self.syscall_insn + 2 {
            return Err(io::Error::other(format!("task {}: stepping over injected system call {nr} stopped at {:#x}, not after it", self.tid, after.rip)));
        }
        Ok(after.rax as i64)
    }

    /// Steps the thread over the call it is set at, until the step's report (a SIGTRAP stop);
    /// a clone in between reports the new thread first.
    fn step_over_call(&mut self, nr: libc::c_long) -> io::Result<()> {
        sys::single_step(self.tid)?;
        loop {
            self.stops += 1;
            match sys::wait(self.tid)? {
                // Stopped before delivery: the next resume drops it.
                StopKind::Signal(libc::SIGTRAP) => return Ok(()),
                StopKind::Syscall => {}
                other => self.on_the_way(other, nr)?,
            }
            sys::single_step(self.tid)?;
        }
    }

    /// Runs one system call; a negative result becomes an error naming the call.
    pub fn call(&mut self, name: &str, nr: libc::c_long, args: &[u64]) -> io::Result<u64> {
        tracing::trace!(tid = self.tid, name, "injected call");
        let r = self.raw(nr, args)?;
        call_result(self.tid, name, r)
    }

    /// Runs code of the task's own at `entry`, with `args` in rdi, rsi, rdx and rcx, until it stops at a
    /// breakpoint (int3), and returns the registers there. The thread's signal mask must let
    /// SIGTRAP through (see [`super::batch`]); any other signal is an error.
    pub fn run_to_breakpoint(&mut self, entry: u64, args: [u64; 4]) -> io::Result<Regs> {
        let mut regs = self.base;
        regs.rip = entry;
        // Not in a system call: nothing for the kernel to restart when the code starts.
        regs.orig_rax = u64::MAX;
        (regs.rdi, regs.rsi, regs.rdx, regs.rcx) = (args[0], args[1], args[2], args[3]);
        regs.write(self.tid)?;
        self.injected = true;
        sys::resume(self.tid, 0)?;
        loop {
            self.stops += 1;
            match sys::wait(self.tid)? {
                // The breakpoint's SIGTRAP, stopped before delivery: the next resume drops it.
                StopKind::Signal(libc::SIGTRAP) => return Regs::read(self.tid),
                StopKind::Signal(libc::SIGSTOP) => {
                    self.held_stops += 1;
                    sys::resume(self.tid, 0)?
                }
                StopKind::Signal(sig) => return Err(io::Error::other(format!("task {}: signal {sig} arrived while it ran injected code", self.tid))),
                StopKind::Exited(_) | StopKind::Killed(_) => return Err(io::Error::other(format!("task {} ended while it ran injected code", self.tid))),
                _ => sys::resume(self.tid, 0)?,
            }
        }
    }

    /// Puts the thread's own registers back, ready to be released. A system call the thread was
    /// stopped in is rewound so it runs again: the kernel's own restart logic no longer applies
    /// once we have stepped the thread through system-call stops.
    pub fn finish(mut self) -> io::Result<()> {
        self.settled = true;
        if self.injected {
            self.base.with_restart_resolved(true).write(self.tid)?;
        }
        Ok(())
    }

    /// Leaves the registers to the caller (who will write the final ones).
    pub fn abandon(mut self) {
        self.settled = true;
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        if !self.settled && self.injected {
            // Best effort, on a way out that already carries an error.
            let _ = self.base.with_restart_resolved(true).write(self.tid);
        }
        for _ in 0..self.held_stops {
            if let Err(e) = sys::tkill(self.tid, libc::SIGSTOP) {
                tracing::warn!(tid = self.tid, "a SIGSTOP held back during injected calls could not be sent again: {e}");
            }
        }
    }
}

/// The raw result `raw` of system call `name` made in thread `tid`: a negative errno becomes an
/// error naming the call and the thread.
pub fn call_result(tid: Tid, name: &str, raw: i64) -> io::Result<u64> {
    if (-4095..0).contains(&raw) {
        let e = io::Error::from_raw_os_error(-raw as i32);
        return Err(io::Error::new(e.kind(), format!("task {tid}: {name} failed: {e}")));
    }
    Ok(raw as u64)
}

/// SIGTRAP's bit in a signal mask.
pub(super) const SIGTRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// Finds a `syscall` instruction in a block of code read from the task.
pub fn find_syscall_insn(code: &[u8], base: u64) -> Option<u64> {
    code.windows(2).position(|w| w == [0x0f, 0x05]).map(|i| base + i as u64)
}
