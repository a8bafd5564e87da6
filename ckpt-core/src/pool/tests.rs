use std::fs;
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::image::{chunk_file_name, StreamReader};

const KIB: usize = 1024;

fn small_pool(codec: Codec) -> Pool {
    Pool::new(PoolConfig { pool_bytes: 4 * 64 * KIB, chunk_bytes: 64 * KIB, io_threads: 2, codec, ..PoolConfig::default() }).unwrap()
}

/// Deterministic stream content: compressible runs and noise, different per pid.
fn content(pid: u32, len: usize) -> Vec<u8> {
    let mut x = 0x9e3779b97f4a7c15u64 ^ pid as u64;
    (0..len)
        .map(|i| {
            if (i / 10_000) % 3 == 0 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                (i / 64) as u8 ^ pid as u8
            }
        })
        .collect()
}

fn check_stream(dir: &Path, pid: u32, expect: &[u8]) {
    let mut r = StreamReader::open(dir, pid).unwrap();
    assert_eq!(r.len(), expect.len() as u64, "pid {pid}");
    let mut back = vec![0u8; expect.len()];
    r.read_exact_at(0, &mut back).unwrap();
    assert!(back == expect, "pid {pid}: stream differs");
}

#[test]
fn config_validation() {
    assert_eq!(PoolConfig::default().validate().unwrap(), 256);
    let bad = [
        PoolConfig { chunk_bytes: 0, ..PoolConfig::default() },
        PoolConfig { pool_bytes: 1000, chunk_bytes: 4096, ..PoolConfig::default() },
        PoolConfig { io_threads: 0, ..PoolConfig::default() },
        PoolConfig { codec: Codec::Zstd(99), ..PoolConfig::default() },
        PoolConfig { writer: WriterMode::Wag { threshold: 100 }, ..PoolConfig::default() },
    ];
    for cfg in bad {
        assert!(Pool::new(cfg.clone()).is_err(), "{cfg:?}");
    }
}

