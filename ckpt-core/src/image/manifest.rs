//! The manifest: a generation's index, written last. A generation without one does not exist.
//!
//! On disk, a first line `CKPT-MANIFEST 1 crc32c=xxxxxxxx\n` (format version, crc32c in hex of
//! everything after that line), then the manifest as pretty JSON, so that a human can read it and
//! any tool can parse it.

use std::io::Read;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{ImageError, Result};
use super::fsutil;
use super::record::{check_version, FileEntry};
use super::FORMAT_VERSION;

/// File name of the manifest inside a generation directory.
pub const MANIFEST_NAME: &str = "MANIFEST";
/// The word that starts every manifest.
pub const MANIFEST_MAGIC: &str = "CKPT-MANIFEST";
/// Largest manifest a reader accepts. A generation of a few TiB in 4 MiB chunks lists about a
/// million files, at ~100 bytes each: 64 MiB leaves room while bounding a damaged file.
pub const MAX_MANIFEST_LEN: u64 = 64 << 20;

/// A generation's index: what it holds and the checksum of every file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub generation: u64,
    pub created_unix_ms: u64,
    /// The nodes that contributed, each a directory of the generation.
    pub nodes: Vec<String>,
    /// Every file of the generation but the manifest itself; since format 29 a node's records
    /// and its index, which lists the node's other files (read them all through
    /// [`super::PartFiles`]).
    pub files: Vec<FileEntry>,
    /// Free-form numbers filled by the caller: frozen_ms, durable_ms, bytes_raw, bytes_stored, ...
    #[serde(default)]
    pub stats: serde_json::Value,
    /// Node-local level (`ckpt coordinator --local-dir`): every node's part is kept in this
    /// directory on the node's own host, `{node}` replaced by the node's name (see
    /// [`Manifest::part_dir`]); the generation directory keeps only each node's records. Absent:
    /// every part is in the generation directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_dir: Option<String>,
    /// Redundancy (`--redundancy partner`): for each node, the nodes that keep a copy of its
    /// part, each in its own node-local directory (`<local dir of holder>/gen-N/<node>/`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub copies: std::collections::BTreeMap<String, Vec<String>>,
    /// Global level (`ckpt coordinator --flush-every N`): every node's whole part was copied into
    /// the generation directory too, after the commit (the manifest is then written again with
    /// this set); any host can restart any part from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global: bool,
    /// XOR redundancy (`--redundancy xor:K`): the groups of nodes; every member keeps its
    /// group's parity piece in `<its local dir>/gen-N/parity.xor` (see [`super::xor`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xor: Vec<Vec<String>>,
    /// An incremental generation: the earlier generations whose streams hold pages it refers
    /// to (`VmaRecord::earlier`), sorted, each older than this one. Pruning keeps them while
    /// this generation is kept. Empty: the generation is whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<u64>,
}

/// The file of a node's XOR parity piece, in its local directory's `gen-N/`.
pub const PARITY_NAME: &str = "parity.xor";

/// The records of a node's part (`<node>/procs.bin`, `<node>/files.bin`, and since format 29
/// its index, `<node>/index.bin`): small, kept in the shared generation directory too when the
/// part is node-local, so that any host can read every node's records and find its files.
pub const SHARED_RECORDS: [&str; 3] = ["procs.bin", "files.bin", super::index::INDEX_FILE];

/// The node-local directory of `node` from a `--local-dir` template: `{node}` replaced by the
/// node's name (which validation makes a plain directory name).
pub fn expand_local_dir(template: &str, node: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(template.replace("{node}", node))
}

impl Manifest {
    /// An empty manifest for `generation`, created now.
    pub fn new(generation: u64, nodes: Vec<String>) -> Manifest {
        let created_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        Manifest {
            format_version: FORMAT_VERSION,
            generation,
            created_unix_ms,
            nodes,
            files: Vec::new(),
            stats: serde_json::Value::Object(Default::default()),
            local_dir: None,
            copies: Default::default(),
            global: false,
            xor: Vec::new(),
            needs: Vec::new(),
        }
    }

    /// Where `node`'s part of the generation in `gen_dir` is read from on this host:
    /// `gen_dir/<node>`, or with a node-local level `<local dir of node>/gen-N/<node>` (on that
    /// node's host), unless it is not on this host and the generation reached the global level.
    pub fn part_dir(&self, gen_dir: &Path, node: &str) -> std::path::PathBuf {
        match &self.local_dir {
            None => gen_dir.join(node),
            Some(t) => {
                let local = expand_local_dir(t, node).join(super::fsutil::gen_dir_name(self.generation)).join(node);
                if self.global && !local.is_dir() {
                    gen_dir.join(node)
                } else {
                    local
                }
            }
        }
    }

