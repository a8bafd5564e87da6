//! Jobs that span nodes: `ckpt coordinator` (the standalone coordinator), the link of an agent
//! joined to it (`ckpt launch --coord`, `ckpt restart --coord`), and `ckpt agent-rsh` (Open MPI's
//! remote launcher, which asks the coordinator to start an agent on another host).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::remote::{self, next_frame, send_frame};
use ckpt_coord::secure::{ChannelReader, ChannelWriter};
use ckpt_coord::server::{self, ControlSocket, RshConfig, TcpConfig};
use ckpt_coord::wire::{self, Frame, Role, TcpListen, ADDR_FILE};
use ckpt_coord::Coordinator;
use ckpt_core::image::{CheckpointDir, Manifest};
use clap::Args;

use crate::triggers::{self, Target};

/// Joining a standalone coordinator (`launch`, `restart`), or asking one (`checkpoint`, `status`).
#[derive(Args, Clone, Debug, Default)]
pub struct JoinArgs {
    /// The standalone coordinator's address (`ckpt coordinator --listen ADDR`), e.g.
    /// 10.0.0.1:7070. Without it the coordinator is embedded in the launcher.
    #[arg(long, value_name = "ADDR")]
    pub coord: Option<String>,
    /// This node's name in the image (default: the host name); every agent of a job has its own.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// The job's secret, when the checkpoint directory's `secret` is not readable here.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
}

/// Variables the job of a joined agent inherits: where its coordinator is (`ckpt agent-rsh`
/// reads them), and which ckpt runs it (plugins/bin/ckpt-agent-rsh runs that one).
pub const ENV_COORD: &str = "CKPT_COORD";
pub const ENV_NODE: &str = "CKPT_NODE";
pub const ENV_SECRET_FILE: &str = "CKPT_SECRET_FILE";
pub const ENV_EXE: &str = "CKPT_EXE";

/// Sets the job's variables. Call it before any thread starts: setting the environment races
/// with threads that read it.
pub fn export_job_env(addr: &str, node: &str, secret_file: Option<&Path>) {
    std::env::set_var(ENV_COORD, addr);
    std::env::set_var(ENV_NODE, node);
    if let Ok(exe) = std::env::current_exe() {
        std::env::set_var(ENV_EXE, exe);
    }
    if let Some(f) = secret_file {
        std::env::set_var(ENV_SECRET_FILE, std::fs::canonicalize(f).unwrap_or_else(|_| f.to_path_buf()));
    }
}

/// The job's secret, from `--secret-file` or `DIR/secret`.
pub fn read_job_secret(dir: &Path, secret_file: Option<&Path>) -> Result<String> {
    let path = wire::secret_path(dir, secret_file);
    wire::read_secret(&path).with_context(|| {
        format!(
            "reading the job's secret {} (give --dir the coordinator's checkpoint directory, shared with this host, or --secret-file a copy of its `secret`)",
            path.display()
        )
    })
}

/// An agent's connection to its coordinator, hello said and welcome heard; heartbeats go out
/// from here on.
pub struct Link {
    pub addr: String,
    pub node: String,
    pub secret: String,
    /// For reading the coordinator's commands.
    pub stream: ChannelReader,
    /// Shared by the heartbeat and the thread that answers commands.
    pub writer: Arc<Mutex<ChannelWriter>>,
    /// Cleared when the coordinator is lost (stops the heartbeat).
    pub alive: Arc<AtomicBool>,
    /// Whether the agent is attached to a relay (its heartbeats go there, and silence on this
    /// connection is expected).
    pub quiet: Arc<ckpt_coord::relay::Quiet>,
    /// The address this node reaches the coordinator from (where it serves a relay).
    pub local_ip: std::net::IpAddr,
    /// For a restart: the generation the coordinator says to restore.
    pub restore: Option<u64>,
    /// Where this node keeps its part of each new generation (`ckpt coordinator --local-dir`,
    /// `{node}` replaced): on this host's own storage. `None`: the shared checkpoint directory.
    pub local_dir: Option<std::path::PathBuf>,
    /// The data port where this node keeps other nodes' parts (handed to the agent).
    pub data: Option<crate::transfer::DataServer>,
    /// The coordinator recovers from lost nodes (`--recover`): when the job ends, say `ended`
    /// and wait for the verdict.
    pub recover: bool,
}

