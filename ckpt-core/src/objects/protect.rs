//! Protected roots (`ckpt launch --protect DIR`, and `--save-files`): a directory tree (or one
//! file) kept consistent with memory. Every checkpoint records the root's state at the freeze,
//! and a restart puts the root back to it: files changed, created or deleted since, whoever did it.
//!
//! The state is a list of entries (relative path, kind, mode, owner, size, mtime, ctime, inode)
//! and, for each regular file, the name of a copy in the node's store (`D/files/<node>/`). A copy
//! is made only for a file whose inode, size, mtime or ctime differ from the previous generation's
//! record: the freeze pays a stat per entry and a copy per changed file, not a copy of the root.
//! A copy is a reflink (FICLONE) where the file system has them (btrfs, XFS: no data is copied),
//! else an in-kernel copy (copy_file_range). `ckpt launch --protect` copies the root once before
//! the job starts, so the first checkpoint's freeze copies only what changed since.
//!
//! Copies are written while the job is frozen and made durable ([`sync`]) after it runs again,
//! before the generation commits. Copies no committed generation refers to any more are removed
//! after each commit ([`collect_garbage`]).
//!
//! At restart, [`restore`] first checks that every copy it needs is in the store at its size, then
//! changes things: entries that should not be there are removed, directories made, files whose
//! state differs written back from their copy (in place when the same inode is still there, so a
//! file the job reopens is the same one), symlinks made again, owners and modes set.
//!
//! Both sides reach every entry from a descriptor of the root's parent directory and follow no
//! symbolic link on the way ([`crate::sys::beneath`]): users may write in a protected tree of a
//! root job while root reads it at a checkpoint and rewrites it at a restart, and a link they
//! plant, before or during, makes the step fail with ELOOP rather than act outside the tree. A
//! file is written back in place only when it is still the very inode recorded; anything else
//! at its name (a hard link to a file elsewhere included) is removed and a new file made.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files_state::{Kind, Stat};
use crate::error::{Context, Error, Result};
use crate::sys::beneath::Beneath;

/// One entry of a protected root.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the root, `/`-separated; "" is the root itself.
    pub rel: String,
    pub stat: Stat,
    /// The name of the file's copy in the store (regular files), or a symlink's target.
    pub content: Option<String>,
    /// Mapped shared and writable by the job at the checkpoint: written through the mapping
    /// without its mtime changing, so it is copied at every checkpoint and written back at every
    /// restart, whatever its stat says.
    pub mapped: bool,
}

/// A protected root and its state at one checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootState {
    /// An absolute path.
    pub root: String,
    /// Parents before children.
    pub entries: Vec<Entry>,
}

/// Where copies live: `D/files/<node>/`, outside the generations, so that a copy is shared by
/// every generation whose state refers to it.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    pub fn of(ckpt_dir: &Path, node: &str) -> Store {
        Store { dir: ckpt_dir.join("files").join(node) }
    }

    fn create(&self) -> Result<()> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).context(|| format!("create {}", self.dir.display()))
    }
}

/// What one capture did: the copies it made (to be made durable) and their bytes.
#[derive(Debug, Default)]
pub struct Captured {
    pub states: Vec<RootState>,
    pub new_copies: Vec<PathBuf>,
    pub bytes_copied: u64,
    pub entries: usize,
}

/// Every entry under `root` (not following symlinks, not leaving its file system), parents first.
/// `skip`: inodes left out with what is below them (the image directory). The tree is read
/// from its parent's descriptor (see [`Beneath`]): a link planted on the way is never followed.
fn walk(tree: &Beneath, skip: &[(u64, u64)]) -> std::io::Result<Walked> {
    let top = Stat::of_raw(&tree.lstat("")?);
    let mut out = vec![(String::new(), top)];
    let mut i = 0;
    while i < out.len() {
        let (rel, st) = out[i].clone();
        i += 1;
        if st.kind != Kind::Dir || st.dev != top.dev {
            continue;
        }
        let mut children = Vec::new();
        for (name, raw) in tree.list(&rel)? {
            let s = Stat::of_raw(&raw);
            if skip.contains(&(s.dev, s.ino)) {
                continue;
            }
            children.push((if rel.is_empty() { name } else { format!("{rel}/{name}") }, s));
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(children);
    }
    Ok(out)
}

/// Entries of a protected root with their state, parents first.
type Walked = Vec<(String, Stat)>;

/// The tree of a protected root, its state now (empty when it is gone), and the tree for
/// acting on it (`None` when the directory above it is gone too).
fn walk_root(root: &str, skip: &[(u64, u64)]) -> Result<(Option<Beneath>, Walked)> {
    let what = || format!("protected {root}");
    let tree = match Beneath::open(Path::new(root)) {
        Ok(tree) => tree,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, Vec::new())),
        Err(e) => return Err(refused_link(e)).context(what),
    };
    match walk(&tree, skip) {
        Ok(now) => Ok((Some(tree), now)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && tree.lstat("").is_err() => Ok((Some(tree), Vec::new())),
        Err(e) => Err(refused_link(e)).context(what),
    }
}

