//! End-to-end tests of Open MPI jobs (Debian's openmpi-bin, installed by scripts/test.sh):
//! `ckpt launch -- mpirun -np 2 mpi_ring`, through the canonical scenario (see
//! `tests::canonical_scenario`): checkpointed, crashed, restarted, checkpointed with `--kill` and
//! restarted again, finishing with the answer of an uninterrupted run. The ranks talk over shared
//! memory (Open MPI's default between ranks of one node) in one test and over TCP in the other;
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

fn mpi_case(name: &str, transport: &'static [&'static str]) -> Case {
    let mpirun = mpirun();
    Case::new(name, move |_| {
        let mut argv = vec![os(&mpirun), os("--allow-run-as-root"), os("--oversubscribe"), os("-np"), os("2")];
        argv.extend(transport.iter().map(os));
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
    canonical_scenario(&mpi_case("mpi-shm", &[]));
}

#[test]
fn mpirun_two_ranks_tcp() {
    if skip() {
        return;
    }
    canonical_scenario(&mpi_case("mpi-tcp", &["--mca", "btl", "tcp,self"]));
}
