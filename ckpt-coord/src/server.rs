//! Serving the coordinator: clients on the checkpoint directory's Unix socket (`D/agent.sock`,
//! JSON lines, for `ckpt checkpoint --dir D` and libckpt) and, for a standalone coordinator,
//! agents and clients on TCP (each connection opened by the handshake of [`crate::secure`], then
//! frames, the first a `hello`).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::coordinator::{CoordInfo, Coordinator};
use crate::messages::{Request, Response, SOCKET_NAME};
use crate::remote::{send_frame, RemoteAgent};
use crate::secure::{self, ChannelReader, ChannelWriter, Gate, Key, Pass};
use crate::wire::{read_frame, Frame, Role, TcpListen};

pub type SharedCoordinator = Arc<Mutex<Coordinator>>;

/// The control socket of a checkpoint directory, removed when dropped.
pub struct ControlSocket {
    path: PathBuf,
    listener: UnixListener,
}

impl ControlSocket {
    pub fn bind(dir: &Path) -> std::io::Result<ControlSocket> {
        let path = dir.join(SOCKET_NAME);
        if UnixStream::connect(&path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("a job is already running in {} (its agent or coordinator answers on {})", dir.display(), path.display()),
            ));
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| std::io::Error::new(e.kind(), format!("listen on {}: {e}", path.display())))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(ControlSocket { path, listener })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers one client request. Checkpoints take the coordinator in turn; the thread that runs
/// one drives every phase of it (with an in-process agent, it is the job's tracer throughout).
/// `wait_closed` waits until the client has hung up (for detached requests).
pub fn answer(
    coord: &SharedCoordinator,
    info: &CoordInfo,
    req: Request,
    send: &mut dyn FnMut(&Response) -> std::io::Result<()>,
    wait_closed: &mut dyn FnMut(),
) -> std::io::Result<()> {
    let req = match req {
        Request::Status => return send(&info.status()),
        Request::Checkpoint(req) => req,
    };
    // The lock is held until the answer is sent: a job that ends meanwhile (after `--kill`) waits
    // for it before the launcher exits, so the client always hears the outcome.
    let mut c = coord.lock().unwrap_or_else(|p| p.into_inner());
    if req.detach {
        // Asked from inside the job (libckpt): the asking process must not be holding this
        // connection when it is frozen, so it is answered first and closes it; it learns the
        // outcome from the generation's MANIFEST and from `status`.
        send(&Response::Accepted { generation: info.next_generation() })?;
        wait_closed();
        if let Err(e) = c.checkpoint(&req) {
            warn!("checkpoint asked by the job: {e}");
        }
        return Ok(());
    }
    let mut answered = false;
    let early = !req.kill && req.no_wait_durable;
    let result = c.checkpoint_with(&req, &mut |generation, frozen_ms| {
        if early {
            answered = send(&Response::Resumed { generation, frozen_ms }).is_ok();
        }
    });
    match result {
        Ok(_) if answered => Ok(()),
        Ok(reply) => send(&Response::Committed(reply)),
        Err(e) if answered => {
            warn!("{e}");
            Ok(())
        }
        Err(e) => send(&Response::Error { message: e.to_string() }),
    }
}

/// Serves the Unix control socket, each connection on a thread of its own.
pub fn serve_control(coord: SharedCoordinator, socket: &ControlSocket) -> std::io::Result<()> {
    let listener = socket.listener.try_clone()?;
    let info = coord.lock().unwrap_or_else(|p| p.into_inner()).info.clone();
    std::thread::Builder::new().name("ckpt-control".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let (coord, info) = (coord.clone(), info.clone());
            let spawned = std::thread::Builder::new().name("ckpt-request".into()).spawn(move || {
                if let Err(e) = handle_unix(&coord, &info, conn) {
                    warn!("control connection: {e}");
                }
            });
            if let Err(e) = spawned {
                warn!("control connection: no thread to serve it: {e}");
            }
        }
    })?;
    Ok(())
}

