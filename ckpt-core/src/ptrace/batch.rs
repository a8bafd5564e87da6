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
    0x49, 0x89, 0xfc, 0x49, 0x89, 0xf5, 0x4d, 0x85, 0xed, 0x74, 0x32, 0x49, 0x8b, 0x04, 0x24, 0x49, 0x8b, 0x7c, 0x24, 0x08, 0x49, 0x8b, 0x74, 0x24, 0x10, 0x49,
    0x8b, 0x54, 0x24, 0x18, 0x4d, 0x8b, 0x54, 0x24, 0x20, 0x4d, 0x8b, 0x44, 0x24, 0x28, 0x4d, 0x8b, 0x4c, 0x24, 0x30, 0x0f, 0x05, 0x49, 0x89, 0x44, 0x24, 0x38,
    0x49, 0x83, 0xc4, 0x40, 0x49, 0xff, 0xcd, 0xeb, 0xc9, 0xcc,
];

/// Where [`PROLOGUE`] lies in the runner's page, after [`RUNNER`].
const PROLOGUE_AT: u64 = 64;

/// What a runner mapped with its scratch area ([`Runner::map_with_area`]) runs first, once:
/// it makes the area (mapped readable and executable with the runner, in one injected call)
/// readable and writable, and then runs the calls; it stops at its own breakpoint, before
/// writing anything, if the kernel refuses (rax then holds the error). rdi = the table, rsi =
/// the number of calls, rdx = the area, rcx = its length.
///
/// ```text
/// 40: mov r12, rdi          ; kept for the runner
/// 43: mov r13, rsi
/// 46: mov rdi, rdx          ; mprotect(area, len, PROT_READ | PROT_WRITE)
/// 49: mov rsi, rcx
/// 4c: mov eax, 10
/// 51: mov edx, 3
/// 56: syscall
/// 58: test rax, rax
/// 5b: jne 65
/// 5d: mov rdi, r12
/// 60: mov rsi, r13
/// 63: jmp 0                 ; the runner
/// 65: int3                  ; refused
/// ```
const PROLOGUE: [u8; 38] = [
    0x49, 0x89, 0xfc, 0x49, 0x89, 0xf5, 0x48, 0x89, 0xd7, 0x48, 0x89, 0xce, 0xb8, 0x0a, 0x00, 0x00, 0x00, 0xba, 0x03, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85,
    0xc0, 0x75, 0x08, 0x4c, 0x89, 0xe7, 0x4c, 0x89, 0xee, 0xeb, 0x9b, 0xcc,
];

/// The page the runner takes ([`Runner::map_with_area`]).
pub const PAGE: u64 = 4096;

/// Whether the process's SIGTRAP is neither ignored nor pending, so the runner's breakpoint
/// leaves no trace (see the module's documentation).
pub fn trap_is_free(tid: Tid) -> io::Result<bool> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
    let mask = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(u64::MAX)
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
    /// The scratch area its first run makes writable ([`Runner::map_with_area`]); None once
    /// it is, or for a runner placed beside writable memory.
    locked_area: std::cell::Cell<Option<(u64, u64)>>,
}

impl Runner {
    /// Maps `area_len` bytes of scratch (a multiple of [`PAGE`]) and the runner's page after
    /// them in one injected mmap, and writes the runner there through /proc/<pid>/mem. Returns
    /// the area's address and the runner. The mapping is readable and executable only; the
    /// runner's first run makes the area readable and writable before it writes anything
    /// ([`PROLOGUE`]), so the area is usable only through the runner until it has run once
    /// ([`Runner::unlock_area`] does it without calls). No page is ever writable and
    /// executable at once, nor made executable after being writable, which a process under
    /// prctl(PR_SET_MDWE) (systemd's MemoryDenyWriteExecute) refuses.
    /// Where the injected mmap fails, nothing is mapped. Unmap both with one munmap of
    /// `area_len +` [`PAGE`] bytes at the area.
    pub fn map_with_area(inj: &mut Injector, mem: &ProcMem, area_len: u64) -> io::Result<(u64, Runner)> {
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let area = inj.call("mmap", libc::SYS_mmap, &[0, area_len + PAGE, prot, flags, u64::MAX, 0])?;
        let code = area + area_len;
        let mut bytes = vec![0xcc; PROLOGUE_AT as usize + PROLOGUE.len()];
        bytes[..RUNNER.len()].copy_from_slice(&RUNNER);
        bytes[PROLOGUE_AT as usize..].copy_from_slice(&PROLOGUE);
        if let Err(e) = mem.write_all(code, &bytes) {
            inj.call("munmap", libc::SYS_munmap, &[area, area_len + PAGE])?;
            return Err(e);
        }
        Ok((area, Runner { code, locked_area: std::cell::Cell::new(Some((area, area_len))) }))
    }

