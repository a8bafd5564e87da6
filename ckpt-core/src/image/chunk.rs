//! Chunk files: one contiguous piece of one process's stream, possibly compressed.
//!
//! A file `chunks/p<pid>-<offset as 16 decimal digits>` holds a 56-byte header followed by the
//! stored bytes. Header, little-endian:
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0..8   | magic `b"CKPTCHNK"` |
//! | 8..12  | format version |
//! | 12..16 | codec (0 = none, 1 = zstd) |
//! | 16..20 | pid |
//! | 20..24 | reserved, 0 |
//! | 24..32 | offset of the chunk's first byte in the process's stream |
//! | 32..40 | raw length (bytes of stream the chunk holds) |
//! | 40..48 | stored length (bytes following the header) |
//! | 48..52 | crc32c of the stored bytes |
//! | 52..56 | crc32c of header bytes 0..52 |
//!
//! The pid and offset are in both the name and the header, so that a renamed or misplaced file is
//! caught instead of silently splicing the wrong bytes into a process's memory.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::codec::{Codec, CodecId};
use super::error::{ImageError, Result};
use super::fsutil;
use super::mapped::MappedFile;
use super::record::{check_magic, check_version, FileEntry};
use super::FORMAT_VERSION;

/// Magic at the start of every chunk file.
pub const CHUNK_MAGIC: [u8; 8] = *b"CKPTCHNK";
/// Length of a chunk file's header.
pub const CHUNK_HEADER_LEN: usize = 56;
/// The largest raw length a reader accepts: far above any sane chunk size, low enough that a
/// damaged length cannot exhaust memory.
pub const MAX_CHUNK_RAW_LEN: u64 = 1 << 30;

/// The parsed header of a chunk file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub version: u32,
    pub codec: CodecId,
    pub pid: u32,
    /// Position of the chunk's first byte in the process's stream.
    pub offset: u64,
    /// Bytes of stream the chunk holds, once decompressed.
    pub raw_len: u64,
    /// Bytes stored after the header.
    pub stored_len: u64,
    /// crc32c of the stored bytes.
    pub data_crc32c: u32,
}

impl ChunkHeader {
    /// Stream offset just past this chunk.
    pub fn end(&self) -> u64 {
        self.offset + self.raw_len
    }

    /// Size of the whole chunk file.
    pub fn file_size(&self) -> u64 {
        CHUNK_HEADER_LEN as u64 + self.stored_len
    }

    /// The header as it is on disk, with its own checksum filled in.
    pub fn to_bytes(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[0..8].copy_from_slice(&CHUNK_MAGIC);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        h[12..16].copy_from_slice(&(self.codec as u32).to_le_bytes());
        h[16..20].copy_from_slice(&self.pid.to_le_bytes());
        // 20..24 reserved, 0
        h[24..32].copy_from_slice(&self.offset.to_le_bytes());
        h[32..40].copy_from_slice(&self.raw_len.to_le_bytes());
        h[40..48].copy_from_slice(&self.stored_len.to_le_bytes());
        h[48..52].copy_from_slice(&self.data_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&h[..52]);
        h[52..56].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// crc32c of the whole file (header and stored bytes), as the manifest records it. Derived
    /// from the header alone, so the data is not read twice.
    pub fn file_crc32c(&self) -> u32 {
        crc32c::crc32c_combine(
            crc32c::crc32c(&self.to_bytes()),
            self.data_crc32c,
            self.stored_len as usize,
        )
    }

    /// Parses and checks a header read from `path` (used only in errors). Every length is bounded
    /// here, before anyone allocates from it.
    pub fn parse(h: &[u8; CHUNK_HEADER_LEN], path: &Path) -> Result<ChunkHeader> {
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));

