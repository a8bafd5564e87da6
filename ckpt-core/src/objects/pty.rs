//! Pseudo-terminals: a master (`/dev/ptmx`) and its slave (`/dev/pts/N`), their line settings,
//! window size, lock and packet mode, and the output the slave side wrote that the master has not
//! read yet. Open MPI's mpirun, `script`, `expect` and terminal multiplexers hold them.
//!
//! Capture works on duplicates of the job's descriptors (`pidfd_getfd`): reopening a master by its
//! /proc path would make a new terminal. The pending output cannot be peeked at, so it is read
//! out of the master and written straight back into the slave with output processing switched
//! off for that moment (otherwise a "\n" would come back as "\r\n"), leaving the job's terminal as
//! it was. Input typed into the master and not yet read is taken the same way from the slave and
//! typed back with input processing and echo off, so the line discipline does not see it twice.
//! In canonical mode (line editing) the slave reads one complete line at a time: the lines are
//! read out that way, then the line being typed (in non-canonical mode for a moment), and all
//! are typed back in canonical mode with every special character but the line ends disabled,
//! each line ended as it was ([`read_lines`], [`type_back_lines`]).
//!
//! Restore opens a new master in the first process that holds either end, gives the pair its
//! settings, and opens every slave from the master (`TIOCGPTPEER`), so no path under /dev/pts is
//! needed: the new pair may get another number N than the old one.
//!
//! A pty can be the controlling terminal of a session of the job (`script`, `ssh`, terminal
//! emulators make it so): the session leader records it with its foreground process group, and
//! takes it again at restart (`TIOCSCTTY`, `TIOCSPGRP`) through a descriptor it holds on it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::descriptor::{self, DescriptorKind, FdKind, FdRecord, Opening, RestoreCtx};
use crate::error::{Context, Error, Result};
use crate::ptrace::{RemoteTask, Tid};
use crate::sys::tty;

/// Unix98 pty slaves have major numbers 136 to 143.
const PTY_SLAVE_MAJORS: std::ops::RangeInclusive<u32> = 136..=143;
/// /dev/ptmx is the character device 5:2.
const PTMX_RDEV: (u32, u32) = (5, 2);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyRecord {
    /// Which pair: the slave's number N and its devpts instance at the checkpoint.
    pub index: u32,
    pub devpts: u64,
    /// This descriptor is the master side.
    pub master: bool,
    /// The pair's state, carried by the first descriptor of the pair captured.
    pub state: Option<PtyState>,
}

impl PtyRecord {
    fn key(&self) -> (u64, u32) {
        (self.devpts, self.index)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtyState {
    pub termios: Termios,
    /// rows, columns, x pixels, y pixels.
    pub winsize: [u16; 4],
    /// The slave cannot be opened (`unlockpt` not called yet).
    pub locked: bool,
    /// TIOCPKT: every read from the master starts with a status byte.
    pub packet_mode: bool,
    /// What the slave side wrote and the master had not read, in order.
    pub output: Vec<u8>,
    /// What was typed into the master and the slave side had not read, in order. Where
    /// `termios` is in canonical mode (ICANON), the bytes to type in line-editing mode
    /// ([`type_back_lines`]): each line with its end, ^V before a byte that is not to be taken
    /// as a special character.
    #[serde(default)]
    pub input: Vec<u8>,
    /// The slave's owner and permission bits (uid, gid, mode): grantpt(3) gives it to the
    /// user and the tty group, sshd and login to whoever logged in, a program may chown it;
    /// a new pair belongs to the restorer. None for a locked pair, and from an older image
    /// (format 31).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub slave_owner: Option<(u32, u32, u32)>,
    /// Every master of the pair was closed: the slaves are hung up (reads end, writes and the
    /// settings fail with EIO), as a program's terminal is once its ssh session went and it
    /// ignored the SIGHUP; the other fields are not the pair's then. The restart makes a pair,
    /// opens the slaves and closes the master. Format 31.
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub hung_up: bool,
}

/// The line settings of the pair (the slave's termios; the master has none of its own to keep).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Termios {
    pub iflag: u32,
    pub oflag: u32,
    pub cflag: u32,
    pub lflag: u32,
    pub line: u8,
    pub cc: Vec<u8>,
    pub ispeed: u32,
    pub ospeed: u32,
}

impl Termios {
    fn from_libc(t: &libc::termios) -> Termios {
        Termios {
            iflag: t.c_iflag,
            oflag: t.c_oflag,
            cflag: t.c_cflag,
            lflag: t.c_lflag,
            line: t.c_line,
            cc: t.c_cc.to_vec(),
            ispeed: t.c_ispeed,
            ospeed: t.c_ospeed,
        }
    }