    /// Makes the area of [`Runner::map_with_area`] writable now, if no run has yet: for
    /// injected calls that write into it outside the runner.
    pub fn unlock_area(&self, inj: &mut Injector) -> io::Result<()> {
        if let Some((area, len)) = self.locked_area.get() {
            inj.call("mprotect", libc::SYS_mprotect, &[area, len, (libc::PROT_READ | libc::PROT_WRITE) as u64])?;
            self.locked_area.set(None);
        }
        Ok(())
    }

    /// Writes the runner at `code`, in memory of the task that is executable already: a
    /// restorer's own area (mapped readable, writable and executable by the restart, which
    /// runs nothing of the job's until the area is gone). Nothing to [`Runner::remove`].
    pub fn write_at(mem: &ProcMem, code: u64) -> io::Result<Runner> {
        mem.write_all(code, &RUNNER)?;
        Ok(Runner { code, locked_area: Default::default() })
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
        let locked = self.locked_area.get();
        let ran = match locked {
            Some((area, len)) => inj.run_to_breakpoint(self.code + PROLOGUE_AT, [table, calls.len() as u64, area, len]),
            None => inj.run_to_breakpoint(self.code, [table, calls.len() as u64, 0, 0]),
        };
        sys::set_sigmask(tid, mask)?;
        let regs = ran?;
        if locked.is_some() && regs.rip == self.code + PROLOGUE_AT + PROLOGUE.len() as u64 {
            let errno = (regs.rax as i64).checked_neg().filter(|e| (1..4096).contains(e)).unwrap_or(libc::EINVAL as i64);
            let e = io::Error::from_raw_os_error(errno as i32);
            return Err(io::Error::new(e.kind(), format!("task {tid}: make its scratch area writable (mprotect): {e}")));
        }
        self.locked_area.set(None);
        if regs.rip != self.code + RUNNER.len() as u64 {
            return Err(io::Error::other(format!("task {tid}: injected code stopped at {:#x}, not at its end", regs.rip)));
        }
        mem.read_exact(table, &mut bytes)?;
        Ok(bytes.chunks_exact(ENTRY_LEN).map(|e| i64::from_ne_bytes(e[56..64].try_into().unwrap())).collect())
    }
}