/// The nodes that restart on other hosts, and every moved node's (old, new) addresses.
pub type Placement = (Vec<String>, Vec<(std::net::IpAddr, std::net::IpAddr)>);

impl Link {
    /// Call after the launcher's signals are blocked: this starts the heartbeat thread.
    pub fn connect(dir: &Path, addr: &str, node: &str, secret_file: Option<&Path>, restart: bool) -> Result<Link> {
        let secret = read_job_secret(dir, secret_file)?;
        let mut channel = remote::dial(addr, &secret)?;
        // Other nodes hand this node their parts here (partner copies), on the address this
        // node reaches the coordinator from (the one the coordinator tells them).
        let local_ip = channel.local_addr()?.ip();
        let data = crate::transfer::DataServer::start(secret.clone(), dir, node, local_ip)?;
        let role = Role::Agent { node: node.into(), pid: std::process::id(), restart, data_port: Some(data.port) };
        remote::hello(&mut channel, addr, role)?;
        let (stream, writer) = channel.split();
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let (restore, local_dir, recover) = match next_frame(&stream, addr)? {
            Frame::Welcome { restore, local_dir, recover } => (restore, local_dir, recover),
            other => bail!("the coordinator at {addr} answered {other:?} to our hello"),
        };
        let writer = Arc::new(Mutex::new(writer));
        let (alive, quiet) = (Arc::new(AtomicBool::new(true)), Arc::new(ckpt_coord::relay::Quiet::default()));
        remote::start_heartbeat(writer.clone(), alive.clone(), Some(quiet.clone()))?;
        let local_dir = match local_dir {
            None => None,
            Some(t) => {
                ckpt_core::image::manifest::check_local_dir_template(&t).map_err(|e| anyhow!("the coordinator's --local-dir: {e}"))?;
                Some(ckpt_core::image::manifest::expand_local_dir(&t, node))
            }
        };
        Ok(Link { addr: addr.into(), node: node.into(), secret, stream, writer, alive, quiet, local_ip, restore, local_dir, data: Some(data), recover })
    }

    /// A restart whose part is not on this host: asks the coordinator which node keeps a copy
    /// and where (it waits for that node's agent), then fetches the part into `dest` (this
    /// node's local directory for the generation).
    pub fn fetch_part(&self, manifest: &Manifest, gen_dir: &Path, dest: &Path) -> Result<String> {
        let generation = manifest.generation;
        send_frame(&self.writer, &Frame::PartWanted { generation, node: self.node.clone() })
            .with_context(|| format!("asking the coordinator at {} where node {}'s part is", self.addr, self.node))?;
        self.stream.set_read_timeout(Some(Duration::from_secs(90)))?;
        let at = next_frame(&self.stream, &self.addr);
        self.stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        match at? {
            Frame::PartAt { holder, addr } => {
                crate::transfer::fetch_part(&addr, &self.secret, generation, &self.node, dest)
                    .with_context(|| format!("fetching node {}'s part of generation {generation} from node {holder} ({addr})", self.node))?;
                Ok(format!("node {holder}"))
            }
            Frame::XorFrom { group, addrs } => {
                let parts = ckpt_core::image::PartFiles::read_nodes(manifest, gen_dir, &group)?;
                crate::transfer::rebuild_part(manifest, &parts, &self.secret, &self.node, &group, &addrs, dest)
                    .with_context(|| format!("rebuilding node {}'s part of generation {generation} from its XOR group", self.node))?;
                Ok(format!("its XOR group ({})", group.iter().filter(|m| **m != self.node).cloned().collect::<Vec<_>>().join(", ")))
            }
            other => bail!("the coordinator at {} answered {other:?}", self.addr),
        }
    }

