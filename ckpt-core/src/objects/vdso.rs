//! The vdso block: the kernel's [vvar] data pages and [vdso] code, placed by the kernel at exec.
//! A restored program keeps pointers into its old vdso (glibc keeps the address of each vdso
//! function it uses, the unwinder reads the vdso's ELF headers at AT_SYSINFO_EHDR).
//!
//! **The same vdso** (the same kernel build): the restarting kernel's block is moved, keeping
//! its parts' relative offsets, to where the old [vdso] was.
//!
//! **Another kernel's vdso** (a restart on another machine or after an upgrade): its functions
//! are at other offsets and read data pages of another layout, so the old code cannot run on
//! the new data and the new code cannot be put where the old was. The new block is parked
//! where both layouts are free; at the old [vdso]'s address goes a proxy, private memory holding
//! the old image (its ELF headers and unwind tables stay valid) with, at each function's entry,
//! a jump to the new vdso's function of the same name (`movabs rax, TARGET; jmp rax`: rax is
//! scratch at a call), or a stub making the function's system call where the new vdso lacks
//! it. The old data pages' place is held by inaccessible memory. A later checkpoint records the
//! proxy as ordinary memory and the parked block as the vdso, so restarts chain. A thread
//! stopped inside the vdso's code is stepped out of it at capture (`capture::step_out_of_vdso`),
//! so no thread resumes inside the old code.

use std::collections::BTreeMap;

use tracing::info;

use crate::error::{Error, Result};
use crate::objects::memory::{Backing, VmaRecord};
use crate::objects::thread::ThreadRecord;
use crate::procfs::{MMapPath, MemoryMap};
use crate::ptrace::RemoteTask;

/// Whether a mapping is one of the kernel's vdso data pages ([vvar], [vvar_vclock], ...), and
/// which: procfs reports the name without brackets.
pub fn vdso_data_name(path: &MMapPath) -> Option<String> {
    match path {
        MMapPath::Vvar => Some("vvar".into()),
        MMapPath::Other(n) if n.trim_matches(['[', ']']).starts_with("vvar") => Some(n.trim_matches(['[', ']']).to_string()),
        _ => None,
    }
}

/// Whether a mapping belongs to the kernel's vdso block (code or data).
pub fn is_vdso_block(path: &MMapPath) -> bool {
    matches!(path, MMapPath::Vdso) || vdso_data_name(path).is_some()
}

/// The parts of the current kernel's vdso block in a process, as (start, end, is_code).
pub fn current_block(maps: &[MemoryMap]) -> Vec<(u64, u64, bool)> {
    maps.iter().filter(|m| is_vdso_block(&m.pathname)).map(|m| (m.address.0, m.address.1, matches!(m.pathname, MMapPath::Vdso))).collect()
}

/// Moves the block, or parks it and puts the proxy in place (see the module's comment). `temp`
/// is a free address (in both the current and the image's layout) with room for the whole
/// block: a stepping stone so that no move overlaps another part, and the proxy's parking place.
/// `threads` are the process's, whose registers say where each resumes.
pub fn restore(task: &mut RemoteTask, image: &[VmaRecord], threads: &[ThreadRecord], maps: &[MemoryMap], temp: u64) -> Result<()> {
    let block = current_block(maps);
    let Some(&(cur_code, cur_code_end, _)) = block.iter().find(|b| b.2) else {
        return Err(Error::Other("the restoring process has no vdso".into()));
    };
    let Some((old_code, code)) = image.iter().find_map(|v| match &v.backing {
        Backing::Vdso { code } => Some((v.start, code)),
        _ => None,
    }) else {
        // The program ran without a vdso: take ours away too.
        for (start, end, _) in block {
            task.syscall("munmap", libc::SYS_munmap, &[start, end - start])?;
        }
        return Ok(());
    };
    let current = task.get(cur_code, (cur_code_end - cur_code) as usize)?;
    if current != *code || proxy_forced() {
        refuse_threads_inside(threads, old_code, code.len() as u64)?;
        return proxy(task, image, &block, (cur_code, &current), (old_code, code), temp);
    }
    if old_code == cur_code {
        return Ok(());
    }
    let block_start = block.iter().map(|b| b.0).min().unwrap_or(cur_code);
    let moves: Vec<(u64, u64, u64)> = block.iter().map(|&(s, e, _)| (s, e.saturating_sub(s), s.saturating_sub(block_start))).collect();
    // The old vdso's address comes from the image: the block must fit below and above it.
    let block_end = block.iter().map(|b| b.1).max().unwrap_or(cur_code_end);
    let new_block_start = old_code
        .checked_sub(cur_code.saturating_sub(block_start))
        .filter(|s| s.checked_add(block_end.saturating_sub(block_start)).is_some_and(|e| e <= super::memory::USER_SPACE_END))
        .ok_or_else(|| Error::Forged { what: format!("the vdso block cannot be moved to {old_code:#x}: it does not fit there") })?;
    for &(s, len, rel) in &moves {
        mremap(task, s, len, temp + rel)?;
    }
    for &(_, len, rel) in &moves {
        mremap(task, temp + rel, len, new_block_start + rel)?;
    }
    Ok(())
}

