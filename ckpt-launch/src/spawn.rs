//! Starting the job's init in a new PID and mount namespace, and talking to it.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use anyhow::{anyhow, bail, Context, Result};
use ckpt_core::objects::timens::Offsets;
use ckpt_core::ptrace::Tid;
use ckpt_core::sys::process::{self, Forked};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// The descriptor number of the control socket in the job's init.
const INIT_CONTROL_FD: i32 = 3;

/// The job's init, seen from the launcher.
pub struct JobInit {
    /// Its pid outside the namespace.
    pub host_pid: Tid,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The job's mount table as the init set it up, before any process of the job ran: what the
    /// job changes is measured from it (see [`ckpt_core::objects::mounts`]).
    pub mounts_baseline: Vec<ckpt_core::objects::mounts::MountInfo>,
}

/// How the job ended: as its main process did.
pub use ckpt_core::snapshot::MainEnd as JobEnd;

impl JobInit {
    /// Starts `ckpt __init` as pid 1 of a new PID namespace (and mount and IPC namespaces, for
    /// its /proc and the job's System V objects). Without privilege, in a new user namespace
    /// too, which those namespaces belong to (see [`ckpt_core::userns`]).
    pub fn spawn(init_args: &[String]) -> Result<JobInit> {
        let (ours, theirs) = UnixStream::pair().context("socketpair for the job's init")?;
        let exe = CString::new("/proc/self/exe").unwrap();
        let mut argv: Vec<CString> = vec![CString::new("ckpt").unwrap(), CString::new("__init").unwrap()];
        argv.push(CString::new(format!("--control-fd={INIT_CONTROL_FD}")).unwrap());
        argv.extend(init_args.iter().map(|a| CString::new(a.as_bytes()).expect("argument without NUL")));
        let program = process::Exec::new(exe, argv);

        let own_user_ns = !ckpt_core::userns::privileged();
        // The child waits on this pipe until its uid and gid maps are written.
        let (maps_ready_read, maps_ready_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe for the job's init")?;
        let mut flags = (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::SIGCHLD) as libc::c_ulong;
        if own_user_ns {
            flags |= libc::CLONE_NEWUSER as libc::c_ulong;
        }
        // SAFETY: the child only makes async-signal-safe calls (close, read, capget, capset,
        // prctl, fcntl or dup2, close_range, execve, _exit) on data prepared before the call.
        let pid = match unsafe { process::clone_fork(flags) } {
            Err(e) => {
                if own_user_ns {
                    bail!("cannot create the job's user namespace (clone CLONE_NEWUSER: {e}): {}", ckpt_core::userns::unavailable_reason());
                }
                return Err(e).context("create the job's PID namespace (clone CLONE_NEWPID)");
            }
            Ok(Forked::Child) => {
                drop(maps_ready_write);
                let mut byte = [0u8];
                if nix::unistd::read(&maps_ready_read, &mut byte) != Ok(1) {
                    process::exit_now(126); // the launcher gave up (its error says why)
                }
                if own_user_ns && ckpt_core::userns::keep_caps_across_exec().is_err() {
                    process::exit_now(125);
                }
                // The job gets stdio and nothing else of the launcher's; the control socket is
                // put at a known number.
                process::exec_with_fd(&program, theirs.as_fd(), INIT_CONTROL_FD);
            }
            Ok(Forked::Parent(pid)) => pid,
        };
        drop(maps_ready_read);
        if own_user_ns {
            if let Err(e) = ckpt_core::userns::map_own_ids(pid) {
                // Our own child, which has not started anything yet.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = waitpid(Pid::from_raw(pid), None);
                return Err(anyhow!(e)).context("set up the job's user namespace");
            }
        }
        nix::unistd::write(&maps_ready_write, &[1]).context("start the job's init")?;
        drop(maps_ready_write);
        drop(theirs);
        let writer = ours.try_clone()?;
        let mut init = JobInit { host_pid: pid, reader: BufReader::new(ours), writer, mounts_baseline: Vec::new() };
        let ready = init.read_line()?;
        let baseline = if ready == "ready" {
            ckpt_core::objects::mounts::read_table(init.host_pid).map_err(|e| anyhow!(e))
        } else {
            Err(anyhow!("job init said {ready:?}"))
        };
        match baseline {
            Ok(table) => init.mounts_baseline = table,
            Err(e) => {
                init.kill();
                let _ = waitpid(Pid::from_raw(init.host_pid), None);
                return Err(e).context("set up the job's init (its mount table)");
            }
        }
        Ok(init)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("the job's init ended unexpectedly");
        }
        Ok(line.trim_end().to_string())
    }

