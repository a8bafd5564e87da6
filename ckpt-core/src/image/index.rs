//! A node's index of its part: every file of the part but its records (`index.bin`, a record
//! file beside `procs.bin`), so that the manifest lists three files a node instead of all of
//! them (format 29; docs/IMAGE-FORMAT.md, "The node index").
//!
//! Why: a node of 64 ranks stores a chunk file or more a rank each checkpoint; a manifest of
//! 4,096 such nodes listed 270,000 files (30 MiB of JSON, written by one process, parsed by every
//! reader, and every file `stat`ed by the coordinator at the commit). Each node checks and makes
//! durable its own files already, in parallel with the others; the coordinator now checks only
//! what the manifest lists. A reader that needs a part's files reads them through [`PartFiles`],
//! which reads each listed index, checked against the manifest's size and crc32c for it: an
//! index is as trustworthy as the manifest, and a node's index names only files of its own part.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ImageError, Result};
use super::fsutil;
use super::manifest::{Manifest, MANIFEST_NAME, SHARED_RECORDS};
use super::record::{decode_record, write_record_file, FileEntry};

/// The node index's file name in a node's directory (one of [`SHARED_RECORDS`]).
pub const INDEX_FILE: &str = "index.bin";
const INDEX_MAGIC: [u8; 8] = *b"CKPTINDX";
/// Bound on an index's payload, as on the manifest: about 570,000 files of a node.
const INDEX_MAX: u64 = super::MAX_MANIFEST_LEN;
/// Bound on the indexes one reader takes in (`PartFiles::read` of every node): 20 million
/// files or so, held in memory at once.
const MAX_INDEXES_LEN: u64 = 1 << 30;
/// The format version whose manifests list each node's index in place of its other files.
pub const INDEX_SINCE: u32 = 29;

/// The files of a node's part that its records are not (its chunk files), each with its size
/// and crc32c, in the order the node wrote them (the order of its XOR
/// stream, `image::xor`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartIndex {
    pub generation: u64,
    pub node: String,
    pub files: Vec<FileEntry>,
}

impl PartIndex {
    /// Writes the index into `node_dir` (durably, as every record); its entry for the manifest.
    pub fn write(&self, node_dir: &Path) -> Result<FileEntry> {
        write_record_file(&node_dir.join(INDEX_FILE), INDEX_MAGIC, self)
    }

    /// Reads the index the manifest lists as `entry` (its path `<node>/index.bin`, in `gen_dir`)
    /// and checks it: the bytes the manifest vouches for (size and crc32c of the whole file),
    /// the generation and node it says, and every file it names a plain path inside that
    /// node's part, not one of its records, listed once.
    pub fn read(gen_dir: &Path, manifest: &Manifest, node: &str, entry: &FileEntry) -> Result<PartIndex> {
        let path = manifest.resolve_file(gen_dir, &entry.path)?;
        if entry.size > INDEX_MAX + super::RECORD_HEADER_LEN as u64 {
            return Err(ImageError::TooLarge { path, what: "node index", len: entry.size, max: INDEX_MAX });
        }
        let (f, len) = fsutil::open_with_len(&path)?;
        if len != entry.size {
            return Err(ImageError::SizeMismatch { path, expected: entry.size, found: len });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        f.take(len).read_to_end(&mut bytes).map_err(|e| ImageError::io(&path, "read", e))?;
        if crc32c::crc32c(&bytes) != entry.crc32c {
            return Err(ImageError::Checksum { kind: "node index", path, detail: format!(" (not the file {MANIFEST_NAME} lists)") });
        }
        PartIndex::from_bytes(&bytes, &path, manifest.generation, node)
    }

    /// An index file's whole contents (`path` for messages only), checked as [`PartIndex::read`]
    /// does past the manifest's checksum: the record's header and checksum, and that it is
    /// `node`'s index of `generation` naming only files of that node's part. For the fuzz
    /// target, and `read`.
    pub fn from_bytes(bytes: &[u8], path: &Path, generation: u64, node: &str) -> Result<PartIndex> {
        let index: PartIndex = decode_record(bytes, path, INDEX_MAGIC, INDEX_MAX)?;
        index.check(path, generation, node)?;
        Ok(index)
    }

    /// The record of `index` as written on disk, for tests and fuzz seeds.
    pub fn to_bytes(&self) -> Vec<u8> {
        super::record::encode_record(INDEX_MAGIC, &postcard::to_stdvec(self).unwrap_or_default())
    }

    fn check(&self, path: &Path, generation: u64, node: &str) -> Result<()> {
        let invalid = |place: String, problem: String| ImageError::Invalid { path: path.to_path_buf(), place, problem };
        if self.generation != generation || self.node != node {
            return Err(invalid(
                "header".into(),
                format!("the index of node {:?} of generation {}, found as node {node:?}'s of generation {generation}", self.node, self.generation),
            ));
        }
        let prefix = format!("{node}/");
        let mut seen = std::collections::HashSet::with_capacity(self.files.len());
        for f in &self.files {
            let inner = f.path.strip_prefix(&prefix).filter(|inner| !inner.is_empty());
            match inner {
                None => return Err(invalid(format!("file {:?}", f.path), format!("is not in node {node}'s part"))),
                Some(inner) if SHARED_RECORDS.contains(&inner) => {
                    return Err(invalid(format!("file {:?}", f.path), "is one of the node's records, which the manifest lists itself".into()))
                }
                // Segment by segment, not `Path::components`, which drops `.` and empty
                // segments: `n0/./procs.bin` would pass for a chunk and `n0//a` for a second name.
                Some(_) if f.path.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") => {
                    return Err(invalid(format!("file {:?}", f.path), "is not a plain path inside the generation directory".into()))
                }
                Some(_) => {}
            }
            if !seen.insert(f.path.as_str()) {
                return Err(invalid(format!("file {:?}", f.path), "listed twice".into()));
            }
        }
        Ok(())
    }
}

