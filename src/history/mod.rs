//! The run history: one SQLite row per run, written from a dedicated blocking thread.
//!
//! The async side holds a cloneable [`History`] handle and sends commands over a channel; it
//! never waits for a write. A write that fails is dropped: history is a record, and a broken
//! database (unwritable, its disk full) must never fail or delay a run. The first failure is
//! logged (`warn`), then at most one warning every ten minutes while writes keep failing
//! (with how many were lost meanwhile), the rest at `debug`: one warning per outage, not one
//! per run. Queries get their answer over
//! a oneshot channel.
//!
//! At open, rows another (now dead) server instance left `queued` or `running` are marked
//! `sandbox_error` with the message "interrupted by server restart".
//!
//! Besides the metadata kept forever (SPEC section 9), a row holds the run's full final report
//! (JSON, `report` column) for the retention period only: the run manager serves reports it
//! evicted from memory from here, and clears the column when the retention has passed
//! ([`History::forget_reports`], [`History::forget_reports_ended_before`]).

mod schema;

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use rusqlite::{params, Connection, OptionalExtension};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::config::{CodePolicy, CODE_PREVIEW_CHARS};
use crate::instance::{Instance, Liveness};
use crate::report::{RunLimits, RunReport, Stage, Status};

/// Message written on rows a crashed server left unfinished.
pub const INTERRUPTED_MESSAGE: &str = "interrupted by server restart";
/// Rows returned when a query sets no limit.
pub const DEFAULT_QUERY_LIMIT: usize = 20;
/// Most rows one query returns.
pub const MAX_QUERY_LIMIT: usize = 1000;

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
}

/// A history operation that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HistoryError {
    #[error("the history database {path} is not available: {detail}")]
    Unavailable { path: PathBuf, detail: String },
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
        }
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

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

type Reply<T> = oneshot::Sender<Result<T, HistoryError>>;

enum Command {
    Insert(NewRun),
    Started {
        run_id: String,
        at_ms: i64,
    },
    Finish {
        report: Arc<RunReport>,
        at_ms: i64,
    },
    ForgetReports {
        run_ids: Vec<String>,
    },
    ForgetReportsEndedBefore {
        cutoff_ms: i64,
    },
    Report {
        run_id: String,
        ended_after_ms: Option<i64>,
        reply: Reply<Option<RunReport>>,
    },
    Query {
        query: Query,
        reply: Reply<Vec<HistoryRow>>,
    },
    Get {
        run_id: String,
        reply: Reply<Option<HistoryRow>>,
    },
}

/// Why a query got no answer.
const NO_ANSWER: &str = "the history thread did not answer (it stopped, or is too far behind)";

/// How often a history that keeps failing is warned about.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// How many commands may wait for the history thread.
const QUEUE_CAPACITY: usize = 4096;

/// Handle to the history thread. Cheap to clone; every method returns at once except queries.
#[derive(Clone)]
pub struct History {
    tx: mpsc::SyncSender<Command>,
    path: PathBuf,
    /// Commands are being dropped (the queue is full, or the thread stopped): warned once.
    dropping: Arc<std::sync::atomic::AtomicBool>,
}

/// Where [`History::open`] looks for living instances when marking interrupted rows.
#[derive(Debug, Clone)]
pub struct Owner {
    /// This server's instance id (recorded on each row).
    pub instance: String,
    /// The data directory holding instance locks.
    pub data_dir: PathBuf,
}

