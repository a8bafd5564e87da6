//! eventfd: a 64-bit counter in the kernel, with its semaphore mode.
//!
//! Capture reads the counter from fdinfo (`eventfd-count`, in hex) without touching it. Restore
//! creates the eventfd with its flags and writes the count back into it; O_NONBLOCK and
//! close-on-exec come from the descriptor's open flags.

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EventfdRecord {
    /// The counter at the checkpoint.
    pub count: u64,
    /// EFD_SEMAPHORE: each read takes 1 instead of the whole count.
    pub semaphore: bool,
}

/// Reads an eventfd's state from its fdinfo text (pure).
pub fn parse(text: &str) -> std::result::Result<EventfdRecord, String> {
    let count = procfs::fdinfo_field(text, "eventfd-count").ok_or("no eventfd-count line")?;
    let count = u64::from_str_radix(count, 16).map_err(|e| format!("eventfd-count {count:?}: {e}"))?;
    // Older kernels do not show the mode, and the count alone cannot tell it.
    let semaphore = match procfs::fdinfo_field(text, "eventfd-semaphore") {
        Some("0") => false,
        Some("1") => true,
        Some(other) => return Err(format!("eventfd-semaphore {other:?}")),
        None => return Err("no eventfd-semaphore line (a kernel too old to show the mode)".into()),
    };
    Ok(EventfdRecord { count, semaphore })
}

/// Captures the eventfd at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32) -> Result<EventfdRecord> {
    let text = procfs::fdinfo_text(pid, fd)?;
    parse(&text).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (an eventfd): {e}")))
}

impl DescriptorKind for EventfdRecord {
    fn describe(&self) -> String {
        "eventfd".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off)
    }
}

/// Creates the eventfd inside the task, holding its count; returns the descriptor.
fn open(task: &mut RemoteTask, rec: &FdRecord, e: &EventfdRecord, scratch_off: usize) -> Result<u64> {
    let mut flags = rec.flags & (libc::O_NONBLOCK | libc::O_CLOEXEC) as u32;
    if e.semaphore {
        flags |= libc::EFD_SEMAPHORE as u32;
    }
    // eventfd2 takes a 32-bit initial value; the count can be larger, so it is written instead.
    let fd = task.syscall("eventfd2", libc::SYS_eventfd2, &[0, flags as u64])?;
    if e.count != 0 {
        let addr = task.put(scratch_off, &e.count.to_le_bytes())?;
        task.syscall("write", libc::SYS_write, &[fd, addr, 8]).context(|| format!("put the count {} back into the eventfd", e.count))?;
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "pos:\t0\nflags:\t02004002\nmnt_id:\t17\nino:\t1038\n\
                        eventfd-count:                5\neventfd-id: 1\neventfd-semaphore: 1\n";

    #[test]
    fn parses_count_and_mode() {
        assert_eq!(parse(TEXT), Ok(EventfdRecord { count: 5, semaphore: true }));
        let big = TEXT.replace("               5", "fffffffffffffff0").replace("semaphore: 1", "semaphore: 0");
        assert_eq!(parse(&big), Ok(EventfdRecord { count: 0xffff_ffff_ffff_fff0, semaphore: false }));
    }

    #[test]
    fn count_is_hex() {
        let t = TEXT.replace("               5", "               a");
        assert_eq!(parse(&t).unwrap().count, 10);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(parse("pos:\t0\n").unwrap_err().contains("eventfd-count"));
        let old = TEXT.replace("eventfd-semaphore: 1\n", "");
        assert!(parse(&old).unwrap_err().contains("eventfd-semaphore"));
        assert!(parse(&TEXT.replace("               5", "zz")).is_err());
    }
}
