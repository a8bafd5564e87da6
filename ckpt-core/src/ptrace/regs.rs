//! Register state of a thread, as stored in the image.

use serde::{Deserialize, Serialize};

use super::sys::{self, Tid};

/// General-purpose registers plus fs/gs base: x86_64 `user_regs_struct`, field for field.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Regs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rax: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub orig_rax: u64,
    pub rip: u64,
    pub cs: u64,
    pub eflags: u64,
    pub rsp: u64,
    pub ss: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
}

// Kernel-internal return values a thread shows when it was stopped inside an interrupted system
// call. They never reach user space: the kernel either restarts the call or turns them into EINTR.
const ERESTARTSYS: i64 = -512;
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
const ERESTART_RESTARTBLOCK: i64 = -516;

/// The calls that end with a restart block (ERESTART_RESTARTBLOCK) which a restart makes again
/// from their registers (see [`Regs::with_restart_resolved`]).
const MADE_AGAIN_AFTER_A_RESTART: [i64; 4] = [libc::SYS_poll, libc::SYS_nanosleep, libc::SYS_clock_nanosleep, libc::SYS_futex];
const SYSCALL_INSN_LEN: u64 = 2;
const NR_RESTART_SYSCALL: u64 = 219;

/// The blocking calls that Linux ends with EINTR when their thread is merely stopped (a ptrace
/// interrupt, SIGSTOP), no handler run: signal(7), "Interruption of system calls and library
/// functions by stop signals" (epoll, System V semaphores, sigtimedwait, socket calls with
/// SO_RCVTIMEO/SO_SNDTIMEO), and the AIO waits that end the same way. x86_64 numbers.
const CUT_SHORT_BY_A_STOP: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_io_getevents,
    333, // io_pgetevents (not named by the libc crate)
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_sendmmsg,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_write,
    libc::SYS_writev,
];

/// What to do about a system call the thread was stopped in, when it resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptedCall {
    /// The call can run again from scratch (in the same or a new process).
    Restart,
    /// The kernel kept per-call state (a restart block); it survives in the same process only.
    RestartBlock,
}

/// Bytes of code read before a thread's return address to find the call it made: a `mov
/// imm32, %eax` (5 bytes) and the `syscall` instruction (2).
pub const CALL_SITE_LEN: usize = 7;

/// The call a `syscall` instruction was made for, when the code before it loads its number
/// right before it (`b8 NN NN NN NN 0f 05`: `mov $NR, %eax; syscall`, the way the C library
/// makes clock_nanosleep, nanosleep, poll and most futex calls) and the number is one of the
/// calls a restart makes again ([`MADE_AGAIN_AFTER_A_RESTART`]). Pure.
pub fn restartable_call_at(site: &[u8; CALL_SITE_LEN]) -> Option<u64> {
    let [0xb8, a, b, c, d, 0x0f, 0x05] = *site else { return None };
    let nr = u32::from_le_bytes([a, b, c, d]) as i64;
    MADE_AGAIN_AFTER_A_RESTART.contains(&nr).then_some(nr as u64)
}

impl Regs {
    pub fn read(tid: Tid) -> std::io::Result<Regs> {
        Ok(Regs::from(sys::get_regs(tid)?))
    }

    pub fn write(&self, tid: Tid) -> std::io::Result<()> {
        sys::set_regs(tid, &libc::user_regs_struct::from(*self))
    }

    /// Whether the thread stopped as it left one of the calls a stop alone ends with EINTR
    /// ([`CUT_SHORT_BY_A_STOP`]): the EINTR is the freeze's doing, unless a signal with a
    /// handler came with it (the caller knows).
    pub fn cut_short_by_the_stop(&self) -> bool {
        self.rax as i64 == -(libc::EINTR as i64) && CUT_SHORT_BY_A_STOP.contains(&(self.orig_rax as i64))
    }

    /// Makes a call [`Self::cut_short_by_the_stop`] one the kernel restarts when the thread
    /// resumes with no handler to run (as it does a `poll` cut short), or ends with EINTR if a
    /// handler runs first: what the program would have seen had the stop not happened. It is
    /// made again whole, with its full timeout: never early, at worst longer by what had passed.
    pub fn restart_after_the_stop(&mut self) {
        self.rax = ERESTARTNOHAND as u64;
    }