    fn to_libc(&self) -> libc::termios {
        let mut t = tty::blank_termios();
        t.c_iflag = self.iflag;
        t.c_oflag = self.oflag;
        t.c_cflag = self.cflag;
        t.c_lflag = self.lflag;
        t.c_line = self.line;
        for (dst, src) in t.c_cc.iter_mut().zip(&self.cc) {
            *dst = *src;
        }
        t.c_ispeed = self.ispeed;
        t.c_ospeed = self.ospeed;
        t
    }
}

/// Whether a descriptor's target is a pty end: `Some(true)` for a master, `Some(false)` for a slave.
pub fn which_end(meta: &std::fs::Metadata) -> Option<bool> {
    use std::os::unix::fs::FileTypeExt;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    if (major, minor) == PTMX_RDEV {
        return Some(true);
    }
    PTY_SLAVE_MAJORS.contains(&major).then_some(false)
}

// --- thin ioctl wrappers on descriptors the restorer owns ---

fn ioctl_int_out(fd: &OwnedFd, request: libc::c_ulong, what: &str) -> Result<libc::c_int> {
    tty::int_out(fd, request).context(|| what.to_string())
}

fn ioctl_int_in(fd: &OwnedFd, request: libc::c_ulong, value: libc::c_int, what: &str) -> Result<()> {
    tty::int_in(fd, request, value).context(|| what.to_string())
}

fn get_termios(fd: &OwnedFd) -> Result<libc::termios> {
    tty::termios(fd).context(|| "read the terminal's settings (tcgetattr)".into())
}

fn set_termios(fd: &OwnedFd, t: &libc::termios) -> Result<()> {
    tty::set_termios(fd, t).context(|| "set the terminal's settings (tcsetattr)".into())
}

fn get_winsize(fd: &OwnedFd) -> Result<[u16; 4]> {
    tty::winsize(fd).context(|| "read the window size (TIOCGWINSZ)".into())
}

fn set_winsize(fd: &OwnedFd, w: [u16; 4]) -> Result<()> {
    tty::set_winsize(fd, w).context(|| "set the window size (TIOCSWINSZ)".into())
}

/// Opens the slave of a master the restorer holds (no path needed, whatever its number).
fn open_peer(master: &OwnedFd) -> Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC;
    tty::open_peer(master, flags).context(|| "open the slave of the master (TIOCGPTPEER)".into())
}

/// Which pty pairs are already in the image, by (devpts, index).
#[derive(Default)]
pub struct PtyCaptureState {
    seen: std::collections::HashSet<(u64, u32)>,
}

/// Captures one end of a pty of a stopped process; `pids` are the job's processes (host pids).
pub fn capture(pid: Tid, fd: i32, master: bool, meta: &std::fs::Metadata, pids: &[Tid], seen: &mut PtyCaptureState) -> Result<PtyRecord> {
    let fail = |e: Error| e.of_object(pid, format!("fd {fd} (a pseudo-terminal)"));
    let end = descriptor::take_into_self(pid, fd)?;
    let (index, devpts) = if master { master_identity(&end).map_err(fail)? } else { slave_identity(meta) };
    let mut rec = PtyRecord { index, devpts, master, state: None };
    if !seen.seen.insert(rec.key()) {
        return Ok(rec);
    }
    // The state is read through the master, wherever it is in the job.
    let state = if master {
        capture_state(&end)
    } else {
        match find_master(pids, rec.key()) {
            Some(m) => capture_state(&m),
            None => capture_state_from_slave(&end),
        }
    };
    rec.state = Some(state.map_err(fail)?);
    Ok(rec)
}

/// The (devpts instance, number) of a master's pair.
fn master_identity(master: &OwnedFd) -> Result<(u32, u64)> {
    let index = ioctl_int_out(master, libc::TIOCGPTN, "read the pty number (TIOCGPTN)")? as u32;
    let locked = ioctl_int_out(master, libc::TIOCGPTLCK, "read the pty lock (TIOCGPTLCK)")? != 0;
    let devpts = if locked {
        // A locked pair has no slave open anywhere; its devpts is the one /dev/pts shows.
        std::fs::metadata("/dev/pts").map(|m| m.dev()).unwrap_or(0)
    } else {
        let peer = open_peer(master)?;
        std::fs::metadata(format!("/proc/self/fd/{}", peer.as_raw_fd())).map(|m| m.dev()).context(|| "stat the pty's slave".to_string())?
    };
    Ok((index, devpts))
}

/// The (devpts instance, number) of a slave: Unix98 slaves are numbered 256 per major.
fn slave_identity(meta: &std::fs::Metadata) -> (u32, u64) {
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    ((major - PTY_SLAVE_MAJORS.start()) * 256 + minor, meta.dev())
}

