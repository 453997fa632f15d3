//! The conversation with `codebox-init`, the waiting step inside every container
//! (`docs/sandbox-init.md`): the payload codebox writes to the container's stdin
//! ([`payload`]), the frames it reads back from its stdout ([`frames`]), and the requests of a
//! session's container ([`session`]).
//!
//! The decoder is incremental and bounded: it keeps at most the output cap per stream, the
//! configured bytes of file content and a fixed number of entries, whatever the container
//! sends. Anything that does not follow the protocol is an error, never a panic.

mod frames;
mod payload;
pub mod session;
#[cfg(any(test, feature = "testing"))]
mod testing;

pub use frames::*;
pub use payload::*;
#[cfg(any(test, feature = "testing"))]
pub use testing::{frame, parse_payload};

/// First line of every payload.
pub(crate) const MAGIC: &[u8] = b"codebox-init 1\n";
