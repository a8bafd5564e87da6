//! Record files: one serde value per file (the process tree, per-process metadata, ...).
//!
//! Layout (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8   | magic, chosen by the writer (`b"CKPTPROC"`, ...) |
//! | 8..12  | format version ([`FORMAT_VERSION`]) |
//! | 12..20 | payload length |
//! | 20..24 | crc32c of the payload |
//! | 24..   | payload: the value, serialized with postcard |

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{ImageError, Result};
use super::fsutil;
use super::{FORMAT_VERSION, OLDEST_FORMAT_VERSION};

/// Length of a record file's header.
pub const RECORD_HEADER_LEN: usize = 24;

/// One file of a generation as the manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the generation directory, `/`-separated: `n0/procs.bin`.
    pub path: String,
    /// Size of the whole file in bytes.
    pub size: u64,
    /// crc32c of the whole file, headers included.
    pub crc32c: u32,
}

/// Serializes `value` into the record file `path`, atomically (through `path.tmp`, fsync,
/// rename, fsync of the directory).
///
/// The returned entry's path is relative to the generation directory that encloses `path`
/// (found by its `gen-NNNNNN` name); outside a generation it is `path` as given.
pub fn write_record_file<T: Serialize + ?Sized>(path: &Path, magic: [u8; 8], value: &T) -> Result<FileEntry> {
    let payload = postcard::to_stdvec(value).map_err(|e| ImageError::Encode { path: path.to_path_buf(), what: "record", detail: e.to_string() })?;
    let header = encode_header(magic, &payload);
    fsutil::write_file_atomic(path, &[&header, &payload])?;
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header), &payload);
    Ok(FileEntry { path: fsutil::gen_relative(path), size: (header.len() + payload.len()) as u64, crc32c: crc })
}

fn encode_header(magic: [u8; 8], payload: &[u8]) -> [u8; RECORD_HEADER_LEN] {
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..8].copy_from_slice(&magic);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..20].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[20..24].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    h
}

/// Reads the record file `path`, written with the same `magic`.
///
/// The payload length is checked against `max_len` and the file's real size before anything is
/// allocated, so a damaged or hostile file cannot make the reader allocate more than `max_len`.
pub fn read_record_file<T: DeserializeOwned>(path: &Path, magic: [u8; 8], max_len: u64) -> Result<T> {
    read_record_file_as(path, magic, max_len, |_, payload| decode_payload(path, payload))
}

/// Reads the record file `path` as [`read_record_file`] does, but decodes its checked payload
/// with `decode`, which is given the file's format version: for a record whose layout changed
/// between the versions this ckpt reads (postcard is positional: an older layout does not
/// decode as the newer one).
pub fn read_record_file_as<T>(path: &Path, magic: [u8; 8], max_len: u64, decode: impl FnOnce(u32, &[u8]) -> Result<T>) -> Result<T> {
    let (mut f, file_len) = fsutil::open_with_len(path)?;
    let mut h = [0u8; RECORD_HEADER_LEN];
    if file_len < RECORD_HEADER_LEN as u64 {
        return Err(ImageError::truncated(path, format!("{file_len} bytes, shorter than the {RECORD_HEADER_LEN}-byte record header")));
    }
    fsutil::read_exact_or_truncated(&mut f, path, &mut h, "record header")?;
    let RecordHeader { version, payload_len, crc } = RecordHeader::parse(path, &h, magic, max_len)?;
    let on_disk = file_len - RECORD_HEADER_LEN as u64;
    if on_disk < payload_len {
        return Err(ImageError::truncated(path, format!("header announces {payload_len} payload bytes, the file holds {on_disk}")));
    }
    if on_disk > payload_len {
        return Err(ImageError::malformed(
            path,
            format!("{} bytes after the {payload_len}-byte payload (file damaged or appended to?)", on_disk - payload_len),
        ));
    }

    let mut payload = vec![0u8; payload_len as usize];
    fsutil::read_exact_or_truncated(&mut f, path, &mut payload, "record payload")?;
    check_payload(path, &payload, crc)?;
    super::since::decoding(version, || decode(version, &payload))
}

