//! The TCP side of the coordinator: an agent at the other end of a connection as an
//! [`AgentHandle`], and the client calls (`request`, `spawn`) that agents, `ckpt checkpoint
//! --coord` and `ckpt agent-rsh` make. Every connection is opened by the handshake of
//! [`crate::secure`].

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use crate::coordinator::{AgentHandle, AgentLost, Registry};
use crate::messages::{Request, Response};
use crate::relay::{AgentSide, Quiet, RelayLink};
use crate::secure::{self, Channel, ChannelReader, ChannelWriter, HandshakeError, Key};
use crate::wire::{read_frame, write_frame, AgentCommand, AgentReply, Frame, Role, WireError, HEARTBEAT_EVERY, LOST_AFTER};

/// An agent that has joined over TCP. A thread reads its frames (heartbeats and replies); one
/// silent for [`LOST_AFTER`], or whose connection closes, is lost: its connection is shut down
/// (so that a stalled agent that wakes up finds it closed and releases its job) and its node
/// name is freed.
pub struct RemoteAgent {
    node: String,
    writer: Arc<Mutex<ChannelWriter>>,
    replies: mpsc::Receiver<Result<AgentReply, String>>,
    alive: Arc<AtomicBool>,
    /// Where it takes other nodes' parts (`IP:port`), if it said.
    data: Option<String>,
    /// The relay it is attached to, if any ([`crate::relay`]).
    via: Arc<Mutex<Option<Arc<RelayLink>>>>,
}

impl RemoteAgent {
    /// Takes over the connection of an agent that has said hello and joined.
    pub fn start(
        node: String,
        reader: ChannelReader,
        writer: Arc<Mutex<ChannelWriter>>,
        registry: Arc<Registry>,
        data: Option<String>,
    ) -> std::io::Result<RemoteAgent> {
        reader.set_read_timeout(Some(LOST_AFTER))?;
        let reader = Arc::new(reader);
        let alive = Arc::new(AtomicBool::new(true));
        let (tx, replies) = mpsc::channel();
        let side = AgentSide { replies: tx.clone(), alive: alive.clone(), via: Arc::new(Mutex::new(None)), quiet: Arc::default(), conn: reader.clone() };
        let (via, quiet) = (side.via.clone(), side.quiet.clone());
        registry.set_link(&node, writer.clone());
        registry.pulse.add(&writer, &alive, Some(&side.quiet))?;
        registry.set_side(&node, side);
        {
            let (node, alive) = (node.clone(), alive.clone());
            std::thread::Builder::new().name(format!("ckpt-agent-{node}")).spawn(move || {
                let mut bye = false;
                let why = loop {
                    match read_frame(&*reader) {
                        Ok(Frame::Heartbeat) => {}
                        // Attached to a relay, which answers for its life, or just detached:
                        // its own connection is quiet.
                        Err(WireError::Silent(_)) if quiet.excuses_silence() && alive.load(Relaxed) => {}
                        Ok(Frame::Bye) => bye = true,
                        Ok(Frame::Flushed { generation, ok, message }) => {
                            registry.flush_reported(&node, generation, ok, message);
                        }
                        Ok(Frame::Ended { status }) => {
                            info!(node, status, "the node's job ended; its agent waits for the verdict");
                            registry.ended(&node, status);
                        }
                        Ok(Frame::Reply(r)) => {
                            let _ = tx.send(Ok(r));
                        }
                        Ok(Frame::RelayAt { port }) => match reader.peer_addr() {
                            Ok(peer) => registry.relay_ready(&node, std::net::SocketAddr::new(peer.ip(), port).to_string()),
                            Err(e) => warn!(node, "its relay: {e}"),
                        },
                        Ok(other) => break format!("unexpected message {other:?}"),
                        Err(WireError::Closed) => break "its connection closed (agent ended or died)".to_string(),
                        Err(e) => break e.to_string(),
                    }
                };
                alive.store(false, Relaxed);
                let _ = reader.shutdown(Shutdown::Both);
                registry.left(&node, !bye);
                if bye {
                    info!(node, "agent left: its job ended");
                } else {
                    warn!(node, "agent lost: {why}");
                }
                let _ = tx.send(Err(why));
            })?;
        }
        Ok(RemoteAgent { node, writer, replies, alive, data, via })
    }
}