/// The master of a pair, if a process of the job holds it.
fn find_master(pids: &[Tid], key: (u64, u32)) -> Option<OwnedFd> {
    for &pid in pids {
        let Ok(fds) = crate::procfs::fds(pid) else { continue };
        for fd in fds {
            let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")) else { continue };
            if which_end(&meta) != Some(true) {
                continue;
            }
            let Ok(m) = descriptor::take_into_self(pid, fd) else { continue };
            if master_identity(&m).ok().map(|(i, d)| (d, i)) == Some(key) {
                return Some(m);
            }
        }
    }
    None
}

/// Reads the pair's state through a duplicate of the job's master descriptor.
fn capture_state(master: &OwnedFd) -> Result<PtyState> {
    let locked = ioctl_int_out(master, libc::TIOCGPTLCK, "read the pty lock (TIOCGPTLCK)")? != 0;
    let packet_mode = ioctl_int_out(master, libc::TIOCGPKT, "read packet mode (TIOCGPKT)")? != 0;
    let t = get_termios(master)?;
    let winsize = get_winsize(master)?;
    if locked {
        return Ok(PtyState {
            termios: Termios::from_libc(&t),
            winsize,
            locked,
            packet_mode,
            output: Vec::new(),
            input: Vec::new(),
            slave_owner: None,
            hung_up: false,
        });
    }
    let slave = open_peer(master)?;
    let slave_owner = Some(owner_of(&slave)?);
    let input = if t.c_lflag & libc::ICANON != 0 {
        let input = read_lines(master, &slave, &t)?;
        type_back_lines(master, &slave, &t, &input)?;
        input
    } else {
        let input = read_pending(&slave, false).context(|| "read the terminal's pending input".to_string())?;
        if !input.is_empty() {
            type_back(master, &slave, &t, &input)?;
        }
        input
    };
    let output = read_pending(master, packet_mode).context(|| "read the terminal's pending output".to_string())?;
    if !output.is_empty() {
        // Back where they were: written into the slave with output processing off, they reach
        // the master's side unchanged.
        let mut raw = t;
        raw.c_oflag &= !libc::OPOST;
        set_termios(master, &raw)?;
        let written = write_all_nonblocking(&slave, &output);
        set_termios(master, &t)?;
        written.context(|| format!("put {} bytes of terminal output back", output.len()))?;
    }
    Ok(PtyState { termios: Termios::from_libc(&t), winsize, locked, packet_mode, output, input, slave_owner, hung_up: false })
}

/// The (uid, gid, permission bits) of a pty's slave.
fn owner_of(slave: &OwnedFd) -> Result<(u32, u32, u32)> {
    let st = nix::sys::stat::fstat(slave).map_err(std::io::Error::from).context(|| "stat the pty's slave".to_string())?;
    Ok((st.st_uid, st.st_gid, st.st_mode & 0o777))
}

/// Gives a new pair's slave the owner and mode the old one had. Root may give any owner; an
/// ordinary user only their own uid and a group they are in: elsewhere the slave keeps the
/// restart's owner, with a warning (its mode is set all the same).
fn set_slave_owner(slave: &OwnedFd, (uid, gid, mode): (u32, u32, u32)) -> Result<()> {
    use nix::unistd::{fchown, Gid, Uid};
    if owner_of(slave)? == (uid, gid, mode) {
        return Ok(());
    }
    if let Err(e) = fchown(slave, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))) {
        tracing::warn!(uid, gid, "the new terminal keeps the restart's owner, not the job's: {e}");
    }
    nix::sys::stat::fchmod(slave, nix::sys::stat::Mode::from_bits_truncate(mode))
        .map_err(std::io::Error::from)
        .context(|| format!("give the new terminal the mode {mode:o}"))
}

/// A job that holds only the slave (its master is outside the job, say the launcher's terminal
/// multiplexer): its settings are kept, but the output belongs to whoever holds the master.
fn capture_state_from_slave(slave: &OwnedFd) -> Result<PtyState> {
    let slave_owner = Some(owner_of(slave)?);
    let t = match tty::termios(slave) {
        // Hung up: its master is closed (no process outside the job holds one either).
        Err(e) if e.raw_os_error() == Some(libc::EIO) => {
            let none = Termios { iflag: 0, oflag: 0, cflag: 0, lflag: 0, line: 0, cc: Vec::new(), ispeed: 0, ospeed: 0 };
            let (output, input) = (Vec::new(), Vec::new());
            return Ok(PtyState { termios: none, winsize: [0; 4], locked: false, packet_mode: false, output, input, slave_owner, hung_up: true });
        }
        t => t.context(|| "read the terminal's settings (tcgetattr)".into())?,
    };
    let winsize = get_winsize(slave)?;
    Ok(PtyState {
        termios: Termios::from_libc(&t),
        winsize,
        locked: false,
        packet_mode: false,
        output: Vec::new(),
        input: Vec::new(),
        slave_owner,
        hung_up: false,
    })
}

