//! The record of one node's part of a generation: `<node>/procs.bin`, every process captured
//! there. Memory pages are not in it; they are in the node's chunk files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::image::{self, FileEntry};
use crate::objects::process::ZombieRecord;
use crate::objects::ProcessRecord;

pub const PROCS_FILE: &str = "procs.bin";
const PROCS_MAGIC: [u8; 8] = *b"CKPTPROC";
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

    pub fn read(node_dir: &Path) -> Result<NodeImage, image::ImageError> {
        image::read_record_file(&node_dir.join(PROCS_FILE), PROCS_MAGIC, PROCS_MAX)
    }
}
