//! The node agent inside `ckpt launch` and `ckpt restart`: it owns the node's buffer pool, serves
//! the control socket, and runs checkpoints of the job (with the coordinator embedded: this agent
//! is the job's only one).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result};
use ckpt_coord::messages::{StatusReply, SOCKET_NAME};
use ckpt_coord::{CheckpointReply, CheckpointRequest, Request, Response};
use ckpt_core::capture;
use ckpt_core::image::{CheckpointDir, Manifest};
use ckpt_core::objects::file::StdioIds;
use ckpt_core::pool::Pool;
use ckpt_core::ptrace::Tid;
use ckpt_core::snapshot::NodeImage;
use tracing::{info, warn};

/// What the agent tells about itself without waiting for a checkpoint to finish.
pub struct AgentInfo {
    root: std::path::PathBuf,
    command: Vec<String>,
    running: std::sync::atomic::AtomicBool,
    /// The generation being written after its job was released (0: none).
    persisting: std::sync::atomic::AtomicU64,
}

impl AgentInfo {
    fn status(&self) -> Response {
        use std::sync::atomic::Ordering::Relaxed;
        let persisting = self.persisting.load(Relaxed);
        Response::Status(StatusReply {
            launcher_pid: std::process::id(),
            command: self.command.clone(),
            generations: CheckpointDir::open(&self.root).and_then(|d| d.committed()).unwrap_or_default(),
            checkpoint_running: self.running.load(Relaxed),
            persisting: (persisting != 0).then_some(persisting),
        })
    }
}

pub struct Agent {
    pub dir: CheckpointDir,
    pub node: String,
    /// Host pid of the job's init.
    pub init_pid: Tid,
    /// Pid, inside the job, of the main process.
    pub main_pid: Tid,
    pub pool: Pool,
    pub stdio: StdioIds,
    /// Committed generations to keep.
    pub keep: usize,
    next_generation: u64,
    /// What `status` reports, readable while a checkpoint runs.
    pub info: Arc<AgentInfo>,
    /// What the last checkpoint cost the application (its frozen time).
    last_cost: Option<std::time::Duration>,
    /// `--tcp-established`: a kill after a checkpoint closes connections to peers outside the job
    /// silently (the restarted job takes them over).
    pub tcp_established: bool,
    /// `--save-files`: files open for writing are saved whole in every checkpoint.
    pub save_files: bool,
}

impl Agent {
    pub fn new(dir: CheckpointDir, node: String, init_pid: Tid, main_pid: Tid, pool: Pool, command: Vec<String>, keep: usize) -> Result<Agent> {
        let next_generation = dir.next_generation()?;
        let info = Arc::new(AgentInfo {
            root: dir.root().to_path_buf(),
            command,
            running: Default::default(),
            persisting: Default::default(),
        });
        Ok(Agent {
            dir,
            node,
            init_pid,
            main_pid,
            pool,
            stdio: StdioIds::of_self(),
            keep,
            next_generation,
            info,
            last_cost: None,
            tcp_established: false,
            save_files: false,
        })
    }

    /// One checkpoint: freeze, capture, resume (or, with `kill`, hold until committed and kill),
    /// persist, commit. On any error the job is released and the generation removed.
    pub fn checkpoint(&mut self, req: &CheckpointRequest) -> Result<CheckpointReply> {
        self.checkpoint_with(req, &mut |_, _| {})
    }

    /// A checkpoint that calls `on_resumed(generation, frozen_ms)` as soon as the job runs again
    /// (not with `kill`), before the generation is durable.
    pub fn checkpoint_with(&mut self, req: &CheckpointRequest, on_resumed: &mut dyn FnMut(u64, f64)) -> Result<CheckpointReply> {
        use std::sync::atomic::Ordering::Relaxed;
        /// Clears the status flags however the checkpoint ends.
        struct Running<'a>(&'a AgentInfo);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.running.store(false, Relaxed);
                self.0.persisting.store(0, Relaxed);
            }
        }
        let info = self.info.clone();
        info.running.store(true, Relaxed);
        let _running = Running(&info);
        let t0 = Instant::now();
        let generation = self.next_generation;
        let pending = self.dir.begin(generation)?;
        let node_dir = pending.node_dir(&self.node)?;
        let batch = self.pool.batch(&pending.chunks_dir(&self.node)?);

        // Frozen time is what the application feels: from the freeze to the release.
        let t_freeze = Instant::now();
        let mut tree = capture::freeze(self.init_pid)?;
        let save_files = self.save_files;
        let captured = tree.capture(&batch, &self.stdio).and_then(|p| {
            let saved = if save_files { ckpt_core::objects::saved_files::capture(&p)? } else { Vec::new() };
            Ok((p, tree.zombies()?, ckpt_core::objects::sysvipc::capture(self.init_pid)?, saved))
        });
        let (processes, zombies, sysvipc, saved_files) = match captured {
            Ok(p) => p,
            Err(e) => {
                drop(tree);
                let _ = batch.wait_durable();
                let _ = pending.abandon();
                return Err(e).context(format!("checkpoint of generation {generation} failed; the job goes on"));
            }
        };
        // With --kill the job stays frozen until the generation is safe, then dies: it never
        // runs past the checkpoint. Otherwise it goes on now.
        let held = if req.kill { Some(tree) } else { tree.resume()?; None };
        let frozen = t_freeze.elapsed();
        if held.is_none() {
            info.persisting.store(generation, Relaxed);
            on_resumed(generation, frozen.as_secs_f64() * 1e3);
        }
        let threads = processes.iter().map(|p| p.threads.len()).sum();
        let image = NodeImage { node: self.node.clone(), main_pid: self.main_pid, processes, zombies, sysvipc, saved_files };
        let count = image.processes.len();

        let procs_entry = image.write(&node_dir);
        let report = batch.wait_durable();
        let (procs_entry, report) = match (procs_entry, report) {
            (Ok(p), Ok(r)) => (p, r),
            (Err(e), _) | (_, Err(e)) => {
                let _ = pending.abandon();
                return Err(e).context(format!("writing generation {generation} failed; the job goes on"));
            }
        };
        let mut manifest = Manifest::new(generation, vec![self.node.clone()]);
        manifest.files = report.files.clone();
        manifest.files.push(procs_entry);
        let durable = t0.elapsed();
        let reply = CheckpointReply {
            generation,
            frozen_ms: frozen.as_secs_f64() * 1e3,
            durable_ms: durable.as_secs_f64() * 1e3,
            bytes_raw: report.bytes_raw,
            bytes_stored: report.bytes_stored,
            processes: count,
            threads,
            pool_wait_ms: report.wait_for_free_chunk.as_secs_f64() * 1e3,
        };
        manifest.stats = serde_json::to_value(&reply)?;
        pending.commit(&manifest).context(format!("commit generation {generation}"))?;
        self.next_generation += 1;
        self.last_cost = Some(frozen);
        if let Some(tree) = held {
            // Killed, its TCP connections would send FINs and resets, and linger in TIME_WAIT.
            ckpt_core::objects::inet::before_kill(&tree.pids(), self.tcp_established);
            tree.kill();
        }
        if let Err(e) = self.dir.prune(self.keep) {
            warn!("removing old generations: {e}");
        }
        info!(generation, frozen_ms = reply.frozen_ms, durable_ms = reply.durable_ms, "generation committed");
        Ok(reply)
    }

    /// The frozen time of the last committed checkpoint.
    pub fn last_cost(&self) -> Option<std::time::Duration> {
        self.last_cost
    }

}

