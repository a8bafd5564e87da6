//! A thread's credentials: for now its capability sets (effective, permitted, inheritable,
//! bounding, ambient), which are per thread.
//!
//! **Capture** reads them from `/proc/PID/task/TID/status`.
//!
//! **Restore** is the last step of a process's rebuild ([`restore_last`]), in every thread:
//! the restorer's injected system calls run with the capabilities the empty process inherited
//! from the job's init (root's, or the full set of the job's own user namespace for an ordinary
//! user, see [`crate::userns`]), and nothing may keep them that the program did not have. The
//! bounding set is lowered first (that needs CAP_SETPCAP, still held), then the three sets are
//! set, then the ambient ones raised again. Capabilities can only be lowered this way: an image
//! that claims more than the restorer has is refused by the kernel (EPERM), never granted.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ptrace::{Injector, Scratch, Tid};

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CapsRecord {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
    pub bounding: u64,
    pub ambient: u64,
}

/// Reads a thread's capability sets.
pub fn capture(host_pid: Tid, host_tid: Tid) -> Result<CapsRecord> {
    let path = format!("/proc/{host_pid}/task/{host_tid}/status");
    let text = std::fs::read_to_string(&path)?;
    parse_status(&text).ok_or_else(|| crate::Error::Other(format!("{path}: no capability sets in it")))
}

/// The capability lines of a status file. Pure.
fn parse_status(text: &str) -> Option<CapsRecord> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    Some(CapsRecord {
        inheritable: field("CapInh")?,
        permitted: field("CapPrm")?,
        effective: field("CapEff")?,
        bounding: field("CapBnd")?,
        // Kernels before 4.3 have no ambient set.
        ambient: field("CapAmb").unwrap_or(0),
    })
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Puts the thread's capability sets to the record's, from inside the thread.
pub fn restore_last(rec: &CapsRecord, host_pid: Tid, host_tid: Tid, inj: &mut Injector, scratch: Scratch) -> Result<()> {
    let now = capture(host_pid, host_tid)?;
    if now == *rec {
        return Ok(());
    }
    for cap in bits(now.bounding & !rec.bounding) {
        inj.call("prctl(PR_CAPBSET_DROP)", libc::SYS_prctl, &[libc::PR_CAPBSET_DROP as u64, cap])?;
    }
    // struct __user_cap_header_struct, then two struct __user_cap_data_struct.
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(&LINUX_CAPABILITY_VERSION_3.to_le_bytes());
    bytes.extend_from_slice(&0i32.to_le_bytes());
    for half in [0, 32] {
        for set in [rec.effective, rec.permitted, rec.inheritable] {
            bytes.extend_from_slice(&((set >> half) as u32).to_le_bytes());
        }
    }
    let header = scratch.put(0, &bytes)?;
    inj.call("capset", libc::SYS_capset, &[header, header + 8])?;
    for cap in bits(rec.ambient) {
        inj.call("prctl(PR_CAP_AMBIENT_RAISE)", libc::SYS_prctl, &[libc::PR_CAP_AMBIENT as u64, libc::PR_CAP_AMBIENT_RAISE as u64, cap])?;
    }
    Ok(())
}

/// The numbers of the capabilities set in a mask.
fn bits(mask: u64) -> impl Iterator<Item = u64> {
    (0..64).filter(move |b| mask & (1 << b) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_give_the_sets() {
        let text = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001fffeffffff\n\
                    CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000400\nNoNewPrivs:\t0\n";
        let c = parse_status(text).unwrap();
        assert_eq!(c.inheritable, 0);
        assert_eq!(c.permitted, 0x1ff_ffff_ffff);
        assert_eq!(c.effective, 0x1ff_feff_ffff);
        assert_eq!(c.ambient, 1 << 10);
        assert_eq!(bits(c.ambient).collect::<Vec<_>>(), vec![10]);
        assert!(parse_status("Name:\tx\n").is_none());
    }
}
