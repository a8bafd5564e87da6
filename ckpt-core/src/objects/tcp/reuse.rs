//! SO_REUSEADDR on the job's TCP sockets, so that an ordinary user's restart after a crash binds
//! its listeners again beside what the old job's connections left on their ports.
//!
//! After a crash the ends of the old job's closed connections linger on its ports (TIME-WAIT
//! for 60 s, FIN-WAIT, LAST-ACK). Root's restart ends them (SOCK_DESTROY); an ordinary user
//! cannot, and the kernel lets a new listener bind beside such an end only when the end's socket
//! had SO_REUSEADDR too (an end keeps its socket's option; an accepted connection takes its
//! listener's, as it was when the connection came). Programs often clear it: Open MPI sets it
//! to 0 on every listener. So, without repair mode:
//!
//! - every checkpoint sets it on every TCP socket of the job before the socket's record is taken
//!   ([`let_bind_beside`], called by the capture), so the restarted job's sockets have it too;
//! - from the launch on, a watcher ([`watch_listeners`]) sets it on each listener of the job as
//!   soon as it sees it, a few tens of milliseconds after `listen(2)`, so that the connections
//!   accepted before the first checkpoint carry it as well. Open MPI's ranks, which connect to
//!   each other at once from both sides and close one of the two connections, leave such ends
//!   at every start; a crash within the next minute left the restart waiting for them.
//!
//! What else it changes: another socket with SO_REUSEADDR may bind the port of a connection of
//! the job (never beside a listener), which leaves the connection as it is, as for any server
//! that sets the option; a program that reads the option back sees 1.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use tracing::debug;

use crate::objects::descriptor::{take_into_self, Listing};
use crate::ptrace::Tid;
use crate::sockdiag::{self, DiagSocket};
use crate::sys::socket::setopt_int;

/// Sets SO_REUSEADDR on one socket of the job (a duplicate of it); best effort, as a socket
/// without it only makes a restart after a crash wait.
pub(super) fn let_bind_beside(sock: &OwnedFd, pid: Tid, fd: i32) {
    if let Err(e) = setopt_int(sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1) {
        debug!(pid, fd, "SO_REUSEADDR not set: a restart after a crash may wait for this socket's lingering ends: {e}");
    }
}

/// How often the watcher looks for new listeners: well under the time a program takes from
/// `listen(2)` to its first connection in practice (Open MPI: about 300 ms, the addresses being
/// exchanged in between). One look is a dump of the kernel's table of listeners.
const LOOK_EVERY: Duration = Duration::from_millis(25);

/// A listener seen this many times without being found in the job is not the job's (the
/// agent's own, another program's): it is not looked for again.
const LOOKS_BEFORE_FOREIGN: u8 = 3;

/// Starts the watcher of the job below `init_pid` (the job's init, a child of the caller), on a
/// thread of its own that ends with the init; only where TCP repair mode is not available (with
/// it, the restart ends the lingering ends itself and the job's options are left alone). Only
/// the caller's own network namespace is watched: a namespace the job made goes with it.
pub fn watch_listeners(init_pid: Tid) {
    if super::super::tcp_reconnect::repair_available() {
        return;
    }
    // Opened while the init is our child and alive: a pid reused after it ends is never taken
    // for it.
    let init = match crate::sys::pidfd::open(init_pid) {
        Ok(fd) => fd,
        Err(e) => return debug!("the job's listeners are not watched (pidfd_open of {init_pid}: {e})"),
    };
    let via = match DiagSocket::here() {
        Ok(v) => v,
        Err(e) => return debug!("the job's listeners are not watched (sock_diag: {e})"),
    };
    let spawned = std::thread::Builder::new().name("ckpt-listeners".into()).spawn(move || {
        let mut watch = Watch::default();
        while !ended(&init) {
            if let Err(e) = watch.look(&via, init_pid) {
                debug!("the job's listeners are no longer watched: {e}");
                return;
            }
            std::thread::sleep(LOOK_EVERY);
        }
    });
    if let Err(e) = spawned {
        debug!("the job's listeners are not watched (thread: {e})");
    }
}

