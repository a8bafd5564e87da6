//! The subcommands: launch and restart (which become the job's agent), and the clients.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::coordinator::DEFAULT_FULL_EVERY;
use ckpt_coord::messages::{call, Request, Response};
use ckpt_coord::CheckpointRequest;
use ckpt_core::image::{verify_generation, CheckpointDir, Manifest, CHUNKS_DIR_NAME};
use ckpt_core::objects::memory::Backing;
use ckpt_core::objects::timens::{self, ClocksRecord};
use ckpt_core::pool::{Pool, PoolConfig, WriterMode};
use ckpt_core::ptrace::Tid;
use ckpt_core::snapshot::NodeImage;
use restart_tool::{GrownFiles, Spawner};

use crate::agent::{self, FilesPolicy, LocalAgent, NodeAgent};
use crate::coord::{JoinArgs, Link};
use crate::spawn::JobInit;
use crate::triggers::Target;
use crate::triggers::{self, TriggerArgs, Triggers};
use crate::{NetArgs, PoolArgs, Writer};
use ckpt_coord::server::ControlSocket;
use ckpt_coord::wire::TcpListen;
use ckpt_coord::Coordinator;
use ckpt_core::objects::file::StdioIds;
use ckpt_core::objects::files_state::FilesRecord;
use ckpt_core::objects::protect::Store;

fn pool_config(args: &PoolArgs) -> Result<PoolConfig> {
    if args.chunk == 0 || !args.chunk.is_multiple_of(4096) {
        bail!("--chunk must be a positive multiple of 4K (got {})", args.chunk);
    }
    if args.pool < args.chunk {
        bail!("--pool must hold at least one chunk");
    }
    let writer = match args.writer {
        Writer::Dbi => WriterMode::Dbi,
        Writer::Wag => WriterMode::Wag { threshold: args.threshold as usize },
        Writer::Direct => WriterMode::Direct,
    };
    Ok(PoolConfig { pool_bytes: args.pool as usize, chunk_bytes: args.chunk as usize, io_threads: args.io_threads.max(1), codec: args.compress, writer })
}

/// Starts handing out the pool's chunks; with memory copied while frozen, which would pay for
/// every fault of the pool then, faults it all in first and keeps it (`Pool::keep_warm`).
fn start_prefault(pool: &Pool, copy_memory: crate::CopyMemory) {
    if copy_memory == crate::CopyMemory::Frozen {
        pool.keep_warm();
    }
    pool.prefault_in_background();
}

/// The node's name in the image: this machine's host name.
pub fn node_name() -> String {
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let clean: String = host.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.').collect();
    if clean.is_empty() {
        "node0".into()
    } else {
        clean
    }
}

/// Runs as the job's agent with the coordinator embedded, until its main process ends; returns
/// the job's exit code.
fn run_embedded(agent: NodeAgent, (keep, full_every): (usize, u64), command: Vec<String>, socket: &ControlSocket, init: JobInit, t: Triggers) -> Result<i32> {
    let (main_pid, main_end) = (agent.main_pid, agent.main_end.clone());
    let mut coord = Coordinator::new(agent.dir.clone(), keep, command)?;
    coord.set_full_every(full_every);
    coord.registry().join(Box::new(LocalAgent::new(agent))).map_err(|e| anyhow!(e))?;
    let coord = Arc::new(Mutex::new(coord));
    let ended = Arc::new(AtomicBool::new(false));
    let target = Target::Local(coord.clone());
    triggers::start_signals(target.clone(), t.clone(), init.host_pid, main_pid)?;
    triggers::start_interval(target, t.interval, ended.clone())?;
    ckpt_coord::server::serve_control(coord.clone(), socket)?;
    let end = init.wait_end(&main_ended(&main_end))?;
    ended.store(true, Ordering::Relaxed);
    // A checkpoint in progress (say, with --kill) finishes and answers before we exit.
    let _done = coord.lock().unwrap_or_else(|p| p.into_inner());
    Ok(end.exit_code())
}

/// What the launcher does when the job's main process ends before the daemons it left: the
/// agent records it in every image from then on (a restart then waits for the daemons alone).
fn main_ended(main_end: &Arc<Mutex<Option<crate::spawn::JobEnd>>>) -> impl Fn(crate::spawn::JobEnd) + '_ {
    move |end| {
        tracing::info!(?end, "the job's main process ended; the job goes on with the daemons it left");
        *main_end.lock().unwrap_or_else(|p| p.into_inner()) = Some(end);
    }
}

/// Runs as an agent joined to a standalone coordinator, until the job's main process ends.
fn run_joined(agent: NodeAgent, link: Link, init: JobInit, t: Triggers) -> Result<Ended> {
    let (main_pid, main_end) = (agent.main_pid, agent.main_end.clone());
    link.joined()?;
    let target = Target::Remote { addr: link.addr.clone(), secret: link.secret.clone() };
    triggers::start_signals(target, t, init.host_pid, main_pid)?;
    let (writer, alive, recover) = (link.writer.clone(), link.alive.clone(), link.recover);
    let (verdict_tx, verdicts) = std::sync::mpsc::channel();
    let relays =
        agent::RelayAccess { coord: link.addr.clone(), secret: link.secret.clone(), node: link.node.clone(), bind: link.local_ip, quiet: link.quiet.clone() };
    agent::follow_coordinator(agent, link.stream, link.writer, link.alive, relays, verdict_tx)?;
    let end = init.wait_end(&main_ended(&main_end))?;
    let send = |frame| ckpt_coord::remote::send_frame(&writer, &frame);
    // With --recover, the job's end may come from another node's loss (mpirun aborts when a
    // daemon dies): the coordinator says whether to exit or to restart.
    let verdict = match verdicts.try_recv() {
        Ok(v) => v,
        Err(_) if recover && send(ckpt_coord::wire::Frame::Ended { status: end.exit_code() }).is_ok() => {
            // Lost coordinator: the sender is dropped, and the job's status stands.
            verdicts.recv().unwrap_or(agent::Verdict::Finish)
        }
        Err(_) => agent::Verdict::Finish,
    };
    let _ = send(ckpt_coord::wire::Frame::Bye);
    alive.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(std::net::Shutdown::Both);
    Ok(match verdict {
        agent::Verdict::Finish => Ended::Exit(end.exit_code()),
        agent::Verdict::Recover => Ended::Recover,
    })
}

/// How a `ckpt launch` or `ckpt restart` process's job ended.
pub enum Ended {
    /// Exit with this status.
    Exit(i32),
    /// Another node of the job was lost (`ckpt coordinator --recover`): restart this node's
    /// part, joined again.
    Recover,
}

