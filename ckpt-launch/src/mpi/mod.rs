//! What MPI libraries need from ckpt, one module per library: the environment the launched
//! program starts with ([`set_job_environment`]). Everything else about an MPI job (its
//! processes, sockets, shared memory) is checkpointed like any program's; the remote launch
//! of a job across nodes goes through `ckpt agent-rsh` (`coord.rs`), whichever library asks.

mod mpich;
mod openmpi;

pub use openmpi::{remote_command, SEGMENT_DIR_VAR};

/// Environment the launched program starts with, beside the launcher's own. Called by the
/// job's init while it is single-threaded, before the program starts. A variable the user set
/// is left as it is.
pub fn set_job_environment() {
    openmpi::set_job_environment();
    mpich::set_job_environment();
}

/// Once the job launched has ended: what [`set_job_environment`] made for it and the job left
/// empty, removed.
pub fn job_ended() {
    openmpi::remove_job_dir();
}
