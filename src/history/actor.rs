//! The history thread: the commands the handle sends it (each with its weight, which bounds
//! the queue by bytes as well as by count), and the actor that owns the database connection,
//! carries the commands out in order, reconnects and beats the heart.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::db::{Database, DbError};
use super::{
    pg, sqlite, store, HistoryError, HistoryRow, NewRun, Owner, Query, Whereabouts,
    HEARTBEAT_INTERVAL, RECONNECT_INTERVAL,
};
use crate::config::HistoryStore;
use crate::report::RunReport;

pub(super) type Reply<T> = oneshot::Sender<Result<T, HistoryError>>;

pub(super) enum Command {
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
    Whereabouts {
        run_id: String,
        reply: Reply<Option<Whereabouts>>,
    },
    /// Answered once every command sent before it is done.
    Flush {
        reply: oneshot::Sender<()>,
    },
}

/// Why a query got no answer.
pub(super) const NO_ANSWER: &str =
    "the history thread did not answer (it stopped, or is too far behind)";

/// What may wait for the history thread: a number of commands, and bytes, since a finished
/// run's report may hold megabytes (output, returned files, test cases). A command that would
/// go over either is dropped (one warning per episode); the first command into an empty queue
/// is always taken, whatever its size.
#[derive(Debug, Clone, Copy)]
pub(super) struct QueueBounds {
    pub commands: usize,
    pub bytes: u64,
}

pub(super) const QUEUE: QueueBounds = QueueBounds {
    commands: 4096,
    bytes: 64 << 20,
};

/// How often a history that keeps failing is warned about.
const WARN_EVERY: Duration = Duration::from_secs(600);

impl Command {
    /// Roughly the bytes a queued command keeps alive: what bounds the queue by memory.
    pub(super) fn weight(&self) -> u64 {
        const BASE: usize = 256;
        let n = match self {
            Command::Insert(run) => BASE + run.code_preview.as_ref().map_or(0, String::len),
            Command::Finish { report, .. } => BASE + report_bytes(report),
            Command::ForgetReports { run_ids } => {
                BASE + run_ids.iter().map(String::len).sum::<usize>()
            }
            _ => BASE,
        };
        n as u64
    }
}

/// The bytes a report holds in its strings: output, compile output, files, test cases.
fn report_bytes(r: &RunReport) -> usize {
    let compile = r
        .compile
        .as_ref()
        .map_or(0, |c| c.stdout.len() + c.stderr.len());
    let files: usize = r
        .files
        .iter()
        .map(|f| f.path.len() + f.content_base64.as_ref().map_or(0, String::len) + 128)
        .sum();
    let tests: usize = r
        .tests
        .iter()
        .map(|t| t.name.len() + t.stdout.len() + t.stderr.len() + 128)
        .sum();
    r.stdout.len() + r.stderr.len() + r.message.len() + compile + files + tests
}

impl Command {
    /// Answer a command that cannot be carried out: queries get `error`, a flush its answer.
    fn refuse(self, error: HistoryError) {
        match self {
            Command::Query { reply, .. } => drop(reply.send(Err(error))),
            Command::Get { reply, .. } => drop(reply.send(Err(error))),
            Command::Report { reply, .. } => drop(reply.send(Err(error))),
            Command::Whereabouts { reply, .. } => drop(reply.send(Err(error))),
            Command::Flush { reply } => drop(reply.send(())),
            _ => {}
        }
    }
}

/// Send a query's answer (or its failure) to the asker; the database's error also goes back
/// to the actor, which logs it.
fn answer<T>(
    reply: Reply<T>,
    result: Result<Result<T, HistoryError>, DbError>,
) -> Result<(), DbError> {
    match result {
        Ok(answer) => {
            let _ = reply.send(answer);
            Ok(())
        }
        Err(e) => {
            let _ = reply.send(Err(HistoryError::Query(e.to_string())));
            Err(e)
        }
    }
}

/// An error and its causes, each said once ("PostgreSQL: db error: FATAL: ..."): the
/// PostgreSQL client's own messages keep the server's reason in the cause.
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

