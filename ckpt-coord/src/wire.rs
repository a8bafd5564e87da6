//! The TCP protocol between a standalone coordinator and its agents and clients: frames of a
//! 4-byte big-endian length and one JSON object, carried inside a connection that the handshake
//! of [`crate::secure`] authenticated with the job's secret and encrypts; the first frame of
//! every connection is a `hello` saying who connects (docs/PROTOCOL.md).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ckpt_core::image::FileEntry;
use serde::{Deserialize, Serialize};

use crate::messages::{Request, Response};

/// Largest frame accepted: a node's file list of a big generation fits (the manifest's own bound
/// is 64 MiB for every node together).
pub const MAX_FRAME: u32 = 64 << 20;
/// Each side sends a heartbeat this often...
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// ... and gives the other up after this long without any frame.
pub const LOST_AFTER: Duration = Duration::from_secs(3);
/// The file, in the checkpoint directory, that holds the job's secret.
pub const SECRET_FILE: &str = "secret";
/// The file, in the checkpoint directory, where a standalone coordinator writes the address it
/// listens on (useful with port 0).
pub const ADDR_FILE: &str = "coordinator.addr";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Role {
    /// A node agent (`ckpt launch --coord`, `ckpt restart --coord`).
    Agent {
        node: String,
        /// Pid of the agent (for `status`).
        pid: u32,
        /// A `ckpt restart`: the coordinator answers which generation to restore.
        restart: bool,
        /// The port (on the address the coordinator sees the agent at) where the agent takes
        /// other nodes' parts for safekeeping (`--redundancy partner`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data_port: Option<u16>,
    },
    /// Another node's agent, about to hand over its part of a generation (`part_offer`).
    Peer { node: String },
    /// A client: `request`s or `spawn`s, each answered.
    Client,
    /// The relay of a group of agents (docs/PLAN-SCALE.md, "relays"), run by the agent of
    /// `node`: it says `attached` for each agent that reaches the coordinator through it, and
    /// takes their commands as one `fanout` and answers them as one `replies`.
    Relay { node: String },
}

/// One agent's reply in a relay's `replies`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReply {
    pub node: String,
    pub reply: AgentReply,
}

/// What the coordinator asks an agent, one generation at a time, in this order: (`freeze`, when
/// the job spans several agents), `prepare`, `release`, `persist`, then `commit` or, at any
/// point, `abort`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum AgentCommand {
    /// Freeze the node's tree and read the send queues of its TCP connections; answer `frozen`.
    /// Every node does this before any node reads a receive queue (in `prepare`), so that a
    /// byte in flight between two nodes is in the image once.
    Freeze { generation: u64 },
    /// Before `freeze` or `prepare`, the job running (`--copy-memory ahead`; not for a held
    /// job): copy its private memory into the node's part of the generation, its writes
    /// tracked, as an increment of `base` where the node tracked writes since; answer `done`.
    /// Every node copies before any freezes, so that none is frozen while another copies.
    CopyAhead {
        generation: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<u64>,
    },
    /// Freeze the node's tree (unless `freeze` did) and capture it into the buffer pool; answer
    /// `captured`. `hold`: the release will hold the tree for `--kill` (then memory is copied
    /// while frozen: the job never runs again, and nothing is gained by copying it later).
    Prepare {
        generation: u64,
        #[serde(default)]
        hold: bool,
        /// Store only what changed since this committed generation, where the node tracked
        /// the writes since (an incremental generation; docs/PLAN-INSTANT.md, step 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<u64>,
        /// Track the writes from now on, for the next generation to be incremental (the
        /// coordinator makes incremental generations).
        #[serde(default)]
        track: bool,
        /// The last try of a checkpoint given up on passing states before: what passes by
        /// itself and can be lost is taken as it is (see `ckpt_core::Error::Passing`).
        #[serde(default)]
        last_try: bool,
    },
    /// Every agent has captured: resume the tree, or with `hold` keep it frozen until `commit`
    /// (then kill it); answer `released`.
    Release { generation: u64, hold: bool },
    /// Wait until the node's data is durable and write its `procs.bin`; answer `persisted`.
    Persist { generation: u64 },
    /// The coordinator wrote the manifest: keep the node's part (and kill a held tree); `done`.
    /// `flush` (bytes per second; `--flush-every`): then copy the part into the shared
    /// directory in the background at most that fast, and say `flushed` when it is durable.
    Commit {
        generation: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        flush: Option<u64>,
    },
    /// Give the generation up: release the tree, remove the node's part; `done`.
    Abort { generation: u64 },
    /// Without TCP repair mode, between `freeze` and `prepare`: one round of draining the TCP
    /// connections between nodes of the job (`ends`: every such end of every node; each agent
    /// works on those it holds): read out what arrived, answer `drained` with what its senders
    /// still have to send. With `last`, every sender has nothing left: keep what each end
    /// received for the capture and answer with the bytes to write back (`refills`).
    Drain { generation: u64, ends: Vec<TcpEnd>, last: bool },
    /// Write back, through the sending ends this node holds, the bytes the drain took out of
    /// their receivers on other nodes; `done`.
    Refill { generation: u64, refills: Vec<TcpRefill> },
    /// After `persist`, with `--redundancy partner`: every copy of a part to make (`copies`,
    /// each agent sends those of its own part) to the holder's data port; `done` once the
    /// holder has it durable.
    Replicate { generation: u64, copies: Vec<PartCopy> },
    /// After `persist`, with `--redundancy xor:K`: every XOR group of the generation; each
    /// agent sends the segments of its own part to the members of its group that keep the
    /// parities they go into (docs/IMAGE-FORMAT.md, XOR); `done` once each is durable there.
    Parity { generation: u64, groups: Vec<XorGroup> },
}

