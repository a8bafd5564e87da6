//! Seizing, interrupting and driving stopped tasks.
//!
//! Every raw `ptrace` call lives in [`sys`]; the rest of this module (and of the crate) is safe code
//! over it. [`inject`] runs system calls inside a stopped task, which is how both capture (reading
//! state only the task itself can ask the kernel for) and restore (building the address space from
//! the inside) work; [`batch`] makes many system calls inside a task in one stop.

pub mod batch;
pub mod inject;
pub mod regs;
pub mod remote;
pub mod remote_mem;
pub mod sys;
pub mod tracers;

pub use inject::Injector;
pub use regs::{Regs, XState};
pub use remote::{RemoteTask, Scratch};
pub use sys::{StopKind, Tid};
pub use tracers::Tracers;
