//! TCP sockets, IPv4 and IPv6: listening sockets, connections (established and half-closed) with
//! the data in flight in both directions, and unconnected sockets.
//!
//! **Capture.** The first TCP socket met in a checkpoint captures every TCP socket of the job at
//! once, through duplicates taken with pidfd_getfd: inet_diag tells each socket's state, its peer
//! (a socket of the job, a connection not accepted yet by a listener of the job, or something
//! outside the job) and a listener's backlog. Connections are put in TCP repair mode (root only),
//! which lets their queues be read without taking anything out: first the send queue of every
//! connection (bytes not acknowledged, then not sent), then the receive queue of every one
//! (bytes received, not read), with their sequence numbers, then MSS, window scaling, SACK,
//! timestamps and windows. Send queues first, receive queues after: while the job is frozen the
//! kernel can still move bytes from one end of a connection of the job to the other, and in this
//! order every byte is in one of the two queues (possibly both: the sender's copy is then cut to
//! start where the receiver's queue ends). Repair mode is then turned off without a window probe
//! and SO_REUSEADDR (which repair mode overrides) and SO_PEEK_OFF put back: the job's sockets are
//! left as they were.
//!
//! **Restore.** `socket(2)` is injected into the process; the restorer does the rest on its own
//! duplicate. A connection is rebuilt in repair mode: sequence numbers, bind to the same local
//! address, connect to the same peer (no packet is sent in repair mode), TCP options, the
//! receive queue put back, windows. Once every process has its descriptors ([`finish`]), repair
//! mode is turned off (a window probe resynchronises the peer), the send queue is sent again
//! (TCP drops what the peer already has), a FIN that had been sent is sent again by
//! shutdown(SHUT_WR), and the options are set. A connection still waiting in a listener's backlog
//! is connected again to the restored listener and its sent bytes written again. A connection to
//! a peer outside the job is rebuilt the same way with `--tcp-established`; otherwise it is
//! rebuilt and reset (the program sees ECONNRESET, as after a network failure, and the bytes it
//! had not read are lost).
//!
//! Repair mode needs CAP_NET_ADMIN over the job's network namespace. Where it is refused (an
//! ordinary user's job), or `CKPT_TCP_RECONNECT=1` says so, connections are drained at capture
//! and made again by connecting at restore instead: [`super::tcp_reconnect`].
//!
//! Here the records and the kernel's constants; in `capture.rs` the capture (the listing, the
//! peers, the drains, `capture_all`), in `repair.rs` TCP repair mode (reading and writing a
//! connection's queues, sequence numbers, window and options) and what is done to the job's
//! connections before it is killed, in `restore.rs` the restore (`open`, listeners, stand-in
//! peers, `finish`), in `lock.rs` the network lock that holds a peer's packets off while a job
//! killed with `--tcp-established` is down.

use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::inet::{getopt_int, setopt_int, Addr, Bytes, SockOpts};

mod capture;
mod lock;
mod repair;
mod restore;
mod reuse;

