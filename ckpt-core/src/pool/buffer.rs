//! The pool's memory: one anonymous mapping cut into chunk slots, and the slots themselves.
//!
//! A slot holds a chunk file's image as it goes to disk: the 56-byte chunk header, then the data,
//! then zero padding up to the next 4 KiB. The capture writes the data in place; the IO thread
//! writes the header in front of it and sends `header + data + padding` to the file in one
//! `O_DIRECT` write (which wants an aligned buffer, an aligned offset and an aligned length), then
//! cuts the file to its real length. So the data is copied once, from the process into the slot,
//! and never again on its way to the disk.
//!
//! The mapping is asked for transparent huge pages (faulting 1 GiB in 4 KiB pages costs about
//! 0.35 s in the benchmark VM, in 2 MiB pages about 0.05 s) and is faulted in ("prefaulted") by a
//! background thread when the pool is made (with `CKPT_POOL_PREFAULT=1`), so that the first
//! checkpoint does not pay for it while the job is frozen. Otherwise slots are faulted in as a
//! checkpoint first writes them, and after each checkpoint the free ones beyond a few are given
//! back ([`ChunkBuf::release_memory`]): an idle node costs little memory.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::image::CHUNK_HEADER_LEN;

/// Alignment of `O_DIRECT` buffers, offsets and lengths: 4 KiB covers every block device.
pub(crate) const IO_ALIGN: usize = 4096;
/// Room in front of a slot's data for the chunk header.
pub(crate) const HEADER_ROOM: usize = CHUNK_HEADER_LEN;
/// Transparent huge page size on x86_64; the mapping is aligned to it.
const HUGE_PAGE: usize = 2 << 20;

/// `n` rounded up to a multiple of `to` (a power of two).
pub(crate) fn round_up(n: usize, to: usize) -> usize {
    (n + to - 1) & !(to - 1)
}

/// Room after `cap` bytes of data for the trailer of block checksums a raw chunk has.
fn trailer_room(cap: usize) -> usize {
    cap.div_ceil(1 << crate::image::chunk::BLOCK_SHIFT) * 4
}

/// Bytes of a slot for `cap` bytes of data: header, data, trailer, padding to [`IO_ALIGN`].
pub(crate) fn slot_len(cap: usize) -> usize {
    round_up(HEADER_ROOM + cap + trailer_room(cap), IO_ALIGN)
}

