//! Reports that are not in this manager's memory: evicted ones (within their retention), and
//! runs of other servers sharing the history database. A run another server accepted is
//! answered from the database once it has ended; while it is unfinished there, the answer is
//! [`LookupError::Elsewhere`], naming that server, and a wait looks again until the end.

use std::time::Duration;

use super::Dispatch;
use crate::history::{now_ms, History};
use crate::report::{RunLimits, RunReport, Status};

/// The limits of a run whose request is not at hand.
pub const NO_LIMITS: RunLimits = RunLimits {
    memory_mb: 0,
    timeout_seconds: 0.0,
    cpus: 0.0,
};

/// Where reports not in memory are looked for, and how long they are kept.
pub(super) struct Where<'a> {
    pub history: Option<&'a History>,
    /// This server's instance id.
    pub instance: &'a str,
    /// It says where a run it placed stands until a server runs it.
    pub dispatch: &'a dyn Dispatch,
    pub retention: Duration,
    pub retained_reports_mb: u64,
}

/// How often `get_result` with `wait_seconds` looks again at a run another server holds.
pub const ELSEWHERE_POLL: Duration = Duration::from_millis(500);
/// How long `get_result` with `wait_seconds` looks again for a run id the history does not
/// know yet: another server sharing it may have accepted the run a moment ago (its history
/// writes trail its answers).
pub const UNKNOWN_GRACE: Duration = Duration::from_secs(2);
/// How often it looks during that grace.
pub const UNKNOWN_POLL: Duration = Duration::from_millis(100);

/// Why a run's report cannot be given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LookupError {
    /// Never known here, or finished longer ago than the retention.
    #[error("run_id: no run `{run_id}` is known to this server (reports are kept for {retention_seconds} s after a run ends; see get_execution_history for older runs)")]
    Unknown {
        run_id: String,
        retention_seconds: u64,
    },
    /// Accepted by another codebox server that shares this history database, and not
    /// finished (as far as the database knows): only that server holds it and can stop it.
    #[error("run_id: run `{run_id}` is {status} on another codebox server ({owner}); only that server holds it and can stop it. Its report can be read from any server sharing the history database once it ends (get_result with wait_seconds waits for that)", status = status.as_str())]
    Elsewhere {
        run_id: String,
        status: Status,
        /// The owning instance, its host and when it was last heard from.
        owner: String,
    },
    /// Finished within the retention, but its report left memory (the reports held exceeded
    /// `runs.retained_reports_mb`) and the history database cannot give it back.
    #[error("run_id: the report of run `{run_id}` was evicted from memory because finished reports exceeded `runs.retained_reports_mb` ({retained_reports_mb} MB), and the history database cannot supply it: {detail}. Its metadata may still be in get_execution_history; the operator can raise `runs.retained_reports_mb` or fix the history database")]
    Evicted {
        run_id: String,
        retained_reports_mb: u64,
        detail: String,
    },
}

/// The final report of a run that is not in memory: evicted (within the retention;
/// `evicted_live` says whether it was, `None` when it was never held here), or finished
/// by an earlier server on the same history database. Either comes from the history while
/// its retention lasts; anything else is unknown.
pub(super) async fn stored(
    at: Where<'_>,
    run_id: &str,
    evicted_live: Option<bool>,
) -> Result<RunReport, LookupError> {
    let retention = at.retention;
    let unknown = || LookupError::Unknown {
        run_id: run_id.to_string(),
        retention_seconds: retention.as_secs(),
    };
    let evicted = |detail: String| LookupError::Evicted {
        run_id: run_id.to_string(),
        retained_reports_mb: at.retained_reports_mb,
        detail,
    };
    let history = at.history;
    match (evicted_live, history) {
        (Some(false), _) | (None, None) => Err(unknown()),
        (None, Some(h)) => {
            let since = now_ms().saturating_sub(retention.as_millis() as i64);
            match h.report(run_id, Some(since)).await {
                Ok(Some(r)) => Ok(r),
                Ok(None) => held_elsewhere(h, run_id, at.instance, at.dispatch)
                    .await
                    .unwrap_or_else(|| Err(unknown())),
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "cannot look up a report in the history");
                    Err(unknown())
                }
            }
        }
        (Some(true), None) => Err(evicted("this server keeps no history".into())),
        (Some(true), Some(h)) => match h.report(run_id, None).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(evicted(
                "the history database holds no copy of it (its write failed; see the log)".into(),
            )),
            Err(e) => Err(evicted(e.to_string())),
        },
    }
}

/// [`LookupError::Elsewhere`] if the history says another instance holds the run
/// unfinished; its report as it stands while the dispatch that placed it says it waits for a
/// server ([`Dispatch::standing`]).
async fn held_elsewhere(
    history: &History,
    run_id: &str,
    instance: &str,
    dispatch: &dyn Dispatch,
) -> Option<Result<RunReport, LookupError>> {
    let w = match history.whereabouts(run_id).await {
        Ok(w) => w?,
        Err(e) => {
            tracing::warn!(run_id, error = %e, "cannot look up a run in the history");
            return None;
        }
    };
    if let Some((status, message)) = dispatch.standing(&w, w.instance == instance) {
        let row = history.get(run_id).await.ok().flatten();
        let mut r = RunReport::new(
            run_id,
            row.as_ref().map(|r| r.language.clone()).unwrap_or_default(),
            status,
            row.as_ref().map(|r| r.limits).unwrap_or(NO_LIMITS),
            message,
        );
        if let Some(created) =
            row.and_then(|r| chrono::DateTime::parse_from_rfc3339(&r.created_at).ok())
        {
            r.queued_ms = (now_ms() - created.timestamp_millis()).max(0) as u64;
        }
        return Some(Ok(r));
    }
    if w.status.is_terminal() {
        // It ended between the two looks (on another server): its report is stored now.
        return history.report(run_id, None).await.ok().flatten().map(Ok);
    }
    let mut owner = format!("instance {}", w.instance);
    if let Some(host) = &w.host {
        owner.push_str(&format!(" on host {host}"));
    }
    if let Some(ms) = w.last_seen_ms_ago {
        owner.push_str(&format!(
            ", last heard from {:.0} s ago",
            ms as f64 / 1000.0
        ));
    }
    Some(Err(LookupError::Elsewhere {
        run_id: run_id.to_string(),
        status: w.status,
        owner,
    }))
}