    /// Whether the thread was stopped inside `restart_syscall`: a call it made was cut short by
    /// an earlier stop and is being resumed from the kernel's restart block, which does not say
    /// which call it was. The address of the code that made it (the `syscall` instruction and
    /// what loaded its number) is [`CALL_SITE_LEN`] bytes before `rip`.
    pub fn resuming_a_call(&self) -> bool {
        self.orig_rax == NR_RESTART_SYSCALL && self.interrupted_call() == Some(InterruptedCall::RestartBlock)
    }

    /// Records `nr` as the call being resumed (see [`Self::resuming_a_call`]): here the kernel
    /// still resumes it through its restart block, and a restart makes it again from its
    /// registers, which still hold its arguments, instead of failing it with EINTR.
    pub fn resuming(&mut self, nr: u64) {
        self.orig_rax = nr;
    }

    /// Whether the thread was stopped inside a system call that the kernel meant to restart.
    pub fn interrupted_call(&self) -> Option<InterruptedCall> {
        if (self.orig_rax as i64) < 0 {
            return None;
        }
        match self.rax as i64 {
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => Some(InterruptedCall::Restart),
            ERESTART_RESTARTBLOCK => Some(InterruptedCall::RestartBlock),
            _ => None,
        }
    }

    /// The registers to resume with when the kernel will no longer do the restart itself (the
    /// thread is resumed from a system-call stop, or in a new process). `same_process` tells
    /// whether a restart block is still valid.
    pub fn with_restart_resolved(&self, same_process: bool) -> Regs {
        let mut r = *self;
        match self.interrupted_call() {
            None => {}
            Some(InterruptedCall::Restart) => {
                r.rax = r.orig_rax;
                r.rip -= SYSCALL_INSN_LEN;
            }
            Some(InterruptedCall::RestartBlock) if same_process => {
                r.rax = NR_RESTART_SYSCALL;
                r.rip -= SYSCALL_INSN_LEN;
            }
            // The kernel's restart block (the remaining time) is gone with the old process: a
            // call whose arguments are all still in their registers is made again whole, with
            // its full timeout (an absolute deadline stays exact): never early, at worst longer
            // by what had passed. Failing it with EINTR instead ended sleeps early (`sleep(10)`
            // returned 8 at once) and programs that take EINTR as fatal (util-linux `script`).
            Some(InterruptedCall::RestartBlock) if MADE_AGAIN_AFTER_A_RESTART.contains(&(self.orig_rax as i64)) => {
                r.rax = r.orig_rax;
                r.rip -= SYSCALL_INSN_LEN;
            }
            // A call already being restarted (restart_syscall) whose code did not tell which call
            // it was (see `restartable_call_at`): EINTR, which every caller of a sleep or a timed
            // wait must handle.
            Some(InterruptedCall::RestartBlock) => {
                r.rax = (-libc::EINTR as i64) as u64;
            }
        }
        // Tell the kernel there is no system call in progress, so it applies no restart logic of
        // its own on top of ours.
        r.orig_rax = u64::MAX;
        r
    }
}

macro_rules! convert_regs {
    ($($f:ident),*) => {
        impl From<libc::user_regs_struct> for Regs {
            fn from(r: libc::user_regs_struct) -> Regs { Regs { $($f: r.$f),* } }
        }
        impl From<Regs> for libc::user_regs_struct {
            fn from(r: Regs) -> libc::user_regs_struct { libc::user_regs_struct { $($f: r.$f),* } }
        }
    };
}
convert_regs!(r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags, rsp, ss, fs_base, gs_base, ds, es, fs, gs);

/// The FPU/SSE/AVX state (the XSAVE area), opaque bytes as the kernel hands them out.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct XState(pub Vec<u8>);

impl XState {
    pub fn read(tid: Tid) -> std::io::Result<XState> {
        let mut buf = vec![0u8; 64 * 1024];
        let n = sys::get_regset(tid, sys::NT_X86_XSTATE, &mut buf)?;
        buf.truncate(n);
        Ok(XState(buf))
    }