fn handle_unix(coord: &SharedCoordinator, info: &CoordInfo, conn: UnixStream) -> std::io::Result<()> {
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let send = &mut |r: &Response| {
        let mut out = serde_json::to_string(r).expect("responses serialize");
        out.push('\n');
        (&conn).write_all(out.as_bytes())
    };
    match serde_json::from_str::<Request>(&line) {
        Err(e) => send(&Response::Error { message: format!("malformed request: {e}") }),
        Ok(req) => answer(coord, info, req, send, &mut || wait_closed(&conn)),
    }
}

/// Waits (a few seconds at most) until the client has closed its end.
fn wait_closed(conn: &UnixStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    while let Ok(n) = (&*conn).read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

/// How a standalone coordinator starts agents on other hosts for `ckpt agent-rsh`.
#[derive(Clone, Debug)]
pub struct RshConfig {
    /// A command prefix with `{host}` that runs a shell command line on the host, given as one
    /// last argument, as ssh does: `ssh {host}`, `ip netns exec {host} sh -c`.
    pub template: String,
    /// The `ckpt` binary (the same path on every host).
    pub exe: PathBuf,
    /// The checkpoint directory (shared by every host).
    pub dir: PathBuf,
}

impl RshConfig {
    /// The command that starts, on `host`, an agent joined to the coordinator at `addr` that
    /// runs `command`.
    pub fn argv(&self, host: &str, addr: &str, command: &[String]) -> Vec<String> {
        let mut remote = self.ckpt("launch", addr, host);
        remote.push("--".into());
        remote.extend(command.iter().cloned());
        self.on(host, &remote)
    }

    /// The command that restarts, on `host`, node `node`'s part of the generation the
    /// coordinator at `addr` restores.
    pub fn restart_argv(&self, host: &str, addr: &str, node: &str) -> Vec<String> {
        let remote = self.ckpt("restart", addr, node);
        self.on(host, &remote)
    }

    /// `ckpt VERB --coord ADDR --node NODE --dir DIR`.
    fn ckpt(&self, verb: &str, addr: &str, node: &str) -> Vec<String> {
        let mut remote = vec![self.exe.display().to_string()];
        remote.extend([verb, "--coord", addr, "--node", node, "--dir"].map(String::from));
        remote.push(self.dir.display().to_string());
        remote
    }

    /// The template's command running `remote` on `host`.
    fn on(&self, host: &str, remote: &[String]) -> Vec<String> {
        let mut argv: Vec<String> = self.template.split_whitespace().map(|w| w.replace("{host}", host)).collect();
        // One command line for the remote shell, every word quoted: ssh joins its arguments
        // with spaces and hands them to a shell, which would split an unquoted command again.
        argv.push(remote.iter().map(|w| shlex::try_quote(w).map(|q| q.into_owned()).unwrap_or_else(|_| w.clone())).collect::<Vec<_>>().join(" "));
        argv
    }
}

/// What the TCP side of a standalone coordinator needs.
pub struct TcpConfig {
    /// The key of the job's connections, from its secret.
    pub key: Key,
    /// The generation restarting agents restore, and where they meet.
    pub restoring: Mutex<Restoring>,
    pub rsh: Option<RshConfig>,
    /// `--local-dir`: the node-local level, told to every agent in `welcome`.
    pub local_dir: Option<String>,
    /// Every agent's data port (`IP:port`) by node, as said in its hello: a restarting node
    /// fetches its part from the node that keeps a copy.
    pub data_ports: Arc<Mutex<std::collections::HashMap<String, String>>>,
    /// The checkpoint directory (for the restored generation's manifest).
    pub dir: std::path::PathBuf,
    /// `--recover`: agents wait for a verdict when their job ends (told in `welcome`).
    pub recover: bool,
    /// The coordinator's address as the agents reach it (the local address of the first
    /// agent's connection): what an agent started on a spare host is given.
    pub reach: Mutex<Option<String>>,
    /// Where each node's agent runs, as the rsh template names hosts: the host it was started
    /// on through `--rsh`, else the address its connection came from. A recovery with no spare
    /// left puts a lost part on a survivor's host.
    pub hosts: Mutex<std::collections::HashMap<String, String>>,
    /// The hosts agents were started on through `--rsh` and that have not joined yet, by node.
    pub starting: Mutex<std::collections::HashMap<String, String>>,
}

impl TcpConfig {
    /// The host `node`'s agent runs on, if it has joined.
    pub fn host_of(&self, node: &str) -> Option<String> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner()).get(node).cloned()
    }

    /// `node`'s agent is about to be started on `host` through the rsh template.
    fn starting_on(&self, node: &str, host: &str) {
        self.starting.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), host.to_string());
    }
}