/// Reads everything one end has to read. The line discipline moves bytes between the ends
/// asynchronously (a worker pushes what one end wrote to the other's), but a read that finds
/// nothing runs that worker to its end before it answers EAGAIN (n_tty_read's
/// tty_buffer_flush_work), so with the job's writers stopped an empty non-blocking read is the
/// truth: no wait. (It waited 5 ms for more, twice per pair: 10 ms of freeze for each of the
/// 32 ranks of an Open MPI job, whose launcher gives each rank a pseudo-terminal.)
fn read_pending(end: &OwnedFd, packet_mode: bool) -> std::io::Result<Vec<u8>> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    // Put back below.
    let old_flags = OFlag::from_bits_retain(fcntl(end, FcntlArg::F_GETFL)?);
    fcntl(end, FcntlArg::F_SETFL(old_flags | OFlag::O_NONBLOCK))?;
    let mut file = std::fs::File::from(end.try_clone()?);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let result = loop {
        match file.read(&mut buf) {
            Ok(0) => break Ok(()),
            // In packet mode each read starts with a status byte: 0 before data.
            Ok(n) if packet_mode => out.extend_from_slice(&buf[1.min(n)..n]),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Ok(()),
            // EIO: the other side is closed; nothing is pending then.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    fcntl(end, FcntlArg::F_SETFL(old_flags))?;
    result.map(|()| out)
}

/// Types `input` into the master so that the slave side reads exactly these bytes: with input
/// processing, signals and echo off until the line discipline has taken all of them in (it
/// does so asynchronously), then the settings `t` again.
fn type_back(master: &OwnedFd, slave: &OwnedFd, t: &libc::termios, input: &[u8]) -> Result<()> {
    let mut raw = *t;
    raw.c_iflag = 0;
    raw.c_lflag &= !(libc::ECHO | libc::ECHONL | libc::ICANON | libc::ISIG | libc::IEXTEN);
    type_with(master, slave, (&raw, t), input, input.len(), std::time::Duration::ZERO)
}

/// Types `bytes` into the master with the settings `typed_as`, waits until the slave counts
/// `counted` bytes to read (the line discipline takes what is typed asynchronously), then
/// `settle` more, and gives the pair the settings `t` again, whatever happened.
fn type_with(
    master: &OwnedFd,
    slave: &OwnedFd,
    (typed_as, t): (&libc::termios, &libc::termios),
    bytes: &[u8],
    counted: usize,
    settle: std::time::Duration,
) -> Result<()> {
    set_termios(master, typed_as)?;
    let typed = write_all_nonblocking(master, bytes).map_err(Error::Io).and_then(|()| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while (ioctl_int_out(slave, libc::FIONREAD, "count the input typed back (FIONREAD)")? as usize) < counted {
            if std::time::Instant::now() > deadline {
                return Err(Error::Other("the terminal did not take the input typed back within 2 s".into()));
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        std::thread::sleep(settle);
        Ok(())
    });
    set_termios(master, t)?;
    typed.map_err(|e| Error::Other(format!("type {} bytes of terminal input back: {e}", bytes.len())))
}

/// ^V: the literal-next character while input is typed back in line-editing mode.
const LNEXT: u8 = 0x16;

/// The characters that end a line for settings `t` in canonical mode besides the newline
/// (EOL, EOL2, where set), and the end-of-file character typed back for a line pushed
/// without an end (VEOF, ^D where `t` has none).
fn line_ends(t: &libc::termios) -> (Vec<u8>, u8) {
    let ends = [t.c_cc[libc::VEOL], t.c_cc[libc::VEOL2]].into_iter().filter(|&c| c != 0).collect();
    let eof = match t.c_cc[libc::VEOF] {
        0 => 0x04,
        c => c,
    };
    (ends, eof)
}

/// `bytes` as typed back by [`type_back_lines`]: ^V before each byte the typing settings take
/// as a special character (NUL, which stands for a disabled one; the EOF character; ^V; a line
/// end inside a line being typed).
fn escaped(bytes: &[u8], t: &libc::termios, out: &mut Vec<u8>) {
    let (ends, eof) = line_ends(t);
    for &b in bytes {
        if b == 0 || b == eof || b == LNEXT || b == b'\n' || ends.contains(&b) {
            out.push(LNEXT);
        }
        out.push(b);
    }
}

/// Reads the input the slave side of a pair in canonical mode (settings `t`) has not read:
/// each complete line, one read each, then (switching the pair to non-canonical mode for a
/// moment) the line being typed. Returns the bytes that type them back ([`type_back_lines`]).
/// Leaves the slave's input empty.
fn read_lines(master: &OwnedFd, slave: &OwnedFd, t: &libc::termios) -> Result<Vec<u8>> {
    let (ends, eof) = line_ends(t);
    let mut typing = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut file = std::fs::File::from(slave.try_clone().map_err(Error::Io)?);
    // (FIONREAD counts the complete lines' bytes.)
    while ioctl_int_out(slave, libc::FIONREAD, "count the input not yet read (FIONREAD)")? > 0 {
        let n = match file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(Error::Other(format!("read the terminal's pending lines: {e}"))),
        };
        let line = &buf[..n];
        match line.split_last() {
            Some((&end, body)) if end == b'\n' || ends.contains(&end) => {
                escaped(body, t, &mut typing);
                typing.push(end);
            }
            // Pushed with the end-of-file character, which is not read.
            _ => {
                escaped(line, t, &mut typing);
                typing.push(eof);
            }
        }
    }
    let mut raw = *t;
    raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ECHONL | libc::ISIG | libc::IEXTEN);
    raw.c_cc[libc::VMIN] = 0;
    raw.c_cc[libc::VTIME] = 0;
    set_termios(master, &raw)?;
    let partial = read_pending(slave, false).context(|| "read the line being typed into the terminal".to_string());
    set_termios(master, t)?;
    escaped(&partial?, t, &mut typing);
    Ok(typing)
}

