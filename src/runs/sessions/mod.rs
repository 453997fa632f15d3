//! Sessions (SPEC section 11), a room of their own: the table of sessions, its lock and every
//! verb (create, execute, read, list, close, expire, keep ready).
//!
//! A session is opened at once or refused at once, holds its memory from the admission budget
//! for its whole life, and runs its executions as runs (a run slot each, one at a time per
//! session, in arrival order). It ends when it is closed, when it has been idle for its idle
//! timeout (the clock stands still while an execution is queued or running), when it reaches
//! the maximum lifetime, or when its container breaks; every later call is told why.
//! Executions still queued then end `stopped`, naming the end; a running one is stopped. A
//! closed session's container is removed at once, a stuck cell or not.
//!
//! Sessions opened ahead of time (`sessions.ready`) count in `sessions.max_sessions` and in
//! the sessions' share of memory, and give way: to a `create_session` that needs their place
//! or memory, and to a queued run that needs their memory (the run manager asks for it back).
//!
//! The run manager alone owns the budget and the runs; sessions reach it through [`Host`].
//! Lock order: the run manager may lock the table while it holds its own lock; the table is
//! never held while a [`Host`] method that locks the run manager is called.
//!
//! [`ends`]: names, end reasons, errors and what the tools show of a session;
//! [`files`]: what `read_session_file` found.

pub mod ends;
mod files;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::config::Config;
use crate::contract::{check_relative_path, RequestError, SessionRequest, ValidSession};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Entry, Files};
use crate::executor::session::{Broken, ReadError, SessionBox, SessionSpec};
use crate::executor::{Executor, OpenError};
use crate::history::History;
use crate::registry::Registry;
use crate::report::{InterpreterState, RunLimits};
use crate::runs::metrics::Metrics;
pub use ends::{
    log_id, new_session_id, Closed, EndReason, SessionError, SessionInfo, SessionList,
    SERVER_STOPPED, SESSION_PREFIX, SESSION_TICK,
};
use ends::{rfc3339, ENDED_KEPT};
pub use files::{FolderEntry, SessionFile};

/// What sessions ask of the run manager, which owns the admission budget and the runs.
/// `hold`, `unhold`, `claim` and `stop_executions` lock the run manager: never call them with
/// the session table locked. `is_closed` and `metrics` lock nothing.
pub trait Host: Send + Sync + 'static {
    /// Hold `mb` of the budget for an open session, now or never: the pool's containers and
    /// sessions opened ahead of time give theirs back when that makes room. `ahead`: for a
    /// session opened ahead of time, only while nobody waits and the budget has room.
    fn hold(&self, mb: u64, ahead: bool) -> Result<(), String>;
    /// Give back what [`Host::hold`] held, and start what can start.
    fn unhold(&self, mb: u64, ahead: bool);
    /// A session opened ahead of time is now a session: its memory is no longer given back
    /// on demand.
    fn claim(&self, mb: u64);
    /// A session opened ahead of time is ready: a queued run that asked for its memory while
    /// it was being opened may take it back now.
    fn opened_ahead(&self);
    /// End these executions of an ending session: queued ones `stopped`, naming the end in
    /// `message`; running ones stopped.
    fn stop_executions(&self, run_ids: &[String], message: &str);
    fn is_closed(&self) -> bool;
    fn metrics(&self) -> &Metrics;
}

/// What a change to the table asks of the run manager once the table is unlocked.
#[derive(Debug, Default)]
#[must_use]
pub struct Effects {
    /// Executions to stop, with the end to name.
    pub stop: Vec<(Vec<String>, String)>,
    /// Memory of ended sessions, and of sessions opened ahead of time, to give back.
    pub unhold_mb: u64,
    pub unhold_ahead_mb: u64,
}

impl Effects {
    fn and(mut self, other: Effects) -> Effects {
        self.stop.extend(other.stop);
        self.unhold_mb += other.unhold_mb;
        self.unhold_ahead_mb += other.unhold_ahead_mb;
        self
    }

