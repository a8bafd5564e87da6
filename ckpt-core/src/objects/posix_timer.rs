//! POSIX timers (timer_create): per process, each with its id, clock, how it notifies (signal
//! number, sigev value, the process or one thread), the time left to its next expiration and its
//! interval.
//!
//! Capture reads `/proc/<pid>/timers` (id, signal and sigev value, notify, clock) and asks the
//! time left and the overrun count from inside the stopped task (timer_gettime,
//! timer_getoverrun). Restore creates each timer again with its old id: the kernel hands out ids
//! in sequence, not the lowest free one, so the restore switches the process into id-restore mode
//! (`prctl(PR_TIMER_CREATE_RESTORE_IDS)`, Linux 6.16), in which timer_create takes the id it is
//! given. A timer is re-armed relative to now with the time it had left, so it fires as long
//! after the restart as it would have after the checkpoint. The overrun count of a signal not yet
//! delivered is recorded but cannot be put back (the kernel has no call for it).

use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::procfs;
use crate::ptrace::batch::{Answers, Asked, Asker};
use crate::ptrace::{RemoteTask, Tid};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PosixTimerRecord {
    pub id: i32,
    pub clockid: i32,
    /// SIGEV_SIGNAL, SIGEV_NONE, or SIGEV_THREAD_ID (with `tid`).
    pub notify: i32,
    pub signo: i32,
    /// sigev_value (sival_ptr or sival_int, as the kernel keeps it).
    pub value: u64,
    /// For SIGEV_THREAD_ID, the thread (pid in the job's namespace).
    pub tid: Tid,
    /// Time left to the next expiration, in nanoseconds; 0 when disarmed.
    pub value_ns: u64,
    pub interval_ns: u64,
    /// timer_getoverrun at the checkpoint (not restored; see the module's documentation).
    pub overrun: i32,
}

const NS: u64 = 1_000_000_000;
use libc::{SIGEV_NONE, SIGEV_SIGNAL, SIGEV_THREAD_ID};
const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;

/// One entry of `/proc/<pid>/timers`, before the time left is known: (id, signo, value, notify,
/// pid or tid as /proc shows it, clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcTimer {
    pub id: i32,
    pub signo: i32,
    pub value: u64,
    pub notify: i32,
    pub target: Tid,
    pub clockid: i32,
}

/// Parses `/proc/<pid>/timers` (pure).
pub fn parse(text: &str) -> std::result::Result<Vec<ProcTimer>, String> {
    let mut out: Vec<ProcTimer> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (key, val) = line.split_once(':').ok_or_else(|| format!("line {line:?}"))?;
        let val = val.trim();
        if key == "ID" {
            let id = val.parse().map_err(|_| format!("ID {val:?}"))?;
            out.push(ProcTimer { id, signo: 0, value: 0, notify: SIGEV_SIGNAL, target: 0, clockid: 0 });
            continue;
        }
        let t = out.last_mut().ok_or_else(|| format!("{key} before any ID"))?;
        match key {
            "signal" => {
                let (s, v) = val.split_once('/').ok_or_else(|| format!("signal {val:?}"))?;
                t.signo = s.parse().map_err(|_| format!("signal {val:?}"))?;
                t.value = u64::from_str_radix(v, 16).map_err(|_| format!("signal value {val:?}"))?;
            }
            "notify" => {
                let (how, who) = val.split_once('/').ok_or_else(|| format!("notify {val:?}"))?;
                let (kind, n) = who.split_once('.').ok_or_else(|| format!("notify {val:?}"))?;
                let base = match how {
                    "signal" => SIGEV_SIGNAL,
                    "none" => SIGEV_NONE,
                    _ => return Err(format!("notify {val:?}")),
                };
                t.notify = if kind == "tid" { base | SIGEV_THREAD_ID } else { base };
                t.target = n.parse().map_err(|_| format!("notify {val:?}"))?;
            }
            "ClockID" => t.clockid = val.parse().map_err(|_| format!("ClockID {val:?}"))?,
            _ => {}
        }
    }
    Ok(out)
}

fn ns_of(b: &[u8], i: usize) -> u64 {
    let w = |k: usize| u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap());
    w(i) * NS + w(i + 1)
}

/// Timers asked about in one stop: a process may have thousands, and their questions must fit
/// the area for them.
const TIMERS_PER_STOP: usize = 128;

/// A process's timers as [`capture`] read them, to be [settled](Timers::settle) against the
/// signals the capture records.
#[derive(Debug, Default)]
pub struct Timers {
    pub records: Vec<PosixTimerRecord>,
    /// The timers whose signal was queued before their time left was read.
    queued_before: Vec<i32>,
}

