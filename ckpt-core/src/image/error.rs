//! The one error type of the image format and the node buffer pool.
//!
//! Every variant names the file or directory it concerns, so that a user who sees
//! `chunk /ckpt/gen-000007/n0/chunks/p4242-0000000041943040: checksum mismatch in data (file damaged?)`
//! knows which file to look at, and most say what to do about it.

use std::io;
use std::path::{Path, PathBuf};

/// Shorthand used throughout [`crate::image`] and [`crate::pool`].
pub type Result<T, E = ImageError> = std::result::Result<T, E>;

/// What went wrong while writing, reading or verifying a checkpoint image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A system call on a file or directory failed.
    #[error("{path}: cannot {action}: {error}{}", io_hint(error))]
    Io {
        path: PathBuf,
        /// What we tried, as a verb phrase: "create", "read", "fsync", ...
        action: &'static str,
        /// Said in the message, so not the error's `source()`: a chain of causes printed whole
        /// (`{:#}`) would say it twice.
        error: io::Error,
    },

    /// A directory or secret that someone other than the user running ckpt could have made or
    /// could change (docs/TRUST.md, "Directories the user owns").
    #[error("{path}: {problem}: no other user may change a job's directories nor read its secret; {remedy}")]
    NotPrivate { path: PathBuf, problem: String, remedy: String },

    /// The file does not start with the magic of the kind of file we expected. `found` says
    /// what it looks like instead, never its bytes: a refusal must not show what a file holds to
    /// someone who could not read it.
    #[error("{path}: not a {expected} ({found}; wrong file, or damaged?)")]
    BadMagic { path: PathBuf, expected: &'static str, found: &'static str },

    /// The file was written by a ckpt that uses a newer format than this one reads.
    #[error(
        "{path}: written by a newer ckpt (format version {found}, this ckpt reads up to {supported}); \
         use that ckpt version or newer to read it"
    )]
    NewerFormat { path: PathBuf, found: u32, supported: u32 },

    /// The file was written by a ckpt that uses an older format than this one reads.
    #[error(
        "{path}: written by an older ckpt (format version {found}, this ckpt reads {oldest} to {supported}); \
         restart it with the ckpt that wrote it"
    )]
    OlderFormat { path: PathBuf, found: u32, oldest: u32, supported: u32 },

    /// The bytes on disk do not match their recorded checksum.
    #[error("{kind} {path}: checksum mismatch{detail} (file damaged?)")]
    Checksum {
        /// "chunk", "record file", "manifest", "file".
        kind: &'static str,
        path: PathBuf,
        /// Where in the file, with a leading space (" in header"), or empty.
        detail: String,
    },

    /// A length read from disk (or asked for) is larger than any sane value; refused before allocating.
    #[error("{path}: {what} of {len} bytes exceeds the limit of {max} bytes (file damaged?)")]
    TooLarge { path: PathBuf, what: &'static str, len: u64, max: u64 },

    /// The file ends before the data its header announces.
    #[error("{path}: truncated: {detail} (damaged, or left by an interrupted write?)")]
    Truncated { path: PathBuf, detail: String },

    /// The file is readable but its structure is wrong; `detail` says how and what to do.
    #[error("{path}: {detail}")]
    Malformed { path: PathBuf, detail: String },

    /// A payload (postcard, JSON, zstd) could not be decoded although its checksum held.
    #[error("{path}: cannot decode {what}: {detail} (written by an incompatible ckpt, or damaged?)")]
    Decode { path: PathBuf, what: &'static str, detail: String },

    /// A value could not be serialized or compressed.
    #[error("{path}: cannot encode {what}: {detail}")]
    Encode { path: PathBuf, what: &'static str, detail: String },

    /// A record decoded (its checksum held) but a field is out of bounds or disagrees with the
    /// rest of the image: the validation step after decoding refuses it before anything acts on
    /// it (see `crate::validate`). `place` says where in the image: a pid, a descriptor, an address.
    #[error(
        "{path}: {place}: {problem} (image damaged or forged: refused before restoring anything; \
         restart from another generation)"
    )]
    Invalid { path: PathBuf, place: String, problem: String },

    /// A process's stream has bytes that no chunk file holds.
    #[error(
        "{path}: missing: bytes {start}..{end} of process {pid}'s stream are in no chunk file \
         (chunk file deleted, or the checkpoint was incomplete?)"
    )]
    Gap {
        /// The chunk file that would hold the missing bytes.
        path: PathBuf,
        pid: u32,
        start: u64,
        end: u64,
    },

    /// Two chunk files of one process hold the same stream bytes.
    #[error(
        "{path}: overlaps {other}: bytes {start}..{end} of process {pid}'s stream are stored twice \
         (stray or duplicated chunk file?)"
    )]
    Overlap { path: PathBuf, other: PathBuf, pid: u32, start: u64, end: u64 },

    /// A read asked for bytes beyond the end of a process's stream.
    #[error(
        "{path}: bytes {start}..{end} of process {pid}'s stream were asked for, but it holds only {len} \
         (image incomplete, or records and chunks disagree?)"
    )]
    OutOfRange {
        /// The chunks directory.
        path: PathBuf,
        pid: u32,
        start: u64,
        end: u64,
        len: u64,
    },

    /// The checkpoint directory does not exist.
    #[error("no checkpoint directory at {path} (run `ckpt launch --dir {path}` first)")]
    NoCheckpointDir { path: PathBuf },

    /// A generation that is already committed was about to be written again.
    #[error(
        "{path}: generation {generation} is already committed; refusing to overwrite it \
         (use a generation number above the newest one)"
    )]
    AlreadyCommitted { path: PathBuf, generation: u64 },

    /// The manifest lists a file that is not on disk.
    #[error("{path}: listed in the manifest but missing (deleted or moved after the checkpoint?)")]
    Missing { path: PathBuf },

    /// A file's size differs from what the manifest recorded.
    #[error(
        "{path}: {found} bytes on disk but the manifest says {expected} \
         (truncated or rewritten after the checkpoint?)"
    )]
    SizeMismatch { path: PathBuf, expected: u64, found: u64 },

    /// A batch of the buffer pool failed as a whole (IO thread panicked, stream abandoned, misuse).
    #[error("{path}: {detail}")]
    Batch {
        /// The batch's chunks directory.
        path: PathBuf,
        detail: String,
    },

    /// A configuration value (pool sizes, codec) is invalid. The one variant without a path:
    /// configuration comes from the command line, not from a file.
    #[error("invalid {what}: {detail}")]
    InvalidConfig { what: &'static str, detail: String },
}

