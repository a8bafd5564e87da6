//! PROCMAP_QUERY (Linux 6.11): the ioctl on /proc/PID/maps that describes one mapping (the one
//! covering an address, or the next one) in a fixed structure, its name only if asked for. A
//! process of some 400 mappings is listed in a quarter of the time a read of /proc/PID/maps
//! takes without names (the kernel formats every path there, and escapes it), under half with
//! them (measured on 6.18: docs/PLAN-SCALE.md, session 23). One call here; `procfs` walks.
//!
//! Hand-written: neither libc (0.2.191), nix (0.31) nor rustix (1.1) has the ioctl; the
//! structure below is the kernel's stable ABI (linux/fs.h, extensible by `size`), checked by a
//! size test.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// The mapping covering the address asked, or else the next one up.
pub const COVERING_OR_NEXT_VMA: u64 = 0x10;

/// vma_flags bits (PROCMAP_QUERY_VMA_*).
pub const VMA_READABLE: u64 = 0x01;
pub const VMA_WRITABLE: u64 = 0x02;
pub const VMA_EXECUTABLE: u64 = 0x04;
pub const VMA_SHARED: u64 = 0x08;

/// One mapping as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// VMA_* bits.
    pub flags: u64,
    pub offset: u64,
    pub dev: (u32, u32),
    pub inode: u64,
    /// Its name as /proc/PID/maps shows it (a path, "[heap]"...; empty for anonymous memory),
    /// if asked for; raw where maps escapes (a newline is `\012` there).
    pub name: Option<Vec<u8>>,
}

/// struct procmap_query
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

nix::ioctl_readwrite!(procmap_query_ioctl, b'f', 17, ProcmapQuery);

/// The longest name asked for: a path (PATH_MAX) and the " (deleted)" the kernel may add.
const NAME_MAX_LEN: usize = 4096 + 16;

/// The mapping of `maps` (an open /proc/PID/maps) covering `addr`, or the next one up; its name
/// too with `named`. None past the last mapping (ENOENT). ENOTTY: the kernel has no
/// PROCMAP_QUERY (before 6.11).
pub fn query(maps: &impl AsFd, addr: u64, named: bool) -> io::Result<Option<Mapping>> {
    let mut name = if named { vec![0u8; NAME_MAX_LEN] } else { Vec::new() };
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_flags: COVERING_OR_NEXT_VMA,
        query_addr: addr,
        vma_name_size: name.len() as u32,
        vma_name_addr: if named { name.as_mut_ptr() as u64 } else { 0 },
        ..Default::default()
    };
    // SAFETY: `q` is a properly laid out procmap_query; its name buffer, where given, is
    // `name`, writable and `vma_name_size` bytes long for the call; the kernel writes at most
    // that many (the name and its NUL) and says how many in `vma_name_size`.
    match unsafe { procmap_query_ioctl(maps.as_fd().as_raw_fd(), &mut q) } {
        Ok(_) => {}
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(io::Error::from(e)),
    }
    let name = named.then(|| {
        // (The size counts the NUL; 0 for a mapping without a name.)
        name.truncate((q.vma_name_size as usize).saturating_sub(1));
        name
    });
    Ok(Some(Mapping { start: q.vma_start, end: q.vma_end, flags: q.vma_flags, offset: q.vma_offset, dev: (q.dev_major, q.dev_minor), inode: q.inode, name }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structure_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<ProcmapQuery>(), 104);
        // _IOWR('f', 17, struct procmap_query), as linux/fs.h defines PROCMAP_QUERY.
        assert_eq!(nix::request_code_readwrite!(b'f', 17, 104), 0xc068_6611);
    }
}
