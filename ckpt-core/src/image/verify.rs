//! `ckpt verify`: does every byte of a generation still hold?

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chunk::{check_chunk_name, parse_chunk_file_name, ChunkDecoder};
use super::error::{ImageError, Result};
use super::fsutil;
use super::manifest::{Manifest, MANIFEST_NAME};
use super::stream::{check_contiguous, ChunkLoc};

/// Name of the directory that holds a node's chunk files.
pub const CHUNKS_DIR_NAME: &str = "chunks";

/// What `verify_generation` checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub generation: u64,
    pub nodes: Vec<String>,
    /// Files listed in the manifest, all checked.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// How many of them are chunk files.
    pub chunk_files: u64,
    /// Chunk data as stored (compressed), headers excluded.
    pub bytes_stored: u64,
    /// Chunk data once decompressed: the total of every process's stream.
    pub bytes_raw: u64,
    /// Every process stream found, in chunks-directory and pid order.
    pub streams: Vec<StreamSummary>,
    /// Files present in the generation directory but not listed in the manifest (relative paths).
    /// Not an error by themselves, but nothing should put them there.
    pub unlisted: Vec<String>,
    /// Nodes whose part is on their own host's storage (a node-local level) and not on this
    /// host: their files are not checked here.
    pub elsewhere: Vec<String>,
}

/// One process's stream, as verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamSummary {
    /// The chunks directory, relative to the generation directory (`n0/chunks`).
    pub chunks_dir: String,
    pub pid: u32,
    pub chunks: u64,
    pub bytes: u64,
}

/// Checks the generation in `gen_dir`: its manifest, the size and crc32c of every listed file,
/// the header and data checksum of every chunk file (decompressing it), and that each process's
/// stream has no gap or overlap. Stops at the first damaged file, naming it.
pub fn verify_generation(gen_dir: &Path) -> Result<VerifyReport> {
    let manifest = Manifest::load(gen_dir)?;
    let mut report = VerifyReport { generation: manifest.generation, nodes: manifest.nodes.clone(), ..VerifyReport::default() };
    let mut listed = BTreeSet::new();
    let mut streams: BTreeMap<(PathBuf, u32), Vec<ChunkLoc>> = BTreeMap::new();
    let mut decoder = ChunkDecoder::new();
    let mut scratch = Vec::new();

    let mut chunk_dir_names: BTreeMap<PathBuf, String> = BTreeMap::new();
    let parts = super::PartFiles::read(&manifest, gen_dir)?;
    for entry in parts.all() {
        let path = manifest.resolve_file(gen_dir, &entry.path)?;
        let node = entry.path.split('/').next().unwrap_or_default();
        if manifest.is_node_local(&entry.path) && !manifest.part_dir(gen_dir, node).is_dir() {
            if !report.elsewhere.iter().any(|n| n == node) {
                report.elsewhere.push(node.to_string());
            }
            continue;
        }
        let rel = normalized(&fsutil::resolve_listed(gen_dir, &entry.path)?, gen_dir);
        if !listed.insert(rel.clone()) {
            return Err(ImageError::malformed(gen_dir.join(MANIFEST_NAME), format!("lists {} twice (manifest damaged?)", entry.path)));
        }
        let size = check_listed_file(&path, entry.size)?;
        report.files += 1;
        report.bytes += size;

        if let Some(chunks_dir) = chunk_file_dir(&path) {
            if let Some((dir_rel, _)) = rel.rsplit_once('/') {
                chunk_dir_names.insert(chunks_dir.clone(), dir_rel.to_string());
            }
            let (header, file_crc32c) = decoder.read(&path, &mut scratch)?;
            check_chunk_name(&path, &header)?;
            if file_crc32c != entry.crc32c {
                return Err(checksum_vs_manifest("chunk", path));
            }
            report.chunk_files += 1;
            report.bytes_stored += header.stored_len;
            report.bytes_raw += header.raw_len;
            streams.entry((chunks_dir, header.pid)).or_default().push(ChunkLoc { path, header });
        } else if file_crc32c(&path)? != entry.crc32c {
            return Err(checksum_vs_manifest("file", path));
        }
    }

    for ((chunks_dir, pid), mut chunks) in streams {
        let bytes = check_contiguous(&chunks_dir, pid, &mut chunks)?;
        report.streams.push(StreamSummary {
            chunks_dir: chunk_dir_names.get(&chunks_dir).cloned().unwrap_or_else(|| normalized(&chunks_dir, gen_dir)),
            pid,
            chunks: chunks.len() as u64,
            bytes,
        });
    }

    let mut on_disk = Vec::new();
    list_files(gen_dir, gen_dir, &mut on_disk)?;
    report.unlisted = on_disk.into_iter().filter(|rel| rel != MANIFEST_NAME && !listed.contains(rel)).collect();
    report.unlisted.sort();
    Ok(report)
}

fn checksum_vs_manifest(kind: &'static str, path: PathBuf) -> ImageError {
    ImageError::Checksum { kind, path, detail: " against the manifest".into() }
}

/// The chunks directory of `path` if `path` is named and placed as a chunk file.
fn chunk_file_dir(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    parse_chunk_file_name(name)?;
    let dir = path.parent()?;
    (dir.file_name()? == CHUNKS_DIR_NAME).then(|| dir.to_path_buf())
}

/// `path` relative to `gen_dir`, `/`-separated, without `.` components.
/// The listed file at `path` is a regular file of `expected` bytes; returns its size.
fn check_listed_file(path: &Path, expected: u64) -> Result<u64> {
    let size = match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Err(ImageError::malformed(path, "is not a regular file (replaced after the checkpoint?)")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ImageError::Missing { path: path.to_path_buf() }),
        Err(e) => return Err(ImageError::io(path, "stat", e)),
    };
    if size != expected {
        return Err(ImageError::SizeMismatch { path: path.to_path_buf(), expected, found: size });
    }
    Ok(size)
}

