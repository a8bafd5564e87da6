//! The coordinator's side of a relay (docs/PLAN-SCALE.md, "relays"): one connection that
//! carries the commands, replies and heartbeats of a group of agents, each of which joined on
//! its own connection and keeps it for what is rare and per node (the restart's barriers,
//! `ended`, `flushed`, `recover`, parts wanted).
//!
//! Why: a coordinator that exchanges every message with every agent spends its CPU per agent,
//! about 15 us a message (a checkpoint is 12 messages an agent, idleness 2 a second):
//! 4,096 agents cost it 0.7 s of CPU a checkpoint and 9-17 % of a core idle
//! (docs/bench-coord-scale.md). Behind relays of 64 agents it exchanges one message a phase
//! with each relay.
//!
//! Nothing is lost with a relay: an agent attached to one is still joined on its own
//! connection, which the coordinator reads without the heartbeat timeout while the relay
//! answers for the agent's life. When the relay's connection ends, its agents are detached:
//! back in the pulse and under the timeout, reached directly; a phase that waited for one of
//! them fails as a phase does when an agent is lost (the generation is tried again), and no
//! node is lost for it.

use std::collections::HashSet;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

use crate::coordinator::Registry;
use crate::remote::send_frame;
use crate::secure::{ChannelReader, ChannelWriter};
use crate::wire::{read_frame, AgentCommand, AgentReply, Frame, WireError, LOST_AFTER};

/// How long an attached agent's own connection may be silent before its reading thread looks
/// again: its relay answers for its life meanwhile, so the thread wakes rarely. A detached
/// agent's connection is read under [`LOST_AFTER`] again.
pub const ATTACHED_SILENCE: Duration = Duration::from_secs(30);

/// Whether silence on an agent's own connection is expected, on either side of it: while the
/// agent is attached to a relay (which carries the heartbeats), and for [`LOST_AFTER`] after
/// it is detached, since a read begun while attached keeps its longer timeout and the
/// heartbeats take a moment to come back on the own connection.
#[derive(Default)]
pub struct Quiet {
    attached: AtomicBool,
    detached_at: Mutex<Option<std::time::Instant>>,
}

impl Quiet {
    pub fn set_attached(&self, attached: bool) {
        self.attached.store(attached, Relaxed);
        if !attached {
            *self.detached_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        }
    }

    pub fn attached(&self) -> bool {
        self.attached.load(Relaxed)
    }

    /// A read of the own connection that timed out now is no sign of a loss.
    pub fn excuses_silence(&self) -> bool {
        self.attached() || self.detached_at.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| t.elapsed() < LOST_AFTER)
    }
}

/// Writes `frame` on `writer`, waiting at most `limit` for room (a peer that stopped reading
/// must not hold the writer, or the locks of whoever waits on it, for ever).
pub fn send_frame_within(writer: &Mutex<ChannelWriter>, frame: &Frame, limit: Duration) -> Result<(), WireError> {
    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
    let _ = w.set_write_timeout(Some(limit));
    let sent = crate::wire::write_frame(&mut *w, frame);
    let _ = w.set_write_timeout(None);
    sent
}

/// What the coordinator keeps of an agent joined over TCP, for a relay to reach it: where its
/// replies go, whether it is alive, the relay it is attached to, and its own connection.
#[derive(Clone)]
pub struct AgentSide {
    pub replies: mpsc::Sender<Result<AgentReply, String>>,
    pub alive: Arc<AtomicBool>,
    /// The relay it is attached to, if any.
    pub via: Arc<Mutex<Option<Arc<RelayLink>>>>,
    /// Whether it is attached (then left out of the coordinator's pulse), and so whether its
    /// own connection's silence is expected.
    pub quiet: Arc<Quiet>,
    /// Its own connection: its read timeout, its shutdown.
    pub conn: Arc<ChannelReader>,
}

