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

use super::inject::{Injector, SIGTRAP_BIT};
use super::remote::RemoteTask;
use super::remote_mem::ProcMem;
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

/// The page the runner takes ([`Runner::place`]).
pub const PAGE: u64 = 4096;

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

/// [`trap_is_free`] told by a status already read (of the thread the runner would run in).
pub fn trap_is_free_by(status: &procfs::process::Status) -> bool {
    (status.sigign | status.sigpnd | status.shdpnd) & SIGTRAP_BIT == 0
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

    /// Puts the runner on `page`, the last page of a mapping of the caller's in the task: a new
    /// mapping, readable and executable only, replaces the page there (one injected mmap), and
    /// the runner is written into it through /proc/<pid>/mem. The page is never writable and
    /// executable at once, and never made executable after being writable, which a process
    /// under prctl(PR_SET_MDWE) (systemd's MemoryDenyWriteExecute) refuses. It goes with the
    /// caller's mapping: there is nothing to [`Runner::remove`].
    pub fn place(inj: &mut Injector, mem: &ProcMem, page: u64) -> io::Result<Runner> {
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64;
        let at = inj.call("mmap", libc::SYS_mmap, &[page, PAGE, prot, flags, u64::MAX, 0])?;
        if at != page {
            return Err(io::Error::other(format!("task {}: the runner's page mapped at {at:#x}, not at {page:#x}", inj.tid())));
        }
        mem.write_all(page, &RUNNER)?;
        Ok(Runner { code: page })
    }

    /// Writes the runner at `code`, in memory of the task that is executable already: a
    /// restorer's own area (mapped readable, writable and executable by the restart, which
    /// runs nothing of the job's until the area is gone). Nothing to [`Runner::remove`].
    pub fn write_at(mem: &ProcMem, code: u64) -> io::Result<Runner> {
        mem.write_all(code, &RUNNER)?;
        Ok(Runner { code })
    }

    /// Makes `calls` in the task's main thread and returns their raw results (a negative errno
    /// for a failed call). `table` is writable memory of the task with room for
    /// [`ENTRY_LEN`] bytes per call.
    pub fn run(&self, task: &mut RemoteTask, table: u64, calls: &[Call]) -> io::Result<Vec<i64>> {
        self.run_in(&mut task.main, &task.mem, table, calls)
    }

    /// [`Runner::run`] in the thread `inj` drives (any thread of the task: they share its memory).
    pub fn run_in(&self, inj: &mut Injector, mem: &ProcMem, table: u64, calls: &[Call]) -> io::Result<Vec<i64>> {
        let mut bytes = Vec::with_capacity(calls.len() * ENTRY_LEN);
        for c in calls {
            bytes.extend_from_slice(&(c.nr as u64).to_ne_bytes());
            for a in c.args {
                bytes.extend_from_slice(&a.to_ne_bytes());
            }
            bytes.extend_from_slice(&0u64.to_ne_bytes());
        }
        mem.write_all(table, &bytes)?;
        let tid = inj.tid();
        let mask = sys::get_sigmask(tid)?;
        sys::set_sigmask(tid, mask & !SIGTRAP_BIT)?;
        let ran = inj.run_to_breakpoint(self.code, [table, calls.len() as u64]);
        sys::set_sigmask(tid, mask)?;
        let regs = ran?;
        if regs.rip != self.code + RUNNER.len() as u64 {
            return Err(io::Error::other(format!("task {tid}: injected code stopped at {:#x}, not at its end", regs.rip)));
        }
        mem.read_exact(table, &mut bytes)?;
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

/// Calls that read a stopped thread's state, asked together ([`Questions::ask`]) and answered
/// together ([`Questions::answer`]): in one stop where the runner can be used, one injected
/// call at a time where it cannot. A capture asks every module's questions first and reads
/// every answer after, instead of a round trip of two ptrace stops per call.
///
/// Buffers the calls fill, then the table of calls, lie in an area of the task's memory the
/// caller mapped read-write.
pub struct Questions {
    area: u64,
    area_len: usize,
    asked: Vec<Question>,
    /// Bytes at the start of the area given to buffers.
    buffers_len: usize,
}

struct Question {
    name: &'static str,
    call: Call,
    buffer: Option<(usize, usize)>,
}

/// A question asked, to find its answer by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked(usize);

impl Questions {
    /// Questions whose buffers and table go into `[area, area + area_len)` of the task.
    pub fn new(area: u64, area_len: usize) -> Questions {
        Questions { area, area_len, asked: Vec::new(), buffers_len: 0 }
    }

    /// Asks a call whose answer is its result; `name` names it in errors.
    pub fn ask(&mut self, name: &'static str, nr: libc::c_long, args: &[u64]) -> Asked {
        self.asked.push(Question { name, call: Call::new(nr, args), buffer: None });
        Asked(self.asked.len() - 1)
    }

    /// Asks a call that writes up to `len` bytes through a pointer: `args` makes its arguments
    /// from the address of a buffer of that size, zeroed before the call.
    pub fn ask_into<A: AsRef<[u64]>>(&mut self, name: &'static str, nr: libc::c_long, len: usize, args: impl FnOnce(u64) -> A) -> io::Result<Asked> {
        let at = self.buffers_len.next_multiple_of(8);
        if at + len + ENTRY_LEN > self.area_len {
            return Err(io::Error::other(format!("{name}: no room for its {len} bytes in the {} bytes of the area for questions", self.area_len)));
        }
        self.buffers_len = at + len;
        let call = Call::new(nr, args(self.area + at as u64).as_ref());
        self.asked.push(Question { name, call, buffer: Some((at, len)) });
        Ok(Asked(self.asked.len() - 1))
    }

    /// Makes every call in the thread `inj` drives and returns the answers. With `runner` the
    /// calls are made by it, in as few stops as the table's room allows (one, mostly); without
    /// (a thread whose SIGTRAP is not free, see [`trap_is_free`], or a runner that could not be
    /// placed) one injected call at a time. A failed call is an answer, not an error: the
    /// reader of its answer decides.
    pub fn answer(self, inj: &mut Injector, mem: &ProcMem, runner: Option<&Runner>) -> io::Result<Answers> {
        let tid = inj.tid();
        if self.asked.is_empty() {
            return Ok(Answers { tid, asked: self.asked, results: Vec::new(), buffers: Vec::new() });
        }
        mem.write_all(self.area, &vec![0u8; self.buffers_len])?;
        let results = match runner {
            Some(runner) => {
                let table_at = self.buffers_len.next_multiple_of(8);
                let per_run = (self.area_len - table_at) / ENTRY_LEN;
                let calls: Vec<Call> = self.asked.iter().map(|q| q.call).collect();
                let mut results = Vec::with_capacity(calls.len());
                for run in calls.chunks(per_run) {
                    results.extend(runner.run_in(inj, mem, self.area + table_at as u64, run)?);
                }
                results
            }
            None => self.asked.iter().map(|q| inj.raw(q.call.nr, &q.call.args)).collect::<io::Result<_>>()?,
        };
        let mut buffers = vec![0u8; self.buffers_len];
        mem.read_exact(self.area, &mut buffers)?;
        Ok(Answers { tid, asked: self.asked, results, buffers })
    }
}

/// The answers to [`Questions`], read from the task.
pub struct Answers {
    tid: Tid,
    asked: Vec<Question>,
    results: Vec<i64>,
    buffers: Vec<u8>,
}

impl Answers {
    /// The call's raw result: a negative errno where it failed.
    pub fn raw(&self, asked: Asked) -> i64 {
        self.results[asked.0]
    }

    /// The call's result; a failure is an error naming the call, as [`Injector::call`]'s.
    pub fn value(&self, asked: Asked) -> io::Result<u64> {
        super::inject::call_result(self.tid, self.asked[asked.0].name, self.raw(asked))
    }

    /// What the call wrote into its buffer (after checking it succeeded).
    pub fn bytes(&self, asked: Asked) -> io::Result<&[u8]> {
        self.value(asked)?;
        let (at, len) = self.asked[asked.0].buffer.expect("bytes() of a question asked without a buffer");
        Ok(&self.buffers[at..at + len])
    }
}

/// A stopped thread to ask [`Questions`] of: its injector, the task's memory, the area for
/// questions, and the runner where the thread may use it.
pub struct Asker<'a> {
    pub inj: &'a mut Injector,
    mem: &'a ProcMem,
    area: (u64, usize),
    runner: Option<&'a Runner>,
}

impl<'a> Asker<'a> {
    pub fn new(inj: &'a mut Injector, mem: &'a ProcMem, area: (u64, usize), runner: Option<&'a Runner>) -> Asker<'a> {
        Asker { inj, mem, area, runner }
    }

    /// Questions for this thread, none asked yet.
    pub fn questions(&self) -> Questions {
        Questions::new(self.area.0, self.area.1)
    }

    /// Answers `q` (see [`Questions::answer`]).
    pub fn answer(&mut self, q: Questions) -> io::Result<Answers> {
        q.answer(self.inj, self.mem, self.runner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_laid_out_apart_and_aligned_and_a_buffer_without_room_is_refused() {
        let mut q = Questions::new(0x10000, 512);
        let a = q.ask_into("a", 1, 4, |at| [at]).unwrap();
        let b = q.ask_into("b", 2, 24, |at| [7, at]).unwrap();
        q.ask("c", 3, &[9]);
        assert_eq!(q.asked[a.0].call.args[0], 0x10000);
        assert_eq!(q.asked[b.0].call.args[..2], [7, 0x10008]);
        assert_eq!(q.asked[b.0].buffer, Some((8, 24)));
        // 32 bytes of buffers so far; a buffer must leave room for at least one entry of the table.
        let too_big = q.ask_into("d", 4, 512 - 32 - ENTRY_LEN + 1, |at| [at]);
        assert!(too_big.is_err_and(|e| e.to_string().contains("d: no room")));
        assert_eq!(q.asked.len(), 3, "a refused question is not asked");
    }
}