/// A record file's header, checked: its magic, a version this ckpt reads, a payload length
/// within the reader's bound.
struct RecordHeader {
    version: u32,
    payload_len: u64,
    crc: u32,
}

impl RecordHeader {
    fn parse(path: &Path, h: &[u8; RECORD_HEADER_LEN], magic: [u8; 8], max_len: u64) -> Result<RecordHeader> {
        check_magic(path, &h[0..8], &magic, "ckpt record file")?;
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        check_version(path, version)?;
        let payload_len = u64::from_le_bytes(h[12..20].try_into().expect("8 bytes"));
        if payload_len > max_len {
            return Err(ImageError::TooLarge { path: path.to_path_buf(), what: "record payload", len: payload_len, max: max_len });
        }
        Ok(RecordHeader { version, payload_len, crc: u32::from_le_bytes(h[20..24].try_into().expect("4 bytes")) })
    }
}

/// Checks the crc of a record's payload.
fn check_payload(path: &Path, payload: &[u8], crc: u32) -> Result<()> {
    if crc32c::crc32c(payload) != crc {
        return Err(ImageError::Checksum { kind: "record file", path: path.to_path_buf(), detail: " in payload".into() });
    }
    Ok(())
}

/// Decodes a record's checked payload (`path` is for messages only); the whole payload must be
/// used.
pub fn decode_payload<T: DeserializeOwned>(path: &Path, payload: &[u8]) -> Result<T> {
    let (value, rest) =
        postcard::take_from_bytes(payload).map_err(|e| ImageError::Decode { path: path.to_path_buf(), what: "record", detail: e.to_string() })?;
    if !rest.is_empty() {
        return Err(ImageError::malformed(path, format!("{} payload bytes left after the record (written by an incompatible ckpt?)", rest.len())));
    }
    Ok(value)
}

/// A record file's whole contents, checked and decoded as [`read_record_file`] does with a file
/// (`path` is for messages only). For fuzzing and tests, which have the bytes in memory.
pub fn decode_record<T: DeserializeOwned>(bytes: &[u8], path: &Path, magic: [u8; 8], max_len: u64) -> Result<T> {
    decode_record_as(bytes, path, magic, max_len, |_, payload| decode_payload(path, payload))
}

/// [`decode_record`] with a decoder given the format version, as [`read_record_file_as`].
pub fn decode_record_as<T>(bytes: &[u8], path: &Path, magic: [u8; 8], max_len: u64, decode: impl FnOnce(u32, &[u8]) -> Result<T>) -> Result<T> {
    let Some((h, payload)) = bytes.split_first_chunk::<RECORD_HEADER_LEN>() else {
        return Err(ImageError::truncated(path, format!("{} bytes, shorter than the {RECORD_HEADER_LEN}-byte record header", bytes.len())));
    };
    let RecordHeader { version, payload_len, crc } = RecordHeader::parse(path, h, magic, max_len)?;
    if payload.len() as u64 != payload_len {
        return Err(ImageError::malformed(path, format!("header announces {payload_len} payload bytes, the file holds {}", payload.len())));
    }
    check_payload(path, payload, crc)?;
    super::since::decoding(version, || decode(version, payload))
}

/// The header and payload of a record file holding `payload`: for tests that forge records with
/// valid checksums.
pub fn encode_record(magic: [u8; 8], payload: &[u8]) -> Vec<u8> {
    let mut out = encode_header(magic, payload).to_vec();
    out.extend_from_slice(payload);
    out
}

/// Refuses a file whose first 8 bytes are not `expected`.
pub(crate) fn check_magic(path: &Path, found: &[u8], expected: &[u8], kind: &'static str) -> Result<()> {
    if found == expected {
        return Ok(());
    }
    Err(ImageError::BadMagic { path: path.to_path_buf(), expected: kind, found: looks_like(found) })
}

