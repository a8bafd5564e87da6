//! Files open for writing, saved whole (`--save-files`): a file the job changes in place (not
//! only appends to) is put back at restart as it was at the checkpoint, so that what the job
//! wrote after the checkpoint, before a crash, is undone with the rest of its state.
//!
//! Capture reads each regular file some process of the job has open for writing, once per file,
//! while the job is frozen; restart checks that each is still the same file (device and inode)
//! and writes the saved contents over it, at its checkpoint size, before any process exists.

use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::fd::FdKind;
use super::ProcessRecord;
use crate::error::{Context, Error, Result};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavedFileRecord {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub data: Vec<u8>,
}

/// Largest total of file contents one checkpoint saves (they live in the node's record).
const MAX_SAVED_BYTES: u64 = 256 << 20;

/// The regular files open for writing in the job, once each: (path, dev, ino) (pure).
pub fn files_to_save(processes: &[ProcessRecord]) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for p in processes {
        for rec in p.fds.iter().filter(|r| r.writable()) {
            if let FdKind::File { path, dev, ino, .. } = &rec.kind {
                if !out.iter().any(|f| (f.1, f.2) == (*dev, *ino)) {
                    out.push((path.clone(), *dev, *ino));
                }
            }
        }
    }
    out
}

/// Saves every file the job has open for writing. The job must be frozen.
pub fn capture(processes: &[ProcessRecord]) -> Result<Vec<SavedFileRecord>> {
    let mut out = Vec::new();
    let mut total = 0;
    for (path, dev, ino) in files_to_save(processes) {
        let meta = std::fs::metadata(&path).context(|| format!("stat {path} to save it"))?;
        if !meta.is_file() || (meta.dev(), meta.ino()) != (dev, ino) {
            continue; // a directory, or the path now names another file: nothing to save by path
        }
        total += meta.size();
        if total > MAX_SAVED_BYTES {
            return Err(Error::Other(format!(
                "--save-files: the files open for writing exceed {MAX_SAVED_BYTES} bytes (at {path}); run without --save-files"
            )));
        }
        let data = std::fs::read(&path).context(|| format!("read {path} to save it"))?;
        out.push(SavedFileRecord { path, dev, ino, data });
    }
    Ok(out)
}

/// Checks that every saved file is still the same file; changes nothing.
pub fn check(saved: &[SavedFileRecord]) -> Result<()> {
    for f in saved {
        let changed = |problem: String| Error::FileChanged { path: f.path.clone(), problem };
        let meta = std::fs::metadata(&f.path).map_err(|e| changed(format!("file is gone ({e})")))?;
        if (meta.dev(), meta.ino()) != (f.dev, f.ino) {
            return Err(changed("file was replaced by another file (different inode)".into()));
        }
    }
    Ok(())
}

/// Writes every saved file back as it was at the checkpoint (same inode, contents and size).
pub fn restore(saved: &[SavedFileRecord]) -> Result<()> {
    use std::io::Write;
    for f in saved {
        let mut file = std::fs::OpenOptions::new().write(true).open(&f.path).context(|| format!("open {} to put it back", f.path))?;
        file.write_all(&f.data).context(|| format!("write {} back", f.path))?;
        file.set_len(f.data.len() as u64).context(|| format!("cut {} to its checkpoint size", f.path))?;
        file.sync_all().context(|| format!("sync {}", f.path))?;
    }
    Ok(())
}
