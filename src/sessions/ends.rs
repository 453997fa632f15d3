//! What sessions are called and how they end, as every caller sees it: ids, end reasons,
//! the errors later calls are told, and a session as the tools describe it.

use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::contract::SessionError;
use crate::report::{InterpreterState, RunLimits};

/// How often sessions are checked for their idle timeout and lifetime.
pub const SESSION_TICK: Duration = Duration::from_secs(1);
/// Ended sessions remembered in memory (beyond: "unknown", or the history's word).
pub(super) const ENDED_KEPT: usize = 10_000;
/// Prefix of every session id.
pub const SESSION_PREFIX: &str = "cbx_";

/// A new session id: 160 random bits, hex. Unguessable, and unrelated to any run id.
pub fn new_session_id() -> String {
    let mut bytes = [0u8; 20];
    // The operating system's generator; without it there is no safe id to hand out.
    getrandom::fill(&mut bytes).expect("the operating system's random number generator");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{SESSION_PREFIX}{hex}")
}

/// A session id as logs show it: never whole (holders of the id can use the session).
pub fn log_id(id: &str) -> String {
    let keep = (SESSION_PREFIX.len() + 6).min(id.len());
    format!("{}…", &id[..keep])
}

/// Why a session ended.
/// Why a session ended whose server's lease lapsed (SPEC section 15).
pub const SERVER_STOPPED: &str = "the server that held it stopped";

#[derive(Debug, Clone, PartialEq)]
pub enum EndReason {
    Closed,
    Idle { seconds: u64 },
    Lifetime { seconds: u64 },
    OutOfMemory,
    Failed(String),
    ShuttingDown,
}

impl EndReason {
    /// How the history records it.
    pub(super) fn as_record(&self) -> String {
        match self {
            EndReason::Closed => "closed".into(),
            EndReason::Idle { seconds } => format!("idle {seconds}"),
            EndReason::Lifetime { seconds } => format!("lifetime {seconds}"),
            EndReason::OutOfMemory => "out_of_memory".into(),
            EndReason::Failed(why) => format!("failed {why}"),
            // What later calls are told of a session the server ended as it stopped.
            EndReason::ShuttingDown => crate::history::SESSION_RESTARTED.into(),
        }
    }

    /// A reason as the history recorded it; `None` for `restarted` (and anything unknown).
    pub(super) fn from_record(text: &str) -> Option<EndReason> {
        let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
        Some(match kind {
            "closed" => EndReason::Closed,
            "idle" => EndReason::Idle {
                seconds: rest.parse().ok()?,
            },
            "lifetime" => EndReason::Lifetime {
                seconds: rest.parse().ok()?,
            },
            "out_of_memory" => EndReason::OutOfMemory,
            "failed" => EndReason::Failed(rest.to_string()),
            _ => return None,
        })
    }
}

impl EndReason {
    /// What a later call naming the session is told.
    pub fn error(&self, id: &str) -> SessionError {
        let id = id.to_string();
        match self {
            EndReason::Closed => SessionError::Closed { id },
            EndReason::Idle { seconds } => SessionError::Expired {
                id,
                seconds: *seconds,
            },
            EndReason::Lifetime { seconds } => SessionError::Lifetime {
                id,
                seconds: *seconds,
            },
            EndReason::OutOfMemory => SessionError::OutOfMemory { id },
            EndReason::Failed(why) => SessionError::Failed {
                id,
                why: why.clone(),
            },
            EndReason::ShuttingDown => SessionError::Failed {
                id,
                why: "the server shut down".into(),
            },
        }
    }
}

/// A session as `create_session` and `list_sessions` describe it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    /// Pass it to `run_code`, `start_run`, `read_session_file` and `close_session`.
    pub session_id: String,
    pub language: String,
    /// Memory and CPU for the session's life; `timeout_seconds`: each execution's default.
    pub limits: RunLimits,
    /// Whether the interpreter's state (variables, imports, definitions) is kept between
    /// executions; otherwise only files are.
    pub stateful: bool,
    pub idle_timeout_seconds: u64,
    pub max_lifetime_seconds: u64,
    /// When the session was created (RFC 3339).
    pub created_at: String,
    /// When it was last named by a call (RFC 3339).
    pub last_used_at: String,
    /// When it ends unless a call names it first (idle timeout), or at its maximum lifetime,
    /// whichever is sooner (RFC 3339).
    pub expires_at: String,
    /// Executions accepted so far.
    pub executions: u64,
    /// Bytes used in its working directory, as of its last execution.
    pub workspace_bytes: u64,
    /// The interpreter after the last execution (`new` before any).
    pub state: InterpreterState,
    /// An execution is queued or running.
    pub busy: bool,
}

/// `list_sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// `close_session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Closed {
    pub session_id: String,
    pub executions: u64,
    pub closed: bool,
}

pub(super) fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_long_random_and_logged_only_in_part() {
        let (a, b) = (new_session_id(), new_session_id());
        assert_ne!(a, b);
        assert!(a.starts_with(SESSION_PREFIX));
        assert_eq!(a.len(), SESSION_PREFIX.len() + 40, "160 bits in hex");
        let logged = log_id(&a);
        assert!(a.starts_with(logged.trim_end_matches('…')));
        assert!(logged.len() < a.len() / 2);
    }

    #[test]
    fn every_end_is_named_to_a_later_call() {
        let id = "cbx_1";
        let text = |r: EndReason| r.error(id).to_string();
        assert_eq!(
            text(EndReason::Closed),
            "session_id: session cbx_1 was closed"
        );
        assert_eq!(
            text(EndReason::Idle { seconds: 600 }),
            "session_id: session cbx_1 expired after 600 s idle; create a new one"
        );
        assert!(text(EndReason::Lifetime { seconds: 3600 })
            .contains("reached its maximum lifetime of 3600 s"));
        assert!(text(EndReason::OutOfMemory).contains("ended: out of memory"));
        assert!(EndReason::Closed.error(id).is_ended());
        assert!(!SessionError::Unknown { id: id.into() }.is_ended());
        assert!(SessionError::Full("x".into()).is_retryable());
    }

    #[test]
    fn end_reasons_read_back_from_the_history() {
        for r in [
            EndReason::Closed,
            EndReason::Idle { seconds: 30 },
            EndReason::Lifetime { seconds: 3600 },
            EndReason::OutOfMemory,
            EndReason::Failed("its sandbox failed: gone".into()),
        ] {
            assert_eq!(EndReason::from_record(&r.as_record()), Some(r));
        }
        assert_eq!(
            EndReason::from_record(&EndReason::ShuttingDown.as_record()),
            None
        );
    }
}
