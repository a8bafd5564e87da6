//! Mounts (mount(2) and the mount API of Linux 5.2: open_tree, move_mount, fsopen, fsmount,
//! mount_setattr), working directories and file nodes, for `objects::mounts`'s replay of a
//! job's mounts. Hand-written where nix lacks the call (the new mount API) or takes paths where
//! ckpt acts on descriptors (a mount in another namespace is reached through an O_PATH
//! descriptor and "."; see [`at`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int) -> io::Result<()> {
    super::check(r).map(drop)
}

/// A place in this thread's mount namespace, found without following any symbolic link
/// (openat2 with RESOLVE_NO_SYMLINKS): an O_PATH descriptor.
pub fn open_path(path: &str) -> io::Result<OwnedFd> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC).resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2(nix::fcntl::AT_FDCWD, path, how).map_err(io::Error::from)
}

fn mount(source: Option<&CString>, target: &CString, fstype: Option<&CString>, flags: u64, data: Option<&CString>) -> io::Result<()> {
    let p = |c: Option<&CString>| c.map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that outlives the call.
    check(unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags as libc::c_ulong, p(data) as *const libc::c_void) })
}

/// Runs `op` on "." with `target` as this thread's working directory: mount calls reach an
/// O_PATH descriptor this way, since in the job's mount namespace /proc/self/fd is not ours
/// (the job's /proc shows its own PID namespace). Goes back to the root after.
fn at<T>(target: &OwnedFd, op: impl FnOnce(&CString) -> io::Result<T>) -> io::Result<T> {
    change_dir(target)?;
    let out = op(&cstr(".")?);
    change_dir_root()?;
    out
}

pub fn change_dir(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fchdir on an open descriptor; this thread's file system context is its own.
    check(unsafe { libc::fchdir(fd.as_raw_fd()) })
}

pub fn change_dir_root() -> io::Result<()> {
    std::env::set_current_dir("/")
}

/// This thread leaves the file system context it shares with the process's other threads
/// and enters the mount namespace `ns` (its root and working directory become that
/// namespace's root).
pub fn enter_mount_namespace(ns: &std::fs::File) -> io::Result<()> {
    // SAFETY: unshare and setns change only this thread (CLONE_FS unshared first).
    check(unsafe { libc::unshare(libc::CLONE_FS) })?;
    // SAFETY: as above; `ns` is an open namespace file.
    check(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) })
}

pub fn unmount_detached(target: &OwnedFd) -> io::Result<()> {
    // SAFETY: a NUL-terminated path.
    at(target, |dot| check(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) }))
}

/// Gives the mount at `target` these per-mount flags (nothing to do when it has them: a
/// bind takes its source's). A mounted file, which cannot be a working directory, is given
/// them through mount_setattr (Linux 5.12).
pub fn remount_flags(target: &OwnedFd, flags: u64) -> io::Result<()> {
    if flags_of(target)? == flags {
        return Ok(());
    }
    match at(target, |dot| mount(None, dot, None, libc::MS_REMOUNT | libc::MS_BIND | flags, None)) {
        Err(e) if not_to_enter(&e) => set_attributes(target, flags),
        other => other,
    }
}

/// The id of the mount the file at `path` is on, as /proc/PID/mountinfo numbers mounts
/// (statx's STATX_MNT_ID, following symbolic links); None when the kernel does not say (before
/// Linux 5.8). Hand-written: nix has no statx, and rustix, which has, is no dependency of ours.
pub fn mount_id(path: &str) -> io::Result<Option<i32>> {
    let c = cstr(path)?;
    // SAFETY: an all-zero statx is a valid value; statx fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path, `stx` a valid out-pointer.
    check(unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MNT_ID, &mut stx) })?;
    Ok((stx.stx_mask & libc::STATX_MNT_ID != 0).then_some(stx.stx_mnt_id as i32))
}

/// The per-mount flags (MS_*) of the mount `fd` is on.
fn flags_of(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: fstatvfs fills the struct we pass; an open descriptor.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut v) })?;
    const ST: &[(u64, u64)] = &[
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
        (8192, 256), // ST_NOSYMFOLLOW, MS_NOSYMFOLLOW
    ];
    Ok(ST.iter().filter(|(st, _)| v.f_flag & st != 0).map(|(_, ms)| ms).fold(0, |a, b| a | b))
}

