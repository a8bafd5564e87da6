//! The coordinator at scale (issue 37, item 3): the real coordinator of `ckpt-coord`, in a
//! process of its own, against N simulated agents that speak the real protocol over TCP (the
//! handshake of `secure.rs`, `hello`, `welcome`, `joined`, heartbeats every second, every phase
//! of a checkpoint answered with replies of a real agent's shape and size), and failures on
//! demand (an agent that stops answering). It reports, for each N:
//!
//! - the coordination time of a checkpoint: from the request to the commit, less the agents'
//!   own work (zero here but for creating the files they list, which is timed and subtracted);
//! - the coordinator's CPU while idle (heartbeats only) and during a checkpoint, and its memory;
//! - the manifest's size and write time;
//! - the time to notice a silent agent and to decide a recovery (`--recover`);
//! - the time of a `status` request.
//!
//! `bench/coord-scale.sh` runs it for 64, 512 and 4,096 agents and writes
//! docs/bench-coord-scale.md. The fake agents run in this process, one thread each: the machine
//! is shared between them and the coordinator, so what is measured on the coordinator is its
//! own CPU time (from /proc), beside the wall-clock times.

use std::collections::HashMap;
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::messages::{CheckpointRequest, Request, Response};
use ckpt_coord::remote::{self, send_frame};
use ckpt_coord::secure::{self, ChannelReader, ChannelWriter, Key};
use ckpt_coord::server::{self, ControlSocket, RshConfig, TcpConfig};
use ckpt_coord::wire::{self, read_frame, AgentCommand, AgentReply, Frame, Persisted, Role, WireError, ADDR_FILE, LOST_AFTER};
use ckpt_coord::Coordinator;
use ckpt_core::image::{CheckpointDir, FileEntry, Manifest};
use clap::{Parser, Subcommand};
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(about = "The coordinator against N simulated agents over TCP (issue 37, item 3)")]
struct Cli {
    #[command(subcommand)]
    serve: Option<Serve>,
    /// Numbers of agents, one run each.
    #[arg(long, value_delimiter = ',', default_value = "64,512,4096")]
    agents: Vec<usize>,
    /// Files each agent lists in `persisted` (procs.bin, files.bin and chunk files): a node of
    /// 64 ranks that wrote one chunk each since the last generation.
    #[arg(long, default_value_t = 66)]
    files_per_node: usize,
    /// Checkpoints per run.
    #[arg(long, default_value_t = 3)]
    checkpoints: usize,
    /// Seconds of idleness (heartbeats only) over which the coordinator's CPU is measured.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// A fixed time each agent takes to capture (answering `prepare`); subtracted from the
    /// coordination time.
    #[arg(long, default_value_t = 0)]
    work_ms: u64,
    /// Agents per relay (docs/PLAN-SCALE.md, "relays"): once every agent has joined, the
    /// harness plays one relay per group of this many, each attaching its group and answering
    /// for it (0: no relays, every agent talks to the coordinator itself).
    #[arg(long, default_value_t = 0)]
    relay_every: usize,
    /// Where the checkpoint directories go (one per run, removed after).
    #[arg(long, default_value = "/tmp")]
    work_dir: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the markdown table here too.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Serve {
    /// (internal) The coordinator process: serves the checkpoint directory as `ckpt coordinator
    /// --listen 127.0.0.1:0 --recover --spares spare-0 --rsh true` does.
    Coordinator { dir: PathBuf },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    raise_nofile();
    if let Some(Serve::Coordinator { dir }) = &cli.serve {
        return serve(dir);
    }
    let mut results = Vec::new();
    for &n in &cli.agents {
        eprintln!("coord-scale: {n} agents");
        let r = run(&cli, n).with_context(|| format!("the run with {n} agents"))?;
        eprintln!("{}", serde_json::to_string(&r)?);
        results.push(r);
    }
    let table = markdown(&results, &cli);
    println!("{table}");
    if let Some(p) = &cli.markdown {
        fs::write(p, &table).with_context(|| format!("write {}", p.display()))?;
    }
    if let Some(p) = &cli.json {
        fs::write(p, serde_json::to_string_pretty(&results)?).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// Thousands of sockets, on both sides.
fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The coordinator process, set up as `ckpt coordinator` sets itself up
/// (ckpt-launch/src/coord.rs, `run_coordinator`), with `--recover` so that a lost agent starts
/// a recovery; the spare's restart is started through an rsh template that runs `true`.
fn serve(dir: &Path) -> Result<()> {
    let cdir = CheckpointDir::create(dir)?;
    let socket = ControlSocket::bind(dir)?;
    cdir.remove_uncommitted()?;
    let secret = wire::load_or_create_secret(dir)?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let bound = listener.local_addr()?;
    let coordinator = Coordinator::new(cdir, 2, vec!["coord-scale".into()])?;
    let coord = Arc::new(Mutex::new(coordinator));
    let registry = coord.lock().unwrap_or_else(|p| p.into_inner()).registry();
    server::serve_control(coord.clone(), &socket)?;
    let tcp = Arc::new(TcpConfig {
        key: Key::from_secret(&secret),
        restoring: Mutex::new(server::Restoring::default()),
        rsh: Some(RshConfig { template: "true".into(), exe: "/bin/true".into(), dir: dir.to_path_buf() }),
        local_dir: None,
        data_ports: Default::default(),
        dir: dir.to_path_buf(),
        recover: true,
        reach: Mutex::new(Some(bound.to_string())),
        hosts: Mutex::default(),
        starting: Mutex::default(),
    });
    server::serve_tcp(coord.clone(), listener, tcp.clone())?;
    let mut recovery = ckpt_coord::recovery::Recovery::new(ckpt_coord::recovery::RecoveryConfig { spares: vec!["spare-0".into()], max_attempts: 1 });
    fs::write(dir.join(ADDR_FILE), format!("{bound}\n"))?;
    // The loop of `ckpt coordinator`; it ends when the harness kills it.
    loop {
        std::thread::sleep(Duration::from_millis(200));
        recovery.tick(&coord, &tcp);
        if let Ok(mut c) = coord.try_lock() {
            c.finish_flushes();
        }
        let _ = registry.nodes().is_empty();
    }
}

/// One simulated agent, as seen by the harness.
#[derive(Clone)]
struct FakeAgent {
    node: String,
    writer: Arc<Mutex<ChannelWriter>>,
    /// Stops heartbeats and answers: the agent "hangs".
    silent: Arc<AtomicBool>,
    /// When it last sent anything (ns since the run's start).
    last_sent: Arc<AtomicU64>,
    /// Attached to a relay: its heartbeats and answers go through the relay.
    relayed: Arc<AtomicBool>,
}

/// What the agents' threads report, shared.
#[derive(Default)]
struct Shared {
    /// Nanoseconds the agents spent on their own work (creating the files they list).
    work_ns: AtomicU64,
    /// When (ns since the run's start) each agent saw its connection closed by the coordinator.
    closed_at: Mutex<HashMap<String, u64>>,
    /// When each agent was told `recover`.
    recover_at: Mutex<Vec<u64>>,
    replies: AtomicUsize,
    /// When the first agent was told `commit` (the manifest is written): ns since the start.
    commit_at: AtomicU64,
}

struct Run {
    start: Instant,
    gen_root: PathBuf,
    staging: PathBuf,
    files_per_node: usize,
    /// The generation the staged parts are for.
    staged_for: Mutex<u64>,
    work: Duration,
    shared: Shared,
}

impl Run {
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

/// The files of a node's part: its records and one chunk per rank (the manifest lists the
/// records and the node's index, `index.bin`, which lists the chunks).
fn part_files(node: &str, k: usize) -> Vec<(String, u64)> {
    let mut files = vec![(format!("{node}/procs.bin"), 48 << 10), (format!("{node}/files.bin"), 4 << 10)];
    for i in 0..k.saturating_sub(2) {
        files.push((format!("{node}/chunks/p{}-{:016}", 100 + i, 0), 4 << 20));
    }
    files
}

/// Prepares every agent's part of `generation` in a staging directory, off the clock: sparse
/// files of the listed sizes, and the node's index of its chunks, as a real agent writes it.
fn stage_parts(run: &Run, nodes: &[String], generation: u64) -> std::io::Result<()> {
    *run.staged_for.lock().unwrap() = generation;
    for node in nodes {
        let dir = run.staging.join(node);
        let mut index = ckpt_core::image::PartIndex { generation, node: node.clone(), files: Vec::new() };
        fs::create_dir_all(dir.join("chunks"))?;
        for (path, size) in part_files(node, run.files_per_node) {
            let file = run.staging.join(&path);
            if file.metadata().ok().map(|m| m.len()) != Some(size) {
                fs::File::create(&file)?.set_len(size)?;
            }
            if path.contains("/chunks/") {
                index.files.push(FileEntry { path, size, crc32c: 0x1234_5678 });
            }
        }
        index.write(&dir).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// CPU time of the calling thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a plain system call on a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Puts the node's part of `generation` in place: the part was staged before the checkpoint,
/// so what is left on the clock is one rename (a real agent makes its directory there too). Its
/// CPU time is counted as the agent's own work. What the node lists in `persisted`: its records
/// and its index, and the bytes its index lists.
fn write_part(run: &Run, node: &str, generation: u64) -> std::io::Result<(Vec<FileEntry>, u64)> {
    let staged = *run.staged_for.lock().unwrap();
    if staged != generation {
        return Err(std::io::Error::other(format!("the parts were staged for generation {staged}, not {generation}")));
    }
    let t = thread_cpu_ns();
    let gen_dir = run.gen_root.join(format!("gen-{generation:06}"));
    fs::rename(run.staging.join(node), gen_dir.join(node))?;
    let mut listed = Vec::new();
    let mut part_bytes = 0;
    for (path, size) in part_files(node, run.files_per_node) {
        if path.contains("/chunks/") {
            part_bytes += size;
        } else {
            listed.push(FileEntry { path, size, crc32c: 0x1234_5678 });
        }
    }
    let index = format!("{node}/{}", ckpt_core::image::INDEX_FILE);
    let bytes = fs::read(gen_dir.join(&index))?;
    listed.push(FileEntry { path: index, size: bytes.len() as u64, crc32c: crc32c::crc32c(&bytes) });
    run.shared.work_ns.fetch_add(thread_cpu_ns() - t, Relaxed);
    Ok((listed, part_bytes))
}

/// The answer of a real agent to `cmd`, without its job.
fn answer(run: &Run, node: &str, cmd: &AgentCommand, files: &mut (Vec<FileEntry>, u64)) -> AgentReply {
    let generation = cmd.generation();
    match cmd {
        AgentCommand::CopyAhead { .. } => match write_part(run, node, generation) {
            Ok(f) => {
                *files = f;
                AgentReply::Done { generation }
            }
            Err(e) => AgentReply::Failed { generation, message: format!("writing the part: {e}"), passing: false },
        },
        AgentCommand::Freeze { .. } => AgentReply::Frozen { generation, tcp_ends: Vec::new() },
        AgentCommand::Prepare { .. } => {
            if !run.work.is_zero() {
                std::thread::sleep(run.work);
            }
            AgentReply::Captured { generation, processes: 64, threads: 192 }
        }
        AgentCommand::Release { .. } => AgentReply::Released { generation, frozen_ms: run.work.as_secs_f64() * 1e3 },
        AgentCommand::Persist { .. } => {
            let (listed, part_bytes) = std::mem::take(files);
            let stored: u64 = listed.iter().map(|f| f.size).sum::<u64>() + part_bytes;
            AgentReply::Persisted(Persisted {
                generation,
                files: listed,
                part_bytes,
                bytes_raw: stored * 2,
                bytes_stored: stored,
                pool_wait_ms: 0.0,
                needs: Vec::new(),
                copied_ahead: stored,
                gpu: None,
            })
        }
        AgentCommand::Drain { .. } => AgentReply::Drained { generation, outq: 0, refills: Vec::new() },
        _ => AgentReply::Done { generation },
    }
}

/// Joins one agent: handshake, `hello`, `welcome`, `joined`.
fn join(addr: &str, key: &Key, node: &str) -> Result<(ChannelReader, ChannelWriter)> {
    let stream = TcpStream::connect(addr)?;
    let _ = stream.set_nodelay(true);
    let mut channel = secure::connect(stream, key)?;
    let role = Role::Agent { node: node.into(), pid: std::process::id(), restart: false, data_port: None };
    wire::write_frame(&mut channel, &Frame::Hello { role })?;
    let (reader, mut writer) = channel.split();
    reader.set_read_timeout(Some(Duration::from_secs(30)))?;
    loop {
        match read_frame(&reader)? {
            Frame::Welcome { .. } => break,
            Frame::Heartbeat => continue,
            other => bail!("{node}: the coordinator answered {other:?} to hello"),
        }
    }
    wire::write_frame(&mut writer, &Frame::Joined)?;
    reader.set_read_timeout(None)?;
    Ok((reader, writer))
}

/// Opens a relay's connection (run by the agent of the group's first node) and attaches the
/// group's agents to it.
fn join_relay(addr: &str, key: &Key, group: &[FakeAgent]) -> Result<(ChannelReader, Arc<Mutex<ChannelWriter>>)> {
    let stream = TcpStream::connect(addr)?;
    let _ = stream.set_nodelay(true);
    let mut channel = secure::connect(stream, key)?;
    wire::write_frame(&mut channel, &Frame::Hello { role: Role::Relay { node: group[0].node.clone() } })?;
    let (reader, writer) = channel.split();
    let writer = Arc::new(Mutex::new(writer));
    for a in group {
        send_frame(&writer, &Frame::Attached { node: a.node.clone() })?;
        a.relayed.store(true, Relaxed);
    }
    Ok((reader, writer))
}

/// A relay's thread, as a real relay does on the wire: every `fanout` answered with one
/// `replies` (each agent's answer computed here, as its own thread would), a heartbeat a
/// second upstream, and an agent gone silent reported `lost` after [`LOST_AFTER`].
fn relay_loop(run: Arc<Run>, group: Vec<FakeAgent>, reader: ChannelReader, writer: Arc<Mutex<ChannelWriter>>, stop: Arc<AtomicBool>) {
    let mut files: HashMap<String, (Vec<FileEntry>, u64)> = HashMap::new();
    let mut reported = std::collections::HashSet::new();
    let _ = reader.set_read_timeout(Some(Duration::from_millis(200)));
    let mut beat = Instant::now();
    while !stop.load(Relaxed) {
        if beat.elapsed() >= wire::HEARTBEAT_EVERY {
            let _ = send_frame(&writer, &Frame::Heartbeat);
            beat = Instant::now();
        }
        for a in &group {
            let since = run.now_ns().saturating_sub(a.last_sent.load(Relaxed));
            if a.silent.load(Relaxed) && since >= LOST_AFTER.as_nanos() as u64 && reported.insert(a.node.clone()) {
                let _ = send_frame(&writer, &Frame::Lost { node: a.node.clone(), why: format!("silent for {} s", LOST_AFTER.as_secs()) });
            }
        }
        match read_frame(&reader) {
            Ok(Frame::Fanout { nodes, cmd }) => {
                if let AgentCommand::Commit { .. } = cmd {
                    run.shared.commit_at.fetch_min(run.now_ns(), Relaxed);
                }
                let mut replies = Vec::with_capacity(nodes.len());
                for node in nodes {
                    let Some(a) = group.iter().find(|a| a.node == node) else { continue };
                    if a.silent.load(Relaxed) {
                        continue;
                    }
                    let reply = answer(&run, &node, &cmd, files.entry(node.clone()).or_default());
                    a.last_sent.store(run.now_ns(), Relaxed);
                    replies.push(wire::NodeReply { node, reply });
                }
                if send_frame(&writer, &Frame::Replies { replies }).is_ok() {
                    run.shared.replies.fetch_add(1, Relaxed);
                }
            }
            Ok(_) | Err(WireError::Silent(_)) => {}
            Err(_) => return,
        }
        // An attached agent that is not silent is alive: its relay sees it (a real relay
        // hears its heartbeats).
        for a in &group {
            if !a.silent.load(Relaxed) {
                a.last_sent.store(run.now_ns(), Relaxed);
            }
        }
    }
}

/// The agent's thread: answers commands until its connection closes.
fn agent_loop(run: Arc<Run>, node: String, reader: ChannelReader, agent: (Arc<Mutex<ChannelWriter>>, Arc<AtomicBool>, Arc<AtomicU64>)) {
    let (writer, silent, last_sent) = agent;
    let mut files = (Vec::new(), 0);
    loop {
        match read_frame(&reader) {
            Ok(Frame::Command(cmd)) => {
                if let AgentCommand::Commit { .. } = cmd {
                    run.shared.commit_at.fetch_min(run.now_ns(), Relaxed);
                }
                if silent.load(Relaxed) {
                    continue;
                }
                let reply = answer(&run, &node, &cmd, &mut files);
                if send_frame(&writer, &Frame::Reply(reply)).is_ok() {
                    last_sent.store(run.now_ns(), Relaxed);
                    run.shared.replies.fetch_add(1, Relaxed);
                }
            }
            Ok(Frame::Recover { .. }) => run.shared.recover_at.lock().unwrap().push(run.now_ns()),
            Ok(_) => {}
            Err(WireError::Closed) | Err(WireError::Io(_)) => {
                run.shared.closed_at.lock().unwrap().insert(node.clone(), run.now_ns());
                return;
            }
            Err(_) => {}
        }
    }
}

/// One heartbeat a second from every agent that has joined and is not silent, as a real
/// agent's `start_heartbeat` does, all from one thread. It starts before the first agent joins:
/// an agent that joined early would otherwise be lost before the last one has joined.
fn heartbeats(run: Arc<Run>, joined: Arc<Mutex<Vec<FakeAgent>>>, stop: Arc<AtomicBool>) {
    while !stop.load(Relaxed) {
        let t = Instant::now();
        let agents: Vec<FakeAgent> = joined.lock().unwrap().clone();
        for a in agents.iter() {
            // An attached agent's heartbeats are its relay's business.
            if a.relayed.load(Relaxed) {
                continue;
            }
            if !a.silent.load(Relaxed) && send_frame(&a.writer, &Frame::Heartbeat).is_ok() {
                a.last_sent.store(run.now_ns(), Relaxed);
            }
        }
        std::thread::sleep(wire::HEARTBEAT_EVERY.saturating_sub(t.elapsed()));
    }
}

/// CPU time (user + system) of a process, in seconds.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(") ").ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM), or a count (Threads).
fn proc_status(pid: u32, field: &str) -> Result<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = s.lines().find(|l| l.starts_with(field)).ok_or_else(|| anyhow!("no {field} in /proc/{pid}/status"))?;
    Ok(line[field.len() + 1..].split_whitespace().next().unwrap_or("0").parse()?)
}

#[derive(Serialize, Debug, Default)]
struct Checkpoint {
    /// From the request until the first agent is told `commit` (the manifest is written).
    to_commit_ms: f64,
    /// From the request until its answer (after the commit is told to every agent, and older
    /// generations pruned).
    wall_ms: f64,
    /// What the agents spent on their own work meanwhile (summed over agents).
    agent_work_ms: f64,
    coordination_ms: f64,
    coord_cpu_ms: f64,
    /// The simulated agents' CPU meanwhile (this process).
    harness_cpu_ms: f64,
    durable_ms: f64,
}

#[derive(Serialize, Debug, Default)]
struct Results {
    agents: usize,
    files_per_node: usize,
    join_s: f64,
    coord_threads: u64,
    idle_cpu_pct: f64,
    harness_idle_cpu_pct: f64,
    checkpoints: Vec<Checkpoint>,
    checkpoint_cpu_pct: f64,
    rss_mib: f64,
    hwm_mib: f64,
    manifest_bytes: u64,
    /// Files the manifest lists itself (each node's records and index).
    manifest_files: usize,
    manifest_write_ms: f64,
    status_tcp_ms: Vec<f64>,
    status_unix_ms: Vec<f64>,
    status_during_checkpoint_ms: f64,
    lost_noticed_s: f64,
    recovery_decided_ms: f64,
    recovery_all_told_ms: f64,
}

fn run(cli: &Cli, n: usize) -> Result<Results> {
    let dir = cli.work_dir.join(format!("coord-scale-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let secret = wire::load_or_create_secret(&dir)?;
    let mut child = spawn_coordinator(&dir)?;
    let out = measure(cli, n, &dir, &secret, &child);
    let _ = child.kill();
    let _ = child.wait();
    let _ = fs::remove_dir_all(&dir);
    out
}

fn spawn_coordinator(dir: &Path) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("coordinator").arg(dir);
    // SAFETY: prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the coordinator")?;
    let addr_file = dir.join(ADDR_FILE);
    let t = Instant::now();
    while !addr_file.exists() {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("the coordinator did not start within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(child)
}

fn status_tcp(addr: &str, secret: &str) -> Result<(f64, usize)> {
    let t = Instant::now();
    let r = remote::request(addr, secret, &Request::Status)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    match r {
        Response::Status(s) => Ok((ms, s.nodes.len())),
        other => bail!("status answered {other:?}"),
    }
}

fn measure(cli: &Cli, n: usize, dir: &Path, secret: &str, child: &Child) -> Result<Results> {
    let pid = child.id();
    let addr = fs::read_to_string(dir.join(ADDR_FILE))?.trim().to_string();
    let key = Arc::new(Key::from_secret(secret));
    let run = Arc::new(Run {
        start: Instant::now(),
        gen_root: dir.to_path_buf(),
        staging: dir.join("staging"),
        files_per_node: cli.files_per_node,
        staged_for: Mutex::new(0),
        work: Duration::from_millis(cli.work_ms),
        shared: Shared::default(),
    });
    let mut r = Results { agents: n, files_per_node: cli.files_per_node, ..Default::default() };

    // Join: a few connecting threads (the coordinator takes at most 32 handshakes at once).
    let t = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let joined: Arc<Mutex<Vec<FakeAgent>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let (run, joined, stop) = (run.clone(), joined.clone(), stop.clone());
        std::thread::spawn(move || heartbeats(run, joined, stop));
    }
    let connectors: Vec<_> = (0..8)
        .map(|_| {
            let (next, joined, run, key, addr) = (next.clone(), joined.clone(), run.clone(), key.clone(), addr.clone());
            std::thread::spawn(move || -> Result<()> {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let node = format!("node{i:05}");
                    let (reader, writer) = join(&addr, &key, &node)?;
                    let a = FakeAgent {
                        node: node.clone(),
                        writer: Arc::new(Mutex::new(writer)),
                        silent: Arc::default(),
                        last_sent: Arc::new(AtomicU64::new(run.now_ns())),
                        relayed: Arc::default(),
                    };
                    let parts = (a.writer.clone(), a.silent.clone(), a.last_sent.clone());
                    let run = run.clone();
                    std::thread::Builder::new().name(node.clone()).stack_size(128 << 10).spawn(move || agent_loop(run, node, reader, parts))?;
                    joined.lock().unwrap().push(a);
                }
            })
        })
        .collect();
    for c in connectors {
        c.join().map_err(|_| anyhow!("a connecting thread panicked"))??;
    }
    let nodes: Vec<String> = joined.lock().unwrap().iter().map(|a| a.node.clone()).collect();
    // Joined once the coordinator lists every node.
    loop {
        let (_, nodes) = status_tcp(&addr, secret)?;
        if nodes == n {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("only {nodes} of {n} agents joined within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    r.join_s = t.elapsed().as_secs_f64();
    r.coord_threads = proc_status(pid, "Threads")?;
    eprintln!("  joined in {:.1} s; the coordinator has {} threads", r.join_s, r.coord_threads);

    if cli.relay_every > 0 {
        let agents: Vec<FakeAgent> = joined.lock().unwrap().clone();
        for group in agents.chunks(cli.relay_every) {
            let (reader, writer) = join_relay(&addr, &key, group)?;
            let (run, group, stop) = (run.clone(), group.to_vec(), stop.clone());
            std::thread::Builder::new().name(format!("relay-{}", group[0].node)).spawn(move || relay_loop(run, group, reader, writer, stop))?;
        }
        eprintln!("  {} relays of {} agents", n.div_ceil(cli.relay_every), cli.relay_every);
    }

    // Idle: heartbeats only.
    std::thread::sleep(Duration::from_secs(2));
    let (c0, h0, t0) = (cpu_secs(pid)?, cpu_secs(std::process::id())?, Instant::now());
    std::thread::sleep(Duration::from_secs(cli.idle_secs));
    let secs = t0.elapsed().as_secs_f64();
    r.idle_cpu_pct = (cpu_secs(pid)? - c0) / secs * 100.0;
    r.harness_idle_cpu_pct = (cpu_secs(std::process::id())? - h0) / secs * 100.0;
    eprintln!("  idle: coordinator {:.2} % of a core, harness {:.2} %", r.idle_cpu_pct, r.harness_idle_cpu_pct);

    for _ in 0..3 {
        r.status_tcp_ms.push(status_tcp(&addr, secret)?.0);
        let t = Instant::now();
        ckpt_coord::messages::call(dir, &Request::Status)?;
        r.status_unix_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // Checkpoints, one after the other; a status is asked in the middle of the second.
    let (mut cpu_total, mut wall_total) = (0.0, 0.0);
    let mut last_generation = 0;
    for i in 0..cli.checkpoints {
        let probe = (i == 1).then(|| {
            let (addr, secret) = (addr.clone(), secret.to_string());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                status_tcp(&addr, &secret).map(|s| s.0).unwrap_or(f64::NAN)
            })
        });
        stage_parts(&run, &nodes, last_generation + 1)?;
        run.shared.commit_at.store(u64::MAX, Relaxed);
        let (w0, c0, h0) = (run.shared.work_ns.load(Relaxed), cpu_secs(pid)?, cpu_secs(std::process::id())?);
        let asked = run.now_ns();
        let t = Instant::now();
        let answer = remote::request(&addr, secret, &Request::Checkpoint(CheckpointRequest::default()))?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        let cpu = (cpu_secs(pid)? - c0) * 1e3;
        let harness_cpu = (cpu_secs(std::process::id())? - h0) * 1e3;
        let reply = match answer {
            Response::Committed(reply) => reply,
            other => bail!("checkpoint answered {other:?}"),
        };
        last_generation = reply.generation;
        let committed = run.shared.commit_at.load(Relaxed).saturating_sub(asked) as f64 / 1e6;
        let work = (run.shared.work_ns.load(Relaxed) - w0) as f64 / 1e6;
        // The agents' own work: the renames (their CPU time, all agents together: on this
        // machine they take turns on its cores), and the capture time each agent is given,
        // which they spend at once.
        let own = work + cli.work_ms as f64;
        let c = Checkpoint {
            to_commit_ms: committed,
            wall_ms: wall,
            agent_work_ms: own,
            coordination_ms: committed - own,
            coord_cpu_ms: cpu,
            harness_cpu_ms: harness_cpu,
            durable_ms: reply.durable_ms,
        };
        eprintln!("  checkpoint {}: {c:?}", reply.generation);
        cpu_total += cpu;
        wall_total += wall;
        r.checkpoints.push(c);
        if let Some(p) = probe {
            r.status_during_checkpoint_ms = p.join().unwrap_or(f64::NAN);
        }
    }
    r.checkpoint_cpu_pct = cpu_total / wall_total * 100.0;
    r.rss_mib = proc_status(pid, "VmRSS")? as f64 / 1024.0;
    r.hwm_mib = proc_status(pid, "VmHWM")? as f64 / 1024.0;

    // The manifest: its size, and the time of the same write (temp file, fsync, rename, fsync
    // of the directory) into a scratch generation directory on the same file system.
    let gen_dir = dir.join(format!("gen-{last_generation:06}"));
    let manifest = Manifest::load(&gen_dir)?;
    r.manifest_bytes = fs::metadata(gen_dir.join(ckpt_core::image::MANIFEST_NAME))?.len();
    r.manifest_files = manifest.files.len();
    let scratch = dir.join("manifest-scratch");
    fs::create_dir_all(&scratch)?;
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        manifest.commit(&scratch)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    r.manifest_write_ms = times.iter().cloned().fold(f64::INFINITY, f64::min);

    // A lost agent: it stops sending anything (heartbeats and answers) but keeps its
    // connection; the coordinator shuts the connection down once it notices, and its recovery
    // tells every other agent `recover`.
    let lost = joined.lock().unwrap()[n / 2].clone();
    lost.silent.store(true, Relaxed);
    let silent_since = lost.last_sent.load(Relaxed);
    let t = Instant::now();
    let noticed = loop {
        if let Some(&at) = run.shared.closed_at.lock().unwrap().get(&lost.node) {
            break at;
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the silent agent was not noticed within 30 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    r.lost_noticed_s = noticed.saturating_sub(silent_since) as f64 / 1e9;
    let t = Instant::now();
    while run.shared.recover_at.lock().unwrap().len() < n - 1 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    {
        let told = run.shared.recover_at.lock().unwrap();
        if told.len() < n - 1 {
            eprintln!("  only {} of {} agents were told to recover", told.len(), n - 1);
        }
        let first = told.iter().min().copied().unwrap_or(u64::MAX);
        let last = told.iter().max().copied().unwrap_or(u64::MAX);
        r.recovery_decided_ms = first.saturating_sub(noticed) as f64 / 1e6;
        r.recovery_all_told_ms = last.saturating_sub(noticed) as f64 / 1e6;
    }
    eprintln!("  lost agent noticed after {:.2} s; recovery decided {:.0} ms later", r.lost_noticed_s, r.recovery_decided_ms);
    stop.store(true, Relaxed);
    let _ = LOST_AFTER;
    Ok(r)
}

fn markdown(results: &[Results], cli: &Cli) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let range = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("{lo:.0}-{hi:.0}")
    };
    let _ = writeln!(s, "| agents | coordination ms (request to commit, less agents' work) | request to commit ms | agents' work ms (their CPU in this process) | request to answer ms | coordinator CPU during a checkpoint | idle CPU (% of a core) | RSS MiB (peak) | threads | manifest | manifest write ms | lost agent noticed s | recovery decided ms (all told) | status ms (TCP / Unix / during a checkpoint) |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let coord: Vec<f64> = r.checkpoints.iter().map(|c| c.coordination_ms).collect();
        let wall: Vec<f64> = r.checkpoints.iter().map(|c| c.to_commit_ms).collect();
        let answered: Vec<f64> = r.checkpoints.iter().map(|c| c.wall_ms).collect();
        let work: Vec<f64> = r.checkpoints.iter().map(|c| c.agent_work_ms).collect();
        let hcpu: Vec<f64> = r.checkpoints.iter().map(|c| c.harness_cpu_ms).collect();
        let cpu: Vec<f64> = r.checkpoints.iter().map(|c| c.coord_cpu_ms).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} ({}) | {} | {:.0} ms ({:.0} % of a core) | {:.2} | {:.0} ({:.0}) | {} | {:.1} MiB, lists {} files | {:.1} | {:.2} | {:.0} ({:.0}) | {:.1} / {:.1} / {:.1} |",
            r.agents,
            range(&coord),
            range(&wall),
            range(&work),
            range(&hcpu),
            range(&answered),
            med(cpu),
            r.checkpoint_cpu_pct,
            r.idle_cpu_pct,
            r.rss_mib,
            r.hwm_mib,
            r.coord_threads,
            r.manifest_bytes as f64 / (1 << 20) as f64,
            r.manifest_files,
            r.manifest_write_ms,
            r.lost_noticed_s,
            r.recovery_decided_ms,
            r.recovery_all_told_ms,
            med(r.status_tcp_ms.clone()),
            med(r.status_unix_ms.clone()),
            r.status_during_checkpoint_ms,
        );
    }
    let _ = writeln!(s, "\n{} checkpoints per row, each agent's part {} files (its records and a chunk a rank) and its index, which lists the chunks; idle CPU over {} s; agents' capture {} ms.", cli.checkpoints, cli.files_per_node, cli.idle_secs, cli.work_ms);
    s
}