/// Sends a heartbeat every second on `writer` until `alive` is cleared or the connection fails
/// (an agent's side of its connection; the coordinator sends all of its own from one thread,
/// [`Pulse`]); none while `quiet` says attached (an agent attached to a relay, which its
/// heartbeats go to instead).
pub fn start_heartbeat(writer: Arc<Mutex<ChannelWriter>>, alive: Arc<AtomicBool>, quiet: Option<Arc<Quiet>>) -> std::io::Result<()> {
    std::thread::Builder::new().name("ckpt-heartbeat".into()).spawn(move || {
        while alive.load(Relaxed) {
            if !quiet.as_ref().is_some_and(|q| q.attached()) && send_frame(&writer, &Frame::Heartbeat).is_err() {
                break;
            }
            std::thread::sleep(HEARTBEAT_EVERY);
        }
    })?;
    Ok(())
}

/// The coordinator's heartbeats to every agent, from one thread. A thread per agent that
/// sleeps a second and sends 40 bytes cost a wakeup per agent per second and a thread's memory
/// (docs/bench-coord-scale.md: the idle coordinator's CPU and its threads, by number of agents).
#[derive(Default)]
pub struct Pulse {
    links: Arc<Mutex<Vec<PulseLink>>>,
    started: AtomicBool,
}

/// One agent's connection, as the heartbeat thread holds it: not kept open by it.
struct PulseLink {
    writer: std::sync::Weak<Mutex<ChannelWriter>>,
    alive: Arc<AtomicBool>,
    /// Skipped while attached to a relay, which pulses it.
    paused: Option<Arc<Quiet>>,
}

/// How long the heartbeat thread waits on one agent's connection whose buffers are full (an
/// agent that has not read for long): it must not hold up every other agent's heartbeat.
const PULSE_STALL: std::time::Duration = std::time::Duration::from_millis(100);

impl Pulse {
    /// Sends heartbeats on `writer` every [`HEARTBEAT_EVERY`] from now until `alive` is
    /// cleared, the writer dropped or a heartbeat fails; none while `paused` says attached.
    pub fn add(&self, writer: &Arc<Mutex<ChannelWriter>>, alive: &Arc<AtomicBool>, paused: Option<&Arc<Quiet>>) -> std::io::Result<()> {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).push(PulseLink { writer: Arc::downgrade(writer), alive: alive.clone(), paused: paused.cloned() });
        if self.started.swap(true, Relaxed) {
            return Ok(());
        }
        let links = self.links.clone();
        let spawned = std::thread::Builder::new().name("ckpt-heartbeat".into()).spawn(move || loop {
            let began = std::time::Instant::now();
            let live: Vec<(Arc<Mutex<ChannelWriter>>, Arc<AtomicBool>)> = {
                let mut links = links.lock().unwrap_or_else(|p| p.into_inner());
                links.retain(|l| l.alive.load(Relaxed) && l.writer.strong_count() > 0);
                links.iter().filter(|l| !l.paused.as_ref().is_some_and(|p| p.attached())).filter_map(|l| Some((l.writer.upgrade()?, l.alive.clone()))).collect()
            };
            for (writer, alive) in live {
                if !pulse_one(&writer) {
                    // Nothing more goes there: the agent's reading thread notices the rest.
                    links.lock().unwrap_or_else(|p| p.into_inner()).retain(|l| !Arc::ptr_eq(&l.alive, &alive));
                }
            }
            std::thread::sleep(HEARTBEAT_EVERY.saturating_sub(began.elapsed()));
        });
        if spawned.is_err() {
            self.started.store(false, Relaxed);
        }
        spawned.map(|_| ())
    }
}