        check_magic(path, &h[0..8], &CHUNK_MAGIC, "ckpt chunk file")?;
        let version = u32_at(8);
        check_version(path, version)?;
        if crc32c::crc32c(&h[..52]) != u32_at(52) {
            return Err(ImageError::Checksum {
                kind: "chunk",
                path: path.to_path_buf(),
                detail: " in header".into(),
            });
        }
        let codec = CodecId::from_u32(u32_at(12)).ok_or_else(|| {
            ImageError::malformed(
                path,
                format!("unknown codec id {} (written by a newer ckpt?)", u32_at(12)),
            )
        })?;
        if u32_at(20) != 0 {
            return Err(ImageError::malformed(
                path,
                "reserved header field is not 0 (written by a newer ckpt?)",
            ));
        }
        let header = ChunkHeader {
            version,
            codec,
            pid: u32_at(16),
            offset: u64_at(24),
            raw_len: u64_at(32),
            stored_len: u64_at(40),
            data_crc32c: u32_at(48),
        };
        if header.raw_len == 0 {
            return Err(ImageError::malformed(path, "empty chunk (raw length 0)"));
        }
        if header.raw_len > MAX_CHUNK_RAW_LEN {
            return Err(ImageError::TooLarge {
                path: path.to_path_buf(),
                what: "chunk raw length",
                len: header.raw_len,
                max: MAX_CHUNK_RAW_LEN,
            });
        }
        // Writers store raw whenever compression does not help, so stored > raw is never written.
        let stored_ok = match codec {
            CodecId::None => header.stored_len == header.raw_len,
            CodecId::Zstd => header.stored_len > 0 && header.stored_len <= header.raw_len,
        };
        if !stored_ok {
            return Err(ImageError::malformed(
                path,
                format!(
                    "stored length {} is impossible for raw length {} with codec {codec:?} (file damaged?)",
                    header.stored_len, header.raw_len
                ),
            ));
        }
        if header.offset.checked_add(header.raw_len).is_none() {
            return Err(ImageError::malformed(
                path,
                format!(
                    "offset {} + length {} overflows",
                    header.offset, header.raw_len
                ),
            ));
        }
        Ok(header)
    }
}

/// File name of the chunk of process `pid` starting at stream offset `offset`.
pub fn chunk_file_name(pid: u32, offset: u64) -> String {
    format!("p{pid}-{offset:016}")
}

/// Parses a chunk file name; only the exact spelling [`chunk_file_name`] produces is accepted,
/// so that `x.tmp` or re-padded copies are never taken for chunks.
pub fn parse_chunk_file_name(name: &str) -> Option<(u32, u64)> {
    let (pid, offset) = name.strip_prefix('p')?.split_once('-')?;
    if !pid.bytes().all(|b| b.is_ascii_digit()) || !offset.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (pid, offset) = (pid.parse().ok()?, offset.parse().ok()?);
    (chunk_file_name(pid, offset) == name).then_some((pid, offset))
}

/// Refuses a chunk file whose header disagrees with its name.
pub(crate) fn check_chunk_name(path: &Path, header: &ChunkHeader) -> Result<()> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_chunk_file_name);
    match named {
        Some((pid, offset)) if pid == header.pid && offset == header.offset => Ok(()),
        Some((pid, offset)) => Err(ImageError::malformed(
            path,
            format!(
                "header says process {} offset {}, but the file name says process {pid} offset {offset} \
                 (file renamed or copied wrongly?)",
                header.pid, header.offset
            ),
        )),
        None => Err(ImageError::malformed(
            path,
            "not a chunk file name (expected p<pid>-<16-digit offset>)",
        )),
    }
}

/// A chunk ready to be written: its header and the bytes to store after it.
#[derive(Debug)]
pub struct EncodedChunk<'a> {
    pub header: ChunkHeader,
    pub stored: &'a [u8],
}

/// Encodes chunks with one codec, reusing its compression context and scratch buffer across
/// chunks (one encoder per IO thread).
pub struct ChunkEncoder {
    codec: Codec,
    compressor: Option<zstd::bulk::Compressor<'static>>,
    scratch: Vec<u8>,
}

