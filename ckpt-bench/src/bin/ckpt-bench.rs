//! `ckpt-bench`: checkpoint and restart speed against the machine's limits; writes
//! docs/PERFORMANCE.md (see the library's comment). Run from the repository's root after `cargo
//! build --release`: `target/release/ckpt-bench [--quick] [--only ...]`.

use clap::Parser;

/// Measure checkpoint and restart speed against the machine's limits; writes docs/PERFORMANCE.md.
#[derive(Parser, Debug)]
#[command(name = "ckpt-bench", version)]
struct Cli {
    #[command(flatten)]
    args: ckpt_bench::BenchArgs,
}

fn main() {
    let cli = Cli::parse();
    match ckpt_bench::run(&cli.args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ckpt-bench: {e:#}");
            std::process::exit(1);
        }
    }
}