fn mremap(task: &mut RemoteTask, from: u64, len: u64, to: u64) -> Result<()> {
    task.syscall("mremap", libc::SYS_mremap, &[from, len, len, (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64, to])
        .map_err(|e| Error::Other(format!("move vdso part {from:#x}+{len:#x} to {to:#x}: {e}")))?;
    Ok(())
}

/// Test hook: `CKPT_TEST_VDSO=proxy` in the restart's environment puts the proxy in place even
/// where the vdso is the same, so that the other kernel's path runs on one kernel.
fn proxy_forced() -> bool {
    crate::testhooks::var("CKPT_TEST_VDSO").is_some_and(|v| v == "proxy")
}

/// A thread that would resume inside the old vdso's code, outside a system call, would run the
/// old code on data pages that are not there: refused. The capture steps threads out of the vdso;
/// only a thread of a stopped process (SIGSTOP), or one of an image of an older ckpt, is left
/// there. One in a system call returns into the old code, which is kept.
fn refuse_threads_inside(threads: &[ThreadRecord], old_code: u64, len: u64) -> Result<()> {
    match threads.iter().find(|t| (old_code..old_code + len).contains(&t.regs.rip) && (t.regs.orig_rax as i64) < 0) {
        Some(t) => Err(Error::Other(format!(
            "thread {} stopped inside the vdso (at {:#x}) and this kernel's vdso differs from the one it ran with: restart on the kernel that took the checkpoint, or checkpoint the job again while it runs",
            t.tid, t.regs.rip
        ))),
        None => Ok(()),
    }
}

/// Parks the current block at `temp` and puts the proxy of the old vdso at its old address
/// (see the module's comment).
fn proxy(
    task: &mut RemoteTask,
    image: &[VmaRecord],
    block: &[(u64, u64, bool)],
    (cur_code, current): (u64, &[u8]),
    (old_code, old): (u64, &[u8]),
    temp: u64,
) -> Result<()> {
    let block_start = block.iter().map(|b| b.0).min().unwrap_or(cur_code);
    for &(s, e, _) in block {
        mremap(task, s, e - s, temp + (s - block_start))?;
    }
    let parked = temp + (cur_code - block_start);
    let old_entries = entries(old).map_err(|e| Error::Forged { what: format!("the job's vdso, in the image: {e}") })?;
    let new_entries = entries(current).map_err(|e| Error::Other(format!("this kernel's vdso: {e}")))?;
    let patches = proxy_patches(&old_entries, old.len() as u64, &new_entries, parked)?;

    let len = (old.len() as u64).div_ceil(crate::PAGE_SIZE) * crate::PAGE_SIZE;
    map_fixed(task, old_code, len, libc::PROT_READ | libc::PROT_WRITE, "the proxy of the job's vdso")?;
    task.mem.write_all(old_code, old)?;
    for (offset, bytes) in &patches {
        task.mem.write_all(old_code + offset, bytes)?;
    }
    task.syscall("mprotect", libc::SYS_mprotect, &[old_code, len, (libc::PROT_READ | libc::PROT_EXEC) as u64])?;
    // Nothing may land where the old data pages were: the old code read them at fixed offsets.
    for v in image.iter().filter(|v| matches!(v.backing, Backing::VdsoData { .. })) {
        map_fixed(task, v.start, v.end - v.start, libc::PROT_NONE, "the place of the job's vdso data")?;
    }
    info!(
        functions = patches.len(),
        old = format_args!("{old_code:#x}"),
        parked = format_args!("{parked:#x}"),
        "this kernel's vdso differs from the job's: the job's vdso functions are reached through jumps at their old place"
    );
    Ok(())
}

/// Private anonymous memory at exactly `[at, at+len)`, which must be free.
fn map_fixed(task: &mut RemoteTask, at: u64, len: u64, prot: i32, what: &str) -> Result<()> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    let got = task
        .syscall("mmap", libc::SYS_mmap, &[at, len, prot as u64, flags as u64, u64::MAX, 0])
        .map_err(|e| Error::Other(format!("map {what} at {at:#x}+{len:#x}: {e}")))?;
    if got != at {
        return Err(Error::Other(format!("map {what} at {at:#x}: the kernel placed it at {got:#x}")));
    }
    Ok(())
}