#[test]
fn round_trip_many_streams_small_pool() {
    // auto: some chunks compressed, some not, as the queue goes; every stream reads back whole.
    for codec in [Codec::None, Codec::Zstd(3), Codec::Auto(1)] {
        let dir = tempfile::tempdir().unwrap();
        let chunks = dir.path().join("gen-000001/n0/chunks");
        let pool = small_pool(codec);
        let batch = pool.batch(&chunks);
        let sizes = [3 * 1024 * KIB + 17, 2 * 1024 * KIB, 4 * 1024 * KIB - 5];
        let stats: Vec<StreamStats> = std::thread::scope(|s| {
            let handles: Vec<_> = sizes
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let batch = batch.clone();
                    s.spawn(move || {
                        let pid = 100 + i as u32;
                        let data = content(pid, len);
                        let mut w = batch.stream(pid);
                        // Mix the two ways of writing: space/advance with odd sizes, and write_all.
                        let mut off = 0;
                        let mut step = 1;
                        while off < data.len() {
                            if step % 2 == 0 {
                                let n = (step * 1000).min(data.len() - off);
                                w.write_all(&data[off..off + n]).unwrap();
                                off += n;
                            } else {
                                let want = (step * 777 % (64 * KIB)).max(1).min(data.len() - off);
                                let space = w.space(want).unwrap();
                                assert!(space.len() >= want);
                                let n = space.len().min(data.len() - off);
                                space[..n].copy_from_slice(&data[off..off + n]);
                                w.advance(n);
                                off += n;
                            }
                            assert_eq!(w.offset(), off as u64);
                            step += 1;
                        }
                        w.finish().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // An empty stream writes nothing.
        let empty = batch.stream(7).finish().unwrap();
        assert_eq!((empty.bytes, empty.chunks), (0, 0));

        let report = batch.wait_durable().unwrap();
        let total: usize = sizes.iter().sum();
        assert_eq!(report.bytes_raw, total as u64);
        assert_eq!(report.chunks, stats.iter().map(|s| s.chunks).sum::<u64>());
        assert_eq!(report.files.len() as u64, report.chunks);
        match codec {
            Codec::None => assert_eq!(report.bytes_stored, report.bytes_raw),
            Codec::Zstd(_) => assert!(report.bytes_stored < report.bytes_raw / 2, "{report:?}"),
            Codec::Auto(_) => assert!(report.bytes_stored <= report.bytes_raw, "{report:?}"),
        }
        assert!(report.files.windows(2).all(|w| w[0].path < w[1].path));
        assert!(report.files[0].path.starts_with("n0/chunks/p100-"), "{:?}", report.files[0]);
        assert_eq!(pool.free_chunks(), pool.chunk_count());

        for (i, &len) in sizes.iter().enumerate() {
            let pid = 100 + i as u32;
            assert_eq!(stats[i].bytes, len as u64);
            check_stream(&chunks, pid, &content(pid, len));
        }
        assert!(StreamReader::open(&chunks, 7).unwrap().is_empty());
        assert!(!chunks.join(chunk_file_name(7, 0)).exists());
    }
}

#[test]
fn waiting_for_chunks_is_measured() {
    // One chunk, one IO thread, zstd at a slow level: the writer must wait for the IO thread.
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::new(PoolConfig { pool_bytes: 64 * KIB, chunk_bytes: 64 * KIB, io_threads: 1, codec: Codec::Zstd(19), ..PoolConfig::default() }).unwrap();
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(1);
    w.write_all(&content(1, 1024 * KIB)).unwrap();
    let stats = w.finish().unwrap();
    let report = batch.wait_durable().unwrap();
    assert_eq!(stats.chunks, 16);
    assert!(stats.wait_for_free_chunk > Duration::ZERO);
    assert_eq!(report.wait_for_free_chunk, stats.wait_for_free_chunk);
    check_stream(dir.path(), 1, &content(1, 1024 * KIB));
}

#[test]
fn space_ending_a_chunk_early() {
    // A request that does not fit the current chunk ends it early: chunks of uneven size.
    let dir = tempfile::tempdir().unwrap();
    let pool = small_pool(Codec::None);
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(3);
    let data = content(3, 200 * KIB);
    w.write_all(&data[..60 * KIB]).unwrap();
    let space = w.space(8 * KIB).unwrap();
    assert_eq!(space.len(), 64 * KIB);
    space[..8 * KIB].copy_from_slice(&data[60 * KIB..68 * KIB]);
    w.advance(8 * KIB);
    w.write_all(&data[68 * KIB..]).unwrap();
    assert!(w.space(64 * KIB + 1).is_err());
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    let r = StreamReader::open(dir.path(), 3).unwrap();
    assert_eq!(r.chunks()[0].header.raw_len, 60 * KIB as u64);
    check_stream(dir.path(), 3, &data);
}

#[test]
fn io_error_fails_batch_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"not a directory").unwrap();
    let pool = small_pool(Codec::None);
    let batch = pool.batch(&blocker.join("chunks"));
    let mut w = batch.stream(1);
    let data = content(1, 1024 * KIB);
    // Writes may start failing once the IO threads report the error; either way no hang.
    let _ = w.write_all(&data);
    let _ = w.finish();
    let err = batch.wait_durable().unwrap_err();
    assert!(err.to_string().contains("chunks"), "{err}");
    assert_eq!(pool.free_chunks(), pool.chunk_count());
}

#[test]
fn io_thread_panic_fails_batch_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let pool = small_pool(Codec::Zstd(1));
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(io::PANIC_PID);
    let _ = w.write_all(&content(1, 512 * KIB));
    let _ = w.finish();
    let err = batch.wait_durable().unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(pool.free_chunks(), pool.chunk_count());

    // The pool survives: a later batch works.
    let dir2 = tempfile::tempdir().unwrap();
    let batch = pool.batch(dir2.path());
    let mut w = batch.stream(2);
    w.write_all(&content(2, 300 * KIB)).unwrap();
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    check_stream(dir2.path(), 2, &content(2, 300 * KIB));
}

#[test]
fn misuse_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pool = small_pool(Codec::None);

    // A stream dropped without finish fails the batch.
    let batch = pool.batch(dir.path());
    {
        let mut w = batch.stream(1);
        w.write_all(b"hello").unwrap();
    }
    let err = batch.wait_durable().unwrap_err();
    assert!(err.to_string().contains("without finish"), "{err}");

    // wait_durable with a stream still open says so instead of hanging.
    let batch = pool.batch(dir.path());
    let w = batch.stream(2);
    let err = batch.clone().wait_durable().unwrap_err();
    assert!(err.to_string().contains("not finished"), "{err}");
    drop(w);

    // Two streams for one pid.
    let batch = pool.batch(dir.path());
    let a = batch.stream(3);
    let mut b = batch.stream(3);
    assert!(b.space(1).is_err());
    a.finish().unwrap();
    assert!(b.finish().is_err());
    assert!(batch.wait_durable().is_err());
    assert_eq!(pool.free_chunks(), pool.chunk_count());
}

