//! A batch (one generation's writes on one node) and the stream writers that fill it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::buffer::ChunkBuf;
use super::io::{self, ChunkWriter, Job, Written};
use super::{PoolInner, WriterMode};
use crate::image::fsutil;
use crate::image::{FileEntry, ImageError};

/// What a batch wrote, once durable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// One entry per chunk file, sorted by path, ready for the manifest.
    pub files: Vec<FileEntry>,
    /// Stream bytes handed to the batch.
    pub bytes_raw: u64,
    /// Chunk data bytes on disk after compression (headers excluded).
    pub bytes_stored: u64,
    /// Chunk files written.
    pub chunks: u64,
    /// Time capture threads spent waiting for a free chunk, summed over every stream: how much
    /// a larger pool (or faster disk) would have saved the frozen application.
    pub wait_for_free_chunk: Duration,
}

/// What one stream wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub pid: u32,
    /// Raw stream bytes.
    pub bytes: u64,
    /// Chunks handed to the IO threads.
    pub chunks: u64,
    /// Time spent waiting for a free chunk.
    pub wait_for_free_chunk: Duration,
}

/// State shared by a batch's handles, its stream writers and the IO threads' jobs.
pub(crate) struct BatchShared {
    pub(crate) chunks_dir: PathBuf,
    /// Set with the first error, so that writers and IO threads stop early.
    pub(crate) failed: AtomicBool,
    dir_ready: AtomicBool,
    state: Mutex<BatchState>,
    /// Signalled whenever a chunk completes.
    done: Condvar,
}

#[derive(Default)]
struct BatchState {
    /// Chunks handed to the IO threads and not completed yet.
    pending: u64,
    /// The same, per stream (for `wag`, whose streams wait for their own chunks).
    pending_by_pid: BTreeMap<u32, u64>,
    /// Streams opened and neither finished nor dropped.
    open: BTreeSet<u32>,
    /// Every pid that had a stream, to refuse a second stream (it would collide on file names).
    seen: BTreeSet<u32>,
    /// Set by `wait_durable`: later streams are refused.
    closed: bool,
    /// Streams given up whole ([`StreamWriter::discard`]): their chunk files are deleted and
    /// left out of the report once written.
    discarded: BTreeSet<u32>,
    /// Raw and stored bytes written, per stream (to take a discarded one out of the report).
    bytes_by_pid: BTreeMap<u32, (u64, u64)>,
    report: BatchReport,
    first_error: Option<ImageError>,
}