impl AgentSide {
    fn is_via(&self, link: &Arc<RelayLink>) -> bool {
        self.via.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|l| Arc::ptr_eq(l, link))
    }

    /// Attaches the agent to `link`.
    pub(crate) fn attach(&self, link: &Arc<RelayLink>) -> std::io::Result<()> {
        let mut via = self.via.lock().unwrap_or_else(|p| p.into_inner());
        // One relay at a time: another may not take over an agent that waits on the first.
        if let Some(other) = via.as_ref().filter(|l| l.alive() && !Arc::ptr_eq(l, link)) {
            return Err(std::io::Error::other(format!("it is attached to the relay of node {} already", other.node)));
        }
        self.conn.set_read_timeout(Some(ATTACHED_SILENCE))?;
        *via = Some(link.clone());
        self.quiet.set_attached(true);
        Ok(())
    }

    /// Takes the agent back from `link` (if it is attached there); `failed`: the reply to a
    /// command of that generation will not come, and why. That answer is a passing failure:
    /// the agent is there, reached directly from now on, and the coordinator lets the job go
    /// and tries the checkpoint again, as for a state the job leaves by itself.
    pub(crate) fn detach(&self, link: &Arc<RelayLink>, failed: Option<(u64, String)>) {
        if !self.is_via(link) {
            return;
        }
        *self.via.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.quiet.set_attached(false);
        let _ = self.conn.set_read_timeout(Some(LOST_AFTER));
        if let Some((generation, message)) = failed {
            let _ = self.replies.send(Ok(AgentReply::Failed { generation, message, passing: true }));
        }
    }

    /// A reply that came through `link`.
    pub(crate) fn relayed_reply(&self, link: &Arc<RelayLink>, reply: AgentReply) {
        if self.is_via(link) {
            let _ = self.replies.send(Ok(reply));
        }
    }

    /// The relay gave the agent up: it is lost as if its own connection had gone silent. Its
    /// connection is shut down, so that its reading thread frees the node (as lost) and a
    /// stalled agent that wakes up finds it closed.
    pub(crate) fn lost(&self, link: &Arc<RelayLink>, why: String) {
        if !self.is_via(link) {
            return;
        }
        self.alive.store(false, Relaxed);
        let _ = self.replies.send(Err(why));
        let _ = self.conn.shutdown(Shutdown::Both);
    }
}

/// A relay's connection to the coordinator.
pub struct RelayLink {
    /// The node whose agent runs the relay.
    node: String,
    writer: Arc<Mutex<ChannelWriter>>,
    alive: Arc<AtomicBool>,
    /// The nodes attached through it.
    attached: Mutex<Vec<String>>,
    /// Nodes sent a command through it and not answered yet, with the command's generation.
    pending: Mutex<std::collections::HashMap<String, u64>>,
}

