//! The job's clocks across a restart, kept by a time namespace (time_namespaces(7)).
//!
//! CLOCK_MONOTONIC and CLOCK_BOOTTIME count from the machine's boot. A job restarted later, or
//! on another machine, would see them jump by the time it was down, and a program with deadlines
//! or heartbeats on them (MPI timeouts, lease renewals) would see an outage that never happened
//! to it. A time namespace adds fixed offsets to these clocks (and to their _RAW, _COARSE and
//! _ALARM variants) for the processes in it; a restarted job runs in one whose offsets make its
//! clocks go on from what they read at the checkpoint.
//!
//! - Capture ([`capture`], at the end of the freeze): each clock as the job sees it, which is
//!   the machine's clock plus the offsets of the job's namespace. These are read from the job's
//!   init: `/proc/PID/timens_offsets` shows the namespace a process's *children* are in, and the
//!   init's children are the job. A restarted job already runs with offsets; counting them
//!   makes a job restarted any number of times keep one unbroken pair of clocks.
//! - Restore ([`offsets_to_continue`] in the restorer, then [`enter_for_children`] in the job's
//!   init, before it creates any process): offsets = the recorded clock minus the machine's
//!   clock now (negative when the job's clocks are behind the machine's, the usual case).
//!   `unshare(CLONE_NEWTIME)` puts the init's future children in a new namespace, not the init
//!   itself, and the offsets must be written before any process enters it: the kernel refuses
//!   them after. The job's clocks then continue from the freeze, and the only time they see pass
//!   is the restart's own.
//!
//! Offsets are relative to the machine's clocks (the initial time namespace), not to the
//! namespace of whoever reads them: the launcher subtracts its own offsets (zero, unless it runs
//! in a container with a time namespace) from the clocks it reads.
//!
//! The vdso reads these clocks without a system call. A process in a time namespace gets another
//! page in its [vvar] area, one that sends the vdso to the namespace's offsets; the page is part
//! of the area, which the restart moves as a whole ([`super::vdso`]), so the vdso and the system
//! call agree.
//!
//! Writing the offsets needs CAP_SYS_TIME in the user namespace that owns the time namespace:
//! root has it, and an ordinary user's job init holds every capability in the job's own user
//! namespace ([`crate::userns`]), which owns the namespaces the init makes.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::ptrace::Tid;

const NS_PER_SEC: i64 = 1_000_000_000;

/// The largest clock value a time namespace can show, in nanoseconds: the kernel refuses
/// offsets that would take a clock past KTIME_SEC_MAX / 2 seconds (about 146 years).
pub const MAX_CLOCK_NS: i64 = (i64::MAX / NS_PER_SEC / 2) * NS_PER_SEC;

/// The job's clocks at the checkpoint, in nanoseconds, as the job read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClocksRecord {
    /// CLOCK_MONOTONIC (CLOCK_MONOTONIC_RAW and _COARSE follow it).
    pub monotonic_ns: i64,
    /// CLOCK_BOOTTIME (and CLOCK_BOOTTIME_ALARM): the monotonic clock plus time suspended.
    pub boottime_ns: i64,
}

/// The offsets of a time namespace from the machine's clocks, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offsets {
    pub monotonic_ns: i64,
    pub boottime_ns: i64,
}

impl Offsets {
    /// The offset a clock gets in a namespace with these offsets (0 for clocks no namespace
    /// shifts, CLOCK_REALTIME among them).
    pub fn of_clock(&self, clockid: libc::clockid_t) -> i64 {
        match clockid {
            libc::CLOCK_MONOTONIC | libc::CLOCK_MONOTONIC_RAW | libc::CLOCK_MONOTONIC_COARSE => self.monotonic_ns,
            libc::CLOCK_BOOTTIME | libc::CLOCK_BOOTTIME_ALARM => self.boottime_ns,
            _ => 0,
        }
    }