/// One heartbeat on `writer`; false when the connection failed. A connection another thread is
/// writing to now is skipped: that frame tells the agent the coordinator is there as well.
fn pulse_one(writer: &Mutex<ChannelWriter>) -> bool {
    let mut w = match writer.try_lock() {
        Ok(w) => w,
        Err(std::sync::TryLockError::WouldBlock) => return true,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
    };
    // Bounded, so that one agent that stopped reading does not hold up the others; the
    // connection's other writers (commands) keep waiting as long as it takes.
    let _ = w.set_write_timeout(Some(PULSE_STALL));
    let sent = write_frame(&mut *w, &Frame::Heartbeat).is_ok();
    let _ = w.set_write_timeout(None);
    sent
}

/// Writes a frame on a connection that several threads write to.
pub fn send_frame(writer: &Mutex<ChannelWriter>, frame: &Frame) -> Result<(), WireError> {
    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
    write_frame(&mut *w, frame)
}

impl AgentHandle for RemoteAgent {
    fn node(&self) -> &str {
        &self.node
    }

    fn alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    fn data_addr(&self) -> Option<String> {
        self.data.clone()
    }

    fn send(&mut self, cmd: AgentCommand) -> Result<(), AgentLost> {
        send_frame(&self.writer, &Frame::Command(cmd)).map_err(|e| AgentLost { node: self.node.clone(), why: e.to_string() })
    }

    fn relay(&self) -> Option<Arc<RelayLink>> {
        self.via.lock().unwrap_or_else(|p| p.into_inner()).clone().filter(|l| l.alive())
    }

    fn reply(&mut self) -> Result<AgentReply, AgentLost> {
        // The reading thread always ends with a last message, so this never waits for ever.
        match self.replies.recv() {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(why)) => Err(AgentLost { node: self.node.clone(), why }),
            Err(_) => Err(AgentLost { node: self.node.clone(), why: "its connection is closed".into() }),
        }
    }
}

