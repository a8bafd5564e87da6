//! The coordinator: protocol messages between clients, agents and the coordinator, the
//! checkpoint's state machine, and the generation counter. Embedded in the launcher for a
//! one-node job (its only agent is in-process), or standalone (`ckpt coordinator`), with agents
//! joined over TCP. docs/PROTOCOL.md describes the messages and the failure rules.

pub mod coordinator;
pub mod messages;
pub mod phase;
pub mod recovery;
pub mod relay;
pub mod remote;
pub mod secure;
pub mod server;
pub mod testhook;
pub mod wire;

pub use coordinator::{AgentHandle, AgentLost, CheckpointError, Coordinator, Registry};
pub use messages::{CheckpointReply, CheckpointRequest, Request, Response};
pub use phase::Phase;
