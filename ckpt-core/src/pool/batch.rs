//! A batch (one generation's writes on one node) and the stream writers that fill it.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;

use super::buffer::ChunkBuf;
use super::io::{Job, Written};
use super::PoolInner;
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
    /// Streams opened and neither finished nor dropped.
    open: BTreeSet<u32>,
    /// Every pid that had a stream, to refuse a second stream (it would collide on file names).
    seen: BTreeSet<u32>,
    /// Set by `wait_durable`: later streams are refused.
    closed: bool,
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
        ImageError::Batch {
            path: self.chunks_dir.clone(),
            detail: detail.into(),
        }
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

    /// Called by an IO thread when a chunk of `raw_len` bytes is done, whatever the outcome.
    pub(crate) fn chunk_done(&self, raw_len: u64, outcome: Result<Written, ImageError>) {
        let mut st = self.lock();
        match outcome {
            Ok(Some((entry, stored))) => {
                st.report.files.push(entry);
                st.report.bytes_raw += raw_len;
                st.report.bytes_stored += stored;
                st.report.chunks += 1;
            }
            Ok(None) => {}
            Err(e) => self.fail(&mut st, e),
        }
        st.pending -= 1;
        drop(st);
        self.done.notify_all();
    }
}

/// One generation's writes on this node: the streams of every process captured on it, written
/// as chunk files to one chunks directory. Cheap to clone; clones are the same batch, so several
/// capture threads can each open streams.
#[derive(Clone)]
pub struct Batch {
    pool: Arc<PoolInner>,
    shared: Arc<BatchShared>,
}

impl Batch {
    pub(crate) fn new(pool: Arc<PoolInner>, chunks_dir: PathBuf) -> Batch {
        Batch {
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
            Some(format!(
                "stream of process {pid} opened after wait_durable (caller bug: open every stream first)"
            ))
        } else if !st.seen.insert(pid) {
            let detail = format!("process {pid} has two streams in one batch (caller bug)");
            self.shared.fail(&mut st, self.shared.error(detail.clone()));
            Some(detail)
        } else {
            st.open.insert(pid);
            None
        };
        drop(st);
        StreamWriter {
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
        let mut report = std::mem::take(&mut st.report);
        drop(st);
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

/// Writes one process's stream into pool chunks. Not shared between threads; each capture
/// thread has its own.
///
/// Drop it without [`finish`](Self::finish) and the batch fails: the stream would be incomplete.
pub struct StreamWriter {
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
        let chunk_bytes = self.pool.cfg.chunk_bytes;
        if min > chunk_bytes {
            return Err(self.batch.error(format!(
                "asked for {min} contiguous bytes, more than a chunk ({chunk_bytes}) (caller bug)"
            )));
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
        if self
            .buf
            .as_ref()
            .is_some_and(|b| b.len() - self.filled < need)
        {
            self.submit();
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
        let buf = self
            .buf
            .as_ref()
            .expect("StreamWriter::advance without space()");
        assert!(
            n <= buf.len() - self.filled,
            "StreamWriter::advance({n}) beyond the {} bytes of space",
            buf.len() - self.filled
        );
        self.filled += n;
        self.offset += n as u64;
        if self.filled == buf.len() {
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

    /// Hands the last partial chunk to the IO threads and closes the stream. The data is durable
    /// only once the batch's `wait_durable` returns.
    pub fn finish(mut self) -> Result<StreamStats, ImageError> {
        if let Some(why) = &self.refused {
            return Err(self.batch.error(why.clone()));
        }
        self.submit();
        self.close(None);
        Ok(StreamStats {
            pid: self.pid,
            bytes: self.offset,
            chunks: self.chunks,
            wait_for_free_chunk: self.waited,
        })
    }

    fn take_free_chunk(&mut self) -> Result<ChunkBuf, ImageError> {
        if let Ok(buf) = self.pool.free_rx.try_recv() {
            return Ok(buf);
        }
        let start = Instant::now();
        let result = loop {
            match self.pool.free_rx.recv_timeout(SLOW_WAIT) {
                Ok(buf) => break Ok(buf),
                Err(RecvTimeoutError::Timeout) => tracing::warn!(
                    pid = self.pid,
                    waited_s = start.elapsed().as_secs(),
                    chunks = self.pool.chunk_count,
                    "still waiting for a free pool chunk: the disk is slow, or more streams hold a \
                     partial chunk than the pool has chunks (enlarge the pool)"
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    break Err(self
                        .batch
                        .error("buffer pool shut down while a stream was being written"))
                }
            }
        };
        self.waited += start.elapsed();
        result
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
        self.batch.lock().pending += 1;
        let job = Job {
            batch: Arc::clone(&self.batch),
            pid: self.pid,
            offset: self.chunk_offset,
            len,
            buf: Some(buf),
            free: self.pool.free_tx.clone(),
        };
        if let Some(work) = &self.pool.work_tx {
            // On failure the job comes back inside the error and its Drop reports it.
            let _ = work.send(job);
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
