//! Open MPI: a session directory and shared-memory segments of each job's own.

/// Every job has its own PID namespace, so concurrent jobs' processes have the same small pids;
/// Open MPI names its session directory after mpirun's pid, so two jobs would share one and
/// break each other. Each job gets its own base for it (unless the user chose one), in memory
/// (/dev/shm): the files mpirun and the ranks map shared there are then saved in each
/// checkpoint and recreated at restart, on this node or another.
///
/// The shared-memory transport's segments (vader in Open MPI 4, sm in 5) are named after the
/// job's id, which comes from mpirun's pid too, in /dev/shm itself: two jobs launched at once
/// opened each other's segments and their ranks died of SIGSEGV in
/// `mca_btl_vader_poll_handle_frag` (and a segment another user had made at that name, which
/// anyone can foresee, would have been opened, or refused the job). They go into the job's base
/// as well, which only its user can write.
pub fn set_job_environment() {
    const SESSION_BASES: [&str; 2] = ["OMPI_MCA_orte_tmpdir_base", "PRTE_MCA_prte_tmpdir_base"];
    const SEGMENT_DIRS: [&str; 2] = ["OMPI_MCA_btl_vader_backing_directory", "OMPI_MCA_btl_sm_backing_directory"];
    let user_chose = |vars: &[&str]| vars.iter().any(|v| std::env::var_os(v).is_some());
    let (own_session, own_segments) = (!user_chose(&SESSION_BASES), !user_chose(&SEGMENT_DIRS));
    if !own_session && !own_segments {
        return;
    }
    let Some(base) = job_base() else { return };
    let _ = MADE.set(base.clone());
    for (own, vars) in [(own_session, SESSION_BASES), (own_segments, SEGMENT_DIRS)] {
        if own {
            for v in vars {
                std::env::set_var(v, &base);
            }
        }
    }
}

/// The directory [`set_job_environment`] made for the job.
static MADE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Once the job has ended (every process of it reaped): its directory removed if it is empty,
/// as Open MPI leaves it when its job ends well (and every job that is not Open MPI's). Left
/// where anything is in it: a job that crashed leaves its segments there, which nothing but
/// the user should remove. (A job ended by `checkpoint --kill` never comes here: its restart
/// needs the directory's files.)
pub fn remove_job_dir() {
    if let Some(base) = MADE.get() {
        let _ = std::fs::remove_dir(base);
    }
}

/// A new directory of a random name under /dev/shm, made now (0777 less the umask: nobody else
/// can make a file in it); a name someone else made already is not used.
fn job_base() -> Option<String> {
    for _ in 0..4 {
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).ok()?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let base = format!("/dev/shm/ckpt-job-{hex}");
        if std::fs::create_dir(&base).is_ok() {
            return Some(base);
        }
    }
    None
}
