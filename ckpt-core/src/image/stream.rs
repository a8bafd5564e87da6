//! Reassembling a process's stream from its chunk files, at restart.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::chunk::{check_chunk_name, chunk_file_name, parse_chunk_file_name, read_chunk_header};
use super::chunk::{BlockTable, ChunkBytes, ChunkDecoder, ChunkHeader, CHUNK_HEADER_LEN};
use super::error::{ImageError, Result};
use super::fsutil;

/// One chunk file of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkLoc {
    pub path: PathBuf,
    pub header: ChunkHeader,
}

/// Reads one process's stream back from the chunk files `chunks_dir/p<pid>-*`.
///
/// Reads are served from the decoded current chunk, so mostly sequential reads (the restore of
/// memory regions in address order) decode every chunk once. While the caller consumes one
/// chunk, helper threads read, check and decode the next few (two threads, three chunks
/// ahead), overlapping disk, checksum and zstd work with the caller's and with each other's:
/// with one helper one chunk ahead, a cold restart of 1 GiB took 0.95-1.26x a cold `cat` of
/// its files, with these 0.96-1.12x (the two binaries in alternation, 2026-11-26). Chunks
/// stored raw are mapped, not read ([`super::mapped`]): [`for_each_piece`](Self::for_each_piece)
/// hands out the page cache's bytes without a copy.
///
/// A reader of a few scattered pages ([`set_scattered`](Self::set_scattered),
/// [`read_blocks_at`](Self::read_blocks_at)) reads and checks only the 64 KiB blocks that hold
/// them in chunks stored raw, by their trailers' block checksums: a lazy restart's page fault
/// costs one 64 KiB read, not a 16 MiB one.
pub struct StreamReader {
    chunks_dir: PathBuf,
    pid: u32,
    chunks: Vec<ChunkLoc>,
    len: u64,
    /// Index in `chunks` of the chunk whose raw bytes are in `data`.
    current: Option<usize>,
    data: ChunkBytes,
    decoder: ChunkDecoder,
    /// Reads skip most of the stream: see [`set_scattered`](Self::set_scattered). A scattered
    /// reader has no helpers reading ahead.
    scattered: bool,
    /// The block checksums of the chunks read in part so far, by index in `chunks`.
    tables: std::collections::HashMap<usize, BlockTable>,
    /// The bytes of the last read in part.
    partial: Vec<u8>,
    prefetcher: Option<Prefetcher>,
    /// Chunks before this index have been announced to the kernel (see [`READ_AHEAD_CHUNKS`]).
    announced: usize,
    /// Time the reader waited for chunks to be read and checked (logged when it is dropped).
    waited: std::time::Duration,
    /// Chunks announced by [`will_read`](Self::will_read).
    advised: std::collections::HashSet<usize>,
}

/// How many chunks past those being prefetched the kernel is asked to read ahead
/// (POSIX_FADV_WILLNEED): the disk keeps reading while the helpers check chunks and the caller
/// copies another, instead of waiting for each chunk's first touch.
const READ_AHEAD_CHUNKS: usize = 4;

impl StreamReader {
    /// Finds the chunk files of process `pid`, checks their headers, and checks that together
    /// they cover the stream from 0 without gap or overlap. A process whose stream was empty has
    /// no chunk file and gives an empty reader.
    pub fn open(chunks_dir: &Path, pid: u32) -> Result<StreamReader> {
        ChunkListing::read(chunks_dir, Some(pid))?.open(pid)
    }