/// Captures the POSIX timers of a stopped process (host pid `pid`), asking each one's time left
/// and overrun count from inside the task (one stop per [`TIMERS_PER_STOP`] timers; none
/// without timers).
///
/// A frozen job's timers still run: one may expire between the read of its time left and the
/// read of the pending signals, which would then hold its signal while its record still has it
/// armed (a one-shot timer would fire twice after a restart). The timers' signals queued before
/// are noted here, and [`Timers::settle`] gives the record of a timer whose signal came since
/// the state it had after that expiry.
pub fn capture(pid: Tid, asker: &mut Asker) -> Result<Timers> {
    let path = format!("/proc/{pid}/timers");
    let text = std::fs::read_to_string(&path).context(|| format!("read {path}"))?;
    let timers = parse(&text).map_err(|e| Error::Other(format!("{path}: {e}")))?;
    if timers.is_empty() {
        return Ok(Timers::default());
    }
    let queued_before = queued_timers(pid, &timers)?;
    let mut out = Vec::new();
    for some in timers.chunks(TIMERS_PER_STOP) {
        let mut q = asker.questions();
        let mut asked = Vec::with_capacity(some.len());
        for t in some {
            let time_left = q.ask_into("timer_gettime", libc::SYS_timer_gettime, 32, |at| [t.id as u64, at])?;
            asked.push((time_left, q.ask("timer_getoverrun", libc::SYS_timer_getoverrun, &[t.id as u64])));
        }
        let answers = asker.answer(q)?;
        for (t, &(time_left, overrun)) in some.iter().zip(&asked) {
            out.push(record(pid, t, &answers, time_left, overrun)?);
        }
    }
    out.sort_by_key(|t| t.id);
    Ok(Timers { records: out, queued_before })
}

/// The timers of `timers` whose signal is queued to process `pid` (host pid) or to the thread
/// a timer signals.
fn queued_timers(pid: Tid, timers: &[ProcTimer]) -> Result<Vec<i32>> {
    let mut queues = vec![(pid, true)];
    queues.extend(timers.iter().filter(|t| t.notify & SIGEV_THREAD_ID != 0).map(|t| (t.target, false)));
    queues.dedup();
    let mut ids = Vec::new();
    for (tid, shared) in queues {
        let queued = crate::ptrace::sys::peek_pending(tid, shared).context(|| format!("the signals queued to {tid}"))?;
        ids.extend(queued.iter().filter_map(|info| super::signals::PendingSignal(info.to_vec()).timer()));
    }
    Ok(ids)
}

impl Timers {
    /// Gives each timer whose signal the capture recorded (`queued`: the timer ids of the
    /// process's and its threads' recorded signals) but that was not queued before its time
    /// left was read the state it has after that expiry: disarmed, or for an interval timer
    /// armed for a whole interval (re-armed when the signal is taken).
    pub fn settle(mut self, queued: impl IntoIterator<Item = i32>) -> Vec<PosixTimerRecord> {
        for id in queued {
            if self.queued_before.contains(&id) {
                continue;
            }
            if let Some(t) = self.records.iter_mut().find(|t| t.id == id) {
                t.value_ns = t.interval_ns;
            }
        }
        self.records
    }
}

/// One timer's record, from /proc's line and the answers about it.
fn record(pid: Tid, t: &ProcTimer, answers: &Answers, time_left: Asked, overrun: Asked) -> Result<PosixTimerRecord> {
    let spec = answers.bytes(time_left).context(|| format!("timer_gettime of POSIX timer {}", t.id))?;
    let (interval_ns, mut value_ns) = (ns_of(spec, 0), ns_of(spec, 2));
    if value_ns == 0 && interval_ns != 0 {
        // An interval timer whose signal is queued is re-armed when the signal is taken.
        value_ns = interval_ns;
    }
    let overrun = answers.value(overrun)? as i32;
    let tid = if t.notify & SIGEV_THREAD_ID != 0 {
        procfs::ns_tid(t.target)
            .map_err(|_| Error::Unsupported { pid, what: format!("POSIX timer {} signalling thread {}, which is not in the job", t.id, t.target) })?
    } else {
        0
    };
    Ok(PosixTimerRecord { id: t.id, clockid: t.clockid, notify: t.notify, signo: t.signo, value: t.value, tid, value_ns, interval_ns, overrun })
}

/// struct sigevent as the kernel reads it (64 bytes).
fn sigevent(t: &PosixTimerRecord) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&t.value.to_le_bytes());
    b[8..12].copy_from_slice(&t.signo.to_le_bytes());
    b[12..16].copy_from_slice(&t.notify.to_le_bytes());
    b[16..20].copy_from_slice(&t.tid.to_le_bytes());
    b
}

