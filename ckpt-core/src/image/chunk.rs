//! Chunk files: one contiguous piece of one process's stream, possibly compressed.
//!
//! A file `chunks/p<pid>-<offset as 16 decimal digits>` holds a 56-byte header, the stored bytes,
//! and (format 11, chunks stored raw) a trailer of block checksums. Header, little-endian:
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0..8   | magic `b"CKPTCHNK"` |
//! | 8..12  | format version |
//! | 12..16 | codec (0 = none, 1 = zstd) |
//! | 16..20 | pid |
//! | 20..24 | block shift: log2 of the trailer's block size (16: 64 KiB), 0 = no trailer |
//! | 24..32 | offset of the chunk's first byte in the process's stream |
//! | 32..40 | raw length (bytes of stream the chunk holds) |
//! | 40..48 | stored length (bytes following the header) |
//! | 48..52 | crc32c of the stored bytes |
//! | 52..56 | crc32c of header bytes 0..52 |
//!
//! The pid and offset are in both the name and the header, so that a renamed or misplaced file is
//! caught instead of silently splicing the wrong bytes into a process's memory.
//!
//! The trailer ([`BlockTable`]) is the crc32c of each block of the stored bytes, in order, as
//! little-endian u32s (the last block may be shorter). It lets a reader that needs a few pages
//! (a lazy restart's page fault) read and check 64 KiB instead of the whole chunk. The trailer
//! needs no checksum of its own: combined, its entries must give the header's data crc32c,
//! which the header's own checksum covers. Compressed chunks have none (a piece of a zstd frame
//! cannot be decoded alone).

use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::codec::{Codec, CodecId};
use super::error::{ImageError, Result};
use super::fsutil;
use super::record::{check_magic, check_version, FileEntry};
use super::FORMAT_VERSION;
use crate::sys::mapped::MappedFile;

/// Magic at the start of every chunk file.
pub const CHUNK_MAGIC: [u8; 8] = *b"CKPTCHNK";
/// Length of a chunk file's header.
pub const CHUNK_HEADER_LEN: usize = 56;
/// The largest raw length a reader accepts: far above any sane chunk size, low enough that a
/// damaged length cannot exhaust memory.
pub const MAX_CHUNK_RAW_LEN: u64 = 1 << 30;
/// The block size writers give raw chunks' trailers: 64 KiB, the lazy restart's fault block.
pub const BLOCK_SHIFT: u32 = 16;
/// The block sizes a reader accepts: 4 KiB ..= 1 GiB, which bounds a trailer to 1 MiB.
const BLOCK_SHIFTS: std::ops::RangeInclusive<u32> = 12..=30;
/// The first format whose chunk files may have a trailer; before it, header bytes 20..24 were
/// reserved and 0.
const BLOCK_TABLE_SINCE: u32 = 11;

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
    /// log2 of the trailer's block size; 0 when the file has no trailer.
    pub block_shift: u32,
}

impl ChunkHeader {
    /// Stream offset just past this chunk.
    pub fn end(&self) -> u64 {
        self.offset + self.raw_len
    }

    /// Size of the whole chunk file.
    pub fn file_size(&self) -> u64 {
        CHUNK_HEADER_LEN as u64 + self.stored_len + self.trailer_len()
    }

    /// Blocks the trailer has a checksum for (0 without a trailer).
    pub fn block_count(&self) -> u64 {
        match self.block_shift {
            0 => 0,
            shift => self.stored_len.div_ceil(1 << shift),
        }
    }

    /// Bytes of the trailer after the stored bytes.
    pub fn trailer_len(&self) -> u64 {
        self.block_count() * 4
    }

