//! Work done inside namespaces of the job that this process cannot enter itself.
//!
//! A thread may enter a mount or IPC namespace (setns), but only with CAP_SYS_ADMIN in its own
//! user namespace, which an ordinary user's restorer does not have; and only a single-threaded
//! process may enter a user namespace. So the work goes to a helper process: this same binary
//! started as `ckpt __in-namespaces` ([`helper_main`], first thing in `main`, before any
//! thread), which enters the namespaces of a process of the job (its user namespace first:
//! the job's user namespaces are this user's, and entering one gives every capability in it),
//! does the work and answers. The request comes on its stdin and the answer goes to its stdout
//! (postcard); its errors come back as text.
//!
//! Users: System V IPC of an ordinary user's job ([`crate::objects::sysvipc`]), the maps of a
//! user namespace the job made ([`crate::objects::user_namespaces`]), and the mounts of a mount
//! namespace owned by one ([`crate::objects::mounts`]).

use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use nix::sched::CloneFlags;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::objects::{mounts, sysvipc, user_namespaces};
use crate::ptrace::Tid;
use crate::sys;

/// The hidden command that runs [`helper_main`].
pub const COMMAND: &str = "__in-namespaces";

/// A namespace of the process to enter, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Enter {
    /// Its user namespace (nothing to do when it is the helper's own).
    User,
    Ipc,
    Mount,
    /// The user namespace this many levels above its own (its parent's for 1): one the job
    /// made that no process is in any more.
    UserAbove(u32),
    /// The user namespace its IPC namespace belongs to (its own, or one above it).
    OwnerOfIpc,
}

impl Enter {
    fn link_and_flag(self) -> (&'static str, libc::c_int) {
        match self {
            Enter::User => ("user", libc::CLONE_NEWUSER),
            Enter::Ipc => ("ipc", libc::CLONE_NEWIPC),
            Enter::Mount => ("mnt", libc::CLONE_NEWNS),
            Enter::UserAbove(_) => ("user", libc::CLONE_NEWUSER),
            Enter::OwnerOfIpc => ("ipc", libc::CLONE_NEWUSER),
        }
    }
}

/// What the helper does once inside.
#[derive(Debug, Serialize, Deserialize)]
pub enum Work {
    SysvIpc(sysvipc::Work),
    IdMaps(user_namespaces::Maps),
    Mounts(Vec<mounts::MountChange>),
    /// Read the maps of the user namespace entered (answers [`user_namespaces::MapsRead`]).
    ReadMaps,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    pid: Tid,
    enter: Vec<Enter>,
    work: Work,
}

/// The identity of a namespace: the device and inode of its file under /proc/PID/ns.
pub type NamespaceId = (u64, u64);

/// The namespace at `path` (/proc/PID/ns/KIND).
pub fn namespace_id(path: &str) -> Result<NamespaceId> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino())).context(|| format!("stat {path}"))
}

/// How another namespace is related to one ([`related_namespace`]).
#[derive(Debug, Clone, Copy)]
pub enum Relation {
    /// The user namespace that owns it (NS_GET_USERNS).
    Owner,
    /// Its parent, for a user or PID namespace (NS_GET_PARENT).
    Parent,
}

/// The namespace related to the one at `path` as `relation` says (ioctl_ns(2)).
pub fn related_namespace(path: &str, relation: Relation) -> Result<NamespaceId> {
    let ns = std::fs::File::open(path).context(|| format!("open {path}"))?;
    let related = std::fs::File::from(
        related_fd(&ns, relation).map_err(|e| Error::Io(std::io::Error::new(e.kind(), format!("the {relation:?} namespace of {path}: {e}"))))?,
    );
    let m = related.metadata().context(|| format!("stat the {relation:?} namespace of {path}"))?;
    Ok((m.dev(), m.ino()))
}

/// The user namespaces above the one at `path` (/proc/PID/ns/user), nearest first, up to (not
/// with) `top`; an error if `top` is not found within `MAX_NESTING` levels.
pub fn user_namespaces_above(path: &str, top: NamespaceId) -> Result<Vec<NamespaceId>> {
    const MAX_NESTING: usize = 32;
    let mut ns = std::fs::File::open(path).context(|| format!("open {path}"))?;
    let mut out = Vec::new();
    for _ in 0..MAX_NESTING {
        ns = std::fs::File::from(related_fd(&ns, Relation::Parent).context(|| format!("the user namespaces above {path}"))?);
        let m = ns.metadata().context(|| format!("stat a user namespace above {path}"))?;
        if (m.dev(), m.ino()) == top {
            return Ok(out);
        }
        out.push((m.dev(), m.ino()));
    }
    Err(Error::Other(format!("the user namespace of {path} is not within {MAX_NESTING} levels below the job's")))
}