/// Restarts this node's part, in this same process, every time the coordinator recovers the
/// job from a lost node; returns the exit status once the job has finished. `clocks_jump`:
/// as `ckpt restart --clocks-jump`, for those restarts too.
pub fn until_finished(
    mut ended: Ended,
    dir: &Path,
    clocks_jump: bool,
    pool_args: &PoolArgs,
    trigger_args: &TriggerArgs,
    net: &NetArgs,
    join: &JoinArgs,
) -> Result<i32> {
    loop {
        match ended {
            Ended::Exit(code) => {
                // The job has ended; the launcher may still be acting on a signal that ended it
                // (the requeue after a checkpoint on Slurm's warning): it exits after that.
                triggers::settle();
                return Ok(code);
            }
            Ended::Recover => {
                say!("ckpt: a node of the job was lost: restarting this node's part, as the coordinator recovers the job");
                let choices = RestartChoices { clocks_jump, ..RestartChoices::default() };
                ended = restart(dir, &choices, pool_args, trigger_args, net, join)?;
            }
        }
    }
}

/// `ckpt run`: the job of `dir` restarted from its newest committed generation, or `command`
/// launched when there is none yet; then, as launch and restart do, on until the job ends.
/// Only a directory without any committed generation launches: a restart that fails is an
/// error, never a silent start from the beginning, which would throw the job's work away.
pub fn run(
    dir: &Path,
    choices: &RestartChoices,
    pool_args: &PoolArgs,
    trigger_args: &TriggerArgs,
    net: &NetArgs,
    join: &JoinArgs,
    command: Vec<String>,
) -> Result<i32> {
    let newest = match CheckpointDir::open(dir) {
        Ok(cdir) => cdir.newest_committed()?,
        Err(_) if !dir.exists() => None,
        Err(e) => return Err(e.into()),
    };
    let ended = match newest {
        Some(gen) => {
            let launched: Option<Vec<String>> = read_job(dir, join.node.as_deref()).and_then(|j| serde_json::from_value(j["command"].clone()).ok());
            say!("ckpt run: {} holds generation {gen}: restarting the job from its newest checkpoint", dir.display());
            if let Some(launched) = launched.filter(|l| *l != command) {
                say!("ckpt run: the job was launched as `{}`; it comes back as it was (`{}` is not run)", launched.join(" "), command.join(" "));
            }
            restart(dir, choices, pool_args, trigger_args, net, join)?
        }
        None => {
            say!("ckpt run: no checkpoint in {} yet: launching `{}`", dir.display(), command.join(" "));
            launch(dir, pool_args, trigger_args, net, join, command)?
        }
    };
    until_finished(ended, dir, choices.clocks_jump, pool_args, trigger_args, net, join)
}

/// The job's own file of options: `job.json`, or `job-<node>.json` for a node joined to a
/// standalone coordinator (the directory is shared by every node).
fn job_file(dir: &Path, joined_node: Option<&str>) -> std::path::PathBuf {
    match joined_node {
        None => dir.join("job.json"),
        Some(node) => dir.join(format!("job-{node}.json")),
    }
}

