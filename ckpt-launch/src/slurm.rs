//! Slurm: the batch job ckpt runs in, when it runs in one, and its requeue.
//!
//! Slurm warns a batch job before its time limit, or before a preemption, with a signal to the
//! batch shell (`#SBATCH --signal=B:USR1@120`); with `exec ckpt run ...` in the script, ckpt is
//! that shell. The triggers ([`crate::triggers`]) checkpoint and end the job on that signal; this
//! module asks Slurm, through its client `scontrol`, whether the job may be requeued and requeues
//! it, so that it runs again and `ckpt run` continues it from the checkpoint.
//!
//! Deciding (what `scontrol show job` says about the job) is [`requeue_refusal`], pure and
//! unit-tested; doing is a thin call of `scontrol`.

use std::process::Command;

/// The environment variable Slurm sets in every process of a job.
pub const JOB_ID_VAR: &str = "SLURM_JOB_ID";

/// What went wrong while asking Slurm about the job or requeueing it.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("{JOB_ID_VAR}={0:?} is not a Slurm job id (digits expected)")]
    BadJobId(String),
    #[error("cannot run `{command}`: {error} (Slurm's client scontrol must be on PATH)")]
    Spawn { command: String, error: std::io::Error },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed { command: String, status: std::process::ExitStatus, stderr: String },
    #[error("Slurm job {job} is not requeueable: {why}")]
    NotRequeueable { job: SlurmJob, why: &'static str },
}

/// A Slurm job, by its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob(String);

impl std::fmt::Display for SlurmJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl SlurmJob {
    /// The job this process runs in: `SLURM_JOB_ID`, if set (and not empty).
    pub fn from_env() -> Result<Option<SlurmJob>, SlurmError> {
        match std::env::var(JOB_ID_VAR) {
            Ok(id) if id.is_empty() => Ok(None),
            Ok(id) => SlurmJob::new(&id).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// A job id as Slurm writes it: digits (an array task has a job id of its own, digits too).
    /// Checked because it becomes an argument of `scontrol`.
    pub fn new(id: &str) -> Result<SlurmJob, SlurmError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(SlurmError::BadJobId(id.to_string()));
        }
        Ok(SlurmJob(id.to_string()))
    }

    /// Whether Slurm would requeue the job: `Ok` if so (or if `scontrol show job` does not
    /// say), [`SlurmError::NotRequeueable`] with the reason if not.
    pub fn check_requeueable(&self) -> Result<(), SlurmError> {
        let shown = scontrol(&["show", "job", "--oneliner", &self.0])?;
        match requeue_refusal(&shown) {
            None => Ok(()),
            Some(why) => Err(SlurmError::NotRequeueable { job: self.clone(), why }),
        }
    }

    /// `scontrol requeue JOB`: Slurm ends what is left of the job (SIGTERM, then SIGKILL after
    /// KillWait, to every process of it, this one included) and puts it back in the queue.
    pub fn requeue(&self) -> Result<(), SlurmError> {
        scontrol(&["requeue", &self.0]).map(drop)
    }
}

/// Why Slurm would not requeue the job `scontrol show job --oneliner` describes, or `None` when
/// nothing it says stands in the way. A field it does not print is no reason: the requeue
/// itself then says.
pub fn requeue_refusal(shown: &str) -> Option<&'static str> {
    let field = |name: &str| shown.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='));
    if field("BatchFlag") == Some("0") {
        return Some("it is not a batch job (only a job submitted with sbatch can be requeued)");
    }
    if field("Requeue") == Some("0") {
        return Some("Requeue=0 (submit it with `sbatch --requeue`, or have the site set JobRequeue=1 in slurm.conf)");
    }
    None
}

fn scontrol(args: &[&str]) -> Result<String, SlurmError> {
    let command = format!("scontrol {}", args.join(" "));
    let out = Command::new("scontrol").args(args).output().map_err(|error| SlurmError::Spawn { command: command.clone(), error })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(SlurmError::Failed { command, status: out.status, stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Trimmed from Slurm 22.05's `scontrol show job --oneliner` of a running batch job.
    const SHOWN: &str = "JobId=7 JobName=wrap UserId=ckpt-test(1002) GroupId=ckpt-test(1002) Priority=1 \
        JobState=RUNNING Reason=None Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 \
        Command=(null) WorkDir=/tmp/x StdOut=/tmp/x/job.out";

    #[test]
    fn requeueable_or_why_not() {
        assert_eq!(requeue_refusal(SHOWN), None);
        let no_requeue = SHOWN.replace("Requeue=1", "Requeue=0");
        assert!(requeue_refusal(&no_requeue).is_some_and(|why| why.contains("--requeue")));
        let interactive = SHOWN.replace("BatchFlag=1", "BatchFlag=0");
        assert!(requeue_refusal(&interactive).is_some_and(|why| why.contains("batch")));
        // A name that merely ends like a field does not count.
        assert_eq!(requeue_refusal("JobId=7 NoRequeue=0 BatchFlag=1"), None);
        assert_eq!(requeue_refusal(""), None);
    }

    #[test]
    fn job_ids() {
        assert_eq!(SlurmJob::new("4711").unwrap().to_string(), "4711");
        for bad in ["", "12;rm", "-1", "4711_3"] {
            assert!(matches!(SlurmJob::new(bad), Err(SlurmError::BadJobId(_))), "{bad:?}");
        }
    }
}
