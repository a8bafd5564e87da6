use std::fs;
use std::path::Path;
use std::time::Duration;

use super::*;
use crate::image::{chunk_file_name, StreamReader};

const KIB: usize = 1024;

fn small_pool(codec: Codec) -> Pool {
    Pool::new(PoolConfig {
        pool_bytes: 4 * 64 * KIB,
        chunk_bytes: 64 * KIB,
        io_threads: 2,
        codec,
        ..PoolConfig::default()
    })
    .unwrap()
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
        PoolConfig {
            chunk_bytes: 0,
            ..PoolConfig::default()
        },
        PoolConfig {
            pool_bytes: 1000,
            chunk_bytes: 4096,
            ..PoolConfig::default()
        },
        PoolConfig {
            io_threads: 0,
            ..PoolConfig::default()
        },
        PoolConfig {
            codec: Codec::Zstd(99),
            ..PoolConfig::default()
        },
    ];
    for cfg in bad {
        assert!(Pool::new(cfg.clone()).is_err(), "{cfg:?}");
    }
}

#[test]
fn round_trip_many_streams_small_pool() {
    for codec in [Codec::None, Codec::Zstd(3)] {
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
        if codec == Codec::None {
            assert_eq!(report.bytes_stored, report.bytes_raw);
        } else {
            assert!(report.bytes_stored < report.bytes_raw / 2, "{report:?}");
        }
        assert!(report.files.windows(2).all(|w| w[0].path < w[1].path));
        assert!(
            report.files[0].path.starts_with("n0/chunks/p100-"),
            "{:?}",
            report.files[0]
        );
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
    let pool = Pool::new(PoolConfig {
        pool_bytes: 64 * KIB,
        chunk_bytes: 64 * KIB,
        io_threads: 1,
        codec: Codec::Zstd(19),
        ..PoolConfig::default()
    })
    .unwrap();
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