/// Types `typing` (from [`read_lines`]) into the master of a pair in canonical mode (settings
/// `t`): with echo, signals and input processing off and every special character disabled but
/// the line ends, the end-of-file character and ^V, until the line discipline has taken the
/// complete lines in (FIONREAD counts them), then the settings `t` again.
fn type_back_lines(master: &OwnedFd, slave: &OwnedFd, t: &libc::termios, typing: &[u8]) -> Result<()> {
    if typing.is_empty() {
        return Ok(());
    }
    let (ends, eof) = line_ends(t);
    // The bytes the slave will count once the complete lines are in, and whether a line being
    // typed follows them.
    let (mut complete, mut pending, mut literal) = (0usize, 0usize, false);
    for &b in typing {
        match (literal, b) {
            (false, LNEXT) => literal = true,
            (false, b) if b == eof => (complete, pending) = (complete + pending, 0),
            (false, b) if b == b'\n' || ends.contains(&b) => (complete, pending) = (complete + pending + 1, 0),
            _ => (pending, literal) = (pending + 1, false),
        }
    }
    let mut typed_as = *t;
    typed_as.c_iflag = 0;
    typed_as.c_lflag &= !(libc::ECHO | libc::ECHONL | libc::ECHOCTL | libc::ISIG);
    typed_as.c_lflag |= libc::ICANON | libc::IEXTEN;
    for (at, c) in typed_as.c_cc.iter_mut().enumerate() {
        *c = match at {
            libc::VEOF => eof,
            libc::VLNEXT => LNEXT,
            libc::VEOL | libc::VEOL2 | libc::VMIN | libc::VTIME => *c,
            _ => 0,
        };
    }
    // The line being typed is not counted until it ends: the line discipline takes what one
    // write gave it in one go, right after the complete lines (or, without them, as soon as it
    // runs).
    let settle = match (pending, complete) {
        (0, _) => std::time::Duration::ZERO,
        (_, 0) => std::time::Duration::from_millis(5),
        _ => std::time::Duration::from_millis(1),
    };
    type_with(master, slave, (&typed_as, t), typing, complete, settle)
}