/// The control socket of a checkpoint directory, removed when dropped.
pub struct ControlSocket {
    path: PathBuf,
    listener: UnixListener,
}

impl ControlSocket {
    pub fn bind(dir: &std::path::Path) -> Result<ControlSocket> {
        let path = dir.join(SOCKET_NAME);
        if UnixStream::connect(&path).is_ok() {
            anyhow::bail!("a job is already running in {} (its agent answers on {})", dir.display(), path.display());
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).with_context(|| format!("listen on {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(ControlSocket { path, listener })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves requests, each on a thread of its own: `status` answers at once, checkpoints take the
/// agent in turn (the thread that runs one is the tracer for all of it).
pub fn serve(agent: Arc<Mutex<Agent>>, socket: &ControlSocket) -> Result<std::thread::JoinHandle<()>> {
    let listener = socket.listener.try_clone()?;
    let info = agent.lock().unwrap_or_else(|p| p.into_inner()).info.clone();
    Ok(std::thread::Builder::new().name("ckpt-agent".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let (agent, info) = (agent.clone(), info.clone());
            let spawned = std::thread::Builder::new().name("ckpt-request".into()).spawn(move || {
                if let Err(e) = handle(&agent, &info, conn) {
                    warn!("control connection: {e}");
                }
            });
            if let Err(e) = spawned {
                warn!("control connection: no thread to serve it: {e}");
            }
        }
    })?)
}

fn handle(agent: &Arc<Mutex<Agent>>, info: &AgentInfo, conn: UnixStream) -> Result<()> {
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    let req = match serde_json::from_str::<Request>(&line) {
        Err(e) => return send(&conn, &Response::Error { message: format!("malformed request: {e}") }),
        Ok(Request::Status) => return send(&conn, &info.status()),
        Ok(Request::Checkpoint(req)) => req,
    };
    // The lock is held until the answer is sent: a job that ends meanwhile (after `--kill`) waits
    // for it before the launcher exits, so the client always hears the outcome.
    let mut a = agent.lock().unwrap_or_else(|p| p.into_inner());
    if req.detach {
        // Asked from inside the job (libckpt): the asking process must not be holding this
        // connection when it is frozen, so it is answered first and closes it; it learns the
        // outcome from the generation's MANIFEST and from `status`.
        let generation = a.next_generation;
        send(&conn, &Response::Accepted { generation })?;
        wait_closed(&conn);
        if let Err(e) = a.checkpoint(&req) {
            warn!("checkpoint asked by the job: {e:#}");
        }
        return Ok(());
    }
    let mut answered = false;
    let early = !req.kill && req.no_wait_durable;
    let result = a.checkpoint_with(&req, &mut |generation, frozen_ms| {
        if early {
            answered = send(&conn, &Response::Resumed { generation, frozen_ms }).is_ok();
        }
    });
    match result {
        Ok(_) if answered => Ok(()),
        Ok(reply) => send(&conn, &Response::Committed(reply)),
        Err(e) if answered => {
            warn!("{e:#}");
            Ok(())
        }
        Err(e) => send(&conn, &Response::Error { message: format!("{e:#}") }),
    }
}

fn send(conn: &UnixStream, response: &Response) -> Result<()> {
    let mut out = serde_json::to_string(response)?;
    out.push('\n');
    (&*conn).write_all(out.as_bytes())?;
    Ok(())
}

/// Waits (a few seconds at most) until the client has closed its end.
fn wait_closed(conn: &UnixStream) {
    use std::io::Read;
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    while let Ok(n) = (&*conn).read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}