impl RelayLink {
    /// Takes over the connection of a relay that has said hello (as `node`'s); a thread reads
    /// its frames until it ends or goes silent for [`LOST_AFTER`], then detaches its agents.
    pub fn start(node: String, reader: ChannelReader, writer: Arc<Mutex<ChannelWriter>>, registry: Arc<Registry>) -> std::io::Result<Arc<RelayLink>> {
        reader.set_read_timeout(Some(LOST_AFTER))?;
        let link = Arc::new(RelayLink {
            node: node.clone(),
            writer: writer.clone(),
            alive: Arc::new(AtomicBool::new(true)),
            attached: Mutex::new(Vec::new()),
            pending: Mutex::new(std::collections::HashMap::new()),
        });
        registry.pulse.add(&writer, &link.alive, None)?;
        let l = link.clone();
        std::thread::Builder::new().name(format!("ckpt-relay-{node}")).spawn(move || {
            let why = loop {
                match read_frame(&reader) {
                    Ok(Frame::Heartbeat) => {}
                    Ok(Frame::Attached { node }) => match registry.side(&node) {
                        Some(side) if side.alive.load(Relaxed) => match side.attach(&l) {
                            Ok(()) => {
                                l.attached.lock().unwrap_or_else(|p| p.into_inner()).push(node);
                            }
                            Err(e) => warn!(relay = l.node, node, "cannot attach: {e}"),
                        },
                        _ => warn!(relay = l.node, node, "attached a node that has no agent joined here"),
                    },
                    Ok(Frame::Replies { replies }) => {
                        let mut pending = l.pending.lock().unwrap_or_else(|p| p.into_inner());
                        for r in replies {
                            // Only a reply that was asked for: a relay answers for its own
                            // agents, once a command.
                            if pending.remove(&r.node).is_some() {
                                if let Some(side) = registry.side(&r.node) {
                                    side.relayed_reply(&l, r.reply);
                                }
                            }
                        }
                    }
                    Ok(Frame::Detached { node, why }) => {
                        let waited = l.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&node);
                        l.attached.lock().unwrap_or_else(|p| p.into_inner()).retain(|n| *n != node);
                        if let Some(side) = registry.side(&node) {
                            info!(relay = l.node, node, "agent detached by its relay: {why}");
                            side.detach(&l, waited.map(|g| (g, format!("its relay (node {}) lost its connection to it: {why}", l.node))));
                        }
                    }
                    Ok(Frame::Lost { node, why }) => {
                        l.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&node);
                        l.attached.lock().unwrap_or_else(|p| p.into_inner()).retain(|n| *n != node);
                        if let Some(side) = registry.side(&node) {
                            warn!(relay = l.node, node, "agent lost, says its relay: {why}");
                            side.lost(&l, format!("its relay (node {}) lost it: {why}", l.node));
                        }
                    }
                    Ok(other) => break format!("unexpected message {other:?}"),
                    Err(WireError::Closed) => break "its connection closed".to_string(),
                    Err(e) => break e.to_string(),
                }
            };
            // Under the lock `fanout` takes: a command is either sent before this (and its
            // node failed below) or refused (and never waited for).
            let pending = {
                let mut pending = l.pending.lock().unwrap_or_else(|p| p.into_inner());
                l.alive.store(false, Relaxed);
                std::mem::take(&mut *pending)
            };
            let _ = reader.shutdown(Shutdown::Both);
            let attached = std::mem::take(&mut *l.attached.lock().unwrap_or_else(|p| p.into_inner()));
            warn!(relay = l.node, agents = attached.len(), "relay lost: {why}; its agents are reached on their own connections again");
            for node in attached {
                if let Some(side) = registry.side(&node) {
                    let failed = pending.get(&node).map(|&g| (g, format!("its relay (node {}) was lost: {why}", l.node)));
                    side.detach(&l, failed);
                }
            }
        })?;
        info!(relay = node, "relay joined");
        Ok(link)
    }

    /// The node whose agent runs the relay.
    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    /// Sends `cmd` to each of `nodes` (attached here) in one frame. Ok: exactly one answer
    /// comes to each node's reply channel, its reply or why it will not come (a write that
    /// fails shuts the connection, and its reading thread fails every node still waiting).
    /// Err: the relay is gone, nothing was sent, and nothing will come.
    pub fn fanout(&self, nodes: Vec<String>, cmd: AgentCommand) -> Result<(), WireError> {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if !self.alive() {
                return Err(WireError::Closed);
            }
            pending.extend(nodes.iter().map(|n| (n.clone(), cmd.generation())));
        }
        if let Err(e) = send_frame_within(&self.writer, &Frame::Fanout { nodes, cmd }, LOST_AFTER) {
            warn!(relay = self.node, "a command to the relay: {e}");
            let _ = self.writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
        }
        Ok(())
    }
}

/// Which agents serve as relays and which use them: groups of `every` in the order they
/// joined, the first of each its relay. A job of at most `every` agents has none (each agent
/// talks to the coordinator itself, as before relays); the agent that makes it one more starts
/// them, for the groups formed so far too. A group whose relay leaves keeps its agents on their
/// own connections.
#[derive(Default)]
pub struct RelayPlan {
    pub(crate) every: usize,
    groups: Vec<RelayGroup>,
    active: bool,
}

struct RelayGroup {
    relay: String,
    members: Vec<String>,
    /// Where its relay listens, once it said.
    addr: Option<String>,
    /// Its relay left: none for the group.
    gone: bool,
}

impl RelayPlan {
    /// `node` joined: what to tell whom.
    pub(crate) fn joined(&mut self, node: &str) -> Vec<(String, Frame)> {
        if self.every == 0 {
            return Vec::new();
        }
        match self.groups.last_mut() {
            Some(g) if !g.gone && g.members.len() < self.every => g.members.push(node.into()),
            _ => self.groups.push(RelayGroup { relay: node.into(), members: vec![node.into()], addr: None, gone: false }),
        }
        let joined: usize = self.groups.iter().map(|g| g.members.len()).sum();
        if !self.active {
            if joined <= self.every {
                return Vec::new();
            }
            self.active = true;
            return self.groups.iter().map(|g| (g.relay.clone(), Frame::RelayServe)).collect();
        }
        let g = self.groups.last().expect("pushed above");
        if g.relay == node {
            vec![(node.into(), Frame::RelayServe)]
        } else if let (Some(addr), false) = (&g.addr, g.gone) {
            vec![(node.into(), Frame::UseRelay { addr: addr.clone() })]
        } else {
            Vec::new()
        }
    }

    /// The relay of `node` listens at `addr`: its group's other agents are told.
    pub(crate) fn ready(&mut self, node: &str, addr: String) -> Vec<(String, Frame)> {
        let Some(g) = self.groups.iter_mut().find(|g| g.relay == node && !g.gone) else { return Vec::new() };
        g.addr = Some(addr.clone());
        g.members.iter().filter(|m| **m != g.relay).map(|m| (m.clone(), Frame::UseRelay { addr: addr.clone() })).collect()
    }