/// One XOR group of a generation, as its members' agents need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XorGroup {
    pub members: Vec<String>,
    /// Each member's data port (`IP:port`), in the same order.
    pub addrs: Vec<String>,
    /// The segment size: the longest member's part over (members - 1), rounded up.
    pub seg: u64,
}

/// One node's part, to be kept by another node too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartCopy {
    /// The node whose part it is (it sends it).
    pub of: String,
    /// The node that keeps the copy, and where it takes it (`IP:port`).
    pub to: String,
    pub addr: String,
}

/// One end of a TCP connection between two nodes of the job, as its node's kernel sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpEnd {
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
    /// This end has sent its FIN: nothing can be written through it again.
    pub fin_sent: bool,
}

/// Where the server end of a connection between nodes, once `server_old` with its client at
/// `client_old`, listens at a restart (the same address, unless its node or port changed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpListen {
    pub server_old: std::net::SocketAddr,
    pub client_old: std::net::SocketAddr,
    pub addr: std::net::SocketAddr,
}

/// Bytes to write again through the end `(local, remote)` (its node's view).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpRefill {
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
    pub data: Vec<u8>,
}

impl AgentCommand {
    pub fn generation(&self) -> u64 {
        match *self {
            AgentCommand::Freeze { generation }
            | AgentCommand::CopyAhead { generation, .. }
            | AgentCommand::Prepare { generation, .. }
            | AgentCommand::Release { generation, .. }
            | AgentCommand::Persist { generation }
            | AgentCommand::Commit { generation, .. }
            | AgentCommand::Abort { generation }
            | AgentCommand::Drain { generation, .. }
            | AgentCommand::Refill { generation, .. }
            | AgentCommand::Replicate { generation, .. }
            | AgentCommand::Parity { generation, .. } => generation,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum AgentReply {
    /// `tcp_ends`: without TCP repair mode, the node's TCP connections whose peer is not on this
    /// node (some may be on other nodes of the job: the coordinator pairs them).
    Frozen {
        generation: u64,
        #[serde(default)]
        tcp_ends: Vec<TcpEnd>,
    },
    /// `outq`: bytes the node's ends listed in `drain` still have to send; `refills`, with
    /// `last`: bytes taken out of its receiving ends, to be written again by their senders.
    Drained {
        generation: u64,
        outq: u64,
        #[serde(default)]
        refills: Vec<TcpRefill>,
    },
    Captured {
        generation: u64,
        processes: usize,
        threads: usize,
    },
    /// The tree runs again (or is held); `frozen_ms` from its freeze until now.
    Released {
        generation: u64,
        frozen_ms: f64,
    },
    Persisted(Persisted),
    Done {
        generation: u64,
    },
    /// `passing`: what failed is a state the job leaves by itself in a moment (an agent of an
    /// older ckpt says nothing: false); the coordinator lets the job go and tries again.
    Failed {
        generation: u64,
        message: String,
        #[serde(default)]
        passing: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub generation: u64,
    /// The files of the node's part the manifest lists, relative to the generation directory
    /// (`<node>/...`): its records and its index (`<node>/index.bin`, which lists the others;
    /// an agent before format 29 lists every file here).
    pub files: Vec<FileEntry>,
    /// Bytes of the files the node's index lists (its XOR stream with `files`' others).
    #[serde(default)]
    pub part_bytes: u64,
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    pub pool_wait_ms: f64,
    /// The earlier generations the part refers to for pages not written since (empty: it is
    /// whole).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<u64>,
    /// Bytes of memory copied before the freeze (`--copy-memory ahead`).
    #[serde(default)]
    pub copied_ahead: u64,
    /// The node's CUDA processes (ckpt_core::gpu), when it has some. Boxed: most jobs have
    /// none, and every frame is as large as its largest kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Box<GpuUse>>,
}

/// What a checkpoint did with a node's CUDA processes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuUse {
    /// How long their CUDA calls were held: from the lock to the unlock, or to the checkpoint
    /// when the job is killed.
    pub ms: f64,
    /// The host memory the driver's checkpoint added to them (their device memory, about).
    pub bytes: u64,
    /// A process the driver could not give its GPU back after the release: the job is ended
    /// once this generation is committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Frame {
    /// First frame of every connection, from the side that connected, once the handshake has
    /// proved that it holds the job's secret.
    Hello {
        role: Role,
    },
    /// Between two agents, after `hello` with role `peer`: the files of `node`'s part of
    /// `generation` follow, each as its `size` raw bytes, in this order; the holder answers
    /// `part_stored` once they are durable, or `error`.
    PartOffer {
        generation: u64,
        node: String,
        files: Vec<FileEntry>,
    },
    PartStored {
        generation: u64,
    },
    /// From a restarting agent whose node's part is not on its host, to the coordinator: which
    /// node keeps a copy of `node`'s part of the restored generation, and where it takes
    /// requests (`part_at`, once that node's agent has said hello, or `error`). Between agents,
    /// after `hello` with role `peer`: send me `node`'s part of `generation` (a `part_offer`
    /// and the bytes follow; the asker answers `part_stored`).
    PartWanted {
        generation: u64,
        node: String,
    },
    PartAt {
        holder: String,
        addr: String,
    },
    /// The coordinator's answer to `part_wanted` for a part kept by XOR redundancy: the group
    /// and its members' data ports (the lost one's empty), to rebuild it from.
    XorFrom {
        group: Vec<String>,
        addrs: Vec<String>,
    },
    /// Between agents, after `hello` with role `peer`: a segment of the sender's part for the
    /// parity piece this node keeps of `generation`; `seg` raw bytes follow, XORed into the
    /// piece, which is durable when the holder answers `part_stored`.
    ParityPiece {
        generation: u64,
        seg: u64,
    },
    /// Between agents: send `len` bytes of your part's stream (`node` must be yours) from
    /// `offset` (zeros past its end), or (`parity_wanted`) your parity piece of `generation`;
    /// answered `range_follows` and the raw bytes.
    RangeWanted {
        generation: u64,
        node: String,
        offset: u64,
        len: u64,
    },
    ParityWanted {
        generation: u64,
    },
    RangeFollows {
        len: u64,
    },
    /// To an agent: registered; a restart restores `restore`. `local_dir`: the node-local level
    /// (`ckpt coordinator --local-dir`, `{node}` still in it) where the agent keeps its part of
    /// every new generation; absent, in the shared checkpoint directory.
    Welcome {
        restore: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        local_dir: Option<String>,
        /// `ckpt coordinator --recover`: when its job ends, the agent says `ended` and waits for
        /// the verdict (`finish`, or `recover` when another node was lost) instead of leaving.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        recover: bool,
    },
    /// From a restarting agent: its processes are rebuilt and still stopped, their TCP
    /// connections still in repair mode.
    Rebuilt,
    /// To a restarting agent: every node of the generation is rebuilt; release the job.
    Proceed,
    /// From a restarting agent of a job over several nodes, first: whether it restarts on
    /// another host than the one its part ran on (an address its part's connections to the other
    /// nodes had is not on this host), and then each such old address with the address that
    /// stands for it here (the one this agent reaches the coordinator from).
    Placed {
        moved: bool,
        #[serde(default)]
        readdressed: Vec<(std::net::IpAddr, std::net::IpAddr)>,
    },
    /// To each restarting agent, once every node of the generation has said `placed`: the nodes
    /// that restart elsewhere and every moved node's old and new addresses. Where TCP repair
    /// mode is used, the connections between nodes are rebuilt by it with these addresses put in
    /// place of the old ones at both ends; otherwise every node makes them again by connecting.
    Placement {
        moved: Vec<String>,
        #[serde(default)]
        readdressed: Vec<(std::net::IpAddr, std::net::IpAddr)>,
    },
    /// From a restarting agent of a job over several nodes, before it rebuilds its processes:
    /// where the server ends of its TCP connections to other nodes listen now (made again
    /// without repair mode; empty otherwise).
    TcpListening {
        ends: Vec<TcpListen>,
    },
    /// To each restarting agent, once every node of the generation has said `tcp_listening`:
    /// every node's listening addresses, for its client ends to connect to.
    TcpConnectTo {
        ends: Vec<TcpListen>,
    },
    /// From an agent: its job runs (launched or restored); it takes commands now.
    Joined,
    /// From an agent: its job has ended; the connection closing next is no failure.
    Bye,
    /// From an agent of a coordinator with `--recover`: its job has ended with `status` (the
    /// exit code it would exit with); it waits for the verdict.
    Ended {
        status: i32,
    },
    /// From an agent, when the background copy of its part of `generation` into the shared
    /// directory (`commit` with `flush`) is durable (`ok`), or failed (`message` says why).
    Flushed {
        generation: u64,
        ok: bool,
        message: String,
    },
    /// To an agent that said `ended`: no node was lost; exit with the job's status.
    Finish,
    /// To every agent that is left when a node was lost (`--recover`): end the job if it still
    /// runs, say `bye`, and restart this node's part of `generation` joined to the coordinator
    /// again, in the same process (the user's `ckpt launch` stays in the foreground).
    Recover {
        generation: u64,
    },
    Heartbeat,
    Command(AgentCommand),
    Reply(AgentReply),
    /// From a client: a request as on `DIR/agent.sock`.
    Request(Request),
    Response(Response),
    /// From `ckpt agent-rsh`: start an agent on `host` running `command` under it.
    Spawn {
        host: String,
        command: Vec<String>,
    },
    /// The agent started by `spawn` has joined.
    Spawned {
        node: String,
    },
    /// A refusal or failure, then the connection is closed.
    Error {
        message: String,
    },
    /// From a relay: the agent of `node` (joined on its own connection) now takes its
    /// commands and sends its replies and heartbeats through this relay.
    Attached {
        node: String,
    },
    /// To a relay: `cmd` for each of `nodes`, agents attached to it.
    Fanout {
        nodes: Vec<String>,
        cmd: AgentCommand,
    },
    /// From a relay: the replies to a `fanout`, every node's, once every one has answered.
    Replies {
        replies: Vec<NodeReply>,
    },
    /// From a relay: it gave up the agent of `node`, silent for the heartbeat timeout.
    Lost {
        node: String,
        why: String,
    },
    /// From a relay: its connection to the agent of `node` ended (the agent ended, or failed
    /// to attach): the agent is reached on its own connection again, which tells whether it
    /// is still there.
    Detached {
        node: String,
        why: String,
    },
    /// To a joined agent: serve as the relay of a group of agents; answer `relay_at`.
    RelayServe,
    /// From an agent told `relay_serve`: its relay listens on this port (of the address the
    /// coordinator sees it at), and has joined the coordinator.
    RelayAt {
        port: u16,
    },
    /// To a joined agent: take commands through the relay at `addr` (`IP:port`).
    UseRelay {
        addr: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("nothing heard from the peer for {0:?} (no heartbeat)")]
    Silent(Duration),
    #[error("malformed frame: {0}")]
    Malformed(String),
}

pub fn write_frame(mut w: impl Write, frame: &Frame) -> Result<(), WireError> {
    let body = serde_json::to_vec(frame).map_err(|e| WireError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| WireError::Malformed(format!("frame of {} bytes is too large", body.len())))?;
    // One write, so that frames written by two threads under one lock never interleave.
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame. A read timeout set on the stream shows as [`WireError::Silent`].
pub fn read_frame(mut r: impl Read) -> Result<Frame, WireError> {
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => WireError::Silent(LOST_AFTER),
        std::io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    };
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(timed_out)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(WireError::Malformed(format!("frame length {len} above {MAX_FRAME} (not a ckpt peer?)")));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(timed_out)?;
    serde_json::from_slice(&body).map_err(|e| WireError::Malformed(e.to_string()))
}

/// The job's secret: 32 random bytes in hex, in `DIR/secret` (mode 0600). Created if missing.
pub fn load_or_create_secret(dir: &Path) -> std::io::Result<String> {
    let path = dir.join(SECRET_FILE);
    match read_secret(&path) {
        Ok(s) => return Ok(s),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| std::io::Error::other(format!("no random bytes for the job's secret: {e}")))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    use std::os::unix::fs::OpenOptionsExt;
    // create_new: two launchers starting together agree on the first one's secret.
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
        Ok(mut f) => {
            f.write_all(hex.as_bytes())?;
            f.sync_all()?;
            Ok(hex)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_secret(&path),
        Err(e) => Err(e),
    }
}

/// Reads a secret file (`--secret-file`, or `DIR/secret`).
pub fn read_secret(path: &Path) -> std::io::Result<String> {
    // Another user's, or one others may read: whoever else knows it can reach the job.
    std::fs::metadata(path)?;
    ckpt_core::image::check_private_file(path).map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()))?;
    let s = std::fs::read_to_string(path)?;
    let s = s.trim().to_string();
    if s.len() < 32 || !s.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} does not hold a ckpt secret (hex digits); remove it and start the coordinator again", path.display()),
        ));
    }
    Ok(s)
}

