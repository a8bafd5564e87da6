//! Parts of a generation moving between nodes (`--redundancy partner`): every agent takes other
//! nodes' parts on a data port of its own, and sends its own part to the node that keeps it.
//!
//! The connection is the agents' own (the coordinator only says who sends what where) and is
//! authenticated like every connection of the job, with its secret (`hello`, role `peer`). Then
//! one `part_offer` frame lists the files (path, size, crc32c, as in the manifest), and each
//! file's bytes follow raw, in order: bulk data never goes through JSON. The holder writes them
//! into its node-local directory as `gen-N/<node>/...` (the layout of a part: a copy is a part
//! in another node's directory), checks every crc32c, makes everything durable, and answers
//! `part_stored`. A node restarting without its own part asks the holder the other way round
//! (`part_wanted`): the holder offers the copy, and the asker keeps it the same way.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::wire::{read_frame, write_frame, Frame, Role};
use ckpt_core::image::{CheckpointDir, FileEntry};
use tracing::{info, warn};

/// How long a holder may take to answer (it fsyncs what it received).
const STORE_TIMEOUT: Duration = Duration::from_secs(120);
/// Pieces of a file in flight.
const PIECE: usize = 1 << 20;

/// The data port: takes other nodes' parts into this node's local level once it is known, and
/// hands out the copies it keeps to a node restarting without its own.
pub struct DataServer {
    pub port: u16,
    local: Arc<OnceLock<CheckpointDir>>,
}

/// What a data port knows of its node: the shared checkpoint directory (the manifests) and the
/// node's name.
#[derive(Clone)]
struct Home {
    shared: PathBuf,
    node: String,
}

impl DataServer {
    /// Listens on every address of this host, on a port the kernel picks; the coordinator tells
    /// senders this host's address as it sees it.
    pub fn start(secret: String, shared: &Path, node: &str) -> Result<DataServer> {
        let home = Home { shared: shared.to_path_buf(), node: node.to_string() };
        let listener = TcpListener::bind("0.0.0.0:0").context("open a data port for other nodes' parts")?;
        let port = listener.local_addr()?.port();
        let local: Arc<OnceLock<CheckpointDir>> = Arc::default();
        let for_thread = local.clone();
        std::thread::Builder::new().name("ckpt-data".into()).spawn(move || {
            for conn in listener.incoming().flatten() {
                let (secret, local, home) = (secret.clone(), for_thread.clone(), home.clone());
                let _ = std::thread::Builder::new().name("ckpt-data-in".into()).spawn(move || {
                    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                    if let Err(e) = serve(&conn, &secret, local.get(), &home) {
                        warn!(peer, "a request from another node failed: {e:#}");
                        let _ = write_frame(&conn, &Frame::Error { message: format!("{e:#}") });
                    }
                });
            }
        })?;
        Ok(DataServer { port, local })
    }

    /// Where other nodes' parts go: this node's local level (known after the coordinator's
    /// welcome).
    pub fn set_local(&self, local: &CheckpointDir) {
        let _ = self.local.set(local.clone());
    }
}

/// One connection from another node: a part to keep (`part_offer`) or a kept copy wanted back
/// (`part_wanted`).
fn serve(conn: &TcpStream, secret: &str, local: Option<&CheckpointDir>, home: &Home) -> Result<()> {
    conn.set_read_timeout(Some(STORE_TIMEOUT))?;
    let from = match read_frame(conn)? {
        Frame::Hello { secret: s, role: Role::Peer { node } } if ckpt_coord::wire::same_secret(&s, secret) => node,
        _ => bail!("refused: not a node of this job (wrong secret or role)"),
    };
    match read_frame(conn)? {
        Frame::PartOffer { generation, node, files } => {
            if node != from {
                bail!("node {from} offered node {node}'s part");
            }
            let local = local.ok_or_else(|| anyhow!("this node has no node-local directory (--local-dir) to keep node {node}'s part in"))?;
            let part = local.local_node_part(generation, &node)?;
            receive_files(conn, part.node_dir(), &node, &files)?;
            part.keep();
            info!(generation, node, files = files.len(), "kept a copy of another node's part");
            write_frame(conn, &Frame::PartStored { generation })?;
            Ok(())
        }
        Frame::PartWanted { generation, node } => {
            if node != from {
                bail!("node {from} asked for node {node}'s part");
            }
            hand_back(conn, home, generation, &node)
        }
        other => bail!("node {from} sent {other:?}"),
    }
}

