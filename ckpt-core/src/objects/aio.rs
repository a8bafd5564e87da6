//! Linux AIO contexts (io_setup(2): libaio, as MariaDB's InnoDB, fio and Ceph use it).
//!
//! A context is a ring of completion events the kernel maps into the process (`/[aio]` in its
//! maps); the context's id, which the program passes to io_submit and io_getevents, is the
//! ring's address, and libaio reads the ring's head and tail directly. Restored as memory alone,
//! the ring would be an ordinary page and every io_submit would fail with EINVAL: the restart
//! makes a new context instead (io_setup with the size that gives a ring of the same length) and
//! moves its ring to the old address (mremap, which the kernel follows: the context's id becomes
//! that address).
//!
//! Events completed but not reaped (head != tail) cannot be put back in a new ring: such a
//! context is refused at checkpoint time. Requests still in flight when the job is frozen (only
//! O_DIRECT requests to a slow device take that long; buffered I/O completes within io_submit)
//! are not visible to a checkpointer and do not complete after a restart.

use crate::error::{Context, Error, Result};
use crate::ptrace::remote_mem::ProcMem;
use crate::ptrace::{RemoteTask, Tid};
use crate::PAGE_SIZE;

/// The name the kernel gives a ring's mapping.
pub const RING_PATH: &str = "/[aio] (deleted)";
/// The ring's header: id, nr, head, tail, magic, compat and incompat features, header length.
const HEADER_LEN: u64 = 32;
/// One event: data, obj, res, res2.
const EVENT_LEN: u64 = 32;
const RING_MAGIC: u32 = 0xa10a10a1;

/// Reads the ring at `addr` of process `pid`: the number of events it holds (its `nr`).
pub fn capture(pid: Tid, mem: &ProcMem, addr: u64, len: u64) -> Result<u32> {
    let mut header = [0u8; HEADER_LEN as usize];
    mem.read_exact(addr, &mut header).context(|| format!("read the AIO ring of pid {pid} at {addr:#x}"))?;
    let word = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let (nr, head, tail, magic) = (word(1), word(2), word(3), word(4));
    if magic != RING_MAGIC || ring_len(nr) != len {
        return Err(Error::Unsupported {
            pid,
            what: format!("an AIO context at {addr:#x} whose ring is not as the kernel makes it (nr {nr}, magic {magic:#x})"),
        });
    }
    if head != tail {
        return Err(Error::Unsupported {
            pid,
            what: format!(
                "an AIO context at {addr:#x} holding {} completed events not reaped yet (they cannot be put back)",
                tail.wrapping_sub(head) % nr.max(1)
            ),
        });
    }
    Ok(nr)
}

/// The length of the ring the kernel makes for `nr` events: whole pages. Pure.
pub fn ring_len(nr: u32) -> u64 {
    (HEADER_LEN + nr as u64 * EVENT_LEN).div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// What to ask io_setup for so that the kernel makes a ring of `nr` events: it raises the
/// request to 4 per CPU, doubles it, adds 2, and makes the ring whole pages, which then hold
/// `nr` (a ring of P pages holds 128 P - 1). Pure.
fn request_for(nr: u32) -> u32 {
    nr.saturating_sub(2) / 2
}

/// Makes a new context in the task whose ring holds `nr` events, and moves the ring to `addr`
/// (free: the task's old mappings are gone); its id is then `addr`, as the program knows it.
pub fn restore(task: &mut RemoteTask, addr: u64, len: u64, nr: u32, scratch_off: usize) -> Result<()> {
    let (inj, scratch) = task.split();
    let out = scratch.at(scratch_off);
    scratch.put(scratch_off, &0u64.to_ne_bytes())?;
    inj.call("io_setup", libc::SYS_io_setup, &[request_for(nr) as u64, out])
        .context(|| format!("make an AIO context of {nr} events again (io_setup; the machine's fs.aio-max-nr may be too low)"))?;
    let made = scratch.get_u64(scratch_off)?;
    let made_len = ring_len(read_nr(task, made)?);
    if made_len != len {
        // A ring the restarting machine makes larger (more CPUs): it would not fit its place.
        let _ = task.syscall("io_destroy", libc::SYS_io_destroy, &[made]);
        return Err(Error::Other(format!("an AIO context at {addr:#x}: this machine makes its ring {made_len} bytes long, not {len} (more CPUs?)")));
    }
    if made != addr {
        let flags = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
        task.syscall("mremap", libc::SYS_mremap, &[made, len, len, flags, addr]).context(|| format!("move the AIO ring from {made:#x} to {addr:#x}"))?;
    }
    Ok(())
}

fn read_nr(task: &RemoteTask, ring: u64) -> Result<u32> {
    let mut nr = [0u8; 4];
    task.mem.read_exact(ring + 4, &mut nr).context(|| format!("read the new AIO ring at {ring:#x}"))?;
    Ok(u32::from_ne_bytes(nr))
}

/// Checks a record's ring against its mapping's length. Pure.
pub fn validate(nr: u32, len: u64) -> std::result::Result<(), String> {
    if nr == 0 || ring_len(nr) != len {
        return Err(format!("an AIO ring of {nr} events in a mapping of {len} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_gives_a_ring_of_the_same_pages() {
        // What the kernel does with a request (aio_setup's arithmetic), on a small machine.
        let kernel_nr = |req: u32, cpus: u32| {
            let doubled = req.max(4 * cpus) * 2 + 2;
            let pages = (HEADER_LEN + doubled as u64 * EVENT_LEN).div_ceil(PAGE_SIZE);
            ((pages * PAGE_SIZE - HEADER_LEN) / EVENT_LEN) as u32
        };
        for asked in [1, 64, 128, 1000, 65536] {
            let nr = kernel_nr(asked, 2);
            assert_eq!(kernel_nr(request_for(nr), 2), nr, "asked {asked}");
            assert_eq!(validate(nr, ring_len(nr)), Ok(()));
        }
        assert!(validate(127, 8192).is_err());
    }
}
