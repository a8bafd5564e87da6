//! PostgreSQL 15 under ckpt (issue 18): the server keeps its data in files it changes in place,
//! opens and closes as it goes, creates, renames and removes (WAL segments). Under
//! `ckpt launch --protect DATA` a crash after more writes, then a restart, must bring back exactly
//! the checkpoint's rows, with clients connecting through the server's Unix socket (whose file
//! must come back with the server's owner and mode), further writes adding up, and `pg_amcheck`
//! finding nothing; the same after `checkpoint --kill`. Without `--protect` the crash round must
//! be refused, naming a file of the data directory.
//!
//! PostgreSQL refuses to run as root: as root the server runs as the `postgres` user through
//! setpriv; as an ordinary user (CKPT_TEST_USER), as that user.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tests::*;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// One server's sandbox: data directory, socket directory, port.
struct Pg {
    sb: Sandbox,
    data: PathBuf,
    sock: PathBuf,
    port: u16,
}

/// The prefix that runs a command as the server's user.
fn as_server_user() -> Vec<OsString> {
    if jobs_as_root() {
        ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"].iter().map(os).collect()
    } else {
        user_prefix()
    }
}

fn server_command(program: &str) -> Command {
    let prefix = as_server_user();
    let path = Path::new(BIN).join(program);
    match prefix.split_first() {
        None => Command::new(path),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(path);
            c
        }
    }
}

impl Pg {
    /// A new data directory (initdb), owned by the server's user.
    fn new(name: &str, port: u16) -> Pg {
        // Not installed fails the test: a test that reports ok without running is a defect.
        assert!(Path::new(BIN).join("postgres").is_file(), "PostgreSQL 15 is not installed: apt-get install postgresql (scripts/test.sh does)");
        let sb = Sandbox::new(name);
        let base = sb.mkdir("pg");
        let sock = sb.mkdir("pg/sock");
        if jobs_as_root() {
            // The server's user must reach and write its directories.
            std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
            for d in [&base, &sock] {
                std::os::unix::fs::chown(d, Some(uid_of("postgres")), Some(gid_of("postgres"))).unwrap();
            }
        }
        let data = base.join("data");
        let mut initdb = server_command("initdb");
        initdb.args([os("-D"), os(&data), os("-A"), os("trust"), os("-U"), os("postgres"), os("--no-sync")]);
        let out = run_command(initdb, Duration::from_secs(60));
        assert!(out.success(), "initdb failed: {out}");
        Pg { sb, data, sock, port }
    }

    /// The server's command line under `ckpt launch` (which already runs as the test's user).
    fn server_argv(&self) -> Vec<OsString> {
        let mut argv = if jobs_as_root() { as_server_user() } else { Vec::new() };
        argv.push(os(Path::new(BIN).join("postgres")));
        for a in ["-D", &self.data.to_string_lossy(), "-k", &self.sock.to_string_lossy(), "-p", &self.port.to_string(), "-c", "listen_addresses="] {
            argv.push(os(a));
        }
        argv
    }

    /// Runs SQL through the server's Unix socket; returns its output or the error.
    fn try_sql(&self, sql: &str) -> Result<String, String> {
        let mut c = server_command("psql");
        c.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-d", "postgres", "-p", &self.port.to_string(), "-h"]);
        c.arg(&self.sock).arg("-c").arg(sql);
        let out = run_command(c, Duration::from_secs(60));
        if out.success() {
            Ok(out.stdout.trim().to_string())
        } else {
            Err(out.to_string())
        }
    }

    fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}\n{}", self.sb.report()))
    }

    /// Waits until the server answers through its socket.
    fn wait_ready(&self, job: &mut Job) {
        let t = Instant::now();
        loop {
            match self.try_sql("select 1") {
                Ok(_) => return,
                Err(e) if t.elapsed() > Duration::from_secs(20) => panic!("the server does not answer: {e}\n{}", job.report()),
                Err(_) => {
                    assert!(job.try_wait().is_none(), "the job ended\n{}", job.report());
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// (count, sum) of the test table.
    fn rows(&self) -> String {
        self.sql("select count(*), sum(i) from t")
    }

    fn amcheck(&self) {
        self.sql("create extension if not exists amcheck");
        let mut c = server_command("pg_amcheck");
        c.args(["-U", "postgres", "-d", "postgres", "--heapallindexed", "-p", &self.port.to_string(), "-h"]).arg(&self.sock);
        let out = run_command(c, Duration::from_secs(60));
        assert!(out.success() && out.stdout.trim().is_empty(), "pg_amcheck found something: {out}");
    }
}

fn uid_of(name: &str) -> u32 {
    id_of("-u", name)
}

fn gid_of(name: &str) -> u32 {
    id_of("-g", name)
}

fn id_of(flag: &str, name: &str) -> u32 {
    let out = Command::new("id").args([flag, name]).output().expect("id");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a numeric id")
}

/// 1,000 rows, a checkpoint, 100,000 more rows and a PostgreSQL CHECKPOINT (the data files and
/// WAL on disk are now well past the checkpoint), then a crash. Returns the launch's generation.
fn checkpoint_then_write_on(pg: &Pg, launch: &mut Job) -> u64 {
    pg.wait_ready(launch);
    pg.sql("create table t (i int primary key, v text); insert into t select g, md5(g::text) from generate_series(1, 1000) g");
    let g = check_checkpoint_json(&launch.checkpoint(&[]));
    pg.sql("insert into t select g, md5(g::text) from generate_series(1001, 101000) g; checkpoint");
    assert_eq!(pg.rows(), "101000|5100550500");
    launch.kill_launcher();
    g
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn postgres_crash_and_kill_rounds_under_protect() {
    let pg = Pg::new("postgres-protect", port_of_this_run(0));
    let protect = pg.data.to_string_lossy().into_owned();
    let mut launch = Job::launch_with(&pg.sb.dir, &["--protect", &protect], &pg.server_argv(), &pg.sb.path("launch.out"));
    let g1 = checkpoint_then_write_on(&pg, &mut launch);

    // The crash round: exactly the checkpoint's rows, clients through the socket.
    let mut first = Job::restart(&pg.sb.dir, &pg.sb.path("restart1.out"));
    pg.wait_ready(&mut first);
    assert_eq!(pg.rows(), "1000|500500", "the restarted server does not hold the checkpoint's rows");
    let sock_file = pg.sock.join(format!(".s.PGSQL.{}", pg.port));
    let meta = std::fs::symlink_metadata(&sock_file).unwrap_or_else(|e| panic!("{}: {e}", sock_file.display()));
    let owner = if jobs_as_root() { uid_of("postgres") } else { test_user().map(|u| u.uid).unwrap_or(0) };
    assert_eq!((std::os::unix::fs::MetadataExt::uid(&meta), meta.permissions().mode() & 0o777), (owner, 0o777), "the socket file's owner and mode");
    // Further writes add up, also after a CHECKPOINT writes the server's memory to its files.
    pg.sql("insert into t values (200000, 'after'); checkpoint");
    assert_eq!(pg.rows(), "1001|700500");
    pg.amcheck();

    // The --kill round.
    let g2 = check_checkpoint_json(&first.checkpoint(&["--kill"]));
    assert!(g2 > g1);
    first.wait_killed();
    let mut second = Job::restart(&pg.sb.dir, &pg.sb.path("restart2.out"));
    pg.wait_ready(&mut second);
    assert_eq!(pg.rows(), "1001|700500");
    pg.sql("insert into t values (200001, 'again'); checkpoint");
    assert_eq!(pg.rows(), "1002|900501");
    pg.amcheck();
    second.checkpoint(&["--kill"]);
    second.wait_killed();
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn postgres_crash_round_without_protect_is_refused() {
    let pg = Pg::new("postgres-refused", port_of_this_run(1));
    let mut launch = Job::launch(&pg.sb.dir, &pg.server_argv(), &pg.sb.path("launch.out"));
    checkpoint_then_write_on(&pg, &mut launch);
    let mut job = Job::restart(&pg.sb.dir, &pg.sb.path("restart.out"));
    let status = job.wait_timeout(Duration::from_secs(60));
    assert!(!status.success(), "the restart should have been refused\n{}", job.report());
    wait_job_gone(&pg.sb.dir, Duration::from_secs(5), "a refused restart");
    let err = job.errors();
    assert!(err.contains("restart refused") && err.contains(&format!("{}/", pg.data.display())), "the refusal names no file of the data directory:\n{err}");
    assert!(pg.try_sql("select 1").is_err(), "a server answers although the restart was refused");
}
