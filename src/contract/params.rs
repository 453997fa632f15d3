//! The parameters of the tools other than `run_code` and `create_session` (and of their
//! `/v1` routes), and their checks.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{reject, RequestError};
use crate::registry::Registry;
use crate::report::Status;

/// Longest `get_result` long-poll (and `GET /v1/runs/{id}?wait_seconds=`).
pub const MAX_WAIT_SECONDS: f64 = 60.0;

/// Most history rows one query returns.
pub(crate) const MAX_HISTORY_LIMIT: usize = 1000;

/// A long-poll's wait: 0 (the default) to [`MAX_WAIT_SECONDS`].
pub(crate) fn check_wait(seconds: Option<f64>) -> Result<Duration, RequestError> {
    let wait = seconds.unwrap_or(0.0);
    if !(wait.is_finite() && (0.0..=MAX_WAIT_SECONDS).contains(&wait)) {
        return reject(
            "wait_seconds",
            format!("must be a number from 0 to {MAX_WAIT_SECONDS:.0}; got {wait}"),
        );
    }
    Ok(Duration::from_secs_f64(wait))
}

/// Arguments of `get_result`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct GetResultParams {
    /// The id `start_run` returned.
    pub run_id: String,
    /// Wait up to this many seconds (0 to 60, default 0) for the run to finish before
    /// answering; the answer comes as soon as it finishes.
    #[serde(default)]
    pub wait_seconds: Option<f64>,
}

/// Arguments of `stop_run`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopRunParams {
    /// The id `start_run` returned.
    pub run_id: String,
}

/// Arguments of `get_execution_history`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryParams {
    /// Most runs to return, newest first (1 to 1000, default 20).
    #[serde(default)]
    pub limit: Option<i64>,
    /// Only runs with this status: queued, running, succeeded, failed, compile_error,
    /// timed_out, out_of_memory, stopped or sandbox_error.
    #[serde(default)]
    pub status: Option<String>,
    /// Only runs of this language (id or alias).
    #[serde(default)]
    pub language: Option<String>,
    /// Only the executions of this session.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// Arguments naming a session.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionIdParams {
    /// The id `create_session` returned.
    pub session_id: String,
}

/// Arguments of `read_session_file`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadSessionFileParams {
    /// The id `create_session` returned.
    pub session_id: String,
    /// Relative to the session's working directory (`.` for itself, `outputs/plot.png`).
    pub path: String,
    /// Where to start reading, in bytes (default 0).
    #[serde(default)]
    pub offset: Option<i64>,
    /// Most bytes to return (default and maximum: the output cap).
    #[serde(default)]
    pub max_bytes: Option<i64>,
}

/// A history query that passed its checks.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HistoryFilter {
    pub limit: Option<usize>,
    pub status: Option<Status>,
    /// A language id (an alias resolved; an unknown name kept, which matches nothing).
    pub language: Option<String>,
    pub session_id: Option<String>,
}

impl HistoryParams {
    pub fn check(self, registry: &Registry) -> Result<HistoryFilter, RequestError> {
        let limit = match self.limit {
            None => None,
            Some(n) if (1..=MAX_HISTORY_LIMIT as i64).contains(&n) => Some(n as usize),
            Some(n) => {
                return reject(
                    "limit",
                    format!("must be between 1 and {MAX_HISTORY_LIMIT}; got {n}"),
                )
            }
        };
        let status = match self.status.as_deref() {
            None => None,
            Some(s) => Some(Status::parse(s).ok_or_else(|| {
                let all: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
                RequestError {
                    field: "status".into(),
                    message: format!("`{s}` is not a status; use one of {}", all.join(", ")),
                }
            })?),
        };
        let language = self.language.map(|l| match registry.resolve(&l) {
            Some(lang) => lang.id.clone(),
            None => l,
        });
        Ok(HistoryFilter {
            limit,
            status,
            language,
            session_id: self.session_id,
        })
    }
}