    /// Where the listed file `rel` (`<node>/...`) lies: a node's records are in the generation
    /// directory; with a node-local level everything else of the part is in the node's
    /// [`part_dir`](Self::part_dir).
    pub fn resolve_file(&self, gen_dir: &Path, rel: &str) -> Result<std::path::PathBuf> {
        let listed = fsutil::resolve_listed(gen_dir, rel)?;
        if self.local_dir.is_none() || self.is_shared_record(rel) {
            return Ok(listed);
        }
        let (node, inner) =
            rel.split_once('/').ok_or_else(|| ImageError::malformed(gen_dir.join(MANIFEST_NAME), format!("{rel} is not under a node's directory")))?;
        fsutil::resolve_listed(&self.part_dir(gen_dir, node), inner)
    }

    /// `node`'s XOR group and its place in it, if the generation has XOR redundancy.
    pub fn xor_group_of(&self, node: &str) -> Option<(&[String], usize)> {
        self.xor.iter().find_map(|g| g.iter().position(|n| n == node).map(|i| (g.as_slice(), i)))
    }

    /// Where `holder` keeps its XOR group's parity piece (on its own host).
    pub fn parity_path(&self, holder: &str) -> Option<std::path::PathBuf> {
        let t = self.local_dir.as_deref()?;
        Some(expand_local_dir(t, holder).join(super::fsutil::gen_dir_name(self.generation)).join(PARITY_NAME))
    }

    /// Whether the listed file `rel` is one of a node's records, which stay in the generation
    /// directory (see [`SHARED_RECORDS`]).
    pub fn is_shared_record(&self, rel: &str) -> bool {
        rel.split_once('/').is_some_and(|(_, inner)| SHARED_RECORDS.contains(&inner))
    }

    /// Whether the listed file `rel` lies on a node's own storage, out of reach of other hosts.
    pub fn is_node_local(&self, rel: &str) -> bool {
        self.local_dir.is_some() && !self.global && !self.is_shared_record(rel)
    }

