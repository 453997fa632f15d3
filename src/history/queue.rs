//! One queue for the servers that share a PostgreSQL history (SPEC section 15): a run
//! submitted to any of them is a row of the `queue` table until a server claims it, in
//! submission order, within its own host's slots and memory budget
//! (`SELECT ... FOR UPDATE SKIP LOCKED`, so that servers claiming at once never wait for each
//! other nor take the same row). `LISTEN/NOTIFY` wakes idle servers when work arrives (with
//! a slow poll behind it), and tells a server waiting on another's run that it moved.
//!
//! A claimed row stays until its run starts: if its server dies first, the lease judge (one
//! server at a time, under [`super::JUDGE_LOCK`]) gives the row back to the queue, once. A
//! drained server gives back what it claimed and has not started.
//!
//! # Fencing
//! A server that only looked dead (paused, cut off for longer than its lease) comes back
//! holding claims the judge gave back, which another server may have claimed and run since.
//! So a claimed run starts only by [`SharedQueue::take`]: one transaction that deletes the
//! row *while it is still this server's claim* (`DELETE ... WHERE claimed_by = me RETURNING`)
//! and marks the run `running`. The row's lock orders it against the judge's hand-back and
//! another server's claim: exactly one of them wins, and a server whose claim was given back
//! does not start the run. (The claim's token is the instance id, which is new at every start
//! of a server; a server that claims a run again holds one entry for it.)
//!
//! The queue has a connection of its own on a thread of its own (the history's thread must
//! never hold up a claim behind a report being written), and a second one that listens.
//! SQLite keeps today's queue in the process: nothing here runs for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::db::{transaction, values, Database, DbError};
use super::{pg, store, NewRun, MOVED_CHANNEL, QUEUE_CHANNEL};
use crate::config::HistoryStore;
use crate::report::{RunReport, Status};

/// How long a connection that failed is left before the next try.
const RETRY: Duration = Duration::from_secs(1);
/// How long the listener waits for a notification before it looks whether it should stop.
const LISTEN_WAIT: Duration = Duration::from_secs(1);
/// The database's clock, in Unix ms and µs.
const NOW_MS: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";
const NOW_US: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)";

/// A run for the queue: its history row, its request and what it takes.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub row: NewRun,
    /// The run request, JSON.
    pub request: String,
    /// Its report had it never started (status `queued`), JSON.
    pub base: String,
    pub slots: usize,
    pub charge_mb: u64,
    /// The submitting server has room for it now: it claims it in the same transaction,
    /// unless an older run that would fit it as well waits unclaimed.
    pub claim_here: bool,
}

/// What a server has free, and the most it could ever take (a run larger than that is left
/// to the others).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    pub slots: usize,
    pub memory_mb: u64,
    pub max_slots: usize,
    pub budget_mb: u64,
}

/// A run this server claimed.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub run_id: String,
    /// The run request, JSON.
    pub request: String,
    /// How long it waited in the queue (the database's clock).
    pub waited_ms: u64,
}

/// Why the queue could not do what it was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    #[error("the shared queue in the history database is not available: {0}")]
    Unavailable(String),
}

type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

enum Job {
    Submit(Box<Submitted>, Reply<bool>),
    Claim(Room, Reply<Vec<Claimed>>),
    Settle(String),
    Take(String, Reply<bool>),
    HandBack(Vec<String>, Reply<u64>),
    Withdraw(String, String, Reply<Option<RunReport>>),
}

/// The handle to the shared queue. Cheap to clone.
#[derive(Clone)]
pub struct SharedQueue {
    inner: Arc<Handle>,
}

struct Handle {
    tx: mpsc::Sender<Job>,
    /// Work arrived, or this server's room grew: its claimer looks.
    work: Arc<Notify>,
    /// A run changed hands or ended somewhere.
    moved: Arc<Notify>,
    stop: Arc<AtomicBool>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for SharedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedQueue").finish_non_exhaustive()
    }
}

