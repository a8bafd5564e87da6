//! Files identified by what they are, not only where they sit (issue 35).
//!
//! On the machine and boot of the checkpoint, a file the job had is the same file when its
//! device and inode are: every check of the restart says so today. Elsewhere, and after a reboot
//! of the same machine, device numbers are given anew (a network file system, an overlay, a
//! btrfs subvolume get another anonymous device), and on another machine with its own root file
//! system `/usr/bin/bash` is another inode with the same bytes. So a restart compares the boot
//! it runs in with the checkpoint's ([`Place`]):
//!
//! - on the same boot, device and inode, as before;
//! - on another boot, a file the job only reads or maps privately (executables, libraries, input)
//!   is judged by its contents, recorded at the checkpoint ([`FileIdentity`]): an ELF file by
//!   its build-id and size, another by its size, mode and BLAKE3 hash (a file above
//!   [`MAX_HASHED`] by size and mode alone, said in a warning); a file the job writes must be
//!   the same inode (a file system both machines share), its device not compared.
//!
//! Identities are computed after the job runs again ([`record`]), never while it is frozen, and
//! once per file for the life of an agent ([`Cache`], keyed by device, inode, size and times).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

use super::files_state::Use;

/// What a file holds, as far as telling another copy of it apart goes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Content {
    /// An ELF file's NT_GNU_BUILD_ID note: the linker's hash of the code and data.
    BuildId(Vec<u8>),
    /// BLAKE3-256 of the whole file.
    Blake3([u8; 32]),
    /// Larger than [`MAX_HASHED`]: judged by size and mode only.
    NotSummed,
}

/// A file the job only reads, by its device and inode at the checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub content: Content,
}

/// Files above this are not hashed (reading them at each launch would cost more than it tells).
pub const MAX_HASHED: u64 = 1 << 30;

/// The longest build-id taken (GNU ld writes 20 bytes; 64 leaves room for any hash).
pub const MAX_BUILD_ID: usize = 64;

/// The identity of the open regular file `f`.
pub fn of_file(f: &File) -> std::io::Result<FileIdentity> {
    let meta = f.metadata()?;
    let content = match build_id(f, meta.len())? {
        Some(id) => Content::BuildId(id),
        None if meta.len() > MAX_HASHED => Content::NotSummed,
        None => Content::Blake3(hash(f)?),
    };
    Ok(FileIdentity { dev: meta.dev(), ino: meta.ino(), size: meta.len(), mode: meta.mode() & 0o7777, content })
}

/// BLAKE3 of a whole file, read from its start.
fn hash(f: &File) -> std::io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, f);
    std::io::copy(&mut reader.by_ref(), &mut hasher)?;
    Ok(*hasher.finalize().as_bytes())
}

/// An ELF file's build-id, from its header, program headers and PT_NOTE segments only (goblin's
/// lazy parse: a whole `Elf::parse` would read the symbol tables too). None for a file that is
/// not ELF or has no build-id note.
fn build_id(f: &File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    use goblin::elf::{header, program_header, Elf, ProgramHeader};
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; header::header64::SIZEOF_EHDR];
    if len < head.len() as u64 || f.read_exact_at(&mut head, 0).is_err() || &head[..4] != header::ELFMAG {
        return Ok(None);
    }
    let Ok(hdr) = Elf::parse_header(&head) else { return Ok(None) };
    let (ph_off, ph_size) = (hdr.e_phoff, u64::from(hdr.e_phnum) * u64::from(hdr.e_phentsize));
    if ph_size == 0 || ph_off.saturating_add(ph_size) > len || ph_size > 1 << 20 {
        return Ok(None);
    }
    let mut ph = vec![0u8; (ph_off + ph_size) as usize];
    f.read_exact_at(&mut ph[ph_off as usize..], ph_off)?;
    let (Ok(container), Ok(endian)) = (hdr.container(), hdr.endianness()) else { return Ok(None) };
    let ctx = goblin::container::Ctx::new(container, endian);
    let Ok(headers) = ProgramHeader::parse(&ph, ph_off as usize, hdr.e_phnum as usize, ctx) else { return Ok(None) };
    for note in headers.iter().filter(|p| p.p_type == program_header::PT_NOTE) {
        let (off, size) = (note.p_offset, note.p_filesz);
        if size == 0 || off.saturating_add(size) > len || size > 1 << 20 {
            continue;
        }
        let mut bytes = vec![0u8; size as usize];
        f.read_exact_at(&mut bytes, off)?;
        if let Some(id) = gnu_build_id(&bytes, ctx.le) {
            return Ok(Some(id));
        }
    }
    Ok(None)
}