    /// The manifest as it is on disk.
    pub fn to_bytes(&self, path: &Path) -> Result<Vec<u8>> {
        let mut body = serde_json::to_vec_pretty(self).map_err(|e| ImageError::Encode { path: path.to_path_buf(), what: "manifest", detail: e.to_string() })?;
        body.push(b'\n');
        let mut out = format!("{MANIFEST_MAGIC} {FORMAT_VERSION} crc32c={:08x}\n", crc32c::crc32c(&body)).into_bytes();
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Parses a manifest read from `path` (used only in errors).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Manifest> {
        if !bytes.starts_with(MANIFEST_MAGIC.as_bytes()) {
            let found = &bytes[..bytes.len().min(MANIFEST_MAGIC.len())];
            return Err(ImageError::BadMagic { path: path.to_path_buf(), expected: "ckpt manifest", found: super::record::looks_like(found) });
        }
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| ImageError::truncated(path, "no end to the first line"))?;
        let (line, body) = (&bytes[..nl], &bytes[nl + 1..]);
        let bad_line = || {
            ImageError::malformed(
                path,
                format!("first line {:?} is not `{MANIFEST_MAGIC} <version> crc32c=<8 hex digits>` (manifest damaged?)", String::from_utf8_lossy(line)),
            )
        };
        let line = std::str::from_utf8(line).map_err(|_| bad_line())?;
        let mut words = line.split(' ');
        let (Some(_magic), Some(version), Some(crc), None) = (words.next(), words.next(), words.next(), words.next()) else {
            return Err(bad_line());
        };
        let version: u32 = version.parse().map_err(|_| bad_line())?;
        check_version(path, version)?;
        let crc = crc.strip_prefix("crc32c=").filter(|h| h.len() == 8).and_then(|h| u32::from_str_radix(h, 16).ok()).ok_or_else(bad_line)?;
        if crc32c::crc32c(body) != crc {
            return Err(ImageError::Checksum { kind: "manifest", path: path.to_path_buf(), detail: String::new() });
        }
        let m: Manifest = serde_json::from_slice(body).map_err(|e| ImageError::Decode { path: path.to_path_buf(), what: "manifest", detail: e.to_string() })?;
        if m.format_version != version {
            return Err(ImageError::malformed(
                path,
                format!("first line says format version {version}, the body says {} (manifest damaged?)", m.format_version),
            ));
        }
        m.check_nodes(path)?;
        for member in m.xor.iter().flatten() {
            if !m.nodes.contains(member) {
                return Err(ImageError::Invalid {
                    path: path.to_path_buf(),
                    place: "xor".into(),
                    problem: format!("{member:?} is not a node of the generation"),
                });
            }
        }
        for (node, holders) in &m.copies {
            if let Some(stranger) = std::iter::once(node).chain(holders).find(|n| !m.nodes.contains(n)) {
                return Err(ImageError::Invalid {
                    path: path.to_path_buf(),
                    place: format!("copies of {node:?}"),
                    problem: format!("{stranger:?} is not a node of the generation"),
                });
            }
        }
        if m.needs.iter().any(|&g| g >= m.generation) || m.needs.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ImageError::Invalid {
                path: path.to_path_buf(),
                place: "needs".into(),
                problem: format!("{:?} is not a sorted list of generations older than {}", m.needs, m.generation),
            });
        }
        if let Some(t) = &m.local_dir {
            check_local_dir_template(t).map_err(|problem| ImageError::Invalid { path: path.to_path_buf(), place: "local_dir".into(), problem })?;
        }
        Ok(m)
    }

    /// Writes the manifest into `gen_dir` atomically: `MANIFEST.tmp`, fsync, rename to
    /// `MANIFEST`, fsync of `gen_dir`. After this returns the generation exists; before, it does
    /// not, whatever else its directory holds.
    pub fn commit(&self, gen_dir: &Path) -> Result<()> {
        let path = gen_dir.join(MANIFEST_NAME);
        let bytes = self.to_bytes(&path)?;
        fsutil::write_file_atomic(&path, &[&bytes])
    }

    /// Reads and checks the manifest of `gen_dir`. When the directory is named `gen-NNNNNN`, the
    /// manifest must be that generation's.
    pub fn load(gen_dir: &Path) -> Result<Manifest> {
        let path = gen_dir.join(MANIFEST_NAME);
        let (f, len) = fsutil::open_with_len(&path)?;
        if len > MAX_MANIFEST_LEN {
            return Err(ImageError::TooLarge { path, what: "manifest", len, max: MAX_MANIFEST_LEN });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        f.take(MAX_MANIFEST_LEN + 1).read_to_end(&mut bytes).map_err(|e| ImageError::io(&path, "read", e))?;
        let m = Manifest::from_bytes(&bytes, &path)?;
        let dir_gen = gen_dir.file_name().and_then(|n| n.to_str()).and_then(fsutil::parse_gen_dir_name);
        if let Some(n) = dir_gen {
            if n != m.generation {
                return Err(ImageError::malformed(
                    &path,
                    format!(
                        "manifest of generation {} found in the directory of generation {n} \
                         (directory renamed or copied wrongly?)",
                        m.generation
                    ),
                ));
            }
        }
        for f in &m.files {
            fsutil::resolve_listed(gen_dir, &f.path)?;
        }
        Ok(m)
    }

    /// Node names are joined to the generation directory: each must be a plain name (no `/`,
    /// not `.` or `..`, not empty, bounded), listed once. Checked on every load, before any
    /// caller builds a path from them.
    pub fn check_nodes(&self, path: &Path) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for n in &self.nodes {
            crate::validate::node_name(n).map_err(|e| e.in_file(path))?;
            if !seen.insert(n) {
                return Err(ImageError::Invalid { path: path.to_path_buf(), place: format!("node {n:?}"), problem: "listed twice".into() });
            }
        }
        Ok(())
    }
}