/// NS_GET_USERNS or NS_GET_PARENT on namespace file `ns`.
fn related_fd(ns: &std::fs::File, relation: Relation) -> std::io::Result<OwnedFd> {
    match relation {
        Relation::Owner => sys::ns::owner(ns),
        Relation::Parent => sys::ns::parent(ns),
    }
}

/// Whether process `pid` (host pid) is in this process's namespace of kind `link`.
pub fn same_namespace(link: &str, pid: Tid) -> Result<bool> {
    Ok(namespace_id(&format!("/proc/self/ns/{link}"))? == namespace_id(&format!("/proc/{pid}/ns/{link}"))?)
}

/// Does `work` in a helper process that entered `enter` of process `pid` (host pid) first;
/// returns its answer (postcard; empty for work that answers nothing).
pub fn run(pid: Tid, enter: &[Enter], work: Work) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let request = postcard::to_allocvec(&Request { pid, enter: enter.to_vec(), work })
        .map_err(|e| Error::Other(format!("encode the namespace helper's request: {e}")))?;
    let mut child = Command::new("/proc/self/exe")
        .arg(COMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context(|| format!("start the namespace helper (ckpt {COMMAND})"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || stdin.write_all(&request));
    let out = child.wait_with_output().context(|| "wait for the namespace helper".to_string())?;
    let _ = writer.join();
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::Other(if why.is_empty() { format!("the namespace helper failed ({})", out.status) } else { why }));
    }
    Ok(out.stdout)
}

/// `ckpt __in-namespaces`: reads the request, enters the namespaces it names, does the work and
/// writes the answer. Must run single-threaded (entering a user namespace demands it): call it
/// first thing in `main`.
pub fn helper_main() -> Result<()> {
    use std::io::{Read, Write};
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes)?;
    let request: Request = postcard::from_bytes(&bytes).map_err(|e| Error::Other(format!("the namespace helper's request: {e}")))?;
    let pid = request.pid;
    for kind in request.enter {
        let (link, flag) = kind.link_and_flag();
        // Entering one's own user namespace is refused (EINVAL): nothing to do then.
        if kind == Enter::User && same_namespace(link, pid)? {
            continue;
        }
        let path = format!("/proc/{pid}/ns/{link}");
        let mut ns: OwnedFd = std::fs::File::open(&path).context(|| format!("open {path}"))?.into();
        if let Enter::UserAbove(levels) = kind {
            for _ in 0..levels {
                ns = related_fd(&std::fs::File::from(ns), Relation::Parent).context(|| format!("a user namespace above {path}"))?;
            }
        }
        if kind == Enter::OwnerOfIpc {
            if related_namespace(&path, Relation::Owner)? == namespace_id("/proc/self/ns/user")? {
                continue;
            }
            ns = related_fd(&std::fs::File::from(ns), Relation::Owner).context(|| format!("the user namespace owning {path}"))?;
        }
        if let Err(e) = nix::sched::setns(&ns, CloneFlags::from_bits_retain(flag)) {
            let e = std::io::Error::from(e);
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("enter the {link} namespace of pid {pid} ({path}): {e}"))));
        }
    }
    let answer = match request.work {
        Work::SysvIpc(work) => {
            let found = sysvipc::work_here(&work)?;
            postcard::to_allocvec(&found).map_err(|e| Error::Other(format!("encode the System V IPC answer: {e}")))?
        }
        Work::IdMaps(maps) => {
            maps.write_here()?;
            Vec::new()
        }
        Work::Mounts(changes) => {
            mounts::apply_here(&changes)?;
            Vec::new()
        }
        Work::ReadMaps => {
            let maps = user_namespaces::MapsRead::of_self()?;
            postcard::to_allocvec(&maps).map_err(|e| Error::Other(format!("encode the maps read: {e}")))?
        }
    };
    std::io::stdout().write_all(&answer)?;
    Ok(())
}
