//! The coordinator: protocol messages between clients, agents and the coordinator, and the
//! checkpoint's phases. In this version the coordinator is embedded in the launcher, which is the
//! job's only agent; docs/PROTOCOL.md describes the messages.

pub mod messages;
pub mod phase;

pub use messages::{CheckpointReply, CheckpointRequest, Request, Response};
pub use phase::Phase;