    /// A restart of a job over several nodes, first: tells the coordinator the addresses this
    /// node's part had that are not on this host (it restarts elsewhere: each stands for the
    /// address this node reaches the coordinator from), and returns the nodes that moved and
    /// every moved node's (old, new) addresses.
    pub fn placement(&self, moved_from: &[std::net::IpAddr]) -> Result<Placement> {
        let here = self.stream.local_addr()?.ip();
        let readdressed = moved_from.iter().map(|old| (*old, here)).collect();
        self.round(Frame::Placed { moved: !moved_from.is_empty(), readdressed }, "whether the other nodes restart elsewhere", |f| match f {
            Frame::Placement { moved, readdressed } => Ok((moved, readdressed)),
            other => Err(other),
        })
    }

    /// A restart: tells the coordinator this node's processes are rebuilt (their connections to
    /// the other nodes in repair mode) and waits until every node of the generation is.
    pub fn rebuilt(&self) -> Result<()> {
        self.round(Frame::Rebuilt, "the other nodes to be rebuilt", |f| match f {
            Frame::Proceed => Ok(()),
            other => Err(other),
        })
    }

    /// A restart of a job over several nodes, before its processes are rebuilt: tells the
    /// coordinator where this node's TCP server ends listen (an unspecified address stands for
    /// this node's address as the coordinator sees it) and returns every node's.
    pub fn tcp_listening(&self, mut ends: Vec<TcpListen>) -> Result<Vec<TcpListen>> {
        let here = self.stream.local_addr()?.ip();
        for e in &mut ends {
            if e.addr.ip().is_unspecified() {
                e.addr.set_ip(here);
            }
        }
        self.round(Frame::TcpListening { ends }, "the other nodes' addresses", |f| match f {
            Frame::TcpConnectTo { ends } => Ok(ends),
            other => Err(other),
        })
    }

    /// One round of a restart over several nodes: sends `said`, then waits (the coordinator
    /// says nothing until every node of the generation has said its part) for the answer
    /// `answer` takes.
    fn round<T>(&self, said: Frame, waiting_for: &str, answer: impl Fn(Frame) -> std::result::Result<T, Frame>) -> Result<T> {
        send_frame(&self.writer, &said).with_context(|| format!("telling the coordinator at {} {said:?}", self.addr))?;
        let started = std::time::Instant::now();
        let mut told = false;
        loop {
            match next_frame(&self.stream, &self.addr) {
                Ok(frame) => {
                    return answer(frame).map_err(|other| anyhow!("the coordinator at {} answered {other:?} while we waited for {waiting_for}", self.addr))
                }
                Err(remote::RemoteError::Wire { error: wire::WireError::Silent(_), .. }) => {}
                Err(e) => return Err(e).context(format!("waiting for {waiting_for} at the coordinator {}", self.addr)),
            }
            if !told && started.elapsed() > Duration::from_secs(5) {
                say!("ckpt restart: node {} waits for {waiting_for}", self.node);
                told = true;
            }
            if started.elapsed() > REBUILT_WAIT {
                bail!("waited {} s for {waiting_for} (are the other nodes' `ckpt restart --coord` running?)", REBUILT_WAIT.as_secs());
            }
        }
    }

    /// Tells the coordinator that the job runs and commands may come.
    pub fn joined(&self) -> Result<()> {
        send_frame(&self.writer, &Frame::Joined).with_context(|| format!("joining the coordinator at {}", self.addr))?;
        Ok(())
    }
}

