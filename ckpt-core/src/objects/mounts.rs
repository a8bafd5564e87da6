//! The job's mounts: what it mounted, unmounted and changed in its own mount namespace, and the
//! mount namespaces it made (`unshare --mount`, a container runtime inside the job).
//!
//! A job starts in a mount namespace the launcher made: a private copy of the machine's. At a
//! restart, perhaps on another host, the new namespace is again a copy of that host's, so what
//! an image keeps is not a mount table but what the job changed: for its own namespace, the
//! changes since the launcher set it up (the *baseline*, read from the init before the program
//! starts: [`read_table`]); for a namespace a process made, the changes from the namespace it was
//! copied from (its maker's parent's). A restart replays them in the same order
//! ([`apply`]): the job's namespace right after the init is started, a made namespace in its
//! first process (its *maker*, by an injected `unshare(CLONE_NEWNS)`) once every process is
//! made, parents first; the other processes of that namespace join it (`setns`). A namespace
//! made in a user namespace of the job's (`unshare -Urm`, [`super::user_namespaces`]) belongs
//! to it, and its changes are replayed from a helper process that entered it
//! ([`crate::nshelper`]), with its tmpfs's owners as it numbers them.
//!
//! Mounts are matched by where they are, which file system and which part of it
//! (mount point, device, root, type); a change is one of:
//! - an unmount of a mount the reference had (only the topmost: its submounts go with it);
//! - new flags (read-only, nosuid, ...) or propagation (shared, slave, private, unbindable) of a
//!   mount both have;
//! - a new mount: a bind of a directory the namespace can see (found by device and root among
//!   the mounts before it), a tmpfs with its whole contents (a tree of directories, files,
//!   links and FIFOs, with modes, owners and times: [`TreeRecord`]), or a file system that holds
//!   no state of its own (proc, sysfs, mqueue, devpts, cgroup2: [`STATELESS`]), mounted fresh.
//!   Other file systems (a disk, overlay, FUSE) are refused, naming the mount.
//!
//! Paths are resolved at restart without following symbolic links (mount points and bind
//! sources read from /proc/PID/mountinfo have none), so that a link put in the way since the
//! checkpoint cannot redirect a mount.
//!
//! Known limits: peer groups are made again as far as copying a namespace and marking a
//! mount gives them (a slave's master is the mount it was copied from); files hidden under a
//! mount inside a tmpfs are not kept (the mount point is made again empty, with the mode of
//! what is mounted on it and the tmpfs's owner); holes in a tmpfs's files come back as zeros.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use serde::{Deserialize, Serialize};

use super::user_namespaces::Numbering;
use crate::error::Context;
use crate::ptrace::Tid;
use crate::sys::mount as sys;
use crate::{Error, Result};

/// File systems mounted fresh at restart: they hold no state of the job's (proc shows the
/// job's PID namespace, mqueue its IPC namespace, the restart makes both again).
pub const STATELESS: &[&str] = &[
    "proc",
    "sysfs",
    "mqueue",
    "devpts",
    "cgroup2",
    "cgroup",
    "bpf",
    "tracefs",
    "debugfs",
    "securityfs",
    "configfs",
    "fusectl",
    "pstore",
    "hugetlbfs",
    "binfmt_misc",
];

/// Most bytes of tmpfs contents one node's image keeps.
pub const MAX_TREE_BYTES: u64 = 256 << 20;
/// Most entries of one tmpfs's tree.
pub const MAX_TREE_ENTRIES: usize = 1 << 20;

/// One line of /proc/PID/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub id: u32,
    pub parent: u32,
    pub dev: (u32, u32),
    /// The directory of the file system at the root of the mount.
    pub root: String,
    /// Where it is mounted, as the reading process sees it.
    pub at: String,
    /// Per-mount options (ro, nosuid, ...), as MS_* flags.
    pub flags: u64,
    pub propagation: Propagation,
    pub fstype: String,
    pub source: String,
    /// The file system's own options (`size=...,mode=...` for a tmpfs).
    pub super_options: String,
}

/// How mount and unmount events reach a mount from its peers and master (mount_namespaces(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Propagation {
    Private,
    Shared,
    Slave,
    SharedAndSlave,
    Unbindable,
}

impl Propagation {
    /// The mount(2) calls that give a mount this propagation, in order.
    fn steps(self) -> &'static [u64] {
        match self {
            Propagation::Private => &[libc::MS_PRIVATE],
            Propagation::Shared => &[libc::MS_SHARED],
            Propagation::Slave => &[libc::MS_SLAVE],
            // A slave that is shared too: made a slave of what it was copied from, then shared.
            Propagation::SharedAndSlave => &[libc::MS_SLAVE, libc::MS_SHARED],
            Propagation::Unbindable => &[libc::MS_UNBINDABLE],
        }
    }
}

/// The per-mount flags mountinfo shows, and the MS_* bit each stands for.
const FLAGS: &[(&str, u64)] = &[
    ("ro", libc::MS_RDONLY),
    ("nosuid", libc::MS_NOSUID),
    ("nodev", libc::MS_NODEV),
    ("noexec", libc::MS_NOEXEC),
    ("noatime", libc::MS_NOATIME),
    ("nodiratime", libc::MS_NODIRATIME),
    ("relatime", libc::MS_RELATIME),
    ("nosymfollow", 256), // MS_NOSYMFOLLOW, Linux 5.10
];

/// Every bit a mount's flags may hold: a record with others is refused.
const ALL_FLAGS: u64 = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_NOATIME | libc::MS_NODIRATIME | libc::MS_RELATIME | 256;

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/PID/mountinfo. Pure.
pub fn parse_mountinfo(text: &str) -> std::result::Result<Vec<MountInfo>, String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let bad = || format!("mountinfo line {line:?}");
        let (head, tail) = line.split_once(" - ").ok_or_else(bad)?;
        let head: Vec<&str> = head.split(' ').collect();
        let tail: Vec<&str> = tail.split(' ').collect();
        if head.len() < 6 || tail.len() < 3 {
            return Err(bad());
        }
        let (major, minor) = head[2].split_once(':').ok_or_else(bad)?;
        let mut flags = 0;
        for opt in head[5].split(',') {
            if let Some((_, bit)) = FLAGS.iter().find(|(name, _)| *name == opt) {
                flags |= bit;
            }
        }
        let optional = &head[6..];
        let shared = optional.iter().any(|o| o.starts_with("shared:"));
        let slave = optional.iter().any(|o| o.starts_with("master:"));
        let propagation = match (shared, slave, optional.contains(&"unbindable")) {
            (_, _, true) => Propagation::Unbindable,
            (true, true, _) => Propagation::SharedAndSlave,
            (true, false, _) => Propagation::Shared,
            (false, true, _) => Propagation::Slave,
            (false, false, _) => Propagation::Private,
        };
        out.push(MountInfo {
            id: head[0].parse().map_err(|_| bad())?,
            parent: head[1].parse().map_err(|_| bad())?,
            dev: (major.parse().map_err(|_| bad())?, minor.parse().map_err(|_| bad())?),
            root: unescape(head[3]),
            at: unescape(head[4]),
            flags,
            propagation,
            fstype: unescape(tail[0]),
            source: unescape(tail[1]),
            super_options: unescape(tail[2]),
        });
    }
    Ok(parents_first(out))
}

/// The table with every mount after the one it is mounted on, otherwise in mountinfo's order.
/// mountinfo lists a namespace's mounts in the order they were attached, mostly; but a copy
/// made before it is attached (open_tree, as a restart's replay makes binds whose sources a
/// later mount hides) keeps its place among those made before the mount it is attached to,
/// and the changes of a table are replayed in its order. Pure.
fn parents_first(table: Vec<MountInfo>) -> Vec<MountInfo> {
    let ids: HashSet<u32> = table.iter().map(|m| m.id).collect();
    // Mounts whose parent comes later, by that parent: placed right after it.
    let mut waiting: HashMap<u32, Vec<MountInfo>> = HashMap::new();
    let mut ready = Vec::new();
    // Mounts placed in the table's order so far (not those waiting for a parent: their
    // children wait for them in turn).
    let mut in_order: HashSet<u32> = HashSet::new();
    for m in table {
        // A parent outside the table (the root's) or the mount itself (a root): no wait.
        if m.parent != m.id && ids.contains(&m.parent) && !in_order.contains(&m.parent) {
            waiting.entry(m.parent).or_default().push(m);
        } else {
            in_order.insert(m.id);
            ready.push(m);
        }
    }
    let mut out = Vec::with_capacity(ids.len());
    let mut stack: Vec<MountInfo> = ready.into_iter().rev().collect();
    while let Some(m) = stack.pop() {
        if let Some(children) = waiting.remove(&m.id) {
            stack.extend(children.into_iter().rev());
        }
        out.push(m);
    }
    // A cycle cannot be; if the table says so anyway, the rest as it is.
    out.extend(waiting.into_values().flatten());
    out
}

