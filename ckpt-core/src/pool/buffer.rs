//! The pool's chunk buffers.

/// One chunk buffer: `len` bytes starting at a page boundary, allocated once and reused for the
/// pool's whole life. Page alignment lets the capture read memory straight into it
/// (`process_vm_readv`) and keeps the door open to `O_DIRECT` writes.
///
/// The alignment is obtained by over-allocating one page and starting inside it, which keeps this
/// safe code; the cost is one page per chunk (0.1 % of a 4 MiB chunk).
pub(crate) struct ChunkBuf {
    mem: Box<[u8]>,
    start: usize,
    len: usize,
}

impl ChunkBuf {
    pub(crate) fn new(len: usize, align: usize) -> ChunkBuf {
        // Zeroed allocation of this size comes from fresh anonymous memory: pages are only
        // materialized when first written, so an idle pool costs address space, not memory.
        let mem = vec![0u8; len + align].into_boxed_slice();
        let start = mem.as_ptr().align_offset(align);
        assert!(
            start < align,
            "cannot align a chunk buffer to {align} bytes"
        );
        ChunkBuf { mem, start, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

/// The system page size (4096 if it cannot be read).
pub(crate) fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned() {
        let page = page_size();
        for len in [1, 4096, 65536, 100_000] {
            let mut b = ChunkBuf::new(len, page);
            assert_eq!(b.as_slice().as_ptr() as usize % page, 0);
            assert_eq!(b.as_mut_slice().len(), len);
            assert_eq!(b.len(), len);
        }
    }
}