/// The job's file of options ([`job_file`]) as JSON, if there is one that parses.
fn read_job(dir: &Path, joined_node: Option<&str>) -> Option<serde_json::Value> {
    std::fs::read(job_file(dir, joined_node)).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

pub fn launch(dir: &Path, pool_args: &PoolArgs, trigger_args: &TriggerArgs, net: &NetArgs, join: &JoinArgs, command: Vec<String>) -> Result<Ended> {
    ckpt_core::kernel::check()?;
    let t = trigger_args.parse()?;
    // Before any thread starts (the heartbeat and the pool's IO threads among them), so that
    // every thread inherits the mask and the signals reach only the thread that waits for them.
    triggers::block_handled(&t)?;
    let link = match &join.coord {
        None => None,
        Some(addr) => {
            if t.interval.is_some() {
                bail!("--interval goes to `ckpt coordinator` when the job is joined to one (it checkpoints every node)");
            }
            let node = join.node.clone().unwrap_or_else(node_name);
            // Before any thread starts: the job inherits these (`ckpt agent-rsh` reads them).
            crate::coord::export_job_env(addr, &node, join.secret_file.as_deref());
            Some(Link::connect(dir, addr, &node, join.secret_file.as_deref(), false)?)
        }
    };
    let cdir = CheckpointDir::create(dir)?;
    let local = local_level(link.as_ref())?;
    let socket = match link {
        Some(_) => None,
        None => {
            let socket = ControlSocket::bind(dir)?;
            cdir.remove_uncommitted()?;
            ckpt_coord::wire::load_or_create_secret(dir).with_context(|| format!("the job's secret in {}", dir.display()))?;
            Some(socket)
        }
    };
    let node = link.as_ref().map(|l| l.node.clone());
    let protect = protect_roots(&pool_args.protect, &[])?;
    // Removed, where the job left it empty, when this function returns: the job has ended then.
    let shm_dir = crate::mpi::JobDir::for_launch();
    let job = serde_json::json!({
        "command": command,
        "cwd": std::env::current_dir()?.display().to_string(),
        "pool": { "pool": pool_args.pool, "chunk": pool_args.chunk, "io_threads": pool_args.io_threads, "compress": pool_args.compress.to_string() },
        "tcp_established": net.tcp_established,
        "save_files": pool_args.save_files,
        "copy_memory": pool_args.copy_memory,
        "full_every": pool_args.full_every,
        "until": pool_args.until,
        "protect": protect,
        "coordinator": join.coord,
        "shm_dir": shm_dir.as_ref().map(|d| d.path()),
    });
    write_private(&job_file(dir, node.as_deref()), serde_json::to_string_pretty(&job)?.as_bytes())?;
    let pool = Pool::new_deferred(pool_config(pool_args)?)?;
    start_prefault(&pool, pool_args.copy_memory.unwrap_or_default());
    let node_name_ = node.clone().unwrap_or_else(node_name);
    let mut files = FilesPolicy::new(dir, &node_name_, protect, pool_args.save_files);
    // Before the job starts, so that the first checkpoint's freeze copies only what changed.
    files.copy_new_roots().context("copying the protected directories (--protect)")?;

    let abs_dir = std::fs::canonicalize(dir)?;
    let until = pool_args.until.unwrap_or_default();
    let mut init_args = vec![format!("--job-dir={}", abs_dir.display()), until.init_arg()];
    init_args.extend(shm_dir.as_ref().map(|d| format!("--shm-dir={}", d.path())));
    init_args.push("launch".to_string());
    init_args.extend(command.iter().cloned());
    let mut init = JobInit::spawn(&init_args)?;
    // Before the program runs, so that its first listener is seen at once.
    ckpt_core::objects::tcp::watch_listeners(init.host_pid);
    let main_pid = init.started()?;
    let mut agent = NodeAgent::new(cdir, node_name_, init.host_pid, main_pid, pool);
    agent.mounts_baseline = std::mem::take(&mut init.mounts_baseline);
    agent.local = local;
    agent.tcp_established = net.tcp_established;
    agent.copy_memory = pool_args.copy_memory.unwrap_or_default();
    agent.files = files;
    match (link, socket) {
        (Some(mut link), _) => {
            attach_data_port(&mut agent, &mut link);
            run_joined(agent, link, init, t)
        }
        (None, Some(socket)) => {
            run_embedded(agent, (pool_args.keep, pool_args.full_every.unwrap_or(DEFAULT_FULL_EVERY)), command, &socket, init, t).map(Ended::Exit)
        }
        (None, None) => unreachable!("an embedded job has its control socket"),
    }
}

/// Gives the agent the link's data port, taking other nodes' parts into the agent's local
/// level.
fn attach_data_port(agent: &mut NodeAgent, link: &mut Link) {
    if let Some(data) = link.data.take() {
        if let Some(local) = &agent.local {
            data.set_local(local);
        }
        agent.data = Some((data, link.secret.clone()));
    }
}

/// The node-local level the coordinator named in its welcome, created (mode 0700) if needed.
fn local_level(link: Option<&Link>) -> Result<Option<CheckpointDir>> {
    let Some(path) = link.and_then(|l| l.local_dir.as_ref()) else { return Ok(None) };
    Ok(Some(CheckpointDir::create(path).with_context(|| format!("the node-local checkpoint directory {} (--local-dir)", path.display()))?))
}

/// The protected roots: `--protect` directories given now and those of the job (job.json), as
/// absolute paths without symlinks, each once.
fn protect_roots(given: &[std::path::PathBuf], of_job: &[String]) -> Result<Vec<String>> {
    let mut roots: Vec<String> = of_job.to_vec();
    for p in given {
        let abs = std::fs::canonicalize(p).with_context(|| format!("--protect {}: no such directory", p.display()))?;
        if !abs.is_dir() {
            bail!("--protect {}: not a directory", p.display());
        }
        let abs = abs.to_string_lossy().into_owned();
        if !roots.contains(&abs) {
            roots.push(abs);
        }
    }
    Ok(roots)
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = ckpt_core::image::open_private_file(path, true).with_context(|| format!("write {}", path.display()))?;
    f.write_all(data)?;
    Ok(())
}

/// Sends a client request to the job of `dir`: to its launcher or coordinator on `D/agent.sock`,
/// or with `--coord`, to a standalone coordinator over TCP.
fn ask(dir: &Path, join: &JoinArgs, req: &Request) -> Result<Response> {
    match &join.coord {
        None => Ok(call(dir, req)?),
        Some(addr) => {
            let secret = crate::coord::read_job_secret(dir, join.secret_file.as_deref())?;
            Ok(ckpt_coord::remote::request(addr, &secret, req)?)
        }
    }
}

pub fn checkpoint(dir: &Path, join: &JoinArgs, kill: bool, json: bool, no_wait_durable: bool) -> Result<i32> {
    match ask(dir, join, &Request::Checkpoint(CheckpointRequest { kill, detach: false, no_wait_durable }))? {
        Response::Resumed { generation, frozen_ms } => {
            if json {
                println!("{}", serde_json::json!({ "generation": generation, "frozen_ms": frozen_ms, "durable": false }));
            } else {
                println!("generation {generation}: the job runs again after {frozen_ms:.1} ms frozen; its data is being written (`ckpt status` shows when it is committed)");
            }
            Ok(0)
        }
        Response::Committed(r) => {
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "generation {} committed: frozen {:.1} ms, durable {:.1} ms, {} processes, {} threads, {} stored ({} raw)",
                    r.generation,
                    r.frozen_ms,
                    r.durable_ms,
                    r.processes,
                    r.threads,
                    human(r.bytes_stored),
                    human(r.bytes_raw)
                );
                if r.gpu_ms > 0.0 {
                    println!("  CUDA calls held {:.1} ms by the NVIDIA driver's checkpoint ({} of GPU memory)", r.gpu_ms, human(r.gpu_bytes));
                }
            }
            if let Some(why) = &r.gpu_failed {
                say!("ckpt checkpoint: {why}; the job was ended after generation {} was committed: `ckpt restart` brings it back from there", r.generation);
                return Ok(1);
            }
            Ok(0)
        }
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

struct InitSpawner<'a>(&'a mut JobInit);

impl Spawner for InitSpawner<'_> {
    fn spawn(&mut self, ns_pid: Tid) -> ckpt_core::Result<Tid> {
        self.0.spawn_empty(ns_pid).map_err(|e| ckpt_core::Error::Other(format!("{e:#}")))
    }

    fn init_pid(&self) -> Tid {
        self.0.host_pid
    }
}

pub fn pick_generation(cdir: &CheckpointDir, generation: Option<u64>) -> Result<u64> {
    let committed = cdir.committed()?;
    match generation {
        Some(n) if committed.contains(&n) => Ok(n),
        Some(n) => bail!("generation {n} is not committed in {} (committed: {committed:?})", cdir.root().display()),
        None => committed.last().copied().ok_or_else(|| anyhow!("no committed generation in {} (run `ckpt checkpoint` first)", cdir.root().display())),
    }
}

/// What `ckpt restart` is asked besides the options it shares with `launch`.
#[derive(Debug, Clone, Default)]
pub struct RestartChoices {
    /// The generation to restore (default: the newest committed).
    pub generation: Option<u64>,
    /// `--keep-files`: take the job's files as they are.
    pub keep_files: bool,
    /// `--as-root`: keep root's rights, whoever owns the image.
    pub as_root: bool,
    /// `--clocks-jump`: no time namespace; the job's monotonic and boot-time clocks show the
    /// time it was down.
    pub clocks_jump: bool,
    /// `--lazy`: the job runs before its memory is back (see [`ckpt_core::lazy`]).
    pub lazy: bool,
    /// `--ignore-cpu`: CPU extensions the restart may do without.
    pub ignore_cpu: Vec<String>,
}

