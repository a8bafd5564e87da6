//! The IO threads: full chunks in, durable chunk files out, buffers back to the free list.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::batch::BatchShared;
use super::buffer::ChunkBuf;
use crate::image::{write_chunk_file, ChunkEncoder, Codec, FileEntry, ImageError};

/// A pid whose chunks make the IO thread panic, to test that a panic fails the batch instead of
/// hanging it.
#[cfg(test)]
pub(crate) const PANIC_PID: u32 = u32::MAX - 7;

/// One full (or last, partial) chunk of one stream, on its way to disk.
///
/// Whatever happens to a job (written, failed, panicked on, dropped unsent because the pool is
/// shutting down), its buffer goes back to the free list and its batch is told, exactly once:
/// that is what keeps `wait_durable` and waiting capture threads from hanging.
pub(crate) struct Job {
    pub(crate) batch: Arc<BatchShared>,
    pub(crate) pid: u32,
    /// Stream offset of the chunk's first byte.
    pub(crate) offset: u64,
    /// Bytes of `buf` that hold data.
    pub(crate) len: usize,
    pub(crate) buf: Option<ChunkBuf>,
    pub(crate) free: Sender<ChunkBuf>,
}

/// A chunk written: its manifest entry and how many bytes it took on disk after the header.
pub(crate) type Written = Option<(FileEntry, u64)>;

impl Job {
    fn write(&mut self, encoder: Option<&mut ChunkEncoder>) -> Result<Written, ImageError> {
        if self.batch.failed.load(Ordering::Acquire) {
            // The batch is lost already; writing more of it would only delay the failure.
            return Ok(None);
        }
        #[cfg(test)]
        if self.pid == PANIC_PID {
            panic!("test: IO thread panics on pid {}", self.pid);
        }
        self.batch.ensure_dir()?;
        let encoder = encoder.ok_or_else(|| ImageError::Batch {
            path: self.batch.chunks_dir.clone(),
            detail: "IO thread has no chunk encoder (codec could not be set up)".into(),
        })?;
        let buf = self
            .buf
            .as_ref()
            .expect("a job holds its buffer until completed");
        let chunk = encoder.encode(self.pid, self.offset, &buf.as_slice()[..self.len])?;
        let stored = chunk.header.stored_len;
        let entry = write_chunk_file(&self.batch.chunks_dir, &chunk)?;
        Ok(Some((entry, stored)))
    }

    /// Gives the buffer back, then reports the outcome to the batch.
    fn complete(&mut self, outcome: Result<Written, ImageError>) {
        let Some(buf) = self.buf.take() else { return };
        // Sending fails only when the pool is gone, and then nobody needs the buffer.
        let _ = self.free.send(buf);
        self.batch.chunk_done(self.len as u64, outcome);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.buf.is_some() {
            let err = ImageError::Batch {
                path: self.batch.chunks_dir.clone(),
                detail: format!(
                    "chunk at offset {} of process {} was never written (IO threads stopped?)",
                    self.offset, self.pid
                ),
            };
            self.complete(Err(err));
        }
    }
}

/// Body of an IO thread: runs until the pool's work queue closes.
pub(crate) fn run(work: Receiver<Job>, codec: Codec) {
    let mut encoder = ChunkEncoder::new(codec).ok();
    for mut job in work {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| job.write(encoder.as_mut())));
        let outcome = outcome.unwrap_or_else(|payload| {
            // The encoder may be mid-frame; start afresh for the next job.
            encoder = ChunkEncoder::new(codec).ok();
            Err(ImageError::Batch {
                path: job.batch.chunks_dir.clone(),
                detail: format!(
                    "IO thread panicked writing the chunk at offset {} of process {}: {}",
                    job.offset,
                    job.pid,
                    panic_message(&*payload)
                ),
            })
        });
        job.complete(outcome);
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}
