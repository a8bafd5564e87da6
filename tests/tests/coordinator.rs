//! End-to-end tests of the standalone coordinator (`ckpt coordinator`) and agents joined to it
//! (`ckpt launch --coord`, `ckpt restart --coord`): one generation over several nodes (here,
//! several agents on this machine with different node names), the failure rules of
//! docs/PROTOCOL.md (each checked by killing a process at a step with `CKPT_TEST_DIE_AT`), the
//! secret, and `ckpt agent-rsh`.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tests::*;

/// A running `ckpt coordinator --listen 127.0.0.1:0` and the address it bound.
struct Coord {
    job: Job,
    addr: String,
}

fn start_coordinator(sb: &Sandbox, name: &str, extra: &[&str], env: &[(&str, &str)]) -> Coord {
    let addr_file = sb.dir.join("coordinator.addr");
    // A killed coordinator leaves its address behind: never read an old one.
    let _ = std::fs::remove_file(&addr_file);
    let mut args = vec![os("coordinator"), os("--listen"), os("127.0.0.1:0"), os("--dir"), os(&sb.dir)];
    args.extend(extra.iter().map(os));
    let mut job = Job::start(&sb.dir, &sub_tag(&sb.dir, name), &args, env, &sb.path(&format!("{name}.out")));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let addr = read_text(&addr_file).trim().to_string();
        if !addr.is_empty() {
            return Coord { job, addr };
        }
        assert!(job.try_wait().is_none(), "the coordinator ended at once\n{}", job.report());
        assert!(Instant::now() < deadline, "the coordinator wrote no address\n{}", job.report());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ckpt launch --coord ADDR --node NODE --dir D -- ARGV`, or `ckpt restart ...` when `argv` is
/// empty.
fn node(sb: &Sandbox, coord: &Coord, node: &str, argv: &[PathBuf], env: &[(&str, &str)], out: &str) -> Job {
    let verb = if argv.is_empty() { "restart" } else { "launch" };
    let mut args: Vec<OsString> = vec![os(verb), os("--coord"), os(&coord.addr), os("--node"), os(node), os("--dir"), os(&sb.dir), os("--pool"), os("128M")];
    if !argv.is_empty() {
        args.push(os("--"));
        args.extend(argv.iter().map(os));
    }
    Job::start(&sb.dir, &sub_tag(&sb.dir, node), &args, env, &sb.path(out))
}

fn compute(secs: u32) -> Vec<PathBuf> {
    vec![prog("compute"), PathBuf::from(secs.to_string())]
}

fn threads(secs: u32) -> Vec<PathBuf> {
    vec![prog("threads"), PathBuf::from(secs.to_string())]
}

fn reference(sb: &Sandbox, argv: &[PathBuf], name: &str) -> String {
    let text = reference_run(argv, &sb.path(&format!("{name}.out"))).unwrap_or_else(|e| panic!("{e}"));
    result_line(&text).expect("a RESULT")
}

/// Waits for the job to end and checks it finished with the reference RESULT.
fn assert_finishes_with(job: &mut Job, want: &str) {
    let status = job.wait();
    assert!(status.success(), "{}", job.report());
    assert_eq!(result_line(&job.output()).as_deref(), Some(want), "{}", job.report());
    assert!(has_line(&job.output(), "PASS"), "{}", job.report());
}

/// The committed generations: those whose directory holds a MANIFEST.
fn committed(dir: &Path) -> Vec<u64> {
    let mut gens: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("MANIFEST").is_file())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("gen-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    gens.sort();
    gens
}

fn manifest_nodes(dir: &Path) -> Vec<String> {
    let out = ckpt(&[os("inspect"), os(dir), os("--json")]);
    assert!(out.success(), "inspect: {out}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("inspect --json: {e}: {out}"));
    let mut nodes: Vec<String> = v["nodes"].as_array().expect("nodes").iter().map(|n| n["node"].as_str().unwrap().to_string()).collect();
    nodes.sort();
    nodes
}

fn start_two(sb: &Sandbox, coord: &Coord, b_env: &[(&str, &str)], a_secs: u32, b_secs: u32) -> (Job, Job) {
    let mut a = node(sb, coord, "a", &compute(a_secs), &[], "a.out");
    let mut b = node(sb, coord, "b", &threads(b_secs), b_env, "b.out");
    a.wait_for_line("START", Duration::from_secs(20));
    b.wait_for_line("START", Duration::from_secs(20));
    wait_nodes(sb, 2);
    (a, b)
}

/// Waits until `n` agents have joined (`ckpt status` lists them).
fn wait_nodes(sb: &Sandbox, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = ckpt(&[os("status"), os("--dir"), os(&sb.dir), os("--json")]);
        let joined = serde_json::from_str::<Value>(out.stdout.trim()).ok().and_then(|v| v["nodes"].as_array().map(|a| a.len())).unwrap_or(0);
        if joined >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} agents did not join: {out}\n{}", sb.report());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Processes of a job still traced by someone (a leftover of a checkpoint).
fn traced(tag: &Path) -> Vec<String> {
    job_processes(tag)
        .into_iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().to_string();
            (tracer != "0").then(|| format!("{pid} traced by {tracer}"))
        })
        .collect()
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn two_nodes_one_generation_then_restart_each_node() {
    two_nodes_then_restart("coord-two", false);
}

/// The same with every node's parts on its own storage (`--local-dir`): the `--kill`
/// generation is incremental there too, and each node's restart reads the pages it refers to
/// from its own storage.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn two_nodes_with_node_local_parts_incremental_then_restart() {
    two_nodes_then_restart("coord-two-local", true);
}

/// Two nodes, a generation, a `--kill` generation (incremental: it refers to the first), a
/// restart of each node from it with a new coordinator.
fn two_nodes_then_restart(name: &str, node_local: bool) {
    let sb = Sandbox::new(name);
    let (ref_a, ref_b) = (reference(&sb, &compute(6), "ref-a"), reference(&sb, &threads(6), "ref-b"));
    let template = format!("{}/{{node}}", sb.dir.join("local").display());
    let level: Vec<&str> = if node_local { vec!["--local-dir", &template] } else { vec![] };
    let mut coord = start_coordinator(&sb, "coord", &level, &[]);
    let (mut a, mut b) = start_two(&sb, &coord, &[], 6, 6);
    std::thread::sleep(Duration::from_millis(800));
    let g = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    assert_eq!(committed(&sb.dir), vec![g]);
    assert_eq!(manifest_nodes(&sb.dir), ["a", "b"], "one MANIFEST lists both nodes");
    assert!(sb.dir.join(format!("gen-{g:06}/a/procs.bin")).is_file() && sb.dir.join(format!("gen-{g:06}/b/procs.bin")).is_file());
    let v = verify(&sb.dir);
    assert!(v.success(), "{v}");
    // A node's part cannot be restarted alone without a coordinator.
    let alone = ckpt(&[os("restart"), os("--dir"), os(&sb.dir)]);
    assert!(!alone.success() && alone.stderr.contains("--coord"), "{alone}");

    // --kill: both nodes' jobs are held frozen until the generation is committed, then end.
    std::thread::sleep(Duration::from_millis(300));
    let g2 = check_checkpoint_json(&checkpoint(&sb.dir, &["--kill"]));
    assert!(g2 > g);
    a.wait_killed();
    b.wait_killed();
    assert_eq!(committed(&sb.dir), vec![g, g2]);
    let out = ckpt(&[os("inspect"), os(&sb.dir), os("--json")]);
    let needs = serde_json::from_str::<Value>(&out.stdout).map(|v| v["needs"].clone()).unwrap_or_default();
    assert_eq!(needs, serde_json::json!([g]), "the --kill generation should refer to the first: {out}");
    if node_local {
        for n in ["a", "b"] {
            let chunks = sb.dir.join("local").join(n).join(format!("gen-{g:06}/{n}/chunks"));
            assert!(chunks.is_dir(), "node {n}'s part of generation {g} is not on its own storage ({})", chunks.display());
        }
    }
    // Every agent gone, the coordinator ends.
    assert!(coord.job.wait_timeout(Duration::from_secs(10)).success(), "{}", coord.job.report());

    let coord = start_coordinator(&sb, "coord2", &level, &[]);
    let mut ra = node(&sb, &coord, "a", &[], &[], "ra.out");
    let mut rb = node(&sb, &coord, "b", &[], &[], "rb.out");
    assert_finishes_with(&mut ra, &ref_a);
    assert_finishes_with(&mut rb, &ref_b);
    assert_not_rerun(&ra);
    assert_not_rerun(&rb);
}

/// Agent b kills itself at `step` of generation 2: the generation is aborted on a, which runs on
/// to the right answer; b's job dies with its agent; generation 1 stays intact.
fn agent_dies_at(step: &str) {
    let sb = Sandbox::new(&format!("coord-agent-{step}"));
    let ref_a = reference(&sb, &compute(6), "ref-a");
    let _coord = start_coordinator(&sb, "coord", &[], &[]);
    let die = format!("{step}@2");
    let (mut a, mut b) = start_two(&sb, &_coord, &[("CKPT_TEST_DIE_AT", &die)], 6, 30);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(check_checkpoint_json(&checkpoint(&sb.dir, &[])), 1);
    let failed = try_checkpoint(&sb.dir, &[]).expect_err("generation 2 must fail");
    assert!(failed.all().contains("node b"), "the error names the lost node: {failed}");
    let status = b.wait_timeout(Duration::from_secs(10));
    assert_eq!(status.code(), None, "b's agent was killed: {}", b.report());
    wait_job_gone(&b.tag, Duration::from_secs(5), "b's agent died");
    assert!(traced(&a.tag).is_empty(), "{:?}", traced(&a.tag));
    assert_finishes_with(&mut a, &ref_a);
    assert_eq!(committed(&sb.dir), vec![1]);
    let v = verify(&sb.dir);
    assert!(v.success(), "{v}");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn agent_killed_after_capture_aborts_the_generation() {
    agent_dies_at("captured");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn agent_killed_at_prepare_aborts_the_generation() {
    agent_dies_at("prepare");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn agent_killed_at_release_aborts_the_generation() {
    agent_dies_at("release");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn agent_killed_at_persist_aborts_the_generation() {
    agent_dies_at("persist");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn silent_agent_is_lost_after_missed_heartbeats() {
    let sb = Sandbox::new("coord-silent");
    let (ref_a, ref_b) = (reference(&sb, &compute(6), "ref-a"), reference(&sb, &threads(8), "ref-b"));
    let _coord = start_coordinator(&sb, "coord", &[], &[]);
    let (mut a, mut b) = start_two(&sb, &_coord, &[], 6, 8);
    std::thread::sleep(Duration::from_millis(500));
    // b's agent stops answering (and sending heartbeats); its job runs on.
    // SAFETY: kill(2) on the agent this test started.
    assert_eq!(unsafe { libc::kill(b.pid() as i32, libc::SIGSTOP) }, 0);
    let t = Instant::now();
    let failed = try_checkpoint(&sb.dir, &[]).expect_err("the checkpoint must fail");
    assert!(t.elapsed() < Duration::from_secs(10), "lost agent detected in {:?}", t.elapsed());
    assert!(failed.all().contains("node b"), "{failed}");
    assert!(committed(&sb.dir).is_empty());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(b.pid() as i32, libc::SIGCONT) }, 0);
    // Both jobs run to their end: a was released at the abort, b finds its coordinator gone.
    assert_finishes_with(&mut a, &ref_a);
    assert_finishes_with(&mut b, &ref_b);
    assert!(b.errors().contains("lost the coordinator"), "{}", b.report());
}

/// The coordinator kills itself at `step` of generation 2: every agent releases its job when
/// the connection drops; the jobs finish with the right answers; generation 1 stays intact.
fn coordinator_dies_at(step: &str) -> (Sandbox, String, String) {
    let sb = Sandbox::new(&format!("coord-dies-{step}"));
    let (ref_a, ref_b) = (reference(&sb, &compute(6), "ref-a"), reference(&sb, &threads(6), "ref-b"));
    let die = format!("{step}@2");
    let mut coord = start_coordinator(&sb, "coord", &[], &[("CKPT_TEST_DIE_AT", &die)]);
    let (mut a, mut b) = start_two(&sb, &coord, &[], 6, 6);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(check_checkpoint_json(&checkpoint(&sb.dir, &[])), 1);
    let failed = try_checkpoint(&sb.dir, &[]).expect_err("generation 2 must fail");
    assert!(coord.job.wait_timeout(Duration::from_secs(10)).code().is_none(), "the coordinator was killed: {failed}");
    // An agent in the middle of its capture finds the connection gone once the capture ends,
    // which a loaded machine makes slow: the jobs must be let go, soon, not at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(traced(&a.tag).is_empty() && traced(&b.tag).is_empty()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(traced(&a.tag).is_empty() && traced(&b.tag).is_empty(), "still traced 10 s after the coordinator died: {:?} {:?}", traced(&a.tag), traced(&b.tag));
    assert_finishes_with(&mut a, &ref_a);
    assert_finishes_with(&mut b, &ref_b);
    assert!(a.errors().contains("lost the coordinator"), "{}", a.report());
    assert_eq!(committed(&sb.dir), vec![1]);
    let v = verify(&sb.dir);
    assert!(v.success(), "{v}");
    (sb, ref_a, ref_b)
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn coordinator_killed_while_jobs_are_frozen() {
    coordinator_dies_at("captured");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn coordinator_killed_while_agents_freeze() {
    coordinator_dies_at("prepare");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn coordinator_killed_after_release() {
    coordinator_dies_at("release");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn coordinator_killed_before_commit_leaves_the_last_generation_restartable() {
    let (sb, ref_a, ref_b) = coordinator_dies_at("commit");
    // Generation 1 restarts on both nodes, under a new coordinator.
    let coord = start_coordinator(&sb, "coord2", &[], &[]);
    let mut ra = node(&sb, &coord, "a", &[], &[], "ra.out");
    let mut rb = node(&sb, &coord, "b", &[], &[], "rb.out");
    assert_finishes_with(&mut ra, &ref_a);
    assert_finishes_with(&mut rb, &ref_b);
}

fn write_frame(s: &mut TcpStream, v: &Value) {
    let body = serde_json::to_vec(v).unwrap();
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
}

fn read_frame(s: &mut TcpStream) -> Value {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("an answer");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn connections_without_the_secret_are_refused() {
    let sb = Sandbox::new("coord-secret");
    let ref_a = reference(&sb, &compute(4), "ref-a");
    let mut coord = start_coordinator(&sb, "coord", &[], &[("CKPT_LOG", "info")]);
    let secret = std::fs::read_to_string(sb.dir.join("secret")).expect("the coordinator created the secret");
    assert_eq!(secret.trim().len(), 64);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(sb.dir.join("secret")).unwrap().permissions().mode() & 0o777, 0o600);
    let mut a = node(&sb, &coord, "a", &compute(4), &[], "a.out");
    a.wait_for_line("START", Duration::from_secs(20));
    wait_nodes(&sb, 1);

    // A wrong secret, then no hello at all.
    let mut s = TcpStream::connect(&coord.addr).unwrap();
    write_frame(&mut s, &json!({"msg": "hello", "secret": "00".repeat(32), "role": {"role": "client"}}));
    let answer = read_frame(&mut s);
    assert_eq!(answer["msg"], "error", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("secret"), "{answer}");
    let mut s = TcpStream::connect(&coord.addr).unwrap();
    write_frame(&mut s, &json!({"msg": "request", "op": "checkpoint"}));
    assert_eq!(read_frame(&mut s)["msg"], "error");
    // The CLI and an agent with a wrong secret file are refused too.
    let wrong = sb.path("wrong-secret");
    std::fs::write(&wrong, "ab".repeat(32)).unwrap();
    let out = ckpt(&[os("checkpoint"), os("--coord"), os(&coord.addr), os("--secret-file"), os(&wrong)]);
    assert!(!out.success() && out.stderr.contains("refused"), "{out}");
    let mut intruder = Job::start(
        &sb.dir,
        &sub_tag(&sb.dir, "x"),
        &[os("launch"), os("--coord"), os(&coord.addr), os("--node"), os("x"), os("--secret-file"), os(&wrong), os("--dir"), os(&sb.dir), os("--"), os(prog("compute"))],
        &[],
        &sb.path("x.out"),
    );
    assert!(!intruder.wait_timeout(Duration::from_secs(10)).success(), "{}", intruder.report());
    assert!(!has_line(&intruder.output(), "START"), "the intruder's program never started");

    let log = coord.job.errors();
    assert!(log.contains("refused a connection") && log.contains("127.0.0.1"), "the refusals are logged with the peer: {log}");
    // Nothing changed in the job: no generation, it finishes as if alone.
    assert!(std::fs::read_dir(&sb.dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with("gen-")));
    assert_finishes_with(&mut a, &ref_a);
    // Its only agent gone, the coordinator ends.
    assert!(coord.job.wait_timeout(Duration::from_secs(10)).success());
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn agent_rsh_starts_the_remote_agent_outside_the_asking_job() {
    let sb = Sandbox::new("coord-rsh");
    // On one machine the "remote" command runs here; `env` stands for `ssh {host}`.
    let coord = start_coordinator(&sb, "coord", &["--rsh", "env CKPT_RSH_HOST={host} sh -c"], &[]);
    let bin = ckpt_bin();
    let script = format!(
        "{} agent-rsh -x nodeb {} 6; echo RSH=$?; {} 6",
        bin.display(),
        prog("compute").display(),
        prog("compute").display()
    );
    let mut a = Job::start(
        &sb.dir,
        &sub_tag(&sb.dir, "a"),
        &[os("launch"), os("--coord"), os(&coord.addr), os("--node"), os("a"), os("--dir"), os(&sb.dir), os("--pool"), os("128M"), os("--"), os("/bin/sh"), os("-c"), os(&script)],
        &[],
        &sb.path("a.out"),
    );
    a.wait_for_line("RSH=0", Duration::from_secs(30));
    wait_nodes(&sb, 2);
    // The remote agent is not in a's process tree (it is the coordinator's child).
    let family = descendants(a.pid());
    let cmdlines: Vec<String> = family.iter().map(|p| describe_processes(&[p.pid])).collect();
    assert!(cmdlines.iter().all(|c| !c.contains("--node nodeb")), "{cmdlines:?}");
    let g = check_checkpoint_json(&checkpoint(&sb.dir, &[]));
    assert_eq!(manifest_nodes(&sb.dir), ["a", "nodeb"], "generation {g}");
    assert!(a.wait().success(), "{}", a.report());
}
