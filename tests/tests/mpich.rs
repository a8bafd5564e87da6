//! End-to-end tests of MPICH jobs (Debian's mpich: ch4 over UCX, the Hydra process manager;
//! installed by scripts/test.sh beside Open MPI, whose `mpicc` and `mpiexec` it leaves alone):
//! `ckpt launch -- mpiexec.mpich -n 2 mpi_ring_mpich`, through the canonical scenario (see
//! `tests::canonical_scenario`): checkpointed, crashed, restarted, checkpointed with `--kill`
//! and restarted again, finishing with the answer of an uninterrupted run. mpiexec, its proxy
//! and the ranks are one process tree (Unix socket pairs, pipes, PMI over TCP on the loopback).
//! The ranks talk over MPICH's shared memory in one test, over UCX's TCP transport in another
//! and over UCX's shared-memory transports in the third (ckpt gives MPICH jobs the UCX
//! transports it keeps, `UCX_TLS=self,tcp,posix,sysv,cma`: ckpt-launch/src/mpi/mpich.rs).

use tests::*;

/// Seconds the MPI program runs (uninterrupted).
const SECONDS: &str = "6";

fn mpiexec() -> std::path::PathBuf {
    let p = std::path::Path::new("/usr/bin/mpiexec.mpich");
    assert!(p.exists(), "MPICH is not installed: apt-get install mpich libmpich-dev (scripts/test.sh does)");
    p.to_path_buf()
}

/// The library built beside the test programs (tests/progs/Makefile).
fn finalize_progress_lib() -> std::path::PathBuf {
    build_progs();
    let p = progs_dir().join("bin/libmpich_finalize_progress.so");
    assert!(p.is_file(), "{} was not built", p.display());
    p
}

/// `env`: variables mpiexec gives every rank (`-genv NAME VALUE`), so that the reference run
/// (outside ckpt) and the run under ckpt get them alike.
///
/// Every rank also preloads `libmpich_finalize_progress.so` (tests/progs/mpich_finalize_progress.c):
/// MPICH 4.0.2's MPI_Finalize waits in a PMI barrier without progressing UCX, and over UCX's TCP
/// transport a rank that got there first leaves the other spinning for good, without ckpt as
/// with it (2 runs in 40 of this ring alone, 8 in 40 two jobs at a time). The library keeps UCX
/// progressing during that wait (upstream MPICH dropped the barrier), so that these tests check
/// ckpt and not that race.
fn mpich_case(name: &str, env: &'static [(&'static str, &'static str)]) -> Case {
    let mpiexec = mpiexec();
    Case::new(name, move |_work| {
        let mut argv = vec![os(&mpiexec)];
        argv.extend([os("-genv"), os("LD_PRELOAD"), os(finalize_progress_lib())]);
        for (k, v) in env {
            argv.extend([os("-genv"), os(k), os(v)]);
        }
        argv.extend([os("-n"), os("2"), os(prog("mpi_ring_mpich")), os(SECONDS)]);
        argv
    })
    .timing(Timing::MPI)
}

/// Ranks on one node talk through MPICH's own shared memory (ch4's POSIX module), the default;
/// UCX still connects them (over TCP) for what does not go through it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpiexec_two_ranks_shared_memory() {
    canonical_scenario(&mpich_case("mpich-shm", &[]));
}

/// `MPIR_CVAR_NOLOCAL=1`: no shared memory between ranks, every message over UCX's TCP
/// transport (connections between the ranks, each rank's listener, nested epoll instances).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpiexec_two_ranks_ucx_tcp() {
    canonical_scenario(&mpich_case("mpich-tcp", &[("MPIR_CVAR_NOLOCAL", "1"), ("UCX_TLS", "tcp,self")]));
}

/// `MPIR_CVAR_NOLOCAL=1` and the transports ckpt gives a job: every message over UCX's
/// shared-memory transports (posix, sysv, cma), which UCX prefers on one node: segments each
/// rank maps, and a datagram socket per rank bound to an abstract name, to which the other rank
/// sends one-byte wake-ups that stay queued for good (they come back from their senders'
/// names: `ckpt_core::objects::unix`). The uninterrupted reference run, outside ckpt, takes
/// UCX's own choice.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mpiexec_two_ranks_ucx_shared_memory() {
    let case = mpich_case("mpich-ucx-sm", &[("MPIR_CVAR_NOLOCAL", "1")]).check_image(|dir| {
        // UCX's posix segments: files of /dev/shm deleted once mapped (named ucx_shm_posix_* at
        // first, after a restart by the restart's unnamed copies).
        let i = inspect(dir);
        assert!(
            i.stdout.contains("Deleted(DeletedFileRecord { path: \"/dev/shm/"),
            "mpich-ucx-sm: the last generation holds no UCX shared-memory segment: the ranks did not use those transports\n{i}"
        );
    });
    canonical_scenario(&case);
}
