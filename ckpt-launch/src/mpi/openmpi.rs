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
    const SEGMENT_DIRS: [&str; 2] = [SEGMENT_DIR_VAR, "OMPI_MCA_btl_sm_backing_directory"];
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

/// The job's directory as the shell of another node must find it, for `command` (Open MPI's
/// daemon) to run there: mpirun hands its own variables on to the ranks it starts on other
/// nodes, so they look for their segments in the directory this node made, which no other node
/// has. Made there first, and checked to be the job's user's own (no link; nobody else can have
/// made it: its name is random and the user's alone to know, but /dev/shm is listed to all).
/// Left there after (empty once the job ended well): the daemon may go on in the background
/// after the command returns, and its ranks would find the directory gone. The lines are
/// separate, so that the command may end as a shell line may (with `;`). `env_dir`: the
/// directory named by this process's environment, used only if it has the shape [`job_base`]
/// gives (so it is safe in a shell line as it is). Pure.
pub fn remote_command(command: &str, env_dir: Option<&str>) -> String {
    let Some(dir) = env_dir.filter(|d| is_job_base(d)) else { return command.to_string() };
    format!(
        "mkdir -m 0700 {dir} 2>/dev/null\nif test -h {dir} || ! test -d {dir} || ! test -O {dir}; then echo 'ckpt: {dir} here is not a directory of this user alone' >&2; exit 1; fi\n{command}"
    )
}

/// What every job's directory is named from: [`job_base`] adds 12 hexadecimal digits.
const JOB_BASE_PREFIX: &str = "/dev/shm/ckpt-job-";

/// Whether `dir` is a name [`job_base`] makes.
fn is_job_base(dir: &str) -> bool {
    dir.strip_prefix(JOB_BASE_PREFIX).is_some_and(|hex| hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The variable that names the segments' directory (the one mpirun hands on).
pub const SEGMENT_DIR_VAR: &str = "OMPI_MCA_btl_vader_backing_directory";

/// A new directory of a random name under /dev/shm, made now (0777 less the umask: nobody else
/// can make a file in it); a name someone else made already is not used.
fn job_base() -> Option<String> {
    for _ in 0..4 {
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).ok()?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let base = format!("{JOB_BASE_PREFIX}{hex}");
        if std::fs::create_dir(&base).is_ok() {
            return Some(base);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_command_makes_the_job_directory_only_of_the_shape_ckpt_gives() {
        let dir = "/dev/shm/ckpt-job-0123456789ab";
        let line = remote_command("orted -mca ess env", Some(dir));
        assert!(line.starts_with(&format!("mkdir -m 0700 {dir} 2>/dev/null\nif test -h {dir} ")), "{line}");
        assert!(line.ends_with("; exit 1; fi\norted -mca ess env"), "{line}");
        // Anything else (the user's own choice, or a value that would be read by the shell) is
        // left alone.
        for other in ["/scratch/me", "/dev/shm/ckpt-job-0123456789ab; rm -rf ~", "/dev/shm/ckpt-job-0123", "/dev/shm/ckpt-job-0123456789aZ"] {
            assert_eq!(remote_command("orted", Some(other)), "orted", "{other}");
        }
        assert_eq!(remote_command("orted", None), "orted");
    }

    /// The line as a shell runs it: the directory made, the command run (one that ends as a
    /// shell line may, with `;`); refused where the name is a link.
    #[test]
    fn the_remote_command_runs_as_a_shell_line() {
        let hex: String = std::process::id().to_string().chars().chain(std::iter::repeat('a')).take(12).collect();
        let dir = format!("/dev/shm/ckpt-job-{hex}");
        let _ = std::fs::remove_dir(&dir);
        let run = |line: &str| std::process::Command::new("/bin/sh").args(["-c", line]).output().unwrap();
        let out = run(&remote_command(&format!("test -d {dir} && echo there ;"), Some(&dir)));
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("there"), "{out:?}");
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/tmp", &dir).unwrap();
        let out = run(&remote_command("echo ran", Some(&dir)));
        std::fs::remove_file(&dir).unwrap();
        assert!(!out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("ran"), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("here is not a directory of this user alone"), "{out:?}");
    }
}