/// The mount table of process `pid`'s namespace (host pid), as it sees it.
pub fn read_table(pid: Tid) -> Result<Vec<MountInfo>> {
    let path = format!("/proc/{pid}/mountinfo");
    let text = std::fs::read_to_string(&path).context(|| format!("read {path}"))?;
    parse_mountinfo(&text).map_err(|e| Error::Other(format!("{path}: {e}")))
}

/// What a node's image keeps of the job's mounts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MountsRecord {
    /// The job's own namespace first (index 0: its `pids` empty, it holds every process not in
    /// another), then the namespaces the job made, each after the one it was made from.
    pub namespaces: Vec<MountNsRecord>,
}

/// One mount namespace of the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MountNsRecord {
    /// The namespace it is a changed copy of (an index before its own); 0 for the job's own.
    pub made_from: u32,
    /// Its processes (pids in the job), in the image's order; the first is its maker.
    pub pids: Vec<Tid>,
    /// What makes the copy into this namespace, in order.
    pub changes: Vec<MountChange>,
    /// The user namespace it belongs to (an index of `UsersRecord::namespaces`) when that is
    /// not its maker's own but one above it, where the restart makes it on the maker's way
    /// down (ch-run mounts as root of one user namespace, then enters a second). Since format
    /// 16 (none: its maker's own).
    #[serde(deserialize_with = "crate::image::since::since::<16, _, _>")]
    pub owner: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MountChange {
    /// Unmount what is mounted here (with what is mounted below it).
    Unmount { at: String },
    /// A mount both have, with these flags and this propagation now.
    Set { at: String, flags: u64, propagation: Propagation },
    /// A new mount on top of what is at `at`.
    Mount { at: String, source: MountSource, flags: u64, propagation: Propagation },
    /// The namespace's root became a bind of `from` (as the namespace it was made from sees
    /// it), and nothing of the old root is left (pivot_root, then the old root unmounted: a
    /// container runtime). Only first among a namespace's changes; the mounts after it are
    /// where the new root has them, their bind sources still as the namespace made from sees
    /// them. Since format 16.
    PivotRoot { from: String, flags: u64, propagation: Propagation },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MountSource {
    /// A bind of this directory or file, as the namespace sees it before the mount; with
    /// `recursive`, with the mounts below it too (`mount --rbind`: since format 16). With
    /// `before_changes`, `from` is as the namespace it was made from sees it, taken before any
    /// change of this one (since format 19): an earlier mount of the namespace hides it there
    /// (bubblewrap binds a directory of the machine's /tmp below its own tmpfs on /tmp). In a
    /// pivoted namespace every bind's source is so, without the flag.
    Bind {
        from: String,
        #[serde(deserialize_with = "crate::image::since::since::<16, _, _>")]
        recursive: bool,
        #[serde(deserialize_with = "crate::image::since::since::<19, _, _>")]
        before_changes: bool,
    },
    /// A new tmpfs with these options (`size=...,mode=...`) and these contents.
    Tmpfs { options: String, tree: TreeRecord },
    /// A new instance of a file system of [`STATELESS`].
    Fresh { fstype: String, source: String, options: String },
    /// A bind of a file deleted since (ch-run binds temporary files at /etc/passwd and
    /// /etc/group, then removes them): its contents, mode and owner (as the machine numbers
    /// them), and `path`, where it was (for messages: the restart makes the copy on a tmpfs of
    /// its own, mounted nowhere). Since format 16.
    DeletedFile { path: String, contents: Vec<u8>, mode: u32, uid: u32, gid: u32 },
}

/// How mountinfo shows the root of a bind whose file or directory was deleted.
const DELETED_ROOT: &str = "//deleted";

/// The largest deleted file a bind may keep (the contents go into the node record).
const MAX_DELETED_BIND: u64 = 16 << 20;

/// The contents of a tmpfs: its entries, each after the directory that holds it. The root
/// directory is the first entry, with the path "".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeRecord {
    pub entries: Vec<TreeEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// Relative to the file system's root; components separated by '/'.
    pub path: String,
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File {
        data: Vec<u8>,
    },
    Symlink {
        target: String,
    },
    Fifo,
    /// Another name of the file at this earlier entry.
    HardLink {
        to: u32,
    },
    /// A character or block device (root only).
    Device {
        rdev: u64,
        block: bool,
    },
}

impl MountsRecord {
    /// The namespace (index) process `pid` (in the job) is in.
    pub fn namespace_of(&self, pid: Tid) -> usize {
        self.namespaces.iter().position(|ns| ns.pids.contains(&pid)).unwrap_or(0)
    }

    /// One line per namespace with changes, saying what a restart replays (for `ckpt inspect`).
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, ns) in self.namespaces.iter().enumerate() {
            if i > 0 || !ns.changes.is_empty() {
                let whose = if i == 0 {
                    "the job's mount namespace".to_string()
                } else {
                    format!("the mount namespace pid {} made (pids {})", ns.pids[0], ns.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "))
                };
                let what: Vec<String> = ns.changes.iter().map(describe_change).collect();
                out.push(format!("{whose}: {}", if what.is_empty() { "as it was made".to_string() } else { what.join("; ") }));
            }
        }
        out
    }

    /// Where a file at `path` in namespace `ns` comes from at restart: the path on the
    /// restarting host to check it at, or None when the job's own mounts hold it (a tmpfs put
    /// back from the image, a fresh proc): nothing outside the job to check.
    pub fn host_path(&self, ns: usize, path: &str) -> Option<String> {
        self.host_path_before(ns, usize::MAX, path, 0)
    }

    fn host_path_before(&self, ns: usize, before: usize, path: &str, depth: u32) -> Option<String> {
        if depth > 64 {
            return None;
        }
        let Some(rec) = self.namespaces.get(ns) else { return Some(path.to_string()) };
        let upto = before.min(rec.changes.len());
        // In a namespace that pivoted, bind sources are where the namespace it was made from has
        // them, as is the new root.
        let made_from = rec.made_from as usize;
        let pivoted = matches!(rec.changes.first(), Some(MountChange::PivotRoot { .. }));
        // The last mount covering the path is the one it is on.
        for (i, change) in rec.changes[..upto].iter().enumerate().rev() {
            let (at, source) = match change {
                MountChange::Mount { at, source, .. } => (at, source),
                MountChange::PivotRoot { from, .. } => {
                    return self.host_path_before(made_from, usize::MAX, &join(from, path.trim_start_matches('/')), depth + 1)
                }
                _ => continue,
            };
            let Some(rest) = below(at, path) else { continue };
            return match source {
                MountSource::Bind { from, before_changes, .. } if pivoted || *before_changes => {
                    self.host_path_before(made_from, usize::MAX, &join(from, rest), depth + 1)
                }
                MountSource::Bind { from, .. } => self.host_path_before(ns, i, &join(from, rest), depth + 1),
                MountSource::Tmpfs { .. } | MountSource::Fresh { .. } | MountSource::DeletedFile { .. } => None,
            };
        }
        if ns == 0 {
            Some(path.to_string())
        } else {
            self.host_path_before(rec.made_from as usize, usize::MAX, path, depth + 1)
        }
    }
}

