//! Fuzzes what a coordinator or an agent's data port reads from the network (docs/PROTOCOL.md,
//! "Connections"): the handshake as the answering side takes it from anyone (preamble, Noise
//! message 1, the first transport message, an old peer's frame), and, behind a real handshake,
//! transport messages and the frames inside them, as a peer holding the secret could send them.
//! Every input must end in an error or a value, within the handshake's bounds; a panic, an
//! overflow, a hang or a huge allocation is a bug.
//!
//! The first byte of an input chooses what the rest is (its value modulo 3). By hand, from the
//! repository's root: `cargo fuzz run wire --sanitizer none`; scripts/fuzz.sh runs it too.

#![no_main]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::OnceLock;

use ckpt_coord::secure::{accept, connect, Key};
use ckpt_coord::wire::{read_frame, Frame};
use libfuzzer_sys::fuzz_target;

fn listener() -> &'static TcpListener {
    static L: OnceLock<TcpListener> = OnceLock::new();
    L.get_or_init(|| TcpListener::bind("127.0.0.1:0").expect("a loopback port"))
}

/// A connected pair on loopback: (connecting end, accepted end).
fn pair() -> (TcpStream, TcpStream) {
    let c = TcpStream::connect(listener().local_addr().unwrap()).unwrap();
    let (s, _) = listener().accept().unwrap();
    (c, s)
}

fn key() -> Key {
    Key::from_secret("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    // Within what a socket buffer takes without a reader.
    let rest = &rest[..rest.len().min(32 << 10)];
    match mode % 3 {
        // Anyone's bytes to the answering side of a handshake.
        0 => {
            let (c, s) = pair();
            let _ = (&c).write_all(rest);
            let _ = c.shutdown(Shutdown::Write);
            if let Ok(mut ch) = accept(s, &key()) {
                while read_frame(&mut ch).is_ok() {}
            }
        }
        // A preamble made right, then the input as message 1 and on.
        1 => {
            let (c, s) = pair();
            let mut p = b"ckpt".to_vec();
            p.extend_from_slice(&2u16.to_be_bytes());
            let release = env!("CARGO_PKG_VERSION");
            p.push(release.len() as u8);
            p.extend_from_slice(release.as_bytes());
            let _ = (&c).write_all(&p);
            let _ = (&c).write_all(rest);
            let _ = c.shutdown(Shutdown::Write);
            let _ = accept(s, &key());
        }
        // Behind a real handshake and hello: the input as transport messages, read as frames
        // and as raw bytes.
        _ => {
            let (c, s) = pair();
            let raw = c.try_clone().unwrap();
            let server = std::thread::spawn(move || {
                let Ok(mut ch) = accept(s, &key()) else { return };
                let _ = read_frame(&mut ch);
                let mut sink = [0u8; 4096];
                loop {
                    match read_frame(&mut ch) {
                        Ok(Frame::RangeFollows { .. }) => {
                            while matches!(ch.read(&mut sink), Ok(n) if n > 0) {}
                            break;
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
            if let Ok(mut ch) = connect(c, &key()) {
                let _ = ckpt_coord::wire::write_frame(&mut ch, &Frame::Heartbeat);
                let _ = (&raw).write_all(rest);
            }
            let _ = raw.shutdown(Shutdown::Both);
            let _ = server.join();
        }
    }
});