fn write_all_nonblocking(fd: &OwnedFd, mut data: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::from(fd.try_clone()?);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !data.is_empty() {
        match file.write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Per-node state of ptys being restored.
#[derive(Default)]
pub struct PtyRestoreState {
    /// Pair → its state, gathered before any is restored.
    states: HashMap<(u64, u32), PtyState>,
    /// Pair → where its new master is: (pid in the job, fd).
    masters: HashMap<(u64, u32), (Tid, u64)>,
    /// Masters opened only so that a slave could be: parked, to be taken by the master's holder.
    parked: HashMap<(u64, u32), (Tid, u64)>,
}

impl PtyRestoreState {
    pub fn collect<'a>(&mut self, fds: impl Iterator<Item = &'a FdRecord>) {
        for rec in fds {
            if let FdKind::Pty(p @ PtyRecord { state: Some(s), .. }) = &rec.kind {
                self.states.insert(p.key(), s.clone());
            }
        }
    }
}

impl DescriptorKind for PtyRecord {
    fn describe(&self) -> String {
        if self.master {
            format!("/dev/ptmx (master of pts {})", self.index)
        } else {
            format!("/dev/pts/{}", self.index)
        }
    }

    fn open(&self, at: &mut Opening<'_>) -> Result<u64> {
        open(at.task, at.ns_pid, at.rec, self, at.ctx, at.scratch_off, at.work_base)
    }
}

/// Opens one end of a pty in the task (making the pair if no end of it exists yet).
fn open(task: &mut RemoteTask, ns_pid: Tid, rec: &FdRecord, p: &PtyRecord, ctx: &mut RestoreCtx, scratch_off: usize, work_base: u64) -> Result<u64> {
    let key = p.key();
    let status_flags = (rec.flags & (libc::O_NONBLOCK | libc::O_ASYNC) as u32) as u64;
    if p.master {
        if let Some((owner, parked)) = ctx.ptys.parked.remove(&key) {
            ctx.ptys.masters.insert(key, (ns_pid, rec.fd as u64));
            let fd = if owner == ns_pid {
                ctx.unpark(ns_pid, parked);
                parked
            } else {
                descriptor::take_from(task, owner, parked)?
            };
            task.syscall("fcntl(F_SETFL)", libc::SYS_fcntl, &[fd, libc::F_SETFL as u64, status_flags])?;
            return Ok(fd);
        }
        let fd = create(task, p, ctx, scratch_off, work_base, status_flags)?;
        ctx.ptys.masters.insert(key, (ns_pid, rec.fd as u64));
        return Ok(fd);
    }
    // A slave: from its master, wherever that is; made (and parked) here if there is none yet.
    let (owner, master_fd) = match ctx.ptys.masters.get(&key).or(ctx.ptys.parked.get(&key)) {
        Some(&m) => m,
        None => {
            let m = create(task, p, ctx, scratch_off, work_base, libc::O_NONBLOCK as u64)?;
            ctx.park(ns_pid, m);
            ctx.ptys.parked.insert(key, (ns_pid, m));
            (ns_pid, m)
        }
    };
    let (master_here, borrowed) = if owner == ns_pid { (master_fd, false) } else { (descriptor::take_from(task, owner, master_fd)?, true) };
    // O_CLOEXEC only where the descriptor had it: TIOCGPTPEER keeps it in the file's own flags,
    // which /proc/PID/fdinfo shows whatever the descriptor's flag becomes, so a slave opened
    // with it would be taken for close-on-exec by every later checkpoint (a shell's terminal
    // closed at its next exec: tmux's pane hung up after a second restart).
    let flags = (rec.flags & (libc::O_ACCMODE | libc::O_NONBLOCK | libc::O_CLOEXEC) as u32) as u64 | libc::O_NOCTTY as u64;
    let slave = task.syscall("ioctl(TIOCGPTPEER)", libc::SYS_ioctl, &[master_here, libc::TIOCGPTPEER, flags]);
    if borrowed {
        task.syscall("close", libc::SYS_close, &[master_here])?;
    }
    slave.context(|| format!("open the slave of the new pty for {}", p.describe()))
}

/// Opens a new master in the task and gives the pair its state; returns the master's descriptor.
fn create(task: &mut RemoteTask, p: &PtyRecord, ctx: &mut RestoreCtx, scratch_off: usize, work_base: u64, status_flags: u64) -> Result<u64> {
    let path = task.put_path(scratch_off, "/dev/ptmx")?;
    let flags = (libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) as u64 | status_flags;
    let master = task.syscall("openat(/dev/ptmx)", libc::SYS_openat, &[libc::AT_FDCWD as u64, path, flags, 0])?;
    let master = descriptor::move_above(task, master, work_base)?;
    let state = ctx
        .ptys
        .states
        .get(&p.key())
        .cloned()
        .ok_or_else(|| Error::Other(format!("the image holds no settings for {} (no descriptor of the pair carries them)", p.describe())))?;
    let ours = descriptor::take_into_self(task.pid, master as i32)?;
    setup(&ours, &state).map_err(|e| Error::Other(format!("give the new pty the settings of {}: {e}", p.describe())))?;
    Ok(master)
}

fn setup(master: &OwnedFd, s: &PtyState) -> Result<()> {
    ioctl_int_in(master, libc::TIOCSPTLCK, 0, "unlock the pty (TIOCSPTLCK)")?;
    if let Some(owner) = s.slave_owner {
        set_slave_owner(&open_peer(master)?, owner)?;
    }
    if s.hung_up {
        // Its slaves are opened from it, then it is closed with the other masters no process
        // takes: they hang up.
        return Ok(());
    }
    set_winsize(master, s.winsize)?;
    let t = s.termios.to_libc();
    set_termios(master, &t)?;
    if !s.input.is_empty() {
        let slave = open_peer(master)?;
        match t.c_lflag & libc::ICANON {
            0 => type_back(master, &slave, &t, &s.input)?,
            _ => type_back_lines(master, &slave, &t, &s.input)?,
        }
    }
    if !s.output.is_empty() {
        let slave = open_peer(master)?;
        let mut raw = t;
        raw.c_oflag &= !libc::OPOST;
        set_termios(master, &raw)?;
        write_all_nonblocking(&slave, &s.output).context(|| format!("put {} bytes of terminal output back", s.output.len()))?;
    }
    set_termios(master, &t)?;
    if s.packet_mode {
        ioctl_int_in(master, libc::TIOCPKT, 1, "set packet mode (TIOCPKT)")?;
    }
    if s.locked {
        ioctl_int_in(master, libc::TIOCSPTLCK, 1, "lock the pty (TIOCSPTLCK)")?;
    }
    Ok(())
}

/// A session's controlling terminal, when it is one of the job's ptys, or a console the job
/// holds a descriptor of.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ControllingTty {
    /// The pty's number at the checkpoint (0 for a console).
    pub index: u32,
    /// The terminal's foreground process group, as a pid in the job (0: none or not in the job).
    pub foreground: Tid,
    /// For a console (a virtual console, 4:0 to 4:63, or the system console; see
    /// `file::is_reopenable_device_number`), its device number: the terminal is taken again
    /// through the session leader's descriptor of that device. `None` for a pty, and from a
    /// file older than format 33.
    #[serde(deserialize_with = "crate::image::since::since::<33, _, _>")]
    pub device: Option<u64>,
}