fn describe_change(c: &MountChange) -> String {
    let flags = |f: u64, p: Propagation| {
        let mut words: Vec<&str> = FLAGS.iter().filter(|(_, bit)| f & bit != 0).map(|(name, _)| *name).collect();
        if p != Propagation::Private {
            words.push(match p {
                Propagation::Shared => "shared",
                Propagation::Slave => "slave",
                Propagation::SharedAndSlave => "shared slave",
                _ => "unbindable",
            });
        }
        if words.is_empty() {
            String::new()
        } else {
            format!(" ({})", words.join(", "))
        }
    };
    match c {
        MountChange::Unmount { at } => format!("unmounted {at}"),
        MountChange::PivotRoot { from, flags: f, propagation } => format!("the root pivoted into {from}, the old one gone{}", flags(*f, *propagation)),
        MountChange::Set { at, flags: f, propagation } => format!("{at} with other flags{}", flags(*f, *propagation)),
        MountChange::Mount { at, source, flags: f, propagation } => match source {
            MountSource::Bind { from, recursive, before_changes } => format!(
                "{} of {from}{} at {at}{}",
                if *recursive { "recursive bind" } else { "bind" },
                if *before_changes { " (as the namespace it was made from has it)" } else { "" },
                flags(*f, *propagation)
            ),
            MountSource::Tmpfs { options, tree } => {
                let bytes: usize = tree.entries.iter().map(|e| if let EntryKind::File { data } = &e.kind { data.len() } else { 0 }).sum();
                format!("tmpfs at {at} [{options}] holding {} entries, {bytes} bytes{}", tree.entries.len(), flags(*f, *propagation))
            }
            MountSource::Fresh { fstype, .. } => format!("{fstype} at {at}{}", flags(*f, *propagation)),
            MountSource::DeletedFile { path, contents, .. } => {
                format!("bind of {path}, deleted since ({} bytes), at {at}{}", contents.len(), flags(*f, *propagation))
            }
        },
    }
}

/// The part of `path` below mount point `at` ("" for `at` itself), or None if it is not below.
fn below<'a>(at: &str, path: &'a str) -> Option<&'a str> {
    if at == "/" {
        return Some(path.trim_start_matches('/'));
    }
    let rest = path.strip_prefix(at)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

fn join(dir: &str, rest: &str) -> String {
    match (dir, rest) {
        (_, "") => dir.to_string(),
        ("/", _) => format!("/{rest}"),
        _ => format!("{}/{rest}", dir.trim_end_matches('/')),
    }
}

/// The key mounts are matched by between two tables.
fn key(m: &MountInfo) -> (&str, (u32, u32), &str, &str) {
    (&m.at, m.dev, &m.root, &m.fstype)
}

/// A new mount found in a table, before its source is known.
pub struct Added<'a> {
    pub mount: &'a MountInfo,
    /// Where it is a bind of, when it is one: through a mount before it (kept, or added
    /// earlier) of the same file system whose root holds its root, at a path no later mount
    /// hides; or else where the namespace it was made from has it (see [`BindOf`]).
    pub bind_of: Option<BindOf>,
}

/// The source of a bind, as [`diff`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindOf {
    pub from: String,
    /// `from` is as the namespace it was made from sees it: in this one, a mount made since
    /// hides it ([`MountSource::Bind`]'s `before_changes`).
    pub before_changes: bool,
}

/// The changes that make `reference` into `table` (see the module), in order, the new mounts
/// still to be given their source. Pure.
pub fn diff<'a>(reference: &[MountInfo], table: &'a [MountInfo]) -> Vec<Planned<'a>> {
    let mut used = vec![false; table.len()];
    let mut kept_ref = vec![false; reference.len()];
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for (ri, r) in reference.iter().enumerate() {
        if let Some(ti) = table.iter().enumerate().position(|(ti, t)| !used[ti] && key(t) == key(r)) {
            used[ti] = true;
            kept_ref[ri] = true;
            pairs.push((ri, ti));
        }
    }
    let mut out = Vec::new();
    // Unmounts: the topmost gone mounts (a gone mount whose parent is gone goes with it).
    let ref_index: HashMap<u32, usize> = reference.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    for (ri, r) in reference.iter().enumerate().rev() {
        let parent_gone = ref_index.get(&r.parent).is_some_and(|&pi| pi != ri && !kept_ref[pi]);
        if !kept_ref[ri] && !parent_gone {
            out.push(Planned::Ready(MountChange::Unmount { at: r.at.clone() }));
        }
    }
    for &(ri, ti) in &pairs {
        let (r, t) = (&reference[ri], &table[ti]);
        if (r.flags, r.propagation) != (t.flags, t.propagation) {
            out.push(Planned::Ready(MountChange::Set { at: t.at.clone(), flags: t.flags, propagation: t.propagation }));
        }
    }
    for (ti, t) in table.iter().enumerate() {
        if used[ti] {
            continue;
        }
        // Mounts there when this one is made: the table's earlier ones (kept, or added
        // before it: a table lists mounts in the order they were made) and kept later ones.
        let there = |j: usize| j != ti && (j < ti || used[j]);
        // A path through mount j that a mount made after it, at or below it, covers is not
        // that file system's there.
        let hidden = |j: usize, path: &str| {
            table.iter().enumerate().any(|(k, other)| k > j && there(k) && below(&table[j].at, &other.at).is_some() && below(&other.at, path).is_some())
        };
        let through_this = table
            .iter()
            .enumerate()
            .filter(|&(j, m)| there(j) && m.dev == t.dev)
            .filter_map(|(j, m)| below(&m.root, &t.root).map(|rest| (j, join(&m.at, rest))))
            .find(|(j, path)| !hidden(*j, path))
            .map(|(_, from)| BindOf { from, before_changes: false });
        let bind_of = through_this.or_else(|| bind_source_in(reference, t).map(|(from, _)| BindOf { from, before_changes: true }));
        out.push(Planned::Add(Added { mount: t, bind_of }));
    }
    out
}

/// A change, or a new mount whose source [`capture`] still has to read.
pub enum Planned<'a> {
    Ready(MountChange),
    Add(Added<'a>),
}

/// Captures the job's mounts while it is frozen (see the module): `init` is the job's init (host
/// pid), `baseline` the table of the job's namespace as the launcher set it up, `members` the
/// job's processes in the image's order (parents first).
pub fn capture(init: Tid, baseline: &[MountInfo], members: &[super::namespaces::Member]) -> Result<MountsRecord> {
    let groups = super::namespaces::group("mnt", init, members)?;
    let reader_of: Vec<Tid> = groups.iter().map(|g| g.reader).collect();
    let mut record = MountsRecord {
        namespaces: groups.into_iter().map(|g| MountNsRecord { made_from: g.made_from, pids: g.pids, changes: Vec::new(), owner: None }).collect(),
    };
    let mut tables: Vec<Vec<MountInfo>> = Vec::new();
    for &reader in &reader_of {
        tables.push(read_table(reader)?);
    }
    // An ordinary user's job holds no capability in its own mount namespace (only the init
    // does, and it mounts nothing after the baseline): whatever differs there came from
    // outside (a mount event propagated before the init made its mounts private, seen in CI),
    // not from the job, and a restart could not replay it without privilege anyway.
    if !crate::userns::privileged() {
        if tables[0] != baseline {
            tracing::debug!("the job's mount namespace differs from its baseline; not the job's doing (it cannot mount): not recorded");
        }
        tables[0] = baseline.to_vec();
    }
    let mut tree_bytes = 0u64;
    for i in 0..record.namespaces.len() {
        let reference: &[MountInfo] = if i == 0 { baseline } else { &tables[record.namespaces[i].made_from as usize] };
        let reader = reader_of[i];
        let maker = record.namespaces[i].pids.first().copied().unwrap_or(1);
        let mut new_source = |m: &MountInfo, bind_of: Option<BindOf>| new_mount_source(m, bind_of, (reader, maker), &mut tree_bytes);
        let pivoted = if i > 0 { pivoted_root(reference, &tables[i]) } else { None };
        let changes = match pivoted {
            Some(root) => pivoted_changes(reference, &tables[i], root, maker, &mut new_source)?,
            None => {
                let mut changes = Vec::new();
                for p in diff(reference, &tables[i]) {
                    match p {
                        Planned::Ready(c) => changes.push(c),
                        Planned::Add(Added { mount: m, bind_of }) => {
                            changes.push(MountChange::Mount { at: m.at.clone(), source: new_source(m, bind_of)?, flags: m.flags, propagation: m.propagation })
                        }
                    }
                }
                changes
            }
        };
        record.namespaces[i].changes = changes;
    }
    Ok(record)
}

