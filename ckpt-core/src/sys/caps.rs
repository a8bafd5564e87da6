//! Capability sets of the calling thread (capget, capset, the ambient set). Every call here is
//! async-signal-safe, without allocation: `userns` makes them in a child between `clone` and
//! `execve`.

use std::io;

use super::check;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`; capabilities 0-31 in the first, 32-63 in the second.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A thread's capability sets, as 64-bit masks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapSets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

/// The calling thread's capability sets.
pub fn capget() -> io::Result<CapSets> {
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData, which `data` holds.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) })?;
    let join = |lo: u32, hi: u32| lo as u64 | (hi as u64) << 32;
    Ok(CapSets {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Sets the calling thread's capability sets.
pub fn capset(sets: CapSets) -> io::Result<()> {
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let split = |v: u64| (v as u32, (v >> 32) as u32);
    let (e, p, i) = (split(sets.effective), split(sets.permitted), split(sets.inheritable));
    let data = [CapData { effective: e.0, permitted: p.0, inheritable: i.0 }, CapData { effective: e.1, permitted: p.1, inheritable: i.1 }];
    // SAFETY: capset reads one header and two CapData.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) }).map(drop)
}

/// Adds capability `cap` to the calling thread's ambient set.
pub fn raise_ambient(cap: u64) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, cap, 0, 0) }).map(drop)
}
