//! The record of one node's part of a generation: `<node>/procs.bin`, every process captured
//! there. Memory pages are not in it; they are in the node's chunk files.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::image::{self, FileEntry};
use crate::objects::descriptor::FdRecord;
use crate::objects::memattrs::{MemAttrsRecord, VmaAttrs, VmaAttrsV8};
use crate::objects::memory::{Backing, PageRun, VmaRecord};
use crate::objects::posix_timer::PosixTimerRecord;
use crate::objects::process::{ProcessAttrs, ZombieRecord};
use crate::objects::pty::ControllingTty;
use crate::objects::signals::SignalsRecord;
use crate::objects::sysvipc::SysvIpcRecord;
use crate::objects::thread::ThreadRecord;
use crate::objects::timens::ClocksRecord;
use crate::objects::ProcessRecord;
use crate::ptrace::Tid;

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
    pub sysvipc: SysvIpcRecord,
    /// The job's monotonic and boot-time clocks at the freeze, which a restart continues
    /// ([`crate::objects::timens`]). None in an image of format 7, which did not record them.
    pub clocks: Option<ClocksRecord>,
    /// How the main process ended, when it had and the job went on with the daemons it left
    /// (processes in sessions of their own); `main_pid` is then not a process of the image.
    /// Since format 10.
    pub main_end: Option<MainEnd>,
    /// What the job changed in its mount namespace, and the mount namespaces it made. Since
    /// format 12.
    pub mounts: crate::objects::mounts::MountsRecord,
    /// The user namespaces the job made. Since format 14 (none before).
    #[serde(deserialize_with = "crate::image::since::since::<14, _, _>")]
    pub users: crate::objects::user_namespaces::UsersRecord,
    /// The UTS namespaces the job made. Since format 16 (none before).
    #[serde(deserialize_with = "crate::image::since::since::<16, _, _>")]
    pub uts: crate::objects::uts::UtsRecord,
    /// The IPC namespaces the job made, with their System V objects. Since format 17 (none
    /// before).
    #[serde(deserialize_with = "crate::image::since::since::<17, _, _>")]
    pub ipc: crate::objects::sysvipc::IpcNamespacesRecord,
    /// The network namespaces the job made, with their loopback. Since format 19 (none
    /// before).
    #[serde(deserialize_with = "crate::image::since::since::<19, _, _>")]
    pub net: crate::objects::net_namespaces::NetRecord,
    /// The CPU of the checkpoint: the extensions a restart elsewhere must offer
    /// ([`crate::objects::cpu`]). Since format 21 (none before: not checked).
    #[serde(deserialize_with = "crate::image::since::since::<21, _, _>")]
    pub cpu: Option<crate::objects::cpu::CpuRecord>,
    /// The cgroups the job made and its processes in them ([`crate::objects::cgroups`]). Since
    /// format 31 (none before: such a job was refused).
    #[serde(deserialize_with = "crate::image::since::since::<31, _, _>")]
    pub cgroups: crate::objects::cgroups::CgroupsRecord,
}

/// How a job's main process ended: the launcher's exit status, when the last of the job's
/// processes ends.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum MainEnd {
    Exited(i32),
    Killed(i32),
}

impl MainEnd {
    /// The exit status a shell would show: the code, or 128 + the signal.
    pub fn exit_code(self) -> i32 {
        match self {
            MainEnd::Exited(c) => c,
            MainEnd::Killed(s) => 128 + s,
        }
    }
}

/// The first format whose node record holds [`NodeImage::clocks`].
const CLOCKS_SINCE: u32 = 8;
/// The first format whose mapping records hold the mmap flags (`VmaAttrs::no_reserve`,
/// `grows_down`).
const MMAP_FLAGS_SINCE: u32 = 9;
/// The first format whose mapping records hold [`VmaRecord::earlier`] (incremental generations)
/// and whose process records hold `saved_files` (large deleted files and memfds in the stream).
const EARLIER_RUNS_SINCE: u32 = 10;
/// The first format whose node record holds [`NodeImage::mounts`].
const MOUNTS_SINCE: u32 = 12;

// Older layouts, each decoded by its own type (postcard is positional: a record of an older
// version does not decode as a newer one) and turned into the current one. The node and process
// records of formats 7 to 9 differ from today's only in the mapping record they hold, `V`.

/// A node record of format 7: format 8's without its last field, the clocks.
#[derive(Deserialize)]
struct NodeImageV7 {
    node: String,
    main_pid: i32,
    processes: Vec<ProcessRecordOld<VmaRecordV8>>,
    zombies: Vec<ZombieRecord>,
    sysvipc: SysvIpcRecord,
}

