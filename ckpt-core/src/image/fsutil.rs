//! Small file-system helpers shared by the image writers: private modes, fsync of files and
//! directories, bounded reads, and the generation-relative names the manifest records.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::error::{ImageError, Result};

/// Mode of every directory of an image: images hold process memory, which may hold secrets.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of every file of an image.
pub(crate) const FILE_MODE: u32 = 0o600;

/// `mkdir -p` with mode 0700 for every directory it creates.
pub(crate) fn create_dir_private(path: &Path) -> Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(path).map_err(|e| ImageError::io(path, "create directory", e))
}

/// Refuses a directory of images (`--dir`, `--local-dir`) that the user running ckpt does not
/// own, or that group or others may write: another local user could have made it, planted a
/// secret and an image in it, or could move the job's generations away. Root too (it became
/// the owner of a user's directory before it gets here; a directory another user made first
/// where root meant to make its own is refused). The path is followed: a link to a directory
/// of one's own is fine.
pub fn check_private_dir(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| ImageError::io(path, "stat", e))?;
    check_private(path, &meta, 0o022, "chmod go-w")
}

/// The same for a file holding a secret (a job's `secret`, `--secret-file`): the user's own,
/// and no one else may read or write it (mode 0600 or stricter).
pub fn check_private_file(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| ImageError::io(path, "stat", e))?;
    check_private(path, &meta, 0o077, "chmod 0600")
}

fn check_private(path: &Path, meta: &fs::Metadata, forbidden_mode: u32, chmod: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(ImageError::NotPrivate {
            path: path.to_path_buf(),
            problem: format!("owned by uid {}, not by you (uid {me})", meta.uid()),
            remedy: "use a path of your own (with {node} or $USER in it where several share a parent)".into(),
        });
    }
    let granted = meta.mode() & forbidden_mode;
    if granted != 0 {
        let whom = if granted & 0o007 != 0 { "everyone" } else { "its group" };
        let may = if granted & 0o022 != 0 { "change" } else { "read" };
        return Err(ImageError::NotPrivate {
            path: path.to_path_buf(),
            problem: format!("{whom} may {may} it (mode {:04o})", meta.mode() & 0o7777),
            remedy: format!("`{chmod} {}` if it is yours and nothing was planted in it, or use a path of your own", path.display()),
        });
    }
    Ok(())
}

/// Opens `path` for writing as a file of an image: created with mode 0600 if it is not there,
/// never through a symbolic link in its last component (O_NOFOLLOW: a link another user planted
/// would have the write go elsewhere), emptied if `truncate`. For what ckpt writes in an image
/// directory outside the image writers: received partner parts, parity pieces, rebuilt parts,
/// `job.json`.
pub fn open_private_file(path: &Path, truncate: bool) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(truncate).mode(FILE_MODE).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

/// `create_dir_all` with mode 0700 for what it makes (received parts' directories).
pub fn create_private_dirs(path: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(path)
}

/// Makes the entries of a directory (new files, renames) durable.
pub(crate) fn fsync_dir(path: &Path) -> Result<()> {
    File::open(path).and_then(|d| d.sync_all()).map_err(|e| ImageError::io(path, "fsync directory", e))
}

/// Creates (or truncates) `path` with mode 0600, writes `parts` in order and fsyncs it.
pub(crate) fn write_file_synced(path: &Path, parts: &[&[u8]], exclusive: bool) -> Result<()> {
    let mut opts = OpenOptions::new();
    opts.write(true).mode(FILE_MODE);
    if exclusive {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(true);
    }
    let mut f = opts.open(path).map_err(|e| ImageError::io(path, "create", e))?;
    let written = parts
        .iter()
        .try_for_each(|part| f.write_all(part))
        .map_err(|e| ImageError::io(path, "write", e))
        .and_then(|()| f.sync_all().map_err(|e| ImageError::io(path, "fsync", e)));
    if written.is_err() {
        // A partial file would only mislead a later reader; the error says what happened.
        let _ = fs::remove_file(path);
    }
    written
}

/// Writes `parts` to `path.tmp`, fsyncs it, renames it over `path` and fsyncs the directory,
/// so that `path` holds either its old content or the whole new one, even after a crash.
pub(crate) fn write_file_atomic(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let tmp = tmp_path(path);
    write_file_synced(&tmp, parts, false)?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(ImageError::io(path, "rename the .tmp file to", e));
    }
    fsync_dir(parent_or_dot(path))
}

/// `path` with `.tmp` appended to its file name.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

