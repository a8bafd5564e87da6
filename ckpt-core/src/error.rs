//! The errors ckpt-core reports. Each says what happened, where, and when it helps, what to do.

use crate::image::ImageError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    // Transparent: the text is the io::Error's, and nothing is its source, so that a chain of
    // causes printed whole (`{:#}`) does not say it twice.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    /// Something in the job that this version cannot checkpoint.
    #[error("pid {pid}: {what} cannot be checkpointed yet")]
    Unsupported { pid: i32, what: String },
    /// A file the image refers to is not the file the job had.
    #[error("{path}: {problem} (the job had it open or mapped at the checkpoint); put it back, or restart with --keep-files to take the files as they are, or launch the job with --protect DIR (or --save-files, for the files it writes) to have its files put back at restart")]
    FileChanged { path: String, problem: String },
    /// An entry of a directory the job was writing to, which the job did not hold, changed in a
    /// way a restarted job would not simply redo (see `objects::files_state::entry_refuses`).
    #[error("{path}: {problem}; put it back, or restart with --keep-files to take the files as they are, or launch the job with --protect DIR (its directory) to have it put back at restart")]
    EntryChanged { path: String, problem: String },
    /// A file a process maps can no longer be reached by the path the kernel shows for it, so the
    /// checkpoint cannot tell which file to record.
    #[error(
        "pid {pid}: the file mapped at {addr:#x}, {path}: {problem}; put the file back at that path (or end the program's use of it) and checkpoint again"
    )]
    MappedFileMoved { pid: i32, addr: u64, path: String, problem: String },
    /// Memory the job had locked in RAM (mlock, mlockall) that the restart cannot lock again.
    #[error("pid {pid}: {what} cannot be locked in memory again: {problem}")]
    MemoryLock { pid: i32, what: String, problem: String },
    /// The restarted job's time namespace could not be made or given its clocks' offsets.
    #[error("{what}: {error}; restart with --clocks-jump to run the job without a time namespace (its monotonic and boot-time clocks then jump by the time it was down)")]
    TimeNamespace { what: &'static str, error: std::io::Error },
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
    /// The NVIDIA driver refused one step of a CUDA process's checkpoint or restore
    /// (`crate::gpu`); `problem` is the driver's error.
    #[error("pid {pid}: the NVIDIA driver could not {step}: {problem}")]
    Gpu { pid: i32, step: &'static str, problem: String },
    /// The job has CUDA processes and the NVIDIA driver's checkpoint API is not at hand.
    #[error("pid {pids} use the GPU, and {problem}")]
    NoGpuDriver { pids: String, problem: String },
    /// The image contradicts itself or what the restart made of it so far: validation lets
    /// through only what a damaged or forged image can still get wrong.
    #[error("{what} (image damaged or forged?)")]
    Forged { what: String },
    /// The image lacks something one of its records names.
    #[error("{what} (image damaged?)")]
    Damaged { what: String },
    /// A state ckpt's own code should have made impossible.
    #[error("{0} (bug)")]
    Bug(String),
    /// A failure about one object of a process: a descriptor, a namespace, a mapping.
    ///
    /// The wrapping variants (`Object`, `Capture`, `Restore`) keep the inner error whole, but
    /// not as their `source()`: their text says it already, and anyhow's `{:#}`, with which
    /// `ckpt` prints its errors, would say it again after it.
    #[error("pid {pid}: {object}: {inner}")]
    Object { pid: i32, object: String, inner: Box<Error> },
    /// A failure restoring descriptor `fd` of the process being restored (which the restart's
    /// "restore pid P" stage names), `what` its object ([`crate::objects::descriptor::DescriptorKind::describe`]).
    #[error("fd {fd} ({what}): {inner}")]
    Descriptor { fd: i32, what: String, inner: Box<Error> },
    /// A failure while capturing process `pid`.
    #[error("capture pid {pid}: {inner}")]
    Capture { pid: i32, inner: Box<Error> },
    /// A failure of the restart, with the stage it happened in.
    #[error("{stage}: {inner}")]
    Restore { stage: Stage, inner: Box<Error> },
    /// A cgroup the job made could not be made again, given its settings, or given its
    /// process at restart (`objects::cgroups`); `error` keeps the system's error.
    #[error("the job's cgroup {path}: {step}: {error}{}", cgroup_hint(error))]
    Cgroup { path: String, step: String, error: std::io::Error },
    #[error("{0}")]
    Other(String),
}

/// What to do when a cgroup may not be made or written.
fn cgroup_hint(error: &std::io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => " (making cgroups below the restart's own needs root, or a subtree delegated to the user)",
        _ => "",
    }
}

/// Where in a restart an [`Error::Restore`] happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The work for the job as a whole (connections across nodes, messages carrying
    /// descriptors, TCP connections' last steps).
    Job,
    /// The rebuilding of one process, by its pid in the job.
    Process(i32),
    /// A process's namespace of one kind, as it is made or joined.
    Namespace { pid: i32, kind: &'static str },
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Job => write!(f, "restore"),
            Stage::Process(pid) => write!(f, "restore pid {pid}"),
            Stage::Namespace { pid, kind } => write!(f, "pid {pid}: its {kind} namespace"),
        }
    }
}

impl Error {
    /// The checkpoint met a state that passes by itself: trying again soon may succeed.
    pub fn is_passing(&self) -> bool {
        matches!(self, Error::Passing { .. })
    }

