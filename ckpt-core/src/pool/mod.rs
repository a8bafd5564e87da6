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
//!
//! The writer modes ([`WriterMode`]) differ in who writes and who waits:
//!
//! - `dbi`: IO threads write full chunks while the capture goes on; the job is resumed before
//!   its data is durable. When no chunk is free, the capture thread does not sleep: it writes
//!   queued chunks itself, as one more IO thread, until a chunk comes free (that time is the
//!   measured wait).
//! - `wag`: the same pool and IO threads, chunks of `threshold` bytes, but each stream's
//!   `finish` waits until every chunk of that stream is durable, so the job stays frozen until
//!   its data is on disk (write aggregation without the dynamic buffer's relaxed semantics).
//! - `direct`: the capturing thread itself writes each chunk-sized piece and fsyncs it before
//!   it copies more; no IO thread is involved (BLCR's in-place, blocking write).
//!
//! Chunk files are written from the pool's memory with `O_DIRECT` (see `io.rs`).
//!
//! The pool's memory is one mapping, asked for huge pages. A background thread (`ckpt-prefault`,
//! at low priority) hands chunks to the free list, and with `CKPT_POOL_PREFAULT=1` faults them in
//! first: the launch is not delayed, and a checkpoint that comes before it is done takes the
//! slots it has not reached yet. [`Pool::new_deferred`] waits for
//! [`Pool::prefault_in_background`] to start it (for a restart, which should not compete with
//! it). Without the prefault (the default), a checkpoint faults slots in as it fills them (with
//! the copy ahead, while the job runs), and [`Pool::give_back_idle`] returns the memory of the
//! free ones after it: an idle node's pool costs a few chunks, not its size (a hundred agents
//! of 165 MiB pools did not fit on a small machine).
//!
//! Three environment variables exist for the benchmark's comparisons (docs/PERFORMANCE.md):
//! `CKPT_POOL_PREFAULT=1` faults the whole pool in at launch and keeps it,
//! `CKPT_POOL_HUGEPAGES=0` does not ask for transparent huge pages, and `CKPT_POOL_ODIRECT=0`
//! writes chunk files through the page cache.

mod batch;
mod buffer;
mod io;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

pub use self::batch::{Batch, BatchReport, StreamStats, StreamWriter};
use self::buffer::{ChunkBuf, Region, Slot};
use self::io::DirectIo;
pub use crate::image::Codec;
use crate::image::{ImageError, MAX_CHUNK_RAW_LEN};

/// Sizes and codec of a node's pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Memory for chunk buffers; the pool holds `pool_bytes / chunk_bytes` chunks (with `wag`,
    /// `pool_bytes / threshold`).
    pub pool_bytes: usize,
    /// Size of one chunk buffer, and so the largest chunk file's raw size (with `wag`, the
    /// threshold takes its place).
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
    /// Each process's stream written in place by the capturing thread, chunk by chunk, each
    /// fsynced before more is copied, while the process is frozen (as BLCR did).
    Direct,
    /// Write aggregation: streams gathered in the pool in pieces of `threshold` bytes, each
    /// written by the IO threads as one chunk file; the capture of a process ends only when
    /// all its pieces are durable.
    Wag { threshold: usize },
    /// Dynamic buffer and interleaving: chunks of a shared pool drained by IO threads while the
    /// job runs (the default).
    Dbi,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig { pool_bytes: 1 << 30, chunk_bytes: 4 << 20, io_threads: 2, codec: Codec::None, writer: WriterMode::Dbi }
    }
}

impl PoolConfig {
    /// Size of one pool buffer: the chunk size, or with `wag` the threshold.
    pub fn unit_bytes(&self) -> usize {
        match self.writer {
            WriterMode::Wag { threshold } => threshold,
            WriterMode::Direct | WriterMode::Dbi => self.chunk_bytes,
        }
    }