/// [`remount_flags`] through mount_setattr, which takes a descriptor of any mounted object.
fn set_attributes(target: &OwnedFd, flags: u64) -> io::Result<()> {
    // linux/mount.h's MOUNT_ATTR_*, which libc does not define; RELATIME is 0 in the
    // access-time field.
    const ATTRS: &[(u64, u64)] =
        &[(libc::MS_RDONLY, 0x1), (libc::MS_NOSUID, 0x2), (libc::MS_NODEV, 0x4), (libc::MS_NOEXEC, 0x8), (libc::MS_NODIRATIME, 0x80), (256, 0x200000)];
    const ATIME_MASK: u64 = 0x70;
    const NOATIME: u64 = 0x10;
    let mut set = ATTRS.iter().filter(|(ms, _)| flags & ms != 0).map(|(_, a)| a).fold(0, |a, b| a | b);
    // Only what differs is cleared: a kernel before 5.14 refuses MOUNT_ATTR_NOSYMFOLLOW.
    let current = flags_of(target)?;
    let mut clear = ATTRS.iter().filter(|(ms, _)| flags & ms == 0 && current & ms != 0).map(|(_, a)| a).fold(0, |a, b| a | b) | ATIME_MASK;
    if flags & libc::MS_NOATIME != 0 {
        set |= NOATIME;
    } else if flags & libc::MS_RELATIME == 0 {
        set |= 0x20; // MOUNT_ATTR_STRICTATIME
    }
    clear &= !set | ATIME_MASK;
    let attr: [u64; 4] = [set, clear, 0, 0];
    let empty = cstr("")?;
    // SAFETY: mount_setattr with an open descriptor, an empty path and a mount_attr of the
    // size given.
    let r =
        unsafe { libc::syscall(libc::SYS_mount_setattr, target.as_raw_fd(), empty.as_ptr(), libc::AT_EMPTY_PATH, attr.as_ptr(), std::mem::size_of_val(&attr)) };
    check(r as libc::c_int)
}

/// Gives the mount at `target` a propagation: each MS_SHARED, MS_PRIVATE, MS_SLAVE or
/// MS_UNBINDABLE of `steps` in turn.
pub fn set_propagation(target: &OwnedFd, steps: &[u64]) -> io::Result<()> {
    match at(target, |dot| steps.iter().try_for_each(|&flag| mount(None, dot, None, flag, None))) {
        Err(e) if not_to_enter(&e) => steps.iter().try_for_each(|&flag| set_propagation_attribute(target, flag)),
        other => other,
    }
}

/// Whether [`at`] failed because the mount's root is nothing this thread can make its working
/// directory: a file (a network namespace's mount under /run/netns, a container's
/// /etc/resolv.conf), or a directory closed to it (ENOTDIR, EACCES). mount_setattr takes a
/// descriptor of either. The second: tracefs at /sys/kernel/tracing is root's, mode 0700, and
/// bubblewrap binds /sys with it; an ordinary user's restart of such a job could not give it
/// its flags again.
fn not_to_enter(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::EACCES))
}

/// One propagation step of [`set_propagation`] through mount_setattr (Linux 5.12).
fn set_propagation_attribute(target: &OwnedFd, flag: u64) -> io::Result<()> {
    // struct mount_attr: attr_set, attr_clr, propagation, userns_fd.
    let attr: [u64; 4] = [0, 0, flag, 0];
    let empty = cstr("")?;
    // SAFETY: mount_setattr with an open descriptor, an empty path and a mount_attr of the
    // size given.
    let r =
        unsafe { libc::syscall(libc::SYS_mount_setattr, target.as_raw_fd(), empty.as_ptr(), libc::AT_EMPTY_PATH, attr.as_ptr(), std::mem::size_of_val(&attr)) };
    check(r as libc::c_int)
}

/// Whether `fd` is the root of a mount (statx's STATX_ATTR_MOUNT_ROOT, Linux 5.8): a path
/// something is mounted on, not a file or directory inside a mount.
pub fn is_mount_root(fd: &OwnedFd) -> io::Result<bool> {
    let empty = cstr("")?;
    // SAFETY: an all-zero statx is a valid value; statx fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, an empty path with AT_EMPTY_PATH, a valid out-pointer.
    check(unsafe { libc::statx(fd.as_raw_fd(), empty.as_ptr(), libc::AT_EMPTY_PATH, 0, &mut stx) })?;
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_attributes_mask & root == 0 {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "statx does not say whether a path is a mount's root (Linux 5.8)"));
    }
    Ok(stx.stx_attributes & root != 0)
}

