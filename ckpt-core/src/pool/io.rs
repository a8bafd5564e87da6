//! Writing chunk files, and the IO threads: full chunks in, durable chunk files out, buffers back
//! to the free list.
//!
//! A chunk file is written from its pool slot in one `O_DIRECT` write (header, data, zero padding
//! to 4 KiB), cut to its real length and fsynced; compressed chunks go the same way from the
//! writer's scratch slot. `O_DIRECT` skips the page cache: no second copy of the data, no dirty
//! page cache growing behind the pool, and on the benchmark VM (where fresh page-cache pages are
//! slow to fault in) about 2-5x the buffered write speed. A file system that refuses `O_DIRECT`
//! (EINVAL) gets ordinary buffered writes and fsync from then on.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::batch::BatchShared;
use super::buffer::ChunkBuf;
use crate::image::fsutil;
use crate::image::{chunk_file_name, ChunkHeader, Codec, CodecId, FileEntry, ImageError, MAX_CHUNK_RAW_LEN};

/// A pid whose chunks make the IO thread panic, to test that a panic fails the batch instead of
/// hanging it.
#[cfg(test)]
pub(crate) const PANIC_PID: u32 = u32::MAX - 7;

/// Whether chunk files are written with `O_DIRECT`; cleared for good by the first file system
/// that refuses it. Shared by a pool's writers.
pub(crate) type DirectIo = Arc<AtomicBool>;

/// A chunk written: its manifest entry and how many bytes it took on disk after the header.
pub(crate) type Written = Option<(FileEntry, u64)>;

/// What an IO thread has seen of the disk, for `--compress auto`: how fast its chunk files
/// were written (write and fsync, bytes stored per second, averaged over the last few). With
/// what a chunk's probe tells of the compressor, it decides whether compressing that chunk
/// takes the thread less time than writing it raw ([`compressing_pays`]). The rate is the
/// thread's own: on a disk shared by busy threads, each sees its share.
#[derive(Default)]
pub(crate) struct Pace {
    /// Bytes written and seconds taken, each older write counting less: their quotient is
    /// weighted by bytes, so that a small compressed chunk that went through at once does not
    /// make the disk look fast.
    bytes: f64,
    seconds: f64,
}

impl Pace {
    /// How much an older write still counts after each newer one.
    const KEPT: f64 = 0.7;

    fn wrote(&mut self, bytes: usize, took: std::time::Duration) {
        self.bytes = self.bytes * Self::KEPT + bytes as f64;
        self.seconds = self.seconds * Self::KEPT + took.as_secs_f64();
    }

    fn disk_bytes_per_second(&self) -> Option<f64> {
        (self.seconds > 0.0).then(|| self.bytes / self.seconds)
    }

    /// Whether to compress a chunk whose samples compressed as `probe` says. Until a first
    /// write has been timed, chunks go raw.
    fn compress(&self, probe: &crate::image::codec::Probe) -> bool {
        self.disk_bytes_per_second().is_some_and(|disk| probe.shrinks() && compressing_pays(probe.bytes_per_second(), probe.ratio(), disk))
    }
}

/// Whether compressing a byte (at `compress` bytes per second, shrinking by `ratio`) and writing
/// what is left takes less time than writing it raw to a disk of `disk` bytes per second:
/// 1/compress + 1/(ratio × disk) < 1/disk. Pure.
fn compressing_pays(compress: f64, ratio: f64, disk: f64) -> bool {
    1.0 / compress + 1.0 / (ratio * disk) < 1.0 / disk
}

/// Encodes and writes chunk files; one per IO thread (and per `direct` stream), reusing its zstd
/// context and scratch slot.
pub(crate) struct ChunkWriter {
    compressor: Option<zstd::bulk::Compressor<'static>>,
    /// For `--compress auto`: the disk's pace, in an IO thread. A writer of an auto codec
    /// without one (a `direct` stream, written while the job is frozen) never compresses.
    pace: Option<Pace>,
    auto: bool,
    /// Where compressed data goes, with room for the header in front; made at first use.
    scratch: Option<ChunkBuf>,
    /// The largest raw chunk this writer is given.
    unit: usize,
    direct_io: DirectIo,
    /// Where samples are compressed to decide whether a chunk is worth compressing.
    probe: Vec<u8>,
}