impl SharedQueue {
    /// The shared queue of `store` for instance `instance`: `None` for SQLite.
    pub fn connect(store: &HistoryStore, instance: &str) -> Option<SharedQueue> {
        let HistoryStore::Postgres { url, password_file } = store else {
            return None;
        };
        let (tx, rx) = mpsc::channel();
        let work = Arc::new(Notify::new());
        let moved = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let connect = {
            let (url, password_file) = (url.clone(), password_file.clone());
            move || pg::Postgres::connect(&url, password_file.as_deref())
        };
        let worker = Worker {
            connect: Box::new(connect.clone()),
            instance: instance.to_string(),
            db: None,
            retry_at: Instant::now(),
            last_error: String::new(),
            unsettled: Vec::new(),
        };
        let spawned = std::thread::Builder::new()
            .name("codebox-queue".into())
            .spawn(move || worker.run(rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the shared queue's thread; runs stay on the server that takes them");
            return None;
        }
        let (w, m, s) = (work.clone(), moved.clone(), stop.clone());
        let _ = std::thread::Builder::new()
            .name("codebox-listen".into())
            .spawn(move || listen(connect, &w, &m, &s));
        Some(SharedQueue {
            inner: Arc::new(Handle {
                tx,
                work,
                moved,
                stop,
            }),
        })
    }

    async fn ask<T>(&self, job: impl FnOnce(Reply<T>) -> Job) -> Result<T, QueueError> {
        let (reply, rx) = oneshot::channel();
        if self.inner.tx.send(job(reply)).is_err() {
            return Err(QueueError::Unavailable("its thread stopped".into()));
        }
        rx.await
            .unwrap_or_else(|_| Err(QueueError::Unavailable("its thread stopped".into())))
    }

    /// Put a run in the queue (and its history row, in the same transaction), and wake the
    /// servers; `true` when this server claimed it at once ([`Submitted::claim_here`]).
    pub async fn submit(&self, run: Submitted) -> Result<bool, QueueError> {
        self.ask(|r| Job::Submit(Box::new(run), r)).await
    }

    /// Claim, in submission order, the runs that fit `room`.
    pub async fn claim(&self, room: Room) -> Result<Vec<Claimed>, QueueError> {
        self.ask(|r| Job::Claim(room, r)).await
    }

    /// A claimed run ended before it started: it leaves the queue.
    pub fn settle(&self, run_id: &str) {
        let _ = self.inner.tx.send(Job::Settle(run_id.to_string()));
    }

    /// A claimed run is about to start: it leaves the queue and is marked `running`, if it is
    /// still this server's claim (`true`). `false`: the claim was given back (this server's
    /// lease was judged lapsed) and the run is the queue's or another server's: not started.
    pub async fn take(&self, run_id: &str) -> Result<bool, QueueError> {
        let id = run_id.to_string();
        self.ask(|r| Job::Take(id, r)).await
    }

    /// Give claimed runs that did not start back to the queue (a drain).
    pub async fn hand_back(&self, run_ids: Vec<String>) -> Result<u64, QueueError> {
        if run_ids.is_empty() {
            return Ok(0);
        }
        self.ask(|r| Job::HandBack(run_ids, r)).await
    }

    /// Take an unclaimed run out of the queue, ending it `stopped` with `message`: its report,
    /// or `None` when no unclaimed row has it (a server claimed it, or it is not queued).
    pub async fn withdraw(
        &self,
        run_id: &str,
        message: &str,
    ) -> Result<Option<RunReport>, QueueError> {
        let (id, m) = (run_id.to_string(), message.to_string());
        self.ask(|r| Job::Withdraw(id, m, r)).await
    }

    /// What this server's claimer waits on: work arrived, or its room grew.
    pub fn work(&self) -> &Notify {
        &self.inner.work
    }

    /// Tell this server's claimer to look (its room grew).
    pub(crate) fn wake(&self) {
        self.inner.work.notify_one();
    }

    /// Notified when some run changed hands or ended.
    pub(crate) fn moved(&self) -> &Notify {
        &self.inner.moved
    }
}

type Connect = dyn Fn() -> Result<pg::Postgres, DbError> + Send;

/// The queue's thread: its connection and the jobs, in order.
struct Worker {
    connect: Box<Connect>,
    instance: String,
    db: Option<pg::Postgres>,
    retry_at: Instant,
    last_error: String,
    /// Runs that started while the database could not be told (told once it can).
    unsettled: Vec<String>,
}

impl Worker {
    fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            let job = match rx.recv_timeout(RETRY) {
                Ok(job) => Some(job),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            self.connect_if_due();
            if !self.unsettled.is_empty() {
                let ids = std::mem::take(&mut self.unsettled);
                for id in ids {
                    self.handle(Job::Settle(id));
                }
            }
            if let Some(job) = job {
                self.handle(job);
            }
        }
    }