/// A node record of formats 8 and 9: [`NodeImage`] with process records holding mapping
/// records of layout `V`.
#[derive(Deserialize)]
struct NodeImageOld<V> {
    node: String,
    main_pid: i32,
    processes: Vec<ProcessRecordOld<V>>,
    zombies: Vec<ZombieRecord>,
    sysvipc: SysvIpcRecord,
    clocks: Option<ClocksRecord>,
}

/// A node record of formats 10 and 11: [`NodeImage`] without the mounts.
#[derive(Deserialize)]
struct NodeImageV11 {
    node: String,
    main_pid: i32,
    processes: Vec<ProcessRecord>,
    zombies: Vec<ZombieRecord>,
    sysvipc: SysvIpcRecord,
    clocks: Option<ClocksRecord>,
    main_end: Option<MainEnd>,
}

impl From<NodeImageV11> for NodeImage {
    fn from(v: NodeImageV11) -> NodeImage {
        let NodeImageV11 { node, main_pid, processes, zombies, sysvipc, clocks, main_end } = v;
        NodeImage {
            node,
            main_pid,
            processes,
            zombies,
            sysvipc,
            clocks,
            main_end,
            mounts: Default::default(),
            users: Default::default(),
            uts: Default::default(),
            ipc: Default::default(),
            net: Default::default(),
            cpu: None,
            cgroups: Default::default(),
        }
    }
}

/// A process record of formats 7 to 9: [`ProcessRecord`] with mapping records of layout `V`,
/// without `saved_files`.
#[derive(Deserialize)]
struct ProcessRecordOld<V> {
    pid: Tid,
    ppid: Tid,
    pgid: Tid,
    sid: Tid,
    attrs: ProcessAttrs,
    threads: Vec<ThreadRecord>,
    vmas: Vec<V>,
    fds: Vec<FdRecord>,
    signals: SignalsRecord,
    stream_len: u64,
    posix_timers: Vec<PosixTimerRecord>,
    ctty: Option<ControllingTty>,
    mem_attrs: MemAttrsRecord,
}

/// A mapping record of formats 7 and 8: format 9's with [`VmaAttrsV8`].
#[derive(Deserialize)]
struct VmaRecordV8 {
    start: u64,
    end: u64,
    prot: u32,
    shared: bool,
    file_offset: u64,
    backing: Backing,
    runs: Vec<PageRun>,
    attrs: VmaAttrsV8,
}

/// A mapping record of format 9: [`VmaRecord`] without the pages of earlier generations.
#[derive(Deserialize)]
struct VmaRecordV9 {
    start: u64,
    end: u64,
    prot: u32,
    shared: bool,
    file_offset: u64,
    backing: Backing,
    runs: Vec<PageRun>,
    attrs: VmaAttrs,
}

impl From<NodeImageV7> for NodeImageOld<VmaRecordV8> {
    fn from(v: NodeImageV7) -> NodeImageOld<VmaRecordV8> {
        let NodeImageV7 { node, main_pid, processes, zombies, sysvipc } = v;
        NodeImageOld { node, main_pid, processes, zombies, sysvipc, clocks: None }
    }
}

impl<V: Into<VmaRecord>> From<NodeImageOld<V>> for NodeImage {
    fn from(v: NodeImageOld<V>) -> NodeImage {
        let NodeImageOld { node, main_pid, processes, zombies, sysvipc, clocks } = v;
        NodeImage {
            node,
            main_pid,
            processes: processes.into_iter().map(ProcessRecord::from).collect(),
            zombies,
            sysvipc,
            clocks,
            main_end: None,
            mounts: Default::default(),
            users: Default::default(),
            uts: Default::default(),
            ipc: Default::default(),
            net: Default::default(),
            cpu: None,
            cgroups: Default::default(),
        }
    }
}

impl<V: Into<VmaRecord>> From<ProcessRecordOld<V>> for ProcessRecord {
    fn from(v: ProcessRecordOld<V>) -> ProcessRecord {
        let ProcessRecordOld { pid, ppid, pgid, sid, attrs, threads, vmas, fds, signals, stream_len, posix_timers, ctty, mem_attrs } = v;
        let vmas = vmas.into_iter().map(Into::into).collect();
        ProcessRecord {
            pid,
            ppid,
            pgid,
            sid,
            attrs,
            threads,
            vmas,
            fds,
            signals,
            stream_len,
            posix_timers,
            ctty,
            mem_attrs,
            saved_files: Vec::new(),
            cuda: None,
            seccomp: None,
        }
    }
}

