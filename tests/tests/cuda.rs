//! CUDA jobs on a real NVIDIA GPU, checkpointed and restarted by ckpt alone (ckpt_core::gpu,
//! docs/PLAN-GPU.md): a CUDA C++ program (tests/progs/cuda/counter.cu, built with nvcc), the same
//! with a CPU-only child, two of them under a shell, and a PyTorch training loop with and
//! without DataLoader workers; each goes through the canonical scenario (checkpoint and run on,
//! crash, restart, `--kill`, restart) and must end with an uninterrupted run's RESULT.
//!
//! Built only where a GPU is (`cfg(ckpt_gpu)`: /dev/nvidiactl, or `CKPT_GPU_TESTS=1` to build
//! them here for scripts/gpu-check.sh to run there); ignored elsewhere, with the reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tests::*;

/// tests/progs/cuda/counter.cu, built once with nvcc (on the PATH, or CUDA's own directory).
fn cuda_counter() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let nvcc = ["nvcc", "/usr/local/cuda/bin/nvcc"]
                .into_iter()
                .find(|n| Command::new(n).arg("--version").output().is_ok_and(|o| o.status.success()))
                .expect("nvcc, to build tests/progs/cuda/counter.cu: not on the PATH nor in /usr/local/cuda/bin");
            let out = std::env::temp_dir().join(format!("ckpt-cuda-counter-{}", std::process::id()));
            let src = progs_dir().join("cuda/counter.cu");
            let built = Command::new(nvcc).args(["-O2", "-o"]).arg(&out).arg(&src).output().expect("run nvcc");
            assert!(built.status.success(), "nvcc {}: {}", src.display(), String::from_utf8_lossy(&built.stderr));
            std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            out
        })
        .clone()
}

/// The python3 the PATH names first: the one PyTorch is installed in (often a virtual
/// environment's), which need not be /usr/bin's.
fn python() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|d| d.join("python3")).find(|p| p.is_file()));
    on_path.unwrap_or_else(|| interpreter("python3"))
}

#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn a_cuda_program_holding_256_mib_of_device_memory() {
    let bin = cuda_counter();
    canonical_scenario(&Case::new("cuda-256", move |_| vec![os(&bin), os("256"), os("10")]));
}

#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn a_cuda_program_with_a_child_that_uses_no_gpu() {
    let bin = cuda_counter();
    canonical_scenario(&Case::new("cuda-worker", move |_| vec![os(&bin), os("64"), os("10"), os("--worker")]));
}

#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn two_cuda_programs_under_a_shell() {
    let bin = cuda_counter();
    let mut case = Case::new("cuda-tree", move |work: &Path| {
        let script = r#"echo START; "$0" 64 10 > "$1/a" & "$0" 32 10 > "$1/b"; wait
grep -h '^FAIL' "$1/a" "$1/b"
grep -q '^PASS' "$1/a" && grep -q '^PASS' "$1/b" && echo PASS
echo "RESULT $(grep -h '^RESULT' "$1/a" "$1/b" | tr -d ' \n')""#;
        vec![os("/bin/sh"), os("-c"), os(script), os(&bin), os(work)]
    });
    // Their outputs are written there after the checkpoint.
    case.protect_work = true;
    canonical_scenario(&case);
}

#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn a_pytorch_training_loop() {
    canonical_scenario(&Case::new("torch", |_| vec![os(python()), os(progs_dir().join("torch_train.py")), os("12")]));
}

#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn a_pytorch_training_loop_with_dataloader_workers() {
    canonical_scenario(&Case::new("torch-workers", |_| vec![os(python()), os(progs_dir().join("torch_train.py")), os("12"), os("2")]));
}

/// Two Open MPI ranks, each a CUDA process on the one GPU (scripts/gpu-check.sh skips this, and
/// says so, where Open MPI is not installed).
#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn two_open_mpi_ranks_on_one_gpu() {
    let bin = cuda_counter();
    let mpirun =
        ["/usr/bin/mpirun", "/usr/local/bin/mpirun"].into_iter().map(PathBuf::from).find(|p| p.exists()).expect("Open MPI's mpirun is not installed here");
    let case = Case::new("cuda-mpi", move |work| {
        let mut argv = vec![os(&mpirun)];
        if jobs_as_root() {
            argv.push(os("--allow-run-as-root"));
        }
        // Each run its own session directory: the reference run and the job start together.
        argv.extend([os("--oversubscribe"), os("-np"), os("2"), os("--mca"), os("orte_tmpdir_base"), os(work)]);
        argv.extend([os(&bin), os("64"), os("12")]);
        argv
    })
    .timing(Timing::MPI);
    canonical_scenario(&case);
}

/// `ckpt restart --lazy` of a CUDA job on the real GPU: the job's host memory comes in while it
/// runs, and the driver gets the device's contents back only once all of it is in (the
/// stand-in driver's test in gpu.rs checks the order from the log); the program's own check of
/// its device memory passes and its RESULT is the uninterrupted run's. An ordinary user's
/// restart is not lazy, says so, and ends the same.
#[test]
#[cfg_attr(not(ckpt_gpu), ignore = "no NVIDIA GPU on this machine: scripts/gpu-check.sh runs these where there is one")]
fn a_lazy_restart_of_a_cuda_program() {
    let bin = cuda_counter();
    let case = Case::new("cuda-lazy", move |_| vec![os(&bin), os("256"), os("12")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = reference_run(&argv, &sb.path("reference.out")).unwrap_or_else(|e| panic!("{e}"));
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", std::time::Duration::from_secs(60));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    job.checkpoint(&["--kill"]);
    job.wait_killed();

    let args = [os("restart"), os("--dir"), os(&sb.dir), os("--lazy")];
    let mut restarted = Job::start(&sb.dir, &sb.dir, &args, &[("CKPT_LOG", "ckpt_core::lazy=info")], &sb.path("restart.out"));
    assert_matches_reference(&case, &mut restarted, &reference);
    let err = restarted.errors();
    if jobs_as_root() {
        assert!(err.contains("lazy restart: the fill ended"), "cuda-lazy: the restart should have been lazy\n{}", restarted.report());
    } else {
        assert!(err.contains("not lazy"), "cuda-lazy: an ordinary user's restart should say it is not lazy\n{}", restarted.report());
    }
}
