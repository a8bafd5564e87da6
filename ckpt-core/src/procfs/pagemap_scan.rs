//! PAGEMAP_SCAN (Linux 6.7): an ioctl on /proc/PID/pagemap that lists a range's pages by
//! category as ranges (not 8 bytes a page as a read of pagemap does) and, asked to, write-protects
//! again the pages it reports, atomically with the listing. With a userfaultfd write-protect
//! context in WP_ASYNC mode (`crate::sys::uffd`) this is dirty-page tracking: "written" is a page
//! whose protection bit the kernel cleared on a write.
//!
//! The call and the kernel's structures are `sys::pagemap`'s; here, what is asked and how a
//! scan goes on where the kernel stopped.

use std::io;

use super::Pagemap;
use crate::sys::pagemap::{self as sys, ScanArgs, PM_SCAN_CHECK_WPASYNC, PM_SCAN_WP_MATCHING};
pub use crate::sys::pagemap::{
    PageRegion, PAGE_IS_FILE, PAGE_IS_GUARD, PAGE_IS_HUGE, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PAGE_IS_SWAPPED, PAGE_IS_WPALLOWED, PAGE_IS_WRITTEN,
};

/// Which pages a scan reports: those with every category of `all`, at least one of `any` (if
/// not 0), and the categories of `report` are kept in each region (regions with other
/// categories in `report` are not merged).
#[derive(Debug, Clone, Copy)]
pub struct Query {
    /// Categories turned round before matching: with PRESENT here, PRESENT in `all` or `any`
    /// means "not present". (A region's categories are reported as they are.)
    pub inverted: u64,
    pub all: u64,
    pub any: u64,
    pub report: u64,
    /// Write-protect again what is reported (needs an async write-protect context on every
    /// mapping in the range: EPERM otherwise).
    pub reprotect: bool,
}

impl Query {
    /// Pages written since they were last protected, still there (in memory or swap), protected
    /// again by the scan.
    pub const WRITTEN_REPROTECT: Query =
        Query { inverted: 0, all: PAGE_IS_WRITTEN, any: PAGE_IS_PRESENT | PAGE_IS_SWAPPED, report: PAGE_IS_WRITTEN, reprotect: true };

    /// In one walk, the pages written since they were last protected (reported with WRITTEN,
    /// protected again) and the pages not there, neither in memory nor in swap (reported
    /// without PRESENT and SWAPPED, and with WRITTEN: the kernel calls a dropped page written;
    /// protected, which in a range tracked for writes puts the marker of a page not there yet).
    /// Also reported: markers of pages not there yet, which the kernel counts as swap entries
    /// (SWAPPED, not WRITTEN). For a range whose
    /// pages are all there and few written, the walk reports little: it costs a third of
    /// [`POPULATED`](Self::POPULATED) over a dense heap, which reports every page.
    pub const WRITTEN_OR_ABSENT_REPROTECT: Query = Query {
        inverted: PAGE_IS_PRESENT,
        all: 0,
        any: PAGE_IS_WRITTEN | PAGE_IS_PRESENT,
        report: PAGE_IS_WRITTEN | PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        reprotect: true,
    };
}

impl Query {
    /// Pages that are there: in memory or in swap (or, in a range tracked for writes, a marker
    /// of a page not there yet, which is a swap entry too; or a guard page, which is one too).
    pub const POPULATED: Query = Query { inverted: 0, all: 0, any: PAGE_IS_PRESENT | PAGE_IS_SWAPPED, report: 0, reprotect: false };

    /// Guard pages (madvise MADV_GUARD_INSTALL): Linux 6.16 names them to a scan.
    pub const GUARDS: Query = Query { inverted: 0, all: PAGE_IS_GUARD, any: 0, report: 0, reprotect: false };
}

/// Ranges longer than this are scanned in two halves at once (see [`Pagemap::scan`]).
const SCAN_IN_TWO_FROM: u64 = 512 << 20;

/// Regions asked of the kernel per call: the scan goes on from where a full vector stopped it.
const REGIONS_PER_CALL: usize = 512;

impl Pagemap {
    /// The pages of `[start, end)` (page-aligned) that `q` selects, as address-ordered regions,
    /// adjacent ones merged. Any number of regions: the kernel stops when its vector is full
    /// and says where (walk_end), and the scan goes on from there. ENOTTY: the kernel has no
    /// PAGEMAP_SCAN (before 6.7).
    ///
    /// A range of more than [`SCAN_IN_TWO_FROM`] is walked in two halves on two threads: the
    /// walk costs about 0.7 ms per GiB in page tables, and it is made while the job is frozen.
    pub fn scan(&self, start: u64, end: u64, q: Query) -> io::Result<Vec<PageRegion>> {
        if end.saturating_sub(start) <= SCAN_IN_TWO_FROM {
            return self.scan_with(start, end, q, REGIONS_PER_CALL);
        }
        let mid = start + (end - start) / 2 / crate::PAGE_SIZE * crate::PAGE_SIZE;
        self.scan_in_two(start, mid, end, q)
    }

