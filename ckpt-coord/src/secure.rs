//! Every TCP connection of a job (agent or client to the coordinator, agent to another agent's
//! data port) opens with a handshake that proves, in both directions, that the other side holds
//! the job's secret, without sending it; everything after it is encrypted and authenticated with
//! keys made for that connection (docs/PROTOCOL.md, "Connections"; docs/TRUST.md, "The
//! network").
//!
//! The protocol is Noise `NNpsk0_25519_AESGCM_SHA256` (the `snow` crate does every primitive),
//! its pre-shared key derived from the secret file's text with HKDF-SHA256. Before it, each side
//! says its version in clear (a preamble), and a peer of another version is refused naming
//! both. Before the peer has proved it holds the secret, everything is bounded: one deadline for
//! the whole handshake, messages of a few hundred bytes, a first message (the `hello`) of at most
//! [`MAX_HELLO`] bytes, and a [`Gate`] on the number of connections in handshake.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use snow::StatelessTransportState;

/// The wire protocol's version: 1 was a clear `hello` carrying the secret; 2 is this handshake.
pub const WIRE_VERSION: u16 = 2;
/// The release; peers of another release are refused.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");
/// The whole handshake, up to and including the connecting side's first message, must be over
/// within this.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// The connecting side's first message (its `hello`) is at most this long, sealed.
pub const MAX_HELLO: usize = 4096;
/// Connections in handshake at once, per listener; at the cap the oldest is dropped.
pub const MAX_PENDING: usize = 32;

const NOISE: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
const MAGIC: &[u8; 4] = b"ckpt";
/// A handshake message: an ephemeral key (32 bytes) and an empty payload's tag (16).
const MAX_HANDSHAKE_MESSAGE: usize = 256;
const TAG: usize = 16;
/// A Noise transport message, sealed, and the most plaintext one carries.
const MAX_MESSAGE: usize = 65535;
const MAX_PLAIN: usize = MAX_MESSAGE - TAG;
/// What a reader takes from the socket at once, and what a writer sends at once.
const READ_AHEAD: usize = 256 << 10;
const WRITE_BATCH: usize = 1 << 20;

/// The pre-shared key of a job's connections, derived from its secret.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Key {
    /// HKDF-SHA256 of the secret file's text (as `wire::read_secret` returns it).
    pub fn from_secret(secret: &str) -> Key {
        let mut okm = [0u8; 32];
        hkdf::Hkdf::<sha2::Sha256>::new(Some(b"ckpt wire psk"), secret.as_bytes())
            .expand(b"Noise_NNpsk0 psk0", &mut okm)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        Key(okm)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// A side's version, as its preamble says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub wire: u16,
    pub release: String,
}

impl Version {
    pub fn ours() -> Version {
        Version { wire: WIRE_VERSION, release: RELEASE.to_string() }
    }

    /// `ckpt`, the wire version (u16, big-endian), the release's length (u8) and the release.
    fn preamble(&self) -> Vec<u8> {
        let release = &self.release.as_bytes()[..self.release.len().min(255)];
        let mut p = MAGIC.to_vec();
        p.extend_from_slice(&self.wire.to_be_bytes());
        p.push(release.len() as u8);
        p.extend_from_slice(release);
        p
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ckpt {} (wire protocol {})", self.release, self.wire)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the handshake was not over within {} s", HANDSHAKE_DEADLINE.as_secs())]
    TimedOut,
    #[error("the other side closed the connection during the handshake")]
    Closed,
    #[error("this is {ours}, the other side is {theirs}: run the same ckpt release on every node of a job")]
    Version { ours: Version, theirs: Version },
    #[error("this is {ours}, the other side speaks wire protocol 1 (an older ckpt, whose hello carries the job's secret in clear){}: run the same ckpt release on every node of a job", said.as_ref().map(|s| format!("; it said: {s}")).unwrap_or_default())]
    OldPeer { ours: Version, said: Option<String> },
    #[error("the other side does not speak ckpt's protocol")]
    NotCkpt,
    #[error("the other side does not hold this job's secret (not this job's coordinator or agent: another program may hold the port), or the connection was tampered with")]
    NoSecret,
    #[error("the other side refused: this side does not hold the job's secret (give the job's secret: --dir D holding D/secret, or --secret-file F)")]
    Refused,
    #[error("the other side sent a handshake message of {0} bytes (at most {MAX_HANDSHAKE_MESSAGE})")]
    TooLong(usize),
}