/// What a file's first bytes suggest it is, in words, for a refusal (pure).
pub(crate) fn looks_like(start: &[u8]) -> &'static str {
    const KNOWN: [(&[u8], &str); 6] = [
        (b"\x28\xb5\x2f\xfd", "it is a zstd stream"),
        (b"\x7fELF", "it is an ELF file"),
        (b"\x1f\x8b", "it is a gzip stream"),
        (b"{", "it looks like JSON"),
        (b"CKPT", "it is a ckpt file of another kind"),
        (b"#!", "it is a script"),
    ];
    if start.is_empty() {
        return "it is empty";
    }
    if let Some((_, what)) = KNOWN.iter().find(|(magic, _)| start.starts_with(magic)) {
        return what;
    }
    if start.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) {
        "it starts with text"
    } else if start.iter().all(|&b| b == 0) {
        "it starts with zeros"
    } else {
        "it starts with other bytes"
    }
}

/// Accepts every version this ckpt can read: [`OLDEST_FORMAT_VERSION`] ..= [`FORMAT_VERSION`].
pub(crate) fn check_version(path: &Path, version: u32) -> Result<()> {
    if version == 0 {
        return Err(ImageError::malformed(path, "format version 0 is invalid (file damaged?)"));
    }
    if version < OLDEST_FORMAT_VERSION {
        return Err(ImageError::OlderFormat { path: path.to_path_buf(), found: version, oldest: OLDEST_FORMAT_VERSION, supported: FORMAT_VERSION });
    }
    if version > FORMAT_VERSION {
        return Err(ImageError::NewerFormat { path: path.to_path_buf(), found: version, supported: FORMAT_VERSION });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    const MAGIC: [u8; 8] = *b"CKPTTEST";

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        name: String,
        pids: Vec<u32>,
        nested: Option<Box<Rec>>,
    }

    fn sample() -> Rec {
        Rec { name: "sim".into(), pids: vec![1, 2, 4242], nested: Some(Box::new(Rec { name: "child".into(), pids: vec![], nested: None })) }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let gen = dir.path().join("gen-000003").join("n0");
        fs::create_dir_all(&gen).unwrap();
        let path = gen.join("procs.bin");
        let entry = write_record_file(&path, MAGIC, &sample()).unwrap();
        assert_eq!(entry.path, "n0/procs.bin");
        let bytes = fs::read(&path).unwrap();
        assert_eq!(entry.size, bytes.len() as u64);
        assert_eq!(entry.crc32c, crc32c::crc32c(&bytes));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!fsutil::tmp_path(&path).exists());
        let back: Rec = read_record_file(&path, MAGIC, 1 << 20).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn truncated_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("procs.bin");
        write_record_file(&path, MAGIC, &sample()).unwrap();
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::Truncated { .. }), "{err}");
        assert!(err.to_string().contains("procs.bin"), "{err}");
        fs::write(&path, &bytes[..10]).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::Truncated { .. }), "{err}");
    }

    /// A file of the wrong kind is named for what it looks like, its bytes never quoted.
    #[test]
    fn wrong_kind_named_not_quoted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("procs.bin");
        fs::write(&path, b"root:x:0:0:secret:/root:/bin/sh\n").unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::BadMagic { .. }), "{err}");
        assert!(err.to_string().contains("starts with text") && !err.to_string().contains("root:x"), "{err}");
        assert_eq!(looks_like(b"\x28\xb5\x2f\xfd\0\0\0\0"), "it is a zstd stream");
        assert_eq!(looks_like(b""), "it is empty");
    }

    #[test]
    fn damage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("procs.bin");
        write_record_file(&path, MAGIC, &sample()).unwrap();
        let good = fs::read(&path).unwrap();

        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 0x40;
        fs::write(&path, &bad).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::Checksum { .. }), "{err}");

        let err = read_record_file::<Rec>(&path, *b"CKPTOTHR", 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::BadMagic { .. }), "{err}");

        let mut newer = good.clone();
        newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        fs::write(&path, &newer).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("written by a newer ckpt"), "{err}");

        // A huge announced length is refused before allocating.
        let mut huge = good.clone();
        huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        fs::write(&path, &huge).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
        fs::write(&path, &good).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 4).unwrap_err();
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");

        let mut longer = good.clone();
        longer.push(0);
        fs::write(&path, &longer).unwrap();
        let err = read_record_file::<Rec>(&path, MAGIC, 1 << 20).unwrap_err();
        assert!(matches!(err, ImageError::Malformed { .. }), "{err}");
    }
}