/// A detached copy of the mount at `source` (with the mounts below it when `recursive`),
/// to attach elsewhere (open_tree, Linux 5.2).
pub fn clone_tree(source: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
    let empty = cstr("")?;
    let mut flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: open_tree on an open descriptor with an empty path.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, source.as_raw_fd(), empty.as_ptr(), flags) };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as i32) })
}

/// Mounts a detached copy ([`clone_tree`]) on `target` (move_mount, Linux 5.2).
pub fn attach(tree: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    let empty = cstr("")?;
    let move_flags = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: move_mount between two open descriptors with empty paths.
    let r = unsafe { libc::syscall(libc::SYS_move_mount, tree.as_raw_fd(), empty.as_ptr(), target.as_raw_fd(), empty.as_ptr(), move_flags) };
    check(r as libc::c_int)
}

/// A new tmpfs mounted nowhere, as a descriptor of its root (fsopen, fsmount: Linux 5.2).
pub fn detached_tmpfs() -> io::Result<OwnedFd> {
    let name = cstr("tmpfs")?;
    // SAFETY: fsopen with a NUL-terminated type; the descriptor is owned at once.
    let ctx = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), libc::FSOPEN_CLOEXEC) };
    if ctx < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned to us.
    let ctx = unsafe { OwnedFd::from_raw_fd(ctx as i32) };
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    check(unsafe {
        libc::syscall(libc::SYS_fsconfig, ctx.as_raw_fd(), libc::FSCONFIG_CMD_CREATE, std::ptr::null::<libc::c_char>(), std::ptr::null::<libc::c_void>(), 0)
    } as libc::c_int)?;
    // SAFETY: fsmount on the configured context; the descriptor is owned at once.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), libc::FSMOUNT_CLOEXEC, 0) };
    if mnt < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(mnt as i32) })
}

/// A new file `name` in the directory open at `dir`, for writing.
pub fn create_at(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let n = cstr(name)?;
    // SAFETY: an open directory and a NUL-terminated name; the descriptor is owned at once.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), n.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A detached bind of the file `name` in the directory open at `dir` (open_tree).
pub fn clone_tree_at(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let n = cstr(name)?;
    let flags = (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    // SAFETY: open_tree on an open directory with a NUL-terminated name.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), n.as_ptr(), flags) };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(tree as i32) })
}

/// Removes the file `name` in the directory open at `dir` (an O_PATH descriptor: it stays
/// usable once the tree it is in is detached).
pub fn remove_at(dir: &OwnedFd, name: &str) -> io::Result<()> {
    let n = cstr(name)?;
    // SAFETY: an open directory descriptor and a NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), n.as_ptr(), 0) })
}

/// Makes every mount of this thread's namespace from its root down private.
pub fn make_private_below_root() -> io::Result<()> {
    mount(None, &cstr("/")?, None, libc::MS_REC | libc::MS_PRIVATE, None)
}

/// Makes the mount at `new_root` this thread's namespace's root (pivot_root with the old
/// root put on top of it, then detached), and goes to it. Every process of the namespace
/// whose root or working directory was the old root gets the new one.
pub fn pivot_into(new_root: &OwnedFd) -> io::Result<()> {
    change_dir(new_root)?;
    let dot = cstr(".")?;
    // SAFETY: two NUL-terminated paths.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } as libc::c_int)?;
    // SAFETY: a NUL-terminated path: the old root, now on top of the new one.
    check(unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) })?;
    change_dir_root()
}

pub fn mount_new(fstype: &str, source: &str, target: &OwnedFd, flags: u64, options: &str) -> io::Result<()> {
    let data = if options.is_empty() { None } else { Some(cstr(options)?) };
    let (source, fstype) = (cstr(source)?, cstr(fstype)?);
    at(target, |dot| mount(Some(&source), dot, Some(&fstype), flags, data.as_ref()))
}

pub fn mknod(path: &str, kind: libc::mode_t, rdev: u64) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::mknod(p.as_ptr(), kind | 0o600, rdev as libc::dev_t) })
}

pub fn chmod(path: &str, mode: u32) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) })
}

/// Access and modification times, of the link itself for a symbolic link.
pub fn set_times(path: &str, atime_ns: i64, mtime_ns: i64) -> io::Result<()> {
    let p = cstr(path)?;
    let ts = |ns: i64| libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) };
    let times = [ts(atime_ns), ts(mtime_ns)];
    // SAFETY: a NUL-terminated path and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
}