    /// As [`scan`](Self::scan), over the mappings `ranges` (sorted, disjoint, page-aligned
    /// `(start, end)`: a process's address space, say) in one walk from the first to the last,
    /// or in two at once where they span more than [`SCAN_IN_TWO_FROM`] together, cut where
    /// half of that is behind. The gaps between mappings cost the walk little, so the split
    /// is by what is mapped, not by the span: a process's span is some 47 bits wide, and an
    /// Open MPI rank's 404 mappings were walked in about 0.25 ms (docs/PLAN-SCALE.md, session
    /// 24), where a split by the span gave every process a thread to start and join.
    pub fn scan_mapped(&self, ranges: &[(u64, u64)], q: Query) -> io::Result<Vec<PageRegion>> {
        let (Some(&(start, _)), Some(&(_, end))) = (ranges.first(), ranges.last()) else { return Ok(Vec::new()) };
        let mapped: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        if mapped <= SCAN_IN_TWO_FROM {
            return self.scan_with(start, end, q, REGIONS_PER_CALL);
        }
        let mut behind = 0;
        let mut mid = start;
        for &(s, e) in ranges {
            if behind + (e - s) >= mapped / 2 {
                mid = s + (mapped / 2 - behind) / crate::PAGE_SIZE * crate::PAGE_SIZE;
                break;
            }
            behind += e - s;
        }
        self.scan_in_two(start, mid, end, q)
    }

    /// `[start, mid)` and `[mid, end)` walked at once on two threads, joined.
    fn scan_in_two(&self, start: u64, mid: u64, end: u64, q: Query) -> io::Result<Vec<PageRegion>> {
        let (head, tail) = std::thread::scope(|s| {
            let tail = s.spawn(|| self.scan_with(mid, end, q, REGIONS_PER_CALL));
            let head = self.scan_with(start, mid, q, REGIONS_PER_CALL);
            (head, tail.join())
        });
        let mut out = head?;
        let tail = tail.map_err(|_| io::Error::other("a PAGEMAP_SCAN thread panicked"))??;
        for r in tail {
            match out.last_mut() {
                Some(last) if last.end == r.start && last.categories == r.categories => last.end = r.end,
                _ => out.push(r),
            }
        }
        Ok(out)
    }

    /// Whether at least `enough` pages of `[start, end)` are there (in memory or swap): the
    /// walk stops once it has found that many, so a dense range answers quickly, and a sparse
    /// one as fast as its page tables are few.
    pub fn has_populated(&self, start: u64, end: u64, enough: u64) -> io::Result<bool> {
        let found = self.scan_up_to(start, end, Query::POPULATED, REGIONS_PER_CALL, enough)?;
        Ok(found.iter().map(PageRegion::pages).sum::<u64>() >= enough)
    }

    fn scan_with(&self, start: u64, end: u64, q: Query, per_call: usize) -> io::Result<Vec<PageRegion>> {
        self.scan_up_to(start, end, q, per_call, 0)
    }

    /// As [`scan`](Self::scan), stopping once `max_pages` pages are reported (0: no limit).
    fn scan_up_to(&self, start: u64, end: u64, q: Query, per_call: usize, max_pages: u64) -> io::Result<Vec<PageRegion>> {
        let mut out: Vec<PageRegion> = Vec::new();
        let mut vec = vec![PageRegion::default(); per_call];
        let mut at = start;
        let mut reported = 0u64;
        while at < end {
            let args = ScanArgs {
                flags: if q.reprotect { PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC } else { 0 },
                start: at,
                end,
                // 0 is no limit to the kernel too; a limit reached has ended the loop.
                max_pages: max_pages - reported.min(max_pages),
                category_inverted: q.inverted,
                category_mask: q.all,
                category_anyof_mask: q.any,
                return_mask: q.report,
            };
            let (n, walk_end) = sys::scan(&self.0, &args, &mut vec)?;
            for r in &vec[..n] {
                reported += r.pages();
                match out.last_mut() {
                    // A region cut where one call stopped and the next began.
                    Some(last) if last.end == r.start && last.categories == r.categories => last.end = r.end,
                    _ => out.push(*r),
                }
            }
            // The kernel leaves walk_end at 0 when it found nothing to stop for.
            if walk_end <= at || walk_end >= end || (max_pages > 0 && reported >= max_pages) {
                break;
            }
            at = walk_end;
        }
        Ok(out)
    }

