//! MPICH (Debian's is built with the ch4:ucx device and the Hydra process manager).
//!
//! Hydra needs nothing of ckpt on one node: mpiexec, its proxy and the ranks are one process
//! tree, talking over Unix socket pairs, pipes and TCP on the loopback. The ranks talk through
//! UCX, whose transports ckpt must be able to capture:
//! - `tcp` (and `self`): its connections and listeners are ordinary sockets; its epoll
//!   instances nest (`ckpt_core::objects::epoll`).
//! - its shared-memory transports (`sm`: posix, sysv, cma) keep, per rank, a datagram socket
//!   bound to an abstract name to which the other ranks send one-byte wake-ups that stay queued
//!   for good. ckpt now restores those datagrams from their senders' names
//!   (`ckpt_core::objects::unix`, `send_to_name`); tests/tests/mpich.rs,
//!   `mpiexec_two_ranks_ucx_shared_memory`.
//! - not the transports through devices: InfiniBand and RoCE verbs (`rc`, `ud`, `dc`), `knem`,
//!   `xpmem`, GPU copies. A rank holding such a device is refused at checkpoint.
//!
//! So a job gets the transports ckpt keeps, unless the user chose some: on a cluster whose
//! nodes have InfiniBand, UCX would take it between nodes, and no checkpoint of the job could be
//! taken; with these it goes over TCP (slower, where the network is InfiniBand: set `UCX_TLS`
//! yourself to choose speed over checkpoints). Ranks on one node talk through MPICH's own
//! shared memory (ch4's POSIX module, which UCX_TLS does not touch) and UCX's.

/// The UCX transports a job gets when the user chose none: those ckpt can checkpoint.
pub const UCX_TRANSPORTS: &str = "self,tcp,posix,sysv,cma";

pub fn set_job_environment() {
    if std::env::var_os("UCX_TLS").is_none() {
        std::env::set_var("UCX_TLS", UCX_TRANSPORTS);
    }
}