    /// Launch mode: the pid (in the namespace) of the started program.
    pub fn started(&mut self) -> Result<Tid> {
        writeln!(self.writer, "start")?;
        let line = self.read_line()?;
        line.strip_prefix("started ").and_then(|p| p.parse().ok()).ok_or_else(|| anyhow!("job init said {line:?}"))
    }

    /// Restart mode, before the first [`JobInit::spawn_empty`]: the processes the init creates
    /// from now on are in a new time namespace with `offsets` (see
    /// [`ckpt_core::objects::timens`]).
    pub fn set_clock_offsets(&mut self, offsets: &Offsets) -> Result<()> {
        writeln!(self.writer, "clocks {} {}", offsets.monotonic_ns, offsets.boottime_ns)?;
        let line = self.read_line()?;
        match line.strip_prefix("error ") {
            None if line == "clocks set" => Ok(()),
            None => bail!("job init said {line:?}"),
            Some(err) => bail!("{err}"),
        }
    }

    /// Restart mode: creates an empty process with `ns_pid`; returns its host pid.
    pub fn spawn_empty(&mut self, ns_pid: Tid) -> Result<Tid> {
        writeln!(self.writer, "spawn {ns_pid}")?;
        let line = self.read_line()?;
        if let Some(err) = line.strip_prefix("error ") {
            bail!("{err} (is another job using this pid namespace?)");
        }
        host_pid_in_job(self.host_pid, ns_pid).ok_or_else(|| anyhow!("created pid {ns_pid} but cannot find it among the init's children"))
    }

    /// Names the process whose end ends the job.
    pub fn set_main(&mut self, ns_pid: Tid) -> Result<()> {
        writeln!(self.writer, "main {ns_pid}")?;
        Ok(())
    }

    /// Restart mode, instead of [`JobInit::set_main`]: the job's main process had ended
    /// (`end`) before the checkpoint; the job ends with the last of its processes.
    pub fn set_main_ended(&mut self, end: JobEnd) -> Result<()> {
        writeln!(self.writer, "main-ended {}", end_words(end))?;
        Ok(())
    }

    /// Waits for the job to end, then reaps the init: the main process's end, once no process
    /// of the job is left. `main_ended` is told when the main process ends before the daemons
    /// it left (see the init).
    pub fn wait_end(mut self, main_ended: &dyn Fn(JobEnd)) -> Result<JobEnd> {
        let end = loop {
            match self.read_line() {
                Ok(line) => match line.strip_prefix("main-ended ").map(parse_end) {
                    Some(Some(end)) => {
                        main_ended(end);
                        continue;
                    }
                    Some(None) => bail!("job init said {line:?}"),
                    None => break parse_end(&line).ok_or_else(|| anyhow!("job init said {line:?}"))?,
                },
                Err(_) => break JobEnd::Killed(libc::SIGKILL),
            }
        };
        let _ = waitpid(Pid::from_raw(self.host_pid), None);
        Ok(end)
    }

    pub fn kill(&self) {
        let _ = kill(Pid::from_raw(self.host_pid), Signal::SIGKILL);
    }
}

/// The host pid of a child of the job's init, by its pid inside the job.
pub fn host_pid_in_job(init_host_pid: Tid, ns_pid: Tid) -> Option<Tid> {
    ckpt_core::procfs::children(init_host_pid).ok()?.into_iter().find(|c| ckpt_core::procfs::ns_tid(*c).ok() == Some(ns_pid))
}

fn parse_end(line: &str) -> Option<JobEnd> {
    let (word, n) = line.split_once(' ')?;
    let n = n.parse().ok()?;
    match word {
        "exited" => Some(JobEnd::Exited(n)),
        "killed" => Some(JobEnd::Killed(n)),
        _ => None,
    }
}

fn end_words(end: JobEnd) -> String {
    match end {
        JobEnd::Exited(n) => format!("exited {n}"),
        JobEnd::Killed(n) => format!("killed {n}"),
    }
}
