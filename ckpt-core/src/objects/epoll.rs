//! epoll: an epoll instance and its interest list (each watched descriptor with its events and
//! its data).
//!
//! fdinfo lists the watched files by the descriptor number they were added with (`tfd`), which
//! the kernel keeps as part of the watch's key, even once that descriptor is closed (a program
//! that dup'ed it and closed the original, or opened another file at the number and watches that
//! too). Capture finds, with kcmp(KCMP_EPOLL_TFD), where each watched file is open in the
//! process: at its number, or at another descriptor (`held_at`). Restore adds it by number,
//! putting the file at that number for the moment when it is held elsewhere; this is why epoll
//! instances are restored after every other descriptor of their process and before its locks
//! (see [`super::fd::restore`]). An instance may watch another
//! instance (UCX, under MPICH, nests its transports' instances in its progress thread's): the
//! watched one is restored first ([`restore_order`]); the kernel refuses loops, so there is an
//! order.
//!
//! What cannot come back exactly: readiness is evaluated afresh when a file is added, so an
//! edge-triggered watch whose file is ready reports once more after a restart; and a one-shot
//! watch that has fired (its events are all cleared) is added with EPOLLERR and EPOLLHUP, which
//! epoll_ctl always adds, so only an error or hang-up could wake it.

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EpollRecord {
    /// The interest list, in the kernel's order.
    pub targets: Vec<EpollTarget>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct EpollTarget {
    /// The descriptor number the file is watched under, in the process holding the instance.
    pub fd: i32,
    /// EPOLLIN, EPOLLOUT, ..., EPOLLET, EPOLLONESHOT.
    pub events: u32,
    /// The data the job gave, returned with each event.
    pub data: u64,
    /// Where the process holds the file when not at `fd` (format 13; older images hold only
    /// files open at their number).
    #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
    pub held_at: Option<i32>,
}

impl EpollTarget {
    /// The descriptor the watched file is open at in the process.
    pub fn open_at(&self) -> i32 {
        self.held_at.unwrap_or(self.fd)
    }
}

/// Reads the interest list from an epoll instance's fdinfo text (pure).
pub fn parse(text: &str) -> std::result::Result<Vec<EpollTarget>, String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("tfd:")) {
        // "tfd:        3 events: 4000001d data:               2a  pos:0 ino:40e sdev:10"
        let words: Vec<&str> = line.split_whitespace().collect();
        let (fd, events, data) = match words.as_slice() {
            ["tfd:", fd, "events:", events, "data:", data, ..] => (fd, events, data),
            _ => return Err(format!("unexpected line {line:?}")),
        };
        let bad = |what: &str| format!("{what} in {line:?}");
        out.push(EpollTarget {
            fd: fd.parse().map_err(|_| bad("tfd"))?,
            events: u32::from_str_radix(events, 16).map_err(|_| bad("events"))?,
            data: u64::from_str_radix(data, 16).map_err(|_| bad("data"))?,
            held_at: None,
        });
    }
    Ok(out)
}

/// Whether the file open at `candidate` in process `pid` is the `toff`-th file its epoll
/// instance at `epfd` watches under number `tfd` (the kernel counts them in its own order, which
/// fdinfo lists them in).
fn is_watched_file(pid: Tid, candidate: i32, epfd: i32, tfd: i32, toff: u32) -> bool {
    crate::sys::kcmp::epoll_target(pid, candidate, epfd, tfd, toff)
}

/// Captures the epoll instance at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32) -> Result<EpollRecord> {
    let mut targets = parse(&procfs::fdinfo_text(pid, fd)?).map_err(|e| Error::Other(format!("fdinfo of fd {fd} (an epoll instance): {e}")))?;
    let mut open: Option<Vec<i32>> = None;
    for i in 0..targets.len() {
        let tfd = targets[i].fd;
        let toff = targets[..i].iter().filter(|o| o.fd == tfd).count() as u32;
        if toff == 0 && is_watched_file(pid, tfd, fd, tfd, 0) {
            continue;
        }
        // Closed since, or another file there: where else the process holds it.
        let fds = match &open {
            Some(fds) => fds,
            None => open.insert(procfs::fds(pid).context(|| format!("list the descriptors of pid {pid}"))?),
        };
        let held = fds.iter().copied().find(|&c| c != fd && is_watched_file(pid, c, fd, tfd, toff));
        targets[i].held_at = Some(held.ok_or_else(|| Error::Unsupported {
            pid,
            what: format!("fd {fd} (an epoll instance watching a file added as fd {tfd}, which the process no longer holds at any descriptor)"),
        })?);
    }
    Ok(EpollRecord { targets })
}

