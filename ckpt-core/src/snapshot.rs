//! The record of one node's part of a generation: `<node>/procs.bin`, every process captured
//! there. Memory pages are not in it; they are in the node's chunk files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::image::{self, FileEntry};
use crate::objects::process::ZombieRecord;
use crate::objects::timens::ClocksRecord;
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
    /// The job's monotonic and boot-time clocks at the freeze, which a restart continues
    /// ([`crate::objects::timens`]). None in an image of format 7, which did not record them.
    pub clocks: Option<ClocksRecord>,
}

/// The first format whose node record holds [`NodeImage::clocks`].
const CLOCKS_SINCE: u32 = 8;

/// A node record of format 7: [`NodeImage`] without its last field (postcard is positional).
#[derive(Deserialize)]
struct NodeImageV7 {
    node: String,
    main_pid: i32,
    processes: Vec<ProcessRecord>,
    zombies: Vec<ZombieRecord>,
    sysvipc: crate::objects::sysvipc::SysvIpcRecord,
}

impl From<NodeImageV7> for NodeImage {
    fn from(v: NodeImageV7) -> NodeImage {
        NodeImage { node: v.node, main_pid: v.main_pid, processes: v.processes, zombies: v.zombies, sysvipc: v.sysvipc, clocks: None }
    }
}

impl NodeImage {
    pub fn write(&self, node_dir: &Path) -> Result<FileEntry, image::ImageError> {
        image::write_record_file(&node_dir.join(PROCS_FILE), PROCS_MAGIC, self)
    }

    /// Reads and validates (see [`crate::validate`]) the node's record: what this returns has
    /// passed every check that the records alone allow, so nothing acts on a forged field.
    pub fn read(node_dir: &Path) -> Result<NodeImage, image::ImageError> {
        let path = node_dir.join(PROCS_FILE);
        let img = image::record::read_record_file_as(&path, PROCS_MAGIC, PROCS_MAX, |version, payload| NodeImage::decode(version, payload, &path))?;
        crate::validate::node_image(&img).map_err(|e| e.in_file(&path))?;
        Ok(img)
    }

    /// Decodes a checked payload of the format `version`.
    fn decode(version: u32, payload: &[u8], path: &Path) -> Result<NodeImage, image::ImageError> {
        if version < CLOCKS_SINCE {
            return image::record::decode_payload::<NodeImageV7>(path, payload).map(NodeImage::from);
        }
        image::record::decode_payload(path, payload)
    }

    /// Decodes and validates a procs file's bytes, as [`NodeImage::read`] does with the file
    /// (`path` is for messages only): for fuzzing and tests.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<NodeImage, image::ImageError> {
        let img = image::record::decode_record_as(bytes, path, PROCS_MAGIC, PROCS_MAX, |version, payload| NodeImage::decode(version, payload, path))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::forge::sample_image;

    /// A record file of `version` holding `payload`, as a writer of that version made it.
    fn file_of_version(version: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = image::record::encode_record(PROCS_MAGIC, payload);
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        bytes
    }

    #[test]
    fn reads_its_own_format_with_the_clocks() {
        let img = sample_image();
        let bytes = file_of_version(image::FORMAT_VERSION, &postcard::to_stdvec(&img).unwrap());
        let back = NodeImage::from_bytes(&bytes, Path::new("procs.bin")).unwrap();
        assert_eq!(back.clocks, img.clocks);
        assert!(back.clocks.is_some());
    }

    /// An image checkpointed before the clocks were recorded still restarts (its clocks jump).
    #[test]
    fn reads_format_7_without_clocks() {
        #[derive(Serialize)]
        struct V7<'a>(&'a str, i32, &'a [ProcessRecord], &'a [ZombieRecord], &'a crate::objects::sysvipc::SysvIpcRecord);
        let img = sample_image();
        let payload = postcard::to_stdvec(&V7(&img.node, img.main_pid, &img.processes, &img.zombies, &img.sysvipc)).unwrap();
        let back = NodeImage::from_bytes(&file_of_version(7, &payload), Path::new("procs.bin")).unwrap();
        assert_eq!((back.node.as_str(), back.main_pid, back.processes.len(), back.clocks), ("n0", img.main_pid, img.processes.len(), None));
        // Not as format 8: the payload ends where the clocks would start.
        assert!(NodeImage::from_bytes(&file_of_version(8, &payload), Path::new("procs.bin")).is_err());
    }
}