impl History {
    /// Start the history thread on the database at `path` (created with its folder if
    /// missing). Never fails: if the database cannot be opened, a warning is logged and
    /// every later write is dropped; queries then answer [`HistoryError::Unavailable`].
    pub fn open(path: &Path, owner: Owner) -> History {
        let (tx, rx) = mpsc::sync_channel(QUEUE_CAPACITY);
        let thread_path = path.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("codebox-history".into())
            .spawn(move || actor(thread_path, owner, rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the history thread; runs will not be recorded");
        }
        History {
            tx,
            path: path.to_path_buf(),
            dropping: Default::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Never blocks: when the database falls behind by [`QUEUE_CAPACITY`] commands, the
    /// command is dropped, with one warning until it catches up (a history failure never
    /// holds up or fails a run, and the queue never holds an unbounded number of reports).
    fn send(&self, cmd: Command) {
        use std::sync::atomic::Ordering;
        let dropped = match self.tx.try_send(cmd) {
            Ok(()) => {
                if self.dropping.swap(false, Ordering::Relaxed) {
                    tracing::info!(path = %self.path.display(), "the history database caught up; writes are recorded again");
                }
                return;
            }
            Err(mpsc::TrySendError::Full(_)) => {
                format!("the history database is behind by {QUEUE_CAPACITY} writes; writes are dropped until it catches up")
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                "the history thread has stopped; runs are not recorded".to_string()
            }
        };
        // One warning per episode, not one per dropped write.
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(path = %self.path.display(), "{dropped}");
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
    pub fn forget_reports_ended_before(&self, cutoff_ms: i64) {
        self.send(Command::ForgetReportsEndedBefore { cutoff_ms });
    }

    /// A finished run's full report, if it is still stored (and, with `ended_after_ms`, if the
    /// run ended at or after that Unix ms time). Sees every write sent before it.
    pub async fn report(
        &self,
        run_id: &str,
        ended_after_ms: Option<i64>,
    ) -> Result<Option<RunReport>, HistoryError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Report {
            run_id: run_id.to_string(),
            ended_after_ms,
            reply,
        });
        rx.await
            .unwrap_or_else(|_| Err(self.unavailable(NO_ANSWER)))
    }

    /// Rows matching `query`, newest first. Sees every write sent before it.
    pub async fn query(&self, query: Query) -> Result<Vec<HistoryRow>, HistoryError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Query { query, reply });
        rx.await
            .unwrap_or_else(|_| Err(self.unavailable(NO_ANSWER)))
    }

    /// One run's row.
    pub async fn get(&self, run_id: &str) -> Result<Option<HistoryRow>, HistoryError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Get {
            run_id: run_id.to_string(),
            reply,
        });
        rx.await
            .unwrap_or_else(|_| Err(self.unavailable(NO_ANSWER)))
    }

    fn unavailable(&self, detail: &str) -> HistoryError {
        HistoryError::Unavailable {
            path: self.path.clone(),
            detail: detail.to_string(),
        }
    }
}

/// Open the database, migrate it, and mark rows of dead instances as interrupted.
fn open_db(path: &Path, owner: &Owner) -> Result<Connection, rusqlite::Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return Err(rusqlite::Error::ToSqlConversionFailure(Box::new(e)));
        }
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    schema::migrate(&conn)?;
    mark_interrupted(&conn, owner)?;
    Ok(conn)
}

fn mark_interrupted(conn: &Connection, owner: &Owner) -> Result<usize, rusqlite::Error> {
    let mut stmt =
        conn.prepare("SELECT DISTINCT instance FROM runs WHERE status IN ('queued', 'running')")?;
    let instances: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    let mut marked = 0;
    for instance in instances {
        if instance == owner.instance
            || Instance::liveness(&owner.data_dir, &instance) == Liveness::Alive
        {
            continue;
        }
        marked += conn.execute(
            "UPDATE runs SET status = 'sandbox_error', message = ?1, ended_at = ?2
             WHERE instance = ?3 AND status IN ('queued', 'running')",
            params![INTERRUPTED_MESSAGE, now_ms(), instance],
        )?;
    }
    if marked > 0 {
        tracing::warn!(
            runs = marked,
            "marked runs of a crashed server as sandbox_error ({INTERRUPTED_MESSAGE})"
        );
    }
    Ok(marked)
}