impl ControllingTty {
    fn describe(&self) -> String {
        match self.device {
            Some(rdev) => format!("the console {}:{}", libc::major(rdev), libc::minor(rdev)),
            None => format!("pts {}", self.index),
        }
    }
}

/// The controlling terminal of a session leader (host pid), if it is a pty or a console: from
/// the tty number and foreground group of /proc/PID/stat. Another kind of terminal (the
/// launcher's own is left behind by the job's init, which starts a new session) is refused.
pub fn capture_ctty(host_pid: Tid) -> Result<Option<ControllingTty>> {
    let stat = crate::procfs::stat(host_pid)?;
    if stat.tty_nr == 0 {
        return Ok(None);
    }
    let (major, minor) = stat.tty_nr();
    let (major, minor) = (major as u32, minor as u32);
    // The group is named by its leader's pid, seen from here (the host's namespace).
    let foreground = if stat.tpgid > 0 { crate::procfs::ns_tid(stat.tpgid).unwrap_or(0) } else { 0 };
    if PTY_SLAVE_MAJORS.contains(&major) {
        return Ok(Some(ControllingTty { index: (major - PTY_SLAVE_MAJORS.start()) * 256 + minor, foreground, device: None }));
    }
    let rdev = libc::makedev(major, minor);
    if super::file::is_console(rdev) {
        return Ok(Some(ControllingTty { index: 0, foreground, device: Some(rdev) }));
    }
    Err(Error::Unsupported { pid: host_pid, what: format!("a controlling terminal {major}:{minor} that is not a pseudo-terminal or a console") })
}

