//! What taking a request answers: the run accepted, or why not.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::sessions::ends::SessionError;
use crate::contract::RequestError;
use crate::report::{RunLimits, Status};

/// A run accepted by [`RunManager::submit`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Accepted {
    /// Id to pass to `get_result` and `stop_run`.
    pub run_id: String,
    /// `queued` (waiting for a slot) or `running`.
    pub status: Status,
    /// The limits the run was given (defaults filled in).
    pub limits: RunLimits,
}

/// Why a run was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The request itself is wrong; the error names the field.
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// Too many runs are waiting. Retryable.
    #[error("the server is busy: {waiting} runs are already waiting for a slot (the queue holds at most {max}); retry in a few seconds")]
    QueueFull { waiting: usize, max: usize },
    /// The server is shutting down.
    #[error("the server is shutting down and accepts no new runs")]
    ShuttingDown,
    /// The session named cannot take executions (ended, unknown, another server's).
    #[error(transparent)]
    Session(SessionError),
}

impl From<SessionError> for SubmitError {
    fn from(e: SessionError) -> SubmitError {
        match e {
            SessionError::Invalid(e) => SubmitError::Invalid(e),
            other => SubmitError::Session(other),
        }
    }
}

impl SubmitError {
    /// Whether the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SubmitError::QueueFull { .. })
    }
}
