//! `ckpt bench`: the benchmark of checkpoint writers (docs/PERFORMANCE.md).

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Where to write checkpoint images while benchmarking.
    #[arg(long, default_value = "/tmp/ckpt-bench")]
    pub work_dir: std::path::PathBuf,
}

pub fn run(_args: &BenchArgs) -> Result<i32> {
    bail!("the benchmark is not written yet")
}