/// Whether a descriptor is an epoll instance (restored after every other descriptor).
pub fn is_epoll(rec: &FdRecord) -> bool {
    matches!(rec.kind, super::descriptor::FdKind::Epoll(_))
}

/// The order in which a process's descriptors are restored: every other descriptor first, then
/// its inotify instances watching a file through a descriptor, then its epoll instances, each
/// after the instances it watches (by descriptor number), since
/// epoll_ctl needs the watched file open. Pure. A loop (which the kernel never makes; only a
/// damaged image holds one) leaves its instances in the image's order: epoll_ctl then fails on
/// the descriptor not yet open, and the restore with it.
pub fn restore_order(fds: &[FdRecord]) -> Vec<&FdRecord> {
    let (mut epolls, mut order): (Vec<&FdRecord>, Vec<&FdRecord>) = fds.iter().partition(|r| is_epoll(r));
    // Inotify instances and fanotify groups watching a file through a descriptor come after it
    // too (an epoll instance may watch them: before the epolls).
    let (through, mut order): (Vec<&FdRecord>, Vec<&FdRecord>) =
        order.drain(..).partition(|r| super::inotify::watches_through_descriptors(r) || super::fanotify::marks_through_descriptors(r));
    order.extend(through);
    while !epolls.is_empty() {
        let pending: Vec<i32> = epolls.iter().map(|r| r.fd).collect();
        let waits = |r: &FdRecord| match &r.kind {
            super::descriptor::FdKind::Epoll(e) => e.targets.iter().any(|t| t.open_at() != r.fd && pending.contains(&t.open_at())),
            _ => false,
        };
        let (ready, later): (Vec<&FdRecord>, Vec<&FdRecord>) = epolls.iter().partition(|r| !waits(r));
        if ready.is_empty() {
            order.extend(later);
            break;
        }
        order.extend(ready);
        epolls = later;
    }
    order
}

/// struct epoll_event as the kernel reads it on x86_64: packed, 12 bytes.
fn event_bytes(t: &EpollTarget) -> [u8; 12] {
    let mut ev = [0u8; 12];
    ev[..4].copy_from_slice(&t.events.to_le_bytes());
    ev[4..].copy_from_slice(&t.data.to_le_bytes());
    ev
}

impl DescriptorKind for EpollRecord {
    fn describe(&self) -> String {
        "epoll".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off, at.work_base)
    }
}

/// Creates the epoll instance inside the task and adds every watched descriptor, which must
/// already be open where the record says (`open_at`). Returns the instance's descriptor, at
/// `work_base` or above (below it, it could take a number a watched file is added under).
fn open(task: &mut RemoteTask, rec: &FdRecord, e: &EpollRecord, scratch_off: usize, work_base: u64) -> Result<u64> {
    let created = task.syscall("epoll_create1", libc::SYS_epoll_create1, &[(rec.flags & libc::O_CLOEXEC as u32) as u64])?;
    let ep = task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[created, libc::F_DUPFD_CLOEXEC as u64, work_base])?;
    task.syscall("close", libc::SYS_close, &[created])?;
    for t in &e.targets {
        let addr = task.put(scratch_off, &event_bytes(t))?;
        let add = |task: &mut RemoteTask| {
            task.syscall("epoll_ctl(EPOLL_CTL_ADD)", libc::SYS_epoll_ctl, &[ep, libc::EPOLL_CTL_ADD as u64, t.fd as u64, addr])
                .context(|| format!("watch fd {} again (events {:#x})", t.fd, t.events))
                .map(drop)
        };
        match t.held_at {
            None => add(task)?,
            Some(held) => with_file_at(task, held as u64, t.fd as u64, work_base, add)?,
        }
    }
    if rec.flags & libc::O_NONBLOCK as u32 != 0 {
        task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[ep, libc::F_SETFL as u64, libc::O_NONBLOCK as u64])?;
    }
    Ok(ep)
}

