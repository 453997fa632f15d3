//! A request to open a session, and its validation as itself: its language, its files (with
//! the session's upload cap) and its limits, which hold for the session's whole life and so
//! must fit what sessions may hold.

use std::time::Duration;

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{limit, reject, resolve_language, RequestError};
use super::files::{check_files, FileInput};
use super::limits::{check_limits, LimitsInput};
use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::RunLimits;

/// What a client asks for to open a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Language id or alias (see `list_supported_languages`).
    pub language: String,
    /// Memory and CPU for the session's whole life (memory at most the sessions' ceiling:
    /// `list_supported_languages`' `limits.session_ceilings`); `timeout_seconds` is each
    /// execution's default timeout.
    #[serde(default)]
    pub limits: Option<LimitsInput>,
    /// Files placed in the session's working directory; they stay.
    #[serde(default)]
    pub files: Option<Vec<FileInput>>,
    /// End the session after this many seconds without a call naming it.
    #[serde(default)]
    pub idle_timeout_seconds: Option<f64>,
    /// Packages installed before the session opens, kept for its life (at most 32; as for
    /// `run_code`, only where `list_supported_languages` names a package index).
    #[serde(default)]
    pub packages: Option<Vec<String>>,
}

/// A session request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidSession {
    pub language: Language,
    pub limits: RunLimits,
    pub files: Vec<(String, Bytes)>,
    pub idle_timeout: Duration,
    /// Requirements to install first, sorted, without repeats.
    pub packages: Vec<String>,
}

/// The most one session may ask for: a run's ceilings, with memory also within what all
/// sessions together may hold (`sessions.memory_budget_mb`), since a session holds its memory
/// for its whole life.
pub fn session_ceilings(config: &Config) -> RunLimits {
    let mut c = config.ceilings();
    c.memory_mb = c.memory_mb.min(config.sessions.memory_budget_mb(config));
    c
}

impl ValidSession {
    pub fn new(
        req: SessionRequest,
        registry: &Registry,
        config: &Config,
    ) -> Result<ValidSession, RequestError> {
        let ss = &config.sessions;
        let idle = limit(
            "idle_timeout_seconds",
            req.idle_timeout_seconds,
            ss.idle_timeout_seconds as f64,
            ss.max_idle_timeout_seconds as f64,
            "idle time",
            "s",
        )?;
        if idle < 1.0 {
            return reject(
                "idle_timeout_seconds",
                format!("requested {idle} s; the minimum is 1 s"),
            );
        }
        let language = resolve_language(registry, &req.language)?;
        // A stateful session has no source file for a file to clash with.
        let source = if language.is_stateful() {
            ""
        } else {
            language.source_file.as_str()
        };
        let files = check_files(req.files, source, ss.max_upload_bytes, config)?;
        let packages = super::run::check_packages(req.packages, language, config)?;
        let ceilings = session_ceilings(config);
        // Over the sessions' ceiling: said with why a session's memory is bounded so.
        let over = req
            .limits
            .as_ref()
            .and_then(|l| l.memory_mb)
            .is_some_and(|mb| mb > ceilings.memory_mb as f64);
        let limits = check_limits(req.limits, config.limits.defaults(), ceilings).map_err(|e| {
            if e.field == "limits.memory_mb" && over {
                RequestError {
                    message: format!(
                        "{}: a session holds its memory for its whole life, and sessions may hold {} MB in all (sessions.memory_budget_mb)",
                        e.message, ceilings.memory_mb
                    ),
                    ..e
                }
            } else {
                e
            }
        })?;
        Ok(ValidSession {
            language: language.clone(),
            limits,
            files,
            idle_timeout: Duration::from_secs_f64(idle),
            packages,
        })
    }
}

/// Why a call naming a session cannot be served, or a session not created.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SessionError {
    #[error("session_id: unknown session {id}")]
    Unknown { id: String },
    #[error("session_id: session {id} was closed")]
    Closed { id: String },
    #[error("session_id: session {id} expired after {seconds} s idle; create a new one")]
    Expired { id: String, seconds: u64 },
    #[error(
        "session_id: session {id} reached its maximum lifetime of {seconds} s; create a new one"
    )]
    Lifetime { id: String, seconds: u64 },
    #[error("session_id: session {id} ended: out of memory; create a new one")]
    OutOfMemory { id: String },
    #[error("session_id: session {id} ended: the server restarted; create a new one")]
    Restarted { id: String },
    #[error("session_id: session {id} ended: {why}; create a new one")]
    Failed { id: String, why: String },
    #[error("session_id: session {id} is held by another codebox server ({owner}); only that server can use it")]
    Elsewhere { id: String, owner: String },
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// `read_session_file` of a path the working directory does not have.
    #[error("path: the session's working directory has no file or folder `{path}`")]
    NoSuchFile { path: String },
    /// Over `sessions.max_sessions` or a memory budget. Retryable.
    #[error("{0}; retry later or close a session")]
    Full(String),
    /// The session's container could not be opened.
    #[error("the session could not be opened: {0}")]
    Unavailable(String),
    #[error("the server is shutting down and opens no new sessions")]
    ShuttingDown,
    /// An execution is running in it: its driver's stream is in use until it ends.
    #[error("session_id: session {id} is busy: an execution is running in it; read its files once that ends (get_result waits for it), or stop it with stop_run")]
    Busy { id: String },
}

impl SessionError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SessionError::Full(_))
    }

    /// The session existed and has ended (HTTP 409), as opposed to never known (404).
    #[cfg(test)]
    pub(crate) fn is_ended(&self) -> bool {
        matches!(
            self,
            SessionError::Closed { .. }
                | SessionError::Expired { .. }
                | SessionError::Lifetime { .. }
                | SessionError::OutOfMemory { .. }
                | SessionError::Restarted { .. }
                | SessionError::Failed { .. }
        )
    }
}