#[test]
fn batch_dir_exists_even_if_empty() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("n0/chunks");
    let pool = small_pool(Codec::None);
    let batch = pool.batch(&chunks);
    batch.stream(1).finish().unwrap();
    let report = batch.wait_durable().unwrap();
    assert_eq!(report, BatchReport::default());
    assert!(chunks.is_dir());
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Pool>();
    send_sync::<Batch>();
    send::<StreamWriter>();
    send::<StreamReader>();
}

fn mode_pool(writer: WriterMode, codec: Codec) -> Pool {
    Pool::new(PoolConfig { pool_bytes: 8 * 64 * KIB, chunk_bytes: 64 * KIB, io_threads: 2, codec, writer }).unwrap()
}

/// Writes `len` bytes of pid's content with odd-sized pieces, mixing space/advance and write_all.
fn write_stream(w: &mut StreamWriter, data: &[u8]) {
    let mut off = 0;
    let mut step = 1usize;
    while off < data.len() {
        if step.is_multiple_of(2) {
            let n = (step * 1234).min(data.len() - off);
            w.write_all(&data[off..off + n]).unwrap();
            off += n;
        } else {
            let want = (step * 4096 % (32 * KIB)).max(1).min(data.len() - off);
            let space = w.space(want).unwrap();
            let n = space.len().min(data.len() - off).min(want * 3);
            space[..n].copy_from_slice(&data[off..off + n]);
            w.advance(n);
            off += n;
        }
        step += 1;
    }
}

#[test]
fn every_writer_mode_round_trips() {
    let modes = [WriterMode::Dbi, WriterMode::Wag { threshold: 48 * KIB }, WriterMode::Wag { threshold: 128 * KIB }, WriterMode::Direct];
    for writer in modes {
        for codec in [Codec::None, Codec::Zstd(1)] {
            let dir = tempfile::tempdir().unwrap();
            let chunks = dir.path().join("gen-000001/n0/chunks");
            let pool = mode_pool(writer, codec);
            let batch = pool.batch(&chunks);
            let sizes = [1024 * KIB + 4096 + 3, 700 * KIB, 5];
            std::thread::scope(|s| {
                for (i, &len) in sizes.iter().enumerate() {
                    let batch = batch.clone();
                    let chunks = &chunks;
                    s.spawn(move || {
                        let pid = 10 + i as u32;
                        let data = content(pid, len);
                        let mut w = batch.stream(pid);
                        write_stream(&mut w, &data);
                        let stats = w.finish().unwrap();
                        assert_eq!(stats.bytes, len as u64);
                        if !matches!(writer, WriterMode::Dbi) {
                            // wag and direct: durable when finish returns, before wait_durable.
                            check_stream(chunks, pid, &data);
                        }
                    });
                }
            });
            let report = batch.wait_durable().unwrap();
            assert_eq!(report.bytes_raw, sizes.iter().sum::<usize>() as u64, "{writer:?}");
            assert_eq!(report.files.len() as u64, report.chunks);
            assert_eq!(pool.free_chunks(), pool.chunk_count(), "{writer:?}");
            for (i, &len) in sizes.iter().enumerate() {
                let pid = 10 + i as u32;
                check_stream(&chunks, pid, &content(pid, len));
                let r = StreamReader::open(&chunks, pid).unwrap();
                let unit = pool.config().unit_bytes() as u64;
                assert!(r.chunks().iter().all(|c| c.header.raw_len <= unit), "{writer:?}");
                if len > 2 * unit as usize {
                    // Pieces are mostly full units: one file per unit-sized write.
                    assert!(r.chunks().len() as u64 <= (len as u64).div_ceil(unit) * 2, "{writer:?}");
                }
            }
            // Every listed file is the file on disk.
            for f in &report.files {
                let bytes = fs::read(dir.path().join("gen-000001").join(&f.path)).unwrap();
                assert_eq!(bytes.len() as u64, f.size, "{}", f.path);
                assert_eq!(crc32c::crc32c(&bytes), f.crc32c, "{}", f.path);
            }
        }
    }
}