    /// A group whose relay left takes no one new (its agents stay on their own connections):
    /// after a recovery, the nodes that join again form new groups.
    pub(crate) fn left(&mut self, node: &str) {
        for g in &mut self.groups {
            g.members.retain(|m| m != node);
            if g.relay == node {
                g.gone = true;
            }
        }
        self.groups.retain(|g| !(g.gone && g.members.is_empty()));
    }
}

/// The relay's side, run by the agent the coordinator asked `relay_serve`: it listens for the
/// agents of its group (the job's handshake), says `attached` upstream for each, sends each
/// `fanout`'s command to the nodes it names and answers once with every reply, pulses its
/// agents and gives one up (`lost`) that is silent for [`LOST_AFTER`]. When its connection to
/// the coordinator ends, it closes its agents' connections: they go back to their own.
pub struct RelayServer {
    pub port: u16,
    state: Arc<RelayState>,
}

impl Drop for RelayServer {
    /// The relay ends with the agent that serves it (its job ended, or it restarts after a
    /// recovery): its connection upstream is shut, and so its agents' connections.
    fn drop(&mut self) {
        let _ = self.state.up.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
    }
}

/// One agent attached to a relay.
struct Downstream {
    writer: Arc<Mutex<ChannelWriter>>,
    alive: Arc<AtomicBool>,
}

/// What a relay holds: its agents, the command under way, and its connection upstream.
struct RelayState {
    node: String,
    up: Arc<Mutex<ChannelWriter>>,
    up_alive: Arc<AtomicBool>,
    agents: Mutex<std::collections::HashMap<String, Downstream>>,
    /// The nodes of the `fanout` under way that have not answered, and the replies so far.
    round: Mutex<(HashSet<String>, Vec<crate::wire::NodeReply>)>,
    pulse: crate::remote::Pulse,
}

impl RelayState {
    /// Sends the round's replies upstream once no node of it is left to answer.
    fn finish_round_if_done(&self, round: &mut (HashSet<String>, Vec<crate::wire::NodeReply>)) {
        if round.0.is_empty() && !round.1.is_empty() {
            let replies = std::mem::take(&mut round.1);
            let _ = send_frame(&self.up, &Frame::Replies { replies });
        }
    }

    /// The relay lets `node`'s agent go, and the round goes on without it. `silent`: it was
    /// silent for the heartbeat timeout, and is `lost` upstream (only the relay hears its
    /// heartbeats); otherwise its connection here ended or broke, and it is `detached`
    /// upstream: its own connection tells the coordinator whether it is still there.
    fn let_go(&self, node: &str, why: String, silent: bool) {
        if let Some(d) = self.agents.lock().unwrap_or_else(|p| p.into_inner()).remove(node) {
            d.alive.store(false, Relaxed);
            let _ = d.writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
        }
        let frame = if silent { Frame::Lost { node: node.into(), why } } else { Frame::Detached { node: node.into(), why } };
        let _ = send_frame(&self.up, &frame);
        let mut round = self.round.lock().unwrap_or_else(|p| p.into_inner());
        if round.0.remove(node) {
            self.finish_round_if_done(&mut round);
        }
    }

    fn fanout(&self, nodes: Vec<String>, cmd: AgentCommand) {
        // Every node waited for before any is sent the command (a quick reply finds its node
        // there); the sends then hold no lock, each bounded, so that an agent that stopped
        // reading holds up neither the others' replies nor its own loss.
        let writers: Vec<(String, Option<Arc<Mutex<ChannelWriter>>>)> = {
            let agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
            nodes
                .into_iter()
                .map(|n| {
                    let w = agents.get(&n).map(|d| d.writer.clone());
                    (n, w)
                })
                .collect()
        };
        self.round.lock().unwrap_or_else(|p| p.into_inner()).0.extend(writers.iter().filter(|(_, w)| w.is_some()).map(|(n, _)| n.clone()));
        for (node, writer) in writers {
            let sent = writer.map(|w| send_frame_within(&w, &Frame::Command(cmd.clone()), LOST_AFTER));
            match sent {
                Some(Ok(())) => {}
                Some(Err(e)) => self.let_go(&node, format!("the relay cannot send it a command: {e}"), false),
                None => self.let_go(&node, "not attached to its relay (any more)".into(), false),
            }
        }
    }
}