impl ChunkEncoder {
    pub fn new(codec: Codec) -> Result<ChunkEncoder> {
        let codec = codec.validate()?;
        let compressor = codec.compressor()?;
        Ok(ChunkEncoder {
            codec,
            compressor,
            scratch: Vec::new(),
        })
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Encodes `raw`, the stream bytes of process `pid` starting at `offset`. Compressed data
    /// that is not smaller than `raw` is dropped and `raw` is stored as is, so incompressible
    /// memory costs nothing at restart; a chunk whose samples do not compress is not compressed
    /// at all (`codec::worth_compressing`).
    pub fn encode<'a>(
        &'a mut self,
        pid: u32,
        offset: u64,
        raw: &'a [u8],
    ) -> Result<EncodedChunk<'a>> {
        let name = || PathBuf::from(chunk_file_name(pid, offset));
        if raw.is_empty() || raw.len() as u64 > MAX_CHUNK_RAW_LEN {
            return Err(ImageError::Encode {
                path: name(),
                what: "chunk",
                detail: format!(
                    "{} bytes (a chunk holds 1..={MAX_CHUNK_RAW_LEN} bytes)",
                    raw.len()
                ),
            });
        }
        let mut codec = CodecId::None;
        let mut stored = raw;
        let mut compressor = self.compressor.as_mut();
        if compressor.as_deref_mut().is_some_and(|c| !super::codec::worth_compressing(c, raw, &mut self.scratch)) {
            compressor = None;
        }
        if let Some(c) = compressor {
            self.scratch.clear();
            self.scratch
                .reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let n =
                c.compress_to_buffer(raw, &mut self.scratch)
                    .map_err(|e| ImageError::Encode {
                        path: name(),
                        what: "chunk",
                        detail: format!("zstd: {e}"),
                    })?;
            if n < raw.len() {
                codec = CodecId::Zstd;
                stored = &self.scratch[..n];
            }
        }
        Ok(EncodedChunk {
            header: ChunkHeader {
                version: FORMAT_VERSION,
                codec,
                pid,
                offset,
                raw_len: raw.len() as u64,
                stored_len: stored.len() as u64,
                data_crc32c: crc32c::crc32c(stored),
            },
            stored,
        })
    }
}

/// Writes `chunk` to `chunks_dir/p<pid>-<offset>` and fsyncs it (the directory is fsynced once
/// per batch by the caller). The name is final: no rename, since a generation's files exist only
/// once its manifest lists them. An existing file is an error, never overwritten.
pub fn write_chunk_file(chunks_dir: &Path, chunk: &EncodedChunk<'_>) -> Result<FileEntry> {
    let path = chunks_dir.join(chunk_file_name(chunk.header.pid, chunk.header.offset));
    fsutil::write_file_synced(&path, &[&chunk.header.to_bytes(), chunk.stored], true)?;
    Ok(FileEntry {
        path: fsutil::gen_relative(&path),
        size: chunk.header.file_size(),
        crc32c: chunk.header.file_crc32c(),
    })
}

/// Reads and checks the header of the chunk file `path`, and that the file's size matches it.
pub fn read_chunk_header(path: &Path) -> Result<ChunkHeader> {
    let (mut f, len) = fsutil::open_with_len(path)?;
    read_header_from(&mut f, len, path)
}

fn read_header_from(f: &mut fs::File, file_len: u64, path: &Path) -> Result<ChunkHeader> {
    if file_len < CHUNK_HEADER_LEN as u64 {
        return Err(ImageError::truncated(
            path,
            format!("{file_len} bytes, shorter than the {CHUNK_HEADER_LEN}-byte chunk header"),
        ));
    }
    let mut h = [0u8; CHUNK_HEADER_LEN];
    fsutil::read_exact_or_truncated(f, path, &mut h, "chunk header")?;
    let header = ChunkHeader::parse(&h, path)?;
    let expected = header.file_size();
    if file_len < expected {
        return Err(ImageError::truncated(
            path,
            format!("header announces {expected} bytes, the file holds {file_len}"),
        ));
    }
    if file_len > expected {
        return Err(ImageError::malformed(
            path,
            format!(
                "{} bytes after the chunk data (file damaged or appended to?)",
                file_len - expected
            ),
        ));
    }
    Ok(header)
}

/// Raw chunks at least this long are mapped rather than read (see [`super::mapped`]); smaller
/// ones are not worth a mapping's setup.
const MAP_AT_LEAST: u64 = 256 * 1024;

/// A chunk's raw bytes, as [`ChunkDecoder::load`] hands them out.
pub enum ChunkBytes {
    /// A chunk stored raw, mapped from its file: the bytes are the page cache's, copied only
    /// where they are used.
    Mapped(MappedFile),
    /// A chunk decoded (or read) into memory.
    Owned(Vec<u8>),
}

impl ChunkBytes {
    /// The raw bytes of the chunk.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ChunkBytes::Mapped(m) => &m.bytes()[CHUNK_HEADER_LEN..],
            ChunkBytes::Owned(v) => v,
        }
    }

    /// Whether the bytes handed out so far were the file's: a mapped file that shrank since it
    /// was checked is reported as truncated (`path` names it), never used.
    pub fn check_intact(&self, path: &Path) -> Result<()> {
        match self {
            ChunkBytes::Mapped(m) if !m.intact() => Err(ImageError::truncated(path, "file shrank while being read (is something else writing the image?)")),
            _ => Ok(()),
        }
    }

    /// The buffer to reuse for the next owned chunk.
    pub fn into_spare(self) -> Vec<u8> {
        match self {
            ChunkBytes::Mapped(_) => Vec::new(),
            ChunkBytes::Owned(v) => v,
        }
    }
}

