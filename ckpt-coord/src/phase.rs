//! The phases of a coordinated checkpoint, named as in docs/PROTOCOL.md.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Seize and stop every thread of the job.
    Freeze,
    /// Capture the data in flight on pipes and sockets.
    Drain,
    /// Registers, descriptors, signal state and memory into the buffer pool.
    Capture,
    /// Release the job.
    Resume,
    /// IO threads write the chunks and fsync them.
    Persist,
    /// Write the generation's MANIFEST.
    Commit,
}