fn actor(path: PathBuf, owner: Owner, rx: mpsc::Receiver<Command>) {
    let conn = match open_db(&path, &owner) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot open the history database; runs will be served but not recorded");
            None
        }
    };
    let unavailable = |detail: &str| HistoryError::Unavailable {
        path: path.clone(),
        detail: detail.to_string(),
    };
    // Failed writes since the last warning, and when that was.
    let mut lost: u64 = 0;
    let mut warned: Option<std::time::Instant> = None;
    while let Ok(cmd) = rx.recv() {
        let Some(conn) = conn.as_ref() else {
            match cmd {
                Command::Query { reply, .. } => {
                    let _ = reply.send(Err(unavailable("it could not be opened (see the log)")));
                }
                Command::Get { reply, .. } => {
                    let _ = reply.send(Err(unavailable("it could not be opened (see the log)")));
                }
                Command::Report { reply, .. } => {
                    let _ = reply.send(Err(unavailable("it could not be opened (see the log)")));
                }
                _ => {}
            }
            continue;
        };
        // A write's result; `None` for a read.
        let written = match cmd {
            Command::Insert(run) => Some(insert(conn, &run).map(|_| ())),
            Command::Started { run_id, at_ms } => Some(conn
                .execute(
                    "UPDATE runs SET status = 'running', started_at = ?2 WHERE id = ?1 AND status = 'queued'",
                    params![run_id, at_ms],
                )
                .map(|_| ())),
            Command::Finish { report, at_ms } => Some(finish(conn, &report, at_ms).map(|_| ())),
            Command::ForgetReports { run_ids } => Some(forget_reports(conn, &run_ids).map(|_| ())),
            Command::ForgetReportsEndedBefore { cutoff_ms } => Some(conn
                .execute(
                    "UPDATE runs SET report = NULL WHERE report IS NOT NULL AND ended_at < ?1",
                    params![cutoff_ms],
                )
                .map(|_| ())),
            Command::Report { run_id, ended_after_ms, reply } => {
                let _ = reply.send(stored_report(conn, &run_id, ended_after_ms));
                None
            }
            Command::Query { query, reply } => {
                let _ = reply.send(select(conn, &query).map_err(|e| HistoryError::Query(e.to_string())));
                None
            }
            Command::Get { run_id, reply } => {
                let _ = reply.send(get(conn, &run_id).map_err(|e| HistoryError::Query(e.to_string())));
                None
            }
        };
        if let Some(Err(e)) = written {
            lost += 1;
            // One warning per outage (a full disk fails writes of every run), repeated at
            // most every WARN_EVERY while it lasts.
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                tracing::warn!(path = %path.display(), error = %e, lost, "writing the run history failed; runs go on unaffected but are not recorded (warned again at most every {} minutes while writes fail)", WARN_EVERY.as_secs() / 60);
                warned = Some(std::time::Instant::now());
                lost = 0;
            } else {
                tracing::debug!(path = %path.display(), error = %e, "writing the run history failed again");
            }
        }
    }
}

fn insert(conn: &Connection, r: &NewRun) -> Result<usize, rusqlite::Error> {
    conn.execute(
        "INSERT OR IGNORE INTO runs (id, instance, created_at, language, memory_mb, timeout_seconds, cpus,
            status, code_sha256, code_bytes, code_preview, message)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8, ?9, ?10, 'waiting for a free slot')",
        params![
            r.run_id,
            r.instance,
            r.created_at_ms,
            r.language,
            r.limits.memory_mb as i64,
            r.limits.timeout_seconds,
            r.limits.cpus,
            r.code_sha256,
            r.code_bytes as i64,
            r.code_preview,
        ],
    )
}

/// The report as the history keeps it: returned files by name, size and hash, never their
/// content.
fn without_file_contents(r: &RunReport) -> RunReport {
    let mut r = r.clone();
    for f in &mut r.files {
        if f.content_base64.take().is_some() {
            f.omitted_reason = Some("not kept by the history".to_string());
        }
    }
    r
}

fn finish(conn: &Connection, r: &RunReport, at_ms: i64) -> Result<usize, rusqlite::Error> {
    let json = serde_json::to_string(&without_file_contents(r))
        .map_err(|e| tracing::warn!(run_id = r.run_id, error = %e, "cannot store a run's report"))
        .ok();
    conn.execute(
        "UPDATE runs SET status = ?2, stage = ?3, exit_code = ?4, signal = ?5, image_id = ?6,
            duration_ms = ?7, queued_ms = ?8, compile_duration_ms = ?9,
            stdout_bytes = ?10, stderr_bytes = ?11, stdout_truncated = ?12, stderr_truncated = ?13,
            message = ?14, ended_at = ?15, report = ?16
         WHERE id = ?1",
        params![
            r.run_id,
            r.status.as_str(),
            r.stage.map(Stage::as_str),
            r.exit_code,
            r.signal,
            r.image_id,
            r.duration_ms as i64,
            r.queued_ms as i64,
            r.compile.as_ref().map(|c| c.duration_ms as i64),
            r.stdout_bytes as i64,
            r.stderr_bytes as i64,
            r.stdout_truncated,
            r.stderr_truncated,
            r.message,
            at_ms,
            json,
        ],
    )
}

