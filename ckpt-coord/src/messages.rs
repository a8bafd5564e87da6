//! Messages on an agent's control socket (`DIR/agent.sock`): one JSON object per line, one request
//! and one response per connection.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Checkpoint(CheckpointRequest),
    Status,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// End the job once the generation is committed.
    #[serde(default)]
    pub kill: bool,
    /// Asked from inside the job (libckpt): answer `accepted` at once, and checkpoint once the
    /// asking process has closed the connection.
    #[serde(default)]
    pub detach: bool,
    /// Answer as soon as the job runs again (`resumed`), not when the generation is committed.
    #[serde(default)]
    pub no_wait_durable: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Committed(CheckpointReply),
    /// A detached request was taken; the generation it will commit.
    Accepted {
        generation: u64,
    },
    /// The job runs again; the generation becomes durable later (see `status`).
    Resumed {
        generation: u64,
        frozen_ms: f64,
    },
    Status(StatusReply),
    Error {
        message: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointReply {
    pub generation: u64,
    /// Time the application was stopped (freeze, capture, resume).
    pub frozen_ms: f64,
    /// Time from the request until the generation was committed.
    pub durable_ms: f64,
    pub bytes_raw: u64,
    pub bytes_stored: u64,
    pub processes: usize,
    pub threads: usize,
    /// Time capture waited for a free chunk of the buffer pool.
    pub pool_wait_ms: f64,
    /// Bytes of memory copied before the freeze, while the job ran (`--copy-memory ahead`):
    /// part of `bytes_raw`.
    #[serde(default)]
    pub copied_ahead_bytes: u64,
    /// The job's CUDA processes: the longest time a node's CUDA calls were held by the
    /// checkpoint (the driver's lock to its unlock), and the host memory the driver's
    /// checkpoint added to them (their device memory, about). 0 without CUDA processes.
    #[serde(default)]
    pub gpu_ms: f64,
    #[serde(default)]
    pub gpu_bytes: u64,
    /// A CUDA process the driver could not give its GPU back after the checkpoint: the job was
    /// ended once the generation was committed, and `ckpt restart` brings it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_failed: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReply {
    pub launcher_pid: u32,
    pub command: Vec<String>,
    pub generations: Vec<u64>,
    pub checkpoint_running: bool,
    /// A generation whose job already runs again and whose data is being written.
    #[serde(default)]
    pub persisting: Option<u64>,
    /// The nodes whose agents have joined (one, the launcher's own, when embedded).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// A recovery from a lost node under way (`ckpt coordinator --recover`), or the last one
    /// given up: what it does, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no running job in {dir} (start one with `ckpt launch --dir {dir} -- PROG`, or `ckpt restart --dir {dir}`)")]
    NoJob { dir: String },
    #[error("talking to the agent of {dir}: {error}")]
    Io { dir: String, error: std::io::Error },
    #[error("the agent of {dir} sent a malformed answer: {detail}")]
    Protocol { dir: String, detail: String },
    /// The launcher went away with the request unanswered: its job ended (finished, was killed
    /// or crashed) meanwhile.
    #[error("the job of {dir} ended before it answered (it finished, or was killed, while the request was on its way); `ckpt status --dir {dir}` shows what is left")]
    Ended { dir: String },
}

pub const SOCKET_NAME: &str = "agent.sock";

/// Sends one request to the agent of a checkpoint directory and reads its answer.
pub fn call(dir: &Path, req: &Request) -> Result<Response, ClientError> {
    let d = dir.display().to_string();
    let path = dir.join(SOCKET_NAME);
    let mut stream = UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => ClientError::NoJob { dir: d.clone() },
        _ => ClientError::Io { dir: d.clone(), error: e },
    })?;
    let mut line = serde_json::to_string(req).expect("requests serialize");
    line.push('\n');
    stream.write_all(line.as_bytes()).map_err(|e| ClientError::Io { dir: d.clone(), error: e })?;
    let mut answer = String::new();
    // A launcher that exits before reading the request resets the connection; one that exits
    // after, closes it: either way the job ended meanwhile.
    match BufReader::new(stream).read_line(&mut answer) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Err(ClientError::Ended { dir: d }),
        Err(e) => return Err(ClientError::Io { dir: d, error: e }),
        Ok(_) if answer.is_empty() => return Err(ClientError::Ended { dir: d }),
        Ok(_) => {}
    }
    serde_json::from_str(&answer).map_err(|e| ClientError::Protocol { dir: d, detail: e.to_string() })
}