/// Whether the process of `pidfd` has ended (its pidfd polls readable).
fn ended(pidfd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).map(|n| n > 0).unwrap_or(true)
}

/// The listeners already handled, by inode.
#[derive(Default)]
struct Watch {
    /// Given SO_REUSEADDR, or found to be no listener of the job.
    done: HashSet<u64>,
    /// Seen, not found in the job yet: how many times.
    unfound: HashMap<u64, u8>,
}

impl Watch {
    /// One look: the job's processes are listed only when a listener not handled yet shows up.
    fn look(&mut self, via: &DiagSocket, init_pid: Tid) -> std::io::Result<()> {
        let mut listening = HashSet::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            listening.extend(sockdiag::tcp_listeners(via, family as u8)?.into_iter().map(|d| d.ino as u64).filter(|&i| i != 0));
        }
        // Forget what closed, so the sets stay as small as the table.
        self.done.retain(|i| listening.contains(i));
        self.unfound.retain(|i, _| listening.contains(i));
        let new: HashSet<u64> = listening.difference(&self.done).copied().collect();
        if new.is_empty() {
            return Ok(());
        }
        let Ok(pids) = crate::capture::descendants(init_pid) else { return Ok(()) };
        for pid in pids {
            // A process that ends meanwhile is passed over, not the others.
            let Ok(listing) = Listing::of(&[pid]) else { continue };
            for (pid, fd, ino) in listing.sockets() {
                if new.contains(&ino) && !self.done.contains(&ino) {
                    if let Ok(sock) = take_into_self(pid, fd) {
                        let_bind_beside(&sock, pid, fd);
                        debug!(pid, fd, ino, "a new listener of the job: SO_REUSEADDR set");
                        self.done.insert(ino);
                    }
                }
            }
        }
        for ino in new {
            if !self.done.contains(&ino) {
                let seen = self.unfound.entry(ino).or_default();
                *seen += 1;
                if *seen >= LOOKS_BEFORE_FOREIGN {
                    self.unfound.remove(&ino);
                    self.done.insert(ino);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    fn reuse_addr(s: &OwnedFd) -> i32 {
        crate::sys::socket::getopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR).unwrap()
    }

    /// A program's listener made without SO_REUSEADDR (as Open MPI makes them) has it after one
    /// look, as the program itself reads it back; a listener that is not the job's (here the test's
    /// own, the caller being the job's root) keeps what it had, and is no longer looked for after
    /// a few looks.
    #[test]
    fn the_jobs_listeners_are_given_reuseaddr_and_no_other() {
        let program = "import socket, sys\n\
                       s = socket.socket()\n\
                       s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)\n\
                       s.bind(('127.0.0.1', 0)); s.listen()\n\
                       print(s.getsockname()[1], flush=True)\n\
                       sys.stdin.read()\n\
                       print(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR), flush=True)\n";
        let mut child = Command::new("python3").args(["-c", program]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("run python3");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut port = String::new();
        out.read_line(&mut port).unwrap();
        assert!(port.trim().parse::<u16>().is_ok(), "the program printed no port: {port:?}");

        let own = OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        setopt_int(&own, libc::SOL_SOCKET, libc::SO_REUSEADDR, 0).unwrap();
        let own_ino =
            std::fs::metadata(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&own))).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();

        let via = DiagSocket::here().unwrap();
        let mut watch = Watch::default();
        for _ in 0..LOOKS_BEFORE_FOREIGN {
            watch.look(&via, std::process::id() as Tid).unwrap();
        }
        assert_eq!(reuse_addr(&own), 0, "a listener outside the job was changed");
        assert!(watch.done.contains(&own_ino) && !watch.unfound.contains_key(&own_ino), "a listener outside the job is still looked for");

        child.stdin.take().unwrap().write_all(b"").unwrap();
        let mut seen = String::new();
        out.read_line(&mut seen).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(seen.trim(), "1", "the program's listener does not have SO_REUSEADDR");
    }
}
