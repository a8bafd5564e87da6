//! User namespaces the job made: `unshare --user` (`unshare -Urm`), a container runtime
//! inside the job that makes a user and a mount namespace only (Apptainer without setuid). For an ordinary user this is the
//! only way to mount anything: the mount namespace such a process makes belongs to its user
//! namespace, in which it is root ([`super::mounts`] keeps the mounts).
//!
//! **Capture** groups the job's processes by user namespace ([`super::namespaces::group`]) and
//! reads each namespace's `uid_map`, `gid_map` and `setgroups` from outside (the launcher is in
//! the machine's user namespace, so the maps' outside ids are the machine's).
//!
//! **Restore**: once every process of the job is made (in the init's namespaces), each goes to
//! its own, parents first: a namespace's first process (its maker) makes it by an injected
//! `unshare(CLONE_NEWUSER)`, and its maps are written by [`write_maps`]; the others join it
//! (`setns`). What that order cannot make again is refused at the checkpoint ([`capture`]). The kernel takes a map only from a process in
//! the namespace itself or in its parent, and reads its outside ids as the parent numbers them:
//! the writer is this restorer when the parent is its own namespace (root's job), and otherwise
//! a helper process that entered the parent first (an ordinary user's job, whose namespace is
//! the parent: see [`crate::nshelper`]). The kernel checks the map as it did the first time: an
//! ordinary user can map only their own ids, so a forged image gains nothing.
//!
//! Credentials are recorded as the machine numbers them. A process in a namespace of the job's
//! sets its ids as its namespace numbers them: [`Numbering`] translates (see
//! [`super::creds::restore_last`], [`crate::fsid`], and the owners of a tmpfs's files).

use serde::{Deserialize, Serialize};

use super::namespaces::{self, Member};
use crate::error::{Context, Error, Result};
use crate::ptrace::Tid;

/// The id the kernel shows for one its reader's namespace does not map (`kernel.overflowuid`,
/// `overflowgid`; 65534 unless an administrator changed them).
const OVERFLOW_ID: u32 = 65534;
/// The kernel's limit of lines in a map (`UID_GID_MAP_MAX_EXTENTS`).
const MAX_EXTENTS: usize = 340;

/// The user namespaces the job made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsersRecord {
    /// The job's own first (index 0: its `pids` empty, its maps empty, it holds every process
    /// not in another), then each namespace the job made after the one it was made in.
    pub namespaces: Vec<UserNsRecord>,
}

/// One user namespace of the job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserNsRecord {
    /// Its parent (an index before its own); 0 for the job's own.
    pub made_from: u32,
    /// Its processes (pids in the job), in the image's order; the first is its maker.
    pub pids: Vec<Tid>,
    pub uid_map: Vec<IdRange>,
    pub gid_map: Vec<IdRange>,
    /// Whether its processes may call setgroups (`/proc/PID/setgroups` says "allow").
    pub setgroups_allowed: bool,
}

/// One line of a map: the `count` ids from `inside`, as the namespace numbers them, are those
/// from `outside` as the machine numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// How ids are numbered where a restored process sets them: as the machine numbers them (the
/// job's own namespace maps the user's ids to themselves, and root's job has none), or as one
/// of the job's namespaces does.
#[derive(Debug, Clone, Copy)]
pub enum Numbering<'a> {
    Machine,
    Within(&'a UserNsRecord),
}

impl Numbering<'_> {
    /// User id `machine` as this numbering has it (the overflow id where it is not mapped, as
    /// the kernel shows it).
    pub fn uid(&self, machine: u32) -> u32 {
        match self {
            Numbering::Machine => machine,
            Numbering::Within(ns) => inside(&ns.uid_map, machine),
        }
    }

    pub fn gid(&self, machine: u32) -> u32 {
        match self {
            Numbering::Machine => machine,
            Numbering::Within(ns) => inside(&ns.gid_map, machine),
        }
    }
}

