//! End-to-end tests of ckpt under a real one-node Slurm (scripts/slurm-up.sh starts one;
//! scripts/test.sh runs it): batch jobs whose script is `exec ckpt run --dir D -- PROG`,
//! submitted with sbatch as the run's user, warned as `#SBATCH --signal=B:USR1@T` warns them
//! (`scancel --batch --signal=USR1`, which signals the batch shell: ckpt), checkpoint and end,
//! are requeued, and continue from the checkpoint when Slurm starts them again.
//!
//! The harness acts as the scheduler as root (the warning, `scontrol update StartTime=now` to
//! skip the requeued job's two-minute BeginTime); the jobs belong to the run's user.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use tests::*;

/// How long a batch job may take to start once it may (Slurm schedules at once on an idle node).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Panics, saying what to do, unless a Slurm answers with a node that runs jobs; then waits
/// until no other test uses the cluster (one test at a time: an urgent job preempts whatever
/// runs, and the node has as many cores as the machine) and holds it for the caller.
fn slurm_alone() -> MachineWide {
    let out = Command::new("sinfo").args(["--noheader", "--Node", "--format=%t"]).output();
    let state = out.as_ref().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    assert!(
        ["idle", "mix", "alloc"].iter().any(|s| state.starts_with(s)),
        "no Slurm node runs jobs here (sinfo: {out:?}): start one with `bash scripts/slurm-up.sh` (scripts/test.sh does)"
    );
    machine_wide("slurm")
}

/// Words quoted for a POSIX shell (the batch script sbatch --wrap writes).
fn shell_words<S: AsRef<std::ffi::OsStr>>(words: &[S]) -> String {
    words.iter().map(|w| format!("'{}'", w.as_ref().to_string_lossy().replace('\'', r"'\''"))).collect::<Vec<_>>().join(" ")
}

/// A submitted batch job. Dropped, it is cancelled (a failed test leaves nothing in the queue).
struct BatchJob {
    id: String,
    /// The job's stdout (the program's output) and stderr (ckpt's), appended to by each run.
    out: PathBuf,
    err: PathBuf,
}

