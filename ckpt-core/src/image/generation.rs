//! A checkpoint directory and its generations.
//!
//! The commit rule: a generation exists once its `MANIFEST` is durable, and not before. Everything
//! here follows from it: a checkpoint in progress is invisible, a crash leaves only garbage that
//! [`CheckpointDir::remove_uncommitted`] clears, and old generations are deleted only once a newer
//! one is committed.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::error::{ImageError, Result};
use super::fsutil::{self, gen_dir_name, parse_gen_dir_name};
use super::manifest::{Manifest, MANIFEST_NAME};

/// A checkpoint directory (`ckpt launch --dir D`), holding generations `gen-NNNNNN`.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    root: PathBuf,
}

impl CheckpointDir {
    /// Opens an existing checkpoint directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<CheckpointDir> {
        let root = root.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(CheckpointDir { root }),
            Ok(_) => Err(ImageError::malformed(&root, "is not a directory (give the checkpoint directory, not a file in it)")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ImageError::NoCheckpointDir { path: root }),
            Err(e) => Err(ImageError::io(&root, "stat", e)),
        }
    }

    /// Creates the checkpoint directory (and its parents) with mode 0700 if needed; an existing
    /// one must be the user's own, writable by no one else ([`fsutil::check_private_dir`]).
    pub fn create(root: impl Into<PathBuf>) -> Result<CheckpointDir> {
        let root = root.into();
        fsutil::create_dir_private(&root)?;
        fsutil::check_private_dir(&root)?;
        CheckpointDir::open(root)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of generation `n`, whether or not it exists.
    pub fn gen_dir(&self, n: u64) -> PathBuf {
        self.root.join(gen_dir_name(n))
    }

    /// Every generation directory, committed or not, sorted.
    fn all_generations(&self) -> Result<Vec<u64>> {
        let entries = fs::read_dir(&self.root).map_err(|e| ImageError::io(&self.root, "list", e))?;
        let mut gens = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(&self.root, "list", e))?;
            if let Some(n) = entry.file_name().to_str().and_then(parse_gen_dir_name) {
                gens.push(n);
            }
        }
        gens.sort_unstable();
        Ok(gens)
    }

    fn is_committed(&self, n: u64) -> bool {
        self.gen_dir(n).join(MANIFEST_NAME).is_file()
    }

    /// The committed generations (those whose directory holds a `MANIFEST`), oldest first.
    pub fn committed(&self) -> Result<Vec<u64>> {
        let mut gens = self.all_generations()?;
        gens.retain(|&n| self.is_committed(n));
        Ok(gens)
    }

    pub fn newest_committed(&self) -> Result<Option<u64>> {
        Ok(self.committed()?.last().copied())
    }

    /// A generation number above every generation directory present, committed or not, so that
    /// a new checkpoint never reuses the number of an older or half-written one.
    pub fn next_generation(&self) -> Result<u64> {
        Ok(self.all_generations()?.last().map_or(1, |n| n + 1))
    }

    /// Starts writing generation `n`. Refuses a committed generation; a directory left without
    /// manifest by a crash is garbage by the commit rule and is cleared first.
    pub fn begin(&self, n: u64) -> Result<PendingGeneration> {
        let dir = self.gen_dir(n);
        if self.is_committed(n) {
            return Err(ImageError::AlreadyCommitted { path: dir, generation: n });
        }
        if dir.exists() {
            tracing::warn!(dir = %dir.display(), "removing uncommitted generation left by an earlier run");
            remove_tree(&dir)?;
        }
        fs::DirBuilder::new().mode(fsutil::DIR_MODE).create(&dir).map_err(|e| ImageError::io(&dir, "create directory", e))?;
        Ok(PendingGeneration { root: self.root.clone(), dir, generation: n, done: false })
    }

    /// Removes every generation directory that has no manifest (left by a crash or a killed
    /// checkpoint). Returns their numbers. Call it only while no checkpoint is being written to
    /// this directory: a generation in progress has no manifest yet either.
    pub fn remove_uncommitted(&self) -> Result<Vec<u64>> {
        let mut removed = Vec::new();
        for n in self.all_generations()? {
            if !self.is_committed(n) {
                remove_tree(&self.gen_dir(n))?;
                removed.push(n);
            }
        }
        Ok(removed)
    }

    /// Deletes the oldest committed generations so that `keep` committed ones remain (at least
    /// one is always kept, so the newest committed generation survives). Returns the deleted
    /// numbers. Each is first uncommitted (its manifest removed and the removal made durable), so
    /// that a crash halfway leaves garbage, never a generation with missing files.
    pub fn prune(&self, keep: usize) -> Result<Vec<u64>> {
        let doomed = self.retire(keep)?;
        for &n in &doomed {
            remove_tree(&self.gen_dir(n))?;
        }
        if !doomed.is_empty() {
            fsutil::fsync_dir(&self.root)?;
        }
        Ok(doomed)
    }

    /// The first half of [`CheckpointDir::prune`]: uncommits the generations beyond `keep` (their
    /// manifests removed, durably), which are garbage from then on, and returns their numbers,
    /// for [`CheckpointDir::remove_retired`] to delete, at leisure: a generation of thousands of
    /// nodes holds hundreds of thousands of files, tens of seconds to delete.
    pub fn retire(&self, keep: usize) -> Result<Vec<u64>> {
        if keep == 0 {
            return Err(ImageError::InvalidConfig {
                what: "number of generations to keep",
                detail: "0 would delete the newest checkpoint (keep at least 1)".into(),
            });
        }
        let committed = self.committed()?;
        let excess = committed.len().saturating_sub(keep);
        let mut doomed = committed[..excess].to_vec();
        // The newest generation that reached the global level stays until a newer one has: it
        // is what a job comes back from when every node's own storage is lost.
        let global = |g: u64| Manifest::load(&self.gen_dir(g)).is_ok_and(|m| m.global);
        if let Some(newest_global) = committed.iter().rev().copied().find(|&g| global(g)) {
            doomed.retain(|&g| g != newest_global);
        }
        // An incremental generation kept keeps every generation it reads pages from. (Its list
        // names them all, not only its base: nothing further is needed.) A manifest that cannot
        // be read keeps everything: better a generation too many than a restart that fails.
        let mut needed = std::collections::BTreeSet::new();
        for g in committed.iter().filter(|g| !doomed.contains(g)) {
            match Manifest::load(&self.gen_dir(*g)) {
                Ok(m) => needed.extend(m.needs),
                Err(e) => {
                    tracing::warn!(generation = g, "not pruning: {e}");
                    return Ok(Vec::new());
                }
            }
        }
        doomed.retain(|g| !needed.contains(g));
        for &n in &doomed {
            let dir = self.gen_dir(n);
            let manifest = dir.join(MANIFEST_NAME);
            fs::remove_file(&manifest).map_err(|e| ImageError::io(&manifest, "remove", e))?;
            fsutil::fsync_dir(&dir)?;
        }
        Ok(doomed)
    }

    /// Deletes the directory of a generation [`CheckpointDir::retire`] uncommitted (one left
    /// half-deleted is garbage like any directory without a manifest, removed by the next
    /// coordinator of the directory).
    pub fn remove_retired(&self, n: u64) -> Result<()> {
        remove_tree(&self.gen_dir(n))
    }
}

