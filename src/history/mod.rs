//! The run history: one row per run, in an SQLite file (the embedded default) or in a
//! PostgreSQL database that several codebox servers share, written from a dedicated thread.
//!
//! The async side holds a cloneable [`History`] handle and sends commands over a channel; it
//! never waits for a write. A write that fails is logged (`warn`) and dropped: history is a
//! record, and a broken database must never fail or delay a run. Queries get their answer over
//! a oneshot channel. If the database cannot be reached (at start, or a PostgreSQL connection
//! is lost), the thread tries again every `RECONNECT_INTERVAL`; meanwhile writes are
//! dropped and queries answer [`HistoryError::Unavailable`].
//!
//! Both backends sit behind one seam, [`db::Database`]: the schema, its migrations, the
//! queries and the row mapping are written once (`schema.rs`, `store.rs`) in SQL that both
//! accept.
//!
//! Each codebox process (an *instance*) writes a heartbeat into the `instances` table every
//! `Owner::heartbeat_interval`. At open, and at every heartbeat, rows that a dead instance left
//! `queued` or `running` are marked `sandbox_error` with the message "interrupted by server
//! restart". An instance is dead when its lock file in this process's data directory says so
//! (same host, same data directory: known at once), or else when its heartbeat is older than
//! [`INSTANCE_EXPIRY`] by the database's clock (another host: known within a minute). The
//! runs of living instances, wherever they are, are never touched.
//!
//! Besides the metadata kept forever (SPEC section 9), a row holds the run's full final report
//! (JSON, `report` column) for the retention period only: the run manager serves reports it
//! evicted from memory from here, and clears the column when the retention has passed
//! ([`History::forget_reports`], `History::forget_reports_ended_before`). With a shared
//! store, any server answers `get_result` for a finished run of another from this column.

mod actor;
pub(crate) mod db;
mod pg;
mod pg_tls;
mod queue;
mod schema;
mod scratch;
mod sessions;
mod sqlite;
mod store;

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::config::{CodePolicy, HistoryStore, CODE_PREVIEW_CHARS};
use crate::report::{RunLimits, RunReport, Stage, Status};
use actor::{Actor, Command, QueueBounds, NO_ANSWER, QUEUE};
use db::{Database, DbError};
pub use queue::{Claimed, QueueError, Room, SharedQueue, Submitted};
pub use schema::SCHEMA_VERSION;
pub(crate) use scratch::Scratch;
pub(crate) use sessions::{
    SessionOpened, SessionRecord, RESTARTED as SESSION_RESTARTED,
    SERVER_STOPPED as SESSION_SERVER_STOPPED,
};

/// Message written on rows a crashed server left unfinished.
pub(crate) const INTERRUPTED_MESSAGE: &str = "interrupted by server restart";
/// Rows returned when a query sets no limit.
pub(crate) const DEFAULT_QUERY_LIMIT: usize = 20;
/// Most rows one query returns.
pub(crate) const MAX_QUERY_LIMIT: usize = crate::contract::params::MAX_HISTORY_LIMIT;
/// The message of a run whose server's lease lapsed (another host: it stopped answering).
pub(crate) const STOPPED_ANSWERING_MESSAGE: &str = "its server stopped answering";
/// An instance whose last heartbeat is older than this (by the database's clock), and whose
/// liveness no lock file in this data directory tells, is dead.
pub const INSTANCE_EXPIRY: Duration = Duration::from_secs(10);
/// The shared queue (`queue.rs`): notified when a run is added to the queue or given back to it.
pub(crate) const QUEUE_CHANNEL: &str = "codebox_queue";
/// Notified when a run changes hands (claimed) or ends: a server waiting on a run it does not
/// hold looks again.
pub(crate) const MOVED_CHANNEL: &str = "codebox_moved";
/// The advisory lock held by the one server judging leases at a time.
pub(crate) const JUDGE_LOCK: i64 = 0x0063_6f64_656a_7564; // "codejud"
/// How often the history thread tries again to open a database it cannot reach.
pub(crate) const RECONNECT_INTERVAL: Duration = Duration::from_secs(5);

