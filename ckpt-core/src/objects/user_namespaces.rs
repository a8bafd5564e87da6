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
    map.iter().find(|r| machine >= r.outside && machine - r.outside < r.count).map_or(OVERFLOW_ID, |r| r.inside + (machine - r.outside))
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

    /// The namespaces from the job's (not included) down to `index`, outermost first.
    pub fn chain(&self, index: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut at = index;
        while at > 0 && at < self.namespaces.len() && out.len() <= self.namespaces.len() {
            out.push(at);
            at = self.namespaces[at].made_from as usize;
        }
        out.reverse();
        out
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
                let whose = match ns.pids.first() {
                    Some(maker) => format!("the user namespace pid {maker} made (pids {pids})"),
                    None => "a user namespace no process is in any more".to_string(),
                };
                format!("{whose}: uids {}; gids {}{}", show(&ns.uid_map), show(&ns.gid_map), if ns.setgroups_allowed { "" } else { "; setgroups denied" })
            })
            .collect()
    }
}

/// Captures the user namespaces the job's processes are in (see the module): `init` is the
/// job's init (host pid), `members` the job's processes in the image's order. A namespace made
/// inside another one the job made is recorded after it (`made_from`), and so is one that no
/// process is in any more but that holds another (Charliecloud's ch-run is root in one to
/// mount, then the user again in a second inside it): its maps are read from inside it by the
/// namespace helper. Gives `mounts` the user namespace each mount namespace belongs to where
/// that is not its maker's own. Refuses what a restart could not make again
/// ([`check_shapes`]).
/// Returns the record and each namespace's identity, in the record's order.
pub fn capture(init: Tid, members: &[Member], mounts: &mut super::mounts::MountsRecord) -> Result<(UsersRecord, Vec<crate::nshelper::NamespaceId>)> {
    use crate::nshelper::{self, namespace_id, Enter, Work};
    let groups = namespaces::group("user", init, members)?;
    let job = namespace_id(&format!("/proc/{init}/ns/user"))?;
    let mut ids = vec![job];
    let mut record = UsersRecord { namespaces: vec![UserNsRecord::default()] };
    let index_of = |ids: &[nshelper::NamespaceId], id| ids.iter().position(|i| *i == id);
    for g in groups.into_iter().skip(1) {
        let path = format!("/proc/{}/ns/user", g.reader);
        let above = nshelper::user_namespaces_above(&path, job)?;
        // Those above it that no process of an earlier group is in, outermost first.
        for (level, &id) in above.iter().enumerate().rev() {
            if index_of(&ids, id).is_some() {
                continue;
            }
            let parent = index_of(&ids, above.get(level + 1).copied().unwrap_or(job)).expect("outermost first");
            let answer = nshelper::run(g.reader, &[Enter::UserAbove(level as u32 + 1)], Work::ReadMaps)?;
            let read: MapsRead = postcard::from_bytes(&answer).map_err(|e| Error::Other(format!("the namespace helper's maps: {e}")))?;
            let mut ns = read.into_record(parent as u32).map_err(|e| Error::Other(format!("a user namespace above pid {}'s: {e}", g.pids[0])))?;
            // Read from inside, its outside ids are its parent's: as the machine numbers them.
            ns.number_as_machine(&record.namespaces[parent])
                .map_err(|e| Error::Unsupported { pid: g.pids[0], what: format!("a user namespace above its own whose maps {e}") })?;
            record.namespaces.push(ns);
            ids.push(id);
        }
        let own = namespace_id(&path)?;
        if let Some(k) = index_of(&ids, own) {
            // Listed above a group before it: its processes come later in the image.
            record.namespaces[k].pids = g.pids;
            continue;
        }
        let parent = index_of(&ids, above.first().copied().unwrap_or(job)).expect("just listed");
        let read = |file: &str| {
            let path = format!("/proc/{}/{file}", g.reader);
            std::fs::read_to_string(&path).context(|| format!("read {path}"))
        };
        let parse = |file: &str| -> Result<Vec<IdRange>> { parse_map(&read(file)?).map_err(|e| Error::Other(format!("/proc/{}/{file}: {e}", g.reader))) };
        let (uid_map, gid_map) = (parse("uid_map")?, parse("gid_map")?);
        let setgroups_allowed = read("setgroups")?.trim() == "allow";
        record.namespaces.push(UserNsRecord { made_from: parent as u32, pids: g.pids, uid_map, gid_map, setgroups_allowed });
        ids.push(own);
    }
    check_shapes(init, members, &record, &ids)?;
    // The user namespace each mount namespace the job made belongs to, where it is not its
    // maker's own: the restart makes it there, on the maker's way down.
    for m in mounts.namespaces.iter_mut().skip(1) {
        let Some(maker) = m.pids.first().and_then(|p| members.iter().find(|x| x.pid == *p)) else { continue };
        let owner = crate::nshelper::related_namespace(&format!("/proc/{}/ns/mnt", maker.host_pid), crate::nshelper::Relation::Owner)?;
        let owner = index_of(&ids, owner)
            .ok_or_else(|| Error::Unsupported { pid: maker.pid, what: "a mount namespace that belongs to a user namespace outside the job".into() })?;
        if owner != record.namespace_of(maker.pid) {
            m.owner = Some(owner as u32);
        }
    }
    Ok((record, ids))
}

