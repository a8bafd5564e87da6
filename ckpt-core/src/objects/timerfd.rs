//! timerfd: a timer on a clock, with the time left to its next expiration, its interval, and the
//! expirations the job has not read yet.
//!
//! Capture reads fdinfo (clockid, ticks, settime flags, it_value, it_interval). A relative timer
//! is restored with the time it had left, so that it fires as long after the restart as it would
//! have after the checkpoint (the job's time stands still while it is not running); an absolute
//! timer (TFD_TIMER_ABSTIME) is restored at the same time of its clock as the job sees it. On
//! the wall clock, a deadline passed while the job was down fires at once; the monotonic and
//! boot-time clocks of a restarted job continue from the checkpoint ([`super::timens`]), so such
//! a deadline is as far away as it was. Unread expirations are put back with TFD_IOC_SET_TICKS.

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::descriptor::{DescriptorKind, FdRecord, Opening};
use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TimerfdRecord {
    pub clockid: i32,
    /// TFD_TIMER_ABSTIME and TFD_TIMER_CANCEL_ON_SET, as last given to timerfd_settime.
    pub settime_flags: u32,
    /// Expirations not read yet.
    pub ticks: u64,
    /// Time left to the next expiration, in nanoseconds; 0 when the timer is disarmed.
    pub value_ns: u64,
    pub interval_ns: u64,
    /// For an absolute timer, its next expiration as a time of its clock, in nanoseconds.
    pub deadline_ns: Option<u64>,
}

const NS: u64 = 1_000_000_000;
const TFD_TIMER_ABSTIME: u32 = 1;
const TFD_TIMER_CANCEL_ON_SET: u32 = 2;
/// `_IOW('T', 0, __u64)`: sets the count of unread expirations (CONFIG_CHECKPOINT_RESTORE).
const TFD_IOC_SET_TICKS: u64 = 0x4008_5400;

impl TimerfdRecord {
    fn absolute(&self) -> bool {
        self.settime_flags & TFD_TIMER_ABSTIME != 0
    }
}

/// Parses `(sec, nsec)` into nanoseconds.
fn parse_timespec(v: &str) -> Option<u64> {
    let (s, n) = v.trim().strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
    let (s, n): (u64, u64) = (s.trim().parse().ok()?, n.trim().parse().ok()?);
    s.checked_mul(NS)?.checked_add(n)
}

/// Reads a timerfd's state from its fdinfo text (pure); `deadline_ns` is left to the caller.
pub fn parse(text: &str) -> std::result::Result<TimerfdRecord, String> {
    let field = |name: &str| procfs::fdinfo_field(text, name).ok_or_else(|| format!("no {name} line"));
    let clockid = field("clockid")?;
    let clockid = clockid.parse().map_err(|_| format!("clockid {clockid:?}"))?;
    let ticks = field("ticks")?;
    let ticks = ticks.parse().map_err(|_| format!("ticks {ticks:?}"))?;
    let flags = field("settime flags")?;
    let settime_flags = u32::from_str_radix(flags, 8).map_err(|_| format!("settime flags {flags:?}"))?;
    let value = field("it_value")?;
    let value_ns = parse_timespec(value).ok_or_else(|| format!("it_value {value:?}"))?;
    let interval = field("it_interval")?;
    let interval_ns = parse_timespec(interval).ok_or_else(|| format!("it_interval {interval:?}"))?;
    Ok(TimerfdRecord { clockid, settime_flags, ticks, value_ns, interval_ns, deadline_ns: None })
}

/// timerfd_gettime on a timer of our own; the answer is not used (see [`capture`]).
fn gettime(timer: &OwnedFd) -> Result<()> {
    crate::sys::timerfd::touch(timer).map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("timerfd_gettime: {e}"))))
}

/// Captures the timerfd at `fd` of a stopped process.
pub fn capture(pid: Tid, fd: i32) -> Result<TimerfdRecord> {
    let what = |e: String| Error::Other(format!("fd {fd} (a timerfd): {e}"));
    // An interval timer that expired while the job did not read it is at rest in the kernel,
    // with its expiration in the past, until the next read or timerfd_gettime moves it on (and
    // counts the intervals missed meanwhile); fdinfo shows it as disarmed. timerfd_gettime on a
    // duplicate (the same timer) moves it on without reading it, as the job's next read would.
    let own = super::descriptor::take_into_self(pid, fd)?;
    let mut attempts = 0;
    let mut t = loop {
        gettime(&own)?;
        let t = parse(&procfs::fdinfo_text(pid, fd)?).map_err(what)?;
        attempts += 1;
        // It may have expired again between the two reads: then once more.
        if t.value_ns != 0 || t.interval_ns == 0 || attempts == 10 {
            break t;
        }
    };
    if t.value_ns == 0 && t.interval_ns != 0 {
        // An interval too short to catch armed: it is due about now.
        t.value_ns = t.interval_ns;
    }
    if t.absolute() && t.value_ns != 0 {
        // On the job's clock, not the launcher's: after a restart the job's monotonic and
        // boot-time clocks are offset from the machine's, and the deadline is set again there.
        let now = super::timens::now_in_namespace_of(pid, t.clockid)?;
        t.deadline_ns = Some(u64::try_from(now).unwrap_or(0).saturating_add(t.value_ns));
    }
    Ok(t)
}

