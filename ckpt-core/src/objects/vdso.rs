//! The vdso block: the kernel's [vvar] data pages and [vdso] code, placed by the kernel at exec.
//! A restored program keeps pointers into its old vdso, so the restarting kernel's block is moved
//! (keeping its parts' relative offsets) to where the old [vdso] was.

use crate::error::{Error, Result};
use crate::objects::memory::{Backing, VmaRecord};
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
    maps.iter()
        .filter(|m| is_vdso_block(&m.pathname))
        .map(|m| (m.address.0, m.address.1, matches!(m.pathname, MMapPath::Vdso)))
        .collect()
}

/// Moves the block. `temp` is a free address (in both the current and the image's layout) with
/// room for the whole block, used as a stepping stone so that no move overlaps another part.
pub fn restore(task: &mut RemoteTask, image: &[VmaRecord], maps: &[MemoryMap], temp: u64) -> Result<()> {
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
    if current != *code {
        return Err(Error::Other(
            "the vdso of this kernel differs from the one the job ran with; restart on the kernel that took the checkpoint".into(),
        ));
    }
    if old_code == cur_code {
        return Ok(());
    }
    let block_start = block.iter().map(|b| b.0).min().unwrap_or(cur_code);
    let moves: Vec<(u64, u64, u64)> = block
        .iter()
        .map(|&(s, e, _)| (s, e.saturating_sub(s), s.saturating_sub(block_start)))
        .collect();
    // The old vdso's address comes from the image: the block must fit below and above it.
    let block_end = block.iter().map(|b| b.1).max().unwrap_or(cur_code_end);
    let new_block_start = old_code
        .checked_sub(cur_code.saturating_sub(block_start))
        .filter(|s| s.checked_add(block_end.saturating_sub(block_start)).is_some_and(|e| e <= super::memory::USER_SPACE_END))
        .ok_or_else(|| {
            Error::Forged { what: format!("the vdso block cannot be moved to {old_code:#x}: it does not fit there") }
        })?;
    for &(s, len, rel) in &moves {
        mremap(task, s, len, temp + rel)?;
    }
    for &(_, len, rel) in &moves {
        mremap(task, temp + rel, len, new_block_start + rel)?;
    }
    Ok(())
}

fn mremap(task: &mut RemoteTask, from: u64, len: u64, to: u64) -> Result<()> {
    task.syscall(
        "mremap",
        libc::SYS_mremap,
        &[from, len, len, (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64, to],
    )
    .map_err(|e| Error::Other(format!("move vdso part {from:#x}+{len:#x} to {to:#x}: {e}")))?;
    Ok(())
}