/// Sends the copy this node keeps of `node`'s part of `generation` (as the manifest lists its
/// files) and waits for the asker to have it durable.
fn hand_back(conn: &TcpStream, home: &Home, generation: u64, node: &str) -> Result<()> {
    let gen_dir = CheckpointDir::open(&home.shared)?.gen_dir(generation);
    let manifest = ckpt_core::image::Manifest::load(&gen_dir)?;
    if !manifest.copies.get(node).is_some_and(|h| h.contains(&home.node)) {
        bail!("node {} keeps no copy of node {node}'s part of generation {generation}", home.node);
    }
    let template = manifest.local_dir.as_deref().ok_or_else(|| anyhow!("generation {generation} has no node-local level"))?;
    let copy = ckpt_core::image::manifest::expand_local_dir(template, &home.node).join(ckpt_core::image::gen_dir_name(generation)).join(node);
    let prefix = format!("{node}/");
    let files: Vec<FileEntry> = manifest.files.iter().filter(|f| f.path.starts_with(&prefix)).cloned().collect();
    write_frame(conn, &Frame::PartOffer { generation, node: node.into(), files: files.clone() })?;
    send_files(conn, &copy, node, &files)?;
    match read_frame(conn)? {
        Frame::PartStored { generation: g } if g == generation => {
            info!(generation, node, "handed back the copy of another node's part");
            Ok(())
        }
        other => bail!("node {node} answered {other:?}"),
    }
}

/// Writes the files of an offer into `part_dir` as they arrive, checking every crc32c, and
/// makes them and their directories durable.
fn receive_files(mut reader: impl Read, part_dir: &Path, node: &str, files: &[FileEntry]) -> Result<()> {
    let mut buf = vec![0u8; PIECE];
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        let path = inside(part_dir, node, &f.path)?;
        let dir = path.parent().expect("a path inside the part has a parent").to_path_buf();
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let mut out = std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
        let (mut left, mut crc) = (f.size, 0u32);
        while left > 0 {
            let n = left.min(PIECE as u64) as usize;
            reader.read_exact(&mut buf[..n]).with_context(|| format!("read {} of node {node}", f.path))?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            out.write_all(&buf[..n]).with_context(|| format!("write {}", path.display()))?;
            left -= n as u64;
        }
        if crc != f.crc32c {
            bail!("{} of node {node} arrived damaged (crc32c {crc:08x}, the offer says {:08x})", f.path, f.crc32c);
        }
        out.sync_all().with_context(|| format!("fsync {}", path.display()))?;
        dirs.insert(dir);
    }
    dirs.insert(part_dir.to_path_buf());
    if let Some(gen_dir) = part_dir.parent() {
        dirs.insert(gen_dir.to_path_buf());
    }
    for d in &dirs {
        std::fs::File::open(d).and_then(|f| f.sync_all()).with_context(|| format!("fsync {}", d.display()))?;
    }
    Ok(())
}

/// The global level (`ckpt coordinator --flush-every`): copies the listed files of `node`'s
/// part from `part_dir` (its own storage) into `dest` (the shared directory's part), checking
/// every crc32c and making them durable, at most `rate` bytes/s and not while `paused` is set
/// (a checkpoint of the node is under way: the copy never lengthens a freeze).
pub fn flush_part(part_dir: &Path, dest: &Path, node: &str, files: &[FileEntry], rate: u64, paused: &std::sync::atomic::AtomicBool) -> Result<()> {
    let mut parts: Vec<Box<dyn Read>> = Vec::new();
    for f in files {
        let path = inside(part_dir, node, &f.path)?;
        let file = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        parts.push(Box::new(file.take(f.size)));
    }
    let whole = parts.into_iter().fold(Box::new(std::io::empty()) as Box<dyn Read>, |all, next| Box::new(all.chain(next)));
    let throttled = Throttled { inner: whole, rate: rate.max(1), paused, start: std::time::Instant::now(), done: 0 };
    receive_files(throttled, dest, node, files)
}