/// One private anonymous mapping, unmapped when dropped. The only unsafe code of the pool lives
/// here and in [`Slot`]: handing out disjoint pieces of this mapping as slices.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; which thread may touch which bytes is
// decided by the `Slot`s cut from it, each of which has exactly one owner.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` gives access to no bytes by itself.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to [`IO_ALIGN`]), aligned to 2 MiB, asking for huge pages
    /// if `huge`. Nothing is faulted in yet.
    pub(crate) fn new(len: usize, huge: bool) -> io::Result<Region> {
        let len = round_up(len.max(1), IO_ALIGN);
        let map_len = len.checked_add(HUGE_PAGE).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pool size overflows"))?;
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Keep the 2 MiB-aligned part and give the rest back.
        let base = base as usize;
        let start = round_up(base, HUGE_PAGE);
        let head = start - base;
        let tail = map_len - head - len;
        // SAFETY: both ranges lie inside the mapping just made and are not used by anyone.
        unsafe {
            if head > 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((start + len) as *mut libc::c_void, tail);
            }
            // Advice only: without huge pages the pool still works, with more page faults.
            if huge {
                libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
            }
        }
        Ok(Region { ptr: NonNull::new(start as *mut u8).expect("mmap does not return null"), len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Gives the pages wholly inside `len` bytes at `off` back to the kernel: they read as
    /// zeros, and cost no memory, until written again. The caller owns that piece (no one reads
    /// or writes it meanwhile).
    pub(crate) fn release(&self, off: usize, len: usize) {
        assert!(off <= self.len && len <= self.len - off, "release out of the region");
        let start = round_up(off, IO_ALIGN);
        let end = (off + len) & !(IO_ALIGN - 1);
        if end <= start {
            return;
        }
        // SAFETY: the range is inside the mapping and page-aligned; MADV_DONTNEED on private
        // anonymous memory only drops its contents, which the owner of the piece does not need.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().add(start) as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if r != 0 {
            tracing::debug!("madvise(MADV_DONTNEED) on the pool: {}", io::Error::last_os_error());
        }
    }

    /// Faults in `len` bytes at `off` for writing, so that later writes take no page fault.
    pub(crate) fn populate(&self, off: usize, len: usize) {
        assert!(off <= self.len && len <= self.len - off, "populate out of the region");
        if len == 0 {
            return;
        }
        // Page-align the range (madvise wants an aligned start).
        let start = off & !(IO_ALIGN - 1);
        let len = round_up(off + len, IO_ALIGN).min(self.len) - start;
        // SAFETY: the range is inside the mapping; MADV_POPULATE_WRITE (Linux 5.14) faults the
        // pages in as a write would, without changing their contents.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().add(start) as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
        if r != 0 {
            // Older kernel: touch one byte per page, writing back the byte it holds. The pool
            // populates a slot before anyone owns it, so nobody writes it meanwhile.
            for p in (start..start + len).step_by(IO_ALIGN) {
                // SAFETY: inside the mapping; volatile so the write is not optimized away.
                unsafe {
                    let q = self.ptr.as_ptr().add(p);
                    q.write_volatile(q.read_volatile());
                }
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; every slot holds an `Arc` to this region, so none
        // is alive any more.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// A piece of a [`Region`] owned by exactly one value: the only way to reach its bytes.
pub(crate) struct Slot {
    region: Arc<Region>,
    off: usize,
    len: usize,
}

impl Slot {
    /// The piece `off..off + len` of `region`. The caller makes sure that no two slots of one
    /// region overlap (the pool cuts each region once, into consecutive slots).
    pub(crate) fn new(region: Arc<Region>, off: usize, len: usize) -> Slot {
        assert!(off <= region.len() && len <= region.len() - off, "slot out of its region");
        Slot { region, off, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: the range is inside the live region (kept alive by the Arc) and belongs to
        // this slot alone (see `new`); the borrow of `self` stops any mutable access meanwhile.
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr().add(self.off), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr().add(self.off), self.len) }
    }
}

/// One chunk buffer of the pool: a slot with room for the header in front of `cap` data bytes.
pub(crate) struct ChunkBuf {
    slot: Slot,
    cap: usize,
}

impl ChunkBuf {
    pub(crate) fn new(slot: Slot, cap: usize) -> ChunkBuf {
        assert!(slot.len() >= slot_len(cap), "slot too small for its chunk");
        ChunkBuf { slot, cap }
    }

    /// A chunk buffer in a region of its own (tests, and scratch buffers).
    pub(crate) fn standalone(cap: usize) -> io::Result<ChunkBuf> {
        let len = slot_len(cap);
        let region = Arc::new(Region::new(len, true)?);
        Ok(ChunkBuf::new(Slot::new(region, 0, len), cap))
    }

    /// Data bytes this buffer holds at most.
    pub(crate) fn len(&self) -> usize {
        self.cap
    }

    /// Faults in the first `len` data bytes (at most the buffer's) for writing.
    pub(crate) fn populate(&self, len: usize) {
        self.slot.region.populate(self.slot.off + HEADER_ROOM, len.min(self.cap));
    }

    /// Gives the buffer's memory back to the kernel until it is written again.
    pub(crate) fn release_memory(&self) {
        self.slot.region.release(self.slot.off, self.slot.len);
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.slot.as_slice()[HEADER_ROOM..HEADER_ROOM + self.cap]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let cap = self.cap;
        &mut self.slot.as_mut_slice()[HEADER_ROOM..HEADER_ROOM + cap]
    }

    /// Puts `header` in front of the first `data_len` data bytes and `trailer` after them,
    /// and zeroes the padding after that; returns the file image padded to [`IO_ALIGN`] and the
    /// real file length.
    pub(crate) fn file_image(&mut self, header: &[u8], data_len: usize, trailer: &[u8]) -> (&[u8], usize) {
        assert!(header.len() == HEADER_ROOM && data_len <= self.cap && trailer.len() <= trailer_room(self.cap));
        let data_end = HEADER_ROOM + data_len;
        let real = data_end + trailer.len();
        let padded = round_up(real, IO_ALIGN);
        let s = self.slot.as_mut_slice();
        s[..HEADER_ROOM].copy_from_slice(header);
        s[data_end..real].copy_from_slice(trailer);
        s[real..padded].fill(0);
        (&s[..padded], real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_images() {
        for cap in [1, 4096, 65536, 100_000] {
            let mut b = ChunkBuf::standalone(cap).unwrap();
            assert_eq!(b.as_mut_slice().len(), cap);
            assert_eq!(b.len(), cap);
            b.as_mut_slice().fill(0xab);
            let header = [7u8; HEADER_ROOM];
            let n = cap.min(5000);
            let trailer = vec![9u8; trailer_room(cap)];
            let (image, real) = b.file_image(&header, n, &trailer);
            assert_eq!(image.as_ptr() as usize % IO_ALIGN, 0);
            assert_eq!(image.len() % IO_ALIGN, 0);
            assert_eq!(real, HEADER_ROOM + n + trailer.len());
            assert!(image[..HEADER_ROOM].iter().all(|&x| x == 7));
            assert!(image[HEADER_ROOM..HEADER_ROOM + n].iter().all(|&x| x == 0xab));
            assert!(image[HEADER_ROOM + n..real].iter().all(|&x| x == 9));
            assert!(image[real..].iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn region_is_aligned_and_populates() {
        let r = Arc::new(Region::new(3 * slot_len(8192), true).unwrap());
        assert_eq!(r.ptr.as_ptr() as usize % HUGE_PAGE, 0);
        r.populate(0, r.len());
        let mut slots: Vec<ChunkBuf> = (0..3).map(|i| ChunkBuf::new(Slot::new(r.clone(), i * slot_len(8192), slot_len(8192)), 8192)).collect();
        for (i, s) in slots.iter_mut().enumerate() {
            s.as_mut_slice().fill(i as u8);
        }
        for (i, s) in slots.iter().enumerate() {
            assert!(s.as_slice().iter().all(|&x| x == i as u8));
        }
    }
}
