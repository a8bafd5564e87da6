//! Shared memory objects copied before the freeze (issue 37, item 2; docs/PLAN-SCALE.md): a
//! memfd, MAP_SHARED|MAP_ANONYMOUS memory, a deleted tmpfs file mapped shared ("nameless"
//! objects, whose pages a process's record stores as [`Backing::Shmem`]) and a tmpfs file mapped
//! shared (/dev/shm: POSIX shared memory, whose contents a record saves as
//! [`Backing::File`]'s `saved`). Without this they are read whole while the job is frozen: an
//! Open MPI job's shared-memory segments, PyTorch's DataLoader batches, a database's buffers.
//!
//! Every mapping of an object in the job is write-tracked (`dirty::DirtyTracker::track_shared`)
//! before its pages are copied; at the freeze, the pages written since through any of them, or
//! through a mapping made since, are copied again and the rest is referred to the copy
//! ([`SharedPlan`]). Writes through a descriptor (write(2), fallocate, truncate) show in no page
//! table: inotify tells them ([`DescriptorWrites`]), and the object is then read whole while
//! frozen, as before. What the tracking cannot see, and so is not
//! copied ahead: objects a process outside the tracking maps (under a seccomp filter, sharing its
//! parent's memory until an exec), System V segments (their contents are the node's record), and
//! every object on a node with swap (a written shared page swapped out leaves no mark).
//! `capture::shared` decides which objects are copied and settles them at the freeze.

use super::deleted::Extent;
use super::dirty::{intersect, normalise, subtract};
use crate::error::Result;
use crate::pool::StreamWriter;
use crate::procfs::pagemap_scan::{Query, PAGE_IS_PRESENT};
use crate::procfs::Pagemap;
use crate::ptrace::remote_mem::ProcMem;
use crate::ptrace::Tid;
use crate::PAGE_SIZE;

#[allow(unused_imports)] // (for the links above)
use super::memory::Backing;

/// A shared memory object: the device and inode of its file.
pub type ObjectId = (u64, u64);

/// A mapping of an object in a process: `[start, end)` maps the object from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectMapping {
    pub pid: Tid,
    pub start: u64,
    pub end: u64,
    pub offset: u64,
}

impl ObjectMapping {
    /// The object's offsets it maps.
    pub fn window(&self) -> (u64, u64) {
        (self.offset, self.offset + (self.end - self.start))
    }

    /// `[from, to)` of its addresses as object offsets.
    pub fn offsets_of(&self, (from, to): (u64, u64)) -> (u64, u64) {
        (from - self.start + self.offset, to - self.start + self.offset)
    }
}

/// What the capture at the freeze does with an object copied before it: which process stores it
/// (the one whose stream holds the copy), what the copy holds, and which of its pages may have
/// changed since. Made by `capture::shared::settle`, only for an object whose every mapping was
/// tracked since the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPlan {
    /// The process (host pid) whose stream holds the copy, and which stores the object.
    pub keeper: Tid,
    /// Its mapping of the object, through which a nameless object's pages are stored.
    pub keeper_mapping: (u64, u64),
    /// The object's offsets that mapping maps.
    pub keeper_window: (u64, u64),
    /// Where the copy put the object's pages: `file_offset` is the object's offset; sorted,
    /// disjoint, each a whole number of pages in the stream.
    pub copied: Vec<Extent>,
    /// Object offsets of the pages that may differ from the copy: sorted, disjoint,
    /// page-aligned.
    pub changed: Vec<(u64, u64)>,
}

impl SharedPlan {
    /// Of the object's pages `present` (offsets: sorted, disjoint, page-aligned), those the copy
    /// holds as they are now, as extents of the stream (sorted by offset), and the others, to be
    /// copied now. Pure.
    pub fn split(&self, present: &[(u64, u64)]) -> (Vec<Extent>, Vec<(u64, u64)>) {
        let copied: Vec<(u64, u64)> = self.copied.iter().map(|e| (e.file_offset, e.file_offset + e.len.next_multiple_of(PAGE_SIZE))).collect();
        let unchanged = intersect(&subtract(present, &self.changed), &copied);
        let mut refer = Vec::new();
        for &(from, to) in &unchanged {
            let first = self.copied.partition_point(|e| e.file_offset + e.len.next_multiple_of(PAGE_SIZE) <= from);
            for e in self.copied[first..].iter().take_while(|e| e.file_offset < to) {
                let (s, t) = (from.max(e.file_offset), to.min(e.file_offset + e.len.next_multiple_of(PAGE_SIZE)));
                if s < t {
                    refer.push(Extent { file_offset: s, len: t - s, stream_offset: e.stream_offset + (s - e.file_offset) });
                }
            }
        }
        (refer, subtract(present, &unchanged))
    }
}