    pub fn write(&self, tid: Tid) -> std::io::Result<()> {
        sys::set_regset(tid, sys::NT_X86_XSTATE, &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_a_restart_block_resumes_is_read_from_its_code() {
        // glibc 2.36: clock_nanosleep, poll, futex.
        assert_eq!(restartable_call_at(&[0xb8, 0xe6, 0, 0, 0, 0x0f, 0x05]), Some(libc::SYS_clock_nanosleep as u64));
        assert_eq!(restartable_call_at(&[0xb8, 0x07, 0, 0, 0, 0x0f, 0x05]), Some(libc::SYS_poll as u64));
        assert_eq!(restartable_call_at(&[0xb8, 0xca, 0, 0, 0, 0x0f, 0x05]), Some(libc::SYS_futex as u64));
        assert_eq!(restartable_call_at(&[0xb8, 0x00, 0, 0, 0, 0x0f, 0x05]), None, "read: not a restart block's");
        assert_eq!(restartable_call_at(&[0x40, 0x80, 0xf6, 0x80, 0x90, 0x0f, 0x05]), None, "no mov right before");
        assert_eq!(restartable_call_at(&[0xb8, 0xe6, 0, 0, 0, 0x0f, 0x34]), None, "not a syscall instruction");
        let mut r = regs(ERESTART_RESTARTBLOCK, NR_RESTART_SYSCALL as i64, 0x1002);
        assert!(r.resuming_a_call());
        r.resuming(libc::SYS_clock_nanosleep as u64);
        let again = r.with_restart_resolved(false);
        assert_eq!((again.rax, again.rip), (libc::SYS_clock_nanosleep as u64, 0x1000), "made again from its registers");
        let here = r.with_restart_resolved(true);
        assert_eq!((here.rax, here.rip), (NR_RESTART_SYSCALL, 0x1000), "resumed from the restart block in its process");
    }

    fn regs(rax: i64, orig: i64, rip: u64) -> Regs {
        let mut r = Regs::from(unsafe { std::mem::zeroed::<libc::user_regs_struct>() });
        r.rax = rax as u64;
        r.orig_rax = orig as u64;
        r.rip = rip;
        r
    }

    #[test]
    fn restartable_call_is_rewound() {
        let r = regs(ERESTARTSYS, 0, 0x1002).with_restart_resolved(false);
        assert_eq!((r.rax, r.rip, r.orig_rax), (0, 0x1000, u64::MAX));
    }

    #[test]
    fn restart_block_in_a_new_process_makes_the_call_again_or_eintr() {
        for call in [libc::SYS_poll, libc::SYS_nanosleep, libc::SYS_clock_nanosleep, libc::SYS_futex] {
            let r = regs(ERESTART_RESTARTBLOCK, call, 0x1002).with_restart_resolved(false);
            assert_eq!((r.rax, r.rip), (call as u64, 0x1000), "call {call}");
        }
        let r = regs(ERESTART_RESTARTBLOCK, libc::SYS_restart_syscall, 0x1002).with_restart_resolved(false);
        assert_eq!((r.rax as i64, r.rip), (-(libc::EINTR as i64), 0x1002));
        let same = regs(ERESTART_RESTARTBLOCK, 35, 0x1002).with_restart_resolved(true);
        assert_eq!((same.rax, same.rip), (NR_RESTART_SYSCALL, 0x1000));
    }

    #[test]
    fn ordinary_state_is_kept() {
        let r = regs(-4, 0, 0x1002).with_restart_resolved(false);
        assert_eq!((r.rax as i64, r.rip), (-4, 0x1002));
        let r = regs(ERESTARTSYS, -1, 0x1002).with_restart_resolved(false);
        assert_eq!(r.rip, 0x1002, "not in a system call: untouched");
    }

    #[test]
    fn an_epoll_wait_cut_short_by_the_stop_is_made_again() {
        let mut r = regs(-(libc::EINTR as i64), libc::SYS_epoll_wait, 0x1002);
        assert!(r.cut_short_by_the_stop());
        r.restart_after_the_stop();
        let resumed = r.with_restart_resolved(false);
        assert_eq!((resumed.rax, resumed.rip), (libc::SYS_epoll_wait as u64, 0x1000));
        // nanosleep's EINTR is not a stop's (the kernel restarts it itself); a result is no EINTR.
        assert!(!regs(-(libc::EINTR as i64), libc::SYS_nanosleep, 0x1002).cut_short_by_the_stop());
        assert!(!regs(0, libc::SYS_epoll_wait, 0x1002).cut_short_by_the_stop());
    }
}