fn inside(map: &[IdRange], machine: u32) -> u32 {
    map.iter()
        .find(|r| machine >= r.outside && machine - r.outside < r.count)
        .map_or(OVERFLOW_ID, |r| r.inside + (machine - r.outside))
}

impl UsersRecord {
    /// The namespace (index) process `pid` (in the job) is in.
    pub fn namespace_of(&self, pid: Tid) -> usize {
        self.namespaces.iter().position(|ns| ns.pids.contains(&pid)).unwrap_or(0)
    }

    /// How namespace `index` numbers ids.
    pub fn numbering(&self, index: usize) -> Numbering<'_> {
        match self.namespaces.get(index) {
            Some(ns) if index > 0 => Numbering::Within(ns),
            _ => Numbering::Machine,
        }
    }

    /// How the namespace process `pid` is in numbers ids.
    pub fn numbering_of(&self, pid: Tid) -> Numbering<'_> {
        self.numbering(self.namespace_of(pid))
    }

    /// One line per namespace the job made (for `ckpt inspect`).
    pub fn describe(&self) -> Vec<String> {
        let show = |map: &[IdRange]| map.iter().map(|r| format!("{} as {} ({})", r.inside, r.outside, r.count)).collect::<Vec<_>>().join(", ");
        self.namespaces
            .iter()
            .skip(1)
            .map(|ns| {
                let pids = ns.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
                format!(
                    "the user namespace pid {} made (pids {pids}): uids {}; gids {}{}",
                    ns.pids[0],
                    show(&ns.uid_map),
                    show(&ns.gid_map),
                    if ns.setgroups_allowed { "" } else { "; setgroups denied" }
                )
            })
            .collect()
    }
}

/// Captures the user namespaces the job's processes are in (see the module): `init` is the
/// job's init (host pid), `members` the job's processes in the image's order. Refuses what a
/// restart could not make again ([`check_shapes`]).
pub fn capture(init: Tid, members: &[Member]) -> Result<UsersRecord> {
    let groups = namespaces::group("user", init, members)?;
    check_shapes(init, members, &groups)?;
    let mut record = UsersRecord::default();
    for (i, g) in groups.into_iter().enumerate() {
        if i == 0 {
            record.namespaces.push(UserNsRecord::default());
            continue;
        }
        let read = |file: &str| {
            let path = format!("/proc/{}/{file}", g.reader);
            std::fs::read_to_string(&path).context(|| format!("read {path}"))
        };
        let parse = |file: &str| -> Result<Vec<IdRange>> {
            parse_map(&read(file)?).map_err(|e| Error::Other(format!("/proc/{}/{file}: {e}", g.reader)))
        };
        let (uid_map, gid_map) = (parse("uid_map")?, parse("gid_map")?);
        let setgroups_allowed = read("setgroups")?.trim() == "allow";
        record.namespaces.push(UserNsRecord { made_from: g.made_from, pids: g.pids, uid_map, gid_map, setgroups_allowed });
    }
    Ok(record)
}

/// Refuses, naming the process, the shapes a restart cannot make again yet (it would fail, or
/// make another hierarchy without a word):
/// - a user namespace made inside another one the job made (one level is kept: each is made
///   again as a child of the job's own, and `namespaces::group` could take a parent for
///   another when the maker has gone);
/// - a process in a mount namespace the job made that belongs to a user namespace other than
///   the process's own or the job's (`unshare --mount` and then `unshare --user`): the restart
///   makes a mount namespace from inside the user namespace its maker ends in.
fn check_shapes(init: Tid, members: &[Member], groups: &[namespaces::Grouped]) -> Result<()> {
    use crate::nshelper::{namespace_id, related_namespace, Relation};
    let user_of = |host: Tid| namespace_id(&format!("/proc/{host}/ns/user"));
    let job_user = user_of(init)?;
    let job_mounts = namespace_id(&format!("/proc/{init}/ns/mnt"))?;
    for g in groups.iter().skip(1) {
        if related_namespace(&format!("/proc/{}/ns/user", g.reader), Relation::Parent)? != job_user {
            return Err(Error::Unsupported { pid: g.pids[0], what: "a user namespace made inside another one the job made (unshare --user twice): one level is kept".into() });
        }
    }
    for m in members {
        let user = user_of(m.host_pid)?;
        if user == job_user {
            continue;
        }
        let mounts = format!("/proc/{}/ns/mnt", m.host_pid);
        if namespace_id(&mounts)? != job_mounts && related_namespace(&mounts, Relation::Owner)? != user {
            return Err(Error::Unsupported {
                pid: m.pid,
                what: "a mount namespace that belongs to another user namespace than its own (unshare --mount, then --user): the restart makes it from inside its own".into(),
            });
        }
    }
    Ok(())
}