/// What a new mount is made of: a bind of `bind_of` when it is one, a tmpfs with its contents
/// (read through `reader`), a fresh file system without contents; any other is refused, naming
/// `maker`, the namespace's first process.
fn new_mount_source(m: &MountInfo, bind_of: Option<BindOf>, (reader, maker): (Tid, Tid), tree_bytes: &mut u64) -> Result<MountSource> {
    // A bind of a file deleted since; without a source the namespace before shows, one a
    // restart made (on a tmpfs of its own, mounted nowhere).
    let from = bind_of.as_ref().map(|b| b.from.as_str());
    if let Some(from) = from.and_then(|f| f.strip_suffix(DELETED_ROOT)).or_else(|| m.root.strip_suffix(DELETED_ROOT).filter(|_| bind_of.is_none())) {
        return deleted_file_bind(m, from, (reader, maker), tree_bytes);
    }
    Ok(if let Some(BindOf { from, before_changes }) = bind_of {
        MountSource::Bind { from, recursive: false, before_changes }
    } else if m.fstype == "tmpfs" && m.root == "/" {
        let tree = capture_tree(reader, &m.at, m.dev, tree_bytes).map_err(|what| Error::Unsupported { pid: maker, what })?;
        MountSource::Tmpfs { options: fs_options(&m.super_options), tree }
    } else if STATELESS.contains(&m.fstype.as_str()) {
        MountSource::Fresh { fstype: m.fstype.clone(), source: m.source.clone(), options: fs_options(&m.super_options) }
    } else {
        return Err(Error::Unsupported {
            pid: maker,
            what: format!(
                "{} {} file system mounted at {} by the job ({}{}): only tmpfs, bind mounts and file systems without contents (proc, sysfs, mqueue, ...) are kept",
                if m.fstype.starts_with(['a', 'e', 'i', 'o', 'u']) { "an" } else { "a" },
                m.fstype,
                m.at,
                m.source,
                if m.root == "/" { String::new() } else { format!(", its directory {}", m.root) }
            ),
        });
    })
}

/// A bind of a file deleted since (`from`: where it was, as the namespace made from shows it):
/// its contents, read through the mount, become the record's.
fn deleted_file_bind(m: &MountInfo, from: &str, (reader, maker): (Tid, Tid), tree_bytes: &mut u64) -> Result<MountSource> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| Error::Unsupported { pid: maker, what: format!("a bind at {} of {from}, deleted since: {why}", m.at) };
    let path = crate::procfs::in_namespace_of(reader, &m.at);
    let meta = std::fs::metadata(&path).map_err(|e| refuse(format!("stat {path}: {e}")))?;
    if !meta.is_file() {
        return Err(refuse("not a file (a removed directory is not kept)".into()));
    }
    if meta.size() > MAX_DELETED_BIND || *tree_bytes + meta.size() > MAX_TREE_BYTES {
        return Err(refuse(format!("{} bytes, above what a checkpoint keeps of mounts", meta.size())));
    }
    let contents = std::fs::read(&path).map_err(|e| refuse(format!("read {path}: {e}")))?;
    *tree_bytes += contents.len() as u64;
    Ok(MountSource::DeletedFile { path: from.to_string(), contents, mode: meta.mode() & 0o7777, uid: meta.uid(), gid: meta.gid() })
}

/// The root mount of a namespace's `table` when it is not the one of the namespace it was made
/// from (`reference`): the namespace pivoted its root (pivot_root, as container runtimes do).
/// Pure.
pub fn pivoted_root<'a>(reference: &[MountInfo], table: &'a [MountInfo]) -> Option<&'a MountInfo> {
    let root = table.iter().find(|m| m.at == "/")?;
    let before = reference.iter().rev().find(|m| m.at == "/");
    (before.map(key) != Some(key(root))).then_some(root)
}

/// Where a bind mount `m` of another namespace's table comes from in `reference`: the path of
/// the directory or file its root is, below the topmost mount of the same file system whose
/// root holds it, and that mount. Pure.
fn bind_source_in<'a>(reference: &'a [MountInfo], m: &MountInfo) -> Option<(String, &'a MountInfo)> {
    reference.iter().rev().filter(|r| r.dev == m.dev).find_map(|r| below(&r.root, &m.root).map(|rest| (join(&r.at, rest), r)))
}

/// The mounts below mount `id` in `table` (children, theirs, ...), in the table's order. Pure.
fn mounts_below(table: &[MountInfo], id: u32) -> Vec<&MountInfo> {
    let mut ids = vec![id];
    let mut out = Vec::new();
    for m in table {
        if m.id != id && ids.contains(&m.parent) {
            ids.push(m.id);
            out.push(m);
        }
    }
    out
}

/// The changes that make a namespace whose root was pivoted (see [`MountChange::PivotRoot`]):
/// the new root, then every other mount of `table` where it is, binds with their sources in
/// `reference` (the namespace it was made from); a bind of a whole mount whose mounts below
/// came along the same (`mount --rbind`) is one recursive bind. Refuses a root or a bind that
/// `reference` does not hold.
fn pivoted_changes(
    reference: &[MountInfo],
    table: &[MountInfo],
    root: &MountInfo,
    maker: Tid,
    new_source: &mut dyn FnMut(&MountInfo, Option<BindOf>) -> Result<MountSource>,
) -> Result<Vec<MountChange>> {
    let outside = |what: String| Error::Unsupported { pid: maker, what };
    let (from, _) = bind_source_in(reference, root).ok_or_else(|| {
        outside(format!(
            "a root pivoted into a {} file system ({}, its directory {}) that the namespace it was made from does not show",
            root.fstype, root.source, root.root
        ))
    })?;
    let mut changes = vec![MountChange::PivotRoot { from, flags: root.flags, propagation: root.propagation }];
    let mut came_along: Vec<u32> = Vec::new();
    for m in table.iter().filter(|m| m.id != root.id) {
        if came_along.contains(&m.id) {
            continue;
        }
        let source = match bind_source_in(reference, m) {
            Some((from, _)) if from.ends_with(DELETED_ROOT) => new_source(m, Some(BindOf { from, before_changes: false }))?,
            Some((from, r)) => {
                let (below_ref, below_here) = (mounts_below(reference, r.id), mounts_below(table, m.id));
                let same =
                    |a: &MountInfo, b: &MountInfo| (a.dev, &a.root, &a.fstype) == (b.dev, &b.root, &b.fstype) && below(&r.at, &a.at) == below(&m.at, &b.at);
                let recursive = r.root == m.root
                    && !below_here.is_empty()
                    && below_ref.len() == below_here.len()
                    && below_ref.iter().zip(&below_here).all(|(a, b)| same(a, b));
                if recursive {
                    came_along.extend(below_here.iter().map(|b| b.id));
                }
                MountSource::Bind { from, recursive, before_changes: false }
            }
            None if m.fstype == "tmpfs" || m.root.ends_with(DELETED_ROOT) || STATELESS.contains(&m.fstype.as_str()) => new_source(m, None)?,
            None => {
                return Err(outside(format!(
                    "a bind at {} (in a pivoted root) of a {} file system the namespace it was made from does not show ({}, its directory {})",
                    m.at, m.fstype, m.source, m.root
                )))
            }
        };
        changes.push(MountChange::Mount { at: m.at.clone(), source, flags: m.flags, propagation: m.propagation });
    }
    Ok(changes)
}

/// A file system's options without those the per-mount flags say (ro/rw) and those the kernel
/// only reports: what `mount -o` takes back.
fn fs_options(super_options: &str) -> String {
    super_options.split(',').filter(|o| !matches!(*o, "rw" | "ro" | "") && !o.starts_with("seclabel")).collect::<Vec<_>>().join(",")
}

