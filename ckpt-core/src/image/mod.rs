//! The on-disk image format. See docs/IMAGE-FORMAT.md.
//!
//! ```text
//! D/gen-000007/MANIFEST                          written last, atomically: the commit point
//! D/gen-000007/<node>/procs.bin                  record files (magic, version, length, crc32c, postcard)
//! D/gen-000007/<node>/index.bin                  the node's other files, which the manifest does not list
//! D/gen-000007/<node>/chunks/p<pid>-<offset>     chunk files: one piece of one process's stream
//! ```
//!
//! - [`record`]: one serde value per file.
//! - [`chunk`]: chunk files, their header, encoding and decoding.
//! - [`mapped`]: chunk files read through a mapping, guarded against SIGBUS.
//! - [`stream`]: reassembling a process's stream from its chunk files at restart.
//! - [`manifest`]: the generation's index and checksums.
//! - [`generation`]: the checkpoint directory, committing, cleaning and pruning generations.
//! - [`index`]: a node's index of the files of its part, which the manifest lists in their place.
//! - [`verify`]: checking every byte of a generation.
//!
//! Every reader bounds every length it reads before allocating, and every error names the file.

pub mod chunk;
pub mod codec;
pub mod error;
pub(crate) mod fsutil;
pub mod generation;
pub mod index;
pub mod manifest;
pub mod record;
pub mod since;
pub mod stream;
pub mod verify;
pub mod xor;

/// Version of every file format of the image (record files, chunk files, the manifest). Readers
/// accept OLDEST_FORMAT_VERSION..=FORMAT_VERSION and refuse other files with an error that says
/// which ckpt wrote them.
pub const FORMAT_VERSION: u32 = 33;
/// The oldest format this ckpt reads. Version 2 added the controlling terminal to the process
/// record and the pending input to the pseudo-terminal record; version 3 the credentials (ids,
/// groups, capability sets, securebits) to the thread record; version 4 `repaired` to the TCP
/// connection record; version 5 the socket file's owner and mode to the Unix socket record, the
/// files record `files.bin`, and no more files saved whole in `procs.bin`; version 6 each
/// mapping's lock and madvise flags and the process's future lock and membarrier registrations
/// (`objects::memattrs`) to the process record; version 7 the sockets' receive and send timeouts
/// (SO_RCVTIMEO, SO_SNDTIMEO) to the TCP, UDP and Unix socket records; version 8 the job's clocks
/// at the freeze (`objects::timens`) to the end of the node record (postcard is positional: a
/// record of an older version does not decode as a newer one, so a reader that still takes an
/// older layout decodes it by its version, as `NodeImage::read` does formats 7 and 8); version
/// 9 the mmap flags MAP_NORESERVE and MAP_GROWSDOWN to each mapping's attributes
/// (`memattrs::VmaAttrs`; false when read from format 7 or 8); version 10 each mapping's pages
/// stored by earlier generations (`memory::VmaRecord::earlier`, incremental generations; none
/// when read from an older format); version 11 the trailer of block checksums of chunk files
/// stored raw (`chunk::BlockTable`) and the Unix socket whose queue carries descriptors or
/// datagrams from named senders (`FdKind::UnixQueue`, the last variant: older records decode
/// as in version 10); version 12 the job's mounts (`objects::mounts`, at the end of the node
/// record; none when read from an older format); version 13 the times of deleted files
/// (`deleted::DeletedFileRecord::times`) and where an epoll instance's watched file is held
/// (`epoll::EpollTarget::held_at`), fields inside descriptor records read by version
/// (`image::since`); version 14 the user namespaces the job made
/// (`objects::user_namespaces`, at the end of the node record, read by version as well); version
/// 15 multicast memberships (`udp`) and fanotify groups (`FdKind::Fanotify`); version 16 the UTS
/// namespaces the job made (`objects::uts`, at the end of the node record); version 17 the IPC
/// namespaces the job made with their System V objects (`objects::sysvipc`, at the end of the
/// node record); version 18 the packet socket descriptor kind (`FdKind::Packet`, after
/// `Fanotify`: older files never hold it); version 19 the network namespaces the job made
/// (`objects::net_namespaces`, at the end of the node record) and whether a bind's source is
/// taken before its namespace's changes (`mounts::MountSource::Bind::before_changes`); version
/// 20 the user namespace a UTS, IPC or network namespace belongs to when it is above its
/// maker's own (`namespaces::MadeNamespace::owner`); version 21 the boot id and the identities
/// of the files the job only reads (`objects::identity`, at the end of the files record); version
/// 22 the owner of deleted files (`deleted::DeletedFileRecord::owner`, read by version); version
/// 23 the CUDA state of a process (`ProcessRecord::cuda`, read by version); version 24
/// droppable memory (`memory::Backing::Droppable`, the last variant: older records decode
/// unchanged, and an older ckpt refuses the newer file rather than the variant); version 25 the
/// removed directory descriptor kind (`FdKind::RemovedDir`, the last variant, the same way);
/// version 26 the process's memory-deny-write-execute flags (`process::ProcessAttrs::mdwe`,
/// read by version); version 27 a GPU device's mapping inherited by a process that is no CUDA
/// process (`memory::Backing::GpuInherited`, the last variant, as `Droppable`) and the seccomp
/// sandboxes of a process's threads (`ProcessRecord::seccomp`, read by version); version 28 the
/// data extents of an in-memory file saved for its shared mappings (`memory::SavedFile::extents`,
/// read by version: `None` from an older file, whose saved file lies whole), and whether such a
/// file or a deleted one had space allocated beyond its data (`SavedFile::allocated`,
/// `deleted::SavedFileContents::allocated`, read by version); version 29 the node index
/// (`index::PartIndex`, `<node>/index.bin`): the manifest lists a node's records and its index,
/// the index the node's other files (a manifest of an older format lists every file, and is read
/// as before; an older ckpt refuses the newer manifest rather than miss the indexed files); version
/// 30 lets a saved in-memory file's extents lie in the stream in another order than in the file
/// (copied before the freeze, the pages written since stored after that copy: no field changed,
/// but an older ckpt would refuse such an image as damaged rather than say it is newer); version 31
/// the cgroups the job made (`objects::cgroups`, at the end of the node record, read by version),
/// a memfd's mode and owner (`memfd::MemfdRecord::mode_owner`), MADV_MERGEABLE
/// (`memattrs::VmaAttrs::mergeable`), the audit login id (`process::ProcessAttrs::loginuid`),
/// a UDP socket's shutdown state (`udp::UdpRecord::shutdown`), a Unix socket's SO_PASSSEC
/// (`unix::UnixRecord::passsec`), a pty slave's owner and mode and its hangup (`pty::PtyState::slave_owner`, `hung_up`) and
/// a pidfd of a reaped process (`pidfd::PidfdRecord::reaped`), where a netlink socket is connected
/// (`netlink::NetlinkRecord::connected`), each read by version; a cgroup's owners and modes
/// (`cgroups::CgroupAccess`, inside the cgroups record, which is 31's own), and a TCP connection
/// being established (`tcp::TcpState::Connecting`) and a namespace held open
/// (`descriptor::FdKind::NsFile`), last variants no older file holds; version 32 the guard pages
/// of a mapping (`memory::VmaRecord::guards`, read by version); version 33 a lease being broken
/// (`locks::LockKind::LeaseBreaking`, a last variant no older file holds) and a device's node
/// (`file::DeviceRecord::node`) and a console as controlling terminal
/// (`pty::ControllingTty::device`), each read by version, and a removed symbolic link held
/// with O_PATH (`descriptor::FdKind::RemovedSymlink`, a last variant).
/// The message queue descriptor kind (`FdKind::Mqueue`) came in version 8
/// without a new version: it is the last variant there, which older files never hold, so they
/// decode unchanged.
pub const OLDEST_FORMAT_VERSION: u32 = 7;