/// `ckpt coordinator`: parts brought back on other hosts, by hand (`--restart-on`) or by
/// itself after the loss of a node (`--recover`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NodeLossArgs {
    /// Restart the generation's parts on these hosts, one per node in the manifest's order,
    /// through --rsh (a job brought back on another set of hosts, say after a requeue).
    #[arg(long, value_name = "HOST,...", value_delimiter = ',')]
    pub restart_on: Vec<String>,
    /// When a node is lost, restart the job from the newest generation that can be had without
    /// it, its part on a spare host (--spares) or, with none left, on a surviving node's host,
    /// by itself. Needs --rsh.
    #[arg(long)]
    pub recover: bool,
    /// Hosts to restart lost nodes' parts on (through --rsh), in this order, before any
    /// surviving node's.
    #[arg(long, value_name = "HOST,...", value_delimiter = ',', requires = "recover")]
    pub spares: Vec<String>,
    /// Recoveries before giving up.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub max_recoveries: u32,
}

/// How long a rebuilt node waits for the job's other nodes.
const REBUILT_WAIT: Duration = Duration::from_secs(600);

/// `ckpt coordinator`: serves agents and clients until every agent that joined has left.
#[allow(clippy::too_many_arguments)]
pub fn run_coordinator(
    listen: &str,
    dir: &Path,
    rsh: Option<String>,
    (keep, full_every): (usize, u64),
    generation: Option<u64>,
    interval: Option<String>,
    local_dir: Option<String>,
    redundancy: Option<String>,
    flush: (u64, u64),
    relay_every: usize,
    recover: &NodeLossArgs,
) -> Result<i32> {
    if flush.0 > 0 && local_dir.is_none() {
        bail!("--flush-every copies node-local parts to the checkpoint directory: give --local-dir too (without it every part is there already)");
    }
    if !recover.restart_on.is_empty() && rsh.is_none() {
        bail!("--restart-on starts the parts through --rsh: give --rsh too ('ssh {{host}}' or similar)");
    }
    if recover.recover && rsh.is_none() {
        bail!("--recover restarts lost nodes' parts on spare hosts through --rsh: give --rsh too ('ssh {{host}}' or similar)");
    }
    if let Some(t) = &local_dir {
        ckpt_core::image::manifest::check_local_dir_template(t).map_err(|e| anyhow!("--local-dir: {e}"))?;
    }
    let (partner_copies, xor) = match redundancy.as_deref() {
        None | Some("none") => (false, None),
        Some(s) if local_dir.is_none() => bail!("--redundancy {s} keeps redundancy on the nodes' own storage: give --local-dir too"),
        Some("partner") => (true, None),
        Some(s) if s.starts_with("xor:") => match s["xor:".len()..].parse::<usize>() {
            Ok(k) if k >= 2 => (false, Some(k)),
            _ => bail!("--redundancy {s}: say xor:K with K, the nodes per group, at least 2 (xor:2 is a mirror; xor:4 stores a third more)"),
        },
        Some(s) => bail!("--redundancy {s}: say none, partner or xor:K"),
    };
    let interval = match interval {
        None => None,
        Some(s) => triggers::TriggerArgs { interval: Some(s), signal: "USR1".into(), ..Default::default() }.parse()?.interval,
    };
    let cdir = CheckpointDir::create(dir)?;
    let socket = ControlSocket::bind(dir)?;
    // Nothing else writes generations here while we run; a generation left half-written by an
    // earlier coordinator is garbage.
    cdir.remove_uncommitted()?;
    let restore = match generation {
        Some(_) => Some(crate::commands::pick_generation(&cdir, generation)?),
        None => cdir.newest_committed()?,
    };
    let secret = wire::load_or_create_secret(dir).with_context(|| format!("the job's secret in {}", dir.display()))?;
    let addr_file = dir.join(ADDR_FILE);
    let _ = std::fs::remove_file(&addr_file);
    let listener = TcpListener::bind(listen).with_context(|| format!("listen on {listen} (is the port taken? give another, or port 0)"))?;
    let bound = listener.local_addr()?;
    let rsh = rsh.map(|template| -> Result<RshConfig> { Ok(RshConfig { template, exe: std::env::current_exe()?, dir: std::fs::canonicalize(dir)? }) });
    let rsh = rsh.transpose()?;
    let mut coordinator = Coordinator::new(cdir.clone(), keep, vec!["ckpt".into(), "coordinator".into()])?;
    coordinator.set_local_dir(local_dir.clone());
    coordinator.set_partner_copies(partner_copies);
    coordinator.set_xor(xor);
    coordinator.set_full_every(full_every);
    coordinator.set_flush(flush.0, flush.1);
    let mut restoring = server::Restoring::default();
    if let Some(g) = restore {
        let nodes = Manifest::load(&cdir.gen_dir(g))?.nodes;
        restoring = server::Restoring::of(g, nodes.clone());
        coordinator.await_nodes(nodes);
    }
    let coord = Arc::new(Mutex::new(coordinator));
    let registry = coord.lock().unwrap_or_else(|p| p.into_inner()).registry();
    registry.set_relay_every(relay_every);
    server::serve_control(coord.clone(), &socket)?;
    let tcp = Arc::new(TcpConfig {
        key: ckpt_coord::secure::Key::from_secret(&secret),
        restoring: Mutex::new(restoring),
        rsh,
        local_dir,
        data_ports: Default::default(),
        dir: dir.to_path_buf(),
        recover: recover.recover,
        // Agents started by the coordinator are given the address it listens on, when it is
        // one; otherwise the one the first agent reached it at.
        reach: Mutex::new((!bound.ip().is_unspecified()).then(|| bound.to_string())),
        hosts: Mutex::default(),
        starting: Mutex::default(),
    });
    server::serve_tcp(coord.clone(), listener, tcp.clone())?;
    let mut recovery = recover.recover.then(|| {
        ckpt_coord::recovery::Recovery::new(ckpt_coord::recovery::RecoveryConfig { spares: recover.spares.clone(), max_attempts: recover.max_recoveries })
    });
    {
        use std::io::Write;
        let mut f = ckpt_core::image::open_private_file(&addr_file, true).with_context(|| format!("write {}", addr_file.display()))?;
        f.write_all(format!("{bound}\n").as_bytes()).with_context(|| format!("write {}", addr_file.display()))?;
    }
    match restore {
        Some(g) => say!("ckpt coordinator: listening on {bound}; restarting agents restore generation {g} of {}", dir.display()),
        None => say!("ckpt coordinator: listening on {bound}; checkpoint directory {}", dir.display()),
    }
    if !recover.restart_on.is_empty() {
        restart_on(&cdir, restore, &recover.restart_on, &tcp)?;
    }
    let ended = Arc::new(AtomicBool::new(false));
    triggers::start_interval(Target::Local(coord.clone()), interval, ended.clone())?;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(r) = &mut recovery {
            r.tick(&coord, &tcp);
        }
        // A checkpoint under way holds the coordinator: the flushes are looked at next time.
        if let Ok(mut c) = coord.try_lock() {
            c.finish_flushes();
        }
        let live = !registry.nodes().is_empty();
        // A recovery under way may have no agent for a moment (they restart).
        if registry.anyone_joined() && !live && !recovery.as_ref().is_some_and(|r| r.busy()) {
            break;
        }
    }
    ended.store(true, Relaxed);
    // A checkpoint in progress ends (it aborts: its agents are gone) before we do.
    let _done = coord.lock().unwrap_or_else(|p| p.into_inner());
    let _ = std::fs::remove_file(&addr_file);
    say!("ckpt coordinator: every agent has left; exiting");
    Ok(0)
}