pub(super) use capture::{already_received, has_sent_fin, outside_connections};
pub use capture::{capture, snapshot_send_queues, EarlySends, TcpCaptureState};
pub use lock::NetworkLock;
pub use repair::{lock_outside, reset_at_recovery_kill, silence};
pub use restore::{connections, finish, open, TcpRestoreState};
pub(super) use restore::{listen_as_recorded, shutdown};
pub use reuse::watch_listeners;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TcpRecord {
    pub ino: u64,
    /// AF_INET or AF_INET6.
    pub family: i32,
    pub state: TcpState,
    pub opts: SockOpts,
    pub tcp_opts: TcpOpts,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum TcpState {
    /// Not connected: never connected (bound to `local` if Some), or closed after a connection
    /// (`shut`: reads return end of file, writes fail).
    Closed {
        local: Option<Addr>,
        shut: bool,
        /// Bytes the connection received that the program has not read (format 13).
        #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
        unread: Bytes,
        /// The connection ended with a reset (or another error: the error is not read, that
        /// would take it from the program), which the program has yet to be told, after `unread`
        /// (format 13).
        #[serde(deserialize_with = "crate::image::since::since::<13, _, _>")]
        reset: bool,
    },
    Listening {
        local: Addr,
        backlog: u32,
    },
    Connected(Box<Connection>),
    /// A connection being established: its SYN sent from `local` to `remote`, no answer yet (a
    /// server slow to accept, down or filtered, a client retrying). Made again at restart: the
    /// socket bound to `local` connects to `remote` once every other connection is back, and a
    /// program waiting in connect(2), or polling for the end of a connect that did not block,
    /// waits on (format 31).
    Connecting {
        local: Addr,
        remote: Addr,
    },
}

/// Where the other end of a connection is.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Peer {
    /// A socket of the job (its inode).
    Job(u64),
    /// Not accepted yet, in the backlog of a listening socket of the job: the connection is made
    /// again at restart.
    Backlog,
    /// A process outside the job, on this machine or another.
    Outside,
    /// A socket on this machine that its process closed after sending everything (its FIN is
    /// in this end's receive queue, after the bytes not read yet). At restart a stand-in socket
    /// of the restorer sends the FIN again, and is closed as the peer was.
    Closed,
}

/// An established or half-closed connection, with its data in flight.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Connection {
    pub local: Addr,
    pub remote: Addr,
    pub peer: Peer,
    /// The kernel's state at the checkpoint (1 established, 4/5 FIN sent, 8 FIN received, ...).
    pub kstate: u8,
    /// This end sent a FIN (shutdown(SHUT_WR) or close by another holder): sent again at restart.
    pub fin_sent: bool,
    /// The peer's FIN arrived (after the receive queue).
    pub fin_received: bool,
    /// The program shut down reading.
    pub shut_rd: bool,
    /// Sequence number of the first byte of `send_queue`.
    pub send_seq: u32,
    /// Bytes written by the program and not acknowledged by the peer (sent or not).
    pub send_queue: Bytes,
    /// How many bytes at the end of `send_queue` had not been sent at all.
    pub unsent: u32,
    /// Sequence number of the first byte of `recv_queue`.
    pub recv_seq: u32,
    /// Bytes received and not read by the program.
    pub recv_queue: Bytes,
    pub mss: u32,
    pub wscale: Option<(u8, u8)>,
    pub sack: bool,
    /// The TCP timestamp clock (with its offset) at the checkpoint, when timestamps are on.
    pub timestamp: Option<u32>,
    pub window: Option<Window>,
    /// Captured in TCP repair mode: the sequence numbers, the send queue and the negotiated
    /// options above are the connection's own, and it can be rebuilt by repair mode. False: it was
    /// captured without repair mode ([`super::tcp_reconnect`]): the bytes in flight towards this
    /// end were drained into `recv_queue`, there are no sequence numbers, and it can only be
    /// rebuilt by connecting again.
    pub repaired: bool,
}

/// TCP_REPAIR_WINDOW.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Window {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// TCP-level options kept across a restart.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TcpOpts {
    pub nodelay: bool,
    pub cork: bool,
    pub keepidle: i32,
    pub keepintvl: i32,
    pub keepcnt: i32,
    pub user_timeout: i32,
}

impl TcpRecord {
    pub fn describe(&self) -> String {
        match &self.state {
            TcpState::Closed { local: Some(l), .. } => format!("TCP socket bound to {l}"),
            TcpState::Closed { local: None, shut, reset, .. } => format!(
                "TCP socket, {}",
                if *reset {
                    "reset"
                } else if *shut {
                    "closed"
                } else {
                    "unconnected"
                }
            ),
            TcpState::Listening { local, .. } => format!("TCP listening on {local}"),
            TcpState::Connected(c) => {
                let peer = match c.peer {
                    Peer::Job(_) => "in the job",
                    Peer::Backlog => "waiting in the backlog of a listener of the job",
                    Peer::Outside => "outside the job",
                    Peer::Closed => "closed by its process",
                };
                format!("TCP {} -> {} (peer {peer})", c.local, c.remote)
            }
            TcpState::Connecting { local, remote } => format!("TCP {local} -> {remote} (being established)"),
        }
    }