/// Reads the contents of the tmpfs mounted at `at` in the namespace of `reader` (host pid),
/// through `/proc/READER/root`, without entering what is mounted below it (another device).
fn capture_tree(reader: Tid, at: &str, dev: (u32, u32), total: &mut u64) -> std::result::Result<TreeRecord, String> {
    let top = crate::procfs::in_namespace_of(reader, if at == "/" { "" } else { at });
    let dev = libc::makedev(dev.0, dev.1);
    let mut entries: Vec<TreeEntry> = Vec::new();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut stack: Vec<String> = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let full = if rel.is_empty() { top.clone() } else { format!("{top}/{rel}") };
        let meta = std::fs::symlink_metadata(&full).map_err(|e| format!("the tmpfs mounted at {at}: read {rel:?}: {e}"))?;
        if entries.len() >= MAX_TREE_ENTRIES {
            return Err(format!("a tmpfs mounted at {at} with more than {MAX_TREE_ENTRIES} entries"));
        }
        let ft = meta.file_type();
        // A mount point below this one (a bind into a container's root, say): the directory or
        // file it covers is this file system's, hidden under the mount; it is made again empty,
        // with what shows there now, for the mount to land on (its own contents are the mount's).
        let covered = meta.dev() != dev;
        let kind = if covered {
            if ft.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::File { data: Vec::new() }
            }
        } else if meta.nlink() > 1 && !ft.is_dir() && seen.contains_key(&meta.ino()) {
            EntryKind::HardLink { to: seen[&meta.ino()] }
        } else if ft.is_dir() {
            let mut names: Vec<String> = Vec::new();
            for e in std::fs::read_dir(&full).map_err(|e| format!("the tmpfs mounted at {at}: list {rel:?}: {e}"))? {
                let e = e.map_err(|e| format!("the tmpfs mounted at {at}: list {rel:?}: {e}"))?;
                names.push(e.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            // Popped last first: pushed in reverse, they come out in name order.
            for n in names.into_iter().rev() {
                stack.push(if rel.is_empty() { n } else { format!("{rel}/{n}") });
            }
            EntryKind::Dir
        } else if ft.is_file() {
            *total += meta.len();
            if *total > MAX_TREE_BYTES {
                return Err(format!("tmpfs contents of more than {} MiB in the job's mounts (at {at})", MAX_TREE_BYTES >> 20));
            }
            let data = std::fs::read(&full).map_err(|e| format!("the tmpfs mounted at {at}: read {rel:?}: {e}"))?;
            EntryKind::File { data }
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&full).map_err(|e| format!("the tmpfs mounted at {at}: read link {rel:?}: {e}"))?;
            EntryKind::Symlink { target: target.to_string_lossy().into_owned() }
        } else if ft.is_fifo() {
            EntryKind::Fifo
        } else if ft.is_char_device() || ft.is_block_device() {
            EntryKind::Device { rdev: meta.rdev(), block: ft.is_block_device() }
        } else {
            continue; // a socket file: made again by the bind of its socket, if one holds it
        };
        if meta.nlink() > 1 && !ft.is_dir() && !covered {
            seen.entry(meta.ino()).or_insert(entries.len() as u32);
        }
        // A mount point gets the tmpfs's owner: the mount's may be one the namespace that
        // owns the tmpfs does not map (a bind of root's /usr in an ordinary user's container).
        let (uid, gid) = match entries.first() {
            Some(root) if covered => (root.uid, root.gid),
            _ => (meta.uid(), meta.gid()),
        };
        entries.push(TreeEntry {
            path: rel,
            kind,
            mode: meta.mode() & 0o7777,
            uid,
            gid,
            atime_ns: meta.atime() * 1_000_000_000 + meta.atime_nsec(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        });
    }
    Ok(TreeRecord { entries })
}

/// Checks a record for what would make [`apply`] act outside the job's mounts: every path
/// absolute and without `.` or `..` components, every tree entry's path relative, in a
/// directory of the tree listed before it, hard links to earlier entries, flags known, and
/// namespaces made from earlier ones. Pure.
pub fn validate(rec: &MountsRecord, pids: &[Tid]) -> std::result::Result<(), String> {
    let clean_abs = |p: &str| p.starts_with('/') && !p.contains('\0') && p.split('/').all(|c| c != "." && c != "..");
    let mut bytes = 0u64;
    for (i, ns) in rec.namespaces.iter().enumerate() {
        if i > 0 && (ns.made_from as usize >= i || ns.pids.is_empty()) {
            return Err(format!("mount namespace {i} is made from {} or has no process", ns.made_from));
        }
        if i == 0 && !ns.pids.is_empty() {
            return Err("the job's own mount namespace lists processes".into());
        }
        if let Some(p) = ns.pids.iter().find(|p| !pids.contains(p)) {
            return Err(format!("mount namespace {i} holds pid {p}, which is not in the image"));
        }
        for (j, c) in ns.changes.iter().enumerate() {
            let (at, flags) = match c {
                MountChange::Unmount { at } => (at, 0),
                MountChange::PivotRoot { from, flags, .. } => {
                    if i == 0 || j > 0 {
                        return Err(format!("mount namespace {i} pivots its root at its change {j}"));
                    }
                    (from, *flags)
                }
                MountChange::Set { at, flags, .. } => (at, *flags),
                MountChange::Mount { at, flags, source, .. } => {
                    match source {
                        MountSource::Bind { from, .. } if !clean_abs(from) => return Err(format!("bind source {from:?}")),
                        MountSource::Fresh { fstype, .. } if !STATELESS.contains(&fstype.as_str()) => return Err(format!("file system type {fstype:?}")),
                        MountSource::Tmpfs { tree, .. } => bytes += validate_tree(tree)?,
                        MountSource::DeletedFile { path, contents, mode, .. } => {
                            if !clean_abs(path) || *mode > 0o7777 {
                                return Err(format!("a deleted file's bind from {path:?}, mode {mode:o}"));
                            }
                            bytes += contents.len() as u64;
                        }
                        _ => {}
                    }
                    (at, *flags)
                }
            };
            if !clean_abs(at) {
                return Err(format!("mount point {at:?}"));
            }
            if flags & !ALL_FLAGS != 0 {
                return Err(format!("mount flags {flags:#x} at {at}"));
            }
        }
    }
    if bytes > MAX_TREE_BYTES {
        return Err(format!("{bytes} bytes of tmpfs contents"));
    }
    Ok(())
}

fn validate_tree(tree: &TreeRecord) -> std::result::Result<u64, String> {
    if tree.entries.len() > MAX_TREE_ENTRIES || tree.entries.first().is_some_and(|e| !e.path.is_empty() || e.kind != EntryKind::Dir) {
        return Err("a tmpfs tree whose first entry is not its root directory, or too long".into());
    }
    let mut dirs: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut bytes = 0u64;
    for (i, e) in tree.entries.iter().enumerate() {
        if i > 0 {
            let ok =
                !e.path.is_empty() && !e.path.starts_with('/') && !e.path.contains('\0') && e.path.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
            let parent = e.path.rsplit_once('/').map_or("", |(p, _)| p);
            if !ok || !dirs.contains(parent) {
                return Err(format!("tmpfs entry {:?}", e.path));
            }
        }
        match &e.kind {
            EntryKind::Dir => {
                dirs.insert(&e.path);
            }
            EntryKind::File { data } => bytes += data.len() as u64,
            EntryKind::HardLink { to } if *to as usize >= i || matches!(tree.entries[*to as usize].kind, EntryKind::Dir | EntryKind::HardLink { .. }) => {
                return Err(format!("tmpfs entry {:?} links to entry {to}", e.path))
            }
            _ => {}
        }
    }
    Ok(bytes)
}

/// Replays `changes` in the mount namespace of process `host_pid` (see the module), from a
/// thread of ours that enters it when the process is in our user namespace (root's job), else
/// from a helper process that enters its user namespace first ([`crate::nshelper`]: a mount
/// namespace the job made in a user namespace of its own belongs to that one). `numbering` is
/// how the process's user namespace numbers ids: a tmpfs's files get their owners as it does.
pub fn apply(host_pid: Tid, changes: &[MountChange], numbering: Numbering) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    if !crate::nshelper::same_namespace("user", host_pid)? {
        use crate::nshelper::{run, Enter, Work::Mounts};
        let changes = changes.iter().map(|c| c.owners_as(numbering)).collect();
        return run(host_pid, &[Enter::User, Enter::Mount], Mounts(changes)).map(drop);
    }
    let path = format!("/proc/{host_pid}/ns/mnt");
    let ns = std::fs::File::open(&path).context(|| format!("open {path}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            sys::enter_mount_namespace(&ns).context(|| format!("enter the mount namespace of pid {host_pid}"))?;
            apply_here(changes)
        })
        .join()
        .unwrap_or_else(|_| Err(Error::Other("the thread replaying the job's mounts panicked".into())))
    })
}

/// Replays `changes` in the calling thread's mount namespace.
pub fn apply_here(changes: &[MountChange]) -> Result<()> {
    match changes.split_first() {
        Some((MountChange::PivotRoot { from, flags, propagation }, rest)) => apply_pivoted((from, *flags, *propagation), rest),
        // Binds whose sources a mount made here hides are copied first, as the namespace it
        // was made from has them.
        _ => {
            let early = changes
                .iter()
                .map(|c| match c {
                    MountChange::Mount { at, source: source @ MountSource::Bind { before_changes: true, .. }, .. } => copy_of(at, source),
                    _ => Ok(None),
                })
                .collect::<Result<Vec<_>>>()?;
            changes.iter().zip(early).try_for_each(|(c, copy)| apply_one(c, copy))
        }
    }
}