pub use chunk::{
    chunk_file_name, parse_chunk_file_name, read_chunk_header, write_chunk_file, ChunkDecoder, ChunkEncoder, ChunkHeader, EncodedChunk, CHUNK_HEADER_LEN,
    CHUNK_MAGIC, MAX_CHUNK_RAW_LEN,
};
pub use codec::{Codec, CodecId};
pub use error::{ImageError, Result};
pub use fsutil::{check_private_dir, check_private_file, create_private_dirs, gen_dir_name, open_private_file, parse_gen_dir_name};

/// Writes `bytes` to `path` through a `.tmp` file, fsync and rename, then fsyncs the directory:
/// after it returns the file is there whole, whatever crashes.
pub fn write_file_durable(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    fsutil::write_file_atomic(path, &[bytes])
}
pub use generation::{CheckpointDir, NodePart, PendingGeneration};
pub use index::{PartFiles, PartIndex, INDEX_FILE};
pub use manifest::{Manifest, MANIFEST_NAME, MAX_MANIFEST_LEN};
pub use record::{read_record_file, write_record_file, FileEntry, RECORD_HEADER_LEN};
pub use stream::{ChunkListing, ChunkLoc, StreamReader};
pub use verify::{verify_generation, StreamSummary, VerifyReport, CHUNKS_DIR_NAME};

#[cfg(test)]
mod tests {
    /// docs/IMAGE-FORMAT.md names the current and oldest format versions in two places, which
    /// went stale once (they said 15 when the code wrote 20): this keeps them true.
    #[test]
    fn the_format_page_names_the_versions_this_code_reads_and_writes() {
        let page = include_str!("../../../docs/IMAGE-FORMAT.md");
        let current = format!("Format version: **{}** (`image::FORMAT_VERSION`)", super::FORMAT_VERSION);
        assert!(page.contains(&current), "docs/IMAGE-FORMAT.md lacks {current:?}");
        let range = format!("({} ..= {})", super::OLDEST_FORMAT_VERSION, super::FORMAT_VERSION);
        assert!(page.contains(&range), "docs/IMAGE-FORMAT.md's Compatibility lacks {range:?}");
        let manifest = format!("\"format_version\": {},", super::FORMAT_VERSION);
        assert!(page.contains(&manifest), "docs/IMAGE-FORMAT.md's manifest example lacks {manifest:?}");
    }
}