/// ELOOP from a walk below a protected root, in words.
fn refused_link(e: std::io::Error) -> std::io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        std::io::Error::new(e.kind(), "a symbolic link is in the way (on the path to it, or in place of a directory of it); links are never followed there")
    } else {
        e
    }
}

/// Records the state of every root while the job is frozen, copying the files that changed since
/// `previous` (the last committed state, or the copy made at launch). `tag` makes copy names
/// unique (the generation, or `launch-<ms>`). `mapped`: files the job maps shared and writable.
pub fn capture(roots: &[String], previous: &[RootState], store: &Store, tag: &str, skip: &[(u64, u64)], mapped: &HashSet<(u64, u64)>) -> Result<Captured> {
    if roots.is_empty() {
        return Ok(Captured::default());
    }
    store.create()?;
    let prev: HashMap<(&str, &str), &Entry> = previous.iter().flat_map(|r| r.entries.iter().map(move |e| ((r.root.as_str(), e.rel.as_str()), e))).collect();
    let mut out = Captured::default();
    let mut n = 0usize;
    for root in roots {
        let mut entries = Vec::new();
        let (tree, now) = walk_root(root, skip)?;
        let Some(tree) = tree.filter(|_| !now.is_empty()) else {
            return Err(Error::Other(format!("protected {root}: no longer there")));
        };
        for (rel, mut stat) in now {
            let path = if rel.is_empty() { PathBuf::from(root) } else { Path::new(root).join(&rel) };
            let is_mapped = mapped.contains(&(stat.dev, stat.ino));
            let content = match stat.kind {
                Kind::File => match prev.get(&(root.as_str(), rel.as_str())) {
                    Some(e) if !is_mapped && !e.mapped && e.stat.same_contents(&stat) && e.content.is_some() => e.content.clone(),
                    _ => {
                        n += 1;
                        let name = format!("{tag}-{n:06}");
                        let dst = store.dir.join(&name);
                        out.bytes_copied += copy_file(&tree, &rel, &stat, &dst).context(|| format!("copy {} to {}", path.display(), dst.display()))?;
                        out.new_copies.push(dst);
                        Some(name)
                    }
                },
                Kind::Symlink => Some(tree.read_link(&rel).context(|| format!("read link {}", path.display()))?.to_string_lossy().into_owned()),
                Kind::Dir | Kind::Other => None,
            };
            // The walk stat'ed every entry before now: "now" is after each entry's stat.
            if too_recent(&stat, std::time::SystemTime::now()) {
                // Copied, but the next capture copies it again (and a restart writes it back).
                stat.ctime = (i64::MIN, 0);
            }
            entries.push(Entry { rel, stat, content, mapped: is_mapped });
        }
        out.entries += entries.len();
        out.states.push(RootState { root: root.clone(), entries });
    }
    Ok(out)
}

/// Longer than a clock tick (10 ms at HZ=100).
pub const COARSE_TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether a file's times are too close to the moment of its stat to tell a later write (pure).
/// On file systems and kernels without fine-grained timestamps (before Linux 6.13), a write right
/// after a stat, within the same clock tick, leaves mtime and ctime as they were, so a stat
/// taken later would say "unchanged" of a file that changed after its copy. (Measured here, on
/// 6.18 and ext4: every write after a stat gets new times; this costs a second copy of the files
/// written in the 50 ms before their stat.)
pub fn too_recent(stat: &Stat, stat_at: std::time::SystemTime) -> bool {
    let since = stat_at.checked_sub(COARSE_TICK).unwrap_or(stat_at).duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let since = (since.as_secs() as i64, since.subsec_nanos() as i64);
    stat.kind == Kind::File && (stat.ctime >= since || stat.mtime >= since)
}