/// `--restart-on`: starts the restart of every node of the restored generation on its host,
/// in the manifest's order, through the rsh template.
fn restart_on(cdir: &CheckpointDir, restore: Option<u64>, hosts: &[String], tcp: &TcpConfig) -> Result<()> {
    let g = restore.ok_or_else(|| anyhow!("--restart-on: {} holds no committed generation to restart", cdir.root().display()))?;
    let nodes = Manifest::load(&cdir.gen_dir(g))?.nodes;
    if nodes.len() != hosts.len() {
        bail!(
            "--restart-on names {} host(s) for the {} node(s) of generation {g} ({}): give one host per node, in this order",
            hosts.len(),
            nodes.len(),
            nodes.join(", ")
        );
    }
    if tcp.reach.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
        bail!("--restart-on: give --listen an address the hosts can reach (not 0.0.0.0): the restarts are told to join it");
    }
    for (node, host) in nodes.iter().zip(hosts) {
        say!("ckpt coordinator: restarting node {node}'s part of generation {g} on {host}");
        server::start_restart(tcp, host, node).map_err(|e| anyhow!("--restart-on: node {node} on {host}: {e}"))?;
    }
    Ok(())
}

/// ssh options that take a value (skipped with it when Open MPI passes them to its rsh agent).
const SSH_OPTIONS_WITH_VALUE: &str = "bcDEeFIiJLlmOopQRSWw";