/// The NT_GNU_BUILD_ID descriptor among the notes of one PT_NOTE segment (pure). Notes are
/// 4-byte aligned on every Linux ELF (namesz, descsz, type, name, desc).
///
/// Hand-written: goblin's note iterator needs the whole file's bytes in memory (or mapped),
/// where this reads only the segment.
fn gnu_build_id(seg: &[u8], endian: goblin::container::Endian) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |at: usize| -> Option<u32> {
        let b: [u8; 4] = seg.get(at..at + 4)?.try_into().ok()?;
        Some(if endian.is_little() { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) })
    };
    let align = |n: usize| n.div_ceil(4) * 4;
    let mut at = 0;
    while at + 12 <= seg.len() {
        let (namesz, descsz, kind) = (word(at)? as usize, word(at + 4)? as usize, word(at + 8)?);
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align(namesz))?;
        let end = desc_at.checked_add(align(descsz))?;
        let name = seg.get(name_at..name_at + namesz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && (1..=MAX_BUILD_ID).contains(&descsz) {
            return Some(seg.get(desc_at..desc_at + descsz)?.to_vec());
        }
        at = end;
    }
    None
}

/// What tells that a file is unchanged since its identity was computed: device, inode, size,
/// mtime and ctime.
type Unchanged = (u64, u64, u64, (i64, i64), (i64, i64));

/// Identities already computed: a file is read once for the life of an agent unless it changes.
#[derive(Debug, Default)]
pub struct Cache {
    known: HashMap<Unchanged, FileIdentity>,
}

/// The identities of the files the job only reads (open read-only, mapped privately or
/// read-only), for the files record. A file that cannot be opened, or whose path names another
/// file now than at the freeze, gets none: a restart elsewhere then refuses it, saying so.
pub fn record(uses: &[Use], cache: &mut Cache) -> Vec<FileIdentity> {
    let mut out = Vec::new();
    for u in uses.iter().filter(|u| !u.writable) {
        let Ok(f) = super::file::open_regular(&u.path, false, Some((u.dev, u.ino))) else { continue };
        let Ok(meta) = f.metadata() else { continue };
        let key = (meta.dev(), meta.ino(), meta.len(), (meta.mtime(), meta.mtime_nsec()), (meta.ctime(), meta.ctime_nsec()));
        if let Some(id) = cache.known.get(&key) {
            out.push(id.clone());
            continue;
        }
        match of_file(&f) {
            Ok(id) => {
                cache.known.insert(key, id.clone());
                out.push(id);
            }
            Err(e) => tracing::debug!(path = u.path, "no identity recorded: {e}"),
        }
    }
    out
}

