//! A thread's scheduling attributes and CPU affinity, by its id (sched_getattr, sched_setattr,
//! and the raw affinity calls, whose mask is the kernel's bytes).

use std::io;

use super::check;

/// The fields of `struct sched_attr` up to sched_period (utilization clamps are not kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedAttr {
    pub policy: u32,
    pub flags: u64,
    pub nice: i32,
    pub priority: u32,
    pub runtime: u64,
    pub deadline: u64,
    pub period: u64,
}

/// `struct sched_attr` as the kernel reads it.
#[repr(C)]
#[derive(Default)]
struct RawSchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

const RAW_SIZE: u32 = std::mem::size_of::<RawSchedAttr>() as u32;

/// Thread `tid`'s scheduling policy, priority, flags and nice value.
pub fn getattr(tid: i32) -> io::Result<SchedAttr> {
    let mut raw = RawSchedAttr { size: RAW_SIZE, ..Default::default() };
    // SAFETY: the kernel writes at most `size` bytes into `raw`.
    check(unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut raw as *mut RawSchedAttr, raw.size, 0) })?;
    let RawSchedAttr { policy, flags, nice, priority, runtime, deadline, period, .. } = raw;
    Ok(SchedAttr { policy, flags, nice, priority, runtime, deadline, period })
}

/// Sets thread `tid`'s scheduling policy, priority, flags and nice value.
pub fn setattr(tid: i32, attr: &SchedAttr) -> io::Result<()> {
    let SchedAttr { policy, flags, nice, priority, runtime, deadline, period } = *attr;
    let raw = RawSchedAttr { size: RAW_SIZE, policy, flags, nice, priority, runtime, deadline, period };
    // SAFETY: the kernel reads `size` bytes from `raw`.
    check(unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &raw as *const RawSchedAttr, 0) }).map(drop)
}

/// Thread `tid`'s CPU affinity mask, at most `max_bytes` of it.
pub fn affinity(tid: i32, max_bytes: usize) -> io::Result<Vec<u8>> {
    let mut mask = vec![0u8; max_bytes];
    // SAFETY: the raw system call writes at most `mask.len()` bytes and returns how many.
    let n = check(unsafe { libc::syscall(libc::SYS_sched_getaffinity, tid, mask.len(), mask.as_mut_ptr()) })?;
    mask.truncate(n as usize);
    Ok(mask)
}

/// Sets thread `tid`'s CPU affinity mask.
pub fn set_affinity(tid: i32, mask: &[u8]) -> io::Result<()> {
    // SAFETY: the kernel reads `mask.len()` bytes.
    check(unsafe { libc::syscall(libc::SYS_sched_setaffinity, tid, mask.len(), mask.as_ptr()) }).map(drop)
}