impl From<HandshakeError> for std::io::Error {
    fn from(e: HandshakeError) -> std::io::Error {
        match e {
            HandshakeError::Io(e) => e,
            e => std::io::Error::new(std::io::ErrorKind::PermissionDenied, e.to_string()),
        }
    }
}

fn noise(key: &Key, prologue: &[u8], initiator: bool) -> snow::HandshakeState {
    let params = NOISE.parse().expect("a valid Noise pattern name");
    let builder = snow::Builder::new(params).psk(0, &key.0).and_then(|b| b.prologue(prologue)).expect("a PSK at position 0 and a prologue fit NNpsk0");
    if initiator { builder.build_initiator() } else { builder.build_responder() }.expect("NNpsk0 needs no static key")
}

/// Reads exactly `buf.len()` bytes before `deadline`, whatever the peer's pace.
fn read_by(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> Result<(), HandshakeError> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(HandshakeError::TimedOut)?;
        stream.set_read_timeout(Some(left))?;
        match (&*stream).read(&mut buf[got..]) {
            Ok(0) => return Err(HandshakeError::Closed),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_by(stream: &TcpStream, buf: &[u8], deadline: Instant) -> Result<(), HandshakeError> {
    let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(HandshakeError::TimedOut)?;
    stream.set_write_timeout(Some(left))?;
    (&*stream).write_all(buf).map_err(|e| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            HandshakeError::TimedOut
        } else {
            e.into()
        }
    })
}

/// A u16-length-prefixed message.
fn message(body: &[u8]) -> Vec<u8> {
    let mut m = (body.len() as u16).to_be_bytes().to_vec();
    m.extend_from_slice(body);
    m
}

fn read_message(stream: &TcpStream, max: usize, deadline: Instant) -> Result<Vec<u8>, HandshakeError> {
    let mut len = [0u8; 2];
    read_by(stream, &mut len, deadline)?;
    let len = u16::from_be_bytes(len) as usize;
    if len > max {
        return Err(HandshakeError::TooLong(len));
    }
    let mut body = vec![0u8; len];
    read_by(stream, &mut body, deadline)?;
    Ok(body)
}

/// The rest of a preamble whose magic was read.
fn read_version(stream: &TcpStream, deadline: Instant) -> Result<Version, HandshakeError> {
    let mut head = [0u8; 3];
    read_by(stream, &mut head, deadline)?;
    let mut release = vec![0u8; head[2] as usize];
    read_by(stream, &mut release, deadline)?;
    Ok(Version { wire: u16::from_be_bytes([head[0], head[1]]), release: String::from_utf8_lossy(&release).into_owned() })
}

/// Where a preamble was due: four bytes that are a frame length below 64 MiB are an older ckpt
/// (wire protocol 1, whose frames start so).
fn old_peer(first: [u8; 4]) -> bool {
    u32::from_be_bytes(first) <= 64 << 20
}

fn transport(stream: TcpStream, hs: snow::HandshakeState, first: Vec<u8>) -> Result<Channel, HandshakeError> {
    let keys = Arc::new(hs.into_stateless_transport_mode().map_err(|_| HandshakeError::NoSecret)?);
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let reader = ChannelReader {
        stream: stream.try_clone()?,
        keys: keys.clone(),
        state: Mutex::new(ReadState { nonce: u64::from(!first.is_empty()), raw: Vec::new(), start: 0, end: 0, plain: first, pos: 0, broken: false }),
    };
    let writer = ChannelWriter::new(stream, keys, MAX_HELLO - TAG);
    Ok(Channel { reader, writer })
}

