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
///
/// The directory is made by the launcher ([`JobDir`]) and given here as `dir`; `None`: none is
/// the job's (the user chose both places). Called by the job's init while it is
/// single-threaded, before the program starts.
pub fn set_job_environment(dir: Option<&str>) {
    let Some(dir) = dir else { return };
    for vars in [SESSION_BASES, SEGMENT_DIRS] {
        if !user_chose(&vars) {
            for v in vars {
                std::env::set_var(v, dir);
            }
        }
    }
}

/// The variables that name Open MPI's session base (4, and PRRTE's in 5).
const SESSION_BASES: [&str; 2] = ["OMPI_MCA_orte_tmpdir_base", "PRTE_MCA_prte_tmpdir_base"];
/// The variables that name the shared-memory transport's directory (vader in 4, sm in 5).
const SEGMENT_DIRS: [&str; 2] = [SEGMENT_DIR_VAR, "OMPI_MCA_btl_sm_backing_directory"];

/// Whether one of `vars` is set in this process's environment: the user's choice, kept.
fn user_chose(vars: &[&str]) -> bool {
    vars.iter().any(|v| std::env::var_os(v).is_some())
}

/// A job's own directory under /dev/shm ([`set_job_environment`]), held by the launcher, which
/// outlives the job: made before the job's init starts, made again (or found to be this user's)
/// before a restart puts the job's files back in it, and removed with what is in it once the job
/// has ended, however it ended. The files in it are the job's shared memory (Open MPI's segments:
/// 4 MiB a rank), which every checkpoint saves and every restart recreates: left behind by a job
/// ended by `checkpoint --kill` or by a crash, they held the node's memory until someone removed
/// them by hand (379 MiB of tmpfs on this machine after a day's runs).
#[derive(Debug)]
pub struct JobDir {
    path: String,
    /// Whether the drop removes it: not where it is another user's (`restart --as-root`).
    remove: bool,
}

impl JobDir {
    /// For a launch: a new directory of a random name, made now; `None` where the user chose
    /// both places, or none could be made (Open MPI's defaults then hold).
    pub fn for_launch() -> Option<JobDir> {
        if user_chose(&SESSION_BASES) && user_chose(&SEGMENT_DIRS) {
            return None;
        }
        job_base().map(|path| JobDir { path, remove: true })
    }

    /// For a restart of a job whose launch made `path` (its job file's `shm_dir`; the file is
    /// the user's, so a value of another shape is ignored). Made again where it is gone (the
    /// node was rebooted, or the job ended since); where it is there, it must be a directory of
    /// this user's: its name is listed to anyone in /dev/shm, and another user who made it
    /// would own the directory the job's segments go back into. `as_root`: `restart --as-root`,
    /// root's explicit choice, which takes a directory of the image's user as it is (and leaves
    /// it at the end).
    pub fn for_restart(path: &str, as_root: bool) -> anyhow::Result<Option<JobDir>> {
        use std::os::unix::fs::MetadataExt;
        if !is_job_base(path) {
            return Ok(None);
        }
        match make_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => anyhow::bail!("cannot make the job's directory {path} again: {e}"),
        }
        let meta = std::fs::symlink_metadata(path).map_err(|e| anyhow::anyhow!("the job's directory {path}: {e}"))?;
        let ours = meta.uid() == nix::unistd::geteuid().as_raw();
        if !meta.file_type().is_dir() || !(ours || as_root) {
            let what = if meta.file_type().is_dir() { format!("a directory of uid {}", meta.uid()) } else { "not a directory".to_string() };
            anyhow::bail!(
                "the job's directory {path}, where its shared memory files go back, is {what}, made by someone else since the job ran: remove it (or have its owner remove it) and restart again"
            );
        }
        Ok(Some(JobDir { path: path.to_string(), remove: ours }))
    }

    pub fn path(&self) -> &str {
        &self.path
    }
}

impl Drop for JobDir {
    /// Removes the directory where the job left it empty, as Open MPI leaves it when its job
    /// ends well (and every job that is not Open MPI's). What is left in it stays: a job that
    /// crashed, or was ended by `checkpoint --kill`, may be restarted, and its restart needs the
    /// files the image does not hold (mpirun's hwloc topology, mapped privately by the ranks);
    /// the large ones, the shared memory the image holds, went at the `--kill` already
    /// ([`remove_saved_files`]).
    fn drop(&mut self) {
        if !self.remove {
            return;
        }
        match std::fs::remove_dir(&self.path) {
            Ok(()) => tracing::debug!(path = self.path, "the job's directory under /dev/shm removed"),
            Err(e) => tracing::debug!(path = self.path, "the job's directory under /dev/shm left: {e}"),
        }
    }
}