pub fn restart(dir: &Path, choices: &RestartChoices, pool_args: &PoolArgs, trigger_args: &TriggerArgs, net: &NetArgs, join: &JoinArgs) -> Result<Ended> {
    let RestartChoices { generation, keep_files, as_root, clocks_jump, lazy, ref ignore_cpu } = *choices;
    let lazy = lazy
        && match ckpt_core::lazy::available() {
            None => true,
            Some(why) => {
                say!("ckpt restart: not lazy: {why}; the memory is filled before the job runs");
                false
            }
        };
    if as_root {
        if !nix::unistd::geteuid().is_root() {
            bail!("--as-root is for root: an ordinary user's restart has the user's rights and no more");
        }
        tracing::warn!("--as-root: the job is restored with root's rights, whoever owns the image");
    }
    ckpt_core::kernel::check()?;
    let t = trigger_args.parse()?;
    // Before any thread starts (the heartbeat and the pool's IO threads among them), so that
    // every thread inherits the mask and the signals reach only the thread that waits for them.
    triggers::block_handled(&t)?;
    let cdir = CheckpointDir::open(dir)?;
    // Joined to a coordinator, the coordinator says which generation every node restores.
    let (link, gen, node) = match &join.coord {
        None => {
            let gen = pick_generation(&cdir, generation)?;
            let manifest = Manifest::load(&cdir.gen_dir(gen))?;
            let node = match manifest.nodes.as_slice() {
                [node] => node.clone(),
                [] => bail!("{}: the manifest lists no node", cdir.gen_dir(gen).display()),
                nodes => bail!(
                    "generation {gen} spans nodes {}: restart each node's part with `ckpt restart --dir {} --coord ADDR --node NAME`, joined to `ckpt coordinator --dir {}`",
                    nodes.join(", "),
                    dir.display(),
                    dir.display()
                ),
            };
            (None, gen, node)
        }
        Some(addr) => {
            if t.interval.is_some() {
                bail!("--interval goes to `ckpt coordinator` when the job is joined to one (it checkpoints every node)");
            }
            if generation.is_some() {
                bail!("--generation goes to `ckpt coordinator` when the job is joined to one (it picks the generation every node restores)");
            }
            let node = join.node.clone().unwrap_or_else(node_name);
            crate::coord::export_job_env(addr, &node, join.secret_file.as_deref());
            let link = Link::connect(dir, addr, &node, join.secret_file.as_deref(), true)?;
            let gen = link.restore.ok_or_else(|| anyhow!("the coordinator at {addr} named no generation to restore"))?;
            (Some(link), gen, node)
        }
    };
    let gen_dir = cdir.gen_dir(gen);
    let manifest = Manifest::load(&gen_dir)?;
    if !manifest.nodes.contains(&node) {
        bail!("generation {gen} has no node {node:?} (its nodes: {}); give --node one of them", manifest.nodes.join(", "));
    }
    let node_dir = manifest.part_dir(&gen_dir, &node);
    // The part, and for an incremental generation the parts it reads pages from, on this host.
    fetch_part_if_elsewhere(&gen_dir, &manifest, &node, link.as_ref())?;
    for &g in &manifest.needs {
        let needed = Manifest::load(&cdir.gen_dir(g)).with_context(|| format!("generation {gen} needs generation {g}"))?;
        fetch_part_if_elsewhere(&cdir.gen_dir(g), &needed, &node, link.as_ref())?;
    }
    ckpt_core::image::verify::check_node_files_present(&gen_dir, &manifest, &node)?;
    let started = std::time::Instant::now();
    let image = NodeImage::read(&node_dir)?;
    // The records are validated as they are read; their stream lengths against the chunk files
    // here, before any process exists.
    image.check_streams(&node_dir.join(CHUNKS_DIR_NAME))?;
    let earlier_chunks = earlier_chunk_dirs(&cdir, gen, &manifest.needs, &node)?;
    image.check_earlier_streams(&manifest.needs, &earlier_chunks)?;
    let socket = match link {
        Some(_) => None,
        None => Some(ControlSocket::bind(dir)?),
    };
    let joined_node = link.as_ref().map(|_| node.as_str());
    let job = read_job(dir, joined_node);
    // Before any file is put back: the job's shared memory files go back into it. Removed,
    // where the job left it empty, when this function returns: the job has ended then.
    let _shm_dir = match job.as_ref().and_then(|j| j["shm_dir"].as_str()) {
        Some(path) => crate::mpi::JobDir::for_restart(path, as_root).context("restart refused")?,
        None => None,
    };
    let files = FilesRecord::read(&node_dir)?;
    let place = ckpt_core::objects::identity::Place::of(&files.boot_id, &files.identities);
    let elsewhere = place.is_elsewhere();
    let store = Store::of(dir, &node);
    let own_stdio: Vec<(u64, u64)> = StdioIds::of_self().0.iter().flatten().copied().collect();
    restart_tool::preflight(
        &image,
        &files,
        &store,
        if keep_files { GrownFiles::Keep } else { GrownFiles::Truncate },
        &own_stdio,
        as_root,
        (&place, ignore_cpu),
    )
    .context("restart refused")?;
    // CUDA processes get their GPU state back from the driver once they run: it must be here.
    let cuda: Vec<(Tid, ckpt_core::gpu::CudaRecord)> = image.processes.iter().filter_map(|p| Some((p.pid, p.cuda?))).collect();
    let gpu_driver = match cuda.is_empty() {
        true => None,
        false => {
            Some(ckpt_core::gpu::driver_for(cuda.iter().map(|(p, _)| *p), "their GPU state cannot be restored on this machine").context("restart refused")?)
        }
    };
    // The pool's memory is faulted in only once the job runs again: a restart does not compete
    // with it.
    tracing::info!(ms = started.elapsed().as_millis() as u64, "restart: records read and checked, files put back");
    let pool = Pool::new_deferred(pool_config(pool_args)?)?;
    let local = local_level(link.as_ref())?;
    // --tcp-established given to the launch holds for every restart of the job.
    let tcp_established = net.tcp_established || job.as_ref().is_some_and(|j| j["tcp_established"] == true);
    let progress = Progress::start(restart_tool::memory_bytes(&image), "restoring memory");
    // The connections between this node's processes and the other nodes' are the job's own.
    let mut others = Vec::new();
    for other in manifest.nodes.iter().filter(|n| **n != node) {
        others.push(NodeImage::read(&gen_dir.join(other))?);
    }
    let other_nodes = restart_tool::other_nodes_connections(others.iter());
    let other_nodes_tcp = restart_tool::other_nodes_tcp(others.iter());
    // A node that restarts on another host (its part's addresses are not here) has its
    // connections to the other nodes made again by connecting: every node must know.
    let (nodes_moved, readdressed) = match &link {
        Some(l) if manifest.nodes.len() > 1 => {
            let moved_from = restart_tool::moved_from(&image, &other_nodes);
            if let Some(a) = moved_from.first() {
                say!("ckpt restart: node {node} restarts on another host (its address {a} is not on this one)");
            }
            let (moved, readdressed) = l.placement(&moved_from)?;
            if !moved.is_empty() {
                tracing::info!(?moved, ?readdressed, "nodes restart elsewhere: their addresses change in the connections between nodes");
                let how = if ckpt_core::objects::tcp_reconnect::repair_available() {
                    "rebuilt by TCP repair mode with their new addresses"
                } else {
                    "made again by connecting"
                };
                say!("ckpt restart: node(s) {} restart on other hosts: the connections between nodes are {how}", moved.join(", "));
            }
            (!moved.is_empty(), readdressed)
        }
        _ => (false, Vec::new()),
    };
    let mut options = restart_tool::RestoreOptions {
        tcp_established,
        progress: progress.done.clone(),
        other_nodes,
        other_nodes_tcp,
        nodes_moved,
        readdressed,
        as_root,
        earlier_chunks,
        lazy: None,
        elsewhere,
    };
    // Across nodes, no node's job runs before every node's is rebuilt.
    let mut barrier = || match &link {
        Some(l) if manifest.nodes.len() > 1 => l.rebuilt().map_err(|e| ckpt_core::Error::Other(format!("{e:#}"))),
        _ => Ok(()),
    };

    // Across nodes, where each node's TCP server ends listen again (without repair mode).
    let mut exchange = |ends: Vec<restart_tool::Listening>| match &link {
        Some(l) if manifest.nodes.len() > 1 => {
            let ends = ends.into_iter().map(|(server_old, client_old, addr)| TcpListen { server_old, client_old, addr }).collect();
            l.tcp_listening(ends)
                .map(|all| all.into_iter().map(|e| (e.server_old, e.client_old, e.addr)).collect())
                .map_err(|e| ckpt_core::Error::Other(format!("{e:#}")))
        }
        _ => Ok(Vec::new()),
    };

    // --until given to the launch holds for every restart of the job.
    let until = pool_args.until.or_else(|| job.as_ref().and_then(|j| serde_json::from_value(j["until"].clone()).ok())).unwrap_or_default();
    let mut init = JobInit::spawn(&[until.init_arg(), "restart".to_string()])?;
    if let Err(e) = continue_clocks(&mut init, image.clocks.as_ref(), clocks_jump) {
        init.kill();
        let _ = init.wait_end(&|_| {});
        return Err(e).context(format!("restart of generation {gen} from {} failed; nothing was left running", dir.display()));
    }
    tracing::info!(ms = started.elapsed().as_millis() as u64, "restart: the job's init started");
    if lazy {
        let init_pid = init.host_pid;
        let on_fatal = Box::new(move |what: &str| {
            say!("ckpt restart: {what}; the job was already running and was ended");
            // The init's end takes the job's namespace down.
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(init_pid), nix::sys::signal::Signal::SIGKILL);
        });
        match ckpt_core::lazy::PageServer::start(on_fatal) {
            Ok(server) => options.lazy = Some(std::sync::Arc::new(server)),
            Err(e) => say!("ckpt restart: not lazy: cannot start the page server ({e}); the memory is filled before the job runs"),
        }
    }
    let rebuilt = restart_tool::restore(&image, &node_dir.join(CHUNKS_DIR_NAME), &mut InitSpawner(&mut init), &options, &mut barrier, &mut exchange).and_then(
        |restored| {
            match image.main_end {
                // The main process had ended: the job is its daemons.
                Some(end) => init.set_main_ended(end),
                None => init.set_main(image.main_pid),
            }
            .map_err(|e| ckpt_core::Error::Other(e.to_string()))?;
            let host_pids = restored.host_pids.clone();
            restored.release()?;
            if let Some(server) = &options.lazy {
                server.release();
            }
            if let Some(driver) = &gpu_driver {
                // The driver's restore reads the host copy of the GPU's memory: all of it in
                // first, rather than page by page through the page server.
                if options.lazy.is_some() {
                    ckpt_core::lazy::wait_until_filled();
                }
                let on_host: Vec<_> = cuda.iter().filter_map(|(pid, rec)| Some((host_pids.iter().find(|(p, _)| p == pid)?.1, *rec))).collect();
                let t = std::time::Instant::now();
                ckpt_core::gpu::resume_restarted(&**driver, &on_host)?;
                tracing::info!(processes = on_host.len(), ms = t.elapsed().as_secs_f64() * 1e3, "CUDA processes given their GPU state back");
            }
            Ok(())
        },
    );
    progress.finish();
    tracing::info!(ms = started.elapsed().as_millis() as u64, ok = rebuilt.is_ok(), "restart: every process rebuilt and released");
    if let Err(e) = rebuilt {
        init.kill();
        let _ = init.wait_end(&|_| {});
        return Err(anyhow!(e)).context(format!("restart of generation {gen} from {} failed; nothing was left running", dir.display()));
    }
    let command = job.as_ref().and_then(|v| serde_json::from_value(v["command"].clone()).ok()).unwrap_or_default();
    let of_job = job.as_ref().and_then(|j| serde_json::from_value(j["copy_memory"].clone()).ok());
    let copy_memory = pool_args.copy_memory.or(of_job).unwrap_or_default();
    start_prefault(&pool, copy_memory);
    let job_path = job_file(dir, joined_node);
    // The listeners the restarted job makes from now on.
    ckpt_core::objects::tcp::watch_listeners(init.host_pid);
    let mut agent = NodeAgent::new(cdir, node, init.host_pid, image.main_pid, pool);
    agent.mounts_baseline = std::mem::take(&mut init.mounts_baseline);
    *agent.main_end.lock().unwrap_or_else(|p| p.into_inner()) = image.main_end;
    agent.local = local;
    agent.tcp_established = tcp_established;
    agent.copy_memory = copy_memory;
    let save_files = pool_args.save_files || job.as_ref().is_some_and(|j| j["save_files"] == true);
    let of_job: Vec<String> = job.as_ref().and_then(|j| serde_json::from_value(j["protect"].clone()).ok()).unwrap_or_default();
    let roots = protect_roots(&pool_args.protect, &of_job)?;
    if roots.len() > of_job.len() {
        // --protect given to a restart holds for the job's later restarts too, as at launch.
        if let Some(mut j) = job.clone() {
            j["protect"] = serde_json::json!(roots);
            write_private(&job_path, serde_json::to_string_pretty(&j)?.as_bytes())?;
        }
    }
    agent.files = FilesPolicy::new(dir, &agent.node, roots, save_files);
    // The state put back is the one the next checkpoint compares with.
    agent.files.previous = files.protected;
    if let Err(e) = agent.files.copy_new_roots() {
        // The job runs already: the next checkpoint's freeze copies them whole instead.
        tracing::warn!("copying the protected directories given to the restart (--protect): {e:#}");
    }
    match (link, socket) {
        (Some(mut link), _) => {
            attach_data_port(&mut agent, &mut link);
            run_joined(agent, link, init, t)
        }
        (None, Some(socket)) => {
            let of_job = job.as_ref().and_then(|j| j["full_every"].as_u64());
            let full_every = pool_args.full_every.or(of_job).unwrap_or(DEFAULT_FULL_EVERY);
            run_embedded(agent, (pool_args.keep, full_every), command, &socket, init, t).map(Ended::Exit)
        }
        (None, None) => unreachable!("an embedded job has its control socket"),
    }
}

