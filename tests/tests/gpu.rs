//! CUDA jobs (ckpt_core::gpu, docs/PLAN-GPU.md) on a stand-in for NVIDIA's driver: ckpt loads
//! tests/progs/fakecuda.c's `libcuda.so.1` through LD_LIBRARY_PATH, as it loads the real one,
//! and drives tests/progs/fakegpu.c's "device" through the same calls (lock, checkpoint,
//! restore, unlock). What these tests check is ckpt's side: the calls made at the right moments,
//! the GPU's memory back after a crash and a restart, the driver's refusals passed on, nothing
//! left locked. The same on a real GPU is scripts/gpu-check.sh's.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use tests::*;

/// The directory every stand-in device lives in: what `CKPT_TEST_GPU_DEVICE` names to ckpt
/// (which counts a descriptor or a mapping under it as a GPU's) and to the stand-in driver.
const DEVICES: &str = "/tmp/ckpt-fakegpu/";

/// This test process, and every ckpt it starts, load the stand-in driver.
fn use_stand_in_driver() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        build_progs();
        std::fs::create_dir_all(DEVICES).unwrap();
        std::fs::set_permissions(DEVICES, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
        std::env::set_var("LD_LIBRARY_PATH", progs_dir().join("bin/fakecuda"));
        std::env::set_var("CKPT_TEST_GPU_DEVICE", DEVICES);
    });
}

/// A device of its own for a program run in `work` (each run starts with a new one).
fn device_for(work: &Path) -> PathBuf {
    let name: String = work.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let device = Path::new(DEVICES).join(name);
    for suffix in ["", ".state"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", device.display()));
    }
    device
}

/// The stand-in driver's state of the program using `device` ("running", "locked", ...).
fn gpu_state(device: &Path) -> String {
    let text = std::fs::read_to_string(format!("{}.state", device.display())).unwrap_or_default();
    text.split_whitespace().nth(1).unwrap_or("").to_string()
}

