//! Parts of a generation moving between nodes (`--redundancy partner`): every agent takes other
//! nodes' parts on a data port of its own, and sends its own part to the node that keeps it.
//!
//! The connection is the agents' own (the coordinator only says who sends what where) and is
//! authenticated and encrypted like every connection of the job, with keys of its own from the
//! handshake of `ckpt_coord::secure` (then `hello`, role `peer`). Then one `part_offer` frame
//! lists the files (path, size, crc32c, as in the manifest), and each file's bytes follow raw,
//! in order (inside the encrypted stream): bulk data never goes through JSON. The holder writes them
//! into its node-local directory as `gen-N/<node>/...` (the layout of a part: a copy is a part
//! in another node's directory), checks every crc32c, makes everything durable, and answers
//! `part_stored`. A node restarting without its own part asks the holder the other way round
//! (`part_wanted`): the holder offers the copy, and the asker keeps it the same way.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use ckpt_coord::secure::{self, Channel, ChannelReader, Gate, Key};
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
    /// Listens on `addr` (the address this node reaches the coordinator from, which the
    /// coordinator tells senders), on a port the kernel picks; at most
    /// [`secure::MAX_PENDING`] connections in handshake at once.
    pub fn start(secret: String, shared: &Path, node: &str, addr: IpAddr) -> Result<DataServer> {
        let home = Home { shared: shared.to_path_buf(), node: node.to_string() };
        let listener = TcpListener::bind((addr, 0)).with_context(|| format!("open a data port on {addr} for other nodes' parts"))?;
        let port = listener.local_addr()?.port();
        let local: Arc<OnceLock<CheckpointDir>> = Arc::default();
        let for_thread = local.clone();
        let key = Key::from_secret(&secret);
        let gate = Gate::new();
        std::thread::Builder::new().name("ckpt-data".into()).spawn(move || {
            for conn in listener.incoming().flatten() {
                let Ok(pass) = gate.enter(&conn) else { continue };
                let (key, local, home) = (key.clone(), for_thread.clone(), home.clone());
                let _ = std::thread::Builder::new().name("ckpt-data-in".into()).spawn(move || {
                    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                    let mut channel = match secure::accept(conn, &key) {
                        Ok(c) => c,
                        Err(e) => {
                            warn!(peer, "refused a connection to the data port: {e}");
                            return;
                        }
                    };
                    drop(pass);
                    if let Err(e) = serve(&mut channel, local.get(), &home) {
                        warn!(peer, "a request from another node failed: {e:#}");
                        let _ = write_frame(&mut channel, &Frame::Error { message: format!("{e:#}") });
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
fn serve(conn: &mut Channel, local: Option<&CheckpointDir>, home: &Home) -> Result<()> {
    conn.set_read_timeout(Some(STORE_TIMEOUT))?;
    let from = match read_frame(&mut *conn)? {
        Frame::Hello { role: Role::Peer { node } } => node,
        _ => bail!("refused: a data port takes parts from agents (role peer) only"),
    };
    match read_frame(&mut *conn)? {
        Frame::PartOffer { generation, node, files } => {
            if node != from {
                bail!("node {from} offered node {node}'s part");
            }
            let local = local.ok_or_else(|| anyhow!("this node has no node-local directory (--local-dir) to keep node {node}'s part in"))?;
            let part = local.local_node_part(generation, &node)?;
            receive_files(&conn.reader, part.node_dir(), &node, &files)?;
            part.keep();
            info!(generation, node, files = files.len(), "kept a copy of another node's part");
            write_frame(&mut *conn, &Frame::PartStored { generation })?;
            Ok(())
        }
        Frame::PartWanted { generation, node } => {
            if node != from {
                bail!("node {from} asked for node {node}'s part");
            }
            hand_back(conn, home, generation, &node)
        }
        Frame::ParityPiece { generation, seg } => {
            let local = local.ok_or_else(|| anyhow!("this node has no node-local directory (--local-dir) to keep XOR parity in"))?;
            add_to_parity(&conn.reader, &local.gen_dir(generation).join(ckpt_core::image::manifest::PARITY_NAME), seg)?;
            write_frame(&mut *conn, &Frame::PartStored { generation })?;
            Ok(())
        }
        Frame::RangeWanted { generation, node, offset, len } => {
            if node != home.node {
                bail!("node {from} asked node {} for node {node}'s part", home.node);
            }
            let gen_dir = CheckpointDir::open(&home.shared)?.gen_dir(generation);
            let manifest = ckpt_core::image::Manifest::load(&gen_dir)?;
            let parts = ckpt_core::image::PartFiles::read_node(&manifest, &gen_dir, &node)?;
            let files = ckpt_core::image::xor::stream_files(parts.of(&node), &node);
            let mut stream = ckpt_core::image::xor::PartStream::open(&manifest.part_dir(&gen_dir, &node), &node, &files)?;
            stream.skip(offset)?;
            write_frame(&mut *conn, &Frame::RangeFollows { len })?;
            let mut w = std::io::BufWriter::with_capacity(PIECE, &mut conn.writer);
            std::io::copy(&mut stream.take(len), &mut w)?;
            w.flush()?;
            Ok(())
        }
        Frame::ParityWanted { generation } => {
            let manifest = ckpt_core::image::Manifest::load(&CheckpointDir::open(&home.shared)?.gen_dir(generation))?;
            let path = manifest.parity_path(&home.node).ok_or_else(|| anyhow!("generation {generation} has no node-local level, so no parity"))?;
            let file = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
            let len = file.metadata()?.len();
            write_frame(&mut *conn, &Frame::RangeFollows { len })?;
            let mut w = std::io::BufWriter::with_capacity(PIECE, &mut conn.writer);
            std::io::copy(&mut file.take(len), &mut w)?;
            w.flush()?;
            Ok(())
        }
        other => bail!("node {from} sent {other:?}"),
    }
}

/// Sends the copy this node keeps of `node`'s part of `generation` (as the manifest lists its
/// files) and waits for the asker to have it durable.
fn hand_back(conn: &mut Channel, home: &Home, generation: u64, node: &str) -> Result<()> {
    let gen_dir = CheckpointDir::open(&home.shared)?.gen_dir(generation);
    let manifest = ckpt_core::image::Manifest::load(&gen_dir)?;
    if !manifest.copies.get(node).is_some_and(|h| h.contains(&home.node)) {
        bail!("node {} keeps no copy of node {node}'s part of generation {generation}", home.node);
    }
    let template = manifest.local_dir.as_deref().ok_or_else(|| anyhow!("generation {generation} has no node-local level"))?;
    let copy = ckpt_core::image::manifest::expand_local_dir(template, &home.node).join(ckpt_core::image::gen_dir_name(generation)).join(node);
    let files: Vec<FileEntry> = ckpt_core::image::PartFiles::read_node(&manifest, &gen_dir, node)?.of(node).to_vec();
    write_frame(&mut *conn, &Frame::PartOffer { generation, node: node.into(), files: files.clone() })?;
    send_files(conn, &copy, node, &files)?;
    match read_frame(&mut *conn)? {
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
        ckpt_core::image::create_private_dirs(&dir).with_context(|| format!("create {}", dir.display()))?;
        let mut out = ckpt_core::image::open_private_file(&path, true).with_context(|| format!("create {}", path.display()))?;
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

/// XORs the `seg` bytes arriving on `conn` into the parity piece at `path` (made, zeros, by
/// the first segment of a generation), durable before this returns. Segments of several
/// members arrive at once: one at a time changes a piece.
fn add_to_parity(mut reader: &ChannelReader, path: &Path, seg: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let piece = ckpt_core::image::open_private_file(path, false).with_context(|| format!("open {}", path.display()))?;
    if piece.metadata()?.len() < seg {
        piece.set_len(seg)?;
    }
    let (mut incoming, mut held) = (vec![0u8; PIECE], vec![0u8; PIECE]);
    let mut at = 0u64;
    while at < seg {
        let n = (seg - at).min(PIECE as u64) as usize;
        reader.read_exact(&mut incoming[..n]).context("receive a segment for the parity piece")?;
        piece.read_exact_at(&mut held[..n], at)?;
        ckpt_core::image::xor::xor_into(&mut held[..n], &incoming[..n]);
        piece.write_all_at(&held[..n], at)?;
        at += n as u64;
    }
    piece.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(())
}

/// Sends one segment of this node's part (`seg` bytes of `segment`) to the node at `addr`, for
/// the parity piece it keeps; returns once it is durable there.
pub fn send_parity_piece(addr: &str, secret: &str, generation: u64, node: &str, seg: u64, mut segment: impl Read) -> Result<()> {
    let mut conn = open(addr, secret, node)?;
    write_frame(&mut conn, &Frame::ParityPiece { generation, seg })?;
    let mut w = std::io::BufWriter::with_capacity(PIECE, &mut conn.writer);
    let sent = std::io::copy(&mut segment, &mut w)?;
    w.flush()?;
    drop(w);
    if sent != seg {
        bail!("sent {sent} bytes of a {seg}-byte segment");
    }
    match read_frame(&mut conn)? {
        Frame::PartStored { generation: g } if g == generation => Ok(()),
        Frame::Error { message } => bail!("{message}"),
        other => bail!("answered {other:?}"),
    }
}

/// A connection to the data port at `addr`, the handshake made with the key of `secret` (both
/// sides proved they hold it) and `hello` said as `node`.
fn open(addr: &str, secret: &str, node: &str) -> Result<Channel> {
    let stream = TcpStream::connect(addr).with_context(|| format!("connect to {addr}"))?;
    let _ = stream.set_nodelay(true);
    let mut conn = secure::connect(stream, &Key::from_secret(secret)).with_context(|| format!("no trusted connection to the data port {addr}"))?;
    conn.set_read_timeout(Some(STORE_TIMEOUT))?;
    write_frame(&mut conn, &Frame::Hello { role: Role::Peer { node: node.into() } })?;
    Ok(conn)
}

/// Asks the node at `addr` for bytes (`what`: a range of its part, or its parity piece) and
/// returns the connection they follow on, `len` of them.
fn ask_range(addr: &str, secret: &str, node: &str, what: Frame, len: u64) -> Result<ChannelReader> {
    let mut conn = open(addr, secret, node)?;
    write_frame(&mut conn, &what)?;
    match read_frame(&mut conn)? {
        Frame::RangeFollows { len: l } if l == len => Ok(conn.split().0),
        Frame::RangeFollows { len: l } => bail!("{addr} offers {l} bytes where {len} were asked (parts of different checkpoints?)"),
        Frame::Error { message } => bail!("{addr}: {message}"),
        other => bail!("{addr} answered {other:?}"),
    }
}

/// Rebuilds `node`'s part of `generation` into `dest` from the other members of its XOR group
/// (`group`, their data ports `addrs`): each segment is the parity piece that holds it XOR the
/// other members' segments that went into that piece, streamed from their nodes; every file's
/// crc32c is checked, and the part made durable.
pub fn rebuild_part(
    manifest: &ckpt_core::image::Manifest,
    parts: &ckpt_core::image::PartFiles,
    secret: &str,
    node: &str,
    group: &[String],
    addrs: &[String],
    dest: &Path,
) -> Result<()> {
    use ckpt_core::image::xor;
    let k = group.len();
    let x = group.iter().position(|m| m == node).ok_or_else(|| anyhow!("node {node} is not in the XOR group {group:?}"))?;
    let lens: Vec<u64> = group.iter().map(|m| xor::stream_files(parts.of(m), m).iter().map(|f| f.size).sum()).collect();
    let seg = xor::segment_len(&lens);
    let mut out = xor::PartWriter::new(dest, node, &xor::stream_files(parts.of(node), node));
    let generation = manifest.generation;
    for j in 0..k - 1 {
        let (h, others) = xor::rebuild_sources(x, j, k);
        let mut parity =
            ask_range(&addrs[h], secret, node, Frame::ParityWanted { generation }, seg).with_context(|| format!("the parity piece of node {}", group[h]))?;
        let mut sources = Vec::new();
        for (m, sj) in others {
            let r = ask_range(&addrs[m], secret, node, Frame::RangeWanted { generation, node: group[m].clone(), offset: sj as u64 * seg, len: seg }, seg)
                .with_context(|| format!("segment {sj} of node {}'s part", group[m]))?;
            sources.push(r);
        }
        let (mut acc, mut other) = (vec![0u8; PIECE], vec![0u8; PIECE]);
        let mut left = seg;
        while left > 0 {
            let n = left.min(PIECE as u64) as usize;
            parity.read_exact(&mut acc[..n]).context("read a parity piece")?;
            for s in &mut sources {
                s.read_exact(&mut other[..n]).context("read a segment of another node's part")?;
                xor::xor_into(&mut acc[..n], &other[..n]);
            }
            out.write_all(&acc[..n]).with_context(|| format!("write node {node}'s rebuilt part into {}", dest.display()))?;
            left -= n as u64;
        }
    }
    out.finish().with_context(|| format!("node {node}'s part rebuilt from its XOR group"))?;
    Ok(())
}

/// Streams the listed files of `node`'s part from `part_dir`, each exactly its listed size.
fn send_files(conn: &mut Channel, part_dir: &Path, node: &str, files: &[FileEntry]) -> Result<()> {
    let mut writer = std::io::BufWriter::with_capacity(PIECE, &mut conn.writer);
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
    let mut conn = open(addr, secret, node)?;
    write_frame(&mut conn, &Frame::PartWanted { generation, node: node.into() })?;
    let files = match read_frame(&mut conn)? {
        Frame::PartOffer { generation: g, node: n, files } if g == generation && n == node => files,
        Frame::Error { message } => bail!("{message}"),
        other => bail!("answered {other:?}"),
    };
    receive_files(&conn.reader, dest, node, &files)?;
    write_frame(&mut conn, &Frame::PartStored { generation })?;
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
    let mut conn = open(addr, secret, node).context("handing over this node's part")?;
    write_frame(&mut conn, &Frame::PartOffer { generation, node: node.into(), files: files.to_vec() })?;
    send_files(&mut conn, part_dir, node, files)?;
    match read_frame(&mut conn).with_context(|| format!("waiting for {addr} to keep this node's part"))? {
        Frame::PartStored { generation: g } if g == generation => Ok(()),
        Frame::Error { message } => bail!("the node at {addr} did not keep this node's part: {message}"),
        other => bail!("the node at {addr} answered {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckpt_core::image::{xor, Manifest};

    /// A group of three nodes on this host, each with its data port: every node sends its
    /// segments to the parity pieces, then node n1's part is lost and rebuilt from the other two
    /// nodes' parts and pieces, byte for byte.
    #[test]
    fn a_lost_member_of_a_group_of_three_is_rebuilt_over_the_data_ports() {
        let dir = tempfile::tempdir().unwrap();
        let shared = CheckpointDir::create(dir.path().join("shared")).unwrap();
        let template = format!("{}/local/{{node}}", dir.path().display());
        let nodes: Vec<String> = ["n0", "n1", "n2"].map(String::from).to_vec();
        let mut manifest = Manifest::new(1, nodes.clone());
        manifest.local_dir = Some(template.clone());
        manifest.xor = vec![nodes.clone()];
        for (i, n) in nodes.iter().enumerate() {
            let part = manifest.part_dir(&shared.gen_dir(1), n);
            std::fs::create_dir_all(part.join("chunks")).unwrap();
            let mut index = ckpt_core::image::PartIndex { generation: 1, node: n.clone(), files: Vec::new() };
            for (name, len) in [("chunks/a", 70_000 + 9_000 * i), ("chunks/b", 1_000 * i + 1)] {
                let data: Vec<u8> = (0..len).map(|b| (b * 31 + i * 7) as u8).collect();
                std::fs::write(part.join(name), &data).unwrap();
                index.files.push(FileEntry { path: format!("{n}/{name}"), size: len as u64, crc32c: crc32c::crc32c(&data) });
            }
            // The node's index is one of its records, in the shared directory.
            let records = shared.gen_dir(1).join(n);
            std::fs::create_dir_all(&records).unwrap();
            manifest.files.push(index.write(&records).unwrap());
        }
        std::fs::create_dir_all(shared.gen_dir(1)).unwrap();
        manifest.commit(&shared.gen_dir(1)).unwrap();

        let secret = "s3cret".to_string();
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for n in &nodes {
            let server = DataServer::start(secret.clone(), shared.root(), n, "127.0.0.1".parse().unwrap()).unwrap();
            server.set_local(&CheckpointDir::create(ckpt_core::image::manifest::expand_local_dir(&template, n)).unwrap());
            addrs.push(format!("127.0.0.1:{}", server.port));
            servers.push(server);
        }
        let parts = ckpt_core::image::PartFiles::read(&manifest, &shared.gen_dir(1)).unwrap();
        let lens: Vec<u64> = nodes.iter().map(|n| xor::stream_files(parts.of(n), n).iter().map(|f| f.size).sum()).collect();
        let seg = xor::segment_len(&lens);
        for (m, n) in nodes.iter().enumerate() {
            let files = xor::stream_files(parts.of(n), n);
            let mut stream = xor::PartStream::open(&manifest.part_dir(&shared.gen_dir(1), n), n, &files).unwrap();
            for j in 0..2 {
                let h = xor::holder_of(m, j, 3);
                send_parity_piece(&addrs[h], &secret, 1, n, seg, Read::take(Read::by_ref(&mut stream), seg)).unwrap();
            }
        }
        let lost = manifest.part_dir(&shared.gen_dir(1), "n1");
        let originals: Vec<Vec<u8>> = ["chunks/a", "chunks/b"].iter().map(|f| std::fs::read(lost.join(f)).unwrap()).collect();
        std::fs::remove_dir_all(&lost).unwrap();
        let dest = dir.path().join("rebuilt");
        let mut ports = addrs.clone();
        ports[1] = String::new();
        rebuild_part(&manifest, &parts, &secret, "n1", &nodes, &ports, &dest).unwrap();
        for (f, original) in ["chunks/a", "chunks/b"].iter().zip(originals) {
            assert_eq!(std::fs::read(dest.join(f)).unwrap(), original, "{f} rebuilt");
        }
        // A wrong secret is refused by every data port.
        assert!(rebuild_part(&manifest, &parts, "wrong", "n1", &nodes, &ports, &dir.path().join("again")).is_err());
    }
}