/// A function a vdso image exports: its name and the offset of its first instruction in the
/// image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub offset: u64,
}

/// The functions a vdso image (the bytes of a [vdso] mapping: an ELF shared object) exports:
/// its defined dynamic symbols of type FUNC.
pub fn entries(image: &[u8]) -> std::result::Result<Vec<Entry>, String> {
    use goblin::elf::{program_header::PT_LOAD, sym::STT_FUNC, Elf};
    let elf = Elf::parse(image).map_err(|e| format!("not an ELF image: {e}"))?;
    let mut out = Vec::new();
    for sym in elf.dynsyms.iter().filter(|s| s.st_type() == STT_FUNC && s.st_shndx != 0) {
        let name = elf.dynstrtab.get_at(sym.st_name).ok_or("a symbol without a name")?;
        // Symbol values are addresses as linked: the image offset is through the load segment.
        let offset = elf
            .program_headers
            .iter()
            .find(|ph| ph.p_type == PT_LOAD && ph.p_vaddr <= sym.st_value && sym.st_value < ph.p_vaddr + ph.p_memsz)
            .map(|ph| sym.st_value - ph.p_vaddr + ph.p_offset)
            .filter(|&o| o < image.len() as u64)
            .ok_or_else(|| format!("{name} lies outside the image"))?;
        out.push(Entry { name: name.to_string(), offset });
    }
    if out.is_empty() {
        return Err("it exports no function".into());
    }
    Ok(out)
}

/// `movabs rax, to; jmp rax`.
const JUMP_LEN: u64 = 12;

fn jump_to(to: u64) -> Vec<u8> {
    let mut b = vec![0x48, 0xb8];
    b.extend_from_slice(&to.to_le_bytes());
    b.extend_from_slice(&[0xff, 0xe0]);
    b
}

/// `mov eax, nr; syscall; ret`: the call the vdso function answers without entering the
/// kernel, made by entering it (its arguments are the system call's, in the same registers).
/// `mov rax, -ENOSYS; ret` for a function that has no system call of its own.
fn stub_for(name: &str) -> Vec<u8> {
    let nr = match name.trim_start_matches("__vdso_") {
        "clock_gettime" => Some(libc::SYS_clock_gettime),
        "clock_getres" => Some(libc::SYS_clock_getres),
        "gettimeofday" => Some(libc::SYS_gettimeofday),
        "time" => Some(libc::SYS_time),
        "getcpu" => Some(libc::SYS_getcpu),
        _ => None,
    };
    match nr {
        Some(nr) => {
            let mut b = vec![0xb8];
            b.extend_from_slice(&(nr as u32).to_le_bytes());
            b.extend_from_slice(&[0x0f, 0x05, 0xc3]);
            b
        }
        None => vec![0x48, 0xc7, 0xc0, 0xda, 0xff, 0xff, 0xff, 0xc3],
    }
}

