//! One module per kernel object kind. Each holds its image record, how it is read from a stopped
//! process (`capture`) and how it is recreated (`restore`). Orchestration (who is frozen when, in
//! what order things are restored) lives in [`crate::capture`] and in the restart tool.

pub mod deleted;
pub mod epoll;
pub mod eventfd;
pub mod fd;
pub mod fifo;
pub mod inotify;
pub mod locks;
pub mod file;
pub mod memfd;
pub mod memory;
pub mod pipe;
pub mod process;
pub mod signalfd;
pub mod signals;
pub mod thread;
pub mod timerfd;
pub mod unix;
pub mod vdso;

pub use process::ProcessRecord;
