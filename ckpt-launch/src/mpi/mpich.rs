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
//!   (`ckpt_core::objects::unix`, `send_to_name`). Checked once by hand on 2026-11-26
//!   (`UCX_TLS=all`, `MPIR_CVAR_NOLOCAL=1`, tests/progs/mpi_ring.c on 2 ranks: checkpoint,
//!   checkpoint --kill, restart, checkpoint --kill, restart; the image held those datagrams, the
//!   ring passed with the uninterrupted run's RESULT); no test covers these transports yet, so
//!   the default below stays until one does.
//!
//! So a job gets `UCX_TLS=tcp,self` unless the user chose transports: ranks on one node still
//! talk through MPICH's own shared memory (ch4's POSIX module, which UCX_TLS does not touch),
//! and through UCX over TCP between nodes.

/// The UCX transports a job gets when the user chose none.
pub const UCX_TRANSPORTS: &str = "tcp,self";

pub fn set_job_environment() {
    if std::env::var_os("UCX_TLS").is_none() {
        std::env::set_var("UCX_TLS", UCX_TRANSPORTS);
    }
}
