//! The errors ckpt-core reports. Each says what happened, where, and when it helps, what to do.

use crate::image::ImageError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Something in the job that this version cannot checkpoint.
    #[error("pid {pid}: {what} cannot be checkpointed yet")]
    Unsupported { pid: i32, what: String },
    /// A file the image refers to is not the file the job had.
    #[error("{path}: {problem} (the job had it open or mapped at the checkpoint); put it back, or restart with --keep-files to take the files as they are, or launch the job with --protect DIR (or --save-files, for the files it writes) to have its files put back at restart")]
    FileChanged { path: String, problem: String },
    /// A file a process maps can no longer be reached by the path the kernel shows for it, so the
    /// checkpoint cannot tell which file to record.
    #[error("pid {pid}: the file mapped at {addr:#x}, {path}: {problem}; put the file back at that path (or end the program's use of it) and checkpoint again")]
    MappedFileMoved { pid: i32, addr: u64, path: String, problem: String },
    /// Memory the job had locked in RAM (mlock, mlockall) that the restart cannot lock again.
    #[error("pid {pid}: {what} cannot be locked in memory again: {problem}")]
    MemoryLock { pid: i32, what: String, problem: String },
    /// The restarted job's time namespace could not be made or given its clocks' offsets.
    #[error("{what}: {source}; restart with --clocks-jump to run the job without a time namespace (its monotonic and boot-time clocks then jump by the time it was down)")]
    TimeNamespace { what: &'static str, source: std::io::Error },
    /// The job had no process left when the checkpoint froze it: a generation of nothing
    /// could not be restarted.
    #[error("the job had no process left to checkpoint (it ended as the checkpoint began: did the same signal reach its processes?); no generation was made")]
    NothingToCheckpoint,
    /// Memory copied after the job was released (`--copy-memory later`) could not be read.
    #[error("pid {pid}: copying its memory after the job was released: {problem}; the job runs on and this checkpoint is not kept (--copy-memory frozen copies memory while the job is frozen)")]
    LaterCopy { pid: i32, problem: String },
    /// The kernel cannot tell which pages a process writes (`objects::dirty`): the caller
    /// stores the process's memory whole.
    #[error("pid {pid}: no dirty-page tracking: {why}")]
    NoDirtyTracking { pid: i32, why: String },
    /// A state the program leaves by itself in a moment (a netlink reply it has not read yet, a
    /// mapping's flags changing as it was frozen): the coordinator releases the job and tries
    /// the checkpoint again ([`Error::is_passing`]).
    #[error("pid {pid}: {what}; the program was caught in the middle of it")]
    Passing { pid: i32, what: String },
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The checkpoint met a state that passes by itself: trying again soon may succeed.
    pub fn is_passing(&self) -> bool {
        matches!(self, Error::Passing { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds "what we were doing" to an io::Error.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", what()))))
    }
}