/// Open the store, migrate it, announce this instance and mark what dead ones left.
fn open_store(store: &HistoryStore, owner: &Owner) -> Result<Box<dyn Database>, DbError> {
    let mut db: Box<dyn Database> = match store {
        HistoryStore::Sqlite(path) => Box::new(sqlite::Sqlite::open(path)?),
        HistoryStore::Postgres { url, password_file } => {
            Box::new(pg::Postgres::connect(url, password_file.as_deref())?)
        }
    };
    store::prepare(db.as_mut(), owner)?;
    Ok(db)
}

/// The history thread: owns the connection, runs the commands in order, beats the heart.
pub(super) struct Actor {
    store: HistoryStore,
    name: String,
    owner: Owner,
    db: Option<Box<dyn Database>>,
    /// When to try opening the store again (while `db` is `None`).
    retry_at: Instant,
    /// When the next heartbeat is due (while `db` is `Some`).
    beat_at: Instant,
    /// Whether the current outage was reported (one warning per outage, not per write).
    outage_reported: bool,
    /// Why the store could not be opened last time (what queries are told meanwhile).
    open_error: Option<String>,
    /// Operations that failed since the last warning about them, and when that was: a full
    /// disk fails the writes of every run, and is warned about once, then at most every
    /// [`WARN_EVERY`] while it lasts.
    lost: u64,
    warned: Option<Instant>,
}

impl Actor {
    pub(super) fn new(store: HistoryStore, owner: Owner) -> Actor {
        let now = Instant::now();
        Actor {
            name: store.to_string(),
            store,
            owner,
            db: None,
            retry_at: now,
            beat_at: now,
            outage_reported: false,
            open_error: None,
            lost: 0,
            warned: None,
        }
    }