fn forget_reports(conn: &Connection, run_ids: &[String]) -> Result<(), rusqlite::Error> {
    let tx = conn.unchecked_transaction()?;
    {
        let mut stmt = tx
            .prepare_cached("UPDATE runs SET report = NULL WHERE id = ?1 AND report IS NOT NULL")?;
        for id in run_ids {
            stmt.execute(params![id])?;
        }
    }
    tx.commit()
}

fn stored_report(
    conn: &Connection,
    run_id: &str,
    ended_after_ms: Option<i64>,
) -> Result<Option<RunReport>, HistoryError> {
    let json: Option<String> = conn
        .query_row(
            "SELECT report FROM runs
             WHERE id = ?1 AND report IS NOT NULL AND (?2 IS NULL OR ended_at >= ?2)",
            params![run_id, ended_after_ms],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| HistoryError::Query(e.to_string()))?;
    json.map(|j| {
        serde_json::from_str(&j).map_err(|e| {
            HistoryError::Query(format!(
                "the stored report of run {run_id} is unreadable: {e}"
            ))
        })
    })
    .transpose()
}

const COLUMNS: &str = "id, created_at, started_at, ended_at, language, image_id, memory_mb, timeout_seconds,
    cpus, status, stage, exit_code, signal, duration_ms, queued_ms, compile_duration_ms, stdout_bytes,
    stderr_bytes, stdout_truncated, stderr_truncated, code_sha256, code_bytes, code_preview, message";

fn row(r: &rusqlite::Row<'_>) -> Result<HistoryRow, rusqlite::Error> {
    let status: String = r.get(9)?;
    let stage: Option<String> = r.get(10)?;
    let opt_u64 = |i: usize| -> Result<Option<u64>, rusqlite::Error> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|v| v.max(0) as u64))
    };
    Ok(HistoryRow {
        run_id: r.get(0)?,
        created_at: rfc3339(r.get(1)?),
        started_at: r.get::<_, Option<i64>>(2)?.map(rfc3339),
        ended_at: r.get::<_, Option<i64>>(3)?.map(rfc3339),
        language: r.get(4)?,
        image_id: r.get(5)?,
        limits: RunLimits {
            memory_mb: r.get::<_, i64>(6)?.max(0) as u64,
            timeout_seconds: r.get(7)?,
            cpus: r.get(8)?,
        },
        status: Status::parse(&status).unwrap_or(Status::SandboxError),
        stage: stage.as_deref().and_then(|s| match s {
            "compile" => Some(Stage::Compile),
            "run" => Some(Stage::Run),
            _ => None,
        }),
        exit_code: r.get(11)?,
        signal: r.get(12)?,
        duration_ms: opt_u64(13)?,
        queued_ms: opt_u64(14)?,
        compile_duration_ms: opt_u64(15)?,
        stdout_bytes: opt_u64(16)?.unwrap_or(0),
        stderr_bytes: opt_u64(17)?.unwrap_or(0),
        stdout_truncated: r.get::<_, Option<bool>>(18)?.unwrap_or(false),
        stderr_truncated: r.get::<_, Option<bool>>(19)?.unwrap_or(false),
        code_sha256: r.get(20)?,
        code_bytes: opt_u64(21)?.unwrap_or(0),
        code_preview: r.get(22)?,
        message: r.get::<_, Option<String>>(23)?.unwrap_or_default(),
    })
}

fn select(conn: &Connection, q: &Query) -> Result<Vec<HistoryRow>, rusqlite::Error> {
    let limit = q
        .limit
        .unwrap_or(DEFAULT_QUERY_LIMIT)
        .clamp(1, MAX_QUERY_LIMIT) as i64;
    let sql = format!(
        "SELECT {COLUMNS} FROM runs
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR language = ?2)
         ORDER BY created_at DESC, rowid DESC LIMIT ?3"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        params![q.status.map(Status::as_str), q.language, limit],
        row,
    )?;
    rows.collect()
}

