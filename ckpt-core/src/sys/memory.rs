//! Memory of this process's own, for the tests, which act on it as a program does. (Another
//! process's memory is `ptrace`'s: process_vm_readv, /proc/PID/mem; the node buffer pool maps
//! its own, in `pool`.)

/// madvise(MADV_DONTNEED) over `mem`, whole pages borrowed exclusively: the pages are dropped,
/// and read after as zeros (private anonymous memory) or as the file holds them. EINVAL when
/// `mem` is not whole pages. Hand-written: nix's madvise and memmap2's MADV_DONTNEED are unsafe
/// to call, since they take any range; borrowing the range makes it safe.
pub fn drop_pages(mem: &mut [u8]) -> std::io::Result<()> {
    let (at, len) = (mem.as_mut_ptr() as usize, mem.len());
    if !(at as u64).is_multiple_of(crate::PAGE_SIZE) || !(len as u64).is_multiple_of(crate::PAGE_SIZE) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `mem` is ours alone for the call and whole pages: what the kernel changes is its
    // bytes, to other valid bytes.
    super::check(unsafe { libc::madvise(mem.as_mut_ptr().cast(), len, libc::MADV_DONTNEED) }).map(drop)
}

/// A shared writable mapping of all of file `f`, which the test owns: memmap2's `map_mut` is
/// unsafe because another process may shrink a file under its mapping, which a test's own
/// temporary file rules out.
pub fn map_own_file(f: &std::fs::File) -> std::io::Result<memmap2::MmapMut> {
    // SAFETY: the file is the calling test's own; nothing else changes its size.
    unsafe { memmap2::MmapMut::map_mut(f) }
}
