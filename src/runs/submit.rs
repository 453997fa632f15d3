//! What taking a request answers (the run accepted, or why not), and a [`Job`]: a run that
//! whoever submits it carries out.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::contract::{RequestError, SessionError, ValidRequest};
use crate::live::Feed;
use crate::report::{RunLimits, RunReport, SessionExecution, Status};

/// A run carried out by whoever submits it rather than in containers of its own: an
/// execution in a session's container (the sessions wing makes these). It is queued,
/// charged, started in turn and reported like any run.
pub struct Job {
    /// Its id, chosen by the submitter (who may need it before the run starts).
    pub run_id: String,
    pub request: ValidRequest,
    /// The memory it holds while admitted (it takes one slot).
    pub charge_mb: u64,
    /// Jobs with the same key run one at a time, in order of submission.
    pub serial: String,
    /// What the report says of where it ran, before it runs.
    pub at: SessionExecution,
    /// Carries it out once admitted; dropped unrun when it never starts.
    pub work: Box<dyn Work>,
}

/// What a [`Job`] does once admitted.
pub trait Work: Send {
    /// Carry the run out; its report is the run's. Called as the run starts, with the run
    /// manager locked: what it does before its future is first polled must not call the
    /// run manager (the future itself runs on a task of its own).
    fn run(self: Box<Self>, start: Start) -> BoxFuture<'static, RunReport>;
}

/// An admitted run, as its work receives it.
pub struct Start {
    pub run_id: String,
    pub request: ValidRequest,
    pub queued_ms: u64,
    /// Cancelled when the run is stopped.
    pub cancel: CancellationToken,
    /// Its live events.
    pub feed: Arc<Feed>,
}

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

/// Why a run's task ended without a report: it panicked, or it was abandoned.
pub(super) fn why_it_failed(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "codebox was shutting down and abandoned the run; its containers are being removed"
            .to_string();
    }
    let payload = e.into_panic();
    let why = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("codebox failed while carrying out the run (a task panicked: {why}); its containers are being removed")
}

/// A run's task: a job's work, or the executor carrying out the request in containers of
/// its own. A job's work begins as this is called, when the run starts ([`Work::run`]).
pub(super) fn carry_out(
    executor: Arc<crate::executor::Executor>,
    work: Option<Box<dyn Work>>,
    start: Start,
) -> BoxFuture<'static, RunReport> {
    match work {
        Some(work) => work.run(start),
        None => Box::pin(async move {
            let call = crate::executor::Call {
                run_id: &start.run_id,
                req: &start.request,
                queued_ms: start.queued_ms,
                cancel: start.cancel,
                feed: Some(&start.feed),
            };
            executor.execute_live(call).await
        }),
    }
}
