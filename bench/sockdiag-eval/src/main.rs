//! Measures the cost of parsing a sock_diag Unix dump (and, smaller, a TCP inet dump) with
//! ckpt's hand-written parser versus netlink-packet-sock-diag 0.5 over netlink-packet-core 0.9.
//!
//! Run as root: `target/release/sockdiag-eval [PAIRS] [REPS]` (defaults 20000 and 20).

use std::collections::HashMap;
use std::hint::black_box;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use ckpt_core::sockdiag::{dump_message, inet_request, parse_inet_msg, parse_unix_msg, unix_request, walk_answers, InetDiag, UnixDiag};
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::{
    inet::{nlas::Nla as InetNla, ExtensionFlags, InetRequest, SocketId, StateFlags as InetStates},
    unix::{nlas::Nla as UnixNla, nlas::UnixDiagName, ShowFlags, StateFlags as UnixStates, UnixRequest},
    SockDiagMessage,
};

// =============================================================================================
// ckpt's side: ckpt-core's own requests, walk of the answers and parsers (ckpt_core::sockdiag).
// =============================================================================================

const NETLINK_SOCK_DIAG: libc::c_int = 4;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;

fn our_unix_request() -> Vec<u8> {
    dump_message(&unix_request())
}

fn our_inet_request(family: u8, protocol: u8) -> Vec<u8> {
    dump_message(&inet_request(family, protocol))
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// ckpt's walk of one received buffer: Ok(true) once the dump is done.
fn our_frame(buf: &[u8], each: &mut impl FnMut(&[u8])) -> io::Result<bool> {
    walk_answers(buf, "the measured dump", each)
}

// ---- Parsing the received buffers: ours -----------------------------------------------------

fn ours_parse_unix(bufs: &[Vec<u8>]) -> HashMap<u32, UnixDiag> {
    let mut out = HashMap::new();
    let mut each = |body: &[u8]| {
        if let Some(d) = parse_unix_msg(body) {
            out.insert(d.ino, d);
        }
    };
    for b in bufs {
        if our_frame(b, &mut each).unwrap() {
            break;
        }
    }
    out
}

fn ours_parse_inet(bufs: &[Vec<u8>]) -> Vec<InetDiag> {
    let mut out = Vec::new();
    let mut each = |body: &[u8]| out.extend(parse_inet_msg(body));
    for b in bufs {
        if our_frame(b, &mut each).unwrap() {
            break;
        }
    }
    out
}

// ---- Parsing the received buffers: the crate ------------------------------------------------

/// Walks every netlink message of every buffer through NetlinkMessage::<SockDiagMessage>::
/// deserialize; `each` gets every SockDiagMessage. Stops at NLMSG_DONE; an error message or a
/// message the crate cannot parse is an error.
fn crate_frame(bufs: &[Vec<u8>], mut each: impl FnMut(SockDiagMessage)) -> Result<(), String> {
    for b in bufs {
        let mut at = 0;
        while at < b.len() {
            let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&b[at..]).map_err(|e| e.to_string())?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => return Err(format!("sock_diag: {e:?}")),
                NetlinkPayload::InnerMessage(m) => each(m),
                _ => {}
            }
            at += align4(len);
        }
    }
    Ok(())
}

fn from_crate_unix(r: &netlink_packet_sock_diag::unix::UnixResponse) -> UnixDiag {
    let mut d = UnixDiag { ino: r.header.inode, sock_type: r.header.kind, state: r.header.state, ..UnixDiag::default() };
    for nla in &r.nlas {
        match nla {
            UnixNla::Name(UnixDiagName::Pathname(p)) => d.name = Some(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec()),
            UnixNla::Name(UnixDiagName::Abstract(a)) => {
                let mut n = Vec::with_capacity(a.len() + 1);
                n.push(0);
                n.extend_from_slice(a);
                d.name = Some(n);
            }
            UnixNla::Peer(p) => d.peer = Some(*p),
            UnixNla::PendingConnections(v) => d.pending = v.clone(),
            UnixNla::ReceiveQueueLength(n, _) => d.rqueue = *n,
            UnixNla::Shutdown(s) => d.shutdown = *s,
            // The crate's "max_datagram_size" is sk_meminfo[3], SK_MEMINFO_SNDBUF.
            UnixNla::MemInfo(m) => d.bufs = Some((m.so_rcvbuf as i32, m.max_datagram_size as i32)),
            _ => {}
        }
    }
    d
}