impl ImageError {
    /// The file or directory the error concerns, if it has one.
    pub fn path(&self) -> Option<&Path> {
        use ImageError::*;
        match self {
            Io { path, .. }
            | BadMagic { path, .. }
            | NewerFormat { path, .. }
            | OlderFormat { path, .. }
            | Checksum { path, .. }
            | TooLarge { path, .. }
            | Truncated { path, .. }
            | Malformed { path, .. }
            | Decode { path, .. }
            | Invalid { path, .. }
            | Encode { path, .. }
            | Gap { path, .. }
            | Overlap { path, .. }
            | OutOfRange { path, .. }
            | NoCheckpointDir { path }
            | AlreadyCommitted { path, .. }
            | Missing { path }
            | SizeMismatch { path, .. }
            | Batch { path, .. }
            | NotPrivate { path, .. } => Some(path),
            InvalidConfig { .. } => None,
        }
    }

    /// Wraps an `io::Error` with the path and the action that failed.
    pub(crate) fn io(path: impl Into<PathBuf>, action: &'static str, error: io::Error) -> Self {
        ImageError::Io { path: path.into(), action, error }
    }

    pub(crate) fn malformed(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        ImageError::Malformed { path: path.into(), detail: detail.into() }
    }

    pub(crate) fn truncated(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        ImageError::Truncated { path: path.into(), detail: detail.into() }
    }
}

/// A hint for the IO errors a user can do something about.
fn io_hint(e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::NotFound => " (missing?)",
        io::ErrorKind::PermissionDenied => " (check the owner and mode of the checkpoint directory)",
        io::ErrorKind::StorageFull => " (disk full: free space or checkpoint to another --dir)",
        io::ErrorKind::QuotaExceeded => " (quota exceeded: free space or checkpoint to another --dir)",
        io::ErrorKind::ReadOnlyFilesystem => " (read-only file system: checkpoint to another --dir)",
        io::ErrorKind::UnexpectedEof => " (file truncated?)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file() {
        let e = ImageError::Checksum { kind: "chunk", path: PathBuf::from("gen-000007/n0/chunks/p4242-0000000041943040"), detail: String::new() };
        assert_eq!(e.to_string(), "chunk gen-000007/n0/chunks/p4242-0000000041943040: checksum mismatch (file damaged?)");
        let e = ImageError::io("/d/x", "write", io::Error::from(io::ErrorKind::StorageFull));
        assert!(e.to_string().starts_with("/d/x: cannot write: "));
        assert!(e.to_string().contains("disk full"));
        assert_eq!(e.path(), Some(Path::new("/d/x")));
    }
}