impl BatchShared {
    fn lock(&self) -> MutexGuard<'_, BatchState> {
        // A panic while holding the lock leaves plain counters behind; they stay usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, state: &mut BatchState, err: ImageError) {
        self.failed.store(true, Ordering::Release);
        if state.first_error.is_none() {
            state.first_error = Some(err);
        }
    }

    fn error(&self, detail: impl Into<String>) -> ImageError {
        ImageError::Batch { path: self.chunks_dir.clone(), detail: detail.into() }
    }

    /// Creates the chunks directory once per batch, before its first chunk file.
    pub(crate) fn ensure_dir(&self) -> Result<(), ImageError> {
        if !self.dir_ready.load(Ordering::Acquire) {
            // Racing IO threads may both get here; creating an existing directory is fine.
            fsutil::create_dir_private(&self.chunks_dir)?;
            self.dir_ready.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Counts a chunk of stream `pid` as handed over for writing.
    fn chunk_started(&self, pid: u32) {
        let mut st = self.lock();
        st.pending += 1;
        *st.pending_by_pid.entry(pid).or_default() += 1;
    }

    /// Called when a chunk of stream `pid` of `raw_len` bytes is done, whatever the outcome.
    pub(crate) fn chunk_done(&self, pid: u32, raw_len: u64, outcome: Result<Written, ImageError>) {
        let mut st = self.lock();
        match outcome {
            Ok(Some((entry, stored))) => {
                st.report.files.push(entry);
                st.report.bytes_raw += raw_len;
                st.report.bytes_stored += stored;
                st.report.chunks += 1;
                let by_pid = st.bytes_by_pid.entry(pid).or_default();
                by_pid.0 += raw_len;
                by_pid.1 += stored;
            }
            Ok(None) => {}
            Err(e) => self.fail(&mut st, e),
        }
        st.pending -= 1;
        if let Some(n) = st.pending_by_pid.get_mut(&pid) {
            *n -= 1;
            if *n == 0 {
                st.pending_by_pid.remove(&pid);
            }
        }
        drop(st);
        self.done.notify_all();
    }

    /// Waits until every chunk of stream `pid` handed over so far is done; fails if the batch
    /// failed.
    fn wait_stream(&self, pid: u32) -> Result<(), ImageError> {
        let mut st = self.lock();
        while st.pending_by_pid.contains_key(&pid) {
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match &st.first_error {
            None => Ok(()),
            Some(e) => Err(self.error(format!("stream of process {pid} is not durable: a chunk write of this batch failed: {e}"))),
        }
    }
}

/// One generation's writes on this node: the streams of every process captured on it, written
/// as chunk files to one chunks directory. Cheap to clone; clones are the same batch, so several
/// capture threads can each open streams.
#[derive(Clone)]
pub struct Batch {
    pool: Arc<PoolInner>,
    shared: Arc<BatchShared>,
    /// Keeps the pool's prefault thread waiting while any copy of the batch lives.
    _quiet: Arc<QuietPrefault>,
}

/// While it lives, the pool's prefault thread does not fault memory in (see `prefault_one`).
struct QuietPrefault(Arc<PoolInner>);

impl Drop for QuietPrefault {
    fn drop(&mut self) {
        self.0.checkpoints.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Batch {
    pub(crate) fn new(pool: Arc<PoolInner>, chunks_dir: PathBuf) -> Batch {
        pool.checkpoints.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Batch {
            _quiet: Arc::new(QuietPrefault(pool.clone())),
            pool,
            shared: Arc::new(BatchShared {
                chunks_dir,
                failed: AtomicBool::new(false),
                dir_ready: AtomicBool::new(false),
                state: Mutex::new(BatchState::default()),
                done: Condvar::new(),
            }),
        }
    }

    /// The directory the chunk files go to.
    pub fn chunks_dir(&self) -> &std::path::Path {
        &self.shared.chunks_dir
    }

    /// Opens the stream of process `pid`. A pid has one stream per batch; a second one, or a
    /// stream opened after `wait_durable`, fails at its first write.
    pub fn stream(&self, pid: u32) -> StreamWriter {
        let mut st = self.shared.lock();
        let refused = if st.closed {
            Some(format!("stream of process {pid} opened after wait_durable (caller bug: open every stream first)"))
        } else if !st.seen.insert(pid) {
            let detail = format!("process {pid} has two streams in one batch (caller bug)");
            self.shared.fail(&mut st, self.shared.error(detail.clone()));
            Some(detail)
        } else {
            st.open.insert(pid);
            None
        };
        drop(st);
        let mode = match self.pool.cfg.writer {
            WriterMode::Dbi => Mode::Dbi,
            WriterMode::Wag { .. } => Mode::Wag,
            WriterMode::Direct => Mode::Direct,
        };
        StreamWriter {
            mode,
            writer: None,
            pool: Arc::clone(&self.pool),
            batch: Arc::clone(&self.shared),
            pid,
            buf: None,
            filled: 0,
            chunk_offset: 0,
            offset: 0,
            chunks: 0,
            waited: Duration::ZERO,
            refused,
            done: false,
        }
    }

    /// Waits until every chunk of every stream of this batch is written and fsynced, then
    /// fsyncs the chunks directory. Every stream must be finished first. Returns the first error
    /// of any chunk write (or IO thread panic), if any; then the generation must not be
    /// committed.
    pub fn wait_durable(self) -> Result<BatchReport, ImageError> {
        let shared = &self.shared;
        let mut st = shared.lock();
        st.closed = true;
        if !st.open.is_empty() {
            let open: Vec<_> = st.open.iter().collect();
            return Err(shared.error(format!(
                "wait_durable called while the streams of processes {open:?} are not finished \
                 (call finish() on every StreamWriter first)"
            )));
        }
        while st.pending > 0 {
            st = shared.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        let discarded = std::mem::take(&mut st.discarded);
        for pid in &discarded {
            let (raw, stored) = st.bytes_by_pid.remove(pid).unwrap_or_default();
            st.report.bytes_raw -= raw;
            st.report.bytes_stored -= stored;
        }
        let mut report = std::mem::take(&mut st.report);
        drop(st);
        if !discarded.is_empty() {
            let of_discarded = |path: &str| {
                let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or("");
                discarded.iter().any(|pid| name.starts_with(&format!("p{pid}-")))
            };
            for f in report.files.iter().filter(|f| of_discarded(&f.path)) {
                let name = Path::new(&f.path).file_name().unwrap_or_default();
                let path = shared.chunks_dir.join(name);
                fs::remove_file(&path).map_err(|e| ImageError::io(&path, "delete the chunk file of a stream given up", e))?;
            }
            report.files.retain(|f| !of_discarded(&f.path));
            report.chunks = report.files.len() as u64;
        }
        report.files.sort_by(|a, b| a.path.cmp(&b.path));

        // The directory exists even when every stream was empty, so that restart finds it.
        shared.ensure_dir()?;
        fsutil::fsync_dir(&shared.chunks_dir)?;
        // The chunks directory may be new: its entry in the node directory must be durable too.
        fsutil::fsync_dir(fsutil::parent_or_dot(&shared.chunks_dir))?;
        tracing::debug!(
            dir = %shared.chunks_dir.display(),
            chunks = report.chunks,
            bytes_raw = report.bytes_raw,
            bytes_stored = report.bytes_stored,
            wait_ms = report.wait_for_free_chunk.as_millis() as u64,
            "batch durable"
        );
        Ok(report)
    }
}

/// How a stream's full chunks reach the disk (see [`WriterMode`]).
enum Mode {
    /// Handed to the IO threads; `finish` does not wait for them.
    Dbi,
    /// Handed to the IO threads; `finish` waits until they are durable.
    Wag,
    /// Written and fsynced by the stream itself, in place, before more room is given.
    Direct,
}

/// Writes one process's stream into pool chunks. Not shared between threads; each capture
/// thread has its own.
///
/// Drop it without [`finish`](Self::finish) and the batch fails: the stream would be incomplete.
pub struct StreamWriter {
    mode: Mode,
    /// The stream's own chunk writer (`direct`, and helping the IO threads), made at first use.
    writer: Option<Box<ChunkWriter>>,
    pool: Arc<PoolInner>,
    batch: Arc<BatchShared>,
    pid: u32,
    /// The chunk being filled, if any.
    buf: Option<ChunkBuf>,
    /// Bytes of `buf` filled.
    filled: usize,
    /// Stream offset of `buf`'s first byte.
    chunk_offset: u64,
    offset: u64,
    chunks: u64,
    waited: Duration,
    /// Why this stream cannot be written, if it cannot.
    refused: Option<String>,
    /// Finished (or dropped): accounted for in the batch.
    done: bool,
}

/// How long a capture may wait for a free chunk before a warning says why it might never come.
const SLOW_WAIT: Duration = Duration::from_secs(10);

/// The stream's own chunk writer, made at first use.
fn own_writer<'a>(writer: &'a mut Option<Box<ChunkWriter>>, pool: &PoolInner) -> Result<&'a mut ChunkWriter, ImageError> {
    if writer.is_none() {
        let w = ChunkWriter::new(pool.cfg.codec, pool.unit, pool.direct_io.clone())?;
        *writer = Some(Box::new(w));
    }
    Ok(writer.as_mut().expect("just made"))
}

impl StreamWriter {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Raw stream bytes written so far: the stream offset of the next byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Writable space at the current stream position: at least `min` bytes (`min` must not
    /// exceed the chunk size), up to the end of the current chunk. If the current chunk has less
    /// than `min` left, it is handed to the IO threads as it is and a free chunk is taken,
    /// blocking until one is free (the wait is measured).
    pub fn space(&mut self, min: usize) -> Result<&mut [u8], ImageError> {
        let chunk_bytes = self.pool.unit;
        if min > chunk_bytes {
            return Err(self.batch.error(format!("asked for {min} contiguous bytes, more than a chunk ({chunk_bytes}) (caller bug)")));
        }
        if let Some(why) = &self.refused {
            return Err(self.batch.error(why.clone()));
        }
        if self.batch.failed.load(Ordering::Acquire) {
            return Err(self.batch.error(format!(
                "stream of process {} stopped: an earlier chunk write of this batch failed \
                 (wait_durable reports the cause)",
                self.pid
            )));
        }
        let need = min.max(1);
        if self.buf.as_ref().is_some_and(|b| b.len() - self.filled < need) {
            if matches!(self.mode, Mode::Direct) {
                self.write_in_place()?;
            } else {
                self.submit();
            }
        }
        if self.buf.is_none() {
            let buf = self.take_free_chunk()?;
            self.buf = Some(buf);
            self.filled = 0;
            self.chunk_offset = self.offset;
        }
        let filled = self.filled;
        Ok(&mut self.buf.as_mut().expect("just ensured").as_mut_slice()[filled..])
    }

    /// Commits `n` bytes just written at the start of the space returned by
    /// [`space`](Self::space). A chunk that becomes full goes to the IO threads at once.
    ///
    /// # Panics
    /// If `n` exceeds that space: the caller would have written outside it.
    pub fn advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let buf = self.buf.as_ref().expect("StreamWriter::advance without space()");
        assert!(n <= buf.len() - self.filled, "StreamWriter::advance({n}) beyond the {} bytes of space", buf.len() - self.filled);
        self.filled += n;
        self.offset += n as u64;
        // A full chunk goes to the IO threads at once; in `direct` mode it is written when more
        // room is asked for (or at `finish`), where an error can be returned.
        if self.filled == buf.len() && !matches!(self.mode, Mode::Direct) {
            self.submit();
        }
    }

    /// Appends `data` to the stream.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<(), ImageError> {
        while !data.is_empty() {
            let space = self.space(1)?;
            let n = space.len().min(data.len());
            space[..n].copy_from_slice(&data[..n]);
            self.advance(n);
            data = &data[n..];
        }
        Ok(())
    }

    /// Hands the chunk being filled over now, partial, and holds no pool memory until the next
    /// write. For a stream continued later while other streams are written meanwhile (a
    /// process whose private memory is copied after the job runs again): were each to keep a
    /// chunk, a job of more processes than the pool has chunks would wait for ever.
    pub fn park(&mut self) -> Result<(), ImageError> {
        if matches!(self.mode, Mode::Direct) {
            self.write_in_place()?;
            if let Some(buf) = self.buf.take() {
                let _ = self.pool.free_tx.send(buf);
            }
        } else {
            self.submit();
        }
        Ok(())
    }

    /// Takes the chunk the stream will write next, if one is free at once with more than
    /// `reserve` others left, and faults in its first `bytes`; returns whether it did. For a
    /// stream parked before the freeze that goes on at the freeze: its first writes would
    /// otherwise fault the pool's memory in while the job is frozen (the free chunks beyond a
    /// few are given back after each checkpoint, and a huge page is zeroed at its first touch),
    /// which was most of the cost of copying a small delta while frozen (an Open MPI rank's
    /// 650 KB took 2 ms). `reserve` keeps chunks for the capture's other streams: a stream
    /// holds its chunk until its process is captured.
    pub fn warm(&mut self, bytes: usize, reserve: usize) -> bool {
        if self.buf.is_some() {
            return true;
        }
        if self.refused.is_some() || self.pool.free_rx.len() <= reserve {
            return false;
        }
        let Ok(buf) = self.pool.free_rx.try_recv() else { return false };
        buf.populate(bytes);
        self.buf = Some(buf);
        self.filled = 0;
        self.chunk_offset = self.offset;
        true
    }

    /// Closes the stream and gives up what it wrote: the chunk being filled goes back to the
    /// pool unwritten, those handed over before are deleted by `wait_durable` once written, and
    /// left out of its report. For a stream opened before its process's capture, whose process
    /// ended before it.
    pub fn discard(mut self) {
        if self.refused.is_none() {
            self.batch.lock().discarded.insert(self.pid);
        }
        if let Some(buf) = self.buf.take() {
            let _ = self.pool.free_tx.send(buf);
        }
        self.close(None);
    }

    /// Hands the last partial chunk to the IO threads and closes the stream. With `dbi` the data
    /// is durable only once the batch's `wait_durable` returns; with `wag` and `direct` it is
    /// durable when this returns `Ok`.
    pub fn finish(mut self) -> Result<StreamStats, ImageError> {
        if let Some(why) = &self.refused {
            return Err(self.batch.error(why.clone()));
        }
        let durable = match self.mode {
            Mode::Dbi => {
                self.submit();
                Ok(())
            }
            Mode::Wag => {
                self.submit();
                self.batch.wait_stream(self.pid)
            }
            Mode::Direct => {
                let written = self.write_in_place();
                if let Some(buf) = self.buf.take() {
                    let _ = self.pool.free_tx.send(buf);
                }
                written
            }
        };
        // wag and direct promise a durable stream: its files' names too.
        let durable = durable.and_then(|()| {
            if matches!(self.mode, Mode::Dbi) || self.chunks == 0 {
                return Ok(());
            }
            fsutil::fsync_dir(&self.batch.chunks_dir)
        });
        self.close(None);
        durable?;
        Ok(StreamStats { pid: self.pid, bytes: self.offset, chunks: self.chunks, wait_for_free_chunk: self.waited })
    }

    fn take_free_chunk(&mut self) -> Result<ChunkBuf, ImageError> {
        if let Ok(buf) = self.pool.free_rx.try_recv() {
            return Ok(buf);
        }
        // Before the prefault thread is done: take a slot it has not reached, rather than wait.
        if let Some(buf) = self.pool.claim_unborn() {
            return Ok(buf);
        }
        // The pool is empty: every chunk is full and queued or being written. Rather than sleep,
        // write queued chunks here too, one more writer exactly when the disk is the bottleneck;
        // a chunk written here comes back to the free list like any other.
        let start = Instant::now();
        let result = loop {
            crossbeam_channel::select! {
                recv(self.pool.free_rx) -> buf => break buf.map_err(|_| {
                    self.batch.error("buffer pool shut down while a stream was being written")
                }),
                recv(self.pool.work_rx) -> job => {
                    if let Ok(job) = job {
                        self.help_write(job);
                    }
                }
                default(SLOW_WAIT) => tracing::warn!(
                    pid = self.pid,
                    waited_s = start.elapsed().as_secs(),
                    chunks = self.pool.chunk_count,
                    "still waiting for a free pool chunk: the disk is slow, or more streams hold a \
                     partial chunk than the pool has chunks (enlarge the pool)"
                ),
            }
        };
        self.waited += start.elapsed();
        result
    }

    /// Writes a queued chunk (of any stream) on this thread, as an IO thread would.
    fn help_write(&mut self, job: Job) {
        let writer = own_writer(&mut self.writer, &self.pool).ok();
        if !io::process(job, writer) {
            self.writer = None;
        }
    }

    /// Sends the current chunk, if it holds data, to the IO threads; an empty one goes back to
    /// the free list.
    fn submit(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let len = std::mem::take(&mut self.filled);
        if len == 0 {
            let _ = self.pool.free_tx.send(buf);
            return;
        }
        self.chunks += 1;
        self.batch.chunk_started(self.pid);
        let job = Job { batch: Arc::clone(&self.batch), pid: self.pid, offset: self.chunk_offset, len, buf: Some(buf), free: self.pool.free_tx.clone() };
        if let Some(work) = &self.pool.work_tx {
            // On failure the job comes back inside the error and its Drop reports it.
            let _ = work.send(job);
        }
    }

    /// `direct` mode: writes the filled part of the current chunk to its chunk file and fsyncs
    /// it, here and now, keeping the buffer for the next piece.
    fn write_in_place(&mut self) -> Result<(), ImageError> {
        let len = self.filled;
        let Some(buf) = self.buf.as_mut() else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        self.chunks += 1;
        self.batch.chunk_started(self.pid);
        let pool = &self.pool;
        let writer = &mut self.writer;
        let result = self.batch.ensure_dir().and_then(|()| {
            let writer = own_writer(writer, pool)?;
            writer.write(&self.batch.chunks_dir, self.pid, self.chunk_offset, buf, len)
        });
        let failed = result.as_ref().err().map(|e| self.batch.error(format!("stream of process {}: {e}", self.pid)));
        self.batch.chunk_done(self.pid, len as u64, result.map(Some));
        self.filled = 0;
        self.chunk_offset = self.offset;
        match failed {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Accounts for the stream's end in the batch; `abandoned` says why if it did not finish.
    fn close(&mut self, abandoned: Option<String>) {
        if self.done {
            return;
        }
        self.done = true;
        let mut st = self.batch.lock();
        st.report.wait_for_free_chunk += self.waited;
        if self.refused.is_none() {
            st.open.remove(&self.pid);
        }
        if let Some(detail) = abandoned {
            let err = self.batch.error(detail);
            self.batch.fail(&mut st, err);
        }
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(buf) = self.buf.take() {
            let _ = self.pool.free_tx.send(buf);
        }
        let detail = (self.refused.is_none()).then(|| {
            format!(
                "stream of process {} was dropped after {} bytes without finish() (capture failed?); \
                 the image would be incomplete",
                self.pid, self.offset
            )
        });
        self.close(detail);
    }
}
