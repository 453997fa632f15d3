//! The history thread: it owns the database connection, carries out the commands in the
//! order they were sent, reconnects after an outage, and beats this instance's heart.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::db::{Database, DbError};
use super::{
    pg, sessions, sqlite, store, HistoryError, NewRun, Owner, SessionOpened, RECONNECT_INTERVAL,
};
use crate::config::HistoryStore;
use crate::report::RunReport;

/// How the log names a failed write.
const WRITE_FAILED: &str = "writing the run history failed";

/// What the history thread is asked to do, in order.
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
    SessionOpened(SessionOpened),
    SessionEnded {
        session_id: String,
        reason: String,
        at_ms: i64,
    },
    /// A query: it runs on the thread with the database (or why there is none) and answers
    /// its caller itself; a database error it met is returned for the log.
    Ask(Box<Query_>),
    /// Answered once every command sent before it is done.
    Flush {
        reply: oneshot::Sender<()>,
    },
}

/// A query's work on the history thread.
pub(super) type Query_ =
    dyn FnOnce(Result<&mut dyn Database, HistoryError>) -> Option<DbError> + Send;

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
            Command::Finish { report, .. } => BASE + report.held_bytes() as usize,
            Command::ForgetReports { run_ids } => {
                BASE + run_ids.iter().map(String::len).sum::<usize>()
            }
            _ => BASE,
        };
        n as u64
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
/// Open the store and prepare it; `judge_leases`: also mark the runs of instances whose lease
/// lapsed (not right after an outage of this server's connection: the others may have been
/// cut off too, and need a lease to renew theirs).
/// `joined`: this instance wrote its row before (a reconnection); the answer says whether its
/// lease was judged lapsed meanwhile (`false`).
pub(super) fn open_store(
    store: &HistoryStore,
    owner: &Owner,
    judge_leases: bool,
    joined: bool,
) -> Result<(Box<dyn Database>, bool), DbError> {
    let mut db: Box<dyn Database> = match store {
        HistoryStore::Sqlite(path) => Box::new(sqlite::Sqlite::open(path)?),
        HistoryStore::Postgres { url, password_file } => {
            Box::new(pg::Postgres::connect(url, password_file.as_deref())?)
        }
    };
    let alive = store::prepare(db.as_mut(), owner, judge_leases, joined)?;
    Ok((db, alive))
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
    /// The connection failed or could not be opened since it was last opened.
    had_outage: bool,
    /// From when other instances' leases are judged (a lease after a reconnection).
    judge_after: Instant,
    /// Whether the current outage was reported (one warning per outage, not per write).
    outage_reported: bool,
    /// Why the store could not be opened last time (what queries are told meanwhile).
    open_error: Option<String>,
    /// Operations that failed since the last warning about them, and when that was: a full
    /// disk fails the writes of every run, and is warned about once, then at most every
    /// [`WARN_EVERY`] while it lasts.
    lost: u64,
    warned: Option<Instant>,
    /// This instance's row was written once: a heartbeat renews it, and fails if a judge
    /// found the lease lapsed.
    joined: bool,
    /// Counts the times this instance found its lease judged lapsed ([`super::History::lapses`]).
    lapses: Arc<tokio::sync::watch::Sender<super::Lapse>>,
    /// When this instance last renewed its lease.
    renewed_at: Instant,
}