/// One run as the history records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryRow {
    /// The run id (as returned by `start_run`).
    pub run_id: String,
    /// When the run was accepted (RFC 3339, UTC).
    pub created_at: String,
    /// When it left the queue and started (RFC 3339, UTC); null if it never started.
    pub started_at: Option<String>,
    /// When it reached its final status (RFC 3339, UTC); null while in progress.
    pub ended_at: Option<String>,
    /// Language id.
    pub language: String,
    /// Docker image id the run's containers were created from; null if none was created.
    pub image_id: Option<String>,
    /// The limits the run was given.
    pub limits: RunLimits,
    /// Current or final status.
    pub status: Status,
    /// Stage the final status came from (`compile` or `run`).
    pub stage: Option<Stage>,
    /// Exit code of the program (or of the compiler on `compile_error`).
    pub exit_code: Option<i64>,
    /// Signal that killed the program, e.g. `SIGKILL`.
    pub signal: Option<String>,
    /// Wall time from admission to the end, in milliseconds.
    pub duration_ms: Option<u64>,
    /// Time spent waiting for a slot, in milliseconds.
    pub queued_ms: Option<u64>,
    /// Duration of the compile stage, in milliseconds; null for interpreted languages.
    pub compile_duration_ms: Option<u64>,
    /// Bytes the program wrote to stdout (including any beyond the cap).
    pub stdout_bytes: u64,
    /// Bytes the program wrote to stderr (including any beyond the cap).
    pub stderr_bytes: u64,
    /// Whether stdout was cut at the output cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the output cap.
    pub stderr_truncated: bool,
    /// SHA-256 of the code, lowercase hex.
    pub code_sha256: String,
    /// Size of the code in bytes.
    pub code_bytes: u64,
    /// The code as the operator's policy keeps it: null (`none`), the first 500 characters
    /// (`preview`, the default) or all of it (`full`).
    pub code_preview: Option<String>,
    /// One sentence on what happened.
    pub message: String,
    /// The codebox process (server or command) that accepted the run: several servers may
    /// share one history database.
    pub instance: String,
    /// The session the run executed in; null outside sessions.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Its place among the session's executions (1-based); null outside sessions.
    #[serde(default)]
    pub execution_count: Option<u64>,
    /// The packages it asked for and how they were installed (the report's `packages`); null
    /// for a run without any, or one still in progress.
    #[serde(default)]
    pub packages: Option<crate::report::PackagesReport>,
}

/// Result of `get_execution_history` and `codebox history --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HistoryResult {
    /// Matching runs, newest first. Code is kept as the operator's policy says
    /// (`code_preview`: null, the first 500 characters, or all of it).
    pub runs: Vec<HistoryRow>,
}

/// Filters of a history query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    /// At most this many rows (default 20, at most 1000).
    pub limit: Option<usize>,
    pub status: Option<Status>,
    /// A language id (not an alias).
    pub language: Option<String>,
    /// Only the executions of this session.
    pub session_id: Option<String>,
}

impl From<crate::contract::params::HistoryFilter> for Query {
    fn from(f: crate::contract::params::HistoryFilter) -> Query {
        Query {
            limit: f.limit,
            status: f.status,
            language: f.language,
            session_id: f.session_id,
        }
    }
}

/// Where a run stands in the store and which instance has it: what a server that does not
/// hold a run can tell about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Whereabouts {
    pub run_id: String,
    pub status: Status,
    /// The instance that accepted the run.
    pub instance: String,
    /// That instance's host name, if it ever sent a heartbeat.
    pub host: Option<String>,
    /// Milliseconds since that instance's last heartbeat.
    pub last_seen_ms_ago: Option<i64>,
    /// How the other servers reach that instance (`cluster.advertise_url`), if it said.
    pub advertise_url: Option<String>,
    /// Waiting in the shared queue, claimed by no server: no server holds it yet.
    pub unclaimed: bool,
}