    /// Carry them out through `host` (not under the run manager's lock).
    pub fn apply(self, host: &dyn Host) {
        for (ids, message) in &self.stop {
            host.stop_executions(ids, message);
        }
        if self.unhold_ahead_mb > 0 {
            host.unhold(self.unhold_ahead_mb, true);
        }
        if self.unhold_mb > 0 {
            host.unhold(self.unhold_mb, false);
        }
    }
}

/// What an execution starts from: the session's container, terms and count.
pub struct Begun {
    pub container: Arc<SessionBox>,
    pub language: String,
    pub limits: RunLimits,
    /// 1-based count of this execution.
    pub execution: u64,
    /// The interpreter as the execution finds it.
    pub state: InterpreterState,
}

/// An open session.
struct OpenSession {
    language: String,
    stateful: bool,
    limits: RunLimits,
    container: Arc<SessionBox>,
    created_at: SystemTime,
    created: Instant,
    last_used: Instant,
    last_used_at: SystemTime,
    idle_timeout: Duration,
    lifetime: Duration,
    executions: u64,
    /// Executions accepted and not ended (queued or running).
    pending: usize,
    /// Their run ids, once the run manager has them.
    runs: Vec<String>,
    /// The execution running now (its driver's stream is in use).
    running: Option<String>,
    state: InterpreterState,
    workspace_bytes: u64,
    /// Set once it must end: it ends when no execution of it is left.
    ending: Option<EndReason>,
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
    fn touch(&mut self) {
        self.last_used = Instant::now();
        self.last_used_at = SystemTime::now();
    }
}

/// A session's container opened ahead of time (`sessions.ready`), waiting for its
/// `create_session`: its driver started, nothing else run in it. Its memory is held.
struct Ready {
    language: String,
    container: Arc<SessionBox>,
    since: Instant,
    memory_mb: u64,
}

/// A session that ended, as later calls are told.
struct Ended {
    reason: EndReason,
    executions: u64,
}

/// Every session of one server, and those being opened.
#[derive(Default)]
struct Table {
    open: HashMap<String, OpenSession>,
    /// Sessions being opened, and their memory: they count against the caps already.
    opening: usize,
    opening_mb: u64,
    /// Containers opened ahead of time, and the languages (and memory) of those being opened.
    ready: Vec<Ready>,
    filling: Vec<(String, u64)>,
    /// Keep containers opened ahead of time (`codebox serve`).
    keep_ready: bool,
    /// Shut down: nothing opens, nothing is inserted.
    closed: bool,
    ended: HashMap<String, Ended>,
    ended_order: VecDeque<String>,
}

impl Table {
    /// The open session `id`, or why there is none to use.
    fn usable(&mut self, id: &str) -> Result<&mut OpenSession, SessionError> {
        if let Some(e) = self.ended.get(id) {
            return Err(SessionError::ended(id, &e.reason));
        }
        match self.open.get_mut(id) {
            Some(s) => match &s.ending {
                Some(reason) => Err(SessionError::ended(id, reason)),
                None => Ok(s),
            },
            None => Err(SessionError::Unknown { id: id.to_string() }),
        }
    }

    /// Sessions open, being opened, and opened ahead of time (or being so).
    fn count(&self) -> usize {
        self.open.len() + self.opening + self.ready.len() + self.filling.len()
    }

    /// Memory all of them hold, of the sessions' share.
    fn held_mb(&self) -> u64 {
        let open: u64 = self.open.values().map(|s| s.limits.memory_mb).sum();
        let ready: u64 = self.ready.iter().map(|r| r.memory_mb).sum();
        let filling: u64 = self.filling.iter().map(|(_, mb)| mb).sum();
        open + self.opening_mb + ready + filling
    }

    /// Start ending session `id`: its executions are to be stopped; a closed session's
    /// container (and every one at shutdown) is removed now, whatever runs in it.
    fn begin_end(&mut self, id: &str, reason: EndReason) -> Effects {
        let Some(s) = self.open.get_mut(id) else {
            return Effects::default();
        };
        if s.ending.is_none() {
            tracing::info!(session = log_id(id), reason = ?reason, "session ending");
            s.ending = Some(reason.clone());
        }
        if matches!(reason, EndReason::Closed | EndReason::ShuttingDown) {
            // Removed at once: no interrupt's grace, no driver restart.
            s.container.end_now();
        }
        let mut effects = Effects::default();
        if !s.runs.is_empty() {
            effects
                .stop
                .push((s.runs.clone(), end_message(id, &reason)));
        }
        effects
    }