impl RelayServer {
    /// Starts the relay of `node`'s agent: listens on `bind` (port 0: any), joins the
    /// coordinator at `coord` as a relay. Its threads end with its connection upstream, which
    /// dropping it shuts.
    pub fn start(coord: &str, secret: &str, node: &str, bind: std::net::IpAddr) -> Result<RelayServer, crate::remote::RemoteError> {
        let listener = std::net::TcpListener::bind((bind, 0)).map_err(|error| crate::remote::RemoteError::Connect { addr: format!("{bind}:0"), error })?;
        let port = listener.local_addr().map_err(|error| crate::remote::RemoteError::Connect { addr: format!("{bind}:0"), error })?.port();
        let channel = crate::remote::connect(coord, secret, crate::wire::Role::Relay { node: node.into() })?;
        let (up_reader, up_writer) = channel.split();
        let state = Arc::new(RelayState {
            node: node.into(),
            up: Arc::new(Mutex::new(up_writer)),
            up_alive: Arc::new(AtomicBool::new(true)),
            agents: Mutex::new(std::collections::HashMap::new()),
            round: Mutex::new((HashSet::new(), Vec::new())),
            pulse: crate::remote::Pulse::default(),
        });
        let io = |error| crate::remote::RemoteError::Connect { addr: coord.into(), error };
        state.pulse.add(&state.up, &state.up_alive, None).map_err(io)?;
        up_reader.set_read_timeout(Some(LOST_AFTER)).map_err(io)?;
        let key = crate::secure::Key::from_secret(secret);
        {
            let state = state.clone();
            let wake = std::net::SocketAddr::new(bind, port);
            std::thread::Builder::new().name("ckpt-relay-up".into()).spawn(move || relay_upstream(state, up_reader, wake)).map_err(io)?;
        }
        {
            let state = state.clone();
            std::thread::Builder::new().name("ckpt-relay-accept".into()).spawn(move || relay_accept(state, key, listener)).map_err(io)?;
        }
        info!(node, port, "serving as a relay");
        Ok(RelayServer { port, state })
    }
}

/// The relay's connection to the coordinator: commands in, until it ends; then its agents'
/// connections are closed, and its listener (woken by a connection of its own).
fn relay_upstream(state: Arc<RelayState>, up: ChannelReader, wake: std::net::SocketAddr) {
    let why = loop {
        match read_frame(&up) {
            Ok(Frame::Heartbeat) => {}
            Ok(Frame::Fanout { nodes, cmd }) => state.fanout(nodes, cmd),
            Ok(other) => break format!("unexpected message {other:?}"),
            Err(e) => break e.to_string(),
        }
    };
    warn!(relay = state.node, "the relay lost the coordinator ({why}); its agents go back to their own connections");
    state.up_alive.store(false, Relaxed);
    for (_, d) in state.agents.lock().unwrap_or_else(|p| p.into_inner()).drain() {
        d.alive.store(false, Relaxed);
        let _ = d.writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
    }
    let _ = std::net::TcpStream::connect_timeout(&wake, Duration::from_secs(1));
}

/// Takes the group's agents as they come (each its handshake and `hello` on a thread of its
/// own, at most [`crate::secure::Gate`]'s number at once), until the relay's connection
/// upstream ends.
fn relay_accept(state: Arc<RelayState>, key: crate::secure::Key, listener: std::net::TcpListener) {
    let (key, gate) = (Arc::new(key), crate::secure::Gate::new());
    for conn in listener.incoming() {
        if !state.up_alive.load(Relaxed) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let Ok(pass) = gate.enter(&conn) else { continue };
        let (state, key) = (state.clone(), key.clone());
        let _ = std::thread::Builder::new().name("ckpt-relay-conn".into()).spawn(move || {
            let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            if let Err(e) = relay_downstream(&state, &key, conn, pass) {
                warn!(relay = state.node, peer, "an agent's connection to the relay: {e}");
            }
        });
    }
}