/// A `--local-dir` template must be an absolute path without `..`, and not too long: nodes
/// join parts to it. Pure.
pub fn check_local_dir_template(t: &str) -> std::result::Result<(), String> {
    let p = Path::new(t);
    if !p.is_absolute() || p.components().any(|c| matches!(c, std::path::Component::ParentDir)) || t.contains('\0') || t.len() > 1024 {
        return Err(format!("{t:?} is not an absolute path without '..' (at most 1024 bytes)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn sample(generation: u64) -> Manifest {
        let mut m = Manifest::new(generation, vec!["n0".into(), "n1".into()]);
        m.files.push(FileEntry { path: "n0/procs.bin".into(), size: 123, crc32c: 0xdeadbeef });
        m.stats = serde_json::json!({ "frozen_ms": 12, "bytes_raw": 1 << 30 });
        m
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let gen = dir.path().join("gen-000004");
        fs::create_dir(&gen).unwrap();
        let m = sample(4);
        m.commit(&gen).unwrap();
        assert!(!gen.join("MANIFEST.tmp").exists());
        let text = fs::read_to_string(gen.join(MANIFEST_NAME)).unwrap();
        assert!(text.starts_with(&format!("CKPT-MANIFEST {FORMAT_VERSION} crc32c=")), "{text}");
        assert_eq!(Manifest::load(&gen).unwrap(), m);
    }

    #[test]
    fn damage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gen = dir.path().join("gen-000004");
        fs::create_dir(&gen).unwrap();
        sample(4).commit(&gen).unwrap();
        let path = gen.join(MANIFEST_NAME);
        let good = fs::read(&path).unwrap();

        let text = String::from_utf8(good.clone()).unwrap().replace("123", "124");
        fs::write(&path, text).unwrap();
        let err = Manifest::load(&gen).unwrap_err();
        assert_eq!(err.to_string(), format!("manifest {}: checksum mismatch (file damaged?)", path.display()));

        fs::write(&path, &good[..good.len() - 5]).unwrap();
        assert!(matches!(Manifest::load(&gen), Err(ImageError::Checksum { .. })));

        fs::write(&path, b"{\"generation\": 4}").unwrap();
        assert!(matches!(Manifest::load(&gen), Err(ImageError::BadMagic { .. })));

        let version = |v: u32| String::from_utf8(good.clone()).unwrap().replacen(&format!(" {FORMAT_VERSION} "), &format!(" {v} "), 1);
        fs::write(&path, version(FORMAT_VERSION + 1)).unwrap();
        let err = Manifest::load(&gen).unwrap_err();
        assert!(err.to_string().contains("newer ckpt"), "{err}");
        fs::write(&path, version(super::super::OLDEST_FORMAT_VERSION - 1)).unwrap();
        let err = Manifest::load(&gen).unwrap_err();
        assert!(err.to_string().contains("older ckpt"), "{err}");

        // A manifest in the wrong generation's directory.
        let other = dir.path().join("gen-000005");
        fs::create_dir(&other).unwrap();
        fs::write(other.join(MANIFEST_NAME), &good).unwrap();
        let err = Manifest::load(&other).unwrap_err();
        assert!(err.to_string().contains("generation 4"), "{err}");
    }

    #[test]
    fn escaping_paths_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample(1);
        m.files[0].path = "../../etc/passwd".into();
        m.commit(dir.path()).unwrap();
        let err = Manifest::load(dir.path()).unwrap_err();
        assert!(err.to_string().contains("not a plain path"), "{err}");
    }

    #[test]
    fn node_local_parts_resolve_to_each_nodes_directory_records_stay_shared() {
        let gen_dir = Path::new("/shared/ckpt.d/gen-000007");
        let mut m = Manifest::new(7, vec!["a".into(), "b".into()]);
        assert_eq!(m.part_dir(gen_dir, "b"), gen_dir.join("b"));
        m.local_dir = Some("/local/{node}/ck".into());
        assert_eq!(m.part_dir(gen_dir, "b"), Path::new("/local/b/ck/gen-000007/b"));
        assert_eq!(m.resolve_file(gen_dir, "b/chunks/p5-0000000000000000").unwrap(), Path::new("/local/b/ck/gen-000007/b/chunks/p5-0000000000000000"));
        assert_eq!(m.resolve_file(gen_dir, "b/procs.bin").unwrap(), gen_dir.join("b/procs.bin"));
        assert!(m.is_node_local("a/chunks/x") && !m.is_node_local("a/files.bin"));
        assert!(m.resolve_file(gen_dir, "b/../../etc/passwd").is_err());
        // At the global level, a part not on this host is read from the shared directory.
        m.global = true;
        assert_eq!(m.part_dir(gen_dir, "b"), gen_dir.join("b"));
        assert!(!m.is_node_local("a/chunks/x"));
        m.global = false;
        for bad in ["relative/{node}", "/a/../b", ""] {
            assert!(check_local_dir_template(bad).is_err(), "{bad:?} accepted");
        }
        // Written and read back, the template is kept; a forged one is refused.
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path().join("gen-000007");
        fs::create_dir(&g).unwrap();
        m.commit(&g).unwrap();
        assert_eq!(Manifest::load(&g).unwrap().local_dir.as_deref(), Some("/local/{node}/ck"));
        m.local_dir = Some("../escape".into());
        m.commit(&g).unwrap();
        assert!(Manifest::load(&g).is_err());
    }
}