fn get(conn: &Connection, run_id: &str) -> Result<Option<HistoryRow>, rusqlite::Error> {
    let sql = format!("SELECT {COLUMNS} FROM runs WHERE id = ?1");
    conn.query_row(&sql, params![run_id], row).optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RunLimits {
        RunLimits {
            memory_mb: 512,
            timeout_seconds: 30.0,
            cpus: 1.0,
        }
    }

    #[test]
    fn code_preview_follows_the_policy() {
        let code = "é".repeat(600);
        assert_eq!(code_preview(&code, CodePolicy::None), None);
        assert_eq!(
            code_preview(&code, CodePolicy::Preview)
                .unwrap()
                .chars()
                .count(),
            500
        );
        assert_eq!(code_preview(&code, CodePolicy::Full).unwrap(), code);
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn rows_of_dead_instances_are_marked_interrupted_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite3");
        let owner = |i: &str| Owner {
            instance: i.to_string(),
            data_dir: dir.path().to_path_buf(),
        };
        let h = History::open(&path, owner("old"));
        h.insert(NewRun::new(
            "r1",
            "python",
            limits(),
            "print(1)",
            CodePolicy::Preview,
            "old",
        ));
        h.insert(NewRun::new(
            "r2",
            "python",
            limits(),
            "print(2)",
            CodePolicy::Preview,
            "old",
        ));
        h.started("r2");
        assert_eq!(h.query(Query::default()).await.unwrap().len(), 2);
        drop(h);
        // The old thread may still hold the file a moment; a new handle opens it again.
        let h = History::open(&path, owner("new"));
        let rows = h.query(Query::default()).await.unwrap();
        assert_eq!(rows.len(), 2);
        for r in rows {
            assert_eq!(r.status, Status::SandboxError);
            assert_eq!(r.message, INTERRUPTED_MESSAGE);
            assert!(r.ended_at.is_some());
        }
    }

    fn report(run_id: &str, stdout: &str) -> RunReport {
        RunReport {
            run_id: run_id.to_string(),
            language: "python".into(),
            status: Status::Succeeded,
            stage: Some(Stage::Run),
            exit_code: Some(0),
            signal: None,
            stdout: stdout.to_string(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_bytes: stdout.len() as u64,
            stderr_bytes: 0,
            compile: None,
            duration_ms: 5,
            queued_ms: 0,
            usage: Default::default(),
            limits: limits(),
            image_id: None,
            message: "exited with code 0".into(),
            files: Vec::new(),
            tests: Vec::new(),
            tests_summary: None,
        }
    }

    #[tokio::test]
    async fn full_reports_are_stored_at_the_end_and_cleared_by_id_or_age() {
        let dir = tempfile::tempdir().unwrap();
        let h = History::open(
            &dir.path().join("h.sqlite3"),
            Owner {
                instance: "x".into(),
                data_dir: dir.path().to_path_buf(),
            },
        );
        for id in ["r1", "r2", "r3"] {
            h.insert(NewRun::new(
                id,
                "python",
                limits(),
                "print(1)",
                CodePolicy::Preview,
                "x",
            ));
        }
        assert_eq!(h.report("r1", None).await.unwrap(), None, "not ended yet");
        for id in ["r1", "r2", "r3"] {
            h.finish(Arc::new(report(id, &format!("out of {id}\n"))));
        }
        assert_eq!(
            h.report("r1", None).await.unwrap(),
            Some(report("r1", "out of r1\n"))
        );
        assert_eq!(h.report("nope", None).await.unwrap(), None);
        let later = now_ms() + 60_000;
        assert_eq!(
            h.report("r1", Some(later)).await.unwrap(),
            None,
            "ended too long ago"
        );
        h.forget_reports(vec!["r1".into()]);
        assert_eq!(h.report("r1", None).await.unwrap(), None);
        assert!(h.report("r2", None).await.unwrap().is_some());
        h.forget_reports_ended_before(later);
        assert_eq!(h.report("r2", None).await.unwrap(), None);
        assert_eq!(h.report("r3", None).await.unwrap(), None);
        let row = h.get("r2").await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.stdout_bytes),
            (Status::Succeeded, 10),
            "metadata stays"
        );
    }

    #[tokio::test]
    async fn an_unopenable_database_answers_unavailable_and_drops_writes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "not a folder").unwrap();
        let h = History::open(
            &file.join("history.sqlite3"),
            Owner {
                instance: "x".into(),
                data_dir: dir.path().to_path_buf(),
            },
        );
        h.insert(NewRun::new(
            "r1",
            "python",
            limits(),
            "print(1)",
            CodePolicy::Preview,
            "x",
        ));
        let err = h.query(Query::default()).await.unwrap_err();
        assert!(matches!(err, HistoryError::Unavailable { .. }), "{err}");
    }
}