/// Makes `node`'s part of the generation of `manifest` (in `gen_dir`) available on this host: a
/// node-local part that is not here (the node's disk was lost, or it restarts elsewhere) is
/// fetched from the node that keeps a copy, or rebuilt from its XOR group, through the
/// coordinator of `link`.
fn fetch_part_if_elsewhere(gen_dir: &std::path::Path, manifest: &Manifest, node: &str, link: Option<&Link>) -> Result<()> {
    let gen = manifest.generation;
    let node_dir = manifest.part_dir(gen_dir, node);
    let (Some(template), false) = (&manifest.local_dir, node_dir.is_dir()) else { return Ok(()) };
    let (Some(l), true) = (link, manifest.copies.contains_key(node) || manifest.xor_group_of(node).is_some()) else {
        bail!(
            "node {node}'s part of generation {gen} is kept on its own host's storage, in {}, which is not on this host, and no other node keeps a copy or parity of it (--redundancy): restart node {node} where it ran",
            node_dir.display()
        );
    };
    let local = CheckpointDir::create(ckpt_core::image::manifest::expand_local_dir(template, node))?;
    let part = local.local_node_part(gen, node)?;
    say!("ckpt: node {node}'s part of generation {gen} is not on this host: fetching it from the nodes that keep its redundancy");
    let t = std::time::Instant::now();
    let source = l.fetch_part(manifest, gen_dir, part.node_dir())?;
    // A part rebuilt from XOR parity is its data only: the records are in the shared directory
    // (those the manifest lists: a generation before format 29 has no index).
    let listed = |record: &str| manifest.files.iter().any(|f| f.path == format!("{node}/{record}"));
    for record in ckpt_core::image::manifest::SHARED_RECORDS.into_iter().filter(|r| listed(r)) {
        let (from, to) = (gen_dir.join(node).join(record), part.node_dir().join(record));
        if !to.exists() {
            std::fs::copy(&from, &to).with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
        }
    }
    part.keep();
    say!("ckpt: fetched node {node}'s part of generation {gen} from {source} in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

/// The chunk directory of `node` in each earlier generation that generation `gen` refers to
/// (`needs`, an incremental generation's): each must be committed and hold the node's part.
fn earlier_chunk_dirs(cdir: &CheckpointDir, gen: u64, needs: &[u64], node: &str) -> Result<std::collections::BTreeMap<u64, std::path::PathBuf>> {
    let mut dirs = std::collections::BTreeMap::new();
    for &g in needs {
        let gen_dir = cdir.gen_dir(g);
        let m = Manifest::load(&gen_dir)
            .with_context(|| format!("generation {gen} stores only what changed since earlier generations and needs generation {g}, which cannot be read"))?;
        if !m.nodes.iter().any(|n| n == node) {
            bail!("generation {gen} needs node {node}'s part of generation {g}, which has no such node (image damaged?)");
        }
        let part = m.part_dir(&gen_dir, node);
        ckpt_core::image::verify::check_node_files_present(&gen_dir, &m, node).with_context(|| format!("generation {gen} needs generation {g}"))?;
        dirs.insert(g, part.join(CHUNKS_DIR_NAME));
    }
    Ok(dirs)
}

/// Before the job's first process exists: puts the job in a time namespace whose monotonic and
/// boot-time clocks continue from `at_checkpoint`, the job's clocks at the freeze (see
/// [`ckpt_core::objects::timens`]). With `--clocks-jump`, from an image that did not record
/// them, or on a kernel without time namespaces, the job keeps the machine's clocks, which
/// jump by the time it was down: the last two are said in one line.
fn continue_clocks(init: &mut JobInit, at_checkpoint: Option<&ClocksRecord>, jump: bool) -> Result<()> {
    const JUMP: &str = "the job's monotonic and boot-time clocks jump by the time it was down";
    if jump {
        tracing::info!("--clocks-jump: {JUMP}");
        return Ok(());
    }
    let Some(at_checkpoint) = at_checkpoint else {
        say!("ckpt restart: this image (format 7) did not record the job's clocks: {JUMP}");
        return Ok(());
    };
    if !timens::available() {
        say!("ckpt restart: this kernel has no time namespaces (no /proc/self/ns/time: Linux 5.6 or newer with CONFIG_TIME_NS has them): {JUMP}");
        return Ok(());
    }
    // As late as can be: the job's clocks run from here, while the restart rebuilds it.
    let offsets = timens::offsets_to_continue(at_checkpoint)?;
    tracing::debug!(?offsets, "the job's clocks continue from the checkpoint");
    init.set_clock_offsets(&offsets).context("give the job its clocks at the checkpoint")
}

pub fn inspect(dir: &Path, generation: Option<u64>, json: bool) -> Result<i32> {
    let cdir = CheckpointDir::open(dir)?;
    let gen = pick_generation(&cdir, generation)?;
    let gen_dir = cdir.gen_dir(gen);
    let manifest = Manifest::load(&gen_dir)?;
    let file_count = ckpt_core::image::PartFiles::read(&manifest, &gen_dir)?.count();
    let mut nodes = Vec::new();
    let mut files = Vec::new();
    for node in &manifest.nodes {
        nodes.push((node.clone(), NodeImage::read(&gen_dir.join(node))?));
        files.push(FilesRecord::read(&gen_dir.join(node))?);
    }
    // What a restart checks and puts back (docs/USER-GUIDE.md, "Files at restart").
    let files_json = |f: &FilesRecord| {
        serde_json::json!({
            "watched": f.watched.iter().map(|w| serde_json::json!({"path": w.path, "size": w.stat.size, "writable": w.writable, "append_only": w.append_only})).collect::<Vec<_>>(),
            "listed_dirs": f.listings.iter().map(|l| serde_json::json!({"dir": l.dir, "entries": l.entries.len()})).collect::<Vec<_>>(),
            "protected": f.protected.iter().map(|r| serde_json::json!({"root": r.root, "entries": r.entries.len(), "bytes": r.entries.iter().map(|e| e.stat.size).sum::<u64>()})).collect::<Vec<_>>(),
        })
    };
    if json {
        let v = serde_json::json!({
            "generation": gen,
            "needs": manifest.needs,
            "stats": manifest.stats,
            "files": file_count,
            "nodes": nodes.iter().map(|(n, img)| serde_json::json!({
                "node": n,
                "main_pid": img.main_pid,
                "main_end": img.main_end.map(|e| format!("{e:?}")),
                "clocks": img.clocks.map(|c| serde_json::json!({"monotonic_ns": c.monotonic_ns, "boottime_ns": c.boottime_ns})),
                "processes": img.processes.iter().map(|p| serde_json::json!({
                    "pid": p.pid,
                    "ppid": p.ppid,
                    "exe": p.attrs.exe.path,
                    "cwd": p.attrs.cwd,
                    "threads": p.threads.iter().map(|t| t.tid).collect::<Vec<_>>(),
                    "mappings": p.vmas.len(),
                    "stored_bytes": p.stream_len,
                    "earlier_bytes": p.vmas.iter().map(|v| v.earlier_pages()).sum::<u64>() * ckpt_core::PAGE_SIZE,
                    "memory_attributes": ckpt_core::objects::memattrs::describe(&p.vmas, &p.mem_attrs),
                    "cuda": p.cuda.map(|c| serde_json::json!({"before": format!("{:?}", c.before), "driver_version": c.driver_version})),
                    "pgid": p.pgid,
                    "sid": p.sid,
                    "fds": p.fds.iter().map(|f| serde_json::json!({"fd": f.fd, "kind": format!("{:?}", f.kind), "pos": f.pos, "flags": format!("{:o}", f.flags)})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "zombies": img.zombies.iter().map(|z| serde_json::json!({"pid": z.pid, "ppid": z.ppid, "wait_status": z.wait_status})).collect::<Vec<_>>(),
                "mounts": img.mounts.describe(),
                "user_namespaces": img.users.describe(),
                "uts_namespaces": img.uts.describe_names(),
                "network_namespaces": ckpt_core::objects::net_namespaces::describe(&img.net),
                "ipc_namespaces": ckpt_core::objects::sysvipc::describe_namespaces(&img.ipc),
            })).zip(files.iter()).map(|(mut v, f)| { v["files"] = files_json(f); v }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    println!("generation {gen} in {}", dir.display());
    if let Some(s) = manifest.stats.as_object() {
        let num = |k: &str| s.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        println!(
            "  frozen {:.1} ms, durable {:.1} ms, {} stored ({} raw), {} files",
            num("frozen_ms"),
            num("durable_ms"),
            human(num("bytes_stored") as u64),
            human(num("bytes_raw") as u64),
            file_count
        );
    }
    if !manifest.needs.is_empty() {
        let list = manifest.needs.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", ");
        println!(
            "  incremental: stores what changed since generation {}; reads the rest from generation(s) {list}, kept while this one is",
            manifest.needs.last().expect("not empty")
        );
    }
    for ((node, img), f) in nodes.iter().zip(&files) {
        match img.main_end {
            None => println!("  node {node}: {} process(es), main pid {}", img.processes.len(), img.main_pid),
            Some(end) => println!(
                "  node {node}: {} process(es); the main process (pid {}) had ended ({end:?}): the job is the daemons it left",
                img.processes.len(),
                img.main_pid
            ),
        }
        match img.clocks {
            Some(c) => println!(
                "    the job's clocks at the freeze, which a restart continues: monotonic {:.3} s, boot time {:.3} s",
                c.monotonic_ns as f64 / 1e9,
                c.boottime_ns as f64 / 1e9
            ),
            None => println!("    the job's clocks: not recorded (an image of format 7): they jump at restart"),
        }
        for line in img
            .users
            .describe()
            .into_iter()
            .chain(img.uts.describe_names())
            .chain(ckpt_core::objects::sysvipc::describe_namespaces(&img.ipc))
            .chain(ckpt_core::objects::net_namespaces::describe(&img.net))
        {
            println!("    made again at restart: {line}");
        }
        for line in img.mounts.describe() {
            println!("    mounts replayed at restart, in {line}");
        }
        println!(
            "    files checked at restart: {} open or mapped, {} director{} listed ({})",
            f.watched.len(),
            f.listings.len(),
            if f.listings.len() == 1 { "y" } else { "ies" },
            f.listings.iter().map(|l| l.dir.as_str()).collect::<Vec<_>>().join(", ")
        );
        for r in &f.protected {
            let bytes = r.entries.iter().map(|e| e.stat.size).sum::<u64>();
            println!("    protected: {} ({} entries, {}), put back at restart", r.root, r.entries.len(), human(bytes));
        }
        for p in &img.processes {
            println!("    pid {} (parent {}): {}  cwd {}", p.pid, p.ppid, p.attrs.exe.path, p.attrs.cwd);
            println!("      threads: {:?}", p.threads.iter().map(|t| t.tid).collect::<Vec<_>>());
            let files = p.vmas.iter().filter(|v| matches!(v.backing, Backing::File { .. })).count();
            let earlier = p.vmas.iter().map(|v| v.earlier_pages()).sum::<u64>() * ckpt_core::PAGE_SIZE;
            let from_earlier = if earlier > 0 { format!(", {} in earlier generations", human(earlier)) } else { String::new() };
            println!("      memory: {} mappings ({} of files), {} stored{from_earlier}", p.vmas.len(), files, human(p.stream_len));
            let attrs = ckpt_core::objects::memattrs::describe(&p.vmas, &p.mem_attrs);
            if !attrs.is_empty() {
                println!("      memory attributes: {}", attrs.join(", "));
            }
            if let Some(c) = p.cuda {
                // cuDriverGetVersion's encoding: 1000 × major + 10 × minor.
                let (major, minor) = (c.driver_version / 1000, c.driver_version % 1000 / 10);
                let restart = match c.before {
                    ckpt_core::gpu::GpuState::Running => "a restart gives it back to the GPU".to_string(),
                    ckpt_core::gpu::GpuState::Locked => "a restart gives it back to the GPU, its CUDA calls locked as its owner had them".to_string(),
                    ckpt_core::gpu::GpuState::Checkpointed => "its owner had checkpointed it: a restart leaves it so".to_string(),
                    other => format!("a restart brings it back to {other:?}"),
                };
                println!("      CUDA: its GPU state is in its memory (NVIDIA driver, CUDA {major}.{minor}); {restart}");
            }
            for (tid, mode) in p.seccomp.iter().flat_map(|s| &s.threads) {
                match mode {
                    ckpt_core::objects::seccomp::SeccompMode::Strict => println!("      seccomp: thread {tid} in strict mode"),
                    ckpt_core::objects::seccomp::SeccompMode::Filters(f) => {
                        let insns: usize = f.iter().map(|f| f.insns.len()).sum();
                        println!("      seccomp: thread {tid} under {} filters ({insns} instructions)", f.len());
                    }
                }
            }
            let inherited = p.vmas.iter().filter(|v| matches!(v.backing, Backing::GpuInherited { .. })).count();
            if inherited > 0 {
                println!("      GPU: no CUDA process; {inherited} mappings of an NVIDIA device inherited from one come back inaccessible");
            }
            for f in &p.fds {
                println!("      fd {:>3}: {:?} pos {} flags {:o}", f.fd, f.kind, f.pos, f.flags);
                if let Some(c) = ckpt_core::objects::inet::outside_connection(&f.kind) {
                    println!("             {c}: a restart brings it back reset, unless given --tcp-established");
                }
            }
            println!("      signal handlers: {}, pending: {}", p.signals.actions.len(), p.signals.shared_pending.len());
        }
        for z in &img.zombies {
            println!("    pid {} (parent {}): zombie, wait status {:#x}", z.pid, z.ppid, z.wait_status);
        }
    }
    Ok(0)
}

pub fn verify(dir: &Path, generation: Option<u64>, all: bool) -> Result<i32> {
    let cdir = CheckpointDir::open(dir)?;
    let gens = if all { cdir.committed()? } else { vec![pick_generation(&cdir, generation)?] };
    if gens.is_empty() {
        bail!("no committed generation in {}", dir.display());
    }
    // Each generation's files are read once, however many generations read pages from it.
    let mut verified = std::collections::BTreeSet::new();
    for gen in gens {
        let gen_dir = cdir.gen_dir(gen);
        let report = verify_generation(&gen_dir).with_context(|| format!("generation {gen} is damaged"))?;
        verified.insert(gen);
        // An incremental generation is as sound as the generations it reads pages from.
        let needs = Manifest::load(&gen_dir)?.needs;
        for &g in &needs {
            if verified.insert(g) {
                verify_generation(&cdir.gen_dir(g)).with_context(|| format!("generation {gen} reads pages from generation {g}, which is damaged"))?;
            }
        }
        for node in report.nodes.iter().filter(|n| !report.elsewhere.contains(n)) {
            let image = NodeImage::read(&gen_dir.join(node)).with_context(|| format!("generation {gen} is damaged"))?;
            let chunks = format!("{node}/{CHUNKS_DIR_NAME}");
            let lens = report.streams.iter().filter(|s| s.chunks_dir == chunks).map(|s| (s.pid, s.bytes)).collect();
            ckpt_core::validate::stream_lengths(&image, &lens)
                .map_err(|e| e.in_file(&gen_dir.join(&chunks)))
                .with_context(|| format!("generation {gen} is damaged"))?;
            image.check_earlier_streams(&needs, &earlier_chunk_dirs(&cdir, gen, &needs, node)?).with_context(|| format!("generation {gen} is damaged"))?;
        }
        let mut elsewhere = match report.elsewhere.as_slice() {
            [] => String::new(),
            nodes => format!("; the parts of {} are on their own hosts' storage, not checked here", nodes.join(", ")),
        };
        if !needs.is_empty() {
            elsewhere +=
                &format!("; incremental: generation(s) {} it reads from checked too", needs.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", "));
        }
        println!(
            "generation {gen}: OK ({} files, {} chunk files, {} stored, {} raw{elsewhere})",
            report.files,
            report.chunk_files,
            human(report.bytes_stored),
            human(report.bytes_raw)
        );
    }
    Ok(0)
}

pub fn status(dir: &Path, join: &JoinArgs, json: bool) -> Result<i32> {
    let cdir = CheckpointDir::open(dir)?;
    let answer = match &join.coord {
        None => call(dir, &Request::Status),
        Some(_) => Ok(ask(dir, join, &Request::Status)?),
    };
    match answer {
        Ok(Response::Status(s)) => {
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!("job running: launcher pid {}, command {:?}", s.launcher_pid, s.command);
                if !s.nodes.is_empty() {
                    println!("nodes: {}", s.nodes.join(", "));
                }
                if let Some(r) = &s.recovery {
                    println!("recovery: {r}");
                }
                println!("committed generations: {:?}", s.generations);
                if let Some(g) = s.persisting {
                    println!("generation {g}: the job runs again; its data is being written, not committed yet");
                } else if s.checkpoint_running {
                    println!("a checkpoint is running");
                }
            }
        }
        Ok(other) => bail!("unexpected answer from the agent: {other:?}"),
        Err(ckpt_coord::messages::ClientError::NoJob { .. }) => {
            let gens = cdir.committed()?;
            if json {
                println!("{}", serde_json::json!({ "running": false, "generations": gens }));
            } else {
                println!("no job running in {}; committed generations: {gens:?}", dir.display());
            }
        }
        Err(e) => return Err(e.into()),
    }
    Ok(0)
}

/// A progress bar on stderr, when it is a terminal, fed from a counter of bytes done.
struct Progress {
    done: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn start(total: u64, what: &'static str) -> Progress {
        use std::io::IsTerminal;
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        // Small jobs restore in a blink; a bar is only worth it for big ones.
        let thread = (std::io::stderr().is_terminal() && total > 256 << 20).then(|| {
            let (done, stop) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                let bar = indicatif::ProgressBar::new(total);
                bar.set_style(
                    indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec})")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                bar.set_message(what);
                while !stop.load(Ordering::Relaxed) {
                    bar.set_position(done.load(Ordering::Relaxed));
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                bar.finish_and_clear();
            })
        });
        Progress { done, stop, thread }
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