/// Where a client or agent finds the secret: `--secret-file F`, else `DIR/secret`.
pub fn secret_path(dir: &Path, secret_file: Option<&Path>) -> PathBuf {
    secret_file.map(Path::to_path_buf).unwrap_or_else(|| dir.join(SECRET_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Hello { role: Role::Agent { node: "n1".into(), pid: 7, restart: false, data_port: Some(4000) } },
            Frame::Hello { role: Role::Peer { node: "n2".into() } },
            Frame::Command(AgentCommand::Replicate {
                generation: 3,
                copies: vec![PartCopy { of: "n1".into(), to: "n2".into(), addr: "10.0.0.2:4000".into() }],
            }),
            Frame::PartOffer { generation: 3, node: "n1".into(), files: vec![FileEntry { path: "n1/chunks/p2-0000000000000000".into(), size: 9, crc32c: 1 }] },
            Frame::PartStored { generation: 3 },
            Frame::Command(AgentCommand::Release { generation: 3, hold: true }),
            Frame::Reply(AgentReply::Persisted(Persisted {
                generation: 3,
                files: vec![FileEntry { path: "n1/procs.bin".into(), size: 9, crc32c: 1 }],
                part_bytes: 4,
                bytes_raw: 1,
                bytes_stored: 1,
                pool_wait_ms: 0.0,
                needs: vec![2],
                copied_ahead: 5,
                gpu: Some(Box::new(GpuUse { ms: 1.5, bytes: 2, failed: None })),
            })),
            Frame::Request(Request::Status),
        ];
        let mut buf = Vec::new();
        for f in &frames {
            write_frame(&mut buf, f).unwrap();
        }
        let mut r = &buf[..];
        for f in &frames {
            let back = read_frame(&mut r).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(f).unwrap());
        }
        assert!(matches!(read_frame(&mut r), Err(WireError::Closed)));
        let huge = (MAX_FRAME + 1).to_be_bytes();
        assert!(matches!(read_frame(&huge[..]), Err(WireError::Malformed(_))));
    }

    #[test]
    fn secrets() {
        let dir = tempfile::tempdir().unwrap();
        let s = load_or_create_secret(dir.path()).unwrap();
        assert_eq!(s.len(), 64);
        assert_eq!(load_or_create_secret(dir.path()).unwrap(), s);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(SECRET_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
