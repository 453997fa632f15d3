//! Sessions (SPEC section 11): opened at once or refused at once, their memory held from the
//! budget for their whole life, their executions run like runs (a run slot each, one at a time
//! per session, in arrival order), and their ends named to every later call.
//!
//! A session ends when it is closed, when it has been idle for its idle timeout (the clock
//! stands still while an execution is queued or running), when it reaches the maximum
//! lifetime, or when its container breaks. Executions still queued then end `stopped`, their
//! message naming the end; a running one is interrupted first.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{RunManager, State};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Entry, Files};
use crate::engine::protocol::{EntryKind, FileEntry};
use crate::executor::session::{Broken, ReadError, SessionBox, SessionSpec};
use crate::executor::{
    check_relative_path, RequestError, SandboxFailure, SessionRequest, ValidSession,
};
use crate::report::{InterpreterState, RunLimits, Status};

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
    fn as_record(&self) -> String {
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
    fn from_record(text: &str) -> Option<EndReason> {
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
    fn ended(id: &str, reason: &EndReason) -> SessionError {
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

/// What `read_session_file` found.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionFile {
    File {
        path: String,
        /// The whole file's size and SHA-256.
        size_bytes: u64,
        sha256: String,
        offset: u64,
        /// The bytes from `offset` (at most what was asked for).
        content: Vec<u8>,
    },
    Folder {
        path: String,
        /// The entries directly in it, by name.
        entries: Vec<FolderEntry>,
    },
}

/// One entry of a folder's listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FolderEntry {
    pub path: String,
    /// `file`, `folder` or `link` (a link is never followed).
    pub kind: String,
    pub size_bytes: u64,
}

impl SessionFile {
    fn from_entries(
        path: &str,
        offset: u64,
        mut entries: Vec<FileEntry>,
    ) -> Result<SessionFile, SessionError> {
        let refuse = |why: &str| {
            Err(RequestError {
                field: "path".into(),
                message: format!("`{path}`: {why}"),
            }
            .into())
        };
        if entries.is_empty() {
            return refuse("the session's container sent nothing for it");
        }
        let first = entries.remove(0);
        match first.kind {
            EntryKind::File
                if first
                    .reason
                    .as_deref()
                    .is_some_and(|r| !r.starts_with("range ")) =>
            {
                refuse(first.reason.as_deref().unwrap_or("not readable"))
            }
            EntryKind::File => Ok(SessionFile::File {
                path: first.path,
                size_bytes: first.size,
                sha256: first.sha256,
                offset,
                content: first.content,
            }),
            EntryKind::Link => refuse("is a symbolic link, which is not followed"),
            EntryKind::Dir => Ok(SessionFile::Folder {
                path: first.path,
                entries: entries
                    .into_iter()
                    .map(|e| FolderEntry {
                        kind: match e.kind {
                            EntryKind::Dir => "folder",
                            EntryKind::Link => "link",
                            EntryKind::File => "file",
                        }
                        .into(),
                        path: e.path,
                        size_bytes: e.size,
                    })
                    .collect(),
            }),
        }
    }
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
    fn info(&self, id: &str) -> SessionInfo {
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

/// A session's container opened ahead of time (`sessions.ready`), waiting for its
/// `create_session`: its driver started, nothing else run in it. Its memory is held.
pub(super) struct Ready {
    language: String,
    container: Arc<SessionBox>,
    since: Instant,
    memory_mb: u64,
}

/// Every session of one manager.
#[derive(Default)]
pub(super) struct Sessions {
    pub open: HashMap<String, OpenSession>,
    /// Sessions being opened (they count against the caps already).
    pub opening: usize,
    /// Containers opened ahead of time, and those being opened, by language.
    ready: Vec<Ready>,
    filling: Vec<String>,
    /// Keep containers opened ahead of time (`codebox serve`).
    keep_ready: bool,
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

    fn remember_end(&mut self, id: &str, reason: EndReason) {
        self.ended.insert(id.to_string(), reason);
        self.ended_order.push_back(id.to_string());
        while self.ended_order.len() > ENDED_KEPT {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
    }
}

impl RunManager {
    /// Open a session: at once, or refused at once (never queued).
    pub async fn create_session(&self, req: SessionRequest) -> Result<SessionInfo, SessionError> {
        let config = self.inner.config.clone();
        let valid = ValidSession::new(req, &self.inner.registry, &config)?;
        let memory_mb = valid.limits.memory_mb;
        let settings = &config.sessions;
        let share_mb = settings.memory_budget_mb(&config);
        let mut taken = None;
        {
            let mut st = self.lock();
            let st = &mut *st;
            if st.admission.is_closed() {
                return Err(SessionError::ShuttingDown);
            }
            let d = config.limits.defaults();
            let default_limits = memory_mb == d.memory_mb && valid.limits.cpus == d.cpus;
            if valid.files.is_empty() && default_limits {
                let at = st
                    .sessions
                    .ready
                    .iter()
                    .position(|r| r.language == valid.language.id);
                taken = at.map(|i| st.sessions.ready.swap_remove(i));
            }
        }
        if let Some(ready) = taken {
            let info = self.open_as_session(ready.container, &valid, &new_session_id());
            self.refill_ready();
            return Ok(info);
        }
        {
            let mut st = self.lock();
            let st = &mut *st;
            let open = st.sessions.open.len() + st.sessions.opening;
            if open >= settings.max_sessions {
                return Err(SessionError::Full(format!(
                    "{open} sessions are open, the most this server keeps (sessions.max_sessions)"
                )));
            }
            let held = st.admission.held_mb();
            if held + memory_mb > share_mb {
                return Err(SessionError::Full(format!(
                    "open sessions hold {held} MB of the {share_mb} MB sessions may hold (sessions.memory_budget_mb); this one asks for {memory_mb} MB"
                )));
            }
            let pool = self.inner.executor.pool();
            if !st.admission.may_hold(memory_mb, pool.memory_mb()) {
                pool.shed(memory_mb);
                if !st.admission.may_hold(memory_mb, pool.memory_mb()) {
                    return Err(SessionError::Full(format!(
                        "runs are using the memory budget (runs.memory_budget_mb) now; {memory_mb} MB are not free"
                    )));
                }
            }
            st.admission.hold(memory_mb);
            st.sessions.opening += 1;
        }
        let id = new_session_id();
        let lifetime = Duration::from_secs(settings.max_lifetime_seconds);
        let entries: Vec<Entry> = valid
            .files
            .iter()
            .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone()))
            .collect();
        let spec = SessionSpec {
            name: format!(
                "codebox-session-{}",
                &id[SESSION_PREFIX.len()..SESSION_PREFIX.len() + 12]
            ),
            language: &valid.language,
            limits: Limits {
                memory_mb,
                cpus: valid.limits.cpus,
            },
            workspace_mb: settings.workspace_mb_for(memory_mb),
            files: Files::new(&entries),
            lifetime,
        };
        let opened = self.inner.executor.open_session(spec).await;
        let mut st = self.lock();
        st.sessions.opening -= 1;
        let container = match opened {
            Ok(c) => Arc::new(c),
            Err(e) => {
                st.admission.unhold(memory_mb);
                self.pump(&mut st);
                return Err(SessionError::Unavailable(failure_text(&e)));
            }
        };
        if st.admission.is_closed() {
            container.close();
            st.admission.unhold(memory_mb);
            return Err(SessionError::ShuttingDown);
        }
        drop(st);
        Ok(self.open_as_session(container, &valid, &id))
    }

    /// Record an opened container as session `id` (its memory is held already).
    fn open_as_session(
        &self,
        container: Arc<SessionBox>,
        valid: &ValidSession,
        id: &str,
    ) -> SessionInfo {
        let settings = &self.inner.config.sessions;
        let now = SystemTime::now();
        let session = OpenSession {
            language: valid.language.id.clone(),
            stateful: valid.language.is_stateful(),
            limits: valid.limits,
            container,
            created_at: now,
            created: Instant::now(),
            last_used: Instant::now(),
            last_used_at: now,
            idle_timeout: valid.idle_timeout,
            lifetime: Duration::from_secs(settings.max_lifetime_seconds),
            executions: 0,
            pending: 0,
            state: InterpreterState::New,
            workspace_bytes: 0,
            ending: None,
        };
        let info = session.info(id);
        tracing::info!(
            session = log_id(id),
            language = info.language,
            "session opened"
        );
        if let Some(h) = &self.inner.history {
            h.session_opened(crate::history::SessionOpened {
                session_id: id.to_string(),
                language: info.language.clone(),
                instance: self.inner.executor.instance().to_string(),
                created_at_ms: crate::history::now_ms(),
            });
        }
        self.inner.metrics.session_opened();
        self.lock().sessions.open.insert(id.to_string(), session);
        info
    }

    /// Keep `sessions.ready` containers opened ahead of time from now on (`codebox serve`).
    pub fn start_ready_sessions(&self) {
        self.lock().sessions.keep_ready = true;
        self.refill_ready();
    }

    /// Open containers ahead of time where `sessions.ready` asks for more, while the
    /// sessions' share and count and the budget have room for them.
    pub(super) fn refill_ready(&self) {
        let config = self.inner.config.clone();
        let settings = &config.sessions;
        let memory_mb = config.limits.defaults().memory_mb;
        let mut st = self.lock();
        if !st.sessions.keep_ready || st.admission.is_closed() {
            return;
        }
        for (language, &want) in &settings.ready {
            let Some(lang) = self.inner.registry.resolve(language).cloned() else {
                continue;
            };
            loop {
                let s = &st.sessions;
                let have = s.ready.iter().filter(|r| r.language == lang.id).count()
                    + s.filling.iter().filter(|l| **l == lang.id).count();
                let containers = s.open.len() + s.opening + s.ready.len() + s.filling.len();
                let room = st.admission.held_mb() + memory_mb <= settings.memory_budget_mb(&config)
                    && st
                        .admission
                        .may_hold(memory_mb, self.inner.executor.pool().memory_mb());
                if have >= want || containers >= settings.max_sessions || !room {
                    break;
                }
                st.admission.hold(memory_mb);
                st.sessions.filling.push(lang.id.clone());
                let manager = self.clone();
                let lang = lang.clone();
                tokio::spawn(async move {
                    let d = manager.inner.config.limits.defaults();
                    let spec = SessionSpec {
                        name: format!("codebox-session-{}", &new_session_id()[4..16]),
                        language: &lang,
                        limits: Limits {
                            memory_mb: d.memory_mb,
                            cpus: d.cpus,
                        },
                        workspace_mb: manager.inner.config.sessions.workspace_mb_for(d.memory_mb),
                        files: Files::default(),
                        lifetime: Duration::from_secs(
                            manager.inner.config.sessions.max_lifetime_seconds
                                + manager.inner.config.pool.idle_seconds,
                        ),
                    };
                    let opened = manager.inner.executor.open_session(spec).await;
                    let mut st = manager.lock();
                    if let Some(i) = st.sessions.filling.iter().position(|l| *l == lang.id) {
                        st.sessions.filling.swap_remove(i);
                    }
                    match opened {
                        Ok(c) if !st.admission.is_closed() => st.sessions.ready.push(Ready {
                            language: lang.id.clone(),
                            container: Arc::new(c),
                            since: Instant::now(),
                            memory_mb: d.memory_mb,
                        }),
                        other => {
                            if let Err(e) = other {
                                tracing::warn!(language = lang.id, error = %e, "could not open a session ahead of time");
                            }
                            st.admission.unhold(d.memory_mb);
                            manager.pump(&mut st);
                        }
                    }
                });
            }
        }
    }

    /// Containers opened ahead of time that waited longer than `pool.idle_seconds` are
    /// replaced; on shutdown (`all`) every one goes.
    pub(super) fn expire_ready(&self, all: bool) {
        let max = Duration::from_secs(self.inner.config.pool.idle_seconds);
        let mut st = self.lock();
        let (old, keep): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut st.sessions.ready)
            .into_iter()
            .partition(|r| all || r.since.elapsed() >= max);
        st.sessions.ready = keep;
        for r in &old {
            r.container.close();
            st.admission.unhold(r.memory_mb);
        }
        if !old.is_empty() {
            self.pump(&mut st);
        }
    }

    /// The open sessions of this server.
    pub fn list_sessions(&self) -> SessionList {
        let st = self.lock();
        let mut sessions: Vec<SessionInfo> = st
            .sessions
            .open
            .iter()
            .filter(|(_, s)| s.ending.is_none())
            .map(|(id, s)| s.info(id))
            .collect();
        sessions.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        SessionList { sessions }
    }

    /// Close a session: its container is removed at once (an execution under way is
    /// stopped first).
    pub fn close_session(&self, id: &str) -> Result<Closed, SessionError> {
        let mut st = self.lock();
        let executions = st.sessions.usable(id)?.executions;
        self.end_session(&mut st, id, EndReason::Closed);
        Ok(Closed {
            session_id: id.to_string(),
            executions,
            closed: true,
        })
    }

    /// An error about a session, told better where the history knows more: a session this
    /// process does not know may have ended on it before a restart, or be another server's.
    pub async fn explain(&self, e: SessionError) -> SessionError {
        let SessionError::Unknown { id } = &e else {
            return e;
        };
        let Some(history) = &self.inner.history else {
            return e;
        };
        let record = match history.session(id).await {
            Ok(Some(r)) => r,
            _ => return e,
        };
        let id = id.clone();
        if let Some(reason) = &record.ended {
            return match EndReason::from_record(reason) {
                Some(r) => SessionError::ended(&id, &r),
                None => SessionError::Restarted { id },
            };
        }
        let alive = record.instance != self.inner.executor.instance()
            && record
                .last_seen_ms_ago
                .is_some_and(|ms| ms < crate::history::INSTANCE_EXPIRY.as_millis() as i64);
        if !alive {
            return SessionError::Restarted { id };
        }
        let mut owner = format!("instance {}", record.instance);
        if let Some(host) = &record.host {
            owner.push_str(&format!(" on host {host}"));
        }
        SessionError::Elsewhere { id, owner }
    }

    /// A file of a session's working directory (`offset`, at most `max_bytes`, within the
    /// output cap), or a folder's listing, without running anything. Symbolic links are not
    /// followed. The idle clock starts again.
    pub async fn read_session_file(
        &self,
        id: &str,
        path: &str,
        offset: u64,
        max_bytes: Option<u64>,
    ) -> Result<SessionFile, SessionError> {
        let path = check_relative_path("path", path)?;
        let cap = self.inner.config.sandbox.output_limit_bytes;
        let max_bytes = match max_bytes {
            Some(0) => {
                return Err(RequestError {
                    field: "max_bytes".into(),
                    message: format!("must be between 1 and {cap}"),
                }
                .into())
            }
            Some(m) if m > cap => {
                return Err(RequestError {
                    field: "max_bytes".into(),
                    message: format!("requested {m} bytes; at most {cap} are returned per call (sandbox.output_limit_bytes); use offset for the rest"),
                }
                .into())
            }
            Some(m) => m,
            None => cap,
        };
        let container = {
            let mut st = self.lock();
            let s = st.sessions.usable(id)?;
            s.touch();
            s.container.clone()
        };
        let read = self
            .inner
            .executor
            .read_in_session(&container, &path, offset, max_bytes)
            .await;
        {
            let mut st = self.lock();
            if let Some(s) = st.sessions.open.get_mut(id) {
                s.touch();
            }
        }
        let read = match read {
            Ok(r) => r,
            Err(ReadError::Refused(why)) => {
                return Err(RequestError {
                    field: "path".into(),
                    message: format!("`{path}`: {why}"),
                }
                .into())
            }
            Err(ReadError::Broken(b)) => {
                let reason = match b {
                    Broken::OutOfMemory => EndReason::OutOfMemory,
                    Broken::Failed(why) => EndReason::Failed(format!("its sandbox failed: {why}")),
                };
                let mut st = self.lock();
                self.end_session(&mut st, id, reason.clone());
                return Err(SessionError::ended(id, &reason));
            }
        };
        SessionFile::from_entries(&path, offset, read.decoded.files)
    }

    /// End a session for `reason`: queued executions end `stopped` naming the end; a
    /// running one is stopped, and the container goes when it has ended.
    pub(super) fn end_session(&self, st: &mut State, id: &str, reason: EndReason) {
        let Some(s) = st.sessions.open.get_mut(id) else {
            return;
        };
        if s.ending.is_none() {
            s.ending = Some(reason.clone());
            tracing::info!(session = log_id(id), reason = ?reason, "session ending");
        }
        let message = SessionError::ended(id, &reason).to_string();
        let message = message.trim_start_matches("session_id: ").to_string();
        let mut running = false;
        let ids: Vec<String> = st
            .live
            .iter()
            .filter(|(_, r)| r.session.as_ref().is_some_and(|x| x.id == id))
            .map(|(run_id, _)| run_id.clone())
            .collect();
        for run_id in ids {
            let queued = st.admission.withdraw(&run_id);
            if queued {
                let run = &st.live[&run_id];
                let mut r = run.base.clone();
                r.status = Status::Stopped;
                r.message = format!("stopped before it started: {message}");
                self.finish(st, &run_id, Ok(r.into()));
            } else if let Some(run) = st.live.get(&run_id) {
                run.cancel.cancel();
                running = true;
            }
        }
        if !running {
            self.complete_end(st, id);
        }
    }

    /// A session that is ending and has nothing running any more: remove its container,
    /// give its memory back, remember why it ended.
    pub(super) fn complete_end(&self, st: &mut State, id: &str) {
        let ready = st
            .sessions
            .open
            .get(id)
            .is_some_and(|s| s.ending.is_some() && s.pending == 0);
        if !ready {
            return;
        }
        let Some(s) = st.sessions.open.remove(id) else {
            return;
        };
        s.container.close();
        st.admission.unhold(s.limits.memory_mb);
        let reason = s.ending.unwrap_or(EndReason::Closed);
        if let Some(h) = &self.inner.history {
            h.session_ended(id, &reason.as_record());
        }
        self.inner.metrics.session_ended();
        st.sessions.remember_end(id, reason);
        self.pump(st);
    }

    /// An execution of session `id` ended: the idle clock starts again, the interpreter's
    /// state is noted, and a broken container ends the session.
    pub(super) fn execution_ended(
        &self,
        st: &mut State,
        id: &str,
        state: Option<InterpreterState>,
        workspace_bytes: Option<u64>,
        broken: Option<Broken>,
    ) {
        if let Some(s) = st.sessions.open.get_mut(id) {
            s.pending = s.pending.saturating_sub(1);
            s.touch();
            if let Some(state) = state {
                s.state = state;
            }
            if let Some(b) = workspace_bytes {
                s.workspace_bytes = b;
            }
        }
        if let Some(b) = broken {
            let reason = match b {
                Broken::OutOfMemory => EndReason::OutOfMemory,
                Broken::Failed(why) => EndReason::Failed(format!("its sandbox failed: {why}")),
            };
            self.end_session(st, id, reason);
        }
        self.complete_end(st, id);
    }

    /// End sessions past their idle timeout or their lifetime.
    pub(super) fn expire_sessions(&self) {
        let mut st = self.lock();
        let due: Vec<(String, EndReason)> = st
            .sessions
            .open
            .iter()
            .filter(|(_, s)| s.ending.is_none())
            .filter_map(|(id, s)| {
                if s.created.elapsed() >= s.lifetime {
                    Some((
                        id.clone(),
                        EndReason::Lifetime {
                            seconds: s.lifetime.as_secs(),
                        },
                    ))
                } else if s.pending == 0 && s.last_used.elapsed() >= s.idle_timeout {
                    Some((
                        id.clone(),
                        EndReason::Idle {
                            seconds: s.idle_timeout.as_secs(),
                        },
                    ))
                } else {
                    None
                }
            })
            .collect();
        for (id, reason) in due {
            self.end_session(&mut st, &id, reason);
        }
        drop(st);
        self.expire_ready(false);
        self.refill_ready();
    }

    /// End every session (shutdown), and remove the containers opened ahead of time.
    pub(super) fn end_all_sessions(&self) {
        self.expire_ready(true);
        let mut st = self.lock();
        let ids: Vec<String> = st.sessions.open.keys().cloned().collect();
        for id in ids {
            self.end_session(&mut st, &id, EndReason::ShuttingDown);
        }
    }
}

/// A sandbox failure as a session's error text.
fn failure_text(e: &SandboxFailure) -> String {
    e.to_string()
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
