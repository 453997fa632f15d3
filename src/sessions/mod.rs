//! Sessions (SPEC section 11), a wing above runs: the table of sessions, its lock and every
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
//! The run manager alone owns the budget and the runs: a session holds its memory through
//! [`RunManager::hold`], and an execution is a [`Job`] submitted to it like any run, which
//! runs in the session's container ([`Execution`]). Lock order: the run manager may lock the
//! table while it holds its own lock ([`Ahead::shed`]); the table is never held while a
//! method that locks the run manager is called.
//!
//! [`ends`]: names, end reasons, errors and what the tools show of a session;
//! [`files`]: what `read_session_file` found.

pub mod ends;
mod files;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::config::Config;
use crate::contract::{
    check_relative_path, RequestError, RunRequest, SessionError, SessionRequest, SessionTerms,
    ValidRequest, ValidSession,
};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Entry, Files};
use crate::executor::session::{Broken, ReadError, SessionBox, SessionSpec};
use crate::executor::{new_run_id, Call, Executor, OpenError};
use crate::history::{History, Lapse};
use crate::registry::Registry;
use crate::report::{InterpreterState, RunLimits, RunReport, SessionExecution};
use crate::runs::Metrics;
use crate::runs::{
    execution_charge, Accepted, Ahead, Job, RunManager, SessionCounts, Start, SubmitError, Work,
};
pub use ends::{
    log_id, new_session_id, Closed, EndReason, SessionInfo, SessionList, SERVER_STOPPED,
    SESSION_PREFIX, SESSION_TICK,
};
use ends::{rfc3339, ENDED_KEPT};
pub use files::{FolderEntry, SessionFile};

/// What a change to the table asks of the run manager once the table is unlocked.
#[derive(Debug, Default)]
#[must_use]
struct Effects {
    /// Executions to stop, with the end to name.
    pub stop: Vec<(Vec<String>, String)>,
    /// Memory of ended sessions, and of sessions opened ahead of time, to give back.
    pub unhold_mb: u64,
    pub unhold_ahead_mb: u64,
}

impl Effects {
    fn is_empty(&self) -> bool {
        self.stop.is_empty() && self.unhold_mb == 0 && self.unhold_ahead_mb == 0
    }

    fn and(mut self, other: Effects) -> Effects {
        self.stop.extend(other.stop);
        self.unhold_mb += other.unhold_mb;
        self.unhold_ahead_mb += other.unhold_ahead_mb;
        self
    }

    /// Carry them out (not with the table locked).
    fn apply(self, runs: &RunManager) {
        for (ids, message) in &self.stop {
            runs.stop_runs(ids, message);
        }
        if self.unhold_ahead_mb > 0 {
            runs.unhold(self.unhold_ahead_mb, true);
        }
        if self.unhold_mb > 0 {
            runs.unhold(self.unhold_mb, false);
        }
    }
}

/// What an execution starts from: the session's container, terms and count.
struct Begun {
    container: Arc<SessionBox>,
    language: String,
    limits: RunLimits,
    /// 1-based count of this execution.
    execution: u64,
    /// The interpreter as the execution finds it.
    state: InterpreterState,
}

/// What became of the session in an execution that ran (nothing, for one that did not).
#[derive(Default)]
struct After {
    state: Option<InterpreterState>,
    workspace_bytes: Option<u64>,
    broken: Option<Broken>,
}

/// An execution in a session, as runs carries it out: in the session's container. Dropped
/// unrun (stopped while queued, refused, or its task ended early), it ends in the session
/// all the same.
struct Execution {
    sessions: Arc<Sessions>,
    id: String,
    run_id: String,
    container: Arc<SessionBox>,
    count: u64,
    /// Its end was told to the session.
    over: bool,
}

