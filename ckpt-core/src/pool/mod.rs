//! The node buffer pool (WAG-DBI, seed 001).
//!
//! One pool per node, shared by every process being checkpointed, cut into fixed-size chunk
//! buffers allocated once and reused. A capture thread fills a chunk with its process's stream
//! ([`StreamWriter`]), hands it over full and takes another; IO threads compress, checksum, write
//! and fsync each full chunk as its own chunk file (`p<pid>-<offset>`) and return the buffer to
//! the free list. The application is frozen only while its memory is copied into the pool; the
//! disk works while it runs again ([`Batch::wait_durable`] is the "durable" point). When the pool
//! is empty, capture waits for a free chunk, and that wait is measured.
//!
//! A stream holds at most one chunk at a time, so the pool cannot deadlock as long as it has
//! more chunks than streams open at once.

mod batch;
mod buffer;
mod io;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

pub use self::batch::{Batch, BatchReport, StreamStats, StreamWriter};
use self::buffer::ChunkBuf;
pub use crate::image::Codec;
use crate::image::{ImageError, MAX_CHUNK_RAW_LEN};

/// Sizes and codec of a node's pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Memory for chunk buffers; the pool holds `pool_bytes / chunk_bytes` chunks.
    pub pool_bytes: usize,
    /// Size of one chunk buffer, and so the largest chunk file's raw size.
    pub chunk_bytes: usize,
    /// Threads that compress and write chunks.
    pub io_threads: usize,
    pub codec: Codec,
    /// How captured memory reaches the disk (compared by the benchmark).
    pub writer: WriterMode,
}

/// The writer modes of seed 001, selectable so that the benchmark can compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriterMode {
    /// One file per process, written in place while the process is frozen (as BLCR did).
    Direct,
    /// Write aggregation: processes' data is gathered in the pool and written in `threshold`-sized
    /// writes.
    Wag { threshold: usize },
    /// Dynamic buffer and interleaving: chunks of a shared pool drained by IO threads while the
    /// job runs (the default).
    Dbi,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            pool_bytes: 1 << 30,
            chunk_bytes: 4 << 20,
            io_threads: 2,
            codec: Codec::None,
            writer: WriterMode::Dbi,
        }
    }
}

impl PoolConfig {
    /// Checks the sizes and the codec; returns the number of chunks.
    pub fn validate(&self) -> Result<usize, ImageError> {
        let bad = |detail: String| ImageError::InvalidConfig {
            what: "buffer pool configuration",
            detail,
        };
        if self.chunk_bytes == 0 || self.chunk_bytes as u64 > MAX_CHUNK_RAW_LEN {
            return Err(bad(format!(
                "chunk size {} must be between 1 byte and {MAX_CHUNK_RAW_LEN} bytes (4 MiB is a good start)",
                self.chunk_bytes
            )));
        }
        if self.pool_bytes < self.chunk_bytes {
            return Err(bad(format!(
                "pool size {} is smaller than one chunk ({}); make the pool several chunks large",
                self.pool_bytes, self.chunk_bytes
            )));
        }
        if self.io_threads == 0 || self.io_threads > 1024 {
            return Err(bad(format!(
                "{} IO threads (use 1 to 1024; 2 keeps one disk busy)",
                self.io_threads
            )));
        }
        self.codec.validate()?;
        Ok(self.pool_bytes / self.chunk_bytes)
    }
}

/// The node's buffer pool and its IO threads. Cheap to clone; the threads stop when the last
/// clone (and the last batch made from it) is dropped.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

pub(crate) struct PoolInner {
    pub(crate) cfg: PoolConfig,
    pub(crate) chunk_count: usize,
    pub(crate) free_tx: Sender<ChunkBuf>,
    pub(crate) free_rx: Receiver<ChunkBuf>,
    /// `None` only while dropping, to close the queue before joining the threads.
    pub(crate) work_tx: Option<Sender<io::Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Allocates the chunk buffers and starts the IO threads.
    pub fn new(cfg: PoolConfig) -> Result<Pool, ImageError> {
        let chunk_count = cfg.validate()?;
        let page = buffer::page_size();
        let (free_tx, free_rx) = crossbeam_channel::bounded(chunk_count);
        for _ in 0..chunk_count {
            free_tx
                .send(ChunkBuf::new(cfg.chunk_bytes, page))
                .expect("the free list has room for every chunk");
        }
        let (work_tx, work_rx) = crossbeam_channel::unbounded::<io::Job>();
        let mut threads = Vec::with_capacity(cfg.io_threads);
        for i in 0..cfg.io_threads {
            let work_rx = work_rx.clone();
            let codec = cfg.codec;
            let t = std::thread::Builder::new()
                .name(format!("ckpt-io-{i}"))
                .spawn(move || io::run(work_rx, codec))
                .map_err(|e| ImageError::InvalidConfig {
                    what: "buffer pool configuration",
                    detail: format!("cannot start IO thread {i}: {e} (use fewer IO threads)"),
                })?;
            threads.push(t);
        }
        Ok(Pool {
            inner: Arc::new(PoolInner {
                cfg,
                chunk_count,
                free_tx,
                free_rx,
                work_tx: Some(work_tx),
                threads,
            }),
        })
    }

    pub fn config(&self) -> &PoolConfig {
        &self.inner.cfg
    }

    /// Number of chunk buffers.
    pub fn chunk_count(&self) -> usize {
        self.inner.chunk_count
    }

    /// Chunk buffers free right now.
    pub fn free_chunks(&self) -> usize {
        self.inner.free_rx.len()
    }

    /// Starts one generation's writes on this node, into `chunks_dir` (created when the first
    /// chunk is written, mode 0700).
    pub fn batch(&self, chunks_dir: &Path) -> Batch {
        Batch::new(Arc::clone(&self.inner), chunks_dir.to_path_buf())
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Closing the queue ends each IO thread once the queue is drained.
        self.work_tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
