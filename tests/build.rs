//! `CKPT_SKIP_E2E=1` at build time marks every end-to-end test ignored (they are reported as
//! ignored, never as passed without having run): each test carries
//! `#[cfg_attr(ckpt_skip_e2e, ignore = ...)]`. `cfg(ckpt_gpu)`: this machine has an NVIDIA GPU
//! (or `CKPT_GPU_TESTS=1`: the GPU tests built here, for scripts/gpu-check.sh to run there).
//! `cfg(ckpt_no_droppable)`: the kernel has no MAP_DROPPABLE (before 6.11); `cfg(ckpt_no_mdwe)`:
//! no prctl(PR_SET_MDWE) (before 6.3); `cfg(ckpt_no_guard_regions)`: pagemap does not show guard
//! regions (before 6.14); `cfg(ckpt_no_guard_scan)`: PAGEMAP_SCAN does not name them (before
//! 6.16), so the checkpoint refuses them.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(ckpt_skip_e2e)");
    // A machine with NVIDIA's driver: the tests that need a real GPU run, and those that need its
    // absence are ignored (tests/tests/gpu.rs).
    println!("cargo::rustc-check-cfg=cfg(ckpt_gpu)");
    // Not `rerun-if-changed=/dev/nvidiactl`: a path that does not exist makes cargo rebuild every
    // test binary at every run. A machine gains a GPU rarely; `cargo clean -p tests` then.
    println!("cargo::rerun-if-env-changed=CKPT_GPU_TESTS");
    let asked = std::env::var_os("CKPT_GPU_TESTS").is_some_and(|v| v == "1");
    if asked || std::path::Path::new("/dev/nvidiactl").exists() {
        println!("cargo::rustc-cfg=ckpt_gpu");
    }
    // A kernel before 6.11 has no MAP_DROPPABLE: its test is ignored there.
    println!("cargo::rustc-check-cfg=cfg(ckpt_no_droppable)");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if version < (6, 11) {
        println!("cargo::rustc-cfg=ckpt_no_droppable");
    }
    // Before 6.3, no prctl(PR_SET_MDWE).
    println!("cargo::rustc-check-cfg=cfg(ckpt_no_mdwe)");
    if version < (6, 3) {
        println!("cargo::rustc-cfg=ckpt_no_mdwe");
    }
    // Before 6.14 the kernel does not show guard regions in pagemap (they came in 6.13).
    println!("cargo::rustc-check-cfg=cfg(ckpt_no_guard_regions)");
    if version < (6, 14) {
        println!("cargo::rustc-cfg=ckpt_no_guard_regions");
    }
    // Before 6.16 PAGEMAP_SCAN does not name guard pages (PAGE_IS_GUARD): not taken, refused.
    println!("cargo::rustc-check-cfg=cfg(ckpt_no_guard_scan)");
    if version < (6, 16) {
        println!("cargo::rustc-cfg=ckpt_no_guard_scan");
    }
    println!("cargo::rerun-if-env-changed=CKPT_SKIP_E2E");
    if std::env::var_os("CKPT_SKIP_E2E").is_some_and(|v| !v.is_empty() && v != "0") {
        println!("cargo::rustc-cfg=ckpt_skip_e2e");
    }
}
