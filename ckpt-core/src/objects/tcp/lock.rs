//! The network lock: while a job checkpointed with `--kill --tcp-established` is frozen, dead and
//! not yet restarted, the packets of its connections to peers outside the job are dropped by the
//! node's firewall, both ways.
//!
//! Why: repair mode does not stop the kernel from taking in what a peer sends. A byte arriving
//! after the receive queues were read would be acknowledged and lost (the image does not hold
//! it); one arriving, or sent again, after the kill would find no socket and be answered with a
//! reset, which ends the connection the restart was to take over. Dropped instead, it is sent
//! again by the peer until the restarted connection, with the same sequence numbers, takes it.
//!
//! The lock is two nftables sets of connections (IPv4 and IPv6, each entry source address and
//! port, destination address and port, both directions entered) in a table of its own, matched
//! by one rule per set on the input and the output hooks. Locking adds a connection's entries;
//! the restart removes them just before its connection leaves repair mode ([`unlock`]), and a
//! checkpoint after which the job goes on removes them at the release. A job restarted on
//! another machine leaves its entries behind on the first: they match only its old connections'
//! addresses and ports (`nft delete table inet ckpt_lock` removes every one).
//!
//! The rules are written by the `nft` program (nftables), run as root with a fixed path: no crate
//! with a licence we can ship writes nftables' netlink messages, and the lock is needed only where
//! repair mode is, that is as root. Where `nft` is missing, the job's connections close as before
//! the lock existed (see [`super::silence`]) and a warning says so.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::objects::inet::normalize;

/// The table the lock's sets and rules are in.
const TABLE: &str = "ckpt_lock";

/// Where `nft` is looked for (never through PATH: it runs as root).
const NFT_PATHS: [&str; 2] = ["/usr/sbin/nft", "/sbin/nft"];

/// Connections locked by this process, unlocked when dropped unless [`NetworkLock::keep`] was
/// called (the job is killed and its restart unlocks them).
#[must_use]
pub struct NetworkLock {
    conns: Vec<(SocketAddr, SocketAddr)>,
}

impl NetworkLock {
    /// Drops, from now on, every packet of the connections `conns` (local, remote).
    pub fn lock(conns: Vec<(SocketAddr, SocketAddr)>) -> Result<NetworkLock> {
        let conns: Vec<_> = conns.into_iter().map(|(l, r)| (normalize(l), normalize(r))).collect();
        if conns.is_empty() {
            return Ok(NetworkLock { conns });
        }
        let mut script = String::new();
        script.push_str(&format!("add table inet {TABLE}\n"));
        for (set, ty, match_on) in [
            ("conns4", "ipv4_addr . inet_service . ipv4_addr . inet_service", "ip saddr . tcp sport . ip daddr . tcp dport"),
            ("conns6", "ipv6_addr . inet_service . ipv6_addr . inet_service", "ip6 saddr . tcp sport . ip6 daddr . tcp dport"),
        ] {
            script.push_str(&format!("add set inet {TABLE} {set} {{ type {ty}; }}\n"));
            for (chain, hook) in [("input", "input"), ("output", "output")] {
                // At raw priority, before connection tracking (-200): the packets never reach it.
                script.push_str(&format!("add chain inet {TABLE} {chain}_{set} {{ type filter hook {hook} priority -300; policy accept; }}\n"));
                script.push_str(&format!("flush chain inet {TABLE} {chain}_{set}\n"));
                script.push_str(&format!("add rule inet {TABLE} {chain}_{set} {match_on} @{set} drop\n"));
            }
        }
        script.push_str(&elements("add", &conns));
        run_nft(&script).map_err(|e| Error::Other(format!("lock the job's connections to peers outside it (nftables): {e}")))?;
        debug!(connections = conns.len(), "network lock taken");
        Ok(NetworkLock { conns })
    }

    /// Leaves the connections locked after this process: the restart unlocks them.
    pub fn keep(mut self) {
        self.conns.clear();
    }
}

impl Drop for NetworkLock {
    fn drop(&mut self) {
        if self.conns.is_empty() {
            return;
        }
        if let Err(e) = unlock(&self.conns) {
            warn!("the job's connections to peers outside it could not be unlocked (`nft delete table inet {TABLE}` does it): {e}");
        }
    }
}

/// Lets the packets of the connections `conns` (local, remote, normalized) through again, if a
/// lock holds them. Nothing to do where no lock was ever taken (another machine, no `nft`, a
/// user who cannot read the firewall).
pub(super) fn unlock(conns: &[(SocketAddr, SocketAddr)]) -> Result<()> {
    if nft().is_none() || run_nft(&format!("list table inet {TABLE}\n")).is_err() {
        return Ok(());
    }
    // Added first, so that deleting an entry not there (unlocked already) fails nothing.
    let script = format!("{}{}", elements("add", conns), elements("delete", conns));
    run_nft(&script).map_err(|e| Error::Other(format!("unlock the connections to peers outside the job (nftables): {e}")))
}

/// The `nft` commands adding or deleting both directions of each connection.
fn elements(verb: &str, conns: &[(SocketAddr, SocketAddr)]) -> String {
    let mut out = String::new();
    for &(local, remote) in conns {
        let set = if local.is_ipv4() { "conns4" } else { "conns6" };
        for (from, to) in [(local, remote), (remote, local)] {
            out.push_str(&format!("{verb} element inet {TABLE} {set} {{ {} . {} . {} . {} }}\n", from.ip(), from.port(), to.ip(), to.port()));
        }
    }
    out
}

fn nft() -> Option<&'static str> {
    NFT_PATHS.into_iter().find(|p| std::path::Path::new(p).is_file())
}

/// Runs `nft -f -` on `script`, in one transaction: all of it or none.
fn run_nft(script: &str) -> std::io::Result<()> {
    let nft = nft().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "nft is not installed (the nftables package)"))?;
    let mut child = Command::new(nft).args(["-f", "-"]).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!("nft: {}", String::from_utf8_lossy(&out.stderr).trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_of_each_connection_in_its_familys_set() {
        let v4: (SocketAddr, SocketAddr) = ("10.0.0.1:40000".parse().unwrap(), "10.0.0.2:22".parse().unwrap());
        let mapped: (SocketAddr, SocketAddr) = ("[::ffff:10.0.0.1]:40001".parse().unwrap(), "[::ffff:10.0.0.3]:80".parse().unwrap());
        let v6: (SocketAddr, SocketAddr) = ("[fd00::1]:5000".parse().unwrap(), "[fd00::2]:6000".parse().unwrap());
        let conns: Vec<_> = [v4, mapped, v6].into_iter().map(|(l, r)| (normalize(l), normalize(r))).collect();
        let out = elements("add", &conns);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "add element inet ckpt_lock conns4 { 10.0.0.1 . 40000 . 10.0.0.2 . 22 }",
                "add element inet ckpt_lock conns4 { 10.0.0.2 . 22 . 10.0.0.1 . 40000 }",
                "add element inet ckpt_lock conns4 { 10.0.0.1 . 40001 . 10.0.0.3 . 80 }",
                "add element inet ckpt_lock conns4 { 10.0.0.3 . 80 . 10.0.0.1 . 40001 }",
                "add element inet ckpt_lock conns6 { fd00::1 . 5000 . fd00::2 . 6000 }",
                "add element inet ckpt_lock conns6 { fd00::2 . 6000 . fd00::1 . 5000 }",
            ]
        );
    }
}