    /// The header as it is on disk, with its own checksum filled in.
    pub fn to_bytes(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[0..8].copy_from_slice(&CHUNK_MAGIC);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        h[12..16].copy_from_slice(&(self.codec as u32).to_le_bytes());
        h[16..20].copy_from_slice(&self.pid.to_le_bytes());
        h[20..24].copy_from_slice(&self.block_shift.to_le_bytes());
        h[24..32].copy_from_slice(&self.offset.to_le_bytes());
        h[32..40].copy_from_slice(&self.raw_len.to_le_bytes());
        h[40..48].copy_from_slice(&self.stored_len.to_le_bytes());
        h[48..52].copy_from_slice(&self.data_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&h[..52]);
        h[52..56].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// crc32c of the whole file (header, stored bytes, trailer), as the manifest records it.
    /// Derived from the header and the trailer, so the data is not read twice.
    pub fn file_crc32c(&self, trailer: &[u8]) -> u32 {
        let header_and_data = crc32c_combine(crc32c::crc32c(&self.to_bytes()), self.data_crc32c, self.stored_len);
        crc32c::crc32c_append(header_and_data, trailer)
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
            return Err(ImageError::Checksum { kind: "chunk", path: path.to_path_buf(), detail: " in header".into() });
        }
        let codec =
            CodecId::from_u32(u32_at(12)).ok_or_else(|| ImageError::malformed(path, format!("unknown codec id {} (written by a newer ckpt?)", u32_at(12))))?;
        let block_shift = u32_at(20);
        if block_shift != 0 && version < BLOCK_TABLE_SINCE {
            return Err(ImageError::malformed(path, format!("reserved header field is not 0 in a format {version} file (file damaged?)")));
        }
        if block_shift != 0 && (codec != CodecId::None || !BLOCK_SHIFTS.contains(&block_shift)) {
            return Err(ImageError::malformed(
                path,
                format!("block checksums of 2^{block_shift} bytes for a chunk stored with codec {codec:?} (file damaged?)"),
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
            block_shift,
        };
        if header.raw_len == 0 {
            return Err(ImageError::malformed(path, "empty chunk (raw length 0)"));
        }
        if header.raw_len > MAX_CHUNK_RAW_LEN {
            return Err(ImageError::TooLarge { path: path.to_path_buf(), what: "chunk raw length", len: header.raw_len, max: MAX_CHUNK_RAW_LEN });
        }
        // Writers store raw whenever compression does not help, so stored > raw is never written.
        let stored_ok = match codec {
            CodecId::None => header.stored_len == header.raw_len,
            CodecId::Zstd => header.stored_len > 0 && header.stored_len <= header.raw_len,
        };
        if !stored_ok {
            return Err(ImageError::malformed(
                path,
                format!("stored length {} is impossible for raw length {} with codec {codec:?} (file damaged?)", header.stored_len, header.raw_len),
            ));
        }
        if header.offset.checked_add(header.raw_len).is_none() {
            return Err(ImageError::malformed(path, format!("offset {} + length {} overflows", header.offset, header.raw_len)));
        }
        Ok(header)
    }
}

/// The trailer of a chunk stored raw: the crc32c of each block of its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTable {
    shift: u32,
    crcs: Vec<u32>,
}

impl BlockTable {
    /// The checksums of `data`'s blocks of 2^`shift` bytes.
    pub fn of(data: &[u8], shift: u32) -> BlockTable {
        BlockTable { shift, crcs: data.chunks(1 << shift).map(crc32c::crc32c).collect() }
    }

    /// The crc32c of the whole data, `data_len` bytes, from its blocks' checksums.
    pub fn data_crc32c(&self, data_len: u64) -> u32 {
        let block = 1u64 << self.shift;
        self.crcs.iter().enumerate().fold(0, |crc, (i, &c)| crc32c_combine(crc, c, block.min(data_len.saturating_sub(i as u64 * block))))
    }

    /// The trailer as it is on disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.crcs.iter().flat_map(|c| c.to_le_bytes()).collect()
    }

    /// Parses the trailer `bytes` of the chunk `header` describes, and checks it against the
    /// header's data checksum.
    pub fn parse(bytes: &[u8], header: &ChunkHeader, path: &Path) -> Result<BlockTable> {
        if bytes.len() as u64 != header.trailer_len() {
            return Err(ImageError::truncated(path, format!("block checksums: {} bytes, the header announces {}", bytes.len(), header.trailer_len())));
        }
        let crcs = bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        let table = BlockTable { shift: header.block_shift, crcs };
        if table.data_crc32c(header.stored_len) != header.data_crc32c {
            return Err(ImageError::Checksum { kind: "chunk", path: path.to_path_buf(), detail: " in block checksums".into() });
        }
        Ok(table)
    }

    /// Reads the trailer of the chunk file `path`, whose header is `header`, and checks it.
    pub fn read(path: &Path, header: &ChunkHeader) -> Result<BlockTable> {
        let f = fs::File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
        let mut trailer = vec![0; header.trailer_len() as usize];
        read_exact_at(&f, path, &mut trailer, CHUNK_HEADER_LEN as u64 + header.stored_len)?;
        BlockTable::parse(&trailer, header, path)
    }