    /// [`open`](Self::open), from the chunk files `paths` of process `pid` in `chunks_dir`.
    fn open_files(chunks_dir: &Path, pid: u32, paths: &[PathBuf]) -> Result<StreamReader> {
        let mut chunks = Vec::with_capacity(paths.len());
        for path in paths {
            let header = read_chunk_header(path)?;
            check_chunk_name(path, &header)?;
            chunks.push(ChunkLoc { path: path.clone(), header });
        }
        let len = check_contiguous(chunks_dir, pid, &mut chunks)?;
        Ok(StreamReader {
            chunks_dir: chunks_dir.to_path_buf(),
            pid,
            chunks,
            len,
            current: None,
            data: ChunkBytes::default(),
            decoder: ChunkDecoder::new(),
            scattered: false,
            tables: Default::default(),
            partial: Vec::new(),
            prefetcher: None,
            announced: 0,
            waited: std::time::Duration::ZERO,
            advised: Default::default(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The chunk directory the stream is read from.
    pub fn dir(&self) -> &Path {
        &self.chunks_dir
    }

    /// Total raw bytes of the stream.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream's chunk files in offset order (for callers that schedule reads themselves).
    pub fn chunks(&self) -> &[ChunkLoc] {
        &self.chunks
    }

    /// Starts reading and checking the stream's first chunks on helper threads, for a caller
    /// that will read the stream from its start soon: a restart reads the next process's
    /// stream while it rebuilds this one (a process of a few MiB has one chunk, which would
    /// otherwise be read and checked only when its memory is filled, the restart waiting).
    pub fn read_ahead(&mut self) {
        if self.scattered || self.current.is_some() || self.chunks.is_empty() {
            return;
        }
        let Some(p) = helpers(&mut self.prefetcher) else { return };
        if !p.in_flight.is_empty() {
            return;
        }
        let asked = PREFETCH_DEPTH.min(self.chunks.len());
        let announced = (asked + READ_AHEAD_CHUNKS).min(self.chunks.len());
        let mut read_ahead: Vec<PathBuf> = self.chunks[asked..announced].iter().map(|c| c.path.clone()).collect();
        for j in 0..asked {
            if !p.request(j, self.chunks[j].path.clone(), Vec::new(), std::mem::take(&mut read_ahead)) {
                self.prefetcher = None;
                return;
            }
        }
        self.announced = announced;
    }

    /// Whether the reads to come skip most of the stream (off by default): then nothing is read
    /// ahead, and a read from a chunk stored raw (other than the current one) reads and checks
    /// only the blocks that hold the bytes asked for.
    pub fn set_scattered(&mut self, on: bool) {
        self.scattered = on;
        if on {
            self.prefetcher = None;
        }
    }

    /// Asks the kernel to start reading what the stream bytes `offset..offset + len` need
    /// (POSIX_FADV_WILLNEED): their chunks, each once, or when [scattered](Self::set_scattered)
    /// the blocks that hold them and their chunks' trailers. For a caller about to read
    /// scattered pieces, which are then read in parallel instead of one after the other.
    pub fn will_read(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len);
        let mut pos = offset;
        while pos < end {
            let i = self.chunk_index(pos);
            let h = self.chunks[i].header;
            let path = &self.chunks[i].path;
            if self.scattered && h.block_shift != 0 {
                let header = CHUNK_HEADER_LEN as u64;
                if self.advised.insert(i) {
                    fsutil::advise_will_need_range(path, header + h.stored_len, h.trailer_len());
                }
                let block = 1u64 << h.block_shift;
                let from = (pos - h.offset) & !(block - 1);
                let to = (end.min(h.end()) - h.offset).next_multiple_of(block).min(h.stored_len);
                fsutil::advise_will_need_range(path, header + from, to - from);
            } else if self.advised.insert(i) {
                fsutil::advise_will_need_range(path, 0, 0);
            }
            pos = h.end();
        }
    }

    /// Fills `buf` with the stream bytes starting at `offset`, across chunk boundaries if needed.
    pub fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let scattered = self.scattered;
        self.read_into(offset, buf, scattered)
    }

    /// As [`read_exact_at`](Self::read_exact_at), reading as a [scattered](Self::set_scattered)
    /// reader does whatever this one is set to: for the one page fault among sequential reads.
    pub fn read_blocks_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_into(offset, buf, true)
    }

    fn read_into(&mut self, offset: u64, buf: &mut [u8], scattered: bool) -> Result<()> {
        self.pieces(offset, buf.len() as u64, scattered, |done, piece| {
            let done = done as usize;
            buf[done..done + piece.len()].copy_from_slice(piece);
            Ok(())
        })
    }

    /// Hands the stream bytes `offset..offset + len` to `use_piece` as they lie in the chunks, in
    /// order, one piece per chunk they span: `use_piece(done, piece)` with `done` the bytes of
    /// the range before `piece`. Nothing is copied on the way, but for a scattered reader's
    /// reads in part.
    pub fn for_each_piece<E: From<ImageError>>(
        &mut self,
        offset: u64,
        len: u64,
        use_piece: impl FnMut(u64, &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let scattered = self.scattered;
        self.pieces(offset, len, scattered, use_piece)
    }

    fn pieces<E: From<ImageError>>(
        &mut self,
        offset: u64,
        len: u64,
        scattered: bool,
        mut use_piece: impl FnMut(u64, &[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len).ok_or_else(|| ImageError::OutOfRange {
            path: self.chunks_dir.clone(),
            pid: self.pid,
            start: offset,
            end: offset.saturating_add(len),
            len: self.len,
        })?;
        let mut pos = offset;
        while pos < end {
            let i = self.chunk_index(pos);
            let h = self.chunks[i].header;
            let from = pos - h.offset;
            let n = (end.min(h.end()) - pos) as usize;
            if scattered && self.current != Some(i) && h.block_shift != 0 {
                self.read_in_part(i, from, n)?;
                use_piece(pos - offset, &self.partial)?;
            } else {
                self.load(i)?;
                let from = from as usize;
                use_piece(pos - offset, &self.data.bytes()[from..from + n])?;
                // A mapped chunk that lost pages since its checksum was checked gave zeros.
                self.data.check_intact(&self.chunks[i].path)?;
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// Reads `n` raw bytes of chunk `i` from `from` into `partial`, with only the blocks that
    /// hold them read and checked.
    fn read_in_part(&mut self, i: usize, from: u64, n: usize) -> Result<()> {
        let started = std::time::Instant::now();
        let loc = &self.chunks[i];
        let table = match self.tables.entry(i) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(BlockTable::read(&loc.path, &loc.header)?),
        };
        self.partial.resize(n, 0);
        self.decoder.read_blocks(&loc.path, &loc.header, table, from, &mut self.partial)?;
        self.waited += started.elapsed();
        Ok(())
    }

    /// Whether a read at `offset` would not wait for the disk: its chunk is the current one, or
    /// a helper has read and checked it. When no helper is on it, they start on it (and the
    /// chunks after it) now. For a caller with other work meanwhile: the lazy restart's page
    /// server, whose background fill must not keep a fault waiting behind a chunk's read.
    /// Always true for a reader without helpers ([scattered](Self::set_scattered)).
    pub fn ready(&mut self, offset: u64) -> bool {
        if offset >= self.len || self.scattered {
            return true;
        }
        let i = self.chunk_index(offset);
        if self.current == Some(i) {
            return true;
        }
        let Some(p) = helpers(&mut self.prefetcher) else { return true };
        if let Some(ready) = p.ready(i) {
            return ready;
        }
        for j in i..(i + 1 + PREFETCH_DEPTH).min(self.chunks.len()) {
            if !p.request(j, self.chunks[j].path.clone(), Vec::new(), Vec::new()) {
                self.prefetcher = None;
                return true;
            }
        }
        false
    }

    /// Reads, checks and decodes every chunk; returns the stream's length.
    #[cfg(test)]
    pub fn verify_all(&mut self) -> Result<u64> {
        for i in 0..self.chunks.len() {
            self.load(i)?;
        }
        Ok(self.len)
    }

    /// Index of the chunk holding stream byte `pos` (which must be < len).
    fn chunk_index(&self, pos: u64) -> usize {
        if let Some(i) = self.current {
            let h = &self.chunks[i].header;
            if h.offset <= pos && pos < h.end() {
                return i;
            }
        }
        self.chunks.partition_point(|c| c.header.end() <= pos)
    }

    /// Makes chunk `i` the current one, then asks for chunk `i + 1` ahead of need.
    fn load(&mut self, i: usize) -> Result<()> {
        if self.current == Some(i) {
            return Ok(());
        }
        self.current = None;
        // The buffer of the previous chunk is reused for the next decode.
        let spare = std::mem::take(&mut self.data).into_spare();
        let started = std::time::Instant::now();
        let mut loaded = None;
        if let Some(p) = self.prefetcher.as_mut() {
            match p.take(i) {
                Ok(Some(result)) => loaded = Some(result?),
                Ok(None) => {}                     // not asked for (the first chunk, or the caller seeked)
                Err(()) => self.prefetcher = None, // a helper died: read synchronously from now on
            }
        }
        let loc = &self.chunks[i];
        let (header, data, spare) = match loaded {
            Some((header, data)) => (header, data, spare),
            None => {
                let (header, data) = self.decoder.load(&loc.path, spare)?;
                (header, data, Vec::new())
            }
        };
        if header != loc.header {
            return Err(ImageError::malformed(&loc.path, "chunk header changed since the stream was opened (is something else writing the image?)"));
        }
        self.data = data;
        self.current = Some(i);
        self.waited += started.elapsed();

        if !self.scattered && i + 1 < self.chunks.len() {
            helpers(&mut self.prefetcher);
            let ahead_end = (i + 1 + PREFETCH_DEPTH + READ_AHEAD_CHUNKS).min(self.chunks.len());
            let ahead_start = self.announced.max(i + 1 + PREFETCH_DEPTH).min(ahead_end);
            let mut read_ahead: Vec<PathBuf> = self.chunks[ahead_start..ahead_end].iter().map(|c| c.path.clone()).collect();
            self.announced = ahead_end;
            let mut spare = Some(spare);
            if let Some(p) = self.prefetcher.as_mut() {
                let from = (i + 1).max(p.asked_up_to() + 1);
                for j in from..(i + 1 + PREFETCH_DEPTH).min(self.chunks.len()) {
                    let buf = spare.take().unwrap_or_default();
                    if !p.request(j, self.chunks[j].path.clone(), buf, std::mem::take(&mut read_ahead)) {
                        self.prefetcher = None;
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        if self.current.is_some() {
            tracing::debug!(pid = self.pid, chunks = self.chunks.len(), waited_ms = self.waited.as_millis() as u64, "stream read");
        }
    }
}

/// The chunk files of a chunk directory, by process: listed once for every process of a
/// restart (each [`StreamReader::open`] lists the whole directory: a node of 256 processes read
/// 65,536 names for its streams).
pub struct ChunkListing {
    dir: PathBuf,
    by_pid: std::collections::HashMap<u32, Vec<PathBuf>>,
}

impl ChunkListing {
    /// Lists `chunks_dir`: the chunk files of every process, or of `only` that one.
    pub fn read(chunks_dir: &Path, only: Option<u32>) -> Result<ChunkListing> {
        let entries = fs::read_dir(chunks_dir).map_err(|e| ImageError::io(chunks_dir, "list chunk directory", e))?;
        let mut by_pid: std::collections::HashMap<u32, Vec<PathBuf>> = Default::default();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(chunks_dir, "list chunk directory", e))?;
            let name = entry.file_name();
            let Some((pid, _)) = name.to_str().and_then(parse_chunk_file_name) else {
                continue; // not a chunk file; `verify` reports strays
            };
            if only.is_none_or(|only| only == pid) {
                by_pid.entry(pid).or_default().push(entry.path());
            }
        }
        Ok(ChunkListing { dir: chunks_dir.to_path_buf(), by_pid })
    }

    /// The processes that have chunk files here, in order.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.by_pid.keys().copied().collect();
        pids.sort_unstable();
        pids
    }

    /// The stream of process `pid`, as [`StreamReader::open`] finds and checks it.
    pub fn open(&self, pid: u32) -> Result<StreamReader> {
        StreamReader::open_files(&self.dir, pid, self.by_pid.get(&pid).map_or(&[], Vec::as_slice))
    }
}

/// The helper threads of a reader, started if they are not yet; None if they cannot be (reads
/// still work, only without overlap).
fn helpers(prefetcher: &mut Option<Prefetcher>) -> Option<&mut Prefetcher> {
    if prefetcher.is_none() {
        *prefetcher = Prefetcher::spawn(PREFETCH_THREADS).ok();
    }
    prefetcher.as_mut()
}

/// Sorts `chunks` by offset and checks that they tile the stream from 0: no gap, no overlap.
/// Returns the stream's length.
pub(crate) fn check_contiguous(chunks_dir: &Path, pid: u32, chunks: &mut [ChunkLoc]) -> Result<u64> {
    chunks.sort_by_key(|c| c.header.offset);
    let mut expected = 0u64;
    for (k, c) in chunks.iter().enumerate() {
        let h = &c.header;
        if h.offset > expected {
            return Err(ImageError::Gap { path: chunks_dir.join(chunk_file_name(pid, expected)), pid, start: expected, end: h.offset });
        }
        if h.offset < expected {
            return Err(ImageError::Overlap { path: c.path.clone(), other: chunks[k - 1].path.clone(), pid, start: h.offset, end: expected.min(h.end()) });
        }
        expected = h.end();
    }
    Ok(expected)
}

/// A chunk read and checked: its header and bytes.
type Loaded = Result<(ChunkHeader, ChunkBytes)>;

struct Request {
    path: PathBuf,
    buf: Vec<u8>,
    /// Chunk files further on, for the kernel to start reading.
    read_ahead: Vec<PathBuf>,
    reply: Sender<Loaded>,
}

/// How many chunks past the current one are being read and checked at any time.
const PREFETCH_DEPTH: usize = 3;
/// Helper threads per stream that read and check chunks: two keep the disk's queue full and the
/// checksums going while the caller copies, on the two processors of a small node.
const PREFETCH_THREADS: usize = 2;

/// Helper threads that read, check and decode the [`PREFETCH_DEPTH`] chunks after the reader's,
/// each chunk by whichever thread is free, handed back in order.
struct Prefetcher {
    requests: Option<Sender<Request>>,
    /// Set when the reader is done: the helpers skip what is still queued.
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Chunks asked for, in stream order, with where each one's result comes.
    in_flight: std::collections::VecDeque<(usize, Receiver<Loaded>)>,
    threads: Vec<JoinHandle<()>>,
}

impl Prefetcher {
    fn spawn(threads: usize) -> std::io::Result<Prefetcher> {
        let (req_tx, req_rx) = crossbeam_channel::unbounded::<Request>();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut handles = Vec::with_capacity(threads);
        for _ in 0..threads {
            let req_rx = req_rx.clone();
            let stop = stop.clone();
            let spawned = std::thread::Builder::new().name("ckpt-prefetch".into()).spawn(move || {
                let mut decoder = ChunkDecoder::new();
                for Request { path, buf, read_ahead, reply } in req_rx {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    for p in &read_ahead {
                        fsutil::advise_will_need_range(p, 0, 0);
                    }
                    // The reader may have moved on and dropped the other end.
                    let _ = reply.send(decoder.load(&path, buf));
                }
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) if handles.is_empty() => return Err(e),
                Err(_) => break, // fewer helpers than asked for still overlap
            }
        }
        Ok(Prefetcher { requests: Some(req_tx), stop, in_flight: Default::default(), threads: handles })
    }

    /// The last chunk asked for (0 when none is in flight).
    fn asked_up_to(&self) -> usize {
        self.in_flight.back().map_or(0, |&(j, _)| j)
    }

    /// Asks for chunk `index`, after every chunk in flight; false if the helpers are gone.
    fn request(&mut self, index: usize, path: PathBuf, buf: Vec<u8>, read_ahead: Vec<PathBuf>) -> bool {
        let (reply, result) = crossbeam_channel::bounded(1);
        let sent = self.requests.as_ref().is_some_and(|tx| tx.send(Request { path, buf, read_ahead, reply }).is_ok());
        if sent {
            self.in_flight.push_back((index, result));
        }
        sent
    }

    /// Whether chunk `index` is read and checked, if it was asked for (None if not), dropping
    /// the chunks asked for before it (the caller went past them). Asked for a chunk before
    /// the first in flight (the caller went back: a lazy restart's fill in address order over
    /// an image whose stream is not), it drops them all, so that what the caller asks for next
    /// is first in line; kept, they would stand in front of it for ever.
    fn ready(&mut self, index: usize) -> Option<bool> {
        while self.in_flight.front().is_some_and(|&(j, _)| j < index) {
            self.in_flight.pop_front();
        }
        match self.in_flight.front() {
            Some((j, result)) if *j == index => Some(!result.is_empty()),
            Some(_) => {
                self.in_flight.clear();
                None
            }
            None => None,
        }
    }

    /// Chunk `index`, if it was asked for: waits for it, dropping the chunks asked for before it
    /// (the caller seeked past them). `Ok(None)` if it was not asked for (then nothing in flight
    /// is kept: the caller is reading elsewhere); `Err` if its helper died.
    fn take(&mut self, index: usize) -> std::result::Result<Option<Loaded>, ()> {
        while let Some((j, result)) = self.in_flight.pop_front() {
            if j == index {
                return result.recv().map(Some).map_err(|_| ());
            }
            if j > index {
                self.in_flight.clear();
                break;
            }
        }
        Ok(None)
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // The helpers end after the chunks they are on.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.requests = None;
        self.in_flight.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::chunk::{write_chunk_file, ChunkEncoder};
    use crate::image::Codec;

    fn stream_bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| ((i / 7) as u8).wrapping_mul(seed) ^ (i as u8)).collect()
    }

    /// Writes `data` as chunks of the given sizes; returns their paths.
    fn write_stream(dir: &Path, pid: u32, data: &[u8], sizes: &[usize], codec: Codec) -> Vec<PathBuf> {
        let mut enc = ChunkEncoder::new(codec).unwrap();
        let mut off = 0usize;
        let mut paths = Vec::new();
        for &n in sizes {
            let c = enc.encode(pid, off as u64, &data[off..off + n]).unwrap();
            write_chunk_file(dir, &c).unwrap();
            paths.push(dir.join(chunk_file_name(pid, off as u64)));
            off += n;
        }
        assert_eq!(off, data.len());
        paths
    }

    #[test]
    fn reads_across_chunks() {
        for codec in [Codec::None, Codec::Zstd(3)] {
            for scattered in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let data = stream_bytes(100_000, 3);
                write_stream(dir.path(), 5, &data, &[30_000, 1, 40_000, 29_999], codec);
                // Another process's chunks in the same directory are not ours.
                write_stream(dir.path(), 6, &data[..10], &[10], codec);
                let mut r = StreamReader::open(dir.path(), 5).unwrap();
                r.set_scattered(scattered);
                assert_eq!(r.len(), 100_000);
                assert_eq!(r.chunks().len(), 4);
                let mut buf = vec![0u8; 100_000];
                r.read_exact_at(0, &mut buf).unwrap();
                assert_eq!(buf, data);
                // Sequential small reads, then seeks backwards and across boundaries.
                for (off, len) in [(0, 10), (10, 29_990), (29_995, 10), (30_001, 50_000), (5, 99_995), (99_999, 1), (0, 0)] {
                    let mut b = vec![0u8; len];
                    r.read_exact_at(off as u64, &mut b).unwrap();
                    assert_eq!(b, &data[off..off + len], "{codec} {off}+{len}");
                    r.read_blocks_at(off as u64, &mut b).unwrap();
                    assert_eq!(b, &data[off..off + len], "{codec} {off}+{len} in blocks");
                }
                let err = r.read_exact_at(99_999, &mut [0u8; 2]).unwrap_err();
                assert!(matches!(err, ImageError::OutOfRange { .. }), "{err}");
                assert_eq!(r.verify_all().unwrap(), 100_000);
            }
        }
    }

    /// Asking whether chunks are ready, backwards as well as forwards (a lazy restart's fill
    /// goes in address order, which need not be stream order): each becomes ready.
    #[test]
    fn chunks_asked_for_out_of_order_become_ready() {
        let dir = tempfile::tempdir().unwrap();
        let data = stream_bytes(8 * 10_000, 9);
        write_stream(dir.path(), 5, &data, &[10_000; 8], Codec::None);
        let mut r = StreamReader::open(dir.path(), 5).unwrap();
        for chunk in [6u64, 1, 7, 0, 3] {
            let at = chunk * 10_000 + 10;
            let waited = std::time::Instant::now();
            while !r.ready(at) {
                assert!(waited.elapsed() < std::time::Duration::from_secs(10), "chunk {chunk} never became ready");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let mut b = vec![0u8; 100];
            r.read_exact_at(at, &mut b).unwrap();
            assert_eq!(b, &data[at as usize..at as usize + 100]);
        }
    }

    /// A scattered reader reads and checks only the blocks it needs: a damaged block fails the
    /// reads that need it, and only those; a whole read fails on it.
    #[test]
    fn scattered_reads_check_only_their_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let block = 1usize << crate::image::chunk::BLOCK_SHIFT;
        let data = stream_bytes(3 * block * 2 + 1000, 7);
        let paths = write_stream(dir.path(), 5, &data, &[3 * block, 3 * block + 1000], Codec::None);
        let mut r = StreamReader::open(dir.path(), 5).unwrap();
        r.set_scattered(true);
        for (off, len) in [(0, 10), (block - 5, 10), (3 * block - 1, 2), (6 * block + 999, 1), (100, 4 * block)] {
            let mut b = vec![0u8; len];
            r.read_exact_at(off as u64, &mut b).unwrap();
            assert_eq!(b, &data[off..off + len], "{off}+{len}");
        }
        // Damage the second chunk's middle block.
        let mut file = std::fs::read(&paths[1]).unwrap();
        file[crate::image::CHUNK_HEADER_LEN + block + 7] ^= 0x40;
        std::fs::write(&paths[1], &file).unwrap();
        let mut r = StreamReader::open(dir.path(), 5).unwrap();
        r.set_scattered(true);
        let mut b = vec![0u8; 4096];
        r.read_exact_at(3 * block as u64, &mut b).unwrap();
        r.read_exact_at(5 * block as u64, &mut b).unwrap();
        let err = r.read_exact_at(4 * block as u64 + 4096, &mut b).unwrap_err();
        assert!(err.to_string().contains("block 1"), "{err}");
        let mut whole = StreamReader::open(dir.path(), 5).unwrap();
        assert!(matches!(whole.verify_all(), Err(ImageError::Checksum { .. })));
    }

    #[test]
    fn empty_stream() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = StreamReader::open(dir.path(), 9).unwrap();
        assert!(r.is_empty());
        assert_eq!(r.verify_all().unwrap(), 0);
        r.read_exact_at(0, &mut []).unwrap();
        assert!(StreamReader::open(&dir.path().join("nope"), 9).is_err());
    }

    #[test]
    fn gap_detected() {
        let dir = tempfile::tempdir().unwrap();
        let data = stream_bytes(30_000, 5);
        let paths = write_stream(dir.path(), 5, &data, &[10_000, 10_000, 10_000], Codec::None);
        fs::remove_file(&paths[1]).unwrap();
        let err = StreamReader::open(dir.path(), 5).err().unwrap();
        assert!(matches!(err, ImageError::Gap { start: 10_000, end: 20_000, .. }), "{err}");
        assert!(err.to_string().contains(&chunk_file_name(5, 10_000)), "{err}");

        fs::remove_file(&paths[0]).unwrap();
        let err = StreamReader::open(dir.path(), 5).err().unwrap();
        assert!(matches!(err, ImageError::Gap { start: 0, .. }), "{err}");
    }

    #[test]
    fn overlap_detected() {
        let dir = tempfile::tempdir().unwrap();
        let data = stream_bytes(30_000, 5);
        write_stream(dir.path(), 5, &data, &[10_000, 20_000], Codec::None);
        let mut enc = ChunkEncoder::new(Codec::None).unwrap();
        write_chunk_file(dir.path(), &enc.encode(5, 15_000, &data[15_000..16_000]).unwrap()).unwrap();
        let err = StreamReader::open(dir.path(), 5).err().unwrap();
        assert!(matches!(err, ImageError::Overlap { start: 15_000, end: 16_000, .. }), "{err}");
        assert!(err.to_string().contains(&chunk_file_name(5, 15_000)), "{err}");
    }

    #[test]
    fn misnamed_chunk_detected() {
        let dir = tempfile::tempdir().unwrap();
        let data = stream_bytes(20_000, 5);
        write_stream(dir.path(), 5, &data, &[10_000, 10_000], Codec::None);
        fs::rename(dir.path().join(chunk_file_name(5, 10_000)), dir.path().join(chunk_file_name(5, 20_000))).unwrap();
        let err = StreamReader::open(dir.path(), 5).err().unwrap();
        assert!(err.to_string().contains(&chunk_file_name(5, 20_000)), "{err}");
        assert!(err.to_string().contains("file name says"), "{err}");
    }

    #[test]
    fn damaged_chunk_detected_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let data = stream_bytes(30_000, 5);
        let paths = write_stream(dir.path(), 5, &data, &[10_000, 10_000, 10_000], Codec::Zstd(3));
        let mut bytes = fs::read(&paths[2]).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&paths[2], &bytes).unwrap();
        let mut r = StreamReader::open(dir.path(), 5).unwrap();
        let mut buf = vec![0u8; 20_000];
        r.read_exact_at(0, &mut buf).unwrap(); // the damaged chunk is prefetched, not yet needed
        let err = r.read_exact_at(20_000, &mut buf[..10]).unwrap_err();
        assert!(err.to_string().contains(&paths[2].display().to_string()), "{err}");
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
        let err = r.verify_all().unwrap_err();
        assert!(matches!(err, ImageError::Checksum { .. }), "{err}");
    }
}
