//! A stopped process driven from the outside: its main thread's injector, its memory, and a
//! scratch area inside it for passing structures to injected system calls.

use std::io;

use super::inject::Injector;
use super::remote_mem::ProcMem;
use super::sys::Tid;

pub struct RemoteTask {
    /// The process id as the tracer sees it.
    pub pid: Tid,
    pub main: Injector,
    pub mem: ProcMem,
    scratch: u64,
    scratch_len: usize,
}

impl RemoteTask {
    pub fn new(pid: Tid, main: Injector) -> io::Result<RemoteTask> {
        Ok(RemoteTask { pid, main, mem: ProcMem::open(pid)?, scratch: 0, scratch_len: 0 })
    }

    /// Uses `[addr, addr+len)` of the task, already mapped read-write, as scratch space.
    pub fn set_scratch(&mut self, addr: u64, len: usize) {
        self.scratch = addr;
        self.scratch_len = len;
    }

    pub fn scratch(&self) -> (u64, usize) {
        (self.scratch, self.scratch_len)
    }

    /// Address of scratch byte `off`.
    pub fn scratch_at(&self, off: usize) -> u64 {
        self.scratch_view().at(off)
    }

    /// Copies `data` into the scratch area at `off` and returns its address in the task.
    pub fn put(&self, off: usize, data: &[u8]) -> io::Result<u64> {
        self.scratch_view().put(off, data)
    }

    /// Copies a path as a NUL-terminated string into scratch.
    pub fn put_path(&self, off: usize, path: &str) -> io::Result<u64> {
        let mut bytes = path.as_bytes().to_vec();
        bytes.push(0);
        self.put(off, &bytes)
    }

    /// The main thread's injector together with a view of the scratch area, for code that drives
    /// one thread while passing data through scratch.
    pub fn split(&mut self) -> (&mut Injector, Scratch<'_>) {
        (&mut self.main, Scratch { mem: &self.mem, addr: self.scratch, len: self.scratch_len })
    }

    pub fn scratch_view(&self) -> Scratch<'_> {
        Scratch { mem: &self.mem, addr: self.scratch, len: self.scratch_len }
    }

    pub fn get(&self, addr: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.mem.read_exact(addr, &mut buf)?;
        Ok(buf)
    }

    /// Runs a system call in the main thread.
    pub fn syscall(&mut self, name: &str, nr: libc::c_long, args: &[u64]) -> io::Result<u64> {
        self.main.call(name, nr, args)
    }
}

/// The scratch area of a task, borrowed: every thread of the task sees it at the same address.
#[derive(Clone, Copy)]
pub struct Scratch<'a> {
    pub mem: &'a ProcMem,
    pub addr: u64,
    pub len: usize,
}

impl Scratch<'_> {
    pub fn at(&self, off: usize) -> u64 {
        assert!(off < self.len, "scratch offset {off} beyond {}", self.len);
        self.addr + off as u64
    }

    /// Copies `data` into the scratch area at `off`. Data that does not fit (a path, a list of
    /// groups from an image) is an error, not a write beyond the area.
    pub fn put(&self, off: usize, data: &[u8]) -> io::Result<u64> {
        self.check(off, data.len())?;
        self.mem.write_all(self.addr + off as u64, data)?;
        Ok(self.addr + off as u64)
    }

    fn check(&self, off: usize, len: usize) -> io::Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at offset {off} do not fit the restorer's scratch area of {} bytes", self.len),
            )),
        }
    }

    pub fn get(&self, off: usize, len: usize) -> io::Result<Vec<u8>> {
        self.check(off, len)?;
        let mut buf = vec![0u8; len];
        self.mem.read_exact(self.addr + off as u64, &mut buf)?;
        Ok(buf)
    }

    pub fn get_u64(&self, off: usize) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.get(off, 8)?.try_into().unwrap()))
    }
}