    /// Remove an ending session that has no execution left: its container goes, its memory
    /// is to be given back, and why it ended is remembered.
    fn complete(&mut self, id: &str, history: Option<&History>, metrics: &Metrics) -> Effects {
        let done = self
            .open
            .get(id)
            .is_some_and(|s| s.ending.is_some() && s.pending == 0);
        if !done {
            return Effects::default();
        }
        let Some(s) = self.open.remove(id) else {
            return Effects::default();
        };
        s.container.close();
        let reason = s.ending.unwrap_or(EndReason::Closed);
        if let Some(h) = history {
            h.session_ended(id, &reason.as_record());
        }
        metrics.session_ended();
        self.ended.insert(
            id.to_string(),
            Ended {
                reason,
                executions: s.executions,
            },
        );
        self.ended_order.push_back(id.to_string());
        while self.ended_order.len() > ENDED_KEPT {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        Effects {
            unhold_mb: s.limits.memory_mb,
            ..Effects::default()
        }
    }

    /// End session `id` and remove it if nothing of it runs.
    fn end(
        &mut self,
        id: &str,
        reason: EndReason,
        history: Option<&History>,
        metrics: &Metrics,
    ) -> Effects {
        let first = self.begin_end(id, reason);
        first.and(self.complete(id, history, metrics))
    }

    /// Take sessions opened ahead of time out, oldest first, until `mb` are freed (or none
    /// is left); their containers go.
    fn shed_ready(&mut self, mb: u64) -> u64 {
        let mut freed = 0;
        while freed < mb && !self.ready.is_empty() {
            let r = self.ready.remove(0);
            r.container.close();
            freed += r.memory_mb;
        }
        freed
    }
}

/// The sessions of one server.
pub struct Sessions {
    config: Arc<Config>,
    registry: Arc<Registry>,
    executor: Arc<Executor>,
    history: Option<History>,
    metrics: Arc<Metrics>,
    table: Mutex<Table>,
}

/// A session being opened: until it is in the table, dropping this (an error, or a caller
/// that went away) gives back its place and the memory it holds.
struct Opening<'a> {
    sessions: &'a Sessions,
    host: &'a dyn Host,
    mb: u64,
    held: bool,
    armed: bool,
}

/// Memory held for a session's install container while it opens; given back when dropped.
struct Installing<'a> {
    host: &'a dyn Host,
    mb: u64,
}

impl Drop for Installing<'_> {
    fn drop(&mut self) {
        self.host.unhold(self.mb, false);
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut t = self.sessions.lock();
            t.opening -= 1;
            t.opening_mb -= self.mb;
        }
        if self.held {
            self.host.unhold(self.mb, false);
        }
    }
}