/// Runs `then` with the file open at `held` put at number `at` for the moment, and puts back
/// what was at `at` (if anything: the process's own file there, with its close-on-exec flag).
/// Closing the moment's copy leaves the watch, since the file stays open at `held`.
fn with_file_at(task: &mut RemoteTask, held: u64, at: u64, work_base: u64, then: impl FnOnce(&mut RemoteTask) -> Result<()>) -> Result<()> {
    let before = match task.syscall("fcntl(F_GETFD)", libc::SYS_fcntl, &[at, libc::F_GETFD as u64]) {
        Ok(flags) => Some((task.syscall("fcntl(F_DUPFD_CLOEXEC)", libc::SYS_fcntl, &[at, libc::F_DUPFD_CLOEXEC as u64, work_base])?, flags)),
        Err(_) => None, // EBADF: nothing there
    };
    task.syscall("dup2", libc::SYS_dup2, &[held, at])?;
    let done = then(task);
    match before {
        Some((saved, flags)) => {
            task.syscall("dup3", libc::SYS_dup3, &[saved, at, if flags & libc::FD_CLOEXEC as u64 != 0 { libc::O_CLOEXEC as u64 } else { 0 }])?;
            task.syscall("close", libc::SYS_close, &[saved])?;
        }
        None => {
            task.syscall("close", libc::SYS_close, &[at])?;
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_interest_list() {
        let text = "pos:\t0\nflags:\t02\nmnt_id:\t17\nino:\t1038\n\
                    tfd:        3 events: 4000001d data:               2a  pos:0 ino:40e sdev:10\n\
                    tfd:        7 events: 80000019 data: 1234567890abcdef  pos:0 ino:14337 sdev:f\n";
        assert_eq!(
            parse(text),
            Ok(vec![
                EpollTarget { fd: 3, events: 0x4000_001d, data: 42, held_at: None },
                EpollTarget { fd: 7, events: 0x8000_0019, data: 0x1234_5678_90ab_cdef, held_at: None },
            ])
        );
        assert_eq!(parse("pos:\t0\nflags:\t02\n"), Ok(vec![]));
    }

    #[test]
    fn refuses_a_line_it_does_not_know() {
        assert!(parse("tfd: 3 events: zz data: 0\n").unwrap_err().contains("events"));
        assert!(parse("tfd: 3 mask: 1\n").is_err());
    }

    fn rec(fd: i32, kind: crate::objects::descriptor::FdKind) -> FdRecord {
        FdRecord { fd, flags: 0, pos: 0, description: fd as u32, kind, locks: vec![], owner: None }
    }

    fn epoll_of(fd: i32, watched: &[i32]) -> FdRecord {
        let targets = watched.iter().map(|&t| EpollTarget { fd: t, events: 1, data: t as u64, held_at: None }).collect();
        rec(fd, crate::objects::descriptor::FdKind::Epoll(EpollRecord { targets }))
    }

    #[test]
    fn watched_instances_come_first() {
        use crate::objects::descriptor::FdKind;
        // UCX's shape: the progress thread's instance (18) watches two transports' (19, 21),
        // which watch sockets; and one more level below 21.
        let fds = vec![
            epoll_of(18, &[11, 19, 21]),
            rec(11, FdKind::Stdio(crate::objects::file::StdioRecord { which: 1 })),
            epoll_of(19, &[20]),
            rec(20, FdKind::Stdio(crate::objects::file::StdioRecord { which: 2 })),
            epoll_of(21, &[22]),
            epoll_of(22, &[]),
        ];
        let order: Vec<i32> = restore_order(&fds).iter().map(|r| r.fd).collect();
        assert_eq!(order, vec![11, 20, 19, 22, 21, 18]);
    }

    #[test]
    fn a_loop_keeps_every_descriptor() {
        let fds = vec![epoll_of(3, &[4]), epoll_of(4, &[3]), epoll_of(5, &[])];
        let order: Vec<i32> = restore_order(&fds).iter().map(|r| r.fd).collect();
        assert_eq!(order, vec![5, 3, 4]);
    }

    #[test]
    fn event_is_packed() {
        let ev = event_bytes(&EpollTarget { fd: 3, events: 0x8000_0001, data: 0x0102_0304_0506_0708, held_at: None });
        assert_eq!(ev, [1, 0, 0, 0x80, 8, 7, 6, 5, 4, 3, 2, 1]);
    }
}