    /// The stored bytes block `i` covers, in a chunk of `stored_len` bytes.
    fn block(&self, i: u64, stored_len: u64) -> std::ops::Range<u64> {
        let start = i << self.shift;
        start..(start + (1 << self.shift)).min(stored_len)
    }

    /// Checks `bytes`, the data from block `first` on (whole blocks, the last one possibly the
    /// chunk's short last block), against their checksums.
    fn check(&self, first: u64, bytes: &[u8], path: &Path) -> Result<()> {
        for (k, block) in bytes.chunks(1 << self.shift).enumerate() {
            let i = first + k as u64;
            if self.crcs.get(i as usize) != Some(&crc32c::crc32c(block)) {
                return Err(ImageError::Checksum {
                    kind: "chunk",
                    path: path.to_path_buf(),
                    detail: format!(" in data (block {i}, bytes {}..)", i << self.shift),
                });
            }
        }
        Ok(())
    }
}

/// crc32c(a ‖ b) from crc32c(a), crc32c(b) and b's length in bytes.
///
/// Written here rather than taken from the `crc32c` crate: its `crc32c_combine` is zlib's old
/// method, which works the operator for `len` zero bytes out again at each call (some 30
/// squarings of a 32×32 bit matrix, 20-40 us on this project's machines), and the pool combines
/// twice for every chunk it writes, on IO threads that share the CPUs with a frozen job's
/// capture. The operators for 2^k bytes are worked out once; a call applies one per bit set in
/// `len` (at most 32 exclusive-ors each).
pub fn crc32c_combine(a: u32, b: u32, len: u64) -> u32 {
    let operators = zero_operators();
    (0..64).filter(|k| len >> k & 1 == 1).fold(a, |crc, k| operators[k].apply(crc)) ^ b
}

/// What a crc goes through when some number of zero bytes follow the data it covers: the change
/// is linear over GF(2), so it is a 32×32 bit matrix, kept as its 32 columns (column k is the
/// image of bit k).
#[derive(Clone, Copy)]
struct ZeroOperator {
    columns: [u32; 32],
}

impl ZeroOperator {
    fn apply(&self, crc: u32) -> u32 {
        (0..32).filter(|k| crc >> k & 1 == 1).fold(0, |x, k| x ^ self.columns[k])
    }

    /// The operator for twice as many zero bytes: this one applied twice.
    fn squared(&self) -> ZeroOperator {
        ZeroOperator { columns: self.columns.map(|c| self.apply(c)) }
    }
}

/// The operators for 2^k zero bytes, k = 0..64.
fn zero_operators() -> &'static [ZeroOperator; 64] {
    static OPERATORS: OnceLock<[ZeroOperator; 64]> = OnceLock::new();
    OPERATORS.get_or_init(|| {
        // One byte: combine(a, 0, 1) is the operator applied to a (cheap for one byte).
        let mut operator = ZeroOperator { columns: std::array::from_fn(|k| crc32c::crc32c_combine(1 << k, 0, 1)) };
        std::array::from_fn(|_| {
            let this = operator;
            operator = operator.squared();
            this
        })
    })
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
    let named = path.file_name().and_then(|n| n.to_str()).and_then(parse_chunk_file_name);
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
        None => Err(ImageError::malformed(path, "not a chunk file name (expected p<pid>-<16-digit offset>)")),
    }
}

/// A chunk ready to be written: its header, the bytes to store after it, and its trailer.
#[derive(Debug)]
pub struct EncodedChunk<'a> {
    pub header: ChunkHeader,
    pub stored: &'a [u8],
    pub trailer: Vec<u8>,
}

