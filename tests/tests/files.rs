//! Files at restart (issue 18): a restart never brings old memory back over newer files without
//! saying so. Without `--protect`, a job that changed its files after the checkpoint is refused,
//! naming the file; with `--protect WORK` the work directory is put back as it was at the
//! checkpoint and the job goes on consistent. Real programs: a file rewritten in place
//! (savefiles), SQLite in WAL mode (python3), PostgreSQL (tests/tests/postgres.rs).

use std::path::Path;
use std::time::Duration;

use tests::*;

const SECONDS: &str = "5";

/// The crash round with `--protect WORK` given to the launch only (the restarts take it from the
/// job): launch, checkpoint, run on (changing files), crash, restart, checkpoint --kill, restart
/// and finish with the reference run's result; `compare` files equal to the reference run's.
/// With `whole_sandbox`, the protected directory is the sandbox, which also holds the image
/// directory and the commands' output files: they must be left alone.
fn protected_round(case: &Case, compare: &[&str], whole_sandbox: bool) {
    let sb = Sandbox::new(&case.name);
    let (ref_work, run_work) = (sb.mkdir("ref"), sb.mkdir("run"));
    let reference = reference_run(&case.argv(&ref_work), &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    let protect = if whole_sandbox { sb.path("") } else { run_work.clone() }.to_string_lossy().into_owned();
    let mut launch = Job::launch_with(&sb.dir, &["--protect", &protect], &case.argv(&run_work), &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(case.timing.before_checkpoint);
    let g1 = check_checkpoint_json(&launch.checkpoint(&[]));
    std::thread::sleep(case.timing.run_on);
    assert!(launch.try_wait().is_none(), "the job ended before the crash\n{}", launch.report());
    launch.kill_launcher();

    let mut first = Job::restart(&sb.dir, &sb.path("restart1.out"));
    std::thread::sleep(case.timing.after_restart);
    let g2 = check_checkpoint_json(&first.checkpoint(&["--kill"]));
    assert!(g2 > g1, "generation {g2} after {g1}");
    first.wait_killed();
    assert_not_rerun(&first);

    let mut second = Job::restart(&sb.dir, &sb.path("restart2.out"));
    assert_matches_reference(case, &mut second, &reference);
    for f in compare {
        assert_same_file(&run_work.join(f), &ref_work.join(f));
    }
}

/// The crash round without `--protect`: the restart is refused before any process exists, and
/// the refusal names a file of the work directory.
fn refused_round(case: &Case, names: &[&str]) {
    let sb = Sandbox::new(&format!("{}-refused", case.name));
    let run_work = sb.mkdir("run");
    let mut launch = Job::launch(&sb.dir, &case.argv(&run_work), &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(case.timing.before_checkpoint);
    check_checkpoint_json(&launch.checkpoint(&[]));
    std::thread::sleep(case.timing.run_on);
    launch.kill_launcher();

    let mut job = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = job.wait_timeout(Duration::from_secs(60));
    assert!(!status.success(), "the restart should have been refused (files changed after the checkpoint)\n{}", job.report());
    assert!(result_line(&job.output()).is_none(), "the program ran although the restart was refused\n{}", job.report());
    wait_job_gone(&sb.dir, Duration::from_secs(5), "a refused restart");
    let err = job.errors();
    assert!(
        names.iter().any(|n| err.contains(&format!("{}/{n}", run_work.display()))) && err.contains("restart refused"),
        "the refusal does not name one of {names:?} in {}:\n{err}",
        run_work.display()
    );
}

fn savefiles() -> Case {
    Case::new("savefiles-protect", |work: &Path| vec![os(prog("savefiles")), os(work), os(SECONDS)])
}

fn sqlite() -> Case {
    Case::new("sqlite-wal", |work: &Path| vec![os(interpreter("python3")), os(prog("sqlite_wal.py")), os(work), os(SECONDS)])
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn file_rewritten_in_place_is_put_back_under_protect() {
    protected_round(&savefiles(), &["data.bin"], true);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn file_rewritten_in_place_without_protect_is_refused() {
    refused_round(&savefiles(), &["data.bin"]);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn sqlite_wal_is_put_back_under_protect() {
    protected_round(&sqlite(), &[], false);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn sqlite_wal_without_protect_is_refused() {
    refused_round(&sqlite(), &["data.db", "data.db-wal", "data.db-shm"]);
}

/// Without `--protect`: an output file the job appends to is cut back to its checkpoint size (no
/// line twice), a file created after the checkpoint in the directory the job writes to refuses
/// the restart naming it, and `--keep-files` takes the files as they are.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn appended_output_is_cut_back_and_a_new_file_refuses_the_restart() {
    let sb = Sandbox::new("files-listing");
    let work = sb.mkdir("run");
    let script = r#"exec 3>>"$1/out.log"; i=0; echo START; while :; do echo $i >&3; i=$((i+1)); sleep 0.02; done"#;
    let argv = [os(interpreter("bash")), os("-c"), os(script), os("loop"), os(&work)];
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    check_checkpoint_json(&launch.checkpoint(&[]));
    std::thread::sleep(Duration::from_millis(300));
    launch.kill_launcher();

    let intruder = work.join("intruder.txt");
    std::fs::write(&intruder, b"written after the checkpoint").unwrap();
    give_to_user(&intruder);
    let mut refused = Job::restart(&sb.dir, &sb.path("restart1.out"));
    assert!(!refused.wait_timeout(Duration::from_secs(60)).success(), "a new file in the job's directory should refuse the restart\n{}", refused.report());
    let err = refused.errors();
    assert!(err.contains("intruder.txt") && err.contains("created"), "the refusal does not name intruder.txt as created:\n{err}");
    wait_job_gone(&sb.dir, Duration::from_secs(5), "a refused restart");

    // --keep-files: the files as they are (the log is not cut back either).
    let mut kept = Job::restart_with(&sb.dir, &["--keep-files"], &sb.path("restart2.out"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(kept.try_wait().is_none(), "--keep-files should restart the job\n{}", kept.report());
    kept.kill_launcher();
    std::fs::remove_file(&intruder).unwrap();

    // Without the intruder the restart goes on; the log (which the --keep-files run appended to
    // again) is cut back to the checkpoint, so its lines follow each other without a gap or a
    // repeat after the restarted job appends.
    let mut fourth = Job::restart(&sb.dir, &sb.path("restart4.out"));
    std::thread::sleep(Duration::from_millis(500));
    check_checkpoint_json(&fourth.checkpoint(&["--kill"]));
    fourth.wait_killed();
    let log = std::fs::read_to_string(work.join("out.log")).unwrap();
    let nums: Vec<u64> = log.lines().map(|l| l.parse().unwrap_or_else(|_| panic!("a torn line {l:?} in out.log"))).collect();
    for (k, n) in nums.iter().enumerate() {
        assert_eq!(*n, k as u64, "out.log line {k} is {n}: a line twice or lost (not cut back to the checkpoint)");
    }
}