    /// The connection, if it is one to a peer outside the job.
    pub fn outside(&self) -> Option<&Connection> {
        match &self.state {
            TcpState::Connected(c) if c.peer == Peer::Outside => Some(c),
            _ => None,
        }
    }
}

// Kernel constants (linux/tcp.h, linux/sockios.h).
const TCP_REPAIR: i32 = 19;
const TCP_REPAIR_QUEUE: i32 = 20;
const TCP_QUEUE_SEQ: i32 = 21;
const TCP_REPAIR_OPTIONS: i32 = 22;
const TCP_TIMESTAMP: i32 = 24;
const TCP_REPAIR_WINDOW: i32 = 29;
const REPAIR_ON: i32 = 1;
const REPAIR_OFF: i32 = 0;
const REPAIR_OFF_NO_WP: i32 = -1;
const NO_QUEUE: i32 = 0;
const RECV_QUEUE: i32 = 1;
const SEND_QUEUE: i32 = 2;
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
const SIOCINQ: libc::c_ulong = 0x541B;
const SIOCOUTQ: libc::c_ulong = 0x5411;
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

const ESTABLISHED: u8 = 1;
const SYN_SENT: u8 = 2;
const SYN_RECV: u8 = 3;
const FIN_WAIT1: u8 = 4;
const FIN_WAIT2: u8 = 5;
const CLOSE_WAIT: u8 = 8;
const LAST_ACK: u8 = 9;
const LISTEN: u8 = 10;
const CLOSING: u8 = 11;

/// States of a connection with data that repair mode can read.
fn is_connected(state: u8) -> bool {
    matches!(state, ESTABLISHED | FIN_WAIT1 | FIN_WAIT2 | CLOSE_WAIT | LAST_ACK | CLOSING)
}

fn fin_sent(state: u8) -> bool {
    matches!(state, FIN_WAIT1 | FIN_WAIT2 | CLOSING | LAST_ACK)
}

fn fin_received(state: u8) -> bool {
    matches!(state, CLOSE_WAIT | LAST_ACK | CLOSING)
}

impl TcpOpts {
    fn capture(s: &OwnedFd) -> std::io::Result<TcpOpts> {
        let t = libc::SOL_TCP;
        Ok(TcpOpts {
            nodelay: getopt_int(s, t, libc::TCP_NODELAY)? != 0,
            cork: getopt_int(s, t, libc::TCP_CORK)? != 0,
            keepidle: getopt_int(s, t, libc::TCP_KEEPIDLE)?,
            keepintvl: getopt_int(s, t, libc::TCP_KEEPINTVL)?,
            keepcnt: getopt_int(s, t, libc::TCP_KEEPCNT)?,
            user_timeout: getopt_int(s, t, libc::TCP_USER_TIMEOUT)?,
        })
    }

    pub(super) fn restore(&self, s: &OwnedFd) -> std::io::Result<()> {
        let t = libc::SOL_TCP;
        setopt_int(s, t, libc::TCP_NODELAY, self.nodelay as i32)?;
        setopt_int(s, t, libc::TCP_KEEPIDLE, self.keepidle)?;
        setopt_int(s, t, libc::TCP_KEEPINTVL, self.keepintvl)?;
        setopt_int(s, t, libc::TCP_KEEPCNT, self.keepcnt)?;
        setopt_int(s, t, libc::TCP_USER_TIMEOUT, self.user_timeout)?;
        setopt_int(s, t, libc::TCP_CORK, self.cork as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_with_a_fin() {
        assert!(fin_sent(FIN_WAIT2) && !fin_received(FIN_WAIT2));
        assert!(fin_received(CLOSE_WAIT) && !fin_sent(CLOSE_WAIT));
        assert!(fin_sent(LAST_ACK) && fin_received(LAST_ACK));
        assert!(is_connected(CLOSING) && !is_connected(LISTEN) && !is_connected(SYN_SENT));
    }
}