#[test]
fn wag_threshold_is_the_write_size() {
    let dir = tempfile::tempdir().unwrap();
    let pool = mode_pool(WriterMode::Wag { threshold: 96 * KIB }, Codec::None);
    assert_eq!(pool.chunk_count(), 8 * 64 / 96);
    let batch = pool.batch(dir.path());
    let data = content(5, 1000 * KIB);
    let mut w = batch.stream(5);
    w.write_all(&data).unwrap();
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    let r = StreamReader::open(dir.path(), 5).unwrap();
    let sizes: Vec<u64> = r.chunks().iter().map(|c| c.header.raw_len).collect();
    assert!(sizes[..sizes.len() - 1].iter().all(|&s| s == 96 * KIB as u64), "{sizes:?}");
    check_stream(dir.path(), 5, &data);

    // A threshold larger than the pool is refused.
    assert!(Pool::new(PoolConfig { pool_bytes: 64 * KIB, chunk_bytes: 4 * KIB, writer: WriterMode::Wag { threshold: 128 * KIB }, ..PoolConfig::default() })
        .is_err());
}

#[test]
fn direct_holds_one_chunk_and_reports_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pool = mode_pool(WriterMode::Direct, Codec::None);
    pool.wait_prefaulted();
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(1);
    let data = content(1, 600 * KIB);
    w.write_all(&data[..300 * KIB]).unwrap();
    // One buffer, reused: everything else stays free.
    assert_eq!(pool.free_chunks(), pool.chunk_count() - 1);
    w.write_all(&data[300 * KIB..]).unwrap();
    let stats = w.finish().unwrap();
    assert_eq!(stats.chunks, (600u64).div_ceil(64));
    assert_eq!(pool.free_chunks(), pool.chunk_count());
    check_stream(dir.path(), 1, &data);
    batch.wait_durable().unwrap();

    // A write error is returned by the stream itself, and fails the batch.
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"not a directory").unwrap();
    let batch = pool.batch(&blocker.join("chunks"));
    let mut w = batch.stream(2);
    let err = w.write_all(&content(2, 200 * KIB)).unwrap_err();
    assert!(err.to_string().contains("chunks"), "{err}");
    drop(w);
    assert!(batch.wait_durable().is_err());
    assert_eq!(pool.free_chunks(), pool.chunk_count());
}

#[test]
fn auto_never_compresses_what_is_written_while_the_job_is_frozen() {
    // A direct stream writes its chunks itself, while the job is frozen: auto keeps them raw,
    // compressible as they are, where zstd shrinks them.
    for (codec, compressed) in [(Codec::Auto(1), false), (Codec::Zstd(1), true)] {
        let dir = tempfile::tempdir().unwrap();
        let pool = mode_pool(WriterMode::Direct, codec);
        let batch = pool.batch(dir.path());
        let data: Vec<u8> = (0..600 * KIB).map(|i| (i / 4096) as u8).collect();
        let mut w = batch.stream(1);
        w.write_all(&data).unwrap();
        w.finish().unwrap();
        let report = batch.wait_durable().unwrap();
        assert_eq!(report.bytes_stored < report.bytes_raw, compressed, "{codec}: {report:?}");
        check_stream(dir.path(), 1, &data);
    }
}