    fn connect_if_due(&mut self) {
        if self.db.is_some() || Instant::now() < self.retry_at {
            return;
        }
        let opened = (self.connect)().and_then(|mut db| {
            // The history thread migrates too; whichever comes first (under a lock).
            super::schema::migrate(&mut db)?;
            Ok(db)
        });
        match opened {
            Ok(db) => self.db = Some(db),
            Err(e) => {
                self.last_error = with_causes(&e);
                self.retry_at = Instant::now() + RETRY;
            }
        }
    }

    /// Run `f` on the connection; an error that broke it drops it (the next job reconnects).
    fn with_db<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Database, &str) -> Result<T, DbError>,
    ) -> Result<T, QueueError> {
        let Some(db) = self.db.as_mut() else {
            return Err(QueueError::Unavailable(self.last_error.clone()));
        };
        match f(db, &self.instance) {
            Ok(v) => Ok(v),
            Err(e) => {
                if db.is_broken() {
                    self.db = None;
                    self.retry_at = Instant::now();
                }
                self.last_error = with_causes(&e);
                Err(QueueError::Unavailable(self.last_error.clone()))
            }
        }
    }

    fn handle(&mut self, job: Job) {
        match job {
            Job::Submit(run, reply) => {
                let _ = reply.send(self.with_db(|db, _| submit(db, &run)));
            }
            Job::Claim(room, reply) => {
                let _ = reply.send(self.with_db(|db, me| claim(db, me, room)));
            }
            Job::Settle(id) => {
                let done = self.with_db(|db, me| {
                    db.execute(
                        "DELETE FROM queue WHERE run_id = ?1 AND claimed_by = ?2",
                        values![&id, me],
                    )
                });
                if done.is_err() {
                    self.unsettled.push(id);
                }
            }
            Job::Take(id, reply) => {
                let _ = reply.send(self.with_db(|db, me| take(db, me, &id)));
            }
            Job::HandBack(ids, reply) => {
                let _ = reply.send(self.with_db(|db, me| hand_back(db, me, &ids)));
            }
            Job::Withdraw(id, message, reply) => {
                let _ = reply.send(self.with_db(|db, _| withdraw(db, &id, &message)));
            }
        }
    }
}

/// An error and its causes, one line (PostgreSQL's errors say little at the top).
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        cause = c.source();
    }
    text
}

fn submit(db: &mut dyn Database, run: &Submitted) -> Result<bool, DbError> {
    transaction(db, |db| {
        store::insert(db, &run.row)?;
        let here = run.claim_here && {
            let older = db.query(
                "SELECT COUNT(*) FROM queue WHERE claimed_by IS NULL
                 AND slots <= ?1 AND charge_mb <= ?2",
                values![run.slots as i64, run.charge_mb],
            )?;
            older.first().and_then(|r| r.int(0)) == Some(0)
        };
        let claimer = here.then_some(run.row.instance.as_str());
        db.execute(
            &format!(
                "INSERT INTO queue (run_id, seq, submitted_by, created_at, request, base, slots,
                    charge_mb, claimed_by, claimed_at)
                 VALUES (?1, {NOW_US}, ?2, {NOW_MS}, ?3, ?4, ?5, ?6, ?7,
                    CASE WHEN CAST(?7 AS TEXT) IS NULL THEN NULL ELSE {NOW_MS} END)"
            ),
            values![
                &run.row.run_id,
                &run.row.instance,
                &run.request,
                &run.base,
                run.slots as i64,
                run.charge_mb,
                claimer
            ],
        )?;
        if !here {
            db.notify(QUEUE_CHANNEL, "")?;
        }
        Ok(here)
    })
}

/// Most rows looked at beyond the free slots (rows this server skips as too large for it).
const LOOK_AHEAD: usize = 8;