fn remove_tree(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io(dir, "remove directory", e)),
    }
}

/// A generation being written. It becomes real with [`commit`](Self::commit); if dropped without
/// commit (a failed checkpoint, a panic), its directory is removed, so that no half-written
/// generation is left behind.
#[derive(Debug)]
pub struct PendingGeneration {
    root: PathBuf,
    dir: PathBuf,
    generation: u64,
    done: bool,
}

impl PendingGeneration {
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The generation's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of `node` in this generation, created (mode 0700) if needed.
    pub fn node_dir(&self, node: &str) -> Result<PathBuf> {
        check_node_name(&self.dir, node)?;
        let dir = self.dir.join(node);
        fsutil::create_dir_private(&dir)?;
        Ok(dir)
    }

    /// The chunks directory of `node` in this generation (`<node>/chunks`), created if needed.
    pub fn chunks_dir(&self, node: &str) -> Result<PathBuf> {
        let dir = self.node_dir(node)?.join("chunks");
        fsutil::create_dir_private(&dir)?;
        Ok(dir)
    }

    /// Commits the generation: checks that every listed file is there with its listed size,
    /// makes every directory of the generation durable, then writes the manifest (the commit
    /// point) and makes the generation's directory entry durable.
    pub fn commit(mut self, manifest: &Manifest) -> Result<()> {
        if manifest.generation != self.generation {
            return Err(ImageError::malformed(&self.dir, format!("asked to commit a manifest of generation {} here (caller bug)", manifest.generation)));
        }
        // Files on the nodes' own storage are out of this host's reach: their writers checked
        // them (size and checksum, fsync'd) before they reported them. So are the files a
        // node's index lists (format 29): each node checked and made its own durable, in
        // parallel with the others, before it listed its index; here, a few files a node.
        for f in manifest.files.iter().filter(|f| !manifest.is_node_local(&f.path)) {
            let path = fsutil::resolve_listed(&self.dir, &f.path)?;
            let size = match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ImageError::Missing { path }),
                Err(e) => return Err(ImageError::io(&path, "stat", e)),
            };
            if size != f.size {
                return Err(ImageError::SizeMismatch { path, expected: f.size, found: size });
            }
        }
        // Files were fsynced when written, and so were the directories their writers put them
        // in (a node's chunk directory and its node directory by the pool's batch, its records
        // by `write_file_atomic`, copies by their receivers): what no writer made durable is
        // the generation directory's own entries, the node directories. Only that directory
        // is fsynced here. Doing every directory of the tree again cost a cache flush each,
        // serially, on the coordinator: 2 per node, about 1.5 ms each on an ordinary disk,
        // 12 s for 4,096 nodes (docs/bench-coord-scale.md), all of it repeating the nodes' work.
        fsutil::fsync_dir(&self.dir)?;
        manifest.commit(&self.dir)?;
        fsutil::fsync_dir(&self.root)?;
        self.done = true;
        Ok(())
    }

    /// Gives up the generation and removes its directory.
    pub fn abandon(mut self) -> Result<()> {
        self.done = true;
        remove_tree(&self.dir)
    }
}