/// The generation restarting agents restore (none: agents launch) and the barrier its nodes
/// meet at. Fixed for a coordinator started to restart a job; set anew by each recovery.
#[derive(Default)]
pub struct Restoring {
    pub generation: Option<u64>,
    pub barrier: Arc<RestoreBarrier>,
}

impl Restoring {
    pub fn of(generation: u64, nodes: Vec<String>) -> Restoring {
        Restoring { generation: Some(generation), barrier: Arc::new(RestoreBarrier::new(nodes)) }
    }
}

/// The nodes of a restored generation wait here, each with its processes rebuilt and stopped
/// and its TCP connections still in repair mode, until every node is: a node that released its
/// job earlier would have its connections to the others answered by resets. The same way, they
/// gather what each says before rebuilding (where it restarts, where its TCP server ends listen)
/// and are each told what all said.
#[derive(Default)]
pub struct RestoreBarrier {
    expected: Vec<String>,
    arrived: Gathering<()>,
    /// Nodes that said where their TCP server ends listen (`tcp_listening`), with what they said.
    listening: Gathering<Vec<TcpListen>>,
    /// Nodes that said whether they restart on another host than their part's (`placed`).
    placed: Gathering<(bool, Vec<(std::net::IpAddr, std::net::IpAddr)>)>,
}

/// What the nodes of a restore said in one round, with the connection to answer each on.
type Gathering<T> = Mutex<Vec<(String, Arc<Mutex<ChannelWriter>>, T)>>;

impl RestoreBarrier {
    pub fn new(expected: Vec<String>) -> RestoreBarrier {
        RestoreBarrier { expected, ..Default::default() }
    }

    /// `node` said `value` in a round: once every expected node has, each is sent the frame
    /// `answer` makes of what all said.
    fn gather<T>(
        &self,
        round: &Gathering<T>,
        node: &str,
        conn: &Arc<Mutex<ChannelWriter>>,
        value: T,
        answer: impl Fn(&[(String, Arc<Mutex<ChannelWriter>>, T)]) -> Frame,
    ) -> std::io::Result<()> {
        let mut said = round.lock().unwrap_or_else(|p| p.into_inner());
        said.retain(|(n, _, _)| n != node);
        said.push((node.to_string(), conn.clone(), value));
        let missing: Vec<&String> = self.expected.iter().filter(|n| !said.iter().any(|(a, _, _)| a == *n)).collect();
        if !missing.is_empty() {
            debug!(node, ?missing, "waiting for the other nodes");
            return Ok(());
        }
        let frame = answer(&said);
        for (n, c, _) in said.drain(..) {
            if let Err(e) = send_frame(&c, &frame) {
                warn!(node = n, "answering a restarting node: {e}");
            }
        }
        Ok(())
    }

    /// `node` said where its TCP server ends listen: once every expected node has, each is
    /// told every node's (`tcp_connect_to`).
    fn arrive_listening(&self, node: &str, conn: &Arc<Mutex<ChannelWriter>>, ends: Vec<TcpListen>) -> std::io::Result<()> {
        self.gather(&self.listening, node, conn, ends, |said| {
            let all: Vec<TcpListen> = said.iter().flat_map(|(_, _, e)| e.iter().cloned()).collect();
            info!(nodes = said.len(), ends = all.len(), "every node listens again for its TCP connections to the others");
            Frame::TcpConnectTo { ends: all }
        })
    }