impl ChunkHeader {
    /// The header of a chunk of this format holding `raw_len` bytes of process `pid`'s stream
    /// from `offset`, stored as `stored` in `codec`, and its trailer: a chunk stored raw gets
    /// block checksums ([`BlockTable`]), a compressed one only the whole data's.
    pub fn for_stored(pid: u32, offset: u64, raw_len: u64, codec: CodecId, stored: &[u8]) -> (ChunkHeader, Vec<u8>) {
        let (data_crc32c, block_shift, trailer) = match codec {
            CodecId::None => {
                let table = BlockTable::of(stored, BLOCK_SHIFT);
                (table.data_crc32c(stored.len() as u64), BLOCK_SHIFT, table.to_bytes())
            }
            CodecId::Zstd => (crc32c::crc32c(stored), 0, Vec::new()),
        };
        let header = ChunkHeader { version: FORMAT_VERSION, codec, pid, offset, raw_len, stored_len: stored.len() as u64, data_crc32c, block_shift };
        (header, trailer)
    }
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
        Ok(ChunkEncoder { codec, compressor, scratch: Vec::new() })
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Encodes `raw`, the stream bytes of process `pid` starting at `offset`. Compressed data
    /// that is not smaller than `raw` is dropped and `raw` is stored as is, so incompressible
    /// memory costs nothing at restart; a chunk whose samples do not compress is not compressed
    /// at all (`codec::worth_compressing`).
    pub fn encode<'a>(&'a mut self, pid: u32, offset: u64, raw: &'a [u8]) -> Result<EncodedChunk<'a>> {
        let name = || PathBuf::from(chunk_file_name(pid, offset));
        if raw.is_empty() || raw.len() as u64 > MAX_CHUNK_RAW_LEN {
            return Err(ImageError::Encode {
                path: name(),
                what: "chunk",
                detail: format!("{} bytes (a chunk holds 1..={MAX_CHUNK_RAW_LEN} bytes)", raw.len()),
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
            self.scratch.reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let n =
                c.compress_to_buffer(raw, &mut self.scratch).map_err(|e| ImageError::Encode { path: name(), what: "chunk", detail: format!("zstd: {e}") })?;
            if n < raw.len() {
                codec = CodecId::Zstd;
                stored = &self.scratch[..n];
            }
        }
        let (header, trailer) = ChunkHeader::for_stored(pid, offset, raw.len() as u64, codec, stored);
        Ok(EncodedChunk { header, stored, trailer })
    }
}

/// Writes `chunk` to `chunks_dir/p<pid>-<offset>` and fsyncs it (the directory is fsynced once
/// per batch by the caller). The name is final: no rename, since a generation's files exist only
/// once its manifest lists them. An existing file is an error, never overwritten.
pub fn write_chunk_file(chunks_dir: &Path, chunk: &EncodedChunk<'_>) -> Result<FileEntry> {
    let path = chunks_dir.join(chunk_file_name(chunk.header.pid, chunk.header.offset));
    fsutil::write_file_synced(&path, &[&chunk.header.to_bytes(), chunk.stored, &chunk.trailer], true)?;
    Ok(FileEntry { path: fsutil::gen_relative(&path), size: chunk.header.file_size(), crc32c: chunk.header.file_crc32c(&chunk.trailer) })
}

/// Reads and checks the header of the chunk file `path`, and that the file's size matches it.
pub fn read_chunk_header(path: &Path) -> Result<ChunkHeader> {
    let (mut f, len) = fsutil::open_with_len(path)?;
    read_header_from(&mut f, len, path)
}

fn read_header_from(f: &mut fs::File, file_len: u64, path: &Path) -> Result<ChunkHeader> {
    if file_len < CHUNK_HEADER_LEN as u64 {
        return Err(ImageError::truncated(path, format!("{file_len} bytes, shorter than the {CHUNK_HEADER_LEN}-byte chunk header")));
    }
    let mut h = [0u8; CHUNK_HEADER_LEN];
    fsutil::read_exact_or_truncated(f, path, &mut h, "chunk header")?;
    let header = ChunkHeader::parse(&h, path)?;
    let expected = header.file_size();
    if file_len < expected {
        return Err(ImageError::truncated(path, format!("header announces {expected} bytes, the file holds {file_len}")));
    }
    if file_len > expected {
        return Err(ImageError::malformed(path, format!("{} bytes after the chunk's end (file damaged or appended to?)", file_len - expected)));
    }
    Ok(header)
}

/// Raw chunks at least this long are mapped rather than read (see [`super::mapped`]); smaller
/// ones are not worth a mapping's setup.
const MAP_AT_LEAST: u64 = 256 * 1024;

/// A chunk's raw bytes, as [`ChunkDecoder::load`] hands them out.
pub enum ChunkBytes {
    /// A chunk stored raw, mapped from its file: the bytes are the page cache's, copied only
    /// where they are used. `len` is the data's length (the file's trailer follows it).
    Mapped { map: MappedFile, len: usize },
    /// A chunk decoded (or read) into memory.
    Owned(Vec<u8>),
}

impl ChunkBytes {
    /// The raw bytes of the chunk.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ChunkBytes::Mapped { map, len } => &map.bytes()[CHUNK_HEADER_LEN..CHUNK_HEADER_LEN + len],
            ChunkBytes::Owned(v) => v,
        }
    }