fn itimerspec(t: &PosixTimerRecord) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, v) in [t.interval_ns / NS, t.interval_ns % NS, t.value_ns / NS, t.value_ns % NS].into_iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Creates every timer again inside the task, at its old id, armed with the time it had left.
/// The task's threads must exist already (a timer may signal one of them).
pub fn restore(task: &mut RemoteTask, pid: Tid, timers: &[PosixTimerRecord], scratch_off: usize) -> Result<()> {
    if timers.is_empty() {
        return Ok(());
    }
    task.syscall("prctl(PR_TIMER_CREATE_RESTORE_IDS)", libc::SYS_prctl, &[PR_TIMER_CREATE_RESTORE_IDS, 1, 0, 0, 0])
        .map_err(|e| Error::Unsupported { pid, what: format!("POSIX timers: this kernel cannot create them at given ids ({e}; needs Linux 6.16)") })?;
    let mut result = Ok(());
    for t in timers {
        let ev = task.put(scratch_off, &sigevent(t))?;
        let id = task.put(scratch_off + 64, &t.id.to_le_bytes())?;
        let r = task
            .syscall("timer_create", libc::SYS_timer_create, &[t.clockid as u64, ev, id])
            .context(|| format!("create POSIX timer {} on clock {}", t.id, t.clockid));
        if let Err(e) = r {
            result = Err(e);
            break;
        }
        if t.value_ns != 0 {
            let spec = task.put(scratch_off + 128, &itimerspec(t))?;
            if let Err(e) = task.syscall("timer_settime", libc::SYS_timer_settime, &[t.id as u64, 0, spec, 0]) {
                result = Err(Error::Other(format!("arm POSIX timer {}: {e}", t.id)));
                break;
            }
        }
    }
    task.syscall("prctl(PR_TIMER_CREATE_RESTORE_IDS)", libc::SYS_prctl, &[PR_TIMER_CREATE_RESTORE_IDS, 0, 0, 0, 0])?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timer that expired between the read of its time left and the read of the signals has
    /// the state it has after the expiry; one whose signal was queued before keeps its reading.
    #[test]
    fn a_timer_whose_signal_came_during_the_capture_has_its_state_after_it() {
        let timer = |id: i32, value_ns: u64, interval_ns: u64| PosixTimerRecord {
            id,
            clockid: 1,
            notify: SIGEV_SIGNAL,
            signo: 14,
            value: 0,
            tid: 0,
            value_ns,
            interval_ns,
            overrun: 0,
        };
        let timers = Timers { records: vec![timer(1, 5, 0), timer(2, 5, 1000), timer(3, 5, 0), timer(4, 5, 0)], queued_before: vec![3] };
        let settled = timers.settle([1, 2, 3]);
        let values: Vec<u64> = settled.iter().map(|t| t.value_ns).collect();
        assert_eq!(values, [0, 1000, 5, 5]);
    }

    #[test]
    fn a_queued_signal_names_the_timer_that_queued_it() {
        let mut info = vec![0u8; 128];
        info[0..4].copy_from_slice(&14i32.to_le_bytes());
        info[8..12].copy_from_slice(&(-2i32).to_le_bytes());
        info[12..16].copy_from_slice(&7i32.to_le_bytes());
        assert_eq!(super::super::signals::PendingSignal(info.clone()).timer(), Some(7));
        info[8..12].copy_from_slice(&0i32.to_le_bytes()); // SI_USER
        assert_eq!(super::super::signals::PendingSignal(info).timer(), None);
    }

    const TIMERS: &str = "ID: 3\nsignal: 35/0000000000001234\nnotify: signal/pid.11701\nClockID: 0\n\
                          ID: 0\nsignal: 14/0000000000000000\nnotify: signal/tid.11703\nClockID: 1\n\
                          ID: 7\nsignal: 0/00007ffd00000000\nnotify: none/pid.11701\nClockID: 7\n";

    #[test]
    fn parses_proc_timers() {
        let t = parse(TIMERS).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0], ProcTimer { id: 3, signo: 35, value: 0x1234, notify: SIGEV_SIGNAL, target: 11701, clockid: 0 });
        assert_eq!((t[1].notify, t[1].target, t[1].clockid), (SIGEV_THREAD_ID, 11703, 1));
        assert_eq!((t[2].notify, t[2].value), (SIGEV_NONE, 0x7ffd_0000_0000));
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn refuses_bad_lines() {
        assert!(parse("signal: 3/0\n").unwrap_err().contains("before any ID"));
        assert!(parse(&TIMERS.replace("signal/pid", "thread/pid")).unwrap_err().contains("notify"));
        assert!(parse(&TIMERS.replace("ID: 3", "ID: x")).is_err());
    }

    #[test]
    fn sigevent_and_itimerspec_layout() {
        let t = PosixTimerRecord {
            id: 2,
            clockid: 1,
            notify: SIGEV_THREAD_ID,
            signo: 35,
            value: 0xabcd,
            tid: 9,
            value_ns: 1_500_000_000,
            interval_ns: 20_000_000,
            overrun: 0,
        };
        let ev = sigevent(&t);
        assert_eq!(u64::from_le_bytes(ev[0..8].try_into().unwrap()), 0xabcd);
        assert_eq!(i32::from_le_bytes(ev[8..12].try_into().unwrap()), 35);
        assert_eq!(i32::from_le_bytes(ev[12..16].try_into().unwrap()), SIGEV_THREAD_ID);
        assert_eq!(i32::from_le_bytes(ev[16..20].try_into().unwrap()), 9);
        let s = itimerspec(&t);
        assert_eq!((ns_of(&s, 0), ns_of(&s, 2)), (20_000_000, 1_500_000_000));
    }
}