/// One agent of the group: its hello, `attached` upstream, `joined` to it, then its replies
/// and heartbeats until it ends or goes silent (then it is `lost` upstream).
fn relay_downstream(state: &Arc<RelayState>, key: &crate::secure::Key, conn: std::net::TcpStream, pass: crate::secure::Pass) -> std::io::Result<()> {
    let _ = conn.set_nodelay(true);
    let channel = crate::secure::accept(conn, key)?;
    drop(pass);
    let (reader, writer) = channel.split();
    let writer = Arc::new(Mutex::new(writer));
    reader.set_read_timeout(Some(Duration::from_secs(10)))?;
    let node = match read_frame(&reader) {
        Ok(Frame::Hello { role: crate::wire::Role::Agent { node, .. } }) => node,
        Ok(_) => {
            let _ = send_frame(&writer, &Frame::Error { message: "a relay takes agents only".into() });
            return Ok(());
        }
        Err(e) => return Err(std::io::Error::other(format!("no hello: {e}"))),
    };
    let alive = Arc::new(AtomicBool::new(true));
    {
        let mut agents = state.agents.lock().unwrap_or_else(|p| p.into_inner());
        if !state.up_alive.load(Relaxed) {
            let _ = send_frame(&writer, &Frame::Error { message: "this relay has lost the coordinator".into() });
            return Ok(());
        }
        if let Some(old) = agents.insert(node.clone(), Downstream { writer: writer.clone(), alive: alive.clone() }) {
            old.alive.store(false, Relaxed);
            let _ = old.writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
        }
    }
    send_frame(&state.up, &Frame::Attached { node: node.clone() }).map_err(std::io::Error::other)?;
    send_frame(&writer, &Frame::Joined).map_err(std::io::Error::other)?;
    state.pulse.add(&writer, &alive, None)?;
    reader.set_read_timeout(Some(LOST_AFTER))?;
    let why = loop {
        match read_frame(&reader) {
            Ok(Frame::Heartbeat) => {}
            Ok(Frame::Reply(reply)) => {
                let mut round = state.round.lock().unwrap_or_else(|p| p.into_inner());
                if round.0.remove(&node) {
                    round.1.push(crate::wire::NodeReply { node: node.clone(), reply });
                    state.finish_round_if_done(&mut round);
                }
            }
            Ok(other) => break (format!("unexpected message {other:?}"), false),
            // Only the relay hears its heartbeats: silence is a loss. An agent whose
            // connection here ends (it ended, or gave up attaching) closes or keeps its own,
            // which tells the coordinator.
            Err(WireError::Silent(_)) => break ("silent for the heartbeat timeout".to_string(), true),
            Err(WireError::Closed) => break ("its connection to the relay closed".to_string(), false),
            Err(e) => break (e.to_string(), false),
        }
    };
    // Replaced by a newer connection of the same node, or the relay is ending: nothing to say.
    let current = state.agents.lock().unwrap_or_else(|p| p.into_inner()).get(&node).is_some_and(|d| Arc::ptr_eq(&d.alive, &alive));
    if current && state.up_alive.load(Relaxed) {
        let (why, silent) = why;
        if silent {
            warn!(relay = state.node, node, "agent lost: {why}");
        }
        state.let_go(&node, why, silent);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::AgentHandle;
    use crate::remote::tests::channel_pair;
    use crate::remote::RemoteAgent;
    use crate::secure::ChannelReader;
    use crate::wire::{NodeReply, WireError};

    /// An agent joined over TCP: the coordinator's handle and the agent's end of its own
    /// connection.
    fn joined(registry: &Arc<Registry>, node: &str) -> (RemoteAgent, ChannelReader, Arc<Mutex<ChannelWriter>>) {
        let (coord, agent) = channel_pair();
        let (reader, writer) = coord.split();
        let handle = RemoteAgent::start(node.into(), reader, Arc::new(Mutex::new(writer)), registry.clone(), None).unwrap();
        let (r, w) = agent.split();
        (handle, r, Arc::new(Mutex::new(w)))
    }

    /// The relay's end of a relay connection (and the coordinator's link).
    fn relay(registry: &Arc<Registry>, node: &str) -> (Arc<RelayLink>, ChannelReader, Arc<Mutex<ChannelWriter>>) {
        let (coord, relay) = channel_pair();
        let (reader, writer) = coord.split();
        let link = RelayLink::start(node.into(), reader, Arc::new(Mutex::new(writer)), registry.clone()).unwrap();
        let (r, w) = relay.split();
        r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (link, r, Arc::new(Mutex::new(w)))
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The next frame that is not a heartbeat.
    fn next(reader: &ChannelReader) -> Frame {
        loop {
            match read_frame(reader) {
                Ok(Frame::Heartbeat) => continue,
                other => return other.unwrap(),
            }
        }
    }

    fn done(node: &str, generation: u64) -> NodeReply {
        NodeReply { node: node.into(), reply: AgentReply::Done { generation } }
    }

    /// One command for two agents goes to their relay once, and each gets its own reply; a
    /// relay that ends with one reply still owed fails that agent's wait and gives both back to
    /// their own connections, where the coordinator's heartbeats come again; nobody is lost.
    #[test]
    fn a_relay_carries_its_agents_commands_and_gives_them_back_when_it_ends() {
        let registry = Arc::new(Registry::default());
        let (mut a, a_conn, _aw) = joined(&registry, "a");
        let (mut b, _b_conn, _bw) = joined(&registry, "b");
        let (link, relay_in, relay_out) = relay(&registry, "a");
        for n in ["a", "b"] {
            send_frame(&relay_out, &Frame::Attached { node: n.into() }).unwrap();
        }
        wait_until("both attached", || a.relay().is_some() && b.relay().is_some());

        link.fanout(vec!["a".into(), "b".into()], AgentCommand::Persist { generation: 3 }).unwrap();
        match next(&relay_in) {
            Frame::Fanout { nodes, cmd } => {
                assert_eq!(nodes, ["a", "b"]);
                assert_eq!(cmd, AgentCommand::Persist { generation: 3 });
            }
            other => panic!("the relay got {other:?}"),
        }
        // A reply for a node that was not asked is not taken.
        let stray = NodeReply { node: "c".into(), reply: AgentReply::Done { generation: 3 } };
        send_frame(&relay_out, &Frame::Replies { replies: vec![done("b", 3), stray, done("a", 3)] }).unwrap();
        assert_eq!(a.reply().unwrap(), AgentReply::Done { generation: 3 });
        assert_eq!(b.reply().unwrap(), AgentReply::Done { generation: 3 });

        // Attached, an agent's own connection gets no heartbeats (those sent before are read
        // first).
        a_conn.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        while matches!(read_frame(&a_conn), Ok(Frame::Heartbeat)) {}
        a_conn.set_read_timeout(Some(Duration::from_millis(2500))).unwrap();
        assert!(matches!(read_frame(&a_conn), Err(WireError::Silent(_))), "heartbeats to an attached agent");

        link.fanout(vec!["a".into(), "b".into()], AgentCommand::Commit { generation: 3, flush: None }).unwrap();
        assert!(matches!(next(&relay_in), Frame::Fanout { .. }));
        send_frame(&relay_out, &Frame::Replies { replies: vec![done("a", 3)] }).unwrap();
        relay_out.lock().unwrap().shutdown(Shutdown::Both).unwrap();
        assert_eq!(a.reply().unwrap(), AgentReply::Done { generation: 3 });
        // b is there, reached directly from now on: a passing failure, the checkpoint is
        // tried again.
        match b.reply().unwrap() {
            AgentReply::Failed { generation: 3, message, passing: true } => assert!(message.contains("its relay (node a) was lost"), "{message}"),
            other => panic!("b answered {other:?}"),
        }
        wait_until("both detached", || a.relay().is_none() && b.relay().is_none());
        assert!(a.alive() && b.alive());
        assert!(matches!(read_frame(&a_conn), Ok(Frame::Heartbeat)), "no heartbeats after the relay ended");
        assert!(link.fanout(vec!["a".into()], AgentCommand::Abort { generation: 3 }).is_err());
        assert!(registry.take_lost().is_empty());
    }

    /// A second relay cannot take over an agent attached to a live one (whose reply it would
    /// never see); the agent is still the first's.
    #[test]
    fn an_attached_agent_is_not_taken_over_by_another_relay() {
        let registry = Arc::new(Registry::default());
        let (a, _a_conn, _aw) = joined(&registry, "a");
        let (first, _in1, out1) = relay(&registry, "a");
        send_frame(&out1, &Frame::Attached { node: "a".into() }).unwrap();
        wait_until("attached", || a.relay().is_some());
        let (_second, _in2, out2) = relay(&registry, "a");
        send_frame(&out2, &Frame::Attached { node: "a".into() }).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(a.relay().is_some_and(|l| Arc::ptr_eq(&l, &first)));
    }

    /// Silence on an agent's own connection is expected while it is attached and for a
    /// timeout's length after, not later.
    #[test]
    fn silence_is_excused_while_attached_and_briefly_after() {
        let quiet = Quiet::default();
        assert!(!quiet.excuses_silence());
        quiet.set_attached(true);
        assert!(quiet.excuses_silence());
        quiet.set_attached(false);
        assert!(quiet.excuses_silence(), "just detached");
        *quiet.detached_at.lock().unwrap() = Some(std::time::Instant::now() - LOST_AFTER);
        assert!(!quiet.excuses_silence());
    }

    /// Relays start when the job has more than `every` agents, for the groups formed so far
    /// too; a group's agents are told its relay's address once it has one; a group whose relay
    /// left gets none.
    #[test]
    fn relays_begin_when_the_job_outgrows_one_group() {
        let mut plan = RelayPlan { every: 2, ..RelayPlan::default() };
        let names = |told: Vec<(String, Frame)>| told.into_iter().map(|(n, f)| format!("{n}:{f:?}")).collect::<Vec<_>>();
        assert!(plan.joined("a").is_empty());
        assert!(plan.joined("b").is_empty());
        assert_eq!(names(plan.joined("c")), ["a:RelayServe", "c:RelayServe"]);
        assert_eq!(names(plan.ready("a", "10.0.0.1:7000".into())), ["b:UseRelay { addr: \"10.0.0.1:7000\" }"]);
        assert!(plan.joined("d").is_empty(), "c's relay has no address yet");
        assert_eq!(names(plan.ready("c", "10.0.0.3:7000".into())), ["d:UseRelay { addr: \"10.0.0.3:7000\" }"]);
        assert_eq!(names(plan.joined("e")), ["e:RelayServe"]);
        plan.left("e");
        assert!(plan.ready("e", "10.0.0.5:7000".into()).is_empty());
        assert_eq!(names(plan.joined("f")), ["f:RelayServe"], "e's group is gone: f begins another");
        // Everyone leaves (a recovery) and joins again: new groups, new relays.
        for n in ["a", "b", "c", "d", "f"] {
            plan.left(n);
        }
        assert_eq!(names(plan.joined("a")), ["a:RelayServe"]);
        assert!(plan.joined("b").is_empty());
        assert!(RelayPlan::default().joined("a").is_empty(), "relays are off by default");
    }

    /// An agent whose connection to its relay ended while a command waited (it failed to
    /// attach, or ended) is detached, not lost: a passing failure, and its own connection is
    /// heard again.
    #[test]
    fn an_agent_its_relay_lost_the_connection_to_is_detached_not_lost() {
        let registry = Arc::new(Registry::default());
        let (mut a, _a_conn, _aw) = joined(&registry, "a");
        let (link, relay_in, relay_out) = relay(&registry, "a");
        send_frame(&relay_out, &Frame::Attached { node: "a".into() }).unwrap();
        wait_until("attached", || a.relay().is_some());
        link.fanout(vec!["a".into()], AgentCommand::Freeze { generation: 4 }).unwrap();
        assert!(matches!(next(&relay_in), Frame::Fanout { .. }));
        send_frame(&relay_out, &Frame::Detached { node: "a".into(), why: "broken pipe".into() }).unwrap();
        assert!(matches!(a.reply().unwrap(), AgentReply::Failed { generation: 4, passing: true, .. }));
        wait_until("detached", || a.relay().is_none());
        assert!(a.alive());
        assert!(registry.take_lost().is_empty());
    }

    /// An agent its relay gives up is lost, as one silent on its own connection is: its node
    /// is freed, counted lost, and its connection shut.
    #[test]
    fn an_agent_its_relay_gives_up_is_lost() {
        let registry = Arc::new(Registry::default());
        let (mut a, a_conn, _aw) = joined(&registry, "a");
        let (_b, _b_conn, _bw) = joined(&registry, "b");
        let (link, relay_in, relay_out) = relay(&registry, "b");
        send_frame(&relay_out, &Frame::Attached { node: "a".into() }).unwrap();
        wait_until("attached", || a.relay().is_some());
        link.fanout(vec!["a".into()], AgentCommand::Release { generation: 5, hold: false }).unwrap();
        assert!(matches!(next(&relay_in), Frame::Fanout { .. }));
        send_frame(&relay_out, &Frame::Lost { node: "a".into(), why: "silent for 3 s".into() }).unwrap();
        let err = a.reply().unwrap_err();
        assert!(err.why.contains("lost it: silent for 3 s"), "{err}");
        let lost = Mutex::new(Vec::new());
        wait_until("a counted lost", || {
            lost.lock().unwrap().extend(registry.take_lost());
            !lost.lock().unwrap().is_empty()
        });
        assert_eq!(*lost.lock().unwrap(), ["a"]);
        assert!(!a.alive());
        a_conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let closed = (0..3).map(|_| read_frame(&a_conn)).any(|r| matches!(r, Err(WireError::Closed)));
        assert!(closed, "the lost agent's own connection stayed open");
    }
}