/// Maps the runner and `area_len` bytes of private memory in the task (one injected mmap:
/// [`Runner::map_with_area`]; the area is writable from the runner's first run on), calls `f`
/// with them (the area's address), then unmaps both whatever `f` returned (one munmap): the
/// task keeps nothing of ours. An error of `f` is reported before one of the unmapping.
pub fn with_runner<T, E: From<io::Error>>(task: &mut RemoteTask, area_len: u64, f: impl FnOnce(&mut RemoteTask, &Runner, u64) -> Result<T, E>) -> Result<T, E> {
    let area_len = area_len.div_ceil(PAGE) * PAGE;
    let (area, runner) = Runner::map_with_area(&mut task.main, &task.mem, area_len)?;
    let result = f(task, &runner, area);
    let unmapped = task.syscall("munmap", libc::SYS_munmap, &[area, area_len + PAGE]);
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

    /// A spinning shell, seized and stopped outside any system call, killed however the test
    /// ends; and the address of a `syscall` instruction in its vdso.
    struct Stopped(std::process::Child, u64);

    impl Stopped {
        fn new() -> Stopped {
            // Killed by the guard's drop from here on, whatever fails.
            let mut child = Stopped(std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap(), 0);
            let pid = child.pid();
            // Once it runs the shell: until its exec is done, its maps are the test's, or are
            // being made.
            let ours = std::fs::read_link("/proc/self/exe").unwrap();
            let started = std::time::Instant::now();
            let maps = loop {
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
                if exe.is_ok_and(|exe| exe != ours) && maps.lines().any(|l| l.ends_with("[vdso]")) {
                    break maps;
                }
                assert!(started.elapsed() < std::time::Duration::from_secs(10), "the shell never ran with a vdso");
                std::thread::sleep(std::time::Duration::from_millis(1));
            };
            let vdso = maps.lines().find(|l| l.ends_with("[vdso]")).expect("a vdso");
            let (start, end) = vdso.split_whitespace().next().unwrap().split_once('-').unwrap();
            let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
            let mut code = vec![0u8; (end - start) as usize];
            ProcMem::open(pid).unwrap().read_exact(start, &mut code).unwrap();
            let insn = super::super::inject::find_syscall_insn(&code, start).expect("a syscall instruction in the vdso");
            sys::seize(pid, sys::PTRACE_O_TRACESYSGOOD).unwrap();
            sys::interrupt(pid).unwrap();
            while let sys::StopKind::Signal(sig) = sys::wait(pid).unwrap() {
                sys::resume(pid, sig).unwrap();
            }
            child.1 = insn;
            child
        }

        fn pid(&self) -> Tid {
            self.0.id() as Tid
        }

        /// The permissions /proc/PID/maps shows at `addr`.
        fn prot_at(&self, addr: u64) -> String {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid())).unwrap();
            maps.lines()
                .find(|l| {
                    let (s, e) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
                    (u64::from_str_radix(s, 16).unwrap()..u64::from_str_radix(e, 16).unwrap()).contains(&addr)
                })
                .map_or("unmapped".into(), |l| l.split_whitespace().nth(1).unwrap().to_string())
        }
    }

    impl Drop for Stopped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The area mapped with the runner comes readable and executable, and the runner's first
    /// run makes it writable before the calls write their results; where the kernel refuses
    /// that, the run stops before writing anything (a fault there would be a forced SIGSEGV,
    /// which resets a blocked signal's handler) and says why, and the thread takes calls still.
    #[test]
    fn the_runners_first_run_makes_its_area_writable_or_says_why_not() {
        let child = Stopped::new();
        let pid = child.pid();
        let mem = ProcMem::open(pid).unwrap();
        let mut inj = Injector::new(pid, child.1).unwrap();
        let (area, runner) = Runner::map_with_area(&mut inj, &mem, 2 * PAGE).unwrap();
        assert_eq!((child.prot_at(area).as_str(), child.prot_at(area + 2 * PAGE).as_str()), ("r-xp", "r-xp"));
        let getpid = Call::new(libc::SYS_getpid, &[]);
        assert_eq!(runner.run_in(&mut inj, &mem, area, &[getpid, getpid]).unwrap(), vec![pid as i64, pid as i64]);
        assert_eq!((child.prot_at(area).as_str(), child.prot_at(area + 2 * PAGE).as_str()), ("rw-p", "r-xp"));
        // Runs after the first go straight to the calls.
        assert_eq!(runner.run_in(&mut inj, &mem, area + 64, &[getpid]).unwrap(), vec![pid as i64]);
        inj.call("munmap", libc::SYS_munmap, &[area, 3 * PAGE]).unwrap();

        // Refused: the area's first page is gone before the first run (mprotect: ENOMEM); the
        // table is in the second, readable.
        let (area, runner) = Runner::map_with_area(&mut inj, &mem, 2 * PAGE).unwrap();
        inj.call("munmap", libc::SYS_munmap, &[area, PAGE]).unwrap();
        let e = runner.run_in(&mut inj, &mem, area + PAGE, &[getpid]).unwrap_err();
        assert!(e.to_string().contains("make its scratch area writable") && e.raw_os_error().is_none(), "{e}");
        assert_eq!(e.kind(), io::Error::from_raw_os_error(libc::ENOMEM).kind(), "{e}");
        assert_eq!(inj.call("getpid", libc::SYS_getpid, &[]).unwrap(), pid as u64);
        assert_eq!(child.prot_at(area + PAGE), "r-xp", "nothing changed");
        inj.call("munmap", libc::SYS_munmap, &[area + PAGE, 2 * PAGE]).unwrap();
        inj.finish().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.lines().any(|l| l == "SigPnd:\t0000000000000000"), "{status}");
        sys::detach(pid, 0).unwrap();
    }

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