    /// Reads `/proc/PID/timens_offsets` text (pure): one line per clock, its name, seconds
    /// (negative for a namespace behind the machine) and nanoseconds (0..1e9).
    pub fn parse(text: &str) -> std::result::Result<Offsets, String> {
        let (mut monotonic, mut boottime) = (None, None);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [name, secs, nanos] = words[..] else { return Err(format!("line {line:?}: expected a clock, seconds and nanoseconds")) };
            let secs: i64 = secs.parse().map_err(|_| format!("line {line:?}: seconds {secs:?}"))?;
            let nanos: i64 = nanos.parse().ok().filter(|n| (0..NS_PER_SEC).contains(n)).ok_or_else(|| format!("line {line:?}: nanoseconds {nanos:?}"))?;
            let ns = secs.checked_mul(NS_PER_SEC).and_then(|s| s.checked_add(nanos)).ok_or_else(|| format!("line {line:?}: out of range"))?;
            match name {
                "monotonic" => monotonic = Some(ns),
                "boottime" => boottime = Some(ns),
                _ => {} // a clock a later kernel may add; not one we keep
            }
        }
        match (monotonic, boottime) {
            (Some(monotonic_ns), Some(boottime_ns)) => Ok(Offsets { monotonic_ns, boottime_ns }),
            _ => Err("no monotonic or no boottime line".into()),
        }
    }

    /// The text written to `/proc/PID/timens_offsets` (pure): both clocks in one write, as the
    /// kernel wants seconds and nanoseconds in 0..1e9 (so -1.5 s is `-2 500000000`).
    pub fn proc_text(&self) -> String {
        let line = |name: &str, ns: i64| format!("{name} {} {}\n", ns.div_euclid(NS_PER_SEC), ns.rem_euclid(NS_PER_SEC));
        line("monotonic", self.monotonic_ns) + &line("boottime", self.boottime_ns)
    }
}

/// Whether this kernel has time namespaces (CONFIG_TIME_NS, Linux 5.6 or newer).
pub fn available() -> bool {
    Path::new("/proc/self/ns/time").exists()
}

/// The job's clocks now, as the job sees them: called at the end of the freeze, once every
/// thread is stopped, so that no clock the job read before it stopped is ahead of them.
/// `init` is the job's init; every process of the job is in the namespace it gave them
/// ([`super::namespaces::check`]).
pub fn capture(init: Tid) -> Result<ClocksRecord> {
    let job = offsets_of_children(init)?;
    let machine = machine_now()?;
    Ok(ClocksRecord { monotonic_ns: machine.monotonic_ns + job.monotonic_ns, boottime_ns: machine.boottime_ns + job.boottime_ns })
}

/// The offsets that make a namespace's clocks read, now, what the job's read at the checkpoint.
/// Call it just before [`enter_for_children`]: from then on the job's clocks run again.
pub fn offsets_to_continue(at_checkpoint: &ClocksRecord) -> Result<Offsets> {
    let machine = machine_now()?;
    Ok(Offsets { monotonic_ns: at_checkpoint.monotonic_ns - machine.monotonic_ns, boottime_ns: at_checkpoint.boottime_ns - machine.boottime_ns })
}

/// In the job's init, before it creates any process: makes the time namespace its children will
/// be in, with `offsets`. The init itself stays in its own namespace.
pub fn enter_for_children(offsets: &Offsets) -> Result<()> {
    sys::unshare_time().map_err(|error| Error::TimeNamespace { what: "make the job's time namespace (unshare CLONE_NEWTIME)", error })?;
    // /proc/self shows the namespace for our children: the new one.
    std::fs::write("/proc/self/timens_offsets", offsets.proc_text())
        .map_err(|error| Error::TimeNamespace { what: "give the job's time namespace its clocks' offsets (/proc/self/timens_offsets)", error })
}

/// Clock `clockid` now as process `pid` sees it, in nanoseconds: for a deadline the job set on
/// its own clock (an absolute timer), which its restored copy must find on the same clock.
pub fn now_in_namespace_of(pid: Tid, clockid: libc::clockid_t) -> Result<i64> {
    let own = sys::clock_ns(clockid).context(|| format!("clock_gettime({clockid})"))?;
    Ok(own - own_offsets()?.of_clock(clockid) + offsets_of_children(pid)?.of_clock(clockid))
}

/// The machine's clocks now (those of the initial time namespace).
fn machine_now() -> Result<ClocksRecord> {
    let own = own_offsets()?;
    let read = |clockid| sys::clock_ns(clockid).context(|| format!("clock_gettime({clockid})"));
    Ok(ClocksRecord { monotonic_ns: read(libc::CLOCK_MONOTONIC)? - own.monotonic_ns, boottime_ns: read(libc::CLOCK_BOOTTIME)? - own.boottime_ns })
}