impl Drop for PendingGeneration {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = remove_tree(&self.dir) {
                tracing::warn!("cannot remove uncommitted generation: {e}");
            }
        }
    }
}

/// Refuses node names that are not one plain directory name of a generation.
fn check_node_name(gen_dir: &Path, node: &str) -> Result<()> {
    let ok = !node.is_empty() && node != "." && node != ".." && !node.contains('/') && !node.contains('\0') && node != MANIFEST_NAME;
    if !ok {
        return Err(ImageError::malformed(gen_dir.join(node), format!("{node:?} cannot be a node name (use a host name without '/')")));
    }
    Ok(())
}

impl CheckpointDir {
    /// One node's part (`gen-N/<node>/`) of generation `n`, which the coordinator has begun
    /// (it holds the [`PendingGeneration`] and writes the manifest once every node's part is
    /// durable). If dropped without [`NodePart::keep`], the node's directory is removed.
    pub fn node_part(&self, n: u64, node: &str) -> Result<NodePart> {
        let gen_dir = self.gen_dir(n);
        check_node_name(&gen_dir, node)?;
        if !gen_dir.is_dir() {
            return Err(ImageError::malformed(
                &gen_dir,
                format!(
                    "generation {n} has not been begun by the coordinator (is the checkpoint \
                     directory shared with the coordinator's?)"
                ),
            ));
        }
        let dir = gen_dir.join(node);
        if dir.exists() {
            // Left by a part abandoned without cleanup (a killed agent): garbage.
            remove_tree(&dir)?;
        }
        fsutil::create_dir_private(&dir)?;
        Ok(NodePart { dir, done: false })
    }
}

impl CheckpointDir {
    /// One node's part of generation `n` in a node-local directory (`--local-dir`): as
    /// [`node_part`](Self::node_part), but the generation's directory here is made by the node
    /// itself (no coordinator writes to a node's own storage).
    pub fn local_node_part(&self, n: u64, node: &str) -> Result<NodePart> {
        fsutil::create_dir_private(&self.gen_dir(n))?;
        self.node_part(n, node)
    }

    /// Removes the generations of this node-local directory that `keep` does not name (they
    /// were pruned from the shared directory, or never committed), except `current`. Returns
    /// their numbers.
    pub fn prune_local(&self, keep: &dyn Fn(u64) -> bool, current: u64) -> Result<Vec<u64>> {
        let mut removed = Vec::new();
        for n in self.all_generations()?.into_iter().filter(|&n| n != current && !keep(n)) {
            remove_tree(&self.gen_dir(n))?;
            removed.push(n);
        }
        Ok(removed)
    }

