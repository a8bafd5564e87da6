//! End-to-end tests of what starts a checkpoint besides `ckpt checkpoint`: an interval, a signal
//! to the launcher, and SIGTERM with `--on-term checkpoint`.

use std::time::{Duration, Instant};

use tests::*;

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn interval_commits_generations() {
    let sb = Sandbox::new("interval");
    let mut job = Job::launch_with(&sb.dir, &["--interval", "1s", "--keep", "10"], &[prog("compute"), "7".into()], &sb.path("run.out"));
    job.wait_for_line("START", Duration::from_secs(10));
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let gens = committed(&sb.dir);
    assert!(gens.len() >= 2, "--interval 1s committed {gens:?} in {:?}\n{}", start.elapsed(), job.report());
    let status = job.wait();
    assert!(status.success(), "{}", job.report());
    assert_eq!(result_line(&job.output()), reference_result(&[prog("compute"), "7".into()], &sb));
}

fn reference_result(argv: &[std::path::PathBuf], sb: &Sandbox) -> Option<String> {
    let text = reference_run(argv, &sb.path("reference.out")).expect("the reference run succeeds");
    result_line(&text)
}

fn signal(job: &Job, sig: i32) {
    // SAFETY: kill(2) on the launcher this test started.
    assert_eq!(unsafe { libc::kill(job.pid() as i32, sig) }, 0);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn sigusr1_to_the_launcher_commits_one() {
    let sb = Sandbox::new("sigusr1");
    let mut job = Job::launch(&sb.dir, &[prog("compute"), "4".into()], &sb.path("run.out"));
    job.wait_for_line("START", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    assert!(committed(&sb.dir).is_empty());
    signal(&job, libc::SIGUSR1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while committed(&sb.dir).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(committed(&sb.dir), vec![1], "{}", job.report());
    assert!(job.wait().success(), "the job goes on after the checkpoint: {}", job.report());
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn sigterm_with_on_term_checkpoint_ends_the_job_with_a_generation() {
    let sb = Sandbox::new("onterm");
    let argv = [prog("compute"), "5".into()];
    let mut job = Job::launch_with(&sb.dir, &["--on-term", "checkpoint"], &argv, &sb.path("run.out"));
    job.wait_for_line("START", Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    signal(&job, libc::SIGTERM);
    let status = job.wait();
    assert!(!status.success(), "the job was ended: {}", job.report());
    assert!(result_line(&job.output()).is_none(), "the job did not run to its end: {}", job.report());
    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert!(again.wait().success(), "{}", again.report());
    assert!(!has_line(&again.output(), "START"), "restarted, not rerun: {}", again.report());
    assert_eq!(result_line(&again.output()), reference_result(&argv, &sb));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn program_asks_for_its_own_checkpoint_through_libckpt() {
    let sb = Sandbox::new("libckpt");
    let argv = [prog("apicall"), "4".into()];
    // Without ckpt: harmless, same result.
    let reference = reference_run(&argv, &sb.path("reference.out")).expect("the reference run succeeds");
    assert!(has_line(&reference, "ckpt disabled") && has_line(&reference, "PASS"), "{reference}");

    let mut job = Job::launch(&sb.dir, &argv, &sb.path("run.out"));
    job.wait_for_line("checkpoint: resumed", Duration::from_secs(20));
    assert!(fail_lines(&job.output()).is_empty(), "the hooks' checks failed after resume\n{}", job.report());
    assert_eq!(committed(&sb.dir), vec![1], "{}", job.report());
    std::thread::sleep(Duration::from_millis(300));
    job.kill_launcher();
    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert!(again.wait().success(), "{}", again.report());
    let out = again.output();
    assert!(has_line(&out, "checkpoint: restarted") && !has_line(&out, "START"), "{}", again.report());
    assert!(has_line(&out, "PASS"), "{}", again.report());
    assert_eq!(result_line(&out), result_line(&reference));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn checkpoint_returns_at_resume_with_no_wait_durable() {
    let sb = Sandbox::new("nowait");
    let argv = [prog("compute"), "5".into()];
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("run.out"));
    job.wait_for_line("START", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let v = try_checkpoint(&sb.dir, &["--no-wait-durable"]).unwrap_or_else(|out| panic!("checkpoint --no-wait-durable: {out}"));
    assert_eq!(v["durable"], serde_json::Value::Bool(false), "{v}");
    let generation = v["generation"].as_u64().expect("a generation number");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !committed(&sb.dir).contains(&generation) {
        assert!(Instant::now() < deadline, "generation {generation} never committed: {}", job.report());
        std::thread::sleep(Duration::from_millis(50));
    }
    job.kill_launcher();
    let mut again = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert!(again.wait().success(), "{}", again.report());
    assert_eq!(result_line(&again.output()), reference_result(&argv, &sb));
}
