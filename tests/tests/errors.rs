//! Errors a user must get clearly: a missing image directory, a damaged image, a file that
//! disappeared before restart. Each must fail with a message that says what and where, and
//! leave no process running.

use std::path::Path;
use std::time::Duration;

use tests::*;

fn non_empty_lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// Launches `argv`, lets it run a little, checkpoints with --kill, and waits until the job is
/// gone: leaves a committed image in `sb.dir`.
fn make_image(sb: &Sandbox, argv: &[std::ffi::OsString]) {
    let mut job = Job::launch(&sb.dir, argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
}

/// Runs `ckpt restart` expecting it to fail; returns its stderr. Checks that the program did
/// not run and that no process of the job is left.
fn failed_restart(sb: &Sandbox) -> String {
    let mut job = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = job.wait_timeout(Duration::from_secs(60));
    assert!(
        !status.success(),
        "ckpt restart should have failed\n{}",
        job.report()
    );
    let out = job.output();
    assert!(
        result_line(&out).is_none(),
        "the program ran to its end although the restart failed\n{}",
        job.report()
    );
    wait_job_gone(&sb.dir, Duration::from_secs(5), "`ckpt restart` failed");
    job.errors()
}

#[test]
fn restart_nonexistent_dir() {
    if skip() {
        return;
    }
    let dir = format!("/nonexistent/ckpt-test-{}", std::process::id());
    let out = ckpt(&["restart", "--dir", &dir]);
    assert!(!out.success(), "ckpt restart --dir {dir} succeeded: {out}");
    let lines = non_empty_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "expected a one-line error message: {out}");
    assert!(
        lines[0].contains(&dir),
        "the message does not name {dir}: {out}"
    );
}

#[test]
fn checkpoint_without_job() {
    if skip() {
        return;
    }
    let sb = Sandbox::new("no-job");
    let dir = sb.mkdir("empty");
    let out = try_checkpoint(&dir, &[]).expect_err("checkpoint with no job succeeded");
    assert!(!out.success(), "{out}");
    let lines = non_empty_lines(&out.stderr);
    assert_eq!(lines.len(), 1, "expected a one-line error message: {out}");
    assert!(not_ready(&out), "expected \"no running job\": {out}");
}

#[test]
fn damaged_image_is_refused() {
    if skip() {
        return;
    }
    let sb = Sandbox::new("damaged");
    make_image(&sb, &[os(prog("compute")), os("5")]);
    let v = verify(&sb.dir);
    assert!(v.success(), "ckpt verify failed before any damage: {v}");

    let chunks = chunk_files(&sb.dir);
    let victim = chunks
        .iter()
        .max_by_key(|p| p.metadata().map(|m| m.len()).unwrap_or(0))
        .unwrap_or_else(|| panic!("no chunk file under {}/gen-*/**/chunks/", sb.dir.display()))
        .clone();
    let len = victim.metadata().unwrap().len();
    flip_byte(&victim, len / 2);
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();

    let v = verify(&sb.dir);
    assert!(
        !v.success(),
        "ckpt verify accepted a damaged chunk ({}): {v}",
        victim.display()
    );
    assert!(
        v.all().contains(&name),
        "ckpt verify does not name the damaged file {name}: {v}"
    );

    let err = failed_restart(&sb);
    assert!(
        err.contains(&name),
        "ckpt restart does not name the damaged file {name}:\n{err}"
    );
}

#[test]
fn deleted_file_stops_restart() {
    if skip() {
        return;
    }
    let sb = Sandbox::new("deleted");
    let work = sb.mkdir("run");
    make_image(&sb, &[os(prog("state")), os(&work), os("5")]);
    let data: &Path = &work.join("state-data.bin");
    std::fs::remove_file(data).unwrap_or_else(|e| panic!("{}: {e}", data.display()));

    let err = failed_restart(&sb);
    assert!(
        err.contains("state-data.bin"),
        "ckpt restart does not name the deleted file state-data.bin:\n{err}"
    );
}

/// An ordinary user on a machine whose administrator switched user namespaces off: `ckpt launch`
/// and `ckpt restart` say so, name the setting and what an administrator can do, and leave
/// nothing behind (no image directory, no process). The machine's setting is simulated in a
/// user namespace of the test's own, whose `user.max_user_namespaces` is set to 0 before ckpt
/// runs in it without capabilities.
#[test]
fn user_namespaces_switched_off_are_refused_clearly() {
    if skip() {
        return;
    }
    let sb = Sandbox::new("no-userns");
    // The jobs' user, or `nobody` when jobs run as root.
    let (uid, gid) = test_user().map(|u| (u.uid, u.gid)).unwrap_or((65534, 65534));
    std::os::unix::fs::chown(sb.path(""), Some(uid), Some(gid)).unwrap();
    let ckpt = ckpt_bin();
    for (verb, args) in [("launch", format!("--dir {} -- /bin/true", sb.dir.display())), ("restart", format!("--dir {}", sb.dir.display()))] {
        let script = format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --inh-caps=-all --ambient-caps=-all {} {verb} {args}",
            ckpt.display()
        );
        let mut cmd = std::process::Command::new("setpriv");
        cmd.args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into(), "--".into()]);
        cmd.args(["unshare", "--user", "--map-current-user", "--keep-caps", "sh", "-c", &script]);
        let out = run_command(cmd, COMMAND_TIMEOUT);
        assert!(!out.success(), "ckpt {verb} should fail without user namespaces: {out}");
        let err = out.stderr.to_lowercase();
        assert!(
            err.contains("user.max_user_namespaces = 0") && err.contains("sysctl -w user.max_user_namespaces="),
            "ckpt {verb} does not say which setting refuses it and what to do: {out}"
        );
        assert!(!sb.dir.exists(), "ckpt {verb} left {} behind", sb.dir.display());
        assert!(job_processes(&sb.dir).is_empty(), "ckpt {verb} left processes running");
    }
}

/// A process in a seccomp sandbox is refused at checkpoint time, naming the sandbox, rather than
/// brought back without it; the job goes on and finishes right.
#[test]
fn seccomp_sandbox_is_refused_not_dropped() {
    if skip() {
        return;
    }
    let sb = Sandbox::new("seccomp");
    let mut job = Job::launch(&sb.dir, &[os(prog("seccomp")), os("3")], &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    let out = try_checkpoint(&sb.dir, &[]).expect_err("a checkpoint of a seccomp-sandboxed process succeeded");
    assert!(out.all().contains("seccomp sandbox"), "the refusal does not name the sandbox: {out}");
    let status = job.wait();
    assert!(status.success() && has_line(&job.output(), "PASS"), "the job did not go on after the refusal\n{}", job.report());
}