/// The itimerspec the timer is armed with at restore, as the kernel reads it, and the flags.
fn settime_args(t: &TimerfdRecord) -> ([u8; 32], u32) {
    let (value, flags) = match t.deadline_ns {
        Some(deadline) if t.absolute() => (deadline, t.settime_flags),
        _ => (t.value_ns, t.settime_flags & !(TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET)),
    };
    let mut spec = [0u8; 32];
    for (i, v) in [t.interval_ns / NS, t.interval_ns % NS, value / NS, value % NS].into_iter().enumerate() {
        spec[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    (spec, flags)
}

impl DescriptorKind for TimerfdRecord {
    fn describe(&self) -> String {
        "timerfd".into()
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.rec, self, at.scratch_off)
    }
}

/// Creates the timerfd inside the task, armed as it was, with its unread expirations.
fn open(task: &mut RemoteTask, rec: &FdRecord, t: &TimerfdRecord, scratch_off: usize) -> Result<u64> {
    let flags = rec.flags & (libc::O_NONBLOCK | libc::O_CLOEXEC) as u32;
    let fd = task
        .syscall("timerfd_create", libc::SYS_timerfd_create, &[t.clockid as u64, flags as u64])
        .context(|| format!("create a timer on clock {}", t.clockid))?;
    if t.value_ns != 0 {
        let (spec, flags) = settime_args(t);
        let addr = task.put(scratch_off, &spec)?;
        task.syscall("timerfd_settime", libc::SYS_timerfd_settime, &[fd, flags as u64, addr, 0])?;
    }
    // After settime, which clears them.
    if t.ticks != 0 {
        let addr = task.put(scratch_off, &t.ticks.to_le_bytes())?;
        task.syscall("ioctl(TFD_IOC_SET_TICKS)", libc::SYS_ioctl, &[fd, TFD_IOC_SET_TICKS, addr])
            .context(|| format!("put back {} unread expirations (needs CONFIG_CHECKPOINT_RESTORE)", t.ticks))?;
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELATIVE: &str = "pos:\t0\nflags:\t04002\nmnt_id:\t17\nino:\t1038\nclockid: 1\nticks: 0\n\
                            settime flags: 00\nit_value: (3, 499991217)\nit_interval: (0, 20000000)\n";
    const ABSOLUTE: &str = "pos:\t0\nflags:\t02\nmnt_id:\t17\nino:\t1038\nclockid: 0\nticks: 2\n\
                            settime flags: 03\nit_value: (99, 172705484)\nit_interval: (1, 0)\n";

    #[test]
    fn parses_relative_and_absolute_timers() {
        let r = parse(RELATIVE).unwrap();
        assert_eq!(r, TimerfdRecord { clockid: 1, settime_flags: 0, ticks: 0, value_ns: 3_499_991_217, interval_ns: 20_000_000, deadline_ns: None });
        let a = parse(ABSOLUTE).unwrap();
        assert_eq!((a.clockid, a.settime_flags, a.ticks, a.value_ns, a.interval_ns), (0, 3, 2, 99_172_705_484, NS));
        assert!(a.absolute() && !r.absolute());
    }

    #[test]
    fn refuses_bad_lines() {
        assert!(parse(&RELATIVE.replace("ticks: 0\n", "")).unwrap_err().contains("ticks"));
        assert!(parse(&RELATIVE.replace("(3, 499991217)", "3 499991217")).unwrap_err().contains("it_value"));
        assert!(parse(&RELATIVE.replace("settime flags: 00", "settime flags: 9")).is_err());
        assert_eq!(parse_timespec("(18446744073709551615, 0)"), None);
    }

    #[test]
    fn relative_timer_is_armed_with_what_it_had_left() {
        let t = parse(RELATIVE).unwrap();
        let (spec, flags) = settime_args(&t);
        let word = |i: usize| u64::from_le_bytes(spec[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(flags, 0);
        assert_eq!((word(0), word(1), word(2), word(3)), (0, 20_000_000, 3, 499_991_217));
    }

    #[test]
    fn absolute_timer_keeps_its_deadline_and_flags() {
        let mut t = parse(ABSOLUTE).unwrap();
        t.deadline_ns = Some(1_700_000_000 * NS + 5);
        let (spec, flags) = settime_args(&t);
        let word = |i: usize| u64::from_le_bytes(spec[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(flags, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET);
        assert_eq!((word(0), word(1), word(2), word(3)), (1, 0, 1_700_000_000, 5));
    }
}
