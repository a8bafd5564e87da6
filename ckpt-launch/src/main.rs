//! `ckpt`: transparent checkpoint/restart of Linux processes. See docs/USER-GUIDE.md.

/// `eprintln!` in one write. ckpt's standard error is shared with the job's and the batch
/// system's, and `eprintln!` writes each piece of its format on its own: Slurm's "JOB 56
/// CANCELLED ... DUE TO JOB REQUEUE" landed in the middle of "Slurm job 56 requeued" (and a
/// test looking for that line failed). A line of up to PIPE_BUF bytes is not split by a pipe.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($arg)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

mod agent;
mod commands;
mod coord;
mod init;
mod mpi;
mod owner;
mod slurm;
mod spawn;
mod transfer;
mod triggers;

use std::path::PathBuf;

use ckpt_core::units::parse_size;
use clap::{Args, Parser, Subcommand};

/// `ckpt --version`: the version, and whether this is the tests' build (with the CKPT_TEST_*
/// hooks, ckpt_core::testhooks), which the end-to-end tests require and users never get.
const VERSION: &str = if ckpt_core::testhooks::BUILT_IN { concat!(env!("CARGO_PKG_VERSION"), " (test hooks)") } else { env!("CARGO_PKG_VERSION") };

#[derive(Parser)]
#[command(name = "ckpt", version = VERSION, about = "Checkpoint and restart Linux processes, transparently")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The options of a restart that `ckpt run` shares with `ckpt restart`.
#[derive(Args, Clone, Debug)]
pub struct RestartFlags {
    /// Take the job's files as they are, even if they changed after the checkpoint (by
    /// default a restart refuses changed files, naming them, and cuts output files that only
    /// grew back to their size at the checkpoint). Protected directories are put back anyway.
    #[arg(long)]
    keep_files: bool,
    /// Let the job's monotonic and boot-time clocks (CLOCK_MONOTONIC, CLOCK_BOOTTIME) jump by
    /// the time it was down, as the machine's do. By default the job runs in a time namespace
    /// where they continue from where they were at the checkpoint.
    #[arg(long)]
    clocks_jump: bool,
    /// Let the job run again as soon as its processes are rebuilt, before its memory is back:
    /// each page comes from the image when the job first touches it, and the rest in the
    /// background. Needs root (CAP_SYS_PTRACE) or vm.unprivileged_userfaultfd = 1; otherwise
    /// the restart is eager, saying so. A damaged chunk found once the job runs ends the job.
    #[arg(long)]
    lazy: bool,
    /// Restart on a CPU that lacks these extensions the checkpoint's CPU had (names as the
    /// refusal gives them, comma-separated: `AVX2,FMA`). Libraries chose their code by them
    /// when the program started: code that uses one stops the program with SIGILL.
    #[arg(long, value_delimiter = ',', value_name = "EXTENSIONS")]
    ignore_cpu: Vec<String>,
}

/// Options of the node's buffer pool and writer.
#[derive(Args, Clone, Debug)]
pub struct PoolArgs {
    /// Size of the node buffer pool (e.g. 1G, 256M).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub pool: u64,
    /// Size of one chunk of the pool (and of chunk files).
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    pub chunk: u64,
    /// IO threads that write full chunks.
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Compression of chunk files: none, zstd or zstd:LEVEL (every chunk that shrinks), or
    /// auto or auto:LEVEL (zstd, level 1 by default, on a chunk only where compressing it and
    /// writing what is left is faster than writing it raw, as each IO thread measures its
    /// disk: faster than none when the memory compresses and the disk is slow, never much
    /// slower).
    #[arg(long, default_value = "none", value_name = "CODEC")]
    pub compress: ckpt_core::image::Codec,
    /// How memory reaches the disk: dbi (shared pool drained by IO threads while the job runs),
    /// wag (write aggregation, see --threshold) or direct (one file per process, written while
    /// the job is frozen).
    #[arg(long, value_enum, default_value_t = Writer::Dbi)]
    pub writer: Writer,
    /// When the job's private memory is copied at a checkpoint: `ahead` (the default) copies
    /// it while the job runs, tracking its writes, and at the freeze only what was written
    /// since; `later` forks a copy of each process while the job is frozen and reads the memory
    /// from it once the job runs again; `frozen` copies all of it while the job is frozen. With
    /// `ahead` and `later` the job is frozen for a moment whatever its size (`ahead`: shorter,
    /// and for the first checkpoint too, at the cost of a checkpoint that starts its freeze
    /// later and stores pages written during the copy twice). Given to `launch`, it holds for
    /// the job's restarts too.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub copy_memory: Option<CopyMemory>,
    /// Write size of the wag writer.
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    pub threshold: u64,
    /// Committed generations to keep (older ones are deleted after a newer one is committed;
    /// those a kept incremental generation refers to stay too).
    #[arg(long, default_value_t = 2)]
    pub keep: usize,
    /// A whole generation at least every N checkpoints; those between store only the pages
    /// written since the one before (incremental generations; 1: every one whole). Given to
    /// `launch`, it holds for the job's restarts too.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub full_every: Option<u64>,
    /// Protect each file the job has open for writing at a checkpoint as --protect protects a
    /// directory: it comes back at restart as it was (a file changed in place too). Given to
    /// `launch`, it holds for the job's restarts too.
    #[arg(long)]
    pub save_files: bool,
    /// Keep DIR consistent with the job's memory: every checkpoint records DIR's state (copying
    /// only what changed since the previous one), and a restart puts DIR back to it (files
    /// changed, created or removed since). Repeatable; given to `launch`, it holds for the job's
    /// restarts too.
    #[arg(long, value_name = "DIR")]
    pub protect: Vec<PathBuf>,
    /// When the job ends: `main` (the default) when the launched program ends, and with it what
    /// is left in its session (a daemon, in a session of its own, runs on); `all` when the last
    /// of its processes ends, whatever its session (a program that starts workers and exits).
    /// Given to `launch`, it holds for the job's restarts too.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub until: Option<Until>,
}

