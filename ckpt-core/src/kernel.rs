//! Checks that the running kernel offers the interfaces checkpoint and restart rest on, so that a
//! missing one is reported up front in one line instead of as a failure halfway through.

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};

use crate::error::{Error, Result};
use crate::sys;

/// One interface, and what to do when it is missing.
struct Requirement {
    what: &'static str,
    present: fn() -> bool,
    advice: &'static str,
}

fn has_mm_map() -> bool {
    sys::process::mm_map_size().is_ok()
}

fn has_process_vm_readv() -> bool {
    let src = [7u8; 8];
    let mut dst = [0u8; 8];
    let remote = RemoteIoVec { base: src.as_ptr() as usize, len: 8 };
    process_vm_readv(nix::unistd::getpid(), &mut [IoSliceMut::new(&mut dst)], &[remote]) == Ok(8)
}

const REQUIREMENTS: &[Requirement] = &[
    Requirement { what: "prctl(PR_SET_MM_MAP)", present: has_mm_map, advice: "use a kernel built with CONFIG_CHECKPOINT_RESTORE=y" },
    Requirement { what: "clone3 with set_tid", present: sys::process::has_clone3_with_set_tid, advice: "use Linux 5.5 or newer" },
    Requirement { what: "process_vm_readv", present: has_process_vm_readv, advice: "use a kernel built with CONFIG_CROSS_MEMORY_ATTACH=y" },
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