    /// `node` said whether it restarts on another host: once every expected node has, each is
    /// told which nodes did (`placement`).
    fn arrive_placed(
        &self,
        node: &str,
        conn: &Arc<Mutex<ChannelWriter>>,
        moved: bool,
        readdressed: Vec<(std::net::IpAddr, std::net::IpAddr)>,
    ) -> std::io::Result<()> {
        self.gather(&self.placed, node, conn, (moved, readdressed), |said| {
            let moved: Vec<String> = said.iter().filter(|(_, _, m)| m.0).map(|(n, _, _)| n.clone()).collect();
            let readdressed: Vec<(std::net::IpAddr, std::net::IpAddr)> = said.iter().flat_map(|(_, _, m)| m.1.iter().copied()).collect();
            if !moved.is_empty() {
                info!(?moved, ?readdressed, "nodes restart on other hosts than their parts ran on");
            }
            Frame::Placement { moved, readdressed }
        })
    }

    /// `node` is rebuilt: once every expected node is, each is told to proceed.
    fn arrive(&self, node: &str, conn: &Arc<Mutex<ChannelWriter>>) -> std::io::Result<()> {
        self.gather(&self.arrived, node, conn, (), |said| {
            info!(nodes = said.len(), "every node is rebuilt; releasing them");
            Frame::Proceed
        })
    }
}

/// Accepts agents and clients on `listener`, each connection on a thread of its own; at most
/// [`secure::MAX_PENDING`] of them in handshake at once (the oldest is dropped).
pub fn serve_tcp(coord: SharedCoordinator, listener: TcpListener, config: Arc<TcpConfig>) -> std::io::Result<()> {
    let info = coord.lock().unwrap_or_else(|p| p.into_inner()).info.clone();
    let gate = Gate::new();
    std::thread::Builder::new().name("ckpt-listen".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let Ok(pass) = gate.enter(&conn) else { continue };
            let (coord, info, config) = (coord.clone(), info.clone(), config.clone());
            let spawned = std::thread::Builder::new().name("ckpt-conn".into()).spawn(move || {
                let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
                if let Err(e) = handle_tcp(&coord, &info, &config, conn, pass) {
                    warn!(peer, "connection: {e}");
                }
            });
            if let Err(e) = spawned {
                warn!("connection: no thread to serve it: {e}");
            }
        }
    })?;
    Ok(())
}

/// Answers `error` and says why in the log.
fn refuse(conn: &Mutex<ChannelWriter>, peer: SocketAddr, why: &str) -> std::io::Result<()> {
    warn!(peer = %peer, "refused a connection: {why}");
    let _ = send_frame(conn, &Frame::Error { message: why.to_string() });
    Ok(())
}

