//! signalfd: a descriptor that reads the signals of a mask.
//!
//! Its only state is the mask (fdinfo `sigmask`, in hex); the signals it reads are the process's
//! and threads' pending signals, which the signals module restores. Restore creates a new
//! signalfd with the same mask; O_NONBLOCK and close-on-exec come from the open flags.

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalfdRecord {
    /// Bit n-1 stands for signal n, as in a kernel sigset.
    pub mask: u64,
}

/// Reads a signalfd's mask from its fdinfo text (pure).
pub fn parse(text: &str) -> std::result::Result<SignalfdRecord, String> {
    let mask = procfs::fdinfo_field(text, "sigmask").ok_or("no sigmask line")?;
    let mask = u64::from_str_radix(mask, 16).map_err(|e| format!("sigmask {mask:?}: {e}"))?;
    Ok(SignalfdRecord { mask })
}

/// Captures the signalfd at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32) -> Result<SignalfdRecord> {
    let text = procfs::fdinfo_text(pid, fd)?;
    parse(&text).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (a signalfd): {e}")))
}

impl DescriptorKind for SignalfdRecord {
    fn describe(&self) -> String {
        "signalfd".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off)
    }
}

/// Creates the signalfd inside the task; returns the descriptor.
fn open(task: &mut RemoteTask, rec: &FdRecord, s: &SignalfdRecord, scratch_off: usize) -> Result<u64> {
    let flags = rec.flags & (libc::O_NONBLOCK | libc::O_CLOEXEC) as u32;
    let addr = task.put(scratch_off, &s.mask.to_le_bytes())?;
    // The kernel's sigset is 8 bytes on x86_64.
    Ok(task.syscall("signalfd4", libc::SYS_signalfd4, &[u64::MAX, addr, 8, flags as u64])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_mask() {
        let text = "pos:\t0\nflags:\t04002\nmnt_id:\t17\nino:\t1038\nsigmask:\t0000000800000200\n";
        // SIGUSR1 (10) and SIGRTMIN+2 (36).
        assert_eq!(parse(text), Ok(SignalfdRecord { mask: (1 << 9) | (1 << 35) }));
        assert!(parse("pos:\t0\n").is_err());
        assert!(parse("sigmask:\tnot-hex\n").is_err());
    }
}
