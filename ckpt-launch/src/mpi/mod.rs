//! What MPI libraries need from ckpt, one module per library: the environment the launched
//! program starts with ([`set_job_environment`]). Everything else about an MPI job (its
//! processes, sockets, shared memory) is checkpointed like any program's; the remote launch
//! of a job across nodes goes through `ckpt agent-rsh` (`coord.rs`), whichever library asks.

mod mpich;
mod openmpi;

pub use openmpi::{job_dir_of, remote_command, remove_saved_files, saved_files_in_job_dirs, JobDir, SEGMENT_DIR_VAR};

/// Environment the launched program starts with, beside the launcher's own. Called by the
/// job's init while it is single-threaded, before the program starts. A variable the user set
/// is left as it is. `job_dir`: the job's own directory under /dev/shm ([`JobDir`]), if any.
pub fn set_job_environment(job_dir: Option<&str>) {
    openmpi::set_job_environment(job_dir);
    mpich::set_job_environment();
}