impl Default for ChunkBytes {
    fn default() -> Self {
        ChunkBytes::Owned(Vec::new())
    }
}

/// Reads, checks and decompresses chunk files, reusing its buffers and zstd context.
#[derive(Default)]
pub struct ChunkDecoder {
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    stored: Vec<u8>,
}

impl ChunkDecoder {
    pub fn new() -> ChunkDecoder {
        ChunkDecoder::default()
    }

    /// Reads the chunk file `path` into `out` (replacing its content with the chunk's raw bytes),
    /// after checking its header, its size and the checksum of its data.
    pub fn read(&mut self, path: &Path, out: &mut Vec<u8>) -> Result<ChunkHeader> {
        let (mut f, len) = fsutil::open_with_len(path)?;
        let header = read_header_from(&mut f, len, path)?;
        self.read_data(f, &header, path, out)?;
        Ok(header)
    }

    /// The chunk file `path`'s raw bytes, checked as [`read`](Self::read) checks them: mapped
    /// when the chunk is stored raw and large enough, else read into `spare` (whose allocation
    /// is reused).
    pub fn load(&mut self, path: &Path, spare: Vec<u8>) -> Result<(ChunkHeader, ChunkBytes)> {
        let (mut f, len) = fsutil::open_with_len(path)?;
        let header = read_header_from(&mut f, len, path)?;
        if header.codec == CodecId::None && header.stored_len >= MAP_AT_LEAST {
            if let Some(map) = MappedFile::map(&f, len) {
                let bytes = ChunkBytes::Mapped(map);
                let crc = crc32c::crc32c(bytes.bytes());
                bytes.check_intact(path)?;
                if crc != header.data_crc32c {
                    return Err(data_checksum_error(path));
                }
                return Ok((header, bytes));
            }
        }
        let mut out = spare;
        self.read_data(f, &header, path, &mut out)?;
        Ok((header, ChunkBytes::Owned(out)))
    }

    /// Reads the data following the header from `f` into `out`, checks it and decodes it.
    fn read_data(&mut self, mut f: fs::File, header: &ChunkHeader, path: &Path, out: &mut Vec<u8>) -> Result<()> {
        let stored_len = header.stored_len as usize;
        // Stored bytes go straight to `out` when they are the raw bytes, else to a staging buffer.
        let buf = match header.codec {
            CodecId::None => &mut *out,
            CodecId::Zstd => &mut self.stored,
        };
        buf.clear();
        buf.reserve_exact(stored_len);
        (&mut f)
            .take(header.stored_len)
            .read_to_end(buf)
            .map_err(|e| ImageError::io(path, "read", e))?;
        if buf.len() != stored_len {
            return Err(ImageError::truncated(
                path,
                "file shrank while being read (is something else writing the image?)",
            ));
        }
        if crc32c::crc32c(buf) != header.data_crc32c {
            return Err(data_checksum_error(path));
        }
        if header.codec == CodecId::Zstd {
            let d = match self.decompressor.as_mut() {
                Some(d) => d,
                None => self.decompressor.insert(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| ImageError::io(path, "create a zstd decompressor for", e))?,
                ),
            };
            out.clear();
            out.reserve_exact(header.raw_len as usize);
            let n =
                d.decompress_to_buffer(&self.stored[..], out)
                    .map_err(|e| ImageError::Decode {
                        path: path.to_path_buf(),
                        what: "zstd chunk data",
                        detail: e.to_string(),
                    })?;
            if n as u64 != header.raw_len {
                return Err(ImageError::Decode {
                    path: path.to_path_buf(),
                    what: "zstd chunk data",
                    detail: format!("{n} bytes decompressed, header says {}", header.raw_len),
                });
            }
        }
        Ok(())
    }
}