#[test]
fn wag_reports_errors_at_finish() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, b"not a directory").unwrap();
    let pool = mode_pool(WriterMode::Wag { threshold: 64 * KIB }, Codec::None);
    let batch = pool.batch(&blocker.join("chunks"));
    let mut w = batch.stream(1);
    let _ = w.write_all(&content(1, 100 * KIB));
    assert!(w.finish().is_err());
    assert!(batch.wait_durable().is_err());
    assert_eq!(pool.free_chunks(), pool.chunk_count());
}

#[test]
fn prefault_fills_the_free_list() {
    let pool = Pool::new(PoolConfig { pool_bytes: 64 << 20, chunk_bytes: 4 << 20, ..PoolConfig::default() }).unwrap();
    assert_eq!(pool.free_chunks(), 16);
    pool.wait_prefaulted();
    assert_eq!(pool.free_chunks(), 16);
    // Dropping a pool whose prefault is still running does not hang.
    let pool = Pool::new(PoolConfig { pool_bytes: 4 << 30, chunk_bytes: 4 << 20, ..PoolConfig::default() }).unwrap();
    drop(pool);
}

#[test]
fn chunk_files_with_and_without_o_direct() {
    use std::sync::atomic::AtomicBool;
    for direct in [true, false] {
        for codec in [Codec::None, Codec::Zstd(3)] {
            let dir = tempfile::tempdir().unwrap();
            let flag = std::sync::Arc::new(AtomicBool::new(direct));
            let mut writer = io::ChunkWriter::new(codec, 64 * KIB, flag).unwrap();
            let mut buf = buffer::ChunkBuf::standalone(64 * KIB).unwrap();
            let data = content(9, 64 * KIB);
            buf.as_mut_slice().copy_from_slice(&data);
            let (e1, _) = writer.write(dir.path(), 9, 0, &mut buf, 64 * KIB).unwrap();
            buf.as_mut_slice()[..1000].copy_from_slice(&data[..1000]);
            let (e2, _) = writer.write(dir.path(), 9, 64 * KIB as u64, &mut buf, 1000).unwrap();
            for e in [e1, e2] {
                let name = e.path.rsplit('/').next().unwrap().to_string();
                let bytes = fs::read(dir.path().join(name)).unwrap();
                assert_eq!(bytes.len() as u64, e.size);
                assert_eq!(crc32c::crc32c(&bytes), e.crc32c);
            }
            let mut expect = data.clone();
            expect.extend_from_slice(&data[..1000]);
            check_stream(dir.path(), 9, &expect);
            // Writing an existing chunk file is refused, never overwritten.
            assert!(writer.write(dir.path(), 9, 0, &mut buf, 10).is_err());
            check_stream(dir.path(), 9, &expect);
        }
    }
}

#[test]
fn deferred_prefault() {
    let cfg = PoolConfig { pool_bytes: 8 * 64 * KIB, chunk_bytes: 64 * KIB, ..PoolConfig::default() };
    let pool = Pool::new_deferred(cfg).unwrap();
    assert_eq!(pool.free_chunks(), 8);
    // Streams take unborn slots themselves before any prefault.
    let dir = tempfile::tempdir().unwrap();
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(4);
    let data = content(4, 300 * KIB);
    w.write_all(&data).unwrap();
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    check_stream(dir.path(), 4, &data);
    assert_eq!(pool.free_chunks(), 8);
    pool.prefault_in_background();
    pool.prefault_in_background();
    pool.wait_prefaulted();
    assert_eq!(pool.free_chunks(), 8);
}

