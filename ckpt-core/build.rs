//! cfgs that let a unit test needing what this machine lacks be reported as ignored, with the
//! reason, rather than pass without having run. Read when ckpt-core is built (after a kernel
//! upgrade, `cargo clean -p ckpt-core`):
//! - `ckpt_no_pagemap_scan`: a kernel before 6.7 (no PAGEMAP_SCAN, no userfaultfd WP_ASYNC: no
//!   write tracking);
//! - `ckpt_no_procmap_query`: a kernel before 6.11 (no PROCMAP_QUERY);
//! - `ckpt_not_root`: built by another user than root, for the tests that need root's rights
//!   (scripts/test.sh builds and runs them as root).
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    for cfg in ["ckpt_no_pagemap_scan", "ckpt_no_procmap_query", "ckpt_not_root"] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if version < (6, 7) {
        println!("cargo::rustc-cfg=ckpt_no_pagemap_scan");
    }
    if version < (6, 11) {
        println!("cargo::rustc-cfg=ckpt_no_procmap_query");
    }
    // The effective uid, the second number of /proc/self/status's Uid line.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)).unwrap_or("");
    if euid != "0" {
        println!("cargo::rustc-cfg=ckpt_not_root");
    }
}