impl Actor {
    pub(super) fn new(
        store: HistoryStore,
        owner: Owner,
        lapses: Arc<tokio::sync::watch::Sender<super::Lapse>>,
    ) -> Actor {
        let now = Instant::now();
        Actor {
            name: store.to_string(),
            store,
            owner,
            db: None,
            retry_at: now,
            beat_at: now,
            had_outage: false,
            judge_after: now,
            outage_reported: false,
            open_error: None,
            lost: 0,
            warned: None,
            joined: false,
            lapses,
            renewed_at: now,
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
        match open_store(&self.store, &self.owner, !self.had_outage, self.joined) {
            Ok((db, alive)) => {
                if self.had_outage {
                    // The others reconnect within their retry interval, then renew at once.
                    self.judge_after = Instant::now() + RECONNECT_INTERVAL + self.owner.lease;
                    self.had_outage = false;
                }
                if self.outage_reported {
                    tracing::info!(store = %self.name, "the history database is reachable again; runs are recorded");
                }
                self.db = Some(db);
                self.outage_reported = false;
                self.beat_at = Instant::now() + self.owner.heartbeat_interval();
                self.joined = true;
                if alive {
                    self.renewed_at = Instant::now();
                } else {
                    self.lapsed();
                }
            }
            Err(e) => {
                self.had_outage = true;
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
        self.beat_at = Instant::now() + self.owner.heartbeat_interval();
        let judge_leases = Instant::now() >= self.judge_after;
        let beat = db.now_ms().and_then(|now| {
            let alive = store::heartbeat(db.as_mut(), &self.owner, now, true)?;
            store::mark_interrupted(db.as_mut(), &self.owner, now, judge_leases)?;
            Ok(alive)
        });
        match beat {
            Ok(true) => self.renewed_at = Instant::now(),
            Ok(false) => self.lapsed(),
            Err(e) => self.failed(e, "recording this server's heartbeat failed"),
        }
    }

    /// This instance's lease was judged lapsed (it was paused, or cut off, for longer): the
    /// others marked its runs and sessions and gave its claims back. It takes a fresh lease
    /// at once, and tells the run manager, which stops what the others ended
    /// ([`super::History::lapses`]).
    fn lapsed(&mut self) {
        tracing::warn!(
            instance = self.owner.instance,
            lease_seconds = self.owner.lease.as_secs(),
            "this server's lease was judged lapsed while it did not renew it (it was paused or cut off for longer than the lease): the other servers ended what it held; it stops those runs and sessions and re-joins with a fresh lease"
        );
        if let Some(db) = self.db.as_mut() {
            if let Err(e) = store::rejoin(db.as_mut(), &self.owner) {
                self.failed(e, "re-joining the cluster with a fresh lease failed");
                // Tried again at the next heartbeat, which finds the verdict again.
                return;
            }
        }
        let unrenewed = self.renewed_at.elapsed();
        self.renewed_at = Instant::now();
        self.lapses.send_modify(|l| {
            l.count += 1;
            l.unrenewed = unrenewed;
        });
    }

    /// Log a failed operation; drop a connection that is gone, so the next command reconnects.
    fn failed(&mut self, e: DbError, what: &str) {
        if self.db.as_ref().is_some_and(|db| db.is_broken()) {
            self.db = None;
            self.had_outage = true;
            self.retry_at = Instant::now();
            tracing::warn!(store = %self.name, error = %e, "{what}; the connection to the history database was lost (reconnecting)");
            self.outage_reported = true;
        } else {
            self.lost += 1;
            if self.warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                tracing::warn!(store = %self.name, error = %with_causes(&e), lost = self.lost, "{what}; runs go on unaffected but are not recorded (warned again at most every {} minutes while it fails)", WARN_EVERY.as_secs() / 60);
                self.warned = Some(Instant::now());
                self.lost = 0;
            } else {
                tracing::debug!(store = %self.name, error = %e, "{what} again");
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        let Some(db) = self.db.as_mut() else {
            let unavailable = HistoryError::Unavailable {
                store: self.name.clone(),
                detail: match &self.open_error {
                    Some(e) => format!("it could not be opened: {e}"),
                    None => "it could not be opened (see the log)".to_string(),
                },
            };
            match cmd {
                Command::Ask(query) => {
                    query(Err(unavailable));
                }
                Command::Flush { reply } => {
                    let _ = reply.send(());
                }
                _ => {}
            }
            return;
        };
        let db = db.as_mut();
        let (outcome, what) = match cmd {
            Command::Insert(run) => (store::insert(db, &run), WRITE_FAILED),
            Command::Started { run_id, at_ms } => {
                (store::started(db, &run_id, at_ms), WRITE_FAILED)
            }
            Command::Finish { report, at_ms } => (store::finish(db, &report, at_ms), WRITE_FAILED),
            Command::ForgetReports { run_ids } => {
                (store::forget_reports(db, &run_ids), WRITE_FAILED)
            }
            Command::ForgetReportsEndedBefore { cutoff_ms } => (
                store::forget_reports_ended_before(db, cutoff_ms),
                WRITE_FAILED,
            ),
            Command::SessionOpened(s) => (sessions::opened(db, &s), WRITE_FAILED),
            Command::SessionEnded {
                session_id,
                reason,
                at_ms,
            } => (
                sessions::ended(db, &session_id, &reason, at_ms),
                WRITE_FAILED,
            ),
            Command::Ask(query) => (
                query(Ok(db)).map_or(Ok(()), Err),
                "reading the run history failed",
            ),
            Command::Flush { reply } => {
                let _ = reply.send(());
                (Ok(()), "")
            }
        };
        // A full disk can fail one write and let the next through: successes do not re-arm
        // the warning, only WARN_EVERY does.
        if let Err(e) = outcome {
            self.failed(e, what);
        }
        self.beat_if_due();
    }
}