/// Copies the file `rel` of `tree` to a new file `dst` (mode 0600): a reflink where possible,
/// else an in-kernel copy. Returns the bytes copied (0 for a reflink). The file opened must be
/// the one the walk saw (`stat`): another put there since is refused, not copied.
fn copy_file(tree: &Beneath, rel: &str, stat: &Stat, dst: &Path) -> std::io::Result<u64> {
    use nix::fcntl::OFlag;
    let mut from = File::from(tree.open_entry(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).map_err(refused_link)?);
    let now = Stat::of(&from.metadata()?);
    if (now.kind, now.dev, now.ino) != (Kind::File, stat.dev, stat.ino) {
        return Err(std::io::Error::other("replaced by another entry while the checkpoint read the directory"));
    }
    let mut to = OpenOptions::new().write(true).create_new(true).mode(0o600).open(dst)?;
    if crate::sys::fs::ficlone(&to, &from).is_ok() {
        return Ok(0);
    }
    // std's copy between two files is copy_file_range: no bounce through our memory.
    std::io::copy(&mut from, &mut to)
}

/// Makes the copies of a capture durable (run after the job is released, before the commit).
pub fn sync(store: &Store, copies: &[PathBuf]) -> Result<()> {
    for c in copies {
        File::open(c).and_then(|f| f.sync_all()).context(|| format!("sync {}", c.display()))?;
    }
    if !copies.is_empty() {
        File::open(&store.dir).and_then(|d| d.sync_all()).context(|| format!("sync {}", store.dir.display()))?;
    }
    Ok(())
}

/// Removes every copy that none of `keep` refers to.
pub fn collect_garbage<'a>(store: &Store, keep: impl Iterator<Item = &'a RootState>) -> Result<usize> {
    let used: HashSet<&str> = keep.flat_map(|r| r.entries.iter()).filter(|e| e.stat.kind == Kind::File).filter_map(|e| e.content.as_deref()).collect();
    let Ok(dir) = std::fs::read_dir(&store.dir) else { return Ok(0) };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !used.contains(name.as_str()) && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// What [`restore`] does to one root (pure): entries to remove (children first), and entries of
/// the record to write (parents first) with whether their contents must be written back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub remove: Vec<String>,
    /// (index in the record's entries, contents to write back)
    pub put: Vec<(usize, bool)>,
}

/// Compares a root's record with its walk now (pure).
pub fn plan(rec: &RootState, now: &[(String, Stat)]) -> Plan {
    let want: HashMap<&str, &Entry> = rec.entries.iter().map(|e| (e.rel.as_str(), e)).collect();
    let have: HashMap<&str, &Stat> = now.iter().map(|(r, s)| (r.as_str(), s)).collect();
    let mut plan = Plan::default();
    // Children first: `now` is parents first.
    for (rel, st) in now.iter().rev() {
        match want.get(rel.as_str()) {
            Some(e) if e.stat.kind == st.kind => {}
            _ => plan.remove.push(rel.clone()),
        }
    }
    let removed: HashSet<&str> = plan.remove.iter().map(|s| s.as_str()).collect();
    for (i, e) in rec.entries.iter().enumerate() {
        let cur = have.get(e.rel.as_str()).filter(|_| !removed.contains(e.rel.as_str()));
        let write = match (e.stat.kind, cur) {
            (Kind::File, Some(s)) => e.mapped || !e.stat.same_contents(s),
            (Kind::File, None) | (Kind::Symlink, None) | (Kind::Dir, None) => true,
            (Kind::Symlink, Some(_)) | (Kind::Dir, Some(_)) => false,
            (Kind::Other, _) => false,
        };
        let attrs = cur.is_some_and(|s| (s.mode, s.uid, s.gid) != (e.stat.mode, e.stat.uid, e.stat.gid));
        if write || attrs {
            plan.put.push((i, write));
        }
    }
    plan
}