/// The maps of a user namespace as a process inside it reads them (its parent's ids outside).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MapsRead {
    uid_map: String,
    gid_map: String,
    setgroups: String,
}

impl MapsRead {
    /// This process's own namespace's.
    pub fn of_self() -> Result<MapsRead> {
        let read = |file: &str| std::fs::read_to_string(format!("/proc/self/{file}")).context(|| format!("read /proc/self/{file}"));
        Ok(MapsRead { uid_map: read("uid_map")?, gid_map: read("gid_map")?, setgroups: read("setgroups")? })
    }

    fn into_record(self, made_from: u32) -> std::result::Result<UserNsRecord, String> {
        Ok(UserNsRecord {
            made_from,
            pids: Vec::new(),
            uid_map: parse_map(&self.uid_map)?,
            gid_map: parse_map(&self.gid_map)?,
            setgroups_allowed: self.setgroups.trim() == "allow",
        })
    }
}

impl UserNsRecord {
    /// Turns maps whose outside ids are `parent`'s into maps whose outside ids are the
    /// machine's, as the records keep them (a range must fall in one line of the parent's).
    fn number_as_machine(&mut self, parent: &UserNsRecord) -> std::result::Result<(), String> {
        if parent.uid_map.is_empty() && parent.gid_map.is_empty() {
            return Ok(()); // the job's own: its ids are the machine's
        }
        let through = |map: &mut Vec<IdRange>, parent_map: &[IdRange], what: &str| -> std::result::Result<(), String> {
            for r in map.iter_mut() {
                let line = parent_map
                    .iter()
                    .find(|p| r.outside >= p.inside && r.outside - p.inside < p.count && r.count <= p.count - (r.outside - p.inside))
                    .ok_or_else(|| format!("map {what} {} to {} ids its parent does not map in one piece", r.count, r.outside))?;
                r.outside = line.outside + (r.outside - line.inside);
            }
            Ok(())
        };
        through(&mut self.uid_map, &parent.uid_map, "uids")?;
        through(&mut self.gid_map, &parent.gid_map, "gids")
    }
}

