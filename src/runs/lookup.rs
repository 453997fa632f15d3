//! Reports that are not in this manager's memory: evicted ones (within their retention), and
//! runs of other servers sharing the history database. A run another server accepted is
//! answered from the database once it has ended; while it is unfinished there, the answer is
//! [`LookupError::Elsewhere`], naming that server, and a wait looks again until the end.

use std::time::Duration;

use crate::report::Status;

/// How often `get_result` with `wait_seconds` looks again at a run another server holds.
pub(super) const ELSEWHERE_POLL: Duration = Duration::from_millis(500);
/// How long `get_result` with `wait_seconds` looks again for a run id the history does not
/// know yet: another server sharing it may have accepted the run a moment ago (its history
/// writes trail its answers).
pub(super) const UNKNOWN_GRACE: Duration = Duration::from_secs(2);
/// How often it looks during that grace.
pub(super) const UNKNOWN_POLL: Duration = Duration::from_millis(100);

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
