//! ckpt-core: what a process is made of, and how each part is captured and restored.
//!
//! - [`image`]: the on-disk format (generations, manifest, chunk files, record files).
//! - [`pool`]: the node buffer pool (WAG-DBI) and its IO threads.
//! - [`ptrace`]: seize, interrupt, registers, and system calls injected into a stopped task.
//! - [`procfs`]: what /proc tells about a task.
//! - [`objects`]: one module per kernel object kind, each with its record, capture and restore.
//! - [`userns`]: the job's user namespace, when the launcher has no privilege.
//! - [`capture`]: freezing a process tree and capturing it (the orchestration of the objects).
//! - [`gpu`]: CUDA processes, whose GPU state the NVIDIA driver moves into their memory.

pub mod capture;
pub mod error;
pub mod fsid;
pub mod gpu;
pub mod image;
pub mod kernel;
pub mod lazy;
pub mod nshelper;
pub mod objects;
pub mod pool;
pub mod procfs;
pub mod ptrace;
pub mod snapshot;
pub mod sockdiag;
pub mod sys;
pub mod testhooks;
pub mod units;
pub mod userns;
pub mod validate;

pub use error::{Error, Result};

pub const PAGE_SIZE: u64 = 4096;