/// Every file of every part of a generation: what its manifest lists, and what the node
/// indexes it lists add (read and checked by [`PartFiles::read`]). A generation of a format
/// before 29 has no index: its manifest lists every file.
#[derive(Debug, Default)]
pub struct PartFiles {
    /// By node, the records first, as the manifest lists them, then the index's files.
    by_node: BTreeMap<String, Vec<FileEntry>>,
    /// Listed files under no node of the generation (none in what ckpt writes).
    other: Vec<FileEntry>,
}

impl PartFiles {
    /// Reads every node index `manifest` (of `gen_dir`) lists.
    pub fn read(manifest: &Manifest, gen_dir: &Path) -> Result<PartFiles> {
        PartFiles::read_where(manifest, gen_dir, |_| true)
    }

    /// Only `node`'s part: one index read, where a restart of that node needs no other.
    pub fn read_node(manifest: &Manifest, gen_dir: &Path, node: &str) -> Result<PartFiles> {
        PartFiles::read_where(manifest, gen_dir, |n| n == node)
    }

    /// Only the parts of `nodes` (an XOR group's).
    pub fn read_nodes(manifest: &Manifest, gen_dir: &Path, nodes: &[String]) -> Result<PartFiles> {
        PartFiles::read_where(manifest, gen_dir, |n| nodes.iter().any(|m| m == n))
    }

