//! The record of one node's part of a generation: `<node>/procs.bin`, every process captured
//! there. Memory pages are not in it; they are in the node's chunk files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::image::{self, FileEntry};
use crate::objects::process::ZombieRecord;
use crate::objects::ProcessRecord;

pub const PROCS_FILE: &str = "procs.bin";
pub const PROCS_MAGIC: [u8; 8] = *b"CKPTPROC";
/// Bound on what reading a procs file may allocate (a hostile image cannot exhaust memory).
const PROCS_MAX: u64 = 1 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeImage {
    pub node: String,
    /// Pid (in the job's namespace) of the job's main process, whose exit ends the job.
    pub main_pid: i32,
    /// Parents before children.
    pub processes: Vec<ProcessRecord>,
    /// Exited children not yet reaped by their parents.
    pub zombies: Vec<ZombieRecord>,
    /// The System V IPC objects of the job's IPC namespace.
    pub sysvipc: crate::objects::sysvipc::SysvIpcRecord,
}

impl NodeImage {
    pub fn write(&self, node_dir: &Path) -> Result<FileEntry, image::ImageError> {
        image::write_record_file(&node_dir.join(PROCS_FILE), PROCS_MAGIC, self)
    }

    /// Reads and validates (see [`crate::validate`]) the node's record: what this returns has
    /// passed every check that the records alone allow, so nothing acts on a forged field.
    pub fn read(node_dir: &Path) -> Result<NodeImage, image::ImageError> {
        let path = node_dir.join(PROCS_FILE);
        let img: NodeImage = image::read_record_file(&path, PROCS_MAGIC, PROCS_MAX)?;
        crate::validate::node_image(&img).map_err(|e| e.in_file(&path))?;
        Ok(img)
    }

    /// Decodes and validates a procs file's bytes, as [`NodeImage::read`] does with the file
    /// (`path` is for messages only): for fuzzing and tests.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<NodeImage, image::ImageError> {
        let img: NodeImage = image::record::decode_record(bytes, path, PROCS_MAGIC, PROCS_MAX)?;
        crate::validate::node_image(&img).map_err(|e| e.in_file(path))?;
        Ok(img)
    }

    /// Checks each process's stream length against the chunk files in `chunks_dir` (which the
    /// records alone cannot tell): before a restart reads any stream.
    pub fn check_streams(&self, chunks_dir: &Path) -> Result<(), image::ImageError> {
        let lens = crate::validate::chunk_stream_lengths(chunks_dir)?;
        crate::validate::stream_lengths(self, &lens).map_err(|e| e.in_file(chunks_dir))
    }
}