/// A history operation that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HistoryError {
    #[error("the history database {store} is not available: {detail}")]
    Unavailable { store: String, detail: String },
    #[error("querying the history failed: {0}")]
    Query(String),
}

/// What a new run's row starts with.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub language: String,
    pub limits: RunLimits,
    pub code_sha256: String,
    pub code_bytes: u64,
    pub code_preview: Option<String>,
    pub created_at_ms: i64,
    pub instance: String,
    /// The session it executes in, and its place there.
    pub session: Option<(String, u64)>,
}

impl NewRun {
    /// Describe a run about to be queued; the code is hashed and cut to the policy here.
    pub fn new(
        run_id: &str,
        language: &str,
        limits: RunLimits,
        code: &str,
        policy: CodePolicy,
        instance: &str,
    ) -> NewRun {
        NewRun {
            run_id: run_id.to_string(),
            language: language.to_string(),
            limits,
            code_sha256: sha256_hex(code),
            code_bytes: code.len() as u64,
            code_preview: code_preview(code, policy),
            created_at_ms: now_ms(),
            instance: instance.to_string(),
            session: None,
        }
    }

    /// The same row, for an execution of a session.
    pub fn in_session(mut self, session_id: &str, execution_count: u64) -> NewRun {
        self.session = Some((session_id.to_string(), execution_count));
        self
    }
}