impl Work for Execution {
    fn run(mut self: Box<Self>, start: Start) -> BoxFuture<'static, RunReport> {
        // At once: a call that finds the run running finds the session busy.
        self.sessions.started(&self.id, &start.run_id);
        Box::pin(async move {
            let call = Call {
                run_id: &start.run_id,
                req: &start.request,
                queued_ms: start.queued_ms,
                cancel: start.cancel,
                feed: Some(&start.feed),
            };
            let at = SessionExecution {
                session_id: self.id.clone(),
                execution_count: self.count,
                state: InterpreterState::Kept,
                reset_reason: None,
            };
            let executor = self.sessions.executor.clone();
            let r = executor.execute_in_session(&self.container, at, call).await;
            let end = After {
                state: r.report.session.as_ref().map(|x| x.state),
                workspace_bytes: r.workspace_bytes,
                broken: r.broken,
            };
            self.over = true;
            // Told before runs publishes the report: the next call sees the session as is.
            let effects = self.sessions.ended(&self.id, &self.run_id, end);
            effects.apply(&self.sessions.runs);
            r.report
        })
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        // Possibly under the run manager's lock: the table now, what it asks of runs on a
        // task of its own.
        let effects = self
            .sessions
            .ended(&self.id, &self.run_id, After::default());
        if !effects.is_empty() {
            let runs = self.sessions.runs.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { effects.apply(&runs) });
            }
        }
    }
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
            return Err(e.reason.error(id));
        }
        match self.open.get_mut(id) {
            Some(s) => match &s.ending {
                Some(reason) => Err(reason.error(id)),
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

/// How long a door's `close_session` waits for the container's removal before it answers.
const CLOSE_REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// The sessions of one server.
pub struct Sessions {
    runs: RunManager,
    config: Arc<Config>,
    registry: Arc<Registry>,
    executor: Arc<Executor>,
    history: Option<History>,
    table: Mutex<Table>,
    /// Its loops (expiry, and ending what the others ended after a lapse).
    tasks: Mutex<Vec<AbortOnDropHandle<()>>>,
}

/// A session being opened: until it is in the table, dropping this (an error, or a caller
/// that went away) gives back its place and the memory it holds.
struct Opening<'a> {
    sessions: &'a Sessions,
    runs: &'a RunManager,
    mb: u64,
    held: bool,
    armed: bool,
}

/// Memory held for a session's install container while it opens; given back when dropped.
struct Installing<'a> {
    runs: &'a RunManager,
    mb: u64,
}

impl Drop for Installing<'_> {
    fn drop(&mut self) {
        self.runs.unhold(self.mb, false);
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
            self.runs.unhold(self.mb, false);
        }
    }
}

impl Ahead for Sessions {
    fn shed(&self, mb: u64) -> u64 {
        self.lock().shed_ready(mb)
    }
}

impl Sessions {
    /// The sessions of the server whose runs `runs` manages; they give the memory of those
    /// opened ahead of time back when its queued runs need it. Must be called inside a tokio
    /// runtime (it starts the expiry).
    pub fn new(runs: RunManager) -> Arc<Sessions> {
        let sessions = Arc::new(Sessions {
            config: runs.config().clone(),
            registry: runs.registry().clone(),
            executor: runs.executor().clone(),
            history: runs.history().cloned(),
            runs,
            table: Mutex::new(Table::default()),
            tasks: Mutex::new(Vec::new()),
        });
        let weak: Weak<Sessions> = Arc::downgrade(&sessions);
        sessions.runs.give_way_from(weak.clone());
        let mut tasks = vec![AbortOnDropHandle::new(tokio::spawn(expire_loop(
            weak.clone(),
        )))];
        if let Some(h) = &sessions.history {
            let lapses = h.lapses();
            tasks.push(AbortOnDropHandle::new(tokio::spawn(lapse_loop(
                weak, lapses,
            ))));
        }
        *sessions.tasks.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
        sessions
    }