    /// Whether the callers on the way up put where they were before this error's text
    /// (`capture pid P: `, `restore pid P: `): true of the errors that read as a step of a
    /// larger task, false of those that are a whole message of their own (a refusal that says
    /// what to do, an image's or a file system's error), which reach the user as they are.
    pub fn takes_place(&self) -> bool {
        matches!(
            self,
            Error::Forged { .. }
                | Error::Damaged { .. }
                | Error::Bug(_)
                | Error::Object { .. }
                | Error::Descriptor { .. }
                | Error::Capture { .. }
                | Error::Restore { .. }
                | Error::Other(_)
        )
    }

    /// `self` as the step of process `pid`'s object `object` (a descriptor, a namespace): see
    /// [`Error::Object`].
    pub fn of_object(self, pid: i32, object: impl Into<String>) -> Error {
        Error::Object { pid, object: object.into(), inner: Box::new(self) }
    }

    /// A pid the records name that the restart did not make: validation makes this unreachable
    /// for the processes themselves, but a descriptor's record may still name one.
    pub fn not_created(pid: i32) -> Error {
        Error::Forged { what: format!("pid {pid} is not a process of the image") }
    }

    /// `self` as the step of restoring descriptor `fd` on `what`: see [`Error::Descriptor`].
    pub fn of_descriptor(self, fd: i32, what: impl Into<String>) -> Error {
        Error::Descriptor { fd, what: what.into(), inner: Box::new(self) }
    }

    /// `self` placed in stage `stage` of the restart when it [takes a place](Error::takes_place);
    /// as it is otherwise.
    pub fn in_stage(self, stage: Stage) -> Error {
        if self.takes_place() {
            Error::Restore { stage, inner: Box::new(self) }
        } else {
            self
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn io(text: &str) -> Error {
        Error::Io(std::io::Error::other(text.to_string()))
    }

    /// What `ckpt` prints for an error (anyhow's `{:#}`): its text, then each of its causes.
    fn printed_whole(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text += &format!(": {c}");
            cause = c.source();
        }
        text
    }

    /// An error whose text says its cause does not give it as its source too: printed whole, the
    /// cause would be said twice ("cannot list: Permission denied: Permission denied").
    #[test]
    fn printed_whole_each_cause_is_said_once() {
        let denied = || std::io::Error::from_raw_os_error(libc::EACCES);
        let errors: Vec<Box<dyn std::error::Error>> = vec![
            Box::new(Error::Io(denied())),
            Box::new(Error::TimeNamespace { what: "make the job's time namespace", error: denied() }),
            Box::new(Error::from(ImageError::io("/ckpt", "list", denied()))),
            Box::new(ImageError::io("/ckpt", "list", denied())),
        ];
        for e in errors {
            let text = printed_whole(e.as_ref());
            assert_eq!(text.matches("Permission denied").count(), 1, "{text}");
        }
    }

    #[test]
    fn the_typed_variants_read_as_the_messages_they_replace() {
        let forged = Error::Forged { what: "pid 7 appears twice in the image".into() };
        assert_eq!(forged.to_string(), "pid 7 appears twice in the image (image damaged or forged?)");
        let damaged = Error::Damaged { what: "the image lacks the state of queue /q".into() };
        assert_eq!(damaged.to_string(), "the image lacks the state of queue /q (image damaged?)");
        assert_eq!(Error::Bug("socket:[9]: no record".into()).to_string(), "socket:[9]: no record (bug)");
        let object = io("Bad file descriptor").of_object(12, "fd 3 (a pseudo-terminal)");
        assert_eq!(object.to_string(), "pid 12: fd 3 (a pseudo-terminal): Bad file descriptor");
        let captured = Error::Capture { pid: 12, inner: Box::new(object) };
        assert_eq!(captured.to_string(), "capture pid 12: pid 12: fd 3 (a pseudo-terminal): Bad file descriptor");
        assert_eq!(io("gone").in_stage(Stage::Job).to_string(), "gone", "an io::Error is not placed in a stage");
        assert_eq!(Error::Other("x".into()).in_stage(Stage::Job).to_string(), "restore: x");
        assert_eq!(forged.in_stage(Stage::Process(5)).to_string(), "restore pid 5: pid 7 appears twice in the image (image damaged or forged?)");
        let ns = Error::Restore { stage: Stage::Namespace { pid: 5, kind: "UTS" }, inner: Box::new(io("denied")) };
        assert_eq!(ns.to_string(), "pid 5: its UTS namespace: denied");
        let descriptor = io("No such file or directory").of_descriptor(4, "/tmp/f").in_stage(Stage::Process(5));
        assert_eq!(descriptor.to_string(), "restore pid 5: fd 4 (/tmp/f): No such file or directory");
    }

    #[test]
    fn a_wrapped_error_is_said_once() {
        let restore = io("boom").of_object(3, "fd 4").in_stage(Stage::Process(3));
        assert!(std::error::Error::source(&restore).is_none(), "a chain printer would repeat the inner error");
        let Error::Restore { inner, .. } = &restore else { panic!("{restore:?}") };
        assert!(matches!(&**inner, Error::Object { pid: 3, .. }));
    }

    #[test]
    fn only_the_steps_of_a_larger_task_take_a_place() {
        let unsupported = Error::Unsupported { pid: 1, what: "x".into() };
        assert!(!unsupported.takes_place());
        assert_eq!(unsupported.in_stage(Stage::Job).to_string(), "pid 1: x cannot be checkpointed yet");
        let passing = Error::Passing { pid: 1, what: "y".into() };
        assert!(passing.is_passing() && !passing.takes_place());
        assert!(!Error::Bug("z".into()).is_passing());
        assert!(Error::Damaged { what: "w".into() }.takes_place());
    }
}