/// Lowercase hex SHA-256 of `text`.
pub fn sha256_hex(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// The part of `code` the policy keeps.
pub fn code_preview(code: &str, policy: CodePolicy) -> Option<String> {
    match policy {
        CodePolicy::None => None,
        CodePolicy::Preview => Some(code.chars().take(CODE_PREVIEW_CHARS).collect()),
        CodePolicy::Full => Some(code.to_string()),
    }
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
/// Handle to the history thread. Cheap to clone; every method returns at once except queries.
#[derive(Clone)]
pub struct History {
    tx: mpsc::SyncSender<(Command, u64)>,
    /// How logs and errors name the store (a file, or a URL without password).
    store: String,
    /// Commands are being dropped (the queue is full, or the thread stopped): warned once.
    dropping: Arc<std::sync::atomic::AtomicBool>,
    /// The weight of the commands sent and not yet carried out (the thread subtracts).
    queued_bytes: Arc<std::sync::atomic::AtomicU64>,
    max_bytes: u64,
    /// Queries sent to the history thread (its one connection serves them one at a time).
    lookups: Arc<std::sync::atomic::AtomicU64>,
    /// Counts the times this instance found its lease judged lapsed.
    lapses: tokio::sync::watch::Receiver<Lapse>,
}

/// This instance found its lease judged lapsed by the others ([`History::lapses`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lapse {
    /// How many times so far.
    pub count: u64,
    /// How long it had gone without renewing its lease, the last time: runs that ended here
    /// within it may have been reported by the others first.
    pub unrenewed: Duration,
}

/// This process, as the history records and judges instances.
#[derive(Debug, Clone)]
pub struct Owner {
    /// This process's instance id (recorded on each row and in `instances`).
    pub instance: String,
    /// The data directory holding instance locks.
    pub data_dir: PathBuf,
    /// `cluster.lease_seconds`: a heartbeat every third of it; an instance silent for longer
    /// is gone.
    pub lease: Duration,
    /// `cluster.advertise_url`: how the other servers reach this one.
    pub advertise_url: Option<String>,
}

impl Default for Owner {
    fn default() -> Owner {
        Owner {
            instance: String::new(),
            data_dir: PathBuf::new(),
            lease: INSTANCE_EXPIRY,
            advertise_url: None,
        }
    }
}

impl Owner {
    /// How often this instance renews its lease (a third of it).
    pub(crate) fn heartbeat_interval(&self) -> Duration {
        (self.lease / 3).max(Duration::from_secs(1))
    }
}

impl History {
    /// The history in the SQLite file at `path` (created with its folder if missing).
    pub fn open(path: &Path, owner: Owner) -> History {
        History::connect(&HistoryStore::Sqlite(path.to_path_buf()), owner)
    }

    /// Start the history thread on `store`. Never fails: if the database cannot be opened,
    /// a warning is logged, writes are dropped and queries answer
    /// [`HistoryError::Unavailable`] until it can (tried again every `RECONNECT_INTERVAL`).
    pub fn connect(store: &HistoryStore, owner: Owner) -> History {
        History::start(store, owner, QUEUE)
    }

    fn start(store: &HistoryStore, owner: Owner, bounds: QueueBounds) -> History {
        let (tx, rx) = mpsc::sync_channel(bounds.commands);
        let queued_bytes: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let thread_store = store.clone();
        let thread_queued = queued_bytes.clone();
        let (lapsed, lapses) = tokio::sync::watch::channel(Lapse::default());
        let lapsed = Arc::new(lapsed);
        let spawned = std::thread::Builder::new()
            .name("codebox-history".into())
            .spawn(move || Actor::new(thread_store, owner, lapsed).run(rx, &thread_queued));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the history thread; runs will not be recorded");
        }
        History {
            tx,
            store: store.to_string(),
            dropping: Default::default(),
            queued_bytes,
            lookups: Arc::default(),
            max_bytes: bounds.bytes,
            lapses,
        }
    }

    /// Changes each time this instance finds that the others judged its lease lapsed (it
    /// did not renew it in time: paused, or cut off from the database), and re-joins: what
    /// it held was ended or handed on by them, and must be stopped here (PostgreSQL only).
    pub fn lapses(&self) -> tokio::sync::watch::Receiver<Lapse> {
        self.lapses.clone()
    }

    /// The store, as logs name it: the SQLite file, or the PostgreSQL URL.
    pub fn store(&self) -> &str {
        &self.store
    }

    /// Never blocks: when the database falls behind by [`QUEUE`]'s commands or bytes, the
    /// command is dropped with a warning (a history failure never holds up or fails a run,
    /// and the queue never holds an unbounded number of reports, or bytes of them).
    fn send(&self, cmd: Command) {
        use std::sync::atomic::Ordering;
        let weight = cmd.weight();
        let before = self.queued_bytes.fetch_add(weight, Ordering::SeqCst);
        let dropped = if before > 0 && before.saturating_add(weight) > self.max_bytes {
            format!(
                "the history database is behind by {} MB of reports (the queue holds at most {} MB); writes are dropped until it catches up",
                before >> 20,
                self.max_bytes >> 20
            )
        } else {
            match self.tx.try_send((cmd, weight)) {
                Ok(()) => {
                    if self.dropping.swap(false, Ordering::Relaxed) {
                        tracing::info!(store = %self.store, "the history caught up; runs are recorded again");
                    }
                    return;
                }
                Err(mpsc::TrySendError::Full(_)) => format!(
                    "the history database is behind by {} writes; writes are dropped until it catches up",
                    QUEUE.commands
                ),
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    "the history thread has stopped; runs are not recorded".to_string()
                }
            }
        };
        self.queued_bytes.fetch_sub(weight, Ordering::SeqCst);
        // One warning per episode, not one per dropped write.
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(store = %self.store, "{dropped}");
        }
    }

    /// Record a run that was just accepted (status `queued`).
    pub fn insert(&self, run: NewRun) {
        self.send(Command::Insert(run));
    }

    /// Record that a run left the queue (status `running`).
    pub fn started(&self, run_id: &str) {
        self.send(Command::Started {
            run_id: run_id.to_string(),
            at_ms: now_ms(),
        });
    }

    /// Record a run's final report: its metadata, and the whole report until
    /// [`History::forget_reports`] clears it.
    pub fn finish(&self, report: Arc<RunReport>) {
        self.send(Command::Finish {
            report,
            at_ms: now_ms(),
        });
    }

    /// Drop the stored full reports of these runs (their metadata stays).
    pub fn forget_reports(&self, run_ids: Vec<String>) {
        if !run_ids.is_empty() {
            self.send(Command::ForgetReports { run_ids });
        }
    }

    /// Drop the stored full reports of every run that ended before `cutoff_ms` (Unix ms): the
    /// backstop for runs no living manager tracks (a crash, another instance).
    pub(crate) fn forget_reports_ended_before(&self, cutoff_ms: i64) {
        self.send(Command::ForgetReportsEndedBefore { cutoff_ms });
    }

    /// Run `query` on the history thread (after every command sent before it) and await its
    /// answer.
    async fn ask<T: Send + 'static>(
        &self,
        query: impl FnOnce(&mut dyn Database) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, HistoryError> {
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        self.send(Command::Ask(Box::new(
            move |db: Result<&mut dyn Database, HistoryError>| {
                let (answer, failed) = match db {
                    Err(unavailable) => (Err(unavailable), None),
                    Ok(db) => match query(db) {
                        Ok(v) => (Ok(v), None),
                        Err(e) => (Err(HistoryError::Query(e.to_string())), Some(e)),
                    },
                };
                let _ = reply.send(answer);
                failed
            },
        )));
        rx.await.unwrap_or_else(|_| {
            Err(HistoryError::Unavailable {
                store: self.store.clone(),
                detail: NO_ANSWER.to_string(),
            })
        })
    }

    /// How many queries this handle (and its clones) sent so far.
    pub fn lookups(&self) -> u64 {
        self.lookups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A finished run's full report, if it is still stored (and, with `ended_after_ms`, if the
    /// run ended at or after that Unix ms time). Sees every write sent before it.
    pub async fn report(
        &self,
        run_id: &str,
        ended_after_ms: Option<i64>,
    ) -> Result<Option<RunReport>, HistoryError> {
        let run_id = run_id.to_string();
        let json = self
            .ask(move |db| store::stored_report(db, &run_id, ended_after_ms))
            .await?;
        json.map(|j| {
            serde_json::from_str(&j)
                .map_err(|e| HistoryError::Query(format!("a stored report is unreadable: {e}")))
        })
        .transpose()
    }

    /// Rows matching `query`, newest first. Sees every write sent before it.
    pub async fn query(&self, query: Query) -> Result<Vec<HistoryRow>, HistoryError> {
        self.ask(move |db| store::select(db, &query)).await
    }

    /// One run's row.
    pub async fn get(&self, run_id: &str) -> Result<Option<HistoryRow>, HistoryError> {
        let run_id = run_id.to_string();
        self.ask(move |db| store::get(db, &run_id)).await
    }

    /// Wait (at most `timeout`) until every write sent before has been carried out or
    /// dropped: a process about to exit calls it so that its last runs are recorded.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Flush { reply });
        matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(())))
    }

    /// Where a run stands and which instance has it (for a run this process does not hold).
    pub async fn whereabouts(&self, run_id: &str) -> Result<Option<Whereabouts>, HistoryError> {
        let run_id = run_id.to_string();
        self.ask(move |db| store::whereabouts(db, &run_id)).await
    }

    /// Record a session that was just opened.
    pub(crate) fn session_opened(&self, session: SessionOpened) {
        self.send(Command::SessionOpened(session));
    }

    /// Record why a session ended (`closed`, `idle`...).
    pub fn session_ended(&self, session_id: &str, reason: &str) {
        self.send(Command::SessionEnded {
            session_id: session_id.to_string(),
            reason: reason.to_string(),
            at_ms: now_ms(),
        });
    }

    /// The ids of the sessions that start with `prefix`, in order, at most `limit`.
    pub(crate) async fn session_ids(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, HistoryError> {
        let prefix = prefix.to_string();
        let limit = limit.min(MAX_QUERY_LIMIT) as i64;
        self.ask(move |db| sessions::ids_starting_with(db, &prefix, limit))
            .await
    }

    /// What the store knows of a session this process does not hold.
    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>, HistoryError> {
        let id = session_id.to_string();
        self.ask(move |db| sessions::lookup(db, &id)).await
    }
}

#[cfg(test)]
mod tests;