    /// Whether generation `n` is committed (its manifest is there).
    pub fn has_committed(&self, n: u64) -> bool {
        self.is_committed(n)
    }
}

/// A node's part of a generation being written; see [`CheckpointDir::node_part`].
#[derive(Debug)]
pub struct NodePart {
    dir: PathBuf,
    done: bool,
}

impl NodePart {
    /// `gen-N/<node>`.
    pub fn node_dir(&self) -> &Path {
        &self.dir
    }

    /// `gen-N/<node>/chunks`, created if needed.
    pub fn chunks_dir(&self) -> Result<PathBuf> {
        let dir = self.dir.join("chunks");
        fsutil::create_dir_private(&dir)?;
        Ok(dir)
    }

    /// The generation was committed with this part in it: leave it.
    pub fn keep(mut self) {
        self.done = true;
    }

    /// Gives up this node's part and removes its directory.
    pub fn abandon(mut self) -> Result<()> {
        self.done = true;
        remove_tree(&self.dir)
    }
}

impl Drop for NodePart {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = remove_tree(&self.dir) {
                tracing::warn!("cannot remove an uncommitted node part: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::record::{write_record_file, FileEntry};
    use std::os::unix::fs::PermissionsExt;

    fn commit_gen(cd: &CheckpointDir, n: u64) {
        let g = cd.begin(n).unwrap();
        let entry = write_record_file(&g.node_dir("n0").unwrap().join("procs.bin"), *b"CKPTTEST", &n).unwrap();
        let mut m = Manifest::new(n, vec!["n0".into()]);
        m.files.push(entry);
        g.commit(&m).unwrap();
    }

    #[test]
    fn open_missing_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ck");
        let err = CheckpointDir::open(&root).unwrap_err();
        assert_eq!(err.to_string(), format!("no checkpoint directory at {0} (run `ckpt launch --dir {0}` first)", root.display()));
        let cd = CheckpointDir::create(&root).unwrap();
        assert_eq!(fs::metadata(cd.root()).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(CheckpointDir::open(&root).is_ok());
        assert_eq!(cd.committed().unwrap(), Vec::<u64>::new());
        assert_eq!(cd.newest_committed().unwrap(), None);
        assert_eq!(cd.next_generation().unwrap(), 1);
    }

    #[test]
    fn commit_prune_and_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        let cd = CheckpointDir::create(dir.path().join("ck")).unwrap();
        for n in 1..=4 {
            commit_gen(&cd, n);
        }
        assert_eq!(cd.committed().unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(cd.gen_dir(3), cd.root().join("gen-000003"));
        assert!(matches!(cd.begin(4), Err(ImageError::AlreadyCommitted { generation: 4, .. })));

        // A crash mid-checkpoint: a directory without manifest.
        fs::create_dir_all(cd.gen_dir(5).join("n0/chunks")).unwrap();
        fs::write(cd.gen_dir(5).join("n0/chunks/p1-0000000000000000"), b"x").unwrap();
        assert_eq!(cd.committed().unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(cd.next_generation().unwrap(), 6);
        assert_eq!(cd.remove_uncommitted().unwrap(), vec![5]);
        assert!(!cd.gen_dir(5).exists());

        assert_eq!(cd.prune(2).unwrap(), vec![1, 2]);
        assert_eq!(cd.committed().unwrap(), vec![3, 4]);
        assert!(!cd.gen_dir(1).exists());
        assert_eq!(cd.prune(5).unwrap(), Vec::<u64>::new());
        assert!(cd.prune(0).is_err());
        assert_eq!(cd.newest_committed().unwrap(), Some(4));
        let m = Manifest::load(&cd.gen_dir(4)).unwrap();
        assert_eq!(m.files[0].path, "n0/procs.bin");

        // The newest generation that reached the global level stays until a newer one has.
        let mut m3 = Manifest::load(&cd.gen_dir(3)).unwrap();
        m3.global = true;
        m3.commit(&cd.gen_dir(3)).unwrap();
        commit_gen(&cd, 5);
        assert_eq!(cd.prune(1).unwrap(), vec![4]);
        assert_eq!(cd.committed().unwrap(), vec![3, 5]);
        let mut m5 = Manifest::load(&cd.gen_dir(5)).unwrap();
        m5.global = true;
        m5.commit(&cd.gen_dir(5)).unwrap();
        assert_eq!(cd.prune(1).unwrap(), vec![3]);
    }

    /// A kept incremental generation keeps the generations it reads pages from, until no kept
    /// one needs them.
    #[test]
    fn pruning_keeps_what_kept_generations_need() {
        let dir = tempfile::tempdir().unwrap();
        let cd = CheckpointDir::create(dir.path().join("ck")).unwrap();
        let needing = |n: u64, needs: Vec<u64>| {
            commit_gen(&cd, n);
            let mut m = Manifest::load(&cd.gen_dir(n)).unwrap();
            m.needs = needs;
            m.commit(&cd.gen_dir(n)).unwrap();
        };
        commit_gen(&cd, 1);
        needing(2, vec![1]);
        needing(3, vec![1, 2]);
        assert_eq!(cd.prune(1).unwrap(), Vec::<u64>::new(), "3 needs 1 and 2");
        commit_gen(&cd, 4);
        needing(5, vec![4]);
        assert_eq!(cd.prune(1).unwrap(), vec![1, 2, 3], "5 needs only 4");
        assert_eq!(cd.committed().unwrap(), vec![4, 5]);
    }

    #[test]
    fn dropped_pending_generation_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cd = CheckpointDir::create(dir.path()).unwrap();
        {
            let g = cd.begin(7).unwrap();
            let chunks = g.chunks_dir("n0").unwrap();
            fs::write(chunks.join("p1-0000000000000000"), b"partial").unwrap();
            assert!(cd.gen_dir(7).exists());
        }
        assert!(!cd.gen_dir(7).exists());
        assert_eq!(fs::read_dir(cd.root()).unwrap().count(), 0);

        let g = cd.begin(8).unwrap();
        g.node_dir("n0").unwrap();
        g.abandon().unwrap();
        assert!(!cd.gen_dir(8).exists());

        // A failed commit (a listed file is missing) leaves nothing either.
        let g = cd.begin(9).unwrap();
        let mut m = Manifest::new(9, vec!["n0".into()]);
        m.files.push(FileEntry { path: "n0/procs.bin".into(), size: 1, crc32c: 0 });
        assert!(matches!(g.commit(&m), Err(ImageError::Missing { .. })));
        assert!(!cd.gen_dir(9).exists());
        assert_eq!(cd.committed().unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn node_parts_of_a_coordinated_generation() {
        let dir = tempfile::tempdir().unwrap();
        let cd = CheckpointDir::create(dir.path()).unwrap();
        assert!(cd.node_part(1, "a").is_err(), "the coordinator begins the generation first");
        let g = cd.begin(1).unwrap();
        let a = cd.node_part(1, "a").unwrap();
        let b = cd.node_part(1, "b").unwrap();
        let entry = write_record_file(&a.node_dir().join("procs.bin"), *b"CKPTTEST", &1u8).unwrap();
        assert_eq!(entry.path, "a/procs.bin");
        assert!(b.chunks_dir().unwrap().is_dir());
        b.abandon().unwrap();
        assert!(!cd.gen_dir(1).join("b").exists());
        a.keep();
        let mut m = Manifest::new(1, vec!["a".into()]);
        m.files.push(entry);
        g.commit(&m).unwrap();
        assert_eq!(cd.committed().unwrap(), vec![1]);
        // A part dropped without keep (an agent that gave up) is removed.
        let _g2 = cd.begin(2).unwrap();
        drop(cd.node_part(2, "a").unwrap());
        assert!(!cd.gen_dir(2).join("a").exists());
        assert!(cd.node_part(2, "a/b").is_err());
    }

    #[test]
    fn bad_node_names() {
        let dir = tempfile::tempdir().unwrap();
        let cd = CheckpointDir::create(dir.path()).unwrap();
        let g = cd.begin(1).unwrap();
        for bad in ["", ".", "..", "a/b", "MANIFEST"] {
            assert!(g.node_dir(bad).is_err(), "{bad:?}");
        }
        assert!(g.node_dir("node-01.cluster").is_ok());
    }
}