pub(crate) fn parent_or_dot(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Opens `path` for reading and returns it with its size.
pub(crate) fn open_with_len(path: &Path) -> Result<(File, u64)> {
    let f = File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
    let len = f.metadata().map_err(|e| ImageError::io(path, "stat", e))?.len();
    Ok((f, len))
}

/// Asks the kernel to start reading `len` bytes at `offset` of `path` (0: to the end) into the
/// page cache (POSIX_FADV_WILLNEED), and returns at once. Only a hint: a file that cannot be
/// opened is left for its reader to report.
pub(crate) fn advise_will_need_range(path: &Path, offset: u64, len: u64) {
    if let Ok(f) = File::open(path) {
        let (offset, len) = (offset.try_into().unwrap_or(i64::MAX), len.try_into().unwrap_or(i64::MAX));
        let _ = nix::fcntl::posix_fadvise(&f, offset, len, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED);
    }
}

/// Reads exactly `buf.len()` bytes; an early end of file is reported as truncation.
pub(crate) fn read_exact_or_truncated(f: &mut File, path: &Path, buf: &mut [u8], what: &str) -> Result<()> {
    f.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ImageError::truncated(path, format!("file ends inside the {what}"))
        } else {
            ImageError::io(path, "read", e)
        }
    })
}

/// Parses a generation directory name, `gen-` followed by at least six decimal digits.
pub fn parse_gen_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("gen-")?;
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    // Only the canonical spelling names a generation, so that `gen-0000007` and `gen-000007`
    // cannot both claim generation 7.
    (gen_dir_name(n) == name).then_some(n)
}

/// The directory name of generation `n`: `gen-%06d`.
pub fn gen_dir_name(n: u64) -> String {
    format!("gen-{n:06}")
}

/// The name the manifest records for `path`: relative to the nearest enclosing generation
/// directory (`n0/procs.bin`), or the path as given when it lies in no generation directory.
pub(crate) fn gen_relative(path: &Path) -> String {
    for ancestor in path.ancestors().skip(1) {
        let is_gen = ancestor.file_name().and_then(|n| n.to_str()).and_then(parse_gen_dir_name).is_some();
        if is_gen {
            if let Ok(rel) = path.strip_prefix(ancestor) {
                return rel.to_string_lossy().into_owned();
            }
        }
    }
    path.to_string_lossy().into_owned()
}

/// Resolves a path recorded in a manifest, refusing anything that could point outside the
/// generation directory (absolute paths, `..`), since a manifest is read from disk.
pub(crate) fn resolve_listed(gen_dir: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    let ok = !rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if !ok {
        return Err(ImageError::malformed(
            gen_dir.join("MANIFEST"),
            format!(
                "lists the file {rel:?}, which is not a plain path inside the generation directory \
                 (manifest damaged or forged?)"
            ),
        ));
    }
    Ok(gen_dir.join(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen_names() {
        assert_eq!(gen_dir_name(7), "gen-000007");
        assert_eq!(gen_dir_name(1234567), "gen-1234567");
        assert_eq!(parse_gen_dir_name("gen-000007"), Some(7));
        assert_eq!(parse_gen_dir_name("gen-1234567"), Some(1234567));
        assert_eq!(parse_gen_dir_name("gen-0000007"), None);
        assert_eq!(parse_gen_dir_name("gen-7"), None);
        assert_eq!(parse_gen_dir_name("gen-00000x"), None);
        assert_eq!(parse_gen_dir_name("gen-000007.tmp"), None);
    }

    #[test]
    fn relative_names() {
        assert_eq!(gen_relative(Path::new("/d/gen-000007/n0/chunks/p1-0000000000000000")), "n0/chunks/p1-0000000000000000");
        assert_eq!(gen_relative(Path::new("/tmp/x/procs.bin")), "/tmp/x/procs.bin");
        let g = Path::new("/d/gen-000001");
        assert!(resolve_listed(g, "n0/procs.bin").is_ok());
        assert!(resolve_listed(g, "../x").is_err());
        assert!(resolve_listed(g, "/etc/passwd").is_err());
        assert!(resolve_listed(g, "n0/./x").is_ok()); // `.` is dropped by components()
        assert!(resolve_listed(g, "").is_err());
    }

    #[test]
    fn private_files_are_0600_and_never_written_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, b"not ckpt's").unwrap();
        let planted = dir.path().join("parity-0");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let e = open_private_file(&planted, true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert_eq!(fs::read(&target).unwrap(), b"not ckpt's");
        let made = dir.path().join("part");
        drop(open_private_file(&made, false).unwrap());
        assert_eq!(fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
