//! Opening a session: at once or refused at once; and the containers opened ahead of time
//! (`sessions.ready`) that a `create_session` with the default limits takes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{log_id, new_session_id, OpenSession, SessionError, SessionInfo, SESSION_PREFIX};
use crate::engine::posture::Limits;
use crate::engine::protocol::{Entry, Files};
use crate::executor::session::{SessionBox, SessionSpec};
use crate::executor::SandboxFailure;
use crate::contract::{SessionRequest, ValidSession};
use crate::report::InterpreterState;
use crate::runs::RunManager;

/// A session's container opened ahead of time (`sessions.ready`), waiting for its
/// `create_session`: its driver started, nothing else run in it. Its memory is held.
pub(in crate::runs) struct Ready {
    language: String,
    container: Arc<SessionBox>,
    since: Instant,
    memory_mb: u64,
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
    pub(in crate::runs) fn refill_ready(&self) {
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
                // Tracked with removals: shutdown waits for it, so the container it opens is
                // removed before the process exits.
                self.inner.executor.cleanup().spawn(async move {
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
    pub(in crate::runs) fn expire_ready(&self, all: bool) {
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
}

/// A sandbox failure as a session's error text.
fn failure_text(e: &SandboxFailure) -> String {
    e.to_string()
}