fn data_checksum_error(path: &Path) -> ImageError {
    ImageError::Checksum {
        kind: "chunk",
        path: path.to_path_buf(),
        detail: " in data".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        // Half compressible, half noise, so both codec paths get exercised.
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..len)
            .map(|i| {
                if (i / 4096) % 2 == 0 {
                    (i % 251) as u8
                } else {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn names() {
        assert_eq!(chunk_file_name(4242, 41943040), "p4242-0000000041943040");
        assert_eq!(
            parse_chunk_file_name("p4242-0000000041943040"),
            Some((4242, 41943040))
        );
        assert_eq!(
            parse_chunk_file_name(&chunk_file_name(u32::MAX, u64::MAX)),
            Some((u32::MAX, u64::MAX))
        );
        assert_eq!(parse_chunk_file_name("p4242-41943040"), None);
        assert_eq!(parse_chunk_file_name("p4242-0000000041943040.tmp"), None);
        assert_eq!(parse_chunk_file_name("p+42-0000000041943040"), None);
        assert_eq!(parse_chunk_file_name("procs.bin"), None);
    }

    #[test]
    fn encode_write_read() {
        let dir = tempfile::tempdir().unwrap();
        let raw = pattern(300_000, 1);
        let noise: Vec<u8> = pattern(8192 * 4, 2)
            .chunks(4096)
            .skip(1)
            .step_by(2)
            .flatten()
            .copied()
            .collect();
        let mut dec = ChunkDecoder::new();
        let mut out = Vec::new();
        for codec in [Codec::None, Codec::Zstd(3)] {
            let mut enc = ChunkEncoder::new(codec).unwrap();
            for (i, data) in [&raw, &noise].into_iter().enumerate() {
                let pid = 10 + i as u32;
                let sub = dir.path().join(format!("{codec}-{i}"));
                fs::create_dir(&sub).unwrap();
                let chunk = enc.encode(pid, 1 << 20, data).unwrap();
                let h = chunk.header;
                let expect = if codec == Codec::None || i == 1 {
                    CodecId::None
                } else {
                    CodecId::Zstd
                };
                assert_eq!(h.codec, expect, "{codec} {i}");
                let entry = write_chunk_file(&sub, &chunk).unwrap();
                let path = sub.join(chunk_file_name(pid, 1 << 20));
                let bytes = fs::read(&path).unwrap();
                assert_eq!(entry.size, bytes.len() as u64);
                assert_eq!(entry.crc32c, crc32c::crc32c(&bytes));
                assert_eq!(read_chunk_header(&path).unwrap(), h);
                assert_eq!(dec.read(&path, &mut out).unwrap(), h);
                assert_eq!(&out, data);
                // Never overwritten.
                assert!(write_chunk_file(&sub, &enc.encode(pid, 1 << 20, data).unwrap()).is_err());
            }
        }
    }

    #[test]
    fn damage_detected() {
        let dir = tempfile::tempdir().unwrap();
        let raw = pattern(100_000, 3);
        let mut enc = ChunkEncoder::new(Codec::Zstd(1)).unwrap();
        write_chunk_file(dir.path(), &enc.encode(7, 0, &raw).unwrap()).unwrap();
        let path = dir.path().join(chunk_file_name(7, 0));
        let good = fs::read(&path).unwrap();
        let mut dec = ChunkDecoder::new();
        let mut out = Vec::new();

        for (at, want) in [(CHUNK_HEADER_LEN + 100, " in data"), (30, " in header")] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            fs::write(&path, &bad).unwrap();
            let err = dec.read(&path, &mut out).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("chunk {}", path.display())),
                "{msg}"
            );
            assert!(
                msg.contains(want) && msg.contains("checksum mismatch"),
                "{msg}"
            );
        }

        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(
            dec.read(&path, &mut out),
            Err(ImageError::Truncated { .. })
        ));
        fs::write(&path, &good[..20]).unwrap();
        assert!(matches!(
            read_chunk_header(&path),
            Err(ImageError::Truncated { .. })
        ));

        // A valid header whose raw length is absurd is refused before allocating.
        let mut h =
            ChunkHeader::parse(good[..CHUNK_HEADER_LEN].try_into().unwrap(), &path).unwrap();
        h.raw_len = u64::MAX / 2;
        let err = ChunkHeader::parse(&h.to_bytes(), &path).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn name_must_match_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut enc = ChunkEncoder::new(Codec::None).unwrap();
        let chunk = enc.encode(7, 4096, b"hello").unwrap();
        write_chunk_file(dir.path(), &chunk).unwrap();
        let path = dir.path().join(chunk_file_name(7, 4096));
        assert!(check_chunk_name(&path, &chunk.header).is_ok());
        let moved = dir.path().join(chunk_file_name(8, 4096));
        fs::rename(&path, &moved).unwrap();
        let err = check_chunk_name(&moved, &read_chunk_header(&moved).unwrap()).unwrap_err();
        assert!(err.to_string().contains("renamed"), "{err}");
    }
}