/// Makes a namespace whose root was pivoted (see [`MountChange::PivotRoot`]): what its binds
/// take from the old root is cloned first (open_tree: detached copies), the new root is bound
/// over `from` and pivoted into (pivot_root(".", "."), the old root then detached from above
/// it), and the mounts are attached where the new root has them.
fn apply_pivoted((from, flags, propagation): (&str, u64, Propagation), rest: &[MountChange]) -> Result<()> {
    let copies = rest
        .iter()
        .map(|c| match c {
            MountChange::Mount { at, source, .. } => copy_of(at, source),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    // pivot_root takes no shared mount; the old root is dropped anyway.
    sys::make_private_below_root().context(|| "make the old root's mounts private before pivoting".to_string())?;
    let dir = sys::open_path(from).context(|| format!("find {from}, the root to pivot into"))?;
    let new_root = sys::clone_tree(&dir, false).context(|| format!("copy {from}, the root to pivot into"))?;
    sys::attach(&new_root, &dir).context(|| format!("bind {from} to pivot into it"))?;
    sys::pivot_into(&sys::open_path(from).context(|| format!("find the bind of {from}"))?).context(|| format!("pivot the root into {from}"))?;
    let root = sys::open_path("/").context(|| "find the new root".to_string())?;
    sys::remount_flags(&root, flags).context(|| format!("give the new root its flags {flags:#x}"))?;
    if propagation != Propagation::Private {
        sys::set_propagation(&root, propagation.steps()).context(|| format!("give the new root its propagation {propagation:?}"))?;
    }
    rest.iter().zip(copies).try_for_each(|(c, copy)| apply_one(c, copy))
}

/// A detached copy of what a new mount at `at` is made of, for a bind (of a path, or of a
/// deleted file's copy); None for a file system made anew.
fn copy_of(at: &str, source: &MountSource) -> Result<Option<Copy>> {
    Ok(Some(match source {
        MountSource::Bind { from, recursive, .. } => {
            let src = sys::open_path(from).context(|| format!("bind {from} at {at} again: find {from}"))?;
            let tree = match sys::clone_tree(&src, *recursive) {
                // The machine mounted something below the source since the checkpoint (another
                // job's scratch tmpfs below /tmp), and this namespace's user namespace is not
                // the one those mounts were made in: the kernel locks them to the mount above
                // and copies it only with them (EINVAL otherwise: a copy without them would
                // show what they cover). The bind then shows them, as a bind made now would.
                Err(e) if !*recursive && e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::info!(from, at, "mounts the machine made below the source since are locked to it: bound with them");
                    sys::clone_tree(&src, true)
                }
                other => other,
            };
            Copy { tree: tree.context(|| format!("bind {from} at {at} again: copy it"))?, remove: None }
        }
        MountSource::DeletedFile { path, contents, mode, uid, gid } => deleted_file_tree(at, (path, contents), (*mode, *uid, *gid))?,
        MountSource::Tmpfs { .. } | MountSource::Fresh { .. } => return Ok(None),
    }))
}

impl MountChange {
    /// The same change with a tmpfs's owners (its files', and its `uid=` and `gid=` options) as
    /// `numbering` has them (recorded as the machine numbers them).
    fn owners_as(&self, numbering: Numbering) -> MountChange {
        let mut c = self.clone();
        if let MountChange::Mount { source: MountSource::DeletedFile { uid, gid, .. }, .. } = &mut c {
            (*uid, *gid) = (numbering.uid(*uid), numbering.gid(*gid));
        }
        if let MountChange::Mount { source: MountSource::Tmpfs { tree, options }, .. } = &mut c {
            for e in &mut tree.entries {
                (e.uid, e.gid) = (numbering.uid(e.uid), numbering.gid(e.gid));
            }
            *options = options
                .split(',')
                .map(|o| match o.split_once('=') {
                    Some(("uid", id)) => id.parse().map_or(o.to_string(), |id| format!("uid={}", numbering.uid(id))),
                    Some(("gid", id)) => id.parse().map_or(o.to_string(), |id| format!("gid={}", numbering.gid(id))),
                    _ => o.to_string(),
                })
                .collect::<Vec<_>>()
                .join(",");
        }
        c
    }
}

/// Replays one change; `copy`, for a bind in a pivoted root, is the copy of its source made
/// before the pivot ([`copy_of`]).
fn apply_one(change: &MountChange, copy: Option<Copy>) -> Result<()> {
    match change {
        MountChange::PivotRoot { from, .. } => Err(Error::Forged { what: format!("a pivot into {from} after other changes of its namespace") }),
        MountChange::Unmount { at } => {
            // Nothing mounted there (the path gone, or no mount on it) is what the change
            // leaves: a mount the machine removed under the job (`ip netns delete` removes its
            // file, and the kernel takes the mount on it away in every namespace) is recorded
            // as unmounted and may not be there at the restart either.
            let not_mounted = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL));
            let skipped = |e: std::io::Error| {
                tracing::info!(at, error = %e, "nothing mounted there to unmount again: left as it is");
                Ok(())
            };
            let target = match sys::open_path(at) {
                Err(e) if not_mounted(&e) => return skipped(e),
                other => other.context(|| format!("unmount {at} again: find it"))?,
            };
            match sys::unmount_detached(&target) {
                Err(e) if not_mounted(&e) => skipped(e),
                other => other.context(|| format!("unmount {at} again")),
            }
        }
        MountChange::Set { at, flags, propagation } => {
            // A mount of the namespace this one was made from, kept with other flags. The
            // machine may have removed it since the checkpoint (`ip netns delete` takes the
            // mount on its file away in every namespace): then there is nothing to set, and the
            // job's namespace is left without it, as the machine's is.
            let gone = |why: &str| {
                tracing::info!(at, why, "a mount the machine no longer has: nothing to set again");
                Ok(())
            };
            let target = match sys::open_path(at) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return gone("its path is gone"),
                other => other.context(|| format!("find mount {at}"))?,
            };
            if !sys::is_mount_root(&target).context(|| format!("find mount {at}: is it mounted"))? {
                return gone("nothing is mounted there");
            }
            sys::remount_flags(&target, *flags).context(|| format!("give mount {at} its flags {flags:#x} again"))?;
            sys::set_propagation(&target, propagation.steps()).context(|| format!("give mount {at} its propagation {propagation:?} again"))
        }
        MountChange::Mount { at, source, flags, propagation } => {
            let target = sys::open_path(at).context(|| format!("mount at {at} again: find the mount point"))?;
            let copy = match copy {
                Some(copy) => Some(copy),
                None => copy_of(at, source)?,
            };
            match source {
                MountSource::Bind { .. } | MountSource::DeletedFile { .. } => {
                    let copy = copy.expect("a bind has its copy");
                    let attached = sys::attach(&copy.tree, &target).context(|| format!("bind {} at {at} again", describe_source(source)));
                    // A deleted file's copy loses its name once bound, as it had.
                    if let Some((dir, name)) = &copy.remove {
                        sys::remove_at(dir, name).context(|| format!("remove the copy of {} again ({name})", describe_source(source)))?;
                    }
                    attached?;
                }
                MountSource::Tmpfs { options, tree } => {
                    sys::mount_new("tmpfs", "tmpfs", &target, 0, options).context(|| format!("mount a tmpfs at {at} again ({options})"))?;
                    let root = sys::open_path(at).context(|| format!("open the tmpfs mounted at {at}"))?;
                    fill_tree(&root, tree).map_err(|e| Error::Other(format!("put back the contents of the tmpfs at {at}: {e}")))?;
                }
                MountSource::Fresh { fstype, source, options } => {
                    sys::mount_new(fstype, source, &target, 0, options).context(|| format!("mount {fstype} at {at} again"))?;
                }
            }
            let mounted = sys::open_path(at).context(|| format!("find the mount at {at}"))?;
            if *flags != 0 {
                sys::remount_flags(&mounted, *flags).context(|| format!("give mount {at} its flags {flags:#x} again"))?;
            }
            if *propagation != Propagation::Private {
                sys::set_propagation(&mounted, propagation.steps()).context(|| format!("give mount {at} its propagation {propagation:?} again"))?;
            }
            Ok(())
        }
    }
}