/// The connecting side: says its version, proves it holds the key and checks that the other
/// side does. Its first message after this should be its `hello` (the other side waits for it,
/// within the deadline).
pub fn connect(stream: TcpStream, key: &Key) -> Result<Channel, HandshakeError> {
    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
    let ours = Version::ours();
    let preamble = ours.preamble();
    let mut hs = noise(key, &preamble, true);
    let mut m1 = [0u8; MAX_HANDSHAKE_MESSAGE];
    let n = hs.write_message(&[], &mut m1).expect("message 1 fits");
    let mut first = preamble;
    first.extend_from_slice(&message(&m1[..n]));
    write_by(&stream, &first, deadline)?;

    let mut magic = [0u8; 4];
    read_by(&stream, &mut magic, deadline)?;
    if &magic != MAGIC {
        if !old_peer(magic) {
            return Err(HandshakeError::NotCkpt);
        }
        // An older coordinator answers our preamble with an error frame.
        let len = u32::from_be_bytes(magic) as usize;
        let said = (len <= MAX_HELLO)
            .then(|| {
                let mut body = vec![0u8; len];
                read_by(&stream, &mut body, deadline).ok()?;
                let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                v.get("message").and_then(|m| m.as_str()).map(String::from)
            })
            .flatten();
        return Err(HandshakeError::OldPeer { ours, said });
    }
    let theirs = read_version(&stream, deadline)?;
    if theirs != ours {
        return Err(HandshakeError::Version { ours, theirs });
    }
    let m2 = read_message(&stream, MAX_HANDSHAKE_MESSAGE, deadline)?;
    if m2.is_empty() {
        return Err(HandshakeError::Refused);
    }
    let mut payload = [0u8; MAX_HANDSHAKE_MESSAGE];
    hs.read_message(&m2, &mut payload).map_err(|_| HandshakeError::NoSecret)?;
    transport(stream, hs, Vec::new())
}

/// The answering side: checks the other side's version, that it holds the key (its first
/// message after the handshake, at most [`MAX_HELLO`] bytes, decrypts: a recorded handshake
/// replayed cannot make one), and proves it holds the key. The returned channel's first frame is
/// the other side's `hello`.
pub fn accept(stream: TcpStream, key: &Key) -> Result<Channel, HandshakeError> {
    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
    let ours = Version::ours();
    let mut magic = [0u8; 4];
    read_by(&stream, &mut magic, deadline)?;
    if &magic != MAGIC {
        if !old_peer(magic) {
            return Err(HandshakeError::NotCkpt);
        }
        // An older ckpt's frame (its hello, the secret in it: not read). Its refusal, as it
        // reads them: an error frame.
        let err = HandshakeError::OldPeer { ours: ours.clone(), said: None };
        let body = serde_json::json!({"msg": "error", "message": err.to_string()}).to_string();
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body.as_bytes());
        let _ = write_by(&stream, &frame, deadline);
        return Err(err);
    }
    let theirs = read_version(&stream, deadline)?;
    let preamble = ours.preamble();
    if theirs != ours {
        // Our version, for the other side to name it.
        let _ = write_by(&stream, &preamble, deadline);
        return Err(HandshakeError::Version { ours, theirs });
    }
    let mut hs = noise(key, &preamble, false);
    let m1 = read_message(&stream, MAX_HANDSHAKE_MESSAGE, deadline)?;
    let mut payload = [0u8; MAX_HANDSHAKE_MESSAGE];
    if hs.read_message(&m1, &mut payload).is_err() {
        // An empty message 2 tells an honest peer with a wrong secret why.
        let mut refusal = preamble;
        refusal.extend_from_slice(&message(&[]));
        let _ = write_by(&stream, &refusal, deadline);
        return Err(HandshakeError::NoSecret);
    }
    let mut m2 = [0u8; MAX_HANDSHAKE_MESSAGE];
    let n = hs.write_message(&[], &mut m2).expect("message 2 fits");
    let mut answer = preamble;
    answer.extend_from_slice(&message(&m2[..n]));
    write_by(&stream, &answer, deadline)?;
    let keys = hs.into_stateless_transport_mode().map_err(|_| HandshakeError::NoSecret)?;
    // Key confirmation: the other side's first message, under this connection's keys.
    let sealed = read_message(&stream, MAX_HELLO, deadline)?;
    let mut hello = vec![0u8; sealed.len()];
    let n = keys.read_message(0, &sealed, &mut hello).map_err(|_| HandshakeError::NoSecret)?;
    hello.truncate(n);
    let keys = Arc::new(keys);
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let reader = ChannelReader {
        stream: stream.try_clone()?,
        keys: keys.clone(),
        state: Mutex::new(ReadState { nonce: 1, raw: Vec::new(), start: 0, end: 0, plain: hello, pos: 0, broken: false }),
    };
    let writer = ChannelWriter::new(stream, keys, MAX_PLAIN);
    Ok(Channel { reader, writer })
}