/// Puts every root back to its recorded state. Checks first that every copy needed is there.
/// `skip`: what the capture left out (the image directory, the copies, the launcher's stdio)
/// and the restart's own stdio, which must not be taken for files created since and removed.
///
/// `owner`: the file rights the protected directories are put back with (the job's, see
/// [`crate::fsid`]); the saved copies, in the image's store, are read with the restorer's own.
pub fn restore(states: &[RootState], store: &Store, skip: &[(u64, u64)], owner: Option<&crate::fsid::FsIdentity>) -> Result<usize> {
    for r in states {
        for e in r.entries.iter().filter(|e| e.stat.kind == Kind::File) {
            let name = e.content.as_deref().unwrap_or("");
            let copy = store.dir.join(name);
            let ok = std::fs::symlink_metadata(&copy).map(|m| m.is_file() && m.len() == e.stat.size).unwrap_or(false);
            if name.is_empty() || name.contains('/') || !ok {
                return Err(Error::Other(format!(
                    "the saved copy of {}/{} ({}) is missing or damaged: this generation cannot put the protected directory back",
                    r.root,
                    e.rel,
                    copy.display()
                )));
            }
        }
    }
    let mut changed = 0;
    for r in states {
        let (tree, now) = {
            let _as = crate::fsid::act_as(owner)?;
            walk_root(&r.root, skip)?
        };
        let Some(tree) = tree else {
            return Err(Error::Other(format!("protected {}: the directory above it is gone; make it again to restart", r.root)));
        };
        let plan = plan(r, &now);
        for rel in &plan.remove {
            let _as = crate::fsid::act_as(owner)?;
            tree.remove(rel).map_err(refused_link).context(|| format!("remove {} (not there at the checkpoint)", at(&r.root, rel)))?;
            changed += 1;
        }
        for &(i, write) in &plan.put {
            let e = &r.entries[i];
            put_back(&tree, &r.root, e, write, store, owner).map_err(refused_link).context(|| format!("put {} back", at(&r.root, &e.rel)))?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// `rel` below `root`, for messages.
fn at(root: &str, rel: &str) -> String {
    if rel.is_empty() {
        root.to_string()
    } else {
        format!("{root}/{rel}")
    }
}

/// Puts one entry back: made again or written back when `write`, then its owner and mode set
/// on its own descriptor (owner first: a chown clears the set-user-ID bit).
fn put_back(tree: &Beneath, root: &str, e: &Entry, write: bool, store: &Store, owner: Option<&crate::fsid::FsIdentity>) -> std::io::Result<()> {
    use crate::sys::beneath;
    use nix::fcntl::OFlag;
    // The copy is the image's, read with the restorer's rights; the rest with the job's.
    let from = match (e.stat.kind, write) {
        (Kind::File, true) => Some(File::open(store.dir.join(e.content.as_deref().unwrap_or("")))?),
        _ => None,
    };
    let _as = crate::fsid::act_as(owner).map_err(|err| std::io::Error::other(err.to_string()))?;
    let rel = e.rel.as_str();
    let entry = match e.stat.kind {
        Kind::Dir => {
            if write {
                tree.make_dir(rel, 0o700)?;
            }
            tree.open_entry(rel, OFlag::O_PATH | OFlag::O_DIRECTORY)?
        }
        Kind::Symlink => {
            if write {
                tree.make_link(rel, e.content.as_deref().unwrap_or(""))?;
            }
            tree.open_entry(rel, OFlag::O_PATH)?
        }
        Kind::File if write => {
            // In place when the very file is still there, so that a file the job reopens is the
            // same one; anything else there is removed and a new file made (never written
            // through: it could be a hard link to a file outside the tree).
            let there = match tree.open_entry(rel, OFlag::O_PATH) {
                Ok(fd) => Some(fd),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                Err(err) => return Err(err),
            };
            let same = there.as_ref().map(|fd| beneath::stat(fd).map(|st| Stat::of_raw(&st))).transpose()?;
            let mut to = match (there, same) {
                (Some(fd), Some(st)) if (st.kind, st.dev, st.ino) == (Kind::File, e.stat.dev, e.stat.ino) => {
                    beneath::reopen(&fd, OFlag::O_WRONLY | OFlag::O_TRUNC | OFlag::O_NONBLOCK)?
                }
                (there, _) => {
                    if there.is_some() {
                        tree.remove(rel)?;
                    }
                    tree.create_new(rel, 0o600)?
                }
            };
            let mut from = from.expect("opened above for a file to write");
            std::io::copy(&mut from, &mut to)?;
            let mtime = std::time::UNIX_EPOCH + std::time::Duration::new(e.stat.mtime.0.max(0) as u64, e.stat.mtime.1 as u32);
            to.set_modified(mtime)?;
            std::os::fd::OwnedFd::from(to)
        }
        Kind::File => tree.open_entry(rel, OFlag::O_PATH)?,
        Kind::Other => return Ok(()),
    };
    let now = Stat::of_raw(&beneath::stat(&entry)?);
    if (now.uid, now.gid) != (e.stat.uid, e.stat.gid) {
        if let Err(err) = beneath::set_owner(&entry, e.stat.uid, e.stat.gid) {
            // An ordinary user's restart cannot give a file to someone else; it stays theirs.
            tracing::warn!(path = %at(root, rel), uid = e.stat.uid, gid = e.stat.gid, "cannot give the file its owner back: {err}");
        }
    }
    // A symlink's mode means nothing (Linux has none to set).
    if e.stat.kind != Kind::Symlink {
        beneath::set_mode(&entry, e.stat.mode)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(kind: Kind, ino: u64, size: u64, t: i64) -> Stat {
        Stat { kind, dev: 1, ino, size, mtime: (t, 0), ctime: (t, 0), mode: 0o600, uid: 0, gid: 0 }
    }

    #[test]
    fn plan_removes_new_entries_and_writes_changed_ones_back() {
        let rec = RootState {
            root: "/r".into(),
            entries: vec![
                Entry { rel: "".into(), stat: st(Kind::Dir, 1, 0, 1), content: None, mapped: false },
                Entry { rel: "a".into(), stat: st(Kind::File, 2, 10, 1), content: Some("g1-1".into()), mapped: false },
                Entry { rel: "b".into(), stat: st(Kind::File, 3, 10, 1), content: Some("g1-2".into()), mapped: false },
                Entry { rel: "d".into(), stat: st(Kind::Dir, 4, 0, 1), content: None, mapped: false },
                Entry { rel: "d/c".into(), stat: st(Kind::File, 5, 10, 1), content: Some("g1-3".into()), mapped: false },
            ],
        };
        let now = vec![
            ("".to_string(), st(Kind::Dir, 1, 0, 2)),
            ("a".to_string(), st(Kind::File, 2, 10, 1)),
            ("b".to_string(), st(Kind::File, 3, 20, 2)),
            ("new".to_string(), st(Kind::Dir, 9, 0, 2)),
            ("new/x".to_string(), st(Kind::File, 10, 1, 2)),
        ];
        let p = plan(&rec, &now);
        assert_eq!(p.remove, vec!["new/x".to_string(), "new".to_string()]);
        assert_eq!(p.put, vec![(2, true), (3, true), (4, true)]);
    }

    #[test]
    fn capture_copies_only_what_changed_and_restore_puts_it_back() {
        let base = std::env::temp_dir().join(format!("ckpt-protect-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("data");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a"), b"first").unwrap();
        std::fs::write(root.join("sub/b"), b"bbbb").unwrap();
        // Files written within a clock tick of their stat are copied again next time.
        let fresh = capture(&[root.to_string_lossy().into_owned()], &[], &Store { dir: base.join("fresh") }, "f", &[], &HashSet::new()).unwrap();
        assert!(fresh.states[0].entries.iter().filter(|e| e.stat.kind == Kind::File).all(|e| e.stat.ctime.0 == i64::MIN));
        std::thread::sleep(COARSE_TICK * 2);
        let store = Store { dir: base.join("store") };
        let roots = vec![root.to_string_lossy().into_owned()];
        let c1 = capture(&roots, &[], &store, "g1", &[], &HashSet::new()).unwrap();
        assert_eq!(c1.new_copies.len(), 2);
        let c2 = capture(&roots, &c1.states, &store, "g2", &[], &HashSet::new()).unwrap();
        assert!(c2.new_copies.is_empty(), "nothing changed: {:?}", c2.new_copies);
        // After the checkpoint: a change in place, a new file, a removed directory.
        std::fs::write(root.join("a"), b"second, longer").unwrap();
        std::fs::write(root.join("c"), b"new").unwrap();
        std::fs::remove_dir_all(root.join("sub")).unwrap();
        let ino_a = Stat::lstat(&root.join("a")).unwrap().ino;
        // The copies' directory sits inside the root here: left alone like the image directory.
        std::fs::create_dir_all(root.join("img")).unwrap();
        let img = Stat::lstat(&root.join("img")).unwrap();
        assert!(restore(&c2.states, &store, &[(img.dev, img.ino)], None).unwrap() > 0);
        assert!(root.join("img").is_dir(), "an ignored directory was removed");
        assert_eq!(std::fs::read(root.join("a")).unwrap(), b"first");
        assert_eq!(Stat::lstat(&root.join("a")).unwrap().ino, ino_a, "written back in place");
        assert_eq!(std::fs::read(root.join("sub/b")).unwrap(), b"bbbb");
        assert!(!root.join("c").exists());
        // Only the copies the kept states use survive.
        assert_eq!(collect_garbage(&store, c2.states.iter()).unwrap(), 0);
        assert_eq!(collect_garbage(&store, std::iter::empty()).unwrap(), 2);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A user who may write in a protected directory plants links for root's restart: between
    /// the walk and the put-back (deterministically here: after the capture, the entry put back
    /// by hand), and before the restart (through `restore`). Nothing outside the tree is
    /// written, removed or changed in mode; a hard link in place of a file is replaced, not
    /// written through.
    #[test]
    fn links_planted_in_a_protected_tree_are_never_followed() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("ckpt-protect-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, victim) = (base.join("data"), base.join("victim"));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(root.join("sub/f"), b"inside").unwrap();
        std::fs::set_permissions(root.join("sub/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        for name in ["f", "g"] {
            std::fs::write(victim.join(name), format!("victim {name}")).unwrap();
            std::fs::set_permissions(victim.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let victim_intact = || {
            for name in ["f", "g"] {
                assert_eq!(std::fs::read(victim.join(name)).unwrap(), format!("victim {name}").as_bytes(), "{name} outside the tree was written");
                let mode = std::fs::metadata(victim.join(name)).unwrap().permissions().mode() & 0o7777;
                assert_eq!(mode, 0o644, "{name} outside the tree changed mode");
            }
        };
        let store = Store { dir: base.join("store") };
        let root_s = root.to_string_lossy().into_owned();
        let c = capture(std::slice::from_ref(&root_s), &[], &store, "g1", &[], &HashSet::new()).unwrap();
        let f = c.states[0].entries.iter().find(|e| e.rel == "sub/f").unwrap().clone();

        // sub swapped for a link to the victim's directory after the walk.
        std::fs::rename(root.join("sub"), base.join("sub.real")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("sub")).unwrap();
        let tree = Beneath::open(&root).unwrap();
        for write in [true, false] {
            let err = put_back(&tree, &root_s, &f, write, &store, None).expect_err("put back through a link");
            assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        }
        assert!(tree.remove("sub/g").is_err(), "removed through a link");
        victim_intact();

        // A hard link to an outside file in place of the recorded one: replaced, not written.
        std::fs::remove_file(root.join("sub")).unwrap();
        std::fs::rename(base.join("sub.real"), root.join("sub")).unwrap();
        std::fs::remove_file(root.join("sub/f")).unwrap();
        std::fs::hard_link(victim.join("f"), root.join("sub/f")).unwrap();
        put_back(&tree, &root_s, &f, true, &store, None).unwrap();
        assert_eq!(std::fs::read(root.join("sub/f")).unwrap(), b"inside");
        victim_intact();

        // The link planted before the restart: removed, the directory made again.
        std::fs::remove_dir_all(root.join("sub")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("sub")).unwrap();
        assert!(restore(&c.states, &store, &[], None).unwrap() > 0);
        assert!(root.join("sub").symlink_metadata().unwrap().is_dir());
        assert_eq!(std::fs::read(root.join("sub/f")).unwrap(), b"inside");
        let mode = std::fs::metadata(root.join("sub/f")).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        victim_intact();

        // A link on the way to the root itself refuses the put-back.
        std::fs::create_dir_all(base.join("deeper")).unwrap();
        std::os::unix::fs::symlink(&base, base.join("deeper/x")).unwrap();
        let via_link = RootState { root: base.join("deeper/x/data").to_string_lossy().into_owned(), entries: c.states[0].entries.clone() };
        let err = restore(&[via_link], &store, &[], None).expect_err("a root reached through a link");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        victim_intact();
        let _ = std::fs::remove_dir_all(&base);
    }
}