/// Streams parked with a partial chunk (a process whose memory is copied after the release) hold
/// no pool memory meanwhile: more parked streams than the pool has chunks, each continued
/// afterwards, round-trip in every writer mode, and the pool gets every chunk back.
#[test]
fn parked_streams_hold_no_chunk_and_continue() {
    for writer in [WriterMode::Dbi, WriterMode::Wag { threshold: 48 * KIB }, WriterMode::Direct] {
        let dir = tempfile::tempdir().unwrap();
        let chunks = dir.path().join("chunks");
        let pool = mode_pool(writer, Codec::None);
        let batch = pool.batch(&chunks);
        let streams = pool.chunk_count() as u32 * 2;
        let data: Vec<Vec<u8>> = (0..streams).map(|pid| content(pid, 100 * KIB + 7 * 4096)).collect();
        let mut parked = Vec::new();
        for pid in 0..streams {
            let mut w = batch.stream(pid);
            w.write_all(&data[pid as usize][..30 * KIB]).unwrap();
            w.park().unwrap();
            parked.push(w);
        }
        for (pid, mut w) in parked.into_iter().enumerate() {
            w.write_all(&data[pid][30 * KIB..]).unwrap();
            assert_eq!(w.finish().unwrap().bytes, data[pid].len() as u64, "{writer:?}");
        }
        batch.wait_durable().unwrap();
        assert_eq!(pool.free_chunks(), pool.chunk_count(), "{writer:?}");
        for pid in 0..streams {
            check_stream(&chunks, pid, &data[pid as usize]);
        }
    }
}

/// A stream given up (its process ended before the capture it was opened for) leaves nothing:
/// no chunk file, no entry in the report, no bytes counted; the other streams are whole.
#[test]
fn a_discarded_stream_leaves_no_chunk_files() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = dir.path().join("gen-000001/n0/chunks");
    let pool = small_pool(Codec::None);
    let batch = pool.batch(&chunks);
    let kept = content(5, 200 * KIB);
    let mut w = batch.stream(5);
    w.write_all(&kept).unwrap();
    w.park().unwrap();
    // Three chunks handed over and a fourth begun when it is given up; pid 55's files begin
    // with "p5" too, not with "p5-".
    let mut gone = batch.stream(55);
    gone.write_all(&content(55, 3 * 64 * KIB + 100)).unwrap();
    gone.discard();
    w.write_all(&kept[..10]).unwrap();
    w.finish().unwrap();
    let report = batch.wait_durable().unwrap();
    let names: Vec<String> = fs::read_dir(&chunks).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| n.starts_with("p5-")), "chunk files of the discarded stream left: {names:?}");
    assert_eq!(report.files.len(), names.len());
    assert_eq!(report.chunks as usize, names.len());
    assert_eq!(report.bytes_raw, (kept.len() + 10) as u64);
    let mut expect = kept.clone();
    expect.extend_from_slice(&kept[..10]);
    check_stream(&chunks, 5, &expect);
}

#[test]
fn a_pool_gives_its_idle_memory_back_unless_kept_warm() {
    let cfg = PoolConfig { pool_bytes: 8 << 20, chunk_bytes: 1 << 20, ..PoolConfig::default() };
    let pool = Pool::new(cfg.clone()).unwrap();
    pool.wait_prefaulted();
    // A checkpoint's worth of streams, written and durable.
    let dir = tempfile::tempdir().unwrap();
    let batch = pool.batch(dir.path());
    let mut w = batch.stream(1);
    w.write_all(&content(1, 6 << 20)).unwrap();
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    let given = pool.give_back_idle(2);
    assert_eq!(given, (pool.chunk_count() as u64 - 2) * pool.inner.slot as u64);
    // A given-back buffer reads as zeros until written again, and still works.
    let bufs: Vec<ChunkBuf> = pool.inner.free_rx.try_iter().collect();
    assert!(bufs[2..].iter().all(|b| b.as_slice().iter().all(|&x| x == 0)));
    for b in bufs {
        pool.inner.free_tx.send(b).unwrap();
    }
    let dir2 = tempfile::tempdir().unwrap();
    let batch = pool.batch(dir2.path());
    let mut w = batch.stream(2);
    w.write_all(&content(2, 6 << 20)).unwrap();
    w.finish().unwrap();
    batch.wait_durable().unwrap();
    check_stream(dir2.path(), 2, &content(2, 6 << 20));

    // Kept warm (memory copied while frozen), it keeps everything.
    let warm = Pool::new_deferred(cfg).unwrap();
    warm.keep_warm();
    warm.prefault_in_background();
    warm.wait_prefaulted();
    assert_eq!(warm.give_back_idle(0), 0);
}