/// An authenticated, encrypted connection: a byte stream both ways.
pub struct Channel {
    pub reader: ChannelReader,
    pub writer: ChannelWriter,
}

impl Channel {
    pub fn split(self) -> (ChannelReader, ChannelWriter) {
        (self.reader, self.writer)
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.reader.set_read_timeout(t)
    }

    pub fn peer_addr(&self) -> std::io::Result<SocketAddr> {
        self.reader.stream.peer_addr()
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.reader.stream.local_addr()
    }
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&self.reader).read(buf)
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.writer.flush()
    }
}

/// The receiving half. Reads through a shared reference (as `&TcpStream` does); a read timeout
/// in the middle of a message loses nothing: the next read goes on with it.
pub struct ChannelReader {
    stream: TcpStream,
    keys: Arc<StatelessTransportState>,
    state: Mutex<ReadState>,
}

struct ReadState {
    nonce: u64,
    /// Sealed bytes from the socket, `start..end` not yet opened.
    raw: Vec<u8>,
    start: usize,
    end: usize,
    /// An opened message, `pos..` not yet read.
    plain: Vec<u8>,
    pos: usize,
    broken: bool,
}

fn tampered() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, "a message failed authentication (tampered with in flight)")
}

impl ChannelReader {
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(t)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    pub fn peer_addr(&self) -> std::io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        self.stream.shutdown(how)
    }
}

impl Read for &ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *guard;
        if s.broken {
            return Err(tampered());
        }
        loop {
            if s.pos < s.plain.len() {
                let n = buf.len().min(s.plain.len() - s.pos);
                buf[..n].copy_from_slice(&s.plain[s.pos..s.pos + n]);
                s.pos += n;
                return Ok(n);
            }
            if buf.is_empty() {
                return Ok(0);
            }
            if s.raw.is_empty() {
                s.raw = vec![0u8; READ_AHEAD];
            }
            if s.end - s.start >= 2 {
                let len = u16::from_be_bytes([s.raw[s.start], s.raw[s.start + 1]]) as usize;
                if len < TAG {
                    s.broken = true;
                    return Err(tampered());
                }
                if s.end - s.start >= 2 + len {
                    let sealed = &s.raw[s.start + 2..s.start + 2 + len];
                    let nonce = s.nonce;
                    // Opened straight into the caller's buffer when it has room.
                    let opened = if buf.len() >= len {
                        self.keys.read_message(nonce, sealed, buf).map(Some)
                    } else {
                        s.plain.resize(len, 0);
                        self.keys.read_message(nonce, sealed, &mut s.plain).map(|n| {
                            s.plain.truncate(n);
                            s.pos = 0;
                            None
                        })
                    };
                    s.start += 2 + len;
                    s.nonce += 1;
                    match opened {
                        Ok(Some(n)) if n > 0 => return Ok(n),
                        Ok(_) => continue,
                        Err(_) => {
                            s.broken = true;
                            s.plain.clear();
                            return Err(tampered());
                        }
                    }
                }
            }
            if s.start == s.end {
                (s.start, s.end) = (0, 0);
            } else if s.raw.len() - s.end < 2 + MAX_MESSAGE {
                s.raw.copy_within(s.start..s.end, 0);
                (s.start, s.end) = (0, s.end - s.start);
            }
            let end = s.end;
            let n = (&self.stream).read(&mut s.raw[end..])?;
            if n == 0 {
                if s.start == s.end {
                    return Ok(0);
                }
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection was cut in the middle of a message"));
            }
            s.end += n;
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        (&*self).read(buf)
    }
}