    pub(super) fn run(
        mut self,
        rx: mpsc::Receiver<(Command, u64)>,
        queued_bytes: &std::sync::atomic::AtomicU64,
    ) {
        loop {
            self.connect_if_due();
            self.beat_if_due();
            let now = Instant::now();
            let next = if self.db.is_some() {
                self.beat_at
            } else {
                self.retry_at
            };
            let (cmd, weight) = match rx.recv_timeout(next.saturating_duration_since(now)) {
                Ok(queued) => queued,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            self.connect_if_due();
            self.handle(cmd);
            queued_bytes.fetch_sub(weight, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn connect_if_due(&mut self) {
        if self.db.is_some() || Instant::now() < self.retry_at {
            return;
        }
        match open_store(&self.store, &self.owner) {
            Ok(db) => {
                if self.outage_reported {
                    tracing::info!(store = %self.name, "the history database is reachable again; runs are recorded");
                }
                self.db = Some(db);
                self.outage_reported = false;
                self.beat_at = Instant::now() + HEARTBEAT_INTERVAL;
            }
            Err(e) => {
                self.open_error = Some(with_causes(&e));
                if !self.outage_reported {
                    tracing::warn!(store = %self.name, error = %e, "cannot open the history database; runs will be served but not recorded (trying again every {} s)", RECONNECT_INTERVAL.as_secs());
                    self.outage_reported = true;
                }
                self.retry_at = Instant::now() + RECONNECT_INTERVAL;
            }
        }
    }

    fn beat_if_due(&mut self) {
        let Some(db) = self.db.as_mut() else { return };
        if Instant::now() < self.beat_at {
            return;
        }
        self.beat_at = Instant::now() + HEARTBEAT_INTERVAL;
        let beat = db.now_ms().and_then(|now| {
            store::heartbeat(db.as_mut(), &self.owner, now)?;
            store::mark_interrupted(db.as_mut(), &self.owner, now)
        });
        if let Err(e) = beat {
            self.failed(e, "recording this server's heartbeat failed");
        }
    }

    /// Log a failed operation; drop a connection that is gone, so the next command reconnects.
    fn failed(&mut self, e: DbError, what: &str) {
        if self.db.as_ref().is_some_and(|db| db.is_broken()) {
            self.db = None;
            self.retry_at = Instant::now();
            tracing::warn!(store = %self.name, error = %e, "{what}; the connection to the history database was lost (reconnecting)");
            self.outage_reported = true;
        } else {
            self.lost += 1;
            if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                tracing::warn!(store = %self.name, error = %e, lost = self.lost, "{what}; runs go on unaffected but are not recorded (warned again at most every {} minutes while it fails)", WARN_EVERY.as_secs() / 60);
                self.warned = Some(Instant::now());
                self.lost = 0;
            } else {
                tracing::debug!(store = %self.name, error = %e, "{what} again");
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        let Some(db) = self.db.as_mut() else {
            cmd.refuse(HistoryError::Unavailable {
                store: self.name.clone(),
                detail: match &self.open_error {
                    Some(e) => format!("it could not be opened: {e}"),
                    None => "it could not be opened (see the log)".to_string(),
                },
            });
            return;
        };
        let db = db.as_mut();
        let write = matches!(
            cmd,
            Command::Insert(_)
                | Command::Started { .. }
                | Command::Finish { .. }
                | Command::ForgetReports { .. }
                | Command::ForgetReportsEndedBefore { .. }
        );
        let outcome: Result<(), DbError> = match cmd {
            Command::Insert(run) => store::insert(db, &run),
            Command::Started { run_id, at_ms } => store::started(db, &run_id, at_ms),
            Command::Finish { report, at_ms } => store::finish(db, &report, at_ms),
            Command::ForgetReports { run_ids } => store::forget_reports(db, &run_ids),
            Command::ForgetReportsEndedBefore { cutoff_ms } => {
                store::forget_reports_ended_before(db, cutoff_ms)
            }
            Command::Report {
                run_id,
                ended_after_ms,
                reply,
            } => answer(
                reply,
                store::stored_report(db, &run_id, ended_after_ms).map(|json| {
                    json.map(|j| {
                        serde_json::from_str(&j).map_err(|e| {
                            HistoryError::Query(format!(
                                "the stored report of run {run_id} is unreadable: {e}"
                            ))
                        })
                    })
                    .transpose()
                }),
            ),
            Command::Query { query, reply } => answer(reply, store::select(db, &query).map(Ok)),
            Command::Get { run_id, reply } => answer(reply, store::get(db, &run_id).map(Ok)),
            Command::Whereabouts { run_id, reply } => {
                answer(reply, store::whereabouts(db, &run_id).map(Ok))
            }
            Command::Flush { reply } => {
                let _ = reply.send(());
                Ok(())
            }
        };
        // A full disk can fail one write and let the next through: successes do not re-arm
        // the warning, only WARN_EVERY does.
        if let Err(e) = outcome {
            let what = if write {
                "writing the run history failed"
            } else {
                "reading the run history failed"
            };
            self.failed(e, what);
        }
        self.beat_if_due();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{limits, new_run, report};
    use super::super::*;
    use super::*;

    #[tokio::test]
    async fn reports_waiting_for_a_stalled_database_are_bounded_by_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sqlite3");
        let owner = Owner {
            instance: "x".into(),
            data_dir: dir.path().to_path_buf(),
        };
        let bounds = QueueBounds {
            commands: 4096,
            bytes: 4 << 20,
        };
        let h = History::start(&HistoryStore::Sqlite(path.clone()), owner, bounds);
        h.query(Query::default()).await.unwrap();
        // Another connection holds the write lock: the history thread waits in its first
        // write (up to the busy timeout) while reports of 1 MB each arrive.
        let lock = rusqlite::Connection::open(&path).unwrap();
        lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
        h.insert(new_run("r0", "x"));
        let reports: Vec<Arc<RunReport>> = (0..20)
            .map(|i| Arc::new(report(&format!("r{i}"), &"x".repeat(1 << 20))))
            .collect();
        for r in &reports {
            h.finish(r.clone());
        }
        let held = reports.iter().filter(|r| Arc::strong_count(r) > 1).count();
        assert!(
            (1..=4).contains(&held),
            "{held} reports of 1 MB wait in a 4 MB queue"
        );
        lock.execute_batch("COMMIT").unwrap();
        assert!(h.flush(Duration::from_secs(30)).await);
        // The flush answers before its own weight is taken off: wait for that too.
        let drained = std::time::Instant::now();
        while h.queued_bytes.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            assert!(
                drained.elapsed() < Duration::from_secs(5),
                "the queue never drained"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Once it caught up, writes are taken again.
        h.insert(new_run("r19", "x"));
        h.finish(reports[19].clone());
        assert!(h.report("r19", None).await.unwrap().is_some());
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
        assert!(
            h.flush(Duration::from_secs(5)).await,
            "a flush answers even without a database"
        );
    }
}