/// Makes a console the controlling terminal of the session `task` (`ns_pid`) leads again
/// through the leader's own descriptor of that device. Makes the pty the controlling terminal of
/// the session again, with its
/// foreground group, through a descriptor of its restored table on the pty's slave, or on its
/// master where the leader holds no slave (it closed the slave after taking the terminal, as
/// zdtm's pty03 and programs that only keep /dev/tty do): a slave opened from it for a moment;
/// where the leader holds neither end, through the master another process of the job holds
/// (`tables`: each process's restored table, by pid in the job; zdtm's tty00, a session whose
/// terminal emulator is its parent), taken for that moment.
pub fn restore_ctty(task: &mut RemoteTask, ns_pid: Tid, tables: &[(Tid, &[FdRecord])], ctty: &ControllingTty, scratch_off: usize) -> Result<()> {
    let own = tables.iter().find(|(pid, _)| *pid == ns_pid).map_or(&[][..], |(_, fds)| *fds);
    if let Some(rdev) = ctty.device {
        // A console: through the leader's own descriptor of it (reopened by its number).
        let held = own.iter().find(|r| matches!(&r.kind, FdKind::CharDevice(d) if d.node.as_ref().is_some_and(|n| n.rdev == rdev)));
        return match held {
            Some(r) => take_as_ctty(task, r.fd as u64, ctty, scratch_off),
            None => {
                tracing::warn!(
                    pid = task.pid,
                    "a session's controlling terminal ({}) is not open in its leader: the session comes back without one",
                    ctty.describe()
                );
                Ok(())
            }
        };
    }
    let end_in = |fds: &[FdRecord], master: bool| {
        fds.iter().find(|r| matches!(&r.kind, FdKind::Pty(p) if p.master == master && p.index == ctty.index)).map(|r| r.fd as u64)
    };
    let open_from = |task: &mut RemoteTask, master: u64| {
        let flags = (libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
        task.syscall("ioctl(TIOCGPTPEER)", libc::SYS_ioctl, &[master, libc::TIOCGPTPEER, flags])
            .context(|| format!("open pts {} from its master to make it the session's controlling terminal", ctty.index))
    };
    let slave = match (end_in(own, false), end_in(own, true)) {
        (Some(slave), _) => Ok((slave, false)),
        (None, Some(master)) => open_from(task, master).map(|fd| (fd, true)),
        (None, None) => match tables.iter().find_map(|&(pid, fds)| Some((pid, end_in(fds, true)?))) {
            Some((holder, master)) => {
                let taken = descriptor::take_from(task, holder, master)?;
                let slave = open_from(task, taken);
                task.syscall("close", libc::SYS_close, &[taken])?;
                slave.map(|fd| (fd, true))
            }
            None => {
                tracing::warn!(
                    pid = task.pid,
                    "a session's controlling terminal (pts {}) is not open in the job: the session comes back without one",
                    ctty.index
                );
                return Ok(());
            }
        },
    };
    let (fd, borrowed) = slave?;
    let r = take_as_ctty(task, fd, ctty, scratch_off);
    if borrowed {
        task.syscall("close", libc::SYS_close, &[fd])?;
    }
    r
}

fn take_as_ctty(task: &mut RemoteTask, fd: u64, ctty: &ControllingTty, scratch_off: usize) -> Result<()> {
    task.syscall("ioctl(TIOCSCTTY)", libc::SYS_ioctl, &[fd, libc::TIOCSCTTY, 0])
        .context(|| format!("make {} (fd {fd}) the session's controlling terminal", ctty.describe()))?;
    if ctty.foreground != 0 {
        let addr = task.put(scratch_off, &ctty.foreground.to_le_bytes())?;
        task.syscall("ioctl(TIOCSPGRP)", libc::SYS_ioctl, &[fd, libc::TIOCSPGRP, addr])
            .context(|| format!("give the terminal's foreground to process group {}", ctty.foreground))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// A new pair, unlocked: (master, slave).
    fn pair() -> (OwnedFd, OwnedFd) {
        let master: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY).open("/dev/ptmx").unwrap().into();
        ioctl_int_in(&master, libc::TIOCSPTLCK, 0, "unlock").unwrap();
        let slave = open_peer(&master).unwrap();
        (master, slave)
    }

    /// What the slave side reads, one read at a time, until nothing is left (non-blocking).
    fn reads(slave: &OwnedFd) -> Vec<Vec<u8>> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        fcntl(slave, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
        let mut file = std::fs::File::from(slave.try_clone().unwrap());
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = file.read(&mut buf) {
            out.push(buf[..n].to_vec());
            if n == 0 {
                break;
            }
        }
        out
    }

    /// In line-editing mode the lines not yet read, each with its end (a newline, an EOL
    /// character, the end-of-file character that pushes a line without one), and the line
    /// being typed, special characters in it too, are read out and typed back: the slave reads
    /// the same lines, one read each, and the line being typed only once it is ended; nothing
    /// is echoed twice.
    #[test]
    fn lines_typed_in_line_editing_mode_come_back_line_by_line() {
        let (master, slave) = pair();
        let mut t = get_termios(&slave).unwrap();
        t.c_lflag |= libc::ICANON | libc::ECHO | libc::IEXTEN;
        t.c_cc[libc::VEOL] = b';';
        set_termios(&master, &t).unwrap();
        let mut m = std::fs::File::from(master.try_clone().unwrap());
        // "two" with a ^V-escaped ^D inside, "four" pushed with ^D, "half" being typed.
        m.write_all(b"one\ntwo\x16\x04x;three\nfour\x04hal\x16\nf").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let echoed = read_pending(&master, false).unwrap();
        let typing = read_lines(&master, &slave, &t).unwrap();
        assert_eq!(ioctl_int_out(&slave, libc::FIONREAD, "").unwrap(), 0, "read out");
        type_back_lines(&master, &slave, &t, &typing).unwrap();
        assert_eq!(read_pending(&master, false).unwrap(), b"", "typed back without echo (echoed first: {echoed:?})");
        assert_eq!(get_termios(&slave).unwrap().c_lflag, t.c_lflag, "the settings are the program's again");
        let lines = reads(&slave);
        assert_eq!(lines, [b"one\n".to_vec(), b"two\x04x;".to_vec(), b"three\n".to_vec(), b"four".to_vec()], "{typing:?}");
        // The line being typed, ended now.
        m.write_all(b"\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(reads(&slave), [b"hal\nf\n".to_vec()]);
    }

    /// The bytes typed back say what they will read as: counts and escapes.
    #[test]
    fn special_bytes_inside_a_line_are_typed_literally() {
        let (_master, slave) = pair();
        let mut t = get_termios(&slave).unwrap();
        t.c_cc[libc::VEOF] = 0;
        t.c_cc[libc::VEOL] = 0;
        t.c_cc[libc::VEOL2] = 0;
        let mut out = Vec::new();
        escaped(b"a\0b\x04c\x16d\ne", &t, &mut out);
        assert_eq!(out, b"a\x16\0b\x16\x04c\x16\x16d\x16\ne");
        assert_eq!(line_ends(&t), (Vec::new(), 0x04), "^D where the program has no EOF character");
    }
}