/// The lines of a `uid_map` or `gid_map` file. Pure.
pub fn parse_map(text: &str) -> std::result::Result<Vec<IdRange>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Vec<u32> = l.split_whitespace().map(|w| w.parse().map_err(|_| format!("line {l:?}"))).collect::<std::result::Result<_, _>>()?;
            match v[..] {
                [inside, outside, count] => Ok(IdRange { inside, outside, count }),
                _ => Err(format!("line {l:?}")),
            }
        })
        .collect()
}

/// A map as the kernel takes it, its outside ids as `parent` numbers them. Pure.
fn map_text(map: &[IdRange], outside: impl Fn(u32) -> u32) -> String {
    map.iter().map(|r| format!("{} {} {}\n", r.inside, outside(r.outside), r.count)).collect()
}

/// Checks a record for what the kernel would take otherwise or what would make the restart
/// act on the wrong namespace: each namespace made in an earlier one, its processes in the
/// image, its maps within the kernel's limits and without overlaps. Pure.
pub fn validate(rec: &UsersRecord, pids: &[Tid]) -> std::result::Result<(), String> {
    for (i, ns) in rec.namespaces.iter().enumerate() {
        if i == 0 {
            if !ns.pids.is_empty() || !ns.uid_map.is_empty() || !ns.gid_map.is_empty() {
                return Err("the job's own user namespace lists processes or maps".into());
            }
            continue;
        }
        if ns.made_from as usize >= i || ns.pids.is_empty() {
            return Err(format!("user namespace {i} is made in {} or has no process", ns.made_from));
        }
        if let Some(p) = ns.pids.iter().find(|p| !pids.contains(p)) {
            return Err(format!("user namespace {i} holds pid {p}, which is not in the image"));
        }
        if let Some(p) = ns.pids.iter().find(|p| rec.namespaces[..i].iter().any(|earlier| earlier.pids.contains(p))) {
            return Err(format!("user namespace {i} holds pid {p}, which an earlier one holds too"));
        }
        for (what, map) in [("uid", &ns.uid_map), ("gid", &ns.gid_map)] {
            if map.len() > MAX_EXTENTS {
                return Err(format!("user namespace {i}'s {what} map has {} lines", map.len()));
            }
            let end = |start: u32, r: &IdRange| start.checked_add(r.count).filter(|_| r.count > 0);
            for (j, r) in map.iter().enumerate() {
                let (Some(in_end), Some(out_end)) = (end(r.inside, r), end(r.outside, r)) else {
                    return Err(format!("user namespace {i}'s {what} map line {j} is empty or overflows"));
                };
                for o in &map[..j] {
                    let overlap = |a: u32, a_end: u32, b: u32, b_count: u32| a < b.saturating_add(b_count) && b < a_end;
                    if overlap(r.inside, in_end, o.inside, o.count) || overlap(r.outside, out_end, o.outside, o.count) {
                        return Err(format!("user namespace {i}'s {what} map has overlapping lines"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes the maps of the user namespace process `target` (host pid) just made by
/// `unshare(CLONE_NEWUSER)`: `ns`'s, their outside ids as `parent` numbers them, from a
/// process in the parent namespace (`in_parent`, host pid): this restorer when that is its own,
/// else a helper that enters it (see the module).
pub fn write_maps(target: Tid, ns: &UserNsRecord, in_parent: Tid, parent: Numbering) -> Result<()> {
    let maps = Maps {
        target,
        deny_setgroups: !ns.setgroups_allowed,
        uid_map: map_text(&ns.uid_map, |id| parent.uid(id)),
        gid_map: map_text(&ns.gid_map, |id| parent.gid(id)),
    };
    if crate::nshelper::same_namespace("user", in_parent)? {
        maps.write_here()
    } else {
        crate::nshelper::run(in_parent, &[crate::nshelper::Enter::User], crate::nshelper::Work::IdMaps(maps)).map(drop)
    }
}

/// The maps of one namespace, as text the kernel takes (see [`write_maps`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Maps {
    target: Tid,
    deny_setgroups: bool,
    uid_map: String,
    gid_map: String,
}

impl Maps {
    /// Writes them from this process (setgroups first: the kernel takes it only before the gid
    /// map, and takes a gid map from an unprivileged writer only after "deny").
    pub fn write_here(&self) -> Result<()> {
        let write = |file: &str, text: &str| {
            let path = format!("/proc/{}/{file}", self.target);
            std::fs::write(&path, text).context(|| format!("write {text:?} to {path}"))
        };
        if self.deny_setgroups {
            write("setgroups", "deny")?;
        }
        if !self.uid_map.is_empty() {
            write("uid_map", &self.uid_map)?;
        }
        if !self.gid_map.is_empty() {
            write("gid_map", &self.gid_map)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(uid_map: &str, gid_map: &str) -> UserNsRecord {
        UserNsRecord { made_from: 0, pids: vec![2], uid_map: parse_map(uid_map).unwrap(), gid_map: parse_map(gid_map).unwrap(), setgroups_allowed: false }
    }

    #[test]
    fn ids_are_numbered_as_the_namespace_maps_them() {
        let rec = ns("         0       1001          1\n", "0 1001 1\n1 100000 65536\n");
        let n = Numbering::Within(&rec);
        assert_eq!((n.uid(1001), n.uid(0), n.uid(1002)), (0, OVERFLOW_ID, OVERFLOW_ID));
        assert_eq!((n.gid(1001), n.gid(100000), n.gid(100009)), (0, 1, 10));
        assert_eq!(Numbering::Machine.uid(1001), 1001);
    }

    #[test]
    fn a_map_is_written_as_its_parent_numbers_it() {
        let outer = ns("0 1001 1\n", "0 1001 1\n");
        let inner = ns("5 1001 1\n", "5 1001 1\n");
        assert_eq!(map_text(&inner.uid_map, |id| Numbering::Within(&outer).uid(id)), "5 0 1\n");
        assert_eq!(map_text(&inner.uid_map, |id| Numbering::Machine.uid(id)), "5 1001 1\n");
    }

    #[test]
    fn forged_maps_and_namespaces_are_refused() {
        let job = UserNsRecord::default();
        let good = UsersRecord { namespaces: vec![job.clone(), ns("0 1001 1\n", "0 1001 1\n")] };
        assert_eq!(validate(&good, &[1, 2]), Ok(()));
        assert!(validate(&good, &[1]).is_err(), "a pid not in the image");
        let mut made_later = good.clone();
        made_later.namespaces[1].made_from = 1;
        assert!(validate(&made_later, &[1, 2]).is_err());
        for (uid_map, what) in [("0 1001 0\n", "empty"), ("0 4294967295 2\n", "overflow"), ("0 1001 10\n5 2000 1\n", "overlap inside"), ("0 1001 10\n20 1005 1\n", "overlap outside")] {
            let bad = UsersRecord { namespaces: vec![job.clone(), ns(uid_map, "0 1001 1\n")] };
            assert!(validate(&bad, &[1, 2]).is_err(), "{what}");
        }
    }
}