/// What a bind's source is, for messages.
fn describe_source(source: &MountSource) -> String {
    match source {
        MountSource::Bind { from, .. } => from.clone(),
        MountSource::DeletedFile { path, .. } => format!("the copy of {path}"),
        MountSource::Tmpfs { .. } => "a tmpfs".into(),
        MountSource::Fresh { fstype, .. } => fstype.clone(),
    }
}

/// A detached copy of a mount to attach ([`copy_of`]; made before a pivot when the root is
/// pivoted): with the name of a file to remove once it is attached (`remove`: its directory
/// and its name there).
struct Copy {
    tree: OwnedFd,
    remove: Option<(OwnedFd, String)>,
}

/// A detached bind of a new file holding `contents`, with its mode and owner, made on a tmpfs
/// of its own that is mounted nowhere (never on the host's file systems: an image cannot make
/// a restart create a file anywhere), whose name there is removed once the bind is attached
/// (the kernel attaches no bind of a file without a name; mountinfo then shows it deleted, as
/// it was): what a bind of a deleted file is made of again ([`MountSource::DeletedFile`]). An
/// owner the namespace does not map is left as the restart's (a warning says so).
fn deleted_file_tree(at: &str, (path, contents): (&str, &[u8]), (mode, uid, gid): (u32, u32, u32)) -> Result<Copy> {
    let what = || format!("make the copy of {path}, bound at {at}");
    let name = path.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("file");
    let fs = sys::detached_tmpfs().context(what)?;
    let file = sys::create_at(&fs, name).context(what)?;
    let mut f = std::fs::File::from(file);
    std::io::Write::write_all(&mut f, contents).context(what)?;
    if let Err(e) = std::os::unix::fs::fchown(&f, Some(uid), Some(gid)) {
        tracing::warn!(path, uid, gid, error = %e, "the copy of a deleted file bound in the job keeps the restart's owner");
    }
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)).context(what)?;
    let tree = sys::clone_tree_at(&fs, name).context(what)?;
    Ok(Copy { tree, remove: Some((fs, name.to_string())) })
}

/// Writes a tmpfs's entries below `root` (a fresh tmpfs: nothing there but what we write; every
/// entry's directory is one of ours, validated), by paths relative to it (this thread's working
/// directory: its /proc/self is not in the job's /proc), then the directories' modes and times,
/// deepest first, so that a read-only directory is filled before it becomes read-only.
fn fill_tree(root: &OwnedFd, tree: &TreeRecord) -> std::io::Result<()> {
    sys::change_dir(root)?;
    let rel = |path: &str| if path.is_empty() { ".".to_string() } else { path.to_string() };
    let mut names: BTreeMap<u32, String> = BTreeMap::new();
    for (i, e) in tree.entries.iter().enumerate() {
        let at = rel(&e.path);
        match &e.kind {
            EntryKind::Dir if e.path.is_empty() => {}
            EntryKind::Dir => std::fs::create_dir(&at)?,
            EntryKind::File { data } => {
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&at)?;
                std::io::Write::write_all(&mut f, data)?;
            }
            EntryKind::Symlink { target } => std::os::unix::fs::symlink(target, &at)?,
            EntryKind::Fifo => sys::mknod(&at, libc::S_IFIFO, 0)?,
            EntryKind::Device { rdev, block } => sys::mknod(&at, if *block { libc::S_IFBLK } else { libc::S_IFCHR }, *rdev)?,
            EntryKind::HardLink { to } => {
                let first = names.get(to).ok_or_else(|| std::io::Error::other(format!("{}: links to an entry not made", e.path)))?;
                std::fs::hard_link(first, &at)?;
                continue;
            }
        }
        names.insert(i as u32, at.clone());
        std::os::unix::fs::lchown(&at, Some(e.uid), Some(e.gid))?;
        if !matches!(e.kind, EntryKind::Symlink { .. } | EntryKind::Dir) {
            sys::chmod(&at, e.mode)?;
            sys::set_times(&at, e.atime_ns, e.mtime_ns)?;
        }
    }
    for e in tree.entries.iter().rev() {
        let at = rel(&e.path);
        match e.kind {
            EntryKind::Dir => {
                sys::chmod(&at, e.mode)?;
                sys::set_times(&at, e.atime_ns, e.mtime_ns)?;
            }
            EntryKind::Symlink { .. } => sys::set_times(&at, e.atime_ns, e.mtime_ns)?,
            _ => {}
        }
    }
    sys::change_dir_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw,size=100k