/// As an adopter would write it: owning the parsed message, moving its vectors out.
fn crate_parse_unix(bufs: &[Vec<u8>]) -> HashMap<u32, UnixDiag> {
    let mut out = HashMap::new();
    crate_frame(bufs, |m| {
        if let SockDiagMessage::UnixResponse(r) = m {
            let mut r = *r;
            let mut d = UnixDiag { ino: r.header.inode, sock_type: r.header.kind, state: r.header.state, ..UnixDiag::default() };
            for nla in r.nlas.drain(..) {
                match nla {
                    UnixNla::Name(UnixDiagName::Pathname(p)) => d.name = Some(p.into_vec()),
                    UnixNla::Name(UnixDiagName::Abstract(mut a)) => {
                        a.insert(0, 0);
                        d.name = Some(a);
                    }
                    UnixNla::Peer(p) => d.peer = Some(p),
                    UnixNla::PendingConnections(v) => d.pending = v,
                    UnixNla::ReceiveQueueLength(n, _) => d.rqueue = n,
                    UnixNla::Shutdown(s) => d.shutdown = s,
                    UnixNla::MemInfo(m) => d.bufs = Some((m.so_rcvbuf as i32, m.max_datagram_size as i32)),
                    _ => {}
                }
            }
            out.insert(d.ino, d);
        }
    })
    .unwrap();
    out
}

fn crate_parse_inet(bufs: &[Vec<u8>]) -> Vec<InetDiag> {
    let mut out = Vec::new();
    crate_frame(bufs, |m| {
        if let SockDiagMessage::InetResponse(r) = m {
            let h = &r.header;
            let shutdown = r.nlas.iter().find_map(|n| if let InetNla::Shutdown(s) = n { Some(*s) } else { None }).unwrap_or(0);
            out.push(InetDiag {
                family: h.family,
                state: h.state,
                local: std::net::SocketAddr::new(h.socket_id.source_address, h.socket_id.source_port),
                remote: std::net::SocketAddr::new(h.socket_id.destination_address, h.socket_id.destination_port),
                ino: h.inode,
                rqueue: h.recv_queue,
                wqueue: h.send_queue,
                shutdown,
                netns: 0,
            });
        }
    })
    .unwrap();
    out
}

// ---- The requests built with the crate ------------------------------------------------------

fn crate_unix_request() -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let req = UnixRequest {
        // from_bits_retain: StateFlags::all() is only ESTABLISHED|LISTEN and would drop
        // unconnected (TCP_CLOSE) sockets.
        state_flags: UnixStates::from_bits_retain(u32::MAX),
        inode: 0,
        show_flags: ShowFlags::NAME | ShowFlags::PEER | ShowFlags::ICONS | ShowFlags::RQLEN | ShowFlags::MEMINFO,
        cookie: [0xff; 8],
    };
    let mut msg = NetlinkMessage::new(header, SockDiagMessage::UnixRequest(req).into());
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

fn crate_inet_request(family: u8, protocol: u8) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let req = InetRequest {
        family,
        protocol,
        extensions: ExtensionFlags::empty(),
        // from_bits_retain: StateFlags::all() lacks NEW_SYN_RECV (12) and BOUND_INACTIVE (13).
        states: InetStates::from_bits_retain(u32::MAX),
        socket_id: if family == libc::AF_INET as u8 { SocketId::new_v4() } else { SocketId::new_v6() },
    };
    let mut msg = NetlinkMessage::new(header, SockDiagMessage::InetRequest(req).into());
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

// ---- Plumbing ------------------------------------------------------------------------------

fn diag_socket() -> OwnedFd {
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    assert!(fd >= 0, "{}", io::Error::last_os_error());
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn send(sock: &OwnedFd, msg: &[u8]) {
    let n = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    assert_eq!(n, msg.len() as isize, "{}", io::Error::last_os_error());
}

fn recv(sock: &OwnedFd, buf: &mut [u8]) -> usize {
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert!(n >= 0, "{}", io::Error::last_os_error());
    n as usize
}

/// Receives the whole answer to a dump as the buffers recv gave (64 KiB reads, as ours does).
fn receive_dump(sock: &OwnedFd, request: &[u8]) -> Vec<Vec<u8>> {
    send(sock, request);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(sock, &mut buf);
        let b = buf[..n].to_vec();
        let done = contains_done(&b);
        out.push(b);
        if done {
            return out;
        }
    }
}

