//! Open MPI: a session directory of each job's own.

/// Every job has its own PID namespace, so concurrent jobs' processes have the same small pids;
/// Open MPI names its session directory after mpirun's pid, so two jobs would share one and
/// break each other. Each job gets its own base for it (unless the user chose one), in memory
/// (/dev/shm): the files mpirun and the ranks map shared there are then saved in each
/// checkpoint and recreated at restart, on this node or another.
pub fn set_job_environment() {
    const SESSION_BASES: [&str; 2] = ["OMPI_MCA_orte_tmpdir_base", "PRTE_MCA_prte_tmpdir_base"];
    if SESSION_BASES.iter().any(|v| std::env::var_os(v).is_some()) {
        return;
    }
    let mut id = [0u8; 6];
    if getrandom::fill(&mut id).is_err() {
        return;
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let base = format!("/dev/shm/ckpt-job-{hex}");
    if std::fs::create_dir(&base).is_ok() {
        for v in SESSION_BASES {
            std::env::set_var(v, &base);
        }
    }
}