/// The sending half: what is written is sealed into messages of at most 64 KiB, sent when a
/// message is full or on `flush` (a frame is flushed as a whole).
pub struct ChannelWriter {
    stream: TcpStream,
    keys: Arc<StatelessTransportState>,
    nonce: u64,
    pending: Vec<u8>,
    out: Vec<u8>,
    /// The most plaintext in the next message: the connecting side's first one, its `hello`,
    /// must fit what the other side takes before it is authenticated.
    cap: usize,
}

impl ChannelWriter {
    fn new(stream: TcpStream, keys: Arc<StatelessTransportState>, first_cap: usize) -> ChannelWriter {
        ChannelWriter { stream, keys, nonce: 0, pending: Vec::new(), out: Vec::new(), cap: first_cap }
    }

    fn seal(&mut self, plain: &[u8]) -> std::io::Result<()> {
        self.cap = MAX_PLAIN;
        let at = self.out.len();
        self.out.resize(at + 2 + plain.len() + TAG, 0);
        let n = self.keys.write_message(self.nonce, plain, &mut self.out[at + 2..]).map_err(|e| std::io::Error::other(format!("sealing a message: {e}")))?;
        self.out[at..at + 2].copy_from_slice(&(n as u16).to_be_bytes());
        self.out.truncate(at + 2 + n);
        self.nonce += 1;
        if self.out.len() >= WRITE_BATCH {
            self.send()?;
        }
        Ok(())
    }

    fn send(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            let r = (&self.stream).write_all(&self.out);
            self.out.clear();
            r?;
        }
        Ok(())
    }

    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        self.stream.shutdown(how)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_write_timeout(t)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.stream.local_addr()
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        if !self.pending.is_empty() || self.cap < MAX_PLAIN {
            let take = rest.len().min(self.cap - self.pending.len());
            self.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.pending.len() == self.cap {
                let pending = std::mem::take(&mut self.pending);
                self.seal(&pending)?;
                self.pending = pending;
                self.pending.clear();
            }
        }
        while rest.len() >= MAX_PLAIN {
            self.seal(&rest[..MAX_PLAIN])?;
            rest = &rest[MAX_PLAIN..];
        }
        self.pending.extend_from_slice(rest);
        self.send()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            let sealed = self.seal(&pending);
            self.pending = pending;
            self.pending.clear();
            sealed?;
        }
        self.send()
    }
}

/// Bounds the connections of a listener that have not finished their handshake: at most
/// [`MAX_PENDING`]; a new one beyond drops the oldest (a peer that holds the secret finishes in a
/// round trip; a flood's connections linger).
#[derive(Default)]
pub struct Gate {
    pending: Mutex<VecDeque<(u64, TcpStream)>>,
    next: AtomicU64,
}

/// A connection's place in a [`Gate`], given up when dropped.
pub struct Pass {
    gate: Arc<Gate>,
    id: u64,
}

impl Gate {
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Lets `stream` in, dropping the oldest connection in handshake if there are too many.
    pub fn enter(self: &Arc<Gate>, stream: &TcpStream) -> std::io::Result<Pass> {
        let id = self.next.fetch_add(1, Relaxed);
        let clone = stream.try_clone()?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while pending.len() >= MAX_PENDING {
            if let Some((_, old)) = pending.pop_front() {
                let _ = old.shutdown(Shutdown::Both);
            }
        }
        pending.push_back((id, clone));
        Ok(Pass { gate: self.clone(), id })
    }

