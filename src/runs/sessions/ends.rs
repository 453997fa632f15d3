//! How sessions end: closed, expired, at their lifetime, when their container breaks, at
//! shutdown; what a later call naming one is told; and what an execution's end changes.

use super::{log_id, Closed, EndReason, SessionError, SessionInfo, SessionList};
use crate::executor::session::Broken;
use crate::report::{InterpreterState, Status};
use crate::runs::{RunManager, State};

impl RunManager {
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
        if let Some(s) = st.sessions.open.get(id) {
            s.container.end_now(); // removed at once: no interrupt's grace, no driver restart
        }
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

    /// End a session for `reason`: queued executions end `stopped` naming the end; a
    /// running one is stopped, and the container goes when it has ended.
    pub(in crate::runs) fn end_session(&self, st: &mut State, id: &str, reason: EndReason) {
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
    pub(in crate::runs) fn complete_end(&self, st: &mut State, id: &str) {
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
    pub(in crate::runs) fn execution_ended(
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
    pub(in crate::runs) fn expire_sessions(&self) {
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
    pub(in crate::runs) fn end_all_sessions(&self) {
        self.expire_ready(true);
        let mut st = self.lock();
        let ids: Vec<String> = st.sessions.open.keys().cloned().collect();
        for id in ids {
            self.end_session(&mut st, &id, EndReason::ShuttingDown);
        }
    }
}