impl From<VmaRecordV8> for VmaRecord {
    fn from(v: VmaRecordV8) -> VmaRecord {
        let VmaRecordV8 { start, end, prot, shared, file_offset, backing, runs, attrs } = v;
        VmaRecordV9 { start, end, prot, shared, file_offset, backing, runs, attrs: attrs.into() }.into()
    }
}

impl From<VmaRecordV9> for VmaRecord {
    fn from(v: VmaRecordV9) -> VmaRecord {
        let VmaRecordV9 { start, end, prot, shared, file_offset, backing, runs, attrs } = v;
        VmaRecord { start, end, prot, shared, file_offset, backing, runs, attrs, earlier: Vec::new(), guards: Vec::new() }
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
            return image::record::decode_payload::<NodeImageV7>(path, payload).map(|v| NodeImageOld::from(v).into());
        }
        if version < MMAP_FLAGS_SINCE {
            return image::record::decode_payload::<NodeImageOld<VmaRecordV8>>(path, payload).map(NodeImage::from);
        }
        if version < EARLIER_RUNS_SINCE {
            return image::record::decode_payload::<NodeImageOld<VmaRecordV9>>(path, payload).map(NodeImage::from);
        }
        if version < MOUNTS_SINCE {
            return image::record::decode_payload::<NodeImageV11>(path, payload).map(NodeImage::from);
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

    /// Checks the pages the records refer to in earlier generations (an incremental
    /// generation) against those generations' chunk files: `earlier` gives the chunk directory
    /// of this node in each generation the manifest `needs`.
    pub fn check_earlier_streams(&self, needs: &[u64], earlier: &std::collections::BTreeMap<u64, std::path::PathBuf>) -> Result<(), image::ImageError> {
        let mut lens = std::collections::BTreeMap::new();
        for (&g, dir) in earlier {
            lens.insert(g, crate::validate::chunk_stream_lengths(dir)?);
        }
        let first = earlier.values().next().map(|p| p.as_path()).unwrap_or(Path::new("."));
        crate::validate::earlier_streams(self, needs, &lens).map_err(|e| e.in_file(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::memattrs::{HugePages, Lock, ReadAhead, VmaAttrs};
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

    /// What a writer of formats 7 and 8 wrote for a process: its mappings' attributes without
    /// the mmap flags. Declared apart from the reader's types, field by field as the writer had
    /// them, so that a mistake in either shows.
    #[derive(Serialize)]
    struct OldAttrs(Lock, bool, bool, bool, HugePages, ReadAhead);
    #[derive(Serialize)]
    struct OldVma<'a>(u64, u64, u32, bool, u64, OldBacking<'a>, &'a [PageRun], OldAttrs);

    /// A mapping's backing as writers before format 28 wrote it: a saved in-memory file as its
    /// stream offset and length alone (no extents); every other variant as today.
    struct OldBacking<'a>(&'a Backing);

    impl Serialize for OldBacking<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            use serde::ser::SerializeStructVariant;
            match self.0 {
                Backing::File { path, dev, ino, size, saved } => {
                    // `File` is the enum's third variant.
                    let mut v = s.serialize_struct_variant("Backing", 2, "File", 5)?;
                    v.serialize_field("path", path)?;
                    v.serialize_field("dev", dev)?;
                    v.serialize_field("ino", ino)?;
                    v.serialize_field("size", size)?;
                    v.serialize_field("saved", &saved.as_ref().map(|f| (f.stream_offset, f.len)))?;
                    v.end()
                }
                other => other.serialize(s),
            }
        }
    }

    /// [`image_with_mapping_flags`] as a reader of an older format gives it back: its saved
    /// in-memory files without extents.
    fn image_of_an_older_format() -> NodeImage {
        let mut img = image_with_mapping_flags();
        for v in img.processes.iter_mut().flat_map(|p| p.vmas.iter_mut()) {
            if let Backing::File { saved: Some(f), .. } = &mut v.backing {
                f.extents = None;
            }
        }
        img
    }
    /// A process's attributes before format 16: the executable without `deleted`, no `root`.
    #[derive(Serialize)]
    struct OldProcessAttrs<'a>(
        (&'a str, u64, u64),
        &'a str,
        u32,
        u64,
        &'a [(u32, u64, u64)],
        &'a [crate::objects::process::ItimerRecord; 3],
        &'a crate::objects::process::MmFields,
        i32,
        bool,
        bool,
    );
    /// A descriptor record as formats before 31 wrote it: without its owner.
    #[derive(Serialize)]
    struct OldFd<'a>(i32, u32, u64, u32, OldKind<'a>, &'a [crate::objects::locks::LockRecord]);

    /// A descriptor's kind as formats before 33 wrote it: a device without its node.
    struct OldKind<'a>(&'a crate::objects::descriptor::FdKind);