fn contains_done(b: &[u8]) -> bool {
    let mut m = b;
    while m.len() >= 16 {
        let len = u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize;
        let ty = u16::from_ne_bytes(m[4..6].try_into().unwrap());
        if ty == NLMSG_DONE || ty == NLMSG_ERROR {
            return true;
        }
        m = &m[align4(len).min(m.len())..];
    }
    false
}

/// Whole dump, ours: send, then recv and parse each buffer as it comes (dump_through's shape).
fn ours_whole_unix(sock: &OwnedFd) -> HashMap<u32, UnixDiag> {
    send(sock, &our_unix_request());
    let mut out = HashMap::new();
    let mut each = |body: &[u8]| {
        if let Some(d) = parse_unix_msg(body) {
            out.insert(d.ino, d);
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(sock, &mut buf);
        if our_frame(&buf[..n], &mut each).unwrap() {
            break;
        }
    }
    out
}

/// Whole dump, crate: the crate's request, the same recv, the crate's parse per buffer.
fn crate_whole_unix(sock: &OwnedFd) -> HashMap<u32, UnixDiag> {
    send(sock, &crate_unix_request());
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(sock, &mut buf);
        let b = &buf[..n];
        let mut at = 0;
        let mut done = false;
        while at < b.len() {
            let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&b[at..]).unwrap();
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::Done(_) => {
                    done = true;
                    break;
                }
                NetlinkPayload::Error(e) => panic!("{e:?}"),
                NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r)) => {
                    let d = from_crate_unix(&r);
                    out.insert(d.ino, d);
                }
                _ => {}
            }
            at += align4(len);
        }
        if done {
            break;
        }
    }
    out
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    let n = v.len();
    let m = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2 };
    m.as_secs_f64() * 1e3
}