    /// Whether the bytes handed out so far were the file's: a mapped file that shrank since it
    /// was checked is reported as truncated (`path` names it), never used.
    pub fn check_intact(&self, path: &Path) -> Result<()> {
        match self {
            ChunkBytes::Mapped { map, .. } if !map.intact() => Err(shrank(path)),
            _ => Ok(()),
        }
    }

    /// The buffer to reuse for the next owned chunk.
    pub fn into_spare(self) -> Vec<u8> {
        match self {
            ChunkBytes::Mapped { .. } => Vec::new(),
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
    /// after checking its header, its size and the checksums of its data. Returns the header
    /// and the crc32c of the whole file.
    pub fn read(&mut self, path: &Path, out: &mut Vec<u8>) -> Result<(ChunkHeader, u32)> {
        let (mut f, len) = fsutil::open_with_len(path)?;
        let header = read_header_from(&mut f, len, path)?;
        let trailer = self.read_data(f, &header, path, out)?;
        Ok((header, header.file_crc32c(&trailer)))
    }

    /// The chunk file `path`'s raw bytes, checked as [`read`](Self::read) checks them: mapped
    /// when the chunk is stored raw and large enough, else read into `spare` (whose allocation
    /// is reused).
    pub fn load(&mut self, path: &Path, spare: Vec<u8>) -> Result<(ChunkHeader, ChunkBytes)> {
        let (mut f, len) = fsutil::open_with_len(path)?;
        let header = read_header_from(&mut f, len, path)?;
        if header.codec == CodecId::None && header.stored_len >= MAP_AT_LEAST {
            if let Some(map) = MappedFile::map(&f, len) {
                let (data, trailer) = map.bytes()[CHUNK_HEADER_LEN..].split_at(header.stored_len as usize);
                let checked = check_data(&header, data, trailer, path);
                let bytes = ChunkBytes::Mapped { map, len: header.stored_len as usize };
                bytes.check_intact(path)?;
                checked?;
                return Ok((header, bytes));
            }
        }
        let mut out = spare;
        self.read_data(f, &header, path, &mut out)?;
        Ok((header, ChunkBytes::Owned(out)))
    }

    /// Reads the data following the header from `f` into `out`, checks it and decodes it;
    /// returns the trailer.
    fn read_data(&mut self, mut f: fs::File, header: &ChunkHeader, path: &Path, out: &mut Vec<u8>) -> Result<Vec<u8>> {
        let stored_len = header.stored_len as usize;
        // Stored bytes go straight to `out` when they are the raw bytes, else to a staging buffer.
        let buf = match header.codec {
            CodecId::None => &mut *out,
            CodecId::Zstd => &mut self.stored,
        };
        buf.clear();
        buf.reserve_exact(stored_len + header.trailer_len() as usize);
        (&mut f).take(header.stored_len + header.trailer_len()).read_to_end(buf).map_err(|e| ImageError::io(path, "read", e))?;
        if buf.len() as u64 != header.stored_len + header.trailer_len() {
            return Err(shrank(path));
        }
        let trailer = buf.split_off(stored_len);
        check_data(header, buf, &trailer, path)?;
        if header.codec == CodecId::Zstd {
            let d = match self.decompressor.as_mut() {
                Some(d) => d,
                None => self.decompressor.insert(zstd::bulk::Decompressor::new().map_err(|e| ImageError::io(path, "create a zstd decompressor for", e))?),
            };
            out.clear();
            out.reserve_exact(header.raw_len as usize);
            let n = d.decompress_to_buffer(&self.stored[..], out).map_err(|e| ImageError::Decode {
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
        Ok(trailer)
    }

    /// Fills `out` with the chunk's raw bytes from `from` on, reading and checking only the
    /// blocks that hold them: for a chunk stored raw whose trailer is `table`.
    pub fn read_blocks(&mut self, path: &Path, header: &ChunkHeader, table: &BlockTable, from: u64, out: &mut [u8]) -> Result<()> {
        let end = from.checked_add(out.len() as u64).filter(|&e| e <= header.stored_len && header.codec == CodecId::None);
        let Some(end) = end.filter(|_| !out.is_empty()) else {
            return Err(ImageError::malformed(
                path,
                format!("bytes {from}.. ({} of them) are not in this chunk of {} raw bytes (bug)", out.len(), header.stored_len),
            ));
        };
        let (first, last) = (from >> table.shift, (end - 1) >> table.shift);
        let span = table.block(first, header.stored_len).start..table.block(last, header.stored_len).end;
        self.stored.resize((span.end - span.start) as usize, 0);
        let f = fs::File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
        read_exact_at(&f, path, &mut self.stored, CHUNK_HEADER_LEN as u64 + span.start)?;
        table.check(first, &self.stored, path)?;
        let at = (from - span.start) as usize;
        out.copy_from_slice(&self.stored[at..at + out.len()]);
        Ok(())
    }
}

/// A chunk file found shorter than it was when its header was read.
fn shrank(path: &Path) -> ImageError {
    ImageError::truncated(path, "file shrank while being read (is something else writing the image?)")
}

/// Reads exactly `buf.len()` bytes at `offset` of `f`; an early end is a truncated file.
fn read_exact_at(f: &fs::File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    f.read_exact_at(buf, offset).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => shrank(path),
        _ => ImageError::io(path, "read", e),
    })
}

/// Checks a chunk's stored bytes `data` against its header, block by block when it has a
/// `trailer` (which is checked against the header first).
fn check_data(header: &ChunkHeader, data: &[u8], trailer: &[u8], path: &Path) -> Result<()> {
    if header.block_shift == 0 {
        return match crc32c::crc32c(data) == header.data_crc32c {
            true => Ok(()),
            false => Err(data_checksum_error(path)),
        };
    }
    BlockTable::parse(trailer, header, path)?.check(0, data, path)
}

fn data_checksum_error(path: &Path) -> ImageError {
    ImageError::Checksum { kind: "chunk", path: path.to_path_buf(), detail: " in data".into() }
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
        assert_eq!(parse_chunk_file_name("p4242-0000000041943040"), Some((4242, 41943040)));
        assert_eq!(parse_chunk_file_name(&chunk_file_name(u32::MAX, u64::MAX)), Some((u32::MAX, u64::MAX)));
        assert_eq!(parse_chunk_file_name("p4242-41943040"), None);
        assert_eq!(parse_chunk_file_name("p4242-0000000041943040.tmp"), None);
        assert_eq!(parse_chunk_file_name("p+42-0000000041943040"), None);
        assert_eq!(parse_chunk_file_name("procs.bin"), None);
    }

    #[test]
    fn encode_write_read() {
        let dir = tempfile::tempdir().unwrap();
        let raw = pattern(300_000, 1);
        let noise: Vec<u8> = pattern(8192 * 4, 2).chunks(4096).skip(1).step_by(2).flatten().copied().collect();
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
                let expect = if codec == Codec::None || i == 1 { CodecId::None } else { CodecId::Zstd };
                assert_eq!(h.codec, expect, "{codec} {i}");
                let entry = write_chunk_file(&sub, &chunk).unwrap();
                let path = sub.join(chunk_file_name(pid, 1 << 20));
                let bytes = fs::read(&path).unwrap();
                assert_eq!(entry.size, bytes.len() as u64);
                assert_eq!(entry.crc32c, crc32c::crc32c(&bytes));
                assert_eq!(read_chunk_header(&path).unwrap(), h);
                assert_eq!(dec.read(&path, &mut out).unwrap(), (h, entry.crc32c));
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
            assert!(msg.starts_with(&format!("chunk {}", path.display())), "{msg}");
            assert!(msg.contains(want) && msg.contains("checksum mismatch"), "{msg}");
        }

        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(dec.read(&path, &mut out), Err(ImageError::Truncated { .. })));
        fs::write(&path, &good[..20]).unwrap();
        assert!(matches!(read_chunk_header(&path), Err(ImageError::Truncated { .. })));

        // A valid header whose raw length is absurd is refused before allocating.
        let mut h = ChunkHeader::parse(good[..CHUNK_HEADER_LEN].try_into().unwrap(), &path).unwrap();
        h.raw_len = u64::MAX / 2;
        let err = ChunkHeader::parse(&h.to_bytes(), &path).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
    }