24 22 0:22 / /proc rw,nosuid,nodev,noexec - proc proc rw
25 22 0:30 / /var/tmp rw - tmpfs tmpfs rw,size=10m
";

    fn table(extra: &str) -> Vec<MountInfo> {
        parse_mountinfo(&format!("{BASE}{extra}")).unwrap()
    }

    #[test]
    fn mountinfo_fields_flags_and_propagation() {
        let t = parse_mountinfo("40 22 0:41 /sub /mnt/with\\040space ro,nosuid shared:5 master:2 - tmpfs none rw,size=1024k,mode=755\n").unwrap();
        assert_eq!(t[0].at, "/mnt/with space");
        assert_eq!(t[0].root, "/sub");
        assert_eq!(t[0].flags, libc::MS_RDONLY | libc::MS_NOSUID);
        assert_eq!(t[0].propagation, Propagation::SharedAndSlave);
        assert_eq!(t[0].dev, (0, 41));
        assert_eq!(fs_options(&t[0].super_options), "size=1024k,mode=755");
    }

    #[test]
    fn the_diff_lists_unmounts_changes_and_new_mounts_with_their_bind_source() {
        let reference = table("");
        // /var/tmp gone, /proc made read-only, a tmpfs at /mnt/a, a bind of its dir at /mnt/b,
        // a bind of a host directory at /mnt/c.
        let now = parse_mountinfo(
            "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw,size=100k
24 22 0:22 / /proc ro,nosuid,nodev,noexec - proc proc rw
50 22 0:44 / /mnt/a rw - tmpfs none rw,size=1m
51 22 0:44 /d /mnt/b rw - tmpfs none rw,size=1m
52 22 8:1 /home/u /mnt/c rw,relatime - ext4 /dev/sda1 rw
",
        )
        .unwrap();
        let planned = diff(&reference, &now);
        let mut ready = Vec::new();
        let mut adds = Vec::new();
        for p in planned {
            match p {
                Planned::Ready(c) => ready.push(c),
                Planned::Add(a) => adds.push((a.mount.at.clone(), a.bind_of)),
            }
        }
        assert_eq!(ready[0], MountChange::Unmount { at: "/var/tmp".into() });
        assert_eq!(
            ready[1],
            MountChange::Set {
                at: "/proc".into(),
                flags: libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                propagation: Propagation::Private
            }
        );
        assert_eq!(adds.len(), 3);
        let through = |from: &str| Some(BindOf { from: from.into(), before_changes: false });
        assert_eq!(adds, vec![("/mnt/a".into(), None), ("/mnt/b".into(), through("/mnt/a/d")), ("/mnt/c".into(), through("/home/u"))]);
    }

    /// bubblewrap's sandbox: a tmpfs on /tmp, and below it a bind of the machine's /tmp/w/run,
    /// which the tmpfs hides in the namespace: the bind's source is taken as the namespace it
    /// was made from has it. A restart's replay copies that bind before it mounts the tmpfs,
    /// and mountinfo then lists the bind first: the table is read parents first.
    #[test]
    fn a_bind_whose_source_an_earlier_mount_hides_is_taken_from_before() {
        let reference = table("");
        for order in [
            "60 22 0:50 / /tmp rw - tmpfs tmpfs rw\n61 60 8:1 /tmp/w/run /tmp/w/run rw - ext4 /dev/sda1 rw\n",
            "59 60 8:1 /tmp/w/run /tmp/w/run rw - ext4 /dev/sda1 rw\n60 22 0:50 / /tmp rw - tmpfs tmpfs rw\n",
        ] {
            let now = table(order);
            assert_eq!(now.iter().map(|m| m.at.as_str()).collect::<Vec<_>>(), ["/", "/dev", "/proc", "/var/tmp", "/tmp", "/tmp/w/run"], "{order}");
            // A copy's own children, older than the mount it is attached to, wait for it too.
            let chain = parents_first(
                parse_mountinfo("70 90 0:5 / /dev rw - devtmpfs udev rw\n71 70 0:6 / /dev/shm rw - tmpfs tmpfs rw\n90 90 8:1 / / rw - ext4 /dev/sda1 rw\n")
                    .unwrap(),
            );
            assert_eq!(chain.iter().map(|m| m.id).collect::<Vec<_>>(), [90, 70, 71]);
            let adds: Vec<(String, Option<BindOf>)> = diff(&reference, &now)
                .into_iter()
                .filter_map(|p| match p {
                    Planned::Add(a) => Some((a.mount.at.clone(), a.bind_of)),
                    Planned::Ready(_) => None,
                })
                .collect();
            assert_eq!(adds, vec![("/tmp".into(), None), ("/tmp/w/run".into(), Some(BindOf { from: "/tmp/w/run".into(), before_changes: true }))]);
        }
    }

    #[test]
    fn files_under_the_jobs_mounts_are_found_on_the_host_through_binds() {
        let tmpfs = MountSource::Tmpfs { options: String::new(), tree: TreeRecord::default() };
        let m = |at: &str, source: MountSource| MountChange::Mount { at: at.into(), source, flags: 0, propagation: Propagation::Private };
        let rec = MountsRecord {
            namespaces: vec![
                MountNsRecord {
                    made_from: 0,
                    pids: vec![],
                    changes: vec![m("/data", MountSource::Bind { from: "/home/u/data".into(), recursive: false, before_changes: false })],
                    owner: None,
                },
                MountNsRecord {
                    made_from: 0,
                    pids: vec![3],
                    changes: vec![m("/mnt", tmpfs), m("/in", MountSource::Bind { from: "/data/x".into(), recursive: false, before_changes: false })],
                    owner: None,
                },
            ],
        };
        assert_eq!(rec.host_path(0, "/data/f"), Some("/home/u/data/f".into()));
        assert_eq!(rec.host_path(0, "/etc/passwd"), Some("/etc/passwd".into()));
        assert_eq!(rec.host_path(1, "/mnt/f"), None);
        assert_eq!(rec.host_path(1, "/in/y"), Some("/home/u/data/x/y".into()));
        assert_eq!(rec.host_path(1, "/mntx"), Some("/mntx".into()));
        assert_eq!(rec.namespace_of(3), 1);
        assert_eq!(rec.namespace_of(2), 0);
    }

    /// A container's namespace as ch-run leaves it: the image directory as the root, /dev bound
    /// recursively (with the mounts below it), /proc bound, a tmpfs at /tmp.
    #[test]
    fn a_pivoted_root_is_recorded_with_binds_from_the_namespace_before() {
        let reference = table("26 23 0:23 / /dev/shm rw - tmpfs tmpfs rw\n27 26 0:27 / /dev/shm rw - tmpfs tmpfs rw\n");
        assert!(pivoted_root(&reference, &reference).is_none());
        let now = parse_mountinfo(
            "60 50 8:1 /home/u/img / ro,relatime - ext4 /dev/sda1 rw
61 60 0:5 / /dev rw,nosuid - devtmpfs udev rw,size=100k
62 61 0:23 / /dev/shm rw - tmpfs tmpfs rw
63 62 0:27 / /dev/shm rw - tmpfs tmpfs rw
64 60 0:22 / /proc rw,nosuid,nodev,noexec - proc proc rw
65 60 0:45 / /tmp rw - tmpfs tmpfs rw,size=4096k
66 60 8:1 /home/u/data /data rw - ext4 /dev/sda1 rw
",
        )
        .unwrap();
        let root = pivoted_root(&reference, &now).expect("pivoted");
        let mut fresh = |m: &MountInfo, _: Option<BindOf>| Ok(MountSource::Tmpfs { options: fs_options(&m.super_options), tree: TreeRecord::default() });
        let changes = pivoted_changes(&reference, &now, root, 2, &mut fresh).unwrap();
        let bind = |at: &str, from: &str, recursive: bool, flags: u64| MountChange::Mount {
            at: at.into(),
            source: MountSource::Bind { from: from.into(), recursive, before_changes: false },
            flags,
            propagation: Propagation::Private,
        };
        assert_eq!(
            changes,
            vec![
                MountChange::PivotRoot { from: "/home/u/img".into(), flags: libc::MS_RDONLY | libc::MS_RELATIME, propagation: Propagation::Private },
                bind("/dev", "/dev", true, libc::MS_NOSUID),
                bind("/proc", "/proc", false, libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC),
                MountChange::Mount {
                    at: "/tmp".into(),
                    source: MountSource::Tmpfs { options: "size=4096k".into(), tree: TreeRecord::default() },
                    flags: 0,
                    propagation: Propagation::Private
                },
                bind("/data", "/home/u/data", false, 0),
            ]
        );
        // Files inside are found on the host through the pivot and the binds.
        let rec = MountsRecord { namespaces: vec![MountNsRecord::default(), MountNsRecord { made_from: 0, pids: vec![2], changes, owner: None }] };
        assert_eq!(rec.host_path(1, "/bin/app"), Some("/home/u/img/bin/app".into()));
        assert_eq!(rec.host_path(1, "/data/f"), Some("/home/u/data/f".into()));
        assert_eq!(rec.host_path(1, "/tmp/x"), None);
        assert_eq!(validate(&rec, &[2]), Ok(()));
        // A pivot anywhere but first, or in the job's own namespace, is refused.
        let mut late = rec.clone();
        late.namespaces[1].changes.rotate_left(1);
        assert!(validate(&late, &[2]).is_err());
        let mut own = rec.clone();
        own.namespaces[0].changes = own.namespaces[1].changes.clone();
        assert!(validate(&own, &[2]).is_err());
        // A root the namespace before does not show is refused, naming the process.
        let elsewhere = parse_mountinfo("70 50 9:9 / / rw - ext4 /dev/sdb rw\n").unwrap();
        let e = pivoted_changes(&reference, &elsewhere, &elsewhere[0], 2, &mut fresh).unwrap_err();
        assert!(e.to_string().contains("pid 2") && e.to_string().contains("does not show"), "{e}");
    }

    #[test]
    fn records_that_would_reach_outside_are_refused() {
        let entry = |path: &str, kind: EntryKind| TreeEntry { path: path.into(), kind, mode: 0o644, uid: 0, gid: 0, atime_ns: 0, mtime_ns: 0 };
        let with_tree = |entries| MountsRecord {
            namespaces: vec![MountNsRecord {
                made_from: 0,
                pids: vec![],
                changes: vec![MountChange::Mount {
                    at: "/m".into(),
                    source: MountSource::Tmpfs { options: String::new(), tree: TreeRecord { entries } },
                    flags: 0,
                    propagation: Propagation::Private,
                }],
                owner: None,
            }],
        };
        let good = with_tree(vec![
            entry("", EntryKind::Dir),
            entry("d", EntryKind::Dir),
            entry("d/f", EntryKind::File { data: vec![1] }),
            entry("l", EntryKind::HardLink { to: 2 }),
        ]);
        assert_eq!(validate(&good, &[]), Ok(()));
        for bad in [
            with_tree(vec![entry("", EntryKind::Dir), entry("../x", EntryKind::Fifo)]),
            with_tree(vec![
                entry("", EntryKind::Dir),
                entry("s", EntryKind::Symlink { target: "/etc".into() }),
                entry("s/passwd", EntryKind::File { data: vec![] }),
            ]),
            with_tree(vec![entry("", EntryKind::Dir), entry("/abs", EntryKind::Fifo)]),
            with_tree(vec![entry("x", EntryKind::Dir)]),
            with_tree(vec![entry("", EntryKind::Dir), entry("l", EntryKind::HardLink { to: 1 })]),
        ] {
            assert!(validate(&bad, &[]).is_err(), "{bad:?}");
        }
        let up = MountsRecord {
            namespaces: vec![MountNsRecord { made_from: 0, pids: vec![], changes: vec![MountChange::Unmount { at: "/a/../etc".into() }], owner: None }],
        };
        assert!(validate(&up, &[]).is_err());
        let stray = MountsRecord { namespaces: vec![MountNsRecord::default(), MountNsRecord { made_from: 0, pids: vec![9], changes: vec![], owner: None }] };
        assert!(validate(&stray, &[2]).is_err());
    }
}