/// The offsets of the time namespace `pid`'s children are in (none on a kernel without time
/// namespaces: every process sees the machine's clocks).
fn offsets_of_children(pid: Tid) -> Result<Offsets> {
    read_offsets(&format!("/proc/{pid}/timens_offsets"))
}

/// The offsets of this process's own time namespace. /proc/self shows the namespace of its
/// children, which is its own: the launcher never unshares one (only the job's init does).
fn own_offsets() -> Result<Offsets> {
    read_offsets("/proc/self/timens_offsets")
}

fn read_offsets(path: &str) -> Result<Offsets> {
    if !available() {
        return Ok(Offsets::default());
    }
    let text = std::fs::read_to_string(path).context(|| format!("read {path}"))?;
    // A process that is ending has no namespaces left to show.
    if text.trim().is_empty() {
        return Err(Error::Other(format!("{path} is empty: the process is ending (did the job end during the checkpoint?)")));
    }
    Offsets::parse(&text).map_err(|e| Error::Other(format!("{path}: {e}")))
}

/// The system calls, thin.
mod sys {
    use std::io;

    use nix::sched::{unshare, CloneFlags};
    use nix::time::{clock_gettime, ClockId};

    pub fn clock_ns(clockid: libc::clockid_t) -> io::Result<i64> {
        let ts = clock_gettime(ClockId::from_raw(clockid))?;
        Ok(ts.tv_sec() * super::NS_PER_SEC + ts.tv_nsec())
    }

    /// `unshare(CLONE_NEWTIME)`: the caller's children from now on are in a new time namespace.
    pub fn unshare_time() -> io::Result<()> {
        Ok(unshare(CloneFlags::from_bits_retain(libc::CLONE_NEWTIME))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_offsets_as_the_kernel_shows_them() {
        let text = "monotonic           0         0\nboottime            0         0\n";
        assert_eq!(Offsets::parse(text), Ok(Offsets::default()));
        let text = "monotonic       -1234 500000000\nboottime          -12         1\n";
        assert_eq!(Offsets::parse(text), Ok(Offsets { monotonic_ns: -1_233_500_000_000, boottime_ns: -11_999_999_999 }));
        assert!(Offsets::parse("monotonic 0 0\n").is_err());
        assert!(Offsets::parse("monotonic 0 1000000000\nboottime 0 0\n").is_err());
        assert!(Offsets::parse("monotonic x 0\nboottime 0 0\n").is_err());
    }

    #[test]
    fn writes_negative_offsets_with_nanoseconds_in_range() {
        let o = Offsets { monotonic_ns: -1_500_000_000, boottime_ns: 2_000_000_001 };
        assert_eq!(o.proc_text(), "monotonic -2 500000000\nboottime 2 1\n");
        assert_eq!(Offsets::parse(&o.proc_text()), Ok(o));
    }

    #[test]
    fn each_clock_takes_its_offset() {
        let o = Offsets { monotonic_ns: 5, boottime_ns: 7 };
        assert_eq!(o.of_clock(libc::CLOCK_MONOTONIC), 5);
        assert_eq!(o.of_clock(libc::CLOCK_MONOTONIC_COARSE), 5);
        assert_eq!(o.of_clock(libc::CLOCK_BOOTTIME_ALARM), 7);
        assert_eq!(o.of_clock(libc::CLOCK_REALTIME), 0);
    }

    /// A "job" that is this process (its children's namespace is its own) is recorded with the
    /// clocks it reads, and offsets to continue them now are a moment behind the machine's.
    #[test]
    fn captured_clocks_are_the_ones_the_job_reads() {
        let before = sys::clock_ns(libc::CLOCK_MONOTONIC).unwrap();
        let rec = capture(std::process::id() as Tid).unwrap();
        let after = sys::clock_ns(libc::CLOCK_MONOTONIC).unwrap();
        assert!((before..=after).contains(&rec.monotonic_ns), "{before} {} {after}", rec.monotonic_ns);
        assert!(rec.boottime_ns >= rec.monotonic_ns);
        let to_continue = offsets_to_continue(&rec).unwrap().monotonic_ns - own_offsets().unwrap().monotonic_ns;
        assert!((-NS_PER_SEC..=0).contains(&to_continue), "{to_continue}");
    }
}