    /// Connections in handshake now.
    pub fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.pending.lock().unwrap_or_else(|p| p.into_inner()).retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// Runs `serve` on the accepting end in a thread and `client` here.
    fn both<A: Send + 'static, B>(serve: impl FnOnce(TcpStream) -> A + Send + 'static, client: impl FnOnce(TcpStream) -> B) -> (A, B) {
        let (c, s) = pair();
        let t = std::thread::spawn(move || serve(s));
        let b = client(c);
        (t.join().unwrap(), b)
    }

    #[test]
    fn a_conversation_both_ways_large_and_small() {
        let key = Key::from_secret(&"ab".repeat(32));
        let k2 = key.clone();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let expect = big.clone();
        let (got, ()) = both(
            move |s| {
                let mut ch = accept(s, &k2).unwrap();
                let mut hello = [0u8; 5];
                ch.read_exact(&mut hello).unwrap();
                assert_eq!(&hello, b"hello");
                let mut all = Vec::new();
                ch.read_to_end(&mut all).unwrap();
                ch.write_all(b"stored").unwrap();
                ch.flush().unwrap();
                all
            },
            |c| {
                let mut ch = connect(c, &key).unwrap();
                ch.write_all(b"hello").unwrap();
                ch.flush().unwrap();
                for piece in big.chunks(100_003) {
                    ch.write_all(piece).unwrap();
                }
                ch.flush().unwrap();
                ch.writer.shutdown(Shutdown::Write).unwrap();
                let mut answer = Vec::new();
                ch.read_to_end(&mut answer).unwrap();
                assert_eq!(answer, b"stored");
            },
        );
        assert!(got == expect, "the bytes arrive as sent");
    }

    #[test]
    fn a_wrong_secret_is_refused_both_ways() {
        // The connecting side holds the wrong secret: the answering side refuses it, and it is
        // told so.
        let (served, connected) = both(|s| accept(s, &Key::from_secret("11")).err(), |c| connect(c, &Key::from_secret("22")).err());
        assert!(matches!(served, Some(HandshakeError::NoSecret)), "{served:?}");
        assert!(matches!(connected, Some(HandshakeError::Refused)), "{connected:?}");
        // The answering side (a fake coordinator) plays along with a key of its own: the
        // connecting side cannot open its message 2 and goes no further.
        let (_, connected) = both(
            |s| {
                let mut magic = [0u8; 4];
                (&s).read_exact(&mut magic).unwrap();
                let deadline = Instant::now() + HANDSHAKE_DEADLINE;
                let v = read_version(&s, deadline).unwrap();
                let preamble = v.preamble();
                let mut hs = noise(&Key::from_secret("fake"), &preamble, false);
                let m1 = read_message(&s, 256, deadline).unwrap();
                let mut p = [0u8; 256];
                // A responder without the key cannot even read message 1.
                assert!(hs.read_message(&m1, &mut p).is_err());
                let mut hs = noise(&Key::from_secret("fake"), &preamble, true);
                let mut m2 = [0u8; 256];
                let n = hs.write_message(&[], &mut m2).unwrap();
                let mut answer = preamble;
                answer.extend_from_slice(&message(&m2[..n]));
                (&s).write_all(&answer).unwrap();
            },
            |c| connect(c, &Key::from_secret("real")).err(),
        );
        assert!(matches!(connected, Some(HandshakeError::NoSecret)), "{connected:?}");
    }

    /// A message changed in flight, dropped or replayed, fails authentication; so does anything
    /// after it.
    #[test]
    fn a_tampered_message_is_refused() {
        let key = Key::from_secret("k");
        for change in ["flip", "drop", "replay"] {
            let k2 = key.clone();
            let (result, ()) = both(
                move |s| {
                    let mut ch = accept(s, &k2).unwrap();
                    let mut hello = [0u8; 2];
                    ch.read_exact(&mut hello).unwrap();
                    let mut rest = Vec::new();
                    ch.read_to_end(&mut rest).map_err(|e| e.kind())
                },
                |c| {
                    let raw = c.try_clone().unwrap();
                    let mut ch = connect(c, &key).unwrap();
                    ch.write_all(b"hi").unwrap();
                    ch.flush().unwrap();
                    // Seal two messages by hand and put them on the wire changed.
                    let mut sealed = Vec::new();
                    for body in [&b"first"[..], &b"second"[..]] {
                        let mut m = vec![0u8; body.len() + TAG];
                        let n = ch.writer.keys.write_message(ch.writer.nonce, body, &mut m).unwrap();
                        ch.writer.nonce += 1;
                        sealed.push(message(&m[..n]));
                    }
                    let wire: Vec<u8> = match change {
                        "flip" => {
                            let mut m = sealed[0].clone();
                            m[5] ^= 1;
                            m
                        }
                        "drop" => sealed[1].clone(),
                        _ => [sealed[0].clone(), sealed[0].clone()].concat(),
                    };
                    (&raw).write_all(&wire).unwrap();
                    raw.shutdown(Shutdown::Write).unwrap();
                },
            );
            assert_eq!(result, Err(std::io::ErrorKind::InvalidData), "{change}");
        }
    }

    /// What a connecting side sent, replayed on a new connection, gets message 2 and no further:
    /// the keys are new, and the replayed `hello` does not open.
    #[test]
    fn a_recorded_handshake_replayed_gets_nothing() {
        let key = Key::from_secret("k");
        // A real conversation, through a relay that records what the connecting side sends.
        let real = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = TcpListener::bind("127.0.0.1:0").unwrap();
        let (k1, k2) = (key.clone(), key.clone());
        let real_addr = real.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = real.accept().unwrap();
            let mut ch = accept(s, &k1).unwrap();
            let mut asked = [0u8; 26];
            ch.read_exact(&mut asked).unwrap();
            ch.write_all(b"done").unwrap();
            ch.flush().unwrap();
        });
        let relay_addr = relay.local_addr().unwrap();
        let recorder = std::thread::spawn(move || {
            let (from, _) = relay.accept().unwrap();
            let to = TcpStream::connect(real_addr).unwrap();
            let (from2, to2) = (from.try_clone().unwrap(), to.try_clone().unwrap());
            let back = std::thread::spawn(move || std::io::copy(&mut &to2, &mut &from2));
            let mut recorded = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match (&from).read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        recorded.extend_from_slice(&buf[..n]);
                        (&to).write_all(&buf[..n]).unwrap();
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Write);
            let _ = back.join();
            recorded
        });
        let mut ch = connect(TcpStream::connect(relay_addr).unwrap(), &k2).unwrap();
        ch.write_all(b"hello, a checkpoint please").unwrap();
        ch.flush().unwrap();
        let mut done = [0u8; 4];
        ch.read_exact(&mut done).unwrap();
        assert_eq!(&done, b"done");
        ch.writer.shutdown(Shutdown::Both).unwrap();
        server.join().unwrap();
        let recorded = recorder.join().unwrap();
        assert!(recorded.len() > 48 + 26, "recorded {} bytes", recorded.len());
        // Replayed on a new connection: message 2 comes (new keys), the hello does not open.
        let (served, ()) = both(move |s| accept(s, &key).err(), move |c| (&c).write_all(&recorded).unwrap());
        assert!(matches!(served, Some(HandshakeError::NoSecret)), "{served:?}");
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        let (served, connected) = both(
            |s| accept(s, &Key::from_secret("k")).err().map(|e| e.to_string()),
            |c| {
                let theirs = Version { wire: 3, release: "9.9.9".into() };
                (&c).write_all(&theirs.preamble()).unwrap();
                let mut magic = [0u8; 4];
                (&c).read_exact(&mut magic).unwrap();
                read_version(&c, Instant::now() + HANDSHAKE_DEADLINE).unwrap()
            },
        );
        let served = served.unwrap();
        assert!(served.contains("9.9.9") && served.contains(RELEASE) && served.contains("wire protocol 3"), "{served}");
        assert_eq!(connected, Version::ours(), "the other side learns our version");
        // A peer of wire protocol 1 (its hello carries the secret in clear) gets an error frame
        // it can read.
        let (served, answer) = both(
            |s| accept(s, &Key::from_secret("k")).err(),
            |c| {
                let body = br#"{"msg":"hello","secret":"00","role":{"role":"client"}}"#;
                (&c).write_all(&(body.len() as u32).to_be_bytes()).unwrap();
                (&c).write_all(body).unwrap();
                let mut len = [0u8; 4];
                (&c).read_exact(&mut len).unwrap();
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
                (&c).read_exact(&mut body).unwrap();
                serde_json::from_slice::<serde_json::Value>(&body).unwrap()
            },
        );
        assert!(matches!(served, Some(HandshakeError::OldPeer { .. })));
        assert_eq!(answer["msg"], "error");
        assert!(answer["message"].as_str().unwrap().contains(RELEASE) && answer["message"].as_str().unwrap().contains("wire protocol 1"), "{answer}");
    }

    /// A peer that trickles its handshake is cut off at the one deadline, and one that claims a
    /// large message is refused before anything is allocated.
    #[test]
    fn the_handshake_is_bounded() {
        let t = Instant::now();
        let (served, ()) = both(
            |s| accept(s, &Key::from_secret("k")).err(),
            |c| {
                let mut p = Version::ours().preamble();
                p.extend_from_slice(&[0, 48]);
                for b in p {
                    if (&c).write_all(&[b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(400));
                }
            },
        );
        assert!(matches!(served, Some(HandshakeError::TimedOut)), "{served:?}");
        assert!(t.elapsed() < HANDSHAKE_DEADLINE + Duration::from_secs(2), "{:?}", t.elapsed());
        let (served, ()) = both(
            |s| accept(s, &Key::from_secret("k")).err(),
            |c| {
                let mut p = Version::ours().preamble();
                p.extend_from_slice(&[0xff, 0xff]);
                (&c).write_all(&p).unwrap();
            },
        );
        assert!(matches!(served, Some(HandshakeError::TooLong(65535))), "{served:?}");
    }

    #[test]
    fn the_gate_drops_the_oldest_beyond_its_cap() {
        let gate = Gate::new();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut kept = Vec::new();
        for _ in 0..MAX_PENDING + 3 {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            kept.push((gate.enter(&s).unwrap(), c, s));
        }
        assert_eq!(gate.pending(), MAX_PENDING);
        // The first three were shut down.
        for (_, c, _) in &kept[..3] {
            let mut b = [0u8; 1];
            let mut c: &TcpStream = c;
            assert_eq!(c.read(&mut b).unwrap(), 0);
        }
        kept.truncate(5);
        assert_eq!(gate.pending(), 2);
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `cargo test --release -p ckpt-coord secure::speed -- --ignored --nocapture`: how fast a
    /// channel carries bulk bytes over loopback (sealing on one core, opening on another).
    #[test]
    #[ignore = "a measurement, not a test"]
    fn throughput() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let key = Key::from_secret("k");
        let k2 = key.clone();
        const TOTAL: usize = 1 << 30;
        let t = std::thread::spawn(move || {
            let mut ch = accept(s, &k2).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut got = 0;
            while got < TOTAL + 1 {
                let n = ch.read(&mut buf).unwrap();
                assert!(n > 0);
                got += n;
            }
        });
        let mut ch = connect(c, &key).unwrap();
        ch.write_all(b"h").unwrap();
        let buf = vec![7u8; 1 << 20];
        let start = Instant::now();
        for _ in 0..TOTAL / buf.len() {
            ch.write_all(&buf).unwrap();
        }
        ch.flush().unwrap();
        t.join().unwrap();
        let secs = start.elapsed().as_secs_f64();
        eprintln!("1 GiB sealed, sent and opened in {secs:.3} s: {:.2} GB/s", TOTAL as f64 / secs / 1e9);
    }
}