fn handle_tcp(coord: &SharedCoordinator, info: &Arc<CoordInfo>, config: &TcpConfig, conn: TcpStream, pass: Pass) -> std::io::Result<()> {
    let peer = conn.peer_addr()?;
    let _ = conn.set_nodelay(true);
    let channel = match secure::accept(conn, &config.key) {
        Ok(c) => c,
        Err(e) => {
            warn!(peer = %peer, "refused a connection: {e}");
            return Ok(());
        }
    };
    drop(pass);
    let (reader, writer) = channel.split();
    let writer = Arc::new(Mutex::new(writer));
    // The hello came with the handshake.
    reader.set_read_timeout(Some(Duration::from_secs(10)))?;
    let role = match read_frame(&reader) {
        Ok(Frame::Hello { role }) => role,
        Ok(_) => return refuse(&writer, peer, "the first message must be a hello"),
        Err(e) => return refuse(&writer, peer, &format!("no hello: {e}")),
    };
    match role {
        Role::Agent { node, pid, restart, data_port } => {
            let data = data_port.map(|port| SocketAddr::new(peer.ip(), port).to_string());
            join_agent(info, config, reader, writer, peer, node, pid, restart, data)
        }
        Role::Peer { .. } => refuse(&writer, peer, "this is the coordinator; parts go to agents' data ports"),
        Role::Relay { node } => {
            // A relay runs in an agent of the job, which has joined on its own connection.
            if info.registry.is_free(&node) {
                return refuse(&writer, peer, &format!("a relay runs in an agent of the job, and no agent of node {node:?} has joined"));
            }
            crate::relay::RelayLink::start(node, reader, writer, info.registry.clone()).map(drop)
        }
        Role::Client => {
            reader.set_read_timeout(None)?;
            serve_client(coord, info, config, reader, writer)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn join_agent(
    info: &CoordInfo,
    config: &TcpConfig,
    reader: ChannelReader,
    conn: Arc<Mutex<ChannelWriter>>,
    peer: SocketAddr,
    node: String,
    pid: u32,
    restart: bool,
    data: Option<String>,
) -> std::io::Result<()> {
    // A node restarting in the same process after a recovery may be quicker than its old
    // connection's end is noticed here.
    let free = info.registry.is_free(&node) || (restart && info.registry.wait_free(&node, Duration::from_secs(10)));
    if !free {
        return refuse(&conn, peer, &format!("a node named {node:?} has already joined this job (give each agent its own --node)"));
    }
    let (generation, barrier) = {
        let r = config.restoring.lock().unwrap_or_else(|p| p.into_inner());
        (r.generation, r.barrier.clone())
    };
    if let Ok(here) = reader.local_addr() {
        config.reach.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| here.to_string());
    }
    let restore = match (restart, generation) {
        (false, _) => None,
        (true, Some(g)) => Some(g),
        (true, None) => {
            return refuse(&conn, peer, "this coordinator has no committed generation to restart from (start it with --dir of the job's checkpoint directory)")
        }
    };
    let host = config.starting.lock().unwrap_or_else(|p| p.into_inner()).remove(&node).unwrap_or_else(|| peer.ip().to_string());
    config.hosts.lock().unwrap_or_else(|p| p.into_inner()).insert(node.clone(), host);
    if let Some(addr) = &data {
        config.data_ports.lock().unwrap_or_else(|p| p.into_inner()).insert(node.clone(), addr.clone());
    }
    send_frame(&conn, &Frame::Welcome { restore, local_dir: config.local_dir.clone(), recover: config.recover }).map_err(std::io::Error::other)?;
    // The agent starts or restores its job (heartbeats meanwhile), then says it joined.
    reader.set_read_timeout(Some(crate::wire::LOST_AFTER))?;
    loop {
        match read_frame(&reader) {
            Ok(Frame::Heartbeat) => continue,
            Ok(Frame::Rebuilt) => barrier.arrive(&node, &conn)?,
            Ok(Frame::TcpListening { ends }) => barrier.arrive_listening(&node, &conn, ends)?,
            Ok(Frame::Placed { moved, readdressed }) => barrier.arrive_placed(&node, &conn, moved, readdressed)?,
            Ok(Frame::PartWanted { generation, node: of }) => {
                let answer = where_is_copy(config, generation, &of).unwrap_or_else(|message| Frame::Error { message });
                send_frame(&conn, &answer).map_err(std::io::Error::other)?;
            }
            Ok(Frame::Joined) => break,
            Ok(other) => return refuse(&conn, peer, &format!("expected `joined`, got {other:?}")),
            Err(e) => {
                warn!(node, "agent did not join: {e}");
                return Ok(());
            }
        }
    }
    let agent = RemoteAgent::start(node.clone(), reader, conn.clone(), info.registry.clone(), data)?;
    if let Err(why) = info.registry.join(Box::new(agent)) {
        return refuse(&conn, peer, &why);
    }
    info!(node, pid, peer = %peer, restart, "agent joined");
    info.registry.plan_relay(&node);
    Ok(())
}

/// How long a restarting node waits for the agent of a node that keeps a copy of its part.
const COPY_HOLDER_WAIT: Duration = Duration::from_secs(60);

/// Where `of`'s part of `generation` (the restored one, or one it reads pages from) can be had:
/// the node that keeps a copy and its data port (`part_at`), once its agent has said hello, or
/// with XOR redundancy the members of its group and theirs (`xor_from`), once all have; waits
/// at most [`COPY_HOLDER_WAIT`].
fn where_is_copy(config: &TcpConfig, generation: u64, of: &str) -> Result<Frame, String> {
    let dir = ckpt_core::image::CheckpointDir::open(&config.dir).map_err(|e| e.to_string())?;
    let restoring = config.restoring.lock().unwrap_or_else(|p| p.into_inner()).generation;
    let needed = |r: u64| ckpt_core::image::Manifest::load(&dir.gen_dir(r)).is_ok_and(|m| m.needs.contains(&generation));
    if !restoring.is_some_and(|r| r == generation || needed(r)) {
        return Err(format!("generation {generation} is not the one this coordinator restores, nor one it needs"));
    }
    let gen_dir = dir.gen_dir(generation);
    let manifest = ckpt_core::image::Manifest::load(&gen_dir).map_err(|e| e.to_string())?;
    let holders = manifest.copies.get(of).cloned().unwrap_or_default();
    let group = manifest.xor_group_of(of).map(|(g, _)| g.to_vec());
    if holders.is_empty() && group.is_none() {
        return Err(format!("no node keeps a copy or parity of node {of}'s part of generation {generation} (the job ran without --redundancy)"));
    }
    let deadline = std::time::Instant::now() + COPY_HOLDER_WAIT;
    loop {
        let known = config.data_ports.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((holder, addr)) = holders.iter().find_map(|h| known.get(h).map(|a| (h.clone(), a.clone()))) {
            return Ok(Frame::PartAt { holder, addr });
        }
        if let Some(group) = &group {
            let addrs: Option<Vec<String>> = group.iter().map(|m| if m == of { Some(String::new()) } else { known.get(m).cloned() }).collect();
            if let Some(addrs) = addrs {
                return Ok(Frame::XorFrom { group: group.clone(), addrs });
            }
        }
        if std::time::Instant::now() > deadline {
            let keepers = group.as_ref().map_or(holders.clone(), |g| g.iter().filter(|m| *m != of).cloned().collect());
            return Err(format!(
                "node(s) {} keep a copy or the parity of node {of}'s part, but not all have joined in {} s (restart them too)",
                keepers.join(", "),
                COPY_HOLDER_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn serve_client(
    coord: &SharedCoordinator,
    info: &CoordInfo,
    config: &TcpConfig,
    reader: ChannelReader,
    conn: Arc<Mutex<ChannelWriter>>,
) -> std::io::Result<()> {
    loop {
        let frame = match read_frame(&reader) {
            Ok(f) => f,
            Err(_) => return Ok(()),
        };
        let send = &mut |r: &Response| send_frame(&conn, &Frame::Response(r.clone())).map_err(std::io::Error::other);
        match frame {
            Frame::Heartbeat => {}
            Frame::Request(req) => answer(coord, info, req, send, &mut || wait_closed_tcp(&reader))?,
            Frame::Spawn { host, command } => {
                let reply = match spawn_agent(info, config, &reader, &host, &command) {
                    Ok(node) => Frame::Spawned { node },
                    Err(message) => {
                        warn!(host, "agent-rsh: {message}");
                        Frame::Error { message }
                    }
                };
                send_frame(&conn, &reply).map_err(std::io::Error::other)?;
            }
            other => {
                let _ = send_frame(&conn, &Frame::Error { message: format!("a client cannot send {other:?}") });
                return Ok(());
            }
        }
    }
}

fn wait_closed_tcp(conn: &ChannelReader) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    while read_frame(conn).is_ok() {}
}

/// How long an agent started for `ckpt agent-rsh` may take to join.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts an agent on `host` (through the rsh template) running `command`, as a child of the
/// coordinator, not of the asking process: so the remote node's agent is not inside the asking
/// job's process tree. Returns once it has joined.
fn spawn_agent(info: &CoordInfo, config: &TcpConfig, conn: &ChannelReader, host: &str, command: &[String]) -> Result<String, String> {
    let rsh = config.rsh.as_ref().ok_or("this coordinator cannot start agents (start it with --rsh 'ssh {host}' or similar)")?;
    if host.is_empty() || host.starts_with('-') || !host.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)) {
        return Err(format!("{host:?} is not a host name"));
    }
    if command.is_empty() {
        return Err("no command to run on the host".into());
    }
    if !info.registry.is_free(host) {
        return Err(format!("a node named {host:?} has already joined this job"));
    }
    // The address the asker reached us at is one the remote host can reach too (unlike
    // 0.0.0.0 given to --listen).
    let addr = conn.local_addr().map_err(|e| e.to_string())?.to_string();
    let argv = rsh.argv(host, &addr, command);
    info!(host, ?argv, "starting an agent for agent-rsh");
    config.starting_on(host, host);
    let mut child =
        std::process::Command::new(&argv[0]).args(&argv[1..]).stdin(std::process::Stdio::null()).spawn().map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    let start = Instant::now();
    let outcome = loop {
        if info.registry.wait_for(host, Duration::from_millis(100)) {
            break Ok(host.to_string());
        }
        if let Ok(Some(status)) = child.try_wait() {
            break Err(format!("the agent for {host} ended ({status}) before joining: `{}`", argv.join(" ")));
        }
        if start.elapsed() > SPAWN_TIMEOUT {
            let _ = child.kill();
            break Err(format!("the agent for {host} did not join within {SPAWN_TIMEOUT:?}: `{}`", argv.join(" ")));
        }
    };
    // Reap it whenever it ends.
    let _ = std::thread::Builder::new().name("ckpt-rsh-reaper".into()).spawn(move || {
        let _ = child.wait();
    });
    outcome
}

/// Starts, through the rsh template, a restart of node `node`'s part on `host`, joined to this
/// coordinator (a recovery's lost node on a spare or a survivor, `--restart-on`). Does not wait
/// for it to join.
pub fn start_restart(config: &TcpConfig, host: &str, node: &str) -> Result<(), String> {
    let rsh = config.rsh.as_ref().ok_or("this coordinator cannot start agents (start it with --rsh 'ssh {host}' or similar)")?;
    let addr = config
        .reach
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or("no agent has reached this coordinator yet: its address for the spare is unknown")?;
    let argv = rsh.restart_argv(host, &addr, node);
    info!(host, node, ?argv, "starting a restart on another host");
    config.starting_on(node, host);
    let mut child =
        std::process::Command::new(&argv[0]).args(&argv[1..]).stdin(std::process::Stdio::null()).spawn().map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    let (host, node) = (host.to_string(), node.to_string());
    let _ = std::thread::Builder::new().name("ckpt-rsh-reaper".into()).spawn(move || match child.wait() {
        Ok(s) if s.success() => info!(host, node, "the restart on another host has ended"),
        Ok(s) => warn!(host, node, "the restart on another host has ended: {s}"),
        Err(e) => warn!(host, node, "the restart on another host: {e}"),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rsh_command_line() {
        let rsh = RshConfig { template: "ssh {host}".into(), exe: "/usr/bin/ckpt".into(), dir: "/shared/d".into() };
        let argv = rsh.argv("n1", "10.0.0.1:7070", &["/bin/sh".into(), "-c".into(), "orted -mca x".into()]);
        assert_eq!(argv, ["ssh", "n1", "/usr/bin/ckpt launch --coord 10.0.0.1:7070 --node n1 --dir /shared/d -- /bin/sh -c 'orted -mca x'"]);
        assert_eq!(
            rsh.restart_argv("spare1", "10.0.0.1:7070", "n2"),
            ["ssh", "spare1", "/usr/bin/ckpt restart --coord 10.0.0.1:7070 --node n2 --dir /shared/d"]
        );
    }
}