/// Writes to objects through descriptors (write(2), pwrite, fallocate, ftruncate, splice, AIO,
/// io_uring), which no page table shows: the kernel tells each to inotify as IN_MODIFY, and
/// never a store through a mapping. (The objects' times will not do: a write fault on a
/// protected shared page, which the tracking makes of every first write, sets them too.)
pub struct DescriptorWrites {
    inotify: nix::sys::inotify::Inotify,
}

/// One object watched by [`DescriptorWrites`].
pub type Watch = nix::sys::inotify::WatchDescriptor;

impl DescriptorWrites {
    pub fn new() -> std::io::Result<DescriptorWrites> {
        use nix::sys::inotify::{InitFlags, Inotify};
        Ok(DescriptorWrites { inotify: Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)? })
    }

    /// Watches the file `path` leads to (a path through /proc: a process's root, or a
    /// descriptor's link, which reaches a memfd too).
    pub fn watch(&self, path: &str) -> std::io::Result<Watch> {
        use nix::sys::inotify::AddWatchFlags;
        Ok(self.inotify.add_watch(path, AddWatchFlags::IN_MODIFY)?)
    }

    /// The watches written through a descriptor since they were made; `None` if the kernel lost
    /// count (its queue overflowed: any may have been).
    pub fn written(&self) -> std::io::Result<Option<std::collections::HashSet<Watch>>> {
        use nix::sys::inotify::AddWatchFlags;
        let mut out = std::collections::HashSet::new();
        loop {
            match self.inotify.read_events() {
                Ok(events) if events.is_empty() => return Ok(Some(out)),
                Ok(events) => {
                    for e in events {
                        if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                            return Ok(None);
                        }
                        out.insert(e.wd);
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return Ok(Some(out)),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl std::fmt::Debug for DescriptorWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DescriptorWrites")
    }
}

/// Copies the pages of a nameless object that `keeper` maps into `stream`, while the job runs,
/// each page read through a mapping that has it in its page tables (`mappers`, the keeper's
/// first): a page no mapping has there is left for the freeze, which learns from inside the
/// keeper which pages the object holds (reading one it lacks would make it). The caller
/// tracks the writes to every mapping from before the copy on. Returns where each part went
/// (object offsets); an error where a mapping could not be read (the process ended, or
/// unmapped it): the object is then read at the freeze.
pub fn copy_nameless(keeper: &ObjectMapping, mappers: &[ObjectMapping], stream: &mut StreamWriter) -> Result<Vec<Extent>> {
    let present_only = Query { inverted: 0, all: PAGE_IS_PRESENT, any: 0, report: 0, reprotect: false };
    let window = [keeper.window()];
    let mut copied: Vec<(u64, u64)> = Vec::new();
    let mut out = Vec::new();
    for m in std::iter::once(keeper).chain(mappers.iter().filter(|m| *m != keeper)) {
        let (pagemap, mem) = (Pagemap::open(m.pid)?, ProcMem::open(m.pid)?);
        let there: Vec<(u64, u64)> = pagemap.scan(m.start, m.end, present_only)?.iter().map(|r| m.offsets_of((r.start, r.end))).collect();
        let wanted = subtract(&intersect(&normalise(&there), &window), &copied);
        for &(from, to) in &wanted {
            let mut runs = Vec::new();
            let addr = m.start + (from - m.offset);
            let mut read = |at: u64, buf: &mut [u8]| super::memory::read_mapped(m.pid, &mem, libc::PROT_READ as u32, at, buf);
            super::memory::copy_run_as(addr, (to - from) / PAGE_SIZE, stream, &mut runs, &mut read, true)?;
            out.extend(runs.iter().map(|r| Extent { file_offset: r.addr - m.start + m.offset, len: r.pages * PAGE_SIZE, stream_offset: r.stream_offset }));
        }
        copied = normalise(&[copied, wanted].concat());
    }
    out.sort_unstable_by_key(|e| e.file_offset);
    Ok(out)
}

/// The runs `(offset, pages)` of a nameless object's pages that mincore showed the object holds
/// (`resident`: a byte a page of the mapping, bit 0 set where the page is), as object offsets of
/// a mapping from `offset`. Pure.
pub fn resident_offsets(resident: &[u8], offset: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, _) in resident.iter().enumerate().filter(|(_, b)| *b & 1 != 0) {
        let at = offset + i as u64 * PAGE_SIZE;
        match out.last_mut() {
            Some(last) if last.1 == at => last.1 += PAGE_SIZE,
            _ => out.push((at, at + PAGE_SIZE)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    fn plan(copied: &[(u64, u64, u64)], changed: &[(u64, u64)]) -> SharedPlan {
        SharedPlan {
            keeper: 1,
            keeper_mapping: (0, 0),
            keeper_window: (0, 0),
            copied: copied.iter().map(|&(file_offset, len, stream_offset)| Extent { file_offset, len, stream_offset }).collect(),
            changed: changed.to_vec(),
        }
    }

    #[test]
    fn unchanged_pages_are_referred_to_the_copy_and_the_rest_copied_again() {
        // Copied: pages 0-3 at stream 100P, pages 6-7 at stream 200P. Changed: page 2, 7.
        let p = plan(&[(0, 4 * P, 100 * P), (6 * P, 2 * P, 200 * P)], &[(2 * P, 3 * P), (7 * P, 8 * P)]);
        // Present now: pages 0-8 (page 4-5 new since the copy, page 8 too).
        let (refer, now) = p.split(&[(0, 9 * P)]);
        assert_eq!(
            refer,
            vec![
                Extent { file_offset: 0, len: 2 * P, stream_offset: 100 * P },
                Extent { file_offset: 3 * P, len: P, stream_offset: 103 * P },
                Extent { file_offset: 6 * P, len: P, stream_offset: 200 * P },
            ]
        );
        assert_eq!(now, vec![(2 * P, 3 * P), (4 * P, 6 * P), (7 * P, 9 * P)]);
    }

    #[test]
    fn a_page_gone_since_the_copy_is_neither_referred_nor_copied() {
        let p = plan(&[(0, 4 * P, 0)], &[]);
        let (refer, now) = p.split(&[(0, P), (3 * P, 4 * P)]);
        assert_eq!(refer, vec![Extent { file_offset: 0, len: P, stream_offset: 0 }, Extent { file_offset: 3 * P, len: P, stream_offset: 3 * P }]);
        assert!(now.is_empty());
    }

    #[test]
    fn a_file_tail_shorter_than_a_page_is_a_whole_page_of_the_copy() {
        // A file of 5000 bytes: its copy is two pages in the stream.
        let p = plan(&[(0, 5000, 10 * P)], &[]);
        let (refer, now) = p.split(&[(0, 2 * P)]);
        assert_eq!(refer, vec![Extent { file_offset: 0, len: 2 * P, stream_offset: 10 * P }]);
        assert!(now.is_empty());
    }

    #[test]
    fn everything_changed_is_copied_again() {
        let p = plan(&[(0, 4 * P, 0)], &[(0, 4 * P)]);
        let (refer, now) = p.split(&[(0, 4 * P)]);
        assert!(refer.is_empty());
        assert_eq!(now, vec![(0, 4 * P)]);
    }

    #[test]
    fn resident_pages_become_object_offsets() {
        assert_eq!(resident_offsets(&[1, 1, 0, 1, 0, 0, 1], 8 * P), vec![(8 * P, 10 * P), (11 * P, 12 * P), (14 * P, 15 * P)]);
        assert!(resident_offsets(&[0, 0], 0).is_empty());
    }

    #[test]
    fn a_write_through_a_descriptor_is_seen_and_a_read_is_not() {
        // (That a store through a mapping is not seen either, tests/tests/core.rs shows: an
        // object written only that way uses its copy.)
        let path = std::env::temp_dir().join(format!("ckpt-watch-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let f = std::fs::File::options().read(true).write(true).open(&path).unwrap();
        let writes = DescriptorWrites::new().unwrap();
        let w = writes.watch(&format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f))).unwrap();
        let mut buf = [0u8; 16];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, 100).unwrap();
        assert_eq!(writes.written().unwrap(), Some(Default::default()), "a read");
        std::os::unix::fs::FileExt::write_all_at(&f, b"x", 10).unwrap();
        assert_eq!(writes.written().unwrap(), Some([w].into_iter().collect()), "pwrite");
        std::fs::remove_file(&path).unwrap();
    }
}