/// Every file of `node`'s part (listed by the manifest or by the node's index) is present, a
/// regular file, of its listed size (no checksum: reading checks those). Cheap, one stat per
/// file: restart calls it first, so that a deleted or truncated file is named as such, not
/// found later as a gap in a stream.
pub fn check_node_files_present(gen_dir: &Path, manifest: &Manifest, node: &str) -> Result<()> {
    let parts = super::PartFiles::read_node(manifest, gen_dir, node)?;
    for entry in parts.of(node) {
        check_listed_file(&manifest.resolve_file(gen_dir, &entry.path)?, entry.size)?;
    }
    Ok(())
}

fn normalized(path: &Path, gen_dir: &Path) -> String {
    let rel = path.strip_prefix(gen_dir).unwrap_or(path);
    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

fn file_crc32c(path: &Path) -> Result<u32> {
    let mut f = fs::File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(crc),
            Ok(n) => crc = crc32c::crc32c_append(crc, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::io(path, "read", e)),
        }
    }
}

/// Every non-directory below `dir`, relative to `gen_dir`. Symbolic links are listed, not followed.
fn list_files(dir: &Path, gen_dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| ImageError::io(dir, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::io(dir, "list", e))?;
        let path = entry.path();
        let ty = entry.file_type().map_err(|e| ImageError::io(&path, "stat", e))?;
        if ty.is_dir() {
            list_files(&path, gen_dir, out)?;
        } else {
            out.push(normalized(&path, gen_dir));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::chunk::{chunk_file_name, write_chunk_file, ChunkEncoder};
    use crate::image::generation::CheckpointDir;
    use crate::image::record::write_record_file;
    use crate::image::Codec;

    /// Commits a generation with a record file, two streams and the node's index of their
    /// chunks, as an agent writes it; returns its directory.
    fn make_gen(root: &Path) -> PathBuf {
        let cd = CheckpointDir::create(root).unwrap();
        let g = cd.begin(2).unwrap();
        let mut m = Manifest::new(2, vec!["n0".into()]);
        m.files.push(write_record_file(&g.node_dir("n0").unwrap().join("procs.bin"), *b"CKPTTEST", &"tree").unwrap());
        let chunks = g.chunks_dir("n0").unwrap();
        let mut enc = ChunkEncoder::new(Codec::Zstd(1)).unwrap();
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 97) as u8).collect();
        let mut index = crate::image::PartIndex { generation: 2, node: "n0".into(), files: Vec::new() };
        for pid in [10, 11] {
            for off in (0..50_000).step_by(20_000) {
                let end = (off + 20_000).min(50_000);
                let c = enc.encode(pid, off as u64, &data[off..end]).unwrap();
                index.files.push(write_chunk_file(&chunks, &c).unwrap());
            }
        }
        m.files.push(index.write(&g.node_dir("n0").unwrap()).unwrap());
        g.commit(&m).unwrap();
        cd.gen_dir(2)
    }

    #[test]
    fn good_generation() {
        let dir = tempfile::tempdir().unwrap();
        let gen = make_gen(dir.path());
        let r = verify_generation(&gen).unwrap();
        assert_eq!(r.generation, 2);
        assert_eq!(r.files, 8);
        assert_eq!(r.chunk_files, 6);
        assert_eq!(r.bytes_raw, 100_000);
        assert!(r.bytes_stored < r.bytes_raw);
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.streams[0].chunks_dir, "n0/chunks");
        assert_eq!((r.streams[0].pid, r.streams[0].chunks, r.streams[0].bytes), (10, 3, 50_000));
        assert!(r.unlisted.is_empty());

        fs::write(gen.join("n0/stray"), b"?").unwrap();
        let r = verify_generation(&gen).unwrap();
        assert_eq!(r.unlisted, vec!["n0/stray".to_string()]);
    }

    #[test]
    fn damaged_chunk_named() {
        let dir = tempfile::tempdir().unwrap();
        let gen = make_gen(dir.path());
        let path = gen.join("n0/chunks").join(chunk_file_name(11, 20_000));
        let mut bytes = fs::read(&path).unwrap();
        bytes[70] ^= 4;
        fs::write(&path, &bytes).unwrap();
        let err = verify_generation(&gen).unwrap_err();
        assert_eq!(err.to_string(), format!("chunk {}: checksum mismatch in data (file damaged?)", path.display()));
    }

    #[test]
    fn missing_and_damaged_files_named() {
        let dir = tempfile::tempdir().unwrap();
        let gen = make_gen(dir.path());
        let procs = gen.join("n0/procs.bin");
        let mut bytes = fs::read(&procs).unwrap();
        bytes[0] ^= 1;
        fs::write(&procs, &bytes).unwrap();
        let err = verify_generation(&gen).unwrap_err();
        assert!(matches!(err, ImageError::Checksum { kind: "file", .. }), "{err}");
        assert!(err.to_string().contains("procs.bin"), "{err}");

        bytes[0] ^= 1;
        fs::write(&procs, &bytes).unwrap();
        let chunk = gen.join("n0/chunks").join(chunk_file_name(10, 40_000));
        fs::remove_file(&chunk).unwrap();
        let err = verify_generation(&gen).unwrap_err();
        assert!(matches!(err, ImageError::Missing { .. }), "{err}");
        assert!(err.to_string().contains(&chunk_file_name(10, 40_000)), "{err}");
    }
}
