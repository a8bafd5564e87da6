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
    // The reference runs beside the job, in a sandbox of its own: out of what the restarts put
    // back when the protected directory is the job's whole sandbox.
    let ref_sb = Sandbox::new(&format!("{}-reference", case.name));
    let (ref_work, run_work) = (ref_sb.mkdir("ref"), sb.mkdir("run"));
    let reference = Reference::start(&case.argv(&ref_work), &ref_sb.path("reference.out"));
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
    assert_matches_reference(case, &mut second, reference.output());
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
/// line twice), and a file another program created after the checkpoint in the directory the job
/// writes to (which the job never held) does not refuse the restart: it is named in a warning and
/// left as it is (issue 33). `--keep-files` takes the files as they are.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn appended_output_is_cut_back_and_a_new_file_beside_it_is_named_not_refused() {
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

    // --keep-files: the files as they are (the log is not cut back either).
    let mut kept = Job::restart_with(&sb.dir, &["--keep-files"], &sb.path("restart2.out"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(kept.try_wait().is_none(), "--keep-files should restart the job\n{}", kept.report());
    kept.kill_launcher();

    // Without it the restart goes on, naming the new file; the log (which the --keep-files run
    // appended to again) is cut back to the checkpoint, so its lines follow each other without a
    // gap or a repeat after the restarted job appends.
    let mut again = Job::restart(&sb.dir, &sb.path("restart3.out"));
    std::thread::sleep(Duration::from_millis(500));
    check_checkpoint_json(&again.checkpoint(&["--kill"]));
    again.wait_killed();
    assert!(again.errors().contains("intruder.txt"), "the restart does not name the file created after the checkpoint\n{}", again.report());
    assert_eq!(std::fs::read(&intruder).unwrap(), b"written after the checkpoint", "the restart changed a file the job never held");
    let log = std::fs::read_to_string(work.join("out.log")).unwrap();
    let nums: Vec<u64> = log.lines().map(|l| l.parse().unwrap_or_else(|_| panic!("a torn line {l:?} in out.log"))).collect();
    for (k, n) in nums.iter().enumerate() {
        assert_eq!(*n, k as u64, "out.log line {k} is {n}: a line twice or lost (not cut back to the checkpoint)");
    }
}

/// How long tests/progs/simsteps.c runs: a file every 50 ms, long enough for two rounds of
/// checkpoint, files written after it and crash, before the last restart.
const SIM_SECONDS: &str = "6";

fn simsteps(work: &Path) -> Vec<std::ffi::OsString> {
    vec![os(prog("simsteps")), os(work), os(SIM_SECONDS)]
}

/// The names of the `out_NNNN.dat` files of a simsteps work directory, sorted.
fn out_files(work: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(work)
        .unwrap_or_else(|e| panic!("{}: {e}", work.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out_") && n.ends_with(".dat"))
        .collect();
    names.sort();
    names
}

/// Waits until a restarted simsteps prints a step (it runs again); panics with the restart's
/// output if it ends first (a refused restart).
fn wait_running_again(job: &mut Job) {
    let start = std::time::Instant::now();
    while !job.output().lines().any(|l| l.starts_with("step ")) {
        assert!(job.try_wait().is_none(), "the restart ended before the job ran again\n{}", job.report());
        assert!(start.elapsed() < RESTORE_TIMEOUT, "the restarted job did not run again in {RESTORE_TIMEOUT:?}\n{}", job.report());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A simsteps run ended: its answer, PASS, not run again from its start, and its work directory
/// (every out file and the log, one line per step) equal to the reference run's.
fn assert_simsteps_finished(job: &mut Job, reference: &str, run_work: &Path, ref_work: &Path) {
    let case = Case::new("simsteps", simsteps);
    assert_matches_reference(&case, job, reference);
    assert_not_rerun(job);
    let names = out_files(run_work);
    assert_eq!(names, out_files(ref_work), "the out files differ from the reference run's");
    for f in names.iter().map(String::as_str).chain(["sim.log"]) {
        assert_same_file(&run_work.join(f), &ref_work.join(f));
    }
}

/// The commonest shape of an HPC job (issue 33), without `--protect`: a log held open for
/// appending and a new file written every step in its working directory (tests/progs/simsteps.c).
/// `crashes` times: checkpoint, the job writes more files, crash, restart, which must go on (the
/// job never held the files it wrote after the checkpoint; it writes them again). Then the job
/// finishes with the answer, the log (each step once) and the files of an uninterrupted run.
fn simulation_crashed(name: &str, crashes: usize) {
    let sb = Sandbox::new(name);
    let (ref_work, run_work) = (sb.mkdir("ref"), sb.mkdir("run"));
    let reference = Reference::start(&simsteps(&ref_work), &sb.path("reference.out"));
    let mut job = Job::launch(&sb.dir, &simsteps(&run_work), &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    let mut left_by_crash: Option<String> = None;
    for round in 1..=crashes {
        // A checkpoint taken before the restarted job has written again every step file its
        // crashed run had left beyond the last checkpoint would find those files there, not
        // held, and the job rewrites them in place after it: a restart is then refused, as for
        // any file written in place (USER-GUIDE, "Files at restart"). So the next checkpoint
        // waits for the job to pass them.
        if let Some(last) = left_by_crash.take() {
            let step = last.trim_start_matches("out_").trim_end_matches(".dat").to_string();
            job.wait_for_line(&format!("step {step}"), Duration::from_secs(30));
        }
        check_checkpoint_json(&job.checkpoint(&[]));
        let resumed = std::time::SystemTime::now();
        let at_checkpoint = out_files(&run_work);
        std::thread::sleep(Duration::from_millis(1000));
        assert!(job.try_wait().is_none(), "round {round}: the job ended before the crash\n{}", job.report());
        job.kill_launcher();
        if round > 1 {
            assert_not_rerun(&job);
        }
        let now = out_files(&run_work);
        left_by_crash = now.last().cloned();
        let written = now.iter().filter(|n| std::fs::metadata(run_work.join(n)).and_then(|m| m.modified()).is_ok_and(|t| t > resumed)).count();
        assert!(written > 0, "round {round}: the job wrote no file between the checkpoint and the crash\n{}", job.report());
        eprintln!("round {round}: {written} out files written after the checkpoint ({} new), then a crash", now.len() - at_checkpoint.len());
        job = Job::restart(&sb.dir, &sb.path(&format!("restart{round}.out")));
        wait_running_again(&mut job);
    }
    job.wait();
    assert_simsteps_finished(&mut job, reference.output(), &run_work, &ref_work);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_simulation_writing_a_file_per_step_restarts_after_a_crash() {
    simulation_crashed("simsteps", 1);
}

/// The same, crashed again after a checkpoint of the restarted job, taken once the restarted job
/// has written again the step files its crashed run had left beyond the first checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_simulation_writing_a_file_per_step_restarts_after_a_crash_of_its_restart() {
    simulation_crashed("simsteps-twice", 2);
}

/// `--on-term checkpoint` (a batch system's warning before it ends the job), then another program
/// writes a new file beside the job's output (in the directory of the log the job holds open for
/// appending): the restart must go on, name that file, leave it alone, and the job finish with
/// the answer and the files of an uninterrupted run (issue 33).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_file_written_beside_the_output_after_an_on_term_checkpoint_does_not_refuse_the_restart() {
    let sb = Sandbox::new("onterm-beside");
    let (ref_work, run_work) = (sb.mkdir("ref"), sb.mkdir("run"));
    let reference = Reference::start(&simsteps(&ref_work), &sb.path("reference.out"));
    let mut launch = Job::launch_with(&sb.dir, &["--on-term", "checkpoint"], &simsteps(&run_work), &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: kill(2) on the launcher this test started.
    assert_eq!(unsafe { libc::kill(launch.pid() as libc::pid_t, libc::SIGTERM) }, 0);
    let status = launch.wait();
    assert!(!status.success() && result_line(&launch.output()).is_none(), "SIGTERM should have ended the job with a checkpoint\n{}", launch.report());
    wait_job_gone(&sb.dir, EXIT_TIMEOUT, "the launcher ended after its --on-term checkpoint");

    let beside = run_work.join("summary.txt");
    let mut write = command(interpreter("bash"));
    write.args([os("-c"), os(r#"echo "steps so far: $(wc -l < "$1/sim.log")" > "$1/summary.txt""#), os("summary"), os(&run_work)]);
    let out = run_command(write, COMMAND_TIMEOUT);
    assert!(out.success(), "the other program failed: {out}");
    let summary = std::fs::read(&beside).unwrap();

    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    again.wait();
    assert_simsteps_finished(&mut again, reference.output(), &run_work, &ref_work);
    assert!(again.errors().contains("summary.txt"), "the restart does not name the file created after the checkpoint\n{}", again.report());
    assert_eq!(std::fs::read(&beside).unwrap(), summary, "the restart changed a file the job never held");
}

/// Restart on another machine (issue 35), simulated by another boot id (the test hook
/// `CKPT_TEST_BOOT_ID`): the program runs from a copy of its executable, which after the
/// checkpoint is replaced by another copy with the same bytes (another inode, as on a node with
/// its own root file system). On the same boot the restart refuses it, as before; on another it
/// is taken by its build-id and the job finishes with the reference's answer. A copy of another
/// program in its place is refused, naming both build-ids.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_executable_copied_anew_is_taken_by_its_contents_on_another_boot() {
    let sb = Sandbox::new("another-boot-exe");
    let bin_dir = sb.mkdir("bin");
    let bin = bin_dir.join("compute");
    copy_program(&prog("compute"), &bin);
    let argv = [os(&bin), os(SECONDS)];
    let reference = reference_run(&argv, &sb.path("ref.out")).unwrap_or_else(|e| panic!("{e}"));
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(800));
    check_checkpoint_json(&launch.checkpoint(&["--kill"]));
    launch.wait_killed();

    let another_boot = [("CKPT_TEST_BOOT_ID", "00000000-0000-4000-8000-000000000035")];
    let restart = [os("restart"), os("--dir"), os(&sb.dir)];
    let attempt = |name: &str, env: &[(&str, &str)], extra: &[&str]| {
        let mut args = restart.to_vec();
        args.extend(extra.iter().map(os));
        let mut job = Job::start(&sb.dir, &sub_tag(&sb.dir, name), &args, env, &sb.path(&format!("{name}.out")));
        let status = job.wait_timeout(Duration::from_secs(60));
        (job, status)
    };

    // Replaced as a package manager does: a new file renamed over the old (another inode).
    let replace_with = |from: &Path| {
        let new = bin_dir.join("compute.new");
        copy_program(from, &new);
        std::fs::rename(&new, &bin).unwrap();
    };
    // Another program's copy in its place: refused on another boot, naming both build-ids.
    replace_with(&prog("threads"));
    let (job, status) = attempt("other-build", &another_boot, &[]);
    let err = job.errors();
    assert!(
        !status.success() && err.contains("restart refused") && err.contains(&bin.display().to_string()) && err.contains("build-id"),
        "another program's copy was not refused naming its build-id:\n{}",
        job.report()
    );

    // The same bytes, another inode.
    replace_with(&prog("compute"));
    let (job, status) = attempt("same-boot", &[], &[]);
    let err = job.errors();
    assert!(
        !status.success() && err.contains("executable was replaced by another file"),
        "on the same boot another inode must still be refused:\n{}",
        job.report()
    );

    let (job, status) = attempt("elsewhere", &another_boot, &[]);
    assert!(status.success(), "the restart on another boot did not take a copy with the same contents:\n{}", job.report());
    let out = job.output();
    assert_eq!(result_line(&out), result_line(&reference), "the restarted job's answer differs from the reference's\n{}", job.report());
    assert!(has_line(&out, "PASS") && fail_lines(&out).is_empty(), "{}", job.report());
    assert_not_rerun(&job);
}