impl BatchJob {
    /// `sbatch` as the run's user: `exec ckpt run --dir DIR -- ARGV` as the batch script, with
    /// the options a user of ckpt gives (a time limit, and the warning before it), and `extra`.
    fn submit(sb: &Sandbox, name: &str, extra: &[&str], argv: &[OsString]) -> BatchJob {
        let (out, err) = (sb.path(&format!("{name}.out")), sb.path(&format!("{name}.err")));
        let mut script = vec![OsString::from("exec"), os(ckpt_bin()), os("run"), os("--dir"), os(&sb.dir), os("--")];
        script.extend(argv.iter().cloned());
        let mut cmd = command("sbatch");
        cmd.args(["--parsable", "--job-name", name, "--time=10", "--signal=B:USR1@60", "--open-mode=append"])
            .args(extra)
            .arg(format!("--chdir={}", sb.path("").display()))
            .arg(format!("--output={}", out.display()))
            .arg(format!("--error={}", err.display()))
            .arg(format!("--wrap={}", shell_words(&script)))
            // sbatch passes its environment on: the job's processes carry the sandbox's tag.
            .env(TAG_VAR, &sb.dir);
        let done = run_command(cmd, COMMAND_TIMEOUT);
        assert!(done.success(), "sbatch failed: {done}");
        let id = done.stdout.trim().split(';').next().unwrap_or_default().to_string();
        assert!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()), "sbatch --parsable printed no job id: {done}");
        BatchJob { id, out, err }
    }

    /// `scontrol show job --oneliner`: the job as Slurm sees it.
    fn show(&self) -> String {
        let out = Command::new("scontrol").args(["show", "job", "--oneliner", &self.id]).output().expect("run scontrol");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A field of [`BatchJob::show`] (`JobState`, `Restarts`, `ExitCode`).
    fn field(&self, name: &str) -> String {
        let shown = self.show();
        shown.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')).unwrap_or_default().to_string()
    }

    /// Waits until `done` holds of the job, polling; panics after `timeout`, saying `what`.
    fn wait_until(&self, what: &str, timeout: Duration, done: impl Fn(&BatchJob) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(start.elapsed() < timeout, "Slurm job {}: not {what} after {timeout:?}\n{}", self.id, self.report());
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the job to be in `state` after `restarts` requeues; panics at once if it has
    /// ended otherwise (a requeue that did not happen shows as COMPLETED or FAILED).
    fn wait_state(&self, state: &str, restarts: u32, timeout: Duration) {
        const ENDED: [&str; 8] = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"];
        self.wait_until(&format!("{state} after {restarts} restart(s)"), timeout, |j| {
            let (now, restarted) = (j.field("JobState"), j.field("Restarts"));
            let reached = now == state && restarted == restarts.to_string();
            assert!(reached || !ENDED.contains(&now.as_str()), "Slurm job {}: {now} after {restarted} restart(s)\n{}", j.id, j.report());
            reached
        });
    }

    /// Waits for the job's program to print START.
    fn wait_started(&self) {
        self.wait_until("started (START in its output)", START_TIMEOUT, |j| has_line(&read_text(&j.out), "START"));
    }

    /// Slurm's warning before the time limit, as `--signal=B:USR1@T` sends it: to the batch shell.
    fn warn(&self) {
        let out = run_command(scheduler(&["scancel", "--batch", "--signal=USR1", &self.id]), COMMAND_TIMEOUT);
        assert!(out.success(), "scancel --batch --signal=USR1 {}: {out}", self.id);
    }

    fn output(&self) -> String {
        read_text(&self.out)
    }

    fn errors(&self) -> String {
        read_text(&self.err)
    }

    fn report(&self) -> String {
        format!("--- scontrol show job:\n{}--- stdout:\n{}\n--- stderr:\n{}", self.show(), self.output(), self.errors())
    }
}

impl Drop for BatchJob {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.id).output();
    }
}

/// A command of the scheduler's (root, the harness), not of the job's user.
fn scheduler(argv: &[&str]) -> Command {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// The generations committed in `dir`, where no job runs any more.
fn committed(dir: &Path) -> Vec<u64> {
    let (running, generations) = status_generations(dir);
    assert!(!running, "no job runs in {} now", dir.display());
    generations
}

fn count_lines(text: &str, line: &str) -> usize {
    text.lines().filter(|l| l.trim() == line).count()
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn warned_batch_job_checkpoints_is_requeued_and_continues() {
    requeued_and_continues("slurm-requeue", &[os(prog("compute")), os("8"), os("16")]);
}

/// The same with an MPI job in the batch script (`exec ckpt run --dir D -- mpirun -np 2 ...`,
/// Open MPI, two ranks over shared memory), as USER-GUIDE "An MPI job under Slurm" shows.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn warned_mpi_batch_job_checkpoints_is_requeued_and_continues() {
    let mut argv = vec![os("/usr/bin/mpirun")];
    if jobs_as_root() {
        argv.push(os("--allow-run-as-root"));
    }
    argv.extend([os("--oversubscribe"), os("-np"), os("2"), os("--mca"), os("btl"), os("self,vader"), os(prog("mpi_ring")), os("8")]);
    requeued_and_continues("slurm-mpi", &argv);
}

/// A batch job running `argv` under `exec ckpt run`, warned once it has done some work: it is
/// checkpointed, ended and requeued, and the requeued job continues from the checkpoint to the
/// uninterrupted run's answer, without starting again.
fn requeued_and_continues(name: &str, argv: &[std::ffi::OsString]) {
    let _slurm = slurm_alone();
    let sb = Sandbox::new(name);
    let argv = argv.to_vec();
    thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&argv, &sb.path("reference.out")));
        let job = BatchJob::submit(&sb, name, &["--requeue"], &argv);
        job.wait_started();
        // Some work done, that the second run must not do again.
        thread::sleep(Duration::from_millis(700));
        job.warn();

        // Checkpointed, ended, requeued: pending again, nothing of it left running.
        job.wait_state("PENDING", 1, Duration::from_secs(30));
        wait_job_gone(&sb.dir, EXIT_TIMEOUT, "the job was requeued");
        let first = job.errors();
        assert!(first.contains("generation 1 committed") && first.contains(&format!("Slurm job {} requeued", job.id)), "{}", job.report());
        assert_eq!(committed(&sb.dir), vec![1], "{}", job.report());
        assert!(result_line(&job.output()).is_none(), "the first run was ended before the program's end\n{}", job.report());

        start_now(&job);
        job.wait_state("COMPLETED", 1, JOB_TIMEOUT);
        continued_to_the_answer(&job, &reference.join().expect("reference thread").unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(job.field("ExitCode"), "0:0", "{}", job.report());
    });
}