/// See [`PoolArgs::until`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    #[default]
    Main,
    All,
}

impl Until {
    /// The job init's argument that says it.
    pub fn init_arg(self) -> String {
        match self {
            Until::Main => "--until=main".to_string(),
            Until::All => "--until=all".to_string(),
        }
    }
}

/// See [`PoolArgs::writer`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    Dbi,
    Wag,
    Direct,
}

/// See [`PoolArgs::copy_memory`].
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyMemory {
    #[default]
    Ahead,
    Later,
    Frozen,
}

/// How the job's network connections are treated.
#[derive(Args, Clone, Debug, Default)]
pub struct NetArgs {
    /// Restore TCP connections to peers outside the job with TCP repair mode (root only), so that
    /// the peer does not notice; without it they come back reset. Given to `launch`, it holds for
    /// the job's restarts too; `checkpoint --kill` then closes such connections silently.
    #[arg(long)]
    pub tcp_established: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run PROG under checkpoint control, in the foreground.
    Launch {
        /// Checkpoint directory.
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        #[command(flatten)]
        pool: PoolArgs,
        #[command(flatten)]
        triggers: triggers::TriggerArgs,
        #[command(flatten)]
        net: NetArgs,
        #[command(flatten)]
        join: coord::JoinArgs,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Restart the job of DIR from its newest committed generation when it has one, else launch
    /// PROG: one command for a batch script that may run again after a failure or a requeue
    /// (`exec ckpt run --dir D -- PROG ARGS`).
    Run {
        /// Checkpoint directory.
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        /// What applies when it restarts.
        #[command(flatten)]
        restart: RestartFlags,
        #[command(flatten)]
        pool: PoolArgs,
        #[command(flatten)]
        triggers: triggers::TriggerArgs,
        #[command(flatten)]
        net: NetArgs,
        #[command(flatten)]
        join: coord::JoinArgs,
        /// The program and its arguments, for the first launch (a restart brings back the job
        /// the directory holds).
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Checkpoint the running job of a directory; returns when the generation is committed.
    Checkpoint {
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        /// End the job once the generation is committed.
        #[arg(long)]
        kill: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Return as soon as the job runs again, before its data is durable (`ckpt status`
        /// shows when the generation is committed).
        #[arg(long)]
        no_wait_durable: bool,
        /// Ask a standalone coordinator over TCP (the secret from --dir or --secret-file).
        #[arg(long, value_name = "ADDR")]
        coord: Option<String>,
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// Bring the job back from its newest committed generation, in the foreground.
    Restart {
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        /// Restart this generation instead of the newest.
        #[arg(long)]
        generation: Option<u64>,
        #[command(flatten)]
        restart: RestartFlags,
        /// Root only, for an image you trust entirely: keep root's rights. By default root
        /// restarts an image directory another user owns as that user, and opens, creates and
        /// removes every process's files with that process's own file rights
        /// (docs/TRUST.md).
        #[arg(long)]
        as_root: bool,
        #[command(flatten)]
        pool: PoolArgs,
        #[command(flatten)]
        triggers: triggers::TriggerArgs,
        #[command(flatten)]
        net: NetArgs,
        /// Restart this node's part (--node) of a generation, joined to the standalone
        /// coordinator at ADDR, which says which generation.
        #[command(flatten)]
        join: coord::JoinArgs,
    },
    /// The checkpoint interval that wastes least for a checkpoint cost and a mean time between
    /// failures (Young/Daly), and what it costs.
    Plan {
        /// What one checkpoint costs the application (e.g. 40s, or the frozen time of `ckpt checkpoint`).
        #[arg(long)]
        cost: String,
        /// Mean time between failures (e.g. 6h).
        #[arg(long)]
        mtbf: String,
    },
    /// Show what a generation holds.
    Inspect {
        dir: PathBuf,
        #[arg(long)]
        generation: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Check every checksum of a generation (the newest, or all with --all).
    Verify {
        dir: PathBuf,
        #[arg(long)]
        generation: Option<u64>,
        #[arg(long)]
        all: bool,
    },
    /// The running job of a directory and its generations.
    Status {
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// Ask a standalone coordinator over TCP (the secret from --dir or --secret-file).
        #[arg(long, value_name = "ADDR")]
        coord: Option<String>,
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// A standalone coordinator, for jobs whose agents run on several nodes (`ckpt launch
    /// --coord ADDR`); it exits when every agent that joined has left.
    Coordinator {
        /// The TCP address to listen on: 0.0.0.0:7070, 127.0.0.1:0 (any free port; the address
        /// is written to DIR/coordinator.addr).
        #[arg(long)]
        listen: String,
        /// The checkpoint directory, shared by every node.
        #[arg(long, default_value = "ckpt.d")]
        dir: PathBuf,
        /// How to run a shell command line on another host, for `ckpt agent-rsh`: `ssh {host}`,
        /// `ip netns exec {host} sh -c` (the command line comes as one last argument).
        #[arg(long, value_name = "TEMPLATE")]
        rsh: Option<String>,
        /// Committed generations to keep (and those the kept ones refer to).
        #[arg(long, default_value_t = 2)]
        keep: usize,
        /// A whole generation at least every N checkpoints; those between store only the pages
        /// written since the one before (1: every one whole). Incremental generations are not
        /// made with --local-dir yet.
        #[arg(long, value_name = "N", default_value_t = ckpt_coord::coordinator::DEFAULT_FULL_EVERY, value_parser = clap::value_parser!(u64).range(1..))]
        full_every: u64,
        /// The generation restarting agents restore (default: the newest committed).
        #[arg(long)]
        generation: Option<u64>,
        /// Checkpoint every node every DURATION.
        #[arg(long)]
        interval: Option<String>,
        /// Node-local level: every node keeps its part of each generation in PATH on its own
        /// host (`{node}` is replaced by the node's name), the checkpoint directory only the
        /// manifests and each node's small records. PATH must be absolute.
        #[arg(long, value_name = "PATH")]
        local_dir: Option<String>,
        /// `partner`: each node's part is also kept, durable, on the next node's local
        /// storage (needs --local-dir), so that the loss of one node loses no part.
        #[arg(long, value_name = "SCHEME")]
        redundancy: Option<String>,
        /// Global level: every Nth committed generation is also copied, by each node in the
        /// background, into the checkpoint directory (needs --local-dir); a restart or a
        /// recovery that finds a part nowhere else takes it from there.
        #[arg(long, value_name = "N", default_value_t = 0)]
        flush_every: u64,
        /// How fast each node copies its part to the global level, in bytes per second (64M,
        /// 1G); a copy pauses while a checkpoint runs.
        #[arg(long, value_name = "RATE", default_value = "100M", value_parser = parse_size)]
        flush_rate: u64,
        /// Once the job has more than N agents, every group of N (in the order they join)
        /// talks to the coordinator through a relay, one of them (commands, replies and
        /// heartbeats; each agent keeps its own connection for the rest): the coordinator
        /// exchanges a message a phase with each relay instead of each agent. 0: no relays.
        #[arg(long, value_name = "N", default_value_t = 64)]
        relay_every: usize,
        #[command(flatten)]
        recover: coord::NodeLossArgs,
    },
    /// Open MPI's remote launcher (OMPI_MCA_plm_rsh_agent="ckpt agent-rsh"): asks the job's
    /// coordinator to start `ckpt launch --coord` running COMMAND on HOST.
    #[command(name = "agent-rsh")]
    AgentRsh {
        /// [ssh options] HOST COMMAND...
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// Internal: the job's init (pid 1 of its namespace).
    #[command(name = "__init", hide = true)]
    Init {
        #[arg(long)]
        control_fd: i32,
        /// The checkpoint directory, given to the program as CKPT_DIR (for libckpt).
        #[arg(long)]
        job_dir: Option<PathBuf>,
        /// When the job ends (see [`PoolArgs::until`]).
        #[arg(long, value_enum, default_value = "main")]
        until: Until,
        /// The job's own directory under /dev/shm (`mpi::JobDir`), made by the launcher.
        #[arg(long)]
        shm_dir: Option<String>,
        /// "launch" followed by the program, or "restart".
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
}

fn main() {
    // Before anything else: the namespace helper must stay single-threaded to enter the job's
    // user namespaces (see ckpt_core::nshelper).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(ckpt_core::nshelper::COMMAND) {
        if let Err(e) = ckpt_core::nshelper::helper_main() {
            say!("{e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let cli = Cli::parse();
    if matches!(cli.command, Command::Inspect { .. } | Command::Verify { .. } | Command::Status { .. }) {
        // Commands that only print: `ckpt inspect D | head` ends quietly when head has read
        // enough, as other tools do, instead of panicking on the write to a closed pipe (Rust
        // ignores SIGPIPE). Not for the commands that talk over sockets or run a job, where a
        // peer gone is an error to handle.
        ckpt_core::sys::process::default_action(libc::SIGPIPE);
    }
    if !matches!(cli.command, Command::Init { .. }) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("CKPT_LOG").unwrap_or_else(|_| "warn".into()))
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match cli.command {
        Command::Init { control_fd, job_dir, until, shm_dir, rest } => {
            if let Some(d) = job_dir {
                // Single-threaded here, before the program starts: the only safe time to set it.
                std::env::set_var("CKPT_DIR", d);
            }
            let mode = match rest.split_first() {
                Some((m, prog)) if m == "launch" => {
                    mpi::set_job_environment(shm_dir.as_deref());
                    init::Mode::Launch(prog.to_vec())
                }
                _ => init::Mode::Restart,
            };
            init::run(control_fd, mode, until)
        }
        Command::Launch { dir, pool, triggers, net, join, command } => owner::settle(&dir, false).and_then(|dir| {
            commands::launch(&dir, &pool, &triggers, &net, &join, command)
                .and_then(|ended| commands::until_finished(ended, &dir, false, &pool, &triggers, &net, &join))
        }),
        Command::Run { dir, restart: RestartFlags { keep_files, clocks_jump, lazy, ignore_cpu }, pool, triggers, net, join, command } => {
            let choices = commands::RestartChoices { keep_files, clocks_jump, lazy, ignore_cpu, ..Default::default() };
            owner::settle(&dir, false).and_then(|dir| commands::run(&dir, &choices, &pool, &triggers, &net, &join, command))
        }
        Command::Checkpoint { dir, kill, json, no_wait_durable, coord, secret_file } => owner::settle_existing(&dir)
            .and_then(|dir| commands::checkpoint(&dir, &coord::JoinArgs { coord, node: None, secret_file }, kill, json, no_wait_durable)),
        Command::Restart { dir, generation, restart: RestartFlags { keep_files, clocks_jump, lazy, ignore_cpu }, as_root, pool, triggers, net, join } => {
            let choices = commands::RestartChoices { generation, keep_files, as_root, clocks_jump, lazy, ignore_cpu };
            owner::settle(&dir, as_root).and_then(|dir| {
                commands::restart(&dir, &choices, &pool, &triggers, &net, &join)
                    .and_then(|ended| commands::until_finished(ended, &dir, clocks_jump, &pool, &triggers, &net, &join))
            })
        }
        Command::Coordinator {
            listen,
            dir,
            rsh,
            keep,
            full_every,
            generation,
            interval,
            local_dir,
            redundancy,
            flush_every,
            flush_rate,
            relay_every,
            recover,
        } => owner::settle(&dir, false).and_then(|dir| {
            coord::run_coordinator(
                &listen,
                &dir,
                rsh,
                (keep, full_every),
                generation,
                interval,
                local_dir,
                redundancy,
                (flush_every, flush_rate),
                relay_every,
                &recover,
            )
        }),
        Command::AgentRsh { args } => coord::agent_rsh(&args),
        Command::Plan { cost, mtbf } => triggers::print_plan(&cost, &mtbf),
        Command::Inspect { dir, generation, json } => owner::settle_existing(&dir).and_then(|dir| commands::inspect(&dir, generation, json)),
        Command::Verify { dir, generation, all } => owner::settle_existing(&dir).and_then(|dir| commands::verify(&dir, generation, all)),
        Command::Status { dir, json, coord, secret_file } => {
            owner::settle_existing(&dir).and_then(|dir| commands::status(&dir, &coord::JoinArgs { coord, node: None, secret_file }, json))
        }
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            say!("ckpt: {e:#}");
            std::process::exit(1);
        }
    }
}
