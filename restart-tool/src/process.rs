//! Rebuilding one process from the inside, in the order the kernel objects depend on each other.

use std::sync::atomic::AtomicU64;

use ckpt_core::fsid::{self, FsIdentity};
use ckpt_core::image::StreamReader;
use ckpt_core::objects::memory::{self, VmaRecord};
use ckpt_core::objects::user_namespaces::Numbering;
use ckpt_core::objects::{creds, descriptor, fd, fown, memattrs, process as attrs, sched, seccomp, signals, thread, vdso, ProcessRecord};
use ckpt_core::procfs::{self, MMapPath};
use ckpt_core::ptrace::{batch, sys, Injector, RemoteTask, StopKind, Tid};
use ckpt_core::{Error, Result, PAGE_SIZE};

use crate::tracees::Tracees;
use crate::tree::{clone_args, restorer_area, PidSetter, SEARCH_FROM};
use crate::ReadyThread;

const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND | libc::CLONE_THREAD | libc::CLONE_SYSVSEM) as u64;

/// Where the batch runner goes in the restorer's area: after the `syscall` instruction at its
/// start, in the same page (`tree::prepare_root`).
const RUNNER_OFFSET: u64 = 64;

#[allow(clippy::too_many_arguments)] // each is a separate piece of the restart's state
/// Rebuilds one created process (see [`crate::tree::create`]) from its record and stream.
pub fn rebuild(
    rec: &ProcessRecord,
    task: &mut RemoteTask,
    (reader, earlier): (&mut StreamReader, &mut std::collections::BTreeMap<u64, StreamReader>),
    fds: &mut descriptor::RestoreCtx,
    mem: &memory::MemRestoreCtx,
    tracees: &mut Tracees,
    progress: &AtomicU64,
    (files_as, numbering): (Option<&FsIdentity>, Numbering),
    lazy: Option<&ckpt_core::lazy::PageServer>,
    mut pid_setter: Option<&mut PidSetter>,
) -> Result<(Vec<ReadyThread>, u64)> {
    let host_pid = task.pid;
    let (area, _) = restorer_area(task);
    let maps = procfs::maps(host_pid)?;

    // Room to move the vdso block through, free in both layouts.
    let mut occupied: Vec<(u64, u64)> = maps.iter().map(|m| m.address).collect();
    occupied.extend(rec.vmas.iter().map(|v| (v.start, v.end)));
    let block_len: u64 = vdso::current_block(&maps).iter().map(|b| b.1 - b.0).sum::<u64>() + 16 * PAGE_SIZE;
    let vdso_temp =
        memory::find_gap(&occupied, block_len, SEARCH_FROM).ok_or_else(|| Error::Other("no free room in the address space to move the vdso".into()))?;

    // Drop everything the empty process inherited, except the kernel's vdso block.
    let keep = |m: &procfs::MemoryMap| m.address.0 == area || matches!(m.pathname, MMapPath::Vsyscall) || vdso::is_vdso_block(&m.pathname);
    // One munmap per stretch between mappings kept (the restorer's 30-odd mappings are two or
    // three stretches: an injected call each, not one per mapping).
    for (start, end) in stretches_to_drop(&maps, keep) {
        task.syscall("munmap", libc::SYS_munmap, &[start, end - start])?;
    }
    vdso::restore(task, &rec.vmas, &rec.threads, &maps, vdso_temp)?;

    // (The in-memory files the image holds are written already: `restore`.)
    let keep_base = descriptor::keeping_base(task, &rec.fds)?;
    // The files the process maps and reopens, with its own file rights (see ckpt_core::fsid),
    // as its user namespace numbers them.
    let acting = {
        let (inj, scratch) = task.split();
        fsid::act_as_remote(files_as.map(|id| id.numbered(numbering)).as_ref(), inj, scratch)?
    };
    fds.files_rights = acting.clone().map(|rights| fsid::RemoteRights { elsewhere: fds.elsewhere, ..rights });
    // The batch runner, in the restorer's area after its `syscall` instruction: the mappings
    // are made a batch at a time (where SIGTRAP is free for its breakpoint: `batch`).
    let runner = if batch::trap_is_free(host_pid)? { Some(batch::Runner::write_at(&task.mem, area + RUNNER_OFFSET)?) } else { None };
    memory::map_all(task, rec.pid, &rec.vmas, mem, fds, keep_base, 0, runner.as_ref())?;
    // Before the pages are written: a MADV_HUGEPAGE range fills with huge pages.
    memattrs::advise(task, rec.pid, &rec.vmas)?;
    let filling = std::time::Instant::now();
    let bytes = memory::fill(task, &rec.vmas, mem, reader, earlier, progress, lazy)?;
    tracing::info!(pid = rec.pid, bytes, ms = filling.elapsed().as_millis() as u64, "memory filled");
    memory::restore_guards(task, rec.pid, &rec.vmas)?;
    check_layout(host_pid, &rec.vmas)?;

    fds.saved_files = rec.saved_files.iter().map(|s| ((s.dev, s.ino), s.clone())).collect();
    attrs::restore_attrs(&rec.attrs, task, (rec.pid, 0, keep_base), fds, reader)?;
    // While the process has one thread: registering is cheaper then.
    memattrs::restore_membarrier(task, rec.pid, &rec.mem_attrs.membarrier)?;
    {
        let (inj, scratch) = task.split();
        signals::restore(&rec.signals, rec.pid, inj, scratch, runner.as_ref())?;
    }
    fds.had_admin = rec.threads.iter().find(|t| t.tid == rec.pid).is_none_or(|t| t.creds.caps.effective & creds::CAP_SYS_ADMIN != 0);
    fd::restore(task, rec.pid, &rec.fds, fds, 0, reader)?;
    attrs::share_removed_cwd(&rec.attrs, &rec.fds, task)?;
    fds.files_rights = None;
    {
        let (inj, scratch) = task.split();
        fsid::end_remote(acting, inj, scratch)?;
    }
    attrs::restore_loginuid(&rec.attrs, task, 0)?;

    // Threads: the main thread is this task; the others are cloned from it with their tids,
    // chosen by clone3 in the job's user namespace, or by the pid setter in one the job made
    // (see crate::tree::pid_setter).
    let (scratch_addr, scratch_len) = task.scratch();
    let mut ready = Vec::new();
    let mut others: Vec<(Tid, Injector)> = Vec::new();
    let nested = !matches!(numbering, Numbering::Machine);
    for t in rec.threads.iter().filter(|t| t.tid != rec.pid) {
        let set_tid = if nested {
            let setter = pid_setter
                .as_deref_mut()
                .ok_or_else(|| Error::Bug(format!("thread {} in a user namespace the job made, and nothing to give it its id", t.tid)))?;
            setter.next_id_is(t.tid)?;
            None
        } else {
            task.put(256, &t.tid.to_le_bytes())?;
            Some(task.scratch_at(256))
        };
        let args = clone_args(THREAD_CLONE_FLAGS, 0, set_tid);
        let args_addr = task.put(0, &args)?;
        task.syscall("clone3", libc::SYS_clone3, &[args_addr, args.len() as u64])
            .map_err(|e| Error::Other(format!("create thread {}: {e} (is the tid taken?)", t.tid)))?;
        let new = task.main.take_new_tasks();
        let &[host_tid] = new.as_slice() else {
            return Err(Error::Other(format!("creating thread {} reported {} new threads", t.tid, new.len())));
        };
        tracees.add(host_pid, host_tid);
        wait_event_stop(host_tid)?;
        sys::set_sigmask(host_tid, !0)?;
        others.push((host_tid, Injector::new(host_tid, area)?));
    }
    for t in &rec.threads {
        let (host_tid, inj) = if t.tid == rec.pid {
            (host_pid, &mut task.main)
        } else {
            let (h, inj) = others
                .iter_mut()
                .find(|(h, _)| procfs::ns_tid(*h).ok() == Some(t.tid))
                .ok_or_else(|| Error::Other(format!("thread {} was created with another tid", t.tid)))?;
            (*h, inj)
        };
        let view = ckpt_core::ptrace::Scratch { mem: &task.mem, addr: scratch_addr, len: scratch_len };
        thread::restore_inside(t, host_tid, inj, view, fds.cpu.as_ref())?;
        signals::restore_thread_pending(&t.pending, rec.pid, t.tid, inj, view)?;
        ready.push(ReadyThread { host_tid, regs: t.regs.with_restart_resolved(false), sigmask: t.sigmask });
    }
    // POSIX timers last: one may signal a thread created just above.
    ckpt_core::objects::posix_timer::restore(task, rec.pid, &rec.posix_timers, 0)?;

    Ok((ready, bytes))
}

