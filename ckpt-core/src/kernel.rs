//! Checks that the running kernel offers the interfaces checkpoint and restart rest on, so that a
//! missing one is reported up front in one line instead of as a failure halfway through.

use crate::error::{Error, Result};

const PR_SET_MM: libc::c_int = 35;
const PR_SET_MM_MAP_SIZE: libc::c_ulong = 15;

/// One interface, and what to do when it is missing.
struct Requirement {
    what: &'static str,
    present: fn() -> bool,
    advice: &'static str,
}

fn has_mm_map() -> bool {
    let mut size: u32 = 0;
    // SAFETY: PR_SET_MM_MAP_SIZE only writes the structure size into `size`.
    unsafe { libc::prctl(PR_SET_MM, PR_SET_MM_MAP_SIZE, &mut size as *mut u32, 0, 0) == 0 }
}

fn has_clone3() -> bool {
    // A zero-sized argument is refused with EINVAL by a kernel that has clone3, ENOSYS otherwise.
    // SAFETY: the kernel rejects the call before touching any memory.
    let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

fn has_process_vm_readv() -> bool {
    let src = [7u8; 8];
    let mut dst = [0u8; 8];
    let local = libc::iovec { iov_base: dst.as_mut_ptr() as *mut _, iov_len: 8 };
    let remote = libc::iovec { iov_base: src.as_ptr() as *mut _, iov_len: 8 };
    // SAFETY: both iovecs point at live 8-byte buffers of this process.
    unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) == 8 }
}

const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        what: "prctl(PR_SET_MM_MAP)",
        present: has_mm_map,
        advice: "use a kernel built with CONFIG_CHECKPOINT_RESTORE=y",
    },
    Requirement { what: "clone3 with set_tid", present: has_clone3, advice: "use Linux 5.5 or newer" },
    Requirement {
        what: "process_vm_readv",
        present: has_process_vm_readv,
        advice: "use a kernel built with CONFIG_CROSS_MEMORY_ATTACH=y",
    },
];

/// Fails with one line naming the first missing interface and what to do about it; without
/// privilege, also when this machine refuses the job a user namespace of its own.
pub fn check() -> Result<()> {
    for r in REQUIREMENTS {
        if !(r.present)() {
            return Err(Error::Other(format!("this kernel lacks {}, which ckpt needs: {}", r.what, r.advice)));
        }
    }
    if !crate::userns::privileged() {
        crate::userns::probe()?;
    }
    Ok(())
}