/// Starts a requeued job now, skipping its BeginTime (about two minutes). Not within the second
/// of the requeue: slurmd revokes the job's credential at the requeue, with a time in whole
/// seconds, and refuses a launch whose credential is of the same second ("Job credential
/// revoked": the job then fails; seen once in a run of the suite).
fn start_now(job: &BatchJob) {
    thread::sleep(Duration::from_millis(1100));
    let update = run_command(scheduler(&["scontrol", "update", &format!("JobId={}", job.id), "StartTime=now"]), COMMAND_TIMEOUT);
    assert!(update.success(), "{update}");
}

/// Checks that the job's second run restarted from generation 1 instead of starting again, and
/// finished with `reference`'s (the uninterrupted run's) answer.
fn continued_to_the_answer(job: &BatchJob, reference: &str) {
    let out = job.output();
    assert!(job.errors().contains("holds generation 1: restarting the job"), "the second run restarts\n{}", job.report());
    assert_eq!(count_lines(&out, "START"), 1, "the second run continues from the checkpoint, not from the start\n{}", job.report());
    assert!(has_line(&out, "PASS") && fail_lines(&out).is_empty(), "{}", job.report());
    assert_eq!(result_line(&out), result_line(reference), "the uninterrupted run's answer\n{}", job.report());
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn warned_job_that_is_not_requeueable_ends_after_its_checkpoint_and_continues_when_submitted_again() {
    let _slurm = slurm_alone();
    let sb = Sandbox::new("slurm-norequeue");
    let argv = vec![os(prog("compute")), os("5"), os("16")];
    let job = BatchJob::submit(&sb, "norequeue", &["--no-requeue"], &argv);
    job.wait_started();
    thread::sleep(Duration::from_millis(500));
    job.warn();
    // Ended as after `ckpt checkpoint --kill` (128 + SIGKILL), not requeued.
    job.wait_until("ended", Duration::from_secs(30), |j| !matches!(j.field("JobState").as_str(), "RUNNING" | "COMPLETING"));
    assert_eq!(job.field("JobState"), "FAILED", "{}", job.report());
    assert_eq!(job.field("Restarts"), "0", "{}", job.report());
    let errors = job.errors();
    assert!(errors.contains("not requeueable: Requeue=0"), "says why there is no requeue\n{}", job.report());
    assert!(errors.contains("submit the job script again"), "says what to do\n{}", job.report());
    assert_eq!(committed(&sb.dir), vec![1], "{}", job.report());

    // The same script submitted again continues the work.
    let again = BatchJob::submit(&sb, "norequeue-again", &["--no-requeue"], &argv);
    again.wait_state("COMPLETED", 0, JOB_TIMEOUT);
    let out = again.output();
    assert!(!has_line(&out, "START") && has_line(&out, "PASS"), "{}", again.report());
    let reference = reference_run(&argv, &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(result_line(&out), result_line(&reference), "{}", again.report());
}

/// Preemption: a job of a partition that a higher one preempts by requeueing, with a grace time
/// (scripts/slurm-up.sh: `debug`, GraceTime=60, under `urgent`; `preempt_send_user_signal`), is
/// sent the warning (USR1) the moment an urgent job needs its node, not SIGTERM: ckpt checkpoints
/// it and ends it, Slurm requeues it, the urgent job runs, and the requeued job continues from
/// the checkpoint to the uninterrupted answer.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn preempted_batch_job_checkpoints_at_the_warning_and_continues() {
    let _slurm = slurm_alone();
    let sb = Sandbox::new("slurm-preempt");
    let argv = vec![os(prog("compute")), os("8"), os("16")];
    thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&argv, &sb.path("reference.out")));
        let job = BatchJob::submit(&sb, "preempted", &["--requeue", "--exclusive"], &argv);
        job.wait_started();
        thread::sleep(Duration::from_millis(700));
        // An urgent job that needs the whole node.
        let urgent = run_command(
            scheduler(&["sbatch", "--parsable", "--partition=urgent", "--exclusive", "--time=1", "--output=/dev/null", "--wrap=sleep 1"]),
            COMMAND_TIMEOUT,
        );
        assert!(urgent.success(), "sbatch --partition=urgent: {urgent}");
        let urgent_id = urgent.stdout.trim().split(';').next().unwrap_or_default().to_string();
        struct Cancel(String);
        impl Drop for Cancel {
            fn drop(&mut self) {
                let _ = Command::new("scancel").arg(&self.0).output();
            }
        }
        let _urgent = Cancel(urgent_id.clone());

        // The warning came at once: checkpointed and ended, well before the grace time is up.
        job.wait_until("checkpointed at the preemption", Duration::from_secs(30), |j| j.errors().contains("generation 1 committed"));
        wait_job_gone(&sb.dir, EXIT_TIMEOUT, "the preempted job was ended");
        job.wait_until("requeued", Duration::from_secs(30), |j| j.field("JobState") == "PENDING");
        assert_eq!(committed(&sb.dir), vec![1], "{}", job.report());
        assert!(result_line(&job.output()).is_none(), "the first run was ended before the program's end\n{}", job.report());

        // The urgent job runs and ends; ours starts again (its BeginTime skipped) and continues.
        let urgent_done = |_: &BatchJob| {
            let out = Command::new("scontrol").args(["show", "job", "--oneliner", &urgent_id]).output().expect("run scontrol");
            String::from_utf8_lossy(&out.stdout).contains("JobState=COMPLETED")
        };
        job.wait_until("waiting for the urgent job to end", JOB_TIMEOUT, urgent_done);
        start_now(&job);
        job.wait_until("completed", JOB_TIMEOUT, |j| j.field("JobState") == "COMPLETED");
        continued_to_the_answer(&job, &reference.join().expect("reference thread").unwrap_or_else(|e| panic!("{e}")));
    });
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn failed_checkpoint_on_the_warning_neither_ends_nor_requeues_the_job() {
    let _slurm = slurm_alone();
    let sb = Sandbox::new("slurm-failed");
    // A process in namespaces of its own (user, time): a checkpoint of it fails (it cannot be
    // captured yet), which stands for any failure.
    let program = "echo START; unshare --user --map-root-user --time sleep 4; echo RESULT finished";
    let argv = vec![os("/bin/sh"), os("-c"), os(program)];
    let job = BatchJob::submit(&sb, "failed", &["--requeue"], &argv);
    job.wait_started();
    thread::sleep(Duration::from_millis(300));
    job.warn();
    job.wait_until("reporting the failed checkpoint", Duration::from_secs(30), |j| j.errors().contains("is not requeued"));
    let errors = job.errors();
    assert!(errors.contains("checkpoint failed") && errors.contains("the job was not ended and runs on"), "{}", job.report());
    assert_eq!(job.field("JobState"), "RUNNING", "the job runs on\n{}", job.report());
    job.wait_state("COMPLETED", 0, JOB_TIMEOUT);
    let out = job.output();
    assert_eq!(count_lines(&out, "START"), 1, "{}", job.report());
    assert_eq!(result_line(&out).as_deref(), Some("finished"), "the program ran to its end\n{}", job.report());
    assert!(committed(&sb.dir).is_empty(), "no generation\n{}", job.report());
}