/// The address ranges that cover every mapping of `maps` (in address order) not to `keep`, and
/// no mapping to keep: each from the first mapping to drop after a kept one (or the start) to
/// the end of the last before the next kept one. Pure.
fn stretches_to_drop(maps: &[procfs::MemoryMap], keep: impl Fn(&procfs::MemoryMap) -> bool) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut open = false;
    for m in maps {
        if keep(m) {
            open = false;
            continue;
        }
        match out.last_mut() {
            Some(last) if open => last.1 = m.address.1,
            _ => out.push(m.address),
        }
        open = true;
    }
    out
}

/// The last steps, once every process of the node is rebuilt: limits, locked memory,
/// credentials and scheduling, its descriptors' owners (`owners_done`: the open file
/// descriptions given theirs already), and the scratch page goes.
/// The main thread stops at the exit of that munmap and never executes the (now unmapped)
/// instruction after it; its registers are replaced at release.
pub fn finish(rec: &ProcessRecord, task: &mut RemoteTask, numbering: Numbering, owners_done: &mut std::collections::HashSet<u32>) -> Result<()> {
    attrs::restore_rlimits(&rec.attrs, task.pid, attrs::LimitsNow::AllButDescriptors)?;
    // Locks: with the job's RLIMIT_MEMLOCK, before the credentials (a root job may lock beyond
    // it with CAP_IPC_LOCK), after everything the restorer maps in the process.
    memattrs::restore_locks(task, rec.pid, &rec.vmas, &rec.mem_attrs, memattrs::memlock_limit(&rec.attrs.rlimits))?;
    attrs::restore_oom_score_adj(&rec.attrs, task.pid)?;
    attrs::restore_root(&rec.attrs, task, 0)?;
    // After the last mapping the restorer makes in the process (the locks' above).
    attrs::restore_mdwe(&rec.attrs, task)?;
    let (area, len) = restorer_area(task);
    let host_pid = task.pid;
    // The seccomp sandboxes before the credentials (installing a filter needs what the restorer
    // has until then), suspended until the release for the restorer's calls after.
    // Each thread's own, where they do not all share one.
    let mut per_thread = None;
    if let Some(sandbox) = &rec.seccomp {
        seccomp::suspend(host_pid, crate::tree::SEIZE_OPTIONS)?;
        let tids: Vec<Tid> = rec.threads.iter().map(|t| t.tid).collect();
        match seccomp::shared_chain(sandbox, &tids) {
            Some(chain) => {
                let (inj, scratch) = task.split();
                seccomp::restore_shared(chain, inj, scratch)?;
            }
            None => per_thread = Some(sandbox),
        }
    }
    let sandbox_of = |tid: Tid| per_thread?.threads.iter().find(|(t, _)| *t == tid).map(|(_, mode)| mode);
    // The descriptor limit after the restorer's last open in the process, before the
    // credentials (a process of another user's limits are the restorer's to set only so long).
    attrs::restore_rlimits(&rec.attrs, host_pid, attrs::LimitsNow::DescriptorsOnly)?;
    // Credentials last of all: every injected call before needed the restorer's.
    for host_tid in procfs::tasks(host_pid)? {
        let ns_tid = procfs::ns_tid(host_tid)?;
        let t = rec.threads.iter().find(|t| t.tid == ns_tid).ok_or_else(|| Error::Other(format!("thread {ns_tid} is not in the image")))?;
        if host_tid == host_pid {
            let (inj, scratch) = task.split();
            if let Some(mode) = sandbox_of(ns_tid) {
                seccomp::restore_thread(mode, inj, scratch)?;
            }
            creds::restore_last(&t.creds, host_pid, host_tid, inj, scratch, numbering)?;
            sched::restore_last(&t.sched, host_tid, inj)?;
        } else {
            let mut inj = Injector::new(host_tid, area)?;
            if let Some(mode) = sandbox_of(ns_tid) {
                seccomp::restore_thread(mode, &mut inj, task.scratch_view())?;
            }
            creds::restore_last(&t.creds, host_pid, host_tid, &mut inj, task.scratch_view(), numbering)?;
            sched::restore_last(&t.sched, host_tid, &mut inj)?;
            // The release writes the thread's registers.
            inj.abandon();
        }
    }
    // With the process's own credentials, which the kernel keeps with each owner.
    fown::restore(task, &rec.fds, owners_done)?;
    task.syscall("munmap", libc::SYS_munmap, &[area, len])?;
    Ok(())
}