fn claim(db: &mut dyn Database, me: &str, room: Room) -> Result<Vec<Claimed>, DbError> {
    if room.slots == 0 {
        return Ok(Vec::new());
    }
    transaction(db, |db| {
        let rows = db.query(
            &format!(
                "SELECT run_id, request, slots, charge_mb, {NOW_MS} - created_at FROM queue
                 WHERE claimed_by IS NULL ORDER BY seq, run_id LIMIT ?1
                 FOR UPDATE SKIP LOCKED"
            ),
            values![(room.slots + LOOK_AHEAD) as i64],
        )?;
        let (mut slots, mut mb) = (room.slots, room.memory_mb);
        let mut taken = Vec::new();
        for r in &rows {
            let need_slots = r.int(2).unwrap_or(1).max(1) as usize;
            let need_mb = r.int(3).unwrap_or(0).max(0) as u64;
            if need_slots > room.max_slots || need_mb > room.budget_mb {
                // Never fits here: another server's.
                continue;
            }
            if need_slots > slots || need_mb > mb {
                // The head waits for room here or elsewhere; nothing behind it jumps it.
                break;
            }
            slots -= need_slots;
            mb -= need_mb;
            taken.push(Claimed {
                run_id: r.text(0).unwrap_or_default(),
                request: r.text(1).unwrap_or_default(),
                waited_ms: r.int(4).unwrap_or(0).max(0) as u64,
            });
        }
        for c in &taken {
            db.execute(
                &format!(
                    "UPDATE queue SET claimed_by = ?1, claimed_at = {NOW_MS} WHERE run_id = ?2"
                ),
                values![me, &c.run_id],
            )?;
            db.execute(
                "UPDATE runs SET instance = ?1 WHERE id = ?2",
                values![me, &c.run_id],
            )?;
        }
        if !taken.is_empty() {
            db.notify(MOVED_CHANNEL, "")?;
        }
        Ok(taken)
    })
}

fn take(db: &mut dyn Database, me: &str, run_id: &str) -> Result<bool, DbError> {
    transaction(db, |db| {
        let rows = db.query(
            "DELETE FROM queue WHERE run_id = ?1 AND claimed_by = ?2 RETURNING run_id",
            values![run_id, me],
        )?;
        if rows.is_empty() {
            return Ok(false);
        }
        store::started(db, run_id, super::now_ms())?;
        Ok(true)
    })
}

fn hand_back(db: &mut dyn Database, me: &str, run_ids: &[String]) -> Result<u64, DbError> {
    transaction(db, |db| {
        let mut n = 0;
        for id in run_ids {
            n += db.execute(
                "UPDATE queue SET claimed_by = NULL, claimed_at = NULL,
                    handed_back = handed_back + 1
                 WHERE run_id = ?1 AND claimed_by = ?2",
                values![id, me],
            )?;
        }
        db.notify(QUEUE_CHANNEL, "")?;
        db.notify(MOVED_CHANNEL, "")?;
        Ok(n)
    })
}

fn withdraw(
    db: &mut dyn Database,
    run_id: &str,
    message: &str,
) -> Result<Option<RunReport>, DbError> {
    transaction(db, |db| {
        let rows = db.query(
            &format!(
                "DELETE FROM queue WHERE run_id = ?1 AND claimed_by IS NULL
                 RETURNING base, {NOW_MS} - created_at"
            ),
            values![run_id],
        )?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let mut report: RunReport = serde_json::from_str(&row.text(0).unwrap_or_default())
            .map_err(|e| DbError::Schema(format!("a queued run's report is unreadable: {e}")))?;
        report.status = Status::Stopped;
        report.message = message.to_string();
        report.queued_ms = row.int(1).unwrap_or(0).max(0) as u64;
        store::finish(db, &report, super::now_ms())?;
        Ok(Some(report))
    })
}

/// The listening connection: wakes this server's claimer when work arrives, and its waiters
/// when a run moved. Reconnects after a failure (and wakes the claimer then: a notification
/// may have been missed).
fn listen(
    connect: impl Fn() -> Result<pg::Postgres, DbError>,
    work: &Notify,
    moved: &Notify,
    stop: &AtomicBool,
) {
    let mut db: Option<pg::Postgres> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(conn) = db.as_mut() else {
            match connect().and_then(|mut c| c.listen(&[QUEUE_CHANNEL, MOVED_CHANNEL]).map(|()| c))
            {
                Ok(c) => {
                    db = Some(c);
                    work.notify_one();
                    moved.notify_waiters();
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the shared queue cannot listen; polling meanwhile");
                    std::thread::sleep(RETRY);
                }
            }
            continue;
        };
        match conn.notifications(LISTEN_WAIT) {
            Ok(channels) => {
                if channels.iter().any(|c| c == QUEUE_CHANNEL) {
                    work.notify_one();
                }
                if channels.iter().any(|c| c == MOVED_CHANNEL) {
                    moved.notify_waiters();
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the shared queue's listening connection failed; reconnecting");
                db = None;
            }
        }
    }
}
