//! What the sessions tests on the fake engine share: requests to open a session and to run a
//! cell in one, a run waited to its end, and a session's execution state.

use std::time::Duration;

use codebox::contract::{LimitsInput, RunRequest, SessionRequest};
use codebox::report::{InterpreterState, ResetReason};
use codebox::sessions::SessionInfo;
use std::sync::Arc;

use codebox::sessions::Sessions;

pub(crate) fn open(language: &str) -> SessionRequest {
    SessionRequest {
        language: language.into(),
        ..Default::default()
    }
}

pub(crate) fn cell(session: &SessionInfo, code: &str) -> RunRequest {
    RunRequest {
        code: code.into(),
        session_id: Some(session.session_id.clone()),
        ..Default::default()
    }
}

pub(crate) async fn run(m: &Arc<Sessions>, req: RunRequest) -> codebox::report::RunReport {
    let id = m.submit(req).expect("accepted").run_id;
    m.runs().wait(&id, Duration::from_secs(20)).await.unwrap()
}

pub(crate) fn state(
    r: &codebox::report::RunReport,
) -> (u64, InterpreterState, Option<ResetReason>) {
    let s = r.session.as_ref().expect("a session's execution");
    (s.execution_count, s.state, s.reset_reason)
}

/// A run for `language` asking for `memory_mb`.
pub(crate) fn asking(language: &str, memory_mb: u64) -> RunRequest {
    RunRequest {
        language: language.into(),
        code: "print(1)".into(),
        limits: Some(LimitsInput {
            memory_mb: Some(memory_mb as f64),
            ..Default::default()
        }),
        ..Default::default()
    }
}