/// `ckpt launch -- fakegpu DEVICE 4` in a new sandbox, ckpt given `env`, once it has started.
fn launch_fakegpu(name: &str, env: &[(&str, &str)]) -> (Sandbox, PathBuf, Job) {
    use_stand_in_driver();
    let sb = Sandbox::new(name);
    let device = device_for(&sb.mkdir("run"));
    let args = [os("launch"), os("--dir"), os(&sb.dir), os("--"), os(prog("fakegpu")), os(&device), os("4")];
    let mut job = Job::start(&sb.dir, &sb.dir, &args, env, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    (sb, device, job)
}

/// Waits for `job` and checks that it ended well and printed PASS (`after`: what it ran on after).
fn assert_passes(job: &mut Job, after: &str) {
    let status = job.wait();
    assert!(status.success() && has_line(&job.output(), "PASS"), "the job did not run on right after {after}\n{}", job.report());
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_program_on_a_stand_in_gpu_survives_a_checkpoint_a_crash_and_a_restart() {
    use_stand_in_driver();
    // The device's file goes on changing after the first checkpoint until the crash: a restart
    // that mapped it as it is, instead of having the driver put back what the checkpoint
    // moved into memory, gives the program memory it did not write (it prints FAIL).
    canonical_scenario(&Case::new("fakegpu", |work| vec![os(prog("fakegpu")), os(device_for(work)), os("5")]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn the_checkpoint_of_a_cuda_job_reports_the_gpu_and_gives_it_back() {
    let (sb, device, mut job) = launch_fakegpu("fakegpu-json", &[]);
    let v = job.checkpoint(&[]);
    let gpu_ms = v["gpu_ms"].as_f64().unwrap_or_else(|| panic!("no gpu_ms in {v}"));
    assert!(gpu_ms > 0.0, "the checkpoint held no CUDA call: {v}");
    assert!(v["gpu_bytes"].is_u64(), "no gpu_bytes in {v}");
    assert_eq!(gpu_state(&device), "running", "the program's GPU was not given back after the checkpoint\n{}", job.report());
    let i = inspect(&sb.dir);
    assert!(
        i.success() && i.stdout.contains("CUDA: its GPU state is in its memory (NVIDIA driver, CUDA 13.0)"),
        "ckpt inspect does not show the CUDA process: {i}"
    );
    assert_passes(&mut job, "the checkpoint");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_driver_that_refuses_the_checkpoint_fails_it_and_the_job_runs_on_unlocked() {
    // As the real driver refuses a process with managed memory or CUDA IPC.
    let (sb, device, mut job) = launch_fakegpu("fakegpu-refused", &[("FAKECUDA_FAIL", "checkpoint")]);
    let refused = try_checkpoint(&sb.dir, &[]).expect_err("a checkpoint the driver refused succeeded");
    let said = refused.all();
    assert!(
        said.contains("the NVIDIA driver could not checkpoint its GPU state") && said.contains("CUDA_ERROR_NOT_SUPPORTED"),
        "the driver's refusal was not passed on: {said}"
    );
    assert_eq!(gpu_state(&device), "running", "the refused checkpoint left the program's GPU locked\n{}", job.report());
    assert_passes(&mut job, "the refused checkpoint");
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
#[cfg_attr(ckpt_gpu, ignore = "this machine has NVIDIA's driver, which the loader finds whatever LD_LIBRARY_PATH says")]
fn a_restart_where_the_driver_is_missing_is_refused_before_anything_runs() {
    let (sb, _, mut job) = launch_fakegpu("fakegpu-nodriver", &[]);
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    let args = [os("restart"), os("--dir"), os(&sb.dir)];
    let mut refused = Job::start(&sb.dir, &sb.dir, &args, &[("LD_LIBRARY_PATH", "/nonexistent")], &sb.path("refused.out"));
    let status = refused.wait_timeout(Duration::from_secs(60));
    assert!(!status.success(), "a restart without the driver succeeded\n{}", refused.report());
    let said = refused.errors();
    assert!(said.contains("restart refused") && said.contains("use the GPU") && said.contains("libcuda.so.1"), "{said}");
    assert!(job_processes(&sb.dir).is_empty(), "the refused restart left processes: {:?}", job_processes(&sb.dir));
    // The image is still good where the driver is.
    let mut second = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert_passes(&mut second, "a restart where the driver is");
}

/// `ckpt restart --lazy` of a CUDA job: the driver's restore reads the host copy of the GPU's
/// memory, so it waits until the memory is all in (rather than having the page server fetch it
/// page by page under the driver); the program then runs on with its device memory as it was.
/// An ordinary user's restart is not lazy (it says so) and ends the same.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_lazy_restart_gives_the_gpu_its_memory_once_it_is_all_in() {
    let (sb, device, mut job) = launch_fakegpu("fakegpu-lazy", &[]);
    std::thread::sleep(Duration::from_millis(500));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    let args = [os("restart"), os("--dir"), os(&sb.dir), os("--lazy")];
    let mut restarted = Job::start(&sb.dir, &sb.dir, &args, &[("CKPT_LOG", "ckpt_core::lazy=info,ckpt::commands=info")], &sb.path("restart.out"));
    assert_passes(&mut restarted, "a lazy restart");
    assert_eq!(gpu_state(&device), "running", "the lazy restart did not give the program its GPU back\n{}", restarted.report());
    let log = restarted.errors();
    let given_back = log.find("CUDA processes given their GPU state back").unwrap_or_else(|| panic!("the restart did not give the GPU back\n{log}"));
    if jobs_as_root() {
        let filled = log.find("lazy restart: the fill ended").unwrap_or_else(|| panic!("the restart was not lazy\n{log}"));
        assert!(filled < given_back, "the driver restored the GPU before the memory was all in\n{log}");
    } else {
        assert!(log.contains("not lazy"), "an ordinary user's restart should say it is not lazy\n{log}");
    }
}

/// A checkpoint that fails after the driver's part (here at the freeze: another process of the
/// job has its main thread gone while another thread runs on, which is refused) gives the GPU back: the program runs on
/// unlocked, with its device memory as it was, and finishes right. With `--kill` too: the job is
/// held frozen for that one, and released when it fails.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_checkpoint_that_fails_after_the_driver_gives_the_gpu_back() {
    use_stand_in_driver();
    let sb = Sandbox::new("fakegpu-failed");
    let work = sb.mkdir("run");
    let device = device_for(&work);
    // Long enough for two refusals, each waiting 2 s for the process to end or exec.
    let script = r#"echo START; "$0" "$1" 8 & "$2" 8 > "$3/mainexit.out"; wait"#;
    let argv = [os("/bin/sh"), os("-c"), os(script), os(prog("fakegpu")), os(&device), os(prog("mainexit")), os(&work)];
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    for extra in [&[][..], &["--kill"][..]] {
        let refused = try_checkpoint(&sb.dir, extra).expect_err("a checkpoint of a process without its main thread succeeded");
        assert!(refused.all().contains("whose main thread has exited"), "{refused}");
        assert_eq!(gpu_state(&device), "running", "the failed checkpoint ({extra:?}) left the program's GPU locked\n{}", job.report());
    }
    assert_passes(&mut job, "the failed checkpoints");
}

/// A CUDA process with a child that uses no GPU, as PyTorch's DataLoader workers are: the child
/// holds the device's descriptor and a mapping of it it inherited, and the driver does not count
/// it as a CUDA process; it is left to run through the checkpoint, its descriptor opened again
/// at restart and its mapping brought back inaccessible.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_program_on_a_stand_in_gpu_with_a_child_that_inherited_the_device() {
    use_stand_in_driver();
    let case = Case::new("fakegpu-worker", |work| vec![os(prog("fakegpu")), os(device_for(work)), os("5"), os("--worker")]).check_image(|dir| {
        // The worker kept a mapping of the device (fork copies some of the driver's). The first
        // generation has it as such; after a restart it is inaccessible memory like any other.
        let i = ckpt(&[os("inspect"), os("--generation"), os("1"), os(dir)]);
        assert!(
            i.stdout.contains("mappings of an NVIDIA device inherited from one come back inaccessible"),
            "the worker's inherited mapping is not in the image\n{i}"
        );
    });
    canonical_scenario(&case);
}
