//! Who makes each process of the tree at restart, decided from the image's records alone (pure,
//! so the checkpoint can refuse a tree the restart could not make, while the job goes on).
//!
//! A process is forked from its parent, or made by the job's init when that is its parent. A
//! process whose session is neither its own nor its parent's was adopted: its parent (the init,
//! or a child subreaper) took it over when the process that made it ended. It is made the same
//! way: forked from a process of its session, which ends, and the kernel gives its children to
//! the nearest subreaper above it, or the init. That process is the stand-in of the session when
//! the session's leader exited (a stand-in with the leader's pid makes the session again), or a
//! helper the session's living leader forks. A process group whose leader exited is made again
//! by a stand-in with the leader's pid, forked from a process of its session: the init (its
//! first session), the session's stand-in, or the session's living leader.

use std::collections::{BTreeMap, HashMap};

use ckpt_core::ptrace::Tid;
use ckpt_core::{Error, Result};

/// A process's place in the tree, whether it is alive or a zombie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    pub pid: Tid,
    pub ppid: Tid,
    pub pgid: Tid,
    pub sid: Tid,
    /// prctl(PR_SET_CHILD_SUBREAPER): orphans below it are given to it.
    pub subreaper: bool,
    pub alive: bool,
}

/// What a process or stand-in is forked from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Maker {
    /// The job's init.
    Init,
    /// A process of the image, by pid.
    Process(Tid),
    /// The stand-in of the session (by id) whose leader exited.
    SessionStandIn(Tid),
    /// A helper forked from the session's living leader (by the session's id).
    HelperOf(Tid),
}

/// How the tree is made: see the module.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Each process's (live or zombie) maker, by pid.
    pub makers: BTreeMap<Tid, Maker>,
    /// Sessions whose leader exited, by id: who makes their stand-in (the init, or the
    /// subreaper that adopted the session's members).
    pub session_stand_ins: BTreeMap<Tid, Maker>,
    /// Process groups whose leader exited, by id: who makes their stand-in.
    pub group_stand_ins: BTreeMap<Tid, Maker>,
}

/// Whether a parent is the job's init (not in the image): pid 1, or 0 when it was not visible.
pub fn parent_is_init(ppid: Tid) -> bool {
    ppid <= 1
}

/// Decides how the tree is made, or says why it cannot be.
pub fn plan(all: &[Links]) -> Result<Plan> {
    let by_pid: HashMap<Tid, Links> = all.iter().map(|l| (l.pid, *l)).collect();
    let unsupported = |pid: Tid, what: String| Error::Unsupported { pid, what };
    let mut plan = Plan::default();
    for l in all {
        let parent = if parent_is_init(l.ppid) {
            None
        } else {
            match by_pid.get(&l.ppid) {
                Some(p) if p.alive => Some(p),
                _ => return Err(unsupported(l.pid, format!("a process whose parent {} is not in the image", l.ppid))),
            }
        };
        let by_parent = parent.map_or(Maker::Init, |p| Maker::Process(p.pid));
        let parent_sid = parent.map_or(1, |p| p.sid);
        let maker = if l.sid == l.pid || l.sid == parent_sid { by_parent } else { adopted_maker(l, parent, &by_pid, &mut plan.session_stand_ins)? };
        plan.makers.insert(l.pid, maker);

        // Its process group.
        match by_pid.get(&l.pgid) {
            Some(leader) if leader.sid == l.sid => {}
            Some(leader) => {
                return Err(unsupported(l.pid, format!("process group {} whose leader is in session {}, not its session {}", l.pgid, leader.sid, l.sid)))
            }
            None if l.pgid == 1 && l.sid == 1 => {}
            // The session's stand-in leads the group named after it.
            None if l.pgid == l.sid => {}
            None => {
                let maker = match by_pid.get(&l.sid) {
                    _ if l.sid == 1 => Maker::Init,
                    None => Maker::SessionStandIn(l.sid),
                    Some(leader) if leader.alive => Maker::Process(l.sid),
                    Some(_) => {
                        return Err(unsupported(
                            l.pid,
                            format!("process group {} whose leader is gone, in session {} whose leader is a zombie (nothing alive in the session can make the group again)", l.pgid, l.sid),
                        ))
                    }
                };
                plan.group_stand_ins.insert(l.pgid, maker);
            }
        }
    }
    Ok(plan)
}

/// The maker of `l`, adopted by `parent` (None: the init) into a session not its parent's.
fn adopted_maker(l: &Links, parent: Option<&Links>, by_pid: &HashMap<Tid, Links>, session_stand_ins: &mut BTreeMap<Tid, Maker>) -> Result<Maker> {
    let unsupported = |what: String| Err(Error::Unsupported { pid: l.pid, what });
    if !l.alive {
        return unsupported(format!("a zombie in session {}, which is not its parent's", l.sid));
    }
    let adopter = match parent {
        None => Maker::Init,
        Some(p) if p.subreaper => Maker::Process(p.pid),
        Some(p) => return unsupported(format!("session {} (its parent {}'s session changed after the fork)", l.sid, p.pid)),
    };
    match by_pid.get(&l.sid) {
        _ if l.sid == 1 => unsupported(format!("the job's first session, adopted by {} in another session", l.ppid)),
        None => match session_stand_ins.insert(l.sid, adopter) {
            Some(other) if other != adopter => unsupported(format!(
                "session {} whose leader exited, its processes adopted by {other:?} and {adopter:?} (one stand-in cannot give them to both)",
                l.sid
            )),
            _ => Ok(Maker::SessionStandIn(l.sid)),
        },
        Some(leader) if leader.alive => {
            // The helper is the leader's child: what it leaves goes to the nearest subreaper
            // from the leader up, or the init.
            let reaper = nearest_subreaper(leader, by_pid);
            if reaper != adopter {
                return unsupported(format!("adopted by {adopter:?} into session {}, whose living leader's orphans go to {reaper:?} now", l.sid));
            }
            Ok(Maker::HelperOf(l.sid))
        }
        Some(_) => unsupported(format!("session {} whose leader is a zombie", l.sid)),
    }
}