impl Sessions {
    pub fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        executor: Arc<Executor>,
        history: Option<History>,
        metrics: Arc<Metrics>,
    ) -> Sessions {
        Sessions {
            config,
            registry,
            executor,
            history,
            metrics,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every update is a few assignments: a poisoned lock holds consistent data.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a session: at once, or refused at once (never queued).
    pub async fn create(
        self: &Arc<Self>,
        host: &Arc<dyn Host>,
        req: SessionRequest,
    ) -> Result<SessionInfo, SessionError> {
        let config = self.config.clone();
        let valid = ValidSession::new(req, &self.registry, &config)?;
        let memory_mb = valid.limits.memory_mb;
        let settings = &config.sessions;
        let share_mb = settings.memory_budget_mb(&config);
        let d = config.limits.defaults();
        let default_limits = memory_mb == d.memory_mb && valid.limits.cpus == d.cpus;
        let taken = {
            let mut t = self.lock();
            if t.closed || host.is_closed() {
                return Err(SessionError::ShuttingDown);
            }
            let at = t.ready.iter().position(|r| r.language == valid.language.id);
            match at {
                Some(i)
                    if valid.files.is_empty() && valid.packages.is_empty() && default_limits =>
                {
                    Some(t.ready.remove(i))
                }
                _ => None,
            }
        };
        if let Some(ready) = taken {
            host.claim(ready.memory_mb);
            let info = self.insert(host.as_ref(), ready.container, &valid, &new_session_id());
            self.refill_ready(host);
            return info;
        }
        let mut evicted = Vec::new();
        {
            let mut t = self.lock();
            let open = t.open.len() + t.opening;
            if open >= settings.max_sessions {
                return Err(SessionError::Full(format!(
                    "{open} sessions are open, the most this server keeps (sessions.max_sessions)"
                )));
            }
            // Sessions opened ahead of time give way to this one.
            while (t.count() >= settings.max_sessions || t.held_mb() + memory_mb > share_mb)
                && !t.ready.is_empty()
            {
                evicted.push(t.ready.remove(0));
            }
            let held = t.held_mb();
            let refusal = if held + memory_mb > share_mb {
                Some(format!(
                    "open sessions hold {held} MB of the {share_mb} MB sessions may hold (sessions.memory_budget_mb); this one asks for {memory_mb} MB"
                ))
            } else if t.count() >= settings.max_sessions {
                Some(format!(
                    "{} sessions are open or being opened, the most this server keeps (sessions.max_sessions)",
                    t.count()
                ))
            } else {
                None
            };
            if refusal.is_none() {
                t.opening += 1;
                t.opening_mb += memory_mb;
            }
            drop(t);
            let freed: u64 = evicted.iter().map(|r| r.memory_mb).sum();
            for r in &evicted {
                r.container.close();
            }
            if freed > 0 {
                host.unhold(freed, true);
            }
            if let Some(why) = refusal {
                return Err(SessionError::Full(why));
            }
        }
        let mut opening = Opening {
            sessions: self,
            host: host.as_ref(),
            mb: memory_mb,
            held: false,
            armed: true,
        };
        host.hold(memory_mb, false).map_err(SessionError::Full)?;
        opening.held = true;
        // Its packages install in a container of their own while it opens: that memory is
        // held too, until the install is over.
        let installing = if valid.packages.is_empty() {
            None
        } else {
            let mb = self.config.packages.install_memory_mb;
            host.hold(mb, false).map_err(SessionError::Full)?;
            Some(Installing {
                host: host.as_ref(),
                mb,
            })
        };
        let id = new_session_id();
        let entries: Vec<Entry> = valid
            .files
            .iter()
            .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone()))
            .collect();
        let spec = SessionSpec {
            packages: valid.packages.clone(),
            name: container_name(&id),
            language: &valid.language,
            limits: Limits {
                memory_mb,
                cpus: valid.limits.cpus,
            },
            workspace_mb: settings.workspace_mb_for(memory_mb),
            files: Files::new(&entries),
            lifetime: Duration::from_secs(settings.max_lifetime_seconds),
        };
        let opened = self.executor.open_session(spec).await;
        drop(installing);
        let container = match opened {
            Ok(c) => Arc::new(c),
            // The client's requirements did not install: its own to fix (400), not a retry.
            Err(OpenError::Packages(message)) => {
                let field = "packages".to_string();
                return Err(SessionError::Invalid(RequestError { field, message }));
            }
            Err(e) => return Err(SessionError::Unavailable(e.to_string())),
        };
        {
            let mut t = self.lock();
            t.opening -= 1;
            t.opening_mb -= memory_mb;
            opening.armed = false;
        }
        // Its memory moves from "being opened" to the session (or back, if shut down).
        self.insert(host.as_ref(), container, &valid, &id)
    }

    /// Record an opened container as session `id` (its memory is held already); after a
    /// shutdown it is removed instead, and its memory given back.
    fn insert(
        &self,
        host: &dyn Host,
        container: Arc<SessionBox>,
        valid: &ValidSession,
        id: &str,
    ) -> Result<SessionInfo, SessionError> {
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
            lifetime: Duration::from_secs(self.config.sessions.max_lifetime_seconds),
            executions: 0,
            pending: 0,
            runs: Vec::new(),
            running: None,
            state: InterpreterState::New,
            workspace_bytes: 0,
            ending: None,
        };
        let info = session.info(id);
        let mut t = self.lock();
        if t.closed {
            session.container.close();
            drop(t);
            host.unhold(valid.limits.memory_mb, false);
            return Err(SessionError::ShuttingDown);
        }
        t.open.insert(id.to_string(), session);
        drop(t);
        tracing::info!(
            session = log_id(id),
            language = info.language,
            "session opened"
        );
        if let Some(h) = &self.history {
            h.session_opened(crate::history::SessionOpened {
                session_id: id.to_string(),
                language: info.language.clone(),
                instance: self.executor.instance().to_string(),
                created_at_ms: crate::history::now_ms(),
            });
        }
        self.metrics.session_opened();
        Ok(info)
    }

    /// An execution in session `id` is accepted: counted, the idle clock stands still.
    /// Follow with [`Sessions::attach`] once it has a run id, or [`Sessions::abandon`].
    pub fn begin_execution(&self, id: &str) -> Result<Begun, SessionError> {
        let mut t = self.lock();
        let s = t.usable(id)?;
        s.executions += 1;
        s.pending += 1;
        s.touch();
        Ok(Begun {
            container: s.container.clone(),
            language: s.language.clone(),
            limits: s.limits,
            execution: s.executions,
            state: s.state,
        })
    }

    /// The execution begun was not accepted after all.
    pub fn abandon(&self, id: &str) -> Effects {
        let mut t = self.lock();
        if let Some(s) = t.open.get_mut(id) {
            s.executions -= 1;
            s.pending -= 1;
        }
        t.complete(id, self.history.as_ref(), &self.metrics)
    }

    /// The execution begun is run `run_id`. `Some(message)` when the session began ending
    /// meanwhile: stop it, naming the end.
    pub fn attach(&self, id: &str, run_id: &str) -> Option<String> {
        let mut t = self.lock();
        let s = t.open.get_mut(id)?;
        s.runs.push(run_id.to_string());
        s.ending.as_ref().map(|reason| end_message(id, reason))
    }

    /// Execution `run_id` of session `id` started running.
    pub fn started(&self, id: &str, run_id: &str) {
        if let Some(s) = self.lock().open.get_mut(id) {
            s.running = Some(run_id.to_string());
        }
    }

    /// Execution `run_id` of session `id` ended: the idle clock starts again, the
    /// interpreter's state is noted, and a broken container ends the session.
    pub fn execution_ended(
        &self,
        id: &str,
        run_id: &str,
        state: Option<InterpreterState>,
        workspace_bytes: Option<u64>,
        broken: Option<Broken>,
    ) -> Effects {
        let mut t = self.lock();
        if let Some(s) = t.open.get_mut(id) {
            s.pending = s.pending.saturating_sub(1);
            s.runs.retain(|r| r != run_id);
            if s.running.as_deref() == Some(run_id) {
                s.running = None;
            }
            s.touch();
            if let Some(state) = state {
                s.state = state;
            }
            if let Some(b) = workspace_bytes {
                s.workspace_bytes = b;
            }
        }
        let mut effects = Effects::default();
        if let Some(b) = broken {
            effects = t.begin_end(id, broken_reason(b));
        }
        effects.and(t.complete(id, self.history.as_ref(), &self.metrics))
    }

    /// The open sessions.
    pub fn list(&self) -> SessionList {
        let t = self.lock();
        let mut sessions: Vec<SessionInfo> = t
            .open
            .iter()
            .filter(|(_, s)| s.ending.is_none())
            .map(|(id, s)| s.info(id))
            .collect();
        sessions.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        SessionList { sessions }
    }

    /// Whether this server knows the session (open here, or ended here not long ago): its
    /// calls are answered here, never forwarded.
    pub fn knows(&self, id: &str) -> bool {
        let t = self.lock();
        t.open.contains_key(id) || t.ended.contains_key(id)
    }

    /// `cluster.lease_seconds`: a server silent for longer is gone.
    fn lease(&self) -> Duration {
        self.config.cluster.lease()
    }

    /// Open sessions, those opened ahead of time, and the memory all of them hold.
    pub fn counts(&self) -> (usize, usize, u64) {
        let t = self.lock();
        (t.open.len(), t.ready.len(), t.held_mb())
    }

    /// Close a session: its container is removed at once, an execution under way is
    /// stopped. Closing a session that has ended answers as its close did.
    pub fn close(&self, host: &dyn Host, id: &str) -> Result<Closed, SessionError> {
        let mut t = self.lock();
        if let Some(e) = t.ended.get(id) {
            return Ok(Closed {
                session_id: id.to_string(),
                executions: e.executions,
                closed: true,
            });
        }
        if let Some(s) = t.open.get(id).filter(|s| s.ending.is_some()) {
            return Ok(Closed {
                session_id: id.to_string(),
                executions: s.executions,
                closed: true,
            });
        }
        let executions = t.usable(id)?.executions;
        let effects = t.end(id, EndReason::Closed, self.history.as_ref(), &self.metrics);
        drop(t);
        effects.apply(host);
        Ok(Closed {
            session_id: id.to_string(),
            executions,
            closed: true,
        })
    }

    /// [`Sessions::close`], answered once the session's container is gone (or, if Docker is
    /// slow to remove it, after `within`): a caller told "closed" finds nothing of it left.
    pub async fn close_removed(
        &self,
        host: &dyn Host,
        id: &str,
        within: Duration,
    ) -> Result<Closed, SessionError> {
        let removed = self.lock().open.get(id).map(|s| s.container.removed());
        let closed = self.close(host, id)?;
        if let Some(removed) = removed {
            let _ = tokio::time::timeout(within, removed).await;
        }
        Ok(closed)
    }

    /// A file of a session's working directory (`offset`, at most `max_bytes`, within the
    /// output cap), or a folder's listing, without running anything: at once, or refused
    /// as busy while an execution runs. Symbolic links are not followed. The idle clock
    /// starts again.
    pub async fn read(
        &self,
        host: &dyn Host,
        id: &str,
        path: &str,
        offset: u64,
        max_bytes: Option<u64>,
    ) -> Result<SessionFile, SessionError> {
        let path = check_relative_path("path", path)?;
        let cap = self.config.sandbox.output_limit_bytes;
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
            let mut t = self.lock();
            let s = t.usable(id)?;
            s.touch();
            if s.running.is_some() {
                return Err(SessionError::Busy { id: id.to_string() });
            }
            s.container.clone()
        };
        let read = self
            .executor
            .read_in_session(&container, &path, offset, max_bytes)
            .await;
        if let Some(s) = self.lock().open.get_mut(id) {
            s.touch();
        }
        let read = match read {
            Ok(r) => r,
            Err(ReadError::Refused(why)) => {
                // codebox-init names the path itself: "a/b.txt: No such file or directory".
                let why = why.strip_prefix(&format!("{path}: ")).unwrap_or(&why);
                if why == "No such file or directory" {
                    return Err(SessionError::NoSuchFile { path });
                }
                return Err(RequestError {
                    field: "path".into(),
                    message: format!("`{path}`: {why}"),
                }
                .into());
            }
            Err(ReadError::Broken(b)) => {
                let reason = broken_reason(b);
                let mut t = self.lock();
                let effects = t.end(id, reason.clone(), self.history.as_ref(), &self.metrics);
                drop(t);
                effects.apply(host);
                return Err(SessionError::ended(id, &reason));
            }
        };
        SessionFile::from_entries(&path, offset, read.decoded.files)
    }

    /// End sessions past their idle timeout or their lifetime; replace containers opened
    /// ahead of time that waited too long, and open what `sessions.ready` asks for.
    pub fn expire(self: &Arc<Self>, host: &Arc<dyn Host>) {
        let mut t = self.lock();
        let due: Vec<(String, EndReason)> = t
            .open
            .iter()
            .filter(|(_, s)| s.ending.is_none())
            .filter_map(|(id, s)| {
                if s.created.elapsed() >= s.lifetime {
                    let seconds = s.lifetime.as_secs();
                    Some((id.clone(), EndReason::Lifetime { seconds }))
                } else if s.pending == 0 && s.last_used.elapsed() >= s.idle_timeout {
                    let seconds = s.idle_timeout.as_secs();
                    Some((id.clone(), EndReason::Idle { seconds }))
                } else {
                    None
                }
            })
            .collect();
        let mut effects = Effects::default();
        for (id, reason) in due {
            effects = effects.and(t.end(&id, reason, self.history.as_ref(), &self.metrics));
        }
        let max = Duration::from_secs(self.config.pool.idle_seconds);
        let (old, keep): (Vec<Ready>, Vec<Ready>) = std::mem::take(&mut t.ready)
            .into_iter()
            .partition(|r| r.since.elapsed() >= max);
        t.ready = keep;
        for r in &old {
            r.container.close();
            effects.unhold_ahead_mb += r.memory_mb;
        }
        drop(t);
        effects.apply(host.as_ref());
        self.refill_ready(host);
    }

    /// Keep `sessions.ready` containers opened ahead of time from now on (`codebox serve`).
    pub fn start_ready(self: &Arc<Self>, host: &Arc<dyn Host>) {
        self.lock().keep_ready = true;
        self.refill_ready(host);
    }

    /// Open containers ahead of time where `sessions.ready` asks for more, while the
    /// sessions' share and count and the budget have room for them.
    fn refill_ready(self: &Arc<Self>, host: &Arc<dyn Host>) {
        let config = self.config.clone();
        let settings = &config.sessions;
        let d = config.limits.defaults();
        let share_mb = settings.memory_budget_mb(&config);
        for (language, &want) in &settings.ready {
            let Some(lang) = self.registry.resolve(language).cloned() else {
                continue;
            };
            loop {
                {
                    let mut t = self.lock();
                    let have = t.ready.iter().filter(|r| r.language == lang.id).count()
                        + t.filling.iter().filter(|(l, _)| *l == lang.id).count();
                    if !t.keep_ready
                        || t.closed
                        || have >= want
                        || t.count() >= settings.max_sessions
                        || t.held_mb() + d.memory_mb > share_mb
                    {
                        break;
                    }
                    t.filling.push((lang.id.clone(), d.memory_mb));
                }
                if host.hold(d.memory_mb, true).is_err() {
                    let mut t = self.lock();
                    if let Some(i) = t.filling.iter().position(|(l, _)| *l == lang.id) {
                        t.filling.swap_remove(i);
                    }
                    break;
                }
                let (sessions, host, lang) = (self.clone(), host.clone(), lang.clone());
                // Tracked with removals: shutdown waits for it, so the container it opens is
                // removed before the process exits.
                self.executor.cleanup().spawn(async move {
                    let s = &sessions.config.sessions;
                    let spec = SessionSpec {
                        name: container_name(&new_session_id()),
                        language: &lang,
                        limits: Limits {
                            memory_mb: d.memory_mb,
                            cpus: d.cpus,
                        },
                        workspace_mb: s.workspace_mb_for(d.memory_mb),
                        files: Files::default(),
                        lifetime: Duration::from_secs(
                            s.max_lifetime_seconds + sessions.config.pool.idle_seconds,
                        ),
                        packages: Vec::new(),
                    };
                    let opened = sessions.executor.open_session(spec).await;
                    let mut t = sessions.lock();
                    if let Some(i) = t.filling.iter().position(|(l, _)| *l == lang.id) {
                        t.filling.swap_remove(i);
                    }
                    match opened {
                        Ok(c) if !t.closed => {
                            t.ready.push(Ready {
                                language: lang.id.clone(),
                                container: Arc::new(c),
                                since: Instant::now(),
                                memory_mb: d.memory_mb,
                            });
                            drop(t);
                            host.opened_ahead();
                        }
                        other => {
                            drop(t);
                            if let Err(e) = other {
                                tracing::warn!(language = lang.id, error = %e, "could not open a session ahead of time");
                            }
                            host.unhold(d.memory_mb, true);
                        }
                    }
                });
            }
        }
    }

    /// Give back at least `mb` held by sessions opened ahead of time, if they hold it: a
    /// queued run or a new session needs it. Returns what was freed. Called by the run
    /// manager under its lock: calls no [`Host`] method.
    pub fn shed_ready(&self, mb: u64) -> u64 {
        self.lock().shed_ready(mb)
    }

    /// The ids of the open sessions.
    pub fn open_ids(&self) -> Vec<String> {
        self.lock().open.keys().cloned().collect()
    }

    /// End these sessions, which the other servers ended while this server's lease was
    /// judged lapsed ("the server that held it stopped"): their containers go, a call
    /// naming one is told so.
    pub fn end_lapsed(&self, host: &dyn Host, ids: &[String]) {
        let mut t = self.lock();
        let mut effects = Effects::default();
        for id in ids {
            if t.open.contains_key(id) {
                let reason = EndReason::Failed(SERVER_STOPPED.to_string());
                effects = effects.and(t.end(id, reason, self.history.as_ref(), &self.metrics));
            }
        }
        drop(t);
        effects.apply(host);
    }

    /// End every session (shutdown), and remove the containers opened ahead of time. From
    /// now on nothing opens.
    pub fn shutdown(&self, host: &dyn Host) {
        let mut t = self.lock();
        t.closed = true;
        t.keep_ready = false;
        let all: u64 = t.ready.iter().map(|r| r.memory_mb).sum();
        let mut effects = Effects {
            unhold_ahead_mb: t.shed_ready(all),
            ..Effects::default()
        };
        let ids: Vec<String> = t.open.keys().cloned().collect();
        for id in ids {
            let e = t.end(
                &id,
                EndReason::ShuttingDown,
                self.history.as_ref(),
                &self.metrics,
            );
            effects = effects.and(e);
        }
        drop(t);
        effects.apply(host);
    }

    /// An error about a session, told better where the history knows more: a session this
    /// process does not know may have ended on it before a restart, or be another server's.
    pub async fn explain(&self, e: SessionError) -> SessionError {
        let SessionError::Unknown { id } = &e else {
            return e;
        };
        let Some(history) = &self.history else {
            return e;
        };
        let record = match history.session(id).await {
            Ok(Some(r)) => r,
            _ => return e,
        };
        let id = id.clone();
        if let Some(reason) = &record.ended {
            if reason == crate::history::SESSION_SERVER_STOPPED {
                return SessionError::Failed {
                    id,
                    why: SERVER_STOPPED.to_string(),
                };
            }
            return match EndReason::from_record(reason) {
                Some(r) => SessionError::ended(&id, &r),
                None => SessionError::Restarted { id },
            };
        }
        let alive = record.instance != self.executor.instance()
            && record
                .last_seen_ms_ago
                .is_some_and(|ms| ms < self.lease().as_millis() as i64);
        if !alive {
            return SessionError::Restarted { id };
        }
        let mut owner = format!("instance {}", record.instance);
        if let Some(host) = &record.host {
            owner.push_str(&format!(" on host {host}"));
        }
        SessionError::Elsewhere { id, owner }
    }
}

/// A session container's name: only a prefix of the id (the id is a secret of its holders).
fn container_name(id: &str) -> String {
    let hex = &id[SESSION_PREFIX.len()..];
    format!("codebox-session-{}", &hex[..12.min(hex.len())])
}

/// What an execution stopped by the session's end is told (the end, without the field name).
fn end_message(id: &str, reason: &EndReason) -> String {
    let message = SessionError::ended(id, reason).to_string();
    message.trim_start_matches("session_id: ").to_string()
}

fn broken_reason(b: Broken) -> EndReason {
    match b {
        Broken::OutOfMemory => EndReason::OutOfMemory,
        Broken::Failed(why) => EndReason::Failed(format!("its sandbox failed: {why}")),
    }
}