fn wait_event_stop(tid: Tid) -> Result<()> {
    loop {
        match sys::wait(tid)? {
            StopKind::EventStop(_) => return Ok(()),
            StopKind::Signal(_) => sys::resume(tid, 0)?,
            StopKind::Exited(_) | StopKind::Killed(_) => return Err(Error::Other(format!("task {tid} died before it could be restored"))),
            _ => sys::resume(tid, 0)?,
        }
    }
}

/// After mapping, the process's layout must be the image's (adjacent VMAs may have merged).
fn check_layout(host_pid: Tid, vmas: &[VmaRecord]) -> Result<()> {
    let maps = procfs::maps(host_pid)?;
    for v in vmas.iter().filter(|v| !matches!(v.backing, memory::Backing::Vsyscall)) {
        let covered = maps.iter().any(|m| m.address.0 <= v.start && v.end <= m.address.1);
        if !covered {
            return Err(Error::Other(format!("mapping {:#x}-{:#x} ({}) could not be recreated", v.start, v.end, v.backing_name())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_to_drop_are_unmapped_in_stretches_around_those_kept() {
        let text = "\
55d0a0000000-55d0a0001000 r--p 00000000 fd:00 10 /usr/bin/ckpt
55d0a0001000-55d0a0200000 r-xp 00001000 fd:00 10 /usr/bin/ckpt
55d0a1000000-55d0a1021000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000002000 rw-p 00000000 00:00 0 \n\
7f0000010000-7f0000011000 rw-p 00000000 00:00 0 \n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
7ffd00100000-7ffd00104000 r--p 00000000 00:00 0 [vvar]
7ffd00104000-7ffd00106000 r-xp 00000000 00:00 0 [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";
        let maps = procfs::parse_maps(text).unwrap();
        // The restorer's area is the second anonymous mapping.
        let keep = |m: &procfs::MemoryMap| m.address.0 == 0x7f00_0001_0000 || matches!(m.pathname, MMapPath::Vsyscall | MMapPath::Vdso | MMapPath::Vvar);
        assert_eq!(stretches_to_drop(&maps, keep), vec![(0x55d0_a000_0000, 0x7f00_0000_2000), (0x7ffd_0000_0000, 0x7ffd_0002_1000)]);
        // Nothing kept: one stretch; everything kept: none.
        assert_eq!(stretches_to_drop(&maps, |_| false), vec![(0x55d0_a000_0000, 0xffff_ffff_ff60_1000)]);
        assert!(stretches_to_drop(&maps, |_| true).is_empty());
    }
}