/// Who gets the orphans of a child of `from`: `from` or the nearest of its ancestors that is a
/// child subreaper, else the init.
fn nearest_subreaper(from: &Links, by_pid: &HashMap<Tid, Links>) -> Maker {
    let mut at = *from;
    // Bounded: a forged image could hold a cycle of parents.
    for _ in 0..=by_pid.len() {
        if at.subreaper {
            return Maker::Process(at.pid);
        }
        match by_pid.get(&at.ppid) {
            Some(p) if !parent_is_init(at.ppid) => at = *p,
            _ => return Maker::Init,
        }
    }
    Maker::Init
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: Tid, ppid: Tid, pgid: Tid, sid: Tid) -> Links {
        Links { pid, ppid, pgid, sid, subreaper: false, alive: true }
    }

    #[test]
    fn children_are_forked_from_their_parents() {
        let plan = plan(&[p(2, 1, 2, 1), p(3, 2, 2, 1), p(4, 3, 4, 4)]).unwrap();
        assert_eq!(plan.makers[&2], Maker::Init);
        assert_eq!(plan.makers[&3], Maker::Process(2));
        assert_eq!(plan.makers[&4], Maker::Process(3));
        assert!(plan.session_stand_ins.is_empty() && plan.group_stand_ins.is_empty());
    }

    #[test]
    fn a_daemon_adopted_by_the_init_comes_from_its_sessions_stand_in() {
        // 2 forked 3, which called setsid and forked 4, and ended.
        let plan = plan(&[p(2, 1, 2, 1), p(4, 1, 3, 3)]).unwrap();
        assert_eq!(plan.makers[&4], Maker::SessionStandIn(3));
        assert_eq!(plan.session_stand_ins[&3], Maker::Init);
        assert!(plan.group_stand_ins.is_empty());
    }

    #[test]
    fn a_daemon_adopted_by_a_subreaper_comes_from_a_stand_in_it_forks() {
        let mut reaper = p(2, 1, 2, 1);
        reaper.subreaper = true;
        let plan = plan(&[reaper, p(4, 2, 3, 3), p(5, 4, 5, 3)]).unwrap();
        assert_eq!(plan.makers[&4], Maker::SessionStandIn(3));
        assert_eq!(plan.session_stand_ins[&3], Maker::Process(2));
        assert_eq!(plan.makers[&5], Maker::Process(4));
        // Without the flag, 2 could not have adopted it.
        assert!(super::plan(&[p(2, 1, 2, 1), p(4, 2, 3, 3)]).is_err());
    }

    #[test]
    fn a_group_whose_leader_exited_in_a_living_leaders_session() {
        // 3 leads session 3; its child 4 made group 4, forked 5 and ended: 5 went to the init.
        let plan = plan(&[p(2, 1, 2, 1), p(3, 2, 3, 3), p(5, 1, 4, 3)]).unwrap();
        assert_eq!(plan.makers[&5], Maker::HelperOf(3));
        assert_eq!(plan.group_stand_ins[&4], Maker::Process(3));
        // If 3 is a subreaper, the helper's orphans would go to it, not to the init.
        let mut leader = p(3, 2, 3, 3);
        leader.subreaper = true;
        assert!(super::plan(&[p(2, 1, 2, 1), leader, p(5, 1, 4, 3)]).is_err());
        // ... which is where they were if 3 is their parent.
        let ok = super::plan(&[p(2, 1, 2, 1), leader, p(5, 3, 4, 3)]).unwrap();
        assert_eq!(ok.makers[&5], Maker::Process(3));
    }

    #[test]
    fn groups_whose_leader_exited_come_from_a_process_of_their_session() {
        let plan = plan(&[p(2, 1, 2, 1), p(5, 2, 4, 1), p(7, 1, 6, 3)]).unwrap();
        assert_eq!(plan.group_stand_ins[&4], Maker::Init);
        assert_eq!(plan.group_stand_ins[&6], Maker::SessionStandIn(3));
    }

    #[test]
    fn what_cannot_be_made_is_refused() {
        let mut zombie_leader = p(3, 2, 3, 3);
        zombie_leader.alive = false;
        let cases = [
            vec![p(3, 9, 3, 1)],                               // parent not in the image
            vec![p(2, 1, 2, 1), zombie_leader, p(5, 1, 4, 3)], // adopted into a zombie's session
            vec![p(2, 1, 2, 1), p(3, 2, 9, 1), p(9, 2, 9, 9)], // group led from another session
        ];
        for case in cases {
            assert!(plan(&case).is_err(), "{case:?}");
        }
        let mut zombie = p(4, 2, 3, 3);
        zombie.alive = false;
        let mut reaper = p(2, 1, 2, 1);
        reaper.subreaper = true;
        assert!(plan(&[reaper, zombie]).is_err(), "an adopted zombie");
        let mut a = reaper;
        a.pid = 5;
        assert!(plan(&[reaper, a, p(4, 2, 3, 3), p(6, 5, 3, 3)]).is_err(), "one session adopted by two");
    }
}