/// A reader held to a rate, and stopped while a flag is set.
struct Throttled<'a, R> {
    inner: R,
    rate: u64,
    paused: &'a std::sync::atomic::AtomicBool,
    start: std::time::Instant,
    done: u64,
}

impl<R: Read> Read for Throttled<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.paused.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let len = buf.len().min(PIECE);
        let n = self.inner.read(&mut buf[..len])?;
        self.done += n as u64;
        let due = Duration::from_secs_f64(self.done as f64 / self.rate as f64);
        if let Some(ahead) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(ahead);
        }
        Ok(n)
    }
}

/// Streams the listed files of `node`'s part from `part_dir`, each exactly its listed size.
fn send_files(conn: &TcpStream, part_dir: &Path, node: &str, files: &[FileEntry]) -> Result<()> {
    let mut writer = std::io::BufWriter::with_capacity(PIECE, conn);
    for f in files {
        let path = inside(part_dir, node, &f.path)?;
        let mut file = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let sent = std::io::copy(&mut (&mut file).take(f.size), &mut writer).with_context(|| format!("send {}", path.display()))?;
        if sent != f.size {
            bail!("{} holds {sent} bytes, {} were listed", path.display(), f.size);
        }
    }
    writer.flush()?;
    Ok(())
}

/// A restart of `node` whose part is not on this host: asks the node at `addr`, which keeps a
/// copy, for it, and writes it into `dest` (this host's directory of the part), durable.
pub fn fetch_part(addr: &str, secret: &str, generation: u64, node: &str, dest: &Path) -> Result<()> {
    let conn = TcpStream::connect(addr).with_context(|| format!("connect to {addr}"))?;
    conn.set_read_timeout(Some(STORE_TIMEOUT))?;
    write_frame(&conn, &Frame::Hello { secret: secret.into(), role: Role::Peer { node: node.into() } })?;
    write_frame(&conn, &Frame::PartWanted { generation, node: node.into() })?;
    let files = match read_frame(&conn)? {
        Frame::PartOffer { generation: g, node: n, files } if g == generation && n == node => files,
        Frame::Error { message } => bail!("{message}"),
        other => bail!("answered {other:?}"),
    };
    receive_files(&conn, dest, node, &files)?;
    write_frame(&conn, &Frame::PartStored { generation })?;
    info!(generation, node, files = files.len(), bytes = files.iter().map(|f| f.size).sum::<u64>(), "fetched this node's part from its partner");
    Ok(())
}

/// The place of a listed file (`<node>/...`) inside the part's directory: the path must be
/// `node`'s and stay inside it.
fn inside(part_dir: &Path, node: &str, rel: &str) -> Result<PathBuf> {
    let inner = rel.strip_prefix(node).and_then(|r| r.strip_prefix('/')).ok_or_else(|| anyhow!("{rel} is not a file of node {node}'s part"))?;
    let ok = !inner.is_empty() && Path::new(inner).components().all(|c| matches!(c, std::path::Component::Normal(_)));
    if !ok {
        bail!("{rel}: not a plain path inside the part");
    }
    Ok(part_dir.join(inner))
}

/// Sends this node's part (`files`, as listed at persist, from `part_dir`) to the holder at
/// `addr`, and waits until the holder has it durable.
pub fn send_part(addr: &str, secret: &str, generation: u64, node: &str, part_dir: &Path, files: &[FileEntry]) -> Result<()> {
    let conn = TcpStream::connect(addr).with_context(|| format!("connect to {addr} to hand over this node's part"))?;
    conn.set_read_timeout(Some(STORE_TIMEOUT))?;
    write_frame(&conn, &Frame::Hello { secret: secret.into(), role: Role::Peer { node: node.into() } })?;
    write_frame(&conn, &Frame::PartOffer { generation, node: node.into(), files: files.to_vec() })?;
    send_files(&conn, part_dir, node, files)?;
    match read_frame(&conn).with_context(|| format!("waiting for {addr} to keep this node's part"))? {
        Frame::PartStored { generation: g } if g == generation => Ok(()),
        Frame::Error { message } => bail!("the node at {addr} did not keep this node's part: {message}"),
        other => bail!("the node at {addr} answered {other:?}"),
    }
}