    /// The run manager the sessions' executions run on.
    pub fn runs(&self) -> &RunManager {
        &self.runs
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every update is a few assignments: a poisoned lock holds consistent data.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a session: at once, or refused at once (never queued).
    pub async fn create(
        self: &Arc<Self>,
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
            if t.closed || self.runs.is_closed() {
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
            self.runs.claim(ready.memory_mb);
            let info = self.insert(ready.container, &valid, &new_session_id());
            self.refill_ready();
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
                self.runs.unhold(freed, true);
            }
            if let Some(why) = refusal {
                return Err(SessionError::Full(why));
            }
        }
        let mut opening = Opening {
            sessions: self,
            runs: &self.runs,
            mb: memory_mb,
            held: false,
            armed: true,
        };
        self.runs
            .hold(memory_mb, false)
            .map_err(SessionError::Full)?;
        opening.held = true;
        // Its packages install in a container of their own while it opens: that memory is
        // held too, until the install is over.
        let installing = if valid.packages.is_empty() {
            None
        } else {
            let mb = self.config.packages.install_memory_mb;
            self.runs.hold(mb, false).map_err(SessionError::Full)?;
            Some(Installing {
                runs: &self.runs,
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
        self.insert(container, &valid, &id)
    }

    /// Record an opened container as session `id` (its memory is held already); after a
    /// shutdown it is removed instead, and its memory given back.
    fn insert(
        &self,
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
            self.runs.unhold(valid.limits.memory_mb, false);
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
        self.runs.metrics().session_opened();
        Ok(info)
    }

    /// A run request as the doors take it: executed in its session when it names one
    /// ([`Sessions::execute`]), otherwise a run like any other.
    pub fn submit(self: &Arc<Self>, req: RunRequest) -> Result<Accepted, SubmitError> {
        match req.session_id.clone() {
            Some(id) => self.execute(&id, req),
            None => self.runs.submit(req),
        }
    }

    /// Run `req` in session `id`: checked against the session's terms (its language, memory
    /// and CPU), then submitted to runs as a [`Job`] that executes in the session's
    /// container: one slot, and the compile stage's memory for a compiled language (the
    /// session holds its own).
    fn execute(self: &Arc<Self>, id: &str, req: RunRequest) -> Result<Accepted, SubmitError> {
        let run_id = new_run_id();
        let begun = self.begin_execution(id, &run_id)?;
        let checked = match self.registry.languages.get(&begun.language) {
            None => Err(SessionError::Unknown { id: id.to_string() }.into()),
            Some(lang) => {
                let terms = SessionTerms {
                    language: lang,
                    limits: begun.limits,
                    max_upload_bytes: self.config.sessions.max_upload_bytes,
                };
                ValidRequest::for_session(req, &self.registry, terms, &self.config)
                    .map_err(SubmitError::from)
            }
        };
        let execution = Execution {
            sessions: self.clone(),
            id: id.to_string(),
            run_id: run_id.clone(),
            container: begun.container,
            count: begun.execution,
            over: false,
        };
        let valid = match checked {
            Ok(v) => v,
            Err(e) => {
                drop(execution);
                self.uncount(id);
                return Err(e);
            }
        };
        let job = Job {
            run_id: run_id.clone(),
            charge_mb: execution_charge(&valid, &self.config),
            request: valid,
            serial: id.to_string(),
            at: SessionExecution {
                session_id: id.to_string(),
                execution_count: begun.execution,
                state: begun.state,
                reset_reason: None,
            },
            work: Box::new(execution),
        };
        // Refused: its work was dropped unrun, which ended it here; it counts for nothing.
        let accepted = self
            .runs
            .submit_job(job)
            .inspect_err(|_| self.uncount(id))?;
        // The session began ending since the execution was counted: it is stopped, naming
        // the end (an end after this stops it through the session's runs).
        if let Some(message) = self.ending_message(id) {
            self.runs.stop_runs(&[run_id], &message);
        }
        Ok(accepted)
    }

    /// An execution in session `id` is accepted as run `run_id`: counted, the idle clock
    /// stands still.
    fn begin_execution(&self, id: &str, run_id: &str) -> Result<Begun, SessionError> {
        let mut t = self.lock();
        let s = t.usable(id)?;
        s.executions += 1;
        s.pending += 1;
        s.runs.push(run_id.to_string());
        s.touch();
        Ok(Begun {
            container: s.container.clone(),
            language: s.language.clone(),
            limits: s.limits,
            execution: s.executions,
            state: s.state,
        })
    }

    /// An execution counted by [`Sessions::begin_execution`] was refused: it is not one of
    /// the session's (its [`Sessions::ended`] came first).
    fn uncount(&self, id: &str) {
        if let Some(s) = self.lock().open.get_mut(id) {
            s.executions = s.executions.saturating_sub(1);
        }
    }

    /// Why session `id` is ending, as its stopped executions say it; `None` if it is not.
    fn ending_message(&self, id: &str) -> Option<String> {
        let t = self.lock();
        let reason = t.open.get(id)?.ending.as_ref()?;
        Some(end_message(id, reason))
    }

    /// Execution `run_id` of session `id` started running.
    fn started(&self, id: &str, run_id: &str) {
        if let Some(s) = self.lock().open.get_mut(id) {
            s.running = Some(run_id.to_string());
        }
    }

    /// Execution `run_id` of session `id` ended (or will never run): the idle clock starts
    /// again, the interpreter's state is noted, and a broken container ends the session.
    /// Locks only the table (the run manager may hold its lock); once per execution.
    fn ended(&self, id: &str, run_id: &str, end: After) -> Effects {
        let mut t = self.lock();
        if let Some(s) = t.open.get_mut(id) {
            let Some(at) = s.runs.iter().position(|r| r == run_id) else {
                return Effects::default();
            };
            s.runs.remove(at);
            s.pending = s.pending.saturating_sub(1);
            if s.running.as_deref() == Some(run_id) {
                s.running = None;
            }
            s.touch();
            if let Some(state) = end.state {
                s.state = state;
            }
            if let Some(b) = end.workspace_bytes {
                s.workspace_bytes = b;
            }
        }
        let mut effects = Effects::default();
        if let Some(b) = end.broken {
            effects = t.begin_end(id, broken_reason(b));
        }
        effects.and(t.complete(id, self.history.as_ref(), self.runs.metrics()))
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
    pub(crate) fn knows(&self, id: &str) -> bool {
        let t = self.lock();
        t.open.contains_key(id) || t.ended.contains_key(id)
    }

    /// `cluster.lease_seconds`: a server silent for longer is gone.
    fn lease(&self) -> Duration {
        self.config.cluster.lease()
    }

    /// Open sessions, those opened ahead of time, and the memory all of them hold.
    pub fn counts(&self) -> SessionCounts {
        let t = self.lock();
        SessionCounts {
            open: t.open.len(),
            ready: t.ready.len(),
            memory_mb: t.held_mb(),
        }
    }

    /// The run manager's counts with the sessions' own: the whole picture for `/metrics`
    /// and `/healthz`.
    pub fn stats(&self) -> crate::runs::Stats {
        crate::runs::Stats {
            sessions: self.counts(),
            ..self.runs.stats()
        }
    }

    /// Close a session: its container is removed at once, an execution under way is
    /// stopped. Closing a session that has ended answers as its close did.
    pub fn close(&self, id: &str) -> Result<Closed, SessionError> {
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
        let effects = t.end(
            id,
            EndReason::Closed,
            self.history.as_ref(),
            self.runs.metrics(),
        );
        drop(t);
        effects.apply(&self.runs);
        Ok(Closed {
            session_id: id.to_string(),
            executions,
            closed: true,
        })
    }

    /// [`Sessions::close`], answered once the session's container is gone (or, if Docker is
    /// slow to remove it, after 10 s): a caller told "closed" finds nothing of it left. What
    /// the doors' `close_session` does.
    pub async fn close_removed(&self, id: &str) -> Result<Closed, SessionError> {
        let within = CLOSE_REMOVAL_WAIT;
        let removed = self.lock().open.get(id).map(|s| s.container.removed());
        let closed = self.close(id)?;
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
                let effects = t.end(
                    id,
                    reason.clone(),
                    self.history.as_ref(),
                    self.runs.metrics(),
                );
                drop(t);
                effects.apply(&self.runs);
                return Err(reason.error(id));
            }
        };
        SessionFile::from_entries(&path, offset, read.decoded.files)
    }

    /// End sessions past their idle timeout or their lifetime; replace containers opened
    /// ahead of time that waited too long, and open what `sessions.ready` asks for.
    pub fn expire(self: &Arc<Self>) {
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
            effects = effects.and(t.end(&id, reason, self.history.as_ref(), self.runs.metrics()));
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
        effects.apply(&self.runs);
        self.refill_ready();
    }

    /// Keep `sessions.ready` containers opened ahead of time from now on (`codebox serve`).
    pub fn start_ready(self: &Arc<Self>) {
        self.lock().keep_ready = true;
        self.refill_ready();
    }

    /// Open containers ahead of time where `sessions.ready` asks for more, while the
    /// sessions' share and count and the budget have room for them.
    fn refill_ready(self: &Arc<Self>) {
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
                if self.runs.hold(d.memory_mb, true).is_err() {
                    let mut t = self.lock();
                    if let Some(i) = t.filling.iter().position(|(l, _)| *l == lang.id) {
                        t.filling.swap_remove(i);
                    }
                    break;
                }
                let (sessions, lang) = (self.clone(), lang.clone());
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
                            sessions.runs.opened_ahead();
                        }
                        other => {
                            drop(t);
                            if let Err(e) = other {
                                tracing::warn!(language = lang.id, error = %e, "could not open a session ahead of time");
                            }
                            sessions.runs.unhold(d.memory_mb, true);
                        }
                    }
                });
            }
        }
    }

    /// End these sessions, which the other servers ended while this server's lease was
    /// judged lapsed ("the server that held it stopped"): their containers go, a call
    /// naming one is told so.
    fn end_lapsed(&self, ids: &[String]) {
        let mut t = self.lock();
        let mut effects = Effects::default();
        for id in ids {
            if t.open.contains_key(id) {
                let reason = EndReason::Failed(SERVER_STOPPED.to_string());
                effects =
                    effects.and(t.end(id, reason, self.history.as_ref(), self.runs.metrics()));
            }
        }
        drop(t);
        effects.apply(&self.runs);
    }

    /// Shut down: end every session and remove the containers opened ahead of time (from
    /// now on nothing opens, and runs start nothing), then [`RunManager::shutdown`] with
    /// `grace`.
    pub async fn shutdown(&self, grace: Duration) {
        self.end_all();
        self.runs.shutdown(grace).await;
    }

    /// End every session, and remove the containers opened ahead of time.
    fn end_all(&self) {
        self.runs.close();
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).clear();
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
                self.runs.metrics(),
            );
            effects = effects.and(e);
        }
        drop(t);
        effects.apply(&self.runs);
    }

    /// An error about a session, told better where the history knows more: a session this
    /// process does not know may have ended on it before a restart, or be another server's.
    pub(crate) async fn explain(&self, e: SessionError) -> SessionError {
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
                Some(r) => r.error(&id),
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
    let message = reason.error(id).to_string();
    message.trim_start_matches("session_id: ").to_string()
}