    /// Checks the sizes and the codec; returns the number of chunks.
    pub fn validate(&self) -> Result<usize, ImageError> {
        let bad = |detail: String| ImageError::InvalidConfig { what: "buffer pool configuration", detail };
        if self.chunk_bytes == 0 || self.chunk_bytes as u64 > MAX_CHUNK_RAW_LEN {
            return Err(bad(format!("chunk size {} must be between 1 byte and {MAX_CHUNK_RAW_LEN} bytes (4 MiB is a good start)", self.chunk_bytes)));
        }
        if let WriterMode::Wag { threshold } = self.writer {
            // The capture asks for a page of room at a time.
            if threshold < 4096 || threshold as u64 > MAX_CHUNK_RAW_LEN {
                return Err(bad(format!(
                    "wag threshold {threshold} must be between 4 KiB and {MAX_CHUNK_RAW_LEN} bytes \
                     (it is the size of each write; 16 MiB is a good start)"
                )));
            }
        }
        let unit = self.unit_bytes();
        if self.pool_bytes < unit {
            let what = if matches!(self.writer, WriterMode::Wag { .. }) { "wag threshold" } else { "one chunk" };
            return Err(bad(format!("pool size {} is smaller than {what} ({unit}); make the pool several chunks large", self.pool_bytes)));
        }
        if self.io_threads == 0 || self.io_threads > 1024 {
            return Err(bad(format!("{} IO threads (use 1 to 1024; 2 keeps one disk busy)", self.io_threads)));
        }
        self.codec.validate()?;
        Ok(self.pool_bytes / unit)
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
    /// Data bytes of one buffer (`PoolConfig::unit_bytes`).
    pub(crate) unit: usize,
    pub(crate) free_tx: Sender<ChunkBuf>,
    pub(crate) free_rx: Receiver<ChunkBuf>,
    /// `None` only while dropping, to close the queue before joining the threads.
    pub(crate) work_tx: Option<Sender<io::Job>>,
    /// The IO threads' queue, also read by capture threads that find no free chunk: rather
    /// than sleep, they write a full chunk themselves (see `StreamWriter::take_free_chunk`).
    pub(crate) work_rx: Receiver<io::Job>,
    pub(crate) direct_io: DirectIo,
    /// The pool's memory, cut into `chunk_count` slots of `slot` bytes.
    region: Arc<Region>,
    slot: usize,
    /// Slots not handed out yet (see [`Births`]).
    births: Mutex<Births>,
    /// Whether the prefault thread faults slots in and the pool keeps its memory
    /// ([`Pool::keep_warm`], `CKPT_POOL_PREFAULT`), or it only hands slots out and free ones
    /// give their memory back after a checkpoint ([`Pool::give_back_idle`]).
    populate: AtomicBool,
    /// `CKPT_POOL_PREFAULT` when set: it decides over [`Pool::keep_warm`].
    populate_forced: Option<bool>,
    /// Tells the prefault thread to stop (the pool is being dropped).
    stop: AtomicBool,
    /// Batches (checkpoints) under way: the prefault thread waits meanwhile (see
    /// [`PoolInner::prefault_one`]).
    pub(crate) checkpoints: std::sync::atomic::AtomicUsize,
    prefault: Mutex<Option<JoinHandle<()>>>,
    threads: Vec<JoinHandle<()>>,
}

/// Which slots have become chunk buffers. Slots `next..` are unborn: the prefault thread takes
/// them in order, faults each in and puts it on the free list; a stream that finds the free list
/// empty takes the next unborn slot itself (its own writes fault it in) rather than wait for the
/// prefault thread, which runs at low priority.
struct Births {
    next: usize,
    /// The prefault thread holds a slot it is faulting in (counted as free).
    populating: bool,
}

impl PoolInner {
    fn births(&self) -> MutexGuard<'_, Births> {
        self.births.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk_at(&self, i: usize) -> ChunkBuf {
        ChunkBuf::new(Slot::new(self.region.clone(), i * self.slot, self.slot), self.unit)
    }

    /// The next unborn slot as a chunk buffer, not faulted in, if any is left.
    pub(crate) fn claim_unborn(&self) -> Option<ChunkBuf> {
        let mut b = self.births();
        if b.next >= self.chunk_count {
            return None;
        }
        let i = b.next;
        b.next += 1;
        Some(self.chunk_at(i))
    }