    fn read_where(manifest: &Manifest, gen_dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<PartFiles> {
        let mut parts = PartFiles::default();
        // Thousands of nodes, a few files each: a set, not a scan of the list per file.
        let nodes: std::collections::HashSet<&str> = manifest.nodes.iter().map(String::as_str).collect();
        for f in &manifest.files {
            match f.path.split_once('/').map(|(node, _)| node).filter(|n| nodes.contains(n)) {
                Some(node) if wanted(node) => parts.by_node.entry(node.to_string()).or_default().push(f.clone()),
                Some(_) => {}
                None => parts.other.push(f.clone()),
            }
        }
        let mut total = 0u64;
        for (node, files) in &mut parts.by_node {
            let index_path = format!("{node}/{INDEX_FILE}");
            match files.iter().find(|f| f.path == index_path).cloned() {
                Some(entry) => {
                    // Each index is bounded; so is what one reader holds of all of them.
                    total = total.saturating_add(entry.size);
                    if total > MAX_INDEXES_LEN {
                        return Err(ImageError::TooLarge {
                            path: gen_dir.join(&entry.path),
                            what: "node indexes, all together",
                            len: total,
                            max: MAX_INDEXES_LEN,
                        });
                    }
                    let index = PartIndex::read(gen_dir, manifest, node, &entry)?;
                    files.extend(index.files);
                }
                // A node's files are in its index from format 29 on: without one, its chunk
                // files would be missed, not refused.
                None if manifest.format_version >= INDEX_SINCE => {
                    return Err(ImageError::Invalid {
                        path: gen_dir.join(MANIFEST_NAME),
                        place: format!("node {node:?}"),
                        problem: format!("lists no {INDEX_FILE} of the node (every node has one since format {INDEX_SINCE})"),
                    })
                }
                None => {}
            }
        }
        Ok(parts)
    }

    /// The files of `node`'s part (none for a node the generation does not have).
    pub fn of(&self, node: &str) -> &[FileEntry] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// Every file, node after node.
    pub fn all(&self) -> impl Iterator<Item = &FileEntry> {
        self.by_node.values().flatten().chain(&self.other)
    }

    pub fn count(&self) -> usize {
        self.by_node.values().map(Vec::len).sum::<usize>() + self.other.len()
    }

    pub fn total_bytes(&self) -> u64 {
        self.all().fold(0u64, |acc, f| acc.saturating_add(f.size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, size: u64) -> FileEntry {
        FileEntry { path: path.into(), size, crc32c: 7 }
    }

    /// A generation of one node `n0` with its records listed and `index` written.
    fn generation(index: &PartIndex) -> (tempfile::TempDir, std::path::PathBuf, Manifest) {
        let dir = tempfile::tempdir().unwrap();
        let gen = dir.path().join("gen-000003");
        std::fs::create_dir_all(gen.join("n0")).unwrap();
        let mut m = Manifest::new(3, vec!["n0".into()]);
        m.files.push(entry("n0/procs.bin", 10));
        m.files.push(index.write(&gen.join("n0")).unwrap());
        (dir, gen, m)
    }

    fn index(files: Vec<FileEntry>) -> PartIndex {
        PartIndex { generation: 3, node: "n0".into(), files }
    }

    #[test]
    fn a_part_is_its_records_and_what_its_index_lists() {
        let (_d, gen, m) = generation(&index(vec![entry("n0/chunks/p1-0", 100), entry("n0/chunks/p2-0", 50)]));
        let parts = PartFiles::read(&m, &gen).unwrap();
        let paths: Vec<_> = parts.of("n0").iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["n0/procs.bin", "n0/index.bin", "n0/chunks/p1-0", "n0/chunks/p2-0"]);
        assert_eq!(parts.count(), 4);
        assert!(parts.of("n1").is_empty());
    }

    #[test]
    fn a_manifest_without_index_lists_every_file_itself() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Manifest::new(3, vec!["n0".into(), "n1".into()]);
        m.format_version = INDEX_SINCE - 1;
        m.files = vec![entry("n0/procs.bin", 1), entry("n0/chunks/a", 2), entry("n1/procs.bin", 3)];
        let parts = PartFiles::read(&m, dir.path()).unwrap();
        assert_eq!(parts.of("n0").len(), 2);
        assert_eq!(parts.total_bytes(), 6);
        // From format 29 on, a node without its index would have its chunks missed: refused.
        m.format_version = INDEX_SINCE;
        let err = PartFiles::read(&m, dir.path()).unwrap_err().to_string();
        assert!(err.contains("lists no index.bin"), "{err}");
    }

    #[test]
    fn an_index_that_is_not_the_one_the_manifest_lists_is_refused() {
        let (_d, gen, mut m) = generation(&index(vec![entry("n0/chunks/p1-0", 100)]));
        // Rewritten after the manifest was: same size, other bytes.
        index(vec![entry("n0/chunks/p9-0", 100)]).write(&gen.join("n0")).unwrap();
        let err = PartFiles::read(&m, &gen).unwrap_err().to_string();
        assert!(err.contains("index.bin") && err.contains("checksum"), "{err}");
        m.files[1].size += 1;
        let err = PartFiles::read(&m, &gen).unwrap_err().to_string();
        assert!(err.contains("index.bin"), "{err}");
    }

    #[test]
    fn an_index_naming_files_outside_its_part_is_refused() {
        for (bad, why) in [
            ("n1/chunks/p1-0", "is not in node n0's part"),
            ("n0/../n1/chunks/p1-0", "not a plain path"),
            ("n0/procs.bin", "records"),
            ("n0/", "is not in node n0's part"),
            ("n0/./procs.bin", "not a plain path"),
            ("n0//chunks/a", "not a plain path"),
        ] {
            let (_d, gen, m) = generation(&index(vec![entry(bad, 1)]));
            let err = PartFiles::read(&m, &gen).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let (_d, gen, m) = generation(&index(vec![entry("n0/chunks/a", 1), entry("n0/chunks/a", 1)]));
        assert!(PartFiles::read(&m, &gen).unwrap_err().to_string().contains("listed twice"));
        // Another node's index, or another generation's, in this node's place.
        let (_d, gen, m) = generation(&PartIndex { generation: 2, node: "n0".into(), files: vec![] });
        assert!(PartFiles::read(&m, &gen).unwrap_err().to_string().contains("generation 2"));
        let (_d, gen, m) = generation(&PartIndex { generation: 3, node: "n1".into(), files: vec![] });
        assert!(PartFiles::read(&m, &gen).unwrap_err().to_string().contains("\"n1\""));
    }
}
