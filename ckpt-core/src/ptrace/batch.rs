//! Many system calls inside a stopped thread for the price of one stop.
//!
//! Injecting a system call costs two ptrace stops (entry and exit) and a few register transfers,
//! about ten microseconds; asking the same question of thousands of descriptors that way costs
//! tens of milliseconds of frozen time. Instead, a few instructions of our own are mapped into the
//! task; they read a table of calls (number, six arguments) from the task's memory, make each
//! call, write each result beside it, and stop at a breakpoint. The table and the buffers the
//! calls fill are in memory the caller mapped in the task.
//!
//! The breakpoint's SIGTRAP is forced on the thread: the kernel would make a blocked or ignored
//! SIGTRAP deliverable by resetting its disposition, and would merge it with a SIGTRAP already
//! pending. So the thread's mask lets SIGTRAP through while the code runs, and a process that
//! ignores SIGTRAP or has one pending is not asked ([`trap_is_free`]).

use std::io;

use super::remote::RemoteTask;
use super::sys::{self, Tid};

/// One system call: its number and arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub nr: libc::c_long,
    pub args: [u64; 6],
}

impl Call {
    pub fn new(nr: libc::c_long, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call { nr, args: a }
    }
}

/// Bytes of the table per call: the number, six arguments, the result.
pub const ENTRY_LEN: usize = 64;

/// The runner, x86_64; rdi = the table, rsi = the number of calls.
///
/// ```text
///  0: mov r12, rdi          ; r12, r13 survive system calls
///  3: mov r13, rsi
///  6: test r13, r13         ; loop: calls left?
///  9: je 3d
///  b: mov rax, [r12]        ; number
///  f: mov rdi, [r12+8]      ; arguments
/// 14: mov rsi, [r12+16]
/// 19: mov rdx, [r12+24]
/// 1e: mov r10, [r12+32]
/// 23: mov r8, [r12+40]
/// 28: mov r9, [r12+48]
/// 2d: syscall
/// 2f: mov [r12+56], rax     ; result
/// 34: add r12, 64
/// 38: dec r13
/// 3b: jmp 6
/// 3d: int3
/// ```
const RUNNER: [u8; 62] = [
    0x49, 0x89, 0xfc, 0x49, 0x89, 0xf5, 0x4d, 0x85, 0xed, 0x74, 0x32, 0x49, 0x8b, 0x04, 0x24, 0x49, 0x8b, 0x7c, 0x24, 0x08, 0x49,
    0x8b, 0x74, 0x24, 0x10, 0x49, 0x8b, 0x54, 0x24, 0x18, 0x4d, 0x8b, 0x54, 0x24, 0x20, 0x4d, 0x8b, 0x44, 0x24, 0x28, 0x4d, 0x8b,
    0x4c, 0x24, 0x30, 0x0f, 0x05, 0x49, 0x89, 0x44, 0x24, 0x38, 0x49, 0x83, 0xc4, 0x40, 0x49, 0xff, 0xcd, 0xeb, 0xc9, 0xcc,
];

const PAGE: u64 = 4096;
const SIGTRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// Whether the process's SIGTRAP is neither ignored nor pending, so the runner's breakpoint
/// leaves no trace (see the module's documentation).
pub fn trap_is_free(tid: Tid) -> io::Result<bool> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    let mask = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(u64::MAX)
    };
    Ok((mask("SigIgn") | mask("SigPnd") | mask("ShdPnd")) & SIGTRAP_BIT == 0)
}

/// The runner, mapped in a task.
pub struct Runner {
    code: u64,
}

impl Runner {
    /// Maps the runner into the task, readable and executable only: its bytes are written through
    /// /proc/<pid>/mem, so the task never has a page both writable and executable.
    pub fn install(task: &mut RemoteTask) -> io::Result<Runner> {
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let code = task.syscall("mmap", libc::SYS_mmap, &[0, PAGE, prot, flags, u64::MAX, 0])?;
        let runner = Runner { code };
        if let Err(e) = task.mem.write_all(code, &RUNNER) {
            runner.remove(task)?;
            return Err(e);
        }
        Ok(runner)
    }

    /// Makes `calls` in the task's main thread and returns their raw results (a negative errno
    /// for a failed call). `table` is writable memory of the task with room for
    /// [`ENTRY_LEN`] bytes per call.
    pub fn run(&self, task: &mut RemoteTask, table: u64, calls: &[Call]) -> io::Result<Vec<i64>> {
        let mut bytes = Vec::with_capacity(calls.len() * ENTRY_LEN);
        for c in calls {
            bytes.extend_from_slice(&(c.nr as u64).to_ne_bytes());
            for a in c.args {
                bytes.extend_from_slice(&a.to_ne_bytes());
            }
            bytes.extend_from_slice(&0u64.to_ne_bytes());
        }
        task.mem.write_all(table, &bytes)?;
        let tid = task.main.tid();
        let mask = sys::get_sigmask(tid)?;
        sys::set_sigmask(tid, mask & !SIGTRAP_BIT)?;
        let ran = task.main.run_to_breakpoint(self.code, [table, calls.len() as u64]);
        sys::set_sigmask(tid, mask)?;
        let regs = ran?;
        if regs.rip != self.code + RUNNER.len() as u64 {
            return Err(io::Error::other(format!("task {tid}: injected code stopped at {:#x}, not at its end", regs.rip)));
        }
        task.mem.read_exact(table, &mut bytes)?;
        Ok(bytes.chunks_exact(ENTRY_LEN).map(|e| i64::from_ne_bytes(e[56..64].try_into().unwrap())).collect())
    }

    /// Unmaps the runner.
    pub fn remove(self, task: &mut RemoteTask) -> io::Result<()> {
        task.syscall("munmap", libc::SYS_munmap, &[self.code, PAGE]).map(drop)
    }
}

/// Maps the runner and `area_len` bytes of private writable memory in the task, calls `f` with
/// them (the area's address), then unmaps both whatever `f` returned: the task keeps nothing of
/// ours. An error of `f` is reported before one of the unmapping.
pub fn with_runner<T, E: From<io::Error>>(
    task: &mut RemoteTask,
    area_len: u64,
    f: impl FnOnce(&mut RemoteTask, &Runner, u64) -> Result<T, E>,
) -> Result<T, E> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let area = task.syscall("mmap", libc::SYS_mmap, &[0, area_len, prot, flags, u64::MAX, 0])?;
    let result = Runner::install(task).map_err(E::from).and_then(|runner| {
        let result = f(task, &runner, area);
        let removed = runner.remove(task);
        let result = result?;
        removed?;
        Ok(result)
    });
    let unmapped = task.syscall("munmap", libc::SYS_munmap, &[area, area_len]);
    let result = result?;
    unmapped?;
    Ok(result)
}
