//! Reading and writing another process's memory.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use libc::{c_void, iovec};

use super::sys::Tid;

/// At most this many iovecs per process_vm_readv call (the kernel's UIO_MAXIOV).
pub const MAX_IOV: usize = 1024;

const PAGE: u64 = 4096;
/// A pagemap entry's bit for a page of a guard region (Linux 6.14).
const PM_GUARD_REGION: u64 = 1 << 58;

/// Copies `len` bytes at `addr` of process `pid` into `buf`, with process_vm_readv. Returns the
/// number of bytes read, which is short when an unreadable page is reached.
pub fn read(pid: Tid, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: buf.len() };
    let remote = iovec { iov_base: addr as *mut c_void, iov_len: buf.len() };
    // SAFETY: both iovecs describe memory valid for the call: `buf` is ours, the remote range is
    // only read by the kernel on the other process's behalf.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EFAULT) {
            // The very first page is unreadable.
            return Ok(0);
        }
        return Err(io::Error::new(e.kind(), format!("process_vm_readv of pid {pid} at {addr:#x}+{}: {e}", buf.len())));
    }
    Ok(n as usize)
}

/// Access to a process's memory through /proc/<pid>/mem, which (unlike process_vm_*) reaches
/// PROT_NONE pages and writes into read-only private mappings, as a debugger does.
pub struct ProcMem {
    pid: Tid,
    file: File,
}

impl ProcMem {
    pub fn open(pid: Tid) -> io::Result<ProcMem> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| io::Error::new(e.kind(), format!("open /proc/{pid}/mem: {e}")))?;
        Ok(ProcMem { pid, file })
    }

    /// The process whose memory this is.
    pub fn pid(&self) -> Tid {
        self.pid
    }

    pub fn read_exact(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, addr).map_err(|e| io::Error::new(e.kind(), format!("read pid {} memory at {addr:#x}+{}: {e}", self.pid, buf.len())))
    }

    /// [`ProcMem::read_exact`], telling a guard region apart (MADV_GUARD_INSTALL, Linux 6.13: a
    /// marker no access may pass, which /proc/PID/mem answers with EIO): Ok(Some(address)) of
    /// the first guard page met, the read stopped there. A guard is told by its pagemap bit
    /// (Linux 6.14); where the kernel does not show it, the EIO is the error it was.
    pub fn read_exact_or_guard(&self, addr: u64, buf: &mut [u8]) -> io::Result<Option<u64>> {
        let (mut got, len) = (0usize, buf.len());
        let failed = |e: io::Error| io::Error::new(e.kind(), format!("read pid {} memory at {addr:#x}+{len}: {e}", self.pid));
        while got < buf.len() {
            let at = addr + got as u64;
            match self.file.read_at(&mut buf[got..], at) {
                Ok(0) => return Err(failed(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EIO) && self.is_guard(at).map_err(failed)? => return Ok(Some(at)),
                Err(e) => return Err(failed(e)),
            }
        }
        Ok(None)
    }

    /// Whether the page at `addr` is in a guard region, by its pagemap entry.
    fn is_guard(&self, addr: u64) -> io::Result<bool> {
        let pagemap = File::open(format!("/proc/{}/pagemap", self.pid))?;
        let mut entry = [0u8; 8];
        pagemap.read_exact_at(&mut entry, addr / PAGE * 8)?;
        Ok(u64::from_ne_bytes(entry) & PM_GUARD_REGION != 0)
    }

    /// Reads what it can at `addr`, up to `buf.len()` bytes; returns how many, 0 when the page at
    /// `addr` cannot be read (not mapped, or past the end of the file a mapping shows).
    pub fn read_some(&self, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
        match self.file.read_at(buf, addr) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            r => r.map_err(|e| io::Error::new(e.kind(), format!("read pid {} memory at {addr:#x}+{}: {e}", self.pid, buf.len()))),
        }
    }

    pub fn write_all(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, addr).map_err(|e| io::Error::new(e.kind(), format!("write pid {} memory at {addr:#x}+{}: {e}", self.pid, data.len())))
    }
}
