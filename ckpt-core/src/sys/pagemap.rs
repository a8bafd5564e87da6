//! PAGEMAP_SCAN (Linux 6.7): the ioctl on /proc/PID/pagemap that lists a range's pages by
//! category as ranges (not 8 bytes a page as a read of pagemap does) and, asked to,
//! write-protects again the pages it reports, atomically with the listing. One call here;
//! `procfs::pagemap_scan` says what to ask and goes on where the kernel stopped.
//!
//! Hand-written: neither libc (0.2.191), nix (0.31) nor rustix (1.1) has the ioctl. linux-raw-sys
//! (built here under rustix) declares the structures but not the request number, and is rustix's
//! own binding crate, renumbered with each kernel; the two structures below are the kernel's
//! stable ABI (linux/fs.h), checked by a size test.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Page categories (linux/fs.h PAGE_IS_*).
pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
/// Not write-protected: written since it was last protected (or never protected).
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
/// The shared zero page (a page read but never written).
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
pub const PAGE_IS_HUGE: u64 = 1 << 6;
/// A guard page (madvise MADV_GUARD_INSTALL): a marker no access passes, also reported as
/// SWAPPED (Linux 6.16; an older kernel refuses a query that names it, EINVAL).
pub const PAGE_IS_GUARD: u64 = 1 << 8;

/// Write-protect the pages reported, in the same walk.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// Fail with EPERM on a mapping without an async write-protect context. Without it a mapping
/// not (or no longer) registered is skipped silently under PM_SCAN_WP_MATCHING: its writes would
/// go unreported.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// struct page_region
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

impl PageRegion {
    /// The pages the region spans.
    pub fn pages(&self) -> u64 {
        (self.end - self.start) / crate::PAGE_SIZE
    }
}

/// What one call asks: struct pm_scan_arg's fields, but for its size and its vector (the
/// regions [`scan`] is given) and the walk's end (which it returns).
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanArgs {
    /// PM_SCAN_* flags.
    pub flags: u64,
    pub start: u64,
    pub end: u64,
    /// Stop once this many pages are reported (0: no limit).
    pub max_pages: u64,
    pub category_inverted: u64,
    pub category_mask: u64,
    pub category_anyof_mask: u64,
    pub return_mask: u64,
}

/// struct pm_scan_arg
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    /// Out: where the walk stopped (the end, unless the vector filled up).
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

nix::ioctl_readwrite!(pagemap_scan_ioctl, b'f', 16, PmScanArg);

/// One PAGEMAP_SCAN of `pagemap` (an open /proc/PID/pagemap) into `regions`: how many regions
/// the kernel wrote there, and where its walk stopped (0 when it found nothing to stop for).
/// ENOTTY: the kernel has no PAGEMAP_SCAN.
pub fn scan(pagemap: &impl AsFd, args: &ScanArgs, regions: &mut [PageRegion]) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags: args.flags,
        start: args.start,
        end: args.end,
        walk_end: 0,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        max_pages: args.max_pages,
        category_inverted: args.category_inverted,
        category_mask: args.category_mask,
        category_anyof_mask: args.category_anyof_mask,
        return_mask: args.return_mask,
    };
    // SAFETY: `arg` is a properly laid out pm_scan_arg whose vector is `regions`, writable and
    // `vec_len` regions long for the call; the kernel writes at most that many and returns how
    // many it wrote.
    let n = unsafe { pagemap_scan_ioctl(pagemap.as_fd().as_raw_fd(), &mut arg) }.map_err(io::Error::from)?;
    Ok(((n as usize).min(regions.len()), arg.walk_end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<PageRegion>(), 24);
        // _IOWR('f', 16, struct pm_scan_arg), as linux/fs.h defines PAGEMAP_SCAN.
        assert_eq!(nix::request_code_readwrite!(b'f', 16, 96), 0xc060_6610);
    }
}