/// `[options] HOST COMMAND...` as ssh takes them: the host (without `user@`), and the command.
fn parse_rsh_args(args: &[String]) -> Result<(String, Vec<String>)> {
    let mut i = 0;
    while i < args.len() && args[i].starts_with('-') && args[i].len() > 1 {
        let opt = &args[i][1..];
        // `-p 22` takes the next word; `-p22` and flag groups such as `-xT` do not.
        let last = opt.chars().last().unwrap_or(' ');
        let takes_value = opt.len() == 1 && SSH_OPTIONS_WITH_VALUE.contains(last);
        i += if takes_value { 2 } else { 1 };
    }
    let host = args.get(i).ok_or_else(|| anyhow!("ckpt agent-rsh: no host given (usage: ckpt agent-rsh [ssh options] HOST COMMAND...)"))?;
    let host = host.rsplit('@').next().unwrap_or(host).to_string();
    let command = args[i + 1..].to_vec();
    if command.is_empty() {
        bail!("ckpt agent-rsh: no command for {host} (an interactive login is not supported)");
    }
    Ok((host, command))
}

/// `ckpt agent-rsh [ssh options] HOST COMMAND...`: runs inside a job joined to a standalone
/// coordinator (Open MPI's `plm_rsh_agent`). The coordinator, not this process, starts the agent
/// on HOST, so that the remote node's agent is not part of this job's process tree. Exits 0 once
/// that agent has joined.
pub fn agent_rsh(args: &[String]) -> Result<i32> {
    let (host, command) = parse_rsh_args(args)?;
    let addr = std::env::var(ENV_COORD)
        .map_err(|_| anyhow!("ckpt agent-rsh runs inside a job joined to a standalone coordinator (`ckpt launch --coord ADDR`); {ENV_COORD} is not set"))?;
    let secret_file = std::env::var_os(ENV_SECRET_FILE).map(PathBuf::from);
    let dir = std::env::var_os("CKPT_DIR").map(PathBuf::from).unwrap_or_default();
    let secret = read_job_secret(&dir, secret_file.as_deref())?;
    // As ssh does: the words are one command line for the remote shell.
    let segments = std::env::var(crate::mpi::SEGMENT_DIR_VAR).ok();
    let shell = vec!["/bin/sh".to_string(), "-c".to_string(), crate::mpi::remote_command(&command.join(" "), segments.as_deref())];
    let node = remote::spawn(&addr, &secret, &host, &shell)?;
    tracing::info!(node, "agent-rsh: the agent has joined");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn rsh_arguments_as_open_mpi_gives_them() {
        let (h, c) = parse_rsh_args(&words("-x n1 orted -mca ess env")).unwrap();
        assert_eq!((h.as_str(), c), ("n1", words("orted -mca ess env")));
        let (h, c) = parse_rsh_args(&words("-l me -p 22 -xT me@n2 PATH=/x ; orted")).unwrap();
        assert_eq!((h.as_str(), c), ("n2", words("PATH=/x ; orted")));
        let (h, _) = parse_rsh_args(&words("-p2222 n3 true")).unwrap();
        assert_eq!(h, "n3");
        assert!(parse_rsh_args(&words("-x")).is_err());
        assert!(parse_rsh_args(&words("n1")).is_err());
    }
}