/// This boot's id (/proc/sys/kernel/random/boot_id), or "" where it cannot be read; the value
/// of the test hook `CKPT_TEST_BOOT_ID` where the tests set it (a restart "on another machine"
/// without one).
pub fn boot_id() -> String {
    if let Some(id) = crate::testhooks::var("CKPT_TEST_BOOT_ID").filter(|v| !v.is_empty()) {
        return id;
    }
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Where a restart runs, compared with where its checkpoint was taken.
#[derive(Debug, Clone, Default)]
pub struct Place {
    /// Another boot (of this machine or another): devices are numbered anew.
    elsewhere: bool,
    identities: HashMap<(u64, u64), FileIdentity>,
}

impl Place {
    /// The checkpoint's boot (`boot_id`, "" for an image older than format 21, taken as this
    /// one) against this one, and the identities recorded.
    pub fn of(boot_id: &str, identities: &[FileIdentity]) -> Place {
        let now = self::boot_id();
        let elsewhere = !boot_id.is_empty() && !now.is_empty() && boot_id != now;
        Place { elsewhere, identities: identities.iter().map(|i| ((i.dev, i.ino), i.clone())).collect() }
    }

    /// The boot of the checkpoint itself: device and inode decide (tests, and old images).
    pub fn same_boot() -> Place {
        Place::default()
    }

    /// Another boot, with these identities (tests).
    pub fn another_boot(identities: &[FileIdentity]) -> Place {
        Place { elsewhere: true, identities: identities.iter().map(|i| ((i.dev, i.ino), i.clone())).collect() }
    }

    pub fn is_elsewhere(&self) -> bool {
        self.elsewhere
    }

    /// Whether the contents of the file recorded as `rec` (device, inode) are recorded.
    pub fn knows(&self, rec: (u64, u64)) -> bool {
        self.identities.contains_key(&rec)
    }

    /// Whether a file the job writes (or whose identity alone counts) is the one recorded as
    /// `rec` (device, inode): on the same boot both must be equal; on another, the inode (a file
    /// system both machines share keeps its inodes, not its device number) (pure).
    pub fn same_file(&self, rec: (u64, u64), now: (u64, u64)) -> bool {
        if self.elsewhere {
            rec.1 == now.1
        } else {
            rec == now
        }
    }

    /// [`Place::judge_read_only`] of the file at `path`: on the same boot its `stat` alone (an
    /// executable may be unreadable: mode 0711), elsewhere its contents.
    pub fn judge_path(&self, what: &str, rec: (u64, u64), path: &str) -> Result<(), String> {
        if !self.elsewhere {
            let meta = std::fs::metadata(path).map_err(|e| format!("{what} is gone ({e})"))?;
            return same_inode(what, rec, (meta.dev(), meta.ino()));
        }
        let f = super::file::open_regular(path, false, None).map_err(|e| format!("{what} cannot be opened to compare its contents ({e})"))?;
        self.judge_read_only(what, rec, &f)
    }

    /// Judges a file the job only reads, recorded as `rec` (device, inode), against the open
    /// file `now` at its path. `what` names it in the refusal ("executable", "mapped file",
    /// "file"). On the same boot: the same device and inode. On another: the same contents, as
    /// recorded; without a recorded identity, the same inode.
    pub fn judge_read_only(&self, what: &str, rec: (u64, u64), now: &File) -> Result<(), String> {
        let meta = now.metadata().map_err(|e| format!("{what} cannot be read ({e})"))?;
        let here = (meta.dev(), meta.ino());
        if !self.elsewhere {
            return same_inode(what, rec, here);
        }
        let Some(want) = self.identities.get(&rec) else {
            return if rec.1 == here.1 {
                Ok(())
            } else {
                Err(format!(
                    "{what} is another file here (another boot or machine) and the image records nothing of its contents to compare (taken by a ckpt before format 21, or unreadable at the checkpoint)"
                ))
            };
        };
        let have = of_file(now).map_err(|e| format!("{what} cannot be read to compare its contents ({e})"))?;
        differs(what, want, &have).map_or(Ok(()), Err)
    }
}

/// The checkpoint's boot's rule: the same device and inode, or the refusal in words (pure).
fn same_inode(what: &str, rec: (u64, u64), now: (u64, u64)) -> Result<(), String> {
    if now == rec {
        Ok(())
    } else {
        Err(format!("{what} was replaced by another file (different inode)"))
    }
}

/// What differs between a recorded identity and a file's now, in words (pure); None when they
/// agree.
pub fn differs(what: &str, want: &FileIdentity, have: &FileIdentity) -> Option<String> {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let content = match (&want.content, &have.content) {
        (Content::BuildId(a), Content::BuildId(b)) => {
            (a != b).then(|| format!("{what} is another build: build-id {} at the checkpoint, {} here", hex(a), hex(b)))
        }
        (Content::Blake3(a), Content::Blake3(b)) => (a != b).then(|| format!("{what} has other contents here (BLAKE3 differs)")),
        (Content::BuildId(_), _) => Some(format!("{what} had a build-id at the checkpoint and has none here")),
        (_, Content::BuildId(_)) => Some(format!("{what} is an ELF file with a build-id here and was not at the checkpoint")),
        (Content::NotSummed, _) | (_, Content::NotSummed) => None,
    };
    if content.is_some() {
        return content;
    }
    if want.size != have.size {
        return Some(format!("{what} is {} bytes here, {} at the checkpoint", have.size, want.size));
    }
    if want.mode != have.mode {
        return Some(format!("{what} has mode {:04o} here, {:04o} at the checkpoint", have.mode, want.mode));
    }
    if want.content == Content::NotSummed {
        tracing::warn!("{what}: larger than {} MiB, judged the same by its size and mode alone", MAX_HASHED >> 20);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ino: u64, content: Content) -> FileIdentity {
        FileIdentity { dev: 1, ino, size: 10, mode: 0o755, content }
    }

    /// The build-id read from our own test program is the one the linker wrote (readelf -n).
    #[test]
    fn the_build_id_of_this_test_binary_is_read() {
        let exe = std::env::current_exe().unwrap();
        let f = File::open(&exe).unwrap();
        let got = of_file(&f).unwrap();
        let Content::BuildId(id) = &got.content else { panic!("no build-id read from {}: {:?}", exe.display(), got.content) };
        let out = std::process::Command::new("readelf").arg("-n").arg(&exe).output();
        if let Some(out) = out.ok().filter(|o| o.status.success()) {
            let text = String::from_utf8_lossy(&out.stdout);
            let want = text.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).expect("readelf shows a build-id").trim().to_string();
            assert_eq!(id.iter().map(|x| format!("{x:02x}")).collect::<String>(), want);
        }
        // A file that is not ELF is hashed.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t"), b"#!/bin/sh\necho hi\n").unwrap();
        let t = of_file(&File::open(dir.path().join("t")).unwrap()).unwrap();
        assert!(matches!(t.content, Content::Blake3(_)), "{:?}", t.content);
    }

    #[test]
    fn differences_are_named() {
        let a = id(1, Content::BuildId(vec![1, 2]));
        assert_eq!(differs("executable", &a, &id(9, Content::BuildId(vec![1, 2]))), None);
        let other = differs("executable", &a, &id(9, Content::BuildId(vec![1, 3]))).unwrap();
        assert!(other.contains("build-id 0102 at the checkpoint, 0103 here"), "{other}");
        let bigger = FileIdentity { size: 11, ..id(9, Content::BuildId(vec![1, 2])) };
        assert!(differs("executable", &a, &bigger).unwrap().contains("11 bytes here, 10 at the checkpoint"));
        let h = id(1, Content::Blake3([1; 32]));
        assert!(differs("file", &h, &id(2, Content::Blake3([2; 32]))).unwrap().contains("BLAKE3"));
        let mode = FileIdentity { mode: 0o644, ..id(2, Content::Blake3([1; 32])) };
        assert!(differs("file", &h, &mode).unwrap().contains("mode 0644 here, 0755"));
    }

    /// On another boot, a copy with the same contents is taken and another is refused; on the
    /// same boot the inode decides; a written file's device is not compared elsewhere.
    #[test]
    fn another_boot_judges_by_contents() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        std::fs::write(&a, b"the same bytes").unwrap();
        std::fs::write(&b, b"the same bytes").unwrap();
        std::fs::write(&c, b"other  bytes!!").unwrap();
        let rec = of_file(&File::open(&a).unwrap()).unwrap();
        let key = (rec.dev, rec.ino);
        let elsewhere = Place::another_boot(std::slice::from_ref(&rec));
        assert_eq!(elsewhere.judge_read_only("file", key, &File::open(&b).unwrap()), Ok(()));
        assert!(elsewhere.judge_read_only("file", key, &File::open(&c).unwrap()).unwrap_err().contains("BLAKE3"));
        let here = Place::same_boot();
        assert!(here.judge_read_only("file", key, &File::open(&b).unwrap()).unwrap_err().contains("different inode"));
        assert_eq!(here.judge_read_only("file", key, &File::open(&a).unwrap()), Ok(()));
        assert!(elsewhere.same_file((1, 5), (2, 5)) && !here.same_file((1, 5), (2, 5)));
        let unknown = Place::another_boot(&[]);
        assert!(unknown.judge_read_only("file", key, &File::open(&b).unwrap()).unwrap_err().contains("records nothing"));
    }
}