impl ChunkWriter {
    pub(crate) fn new(codec: Codec, unit: usize, direct_io: DirectIo) -> Result<ChunkWriter, ImageError> {
        let compressor = codec.compressor()?;
        Ok(ChunkWriter { compressor, pace: None, auto: codec.is_auto(), scratch: None, unit, direct_io, probe: Vec::new() })
    }

    /// The same writer, in an IO thread, writing while the job runs: under `--compress auto`
    /// it times its writes and compresses the chunks where that pays.
    pub(crate) fn in_background(mut self) -> ChunkWriter {
        self.pace = self.auto.then(Pace::default);
        self
    }

    /// Writes the first `len` bytes of `buf` as chunk file `dir/p<pid>-<offset>` and fsyncs it.
    /// `buf`'s header room and padding are overwritten; its data is not.
    pub(crate) fn write(&mut self, dir: &Path, pid: u32, offset: u64, buf: &mut ChunkBuf, len: usize) -> Result<(FileEntry, u64), ImageError> {
        let path = dir.join(chunk_file_name(pid, offset));
        if len == 0 || len as u64 > MAX_CHUNK_RAW_LEN || len > buf.len() {
            return Err(ImageError::Encode { path, what: "chunk", detail: format!("{len} bytes (a chunk holds 1..={MAX_CHUNK_RAW_LEN} bytes)") });
        }
        let mut codec = CodecId::None;
        let mut stored_len = len;
        let mut compressor = self.compressor.as_mut();
        let data = &buf.as_slice()[..len];
        let worth = |c: &mut zstd::bulk::Compressor<'static>, probe: &mut Vec<u8>| match (self.auto, &self.pace) {
            (false, _) => crate::image::codec::worth_compressing(c, data, probe),
            (true, None) => false,
            (true, Some(pace)) => crate::image::codec::probe(c, data, probe).is_some_and(|p| pace.compress(&p)),
        };
        if compressor.as_deref_mut().is_some_and(|c| !worth(c, &mut self.probe)) {
            compressor = None;
        }
        if let Some(c) = compressor {
            if self.scratch.is_none() {
                let bound = zstd::zstd_safe::compress_bound(self.unit.max(len));
                let scratch = ChunkBuf::standalone(bound).map_err(|e| ImageError::io(&path, "allocate a compression buffer for", e))?;
                self.scratch = Some(scratch);
            }
            let scratch = self.scratch.as_mut().expect("just made");
            let n = c.compress_to_buffer(&buf.as_slice()[..len], scratch.as_mut_slice()).map_err(|e| ImageError::Encode {
                path: path.clone(),
                what: "chunk",
                detail: format!("zstd: {e}"),
            })?;
            // Kept only if smaller: incompressible memory costs nothing at restart.
            if n < len {
                codec = CodecId::Zstd;
                stored_len = n;
            }
        }
        let from = match codec {
            CodecId::Zstd => self.scratch.as_mut().expect("compressed into it"),
            CodecId::None => buf,
        };
        let (header, trailer) = ChunkHeader::for_stored(pid, offset, len as u64, codec, &from.as_slice()[..stored_len]);
        let (image, real) = from.file_image(&header.to_bytes(), stored_len, &trailer);
        let started = std::time::Instant::now();
        write_file(&path, image, real, &self.direct_io)?;
        if let Some(pace) = &mut self.pace {
            pace.wrote(real, started.elapsed());
        }
        Ok((FileEntry { path: fsutil::gen_relative(&path), size: header.file_size(), crc32c: header.file_crc32c(&trailer) }, stored_len as u64))
    }
}