    /// The combine worked out from stored operators gives the crc of the concatenation, and what
    /// the crate's own (slow) combine gives for lengths no buffer here could hold.
    #[test]
    fn combined_checksums_are_those_of_the_concatenation() {
        for (a_len, b_len) in [(0usize, 0usize), (0, 5), (7, 0), (1, 1), (100, 4096), (65536, 65537), (3, 1_000_003)] {
            let (a, b) = (pattern(a_len, 1), pattern(b_len, 2));
            let whole: Vec<u8> = a.iter().chain(&b).copied().collect();
            assert_eq!(crc32c_combine(crc32c::crc32c(&a), crc32c::crc32c(&b), b_len as u64), crc32c::crc32c(&whole), "{a_len} + {b_len}");
        }
        for len in [1u64 << 33, (1 << 40) + 12_345, u32::MAX as u64 * 3] {
            assert_eq!(crc32c_combine(0x1234_5678, 0x9abc_def0, len), crc32c::crc32c_combine(0x1234_5678, 0x9abc_def0, len as usize), "{len}");
        }
    }

    #[test]
    fn block_checksums_combine_to_the_whole() {
        for len in [1usize, 4095, 65536, 65537, 3 * 65536, 1_000_000] {
            let data = pattern(len, len as u64);
            let table = BlockTable::of(&data, BLOCK_SHIFT);
            assert_eq!(table.data_crc32c(len as u64), crc32c::crc32c(&data), "{len}");
            assert_eq!(BlockTable::of(&data, 12).data_crc32c(len as u64), crc32c::crc32c(&data), "{len} in 4 KiB");
        }
    }

