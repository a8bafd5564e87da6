//! System V IPC (svipc(7)): shared memory segments, semaphore sets and message queues, in the
//! calling thread's IPC namespace. Hand-written: neither nix nor rustix has these calls, and
//! the crates that do wrap the shared memory part only, for programs that make their own
//! segments, not for reading and making ones by id and key as a restart must.

use std::io;

use super::check;

pub use libc::{ipc_perm, msqid_ds, semid_ds, shmid_ds};

/// A segment's mode bit: removed (IPC_RMID) while still attached.
pub const SHM_DEST: u32 = 0o1000;
/// msgrcv: read the message at an index without taking it (Linux 3.8, CONFIG_CHECKPOINT_RESTORE).
const MSG_COPY: i32 = 0o40000;

/// shmget(2).
pub fn shm_get(key: i32, size: usize, flags: i32) -> io::Result<i32> {
    // SAFETY: no pointer is passed.
    check(unsafe { libc::shmget(key, size, flags) })
}

/// shmctl(IPC_STAT): the segment's state.
pub fn shm_stat(id: i32) -> io::Result<shmid_ds> {
    // SAFETY: an all-zero shmid_ds is a valid value; IPC_STAT fills it.
    let mut ds: shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is a valid out-pointer of the type IPC_STAT writes.
    check(unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) })?;
    Ok(ds)
}

/// shmctl(IPC_SET): the owner and mode of `ds.shm_perm`.
pub fn shm_set(id: i32, ds: &shmid_ds) -> io::Result<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET reads the shmid_ds it is given.
    check(unsafe { libc::shmctl(id, libc::IPC_SET, &mut ds) }).map(drop)
}

/// shmctl(IPC_RMID): removes the segment once no process has it attached.
pub fn shm_remove(id: i32) -> io::Result<()> {
    // SAFETY: IPC_RMID takes no buffer.
    check(unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) }).map(drop)
}

/// A segment attached to this process (shmat) for as long as the value lives.
pub struct Attached {
    at: *mut u8,
    len: usize,
    writable: bool,
}

impl Attached {
    /// Attaches segment `id` where the kernel chooses, read-only unless `writable`; the whole
    /// segment, whose size is asked of the kernel.
    pub fn new(id: i32, writable: bool) -> io::Result<Attached> {
        let len = shm_stat(id)?.shm_segsz;
        let flags = if writable { 0 } else { libc::SHM_RDONLY };
        // SAFETY: the kernel chooses the address; nothing of ours is mapped over.
        let at = unsafe { libc::shmat(id, std::ptr::null(), flags) };
        if at as isize == -1 {
            return Err(super::last_error());
        }
        Ok(Attached { at: at.cast(), len, writable })
    }

    /// The segment's bytes. The processes that share the segment are stopped while ckpt reads
    /// or fills it (the job is frozen, or not made yet).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the segment is mapped readable for `len` bytes (its size, which cannot
        // shrink while it exists) at `at` until Drop.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }

    /// The segment's bytes, to fill (attached writable).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.writable, "a segment attached read-only is not written");
        // SAFETY: as in `bytes`, mapped writable, and borrowed mutably once through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // SAFETY: `at` is what shmat returned, detached once.
        unsafe { libc::shmdt(self.at.cast()) };
    }
}

/// semget(2).
pub fn sem_get(key: i32, count: i32, flags: i32) -> io::Result<i32> {
    // SAFETY: no pointer is passed.
    check(unsafe { libc::semget(key, count, flags) })
}

/// semctl(IPC_STAT): the set's state.
pub fn sem_stat(id: i32) -> io::Result<semid_ds> {
    // SAFETY: an all-zero semid_ds is a valid value; IPC_STAT fills it.
    let mut ds: semid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT takes a pointer to a semid_ds.
    check(unsafe { libc::semctl(id, 0, libc::IPC_STAT, &mut ds as *mut semid_ds) })?;
    Ok(ds)
}

/// semctl(IPC_SET): the owner and mode of `ds.sem_perm`.
pub fn sem_set(id: i32, ds: &semid_ds) -> io::Result<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET reads the semid_ds it is given.
    check(unsafe { libc::semctl(id, 0, libc::IPC_SET, &mut ds as *mut semid_ds) }).map(drop)
}

/// semctl(GETALL): every semaphore's value.
pub fn sem_values(id: i32) -> io::Result<Vec<u16>> {
    let mut values = vec![0u16; sem_stat(id)?.sem_nsems as usize];
    // SAFETY: GETALL writes sem_nsems unsigned shorts, which `values` holds.
    check(unsafe { libc::semctl(id, 0, libc::GETALL, values.as_mut_ptr()) })?;
    Ok(values)
}

/// semctl(SETALL): every semaphore's value; `values` must hold one for each (EINVAL if not).
pub fn set_sem_values(id: i32, values: &[u16]) -> io::Result<()> {
    if values.len() != sem_stat(id)?.sem_nsems as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: SETALL reads sem_nsems unsigned shorts, which `values` holds.
    check(unsafe { libc::semctl(id, 0, libc::SETALL, values.as_ptr()) }).map(drop)
}

/// msgget(2).
pub fn msg_get(key: i32, flags: i32) -> io::Result<i32> {
    // SAFETY: no pointer is passed.
    check(unsafe { libc::msgget(key, flags) })
}

/// msgctl(IPC_STAT): the queue's state.
pub fn msg_stat(id: i32) -> io::Result<msqid_ds> {
    // SAFETY: an all-zero msqid_ds is a valid value; IPC_STAT fills it.
    let mut ds: msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is a valid out-pointer of the type IPC_STAT writes.
    check(unsafe { libc::msgctl(id, libc::IPC_STAT, &mut ds) })?;
    Ok(ds)
}

/// msgctl(IPC_SET): the byte limit, owner and mode of `ds`.
pub fn msg_set(id: i32, ds: &msqid_ds) -> io::Result<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET reads the msqid_ds it is given.
    check(unsafe { libc::msgctl(id, libc::IPC_SET, &mut ds) }).map(drop)
}

/// The message at `index` of the queue, of at most `max` bytes, left on it (msgrcv with
/// MSG_COPY): its type and text.
pub fn msg_copy(id: i32, index: usize, max: usize) -> io::Result<(i64, Vec<u8>)> {
    let mut buf = vec![0u8; std::mem::size_of::<libc::c_long>() + max];
    // SAFETY: `buf` holds a long and `max` bytes of text, as msgrcv writes them.
    let n = check(unsafe { libc::msgrcv(id, buf.as_mut_ptr().cast(), max, index as libc::c_long, MSG_COPY | libc::IPC_NOWAIT) })?;
    let mtype = i64::from_ne_bytes(buf[..8].try_into().expect("8 bytes"));
    buf.truncate(8 + n as usize);
    buf.drain(..8);
    Ok((mtype, buf))
}

/// msgsnd(2) without waiting: queues a message of type `mtype`.
pub fn msg_send(id: i32, mtype: i64, text: &[u8]) -> io::Result<()> {
    let mut buf = mtype.to_ne_bytes().to_vec();
    buf.extend_from_slice(text);
    // SAFETY: `buf` is a long followed by the text's bytes.
    check(unsafe { libc::msgsnd(id, buf.as_ptr().cast(), text.len(), libc::IPC_NOWAIT) }).map(drop)
}