/// Refuses, naming the process, the shapes a restart cannot make again yet (it would fail, or
/// make another hierarchy without a word), given the namespaces `record` lists (their ids in
/// `ids`):
/// - a user namespace that no process is in and that holds more than one the job made: the
///   restart makes it on the way down of the first process below it, and could not join it
///   again for another;
/// - a process in a mount namespace the job made that belongs to a user namespace that is not
///   on the way from the job's to the process's own (`unshare --mount` in one user namespace,
///   then `--user` in a sibling): the restart makes a mount namespace on its maker's way down.
fn check_shapes(init: Tid, members: &[Member], record: &UsersRecord, ids: &[crate::nshelper::NamespaceId]) -> Result<()> {
    use crate::nshelper::{namespace_id, related_namespace, Relation};
    for (i, ns) in record.namespaces.iter().enumerate().skip(1) {
        let children = record.namespaces.iter().filter(|c| c.made_from as usize == i).count();
        if ns.pids.is_empty() && children > 1 {
            let first = record.namespaces.iter().find(|c| c.made_from as usize == i).and_then(|c| c.pids.first()).copied().unwrap_or(0);
            return Err(Error::Unsupported {
                pid: first,
                what: "a user namespace no process is in any more, from which several were made: one is kept".into(),
            });
        }
    }
    let job_mounts = namespace_id(&format!("/proc/{init}/ns/mnt"))?;
    for m in members {
        let mounts = format!("/proc/{}/ns/mnt", m.host_pid);
        if namespace_id(&mounts)? == job_mounts {
            continue;
        }
        let owner = related_namespace(&mounts, Relation::Owner)?;
        let on_the_way = record.chain(record.namespace_of(m.pid)).into_iter().chain([0]).any(|i| ids.get(i) == Some(&owner));
        if !on_the_way {
            return Err(Error::Unsupported {
                pid: m.pid,
                what: "a mount namespace that belongs to a user namespace its own was not made in (unshare --mount, then --user elsewhere): the restart makes it on the way to its own".into(),
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
        // One no process is in must hold another, made after it.
        let holds_one = rec.namespaces[i + 1..].iter().any(|c| c.made_from as usize == i);
        if ns.made_from as usize >= i || (ns.pids.is_empty() && !holds_one) {
            return Err(format!("user namespace {i} is made in {} or has no process and holds no namespace", ns.made_from));
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

    /// ch-run's two levels: root of the first (the user outside), the user again in the second.
    #[test]
    fn a_namespace_no_process_is_in_is_kept_with_machine_ids() {
        let outer_read = MapsRead { uid_map: "0 1001 1\n".into(), gid_map: "0 1001 1\n".into(), setgroups: "deny\n".into() };
        let mut outer = outer_read.into_record(0).unwrap();
        outer.number_as_machine(&UserNsRecord::default()).unwrap();
        assert_eq!((outer.uid_map[0].outside, outer.setgroups_allowed, outer.pids.len()), (1001, false, 0));
        // One level further down, read from inside: its outside ids are the outer one's.
        let mut deeper = MapsRead { uid_map: "1001 0 1\n".into(), gid_map: "1001 0 1\n".into(), setgroups: "deny\n".into() }.into_record(1).unwrap();
        deeper.number_as_machine(&outer).unwrap();
        assert_eq!(deeper.uid_map[0], IdRange { inside: 1001, outside: 1001, count: 1 });
        let mut unmapped = MapsRead { uid_map: "0 5 2\n".into(), gid_map: String::new(), setgroups: "deny".into() }.into_record(1).unwrap();
        assert!(unmapped.number_as_machine(&outer).is_err());
        // The record: the empty one holds the second, made after it.
        let second = UserNsRecord { made_from: 1, pids: vec![2], ..deeper };
        let rec = UsersRecord { namespaces: vec![UserNsRecord::default(), outer.clone(), second] };
        assert_eq!(rec.chain(2), vec![1, 2]);
        assert_eq!(rec.chain(0), Vec::<usize>::new());
        assert_eq!(validate(&rec, &[2]), Ok(()));
        let alone = UsersRecord { namespaces: vec![UserNsRecord::default(), outer] };
        assert!(validate(&alone, &[2]).is_err());
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
        for (uid_map, what) in [
            ("0 1001 0\n", "empty"),
            ("0 4294967295 2\n", "overflow"),
            ("0 1001 10\n5 2000 1\n", "overlap inside"),
            ("0 1001 10\n20 1005 1\n", "overlap outside"),
        ] {
            let bad = UsersRecord { namespaces: vec![job.clone(), ns(uid_map, "0 1001 1\n")] };
            assert!(validate(&bad, &[1, 2]).is_err(), "{what}");
        }
    }
}