    impl Serialize for OldKind<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            #[derive(Serialize)]
            struct Device<'a> {
                path: &'a str,
            }
            match self.0 {
                // Its place in `descriptor_kinds!`: the second.
                crate::objects::descriptor::FdKind::CharDevice(d) => s.serialize_newtype_variant("FdKind", 1, "CharDevice", &Device { path: &d.path }),
                kind => kind.serialize(s),
            }
        }
    }

    /// A process record of formats 7 to 9, with mapping records `V` of the format.
    #[derive(Serialize)]
    struct OldProcess<'a, V>(
        Tid,
        Tid,
        Tid,
        Tid,
        OldProcessAttrs<'a>,
        &'a [ThreadRecord],
        Vec<V>,
        Vec<OldFd<'a>>,
        &'a SignalsRecord,
        u64,
        &'a [PosixTimerRecord],
        &'a Option<ControllingTty>,
        &'a MemAttrsRecord,
    );

    fn old_vma(v: &VmaRecord) -> OldVma<'_> {
        let a = v.attrs;
        let attrs = OldAttrs(a.lock, a.dont_fork, a.wipe_on_fork, a.dont_dump, a.huge_pages, a.read_ahead);
        OldVma(v.start, v.end, v.prot, v.shared, v.file_offset, OldBacking(&v.backing), &v.runs, attrs)
    }

    fn old_process_with<'a, V>(p: &'a ProcessRecord, vma: impl Fn(&'a VmaRecord) -> V) -> OldProcess<'a, V> {
        let vmas = p.vmas.iter().map(vma).collect();
        let a = &p.attrs;
        let attrs = OldProcessAttrs(
            (&a.exe.path, a.exe.dev, a.exe.ino),
            &a.cwd,
            a.umask,
            a.personality,
            &a.rlimits,
            &a.itimers,
            &a.mm,
            a.oom_score_adj,
            a.thp_disabled,
            a.child_subreaper,
        );
        let fds = p.fds.iter().map(|f| OldFd(f.fd, f.flags, f.pos, f.description, OldKind(&f.kind), &f.locks)).collect();
        OldProcess(p.pid, p.ppid, p.pgid, p.sid, attrs, &p.threads, vmas, fds, &p.signals, p.stream_len, &p.posix_timers, &p.ctty, &p.mem_attrs)
    }

    fn old_processes(img: &NodeImage) -> Vec<OldProcess<'_, OldVma<'_>>> {
        img.processes.iter().map(|p| old_process_with(p, old_vma)).collect()
    }

    /// The sample image with attributes on its mappings, among them the mmap flags of format 9.
    fn image_with_mapping_flags() -> NodeImage {
        let mut img = sample_image();
        img.processes[0].vmas[1].attrs = VmaAttrs { lock: Lock::Locked, dont_dump: true, no_reserve: true, grows_down: true, ..Default::default() };
        img.processes[1].vmas[0].attrs = VmaAttrs { read_ahead: ReadAhead::Random, no_reserve: true, ..Default::default() };
        img
    }

    /// Its mappings as an image without the mmap flags gives them back: the flags false.
    fn without_mmap_flags(img: &NodeImage) -> Vec<Vec<VmaRecord>> {
        let clear = |v: &VmaRecord| VmaRecord { attrs: VmaAttrs { no_reserve: false, grows_down: false, ..v.attrs }, ..v.clone() };
        img.processes.iter().map(|p| p.vmas.iter().map(clear).collect()).collect()
    }

    fn vmas_of(img: &NodeImage) -> Vec<Vec<VmaRecord>> {
        img.processes.iter().map(|p| p.vmas.clone()).collect()
    }

    #[test]
    fn reads_its_own_format_with_the_mmap_flags() {
        let img = image_with_mapping_flags();
        let bytes = file_of_version(image::FORMAT_VERSION, &postcard::to_stdvec(&img).unwrap());
        let back = NodeImage::from_bytes(&bytes, Path::new("procs.bin")).unwrap();
        assert_eq!(vmas_of(&back), vmas_of(&img));
        assert!(back.processes[0].vmas[1].attrs.no_reserve && back.processes[0].vmas[1].attrs.grows_down);
    }

    /// An image of format 8 (mappings without the mmap flags) still restarts: its mappings read
    /// without MAP_NORESERVE and MAP_GROWSDOWN, everything else as written.
    #[test]
    fn reads_format_8_without_mmap_flags() {
        #[derive(Serialize)]
        struct V8<'a>(&'a str, i32, Vec<OldProcess<'a, OldVma<'a>>>, &'a [ZombieRecord], &'a SysvIpcRecord, &'a Option<ClocksRecord>);
        let img = image_of_an_older_format();
        let payload = postcard::to_stdvec(&V8(&img.node, img.main_pid, old_processes(&img), &img.zombies, &img.sysvipc, &img.clocks)).unwrap();
        let back = NodeImage::from_bytes(&file_of_version(8, &payload), Path::new("procs.bin")).unwrap();
        assert_eq!((back.node.as_str(), back.main_pid, back.processes.len(), back.clocks), ("n0", img.main_pid, img.processes.len(), img.clocks));
        assert_eq!(vmas_of(&back), without_mmap_flags(&img));
        assert_eq!(back.processes[0].vmas[1].attrs.lock, Lock::Locked);
        assert_eq!(back.processes[1].vmas[0].attrs.read_ahead, ReadAhead::Random);
        // Not as format 9: the mapping records are shorter.
        assert!(NodeImage::from_bytes(&file_of_version(9, &payload), Path::new("procs.bin")).is_err());
    }

    /// An image of format 9 (mappings without pages of earlier generations, processes without
    /// saved files, no main process's end) still restarts: every mapping reads as a full
    /// generation's, everything else as written.
    #[test]
    fn reads_format_9_without_earlier_runs() {
        /// A mapping's attributes of formats 9 to 30: those of format 8 and the mmap flags.
        #[derive(Serialize)]
        struct V9Attrs(Lock, bool, bool, bool, crate::objects::memattrs::HugePages, ReadAhead, bool, bool);
        #[derive(Serialize)]
        struct V9Vma<'a>(u64, u64, u32, bool, u64, OldBacking<'a>, &'a [PageRun], V9Attrs);
        #[derive(Serialize)]
        struct V9<'a>(&'a str, i32, Vec<OldProcess<'a, V9Vma<'a>>>, &'a [ZombieRecord], &'a SysvIpcRecord, &'a Option<ClocksRecord>);
        let img = image_of_an_older_format();
        let processes = img
            .processes
            .iter()
            .map(|p| {
                old_process_with(p, |v| {
                    let a = v.attrs;
                    let attrs = V9Attrs(a.lock, a.dont_fork, a.wipe_on_fork, a.dont_dump, a.huge_pages, a.read_ahead, a.no_reserve, a.grows_down);
                    V9Vma(v.start, v.end, v.prot, v.shared, v.file_offset, OldBacking(&v.backing), &v.runs, attrs)
                })
            })
            .collect();
        let payload = postcard::to_stdvec(&V9(&img.node, img.main_pid, processes, &img.zombies, &img.sysvipc, &img.clocks)).unwrap();
        let back = NodeImage::from_bytes(&file_of_version(9, &payload), Path::new("procs.bin")).unwrap();
        assert_eq!(vmas_of(&back), vmas_of(&img));
        assert_eq!(back.clocks, img.clocks);
        // Nor the other additions of format 10: no file saved in a stream, the main process alive.
        assert!(back.processes.iter().all(|p| p.saved_files.is_empty()));
        assert_eq!(back.main_end, None);
        // Not as format 10: the mapping records are shorter.
        assert!(NodeImage::from_bytes(&file_of_version(10, &payload), Path::new("procs.bin")).is_err());
    }

    /// An image checkpointed before the clocks were recorded still restarts (its clocks jump).
    #[test]
    fn reads_format_7_without_clocks() {
        #[derive(Serialize)]
        struct V7<'a>(&'a str, i32, Vec<OldProcess<'a, OldVma<'a>>>, &'a [ZombieRecord], &'a SysvIpcRecord);
        let img = image_of_an_older_format();
        let payload = postcard::to_stdvec(&V7(&img.node, img.main_pid, old_processes(&img), &img.zombies, &img.sysvipc)).unwrap();
        let back = NodeImage::from_bytes(&file_of_version(7, &payload), Path::new("procs.bin")).unwrap();
        assert_eq!((back.node.as_str(), back.main_pid, back.processes.len(), back.clocks), ("n0", img.main_pid, img.processes.len(), None));
        assert_eq!(vmas_of(&back), without_mmap_flags(&img));
        // Not as format 8: the payload ends where the clocks would start.
        assert!(NodeImage::from_bytes(&file_of_version(8, &payload), Path::new("procs.bin")).is_err());
    }
}