/// What the proxy writes at each old entry (offset in the old image, bytes), for a new vdso
/// whose code is at `new_base`. An entry gets a jump to the new function of any of its names
/// (a function and its aliases share an entry), else a stub. Refused when a function is too
/// short to hold the jump without running into the next entry. Pure.
pub fn proxy_patches(old: &[Entry], old_len: u64, new: &[Entry], new_base: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut by_offset: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for e in old {
        by_offset.entry(e.offset).or_default().push(&e.name);
    }
    let offsets: Vec<u64> = by_offset.keys().copied().collect();
    let mut patches = Vec::new();
    for (i, (&offset, names)) in by_offset.iter().enumerate() {
        let room = offsets.get(i + 1).copied().unwrap_or(old_len).saturating_sub(offset);
        let target = names.iter().find_map(|n| new.iter().find(|e| e.name == *n));
        let bytes = match target {
            Some(t) => jump_to(new_base + t.offset),
            None => stub_for(names.iter().find(|n| n.starts_with("__vdso_")).unwrap_or(&names[0])),
        };
        if room < bytes.len() as u64 {
            return Err(Error::Other(format!(
                "the job's vdso function {} is {room} bytes long, too short for the jump to this kernel's ({JUMP_LEN} bytes): restart on a kernel of the same version",
                names.join("/")
            )));
        }
        patches.push((offset, bytes));
    }
    Ok(patches)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of this process's own vdso.
    fn own_vdso() -> Vec<u8> {
        let maps = crate::procfs::maps(std::process::id() as i32).unwrap();
        let v = maps.iter().find(|m| matches!(m.pathname, MMapPath::Vdso)).expect("this process has a vdso");
        let mut code = vec![0u8; (v.address.1 - v.address.0) as usize];
        crate::ptrace::remote_mem::ProcMem::open(std::process::id() as i32).unwrap().read_exact(v.address.0, &mut code).unwrap();
        code
    }

    #[test]
    fn this_kernels_vdso_functions_are_read() {
        let e = entries(&own_vdso()).unwrap();
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        for f in ["__vdso_clock_gettime", "__vdso_gettimeofday", "__vdso_time", "__vdso_getcpu"] {
            assert!(names.contains(&f), "{f} missing from {names:?}");
        }
        // An alias shares its function's entry.
        let at = |n: &str| e.iter().find(|e| e.name == n).map(|e| e.offset);
        assert_eq!(at("clock_gettime"), at("__vdso_clock_gettime"));
        assert!(entries(b"not an elf image at all").is_err());
    }

    #[test]
    fn each_old_entry_jumps_to_the_new_function_of_its_name() {
        let old = [
            Entry { name: "__vdso_clock_gettime".into(), offset: 0x800 },
            Entry { name: "clock_gettime".into(), offset: 0x800 },
            Entry { name: "__vdso_time".into(), offset: 0x900 },
            Entry { name: "__vdso_getrandom".into(), offset: 0xa00 },
        ];
        let new = [Entry { name: "__vdso_time".into(), offset: 0x650 }, Entry { name: "clock_gettime".into(), offset: 0x700 }];
        let p = proxy_patches(&old, 0x2000, &new, 0x7f00_0000_1000).unwrap();
        assert_eq!(p.len(), 3, "one patch per entry, aliases together: {p:?}");
        assert_eq!(p[0], (0x800, vec![0x48, 0xb8, 0x00, 0x17, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0xff, 0xe0]));
        assert_eq!(p[1].1, jump_to(0x7f00_0000_1650));
        // Lacking in the new vdso, without a system call of its own: -ENOSYS.
        assert_eq!(p[2].1, vec![0x48, 0xc7, 0xc0, 0xda, 0xff, 0xff, 0xff, 0xc3]);
    }

    #[test]
    fn a_missing_function_makes_its_system_call() {
        let old = [Entry { name: "__vdso_getcpu".into(), offset: 0x100 }];
        let p = proxy_patches(&old, 0x1000, &[], 0).unwrap();
        assert_eq!(p[0].1, vec![0xb8, libc::SYS_getcpu as u8, 0x01, 0, 0, 0x0f, 0x05, 0xc3]);
    }

    #[test]
    fn a_function_too_short_for_the_jump_is_refused_by_name() {
        let old = [Entry { name: "__vdso_time".into(), offset: 0x100 }, Entry { name: "__vdso_getcpu".into(), offset: 0x108 }];
        let new = [Entry { name: "__vdso_time".into(), offset: 0x100 }, Entry { name: "__vdso_getcpu".into(), offset: 0x200 }];
        let e = proxy_patches(&old, 0x1000, &new, 0).unwrap_err().to_string();
        assert!(e.contains("__vdso_time") && e.contains("8 bytes"), "{e}");
    }
}