    /// Faults in the next unborn slot and puts it on the free list; `false` when none is
    /// left.
    fn prefault_one(&self, populate: bool) -> bool {
        while populate && self.checkpoints.load(Ordering::Relaxed) > 0 && !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let i = {
            let mut b = self.births();
            if b.next >= self.chunk_count || self.stop.load(Ordering::Relaxed) {
                return false;
            }
            b.populating = true;
            b.next += 1;
            b.next - 1
        };
        // Nobody else owns slot i: it is faulted in before it is handed out. In small steps,
        // and not while a checkpoint runs: faulting in holds the launcher's memory map lock,
        // and this thread runs at the lowest priority; on a busy node it could hold the lock
        // for seconds, and a capture thread that maps or unmaps memory would wait as long,
        // the application frozen (seen: 8-17 s freezes of a small job with the CPUs busy).
        // A slot a checkpoint cuts short is handed out as it is: its owner's writes fault the
        // rest in.
        if populate {
            for off in (0..self.slot).step_by(POPULATE_STEP) {
                if self.checkpoints.load(Ordering::Relaxed) > 0 {
                    break;
                }
                self.region.populate(i * self.slot + off, POPULATE_STEP.min(self.slot - off));
            }
        }
        let buf = self.chunk_at(i);
        let mut b = self.births();
        // The free list has room for every chunk, so this never blocks.
        let _ = self.free_tx.send(buf);
        b.populating = false;
        true
    }
}

/// How much of a slot the prefault thread faults in at a time (one huge page).
const POPULATE_STEP: usize = 2 << 20;

/// Body of the prefault thread. It holds the pool only while faulting in one slot, so that
/// dropping the pool stops it.
fn prefault(pool: std::sync::Weak<PoolInner>, populate: bool) {
    // Background work: the job and the capture come first. (Per-thread nice on Linux.)
    // SAFETY: plain setpriority(2) on the calling thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    let t0 = std::time::Instant::now();
    let mut chunks = 0usize;
    while let Some(p) = pool.upgrade() {
        if !p.prefault_one(populate) {
            break;
        }
        chunks += 1;
    }
    tracing::debug!(chunks, ms = t0.elapsed().as_millis() as u64, populate, "buffer pool prefaulted");
}

/// The environment variable `name` as a switch: `Some(false)` for `0`, `no`, `off` or `false`,
/// `Some(true)` for any other value, `None` when unset.
fn env_switch_set(name: &str) -> Option<bool> {
    std::env::var_os(name).map(|_| env_switch(name))
}

/// `false` when the environment variable `name` is `0`, `no`, `off` or `false`.
fn env_switch(name: &str) -> bool {
    !matches!(std::env::var(name).as_deref().map(str::trim), Ok("0" | "no" | "off" | "false"))
}

impl Pool {
    /// Maps the pool's memory, starts faulting it in on a background thread, and starts the IO
    /// threads. Returns at once: chunks join the free list as they are faulted in.
    /// Like [`new`](Self::new), but the memory is not faulted in until
    /// [`prefault_in_background`](Self::prefault_in_background) is called: for `ckpt restart`,
    /// whose restore should not compete with the prefault for CPU and memory bandwidth. Until
    /// then, a checkpoint faults chunks in as it takes them.
    pub fn new_deferred(cfg: PoolConfig) -> Result<Pool, ImageError> {
        let chunk_count = cfg.validate()?;
        let unit = cfg.unit_bytes();
        let slot = buffer::slot_len(unit);
        let bad = |detail: String| ImageError::InvalidConfig { what: "buffer pool configuration", detail };
        let region_len = chunk_count.checked_mul(slot).ok_or_else(|| bad(format!("{chunk_count} chunks of {slot} bytes overflow")))?;
        let region = Arc::new(
            Region::new(region_len, env_switch("CKPT_POOL_HUGEPAGES"))
                .map_err(|e| bad(format!("cannot map {region_len} bytes for the pool: {e} (make the pool smaller)")))?,
        );
        let (free_tx, free_rx) = crossbeam_channel::bounded(chunk_count);
        let populate_forced = env_switch_set("CKPT_POOL_PREFAULT");
        let direct_io: DirectIo = Arc::new(AtomicBool::new(env_switch("CKPT_POOL_ODIRECT")));

        let (work_tx, work_rx) = crossbeam_channel::unbounded::<io::Job>();
        let mut threads = Vec::with_capacity(cfg.io_threads);
        for i in 0..cfg.io_threads {
            let work_rx = work_rx.clone();
            let codec = cfg.codec;
            let direct_io = direct_io.clone();
            let t = std::thread::Builder::new()
                .name(format!("ckpt-io-{i}"))
                .spawn(move || io::run(work_rx, codec, unit, direct_io))
                .map_err(|e| bad(format!("cannot start IO thread {i}: {e} (use fewer IO threads)")));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // Stop what was started before failing.
                    drop(work_tx);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        let inner = Arc::new(PoolInner {
            cfg,
            chunk_count,
            unit,
            free_tx,
            free_rx,
            work_tx: Some(work_tx),
            work_rx,
            direct_io,
            region,
            slot,
            births: Mutex::new(Births { next: 0, populating: false }),
            populate: AtomicBool::new(populate_forced.unwrap_or(false)),
            populate_forced,
            stop: AtomicBool::new(false),
            checkpoints: Default::default(),
            prefault: Mutex::new(None),
            threads,
        });
        Ok(Pool { inner })
    }

    /// Maps the pool's memory, starts faulting it in on a background thread (at low priority),
    /// and starts the IO threads. Returns at once: chunks join the free list as they are faulted
    /// in, and a checkpoint that comes first takes the slots not reached yet.
    pub fn new(cfg: PoolConfig) -> Result<Pool, ImageError> {
        let pool = Pool::new_deferred(cfg)?;
        pool.prefault_in_background();
        Ok(pool)
    }

    /// Starts faulting in the pool's memory on a background thread, if not started yet. For a
    /// pool made with [`new_deferred`](Self::new_deferred), once the work it should not slow
    /// down is done.
    pub fn prefault_in_background(&self) {
        let inner = &self.inner;
        let mut slot = inner.prefault.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return;
        }
        // The thread holds only a weak reference, so that dropping the pool stops it.
        let weak = Arc::downgrade(inner);
        let populate = inner.populate.load(Ordering::Relaxed);
        match std::thread::Builder::new().name("ckpt-prefault".into()).spawn(move || prefault(weak, populate)) {
            Ok(t) => *slot = Some(t),
            // Without the thread, streams take unborn slots themselves: slower, still correct.
            Err(e) => tracing::warn!("cannot start the pool's prefault thread: {e}"),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.inner.cfg
    }

    /// Number of chunk buffers.
    pub fn chunk_count(&self) -> usize {
        self.inner.chunk_count
    }

    /// Chunk buffers free right now (including those not faulted in yet).
    #[cfg(test)]
    pub fn free_chunks(&self) -> usize {
        let b = self.inner.births();
        self.inner.free_rx.len() + (self.inner.chunk_count - b.next) + usize::from(b.populating)
    }

    /// Waits until every slot of the pool has become a chunk buffer (faulted in by the
    /// background thread, or taken by a stream). For measurements and tests: checkpoints need
    /// not wait for it.
    pub fn wait_prefaulted(&self) {
        loop {
            let b = self.inner.births();
            if b.next >= self.inner.chunk_count && !b.populating {
                return;
            }
            drop(b);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Faults the whole pool in (once [`prefault_in_background`](Self::prefault_in_background)
    /// runs) and keeps it, unless `CKPT_POOL_PREFAULT=0`: for a job whose memory is copied while
    /// it is frozen (`--copy-memory frozen`), which would otherwise pay for every fault then.
    /// Call before the prefault starts.
    pub fn keep_warm(&self) {
        if self.inner.populate_forced != Some(false) {
            self.inner.populate.store(true, Ordering::Relaxed);
        }
    }

    /// After a checkpoint (no batch under way): gives the memory of the free chunk buffers
    /// beyond the first `keep` back to the kernel, unless the pool was prefaulted to be kept
    /// (`CKPT_POOL_PREFAULT=1`). Returns the bytes given back.
    pub fn give_back_idle(&self, keep: usize) -> u64 {
        let inner = &self.inner;
        if inner.populate.load(Ordering::Relaxed) || inner.checkpoints.load(Ordering::Relaxed) > 0 {
            return 0;
        }
        let free: Vec<ChunkBuf> = inner.free_rx.try_iter().collect();
        let mut given = 0;
        for (i, buf) in free.into_iter().enumerate() {
            if i >= keep {
                buf.release_memory();
                given += inner.slot as u64;
            }
            // The free list has room for every chunk, so this never blocks.
            let _ = inner.free_tx.send(buf);
        }
        given
    }

    /// Whether chunk files are written with `O_DIRECT` (until a file system refuses it).
    pub fn direct_io(&self) -> bool {
        self.inner.direct_io.load(Ordering::Relaxed)
    }

    /// Starts one generation's writes on this node, into `chunks_dir` (created when the first
    /// chunk is written, mode 0700).
    pub fn batch(&self, chunks_dir: &Path) -> Batch {
        Batch::new(Arc::clone(&self.inner), chunks_dir.to_path_buf())
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // The prefault thread may be the one dropping the last reference; it ends by itself.
        self.stop.store(true, Ordering::Relaxed);
        let t = self.prefault.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        // Closing the queue ends each IO thread once the queue is drained.
        self.work_tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests;