    /// The guard pages of `[start, end)` as `(start, pages)` runs; `None` where the kernel
    /// cannot name them to a scan (before 6.16: EINVAL; before 6.7: no scan at all), in which
    /// case a guard page shows only as a read that fails.
    pub fn guards(&self, start: u64, end: u64) -> io::Result<Option<Vec<(u64, u64)>>> {
        match self.scan(start, end, Query::GUARDS) {
            Ok(regions) => Ok(Some(regions.iter().map(|r| (r.start, r.pages())).collect())),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOTTY)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether this kernel has PAGEMAP_SCAN (an empty scan of the first page answers).
    pub fn can_scan(&self) -> io::Result<bool> {
        let q = Query { inverted: 0, all: 0, any: PAGE_IS_PRESENT, report: PAGE_IS_PRESENT, reprotect: false };
        match self.scan(0, crate::PAGE_SIZE, q) {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain scan (no write-protection involved) of our own memory, with a vector so small
    /// that the kernel stops many times: every present page is found, in order.
    #[test]
    #[cfg_attr(ckpt_no_pagemap_scan, ignore = "this kernel has no PAGEMAP_SCAN (Linux 6.7)")]
    fn scans_go_on_where_the_kernel_stopped() {
        let page = crate::PAGE_SIZE as usize;
        let pages = 64;
        let mut mem = memmap2::MmapMut::map_anon(pages * page).unwrap();
        for i in (0..pages).step_by(2) {
            mem[i * page] = 1;
        }
        let pm = Pagemap::open(std::process::id() as i32).unwrap();
        assert!(pm.can_scan().unwrap(), "a kernel of 6.7 or later (as built) without PAGEMAP_SCAN");
        let start = mem.as_ptr() as u64;
        let end = start + (pages * page) as u64;
        let q = Query { inverted: 0, all: PAGE_IS_PRESENT, any: 0, report: PAGE_IS_PRESENT, reprotect: false };
        let want: Vec<PageRegion> = (0..pages)
            .step_by(2)
            .map(|i| PageRegion { start: start + (i * page) as u64, end: start + ((i + 1) * page) as u64, categories: PAGE_IS_PRESENT })
            .collect();
        assert_eq!(pm.scan_with(start, end, q, 3).unwrap(), want);
        assert_eq!(pm.scan(start, end, q).unwrap(), want);
        // Every page present: one region however often the kernel stopped.
        for i in 0..pages {
            mem[i * page] = 1;
        }
        let whole = vec![PageRegion { start, end, categories: PAGE_IS_PRESENT }];
        assert_eq!(pm.scan_with(start, end, q, 1).unwrap(), whole);
    }

    /// Mappings scanned together, in one walk or in two halves cut by what is mapped: the same
    /// pages as one plain walk over them, whichever way they are cut.
    #[test]
    #[cfg_attr(ckpt_no_pagemap_scan, ignore = "this kernel has no PAGEMAP_SCAN (Linux 6.7)")]
    fn mappings_scanned_in_one_walk_or_two_find_the_same_pages() {
        let page = crate::PAGE_SIZE as usize;
        let pm = Pagemap::open(std::process::id() as i32).unwrap();
        assert!(pm.can_scan().unwrap(), "a kernel of 6.7 or later (as built) without PAGEMAP_SCAN");
        // A reservation of 1 GiB (more than SCAN_IN_TWO_FROM: two walks) with pages written
        // at its start, its middle and its end, and a small mapping beside.
        let big = 1usize << 30;
        let mut reservation = memmap2::MmapOptions::new().len(big).map_anon().unwrap();
        for at in [0, page, big / 2 - page, big / 2, big - page] {
            reservation[at] = 1;
        }
        let mut small = memmap2::MmapMut::map_anon(4 * page).unwrap();
        small[2 * page] = 1;
        let mut ranges: Vec<(u64, u64)> =
            [(reservation.as_ptr(), big), (small.as_ptr(), 4 * page)].iter().map(|&(p, n)| (p as u64, p as u64 + n as u64)).collect();
        ranges.sort_unstable();
        let q = Query { inverted: 0, all: PAGE_IS_PRESENT, any: 0, report: PAGE_IS_PRESENT, reprotect: false };
        // (Clipped to the two mappings: the test harness's own mappings may lie beside them.)
        let regions = |list: Vec<PageRegion>| {
            let mut out = Vec::new();
            for r in &list {
                out.extend(ranges.iter().map(|&(s, e)| (r.start.max(s), r.end.min(e))).filter(|(s, e)| s < e));
            }
            out
        };
        let plain = regions(pm.scan_with(ranges[0].0, ranges[1].1, q, REGIONS_PER_CALL).unwrap());
        assert_eq!(plain.iter().map(|(s, e)| (e - s) / crate::PAGE_SIZE).sum::<u64>(), 6, "{plain:x?}");
        assert_eq!(regions(pm.scan_mapped(&ranges, q).unwrap()), plain);
        // The small mapping alone: one walk.
        assert_eq!(regions(pm.scan_mapped(&ranges[..1], q).unwrap()).len(), regions(pm.scan_with(ranges[0].0, ranges[0].1, q, 8).unwrap()).len());
        assert!(pm.scan_mapped(&[], q).unwrap().is_empty());
    }
}
