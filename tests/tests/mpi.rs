//! End-to-end tests of Open MPI jobs (Debian's openmpi-bin, installed by scripts/test.sh):
//! `ckpt launch -- mpirun -np 2 mpi_ring`, through the canonical scenario (see
//! `tests::canonical_scenario`): checkpointed, crashed, restarted, checkpointed with `--kill` and
//! restarted again, finishing with the answer of an uninterrupted run. The ranks talk over shared
//! memory only (Open MPI's vader transport) in one test and over TCP only in the other;
//! mpirun holds a pseudo-terminal per rank for its output, its PMIx server's Unix sockets and a
//! TCP listener.

use tests::*;

/// Seconds the MPI program runs (uninterrupted).
const SECONDS: &str = "6";

fn mpirun() -> std::path::PathBuf {
    let p = std::path::Path::new("/usr/bin/mpirun");
    assert!(p.exists(), "Open MPI is not installed: apt-get install openmpi-bin libopenmpi-dev (scripts/test.sh does)");
    p.to_path_buf()
}

/// `own_session_dir`: give Open MPI a session directory in the run's work directory. Two
/// reference runs (outside ckpt) starting at once race to create /tmp/ompi.HOST.UID and one
/// fails, so only one test leaves it at its default (under ckpt: /dev/shm/ckpt-job-*).
fn mpi_case(name: &str, transport: &'static [&'static str], own_session_dir: bool) -> Case {
    let mpirun = mpirun();
    Case::new(name, move |work| {
        let mut argv = vec![os(&mpirun), os("--allow-run-as-root"), os("--oversubscribe"), os("-np"), os("2")];
        argv.extend(transport.iter().map(os));
        if own_session_dir {
            argv.extend([os("--mca"), os("orte_tmpdir_base"), os(work)]);
        }
        argv.extend([os(prog("mpi_ring")), os(SECONDS)]);
        argv
    })
    .timing(Timing {
        before_checkpoint: std::time::Duration::from_millis(1500),
        run_on: std::time::Duration::from_millis(700),
        after_restart: std::time::Duration::from_millis(1000),
    })
}

#[test]
fn mpirun_two_ranks_shared_memory() {
    if skip() {
        return;
    }
    canonical_scenario(&mpi_case("mpi-shm", &["--mca", "btl", "self,vader"], false));
}

#[test]
fn mpirun_two_ranks_tcp() {
    if skip() {
        return;
    }
    // Open MPI's TCP transport listens from port 1024 up by default: every MPI job of the
    // machine (other tests' included) competes for the same ports, and a restarted job needs its
    // own back. A range of its own keeps the test from depending on what else runs.
    canonical_scenario(&mpi_case(
        "mpi-tcp",
        &["--mca", "btl", "tcp,self", "--mca", "btl_tcp_port_min_v4", "46200", "--mca", "btl_tcp_port_range_v4", "100"],
        true,
    ));
}
