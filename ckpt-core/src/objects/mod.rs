//! One module per kernel object kind. Each holds its image record, how it is read from a stopped
//! process (`capture`) and how it is recreated (`restore`). Orchestration (who is frozen when, in
//! what order things are restored) lives in [`crate::capture`] and in the restart tool.

pub mod aio;
pub mod cgroups;
pub mod cpu;
pub mod creds;
pub mod deleted;
pub mod descriptor;
pub mod dirty;
pub mod epoll;
pub mod eventfd;
pub mod fanotify;
pub mod fd;
pub mod fifo;
pub mod file;
pub mod files_state;
pub mod identity;
pub mod inet;
pub mod inet_opts;
pub mod inotify;
pub mod locks;
pub mod memattrs;
pub mod memfd;
pub mod memory;
pub mod mounts;
pub mod mqueue;
pub mod multicast;
pub mod namespaces;
pub mod net_namespaces;
pub mod netlink;
pub mod packet;
pub mod pidfd;
pub mod pipe;
pub mod posix_timer;
pub mod process;
pub mod protect;
pub mod pty;
pub mod removed_dir;
pub mod sched;
pub mod seccomp;
pub mod shared_memory;
pub mod signalfd;
pub mod signals;
pub mod sysvipc;
pub mod tcp;
pub mod tcp_reconnect;
pub mod thread;
pub mod timens;
pub mod timerfd;
pub mod udp;
pub mod unix;
pub mod user_namespaces;
pub mod uts;
pub mod vdso;

pub use process::ProcessRecord;
