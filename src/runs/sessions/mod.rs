//! Sessions (SPEC section 11): opened at once or refused at once, their memory held from the
//! budget for their whole life, their executions run like runs (a run slot each, one at a time
//! per session, in arrival order), and their ends named to every later call.
//!
//! A session ends when it is closed, when it has been idle for its idle timeout (the clock
//! stands still while an execution is queued or running), when it reaches the maximum
//! lifetime, or when its container breaks. Executions still queued then end `stopped`, their
//! message naming the end; a running one is interrupted first.
//!
//! Here: ids, ends and errors, what a session is as the tools describe it, and the table of
//! open sessions. [`open`]: `create_session` and the containers opened ahead of time;
//! [`ends`]: closing, expiring, and what becomes of a session when an execution ends;
//! [`files`]: `read_session_file`.

mod ends;
mod files;
mod open;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::executor::session::SessionBox;
use crate::contract::RequestError;
use crate::report::{InterpreterState, RunLimits};
pub use files::{FolderEntry, SessionFile};
use open::Ready;

/// How often sessions are checked for their idle timeout and lifetime.
pub(super) const SESSION_TICK: Duration = Duration::from_secs(1);
/// Ended sessions remembered in memory (beyond: "unknown", or the history's word).
const ENDED_KEPT: usize = 10_000;
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
#[derive(Debug, Clone, PartialEq)]
pub enum EndReason {
    Closed,
    Idle { seconds: u64 },
    Lifetime { seconds: u64 },
    OutOfMemory,
    Failed(String),
    ShuttingDown,
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

impl SessionError {
    pub(super) fn ended(id: &str, reason: &EndReason) -> SessionError {
        let id = id.to_string();
        match reason {
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

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SessionError::Full(_))
    }

    /// The session existed and has ended (HTTP 409), as opposed to never known (404).
    pub fn is_ended(&self) -> bool {
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

/// An open session.
pub(super) struct OpenSession {
    pub language: String,
    pub stateful: bool,
    pub limits: RunLimits,
    pub container: Arc<SessionBox>,
    pub created_at: SystemTime,
    pub created: Instant,
    pub last_used: Instant,
    pub last_used_at: SystemTime,
    pub idle_timeout: Duration,
    pub lifetime: Duration,
    pub executions: u64,
    /// Executions queued or running.
    pub pending: usize,
    pub state: InterpreterState,
    pub workspace_bytes: u64,
    /// Set once it must end: it ends when its running execution has stopped.
    pub ending: Option<EndReason>,
}

impl OpenSession {
    pub(super) fn info(&self, id: &str) -> SessionInfo {
        let idle_end = self.last_used_at + self.idle_timeout;
        let life_end = self.created_at + self.lifetime;
        SessionInfo {
            session_id: id.to_string(),
            language: self.language.clone(),
            limits: self.limits,
            stateful: self.stateful,
            idle_timeout_seconds: self.idle_timeout.as_secs(),
            max_lifetime_seconds: self.lifetime.as_secs(),
            created_at: rfc3339(self.created_at),
            last_used_at: rfc3339(self.last_used_at),
            expires_at: rfc3339(if self.pending > 0 {
                life_end
            } else {
                idle_end.min(life_end)
            }),
            executions: self.executions,
            workspace_bytes: self.workspace_bytes,
            state: self.state,
            busy: self.pending > 0,
        }
    }

    /// A call names it: the idle clock starts again.
    pub fn touch(&mut self) {
        self.last_used = Instant::now();
        self.last_used_at = SystemTime::now();
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Every session of one manager.
#[derive(Default)]
pub(super) struct Sessions {
    pub open: HashMap<String, OpenSession>,
    /// Sessions being opened (they count against the caps already).
    pub opening: usize,
    /// Containers opened ahead of time, and those being opened, by language.
    pub(super) ready: Vec<Ready>,
    pub(super) filling: Vec<String>,
    /// Keep containers opened ahead of time (`codebox serve`).
    pub(super) keep_ready: bool,
    ended: HashMap<String, EndReason>,
    ended_order: VecDeque<String>,
}

impl Sessions {
    /// The open session `id`, or why there is none to use.
    pub fn usable(&mut self, id: &str) -> Result<&mut OpenSession, SessionError> {
        if let Some(reason) = self.ended.get(id) {
            return Err(SessionError::ended(id, reason));
        }
        match self.open.get_mut(id) {
            Some(s) => match &s.ending {
                Some(reason) => Err(SessionError::ended(id, reason)),
                None => Ok(s),
            },
            None => Err(SessionError::Unknown { id: id.to_string() }),
        }
    }

    pub(super) fn remember_end(&mut self, id: &str, reason: EndReason) {
        self.ended.insert(id.to_string(), reason);
        self.ended_order.push_back(id.to_string());
        while self.ended_order.len() > ENDED_KEPT {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
    }
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
        let text = |r: EndReason| SessionError::ended(id, &r).to_string();
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
        assert!(SessionError::ended(id, &EndReason::Closed).is_ended());
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