fn broken_reason(b: Broken) -> EndReason {
    match b {
        Broken::OutOfMemory => EndReason::OutOfMemory,
        Broken::Failed(why) => EndReason::Failed(format!("its sandbox failed: {why}")),
    }
}

/// End sessions past their idle timeout or lifetime, every [`SESSION_TICK`].
async fn expire_loop(sessions: Weak<Sessions>) {
    let mut tick = tokio::time::interval(SESSION_TICK);
    loop {
        tick.tick().await;
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        sessions.expire();
    }
}

/// Each time this server finds its lease was judged lapsed (SPEC section 15): end the
/// sessions the other servers ended meanwhile.
async fn lapse_loop(sessions: Weak<Sessions>, mut lapses: watch::Receiver<Lapse>) {
    while lapses.changed().await.is_ok() {
        let Some(sessions) = sessions.upgrade() else {
            return;
        };
        let Some(history) = sessions.history.clone() else {
            return;
        };
        let ids: Vec<String> = sessions.lock().open.keys().cloned().collect();
        let mut ended = Vec::new();
        for id in ids {
            if let Ok(Some(record)) = history.session(&id).await {
                if record.ended.is_some() {
                    ended.push(id);
                }
            }
        }
        if !ended.is_empty() {
            tracing::warn!(
                sessions = ended.len(),
                "ending the sessions the other servers ended while this server's lease was judged lapsed"
            );
        }
        sessions.end_lapsed(&ended);
    }
}