    /// A raw chunk's trailer is checked against its header; a damaged block is named; a reader
    /// in part reads the blocks it needs; a file of format 10 (no trailer) still reads.
    #[test]
    fn trailers() {
        let dir = tempfile::tempdir().unwrap();
        let raw = pattern(300_000, 9);
        let mut enc = ChunkEncoder::new(Codec::None).unwrap();
        let chunk = enc.encode(7, 0, &raw).unwrap();
        assert_eq!((chunk.header.block_shift, chunk.trailer.len()), (BLOCK_SHIFT, 5 * 4));
        write_chunk_file(dir.path(), &chunk).unwrap();
        let path = dir.path().join(chunk_file_name(7, 0));
        let good = fs::read(&path).unwrap();
        let mut dec = ChunkDecoder::new();
        let header = read_chunk_header(&path).unwrap();
        let table = BlockTable::read(&path, &header).unwrap();
        for (from, len) in [(0u64, 1usize), (65535, 2), (299_999, 1), (70_000, 200_000)] {
            let mut out = vec![0; len];
            dec.read_blocks(&path, &header, &table, from, &mut out).unwrap();
            assert_eq!(out, &raw[from as usize..from as usize + len]);
        }
        assert!(dec.read_blocks(&path, &header, &table, 299_999, &mut [0; 2]).is_err());

        let mut out = Vec::new();
        let trailer_at = CHUNK_HEADER_LEN + raw.len();
        for (at, want) in [(trailer_at + 5, "in block checksums"), (CHUNK_HEADER_LEN + 2 * 65536 + 3, "block 2")] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            fs::write(&path, &bad).unwrap();
            let err = dec.load(&path, Vec::new()).err().unwrap();
            assert!(err.to_string().contains(want), "{err}");
            let err = dec.read(&path, &mut out).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }

        // Format 10: no trailer, header bytes 20..24 zero.
        let mut old = chunk.header;
        old.version = 10;
        old.block_shift = 0;
        fs::write(&path, [&old.to_bytes()[..], &raw].concat()).unwrap();
        let (h, crc) = dec.read(&path, &mut out).unwrap();
        assert_eq!((h, out.as_slice()), (old, raw.as_slice()));
        assert_eq!(crc, crc32c::crc32c(&fs::read(&path).unwrap()));
        // A trailer in a format 10 file, or on a compressed chunk, is refused.
        for (version, codec) in [(10, CodecId::None), (FORMAT_VERSION, CodecId::Zstd)] {
            let h = ChunkHeader { version, codec, stored_len: 1000, ..chunk.header };
            assert!(ChunkHeader::parse(&h.to_bytes(), &path).is_err(), "{version} {codec:?}");
        }
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
