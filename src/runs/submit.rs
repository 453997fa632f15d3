//! Taking a request: validated, charged, given an id, recorded, queued. An execution in a
//! session takes its session's language, memory and CPU, one run slot, and (for a compiled
//! language) its compile stage's memory: the session holds its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admission::{Refusal, Ticket};
use super::sessions::SessionError;
use super::{memory_charge, Live, LiveSession, RunManager, RunState};
use crate::executor::pool::Pool;
use crate::executor::{new_run_id, parallelism, Executor};
use crate::contract::{RequestError, RunRequest, SessionTerms, ValidRequest};
use crate::history::NewRun;
use crate::report::{RunLimits, SessionExecution, Status};

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

impl RunManager {
    /// Validate a request and queue it. Returns at once; the run starts when admitted.
    pub fn submit(&self, req: RunRequest) -> Result<Accepted, SubmitError> {
        if let Some(id) = req.session_id.clone() {
            return self.submit_in_session(&id, req);
        }
        let valid = ValidRequest::new(req, &self.inner.registry, &self.inner.config)?;
        let budget_mb = self.inner.config.runs.memory_budget_mb;
        let slots = parallelism(&valid, &self.inner.config);
        let charge_mb = memory_charge(&valid.language, &valid.limits, slots);
        if charge_mb > budget_mb {
            return Err(SubmitError::Invalid(RequestError {
                field: "limits.memory_mb".into(),
                message: format!(
                    "requested {} MB of memory; this server runs at most {budget_mb} MB of runs at once, so the maximum here is {budget_mb} MB",
                    valid.limits.memory_mb
                ),
            }));
        }
        self.enqueue(valid, slots, charge_mb)
    }

    /// An execution in session `id`: the session's language, memory and CPU; one run slot,
    /// and the compile stage's memory for a compiled language (the session holds its own).
    fn submit_in_session(&self, id: &str, req: RunRequest) -> Result<Accepted, SubmitError> {
        let (language, limits) = {
            let mut st = self.lock();
            let s = st.sessions.usable(id)?;
            (s.language.clone(), s.limits)
        };
        let registry = &self.inner.registry;
        let Some(lang) = registry.languages.get(&language) else {
            return Err(SessionError::Unknown { id: id.to_string() }.into());
        };
        let terms = SessionTerms {
            language: lang,
            limits,
            max_upload_bytes: self.inner.config.sessions.max_upload_bytes,
        };
        let valid = ValidRequest::for_session(req, registry, terms, &self.inner.config)?;
        let charge_mb = if lang.is_compiled() {
            lang.compile_limits.memory_mb
        } else {
            0
        };
        self.enqueue(valid, 1, charge_mb)
    }

    fn enqueue(
        &self,
        valid: ValidRequest,
        slots: usize,
        charge_mb: u64,
    ) -> Result<Accepted, SubmitError> {
        self.purge_expired();
        let run_id = new_run_id();
        let limits = valid.limits;
        // The history row (its code hash) is made before the lock is taken.
        let row = self.inner.history.as_ref().map(|_| {
            NewRun::new(
                &run_id,
                &valid.language.id,
                limits,
                &valid.code,
                self.inner.config.history.code,
                self.inner.executor.instance(),
            )
        });
        let mut base = Executor::blank_report(&run_id, &valid);
        let budget = Executor::budget(&valid);
        // The pool follows what runs ask for (a session's execution runs in its own container).
        let shapes = if valid.session.is_none() {
            Pool::shapes_of(&valid, &self.inner.config, slots)
        } else {
            Vec::new()
        };
        let mut st = self.lock();
        let mut row = row;
        let session = match &valid.session {
            None => None,
            Some(target) => {
                let s = st.sessions.usable(&target.id)?;
                s.executions += 1;
                row = row.map(|r| r.in_session(&target.id, s.executions));
                s.pending += 1;
                s.touch();
                base.session = Some(SessionExecution {
                    session_id: target.id.clone(),
                    execution_count: s.executions,
                    state: s.state,
                    reset_reason: None,
                });
                Some(LiveSession {
                    id: target.id.clone(),
                    container: s.container.clone(),
                    execution: s.executions,
                })
            }
        };
        let ticket = Ticket {
            run_id: run_id.clone(),
            slots,
            charge_mb,
            session: session.as_ref().map(|s| s.id.clone()),
        };
        if let Err(refusal) = st.admission.enqueue(ticket.clone()) {
            if let Some(s) = session.and_then(|x| st.sessions.open.get_mut(&x.id)) {
                s.executions -= 1;
                s.pending -= 1;
            }
            return Err(match refusal {
                Refusal::Closed => SubmitError::ShuttingDown,
                Refusal::QueueFull { waiting, max } => {
                    self.inner.metrics.rejected_queue_full();
                    SubmitError::QueueFull { waiting, max }
                }
            });
        }
        if let (Some(h), Some(row)) = (&self.inner.history, row) {
            h.insert(row);
        }
        self.inner.executor.pool().asked(&valid.language, &shapes);
        let (done, _) = watch::channel(None);
        st.live.insert(
            run_id.clone(),
            Live {
                base,
                ticket,
                shapes,
                session,
                budget,
                accepted: Instant::now(),
                state: RunState::Queued {
                    request: Box::new(valid),
                },
                cancel: CancellationToken::new(),
                done,
            },
        );
        self.pump(&mut st);
        let status = match st.live.get(&run_id).map(|r| &r.state) {
            Some(RunState::Queued { .. }) => Status::Queued,
            _ => Status::Running,
        };
        Ok(Accepted {
            run_id,
            status,
            limits,
        })
    }
}