impl Drop for RemoteAgent {
    fn drop(&mut self) {
        self.alive.store(false, Relaxed);
        let _ = self.writer.lock().unwrap_or_else(|p| p.into_inner()).shutdown(Shutdown::Both);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot reach the coordinator at {addr}: {error} (is `ckpt coordinator --listen {addr}` running?)")]
    Connect { addr: String, error: std::io::Error },
    #[error("talking to the coordinator at {addr}: {error}")]
    Wire { addr: String, error: WireError },
    #[error("no trusted connection to the coordinator at {addr}: {error}")]
    Handshake { addr: String, error: HandshakeError },
    #[error("the coordinator at {addr} refused: {message}")]
    Refused { addr: String, message: String },
    #[error("the coordinator at {addr} sent {got} where {want} was due")]
    Unexpected { addr: String, want: &'static str, got: String },
}

/// A connection to the coordinator at `addr`, the handshake made with the key of `secret`: both
/// sides have proved they hold it. Say `hello` next ([`hello`]).
pub fn dial(addr: &str, secret: &str) -> Result<Channel, RemoteError> {
    let stream = TcpStream::connect(addr).map_err(|error| RemoteError::Connect { addr: addr.into(), error })?;
    let _ = stream.set_nodelay(true);
    secure::connect(stream, &Key::from_secret(secret)).map_err(|error| RemoteError::Handshake { addr: addr.into(), error })
}

/// Says who connects, first thing on a connection [`dial`] made.
pub fn hello(channel: &mut Channel, addr: &str, role: Role) -> Result<(), RemoteError> {
    write_frame(&mut *channel, &Frame::Hello { role }).map_err(|error| RemoteError::Wire { addr: addr.into(), error })
}

/// A connection to the coordinator at `addr` that has said hello, with the key of `secret`.
pub fn connect(addr: &str, secret: &str, role: Role) -> Result<Channel, RemoteError> {
    let mut channel = dial(addr, secret)?;
    hello(&mut channel, addr, role)?;
    Ok(channel)
}

/// Reads the next frame that is not a heartbeat; an `error` frame becomes [`RemoteError::Refused`].
pub fn next_frame(stream: &ChannelReader, addr: &str) -> Result<Frame, RemoteError> {
    loop {
        match read_frame(stream).map_err(|error| RemoteError::Wire { addr: addr.into(), error })? {
            Frame::Heartbeat => continue,
            Frame::Error { message } => return Err(RemoteError::Refused { addr: addr.into(), message }),
            f => return Ok(f),
        }
    }
}

/// Sends one request as a client and returns the answer.
pub fn request(addr: &str, secret: &str, req: &Request) -> Result<Response, RemoteError> {
    let mut channel = connect(addr, secret, Role::Client)?;
    write_frame(&mut channel, &Frame::Request(req.clone())).map_err(|error| RemoteError::Wire { addr: addr.into(), error })?;
    match next_frame(&channel.reader, addr)? {
        Frame::Response(r) => Ok(r),
        other => Err(RemoteError::Unexpected { addr: addr.into(), want: "a response", got: format!("{other:?}") }),
    }
}

/// Asks the coordinator to start an agent on `host` running `command`; returns once it joined.
pub fn spawn(addr: &str, secret: &str, host: &str, command: &[String]) -> Result<String, RemoteError> {
    let mut channel = connect(addr, secret, Role::Client)?;
    write_frame(&mut channel, &Frame::Spawn { host: host.into(), command: command.to_vec() })
        .map_err(|error| RemoteError::Wire { addr: addr.into(), error })?;
    match next_frame(&channel.reader, addr)? {
        Frame::Spawned { node } => Ok(node),
        other => Err(RemoteError::Unexpected { addr: addr.into(), want: "spawned", got: format!("{other:?}") }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two ends of an authenticated connection: (the coordinator's, the agent's).
    pub(crate) fn channel_pair() -> (Channel, Channel) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let key = Key::from_secret("00112233445566778899aabbccddeeff");
        let dialer = std::thread::spawn(move || {
            let key = Key::from_secret("00112233445566778899aabbccddeeff");
            let mut c = secure::connect(TcpStream::connect(addr).unwrap(), &key).unwrap();
            // The connecting side speaks first (its hello), as an agent does.
            write_frame(&mut c, &Frame::Joined).unwrap();
            c
        });
        let mut accepted = secure::accept(l.accept().unwrap().0, &key).unwrap();
        assert!(matches!(read_frame(&mut accepted), Ok(Frame::Joined)));
        (accepted, dialer.join().unwrap())
    }

    /// One thread beats for every agent, and stops for one whose `alive` is cleared.
    #[test]
    fn one_pulse_for_every_agent() {
        let pulse = Pulse::default();
        let mut agents = Vec::new();
        let mut keep = Vec::new();
        for _ in 0..3 {
            let (coord, agent) = channel_pair();
            let (_, writer) = coord.split();
            let writer = Arc::new(Mutex::new(writer));
            let alive = Arc::new(AtomicBool::new(true));
            pulse.add(&writer, &alive, None).unwrap();
            let (reader, _w) = agent.split();
            reader.set_read_timeout(Some(std::time::Duration::from_millis(2500))).unwrap();
            agents.push((reader, alive));
            keep.push((writer, _w));
        }
        for _ in 0..2 {
            for (reader, _) in &agents {
                assert!(matches!(read_frame(reader), Ok(Frame::Heartbeat)));
            }
        }
        agents[1].1.store(false, Relaxed);
        // At most one heartbeat was on its way when it was cleared.
        let (reader, _) = &agents[1];
        let silent = (0..2).map(|_| read_frame(reader)).any(|r| matches!(r, Err(WireError::Silent(_))));
        assert!(silent, "heartbeats went on after the agent was given up");
        assert!(matches!(read_frame(&agents[0].0), Ok(Frame::Heartbeat)));
        assert!(matches!(read_frame(&agents[2].0), Ok(Frame::Heartbeat)));
    }

    /// Printed whole (anyhow's `{:#}`: the text, then each cause), the cause the text already
    /// says is not said again.
    #[test]
    fn each_cause_is_said_once() {
        let refused = || std::io::Error::from(nix::errno::Errno::ECONNREFUSED);
        let errors =
            [RemoteError::Connect { addr: "n1:7000".into(), error: refused() }, RemoteError::Wire { addr: "n1:7000".into(), error: WireError::Io(refused()) }];
        for e in errors {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text += &format!(": {c}");
                cause = c.source();
            }
            assert_eq!(text.matches("refused").count(), 1, "{text}");
        }
    }
}
