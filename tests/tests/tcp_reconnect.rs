//! End-to-end tests of TCP without repair mode (ckpt-core/src/objects/tcp_reconnect.rs), as root
//! with the path forced by `CKPT_TCP_RECONNECT=1`: the same programs as the repair-mode tests of
//! channels.rs, with the same promises (every byte in flight kept once; connections between the
//! job's processes made again at restart; connections to the outside come back reset).

use tests::*;

/// Every test here forces the path; the ckpt commands the tests run inherit the setting.
fn force_reconnect() {
    std::env::set_var("CKPT_TCP_RECONNECT", "1");
}

/// Stream A full both ways (a slow receiver with a small buffer) at the checkpoint, a half-closed
/// stream, a connection waiting in a backlog, a peer that closed after sending: checkpoint,
/// crash, restart, checkpoint --kill, restart; the answer equals an uninterrupted run.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tcp_between_processes_without_repair_mode() {
    force_reconnect();
    canonical_scenario(&Case::new("tcp-reconnect", |work: &std::path::Path| {
        vec![os(prog("tcp")), os(work), os("5")]
    }));
}

/// A connection to an echo server outside the job comes back reset (the program sees
/// ECONNRESET), and `ckpt inspect` lists it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tcp_peer_outside_the_job_reset_without_repair_mode() {
    use std::io::{Read, Write};
    force_reconnect();
    let sb = Sandbox::new("tcp-reconnect-outside");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the echo server");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut c, _)) = listener.accept() {
            let mut buf = [0u8; 4096];
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 || c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let argv = vec![os(prog("tcp")), os("--peer"), os(port.to_string()), os("4")];
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    launch.checkpoint(&[]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    launch.kill_launcher();
    let i = inspect(&sb.dir);
    assert!(i.success() && i.stdout.contains("to a peer outside the job"), "inspect does not list the connection:\n{i}");

    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = restarted.wait();
    let out = restarted.output();
    assert!(
        out.lines().any(|l| l.starts_with("PEER RESET") && l.contains("Connection reset by peer")),
        "the program did not see its connection reset (ECONNRESET)\n{}",
        restarted.report()
    );
    assert_eq!(status.code(), Some(3), "{}", restarted.report());
    assert_not_rerun(&restarted);
}

/// Several checkpoints in a row while the job runs, then a restart: the drained bytes are put
/// back each time, so the live job never loses or repeats one.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tcp_checkpointed_many_times_without_repair_mode() {
    force_reconnect();
    let sb = Sandbox::new("tcp-reconnect-many");
    let work = sb.mkdir("run");
    let ref_work = sb.mkdir("ref");
    let argv = vec![os(prog("tcp")), os(&work), os("10")];
    let reference = reference_run(&[os(prog("tcp")), os(&ref_work), os("10")], &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", std::time::Duration::from_secs(30));
    // Ten seconds of program for six checkpoints with their drains, which a loaded machine slows.
    for _ in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        check_checkpoint_json(&launch.checkpoint(&[]));
    }
    launch.wait();
    let case = Case::new("tcp-reconnect-many", |w: &std::path::Path| vec![os(prog("tcp")), os(w), os("10")]);
    assert_matches_reference(&case, &mut launch, &reference);
}

/// Open MPI over TCP on one node (`--mca btl tcp,self`): the ranks' connections to each other and
/// to mpirun are drained and made again; the job's listeners keep their ports (a pair whose
/// listener's process comes later makes that listener first).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpirun_two_ranks_tcp_without_repair_mode() {
    force_reconnect();
    let mpirun = std::path::PathBuf::from("/usr/bin/mpirun");
    assert!(mpirun.exists(), "Open MPI is not installed: apt-get install openmpi-bin libopenmpi-dev (scripts/test.sh does)");
    let case = Case::new("mpi-tcp-reconnect", move |work| {
        let mut argv = vec![os(&mpirun)];
        if jobs_as_root() {
            argv.push(os("--allow-run-as-root"));
        }
        // A port range of its own (mpi.rs's TCP test uses 46200..46300).
        for a in ["--oversubscribe", "-np", "2", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_port_min_v4", "46400", "--mca", "btl_tcp_port_range_v4", "100", "--mca", "orte_tmpdir_base"] {
            argv.push(os(a));
        }
        argv.extend([os(work), os(prog("mpi_ring")), os("6")]);
        argv
    })
    .timing(Timing::MPI);
    canonical_scenario(&case);
}