fn time<R>(f: impl FnOnce() -> R) -> (Duration, R) {
    let t = Instant::now();
    let r = black_box(f());
    (t.elapsed(), r)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pairs: usize = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(20_000);
    let reps: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(20);

    // Room for the sockets. Raising the hard limit needs CAP_SYS_RESOURCE, which this sandbox's
    // root lacks (hard limit 20000): the pairs are made and held by child processes of at most
    // 8000 pairs each, which sock_diag lists all the same (it dumps the network namespace).
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let want = (pairs as u64) * 2 + 10_000;
    let raise = libc::rlimit { rlim_cur: want.max(lim.rlim_cur), rlim_max: want.max(lim.rlim_max) };
    let raised = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raise) } == 0;
    if !raised {
        lim.rlim_cur = lim.rlim_max;
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        println!("RLIMIT_NOFILE: could not raise to {want} ({}); soft=hard={}, pairs held by children", io::Error::last_os_error(), lim.rlim_max);
    }

    // --- The sockets -----------------------------------------------------------------------
    let dir = std::path::PathBuf::from("/tmp/sockdiag-eval/run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let per_child = if raised { pairs } else { 8000 };
    let mut children = Vec::new();
    let mut made = 0;
    while made < pairs {
        let n = per_child.min(pairs - made);
        children.push(hold_pairs_in_child(n, made));
        made += n;
    }
    let keep_streams_len = pairs * 2;
    let _reap = Reap(children.clone());
    // Listeners with pending connections: 50 by path, 50 abstract, 8 connections waiting each.
    let mut listeners = Vec::new();
    let mut clients = Vec::new();
    for i in 0..100 {
        let l = if i % 2 == 0 {
            UnixListener::bind(dir.join(format!("listen-{i}"))).unwrap()
        } else {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(format!("sockdiag-eval-{}-{i}", std::process::id())).unwrap();
            UnixListener::bind_addr(&addr).unwrap()
        };
        let addr = l.local_addr().unwrap();
        for _ in 0..8 {
            clients.push(UnixStream::connect_addr(&addr).unwrap());
        }
        listeners.push(l);
    }
    // Bound, unconnected datagram sockets (state 7: only found with every state asked for).
    let mut dgrams = Vec::new();
    for i in 0..100 {
        dgrams.push(UnixDatagram::bind(dir.join(format!("dgram-{i}"))).unwrap());
    }
    // Some TCP loopback connections for the inet check.
    let tl = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taddr = tl.local_addr().unwrap();
    let mut tcp = Vec::new();
    for i in 0..1000 {
        let c = std::net::TcpStream::connect(taddr).unwrap();
        let (s, _) = tl.accept().unwrap();
        if i % 5 == 0 {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        tcp.push(c);
        tcp.push(s);
    }

    // --- Request building ----------------------------------------------------------------------
    assert_eq!(our_unix_request(), crate_unix_request(), "the Unix requests differ");
    for fam in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        assert_eq!(our_inet_request(fam, libc::IPPROTO_TCP as u8), crate_inet_request(fam, libc::IPPROTO_TCP as u8), "the inet requests differ");
    }
    const N: u32 = 1_000_000;
    let t = Instant::now();
    for _ in 0..N {
        black_box(our_unix_request());
    }
    let req_ours = t.elapsed().as_secs_f64() * 1e9 / N as f64;
    let t = Instant::now();
    for _ in 0..N {
        black_box(crate_unix_request());
    }
    let req_crate = t.elapsed().as_secs_f64() * 1e9 / N as f64;

    // --- One dump, parsed both ways, compared --------------------------------------------------
    let sock = diag_socket();
    let bufs = receive_dump(&sock, &our_unix_request());
    let bytes: usize = bufs.iter().map(|b| b.len()).sum();
    let a = ours_parse_unix(&bufs);
    let b = crate_parse_unix(&bufs);
    assert_eq!(a, b, "the two parses differ");
    // The accepting ends of pending connections are not in the socket table: they show only
    // in their listener's UNIX_DIAG_ICONS.
    let mine = keep_streams_len + listeners.len() + clients.len() + dgrams.len();
    assert!(a.len() >= mine, "dump has {} sockets, made {mine}", a.len());
    let with_name = a.values().filter(|d| d.name.is_some()).count();
    let with_pending = a.values().filter(|d| !d.pending.is_empty()).count();
    let with_shutdown = a.values().filter(|d| d.shutdown != 0).count();
    let with_rq = a.values().filter(|d| d.rqueue != 0).count();
    let state7 = a.values().filter(|d| d.state == 7).count();
    println!(
        "unix dump: {} sockets ({} made here), {} netlink messages bytes in {} recv buffers; named {with_name}, listening-with-pending {with_pending}, shutdown {with_shutdown}, rqueue>0 {with_rq}, unconnected {state7}",
        a.len(),
        mine,
        bytes,
        bufs.len()
    );

    // --- Parse only, interleaved ---------------------------------------------------------------
    let (mut p_ours, mut p_crate) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (d, r) = time(|| ours_parse_unix(&bufs));
        assert_eq!(r.len(), a.len());
        p_ours.push(d);
        let (d, r) = time(|| crate_parse_unix(&bufs));
        assert_eq!(r.len(), a.len());
        p_crate.push(d);
    }

    // --- Whole dump (send + receive + parse), interleaved --------------------------------------
    let (mut w_ours, mut w_crate) = (Vec::new(), Vec::new());
    let (mut r_only, mut last_o, mut last_c) = (Vec::new(), HashMap::new(), HashMap::new());
    for _ in 0..reps {
        let (d, r) = time(|| ours_whole_unix(&sock));
        w_ours.push(d);
        last_o = r;
        let (d, r) = time(|| crate_whole_unix(&sock));
        w_crate.push(d);
        last_c = r;
        let (d, _) = time(|| receive_dump(&sock, &our_unix_request()));
        r_only.push(d);
    }
    assert_eq!(last_o, last_c, "the whole dumps differ");

    println!("unix parse only   (median of {reps}): ours {:.2} ms, crate {:.2} ms", median(p_ours), median(p_crate));
    println!("unix whole dump   (median of {reps}): ours {:.2} ms, crate {:.2} ms", median(w_ours), median(w_crate));
    println!("unix receive only (median of {reps}): {:.2} ms (send + recv into buffers, no parse)", median(r_only));
    println!("unix request build: ours {req_ours:.0} ns, crate {req_crate:.0} ns (one request per dump)");

    // --- TCP (inet) check: same fields both ways, and parse time -------------------------------
    let ibufs = receive_dump(&sock, &our_inet_request(libc::AF_INET as u8, libc::IPPROTO_TCP as u8));
    let ia = ours_parse_inet(&ibufs);
    let ib = crate_parse_inet(&ibufs);
    assert_eq!(ia, ib, "the two inet parses differ");
    let (mut i_ours, mut i_crate) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        i_ours.push(time(|| ours_parse_inet(&ibufs)).0);
        i_crate.push(time(|| crate_parse_inet(&ibufs)).0);
    }
    let shut = ia.iter().filter(|d| d.shutdown != 0).count();
    // Which attributes the kernel sent (extensions 0), to explain the crate's cost.
    let mut kinds: std::collections::BTreeMap<u16, usize> = Default::default();
    let mut each = |body: &[u8]| {
        let mut attrs = &body[72..];
        while attrs.len() >= 4 {
            let len = u16::from_ne_bytes(attrs[0..2].try_into().unwrap()) as usize;
            *kinds.entry(u16::from_ne_bytes(attrs[2..4].try_into().unwrap())).or_default() += 1;
            attrs = &attrs[align4(len).min(attrs.len())..];
        }
    };
    for b in &ibufs {
        if our_frame(b, &mut each).unwrap() {
            break;
        }
    }
    // SOCK_DESTROY bodies: ours (the dumped id bytes as they came) and the crate's (an
    // InetRequest rebuilt from the parsed SocketId, as SockDiagDestroy would carry it).
    let mut ids = Vec::new();
    for b in &ibufs {
        if our_frame(b, &mut |body: &[u8]| ids.push(body.to_vec())).unwrap() {
            break;
        }
    }
    let mut destroy_same = 0;
    for body in &ids {
        let mut ours = vec![body[0], libc::IPPROTO_TCP as u8, 0, 0];
        ours.extend_from_slice(&(1u32 << body[1]).to_ne_bytes());
        ours.extend_from_slice(&body[4..52]);
        let r = match NetlinkMessage::<SockDiagMessage>::deserialize(&dump_message(body)).unwrap().payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => r,
            _ => unreachable!(),
        };
        let req = InetRequest {
            family: r.header.family,
            protocol: libc::IPPROTO_TCP as u8,
            extensions: ExtensionFlags::empty(),
            states: InetStates::from_bits_retain(1 << r.header.state),
            socket_id: r.header.socket_id.clone(),
        };
        let mut theirs = vec![0; netlink_packet_core::Emitable::buffer_len(&req)];
        netlink_packet_core::Emitable::emit(&req, &mut theirs);
        assert_eq!(ours, theirs, "SOCK_DESTROY bodies differ");
        destroy_same += 1;
    }
    println!("SOCK_DESTROY request bodies identical for all {destroy_same} dumped tcp4 sockets");
    println!("tcp4 attribute kinds (kind: count): {kinds:?}");
    println!(
        "tcp4 dump: {} sockets ({} shut down); parse only (median of {reps}): ours {:.3} ms, crate {:.3} ms",
        ia.len(),
        shut,
        median(i_ours),
        median(i_crate)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills and reaps the children holding sockets, also when a check fails.
struct Reap(Vec<libc::pid_t>);
impl Drop for Reap {
    fn drop(&mut self) {
        for &pid in &self.0 {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Forks a child that makes `n` socketpairs (the `first`-th on: every 10th with 5 bytes
/// queued, every 7th shut down for writing) and holds them until killed; returns once they
/// are all made.
fn hold_pairs_in_child(n: usize, first: usize) -> libc::pid_t {
    let mut p = [0; 2];
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        unsafe { libc::close(p[0]) };
        let mut keep = Vec::with_capacity(n * 2);
        for i in first..first + n {
            let (a, b) = UnixStream::pair().unwrap();
            if i % 10 == 0 {
                (&a).write_all(b"12345").unwrap();
            }
            if i % 7 == 0 {
                a.shutdown(std::net::Shutdown::Write).unwrap();
            }
            keep.push(a);
            keep.push(b);
        }
        unsafe {
            libc::write(p[1], b"x".as_ptr().cast(), 1);
            loop {
                libc::pause();
            }
        }
    }
    unsafe { libc::close(p[1]) };
    let mut x = 0u8;
    assert_eq!(unsafe { libc::read(p[0], (&mut x as *mut u8).cast(), 1) }, 1, "child failed");
    unsafe { libc::close(p[0]) };
    pid
}