/// Creates `path` (it must not exist), writes `image[..real]` to it and fsyncs it. `image` is
/// `real` bytes padded with zeros to a multiple of 4 KiB, in an aligned buffer, for `O_DIRECT`.
fn write_file(path: &Path, image: &[u8], real: usize, direct_io: &AtomicBool) -> Result<(), ImageError> {
    write_file_with(path, image, real, direct_io, open_direct)
}

/// Opens a new file for `O_DIRECT` writes.
fn open_direct(path: &Path) -> io::Result<fs::File> {
    OpenOptions::new().write(true).create_new(true).mode(fsutil::FILE_MODE).custom_flags(libc::O_DIRECT | libc::O_CLOEXEC).open(path)
}

/// [`write_file`] with the opener as a parameter (a unit test fakes a file system).
fn write_file_with(path: &Path, image: &[u8], real: usize, direct_io: &AtomicBool, open: impl Fn(&Path) -> io::Result<fs::File>) -> Result<(), ImageError> {
    if direct_io.load(Ordering::Relaxed) {
        match write_direct(path, image, real, open) {
            Ok(()) => return Ok(()),
            Err((action, e)) => {
                // The name is ours whatever failed: the open is O_EXCL, and a file system may
                // make the file before it refuses O_DIRECT (tmpfs on Linux 6.1 does: the open
                // fails with EINVAL and leaves the file behind).
                let made = action != "create" || e.raw_os_error() == Some(libc::EINVAL);
                if made {
                    let _ = fs::remove_file(path);
                }
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(ImageError::io(path, action, e));
                }
                if direct_io.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        dir = %fsutil::parent_or_dot(path).display(),
                        "the file system refuses O_DIRECT; chunk files are written through the page cache"
                    );
                }
            }
        }
    }
    fsutil::write_file_synced(path, &[&image[..real]], true)
}

fn write_direct(path: &Path, image: &[u8], real: usize, open: impl Fn(&Path) -> io::Result<fs::File>) -> Result<(), (&'static str, io::Error)> {
    let f = open(path).map_err(|e| ("create", e))?;
    f.write_all_at(image, 0).map_err(|e| ("write", e))?;
    if image.len() != real {
        f.set_len(real as u64).map_err(|e| ("truncate", e))?;
    }
    f.sync_all().map_err(|e| ("fsync", e))
}

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

impl Job {
    fn write(&mut self, writer: Option<&mut ChunkWriter>) -> Result<Written, ImageError> {
        if self.batch.failed.load(Ordering::Acquire) {
            // The batch is lost already; writing more of it would only delay the failure.
            return Ok(None);
        }
        #[cfg(test)]
        if self.pid == PANIC_PID {
            panic!("test: IO thread panics on pid {}", self.pid);
        }
        self.batch.ensure_dir()?;
        let writer = writer.ok_or_else(|| ImageError::Batch {
            path: self.batch.chunks_dir.clone(),
            detail: "IO thread has no chunk writer (codec could not be set up)".into(),
        })?;
        let buf = self.buf.as_mut().expect("a job holds its buffer until completed");
        let written = writer.write(&self.batch.chunks_dir, self.pid, self.offset, buf, self.len)?;
        Ok(Some(written))
    }

    /// Gives the buffer back, then reports the outcome to the batch.
    fn complete(&mut self, outcome: Result<Written, ImageError>) {
        let Some(buf) = self.buf.take() else { return };
        // Sending fails only when the pool is gone, and then nobody needs the buffer.
        let _ = self.free.send(buf);
        self.batch.chunk_done(self.pid, self.len as u64, outcome);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.buf.is_some() {
            let err = ImageError::Batch {
                path: self.batch.chunks_dir.clone(),
                detail: format!("chunk at offset {} of process {} was never written (IO threads stopped?)", self.offset, self.pid),
            };
            self.complete(Err(err));
        }
    }
}