/// The files in a job's directory ([`JobDir`]: this node's, or on another node the one mpirun's
/// node made, which the ranks here use) whose contents the processes' records hold: files
/// mapped shared there, saved whole in every checkpoint. As (path, device, inode).
pub fn saved_files_in_job_dirs(processes: &[ckpt_core::objects::ProcessRecord]) -> Vec<(String, u64, u64)> {
    let mut saved: Vec<(String, u64, u64)> = processes
        .iter()
        .flat_map(|p| &p.vmas)
        .filter_map(ckpt_core::objects::memory::saved_file)
        .filter(|(path, ..)| in_a_job_dir(path))
        .map(|(path, dev, ino)| (path.to_string(), dev, ino))
        .collect();
    saved.sort();
    saved.dedup();
    saved
}

/// Whether `path` is below a directory [`job_base`] makes. Pure.
fn in_a_job_dir(path: &str) -> bool {
    job_dir_of(path).is_some_and(|dir| dir.len() < path.len())
}

/// The directory [`job_base`] makes that `path` is, or is below. Pure.
pub fn job_dir_of(path: &str) -> Option<&str> {
    let dir = path.get(..JOB_BASE_PREFIX.len() + 12).filter(|d| is_job_base(d))?;
    matches!(path.as_bytes().get(dir.len()), None | Some(b'/')).then_some(dir)
}

/// Removes the files [`saved_files_in_job_dirs`] found, once the job is ended by `checkpoint --kill`:
/// each only if its path still names that file (the paths are the job's; the directory is its
/// user's alone, and the job's own: its name is random). A restart writes them again from the image, on this node or another.
pub fn remove_saved_files(saved: &[(String, u64, u64)]) {
    use std::os::unix::fs::MetadataExt;
    for (path, dev, ino) in saved {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_file() && (m.dev(), m.ino()) == (*dev, *ino) => match std::fs::remove_file(path) {
                Ok(()) => tracing::debug!(path, "a shared memory file of the job's, saved in the image, removed with the job"),
                Err(e) => tracing::warn!("removing {path}, a shared memory file of the job's saved in the image: {e}"),
            },
            _ => {}
        }
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

/// Makes the directory `path`, writable by its user alone, whatever the umask.
fn make_dir(path: &str) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o755).create(path)
}

/// A new directory of a random name under /dev/shm, made now ([`make_dir`]); a name someone
/// else made already is not used.
fn job_base() -> Option<String> {
    for _ in 0..4 {
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).ok()?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let base = format!("{JOB_BASE_PREFIX}{hex}");
        if make_dir(&base).is_ok() {
            return Some(base);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_directory_is_found_from_the_paths_in_it() {
        assert_eq!(job_dir_of("/dev/shm/ckpt-job-0123456789ab/ompi.vm.0/x"), Some("/dev/shm/ckpt-job-0123456789ab"));
        assert_eq!(job_dir_of("/dev/shm/ckpt-job-0123456789ab"), Some("/dev/shm/ckpt-job-0123456789ab"));
        assert_eq!(job_dir_of("/dev/shm/ckpt-job-0123456789abc"), None);
        assert_eq!(job_dir_of("/dev/shm/other"), None);
    }

    #[test]
    fn only_paths_below_a_job_directory_are_in_one() {
        assert!(in_a_job_dir("/dev/shm/ckpt-job-0123456789ab/vader_segment.1"));
        assert!(in_a_job_dir("/dev/shm/ckpt-job-0123456789ab/ompi.vm.0/pid.2/x"));
        for other in [
            "/dev/shm/ckpt-job-0123456789ab",
            "/dev/shm/ckpt-job-0123456789abc/x",
            "/dev/shm/ckpt-job-0123/x",
            "/dev/shm/PostgreSQL.1",
            "/dev/shm/ckpt-job-0123456789aZ/x",
            "/tmp/ckpt-job-0123456789ab/x",
        ] {
            assert!(!in_a_job_dir(other), "{other}");
        }
    }

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