/// Writes `job` with `writer` (catching a panic, which fails the job's batch), gives its buffer
/// back and reports to its batch. Returns `false` if the writer panicked and must be replaced.
pub(crate) fn process(mut job: Job, writer: Option<&mut ChunkWriter>) -> bool {
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| job.write(writer)));
    let ok = outcome.is_ok();
    let outcome = outcome.unwrap_or_else(|payload| {
        Err(ImageError::Batch {
            path: job.batch.chunks_dir.clone(),
            detail: format!("IO thread panicked writing the chunk at offset {} of process {}: {}", job.offset, job.pid, panic_message(&*payload)),
        })
    });
    job.complete(outcome);
    ok
}

/// Body of an IO thread: runs until the pool's work queue closes.
/// The IO threads' nice value (see [`run`]).
const IO_NICE: i32 = 10;

pub(crate) fn run(work: Receiver<Job>, codec: Codec, unit: usize, direct_io: DirectIo) {
    // Behind the job and the capture: a checkpoint's freeze is a train of round trips between
    // the agent and the stopped job (injected calls), each of which waited a scheduler slice
    // behind these threads on a busy node (measured: 1 ms of calls took 8-10 ms while the
    // chunks of the memory copied before the freeze were written). What they write is never
    // waited for while the job is frozen (`--writer dbi`); a job that keeps every CPU busy
    // gets its checkpoint durable later rather than being slowed by it. (Per-thread nice on
    // Linux; raising one's own nice value needs no privilege.)
    // SAFETY: plain setpriority(2) on the calling thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, IO_NICE) };
    let new_writer = || ChunkWriter::new(codec, unit, direct_io.clone()).ok().map(ChunkWriter::in_background);
    let mut writer = new_writer();
    for job in work {
        if !process(job, writer.as_mut()) {
            // The compressor may be mid-frame; start afresh for the next job.
            writer = new_writer();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 6.1's tmpfs makes the file, then refuses O_DIRECT with EINVAL: the chunk is written
    /// through the page cache all the same, not refused with "File exists" (issue 35).
    #[test]
    fn a_file_system_that_creates_then_refuses_o_direct_leaves_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p1-0");
        let like_tmpfs_6_1 = |p: &Path| -> io::Result<fs::File> {
            fs::File::create_new(p)?;
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        };
        let direct_io = AtomicBool::new(true);
        let image = vec![7u8; 4096];
        write_file_with(&path, &image, 100, &direct_io, like_tmpfs_6_1).expect("written through the page cache");
        assert_eq!(fs::read(&path).unwrap(), vec![7u8; 100]);
        assert!(!direct_io.load(Ordering::Relaxed), "O_DIRECT is given up for the file system");
        // A name already there is not ours: refused and left alone.
        let taken = dir.path().join("taken");
        fs::write(&taken, b"someone's").unwrap();
        let err = write_file_with(&taken, &image, 100, &AtomicBool::new(true), open_direct).unwrap_err();
        assert!(err.to_string().contains("exists"), "{err}");
        assert_eq!(fs::read(&taken).unwrap(), b"someone's");
    }

    #[test]
    fn auto_compresses_where_that_is_quicker_than_the_disk() {
        let (gb, mb) = (1e9, 1e6);
        assert!(!compressing_pays(0.4 * gb, 4.3, 1.9 * gb), "a fast disk: raw");
        assert!(compressing_pays(0.4 * gb, 4.3, 75.0 * mb), "a slow disk: compressed");
        assert!(!compressing_pays(0.4 * gb, 1.0, 75.0 * mb), "nothing saved");
        assert!(!compressing_pays(60.0 * mb, 4.3, 75.0 * mb), "a compressor slower than the disk");
        let probe = crate::image::codec::Probe { sampled: 64 << 10, compressed: 16 << 10, took: std::time::Duration::from_micros(160) };
        assert!(!Pace::default().compress(&probe), "no write timed yet: raw");
        let mut pace = Pace::default();
        pace.wrote(16 << 20, std::time::Duration::from_millis(200));
        assert!(pace.compress(&probe), "84 MB/s against 410 MB/s at 4:1");
        for _ in 0..20 {
            pace.wrote(16 << 20, std::time::Duration::from_millis(8));
        }
        assert!(!pace.compress(&probe), "the disk sped up to 2 GB/s");
    }
}
